/* The entries of one float-compute storage type (cfbn_float_kernels), made
 * from a table file's generic float loops.
 *
 * A table file writes each loop once, for every storage type, with a last
 * argument `dt` (the tensor's enum cfbn_dtype: CFBN_F32, CFBN_F16 or
 * CFBN_BF16; always_inline folds it away).  The loops are named
 * <kernel>_<G>, each taking its entry's arguments and then dt:
 *   - required: stats_run, stats_rows, apply_run, apply_rows, gstats_run,
 *     gstats_rows, gapply_run, gapply_rows, and the fused fapply_run,
 *     fapply_rows, fgstats_run, fgstats_rows, fgapply_run, fgapply_rows;
 *   - second order: ggstats_run, ggstats_rows, ggapply_run, ggapply_rows;
 *   - several runs and streaming: apply_runs, gstats_runs, gapply_runs,
 *     stats_runs, fapply_runs, fgstats_runs, fgapply_runs, apply_run_nt,
 *     apply_rows_nt, gapply_run_nt, gapply_rows_nt, ggstats_runs,
 *     ggapply_runs.
 * Then CFBN_FLOAT_ENTRIES(bf16, CFBN_BF16, G) defines the required static
 * entries stats_run_bf16 ... gapply_rows_fused_bf16, CFBN_GG_ENTRIES and
 * CFBN_RUNS_ENTRIES the others, and CFBN_FLOAT_TABLE(bf16),
 * CFBN_GG_TABLE(bf16) and CFBN_RUNS_TABLE(bf16) list them as parts of a
 * cfbn_float_kernels initialiser (entries not listed stay NULL):
 *
 *     .bf16 = { CFBN_FLOAT_TABLE(bf16), CFBN_GG_TABLE(bf16) }
 *
 * A new storage type is these lines per table file plus its element
 * access. */
#ifndef CFBN_BN_ENTRIES_H
#define CFBN_BN_ENTRIES_H

#include "cfbn.h"

/* static void name(arguments of one of cfbn.h's float entry types) calling
 * loop(those arguments, DT): one macro per argument list */
#define CFBN_E_STATS_RUN(name, loop, DT)                                                                       \
    static void name(const void *x, int64_t n, double shift, double *acc) { loop(x, n, shift, acc, DT); }
#define CFBN_E_STATS_ROWS(name, loop, DT)                                                                      \
    static void name(const void *x, int64_t rows, int64_t w, const double *shift, double *acc)                 \
    { loop(x, rows, w, shift, acc, DT); }
#define CFBN_E_STATS_RUNS(name, loop, DT)                                                                      \
    static void name(const void *x, int64_t n, int64_t runs, int64_t stride, double shift, double *acc)        \
    { loop(x, n, runs, stride, shift, acc, DT); }
#define CFBN_E_APPLY_RUN(name, loop, DT)                                                                       \
    static void name(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p) { loop(x, y, n, p, DT); }
#define CFBN_E_APPLY_ROWS(name, loop, DT)                                                                      \
    static void name(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f32 *p)                 \
    { loop(x, y, rows, w, p, DT); }
#define CFBN_E_GSTATS_RUN(name, loop, DT)                                                                      \
    static void name(const void *dy, const void *x, int64_t n, const cfbn_grad_f32 *p, double *acc)            \
    { loop(dy, x, n, p, acc, DT); }
#define CFBN_E_GSTATS_ROWS(name, loop, DT)                                                                     \
    static void name(const void *dy, const void *x, int64_t rows, int64_t w, const cfbn_grad_f32 *p, double *acc) \
    { loop(dy, x, rows, w, p, acc, DT); }
#define CFBN_E_GAPPLY_RUN(name, loop, DT)                                                                      \
    static void name(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f32 *p)               \
    { loop(dy, x, dx, n, p, DT); }
#define CFBN_E_GAPPLY_ROWS(name, loop, DT)                                                                     \
    static void name(const void *dy, const void *x, void *dx, int64_t rows, int64_t w, const cfbn_grad_f32 *p) \
    { loop(dy, x, dx, rows, w, p, DT); }
#define CFBN_E_GGSTATS_RUN(name, loop, DT)                                                                     \
    static void name(const void *dy, const void *x, const void *ggx, int64_t n, const cfbn_gg_f32 *p, double *acc) \
    { loop(dy, x, ggx, n, p, acc, DT); }
#define CFBN_E_GGSTATS_ROWS(name, loop, DT)                                                                    \
    static void name(const void *dy, const void *x, const void *ggx, int64_t rows, int64_t w,                  \
                     const cfbn_gg_f32 *p, double *acc)                                                        \
    { loop(dy, x, ggx, rows, w, p, acc, DT); }
#define CFBN_E_GGAPPLY_RUN(name, loop, DT)                                                                     \
    static void name(const void *dy, const void *x, const void *ggx, void *ddy, void *dx, int64_t n,           \
                     const cfbn_gg_f32 *p)                                                                     \
    { loop(dy, x, ggx, ddy, dx, n, p, DT); }
#define CFBN_E_GGAPPLY_ROWS(name, loop, DT)                                                                    \
    static void name(const void *dy, const void *x, const void *ggx, void *ddy, void *dx, int64_t rows,        \
                     int64_t w, const cfbn_gg_f32 *p)                                                          \
    { loop(dy, x, ggx, ddy, dx, rows, w, p, DT); }

