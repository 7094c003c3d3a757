/* The second-order gradient's loops (the gg* entries), written once for
 * every ISA over the primitives of the ISA's header (vec_avx2.h: vf and
 * VF_LANES, vd and VD_LANES, masks, loads and stores of each storage type,
 * ...), which the including file has included, together with the loops
 * these call from the plain and fused regions (fold_lanes, needs_double,
 * any_suspect, ld1, lanes_ps, centered_ps, st_out, ...).  Nothing here
 * names an instruction set; the loop names exist once and are static in
 * each ISA's translation unit.
 *
 * Float-compute storage (f32, f16, bf16: a constant dt that always_inline
 * folds away) first, then float64.  Lane counts are VF_LANES and VD_LANES
 * (VF_LANES == 2 VD_LANES); the blocks of 8 vectors (8 rows, 8 runs, or 8
 * vectors of a stream) summed pairwise in float are a blocking factor,
 * GG_BLOCK, the same on every ISA. */
#ifndef VF_LANES
#error "bn_simd_gg.c is included after an ISA's vec_<isa>.h"
#endif

#include <float.h>
#include <math.h>
#include <string.h>

#include "bn_entries.h"
#include "bn_runs.h"

/* vectors (rows, runs) summed pairwise in float before a block's sums are
 * widened to double: gg_block_ps's tree */
#define GG_BLOCK 8

/* ---- second-order gradient (cfbn_gg_f32: f32, f16 and bf16 storage) ----
 * g = dy, q = ggx and d = (x - mhi) - mlo; the five sums are g, g d, q, q d
 * and q g.  They are summed as the gradient's are (gstats_rows8_ps,
 * gstats_tree_step): blocks of 8 vectors (8 rows of a group of VF_LANES
 * columns, or 8 VF_LANES elements of a stream) pairwise in float with
 * u = x - mhi for d, each block's sums widened once and added in double,
 * where mlo comes off as sum g u - mlo sum g.  Widening every element
 * instead (three conversions for each VD_LANES elements) was twice as slow
 * from L1 on AVX2 (0.34 against 0.18 ns an element on 3136-element runs)
 * and 5.3 against 4.0 ms from memory on (32,56,56,64) float32 rows, whose
 * three tensors take 3.5 ms to read.
 * The rows left after the blocks of 8 go a vector at a time in double.  A
 * column whose float sums left float's range is summed again in double
 * (gg_needs_double).  Rows go in blocks of 8 rows, each group of VF_LANES
 * columns summed in registers and added to acc (5 w doubles, in L1) once
 * per block; widths dividing VF_LANES go as one flat stream with per-lane
 * parameters. */

/* The five sums of VD_LANES lanes, in double. */
typedef struct {
    vd g, gd, q, qd, qg;
} acc5;

INLINE acc5 acc5_zero(void)
{
    const vd z = vd_zero();
    acc5 a = {z, z, z, z, z};
    return a;
}

INLINE acc5 acc5_add(acc5 a, acc5 b)
{
    acc5 r = {vd_add(a.g, b.g), vd_add(a.gd, b.gd), vd_add(a.q, b.q),
              vd_add(a.qd, b.qd), vd_add(a.qg, b.qg)};
    return r;
}

/* acc[0..5): the five sums over the lanes of a */
INLINE void acc5_total(acc5 a, double *acc)
{
    acc[0] = vd_hsum(a.g);
    acc[1] = vd_hsum(a.gd);
    acc[2] = vd_hsum(a.q);
    acc[3] = vd_hsum(a.qd);
    acc[4] = vd_hsum(a.qg);
}

/* The lanes of a into lanes[k * stride ...] for sum k. */
INLINE void acc5_store(const acc5 *a, double *lanes, int64_t stride)
{
    vd_store(lanes, a->g);
    vd_store(lanes + stride, a->gd);
    vd_store(lanes + 2 * stride, a->q);
    vd_store(lanes + 3 * stride, a->qd);
    vd_store(lanes + 4 * stride, a->qg);
}

/* Lane sums of a flat stream (lanes[k * period + l], lane l being column
 * l % w, w dividing period) folded into the five sums of w columns. */
static void fold_lanes5(const double *lanes, int64_t period, int64_t w, double *acc)
{
    for (int k = 0; k < 5; k++) fold_lanes(lanes + k * period, period, w, acc + k * w);
}

/* Adds lanes [0, cnt) of a (cnt >= VD_LANES: all of them) to columns j..
 * of the five sums at acc + j (sum k of column j at acc[k * w + j]): the
 * masked lanes belong to the next sum's columns. */
INLINE void acc5_add_cols(const acc5 *a, double *acc, int64_t w, int64_t cnt)
{
    const vd v[5] = {a->g, a->gd, a->q, a->qd, a->qg};
    const vd_mask mk = vd_mask_first(cnt);
    for (int k = 0; k < 5; k++) {
        double *s = acc + k * w;
        if (cnt >= VD_LANES) vd_store(s, vd_add(vd_load(s), v[k]));
        else vd_store_part(s, mk, vd_add(vd_load_part(s, mk), v[k]));
    }
}

/* Whether the five float-block sums of a column, acc[k * w] for sum k over
 * count elements, need double: needs_double for (g, g d) and (q, q d); q g
 * is a second sum whose exact zero is kept where sum q or sum g is exactly
 * zero (ggx or dy zero: every product is an exact zero then, but for the
 * same miss as needs_double's, products that all vanish while their first
 * sums cancel exactly). */
