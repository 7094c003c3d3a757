#!/usr/bin/env bash
# Runs the test suite against the repaired x86-64 cp39 wheel (the oldest
# Python, with numpy 2.0.2: what an old machine runs) on an emulated x86-64
# CPU without AVX or AVX2 (qemu-x86_64 -cpu Nehalem): the scalar table must be
# the one selected, every test must pass, and CFBN_FORCE_ISA=avx2 must be a
# clear import error rather than an illegal instruction.
#
# Nehalem is the oldest model numpy 2.x runs on (it needs x86-64-v2: SSE4.2,
# POPCNT); qemu64 would kill numpy itself with SIGILL.
#
# Child interpreters (test_dispatch.py runs `sys.executable -c ...` and
# `-m cfbn`) would run natively, on the host's AVX2 CPU, since qemu-user does
# not follow execve.  The venv gets a launcher script that starts its python
# under qemu with argv[0] set to the launcher (qemu's -0): sys.executable is
# then the launcher, so children run on the emulated Nehalem too.
# CFBN_OLD_X86_SUBSET=1 runs a subset instead of the whole suite: the wheel's
# scalar table is the same machine code on any x86-64 CPU, and the whole
# suite runs it natively (CFBN_FORCE_ISA=scalar, .ci/run's sanitizer step);
# what an old CPU changes is the selection, the import and the self-check,
# which the subset covers with the forward and gradient paths of every dtype.
# Environment: CFBN_QEMU_X86_CPU (default Nehalem), CFBN_OLD_X86_PYTHON
# (default 3.9: the wheel and the host CPython of that version), PYTEST_ARGS,
# CFBN_OLD_X86_SUBSET.
set -euo pipefail
. "$(dirname "$0")/_lib.sh"
need qemu-x86_64 "$HOST_PYTHON"

CPU=${CFBN_QEMU_X86_CPU:-Nehalem}
VER=${CFBN_OLD_X86_PYTHON:-3.9}
NUMPY=$(numpy_for "$VER")
VENV=$EDGE/venv-old-x86
RUNDIR=$EDGE/x86-tests
LAUNCHER=$VENV/bin/python-qemu

step "wheel"
ensure_wheels
WHL=$(wheel_for "$VER" x86_64)
echo "$WHL"

step "CPython $VER venv with the wheel, numpy $NUMPY, ${TEST_PACKAGES[*]}"
rm -rf "$VENV" "$RUNDIR"
"$(host_python "$VER")" -m venv "$VENV"
"$VENV/bin/pip" install -q "$WHL" "numpy==$NUMPY" "${TEST_PACKAGES[@]}"
# The launcher sits in the venv's bin, so Python finds pyvenv.cfg from it.
# OPENBLAS_CORETYPE, where the host sets it (Haswell, say), would make
# numpy's OpenBLAS run AVX2 kernels on the emulated CPU: unset, OpenBLAS
# reads the emulated CPU's cpuid as on a real old machine.
cat >"$LAUNCHER" <<SH
#!/bin/sh
unset OPENBLAS_CORETYPE
exec qemu-x86_64 -cpu "$CPU" -0 "\$0" "$VENV/bin/python" "\$@"
SH
chmod +x "$LAUNCHER"
copy_tests "$RUNDIR"
golden_dir
cd "$RUNDIR"
unset CFBN_FORCE_ISA

step "runtime_info under qemu-x86_64 -cpu $CPU"
"$LAUNCHER" - "$VENV" <<'PY'
import sys
import cfbn
info = cfbn.runtime_info()
print("cfbn from", cfbn.__file__)
print(info)
assert cfbn.__file__.startswith(sys.argv[1] + "/"), "not the installed wheel"
assert "avx2" in info["compiled_isas"], info
assert info["supported_isas"] == ["scalar"], info
assert info["selected_isa"] == "scalar", info
PY

step "CFBN_FORCE_ISA=avx2 on $CPU: a clear error, not SIGILL"
set +e
CFBN_FORCE_ISA=avx2 "$LAUNCHER" -c 'import cfbn' 2>"$EDGE/force-avx2.err"
rc=$?
set -e
tail -1 "$EDGE/force-avx2.err"
echo "exit status $rc"
[ "$rc" -eq 1 ] || die "expected exit status 1 (an exception), got $rc"
grep -q "CFBN_FORCE_ISA" "$EDGE/force-avx2.err" && grep -q "avx2" "$EDGE/force-avx2.err" \
    || die "the error does not name CFBN_FORCE_ISA and avx2"

what=(tests)
[ -z "${CFBN_OLD_X86_SUBSET:-}" ] || what=(tests/test_forward.py tests/test_grad.py tests/test_isa_selected.py
    tests/test_dispatch.py tests/test_errors.py tests/test_main.py tests/test_special_values.py)
step "pytest under qemu-x86_64 -cpu $CPU: scalar table selected; ${what[*]}"
rc=0
CFBN_EXPECT_ISA=scalar run_suite old-x86 \
    "$LAUNCHER" -m pytest "${what[@]}" -q -p no:cacheprovider ${PYTEST_ARGS:-} || rc=$?

timings
[ "$rc" -eq 0 ] || die "pytest failed under qemu-x86_64 -cpu $CPU"
