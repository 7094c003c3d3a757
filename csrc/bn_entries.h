/* The entries of one float-compute storage type (cfbn_float_kernels), made
 * from an ISA file's generic float loops.
 *
 * An ISA file writes each loop once, for every storage type, with a last
 * argument `dt` (the tensor's enum cfbn_dtype: CFBN_F32, CFBN_F16 or
 * CFBN_BF16; always_inline folds it away).  The loops are named
 * <kernel>_<G>: stats_run_G, stats_rows_G, apply_run_G, apply_rows_G,
 * gstats_run_G, gstats_rows_G, gapply_run_G, gapply_rows_G and the fused
 * fapply_run_G, fapply_rows_G, fgstats_run_G, fgstats_rows_G, fgapply_run_G,
 * fgapply_rows_G, each taking its entry's arguments and then dt.  Then
 *
 *     CFBN_FLOAT_ENTRIES(bf16, CFBN_BF16, G)
 *
 * defines the 14 static entries stats_run_bf16 ... gapply_rows_fused_bf16,
 * and CFBN_FLOAT_TABLE(bf16) lists them as a cfbn_float_kernels initialiser
 * (the optional *_runs and *_stream entries stay NULL unless the file adds
 * them after it).  A new storage type is these two lines per ISA file plus
 * its element access. */
#ifndef CFBN_BN_ENTRIES_H
#define CFBN_BN_ENTRIES_H

#include "cfbn.h"

#define CFBN_FLOAT_ENTRIES(sfx, DT, G)                                                                        \
    static void stats_run_##sfx(const void *x, int64_t n, double shift, double *acc)                           \
    {                                                                                                          \
        stats_run_##G(x, n, shift, acc, DT);                                                                   \
    }                                                                                                          \
    static void stats_rows_##sfx(const void *x, int64_t rows, int64_t w, const double *shift, double *acc)     \
    {                                                                                                          \
        stats_rows_##G(x, rows, w, shift, acc, DT);                                                            \
    }                                                                                                          \
    static void apply_run_##sfx(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p)                    \
    {                                                                                                          \
        apply_run_##G(x, y, n, p, DT);                                                                         \
    }                                                                                                          \
    static void apply_rows_##sfx(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f32 *p)     \
    {                                                                                                          \
        apply_rows_##G(x, y, rows, w, p, DT);                                                                  \
    }                                                                                                          \
    static void gstats_run_##sfx(const void *dy, const void *x, int64_t n, const cfbn_grad_f32 *p, double *acc) \
    {                                                                                                          \
        gstats_run_##G(dy, x, n, p, acc, DT);                                                                  \
    }                                                                                                          \
    static void gstats_rows_##sfx(const void *dy, const void *x, int64_t rows, int64_t w,                      \
                                  const cfbn_grad_f32 *p, double *acc)                                         \
    {                                                                                                          \
        gstats_rows_##G(dy, x, rows, w, p, acc, DT);                                                           \
    }                                                                                                          \
    static void gapply_run_##sfx(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f32 *p)   \
    {                                                                                                          \
        gapply_run_##G(dy, x, dx, n, p, DT);                                                                   \
    }                                                                                                          \
    static void gapply_rows_##sfx(const void *dy, const void *x, void *dx, int64_t rows, int64_t w,            \
                                  const cfbn_grad_f32 *p)                                                      \
    {                                                                                                          \
        gapply_rows_##G(dy, x, dx, rows, w, p, DT);                                                            \
    }                                                                                                          \
    static void apply_run_fused_##sfx(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p)              \
    {                                                                                                          \
        fapply_run_##G(x, y, n, p, DT);                                                                        \
    }                                                                                                          \
    static void apply_rows_fused_##sfx(const void *x, void *y, int64_t rows, int64_t w,                        \
                                       const cfbn_apply_f32 *p)                                                \
    {                                                                                                          \
        fapply_rows_##G(x, y, rows, w, p, DT);                                                                 \
    }                                                                                                          \
    static void gstats_run_fused_##sfx(const void *dy, const void *x, int64_t n, const cfbn_grad_f32 *p,       \
                                       double *acc)                                                            \
    {                                                                                                          \
        fgstats_run_##G(dy, x, n, p, acc, DT);                                                                 \
    }                                                                                                          \
    static void gstats_rows_fused_##sfx(const void *dy, const void *x, int64_t rows, int64_t w,                \
                                        const cfbn_grad_f32 *p, double *acc)                                   \
    {                                                                                                          \
        fgstats_rows_##G(dy, x, rows, w, p, acc, DT);                                                          \
    }                                                                                                          \
    static void gapply_run_fused_##sfx(const void *dy, const void *x, void *dx, int64_t n,                     \
                                       const cfbn_grad_f32 *p)                                                 \
    {                                                                                                          \
        fgapply_run_##G(dy, x, dx, n, p, DT);                                                                  \
    }                                                                                                          \
    static void gapply_rows_fused_##sfx(const void *dy, const void *x, void *dx, int64_t rows, int64_t w,      \
                                        const cfbn_grad_f32 *p)                                                \
    {                                                                                                          \
        fgapply_rows_##G(dy, x, dx, rows, w, p, DT);                                                           \
    }

