#!/usr/bin/env bash
# Runs the test suite against the repaired aarch64 wheel with Debian's arm64
# CPython 3.11 under qemu-user (tools/make_arm64_sysroot.sh): once as detected,
# where the NEON table must be the one selected, and once with
# CFBN_FORCE_ISA=scalar.  The two runs go side by side: Python under qemu keeps
# about one core busy each.
#
# The ISA-parametrized tests (the isa fixture of tests/conftest.py) run every
# table whichever is selected at import, so each run keeps its own table's
# instances of them: the first deselects the scalar ones (-k "not scalar"),
# the forced run the NEON ones (-k "not neon"); both run every other test,
# with their table chosen at import.  CFBN_SCALAR_FULL=1 runs the whole
# suite in both.
#
# The wheel is installed with pip --target --platform into the sysroot's
# /usr/local/lib/python3.11/dist-packages, as on a device, and the tests run
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
# core, Armv8.0-A without optional extensions), PYTEST_ARGS.
set -euo pipefail
. "$(dirname "$0")/_lib.sh"
need qemu-aarch64 aarch64-linux-gnu-gcc

CPU=${CFBN_QEMU_AARCH64_CPU:-cortex-a72}
RUNDIR=$EDGE/aarch64-tests      # copy of tests/, no cfbn/ beside it
LAUNCHER=$ARM64_ROOT/usr/bin/python3.11-qemu

step "wheel and sysroot"
ensure_wheels
WHL=$(one_file "$ROOT/wheelhouse/cfbn-*manylinux*_aarch64.whl")
bash "$ROOT/tools/make_arm64_sysroot.sh"
echo "$WHL"

step "install the wheel for the target (pip --target --platform)"
rm -rf "$ARM64_SITE"/cfbn "$ARM64_SITE"/cfbn-*.dist-info "$ARM64_SITE"/cfbn.libs
"$HOST_PYTHON" -m pip install -q --no-deps --target "$ARM64_SITE" "${ARM64_PIP_TARGET[@]}" "$WHL"
# In the sysroot's bin, the launcher lets Python find its prefix (sysroot/usr)
# from sys.executable.
cat >"$LAUNCHER" <<SH
#!/bin/sh
exec qemu-aarch64 -cpu "$CPU" -L "$ARM64_ROOT" -0 "\$0" "$ARM64_PYTHON" "\$@"
SH
chmod +x "$LAUNCHER"
copy_tests "$RUNDIR"
golden_dir
unset PYTHONPATH CFBN_FORCE_ISA
export CC=aarch64-linux-gnu-gcc
cd "$RUNDIR"

step "runtime_info under qemu-aarch64 -cpu $CPU"
"$LAUNCHER" - "$ARM64_SITE" <<'PY'
import platform, sys
import cfbn
info = cfbn.runtime_info()
print("machine", platform.machine(), "python", sys.version.split()[0], "cfbn from", cfbn.__file__)
print(info)
assert platform.machine() == "aarch64"
assert cfbn.__file__.startswith(sys.argv[1] + "/"), "not the installed wheel"
assert info["selected_isa"] == "neon", info
PY

step "pytest under qemu-aarch64, side by side: NEON table selected | CFBN_FORCE_ISA=scalar"
neon_only=(-k "not scalar")
scalar_only=(-k "not neon")
[ -z "${CFBN_SCALAR_FULL:-}" ] || { neon_only=(); scalar_only=(); }
CFBN_EXPECT_ISA=neon run_suite aarch64-neon \
    "$LAUNCHER" -m pytest tests -q -p no:cacheprovider "${neon_only[@]}" ${PYTEST_ARGS:-} \
    >"$EDGE/summary-neon.txt" &
neon=$!
CFBN_FORCE_ISA=scalar CFBN_EXPECT_ISA=scalar run_suite aarch64-scalar \
    "$LAUNCHER" -m pytest tests -q -p no:cacheprovider "${scalar_only[@]}" ${PYTEST_ARGS:-} \
    >"$EDGE/summary-scalar.txt" &
scalar=$!
failed=()
wait "$neon" || failed+=(neon)
wait "$scalar" || failed+=(scalar)
echo "NEON table selected ${neon_only[*]}:"
cat "$EDGE/summary-neon.txt"
echo "CFBN_FORCE_ISA=scalar ${scalar_only[*]}:"
cat "$EDGE/summary-scalar.txt"

timings
[ ${#failed[@]} -eq 0 ] || die "pytest failed under qemu-aarch64: ${failed[*]}"
