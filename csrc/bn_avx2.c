/* AVX2 + FMA + F16C kernels.  Only this file is compiled with -mavx2 -mfma
 * -mf16c, and everything in it is static except the table: a helper with
 * external linkage could be merged with a baseline copy by the linker and
 * then run on a CPU without AVX2.  Same contracts as bn_scalar.c.  The
 * primitives (masks, loads and stores of each storage type, float16 and
 * bfloat16 conversions, horizontal sums) are in vec_avx2.h; the loops
 * shared with other ISAs (so far the float64 plain entries) in bn_simd.c.
 *
 * f32, f16 and bf16 share their bodies (a constant `dt`, the storage type,
 * that always_inline folds away; bn_entries.h makes the entries); f64 has
 * its own.  Rows kernels whose width divides the vector period (16 floats,
 * 8 doubles) run as one flat stream with per-lane parameters, because then
 * every lane always sees the same column; other widths go row by row with a
 * masked tail.
 *
 * Fused activations of f32, f16 and bf16 tensors run inside the vector loops (the
 * *_fused_* entries): relu, relu6 and leaky relu by max/min/blend; elu,
 * sigmoid, tanh and silu through exp_ps, a Cephes-style expf.  float64
 * tensors take the routing layer's fallback: these plain kernels over
 * L1-sized blocks and bn_math.h's libm formulas.
 *
 * The second-order gradient's entries (gg*) exist for all four dtypes; their
 * loops are bn_simd_gg.c's. */
#include "cfbn.h"
#include "bn_runs.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "bn_act.h"
#include "bn_entries.h"
#include "storage.h"
#include "vec_avx2.h"
#include "bn_simd.c"
#include "bn_simd_float.c"

#include "bn_simd_fused.c"

/* ---- second-order gradient: its loops, written once for every ISA ---- */
#include "bn_simd_gg.c"

/* ---- float32, float16 and bfloat16 entries ---- */

CFBN_FLOAT_ENTRIES(f32, CFBN_F32, ps)
CFBN_FLOAT_ENTRIES(f16, CFBN_F16, ps)
CFBN_FLOAT_ENTRIES(bf16, CFBN_BF16, ps)

const cfbn_kernels cfbn_kernels_avx2 = {
    .name = "avx2",
    .lanes = 8,
    .f32 = { CFBN_FLOAT_TABLE(f32), EXTRA_TABLE(f32), CFBN_GG_TABLE(f32), GG_RUNS_TABLE(f32) },
    .f64 = {
        stats_run_f64, stats_rows_f64, apply_run_f64, apply_rows_f64,
        gstats_run_f64, gstats_rows_f64, gapply_run_f64, gapply_rows_f64,
        .ggstats_run = ggstats_run_f64, .ggstats_rows = ggstats_rows_f64,
        .ggapply_run = ggapply_run_f64, .ggapply_rows = ggapply_rows_f64,
    },
    .f16 = { CFBN_FLOAT_TABLE(f16), EXTRA_TABLE(f16), CFBN_GG_TABLE(f16), GG_RUNS_TABLE(f16) },
    .bf16 = { CFBN_FLOAT_TABLE(bf16), EXTRA_TABLE(bf16), CFBN_GG_TABLE(bf16), GG_RUNS_TABLE(bf16) },
};

#endif