static int gg_needs_double(const double *acc, int64_t w, double count, float mhi, float mlo)
{
    double m = fabs(mhi), tiny = count * TINY_SUM, s = acc[4 * w];
    int mfin = finite_f(mhi) && finite_f(mlo);
    if (needs_double(acc[0], acc[w], count, m, mfin) || needs_double(acc[2 * w], acc[3 * w], count, m, mfin)) return 1;
    if (fabs(s) >= tiny && fabs(s) <= DBL_MAX) return 0;
    return !(s == 0.0 && (acc[0] == 0.0 || acc[2 * w] == 0.0));
}

/* Column j of rows x w: its five sums again in double, element by element
 * as bn_scalar.c sums them, to acc[k * w]. */
COLD void ggstats_column_pd(const void *dy, const void *x, const void *ggx, int64_t rows, int64_t w, int64_t j,
                            float mhi, float mlo, double *acc, int dt)
{
    double s[5] = {0.0, 0.0, 0.0, 0.0, 0.0};
    for (int64_t r = 0; r < rows; r++) {
        int64_t i = r * w + j;
        double g = ld1(dy, i, dt), q = ld1(ggx, i, dt), d = (ld1(x, i, dt) - mhi) - mlo;
        s[0] += g;
        s[1] += g * d;
        s[2] += q;
        s[3] += q * d;
        s[4] += q * g;
    }
    for (int k = 0; k < 5; k++) acc[k * w] = s[k];
}

/* suspect_pd's quick tests for the five sums of one column: whether a sum
 * is not finite or a second sum below tiny (a superset of what
 * gg_needs_double flags) */
INLINE int gg_suspect(const double *acc, int64_t w, double tiny)
{
    double a = fabs(acc[w]), b = fabs(acc[3 * w]), c = fabs(acc[4 * w]);
    return !(acc[0] - acc[0] == 0.0 && acc[2 * w] - acc[2 * w] == 0.0 && a >= tiny && a <= DBL_MAX && b >= tiny &&
             b <= DBL_MAX && c >= tiny && c <= DBL_MAX);
}

/* Each of w columns whose float-block sums (acc, rows elements a column)
 * need double summed again.  The quick tests come first: vector compares
 * (any_suspect) when w is a multiple of VD_LANES, else inline per column.
 * any_suspect takes the pairs (g, g d), (q, q d) and (q d, q g): the last
 * tests q g, and q d and q again, which covers every sum. */
INLINE void ggstats_redo_ps(const void *dy, const void *x, const void *ggx, int64_t rows, int64_t w,
                            const cfbn_gg_f32 *p, double *acc, int dt)
{
    if (w % VD_LANES == 0 && !any_suspect(acc, w, (double)rows) && !any_suspect(acc + 2 * w, w, (double)rows) &&
        !any_suspect(acc + 3 * w, w, (double)rows))
        return;
    const double tiny = (double)rows * TINY_SUM;
    for (int64_t j = 0; j < w; j++)
        if (gg_suspect(acc + j, w, tiny) && gg_needs_double(acc + j, w, (double)rows, p->mhi[j], p->mlo[j]))
            ggstats_column_pd(dy, x, ggx, rows, w, j, p->mhi[j], p->mlo[j], acc + j, dt);
}

/* g, q and u = x - mhi of the vector at e: whole, or with part its first
 * cnt (1..VF_LANES) elements (avail readable from e) and zero past them, so
 * that a missing element adds nothing, even to the sums of an infinite
 * mean */
INLINE void gg_load_ps(const void *dy, const void *x, const void *ggx, int64_t e, int part, int64_t cnt,
                       int64_t avail, vf m, int dt, vf *g, vf *q, vf *u)
{
    if (!part) {
        *g = vf_ld(dy, e, dt);
        *q = vf_ld(ggx, e, dt);
        *u = vf_sub(vf_ld(x, e, dt), m);
        return;
    }
    *g = vf_ld_part(dy, e, cnt, avail, dt);
    *q = vf_ld_part(ggx, e, cnt, avail, dt);
    *u = vf_sub(vf_ld_part(x, e, cnt, avail, dt), vf_keep(m, vf_mask_first(cnt)));
}

/* Vector v (of nv, the last holding last elements) as gg_load_ps loads it,
 * zero past nv. */
INLINE void gg_slot_ps(const void *dy, const void *x, const void *ggx, int64_t e, int64_t v, int64_t nv, int part,
                       int64_t cnt, int64_t last, int64_t avail, vf m, int dt, vf *g, vf *q, vf *u)
{
    if (v < nv - 1 || (v == nv - 1 && !part && last == VF_LANES)) {
        gg_load_ps(dy, x, ggx, e, part, cnt, avail, m, dt, g, q, u);
    } else if (v == nv - 1) {
        gg_load_ps(dy, x, ggx, e, 1, last, avail, m, dt, g, q, u);
    } else {
        *g = *q = *u = vf_zero();
    }
}

/* The five sums of 8 vectors, vector v at element e0 + v step of n (with
 * part, cnt elements of each), the first nv of them (the last of which
 * holds last elements; nv 8 and last cnt: all alike): pairwise in float,
 * in tree8's and dot_tree8's order, then widened to lanes [0, VD_LANES)
 * (lo) and [VD_LANES, VF_LANES) (hi).  n < 0: each vector is readable only
 * up to its cnt elements (8 runs of a channel, not one stream). */
