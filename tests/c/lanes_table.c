/* A kernel table built from the shared plain and streaming loops
 * (csrc/bn_simd_f64.c, csrc/bn_simd_float.c) over tests/c/vec_portable.h,
 * the portable meaning of the primitives, at lane counts the build machine's
 * CPU may not have: vd is an array of LANES
 * doubles, vf of VF_LANES = 2 LANES floats, a mask an array of flags, and
 * the 2-byte storage types go through storage.h's conversions, so that
 * every result is what an ISA with those lane counts must give.  The
 * streaming stores abort on an address less aligned than the primitive
 * requires (PORTABLE_CHECK_ALIGN).  kernel_check.c, built with
 * -DCFBN_HAVE_LANES and this file, checks the table as it checks an ISA's.
 * run.sh builds it with LANES = 2, 4 and 8 (NEON, AVX2 and AVX-512).  The
 * fused and second-order loops are not in it: over these struct-of-array
 * vectors GCC takes more than ten minutes for them; NEON's table (4 floats,
 * under qemu), AVX2's (8) and AVX-512's (16, where the CPU has it) check
 * them at their lane counts. */
#include <float.h>

#define PORTABLE_CHECK_ALIGN 1
#include "vec_portable.h"

#include "bn_entries.h"
#include "bn_simd_f64.c"
#include "bn_simd_float.c"

/* the table's entries: the float-compute loops with their storage type */
#define FLOAT_ENTRIES(sfx, DT)                                                                                \
    CFBN_E_STATS_RUN(stats_run_##sfx, stats_run_ps, DT)                                                        \
    CFBN_E_STATS_ROWS(stats_rows_##sfx, stats_rows_ps, DT)                                                     \
    CFBN_E_APPLY_RUN(apply_run_##sfx, apply_run_ps, DT)                                                        \
    CFBN_E_APPLY_ROWS(apply_rows_##sfx, apply_rows_ps, DT)                                                     \
    CFBN_E_GSTATS_RUN(gstats_run_##sfx, gstats_run_ps, DT)                                                     \
    CFBN_E_GSTATS_ROWS(gstats_rows_##sfx, gstats_rows_ps, DT)                                                  \
    CFBN_E_GAPPLY_RUN(gapply_run_##sfx, gapply_run_ps, DT)                                                     \
    CFBN_E_GAPPLY_ROWS(gapply_rows_##sfx, gapply_rows_ps, DT)                                                  \
    CFBN_E_APPLY_RUN(apply_run_nt_##sfx, apply_run_nt_ps, DT)                                                  \
    CFBN_E_APPLY_ROWS(apply_rows_nt_##sfx, apply_rows_nt_ps, DT)                                               \
    CFBN_E_GAPPLY_RUN(gapply_run_nt_##sfx, gapply_run_nt_ps, DT)                                               \
    CFBN_E_GAPPLY_ROWS(gapply_rows_nt_##sfx, gapply_rows_nt_ps, DT)
#define FLOAT_TABLE(sfx)                                                                                      \
    stats_run_##sfx, stats_rows_##sfx, apply_run_##sfx, apply_rows_##sfx,                                     \
    gstats_run_##sfx, gstats_rows_##sfx, gapply_run_##sfx, gapply_rows_##sfx,                                 \
    .apply_run_stream = apply_run_nt_##sfx, .apply_rows_stream = apply_rows_nt_##sfx,                         \
    .gapply_run_stream = gapply_run_nt_##sfx, .gapply_rows_stream = gapply_rows_nt_##sfx

FLOAT_ENTRIES(f32, CFBN_F32)
FLOAT_ENTRIES(f16, CFBN_F16)
FLOAT_ENTRIES(bf16, CFBN_BF16)

#define STR2(x) #x
#define STR(x) STR2(x)

const cfbn_kernels cfbn_kernels_lanes = {
    .name = "lanes-vd" STR(LANES),
    .lanes = VF_LANES,
    .f32 = { FLOAT_TABLE(f32) },
    .f64 = { stats_run_f64, stats_rows_f64, apply_run_f64, apply_rows_f64,
             gstats_run_f64, gstats_rows_f64, gapply_run_f64, gapply_rows_f64 },
    .f16 = { FLOAT_TABLE(f16) },
    .bf16 = { FLOAT_TABLE(bf16) },
};
