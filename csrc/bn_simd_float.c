/* The float-compute plain and streaming loops (float32, float16 and
 * bfloat16 storage, computed in float), written once for every ISA over the
 * primitives of the ISA's header (vf, VF_LANES, vf_ld, vf_st_nt, ...), as
 * bn_simd_f64.c's float64 loops are; part of bn_simd.c, which includes it.
 * Nothing here names an instruction set; the loop names exist once and are
 * static in each ISA's translation unit.  For AVX2 these are the same
 * operations in the same order as the loops they replaced, so the outputs
 * kept their bits.
 *
 * Rows kernels whose width divides the vector period (2 VF_LANES floats)
 * run as one flat stream with per-lane parameters, because then every lane
 * always sees the same column; widths of a multiple of VF_LANES sum blocks
 * of 8 rows in float; other widths go row by row with a masked tail.  The
 * shared helpers (accf, stats_step, centered_ps, tree8, needs_double, ...)
 * are the fused and second-order loops' too. */
#ifndef VF_LANES
#error "bn_simd_float.c is included by bn_simd.c, after an ISA's vec_<isa>.h"
#endif

/* Double sums for VF_LANES float lanes (two vd: lanes [0, VD_LANES) in lo,
 * the rest in hi): s1 = sum d or sum dy, s2 = sum d^2 or sum dy*d. */
typedef struct {
    vd s1lo, s1hi, s2lo, s2hi;
} accf;

INLINE accf accf_zero(void)
{
    accf a = {vd_zero(), vd_zero(), vd_zero(), vd_zero()};
    return a;
}

INLINE accf accf_load(const double *s1, const double *s2)
{
    accf a = {vd_load(s1), vd_load(s1 + VD_LANES), vd_load(s2), vd_load(s2 + VD_LANES)};
    return a;
}

INLINE void accf_store(const accf *a, double *s1, double *s2)
{
    vd_store(s1, a->s1lo);
    vd_store(s1 + VD_LANES, a->s1hi);
    vd_store(s2, a->s2lo);
    vd_store(s2 + VD_LANES, a->s2hi);
}

/* The sums of a flat stream of w columns (w divides 2 VF_LANES: a from the
 * even blocks, b from the odd ones) per column: s1 to acc[0, w), s2 to
 * acc[w, 2 w). */
INLINE void fold_accf(const accf *a, const accf *b, int64_t w, double *acc)
{
    double s1[2 * VF_LANES], s2[2 * VF_LANES];
    accf_store(a, s1, s2);
    accf_store(b, s1 + VF_LANES, s2 + VF_LANES);
    fold_lanes(s1, 2 * VF_LANES, w, acc);
    fold_lanes(s2, 2 * VF_LANES, w, acc + w);
}

/* Stores lanes [0, cnt) of a into s1[], s2[]. */
INLINE void accf_store_part(const accf *a, double *s1, double *s2, int64_t cnt)
{
    vd_mask mlo = vd_mask_first(cnt);
    vd_store_part(s1, mlo, a->s1lo);
    vd_store_part(s2, mlo, a->s2lo);
    if (cnt > VD_LANES) {
        vd_mask mhi = vd_mask_first(cnt - VD_LANES);
        vd_store_part(s1 + VD_LANES, mhi, a->s1hi);
        vd_store_part(s2 + VD_LANES, mhi, a->s2hi);
    }
}

/* The shift is subtracted in double: x - shift is exact there for any float
 * x near the shift, which keeps sum d^2 free of cancellation. */
INLINE void stats_step(accf *a, vd xlo, vd xhi, vd shlo, vd shhi)
{
    vd dlo = vd_sub(xlo, shlo), dhi = vd_sub(xhi, shhi);
    a->s1lo = vd_add(a->s1lo, dlo);
    a->s1hi = vd_add(a->s1hi, dhi);
    a->s2lo = vd_fma(dlo, dlo, a->s2lo);
    a->s2hi = vd_fma(dhi, dhi, a->s2hi);
}

INLINE void gstats_step(accf *a, vf g, vf d)
{
    vd glo = vf_lo_pd(g), ghi = vf_hi_pd(g);
    a->s1lo = vd_add(a->s1lo, glo);
    a->s1hi = vd_add(a->s1hi, ghi);
    a->s2lo = vd_fma(glo, vf_lo_pd(d), a->s2lo);
    a->s2hi = vd_fma(ghi, vf_hi_pd(d), a->s2hi);
}

/* a - b as a fused multiply-add, a * 1 - b: the same single rounding, so the
 * same bits, but on the multiply-add units.  The sums' loops keep the add
 * units busy with their additions; a subtraction moved off them lets the
 * two kinds of unit share the work (measured on AVX2 Zen 4: rows and run
 * statistics, run apply). */
INLINE vf sub_ps(vf a, vf b)
{
    return vf_fms(a, vf_set1(1.0f), b);
}

/* Two subtractions in this order: x - mhi is exact when x is near the mean
 * (Sterbenz), so a mean much larger than the spread loses nothing. */
INLINE vf centered_ps(vf x, vf mhi, vf mlo)
{
    return sub_ps(sub_ps(x, mhi), mlo);
}

INLINE vf apply_ps(vf x, vf mhi, vf mlo, vf al, vf be)
{
    return vf_fma(centered_ps(x, mhi, mlo), al, be);
}

INLINE vf gapply_ps(vf g, vf x, vf mhi, vf mlo, vf a, vf b, vf c)
{
    return vf_fma(g, a, vf_fma(centered_ps(x, mhi, mlo), b, c));
}

/* Rows of bfloat16 whose width is a multiple of EO_GROUP (and at most
 * EO_MAX_W) go through vf_ld_eo and vf_st_eo too, with the per-column
 * parameters put in the order of its lanes once per call.  Each group of
 * EO_GROUP columns from j gets EO_GROUP k floats at out[j k ..]: for each
 * of the k arrays in turn, the values of the even lanes (columns j, j+2,
 * ..., j+EO_GROUP-2), then those of the odd lanes, so that a row's loop
 * walks one pointer through them. */
#define EO_GROUP (2 * VF_LANES)
#define EO_MAX_W 1024
INLINE int eo_rows(int dt, int64_t w)
{
    return dt == CFBN_BF16 && w % EO_GROUP == 0 && w > 0 && w <= EO_MAX_W;
}

static void eo_params(const float *const *v, int k, int64_t w, float *out)
{
    for (int64_t j = 0; j < w; j += EO_GROUP) {
        for (int a = 0; a < k; a++, out += EO_GROUP) {
            for (int l = 0; l < VF_LANES; l++) {
                out[l] = v[a][j + 2 * l];
                out[VF_LANES + l] = v[a][j + 2 * l + 1];
            }
        }
    }
}

/* 2-byte elements in a 64-byte cache line: the loops that prefetch ahead
 * do so once a line */
#define HALFWORDS_PER_LINE 32

/* prefetch_ahead_of once for each line of the 2-byte elements [i, i + cnt) */
INLINE void prefetch_lines_h(const void *p, int64_t i, int64_t cnt)
{
    for (int64_t l = 0; l < cnt; l += HALFWORDS_PER_LINE) prefetch_ahead_of(p, i + l, CFBN_BF16);
}

/* prefetch_ahead_of for every 64-byte line of the 2 VF_LANES elements from
 * i, the step of the loops that call it: one line for AVX2 and NEON (and
 * for 2-byte elements), two for AVX-512's float32, whose every second line
 * a prefetch per step left to the hardware prefetchers.  AVX-512 / AVX2
 * time, one thread, 8M float32 (benchmarks/isa_ab.sh): the fused relu
 * family's run sums 1.51-1.70 with one prefetch a step. */
INLINE void prefetch_step_ahead_of(const void *p, int64_t i, int dt)
{
    prefetch_ahead_of(p, i, dt);
    if (!dt && 2 * VF_LANES * 4 > 64) prefetch_ahead_of(p, i + 16, dt);
}