INLINE void gg_block_ps(const void *dy, const void *x, const void *ggx, int64_t e0, int64_t step, int64_t n,
                        int part, int64_t cnt, int64_t nv, int64_t last, vf m, vf l, int dt, acc5 *lo,
                        acc5 *hi)
{
    vf h[2][5];
    for (int b = 0; b < 2; b++) {
        vf s[2][5];
        for (int k = 0; k < 2; k++) {
            const int64_t v = 4 * b + 2 * k, e = e0 + v * step;
            vf g0, q0, u0, g1, q1, u1;
            const int64_t av0 = n < 0 ? cnt : n - e, av1 = n < 0 ? cnt : n - e - step;
            gg_slot_ps(dy, x, ggx, e, v, nv, part, cnt, last, av0, m, dt, &g0, &q0, &u0);
            gg_slot_ps(dy, x, ggx, e + step, v + 1, nv, part, cnt, last, av1, m, dt, &g1, &q1, &u1);
            s[k][0] = vf_add(g0, g1);
            s[k][1] = vf_fma(g1, u1, vf_mul(g0, u0));
            s[k][2] = vf_add(q0, q1);
            s[k][3] = vf_fma(q1, u1, vf_mul(q0, u0));
            s[k][4] = vf_fma(q1, g1, vf_mul(q0, g0));
        }
        for (int i = 0; i < 5; i++) h[b][i] = vf_add(s[0][i], s[1][i]);
    }
    vf t[5];
    for (int i = 0; i < 5; i++) t[i] = vf_add(h[0][i], h[1][i]);
    const vd llo = vf_lo_pd(l), lhi = vf_hi_pd(l);
    const vd glo = vf_lo_pd(t[0]), ghi = vf_hi_pd(t[0]), qlo = vf_lo_pd(t[2]), qhi = vf_hi_pd(t[2]);
    lo->g = glo;
    hi->g = ghi;
    lo->gd = vd_fnma(llo, glo, vf_lo_pd(t[1]));
    hi->gd = vd_fnma(lhi, ghi, vf_hi_pd(t[1]));
    lo->q = qlo;
    hi->q = qhi;
    lo->qd = vd_fnma(llo, qlo, vf_lo_pd(t[3]));
    hi->qd = vd_fnma(lhi, qhi, vf_hi_pd(t[3]));
    lo->qg = vf_lo_pd(t[4]);
    hi->qg = vf_hi_pd(t[4]);
}

INLINE void gg_step_pd(acc5 *a, vd g, vd q, vd d)
{
    a->g = vd_add(a->g, g);
    a->gd = vd_fma(g, d, a->gd);
    a->q = vd_add(a->q, q);
    a->qd = vd_fma(q, d, a->qd);
    a->qg = vd_fma(q, g, a->qg);
}

/* The five sums of one vector (part: its first cnt elements) in double,
 * d = (x - mhi) - mlo as bn_scalar.c forms it: the rows left after the
 * blocks of 8. */
INLINE void gg_step_ps(const void *dy, const void *x, const void *ggx, int64_t e, int part, int64_t cnt,
                       int64_t avail, vf m, vf l, int dt, acc5 *lo, acc5 *hi)
{
    vf g, q, u;
    gg_load_ps(dy, x, ggx, e, part, cnt, avail, m, dt, &g, &q, &u);
    vf d = vf_sub(u, part ? vf_keep(l, vf_mask_first(cnt)) : l);
    gg_step_pd(lo, vf_lo_pd(g), vf_lo_pd(q), vf_lo_pd(d));
    gg_step_pd(hi, vf_hi_pd(g), vf_hi_pd(q), vf_hi_pd(d));
}

/* n elements whose lane l of every VF_LANES has the parameters of lane l of
 * m, l (a run: broadcast), in blocks of 8 vectors */
INLINE void ggstats_flat_ps(const void *dy, const void *x, const void *ggx, int64_t n, vf m, vf l, int dt,
                            acc5 *lo, acc5 *hi)
{
    acc5 a = acc5_zero(), b = acc5_zero(), c, d;
    int64_t i = 0;
    for (; i + GG_BLOCK * VF_LANES <= n; i += GG_BLOCK * VF_LANES) {
        /* prefetch_ahead_of's rate: once per 16 elements */
        for (int64_t e = i; e < i + GG_BLOCK * VF_LANES; e += 16) {
            prefetch_ahead_of(dy, e, dt);
            prefetch_ahead_of(x, e, dt);
            prefetch_ahead_of(ggx, e, dt);
        }
        gg_block_ps(dy, x, ggx, i, VF_LANES, n, 0, VF_LANES, GG_BLOCK, VF_LANES, m, l, dt, &c, &d);
        a = acc5_add(a, c);
        b = acc5_add(b, d);
    }
    /* The rest (up to 8 VF_LANES - 1 elements, a 7x7 plane) as one more
     * block of its nv vectors, nv a constant in each case so that the
     * missing vectors cost no loads: 49 elements took 27 ns a vector at a
     * time in double, 19 ns so (AVX2). */
    const int64_t nv = (n - i + VF_LANES - 1) / VF_LANES, last = n - i - VF_LANES * (nv - 1);
    c = d = acc5_zero();
    switch (nv) {
    case 1: gg_block_ps(dy, x, ggx, i, VF_LANES, n, 0, VF_LANES, 1, last, m, l, dt, &c, &d); break;
    case 2: gg_block_ps(dy, x, ggx, i, VF_LANES, n, 0, VF_LANES, 2, last, m, l, dt, &c, &d); break;
    case 3: gg_block_ps(dy, x, ggx, i, VF_LANES, n, 0, VF_LANES, 3, last, m, l, dt, &c, &d); break;
    case 4: gg_block_ps(dy, x, ggx, i, VF_LANES, n, 0, VF_LANES, 4, last, m, l, dt, &c, &d); break;
    case 5: gg_block_ps(dy, x, ggx, i, VF_LANES, n, 0, VF_LANES, 5, last, m, l, dt, &c, &d); break;
    case 6: gg_block_ps(dy, x, ggx, i, VF_LANES, n, 0, VF_LANES, 6, last, m, l, dt, &c, &d); break;
    case 7: gg_block_ps(dy, x, ggx, i, VF_LANES, n, 0, VF_LANES, 7, last, m, l, dt, &c, &d); break;
    case 8: gg_block_ps(dy, x, ggx, i, VF_LANES, n, 0, VF_LANES, 8, last, m, l, dt, &c, &d); break;
    default: break;
    }
    *lo = acc5_add(a, c);
    *hi = acc5_add(b, d);
}

