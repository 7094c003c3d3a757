/* Portable reference kernels: plain C, one element at a time.  Every SIMD
 * table is tested against these.  Baseline flags only.  Float32 and float16
 * tensors share one set of float loops (`half` says how elements are
 * stored); the fused entries run bn_math.h's formulas, libm's activations
 * among them, in the same loop as the normalization. */
#include "bn_act.h"
#include "cfbn.h"
#include "half.h"

static inline float ld(const void *p, int64_t i, int half)
{
    return half ? cfbn_half_to_float(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline void st(void *p, int64_t i, float v, int half)
{
    if (half) ((uint16_t *)p)[i] = cfbn_float_to_half(v);
    else ((float *)p)[i] = v;
}

/* ---- float compute: float32 and float16 storage ---- */

static inline void stats_run_s(const void *x, int64_t n, double shift, double *acc, int half)
{
    double s1 = 0.0, s2 = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)ld(x, i, half) - shift;
        s1 += d;
        s2 += d * d;
    }
    acc[0] = s1;
    acc[1] = s2;
}

static inline void stats_rows_s(const void *x, int64_t rows, int64_t w, const double *shift, double *acc, int half)
{
    for (int64_t j = 0; j < 2 * w; j++) acc[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < w; j++) {
            double d = (double)ld(x, r * w + j, half) - shift[j];
            acc[j] += d;
            acc[w + j] += d * d;
        }
    }
}

/* rows of w elements whose parameters are column j (a run: one row, every
 * element column 0) */
static inline void apply_s(const void *x, void *y, int64_t rows, int64_t w, int is_run, const cfbn_apply_f32 *p,
                           int half)
{
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < w; j++) {
            int64_t c = is_run ? 0 : j, i = r * w + j;
            st(y, i, ((ld(x, i, half) - p->mhi[c]) - p->mlo[c]) * p->alpha[c] + p->beta[c], half);
        }
    }
}

static inline void gstats_s(const void *dy, const void *x, int64_t rows, int64_t w, int is_run,
                            const cfbn_grad_f32 *p, double *acc, int half)
{
    int64_t na = is_run ? 1 : w;
    for (int64_t j = 0; j < 2 * na; j++) acc[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < w; j++) {
            int64_t c = is_run ? 0 : j, i = r * w + j;
            float g = ld(dy, i, half);
            float d = (ld(x, i, half) - p->mhi[c]) - p->mlo[c];
            acc[c] += (double)g;
            acc[na + c] += (double)g * (double)d;
        }
    }
}

static inline void gapply_s(const void *dy, const void *x, void *dx, int64_t rows, int64_t w, int is_run,
                            const cfbn_grad_f32 *p, int half)
{
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < w; j++) {
            int64_t c = is_run ? 0 : j, i = r * w + j;
            float d = (ld(x, i, half) - p->mhi[c]) - p->mlo[c];
            st(dx, i, ld(dy, i, half) * p->a[c] + (d * p->b[c] + p->c[c]), half);
        }
    }
}

/* Fused: y = act(normalize(x) + side); the gradient's g = dy * act'(pre). */
static inline void apply_fused_s(const void *x, void *y, int64_t rows, int64_t w, int is_run,
                                 const cfbn_apply_f32 *p, int half)
{
    const void *side = p->side;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < w; j++) {
            int64_t c = is_run ? 0 : j, i = r * w + j;
            float s = side ? ld(side, i, half) : 0.0f;
            st(y, i, cfbn_fused_y_f(p->act, p->act_alpha, ld(x, i, half), side != NULL, s, p->mhi[c], p->mlo[c],
                                    p->alpha[c], p->beta[c]), half);
        }
    }
}

static inline float fused_g_s(const void *dy, const void *x, int64_t i, int64_t c, const cfbn_grad_f32 *p, int half)
{
    const void *side = p->side;
    float s = side ? ld(side, i, half) : 0.0f;
    return cfbn_fused_g_f(p->act, p->act_alpha, ld(dy, i, half), ld(x, i, half), side != NULL, s, p->mhi[c],
                          p->mlo[c], p->ya ? p->ya[c] : 0.0f, p->yb ? p->yb[c] : 0.0f);
}

static inline void gstats_fused_s(const void *dy, const void *x, int64_t rows, int64_t w, int is_run,
                                  const cfbn_grad_f32 *p, double *acc, int half)
{
    int64_t na = is_run ? 1 : w;
    for (int64_t j = 0; j < 2 * na; j++) acc[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < w; j++) {
            int64_t c = is_run ? 0 : j, i = r * w + j;
            float g = fused_g_s(dy, x, i, c, p, half);
            float d = (ld(x, i, half) - p->mhi[c]) - p->mlo[c];
            acc[c] += (double)g;
            acc[na + c] += (double)g * (double)d;
        }
    }
}

