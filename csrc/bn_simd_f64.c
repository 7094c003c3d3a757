/* The float64 plain entries (stats, apply, gstats, gapply; run and rows),
 * written once for every ISA over the vd primitives of the ISA's header
 * (vd, VD_LANES, vd_load, vd_fma, ...); part of bn_simd.c, which includes
 * it.  For AVX2 these are the operations, in the same order, of the loops
 * they replaced, so the outputs kept their bits. */
#ifndef VD_LANES
#error "bn_simd_f64.c is included by bn_simd.c, after an ISA's vec_<isa>.h"
#endif

/* The elementwise passes' parameters, for these loops and the float ones:
 * the forward's per-column arrays (grad 0) and the gradient's (grad 1), in
 * the order the loops take them */
#define NPAR(grad) ((grad) ? 5 : 4)
#define APPLY_ARRAYS(p) {(p)->mhi, (p)->mlo, (p)->alpha, (p)->beta}
#define GRAD_ARRAYS(p) {(p)->mhi, (p)->mlo, (p)->a, (p)->b, (p)->c}

/* acc[j] = sum of lanes[l] over l = j, j + w, ... < period (w divides period) */
static void fold_lanes(const double *lanes, int64_t period, int64_t w, double *acc)
{
    for (int64_t j = 0; j < w; j++) {
        double s = 0.0;
        for (int64_t l = j; l < period; l += w) s += lanes[l];
        acc[j] = s;
    }
}

/* ---- float64 plain entries: flat streams alternate two parameter sets
 * over blocks of VD_LANES elements, so widths dividing 2 VD_LANES see whole
 * columns per lane; other widths go row by row with a masked tail ---- */

typedef struct {
    vd s1, s2;
} vd_acc;

INLINE vd_acc vd_acc_zero(void)
{
    vd_acc a = {vd_zero(), vd_zero()};
    return a;
}

INLINE void stats_step_pd(vd_acc *a, vd x, vd sh)
{
    vd d = vd_sub(x, sh);
    a->s1 = vd_add(a->s1, d);
    a->s2 = vd_fma(d, d, a->s2);
}

INLINE vd centered_pd(vd x, vd mhi, vd mlo)
{
    return vd_sub(vd_sub(x, mhi), mlo);
}

INLINE void gstats_step_pd(vd_acc *a, vd g, vd d)
{
    a->s1 = vd_add(a->s1, g);
    a->s2 = vd_fma(g, d, a->s2);
}

INLINE vd apply_pd(vd x, vd mhi, vd mlo, vd al, vd be)
{
    return vd_fma(centered_pd(x, mhi, mlo), al, be);
}

INLINE vd gapply_pd(vd g, vd x, vd mhi, vd mlo, vd a, vd b, vd c)
{
    return vd_fma(g, a, vd_fma(centered_pd(x, mhi, mlo), b, c));
}

INLINE vd ldpart_pd(const double *p, int64_t cnt) { return vd_load_part(p, vd_mask_first(cnt)); }

/* The sums of the statistics (grad 0: s1 += x - m0, s2 += (x - m0)^2, m0
 * the shift) or of the gradient (grad 1: s1 += g, s2 += g ((x - m0) - m1),
 * m0, m1 = mhi, mlo); grad is a constant at every call, as in the
 * elementwise passes (bn_simd_float.c), so each is compiled as its own loop
 * and the statistics never read dy or m1. */
INLINE void sums_step_pd(int grad, vd_acc *a, vd g, vd x, vd m0, vd m1)
{
    if (grad) gstats_step_pd(a, g, centered_pd(x, m0, m1));
    else stats_step_pd(a, x, m0);
}

INLINE void sums_at_pd(int grad, vd_acc *a, const double *dy, const double *x, int64_t i, const vd *m)
{
    sums_step_pd(grad, a, grad ? vd_load(dy + i) : vd_zero(), vd_load(x + i), m[0], grad ? m[1] : m[0]);
}