/* columns [j, j + cnt) (cnt 1..VF_LANES) of kr rows from element o of n,
 * added to acc: 8 rows as a block, fewer a row at a time in double */
INLINE void ggstats_cols_ps(const void *dy, const void *x, const void *ggx, int64_t n, int64_t o, int64_t j,
                            int64_t w, int64_t kr, int64_t cnt, vf m, vf l, double *acc, int dt)
{
    acc5 lo = acc5_zero(), hi = acc5_zero();
    if (kr == GG_BLOCK) {
        gg_block_ps(dy, x, ggx, o + j, w, n, cnt < VF_LANES, cnt, GG_BLOCK, cnt, m, l, dt, &lo, &hi);
    } else {
        for (int64_t k = 0; k < kr; k++) {
            const int64_t e = o + k * w + j;
            gg_step_ps(dy, x, ggx, e, cnt < VF_LANES, cnt, n - e, m, l, dt, &lo, &hi);
        }
    }
    acc5_add_cols(&lo, acc + j, w, cnt);
    if (cnt > VD_LANES) acc5_add_cols(&hi, acc + j + VD_LANES, w, cnt - VD_LANES);
}

/* A channel of one element has d = 0, and its exact sums give
 * scale_backprop = r (sum q g - sum q sum g) = 0 (bn_math.h's
 * cfbn_grad_grad_params).  The scalar table's sums, products of floats
 * formed in double, are exact and cancel to 0; a float block would round
 * q g to float and leave about 1e-7 of it (float32: the products of
 * float16 and bfloat16 values are exact in float).  So a run of one
 * element, and a rows call of one row (one element of each column; it
 * takes the rows loop, a vector at a time), form their products in double
 * by gg_step_ps. */
INLINE void ggstats_run_ps(const void *dy, const void *x, const void *ggx, int64_t n, const cfbn_gg_f32 *p,
                           double *acc, int dt)
{
    if (n == 1) {
        acc5 lo = acc5_zero(), hi = acc5_zero();
        gg_step_ps(dy, x, ggx, 0, 1, 1, 1, vf_set1(p->mhi[0]), vf_set1(p->mlo[0]), dt, &lo, &hi);
        acc5_total(acc5_add(lo, hi), acc);
        return;
    }
    acc5 lo, hi;
    ggstats_flat_ps(dy, x, ggx, n, vf_set1(p->mhi[0]), vf_set1(p->mlo[0]), dt, &lo, &hi);
    acc5_total(acc5_add(lo, hi), acc);
    ggstats_redo_ps(dy, x, ggx, n, 1, p, acc, dt);
}

INLINE void ggstats_rows_ps(const void *dy, const void *x, const void *ggx, int64_t rows, int64_t w,
                            const cfbn_gg_f32 *p, double *acc, int dt)
{
    if (w <= 0) return;
    /* one row: the rows loop, exact for a channel of one element (above) */
    if (VF_LANES % w == 0 && rows > 1) {
        vf m, l, odd;
        double lanes[5 * VF_LANES];
        lanes_ps(p->mhi, w, &m, &odd);
        lanes_ps(p->mlo, w, &l, &odd);
        acc5 lo, hi;
        ggstats_flat_ps(dy, x, ggx, rows * w, m, l, dt, &lo, &hi);
        acc5_store(&lo, lanes, VF_LANES);
        acc5_store(&hi, lanes + VD_LANES, VF_LANES);
        fold_lanes5(lanes, VF_LANES, w, acc);
        ggstats_redo_ps(dy, x, ggx, rows, w, p, acc, dt);
        return;
    }
    const int64_t full = w - w % VF_LANES, cnt = w - full, n = rows * w;
    const size_t es = dt ? 2 : 4;
    const float *const v[2] = {p->mhi, p->mlo};
    vf t[2];
    tail_params_ps(v, 2, full, cnt, t);
    memset(acc, 0, (size_t)(5 * w) * sizeof *acc);
    int64_t r = 0;
    for (; r + GG_BLOCK <= rows; r += GG_BLOCK) {
        const int64_t o = r * w;
        for (int64_t j = 0; j < full; j += VF_LANES) {
            prefetch_group_l2(dy, o, j, es);
            prefetch_group_l2(x, o, j, es);
            prefetch_group_l2(ggx, o, j, es);
            ggstats_cols_ps(dy, x, ggx, n, o, j, w, GG_BLOCK, VF_LANES, vf_load(p->mhi + j),
                            vf_load(p->mlo + j), acc, dt);
        }
        if (cnt) ggstats_cols_ps(dy, x, ggx, n, o, full, w, GG_BLOCK, cnt, t[0], t[1], acc, dt);
    }
    if (r < rows) {
        const int64_t o = r * w;
        for (int64_t j = 0; j < full; j += VF_LANES)
            ggstats_cols_ps(dy, x, ggx, n, o, j, w, rows - r, VF_LANES, vf_load(p->mhi + j),
                            vf_load(p->mlo + j), acc, dt);
        if (cnt) ggstats_cols_ps(dy, x, ggx, n, o, full, w, rows - r, cnt, t[0], t[1], acc, dt);
    }
    if (rows >= GG_BLOCK) ggstats_redo_ps(dy, x, ggx, rows, w, p, acc, dt);
}

