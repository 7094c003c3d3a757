#!/bin/sh
# The AVX-512 table against the AVX2 table of the working tree, entry by entry,
# side by side in one process (benchmarks/table_ab.c, "new" AVX-512, "old"
# AVX2): avx512/avx2 time per cell, one thread, float32.  Needs a CPU with
# AVX-512 (F, BW, VL, DQ).  Rows are 64 and 48 wide (48: the driver's
# widening of 24 channels to 16 lanes).
#   sh benchmarks/isa_ab.sh [ENTRY]
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
grep -q avx512bw /proc/cpuinfo || { echo "isa_ab.sh: this CPU has no AVX-512" >&2; exit 2; }
BASE="-O3 ${AB_CFLAGS:-} -std=c11 -fPIC -g1 -fno-math-errno -fvisibility=hidden -I$ROOT/csrc"
gcc $BASE -mavx2 -mfma -mf16c -DCFBN_HAVE_AVX2 -Dcfbn_kernels_avx2=old_kernels \
    -c "$ROOT/csrc/bn_avx2.c" -o "$WORK/avx2.o" &
gcc $BASE -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c -DCFBN_HAVE_AVX512 \
    -Dcfbn_kernels_avx512=cfbn_kernels_avx2 -c "$ROOT/csrc/bn_avx512.c" -o "$WORK/avx512.o"
wait
gcc -O2 -std=c11 -DCFBN_HAVE_AVX2 -DTABLE_AB_WIDTH2=48 -I"$ROOT/csrc" "$ROOT/benchmarks/table_ab.c" \
    "$WORK/avx2.o" "$WORK/avx512.o" -lm -o "$WORK/isa_ab"
echo "new: the AVX-512 table, old: the AVX2 table (working tree); $(grep -m1 'model name' /proc/cpuinfo)"
"$WORK/isa_ab" "$@"
