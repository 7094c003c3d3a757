#!/bin/sh
# The AVX2 table of the working tree against the one of a git revision, side
# by side in one process (benchmarks/table_ab.c): new/old per cell.
#   sh benchmarks/table_ab.sh [REV [ENTRY]]   (default HEAD; ENTRY: that entry's
#                                             cells only, e.g. gstats_run)
#   NEW_CFLAGS=-O2 sh benchmarks/table_ab.sh HEAD   (the same source, other flags)
#   AB_CFLAGS="-falign-functions=64 -falign-loops=64" sh benchmarks/table_ab.sh
# Each table is compiled with setup.py's flags for bn_avx2.c (about a minute
# each) and AB_CFLAGS, the working tree's followed by NEW_CFLAGS; run it on a
# quiet machine.  Loops in L2 are sensitive to where they lie: unchanged code
# has read 1.3x new/old after an edit elsewhere in the file, and 0.99-1.02
# with both tables aligned as above.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
REV=${1:-HEAD}
ONLY=${2:-}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
FLAGS="-O3 ${AB_CFLAGS:-} -std=c11 -fPIC -g1 -fno-math-errno -fvisibility=hidden -mavx2 -mfma -mf16c -DCFBN_HAVE_AVX2"
mkdir "$WORK/old"
git -C "$ROOT" archive "$REV" csrc | tar -x -C "$WORK/old"
gcc $FLAGS -Dcfbn_kernels_avx2=old_kernels -I"$WORK/old/csrc" -c "$WORK/old/csrc/bn_avx2.c" -o "$WORK/old.o" &
gcc $FLAGS ${NEW_CFLAGS:-} -I"$ROOT/csrc" -c "$ROOT/csrc/bn_avx2.c" -o "$WORK/new.o"
wait
gcc -O2 -std=c11 -DCFBN_HAVE_AVX2 -I"$ROOT/csrc" "$ROOT/benchmarks/table_ab.c" "$WORK/old.o" "$WORK/new.o" -lm \
    -o "$WORK/table_ab"
echo "old: $REV ($(git -C "$ROOT" rev-parse --short "$REV")), new: the working tree${NEW_CFLAGS:+, with $NEW_CFLAGS}${AB_CFLAGS:+; both with $AB_CFLAGS}"
"$WORK/table_ab" $ONLY
