/* The vector loops, written once for every ISA, and the ISA's kernel table
 * made of them.  An ISA file is its primitives and this file:
 *
 *     #include "vec_avx2.h"                     vf, vd, VF_LANES, vf_ld, ...
 *     #define SIMD_TABLE cfbn_kernels_avx2      the table's name (cfbn.h)
 *     #define SIMD_NAME "avx2"
 *     #include "bn_simd.c"
 *
 * compiled alone with that ISA's flags (setup.py), so every loop here
 * becomes that ISA's code, static in its translation unit; only the table
 * is exported.  tests/c/lanes_table.c includes it the same way over a
 * portable header, at lane counts no CPU of the build machine may have.
 * Nothing here names an instruction set.  The families:
 *
 *   bn_simd_f64.c    float64 plain entries
 *   bn_simd_float.c  float32/float16/bfloat16 plain and streaming entries,
 *                    and the helpers (sums, parameters, tails) the others use
 *   bn_simd_fused.c  fused activation and side input; several runs a call
 *   bn_simd_gg.c     second-order gradient, every storage type
 *
 * The contracts are cfbn.h's; bn_scalar.c, written separately, is the table
 * every one built from here is tested against (tests/c/run.sh). */
#if !defined(VF_LANES) || !defined(SIMD_TABLE) || !defined(SIMD_NAME)
#error "bn_simd.c is included after an ISA's vec_<isa>.h, with SIMD_TABLE and SIMD_NAME defined"
#endif
#if VF_LANES != 2 * VD_LANES
#error "an ISA's vf holds twice the lanes of its vd"
#endif

#include <float.h>
#include <math.h>
#include <string.h>

#include "bn_act.h"
#include "bn_entries.h"
#include "bn_runs.h"
#include "cfbn.h"
#include "storage.h"

#include "bn_simd_f64.c"
#include "bn_simd_float.c"
#include "bn_simd_fused.c"
#include "bn_simd_gg.c"

CFBN_FLOAT_ENTRIES(f32, CFBN_F32, ps)
CFBN_FLOAT_ENTRIES(f16, CFBN_F16, ps)
CFBN_FLOAT_ENTRIES(bf16, CFBN_BF16, ps)
CFBN_GG_ENTRIES(f32, CFBN_F32, ps)
CFBN_GG_ENTRIES(f16, CFBN_F16, ps)
CFBN_GG_ENTRIES(bf16, CFBN_BF16, ps)
CFBN_RUNS_ENTRIES(f32, CFBN_F32, ps)
CFBN_RUNS_ENTRIES(f16, CFBN_F16, ps)
CFBN_RUNS_ENTRIES(bf16, CFBN_BF16, ps)

const cfbn_kernels SIMD_TABLE = {
    .name = SIMD_NAME,
    .lanes = VF_LANES,
    .f32 = { CFBN_FLOAT_TABLE(f32), CFBN_GG_TABLE(f32), CFBN_RUNS_TABLE(f32) },
    .f64 = {
        stats_run_f64, stats_rows_f64, apply_run_f64, apply_rows_f64,
        gstats_run_f64, gstats_rows_f64, gapply_run_f64, gapply_rows_f64,
        .ggstats_run = ggstats_run_f64, .ggstats_rows = ggstats_rows_f64,
        .ggapply_run = ggapply_run_f64, .ggapply_rows = ggapply_rows_f64,
    },
    .f16 = { CFBN_FLOAT_TABLE(f16), CFBN_GG_TABLE(f16), CFBN_RUNS_TABLE(f16) },
    .bf16 = { CFBN_FLOAT_TABLE(bf16), CFBN_GG_TABLE(bf16), CFBN_RUNS_TABLE(bf16) },
};