#define CFBN_FLOAT_TABLE(sfx)                                                                                  \
    stats_run_##sfx, stats_rows_##sfx, apply_run_##sfx, apply_rows_##sfx,                                      \
    gstats_run_##sfx, gstats_rows_##sfx, gapply_run_##sfx, gapply_rows_##sfx,                                  \
    .apply_run_fused = apply_run_fused_##sfx, .apply_rows_fused = apply_rows_fused_##sfx,                      \
    .gstats_run_fused = gstats_run_fused_##sfx, .gstats_rows_fused = gstats_rows_fused_##sfx,                  \
    .gapply_run_fused = gapply_run_fused_##sfx, .gapply_rows_fused = gapply_rows_fused_##sfx

/* The four second-order gradient entries (optional outside the scalar
 * table), from loops ggstats_run_G, ggstats_rows_G, ggapply_run_G and
 * ggapply_rows_G taking their entry's arguments and then dt:
 *
 *     CFBN_GG_ENTRIES(bf16, CFBN_BF16, G)
 *     .bf16 = { CFBN_FLOAT_TABLE(bf16), CFBN_GG_TABLE(bf16) }
 */
#define CFBN_GG_ENTRIES(sfx, DT, G)                                                                           \
    static void ggstats_run_##sfx(const void *dy, const void *x, const void *ggx, int64_t n,                   \
                                  const cfbn_gg_f32 *p, double *acc)                                           \
    {                                                                                                          \
        ggstats_run_##G(dy, x, ggx, n, p, acc, DT);                                                            \
    }                                                                                                          \
    static void ggstats_rows_##sfx(const void *dy, const void *x, const void *ggx, int64_t rows, int64_t w,    \
                                   const cfbn_gg_f32 *p, double *acc)                                          \
    {                                                                                                          \
        ggstats_rows_##G(dy, x, ggx, rows, w, p, acc, DT);                                                     \
    }                                                                                                          \
    static void ggapply_run_##sfx(const void *dy, const void *x, const void *ggx, void *ddy, void *dx,         \
                                  int64_t n, const cfbn_gg_f32 *p)                                             \
    {                                                                                                          \
        ggapply_run_##G(dy, x, ggx, ddy, dx, n, p, DT);                                                        \
    }                                                                                                          \
    static void ggapply_rows_##sfx(const void *dy, const void *x, const void *ggx, void *ddy, void *dx,        \
                                   int64_t rows, int64_t w, const cfbn_gg_f32 *p)                              \
    {                                                                                                          \
        ggapply_rows_##G(dy, x, ggx, ddy, dx, rows, w, p, DT);                                                 \
    }

#define CFBN_GG_TABLE(sfx)                                                                                     \
    .ggstats_run = ggstats_run_##sfx, .ggstats_rows = ggstats_rows_##sfx,                                      \
    .ggapply_run = ggapply_run_##sfx, .ggapply_rows = ggapply_rows_##sfx

#endif