/* ---- pairwise sums of 8 vectors in float ---- */

INLINE vf tree8(vf a0, vf a1, vf a2, vf a3, vf a4, vf a5, vf a6, vf a7)
{
    return vf_add(vf_add(vf_add(a0, a1), vf_add(a2, a3)),
                         vf_add(vf_add(a4, a5), vf_add(a6, a7)));
}

/* sum of squares of 8 vectors, pairwise */
INLINE vf sq_tree8(vf d0, vf d1, vf d2, vf d3, vf d4, vf d5, vf d6, vf d7)
{
    vf q01 = vf_fma(d1, d1, vf_mul(d0, d0));
    vf q23 = vf_fma(d3, d3, vf_mul(d2, d2));
    vf q45 = vf_fma(d5, d5, vf_mul(d4, d4));
    vf q67 = vf_fma(d7, d7, vf_mul(d6, d6));
    return vf_add(vf_add(q01, q23), vf_add(q45, q67));
}

/* sum of products of 8 vector pairs, pairwise */
INLINE vf dot_tree8(const vf *g, const vf *d)
{
    vf p01 = vf_fma(g[1], d[1], vf_mul(g[0], d[0]));
    vf p23 = vf_fma(g[3], d[3], vf_mul(g[2], d[2]));
    vf p45 = vf_fma(g[5], d[5], vf_mul(g[4], d[4]));
    vf p67 = vf_fma(g[7], d[7], vf_mul(g[6], d[6]));
    return vf_add(vf_add(p01, p23), vf_add(p45, p67));
}

/* ---- float block sums that left float's range ----
 * Float has 8 exponent bits to double's 11.  A block sum, a square or a
 * product dy * (x - mhi) formed in float overflows where double does not:
 * one 2e19 among unit values squares to inf, while the variance (6e33 over
 * 65536 values) is a finite float.  Below 2^-126 a float product keeps only
 * part of its bits: gradual underflow loses up to 2^-150 per product.  So a
 * kernel that sums blocks in float checks each column's (or run's) two sums
 * once it is done, and sums that column again in double, as bn_scalar.c
 * does, when
 *   - a sum is not finite: a block overflowed, or the data hold a NaN or an
 *     infinity, which the double sums then propagate as the scalar table's;
 *   - the second sum is below count * TINY_SUM: only then can the losses to
 *     underflow, at most count * 2^-150, exceed 2^-54 of that sum.
 * A second sum of exactly 0 is kept where it is the common exact zero, so
 * that such columns stay on the fast path: when the first sum is 0 too (a
 * constant column of x; dy = 0), and, for the gradient, when the mean is 0
 * (a channel of zeros) or |sum dy| |mhi| >= count * TINY_SUM (x constant at
 * a nonzero mean, where whatever may have vanished is far below the
 * rounding of the terms dy * x).  (Missed: terms that all vanish while
 * their first sums cancel exactly, or around a gradient's mean of exactly
 * 0; a loss of at most count * 2^-150.)  Otherwise the check costs one pass
 * of vector compares over a piece's 2 w sums; the decision depends only on
 * the column's data and the shape, so results stay independent of the
 * thread count.
 * Non-finite data should not make a pass slow: a gradient with a mean that
 * is not finite (the statistics of a channel holding a NaN) keeps its float
 * second sum, which is then not finite in double either, and of the same
 * kind (NaN, or an infinity of the same sign); a column summed again stops
 * at its first NaN, after which its sums stay NaN. */
#define TINY_SUM 0x1p-96

/* What sums s1, s2 of count elements summed in float need: REDO_S1 and/or
 * REDO_S2, or 0.  For gradient sums m is |mhi| and mfin whether mhi and mlo
 * are finite; statistics pass m < 0 and mfin 1. */
enum { REDO_S1 = 1, REDO_S2 = 2 };
static int needs_double(double s1, double s2, double count, double m, int mfin)
{
    double tiny = count * TINY_SUM;
    int redo = fabs(s1) <= DBL_MAX ? 0 : REDO_S1;
    if (!mfin || (fabs(s2) >= tiny && fabs(s2) <= DBL_MAX)) return redo;
    if (s2 == 0.0 && (s1 == 0.0 || m == 0.0 || fabs(s1) * m >= tiny)) return redo;
    return redo | REDO_S2;
}

INLINE int finite_f(float v) { return fabsf(v) <= FLT_MAX; }

/* All-ones lanes where needs_double's quick tests fail: s1 or s2 not
 * finite, or |s2| < tiny (a superset of the lanes that need double).
 * s1 - s1 is 0, or NaN when s1 is not finite, which then fails the first
 * compare. */
INLINE vd suspect_pd(vd s1, vd s2, vd tiny)
{
    vd t = vd_add(vd_abs(s2), vd_sub(s1, s1));
    return vd_mask_bits(vd_mask_or(vd_nge(t, tiny), vd_gt(t, vd_set1(DBL_MAX))));
}

/* Whether any of w columns (a multiple of VD_LANES), with sums acc[j] and
 * acc[w + j] of count elements, fails the quick tests: one pass of vector
 * compares, after which only such columns are looked at one by one. */
INLINE int any_suspect(const double *acc, int64_t w, double count)
{
    vd tiny = vd_set1(count * TINY_SUM), bad = vd_zero();
    for (int64_t j = 0; j < w; j += VD_LANES)
        bad = vd_or(bad, suspect_pd(vd_load(acc + j), vd_load(acc + w + j), tiny));
    return vd_mask_any(vd_bits_mask(bad));
}

/* Column j of rows x w summed again in double, element by element as
 * bn_scalar.c sums it.  One column alone: the other columns, and so the
 * other channels, keep their bits when one channel holds a NaN.  A NaN d
 * makes both sums NaN for good, so the loop stops there. */
COLD void stats_column_pd(const void *x, int64_t rows, int64_t w, int64_t j, double shift, double *s1, double *s2,
                          int dt)
{
    double a = 0.0, b = 0.0;
    for (int64_t r = 0; r < rows && b == b; r++) {
        double d = (double)ld1(x, r * w + j, dt) - shift;
        a += d;
        b += d * d;
    }
    *s1 = a;
    *s2 = b;
}

/* The sums needs_double asked for (redo), of column j, again in double.
 * With a finite first sum every dy is finite, so a leading stretch of
 * x - mhi - mlo == 0 adds exactly 0 to the second sum and needs no dy: a
 * column of x constant at the mean costs one read of x. */
COLD void gstats_column_pd(const void *dy, const void *x, int64_t rows, int64_t w, int64_t j, float mhi, float mlo,
                           int redo, double *s1, double *s2, int dt)
{
    if (redo & REDO_S1) {
        double a = 0.0;
        for (int64_t r = 0; r < rows && a == a; r++) a += ld1(dy, r * w + j, dt);
        *s1 = a;
    }
    if (redo & REDO_S2) {
        int64_t r = 0;
        if (fabs(*s1) <= DBL_MAX)
            while (r < rows && (ld1(x, r * w + j, dt) - mhi) - mlo == 0.0f) r++;
        double b = 0.0;
        for (; r < rows && b == b; r++) {
            float d = (ld1(x, r * w + j, dt) - mhi) - mlo;
            b += (double)ld1(dy, r * w + j, dt) * (double)d;
        }
        *s2 = b;
    }
}

/* Each of w columns whose float gradient sums (acc[j], acc[w + j] over
 * rows) need double, as needs_double decides, summed again. */
INLINE void gstats_redo_columns(const void *dy, const void *x, int64_t rows, int64_t w, const cfbn_grad_f32 *p,
                                double *acc, int dt)
{
    for (int64_t j = 0; j < w; j++) {
        int redo = needs_double(acc[j], acc[w + j], (double)rows, fabs(p->mhi[j]),
                                finite_f(p->mhi[j]) && finite_f(p->mlo[j]));
        if (redo) gstats_column_pd(dy, x, rows, w, j, p->mhi[j], p->mlo[j], redo, acc + j, acc + w + j, dt);
    }
}