/* Several runs of one channel (runs, stride) in one call.  Short runs (7x7
 * planes) go 8 at a time, the 8 runs' vectors at each position summed as
 * the 8 vectors of a block (8 rows of the rows kernel); longer runs, the
 * runs left over, and strides of a multiple of 4 KB (gstats_runs_ps) one
 * after another.  The blocks' sums stay in double vectors across runs and
 * are tested once, on the totals, as one run of all the elements would be;
 * a channel that needs double is summed again run by run as the scalar
 * table's runs are. */
INLINE void ggstats_runs_ps(const void *dy, const void *x, const void *ggx, int64_t n, const cfbn_gg_f32 *p,
                            double *acc, int dt)
{
    const vf m = vf_set1(p->mhi[0]), l = vf_set1(p->mlo[0]);
    const int64_t st = p->stride, es = dt ? 2 : 4;
    acc5 a = acc5_zero(), lo, hi;
    int64_t k = 0;
    if (n <= SHORT_RUN && (st * es) % 4096 != 0) {
        const int64_t full = n - n % VF_LANES, cnt = n - full;
        for (; k + GG_BLOCK <= p->runs; k += GG_BLOCK) {
            for (int64_t i = 0; i < full; i += VF_LANES) {
                gg_block_ps(dy, x, ggx, k * st + i, st, 0, 0, VF_LANES, GG_BLOCK, VF_LANES, m, l, dt, &lo, &hi);
                a = acc5_add(a, acc5_add(lo, hi));
            }
            if (cnt) {
                gg_block_ps(dy, x, ggx, k * st + full, st, -1, 1, cnt, GG_BLOCK, cnt, m, l, dt, &lo, &hi);
                a = acc5_add(a, acc5_add(lo, hi));
            }
        }
    }
    for (; k < p->runs; k++) {
        const char *g = elem_at(dy, k * st, dt), *u = elem_at(x, k * st, dt), *q = elem_at(ggx, k * st, dt);
        prefetch_next_run(g, n * es);
        prefetch_next_run(u, n * es);
        prefetch_next_run(q, n * es);
        ggstats_flat_ps(g, u, q, n, m, l, dt, &lo, &hi);
        a = acc5_add(a, acc5_add(lo, hi));
    }
    acc5_total(a, acc);
    const double count = (double)n * (double)p->runs;
    if (gg_suspect(acc, 1, count * TINY_SUM) && gg_needs_double(acc, 1, count, p->mhi[0], p->mlo[0])) {
        double sum[5] = {0.0, 0.0, 0.0, 0.0, 0.0}, part[5];
        for (k = 0; k < p->runs; k++) {
            ggstats_column_pd(elem_at(dy, k * st, dt), elem_at(x, k * st, dt), elem_at(ggx, k * st, dt), n, 1, 0,
                              p->mhi[0], p->mlo[0], part, dt);
            for (int j = 0; j < 5; j++) sum[j] += part[j];
        }
        for (int j = 0; j < 5; j++) acc[j] = sum[j];
    }
}

/* the nine parameter arrays, in ggapply_ps's order */
#define GG_NPAR 9
INLINE void gg_arrays_ps(const cfbn_gg_f32 *p, const float **v)
{
    v[0] = p->mhi, v[1] = p->mlo, v[2] = p->a1, v[3] = p->b1, v[4] = p->c1;
    v[5] = p->a2, v[6] = p->b2, v[7] = p->c2, v[8] = p->e2;
}

/* c: mhi, mlo, a1, b1, c1, a2, b2, c2, e2 */
INLINE void ggapply_ps(vf g, vf q, vf x, const vf *c, vf *ddy, vf *dx)
{
    vf d = centered_ps(x, c[0], c[1]);
    *ddy = vf_fma(q, c[2], vf_fma(d, c[3], c[4]));
    *dx = vf_fma(g, c[5], vf_fma(q, c[6], vf_fma(d, c[7], c[8])));
}

/* Non-temporal stores for the two outputs: asked for, float32 storage, and
 * both outputs (and rows of row_bytes) 16-byte aligned.  Measured on
 * (32,56,56,64) and (32,64,56,56), one thread: float32 7.1 against 8.5 ms
 * (NHWC) and 5.9 against 7.0 (NCHW) for the whole second-order gradient.
 * The 2-byte types keep regular stores: a 16-byte store holds 8 of their
 * elements, and with NumPy's 16-byte aligned outputs streaming made the
 * bfloat16 pass slower (NHWC 6.9 against 5.1 ms; the apply kernel alone,
 * rows 7.8 against 4.2), and with line-aligned outputs no faster. */
INLINE int gg_nt(int stream, int dt, const void *ddy, const void *dx, size_t row_bytes)
{
    return stream && dt == CFBN_F32 && (((uintptr_t)ddy | (uintptr_t)dx | row_bytes) & 15) == 0;
}

/* The 2 VF_LANES elements from e, parameters c0 for the first VF_LANES and
 * c1 for the next: all six inputs loaded, then each output's two vectors
 * stored back to back (on AVX2 64 bytes of float32, a line), so that a
 * non-temporal line fills without waiting on the other output's.  On
 * (32,56,56,64) float32 with NumPy's outputs (16 but not 64-byte aligned),
 * the whole second-order gradient took 8.4 ms so, 11.2 ms storing one
 * vector of each output in turn. */
INLINE void ggapply_pair_ps(const void *dy, const void *x, const void *ggx, void *ddy, void *dx, int64_t e,
                            const vf *c0, const vf *c1, int dt, int nt)
{
    vf y0, x0, y1, x1;
    ggapply_ps(vf_ld(dy, e, dt), vf_ld(ggx, e, dt), vf_ld(x, e, dt), c0, &y0, &x0);
    ggapply_ps(vf_ld(dy, e + VF_LANES, dt), vf_ld(ggx, e + VF_LANES, dt), vf_ld(x, e + VF_LANES, dt), c1, &y1,
               &x1);
    st_out(ddy, e, y0, dt, nt);
    st_out(ddy, e + VF_LANES, y1, dt, nt);
    st_out(dx, e, x0, dt, nt);
    st_out(dx, e + VF_LANES, x1, dt, nt);
}