/* dx and side_grad may be the very arrays dy or x: each element's inputs are
 * read before its outputs are written. */
static inline void gapply_fused_s(const void *dy, const void *x, void *dx, int64_t rows, int64_t w, int is_run,
                                  const cfbn_grad_f32 *p, int half)
{
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < w; j++) {
            int64_t c = is_run ? 0 : j, i = r * w + j;
            float g = fused_g_s(dy, x, i, c, p, half);
            float d = (ld(x, i, half) - p->mhi[c]) - p->mlo[c];
            float v = g * p->a[c] + (d * p->b[c] + p->c[c]);
            if (p->side_grad) st(p->side_grad, i, g, half);
            st(dx, i, v, half);
        }
    }
}

static void stats_run_f32(const void *x, int64_t n, double shift, double *acc) { stats_run_s(x, n, shift, acc, 0); }
static void stats_rows_f32(const void *x, int64_t rows, int64_t w, const double *shift, double *acc)
{
    stats_rows_s(x, rows, w, shift, acc, 0);
}
static void apply_run_f32(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p) { apply_s(x, y, 1, n, 1, p, 0); }
static void apply_rows_f32(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f32 *p)
{
    apply_s(x, y, rows, w, 0, p, 0);
}
static void gstats_run_f32(const void *dy, const void *x, int64_t n, const cfbn_grad_f32 *p, double *acc)
{
    gstats_s(dy, x, 1, n, 1, p, acc, 0);
}
static void gstats_rows_f32(const void *dy, const void *x, int64_t rows, int64_t w, const cfbn_grad_f32 *p, double *acc)
{
    gstats_s(dy, x, rows, w, 0, p, acc, 0);
}
static void gapply_run_f32(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f32 *p)
{
    gapply_s(dy, x, dx, 1, n, 1, p, 0);
}
static void gapply_rows_f32(const void *dy, const void *x, void *dx, int64_t rows, int64_t w, const cfbn_grad_f32 *p)
{
    gapply_s(dy, x, dx, rows, w, 0, p, 0);
}
static void apply_run_fused_f32(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p)
{
    apply_fused_s(x, y, 1, n, 1, p, 0);
}
static void apply_rows_fused_f32(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f32 *p)
{
    apply_fused_s(x, y, rows, w, 0, p, 0);
}
static void gstats_run_fused_f32(const void *dy, const void *x, int64_t n, const cfbn_grad_f32 *p, double *acc)
{
    gstats_fused_s(dy, x, 1, n, 1, p, acc, 0);
}
static void gstats_rows_fused_f32(const void *dy, const void *x, int64_t rows, int64_t w, const cfbn_grad_f32 *p,
                                  double *acc)
{
    gstats_fused_s(dy, x, rows, w, 0, p, acc, 0);
}
static void gapply_run_fused_f32(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f32 *p)
{
    gapply_fused_s(dy, x, dx, 1, n, 1, p, 0);
}
static void gapply_rows_fused_f32(const void *dy, const void *x, void *dx, int64_t rows, int64_t w,
                                  const cfbn_grad_f32 *p)
{
    gapply_fused_s(dy, x, dx, rows, w, 0, p, 0);
}

static void stats_run_f16(const void *x, int64_t n, double shift, double *acc) { stats_run_s(x, n, shift, acc, 1); }
static void stats_rows_f16(const void *x, int64_t rows, int64_t w, const double *shift, double *acc)
{
    stats_rows_s(x, rows, w, shift, acc, 1);
}
static void apply_run_f16(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p) { apply_s(x, y, 1, n, 1, p, 1); }
static void apply_rows_f16(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f32 *p)
{
    apply_s(x, y, rows, w, 0, p, 1);
}
static void gstats_run_f16(const void *dy, const void *x, int64_t n, const cfbn_grad_f32 *p, double *acc)
{
    gstats_s(dy, x, 1, n, 1, p, acc, 1);
}
static void gstats_rows_f16(const void *dy, const void *x, int64_t rows, int64_t w, const cfbn_grad_f32 *p, double *acc)
{
    gstats_s(dy, x, rows, w, 0, p, acc, 1);
}
static void gapply_run_f16(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f32 *p)
{
    gapply_s(dy, x, dx, 1, n, 1, p, 1);
}
static void gapply_rows_f16(const void *dy, const void *x, void *dx, int64_t rows, int64_t w, const cfbn_grad_f32 *p)
{
    gapply_s(dy, x, dx, rows, w, 0, p, 1);
}
static void apply_run_fused_f16(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p)
{
    apply_fused_s(x, y, 1, n, 1, p, 1);
}
static void apply_rows_fused_f16(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f32 *p)
{
    apply_fused_s(x, y, rows, w, 0, p, 1);
}
static void gstats_run_fused_f16(const void *dy, const void *x, int64_t n, const cfbn_grad_f32 *p, double *acc)
{
    gstats_fused_s(dy, x, 1, n, 1, p, acc, 1);
}
static void gstats_rows_fused_f16(const void *dy, const void *x, int64_t rows, int64_t w, const cfbn_grad_f32 *p,
                                  double *acc)
{
    gstats_fused_s(dy, x, rows, w, 0, p, acc, 1);
}
static void gapply_run_fused_f16(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f32 *p)
{
    gapply_fused_s(dy, x, dx, 1, n, 1, p, 1);
}
static void gapply_rows_fused_f16(const void *dy, const void *x, void *dx, int64_t rows, int64_t w,
                                  const cfbn_grad_f32 *p)
{
    gapply_fused_s(dy, x, dx, rows, w, 0, p, 1);
}

