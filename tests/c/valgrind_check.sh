#!/bin/sh
# Runs the C harnesses under valgrind's memcheck, which reports any read or
# write outside an allocation and any use of memory no one wrote:
#   - tests/c/driver_check.c: the driver entry points with every kernel table
#     this CPU supports, shapes with odd tails, one and three OpenMP threads,
#     and calls from inside an OpenMP parallel region;
#   - tests/c/kernel_check.c: every kernel of the host's ISA tables against
#     the scalar table, in its short form (KERNEL_CHECK_SHORT: the fused
#     cases once, the routing fallbacks through the fused cases only).
# valgrind runs AVX2, FMA and F16C code, so the AVX2 table is exercised too;
# the script fails if valgrind's CPU hides an ISA the host supports.
# Exits non-zero on any valgrind error or failed check.
# Environment: CC (default gcc), VALGRIND (default valgrind), BUILD_DIR.
set -eu

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CC=${CC:-gcc}
VALGRIND=${VALGRIND:-valgrind}
if ! command -v "$VALGRIND" >/dev/null 2>&1; then
    echo "valgrind_check: $VALGRIND not installed (apt-get install valgrind)" >&2
    exit 2
fi
if [ -z "${BUILD_DIR:-}" ]; then
    BUILD_DIR=$(mktemp -d)
    trap 'rm -rf "$BUILD_DIR"' EXIT
fi
mkdir -p "$BUILD_DIR"

CFLAGS="-O2 -g -std=c11 -Wall -Wextra -Werror -fopenmp -pthread -I$ROOT/csrc"
# the driver's calls gained a fused-operation argument; build against either form
if grep -q "cfbn_fusion" "$ROOT/csrc/cfbn.h"; then
    CFLAGS="$CFLAGS -DCFBN_DRIVER_FUSION"
fi
BASE="$ROOT/csrc/bn_scalar.c $ROOT/csrc/bn_route.c $ROOT/csrc/bn_driver.c $ROOT/csrc/scratch.c $ROOT/csrc/dispatch.c"
ISA_OBJ=""
ISA_DEF=""
case "$(uname -m)" in
x86_64|amd64)
    # only the AVX2 file gets the ISA flags, as in the real build
    $CC $CFLAGS -mavx2 -mfma -mf16c -DCFBN_HAVE_AVX2 -c "$ROOT/csrc/bn_avx2.c" \
        -o "$BUILD_DIR/bn_avx2.o"
    ISA_OBJ="$BUILD_DIR/bn_avx2.o"
    ISA_DEF="-DCFBN_HAVE_AVX2"
    ;;
aarch64|arm64)
    $CC $CFLAGS -DCFBN_HAVE_NEON -c "$ROOT/csrc/bn_neon.c" -o "$BUILD_DIR/bn_neon.o"
    ISA_OBJ="$BUILD_DIR/bn_neon.o"
    ISA_DEF="-DCFBN_HAVE_NEON"
    ;;
esac
# shellcheck disable=SC2086
$CC $CFLAGS $ISA_DEF "$ROOT/tests/c/driver_check.c" $BASE $ISA_OBJ -lm \
    -o "$BUILD_DIR/driver_check"
# shellcheck disable=SC2086
$CC $CFLAGS $ISA_DEF "$ROOT/tests/c/kernel_check.c" "$ROOT/csrc/bn_scalar.c" "$ROOT/csrc/bn_route.c" $ISA_OBJ -lm \
    -o "$BUILD_DIR/kernel_check"

# passive OpenMP waiting: spinning threads make valgrind's serialized run crawl
export OMP_WAIT_POLICY=passive
VG="$VALGRIND --tool=memcheck --error-exitcode=1 --track-origins=yes --leak-check=full \
--errors-for-leak-kinds=definite --show-leak-kinds=definite -q"

echo "valgrind_check: natively"
native=$("$BUILD_DIR/driver_check")
echo "$native"
echo "valgrind_check: driver_check under memcheck"
# shellcheck disable=SC2086
under=$($VG "$BUILD_DIR/driver_check")
echo "$under"
for isa in $(echo "$native" | sed -n 's/^driver_check \([a-z0-9]*\): .*/\1/p'); do
    if ! echo "$under" | grep -q "^driver_check $isa: ok"; then
        echo "valgrind_check: the $isa table did not run under valgrind" >&2
        exit 1
    fi
done
echo "valgrind_check: kernel_check under memcheck"
# shellcheck disable=SC2086
KERNEL_CHECK_SHORT=1 $VG "$BUILD_DIR/kernel_check" | tail -n 3
echo "valgrind_check: ok"
