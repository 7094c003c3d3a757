/* The float64 plain entries (stats, apply, gstats, gapply; run and rows),
 * written once for every ISA over the vd primitives of the ISA's header
 * (vd, VD_LANES, vd_load, vd_fma, ...); part of bn_simd.c, which includes
 * it.  For AVX2 these are the operations, in the same order, of the loops
 * they replaced, so the outputs kept their bits. */
#ifndef VD_LANES
#error "bn_simd_f64.c is included by bn_simd.c, after an ISA's vec_<isa>.h"
#endif

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

/* sh[0] for even blocks, sh[1] for odd; sums of even blocks in *ea. */
INLINE void stats_flat_pd(const double *x, int64_t n, const vd *sh, vd_acc *ea, vd_acc *oa)
{
    vd_acc a0 = vd_acc_zero(), b0 = vd_acc_zero(), a1 = vd_acc_zero(), b1 = vd_acc_zero();
    int64_t i = 0;
    for (; i + 4 * VD_LANES <= n; i += 4 * VD_LANES) {
        stats_step_pd(&a0, vd_load(x + i), sh[0]);
        stats_step_pd(&b0, vd_load(x + i + VD_LANES), sh[1]);
        stats_step_pd(&a1, vd_load(x + i + 2 * VD_LANES), sh[0]);
        stats_step_pd(&b1, vd_load(x + i + 3 * VD_LANES), sh[1]);
    }
    for (; i + 2 * VD_LANES <= n; i += 2 * VD_LANES) {
        stats_step_pd(&a0, vd_load(x + i), sh[0]);
        stats_step_pd(&b0, vd_load(x + i + VD_LANES), sh[1]);
    }
    int odd = 0;
    if (i + VD_LANES <= n) {
        stats_step_pd(&a1, vd_load(x + i), sh[0]);
        i += VD_LANES;
        odd = 1;
    }
    if (i < n) {
        vd_mask mk = vd_mask_first(n - i);
        vd v = vd_load_part(x + i, mk);
        if (odd)
            stats_step_pd(&b1, v, vd_keep(sh[1], mk));
        else
            stats_step_pd(&a1, v, vd_keep(sh[0], mk));
    }
    ea->s1 = vd_add(a0.s1, a1.s1);
    ea->s2 = vd_add(a0.s2, a1.s2);
    oa->s1 = vd_add(b0.s1, b1.s1);
    oa->s2 = vd_add(b0.s2, b1.s2);
}

/* m: mhi, mlo of even blocks, then of odd ones */
INLINE void gstats_flat_pd(const double *dy, const double *x, int64_t n, const vd *m, vd_acc *ea, vd_acc *oa)
{
    vd_acc a0 = vd_acc_zero(), b0 = vd_acc_zero(), a1 = vd_acc_zero(), b1 = vd_acc_zero();
    int64_t i = 0;
    for (; i + 4 * VD_LANES <= n; i += 4 * VD_LANES) {
        gstats_step_pd(&a0, vd_load(dy + i), centered_pd(vd_load(x + i), m[0], m[1]));
        gstats_step_pd(&b0, vd_load(dy + i + VD_LANES), centered_pd(vd_load(x + i + VD_LANES), m[2], m[3]));
        gstats_step_pd(&a1, vd_load(dy + i + 2 * VD_LANES), centered_pd(vd_load(x + i + 2 * VD_LANES), m[0], m[1]));
        gstats_step_pd(&b1, vd_load(dy + i + 3 * VD_LANES), centered_pd(vd_load(x + i + 3 * VD_LANES), m[2], m[3]));
    }
    for (; i + 2 * VD_LANES <= n; i += 2 * VD_LANES) {
        gstats_step_pd(&a0, vd_load(dy + i), centered_pd(vd_load(x + i), m[0], m[1]));
        gstats_step_pd(&b0, vd_load(dy + i + VD_LANES), centered_pd(vd_load(x + i + VD_LANES), m[2], m[3]));
    }
    int odd = 0;
    if (i + VD_LANES <= n) {
        gstats_step_pd(&a1, vd_load(dy + i), centered_pd(vd_load(x + i), m[0], m[1]));
        i += VD_LANES;
        odd = 1;
    }
    if (i < n) {
        vd_mask mk = vd_mask_first(n - i);
        vd g = vd_load_part(dy + i, mk), v = vd_load_part(x + i, mk);
        if (odd)
            gstats_step_pd(&b1, g, centered_pd(v, vd_keep(m[2], mk), vd_keep(m[3], mk)));
        else
            gstats_step_pd(&a1, g, centered_pd(v, vd_keep(m[0], mk), vd_keep(m[1], mk)));
    }
    ea->s1 = vd_add(a0.s1, a1.s1);
    ea->s2 = vd_add(a0.s2, a1.s2);
    oa->s1 = vd_add(b0.s1, b1.s1);
    oa->s2 = vd_add(b0.s2, b1.s2);
}