/* ---- float64 ---- */

static inline void stats_d(const double *x, int64_t rows, int64_t w, int is_run, const double *shift, double *acc)
{
    int64_t na = is_run ? 1 : w;
    for (int64_t j = 0; j < 2 * na; j++) acc[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < w; j++) {
            int64_t c = is_run ? 0 : j;
            double d = x[r * w + j] - shift[c];
            acc[c] += d;
            acc[na + c] += d * d;
        }
    }
}

static inline void apply_d(const double *x, double *y, int64_t rows, int64_t w, int is_run, const cfbn_apply_f64 *p)
{
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < w; j++) {
            int64_t c = is_run ? 0 : j, i = r * w + j;
            y[i] = ((x[i] - p->mhi[c]) - p->mlo[c]) * p->alpha[c] + p->beta[c];
        }
    }
}

static inline void gstats_d(const double *dy, const double *x, int64_t rows, int64_t w, int is_run,
                            const cfbn_grad_f64 *p, double *acc)
{
    int64_t na = is_run ? 1 : w;
    for (int64_t j = 0; j < 2 * na; j++) acc[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < w; j++) {
            int64_t c = is_run ? 0 : j, i = r * w + j;
            acc[c] += dy[i];
            acc[na + c] += dy[i] * ((x[i] - p->mhi[c]) - p->mlo[c]);
        }
    }
}

static inline void gapply_d(const double *dy, const double *x, double *dx, int64_t rows, int64_t w, int is_run,
                            const cfbn_grad_f64 *p)
{
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < w; j++) {
            int64_t c = is_run ? 0 : j, i = r * w + j;
            dx[i] = dy[i] * p->a[c] + (((x[i] - p->mhi[c]) - p->mlo[c]) * p->b[c] + p->c[c]);
        }
    }
}

static inline void apply_fused_d(const double *x, double *y, int64_t rows, int64_t w, int is_run,
                                 const cfbn_apply_f64 *p)
{
    const double *side = p->side;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < w; j++) {
            int64_t c = is_run ? 0 : j, i = r * w + j;
            y[i] = cfbn_fused_y_d(p->act, p->act_alpha, x[i], side != NULL, side ? side[i] : 0.0, p->mhi[c],
                                  p->mlo[c], p->alpha[c], p->beta[c]);
        }
    }
}

static inline double fused_g_d(const double *dy, const double *x, int64_t i, int64_t c, const cfbn_grad_f64 *p)
{
    const double *side = p->side;
    return cfbn_fused_g_d(p->act, p->act_alpha, dy[i], x[i], side != NULL, side ? side[i] : 0.0, p->mhi[c],
                          p->mlo[c], p->ya ? p->ya[c] : 0.0, p->yb ? p->yb[c] : 0.0);
}

static inline void gstats_fused_d(const double *dy, const double *x, int64_t rows, int64_t w, int is_run,
                                  const cfbn_grad_f64 *p, double *acc)
{
    int64_t na = is_run ? 1 : w;
    for (int64_t j = 0; j < 2 * na; j++) acc[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < w; j++) {
            int64_t c = is_run ? 0 : j, i = r * w + j;
            double g = fused_g_d(dy, x, i, c, p);
            acc[c] += g;
            acc[na + c] += g * ((x[i] - p->mhi[c]) - p->mlo[c]);
        }
    }
}