/* ---- float-compute flat streams: VF_LANES-element blocks with an even
 * index use the first parameter set, odd blocks the second ---- */

/* sh: shift lanes lo, hi of even blocks, then of odd blocks */
INLINE void stats_flat_ps(const void *x, int64_t n, const vd *sh, int dt, accf *ea, accf *oa)
{
    accf a = accf_zero(), b = accf_zero();
    int64_t i = 0;
    for (; i + 2 * VF_LANES <= n; i += 2 * VF_LANES) {
        prefetch_step_ahead_of(x, i, dt);
        stats_step(&a, vd_ld_widen(x, i, dt), vd_ld_widen(x, i + VD_LANES, dt), sh[0], sh[1]);
        stats_step(&b, vd_ld_widen(x, i + VF_LANES, dt), vd_ld_widen(x, i + VF_LANES + VD_LANES, dt), sh[2],
                   sh[3]);
    }
    int odd = 0;
    if (i + VF_LANES <= n) {
        stats_step(&a, vd_ld_widen(x, i, dt), vd_ld_widen(x, i + VD_LANES, dt), sh[0], sh[1]);
        i += VF_LANES;
        odd = 1;
    }
    if (i < n) {
        int64_t cnt = n - i;
        vf v = vf_ld_part(x, i, cnt, cnt, dt);
        vd_mask mlo = vd_mask_first(cnt), mhi = vd_mask_first(cnt - VD_LANES);
        /* dead lanes: x reads as 0 and the shift is masked to 0, so d = 0 */
        if (odd)
            stats_step(&b, vf_lo_pd(v), vf_hi_pd(v), vd_keep(sh[2], mlo), vd_keep(sh[3], mhi));
        else
            stats_step(&a, vf_lo_pd(v), vf_hi_pd(v), vd_keep(sh[0], mlo), vd_keep(sh[1], mhi));
    }
    *ea = a;
    *oa = b;
}

/* elements of one block of the float tree: 8 vectors of each of the two
 * parameter sets */
#define TREE_SPAN (16 * VF_LANES)

/* Adds the sums of 8 vectors (g[k], u[k]) to a: the vectors are summed
 * pairwise in float first, as the rows kernels do, and the result is
 * widened once.  u = x - mhi (exact near the mean); the mlo part of the mean
 * comes off in double, as sum g (x - mhi) - mlo sum g, which is more
 * accurate than subtracting it from every element and takes one float
 * subtraction less per element. */
INLINE void gstats_tree_add(accf *a, vf t1, vf t2, vf mlo)
{
    vd t1lo = vf_lo_pd(t1), t1hi = vf_hi_pd(t1);
    a->s1lo = vd_add(a->s1lo, t1lo);
    a->s1hi = vd_add(a->s1hi, t1hi);
    a->s2lo = vd_fnma(vf_lo_pd(mlo), t1lo, vd_add(a->s2lo, vf_lo_pd(t2)));
    a->s2hi = vd_fnma(vf_hi_pd(mlo), t1hi, vd_add(a->s2hi, vf_hi_pd(t2)));
}

INLINE void gstats_tree_step(accf *a, const vf *g, const vf *u, vf mlo)
{
    gstats_tree_add(a, tree8(g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]), dot_tree8(g, u), mlo);
}

/* tree8 and dot_tree8 of 8 pairs (g, u) given one at a time, k = 0 .. 7:
 * their operations in their order, with only the partial sums live (s[1],
 * p[1] hold the results after k = 7), not all 16 vectors, which a loop that
 * holds activation parameters in registers too would spill.  tree_start's
 * zeros are never read; they keep GCC from warning in rolled loops. */
typedef struct {
    vf g0, u0, s[2], p[2];
} tree_acc;

INLINE tree_acc tree_start(void)
{
    const vf z = vf_zero();
    return (tree_acc){z, z, {z, z}, {z, z}};
}

INLINE void tree_push(tree_acc *t, int k, vf g, vf u)
{
    if (!(k & 1)) {
        t->g0 = g, t->u0 = u;
        return;
    }
    vf s = vf_add(t->g0, g), p = vf_fma(g, u, vf_mul(t->g0, t->u0));
    if (k & 2) s = vf_add(t->s[0], s), p = vf_add(t->p[0], p);
    if (!(k & 2)) t->s[0] = s, t->p[0] = p;
    else if (!(k & 4)) t->s[1] = s, t->p[1] = p;
    else t->s[1] = vf_add(t->s[1], s), t->p[1] = vf_add(t->p[1], p);
}

/* m: mhi, mlo of even blocks, then of odd blocks.  tree: sum blocks of 8
 * vector pairs (TREE_SPAN elements) in float first (the fast way); 0 forms every product and sum in
 * double (for sums that left float's range, see needs_double). */
INLINE void gstats_flat_ps(const void *dy, const void *x, int64_t n, const vf *m, int dt, int tree,
                           accf *ea, accf *oa)
{
    accf a = accf_zero(), b = accf_zero();
    int64_t i = 0;
    for (; tree && i + TREE_SPAN <= n; i += TREE_SPAN) {
        vf g[8], d[8];
        for (int k = 0; k < 8; k++) {
            prefetch_step_ahead_of(dy, i + 2 * VF_LANES * k, dt);
            prefetch_step_ahead_of(x, i + 2 * VF_LANES * k, dt);
            g[k] = vf_ld(dy, i + 2 * VF_LANES * k, dt);
            d[k] = sub_ps(vf_ld(x, i + 2 * VF_LANES * k, dt), m[0]);
        }
        gstats_tree_step(&a, g, d, m[1]);
        for (int k = 0; k < 8; k++) {
            g[k] = vf_ld(dy, i + 2 * VF_LANES * k + VF_LANES, dt);
            d[k] = sub_ps(vf_ld(x, i + 2 * VF_LANES * k + VF_LANES, dt), m[2]);
        }
        gstats_tree_step(&b, g, d, m[3]);
    }
    for (; i + 2 * VF_LANES <= n; i += 2 * VF_LANES) {
        gstats_step(&a, vf_ld(dy, i, dt), centered_ps(vf_ld(x, i, dt), m[0], m[1]));
        gstats_step(&b, vf_ld(dy, i + VF_LANES, dt), centered_ps(vf_ld(x, i + VF_LANES, dt), m[2], m[3]));
    }
    int odd = 0;
    if (i + VF_LANES <= n) {
        gstats_step(&a, vf_ld(dy, i, dt), centered_ps(vf_ld(x, i, dt), m[0], m[1]));
        i += VF_LANES;
        odd = 1;
    }
    if (i < n) {
        int64_t cnt = n - i;
        vf_mask mk = vf_mask_first(cnt);
        vf g = vf_ld_part(dy, i, cnt, cnt, dt), v = vf_ld_part(x, i, cnt, cnt, dt);
        /* dead lanes: dy = 0 and d = 0, so even an inf mean adds nothing */
        if (odd)
            gstats_step(&b, g, centered_ps(v, vf_keep(m[2], mk), vf_keep(m[3], mk)));
        else
            gstats_step(&a, g, centered_ps(v, vf_keep(m[0], mk), vf_keep(m[1], mk)));
    }
    *ea = a;
    *oa = b;
}

/* Per-lane parameter vectors for a width w that divides 2 VF_LANES: lane l
 * of the flat stream belongs to column l % w. */
INLINE void lanes_ps(const float *v, int64_t w, vf *even, vf *odd)
{
    float t[2 * VF_LANES];
    for (int l = 0; l < 2 * VF_LANES; l++) t[l] = v[l % w];
    *even = vf_load(t);
    *odd = vf_load(t + VF_LANES);
}

/* ---- float-compute kernel bodies (f32, f16, bf16 storage) ---- */

/* Adds the sums and the sums of squares of 8 vectors d, pairwise in float,
 * to a (widened once) */