/* m: the even blocks' shift (grad 0) or mhi, mlo (grad 1), then the odd
 * blocks'; sums of even blocks in *ea. */
INLINE void sums_flat_pd(int grad, const double *dy, const double *x, int64_t n, const vd *m, vd_acc *ea,
                         vd_acc *oa)
{
    const vd *me = m, *mo = m + (grad ? 2 : 1);
    vd_acc a0 = vd_acc_zero(), b0 = vd_acc_zero(), a1 = vd_acc_zero(), b1 = vd_acc_zero();
    int64_t i = 0;
    for (; i + 4 * VD_LANES <= n; i += 4 * VD_LANES) {
        sums_at_pd(grad, &a0, dy, x, i, me);
        sums_at_pd(grad, &b0, dy, x, i + VD_LANES, mo);
        sums_at_pd(grad, &a1, dy, x, i + 2 * VD_LANES, me);
        sums_at_pd(grad, &b1, dy, x, i + 3 * VD_LANES, mo);
    }
    for (; i + 2 * VD_LANES <= n; i += 2 * VD_LANES) {
        sums_at_pd(grad, &a0, dy, x, i, me);
        sums_at_pd(grad, &b0, dy, x, i + VD_LANES, mo);
    }
    int odd = 0;
    if (i + VD_LANES <= n) {
        sums_at_pd(grad, &a1, dy, x, i, me);
        i += VD_LANES;
        odd = 1;
    }
    if (i < n) {
        /* dead lanes: x (and dy) read as 0 and the parameters are masked
         * to 0, so they add nothing */
        vd_mask mk = vd_mask_first(n - i);
        const vd *q = odd ? mo : me;
        vd g = grad ? vd_load_part(dy + i, mk) : vd_zero(), v = vd_load_part(x + i, mk);
        vd m0 = vd_keep(q[0], mk), m1 = vd_keep(grad ? q[1] : q[0], mk);
        if (odd) sums_step_pd(grad, &b1, g, v, m0, m1);
        else sums_step_pd(grad, &a1, g, v, m0, m1);
    }
    ea->s1 = vd_add(a0.s1, a1.s1);
    ea->s2 = vd_add(a0.s2, a1.s2);
    oa->s1 = vd_add(b0.s1, b1.s1);
    oa->s2 = vd_add(b0.s2, b1.s2);
}

INLINE void lanes_pd(const double *v, int64_t w, vd *even, vd *odd)
{
    double t[2 * VD_LANES];
    for (int l = 0; l < 2 * VD_LANES; l++) t[l] = v[l % w];
    *even = vd_load(t);
    *odd = vd_load(t + VD_LANES);
}

/* k parameter arrays as lanes_pd's even set, then the odd one */
INLINE void lanes_params_pd(const double *const *v, int k, int64_t w, vd *q)
{
    for (int i = 0; i < k; i++) lanes_pd(v[i], w, &q[i], &q[k + i]);
}

/* A run's sums: m as sums_flat_pd's, both sets the same */
INLINE void sums_run_pd(int grad, const double *dy, const double *x, int64_t n, const vd *m, double *acc)
{
    vd_acc a, b;
    sums_flat_pd(grad, dy, x, n, m, &a, &b);
    acc[0] = vd_hsum(vd_add(a.s1, b.s1));
    acc[1] = vd_hsum(vd_add(a.s2, b.s2));
}

/* nr (1 or 2) rows from element o of sums_rows_pd's rows: the whole
 * column blocks' sums added to acc, the partial block's to t (parameters
 * t0, t1) */
