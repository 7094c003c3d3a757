/* Portable reference kernels: plain C, one element at a time.  Every SIMD
 * table is tested against these.  Baseline flags only.  Float32, float16 and
 * bfloat16 tensors share one set of float loops (`dt` says how elements are
 * stored; bn_entries.h makes the entries); the fused entries run bn_math.h's formulas, libm's activations
 * among them, in the same loop as the normalization. */
#include "bn_act.h"
#include "bn_entries.h"
#include "cfbn.h"
#include "storage.h"

static inline float ld(const void *p, int64_t i, int dt) { return cfbn_load_float(dt, p, i); }

static inline void st(void *p, int64_t i, float v, int dt) { cfbn_store_float(dt, p, i, v); }

/* ---- float compute: float32, float16 and bfloat16 storage ---- */

static inline void stats_run_s(const void *x, int64_t n, double shift, double *acc, int dt)
{
    double s1 = 0.0, s2 = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)ld(x, i, dt) - shift;
        s1 += d;
        s2 += d * d;
    }
    acc[0] = s1;
    acc[1] = s2;
}

static inline void stats_rows_s(const void *x, int64_t rows, int64_t w, const double *shift, double *acc, int dt)
{
    for (int64_t j = 0; j < 2 * w; j++) acc[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < w; j++) {
            double d = (double)ld(x, r * w + j, dt) - shift[j];
            acc[j] += d;
            acc[w + j] += d * d;
        }
    }
}

/* rows of w elements whose parameters are column j (a run: one row, every
 * element column 0) */
static inline void apply_s(const void *x, void *y, int64_t rows, int64_t w, int is_run, const cfbn_apply_f32 *p,
                           int dt)
{
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < w; j++) {
            int64_t c = is_run ? 0 : j, i = r * w + j;
            st(y, i, ((ld(x, i, dt) - p->mhi[c]) - p->mlo[c]) * p->alpha[c] + p->beta[c], dt);
        }
    }
}

static inline void gstats_s(const void *dy, const void *x, int64_t rows, int64_t w, int is_run,
                            const cfbn_grad_f32 *p, double *acc, int dt)
{
    int64_t na = is_run ? 1 : w;
    for (int64_t j = 0; j < 2 * na; j++) acc[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < w; j++) {
            int64_t c = is_run ? 0 : j, i = r * w + j;
            float g = ld(dy, i, dt);
            float d = (ld(x, i, dt) - p->mhi[c]) - p->mlo[c];
            acc[c] += (double)g;
            acc[na + c] += (double)g * (double)d;
        }
    }
}

static inline void gapply_s(const void *dy, const void *x, void *dx, int64_t rows, int64_t w, int is_run,
                            const cfbn_grad_f32 *p, int dt)
{
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < w; j++) {
            int64_t c = is_run ? 0 : j, i = r * w + j;
            float d = (ld(x, i, dt) - p->mhi[c]) - p->mlo[c];
            st(dx, i, ld(dy, i, dt) * p->a[c] + (d * p->b[c] + p->c[c]), dt);
        }
    }
}

/* Fused: y = act(normalize(x) + side); the gradient's g = dy * act'(pre). */
static inline void apply_fused_s(const void *x, void *y, int64_t rows, int64_t w, int is_run,
                                 const cfbn_apply_f32 *p, int dt)
{
    const void *side = p->side;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < w; j++) {
            int64_t c = is_run ? 0 : j, i = r * w + j;
            float s = side ? ld(side, i, dt) : 0.0f;
            st(y, i, cfbn_fused_y_f(p->act, p->act_alpha, ld(x, i, dt), side != NULL, s, p->mhi[c], p->mlo[c],
                                    p->alpha[c], p->beta[c]), dt);
        }
    }
}

static inline float fused_g_s(const void *dy, const void *x, int64_t i, int64_t c, const cfbn_grad_f32 *p, int dt)
{
    const void *side = p->side;
    float s = side ? ld(side, i, dt) : 0.0f;
    return cfbn_fused_g_f(p->act, p->act_alpha, ld(dy, i, dt), ld(x, i, dt), side != NULL, s, p->mhi[c],
                          p->mlo[c], p->ya ? p->ya[c] : 0.0f, p->yb ? p->yb[c] : 0.0f);
}

static inline void gstats_fused_s(const void *dy, const void *x, int64_t rows, int64_t w, int is_run,
                                  const cfbn_grad_f32 *p, double *acc, int dt)
{
    int64_t na = is_run ? 1 : w;
    for (int64_t j = 0; j < 2 * na; j++) acc[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < w; j++) {
            int64_t c = is_run ? 0 : j, i = r * w + j;
            float g = fused_g_s(dy, x, i, c, p, dt);
            float d = (ld(x, i, dt) - p->mhi[c]) - p->mlo[c];
            if (p->g_out) st(p->g_out, i, g, dt);
            acc[c] += (double)g;
            acc[na + c] += (double)g * (double)d;
        }
    }
}

/* dx and side_grad may be the very arrays dy or x: each element's inputs are
 * read before its outputs are written. */
