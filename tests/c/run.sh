#!/bin/sh
# Builds tests/c/kernel_check.c against the ISA kernel files and runs it:
#   - on the host (x86_64: bn_avx2.c, and bn_avx512.c natively where the CPU
#     has AVX-512, and with CFBN_CHECK_AVX512_SIMDE=1 through SIMDe's
#     emulation of its intrinsics (apt-get install libsimde-dev), slow to
#     compile; aarch64: bn_neon.c);
#   - tests/c/lanes_table.c: the shared plain and streaming loops as a table
#     over portable primitives at 4, 8 and 16 floats a vector, through
#     kernel_check;
#   - tests/c/vec_check.c: each ISA's primitives (csrc/vec_<isa>.h) against
#     tests/c/vec_portable.h, bit for bit: AVX2 natively, AVX-512 through
#     SIMDe and natively where the CPU has it, NEON natively or under qemu;
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

AVX512_FLAGS="-mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c"
# whether this CPU runs what bn_avx512.c is compiled for
has_avx512() {
    flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
    for f in avx512f avx512bw avx512vl avx512dq fma f16c; do
        case " $flags " in *" $f "*) ;; *) return 1 ;; esac
    done
}

host=$(uname -m)
case "$host" in
x86_64|amd64)
    # Only the AVX2 file gets the ISA flags, as in the real build.
    $CC $CFLAGS -mavx2 -mfma -mf16c -DCFBN_HAVE_AVX2 -c "$ROOT/csrc/bn_avx2.c" -o "$BUILD_DIR/bn_avx2.o"
    $CC $CFLAGS -DCFBN_HAVE_AVX2 $SRC "$BUILD_DIR/bn_avx2.o" -lm -o "$BUILD_DIR/kernel_check_avx2"
    "$BUILD_DIR/kernel_check_avx2"
    # AVX-512: the real intrinsics, always built and run where the CPU has
    # them; and through SIMDe, which emulates them on AVX2 (SIMDe's 64-byte
    # vectors draw GCC's note on their argument passing: -Wno-psabi)
    $CC $CFLAGS $AVX512_FLAGS -DCFBN_HAVE_AVX512 -c "$ROOT/csrc/bn_avx512.c" -o "$BUILD_DIR/bn_avx512.o"
    $CC $CFLAGS -DCFBN_HAVE_AVX512 $SRC "$BUILD_DIR/bn_avx512.o" -lm -o "$BUILD_DIR/kernel_check_avx512"
    if has_avx512; then
        "$BUILD_DIR/kernel_check_avx512"
    else
        echo "kernel_check avx512: built, not run (this CPU has no AVX-512)"
    fi
    # The whole AVX-512 table through SIMDe takes GCC about 8 minutes and
    # 5 GB at -O1 (more than a quarter of an hour at -O2): only with
    # CFBN_CHECK_AVX512_SIMDE=1.  Without it, vec_check below compares every
    # AVX-512 primitive with its portable meaning through SIMDe, and the
    # lanes table runs the plain loops at AVX-512's lane counts.
    if [ "${CFBN_CHECK_AVX512_SIMDE:-0}" = 1 ]; then
        $CC $(printf '%s' "$CFLAGS" | sed 's/-O2/-O1/') -Wno-psabi -mavx2 -mfma -mf16c -DCFBN_VEC_SIMDE -DCFBN_HAVE_AVX512 -c "$ROOT/csrc/bn_avx512.c" \
            -o "$BUILD_DIR/bn_avx512_simde.o"
        $CC $CFLAGS -DCFBN_HAVE_AVX512 $SRC "$BUILD_DIR/bn_avx512_simde.o" -lm -o "$BUILD_DIR/kernel_check_avx512_simde"
        KERNEL_CHECK_SHORT=1 "$BUILD_DIR/kernel_check_avx512_simde"
    fi
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

