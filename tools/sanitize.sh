#!/usr/bin/env bash
# Builds cfbn._kernels with AddressSanitizer and UndefinedBehaviorSanitizer in a
# copy of the source tree (so the development build in cfbn/ is left alone) and
# runs the test suite against it once per ISA this CPU supports
# (CFBN_FORCE_ISA=scalar, avx2 or neon), with the sanitizer runtimes preloaded
# into the uninstrumented Python.  Exits non-zero on a failed test or on any
# sanitizer report.
#
# Not run under the sanitizers: tests/test_leaks.py (ASan's quarantine holds
# freed memory back on purpose, so resident size is not flat), the opt-in
# tests/test_large.py and tests/test_bn_math.py (it replays the CUDA formulas
# through its own, uninstrumented build of bn_math.h).  Leak detection is
# off: CPython keeps its own allocations until exit, which LeakSanitizer
# would report.
#
# Environment: PYTHON (default python), CC (default gcc), BUILD_DIR (default
# build/sanitize), PYTEST_ARGS (extra pytest arguments, e.g. "-k forward"),
# SANITIZE_PHASE (build: only the build; test: only the tests, on the build
# a previous `build` left in BUILD_DIR; default both).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python}
CC=${CC:-gcc}
BUILD_DIR=${BUILD_DIR:-$ROOT/build/sanitize}
SRC=$BUILD_DIR/src
LOG=$BUILD_DIR/log
PHASE=${SANITIZE_PHASE:-all}
case "$PHASE" in build|test|all) ;; *) echo "sanitize: SANITIZE_PHASE must be build, test or all, not '$PHASE'" >&2; exit 2 ;; esac
SAN_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g1 -O1"

asan_rt=$($CC -print-file-name=libasan.so)
ubsan_rt=$($CC -print-file-name=libubsan.so)
for rt in "$asan_rt" "$ubsan_rt"; do
    if [ ! -e "$rt" ]; then
        echo "sanitize: $CC has no $(basename "$rt") (install the compiler's sanitizer runtimes)" >&2
        exit 2
    fi
done

if [ "$PHASE" != test ]; then
    echo "sanitize: copying the sources to $SRC"
    rm -rf "$SRC" "$LOG"
    mkdir -p "$SRC" "$LOG"
    (cd "$ROOT" && tar cf - --exclude=__pycache__ --exclude='*.so' --exclude=cfbn/_kernels.c \
        setup.py pyproject.toml csrc cfbn tests) | (cd "$SRC" && tar xf -)

    echo "sanitize: building with $SAN_FLAGS"
    # The -O1 of CFLAGS replaces setup.py's -O3: at -O3 the instrumented AVX2 file
    # alone takes many minutes to compile, and the sanitizers see the same accesses.
    # -g1: the line tables a report's stack trace needs, at half the compile time
    # of full debug info.
    (cd "$SRC" && CC=$CC CFLAGS="$SAN_FLAGS" LDFLAGS="-fsanitize=address,undefined" \
        "$PYTHON" setup.py -q build_ext --inplace >"$LOG/build.txt" 2>&1) || {
        cat "$LOG/build.txt" >&2
        exit 1
    }
    echo "sanitize: built"
fi
[ "$PHASE" != build ] || exit 0
if ! ls "$SRC"/cfbn/_kernels*.so >/dev/null 2>&1; then
    echo "sanitize: no build in $SRC (run with SANITIZE_PHASE=build first)" >&2
    exit 2
fi

export LD_PRELOAD="$asan_rt $ubsan_rt"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1
export PYTHONPATH=$SRC
export PYTHONDONTWRITEBYTECODE=1
cd "$SRC"

# the tests must import the sanitized build, not the development one
"$PYTHON" - "$SRC" <<'EOF'
import os, sys
import cfbn
where = os.path.realpath(cfbn._kernels.__file__)
if not where.startswith(os.path.realpath(sys.argv[1]) + os.sep):
    sys.exit("sanitize: imported %s instead of the sanitized build" % where)
EOF
isas=$("$PYTHON" -c 'import cfbn; print(" ".join(cfbn.runtime_info()["supported_isas"]))')

# One suite per ISA, side by side: each pytest process is mostly one core of
# Python, so on a 2-core machine the suites take about the time of one.  The
# tests parametrized by the isa fixture (tests/conftest.py) run every table
# whichever is selected at import, so each suite keeps only its own table's
# instances of them (-k "not <other ISAs>") and all the other tests.
run_isa() {
    local isa=$1 start rc other expr=""
    for other in $isas; do
        [ "$other" = "$isa" ] || expr="${expr:+$expr and }not $other"
    done
    start=$(date +%s)
    set +e
    # shellcheck disable=SC2086
    CFBN_FORCE_ISA=$isa "$PYTHON" -m pytest tests -q -p no:cacheprovider -x \
        --ignore=tests/test_leaks.py --ignore=tests/test_large.py --ignore=tests/test_bn_math.py ${expr:+-k "$expr"} ${PYTEST_ARGS:-} \
        >"$LOG/tests-$isa.txt" 2>&1
    rc=$?
    set -e
    echo "$rc $(( $(date +%s) - start ))" >"$LOG/rc-$isa"
}
pids=()
for isa in $isas; do
    echo "sanitize: tests with CFBN_FORCE_ISA=$isa"
    run_isa "$isa" &
    pids+=($!)
done
wait "${pids[@]}"

status=0
for isa in $isas; do
    read -r rc secs <"$LOG/rc-$isa"
    echo "sanitize: $isa:"
    tail -n 3 "$LOG/tests-$isa.txt"
    if grep -qE "ERROR: AddressSanitizer|runtime error:|SUMMARY: (Address|UndefinedBehavior)Sanitizer" \
            "$LOG/tests-$isa.txt"; then
        echo "sanitize: $isa: sanitizer report:" >&2
        grep -E -A40 "ERROR: AddressSanitizer|runtime error:" "$LOG/tests-$isa.txt" | head -n 80 >&2
        status=1
    elif [ "$rc" -ne 0 ]; then
        echo "sanitize: $isa: tests failed (exit $rc); see $LOG/tests-$isa.txt" >&2
        tail -n 40 "$LOG/tests-$isa.txt" >&2
        status=1
    fi
    echo "sanitize: $isa: $secs s"
done
exit $status
