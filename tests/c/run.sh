#!/bin/sh
# Builds tests/c/kernel_check.c against the ISA kernel files and runs it:
#   - on the host (x86_64: bn_avx2.c; aarch64: bn_neon.c);
#   - tests/c/simd_lanes_check.c: the shared loops of bn_simd.c at several
#     lane counts, against the scalar table;
#   - tests/c/lanes_table.c: the shared float and float64 loops as a table
#     at several lane counts, through kernel_check;
#   - on x86_64 hosts, also cross-built for aarch64 and run under qemu-user
#     when aarch64-linux-gnu-gcc and qemu-aarch64 are installed
#     (apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user).
# Exits non-zero if any build or check fails.
# Environment: CC (host compiler, default gcc), CROSS_CC (default
# aarch64-linux-gnu-gcc), QEMU (default qemu-aarch64), BUILD_DIR.
set -eu

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CC=${CC:-gcc}
CROSS_CC=${CROSS_CC:-aarch64-linux-gnu-gcc}
QEMU=${QEMU:-qemu-aarch64}
if [ -z "${BUILD_DIR:-}" ]; then
    BUILD_DIR=$(mktemp -d)
    trap 'rm -rf "$BUILD_DIR"' EXIT
fi
mkdir -p "$BUILD_DIR"
CFLAGS="-O2 -Wall -Wextra -Werror -I$ROOT/csrc"
SRC="$ROOT/tests/c/kernel_check.c $ROOT/csrc/bn_scalar.c $ROOT/csrc/bn_route.c"

host=$(uname -m)
case "$host" in
x86_64|amd64)
    # Only the AVX2 file gets the ISA flags, as in the real build.
    $CC $CFLAGS -mavx2 -mfma -mf16c -DCFBN_HAVE_AVX2 -c "$ROOT/csrc/bn_avx2.c" -o "$BUILD_DIR/bn_avx2.o"
    $CC $CFLAGS -DCFBN_HAVE_AVX2 $SRC "$BUILD_DIR/bn_avx2.o" -lm -o "$BUILD_DIR/kernel_check_avx2"
    "$BUILD_DIR/kernel_check_avx2"
    ;;
aarch64|arm64)
    $CC $CFLAGS -DCFBN_HAVE_NEON $SRC "$ROOT/csrc/bn_neon.c" -lm -o "$BUILD_DIR/kernel_check_neon"
    "$BUILD_DIR/kernel_check_neon"
    ;;
*)
    $CC $CFLAGS $SRC -lm -o "$BUILD_DIR/kernel_check_scalar"
    "$BUILD_DIR/kernel_check_scalar"
    ;;
esac

# The loops of bn_simd.c over a portable stand-in for an ISA header, at
# lane counts this CPU may lack (2: NEON, 4: AVX2, 8: AVX-512 doubles).
for lanes in 2 4 8 16; do
    $CC $CFLAGS -DLANES=$lanes "$ROOT/tests/c/simd_lanes_check.c" "$ROOT/csrc/bn_scalar.c" "$ROOT/csrc/bn_route.c" \
        -lm -o "$BUILD_DIR/simd_lanes_check_$lanes"
    "$BUILD_DIR/simd_lanes_check_$lanes"
done

# The shared float and float64 loops (bn_simd.c, bn_simd_float.c) as a whole
# table over a portable header (tests/c/lanes_table.c), through kernel_check
# like an ISA's table, at 4, 8 and 16 floats a vector (2, 4 and 8 doubles).
$CC $CFLAGS -DCFBN_HAVE_LANES -c "$ROOT/tests/c/kernel_check.c" -o "$BUILD_DIR/kernel_check_lanes.o"
for lanes in 2 4 8; do
    $CC $CFLAGS -DLANES=$lanes -c "$ROOT/tests/c/lanes_table.c" -o "$BUILD_DIR/lanes_table_$lanes.o"
    $CC $CFLAGS "$BUILD_DIR/kernel_check_lanes.o" "$BUILD_DIR/lanes_table_$lanes.o" "$ROOT/csrc/bn_scalar.c" \
        "$ROOT/csrc/bn_route.c" -lm -o "$BUILD_DIR/kernel_check_lanes_$lanes"
    KERNEL_CHECK_SHORT=1 "$BUILD_DIR/kernel_check_lanes_$lanes"
done

if [ "$host" != aarch64 ] && [ "$host" != arm64 ]; then
    if command -v "$CROSS_CC" >/dev/null 2>&1 && command -v "$QEMU" >/dev/null 2>&1; then
        $CROSS_CC $CFLAGS -march=armv8-a -DCFBN_HAVE_NEON $SRC "$ROOT/csrc/bn_neon.c" -lm \
            -o "$BUILD_DIR/kernel_check_neon"
        "$QEMU" -L /usr/aarch64-linux-gnu "$BUILD_DIR/kernel_check_neon"
    else
        echo "kernel_check neon: skipped ($CROSS_CC or $QEMU not installed)"
    fi
fi