INLINE void stats_block_add(accf *a, const vf *d)
{
    vf t1 = tree8(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]);
    vf t2 = sq_tree8(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]);
    a->s1lo = vd_add(a->s1lo, vf_lo_pd(t1));
    a->s1hi = vd_add(a->s1hi, vf_hi_pd(t1));
    a->s2lo = vd_add(a->s2lo, vf_lo_pd(t2));
    a->s2hi = vd_add(a->s2hi, vf_hi_pd(t2));
}

/* Sums of x - shift over a run, every element widened to double */
INLINE void stats_run_pd(const void *x, int64_t n, double shift, double *acc, int dt)
{
    vd s = vd_set1(shift);
    const vd sh[4] = {s, s, s, s};
    accf a, b;
    stats_flat_ps(x, n, sh, dt, &a, &b);
    acc[0] = vd_hsum(vd_add(vd_add(a.s1lo, a.s1hi), vd_add(b.s1lo, b.s1hi)));
    acc[1] = vd_hsum(vd_add(vd_add(a.s2lo, a.s2hi), vd_add(b.s2lo, b.s2hi)));
}

/* 2-byte runs, whose widening to double would cost more than reading them:
 * blocks of 8 vectors (bfloat16 by vf_ld_eo) summed pairwise
 * in float from k, the shift rounded to float, as the rows kernels sum
 * blocks of 8 rows, each block's sums widened once.  The elements after the
 * blocks are summed in double from k; then the rounding of k is put back
 * exactly, as in stats_rows8_ps, and a run whose float sums need double
 * (needs_double) is summed again in double.  Float32 runs stay in double
 * throughout: widening costs less than their reading. */
INLINE void stats_run_ps(const void *x, int64_t n, double shift, double *acc, int dt)
{
    if (dt == CFBN_F32 || n < 8 * VF_LANES) {
        stats_run_pd(x, n, shift, acc, dt);
        return;
    }
    const float kf = (float)shift;
    const vf k = vf_set1(kf);
    accf a = accf_zero();
    int64_t i = 0;
    for (; i + 8 * VF_LANES <= n; i += 8 * VF_LANES) {
        /* once a 64-byte line */
        prefetch_lines_h(x, i, 8 * VF_LANES);
        vf d[8];
        if (dt == CFBN_BF16) {
            for (int r = 0; r < 4; r++) vf_ld_eo(x, i + 2 * VF_LANES * r, &d[2 * r], &d[2 * r + 1]);
        } else {
            for (int r = 0; r < 8; r++) d[r] = vf_ld(x, i + VF_LANES * r, dt);
        }
        for (int r = 0; r < 8; r++) d[r] = sub_ps(d[r], k);
        stats_block_add(&a, d);
    }
    double rest[2] = {0.0, 0.0};
    if (i < n) stats_run_pd(elem_at(x, i, dt), n - i, (double)kf, rest, dt);
    double s1 = vd_hsum(vd_add(a.s1lo, a.s1hi)) + rest[0];
    double s2 = vd_hsum(vd_add(a.s2lo, a.s2hi)) + rest[1];
    /* sums of (x - k) to sums of (x - shift), with e = k - shift */
    const double e = (double)kf - shift, ne = (double)n * e;
    s2 += e * (2.0 * s1 + ne);
    s1 += ne;
    if (needs_double(s1, s2, (double)n, -1.0, 1)) {
        stats_run_pd(x, n, shift, acc, dt);
        return;
    }
    acc[0] = s1;
    acc[1] = s2;
}

/* ---- rows whose width is a multiple of VF_LANES: blocks of 8 rows summed in float ----
 * Row-major over blocks of 8 consecutive rows (one contiguous stretch of
 * memory): each column's 8 values are summed pairwise in float, which bounds
 * the error by three roundings of the block's magnitude, and block sums are
 * added in double.  The float differences are taken from the shift rounded to
 * float; the rounding is put back exactly in double at the end, so the sums
 * are those of x - shift.  The driver picks a shift near the channel's mean,
 * which keeps the squares small and the variance free of cancellation.  A
 * column whose float sums left float's range is summed again in double at
 * the end (needs_double). */

#define SHIFT_BUF 1024
INLINE vf shift_ps(const double *shift)
{
    return vf_from_pd(vd_load(shift), vd_load(shift + VD_LANES));
}

/* Blocks of 8 rows are walked in memory order, and acc (2 w doubles, which
 * stay in L1) takes each block's sums.  Loads of a block come from 8 rows at
 * once, a pattern the hardware prefetchers follow poorly from DRAM, so each
 * column group also prefetches its share of the lines PREFETCH_BYTES ahead
 * in every array it reads: 8 rows x VF_LANES columns. */
#define PREFETCH_BYTES 4096

INLINE void prefetch_group(const void *base, int64_t o, int64_t j, size_t es)
{
    const char *q = (const char *)base + (size_t)o * es + PREFETCH_BYTES + (size_t)j * 8 * es;
    for (size_t b = 0; b < 8 * VF_LANES * es; b += 64) prefetch_l1(q + b);
}

/* The same into L2 only, for the gradient sums, which read two arrays: with
 * both prefetched into L1 the fills crowd out the lines in use (measured on
 * (64,112,112,64): 20% faster from DRAM, 5-15% from L3, where the
 * one-array statistics are faster with the L1 prefetch). */
INLINE void prefetch_group_l2(const void *base, int64_t o, int64_t j, size_t es)
{
    const char *q = (const char *)base + (size_t)o * es + PREFETCH_BYTES + (size_t)j * 8 * es;
    for (size_t b = 0; b < 8 * VF_LANES * es; b += 64) prefetch_l2(q + b);
}

INLINE void add_block(double *acc, int64_t w, int64_t j, vf t1, vf t2)
{
    vd_store(acc + j, vd_add(vd_load(acc + j), vf_lo_pd(t1)));
    vd_store(acc + j + VD_LANES, vd_add(vd_load(acc + j + VD_LANES), vf_hi_pd(t1)));
    vd_store(acc + w + j, vd_add(vd_load(acc + w + j), vf_lo_pd(t2)));
    vd_store(acc + w + j + VD_LANES, vd_add(vd_load(acc + w + j + VD_LANES), vf_hi_pd(t2)));
}

/* add_block for gradient sums of products with u = x - mhi: the second
 * sums take mlo times the first off in double */
INLINE void add_block_mlo(double *acc, int64_t w, int64_t j, vf t1, vf t2, vf mlo)
{
    vd t1lo = vf_lo_pd(t1), t1hi = vf_hi_pd(t1);
    vd_store(acc + j, vd_add(vd_load(acc + j), t1lo));
    vd_store(acc + j + VD_LANES, vd_add(vd_load(acc + j + VD_LANES), t1hi));
    vd_store(acc + w + j, vd_fnma(vf_lo_pd(mlo), t1lo, vd_add(vd_load(acc + w + j), vf_lo_pd(t2))));
    vd_store(acc + w + j + VD_LANES,
             vd_fnma(vf_hi_pd(mlo), t1hi, vd_add(vd_load(acc + w + j + VD_LANES), vf_hi_pd(t2))));
}