static inline void gapply_fused_d(const double *dy, const double *x, double *dx, int64_t rows, int64_t w,
                                  int is_run, const cfbn_grad_f64 *p)
{
    double *sg = p->side_grad;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < w; j++) {
            int64_t c = is_run ? 0 : j, i = r * w + j;
            double g = fused_g_d(dy, x, i, c, p);
            double v = g * p->a[c] + (((x[i] - p->mhi[c]) - p->mlo[c]) * p->b[c] + p->c[c]);
            if (sg) sg[i] = g;
            dx[i] = v;
        }
    }
}

static void stats_run_f64(const void *x, int64_t n, double shift, double *acc) { stats_d(x, 1, n, 1, &shift, acc); }
static void stats_rows_f64(const void *x, int64_t rows, int64_t w, const double *shift, double *acc)
{
    stats_d(x, rows, w, 0, shift, acc);
}
static void apply_run_f64(const void *x, void *y, int64_t n, const cfbn_apply_f64 *p) { apply_d(x, y, 1, n, 1, p); }
static void apply_rows_f64(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f64 *p)
{
    apply_d(x, y, rows, w, 0, p);
}
static void gstats_run_f64(const void *dy, const void *x, int64_t n, const cfbn_grad_f64 *p, double *acc)
{
    gstats_d(dy, x, 1, n, 1, p, acc);
}
static void gstats_rows_f64(const void *dy, const void *x, int64_t rows, int64_t w, const cfbn_grad_f64 *p, double *acc)
{
    gstats_d(dy, x, rows, w, 0, p, acc);
}
static void gapply_run_f64(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f64 *p)
{
    gapply_d(dy, x, dx, 1, n, 1, p);
}
static void gapply_rows_f64(const void *dy, const void *x, void *dx, int64_t rows, int64_t w, const cfbn_grad_f64 *p)
{
    gapply_d(dy, x, dx, rows, w, 0, p);
}
static void apply_run_fused_f64(const void *x, void *y, int64_t n, const cfbn_apply_f64 *p)
{
    apply_fused_d(x, y, 1, n, 1, p);
}
static void apply_rows_fused_f64(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f64 *p)
{
    apply_fused_d(x, y, rows, w, 0, p);
}
static void gstats_run_fused_f64(const void *dy, const void *x, int64_t n, const cfbn_grad_f64 *p, double *acc)
{
    gstats_fused_d(dy, x, 1, n, 1, p, acc);
}
static void gstats_rows_fused_f64(const void *dy, const void *x, int64_t rows, int64_t w, const cfbn_grad_f64 *p,
                                  double *acc)
{
    gstats_fused_d(dy, x, rows, w, 0, p, acc);
}
static void gapply_run_fused_f64(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f64 *p)
{
    gapply_fused_d(dy, x, dx, 1, n, 1, p);
}
static void gapply_rows_fused_f64(const void *dy, const void *x, void *dx, int64_t rows, int64_t w,
                                  const cfbn_grad_f64 *p)
{
    gapply_fused_d(dy, x, dx, rows, w, 0, p);
}

const cfbn_kernels cfbn_kernels_scalar = {
    .name = "scalar",
    .f32 = {
        stats_run_f32, stats_rows_f32, apply_run_f32, apply_rows_f32,
        gstats_run_f32, gstats_rows_f32, gapply_run_f32, gapply_rows_f32,
        .apply_run_fused = apply_run_fused_f32, .apply_rows_fused = apply_rows_fused_f32,
        .gstats_run_fused = gstats_run_fused_f32, .gstats_rows_fused = gstats_rows_fused_f32,
        .gapply_run_fused = gapply_run_fused_f32, .gapply_rows_fused = gapply_rows_fused_f32,
    },
    .f64 = {
        stats_run_f64, stats_rows_f64, apply_run_f64, apply_rows_f64,
        gstats_run_f64, gstats_rows_f64, gapply_run_f64, gapply_rows_f64,
        .apply_run_fused = apply_run_fused_f64, .apply_rows_fused = apply_rows_fused_f64,
        .gstats_run_fused = gstats_run_fused_f64, .gstats_rows_fused = gstats_rows_fused_f64,
        .gapply_run_fused = gapply_run_fused_f64, .gapply_rows_fused = gapply_rows_fused_f64,
    },
    .f16 = {
        stats_run_f16, stats_rows_f16, apply_run_f16, apply_rows_f16,
        gstats_run_f16, gstats_rows_f16, gapply_run_f16, gapply_rows_f16,
        .apply_run_fused = apply_run_fused_f16, .apply_rows_fused = apply_rows_fused_f16,
        .gstats_run_fused = gstats_run_fused_f16, .gstats_rows_fused = gstats_rows_fused_f16,
        .gapply_run_fused = gapply_run_fused_f16, .gapply_rows_fused = gapply_rows_fused_f16,
    },
};