static inline void gapply_fused_s(const void *dy, const void *x, void *dx, int64_t rows, int64_t w, int is_run,
                                  const cfbn_grad_f32 *p, int dt)
{
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < w; j++) {
            int64_t c = is_run ? 0 : j, i = r * w + j;
            float g = fused_g_s(dy, x, i, c, p, dt);
            float d = (ld(x, i, dt) - p->mhi[c]) - p->mlo[c];
            float v = g * p->a[c] + (d * p->b[c] + p->c[c]);
            if (p->side_grad) st(p->side_grad, i, g, dt);
            st(dx, i, v, dt);
        }
    }
}

/* the loops under bn_entries.h's names: a run is one row whose parameters
 * are column 0 */
static inline void apply_run_s(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p, int dt)
{
    apply_s(x, y, 1, n, 1, p, dt);
}
static inline void apply_rows_s(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f32 *p, int dt)
{
    apply_s(x, y, rows, w, 0, p, dt);
}
static inline void gstats_run_s(const void *dy, const void *x, int64_t n, const cfbn_grad_f32 *p, double *acc, int dt)
{
    gstats_s(dy, x, 1, n, 1, p, acc, dt);
}
static inline void gstats_rows_s(const void *dy, const void *x, int64_t rows, int64_t w, const cfbn_grad_f32 *p,
                                 double *acc, int dt)
{
    gstats_s(dy, x, rows, w, 0, p, acc, dt);
}
static inline void gapply_run_s(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f32 *p, int dt)
{
    gapply_s(dy, x, dx, 1, n, 1, p, dt);
}
static inline void gapply_rows_s(const void *dy, const void *x, void *dx, int64_t rows, int64_t w,
                                 const cfbn_grad_f32 *p, int dt)
{
    gapply_s(dy, x, dx, rows, w, 0, p, dt);
}
static inline void fapply_run_s(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p, int dt)
{
    apply_fused_s(x, y, 1, n, 1, p, dt);
}
static inline void fapply_rows_s(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f32 *p, int dt)
{
    apply_fused_s(x, y, rows, w, 0, p, dt);
}
static inline void fgstats_run_s(const void *dy, const void *x, int64_t n, const cfbn_grad_f32 *p, double *acc,
                                 int dt)
{
    gstats_fused_s(dy, x, 1, n, 1, p, acc, dt);
}
static inline void fgstats_rows_s(const void *dy, const void *x, int64_t rows, int64_t w, const cfbn_grad_f32 *p,
                                  double *acc, int dt)
{
    gstats_fused_s(dy, x, rows, w, 0, p, acc, dt);
}
static inline void fgapply_run_s(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f32 *p, int dt)
{
    gapply_fused_s(dy, x, dx, 1, n, 1, p, dt);
}
static inline void fgapply_rows_s(const void *dy, const void *x, void *dx, int64_t rows, int64_t w,
                                  const cfbn_grad_f32 *p, int dt)
{
    gapply_fused_s(dy, x, dx, rows, w, 0, p, dt);
}

/* Second-order gradient (cfbn.h's cfbn_gg_f32): five sums, then ddy and dx.
 * ddy and dx may be the arrays dy or x came in: each element's inputs are
 * read before its outputs are written. */
static inline void ggstats_s(const void *dy, const void *x, const void *ggx, int64_t rows, int64_t w, int is_run,
                             const cfbn_gg_f32 *p, double *acc, int dt)
{
    int64_t na = is_run ? 1 : w;
    for (int64_t j = 0; j < 5 * na; j++) acc[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < w; j++) {
            int64_t c = is_run ? 0 : j, i = r * w + j;
            double g = ld(dy, i, dt), q = ld(ggx, i, dt);
            double d = (ld(x, i, dt) - p->mhi[c]) - p->mlo[c];
            acc[c] += g;
            acc[na + c] += g * d;
            acc[2 * na + c] += q;
            acc[3 * na + c] += q * d;
            acc[4 * na + c] += q * g;
        }
    }
}

static inline void ggapply_s(const void *dy, const void *x, const void *ggx, void *ddy, void *dx, int64_t rows,
                             int64_t w, int is_run, const cfbn_gg_f32 *p, int dt)
{
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < w; j++) {
            int64_t c = is_run ? 0 : j, i = r * w + j;
            float g = ld(dy, i, dt), q = ld(ggx, i, dt);
            float d = (ld(x, i, dt) - p->mhi[c]) - p->mlo[c];
            float vy = q * p->a1[c] + (d * p->b1[c] + p->c1[c]);
            float vx = g * p->a2[c] + (q * p->b2[c] + (d * p->c2[c] + p->e2[c]));
            st(ddy, i, vy, dt);
            st(dx, i, vx, dt);
        }
    }
}