INLINE void stats_rows8_ps(const void *x, int64_t rows, int64_t w, const double *shift, double *acc, int dt)
{
    memset(acc, 0, (size_t)(2 * w) * sizeof *acc);
    const size_t es = dt ? 2 : 4;
    /* the shifts rounded to float once per call where they fit */
    float kf[SHIFT_BUF];
    const int have_kf = w <= SHIFT_BUF;
    if (have_kf)
        for (int64_t j = 0; j < w; j += VF_LANES) vf_store(kf + j, shift_ps(shift + j));
    int64_t r = 0;
    for (; r + 8 <= rows; r += 8) {
        const int64_t o = r * w;
        for (int64_t j = 0; j < w; j += VF_LANES) {
            prefetch_group(x, o, j, es);
            vf k = have_kf ? vf_load(kf + j) : shift_ps(shift + j);
            vf d[8];
            for (int i = 0; i < 8; i++) d[i] = sub_ps(vf_ld(x, o + i * w + j, dt), k);
            add_block(acc, w, j, tree8(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]),
                      sq_tree8(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]));
        }
    }
    for (; r < rows; r++) {
        for (int64_t j = 0; j < w; j += VF_LANES) {
            vf d = vf_sub(vf_ld(x, r * w + j, dt), shift_ps(shift + j));
            add_block(acc, w, j, d, vf_mul(d, d));
        }
    }
    /* from sums of (x - k) to sums of (x - shift): with e = k - shift,
     * sum(d + e) = s1 + n e and sum((d + e)^2) = s2 + 2 e s1 + n e^2; the
     * same pass takes needs_double's quick tests */
    const double n = (double)rows;
    const vd vn = vd_set1(n), two = vd_set1(2.0), tiny = vd_set1(n * TINY_SUM);
    vd bad = vd_zero();
    for (int64_t j = 0; j < w; j += VD_LANES) {
        vd sh = vd_load(shift + j);
        vd e = vd_sub(vd_to_float_and_back(sh), sh);
        vd s1 = vd_load(acc + j), s2 = vd_load(acc + w + j);
        vd ne = vd_mul(vn, e);
        s2 = vd_add(s2, vd_mul(e, vd_add(vd_mul(two, s1), ne)));
        s1 = vd_add(s1, ne);
        vd_store(acc + j, s1);
        vd_store(acc + w + j, s2);
        bad = vd_or(bad, suspect_pd(s1, s2, tiny));
    }
    if (vd_mask_any(vd_bits_mask(bad))) {
        for (int64_t j = 0; j < w; j++)
            if (needs_double(acc[j], acc[w + j], n, -1.0, 1))
                stats_column_pd(x, rows, w, j, shift[j], acc + j, acc + w + j, dt);
    }
}

INLINE void gstats_rows8_ps(const void *dy, const void *x, int64_t rows, int64_t w, const cfbn_grad_f32 *p,
                            double *acc, int dt)
{
    memset(acc, 0, (size_t)(2 * w) * sizeof *acc);
    const size_t es = dt ? 2 : 4;
    int64_t r = 0;
    /* Rows are addressed as a block pointer plus k times the row stride,
     * and the pairwise sums are formed as soon as a pair is loaded: both
     * keep the loop within the registers (16 row pointers and 16 live
     * vectors spilled to the stack). */
    const size_t rs = (size_t)w * es;
    const float *mhi = p->mhi, *mlo = p->mlo;
    for (; r + 8 <= rows; r += 8) {
        const int64_t o = r * w;
        const char *bd = (const char *)dy + (size_t)o * es, *bx = (const char *)x + (size_t)o * es;
        for (int64_t j = 0; j < w; j += VF_LANES, bd += VF_LANES * es, bx += VF_LANES * es) {
            prefetch_group_l2(dy, o, j, es);
            prefetch_group_l2(x, o, j, es);
            const vf m = vf_load(mhi + j);
            vf s[4], q[4];
            for (int k = 0; k < 4; k++) {
                vf g0 = vf_ld(bd + 2 * k * rs, 0, dt), g1 = vf_ld(bd + (2 * k + 1) * rs, 0, dt);
                vf u0 = sub_ps(vf_ld(bx + 2 * k * rs, 0, dt), m);
                vf u1 = sub_ps(vf_ld(bx + (2 * k + 1) * rs, 0, dt), m);
                s[k] = vf_add(g0, g1);
                q[k] = vf_fma(g1, u1, vf_mul(g0, u0));
            }
            /* the order of tree8 and dot_tree8; mlo comes off in double,
             * as in gstats_tree_step */
            vf t1 = vf_add(vf_add(s[0], s[1]), vf_add(s[2], s[3]));
            vf t2 = vf_add(vf_add(q[0], q[1]), vf_add(q[2], q[3]));
            add_block_mlo(acc, w, j, t1, t2, vf_load(mlo + j));
        }
    }
    for (; r < rows; r++) {
        for (int64_t j = 0; j < w; j += VF_LANES) {
            vf m = vf_load(p->mhi + j), l = vf_load(p->mlo + j);
            vf g = vf_ld(dy, r * w + j, dt);
            add_block(acc, w, j, g, vf_mul(g, centered_ps(vf_ld(x, r * w + j, dt), m, l)));
        }
    }
    if (any_suspect(acc, w, (double)rows)) gstats_redo_columns(dy, x, rows, w, p, acc, dt);
}

/* Parameters of the masked tail columns [full, full + cnt) of a row; the
 * dead lanes are 0, whatever they compute is never stored or summed. */
INLINE void tail_params_ps(const float *const *v, int k, int64_t full, int64_t cnt, vf *out)
{
    vf_mask mk = vf_mask_first(cnt);
    for (int i = 0; i < k; i++) out[i] = cnt ? vf_load_part(v[i] + full, mk) : vf_zero();
}

/* ---- rows of any width: the sums of whole VF_LANES-column blocks
 * accumulate in acc (L1-resident, two rows per load and store); the partial
 * block sits at the same columns in every row, so its sums stay in
 * registers.  The statistics (grad 0) widen x to double and take the
 * shifts there; the gradient (grad 1) forms (x - mhi) - mlo in float
 * (centered_ps), from mhi, mlo = m[0], m[1]. ---- */

/* One vector's sums at e (part: its first cnt elements, avail readable),
 * added to a; sh: the shifts of its lanes (statistics), ml: mhi, mlo
 * (gradient) */
INLINE void cols_step(int grad, accf *a, const void *dy, const void *x, int64_t e, int part, int64_t cnt,
                      int64_t avail, const vd *sh, const vf *ml, int dt)
{
    if (grad) {
        vf g = part ? vf_ld_part(dy, e, cnt, avail, dt) : vf_ld(dy, e, dt);
        vf v = part ? vf_ld_part(x, e, cnt, avail, dt) : vf_ld(x, e, dt);
        gstats_step(a, g, centered_ps(v, ml[0], ml[1]));
    } else if (part) {
        vf v = vf_ld_part(x, e, cnt, avail, dt);
        stats_step(a, vf_lo_pd(v), vf_hi_pd(v), sh[0], sh[1]);
    } else {
        stats_step(a, vd_ld_widen(x, e, dt), vd_ld_widen(x, e + VD_LANES, dt), sh[0], sh[1]);
    }
}

/* nr (1 or 2) rows from element o; t: the partial block's sums, whose
 * parameters are tsh, tml */
INLINE void cols_rows(int grad, int nr, const void *dy, const void *x, int64_t o, int64_t w, int64_t n,
                      const double *shift, const float *const *m, const vd *tsh, const vf *tml, accf *t,
                      double *acc, int dt)
{
    const int64_t full = w & ~(int64_t)(VF_LANES - 1), cnt = w - full;
    for (int64_t j = 0; j < full; j += VF_LANES) {
        accf c = accf_load(acc + j, acc + w + j);
        vd sh[2] = {vd_zero(), vd_zero()};
        vf ml[2] = {vf_zero(), vf_zero()};
        if (grad) ml[0] = vf_load(m[0] + j), ml[1] = vf_load(m[1] + j);
        else sh[0] = vd_load(shift + j), sh[1] = vd_load(shift + j + VD_LANES);
        for (int k = 0; k < nr; k++) cols_step(grad, &c, dy, x, o + k * w + j, 0, VF_LANES, 0, sh, ml, dt);
        accf_store(&c, acc + j, acc + w + j);
    }
    for (int k = 0; cnt && k < nr; k++)
        cols_step(grad, t, dy, x, o + k * w + full, 1, cnt, n - o - k * w - full, tsh, tml, dt);
}