/* n elements whose lane l of every VF_LANES has the parameters of lane l
 * of c; nt: whole vectors by non-temporal stores (both outputs 16-byte
 * aligned) */
INLINE void ggapply_flat_ps(const void *dy, const void *x, const void *ggx, void *ddy, void *dx, int64_t n,
                            const vf *c, int dt, int nt)
{
    int64_t i = 0;
    for (; i + 2 * VF_LANES <= n; i += 2 * VF_LANES) ggapply_pair_ps(dy, x, ggx, ddy, dx, i, c, c, dt, nt);
    if (i + VF_LANES <= n) {
        vf vy, vx;
        ggapply_ps(vf_ld(dy, i, dt), vf_ld(ggx, i, dt), vf_ld(x, i, dt), c, &vy, &vx);
        st_out(ddy, i, vy, dt, nt);
        st_out(dx, i, vx, dt, nt);
        i += VF_LANES;
    }
    if (i < n) {
        const int64_t cnt = n - i;
        vf vy, vx;
        ggapply_ps(vf_ld_part(dy, i, cnt, cnt, dt), vf_ld_part(ggx, i, cnt, cnt, dt), vf_ld_part(x, i, cnt, cnt, dt), c,
                   &vy, &vx);
        vf_st_part(ddy, i, vy, cnt, dt);
        vf_st_part(dx, i, vx, cnt, dt);
    }
}

/* The per-channel parameters of a channel's run(s), each in every lane. */
INLINE void gg_broadcast_ps(const cfbn_gg_f32 *p, vf c[GG_NPAR])
{
    const float *v[GG_NPAR];
    gg_arrays_ps(p, v);
    for (int k = 0; k < GG_NPAR; k++) c[k] = vf_set1(v[k][0]);
}

INLINE void ggapply_run_ps(const void *dy, const void *x, const void *ggx, void *ddy, void *dx, int64_t n,
                           const cfbn_gg_f32 *p, int dt)
{
    vf c[GG_NPAR];
    gg_broadcast_ps(p, c);
    /* streaming as gg_nt has it, where both outputs reach 16-byte alignment
     * at the same element; those before it are stored regularly.  On a
     * 64 MB float32 run: 14.1 ms with regular stores, 10.0 with
     * non-temporal ones. */
    const int nt = p->stream && dt == CFBN_F32 && (((uintptr_t)ddy ^ (uintptr_t)dx) & 15) == 0;
    int64_t i = 0;
    if (nt) {
        i = peel_nt(ddy, n, dt);
        ggapply_flat_ps(dy, x, ggx, ddy, dx, i, c, dt, 0);
    }
    ggapply_flat_ps(elem_at(dy, i, dt), elem_at(x, i, dt), elem_at(ggx, i, dt), (void *)elem_at(ddy, i, dt),
                    (void *)elem_at(dx, i, dt), n - i, c, dt, nt);
    if (nt) stream_fence();
}

/* Several runs of one channel, regular stores: the parameters broadcast
 * once, each run prefetching the next's inputs, and its outputs' lines with
 * intent to write (as gapply_runs_ps). */
INLINE void ggapply_runs_ps(const void *dy, const void *x, const void *ggx, void *ddy, void *dx, int64_t n,
                            const cfbn_gg_f32 *p, int dt)
{
    vf c[GG_NPAR];
    gg_broadcast_ps(p, c);
    const int64_t st = p->stride, es = dt ? 2 : 4;
    for (int64_t k = 0; k < p->runs; k++) {
        const char *g = elem_at(dy, k * st, dt), *u = elem_at(x, k * st, dt), *q = elem_at(ggx, k * st, dt);
        prefetch_next_run(g, n * es);
        prefetch_next_run(u, n * es);
        prefetch_next_run(q, n * es);
        if (k + 1 < p->runs) {
            prefetch_run_out(elem_at(ddy, (k + 1) * st, dt), n * es);
            prefetch_run_out(elem_at(dx, (k + 1) * st, dt), n * es);
        }
        ggapply_flat_ps(g, u, q, (void *)elem_at(ddy, k * st, dt), (void *)elem_at(dx, k * st, dt), n, c, dt, 0);
    }
}