/* p: mhi, mlo, alpha, beta of even blocks, then of odd ones */
INLINE void apply_flat_pd(const double *x, double *y, int64_t n, const vd *p)
{
    int64_t i = 0;
    for (; i + 4 * VD_LANES <= n; i += 4 * VD_LANES) {
        vd v0 = vd_load(x + i), v1 = vd_load(x + i + VD_LANES);
        vd v2 = vd_load(x + i + 2 * VD_LANES), v3 = vd_load(x + i + 3 * VD_LANES);
        vd_store(y + i, apply_pd(v0, p[0], p[1], p[2], p[3]));
        vd_store(y + i + VD_LANES, apply_pd(v1, p[4], p[5], p[6], p[7]));
        vd_store(y + i + 2 * VD_LANES, apply_pd(v2, p[0], p[1], p[2], p[3]));
        vd_store(y + i + 3 * VD_LANES, apply_pd(v3, p[4], p[5], p[6], p[7]));
    }
    for (; i + VD_LANES <= n; i += VD_LANES) {
        const vd *q = p + 4 * ((i / VD_LANES) & 1);
        vd_store(y + i, apply_pd(vd_load(x + i), q[0], q[1], q[2], q[3]));
    }
    if (i < n) {
        const vd *q = p + 4 * ((i / VD_LANES) & 1);
        vd_mask mk = vd_mask_first(n - i);
        vd_store_part(y + i, mk, apply_pd(vd_load_part(x + i, mk), q[0], q[1], q[2], q[3]));
    }
}

/* p: mhi, mlo, a, b, c of even blocks, then of odd ones */
INLINE void gapply_flat_pd(const double *dy, const double *x, double *dx, int64_t n, const vd *p)
{
    int64_t i = 0;
    for (; i + 2 * VD_LANES <= n; i += 2 * VD_LANES) {
        vd g0 = vd_load(dy + i), g1 = vd_load(dy + i + VD_LANES);
        vd v0 = vd_load(x + i), v1 = vd_load(x + i + VD_LANES);
        vd_store(dx + i, gapply_pd(g0, v0, p[0], p[1], p[2], p[3], p[4]));
        vd_store(dx + i + VD_LANES, gapply_pd(g1, v1, p[5], p[6], p[7], p[8], p[9]));
    }
    if (i + VD_LANES <= n) {
        vd_store(dx + i, gapply_pd(vd_load(dy + i), vd_load(x + i), p[0], p[1], p[2], p[3], p[4]));
        i += VD_LANES;
    }
    if (i < n) {
        const vd *q = p + 5 * ((i / VD_LANES) & 1);
        vd_mask mk = vd_mask_first(n - i);
        vd g = vd_load_part(dy + i, mk), v = vd_load_part(x + i, mk);
        vd_store_part(dx + i, mk, gapply_pd(g, v, q[0], q[1], q[2], q[3], q[4]));
    }
}

INLINE void lanes_pd(const double *v, int64_t w, vd *even, vd *odd)
{
    double t[2 * VD_LANES];
    for (int l = 0; l < 2 * VD_LANES; l++) t[l] = v[l % w];
    *even = vd_load(t);
    *odd = vd_load(t + VD_LANES);
}

static void stats_run_f64(const void *x_, int64_t n, double shift, double *acc)
{
    const double *x = x_;
    vd s = vd_set1(shift);
    const vd sh[2] = {s, s};
    vd_acc a, b;
    stats_flat_pd(x, n, sh, &a, &b);
    acc[0] = vd_hsum(vd_add(a.s1, b.s1));
    acc[1] = vd_hsum(vd_add(a.s2, b.s2));
}