INLINE void rows_step_pd(int grad, int nr, const double *dy, const double *x, int64_t o, int64_t w,
                         const double *const *v, vd t0, vd t1, vd_acc *t, double *acc)
{
    const int64_t full = w & ~(int64_t)(VD_LANES - 1), cnt = w - full;
    const vd_mask mk = vd_mask_first(cnt);
    for (int64_t j = 0; j < full; j += VD_LANES) {
        vd_acc c = {vd_load(acc + j), vd_load(acc + w + j)};
        const vd m[2] = {vd_load(v[0] + j), grad ? vd_load(v[1] + j) : vd_zero()};
        for (int k = 0; k < nr; k++) sums_at_pd(grad, &c, dy, x, o + k * w + j, m);
        vd_store(acc + j, c.s1);
        vd_store(acc + w + j, c.s2);
    }
    for (int k = 0; cnt && k < nr; k++)
        sums_step_pd(grad, t, grad ? vd_load_part(dy + o + k * w + full, mk) : vd_zero(),
                     vd_load_part(x + o + k * w + full, mk), t0, t1);
}

/* Sums of rows of w columns, per column to acc[0, w) and acc[w, 2 w); v:
 * the shifts (grad 0) or mhi, mlo (grad 1) */
INLINE void sums_rows_pd(int grad, const double *dy, const double *x, int64_t rows, int64_t w,
                         const double *const *v, double *acc)
{
    const int k = grad ? 2 : 1;
    if (w <= 0) return;
    if ((2 * VD_LANES) % w == 0) {
        vd q[4];
        double s1[2 * VD_LANES], s2[2 * VD_LANES];
        lanes_params_pd(v, k, w, q);
        vd_acc a, b;
        sums_flat_pd(grad, dy, x, rows * w, q, &a, &b);
        vd_store(s1, a.s1);
        vd_store(s1 + VD_LANES, b.s1);
        vd_store(s2, a.s2);
        vd_store(s2 + VD_LANES, b.s2);
        fold_lanes(s1, 2 * VD_LANES, w, acc);
        fold_lanes(s2, 2 * VD_LANES, w, acc + w);
        return;
    }
    const int64_t full = w & ~(int64_t)(VD_LANES - 1), cnt = w - full;
    memset(acc, 0, (size_t)(2 * w) * sizeof *acc);
    vd_acc t = vd_acc_zero();
    vd_mask mk = vd_mask_first(cnt);
    vd t0 = vd_zero(), t1 = t0;
    if (cnt) t0 = ldpart_pd(v[0] + full, cnt);
    if (cnt && grad) t1 = ldpart_pd(v[1] + full, cnt);
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2) rows_step_pd(grad, 2, dy, x, r * w, w, v, t0, t1, &t, acc);
    if (r < rows) rows_step_pd(grad, 1, dy, x, r * w, w, v, t0, t1, &t, acc);
    if (cnt) {
        vd_store_part(acc + full, mk, t.s1);
        vd_store_part(acc + w + full, mk, t.s2);
    }
}

/* The elementwise passes (bn_simd_float.c's out_ps): y (grad 0, q = mhi,
 * mlo, alpha, beta) or dx (grad 1, q = mhi, mlo, a, b, c) */
INLINE vd out_pd(int grad, vd g, vd x, const vd *q)
{
    return grad ? gapply_pd(g, x, q[0], q[1], q[2], q[3], q[4]) : apply_pd(x, q[0], q[1], q[2], q[3]);
}

INLINE vd out_at_pd(int grad, const double *dy, const double *x, int64_t i, const vd *q)
{
    return out_pd(grad, grad ? vd_load(dy + i) : vd_zero(), vd_load(x + i), q);
}

/* q: the even blocks' set, then the odd blocks' */
INLINE void out_flat_pd(int grad, const double *dy, const double *x, double *y, int64_t n, const vd *q)
{
    const int k = NPAR(grad), step = grad ? 2 : 4;
    int64_t i = 0;
    for (; i + step * VD_LANES <= n; i += step * VD_LANES) {
        vd r[4];
        for (int s = 0; s < step; s++) r[s] = out_at_pd(grad, dy, x, i + s * VD_LANES, q + k * (s & 1));
        for (int s = 0; s < step; s++) vd_store(y + i + s * VD_LANES, r[s]);
    }
    for (; i + VD_LANES <= n; i += VD_LANES) vd_store(y + i, out_at_pd(grad, dy, x, i, q + k * ((i / VD_LANES) & 1)));
    if (i < n) {
        vd_mask mk = vd_mask_first(n - i);
        vd g = grad ? vd_load_part(dy + i, mk) : vd_zero();
        vd_store_part(y + i, mk, out_pd(grad, g, vd_load_part(x + i, mk), q + k * ((i / VD_LANES) & 1)));
    }
}