INLINE void sums_cols_ps(int grad, const void *dy, const void *x, int64_t rows, int64_t w, const double *shift,
                         const float *const *m, double *acc, int dt)
{
    const int64_t full = w & ~(int64_t)(VF_LANES - 1), cnt = w - full, n = rows * w;
    memset(acc, 0, (size_t)(2 * w) * sizeof *acc);
    accf t = accf_zero();
    vd tsh[2] = {vd_zero(), vd_zero()};
    vf tml[2] = {vf_zero(), vf_zero()};
    if (grad) tail_params_ps(m, 2, full, cnt, tml);
    if (!grad && cnt > 0) tsh[0] = vd_load_part(shift + full, vd_mask_first(cnt));
    if (!grad && cnt > VD_LANES) tsh[1] = vd_load_part(shift + full + VD_LANES, vd_mask_first(cnt - VD_LANES));
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2) cols_rows(grad, 2, dy, x, r * w, w, n, shift, m, tsh, tml, &t, acc, dt);
    if (r < rows) cols_rows(grad, 1, dy, x, r * w, w, n, shift, m, tsh, tml, &t, acc, dt);
    if (cnt) accf_store_part(&t, acc + full, acc + w + full, cnt);
}

INLINE void stats_rows_ps(const void *x, int64_t rows, int64_t w, const double *shift, double *acc, int dt)
{
    if (w <= 0) return;
    if (w % VF_LANES == 0 && w > 2 * VF_LANES) {
        stats_rows8_ps(x, rows, w, shift, acc, dt);
        return;
    }
    if ((2 * VF_LANES) % w == 0) {
        double t[2 * VF_LANES];
        for (int l = 0; l < 2 * VF_LANES; l++) t[l] = shift[l % w];
        const vd sh[4] = {vd_load(t), vd_load(t + VD_LANES), vd_load(t + VF_LANES),
                          vd_load(t + VF_LANES + VD_LANES)};
        accf a, b;
        stats_flat_ps(x, rows * w, sh, dt, &a, &b);
        fold_accf(&a, &b, w, acc);
        return;
    }
    sums_cols_ps(0, NULL, x, rows, w, shift, NULL, acc, dt);
}

/* The gradient sums of `runs` runs of n elements, `stride` apart, with
 * every product and sum in double: run kernels whose float block sums left
 * float's range (needs_double) take them from here. */
COLD void gstats_runs_pd(const void *dy, const void *x, int64_t n, int64_t runs, int64_t stride,
                         const cfbn_grad_f32 *p, double *acc, int dt)
{
    vf m = vf_set1(p->mhi[0]), l = vf_set1(p->mlo[0]);
    const vf q[4] = {m, l, m, l};
    const size_t step = (size_t)stride * (dt ? 2 : 4);
    vd s1 = vd_zero(), s2 = vd_zero();
    for (int64_t k = 0; k < runs; k++) {
        accf a, b;
        gstats_flat_ps((const char *)dy + k * step, (const char *)x + k * step, n, q, dt, 0, &a, &b);
        s1 = vd_add(s1, vd_add(vd_add(a.s1lo, a.s1hi), vd_add(b.s1lo, b.s1hi)));
        s2 = vd_add(s2, vd_add(vd_add(a.s2lo, a.s2hi), vd_add(b.s2lo, b.s2hi)));
    }
    acc[0] = vd_hsum(s1);
    acc[1] = vd_hsum(s2);
}

INLINE int run_needs_double(const double *acc, int64_t count, const cfbn_grad_f32 *p)
{
    int mfin = finite_f(p->mhi[0]) && finite_f(p->mlo[0]);
    return needs_double(acc[0], acc[1], (double)count, fabs(p->mhi[0]), mfin);
}

INLINE void gstats_run_ps(const void *dy, const void *x, int64_t n, const cfbn_grad_f32 *p, double *acc, int dt)
{
    vf m = vf_set1(p->mhi[0]), l = vf_set1(p->mlo[0]);
    const vf q[4] = {m, l, m, l};
    accf a, b;
    gstats_flat_ps(dy, x, n, q, dt, 1, &a, &b);
    acc[0] = vd_hsum(vd_add(vd_add(a.s1lo, a.s1hi), vd_add(b.s1lo, b.s1hi)));
    acc[1] = vd_hsum(vd_add(vd_add(a.s2lo, a.s2hi), vd_add(b.s2lo, b.s2hi)));
    if (n >= TREE_SPAN && run_needs_double(acc, n, p)) gstats_runs_pd(dy, x, n, 1, 0, p, acc, dt);
}

INLINE void gstats_rows_ps(const void *dy, const void *x, int64_t rows, int64_t w, const cfbn_grad_f32 *p,
                           double *acc, int dt)
{
    if (w <= 0) return;
    if (w % VF_LANES == 0 && w > 2 * VF_LANES) {
        gstats_rows8_ps(dy, x, rows, w, p, acc, dt);
        return;
    }
    if ((2 * VF_LANES) % w == 0) {
        vf q[4];
        lanes_ps(p->mhi, w, &q[0], &q[2]);
        lanes_ps(p->mlo, w, &q[1], &q[3]);
        accf a, b;
        gstats_flat_ps(dy, x, rows * w, q, dt, 1, &a, &b);
        fold_accf(&a, &b, w, acc);
        if (rows * w >= TREE_SPAN) gstats_redo_columns(dy, x, rows, w, p, acc, dt);
        return;
    }
    const float *const m[2] = {p->mhi, p->mlo};
    sums_cols_ps(1, dy, x, rows, w, NULL, m, acc, dt);
}

/* ---- elementwise passes: the forward's y = ((x - mhi) - mlo) alpha + beta
 * (grad 0) and the gradient's dx = dy a + ((x - mhi) - mlo) b + c (grad 1),
 * written once for both; grad is a constant at every call, so each pass is
 * compiled as its own loop, and the forward's never reads dy.  Per-column
 * parameters come as arrays v[NPAR(grad)] (mhi, mlo, alpha, beta or mhi,
 * mlo, a, b, c), vector parameter sets q in that order. ---- */

INLINE vf out_ps(int grad, vf g, vf x, const vf *q)
{
    return grad ? gapply_ps(g, x, q[0], q[1], q[2], q[3], q[4]) : apply_ps(x, q[0], q[1], q[2], q[3]);
}

INLINE vf out_at(int grad, const void *dy, const void *x, int64_t i, const vf *q, int dt)
{
    return out_ps(grad, grad ? vf_ld(dy, i, dt) : vf_zero(), vf_ld(x, i, dt), q);
}

/* elements [i, i + cnt), avail of them readable (vf_ld_part) */
INLINE vf out_part(int grad, const void *dy, const void *x, int64_t i, int64_t cnt, int64_t avail, const vf *q,
                   int dt)
{
    return out_ps(grad, grad ? vf_ld_part(dy, i, cnt, avail, dt) : vf_zero(), vf_ld_part(x, i, cnt, avail, dt), q);
}

/* 2 VF_LANES elements from i of dy (grad only) and x: bfloat16 as
 * vf_ld_eo's even and odd lanes, the others as two vectors */
INLINE void ld_pair(int grad, const void *dy, const void *x, int64_t i, int dt, vf *g, vf *v)
{
    g[0] = g[1] = vf_zero();
    if (dt == CFBN_BF16) {
        if (grad) vf_ld_eo(dy, i, &g[0], &g[1]);
        vf_ld_eo(x, i, &v[0], &v[1]);
        return;
    }
    if (grad) g[0] = vf_ld(dy, i, dt), g[1] = vf_ld(dy, i + VF_LANES, dt);
    v[0] = vf_ld(x, i, dt), v[1] = vf_ld(x, i + VF_LANES, dt);
}

INLINE void col_params_ps(const float *const *v, int k, int64_t j, vf *out)
{
    for (int i = 0; i < k; i++) out[i] = vf_load(v[i] + j);
}

/* k parameters of a flat stream of width w (dividing 2 VF_LANES, lanes_ps):
 * the even blocks' set, then the odd blocks' */