static void stats_rows_f64(const void *x_, int64_t rows, int64_t w, const double *shift, double *acc)
{
    const double *x = x_;
    if (w <= 0) return;
    if ((2 * VD_LANES) % w == 0) {
        vd sh[2];
        double s1[2 * VD_LANES], s2[2 * VD_LANES];
        lanes_pd(shift, w, &sh[0], &sh[1]);
        vd_acc a, b;
        stats_flat_pd(x, rows * w, sh, &a, &b);
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
    vd ts = cnt ? vd_load_part(shift + full, mk) : vd_zero();
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2) {
        const double *x0 = x + r * w, *x1 = x0 + w;
        for (int64_t j = 0; j < full; j += VD_LANES) {
            vd_acc c = {vd_load(acc + j), vd_load(acc + w + j)};
            vd s = vd_load(shift + j);
            stats_step_pd(&c, vd_load(x0 + j), s);
            stats_step_pd(&c, vd_load(x1 + j), s);
            vd_store(acc + j, c.s1);
            vd_store(acc + w + j, c.s2);
        }
        if (cnt) {
            stats_step_pd(&t, vd_load_part(x0 + full, mk), ts);
            stats_step_pd(&t, vd_load_part(x1 + full, mk), ts);
        }
    }
    if (r < rows) {
        const double *x0 = x + r * w;
        for (int64_t j = 0; j < full; j += VD_LANES) {
            vd_acc c = {vd_load(acc + j), vd_load(acc + w + j)};
            stats_step_pd(&c, vd_load(x0 + j), vd_load(shift + j));
            vd_store(acc + j, c.s1);
            vd_store(acc + w + j, c.s2);
        }
        if (cnt) stats_step_pd(&t, vd_load_part(x0 + full, mk), ts);
    }
    if (cnt) {
        vd_store_part(acc + full, mk, t.s1);
        vd_store_part(acc + w + full, mk, t.s2);
    }
}

static void apply_run_f64(const void *x_, void *y_, int64_t n, const cfbn_apply_f64 *p)
{
    const double *x = x_;
    double *y = y_;
    vd m = vd_set1(p->mhi[0]), l = vd_set1(p->mlo[0]);
    vd a = vd_set1(p->alpha[0]), b = vd_set1(p->beta[0]);
    const vd q[8] = {m, l, a, b, m, l, a, b};
    apply_flat_pd(x, y, n, q);
}

static void apply_rows_f64(const void *x_, void *y_, int64_t rows, int64_t w, const cfbn_apply_f64 *p)
{
    const double *x = x_;
    double *y = y_;
    if (w <= 0) return;
    if ((2 * VD_LANES) % w == 0) {
        vd q[8];
        lanes_pd(p->mhi, w, &q[0], &q[4]);
        lanes_pd(p->mlo, w, &q[1], &q[5]);
        lanes_pd(p->alpha, w, &q[2], &q[6]);
        lanes_pd(p->beta, w, &q[3], &q[7]);
        apply_flat_pd(x, y, rows * w, q);
        return;
    }
    const int64_t full = w & ~(int64_t)(VD_LANES - 1), cnt = w - full;
    vd_mask mk = vd_mask_first(cnt);
    vd tm = vd_zero(), tl = tm, ta = tm, tb = tm;
    if (cnt) {
        tm = ldpart_pd(p->mhi + full, cnt);
        tl = ldpart_pd(p->mlo + full, cnt);
        ta = ldpart_pd(p->alpha + full, cnt);
        tb = ldpart_pd(p->beta + full, cnt);
    }
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * w;
        double *yr = y + r * w;
        for (int64_t j = 0; j < full; j += VD_LANES)
            vd_store(yr + j, apply_pd(vd_load(xr + j), vd_load(p->mhi + j),
                                              vd_load(p->mlo + j), vd_load(p->alpha + j),
                                              vd_load(p->beta + j)));
        if (cnt) vd_store_part(yr + full, mk, apply_pd(vd_load_part(xr + full, mk), tm, tl, ta, tb));
    }
}

static void gstats_run_f64(const void *dy_, const void *x_, int64_t n, const cfbn_grad_f64 *p, double *acc)
{
    const double *dy = dy_;
    const double *x = x_;
    vd m = vd_set1(p->mhi[0]), l = vd_set1(p->mlo[0]);
    const vd q[4] = {m, l, m, l};
    vd_acc a, b;
    gstats_flat_pd(dy, x, n, q, &a, &b);
    acc[0] = vd_hsum(vd_add(a.s1, b.s1));
    acc[1] = vd_hsum(vd_add(a.s2, b.s2));
}

