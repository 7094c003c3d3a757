#!/usr/bin/env bash
# Runs the aarch64 wheels under qemu-user, each with a Debian arm64 CPython of
# its version (tools/make_arm64_sysroot.sh), side by side (Python under qemu
# keeps about one core busy per run):
#   neon    cp39 wheel, Debian 11 (bullseye) python3.9, numpy 2.0.2: the whole
#           suite with the NEON table selected (the Raspberry Pi OS Bullseye case)
#   scalar  cp311 wheel, Debian 12 (bookworm) python3.11: the whole suite with
#           CFBN_FORCE_ISA=scalar
#   cp313   cp313 wheel, Debian 13 (trixie) python3.13, NEON selected: a
#           representative subset (SUBSET_313 below); the whole suite would
#           not fit the CI budget
# and, beside them, `python -m cfbn --check` (the self-check) with the wheel of each
# run, with the NEON table and with CFBN_FORCE_ISA=scalar.  cp310 and cp312 have no arm64 CPython in any Debian
# release and none on PyPI: those wheels are built, not run.
#
# The ISA-parametrized tests (the isa fixture of tests/conftest.py) run every
# table whichever is selected at import, so each run keeps its own table's
# instances of them: the NEON runs deselect the scalar ones (-k "not scalar"),
# the forced run the NEON ones (-k "not neon"); all run every other test,
# with their table chosen at import.  CFBN_SCALAR_FULL=1 runs the whole suite
# in the neon and scalar runs.
#
# Each wheel is installed with pip --target --platform into its root's
# /usr/local/lib/python3.X/dist-packages, as on a device, and the tests run
# from a copy of tests/ outside the repository: the installed wheel is what is
# imported, never the source folder cfbn/.
#
# Child interpreters: tests start `sys.executable -c ...` and `-m cfbn`, and
# qemu-user does not follow execve into another guest binary without
# binfmt_misc.  The interpreter is started through a launcher script, with
# qemu's -0 (argv[0]) set to the launcher: sys.executable is then the launcher,
# and every child runs emulated on the same CPU model.  Host programs a test
# runs (the C compiler) run natively; CC names the cross compiler, so what they
# build loads in the emulated process.
#
# The C kernel harness for NEON under qemu (tests/c/run.sh) is part of .ci/run.
# Environment: CFBN_QEMU_AARCH64_CPU (default cortex-a72: the Raspberry Pi 4
# core, Armv8.0-A without optional extensions), PYTEST_ARGS, CFBN_AARCH64_RUNS
# (the pytest runs, default "neon scalar cp313"; CI runs "neon"),
# CFBN_AARCH64_SELFCHECK (the roots whose wheel gets `python -m cfbn`, default
# "bullseye bookworm trixie"), CFBN_AARCH64_SUBSET, CFBN_CP313_WHOLE (the
# cp313 run takes the whole suite), CFBN_NEON_SHARDS (the neon run's processes).
set -euo pipefail
. "$(dirname "$0")/_lib.sh"
need qemu-aarch64 aarch64-linux-gnu-gcc

CPU=${CFBN_QEMU_AARCH64_CPU:-cortex-a72}
RUNS=(${CFBN_AARCH64_RUNS:-neon scalar cp313})
# Python 3.13 on aarch64: the forward and gradient paths of every dtype, the
# dispatch and ISA selection, argument checks, the output cache, threads.
SUBSET_313=(tests/test_forward.py tests/test_grad.py tests/test_isa_selected.py tests/test_dispatch.py
            tests/test_errors.py tests/test_output_cache.py tests/test_threads.py)

RUNDIR=$EDGE/aarch64-tests-$(IFS=-; echo "${RUNS[*]}")   # copy of tests/, no cfbn/ beside it
# Every root gets the self-check, whichever suites run.
SUITES=(${CFBN_AARCH64_SELFCHECK:-bullseye bookworm trixie})
for run in "${RUNS[@]}"; do
    case $run in neon) suite=bullseye ;; scalar) suite=bookworm ;; cp313) suite=trixie ;; *) die "no run $run" ;; esac
    [[ " ${SUITES[*]} " == *" $suite "* ]] || SUITES+=("$suite")
done

step "wheels and arm64 roots"
ensure_wheels
bash "$ROOT/tools/make_arm64_sysroot.sh" "${SUITES[@]}"

# launcher SUITE: installs the wheel of SUITE's CPython into its site folder;
# prints the launcher's path.
launcher() {
    local suite=$1 ver root site whl l
    ver=$(suite_python "$suite")
    root=$(arm64_root "$suite")
    site=$(arm64_site "$suite")
    whl=$(wheel_for "$ver" aarch64)
    rm -rf "$site"/cfbn "$site"/cfbn-*.dist-info "$site"/cfbn.libs
    # shellcheck disable=SC2046
    "$HOST_PYTHON" -m pip install -q --no-deps --target "$site" $(arm64_pip_target "$ver") "$whl" >&2
    # In the root's bin, the launcher lets Python find its prefix (root/usr)
    # from sys.executable.
    l=$root/usr/bin/python$ver-qemu
    cat >"$l" <<SH
#!/bin/sh
exec qemu-aarch64 -cpu "$CPU" -L "$root" -0 "\$0" "$root/usr/bin/python$ver" "\$@"
SH
    chmod +x "$l"
    echo "$l"
}