static inline void ggstats_run_s(const void *dy, const void *x, const void *ggx, int64_t n, const cfbn_gg_f32 *p,
                                 double *acc, int dt)
{
    ggstats_s(dy, x, ggx, 1, n, 1, p, acc, dt);
}
static inline void ggstats_rows_s(const void *dy, const void *x, const void *ggx, int64_t rows, int64_t w,
                                  const cfbn_gg_f32 *p, double *acc, int dt)
{
    ggstats_s(dy, x, ggx, rows, w, 0, p, acc, dt);
}
static inline void ggapply_run_s(const void *dy, const void *x, const void *ggx, void *ddy, void *dx, int64_t n,
                                 const cfbn_gg_f32 *p, int dt)
{
    ggapply_s(dy, x, ggx, ddy, dx, 1, n, 1, p, dt);
}
static inline void ggapply_rows_s(const void *dy, const void *x, const void *ggx, void *ddy, void *dx,
                                  int64_t rows, int64_t w, const cfbn_gg_f32 *p, int dt)
{
    ggapply_s(dy, x, ggx, ddy, dx, rows, w, 0, p, dt);
}

CFBN_FLOAT_ENTRIES(f32, CFBN_F32, s)
CFBN_FLOAT_ENTRIES(f16, CFBN_F16, s)
CFBN_FLOAT_ENTRIES(bf16, CFBN_BF16, s)
CFBN_GG_ENTRIES(f32, CFBN_F32, s)
CFBN_GG_ENTRIES(f16, CFBN_F16, s)
CFBN_GG_ENTRIES(bf16, CFBN_BF16, s)

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

static inline void ggstats_d(const double *dy, const double *x, const double *ggx, int64_t rows, int64_t w,
                             int is_run, const cfbn_gg_f64 *p, double *acc)
{
    int64_t na = is_run ? 1 : w;
    for (int64_t j = 0; j < 5 * na; j++) acc[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < w; j++) {
            int64_t c = is_run ? 0 : j, i = r * w + j;
            double g = dy[i], q = ggx[i], d = (x[i] - p->mhi[c]) - p->mlo[c];
            acc[c] += g;
            acc[na + c] += g * d;
            acc[2 * na + c] += q;
            acc[3 * na + c] += q * d;
            acc[4 * na + c] += q * g;
        }
    }
}

static inline void ggapply_d(const double *dy, const double *x, const double *ggx, double *ddy, double *dx,
                             int64_t rows, int64_t w, int is_run, const cfbn_gg_f64 *p)
{
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < w; j++) {
            int64_t c = is_run ? 0 : j, i = r * w + j;
            double g = dy[i], q = ggx[i], d = (x[i] - p->mhi[c]) - p->mlo[c];
            double vy = q * p->a1[c] + (d * p->b1[c] + p->c1[c]);
            double vx = g * p->a2[c] + (q * p->b2[c] + (d * p->c2[c] + p->e2[c]));
            ddy[i] = vy;
            dx[i] = vx;
        }
    }
}

static void ggstats_run_f64(const void *dy, const void *x, const void *ggx, int64_t n, const cfbn_gg_f64 *p,
                            double *acc)
{
    ggstats_d(dy, x, ggx, 1, n, 1, p, acc);
}
static void ggstats_rows_f64(const void *dy, const void *x, const void *ggx, int64_t rows, int64_t w,
                             const cfbn_gg_f64 *p, double *acc)
{
    ggstats_d(dy, x, ggx, rows, w, 0, p, acc);
}
static void ggapply_run_f64(const void *dy, const void *x, const void *ggx, void *ddy, void *dx, int64_t n,
                            const cfbn_gg_f64 *p)
{
    ggapply_d(dy, x, ggx, ddy, dx, 1, n, 1, p);
}
static void ggapply_rows_f64(const void *dy, const void *x, const void *ggx, void *ddy, void *dx, int64_t rows,
                             int64_t w, const cfbn_gg_f64 *p)
{
    ggapply_d(dy, x, ggx, ddy, dx, rows, w, 0, p);
}

const cfbn_kernels cfbn_kernels_scalar = {
    .name = "scalar",
    .lanes = 1,
    .f32 = { CFBN_FLOAT_TABLE(f32), CFBN_GG_TABLE(f32) },
    .f64 = {
        stats_run_f64, stats_rows_f64, apply_run_f64, apply_rows_f64,
        gstats_run_f64, gstats_rows_f64, gapply_run_f64, gapply_rows_f64,
        .apply_run_fused = apply_run_fused_f64, .apply_rows_fused = apply_rows_fused_f64,
        .gstats_run_fused = gstats_run_fused_f64, .gstats_rows_fused = gstats_rows_fused_f64,
        .gapply_run_fused = gapply_run_fused_f64, .gapply_rows_fused = gapply_rows_fused_f64,
        .ggstats_run = ggstats_run_f64, .ggstats_rows = ggstats_rows_f64,
        .ggapply_run = ggapply_run_f64, .ggapply_rows = ggapply_rows_f64,
    },
    .f16 = { CFBN_FLOAT_TABLE(f16), CFBN_GG_TABLE(f16) },
    .bf16 = { CFBN_FLOAT_TABLE(bf16), CFBN_GG_TABLE(bf16) },
};