INLINE void ggapply_rows_ps(const void *dy, const void *x, const void *ggx, void *ddy, void *dx, int64_t rows,
                            int64_t w, const cfbn_gg_f32 *p, int dt)
{
    if (w <= 0) return;
    const float *v[GG_NPAR];
    vf c[GG_NPAR];
    gg_arrays_ps(p, v);
    if (VF_LANES % w == 0) {
        const int nt = gg_nt(p->stream, dt, ddy, dx, 0);
        vf odd;
        for (int k = 0; k < GG_NPAR; k++) lanes_ps(v[k], w, &c[k], &odd);
        ggapply_flat_ps(dy, x, ggx, ddy, dx, rows * w, c, dt, nt);
        if (nt) stream_fence();
        return;
    }
    const int nt = gg_nt(p->stream, dt, ddy, dx, (size_t)w * (dt ? 2 : 4));
    const int64_t full = w - w % VF_LANES, cnt = w - full, n = rows * w;
    vf t[GG_NPAR];
    tail_params_ps(v, GG_NPAR, full, cnt, t);
    /* two rows for each load of a group's parameter vectors: a row at a
     * time, those loads bound the loop in cache (12 loads for 2 stores;
     * 64 rows of 64 floats in L1: 1.38 us, two rows at a time 0.99) */
    for (int64_t r = 0; r < rows; r += 2) {
        const int64_t kr = rows - r < 2 ? rows - r : 2;
        int64_t j = 0;
        for (; j + 2 * VF_LANES <= full; j += 2 * VF_LANES) {
            vf c1[GG_NPAR];
            col_params_ps(v, GG_NPAR, j, c);
            col_params_ps(v, GG_NPAR, j + VF_LANES, c1);
            for (int64_t k = 0; k < kr; k++) ggapply_pair_ps(dy, x, ggx, ddy, dx, (r + k) * w + j, c, c1, dt, nt);
        }
        if (j < full) {
            col_params_ps(v, GG_NPAR, j, c);
            for (int64_t k = 0; k < kr; k++) {
                const int64_t e = (r + k) * w + j;
                vf vy, vx;
                ggapply_ps(vf_ld(dy, e, dt), vf_ld(ggx, e, dt), vf_ld(x, e, dt), c, &vy, &vx);
                st_out(ddy, e, vy, dt, nt);
                st_out(dx, e, vx, dt, nt);
            }
        }
        for (int64_t k = 0; k < kr && cnt; k++) {
            const int64_t e = (r + k) * w + full, av = n - e;
            vf vy, vx;
            ggapply_ps(vf_ld_part(dy, e, cnt, av, dt), vf_ld_part(ggx, e, cnt, av, dt),
                       vf_ld_part(x, e, cnt, av, dt), t, &vy, &vx);
            vf_st_part(ddy, e, vy, cnt, dt);
            vf_st_part(dx, e, vx, cnt, dt);
        }
    }
    if (nt) stream_fence();
}

/* ---- second-order gradient, float64 (cfbn_gg_f64) ----
 * In double throughout (d = (x - mhi) - mlo, the products and the five
 * sums): nothing to convert and no range to leave, so every element is one
 * step of gg_step_pd.  Rows go as the float kernels walk them, blocks of 8
 * rows with the sums of a group of 2 VD_LANES columns in registers; widths
 * dividing VD_LANES go as one flat stream with per-lane parameters. */

/* cnt elements at p (cnt >= VD_LANES: a whole vector), zero past them */
INLINE vd ld_cols_pd(const double *p, int64_t cnt)
{
    return cnt >= VD_LANES ? vd_load(p) : vd_load_part(p, vd_mask_first(cnt));
}

INLINE void st_cols_pd(double *p, vd v, int64_t cnt)
{
    if (cnt >= VD_LANES) vd_store(p, v);
    else vd_store_part(p, vd_mask_first(cnt), v);
}

INLINE void gg_arrays_pd(const cfbn_gg_f64 *p, const double **v)
{
    v[0] = p->mhi, v[1] = p->mlo, v[2] = p->a1, v[3] = p->b1, v[4] = p->c1;
    v[5] = p->a2, v[6] = p->b2, v[7] = p->c2, v[8] = p->e2;
}

/* c: mhi, mlo, a1, b1, c1, a2, b2, c2, e2 */
INLINE void ggapply_pd(vd g, vd q, vd x, const vd *c, vd *ddy, vd *dx)
{
    vd d = centered_pd(x, c[0], c[1]);
    *ddy = vd_fma(q, c[2], vd_fma(d, c[3], c[4]));
    *dx = vd_fma(g, c[5], vd_fma(q, c[6], vd_fma(d, c[7], c[8])));
}

/* n elements whose lane l of every VD_LANES has the parameters of lane l of
 * m, l (a run: broadcast) */
INLINE void ggstats_flat_pd(const double *dy, const double *x, const double *ggx, int64_t n, vd m, vd l,
                            acc5 *out)
{
    acc5 a = acc5_zero(), b = acc5_zero();
    int64_t i = 0;
    for (; i + 2 * VD_LANES <= n; i += 2 * VD_LANES) {
        gg_step_pd(&a, vd_load(dy + i), vd_load(ggx + i), centered_pd(vd_load(x + i), m, l));
        gg_step_pd(&b, vd_load(dy + i + VD_LANES), vd_load(ggx + i + VD_LANES),
                   centered_pd(vd_load(x + i + VD_LANES), m, l));
    }
    for (; i < n; i += VD_LANES) {
        /* dead lanes: dy = ggx = 0 and d = 0 */
        const vd_mask mk = vd_mask_first(n - i);
        gg_step_pd(&a, vd_load_part(dy + i, mk), vd_load_part(ggx + i, mk),
                   centered_pd(vd_load_part(x + i, mk), vd_keep(m, mk), vd_keep(l, mk)));
    }
    *out = acc5_add(a, b);
}

/* columns [j, j + cnt) (cnt 1..2 VD_LANES) of kr rows from element o,
 * added to acc */
INLINE void ggstats_cols_pd(const double *dy, const double *x, const double *ggx, int64_t o, int64_t j, int64_t w,
                            int64_t kr, int64_t cnt, const cfbn_gg_f64 *p, double *acc)
{
    const vd m0 = ld_cols_pd(p->mhi + j, cnt), l0 = ld_cols_pd(p->mlo + j, cnt);
    const vd m1 = ld_cols_pd(p->mhi + j + VD_LANES, cnt - VD_LANES);
    const vd l1 = ld_cols_pd(p->mlo + j + VD_LANES, cnt - VD_LANES);
    acc5 lo = acc5_zero(), hi = acc5_zero();
    for (int64_t k = 0; k < kr; k++) {
        const int64_t e = o + k * w + j;
        gg_step_pd(&lo, ld_cols_pd(dy + e, cnt), ld_cols_pd(ggx + e, cnt), centered_pd(ld_cols_pd(x + e, cnt), m0, l0));
        if (cnt > VD_LANES)
            gg_step_pd(&hi, ld_cols_pd(dy + e + VD_LANES, cnt - VD_LANES),
                       ld_cols_pd(ggx + e + VD_LANES, cnt - VD_LANES),
                       centered_pd(ld_cols_pd(x + e + VD_LANES, cnt - VD_LANES), m1, l1));
    }
    acc5_add_cols(&lo, acc + j, w, cnt);
    if (cnt > VD_LANES) acc5_add_cols(&hi, acc + j + VD_LANES, w, cnt - VD_LANES);
}