# The shared plain and streaming loops as a table over portable primitives
# (tests/c/lanes_table.c), through kernel_check like an ISA's table, at 4, 8
# and 16 floats a vector (2, 4 and 8 doubles).
$CC $CFLAGS -DCFBN_HAVE_LANES -c "$ROOT/tests/c/kernel_check.c" -o "$BUILD_DIR/kernel_check_lanes.o"
for lanes in 2 4 8; do
    $CC $CFLAGS -DLANES=$lanes -c "$ROOT/tests/c/lanes_table.c" -o "$BUILD_DIR/lanes_table_$lanes.o"
    $CC $CFLAGS "$BUILD_DIR/kernel_check_lanes.o" "$BUILD_DIR/lanes_table_$lanes.o" "$ROOT/csrc/bn_scalar.c" \
        "$ROOT/csrc/bn_route.c" -lm -o "$BUILD_DIR/kernel_check_lanes_$lanes"
    KERNEL_CHECK_SHORT=1 "$BUILD_DIR/kernel_check_lanes_$lanes"
done
# vec_check NAME CC ISA_FLAGS LANES [RUNNER...]: tests/c/vec_check.c built
# twice and linked, the ISA's side with ISA_FLAGS and the portable side at
# LANES doubles a vector, then run through RUNNER (env: as it is; no
# RUNNER: built only).  Each operation rounds once on both sides
# (-ffp-contract=off); SIMDe's 64-byte vectors draw GCC's note on their
# argument passing (-Wno-psabi).
VEC_FLAGS="$CFLAGS -ffp-contract=off -Wno-psabi -I$ROOT/tests/c"
vec_check() {
    name=$1 vcc=$2 isa=$3 lanes=$4
    shift 4
    $vcc $VEC_FLAGS -DVEC_REF -DLANES="$lanes" -c "$ROOT/tests/c/vec_check.c" -o "$BUILD_DIR/vec_ref_$name.o"
    $vcc $VEC_FLAGS $isa -c "$ROOT/tests/c/vec_check.c" -o "$BUILD_DIR/vec_isa_$name.o"
    $vcc "$BUILD_DIR/vec_ref_$name.o" "$BUILD_DIR/vec_isa_$name.o" -lm -o "$BUILD_DIR/vec_check_$name"
    [ "$#" -eq 0 ] || "$@" "$BUILD_DIR/vec_check_$name"
}

case "$host" in
x86_64|amd64)
    vec_check avx2 "$CC" "-DVEC_AVX2 -mavx2 -mfma -mf16c" 4 env
    # SIMDe emulates the AVX-512 intrinsics on AVX2 (its own flags: the
    # 256-bit halves and F16C native, as on every AVX-512 CPU)
    if echo '#include <simde/x86/avx512.h>' | $CC -E - >/dev/null 2>&1; then
        vec_check avx512_simde "$CC" "-DVEC_AVX512 -DCFBN_VEC_SIMDE -mavx2 -mfma -mf16c" 8 env
    else
        echo "vec_check avx512 (SIMDe): skipped (libsimde-dev not installed)"
    fi
    # the real intrinsics: always built, run where the CPU has them
    vec_check avx512 "$CC" "-DVEC_AVX512 $AVX512_FLAGS" 8
    if has_avx512; then
        "$BUILD_DIR/vec_check_avx512"
    else
        echo "vec_check avx512: built, not run (this CPU has no AVX-512)"
    fi
    ;;
aarch64|arm64)
    vec_check neon "$CC" "-DVEC_NEON" 2 env
    ;;
esac

if [ "$host" != aarch64 ] && [ "$host" != arm64 ]; then
    if command -v "$CROSS_CC" >/dev/null 2>&1 && command -v "$QEMU" >/dev/null 2>&1; then
        $CROSS_CC $CFLAGS -march=armv8-a -DCFBN_HAVE_NEON $SRC "$ROOT/csrc/bn_neon.c" -lm \
            -o "$BUILD_DIR/kernel_check_neon"
        "$QEMU" -L /usr/aarch64-linux-gnu "$BUILD_DIR/kernel_check_neon"
        vec_check neon "$CROSS_CC" "-march=armv8-a -DVEC_NEON" 2 "$QEMU" -L /usr/aarch64-linux-gnu
    else
        echo "kernel_check neon: skipped ($CROSS_CC or $QEMU not installed)"
    fi
fi