static void gstats_rows_f64(const void *dy_, const void *x_, int64_t rows, int64_t w, const cfbn_grad_f64 *p, double *acc)
{
    const double *dy = dy_;
    const double *x = x_;
    if (w <= 0) return;
    if ((2 * VD_LANES) % w == 0) {
        vd q[4];
        double s1[2 * VD_LANES], s2[2 * VD_LANES];
        lanes_pd(p->mhi, w, &q[0], &q[2]);
        lanes_pd(p->mlo, w, &q[1], &q[3]);
        vd_acc a, b;
        gstats_flat_pd(dy, x, rows * w, q, &a, &b);
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
    vd tm = vd_zero(), tl = tm;
    if (cnt) {
        tm = ldpart_pd(p->mhi + full, cnt);
        tl = ldpart_pd(p->mlo + full, cnt);
    }
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2) {
        const double *x0 = x + r * w, *x1 = x0 + w, *g0 = dy + r * w, *g1 = g0 + w;
        for (int64_t j = 0; j < full; j += VD_LANES) {
            vd_acc c = {vd_load(acc + j), vd_load(acc + w + j)};
            vd m = vd_load(p->mhi + j), l = vd_load(p->mlo + j);
            gstats_step_pd(&c, vd_load(g0 + j), centered_pd(vd_load(x0 + j), m, l));
            gstats_step_pd(&c, vd_load(g1 + j), centered_pd(vd_load(x1 + j), m, l));
            vd_store(acc + j, c.s1);
            vd_store(acc + w + j, c.s2);
        }
        if (cnt) {
            gstats_step_pd(&t, vd_load_part(g0 + full, mk), centered_pd(vd_load_part(x0 + full, mk), tm, tl));
            gstats_step_pd(&t, vd_load_part(g1 + full, mk), centered_pd(vd_load_part(x1 + full, mk), tm, tl));
        }
    }
    if (r < rows) {
        const double *x0 = x + r * w, *g0 = dy + r * w;
        for (int64_t j = 0; j < full; j += VD_LANES) {
            vd_acc c = {vd_load(acc + j), vd_load(acc + w + j)};
            gstats_step_pd(&c, vd_load(g0 + j),
                           centered_pd(vd_load(x0 + j), vd_load(p->mhi + j), vd_load(p->mlo + j)));
            vd_store(acc + j, c.s1);
            vd_store(acc + w + j, c.s2);
        }
        if (cnt)
            gstats_step_pd(&t, vd_load_part(g0 + full, mk), centered_pd(vd_load_part(x0 + full, mk), tm, tl));
    }
    if (cnt) {
        vd_store_part(acc + full, mk, t.s1);
        vd_store_part(acc + w + full, mk, t.s2);
    }
}

static void gapply_run_f64(const void *dy_, const void *x_, void *dx_, int64_t n, const cfbn_grad_f64 *p)
{
    const double *dy = dy_;
    const double *x = x_;
    double *dx = dx_;
    vd m = vd_set1(p->mhi[0]), l = vd_set1(p->mlo[0]);
    vd a = vd_set1(p->a[0]), b = vd_set1(p->b[0]), c = vd_set1(p->c[0]);
    const vd q[10] = {m, l, a, b, c, m, l, a, b, c};
    gapply_flat_pd(dy, x, dx, n, q);
}

static void gapply_rows_f64(const void *dy_, const void *x_, void *dx_, int64_t rows, int64_t w, const cfbn_grad_f64 *p)
{
    const double *dy = dy_;
    const double *x = x_;
    double *dx = dx_;
    if (w <= 0) return;
    if ((2 * VD_LANES) % w == 0) {
        vd q[10];
        lanes_pd(p->mhi, w, &q[0], &q[5]);
        lanes_pd(p->mlo, w, &q[1], &q[6]);
        lanes_pd(p->a, w, &q[2], &q[7]);
        lanes_pd(p->b, w, &q[3], &q[8]);
        lanes_pd(p->c, w, &q[4], &q[9]);
        gapply_flat_pd(dy, x, dx, rows * w, q);
        return;
    }
    const int64_t full = w & ~(int64_t)(VD_LANES - 1), cnt = w - full;
    vd_mask mk = vd_mask_first(cnt);
    vd tm = vd_zero(), tl = tm, ta = tm, tb = tm, tc = tm;
    if (cnt) {
        tm = ldpart_pd(p->mhi + full, cnt);
        tl = ldpart_pd(p->mlo + full, cnt);
        ta = ldpart_pd(p->a + full, cnt);
        tb = ldpart_pd(p->b + full, cnt);
        tc = ldpart_pd(p->c + full, cnt);
    }
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * w, *gr = dy + r * w;
        double *o = dx + r * w;
        for (int64_t j = 0; j < full; j += VD_LANES)
            vd_store(o + j, gapply_pd(vd_load(gr + j), vd_load(xr + j), vd_load(p->mhi + j),
                                              vd_load(p->mlo + j), vd_load(p->a + j),
                                              vd_load(p->b + j), vd_load(p->c + j)));
        if (cnt)
            vd_store_part(o + full, mk, gapply_pd(vd_load_part(gr + full, mk), vd_load_part(xr + full, mk),
                                                        tm, tl, ta, tb, tc));
    }
}