/* Rows of width w: a flat stream where w divides 2 VD_LANES, otherwise
 * row by row with a masked tail */
INLINE void out_rows_pd(int grad, const double *dy, const double *x, double *y, int64_t rows, int64_t w,
                        const double *const *v)
{
    const int k = NPAR(grad);
    if (w <= 0) return;
    if ((2 * VD_LANES) % w == 0) {
        vd q[10];
        lanes_params_pd(v, k, w, q);
        out_flat_pd(grad, dy, x, y, rows * w, q);
        return;
    }
    const int64_t full = w & ~(int64_t)(VD_LANES - 1), cnt = w - full;
    vd_mask mk = vd_mask_first(cnt);
    vd t[5];
    for (int i = 0; i < k; i++) t[i] = cnt ? ldpart_pd(v[i] + full, cnt) : vd_zero();
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = r * w;
        for (int64_t j = 0; j < full; j += VD_LANES) {
            vd c[5];
            for (int i = 0; i < k; i++) c[i] = vd_load(v[i] + j);
            vd_store(y + o + j, out_at_pd(grad, dy, x, o + j, c));
        }
        if (cnt) {
            vd g = grad ? vd_load_part(dy + o + full, mk) : vd_zero();
            vd_store_part(y + o + full, mk, out_pd(grad, g, vd_load_part(x + o + full, mk), t));
        }
    }
}

/* k parameters of a run, each one value broadcast, as both sets */
INLINE void run_params_pd(const double *const *v, int k, vd *q)
{
    for (int i = 0; i < k; i++) q[i] = q[k + i] = vd_set1(v[i][0]);
}

static void stats_run_f64(const void *x, int64_t n, double shift, double *acc)
{
    const vd q[2] = {vd_set1(shift), vd_set1(shift)};
    sums_run_pd(0, NULL, x, n, q, acc);
}

static void stats_rows_f64(const void *x, int64_t rows, int64_t w, const double *shift, double *acc)
{
    const double *const v[1] = {shift};
    sums_rows_pd(0, NULL, x, rows, w, v, acc);
}

static void apply_run_f64(const void *x, void *y, int64_t n, const cfbn_apply_f64 *p)
{
    const double *const v[4] = APPLY_ARRAYS(p);
    vd q[8];
    run_params_pd(v, 4, q);
    out_flat_pd(0, NULL, x, y, n, q);
}

static void apply_rows_f64(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f64 *p)
{
    const double *const v[4] = APPLY_ARRAYS(p);
    out_rows_pd(0, NULL, x, y, rows, w, v);
}

static void gstats_run_f64(const void *dy, const void *x, int64_t n, const cfbn_grad_f64 *p, double *acc)
{
    const double *const v[2] = {p->mhi, p->mlo};
    vd q[4];
    run_params_pd(v, 2, q);
    sums_run_pd(1, dy, x, n, q, acc);
}

static void gstats_rows_f64(const void *dy, const void *x, int64_t rows, int64_t w, const cfbn_grad_f64 *p,
                            double *acc)
{
    const double *const v[2] = {p->mhi, p->mlo};
    sums_rows_pd(1, dy, x, rows, w, v, acc);
}

static void gapply_run_f64(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f64 *p)
{
    const double *const v[5] = GRAD_ARRAYS(p);
    vd q[10];
    run_params_pd(v, 5, q);
    out_flat_pd(1, dy, x, dx, n, q);
}

static void gapply_rows_f64(const void *dy, const void *x, void *dx, int64_t rows, int64_t w,
                            const cfbn_grad_f64 *p)
{
    const double *const v[5] = GRAD_ARRAYS(p);
    out_rows_pd(1, dy, x, dx, rows, w, v);
}