step "install the wheels for their targets (pip --target --platform)"
declare -A PY
for suite in "${SUITES[@]}"; do
    PY[$suite]=$(launcher "$suite")
    echo "$(basename "$(wheel_for "$(suite_python "$suite")" aarch64)") -> ${PY[$suite]}"
done
copy_tests "$RUNDIR"
golden_dir
unset PYTHONPATH PYTHONHOME CFBN_FORCE_ISA
export CC=aarch64-linux-gnu-gcc
cd "$RUNDIR"

step "runtime_info under qemu-aarch64 -cpu $CPU: ${SUITES[*]}"
for suite in "${SUITES[@]}"; do
    "${PY[$suite]}" - "$(arm64_site "$suite")" <<'PY'
import platform, sys
import cfbn
info = cfbn.runtime_info()
print("machine", platform.machine(), "python", sys.version.split()[0], "cfbn from", cfbn.__file__)
print(info)
assert platform.machine() == "aarch64"
assert cfbn.__file__.startswith(sys.argv[1] + "/"), "not the installed wheel"
assert info["selected_isa"] == "neon", info
PY
done

# selfchecks: python -m cfbn --check (no speed table: emulated times mean
# nothing) with each root's wheel, NEON and scalar, one after the other;
# run beside the suites so that no core waits.
selfchecks() {
    local suite out
    for suite in "${SUITES[@]}"; do
        out=$EDGE/selfcheck-aarch64-$suite.txt
        "${PY[$suite]}" -m cfbn --check >"$out" 2>&1 \
            || { cat "$out"; echo "python -m cfbn failed: $suite"; return 1; }
        CFBN_FORCE_ISA=scalar "${PY[$suite]}" -m cfbn --check >>"$out" 2>&1 \
            || { cat "$out"; echo "CFBN_FORCE_ISA=scalar python -m cfbn failed: $suite"; return 1; }
        echo "python -m cfbn ok: $suite python$(suite_python "$suite") (NEON, scalar)"
    done
}

step "pytest under qemu-aarch64, side by side: ${RUNS[*]}; python -m cfbn beside them"
# CFBN_AARCH64_SUBSET=1: the neon and scalar runs take the cp313 subset too.
what=(tests)
[ -z "${CFBN_AARCH64_SUBSET:-}" ] || what=("${SUBSET_313[@]}")
what_313=("${SUBSET_313[@]}")
[ -z "${CFBN_CP313_WHOLE:-}" ] || what_313=(tests)
neon_only=(-k "not scalar")
scalar_only=(-k "not neon")
[ -z "${CFBN_SCALAR_FULL:-}" ] || { neon_only=(); scalar_only=(); }
# CFBN_NEON_SHARDS=N: the neon run as N processes side by side, each with
# every N-th test (CFBN_TEST_SHARD, tests/conftest.py), for the cores that
# the other runs leave idle.
SHARDS=${CFBN_NEON_SHARDS:-1}
declare -A pid
for run in "${RUNS[@]}"; do
    case $run in
        neon) for ((i = 0; i < SHARDS; i++)); do
                  CFBN_TEST_SHARD=$i/$SHARDS CFBN_EXPECT_ISA=neon run_suite aarch64-neon-$i \
                      "${PY[bullseye]}" -m pytest "${what[@]}" -q -p no:cacheprovider "${neon_only[@]}" ${PYTEST_ARGS:-} \
                      >"$EDGE/summary-neon-$i.txt" &
                  pid[neon-$i]=$!
              done
              continue ;;
        scalar) CFBN_FORCE_ISA=scalar CFBN_EXPECT_ISA=scalar run_suite aarch64-scalar \
                  "${PY[bookworm]}" -m pytest "${what[@]}" -q -p no:cacheprovider "${scalar_only[@]}" ${PYTEST_ARGS:-} \
                  >"$EDGE/summary-scalar.txt" & ;;
        cp313) CFBN_EXPECT_ISA=neon run_suite aarch64-cp313 \
                  "${PY[trixie]}" -m pytest "${what_313[@]}" -q -p no:cacheprovider -k "not scalar" ${PYTEST_ARGS:-} \
                  >"$EDGE/summary-cp313.txt" & ;;
        *) die "no run $run" ;;
    esac
    pid[$run]=$!
done
selfchecks >"$EDGE/selfchecks.txt" 2>&1 &
checks=$!
failed=()
for job in "${!pid[@]}"; do wait "${pid[$job]}" || failed+=("$job"); done
wait "$checks" || failed+=("python -m cfbn")
echo "python -m cfbn under qemu-aarch64 -cpu $CPU (beside the suites):"
cat "$EDGE/selfchecks.txt"
for run in "${RUNS[@]}"; do
    case $run in
        neon) for ((i = 0; i < SHARDS; i++)); do
                  echo "cp39, Debian 11 python3.9, NEON table selected ${neon_only[*]}, shard $i/$SHARDS:"
                  cat "$EDGE/summary-neon-$i.txt"
              done
              continue ;;
        scalar) echo "cp311, Debian 12 python3.11, CFBN_FORCE_ISA=scalar ${scalar_only[*]}:" ;;
        cp313) echo "cp313, Debian 13 python3.13, NEON table selected, ${what_313[*]#tests/} -k not scalar:" ;;
    esac
    cat "$EDGE/summary-$run.txt"
done

timings
[ ${#failed[@]} -eq 0 ] || die "pytest failed under qemu-aarch64: ${failed[*]}"