INLINE void lanes_params_ps(const float *const *v, int k, int64_t w, vf *q)
{
    for (int i = 0; i < k; i++) lanes_ps(v[i], w, &q[i], &q[k + i]);
}

/* k parameters of a run, each one value broadcast, as both sets */
INLINE void run_params_ps(const float *const *v, int k, vf *q)
{
    for (int i = 0; i < k; i++) q[i] = q[k + i] = vf_set1(v[i][0]);
}

/* q: the even blocks' set, then the odd blocks' */
INLINE void out_flat_ps(int grad, const void *dy, const void *x, void *y, int64_t n, const vf *q, int dt)
{
    const int k = NPAR(grad), step = grad ? 2 : 4;
    int64_t i = 0;
    for (; i + step * VF_LANES <= n; i += step * VF_LANES) {
        vf r[4];
        for (int s = 0; s < step; s++) r[s] = out_at(grad, dy, x, i + s * VF_LANES, q + k * (s & 1), dt);
        for (int s = 0; s < step; s += 2) vf_st2(y, i + s * VF_LANES, r[s], r[s + 1], dt);
    }
    for (; i + VF_LANES <= n; i += VF_LANES) vf_st(y, i, out_at(grad, dy, x, i, q + k * ((i / VF_LANES) & 1), dt), dt);
    if (i < n) vf_st_part(y, i, out_part(grad, dy, x, i, n - i, n - i, q + k * ((i / VF_LANES) & 1), dt), n - i, dt);
}

/* A run: q as out_flat_ps's, both sets the same.  bfloat16 goes 2 VF_LANES
 * elements at a time through vf_ld_eo and vf_st_eo.  A run of 2 VF_LANES or
 * more that 2 VF_LANES does not divide ends with whole vectors over its
 * last 2 VF_LANES elements instead of a masked tail: loaded before any store
 * (y may be x or dy) and stored last, so the elements they share with the
 * body are written twice with the same values.  Elementwise, so the
 * outputs are those of out_flat_ps. */
INLINE void out_uni_ps(int grad, const void *dy, const void *x, void *y, int64_t n, const vf *q, int dt)
{
    if (n < 2 * VF_LANES) {
        out_flat_ps(grad, dy, x, y, n, q, dt);
        return;
    }
    const int64_t body = n & ~(int64_t)(2 * VF_LANES - 1), e = n - 2 * VF_LANES;
    vf tg[2] = {vf_zero(), vf_zero()}, tv[2] = {vf_zero(), vf_zero()};
    if (body < n) ld_pair(grad, dy, x, e, dt, tg, tv);
    if (dt == CFBN_BF16) {
        for (int64_t i = 0; i < body; i += 2 * VF_LANES) {
            vf g[2], v[2];
            ld_pair(grad, dy, x, i, dt, g, v);
            vf_st_eo(y, i, out_ps(grad, g[0], v[0], q), out_ps(grad, g[1], v[1], q));
        }
    } else {
        out_flat_ps(grad, dy, x, y, body, q, dt);
    }
    if (body < n) {
        vf r0 = out_ps(grad, tg[0], tv[0], q), r1 = out_ps(grad, tg[1], tv[1], q);
        if (dt == CFBN_BF16) vf_st_eo(y, e, r0, r1);
        else vf_st2(y, e, r0, r1, dt);
    }
}

/* Rows of any width, column block by column block with a masked tail.  nt:
 * the blocks' stores non-temporal (rows as rows_stream_ok in bn_route.c
 * allows, whose tails stay within the row: avail is then cnt). */
INLINE void out_cols_ps(int grad, const void *dy, const void *x, void *y, int64_t rows, int64_t w,
                        const float *const *v, int dt, int nt)
{
    const int k = NPAR(grad);
    const int64_t full = w & ~(int64_t)(VF_LANES - 1), cnt = w - full, n = rows * w;
    vf t[5];
    tail_params_ps(v, k, full, cnt, t);
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = r * w;
        for (int64_t j = 0; j < full; j += VF_LANES) {
            vf q[5];
            col_params_ps(v, k, j, q);
            vf u = out_at(grad, dy, x, o + j, q, dt);
            if (nt) vf_st_nt(y, o + j, u, dt);
            else vf_st(y, o + j, u, dt);
        }
        if (cnt) vf_st_part(y, o + full, out_part(grad, dy, x, o + full, cnt, nt ? cnt : n - o - full, t, dt), cnt, dt);
    }
}

/* out_ps with parameters in eo_params's layout: the group at c, h = 0 for
 * the even lanes and VF_LANES for the odd ones */
INLINE vf out_eo_ps(int grad, vf g, vf x, const float *c, int h)
{
    vf q[5];
    for (int a = 0; a < NPAR(grad); a++) q[a] = vf_load(c + a * EO_GROUP + h);
    return out_ps(grad, g, x, q);
}

/* Stores the 2 EO_GROUP elements h0, h1 at y[i..]: regular stores, or (nt)
 * non-temporal ones as vh_stream_seq's */
INLINE void st_eo2_seq(void *y, int64_t i, vh h0, vh h1, int nt, int half, vh *prev)
{
    if (nt) {
        vh_stream_seq(y, i, h0, half, prev);
        vh_stream_seq(y, i + EO_GROUP, h1, half, prev);
        return;
    }
    vh_st(y, i, h0);
    vh_st(y, i + EO_GROUP, h1);
}

/* bfloat16 rows as eo_rows allows, row by row with one pointer through the
 * parameters; widths of a multiple of 2 EO_GROUP take two groups at a time
 * with one NaN test.  nt: non-temporal stores (rows VF_NT_MIN_ALIGN-byte
 * aligned; half: not VF_NT_ALIGN-aligned) as vh_stream_seq's, the inputs
 * prefetched about once a line. */
INLINE void out_rows_eo(int grad, const void *dy, const void *x, void *y, int64_t rows, int64_t w,
                        const float *const *v, int nt)
{
    const int k = NPAR(grad);
    float q[5 * EO_MAX_W];
    eo_params(v, k, w, q);
    const int half = ((uintptr_t)y % VF_NT_ALIGN) != 0;
    vh prev = vh_zero();
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = r * w;
        const float *c = q;
        if (w % (2 * EO_GROUP) == 0) {
            for (int64_t i = o; i < o + w; i += 2 * EO_GROUP, c += 2 * k * EO_GROUP) {
                vf g0[2], v0[2], g1[2], v1[2];
                vh h0, h1;
                if (nt && grad) prefetch_lines_h(dy, i, 2 * EO_GROUP);
                if (nt) prefetch_lines_h(x, i, 2 * EO_GROUP);
                ld_pair(grad, dy, x, i, CFBN_BF16, g0, v0);
                ld_pair(grad, dy, x, i + EO_GROUP, CFBN_BF16, g1, v1);
                vh_narrow_eo2(out_eo_ps(grad, g0[0], v0[0], c, 0), out_eo_ps(grad, g0[1], v0[1], c, VF_LANES),
                              out_eo_ps(grad, g1[0], v1[0], c + k * EO_GROUP, 0),
                              out_eo_ps(grad, g1[1], v1[1], c + k * EO_GROUP, VF_LANES), &h0, &h1);
                st_eo2_seq(y, i, h0, h1, nt, half, &prev);
            }
            continue;
        }
        for (int64_t i = o; i < o + w; i += EO_GROUP, c += k * EO_GROUP) {
            vf g[2], u[2];
            if (nt && grad && !(i % HALFWORDS_PER_LINE)) prefetch_ahead_of(dy, i, CFBN_BF16);
            if (nt && !(i % HALFWORDS_PER_LINE)) prefetch_ahead_of(x, i, CFBN_BF16);
            ld_pair(grad, dy, x, i, CFBN_BF16, g, u);
            u[0] = out_eo_ps(grad, g[0], u[0], c, 0);
            u[1] = out_eo_ps(grad, g[1], u[1], c, VF_LANES);
            if (nt) vh_stream_seq(y, i, vh_narrow_eo(u[0], u[1]), half, &prev);
            else vf_st_eo(y, i, u[0], u[1]);
        }
    }
    if (nt) vh_stream_seq_end(y, rows * w, half, prev);
}