#define CFBN_FLOAT_ENTRIES(sfx, DT, G)                                                                        \
    CFBN_E_STATS_RUN(stats_run_##sfx, stats_run_##G, DT)                                                       \
    CFBN_E_STATS_ROWS(stats_rows_##sfx, stats_rows_##G, DT)                                                    \
    CFBN_E_APPLY_RUN(apply_run_##sfx, apply_run_##G, DT)                                                       \
    CFBN_E_APPLY_ROWS(apply_rows_##sfx, apply_rows_##G, DT)                                                    \
    CFBN_E_GSTATS_RUN(gstats_run_##sfx, gstats_run_##G, DT)                                                    \
    CFBN_E_GSTATS_ROWS(gstats_rows_##sfx, gstats_rows_##G, DT)                                                 \
    CFBN_E_GAPPLY_RUN(gapply_run_##sfx, gapply_run_##G, DT)                                                    \
    CFBN_E_GAPPLY_ROWS(gapply_rows_##sfx, gapply_rows_##G, DT)                                                 \
    CFBN_E_APPLY_RUN(apply_run_fused_##sfx, fapply_run_##G, DT)                                                \
    CFBN_E_APPLY_ROWS(apply_rows_fused_##sfx, fapply_rows_##G, DT)                                             \
    CFBN_E_GSTATS_RUN(gstats_run_fused_##sfx, fgstats_run_##G, DT)                                             \
    CFBN_E_GSTATS_ROWS(gstats_rows_fused_##sfx, fgstats_rows_##G, DT)                                          \
    CFBN_E_GAPPLY_RUN(gapply_run_fused_##sfx, fgapply_run_##G, DT)                                             \
    CFBN_E_GAPPLY_ROWS(gapply_rows_fused_##sfx, fgapply_rows_##G, DT)

#define CFBN_FLOAT_TABLE(sfx)                                                                                  \
    stats_run_##sfx, stats_rows_##sfx, apply_run_##sfx, apply_rows_##sfx,                                      \
    gstats_run_##sfx, gstats_rows_##sfx, gapply_run_##sfx, gapply_rows_##sfx,                                  \
    .apply_run_fused = apply_run_fused_##sfx, .apply_rows_fused = apply_rows_fused_##sfx,                      \
    .gstats_run_fused = gstats_run_fused_##sfx, .gstats_rows_fused = gstats_rows_fused_##sfx,                  \
    .gapply_run_fused = gapply_run_fused_##sfx, .gapply_rows_fused = gapply_rows_fused_##sfx

/* the four second-order gradient entries (optional outside the scalar
 * table) */
#define CFBN_GG_ENTRIES(sfx, DT, G)                                                                           \
    CFBN_E_GGSTATS_RUN(ggstats_run_##sfx, ggstats_run_##G, DT)                                                 \
    CFBN_E_GGSTATS_ROWS(ggstats_rows_##sfx, ggstats_rows_##G, DT)                                              \
    CFBN_E_GGAPPLY_RUN(ggapply_run_##sfx, ggapply_run_##G, DT)                                                 \
    CFBN_E_GGAPPLY_ROWS(ggapply_rows_##sfx, ggapply_rows_##G, DT)

#define CFBN_GG_TABLE(sfx)                                                                                     \
    .ggstats_run = ggstats_run_##sfx, .ggstats_rows = ggstats_rows_##sfx,                                      \
    .ggapply_run = ggapply_run_##sfx, .ggapply_rows = ggapply_rows_##sfx

/* the several-runs and streaming entries (optional) */
#define CFBN_RUNS_ENTRIES(sfx, DT, G)                                                                         \
    CFBN_E_APPLY_RUN(apply_runs_##sfx, apply_runs_##G, DT)                                                     \
    CFBN_E_GSTATS_RUN(gstats_runs_##sfx, gstats_runs_##G, DT)                                                  \
    CFBN_E_GAPPLY_RUN(gapply_runs_##sfx, gapply_runs_##G, DT)                                                  \
    CFBN_E_STATS_RUNS(stats_runs_##sfx, stats_runs_##G, DT)                                                    \
    CFBN_E_APPLY_RUN(apply_runs_fused_##sfx, fapply_runs_##G, DT)                                              \
    CFBN_E_GSTATS_RUN(gstats_runs_fused_##sfx, fgstats_runs_##G, DT)                                           \
    CFBN_E_GAPPLY_RUN(gapply_runs_fused_##sfx, fgapply_runs_##G, DT)                                           \
    CFBN_E_APPLY_RUN(apply_run_nt_##sfx, apply_run_nt_##G, DT)                                                 \
    CFBN_E_APPLY_ROWS(apply_rows_nt_##sfx, apply_rows_nt_##G, DT)                                              \
    CFBN_E_GAPPLY_RUN(gapply_run_nt_##sfx, gapply_run_nt_##G, DT)                                              \
    CFBN_E_GAPPLY_ROWS(gapply_rows_nt_##sfx, gapply_rows_nt_##G, DT)                                           \
    CFBN_E_GGSTATS_RUN(ggstats_runs_##sfx, ggstats_runs_##G, DT)                                               \
    CFBN_E_GGAPPLY_RUN(ggapply_runs_##sfx, ggapply_runs_##G, DT)

#define CFBN_RUNS_TABLE(sfx)                                                                                   \
    .apply_runs = apply_runs_##sfx, .gstats_runs = gstats_runs_##sfx, .gapply_runs = gapply_runs_##sfx,        \
    .stats_runs = stats_runs_##sfx, .apply_runs_fused = apply_runs_fused_##sfx,                                \
    .gstats_runs_fused = gstats_runs_fused_##sfx, .gapply_runs_fused = gapply_runs_fused_##sfx,                \
    .apply_run_stream = apply_run_nt_##sfx, .apply_rows_stream = apply_rows_nt_##sfx,                          \
    .gapply_run_stream = gapply_run_nt_##sfx, .gapply_rows_stream = gapply_rows_nt_##sfx,                      \
    .ggstats_runs = ggstats_runs_##sfx, .ggapply_runs = ggapply_runs_##sfx

#endif
