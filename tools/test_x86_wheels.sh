#!/usr/bin/env bash
# Runs the test suite natively (the AVX2 table selected where the CPU has it)
# against the x86-64 wheels of CFBN_X86_SUITE_VERSIONS (default "3.9 3.13":
# the oldest and the newest CPython), each in a venv of the host's CPython of
# that version with its numpy (numpy_for in _lib.sh) and TEST_PACKAGES, from a
# copy of tests/ outside the repository.  The versions run one after the
# other (each run uses both cores through OpenMP).
# CFBN_X86_SUBSET=1 runs the representative subset that tools/test_aarch64.sh
# runs for cp313 instead of the whole suite (for CI's time budget).
# Environment: PYTEST_ARGS.
set -euo pipefail
. "$(dirname "$0")/_lib.sh"

VERSIONS=(${CFBN_X86_SUITE_VERSIONS:-3.9 3.13})
SUBSET=(tests/test_forward.py tests/test_grad.py tests/test_isa_selected.py tests/test_dispatch.py
        tests/test_errors.py tests/test_output_cache.py tests/test_threads.py)
what=(tests)
[ -z "${CFBN_X86_SUBSET:-}" ] || what=("${SUBSET[@]}")

step "wheels"
ensure_wheels
unset PYTHONPATH CFBN_FORCE_ISA
golden_dir
failed=()
for ver in "${VERSIONS[@]}"; do
    venv=$EDGE/venv-x86-$ver
    rundir=$EDGE/x86-tests-$ver
    whl=$(wheel_for "$ver" x86_64)
    step "cp$ver: venv with $(basename "$whl"), numpy $(numpy_for "$ver"), ${TEST_PACKAGES[*]}"
    rm -rf "$venv"
    "$(host_python "$ver")" -m venv "$venv"
    "$venv/bin/pip" install -q "$whl" "numpy==$(numpy_for "$ver")" "${TEST_PACKAGES[@]}"
    copy_tests "$rundir"
    (cd "$rundir" && "$venv/bin/python" -c 'import sys, cfbn; print(sys.version.split()[0], cfbn.__file__, cfbn.runtime_info()); assert cfbn.__file__.startswith(sys.argv[1] + "/")' "$venv")
    step "cp$ver: pytest ${what[*]}"
    (cd "$rundir" && run_suite "x86-$ver" "$venv/bin/python" -m pytest "${what[@]}" -q -p no:cacheprovider ${PYTEST_ARGS:-}) \
        || failed+=("cp$ver")
done
timings
[ ${#failed[@]} -eq 0 ] || die "pytest failed: ${failed[*]}"