static void ggstats_run_f64(const void *dy, const void *x, const void *ggx, int64_t n, const cfbn_gg_f64 *p,
                            double *acc)
{
    acc5 a;
    ggstats_flat_pd(dy, x, ggx, n, vd_set1(p->mhi[0]), vd_set1(p->mlo[0]), &a);
    acc5_total(a, acc);
}

static void ggstats_rows_f64(const void *dy_, const void *x_, const void *ggx_, int64_t rows, int64_t w,
                             const cfbn_gg_f64 *p, double *acc)
{
    const double *dy = dy_, *x = x_, *ggx = ggx_;
    if (w <= 0) return;
    if (VD_LANES % w == 0) {
        vd m, l, odd;
        double lanes[5 * VD_LANES];
        lanes_pd(p->mhi, w, &m, &odd);
        lanes_pd(p->mlo, w, &l, &odd);
        acc5 a;
        ggstats_flat_pd(dy, x, ggx, rows * w, m, l, &a);
        acc5_store(&a, lanes, VD_LANES);
        fold_lanes5(lanes, VD_LANES, w, acc);
        return;
    }
    memset(acc, 0, (size_t)(5 * w) * sizeof *acc);
    for (int64_t r = 0; r < rows; r += GG_BLOCK) {
        const int64_t kr = rows - r < GG_BLOCK ? rows - r : GG_BLOCK, o = r * w;
        for (int64_t j = 0; j < w; j += 2 * VD_LANES) {
            if (kr == GG_BLOCK && j + 2 * VD_LANES <= w) {
                prefetch_group_l2(dy, o, j, sizeof(double));
                prefetch_group_l2(x, o, j, sizeof(double));
                prefetch_group_l2(ggx, o, j, sizeof(double));
                ggstats_cols_pd(dy, x, ggx, o, j, w, GG_BLOCK, 2 * VD_LANES, p, acc);
            } else {
                ggstats_cols_pd(dy, x, ggx, o, j, w, kr, w - j < 2 * VD_LANES ? w - j : 2 * VD_LANES, p, acc);
            }
        }
    }
}

/* n elements whose lane l of every VD_LANES has the parameters of lane l
 * of c */
INLINE void ggapply_flat_pd(const double *dy, const double *x, const double *ggx, double *ddy, double *dx, int64_t n,
                            const vd *c)
{
    for (int64_t i = 0; i < n; i += VD_LANES) {
        const int64_t k = n - i;
        vd vy, vx;
        ggapply_pd(ld_cols_pd(dy + i, k), ld_cols_pd(ggx + i, k), ld_cols_pd(x + i, k), c, &vy, &vx);
        st_cols_pd(ddy + i, vy, k);
        st_cols_pd(dx + i, vx, k);
    }
}

static void ggapply_run_f64(const void *dy, const void *x, const void *ggx, void *ddy, void *dx, int64_t n,
                            const cfbn_gg_f64 *p)
{
    const double *v[GG_NPAR];
    vd c[GG_NPAR];
    gg_arrays_pd(p, v);
    for (int k = 0; k < GG_NPAR; k++) c[k] = vd_set1(v[k][0]);
    ggapply_flat_pd(dy, x, ggx, ddy, dx, n, c);
}

static void ggapply_rows_f64(const void *dy_, const void *x_, const void *ggx_, void *ddy_, void *dx_, int64_t rows,
                             int64_t w, const cfbn_gg_f64 *p)
{
    const double *dy = dy_, *x = x_, *ggx = ggx_;
    double *ddy = ddy_, *dx = dx_;
    if (w <= 0) return;
    const double *v[GG_NPAR];
    vd c[GG_NPAR], t[GG_NPAR], odd;
    gg_arrays_pd(p, v);
    if (VD_LANES % w == 0) {
        for (int k = 0; k < GG_NPAR; k++) lanes_pd(v[k], w, &c[k], &odd);
        ggapply_flat_pd(dy, x, ggx, ddy, dx, rows * w, c);
        return;
    }
    const int64_t full = w - w % VD_LANES, cnt = w - full;
    for (int k = 0; k < GG_NPAR; k++) t[k] = ld_cols_pd(v[k] + full, cnt);
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = r * w;
        vd vy, vx;
        for (int64_t j = 0; j < full; j += VD_LANES) {
            for (int k = 0; k < GG_NPAR; k++) c[k] = vd_load(v[k] + j);
            ggapply_pd(vd_load(dy + o + j), vd_load(ggx + o + j), vd_load(x + o + j), c, &vy,
                       &vx);
            vd_store(ddy + o + j, vy);
            vd_store(dx + o + j, vx);
        }
        if (cnt) {
            const int64_t e = o + full;
            ggapply_pd(ld_cols_pd(dy + e, cnt), ld_cols_pd(ggx + e, cnt), ld_cols_pd(x + e, cnt), t, &vy, &vx);
            st_cols_pd(ddy + e, vy, cnt);
            st_cols_pd(dx + e, vx, cnt);
        }
    }
}