/* Rows of width w: a flat stream where w divides 2 VF_LANES, bfloat16 rows
 * as eo_rows allows through out_rows_eo, others block by block
 * (out_cols_ps).  nt (rows as rows_stream_ok allows): non-temporal stores,
 * then a fence. */
INLINE void out_rows_ps(int grad, const void *dy, const void *x, void *y, int64_t rows, int64_t w,
                        const float *const *v, int dt, int nt)
{
    if (w <= 0) return;
    if (!nt && (2 * VF_LANES) % w == 0) {
        vf q[10];
        lanes_params_ps(v, NPAR(grad), w, q);
        out_flat_ps(grad, dy, x, y, rows * w, q, dt);
        return;
    }
    if (eo_rows(dt, w)) out_rows_eo(grad, dy, x, y, rows, w, v, nt);
    else out_cols_ps(grad, dy, x, y, rows, w, v, dt, nt);
    if (nt) stream_fence();
}

/* ---- non-temporal stores (f32, f16, bf16 storage) ----
 * For outputs far larger than the caches: a streaming store writes the line
 * without reading it first (no read-for-ownership), a third of a pass's
 * memory traffic.  Stores of VF_NT_MIN_ALIGN bytes (16 on AVX2: 8
 * halfwords, or 4 floats twice), because large NumPy buffers are only
 * 16-byte aligned; the sfence orders them before the caller's barrier.
 * vf_st_nt, vf_stream_aligned and VF_NT_ALIGN are the ISA header's. */

/* elements before p reaches VF_NT_MIN_ALIGN-byte alignment (p is
 * element-aligned) */
INLINE int64_t peel_nt(const void *p, int64_t n, int dt)
{
    int64_t k = (int64_t)((VF_NT_MIN_ALIGN - ((uintptr_t)p % VF_NT_MIN_ALIGN)) % VF_NT_MIN_ALIGN) / (dt ? 2 : 4);
    return k < n ? k : n;
}

/* whether element i of p is VF_NT_ALIGN-byte aligned */
INLINE int nt_aligned(const void *p, int64_t i, int dt)
{
    return (uintptr_t)elem_at(p, i, dt) % VF_NT_ALIGN == 0;
}

/* The streaming run loop stores a whole vector at a time where it can
 * (float: where the output is VF_NT_ALIGN-aligned after the
 * VF_NT_MIN_ALIGN peel; bfloat16: 4 VF_LANES elements a step, one NaN test
 * and one prefetch a line), not VF_NT_MIN_ALIGN-byte pieces: the core then
 * keeps up with the memory bus better.  Float outputs that stay
 * misaligned keep the smaller stores: peeling them further (a masked store
 * at each run's start) made the same forward 11% slower.  (AVX2, 32-byte
 * vectors and 16-byte pieces.)  Measured through the driver, 2 threads,
 * means of interleaved rounds: (64,64,112,112) NCHW training forward,
 * bfloat16 10.70 -> 8.89 ms, float32 17.1 -> 15.5 ms; (64,112,112,64) NHWC
 * bfloat16 11.6 -> 10.8 and 14.6 -> 12.5 ms in two sets.  The bfloat16 peel
 * of VF_LANES elements aligns an output VF_NT_MIN_ALIGN bytes past
 * VF_NT_ALIGN (all there is on AVX2); one it leaves misaligned takes the
 * smaller stores.  q: one parameter set. */
INLINE void out_run_nt_ps(int grad, const void *dy, const void *x, void *y, int64_t n, const vf *q, int dt)
{
    int64_t i = peel_nt(y, n, dt);
    if (i) vf_st_part(y, 0, out_part(grad, dy, x, 0, i, n, q, dt), i, dt);
    if (!dt && nt_aligned(y, i, dt))
        for (; i + VF_LANES <= n; i += VF_LANES) vf_stream_aligned((float *)y, i, out_at(grad, dy, x, i, q, dt));
    if (dt == CFBN_BF16 && i + VF_LANES <= n && !nt_aligned(y, i, dt)) {
        vf_st_nt(y, i, out_at(grad, dy, x, i, q, dt), dt);
        i += VF_LANES;
    }
    if (dt == CFBN_BF16 && nt_aligned(y, i, dt)) {
        for (; i + 4 * VF_LANES <= n; i += 4 * VF_LANES) {
            vf g0[2], v0[2], g1[2], v1[2];
            if (grad) prefetch_lines_h(dy, i, 4 * VF_LANES);
            prefetch_lines_h(x, i, 4 * VF_LANES);
            ld_pair(grad, dy, x, i, dt, g0, v0);
            ld_pair(grad, dy, x, i + 2 * VF_LANES, dt, g1, v1);
            vf_st_eo2_nt(y, i, out_ps(grad, g0[0], v0[0], q), out_ps(grad, g0[1], v0[1], q),
                         out_ps(grad, g1[0], v1[0], q), out_ps(grad, g1[1], v1[1], q));
        }
    }
    for (; !grad && i + 2 * VF_LANES <= n; i += 2 * VF_LANES) {
        vf r0 = out_at(grad, dy, x, i, q, dt), r1 = out_at(grad, dy, x, i + VF_LANES, q, dt);
        vf_st_nt(y, i, r0, dt);
        vf_st_nt(y, i + VF_LANES, r1, dt);
    }
    for (; i + VF_LANES <= n; i += VF_LANES) vf_st_nt(y, i, out_at(grad, dy, x, i, q, dt), dt);
    if (i < n) vf_st_part(y, i, out_part(grad, dy, x, i, n - i, n - i, q, dt), n - i, dt);
    stream_fence();
}

/* ---- the elementwise entries ---- */

INLINE void apply_run_ps(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p, int dt)
{
    const float *const v[4] = APPLY_ARRAYS(p);
    vf q[8];
    run_params_ps(v, 4, q);
    out_uni_ps(0, NULL, x, y, n, q, dt);
}

INLINE void apply_rows_ps(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f32 *p, int dt)
{
    const float *const v[4] = APPLY_ARRAYS(p);
    out_rows_ps(0, NULL, x, y, rows, w, v, dt, 0);
}

INLINE void gapply_run_ps(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f32 *p, int dt)
{
    const float *const v[5] = GRAD_ARRAYS(p);
    vf q[10];
    run_params_ps(v, 5, q);
    out_uni_ps(1, dy, x, dx, n, q, dt);
}

INLINE void gapply_rows_ps(const void *dy, const void *x, void *dx, int64_t rows, int64_t w, const cfbn_grad_f32 *p,
                           int dt)
{
    const float *const v[5] = GRAD_ARRAYS(p);
    out_rows_ps(1, dy, x, dx, rows, w, v, dt, 0);
}

INLINE void apply_run_nt_ps(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p, int dt)
{
    const float *const v[4] = APPLY_ARRAYS(p);
    vf q[8];
    run_params_ps(v, 4, q);
    out_run_nt_ps(0, NULL, x, y, n, q, dt);
}

INLINE void apply_rows_nt_ps(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f32 *p, int dt)
{
    const float *const v[4] = APPLY_ARRAYS(p);
    out_rows_ps(0, NULL, x, y, rows, w, v, dt, 1);
}

INLINE void gapply_run_nt_ps(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f32 *p, int dt)
{
    const float *const v[5] = GRAD_ARRAYS(p);
    vf q[10];
    run_params_ps(v, 5, q);
    out_run_nt_ps(1, dy, x, dx, n, q, dt);
}

INLINE void gapply_rows_nt_ps(const void *dy, const void *x, void *dx, int64_t rows, int64_t w,
                              const cfbn_grad_f32 *p, int dt)
{
    const float *const v[5] = GRAD_ARRAYS(p);
    out_rows_ps(1, dy, x, dx, rows, w, v, dt, 1);
}
