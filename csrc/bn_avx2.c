/* AVX2 + FMA + F16C kernels.  Only this file is compiled with -mavx2 -mfma
 * -mf16c, and everything in it is static except the table: a helper with
 * external linkage could be merged with a baseline copy by the linker and
 * then run on a CPU without AVX2.  Same contracts as bn_scalar.c.  The
 * primitives (masks, loads and stores of each storage type, float16 and
 * bfloat16 conversions, horizontal sums) are in vec_avx2.h; the loops
 * shared with other ISAs (so far the float64 plain entries) in bn_simd.c.
 *
 * f32, f16 and bf16 share their bodies (a constant `dt`, the storage type,
 * that always_inline folds away; bn_entries.h makes the entries); f64 has
 * its own.  Rows kernels whose width divides the vector period (16 floats,
 * 8 doubles) run as one flat stream with per-lane parameters, because then
 * every lane always sees the same column; other widths go row by row with a
 * masked tail.
 *
 * Fused activations of f32, f16 and bf16 tensors run inside the vector loops (the
 * *_fused_* entries): relu, relu6 and leaky relu by max/min/blend; elu,
 * sigmoid, tanh and silu through exp_ps, a Cephes-style expf.  float64
 * tensors take the routing layer's fallback: these plain kernels over
 * L1-sized blocks and bn_math.h's libm formulas.
 *
 * The second-order gradient's entries (gg*) exist for all four dtypes. */
#include "cfbn.h"
#include "bn_runs.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "bn_act.h"
#include "bn_entries.h"
#include "storage.h"
#include "vec_avx2.h"
#include "bn_simd.c"

/* Double sums for 8 float lanes: s1 = sum d or sum dy, s2 = sum d^2 or sum dy*d. */
typedef struct {
    vd s1lo, s1hi, s2lo, s2hi;
} acc8;

INLINE acc8 acc8_zero(void)
{
    acc8 a = {vd_zero(), vd_zero(), vd_zero(), vd_zero()};
    return a;
}

INLINE acc8 acc8_load(const double *s1, const double *s2)
{
    acc8 a = {vd_load(s1), vd_load(s1 + 4), vd_load(s2), vd_load(s2 + 4)};
    return a;
}

INLINE void acc8_store(const acc8 *a, double *s1, double *s2)
{
    vd_store(s1, a->s1lo);
    vd_store(s1 + 4, a->s1hi);
    vd_store(s2, a->s2lo);
    vd_store(s2 + 4, a->s2hi);
}

/* Stores lanes [0, cnt) of a into s1[], s2[]. */
INLINE void acc8_store_part(const acc8 *a, double *s1, double *s2, int64_t cnt)
{
    __m256i mlo = vd_mask_first(cnt);
    vd_store_part(s1, mlo, a->s1lo);
    vd_store_part(s2, mlo, a->s2lo);
    if (cnt > 4) {
        __m256i mhi = vd_mask_first(cnt - 4);
        vd_store_part(s1 + 4, mhi, a->s1hi);
        vd_store_part(s2 + 4, mhi, a->s2hi);
    }
}

/* The shift is subtracted in double: x - shift is exact there for any float
 * x near the shift, which keeps sum d^2 free of cancellation. */
INLINE void stats_step(acc8 *a, vd xlo, vd xhi, vd shlo, vd shhi)
{
    vd dlo = vd_sub(xlo, shlo), dhi = vd_sub(xhi, shhi);
    a->s1lo = vd_add(a->s1lo, dlo);
    a->s1hi = vd_add(a->s1hi, dhi);
    a->s2lo = vd_fma(dlo, dlo, a->s2lo);
    a->s2hi = vd_fma(dhi, dhi, a->s2hi);
}

INLINE void gstats_step(acc8 *a, vf g, vf d)
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

/* apply_ps and gapply_ps with parameters in eo_params's layout: the group
 * at q, h = 0 for the even lanes and 8 for the odd ones */
INLINE vf apply_eo_ps(vf x, const float *q, int h)
{
    return apply_ps(x, vf_load(q + h), vf_load(q + 16 + h), vf_load(q + 32 + h),
                    vf_load(q + 48 + h));
}

INLINE vf gapply_eo_ps(vf g, vf x, const float *q, int h)
{
    return gapply_ps(g, x, vf_load(q + h), vf_load(q + 16 + h), vf_load(q + 32 + h),
                     vf_load(q + 48 + h), vf_load(q + 64 + h));
}

/* Stores the 32 elements h0, h1 at y[i..]: regular stores, or (nt)
 * non-temporal ones as vh_stream_seq's */
INLINE void st32_eo_seq(void *y, int64_t i, __m256i h0, __m256i h1, int nt, int half, __m256i *prev)
{
    if (nt) {
        vh_stream_seq(y, i, h0, half, prev);
        vh_stream_seq(y, i + 16, h1, half, prev);
        return;
    }
    _mm256_storeu_si256((__m256i *)((uint16_t *)y + i), h0);
    _mm256_storeu_si256((__m256i *)((uint16_t *)y + i + 16), h1);
}

/* bfloat16 rows as eo_rows allows, row by row with one pointer through the
 * parameters; widths of a multiple of 32 take two groups at a time with one
 * NaN test.  nt: non-temporal stores (rows 16-byte aligned) as
 * vh_stream_seq's, the inputs prefetched once a line. */
INLINE void apply_rows_eo(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f32 *p, int nt)
{
    float q[4 * EO_MAX_W];
    const float *const v[4] = {p->mhi, p->mlo, p->alpha, p->beta};
    eo_params(v, 4, w, q);
    const int half = ((uintptr_t)y & 31) != 0;
    __m256i prev = _mm256_setzero_si256();
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = r * w;
        const float *g = q;
        if (w % 32 == 0) {
            for (int64_t i = o; i < o + w; i += 32, g += 128) {
                vf e0, o0, e1, o1;
                __m256i h0, h1;
                if (nt) prefetch_ahead_of(x, i, CFBN_BF16);
                vf_ld_eo(x, i, &e0, &o0);
                vf_ld_eo(x, i + 16, &e1, &o1);
                vh_narrow_eo2(apply_eo_ps(e0, g, 0), apply_eo_ps(o0, g, 8), apply_eo_ps(e1, g + 64, 0),
                            apply_eo_ps(o1, g + 64, 8), &h0, &h1);
                st32_eo_seq(y, i, h0, h1, nt, half, &prev);
            }
            continue;
        }
        for (int64_t i = o; i < o + w; i += 16, g += 64) {
            vf e, od;
            if (nt && !(i & 31)) prefetch_ahead_of(x, i, CFBN_BF16);
            vf_ld_eo(x, i, &e, &od);
            e = apply_eo_ps(e, g, 0);
            od = apply_eo_ps(od, g, 8);
            if (nt) vh_stream_seq(y, i, vh_narrow_eo(e, od), half, &prev);
            else vf_st_eo(y, i, e, od);
        }
    }
    if (nt) vh_stream_seq_end(y, rows * w, half, prev);
}

INLINE void gapply_rows_eo(const void *dy, const void *x, void *dx, int64_t rows, int64_t w, const cfbn_grad_f32 *p,
                           int nt)
{
    float q[5 * EO_MAX_W];
    const float *const v[5] = {p->mhi, p->mlo, p->a, p->b, p->c};
    eo_params(v, 5, w, q);
    const int half = ((uintptr_t)dx & 31) != 0;
    __m256i prev = _mm256_setzero_si256();
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = r * w;
        const float *g = q;
        if (w % 32 == 0) {
            for (int64_t i = o; i < o + w; i += 32, g += 160) {
                vf ge0, go0, xe0, xo0, ge1, go1, xe1, xo1;
                __m256i h0, h1;
                if (nt) prefetch_ahead_of(dy, i, CFBN_BF16), prefetch_ahead_of(x, i, CFBN_BF16);
                vf_ld_eo(dy, i, &ge0, &go0);
                vf_ld_eo(x, i, &xe0, &xo0);
                vf_ld_eo(dy, i + 16, &ge1, &go1);
                vf_ld_eo(x, i + 16, &xe1, &xo1);
                vh_narrow_eo2(gapply_eo_ps(ge0, xe0, g, 0), gapply_eo_ps(go0, xo0, g, 8),
                            gapply_eo_ps(ge1, xe1, g + 80, 0), gapply_eo_ps(go1, xo1, g + 80, 8), &h0, &h1);
                st32_eo_seq(dx, i, h0, h1, nt, half, &prev);
            }
            continue;
        }
        for (int64_t i = o; i < o + w; i += 16, g += 80) {
            vf ge, go, xe, xo;
            if (nt && !(i & 31)) prefetch_ahead_of(dy, i, CFBN_BF16), prefetch_ahead_of(x, i, CFBN_BF16);
            vf_ld_eo(dy, i, &ge, &go);
            vf_ld_eo(x, i, &xe, &xo);
            xe = gapply_eo_ps(ge, xe, g, 0);
            xo = gapply_eo_ps(go, xo, g, 8);
            if (nt) vh_stream_seq(dx, i, vh_narrow_eo(xe, xo), half, &prev);
            else vf_st_eo(dx, i, xe, xo);
        }
    }
    if (nt) vh_stream_seq_end(dx, rows * w, half, prev);
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
    const vd mag = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffll));
    vd t = vd_add(_mm256_and_pd(s2, mag), vd_sub(s1, s1));
    return _mm256_or_pd(_mm256_cmp_pd(t, tiny, _CMP_NGE_UQ), _mm256_cmp_pd(t, vd_set1(DBL_MAX), _CMP_GT_OQ));
}

/* Whether any of w columns (a multiple of 4), with sums acc[j] and
 * acc[w + j] of count elements, fails the quick tests: one pass of vector
 * compares, after which only such columns are looked at one by one. */
INLINE int any_suspect(const double *acc, int64_t w, double count)
{
    vd tiny = vd_set1(count * TINY_SUM), bad = vd_zero();
    for (int64_t j = 0; j < w; j += 4)
        bad = _mm256_or_pd(bad, suspect_pd(vd_load(acc + j), vd_load(acc + w + j), tiny));
    return _mm256_movemask_pd(bad);
}

INLINE float ld1(const void *p, int64_t i, int dt)
{
    if (dt == CFBN_BF16) return cfbn_bf16_to_float(((const uint16_t *)p)[i]);
    return dt ? _cvtsh_ss(((const uint16_t *)p)[i]) : ((const float *)p)[i];
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

/* ---- float-compute flat streams: 8-element blocks with an even index use the
 * first parameter set, odd blocks the second ---- */

/* sh: shift lanes lo, hi of even blocks, then of odd blocks */
INLINE void stats_flat_ps(const void *x, int64_t n, const vd *sh, int dt, acc8 *ea, acc8 *oa)
{
    acc8 a = acc8_zero(), b = acc8_zero();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        prefetch_ahead_of(x, i, dt);
        stats_step(&a, vd_ld_widen(x, i, dt), vd_ld_widen(x, i + 4, dt), sh[0], sh[1]);
        stats_step(&b, vd_ld_widen(x, i + 8, dt), vd_ld_widen(x, i + 12, dt), sh[2], sh[3]);
    }
    int odd = 0;
    if (i + 8 <= n) {
        stats_step(&a, vd_ld_widen(x, i, dt), vd_ld_widen(x, i + 4, dt), sh[0], sh[1]);
        i += 8;
        odd = 1;
    }
    if (i < n) {
        int64_t cnt = n - i;
        vf v = vf_ld_part(x, i, cnt, cnt, dt);
        __m256i mlo = vd_mask_first(cnt), mhi = vd_mask_first(cnt - 4);
        /* dead lanes: x reads as 0 and the shift is masked to 0, so d = 0 */
        if (odd)
            stats_step(&b, vf_lo_pd(v), vf_hi_pd(v), vd_keep(sh[2], mlo), vd_keep(sh[3], mhi));
        else
            stats_step(&a, vf_lo_pd(v), vf_hi_pd(v), vd_keep(sh[0], mlo), vd_keep(sh[1], mhi));
    }
    *ea = a;
    *oa = b;
}

/* Adds the sums of 8 vectors (g[k], u[k]) to a: the vectors are summed
 * pairwise in float first, as the rows kernels do, and the result is
 * widened once.  u = x - mhi (exact near the mean); the mlo part of the mean
 * comes off in double, as sum g (x - mhi) - mlo sum g, which is more
 * accurate than subtracting it from every element and takes one float
 * subtraction less per element. */
INLINE void gstats_tree_step(acc8 *a, const vf *g, const vf *u, vf mlo)
{
    vf t1 = tree8(g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]), t2 = dot_tree8(g, u);
    vd t1lo = vf_lo_pd(t1), t1hi = vf_hi_pd(t1);
    a->s1lo = vd_add(a->s1lo, t1lo);
    a->s1hi = vd_add(a->s1hi, t1hi);
    a->s2lo = vd_fnma(vf_lo_pd(mlo), t1lo, vd_add(a->s2lo, vf_lo_pd(t2)));
    a->s2hi = vd_fnma(vf_hi_pd(mlo), t1hi, vd_add(a->s2hi, vf_hi_pd(t2)));
}

/* m: mhi, mlo of even blocks, then of odd blocks.  tree: sum blocks of 8
 * vectors in float first (the fast way); 0 forms every product and sum in
 * double (for sums that left float's range, see needs_double). */
INLINE void gstats_flat_ps(const void *dy, const void *x, int64_t n, const vf *m, int dt, int tree,
                           acc8 *ea, acc8 *oa)
{
    acc8 a = acc8_zero(), b = acc8_zero();
    int64_t i = 0;
    for (; tree && i + 128 <= n; i += 128) {
        vf g[8], d[8];
        for (int k = 0; k < 8; k++) {
            prefetch_ahead_of(dy, i + 16 * k, dt);
            prefetch_ahead_of(x, i + 16 * k, dt);
            g[k] = vf_ld(dy, i + 16 * k, dt);
            d[k] = sub_ps(vf_ld(x, i + 16 * k, dt), m[0]);
        }
        gstats_tree_step(&a, g, d, m[1]);
        for (int k = 0; k < 8; k++) {
            g[k] = vf_ld(dy, i + 16 * k + 8, dt);
            d[k] = sub_ps(vf_ld(x, i + 16 * k + 8, dt), m[2]);
        }
        gstats_tree_step(&b, g, d, m[3]);
    }
    for (; i + 16 <= n; i += 16) {
        gstats_step(&a, vf_ld(dy, i, dt), centered_ps(vf_ld(x, i, dt), m[0], m[1]));
        gstats_step(&b, vf_ld(dy, i + 8, dt), centered_ps(vf_ld(x, i + 8, dt), m[2], m[3]));
    }
    int odd = 0;
    if (i + 8 <= n) {
        gstats_step(&a, vf_ld(dy, i, dt), centered_ps(vf_ld(x, i, dt), m[0], m[1]));
        i += 8;
        odd = 1;
    }
    if (i < n) {
        int64_t cnt = n - i;
        __m256i mk = vf_mask_first(cnt);
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

/* p: mhi, mlo, alpha, beta of even blocks, then of odd blocks */
INLINE void apply_flat_ps(const void *x, void *y, int64_t n, const vf *p, int dt)
{
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        vf v0 = vf_ld(x, i, dt), v1 = vf_ld(x, i + 8, dt);
        vf v2 = vf_ld(x, i + 16, dt), v3 = vf_ld(x, i + 24, dt);
        vf_st2(y, i, apply_ps(v0, p[0], p[1], p[2], p[3]), apply_ps(v1, p[4], p[5], p[6], p[7]), dt);
        vf_st2(y, i + 16, apply_ps(v2, p[0], p[1], p[2], p[3]), apply_ps(v3, p[4], p[5], p[6], p[7]), dt);
    }
    for (; i + 8 <= n; i += 8) {
        const vf *q = p + 4 * ((i >> 3) & 1);
        vf_st(y, i, apply_ps(vf_ld(x, i, dt), q[0], q[1], q[2], q[3]), dt);
    }
    if (i < n) {
        const vf *q = p + 4 * ((i >> 3) & 1);
        vf_st_part(y, i, apply_ps(vf_ld_part(x, i, n - i, n - i, dt), q[0], q[1], q[2], q[3]), n - i, dt);
    }
}

/* p: mhi, mlo, a, b, c of even blocks, then of odd blocks */
INLINE void gapply_flat_ps(const void *dy, const void *x, void *dx, int64_t n, const vf *p, int dt)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        vf g0 = vf_ld(dy, i, dt), g1 = vf_ld(dy, i + 8, dt);
        vf v0 = vf_ld(x, i, dt), v1 = vf_ld(x, i + 8, dt);
        vf_st2(dx, i, gapply_ps(g0, v0, p[0], p[1], p[2], p[3], p[4]), gapply_ps(g1, v1, p[5], p[6], p[7], p[8], p[9]),
             dt);
    }
    if (i + 8 <= n) {
        vf_st(dx, i, gapply_ps(vf_ld(dy, i, dt), vf_ld(x, i, dt), p[0], p[1], p[2], p[3], p[4]), dt);
        i += 8;
    }
    if (i < n) {
        const vf *q = p + 5 * ((i >> 3) & 1);
        int64_t cnt = n - i;
        vf g = vf_ld_part(dy, i, cnt, cnt, dt), v = vf_ld_part(x, i, cnt, cnt, dt);
        vf_st_part(dx, i, gapply_ps(g, v, q[0], q[1], q[2], q[3], q[4]), cnt, dt);
    }
}

/* Per-lane parameter vectors for a width w that divides 16: lane l of the
 * flat stream belongs to column l % w. */
INLINE void lanes_ps(const float *v, int64_t w, vf *even, vf *odd)
{
    float t[16];
    for (int l = 0; l < 16; l++) t[l] = v[l % w];
    *even = vf_load(t);
    *odd = vf_load(t + 8);
}

/* ---- float-compute kernel bodies (f32, f16, bf16 storage) ---- */

/* Adds the sums and the sums of squares of 8 vectors d, pairwise in float,
 * to a (widened once) */
INLINE void stats_block_add(acc8 *a, const vf *d)
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
    acc8 a, b;
    stats_flat_ps(x, n, sh, dt, &a, &b);
    acc[0] = vd_hsum(vd_add(vd_add(a.s1lo, a.s1hi), vd_add(b.s1lo, b.s1hi)));
    acc[1] = vd_hsum(vd_add(vd_add(a.s2lo, a.s2hi), vd_add(b.s2lo, b.s2hi)));
}

/* 2-byte runs, whose widening to double would cost more than reading them:
 * blocks of 64 elements (8 vectors; bfloat16 by vf_ld_eo) summed pairwise
 * in float from k, the shift rounded to float, as the rows kernels sum
 * blocks of 8 rows, each block's sums widened once.  The elements after the
 * blocks are summed in double from k; then the rounding of k is put back
 * exactly, as in stats_rows8_ps, and a run whose float sums need double
 * (needs_double) is summed again in double.  Float32 runs stay in double
 * throughout: widening costs less than their reading. */
INLINE void stats_run_ps(const void *x, int64_t n, double shift, double *acc, int dt)
{
    if (dt == CFBN_F32 || n < 64) {
        stats_run_pd(x, n, shift, acc, dt);
        return;
    }
    const float kf = (float)shift;
    const vf k = vf_set1(kf);
    acc8 a = acc8_zero();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        prefetch_ahead_of(x, i, dt);
        prefetch_ahead_of(x, i + 32, dt);
        vf d[8];
        if (dt == CFBN_BF16) {
            for (int r = 0; r < 4; r++) vf_ld_eo(x, i + 16 * r, &d[2 * r], &d[2 * r + 1]);
        } else {
            for (int r = 0; r < 8; r++) d[r] = vf_ld(x, i + 8 * r, dt);
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

/* ---- rows whose width is a multiple of 8: blocks of 8 rows summed in float ----
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
    return _mm256_set_m128(_mm256_cvtpd_ps(vd_load(shift + 4)), _mm256_cvtpd_ps(vd_load(shift)));
}

/* Blocks of 8 rows are walked in memory order, and acc (2 w doubles, which
 * stay in L1) takes each block's sums.  Loads of a block come from 8 rows at
 * once, a pattern the hardware prefetchers follow poorly from DRAM, so each
 * column group also prefetches its share of the lines PREFETCH_BYTES ahead
 * in every array it reads: 8 rows x 8 columns, that is 64 elements. */
#define PREFETCH_BYTES 4096

INLINE void prefetch_group(const void *base, int64_t o, int64_t j, size_t es)
{
    const char *q = (const char *)base + (size_t)o * es + PREFETCH_BYTES + (size_t)j * 8 * es;
    for (size_t b = 0; b < 64 * es; b += 64) _mm_prefetch(q + b, _MM_HINT_T0);
}

/* The same into L2 only, for the gradient sums, which read two arrays: with
 * both prefetched into L1 the fills crowd out the lines in use (measured on
 * (64,112,112,64): 20% faster from DRAM, 5-15% from L3, where the
 * one-array statistics are faster with the L1 prefetch). */
INLINE void prefetch_group_l2(const void *base, int64_t o, int64_t j, size_t es)
{
    const char *q = (const char *)base + (size_t)o * es + PREFETCH_BYTES + (size_t)j * 8 * es;
    for (size_t b = 0; b < 64 * es; b += 64) _mm_prefetch(q + b, _MM_HINT_T1);
}

INLINE void add_block(double *acc, int64_t w, int64_t j, vf t1, vf t2)
{
    vd_store(acc + j, vd_add(vd_load(acc + j), vf_lo_pd(t1)));
    vd_store(acc + j + 4, vd_add(vd_load(acc + j + 4), vf_hi_pd(t1)));
    vd_store(acc + w + j, vd_add(vd_load(acc + w + j), vf_lo_pd(t2)));
    vd_store(acc + w + j + 4, vd_add(vd_load(acc + w + j + 4), vf_hi_pd(t2)));
}

/* add_block for gradient sums of products with u = x - mhi: the second
 * sums take mlo times the first off in double */
INLINE void add_block_mlo(double *acc, int64_t w, int64_t j, vf t1, vf t2, vf mlo)
{
    vd t1lo = vf_lo_pd(t1), t1hi = vf_hi_pd(t1);
    vd_store(acc + j, vd_add(vd_load(acc + j), t1lo));
    vd_store(acc + j + 4, vd_add(vd_load(acc + j + 4), t1hi));
    vd_store(acc + w + j, vd_fnma(vf_lo_pd(mlo), t1lo,
                                                   vd_add(vd_load(acc + w + j), vf_lo_pd(t2))));
    vd_store(acc + w + j + 4, vd_fnma(vf_hi_pd(mlo), t1hi,
                                                       vd_add(vd_load(acc + w + j + 4), vf_hi_pd(t2))));
}

INLINE void stats_rows8_ps(const void *x, int64_t rows, int64_t w, const double *shift, double *acc, int dt)
{
    memset(acc, 0, (size_t)(2 * w) * sizeof *acc);
    const size_t es = dt ? 2 : 4;
    /* the shifts rounded to float once per call where they fit */
    float kf[SHIFT_BUF];
    const int have_kf = w <= SHIFT_BUF;
    if (have_kf)
        for (int64_t j = 0; j < w; j += 8) vf_store(kf + j, shift_ps(shift + j));
    int64_t r = 0;
    for (; r + 8 <= rows; r += 8) {
        const int64_t o = r * w;
        for (int64_t j = 0; j < w; j += 8) {
            prefetch_group(x, o, j, es);
            vf k = have_kf ? vf_load(kf + j) : shift_ps(shift + j);
            vf d[8];
            for (int i = 0; i < 8; i++) d[i] = sub_ps(vf_ld(x, o + i * w + j, dt), k);
            add_block(acc, w, j, tree8(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]),
                      sq_tree8(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]));
        }
    }
    for (; r < rows; r++) {
        for (int64_t j = 0; j < w; j += 8) {
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
    for (int64_t j = 0; j < w; j += 4) {
        vd sh = vd_load(shift + j);
        vd e = vd_sub(_mm256_cvtps_pd(_mm256_cvtpd_ps(sh)), sh);
        vd s1 = vd_load(acc + j), s2 = vd_load(acc + w + j);
        vd ne = vd_mul(vn, e);
        s2 = vd_add(s2, vd_mul(e, vd_add(vd_mul(two, s1), ne)));
        s1 = vd_add(s1, ne);
        vd_store(acc + j, s1);
        vd_store(acc + w + j, s2);
        bad = _mm256_or_pd(bad, suspect_pd(s1, s2, tiny));
    }
    if (_mm256_movemask_pd(bad)) {
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
        for (int64_t j = 0; j < w; j += 8, bd += 8 * es, bx += 8 * es) {
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
        for (int64_t j = 0; j < w; j += 8) {
            vf m = vf_load(p->mhi + j), l = vf_load(p->mlo + j);
            vf g = vf_ld(dy, r * w + j, dt);
            add_block(acc, w, j, g, vf_mul(g, centered_ps(vf_ld(x, r * w + j, dt), m, l)));
        }
    }
    if (any_suspect(acc, w, (double)rows)) gstats_redo_columns(dy, x, rows, w, p, acc, dt);
}

INLINE void stats_rows_ps(const void *x, int64_t rows, int64_t w, const double *shift, double *acc, int dt)
{
    if (w <= 0) return;
    if (w % 8 == 0 && w > 16) {
        stats_rows8_ps(x, rows, w, shift, acc, dt);
        return;
    }
    if (16 % w == 0) {
        double t[16], s1[16], s2[16];
        for (int l = 0; l < 16; l++) t[l] = shift[l % w];
        const vd sh[4] = {vd_load(t), vd_load(t + 4), vd_load(t + 8), vd_load(t + 12)};
        acc8 a, b;
        stats_flat_ps(x, rows * w, sh, dt, &a, &b);
        acc8_store(&a, s1, s2);
        acc8_store(&b, s1 + 8, s2 + 8);
        fold_lanes(s1, 16, w, acc);
        fold_lanes(s2, 16, w, acc + w);
        return;
    }
    /* Full 8-column blocks accumulate in acc (L1-resident, two rows per
     * load/store); the partial block sits at the same columns in every row,
     * so its sums stay in registers. */
    const int64_t full = w & ~(int64_t)7, cnt = w - full, n = rows * w;
    memset(acc, 0, (size_t)(2 * w) * sizeof *acc);
    acc8 t = acc8_zero();
    vd tlo = vd_zero(), thi = vd_zero();
    if (cnt > 0) tlo = vd_load_part(shift + full, vd_mask_first(cnt));
    if (cnt > 4) thi = vd_load_part(shift + full + 4, vd_mask_first(cnt - 4));
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2) {
        const int64_t o0 = r * w, o1 = o0 + w;
        for (int64_t j = 0; j < full; j += 8) {
            acc8 c = acc8_load(acc + j, acc + w + j);
            vd slo = vd_load(shift + j), shi = vd_load(shift + j + 4);
            stats_step(&c, vd_ld_widen(x, o0 + j, dt), vd_ld_widen(x, o0 + j + 4, dt), slo, shi);
            stats_step(&c, vd_ld_widen(x, o1 + j, dt), vd_ld_widen(x, o1 + j + 4, dt), slo, shi);
            acc8_store(&c, acc + j, acc + w + j);
        }
        if (cnt) {
            vf v0 = vf_ld_part(x, o0 + full, cnt, n - o0 - full, dt);
            vf v1 = vf_ld_part(x, o1 + full, cnt, n - o1 - full, dt);
            stats_step(&t, vf_lo_pd(v0), vf_hi_pd(v0), tlo, thi);
            stats_step(&t, vf_lo_pd(v1), vf_hi_pd(v1), tlo, thi);
        }
    }
    if (r < rows) {
        const int64_t o0 = r * w;
        for (int64_t j = 0; j < full; j += 8) {
            acc8 c = acc8_load(acc + j, acc + w + j);
            stats_step(&c, vd_ld_widen(x, o0 + j, dt), vd_ld_widen(x, o0 + j + 4, dt),
                       vd_load(shift + j), vd_load(shift + j + 4));
            acc8_store(&c, acc + j, acc + w + j);
        }
        if (cnt) {
            vf v0 = vf_ld_part(x, o0 + full, cnt, n - o0 - full, dt);
            stats_step(&t, vf_lo_pd(v0), vf_hi_pd(v0), tlo, thi);
        }
    }
    if (cnt) acc8_store_part(&t, acc + full, acc + w + full, cnt);
}

/* A run: q as apply_flat_ps's, both sets the same.  bfloat16 goes 16
 * elements at a time through vf_ld_eo and vf_st_eo.  A run of 16 or more
 * that 16 does not divide ends with whole vectors over its last 16
 * elements instead of a masked tail: loaded before any store (y may be x)
 * and stored last, so the elements they share with the body are written
 * twice with the same values.  Elementwise, so the outputs are those of
 * apply_flat_ps. */
INLINE void apply_uni_ps(const void *x, void *y, int64_t n, const vf *q, int dt)
{
    if (n < 16) {
        apply_flat_ps(x, y, n, q, dt);
        return;
    }
    const int64_t body = n & ~(int64_t)15;
    vf t0 = vf_zero(), t1 = t0;
    if (body < n) {
        if (dt == CFBN_BF16) vf_ld_eo(x, n - 16, &t0, &t1);
        else t0 = vf_ld(x, n - 16, dt), t1 = vf_ld(x, n - 8, dt);
    }
    if (dt == CFBN_BF16) {
        for (int64_t i = 0; i < body; i += 16) {
            vf e, o;
            vf_ld_eo(x, i, &e, &o);
            vf_st_eo(y, i, apply_ps(e, q[0], q[1], q[2], q[3]), apply_ps(o, q[0], q[1], q[2], q[3]));
        }
    } else {
        apply_flat_ps(x, y, body, q, dt);
    }
    if (body < n) {
        t0 = apply_ps(t0, q[0], q[1], q[2], q[3]);
        t1 = apply_ps(t1, q[0], q[1], q[2], q[3]);
        if (dt == CFBN_BF16) vf_st_eo(y, n - 16, t0, t1);
        else vf_st2(y, n - 16, t0, t1, dt);
    }
}

INLINE void apply_run_ps(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p, int dt)
{
    vf m = vf_set1(p->mhi[0]), l = vf_set1(p->mlo[0]);
    vf a = vf_set1(p->alpha[0]), b = vf_set1(p->beta[0]);
    const vf q[8] = {m, l, a, b, m, l, a, b};
    apply_uni_ps(x, y, n, q, dt);
}

INLINE void apply_rows_ps(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f32 *p, int dt)
{
    if (w <= 0) return;
    if (16 % w == 0) {
        vf q[8];
        lanes_ps(p->mhi, w, &q[0], &q[4]);
        lanes_ps(p->mlo, w, &q[1], &q[5]);
        lanes_ps(p->alpha, w, &q[2], &q[6]);
        lanes_ps(p->beta, w, &q[3], &q[7]);
        apply_flat_ps(x, y, rows * w, q, dt);
        return;
    }
    if (eo_rows(dt, w)) {
        apply_rows_eo(x, y, rows, w, p, 0);
        return;
    }
    const int64_t full = w & ~(int64_t)7, cnt = w - full, n = rows * w;
    vf tm = vf_zero(), tl = tm, ta = tm, tb = tm;
    if (cnt) {
        __m256i mk = vf_mask_first(cnt);
        tm = vf_load_part(p->mhi + full, mk);
        tl = vf_load_part(p->mlo + full, mk);
        ta = vf_load_part(p->alpha + full, mk);
        tb = vf_load_part(p->beta + full, mk);
    }
    int64_t r = 0;
    for (; r < rows; r++) {
        const int64_t o = r * w;
        for (int64_t j = 0; j < full; j += 8) {
            vf v = apply_ps(vf_ld(x, o + j, dt), vf_load(p->mhi + j), vf_load(p->mlo + j),
                                vf_load(p->alpha + j), vf_load(p->beta + j));
            vf_st(y, o + j, v, dt);
        }
        if (cnt) {
            vf v = vf_ld_part(x, o + full, cnt, n - o - full, dt);
            vf_st_part(y, o + full, apply_ps(v, tm, tl, ta, tb), cnt, dt);
        }
    }
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
        acc8 a, b;
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
    acc8 a, b;
    gstats_flat_ps(dy, x, n, q, dt, 1, &a, &b);
    acc[0] = vd_hsum(vd_add(vd_add(a.s1lo, a.s1hi), vd_add(b.s1lo, b.s1hi)));
    acc[1] = vd_hsum(vd_add(vd_add(a.s2lo, a.s2hi), vd_add(b.s2lo, b.s2hi)));
    if (n >= 128 && run_needs_double(acc, n, p)) gstats_runs_pd(dy, x, n, 1, 0, p, acc, dt);
}

INLINE void gstats_rows_ps(const void *dy, const void *x, int64_t rows, int64_t w, const cfbn_grad_f32 *p,
                           double *acc, int dt)
{
    if (w <= 0) return;
    if (w % 8 == 0 && w > 16) {
        gstats_rows8_ps(dy, x, rows, w, p, acc, dt);
        return;
    }
    if (16 % w == 0) {
        vf q[4];
        double s1[16], s2[16];
        lanes_ps(p->mhi, w, &q[0], &q[2]);
        lanes_ps(p->mlo, w, &q[1], &q[3]);
        acc8 a, b;
        gstats_flat_ps(dy, x, rows * w, q, dt, 1, &a, &b);
        acc8_store(&a, s1, s2);
        acc8_store(&b, s1 + 8, s2 + 8);
        fold_lanes(s1, 16, w, acc);
        fold_lanes(s2, 16, w, acc + w);
        if (rows * w >= 128) gstats_redo_columns(dy, x, rows, w, p, acc, dt);
        return;
    }
    const int64_t full = w & ~(int64_t)7, cnt = w - full, n = rows * w;
    memset(acc, 0, (size_t)(2 * w) * sizeof *acc);
    acc8 t = acc8_zero();
    vf tm = vf_zero(), tl = tm;
    if (cnt) {
        __m256i mk = vf_mask_first(cnt);
        tm = vf_load_part(p->mhi + full, mk);
        tl = vf_load_part(p->mlo + full, mk);
    }
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2) {
        const int64_t o0 = r * w, o1 = o0 + w;
        for (int64_t j = 0; j < full; j += 8) {
            acc8 c = acc8_load(acc + j, acc + w + j);
            vf m = vf_load(p->mhi + j), l = vf_load(p->mlo + j);
            gstats_step(&c, vf_ld(dy, o0 + j, dt), centered_ps(vf_ld(x, o0 + j, dt), m, l));
            gstats_step(&c, vf_ld(dy, o1 + j, dt), centered_ps(vf_ld(x, o1 + j, dt), m, l));
            acc8_store(&c, acc + j, acc + w + j);
        }
        if (cnt) {
            gstats_step(&t, vf_ld_part(dy, o0 + full, cnt, n - o0 - full, dt),
                        centered_ps(vf_ld_part(x, o0 + full, cnt, n - o0 - full, dt), tm, tl));
            gstats_step(&t, vf_ld_part(dy, o1 + full, cnt, n - o1 - full, dt),
                        centered_ps(vf_ld_part(x, o1 + full, cnt, n - o1 - full, dt), tm, tl));
        }
    }
    if (r < rows) {
        const int64_t o0 = r * w;
        for (int64_t j = 0; j < full; j += 8) {
            acc8 c = acc8_load(acc + j, acc + w + j);
            vf m = vf_load(p->mhi + j), l = vf_load(p->mlo + j);
            gstats_step(&c, vf_ld(dy, o0 + j, dt), centered_ps(vf_ld(x, o0 + j, dt), m, l));
            acc8_store(&c, acc + j, acc + w + j);
        }
        if (cnt) {
            gstats_step(&t, vf_ld_part(dy, o0 + full, cnt, n - o0 - full, dt),
                        centered_ps(vf_ld_part(x, o0 + full, cnt, n - o0 - full, dt), tm, tl));
        }
    }
    if (cnt) acc8_store_part(&t, acc + full, acc + w + full, cnt);
}

/* A run, as apply_uni_ps: q as gapply_flat_ps's, both sets the same */
INLINE void gapply_uni_ps(const void *dy, const void *x, void *dx, int64_t n, const vf *q, int dt)
{
    if (n < 16) {
        gapply_flat_ps(dy, x, dx, n, q, dt);
        return;
    }
    const int64_t body = n & ~(int64_t)15;
    vf g0 = vf_zero(), g1 = g0, v0 = g0, v1 = g0;
    if (body < n) {
        if (dt == CFBN_BF16) {
            vf_ld_eo(dy, n - 16, &g0, &g1);
            vf_ld_eo(x, n - 16, &v0, &v1);
        } else {
            g0 = vf_ld(dy, n - 16, dt), g1 = vf_ld(dy, n - 8, dt);
            v0 = vf_ld(x, n - 16, dt), v1 = vf_ld(x, n - 8, dt);
        }
    }
    if (dt == CFBN_BF16) {
        for (int64_t i = 0; i < body; i += 16) {
            vf ge, go, xe, xo;
            vf_ld_eo(dy, i, &ge, &go);
            vf_ld_eo(x, i, &xe, &xo);
            vf_st_eo(dx, i, gapply_ps(ge, xe, q[0], q[1], q[2], q[3], q[4]),
                    gapply_ps(go, xo, q[0], q[1], q[2], q[3], q[4]));
        }
    } else {
        gapply_flat_ps(dy, x, dx, body, q, dt);
    }
    if (body < n) {
        vf r0 = gapply_ps(g0, v0, q[0], q[1], q[2], q[3], q[4]), r1 = gapply_ps(g1, v1, q[0], q[1], q[2], q[3], q[4]);
        if (dt == CFBN_BF16) vf_st_eo(dx, n - 16, r0, r1);
        else vf_st2(dx, n - 16, r0, r1, dt);
    }
}

INLINE void gapply_run_ps(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f32 *p, int dt)
{
    vf m = vf_set1(p->mhi[0]), l = vf_set1(p->mlo[0]);
    vf a = vf_set1(p->a[0]), b = vf_set1(p->b[0]), c = vf_set1(p->c[0]);
    const vf q[10] = {m, l, a, b, c, m, l, a, b, c};
    gapply_uni_ps(dy, x, dx, n, q, dt);
}

INLINE void gapply_rows_ps(const void *dy, const void *x, void *dx, int64_t rows, int64_t w, const cfbn_grad_f32 *p,
                           int dt)
{
    if (w <= 0) return;
    if (16 % w == 0) {
        vf q[10];
        lanes_ps(p->mhi, w, &q[0], &q[5]);
        lanes_ps(p->mlo, w, &q[1], &q[6]);
        lanes_ps(p->a, w, &q[2], &q[7]);
        lanes_ps(p->b, w, &q[3], &q[8]);
        lanes_ps(p->c, w, &q[4], &q[9]);
        gapply_flat_ps(dy, x, dx, rows * w, q, dt);
        return;
    }
    if (eo_rows(dt, w)) {
        gapply_rows_eo(dy, x, dx, rows, w, p, 0);
        return;
    }
    const int64_t full = w & ~(int64_t)7, cnt = w - full, n = rows * w;
    vf tm = vf_zero(), tl = tm, ta = tm, tb = tm, tc = tm;
    if (cnt) {
        __m256i mk = vf_mask_first(cnt);
        tm = vf_load_part(p->mhi + full, mk);
        tl = vf_load_part(p->mlo + full, mk);
        ta = vf_load_part(p->a + full, mk);
        tb = vf_load_part(p->b + full, mk);
        tc = vf_load_part(p->c + full, mk);
    }
    int64_t r = 0;
    for (; r < rows; r++) {
        const int64_t o = r * w;
        for (int64_t j = 0; j < full; j += 8) {
            vf v = gapply_ps(vf_ld(dy, o + j, dt), vf_ld(x, o + j, dt), vf_load(p->mhi + j),
                                 vf_load(p->mlo + j), vf_load(p->a + j), vf_load(p->b + j),
                                 vf_load(p->c + j));
            vf_st(dx, o + j, v, dt);
        }
        if (cnt) {
            vf g = vf_ld_part(dy, o + full, cnt, n - o - full, dt);
            vf v = vf_ld_part(x, o + full, cnt, n - o - full, dt);
            vf_st_part(dx, o + full, gapply_ps(g, v, tm, tl, ta, tb, tc), cnt, dt);
        }
    }
}

/* ---- non-temporal stores (f32, f16, bf16 storage) ----
 * For outputs far larger than the caches: a streaming store writes the line
 * without reading it first (no read-for-ownership), a third of a pass's
 * memory traffic.  16-byte stores, because large NumPy buffers are only
 * 16-byte aligned (8 halfwords, or 4 floats twice); the sfence orders them
 * before the caller's barrier. */

INLINE void vf_st_nt(void *p, int64_t i, vf v, int dt)
{
    if (dt) {
        _mm_stream_si128((__m128i *)((uint16_t *)p + i), narrow_ph(v, dt));
        return;
    }
    float *q = (float *)p + i;
    _mm_stream_ps(q, _mm256_castps256_ps128(v));
    _mm_stream_ps(q + 4, _mm256_extractf128_ps(v, 1));
}

/* 8 floats at p + i, 32-byte aligned, non-temporal: one store */
INLINE void vf_stream_aligned(float *p, int64_t i, vf v)
{
    _mm256_stream_ps(p + i, v);
}

/* elements before p reaches 16-byte alignment (p is element-aligned) */
INLINE int64_t peel16(const void *p, int64_t n, int dt)
{
    int64_t k = (int64_t)((16 - ((uintptr_t)p & 15)) & 15) / (dt ? 2 : 4);
    return k < n ? k : n;
}

/* The streaming run and rows loops store 32 bytes at a time (float: where
 * the output is 32-byte aligned after the 16-byte peel; bfloat16: 32
 * elements a step, one NaN test and one prefetch a line), not two 16-byte
 * halves: the core then keeps up with the memory bus better.  Float outputs
 * 16 bytes past 32-byte alignment keep the 16-byte stores: peeling them
 * further (a masked store at each run's start) made the same forward 11%
 * slower.  Measured through the driver, 2 threads, means of
 * interleaved rounds: (64,64,112,112) NCHW training forward, bfloat16
 * 10.70 -> 8.89 ms, float32 17.1 -> 15.5 ms; (64,112,112,64) NHWC bfloat16
 * 11.6 -> 10.8 and 14.6 -> 12.5 ms in two sets. */
INLINE void apply_run_nt_ps(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p, int dt)
{
    vf m = vf_set1(p->mhi[0]), l = vf_set1(p->mlo[0]);
    vf a = vf_set1(p->alpha[0]), b = vf_set1(p->beta[0]);
    int64_t i = peel16(y, n, dt);
    if (i) vf_st_part(y, 0, apply_ps(vf_ld_part(x, 0, i, n, dt), m, l, a, b), i, dt);
    if (!dt && !((uintptr_t)elem_at(y, i, dt) & 31))
        for (; i + 8 <= n; i += 8) vf_stream_aligned((float *)y, i, apply_ps(vf_ld(x, i, dt), m, l, a, b));
    if (dt == CFBN_BF16 && i + 8 <= n && ((uintptr_t)elem_at(y, i, dt) & 31)) {
        vf_st_nt(y, i, apply_ps(vf_ld(x, i, dt), m, l, a, b), dt);
        i += 8;
    }
    for (; dt == CFBN_BF16 && i + 32 <= n; i += 32) {
        vf e0, o0, e1, o1;
        prefetch_ahead_of(x, i, CFBN_BF16);
        vf_ld_eo(x, i, &e0, &o0);
        vf_ld_eo(x, i + 16, &e1, &o1);
        vf_st_eo2_nt(y, i, apply_ps(e0, m, l, a, b), apply_ps(o0, m, l, a, b), apply_ps(e1, m, l, a, b),
                   apply_ps(o1, m, l, a, b));
    }
    for (; i + 16 <= n; i += 16) {
        vf v0 = vf_ld(x, i, dt), v1 = vf_ld(x, i + 8, dt);
        vf_st_nt(y, i, apply_ps(v0, m, l, a, b), dt);
        vf_st_nt(y, i + 8, apply_ps(v1, m, l, a, b), dt);
    }
    for (; i + 8 <= n; i += 8) vf_st_nt(y, i, apply_ps(vf_ld(x, i, dt), m, l, a, b), dt);
    if (i < n) vf_st_part(y, i, apply_ps(vf_ld_part(x, i, n - i, n - i, dt), m, l, a, b), n - i, dt);
    stream_fence();
}

/* rows of w starting 16-byte aligned, w a multiple of 16 bytes
 * (rows_stream_ok in bn_route.c) */
INLINE void apply_rows_nt_ps(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f32 *p, int dt)
{
    if (eo_rows(dt, w)) {
        apply_rows_eo(x, y, rows, w, p, 1);
        stream_fence();
        return;
    }
    const int64_t full = w & ~(int64_t)7, cnt = w - full;
    vf tm = vf_zero(), tl = tm, ta = tm, tb = tm;
    if (cnt) {
        __m256i mk = vf_mask_first(cnt);
        tm = vf_load_part(p->mhi + full, mk);
        tl = vf_load_part(p->mlo + full, mk);
        ta = vf_load_part(p->alpha + full, mk);
        tb = vf_load_part(p->beta + full, mk);
    }
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = r * w;
        for (int64_t j = 0; j < full; j += 8) {
            vf_st_nt(y, o + j, apply_ps(vf_ld(x, o + j, dt), vf_load(p->mhi + j), vf_load(p->mlo + j),
                                      vf_load(p->alpha + j), vf_load(p->beta + j)), dt);
        }
        if (cnt) vf_st_part(y, o + full, apply_ps(vf_ld_part(x, o + full, cnt, cnt, dt), tm, tl, ta, tb), cnt, dt);
    }
    stream_fence();
}

INLINE void gapply_run_nt_ps(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f32 *p, int dt)
{
    vf m = vf_set1(p->mhi[0]), l = vf_set1(p->mlo[0]);
    vf a = vf_set1(p->a[0]), b = vf_set1(p->b[0]), c = vf_set1(p->c[0]);
    int64_t i = peel16(dx, n, dt);
    if (i) vf_st_part(dx, 0, gapply_ps(vf_ld_part(dy, 0, i, n, dt), vf_ld_part(x, 0, i, n, dt), m, l, a, b, c), i, dt);
    if (!dt && !((uintptr_t)elem_at(dx, i, dt) & 31))
        for (; i + 8 <= n; i += 8)
            vf_stream_aligned((float *)dx, i, gapply_ps(vf_ld(dy, i, dt), vf_ld(x, i, dt), m, l, a, b, c));
    if (dt == CFBN_BF16 && i + 8 <= n && ((uintptr_t)elem_at(dx, i, dt) & 31)) {
        vf_st_nt(dx, i, gapply_ps(vf_ld(dy, i, dt), vf_ld(x, i, dt), m, l, a, b, c), dt);
        i += 8;
    }
    for (; dt == CFBN_BF16 && i + 32 <= n; i += 32) {
        vf ge0, go0, xe0, xo0, ge1, go1, xe1, xo1;
        prefetch_ahead_of(dy, i, CFBN_BF16), prefetch_ahead_of(x, i, CFBN_BF16);
        vf_ld_eo(dy, i, &ge0, &go0);
        vf_ld_eo(x, i, &xe0, &xo0);
        vf_ld_eo(dy, i + 16, &ge1, &go1);
        vf_ld_eo(x, i + 16, &xe1, &xo1);
        vf_st_eo2_nt(dx, i, gapply_ps(ge0, xe0, m, l, a, b, c), gapply_ps(go0, xo0, m, l, a, b, c),
                   gapply_ps(ge1, xe1, m, l, a, b, c), gapply_ps(go1, xo1, m, l, a, b, c));
    }
    for (; i + 8 <= n; i += 8)
        vf_st_nt(dx, i, gapply_ps(vf_ld(dy, i, dt), vf_ld(x, i, dt), m, l, a, b, c), dt);
    if (i < n) {
        int64_t k = n - i;
        vf_st_part(dx, i, gapply_ps(vf_ld_part(dy, i, k, k, dt), vf_ld_part(x, i, k, k, dt), m, l, a, b, c), k, dt);
    }
    stream_fence();
}

INLINE void gapply_rows_nt_ps(const void *dy, const void *x, void *dx, int64_t rows, int64_t w,
                              const cfbn_grad_f32 *p, int dt)
{
    if (eo_rows(dt, w)) {
        gapply_rows_eo(dy, x, dx, rows, w, p, 1);
        stream_fence();
        return;
    }
    const int64_t full = w & ~(int64_t)7, cnt = w - full;
    vf tm = vf_zero(), tl = tm, ta = tm, tb = tm, tc = tm;
    if (cnt) {
        __m256i mk = vf_mask_first(cnt);
        tm = vf_load_part(p->mhi + full, mk);
        tl = vf_load_part(p->mlo + full, mk);
        ta = vf_load_part(p->a + full, mk);
        tb = vf_load_part(p->b + full, mk);
        tc = vf_load_part(p->c + full, mk);
    }
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = r * w;
        for (int64_t j = 0; j < full; j += 8) {
            vf_st_nt(dx, o + j, gapply_ps(vf_ld(dy, o + j, dt), vf_ld(x, o + j, dt), vf_load(p->mhi + j),
                                        vf_load(p->mlo + j), vf_load(p->a + j),
                                        vf_load(p->b + j), vf_load(p->c + j)), dt);
        }
        if (cnt)
            vf_st_part(dx, o + full, gapply_ps(vf_ld_part(dy, o + full, cnt, cnt, dt), vf_ld_part(x, o + full, cnt, cnt, dt),
                                            tm, tl, ta, tb, tc), cnt, dt);
    }
    stream_fence();
}


/* streaming pays only with whole aligned rows */
INLINE int rows_stream_ok(const float *out, int64_t w)
{
    return ((uintptr_t)out & 15) == 0 && (w & 3) == 0 && w >= 16;
}

#include "bn_simd_fused.c"

/* ---- second-order gradient (cfbn_gg_f32: f32, f16 and bf16 storage) ----
 * g = dy, q = ggx and d = (x - mhi) - mlo; the five sums are g, g d, q, q d
 * and q g.  They are summed as the gradient's are (gstats_rows8_ps,
 * gstats_tree_step): blocks of 8 vectors (8 rows of a group of 8 columns, or
 * 64 elements of a stream) pairwise in float with u = x - mhi for d, each
 * block's sums widened once and added in double, where mlo comes off as
 * sum g u - mlo sum g.  Widening every element instead (three conversions
 * for each 4 elements) was twice as slow from L1 (0.34 against 0.18 ns an
 * element on 3136-element runs) and 5.3 against 4.0 ms from memory on
 * (32,56,56,64) float32 rows, whose three tensors take 3.5 ms to read.
 * The rows left after the blocks of 8 go a vector at a time in double.  A
 * column whose float sums left float's range is summed again in double
 * (gg_needs_double).  Rows go in blocks of
 * 8 rows, each group of 8 columns summed in registers and added to acc
 * (5 w doubles, in L1) once per block; widths dividing 8 go as one flat
 * stream with per-lane parameters. */

/* The five sums of 4 lanes, in double. */
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

/* Adds lanes [0, cnt) of a (cnt >= 4: all four) to columns j.. of the five
 * sums at acc + j (sum k of column j at acc[k * w + j]): the masked lanes
 * belong to the next sum's columns. */
INLINE void acc5_add_cols(const acc5 *a, double *acc, int64_t w, int64_t cnt)
{
    const vd v[5] = {a->g, a->gd, a->q, a->qd, a->qg};
    const __m256i mk = vd_mask_first(cnt);
    for (int k = 0; k < 5; k++) {
        double *s = acc + k * w;
        if (cnt >= 4) vd_store(s, vd_add(vd_load(s), v[k]));
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
 * need double summed again.  The quick tests come first: one pass of
 * vector compares when w is a multiple of 4, else inline per column. */
INLINE void ggstats_redo_ps(const void *dy, const void *x, const void *ggx, int64_t rows, int64_t w,
                            const cfbn_gg_f32 *p, double *acc, int dt)
{
    if ((w & 3) == 0) {
        const vd tiny = vd_set1((double)rows * TINY_SUM);
        vd bad = vd_zero();
        for (int64_t j = 0; j < w; j += 4) {
            vd q = vd_load(acc + 2 * w + j);
            bad = _mm256_or_pd(bad, suspect_pd(vd_load(acc + j), vd_load(acc + w + j), tiny));
            bad = _mm256_or_pd(bad, suspect_pd(q, vd_load(acc + 3 * w + j), tiny));
            bad = _mm256_or_pd(bad, suspect_pd(q, vd_load(acc + 4 * w + j), tiny));
        }
        if (!_mm256_movemask_pd(bad)) return;
    }
    const double tiny = (double)rows * TINY_SUM;
    for (int64_t j = 0; j < w; j++)
        if (gg_suspect(acc + j, w, tiny) && gg_needs_double(acc + j, w, (double)rows, p->mhi[j], p->mlo[j]))
            ggstats_column_pd(dy, x, ggx, rows, w, j, p->mhi[j], p->mlo[j], acc + j, dt);
}

/* g, q and u = x - mhi of the vector at e: whole, or with part its first
 * cnt (1..8) elements (avail readable from e) and zero past them, so that a
 * missing element adds nothing, even to the sums of an infinite mean */
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
    if (v < nv - 1 || (v == nv - 1 && !part && last == 8)) {
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
 * in tree8's and dot_tree8's order, then widened to lanes 0..3 (lo) and
 * 4..7 (hi).  n < 0: each vector is readable only up to its cnt elements
 * (8 runs of a channel, not one stream). */
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

/* n elements whose lane l of every 8 has the parameters of lane l of m, l
 * (a run: broadcast), in blocks of 64 */
INLINE void ggstats_flat_ps(const void *dy, const void *x, const void *ggx, int64_t n, vf m, vf l, int dt,
                            acc5 *lo, acc5 *hi)
{
    acc5 a = acc5_zero(), b = acc5_zero(), c, d;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        for (int64_t e = i; e < i + 64; e += 16) {
            prefetch_ahead_of(dy, e, dt);
            prefetch_ahead_of(x, e, dt);
            prefetch_ahead_of(ggx, e, dt);
        }
        gg_block_ps(dy, x, ggx, i, 8, n, 0, 8, 8, 8, m, l, dt, &c, &d);
        a = acc5_add(a, c);
        b = acc5_add(b, d);
    }
    /* The rest (up to 63 elements, a 7x7 plane) as one more block of its
     * nv vectors, nv a constant in each case so that the missing vectors
     * cost no loads: 49 elements took 27 ns a vector at a time in double,
     * 19 ns so. */
    const int64_t nv = (n - i + 7) / 8, last = n - i - 8 * (nv - 1);
    c = d = acc5_zero();
    switch (nv) {
    case 1: gg_block_ps(dy, x, ggx, i, 8, n, 0, 8, 1, last, m, l, dt, &c, &d); break;
    case 2: gg_block_ps(dy, x, ggx, i, 8, n, 0, 8, 2, last, m, l, dt, &c, &d); break;
    case 3: gg_block_ps(dy, x, ggx, i, 8, n, 0, 8, 3, last, m, l, dt, &c, &d); break;
    case 4: gg_block_ps(dy, x, ggx, i, 8, n, 0, 8, 4, last, m, l, dt, &c, &d); break;
    case 5: gg_block_ps(dy, x, ggx, i, 8, n, 0, 8, 5, last, m, l, dt, &c, &d); break;
    case 6: gg_block_ps(dy, x, ggx, i, 8, n, 0, 8, 6, last, m, l, dt, &c, &d); break;
    case 7: gg_block_ps(dy, x, ggx, i, 8, n, 0, 8, 7, last, m, l, dt, &c, &d); break;
    case 8: gg_block_ps(dy, x, ggx, i, 8, n, 0, 8, 8, last, m, l, dt, &c, &d); break;
    default: break;
    }
    *lo = acc5_add(a, c);
    *hi = acc5_add(b, d);
}

/* columns [j, j + cnt) (cnt 1..8) of kr rows from element o of n, added to
 * acc: 8 rows as a block, fewer a row at a time in double */
INLINE void ggstats_cols_ps(const void *dy, const void *x, const void *ggx, int64_t n, int64_t o, int64_t j,
                            int64_t w, int64_t kr, int64_t cnt, vf m, vf l, double *acc, int dt)
{
    acc5 lo = acc5_zero(), hi = acc5_zero();
    if (kr == 8) {
        gg_block_ps(dy, x, ggx, o + j, w, n, cnt < 8, cnt, 8, cnt, m, l, dt, &lo, &hi);
    } else {
        for (int64_t k = 0; k < kr; k++) {
            const int64_t e = o + k * w + j;
            gg_step_ps(dy, x, ggx, e, cnt < 8, cnt, n - e, m, l, dt, &lo, &hi);
        }
    }
    acc5_add_cols(&lo, acc + j, w, cnt);
    if (cnt > 4) acc5_add_cols(&hi, acc + j + 4, w, cnt - 4);
}

INLINE void ggstats_run_ps(const void *dy, const void *x, const void *ggx, int64_t n, const cfbn_gg_f32 *p,
                           double *acc, int dt)
{
    acc5 lo, hi;
    ggstats_flat_ps(dy, x, ggx, n, vf_set1(p->mhi[0]), vf_set1(p->mlo[0]), dt, &lo, &hi);
    acc5_total(acc5_add(lo, hi), acc);
    ggstats_redo_ps(dy, x, ggx, n, 1, p, acc, dt);
}

INLINE void ggstats_rows_ps(const void *dy, const void *x, const void *ggx, int64_t rows, int64_t w,
                            const cfbn_gg_f32 *p, double *acc, int dt)
{
    if (w <= 0) return;
    if (8 % w == 0) {
        vf m, l, odd;
        double lanes[5 * 8];
        lanes_ps(p->mhi, w, &m, &odd);
        lanes_ps(p->mlo, w, &l, &odd);
        acc5 lo, hi;
        ggstats_flat_ps(dy, x, ggx, rows * w, m, l, dt, &lo, &hi);
        acc5_store(&lo, lanes, 8);
        acc5_store(&hi, lanes + 4, 8);
        fold_lanes5(lanes, 8, w, acc);
        ggstats_redo_ps(dy, x, ggx, rows, w, p, acc, dt);
        return;
    }
    const int64_t full = w & ~(int64_t)7, cnt = w - full, n = rows * w;
    const size_t es = dt ? 2 : 4;
    const float *const v[2] = {p->mhi, p->mlo};
    vf t[2];
    tail_params_ps(v, 2, full, cnt, t);
    memset(acc, 0, (size_t)(5 * w) * sizeof *acc);
    int64_t r = 0;
    for (; r + 8 <= rows; r += 8) {
        const int64_t o = r * w;
        for (int64_t j = 0; j < full; j += 8) {
            prefetch_group_l2(dy, o, j, es);
            prefetch_group_l2(x, o, j, es);
            prefetch_group_l2(ggx, o, j, es);
            ggstats_cols_ps(dy, x, ggx, n, o, j, w, 8, 8, vf_load(p->mhi + j), vf_load(p->mlo + j),
                            acc, dt);
        }
        if (cnt) ggstats_cols_ps(dy, x, ggx, n, o, full, w, 8, cnt, t[0], t[1], acc, dt);
    }
    if (r < rows) {
        const int64_t o = r * w;
        for (int64_t j = 0; j < full; j += 8)
            ggstats_cols_ps(dy, x, ggx, n, o, j, w, rows - r, 8, vf_load(p->mhi + j),
                            vf_load(p->mlo + j), acc, dt);
        if (cnt) ggstats_cols_ps(dy, x, ggx, n, o, full, w, rows - r, cnt, t[0], t[1], acc, dt);
    }
    if (rows >= 8) ggstats_redo_ps(dy, x, ggx, rows, w, p, acc, dt);
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
        const int64_t full = n & ~(int64_t)7, cnt = n - full;
        for (; k + 8 <= p->runs; k += 8) {
            for (int64_t i = 0; i < full; i += 8) {
                gg_block_ps(dy, x, ggx, k * st + i, st, 0, 0, 8, 8, 8, m, l, dt, &lo, &hi);
                a = acc5_add(a, acc5_add(lo, hi));
            }
            if (cnt) {
                gg_block_ps(dy, x, ggx, k * st + full, st, -1, 1, cnt, 8, cnt, m, l, dt, &lo, &hi);
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

/* The 16 elements from e, parameters c0 for the first 8 and c1 for the
 * next: all six inputs loaded, then each output's two vectors stored back
 * to back, 64 bytes of float32, so that a non-temporal line fills without
 * waiting on the other output's.  On (32,56,56,64) float32 with NumPy's
 * outputs (16 but not 64-byte aligned), the whole second-order gradient
 * took 8.4 ms so, 11.2 ms storing one vector of each output in turn. */
INLINE void ggapply16_ps(const void *dy, const void *x, const void *ggx, void *ddy, void *dx, int64_t e,
                         const vf *c0, const vf *c1, int dt, int nt)
{
    vf y0, x0, y1, x1;
    ggapply_ps(vf_ld(dy, e, dt), vf_ld(ggx, e, dt), vf_ld(x, e, dt), c0, &y0, &x0);
    ggapply_ps(vf_ld(dy, e + 8, dt), vf_ld(ggx, e + 8, dt), vf_ld(x, e + 8, dt), c1, &y1, &x1);
    st8_out(ddy, e, y0, dt, nt);
    st8_out(ddy, e + 8, y1, dt, nt);
    st8_out(dx, e, x0, dt, nt);
    st8_out(dx, e + 8, x1, dt, nt);
}

/* n elements whose lane l of every 8 has the parameters of lane l of c;
 * nt: whole vectors by non-temporal stores (both outputs 16-byte aligned) */
INLINE void ggapply_flat_ps(const void *dy, const void *x, const void *ggx, void *ddy, void *dx, int64_t n,
                            const vf *c, int dt, int nt)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) ggapply16_ps(dy, x, ggx, ddy, dx, i, c, c, dt, nt);
    if (i + 8 <= n) {
        vf vy, vx;
        ggapply_ps(vf_ld(dy, i, dt), vf_ld(ggx, i, dt), vf_ld(x, i, dt), c, &vy, &vx);
        st8_out(ddy, i, vy, dt, nt);
        st8_out(dx, i, vx, dt, nt);
        i += 8;
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
        i = peel16(ddy, n, dt);
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
    if (8 % w == 0) {
        const int nt = gg_nt(p->stream, dt, ddy, dx, 0);
        vf odd;
        for (int k = 0; k < GG_NPAR; k++) lanes_ps(v[k], w, &c[k], &odd);
        ggapply_flat_ps(dy, x, ggx, ddy, dx, rows * w, c, dt, nt);
        if (nt) stream_fence();
        return;
    }
    const int nt = gg_nt(p->stream, dt, ddy, dx, (size_t)w * (dt ? 2 : 4));
    const int64_t full = w & ~(int64_t)7, cnt = w - full, n = rows * w;
    vf t[GG_NPAR];
    tail_params_ps(v, GG_NPAR, full, cnt, t);
    /* two rows for each load of a group's parameter vectors: a row at a
     * time, those loads bound the loop in cache (12 loads for 2 stores;
     * 64 rows of 64 floats in L1: 1.38 us, two rows at a time 0.99) */
    for (int64_t r = 0; r < rows; r += 2) {
        const int64_t kr = rows - r < 2 ? rows - r : 2;
        int64_t j = 0;
        for (; j + 16 <= full; j += 16) {
            vf c1[GG_NPAR];
            col_params_ps(v, GG_NPAR, j, c);
            col_params_ps(v, GG_NPAR, j + 8, c1);
            for (int64_t k = 0; k < kr; k++) ggapply16_ps(dy, x, ggx, ddy, dx, (r + k) * w + j, c, c1, dt, nt);
        }
        if (j < full) {
            col_params_ps(v, GG_NPAR, j, c);
            for (int64_t k = 0; k < kr; k++) {
                const int64_t e = (r + k) * w + j;
                vf vy, vx;
                ggapply_ps(vf_ld(dy, e, dt), vf_ld(ggx, e, dt), vf_ld(x, e, dt), c, &vy, &vx);
                st8_out(ddy, e, vy, dt, nt);
                st8_out(dx, e, vx, dt, nt);
            }
        }
    for (int64_t k = 0; k < kr && cnt; k++) {
            const int64_t e = (r + k) * w + full, av = n - e;
            vf vy, vx;
            ggapply_ps(vf_ld_part(dy, e, cnt, av, dt), vf_ld_part(ggx, e, cnt, av, dt), vf_ld_part(x, e, cnt, av, dt), t,
                       &vy, &vx);
            vf_st_part(ddy, e, vy, cnt, dt);
            vf_st_part(dx, e, vx, cnt, dt);
        }
    }
    if (nt) stream_fence();
}

/* ---- float32, float16 and bfloat16 entries ---- */

CFBN_FLOAT_ENTRIES(f32, CFBN_F32, ps)
CFBN_FLOAT_ENTRIES(f16, CFBN_F16, ps)
CFBN_FLOAT_ENTRIES(bf16, CFBN_BF16, ps)
CFBN_GG_ENTRIES(f32, CFBN_F32, ps)
CFBN_GG_ENTRIES(f16, CFBN_F16, ps)
CFBN_GG_ENTRIES(bf16, CFBN_BF16, ps)

#define GG_RUNS_ENTRIES(sfx, DT)                                                                              \
    static void ggstats_runs_##sfx(const void *dy, const void *x, const void *ggx, int64_t n,                 \
                                   const cfbn_gg_f32 *p, double *acc)                                         \
    {                                                                                                         \
        ggstats_runs_ps(dy, x, ggx, n, p, acc, DT);                                                           \
    }                                                                                                         \
    static void ggapply_runs_##sfx(const void *dy, const void *x, const void *ggx, void *ddy, void *dx,       \
                                   int64_t n, const cfbn_gg_f32 *p)                                           \
    {                                                                                                         \
        ggapply_runs_ps(dy, x, ggx, ddy, dx, n, p, DT);                                                       \
    }
#define GG_RUNS_TABLE(sfx) .ggstats_runs = ggstats_runs_##sfx, .ggapply_runs = ggapply_runs_##sfx

GG_RUNS_ENTRIES(f32, CFBN_F32)
GG_RUNS_ENTRIES(f16, CFBN_F16)
GG_RUNS_ENTRIES(bf16, CFBN_BF16)

/* ---- second-order gradient, float64 (cfbn_gg_f64) ----
 * In double throughout (d = (x - mhi) - mlo, the products and the five
 * sums): nothing to convert and no range to leave, so every element is one
 * step of gg_step_pd.  Rows go as the float kernels walk them, blocks of 8
 * rows with the sums of a group of 8 columns in registers; widths dividing
 * 4 go as one flat stream with per-lane parameters. */

/* cnt elements at p (cnt >= 4: all four), zero past them */
INLINE vd ld_cols_pd(const double *p, int64_t cnt)
{
    return cnt >= 4 ? vd_load(p) : vd_load_part(p, vd_mask_first(cnt));
}

INLINE void st_cols_pd(double *p, vd v, int64_t cnt)
{
    if (cnt >= 4) vd_store(p, v);
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

/* n elements whose lane l of every 4 has the parameters of lane l of m, l
 * (a run: broadcast) */
INLINE void ggstats_flat_pd(const double *dy, const double *x, const double *ggx, int64_t n, vd m, vd l,
                            acc5 *out)
{
    acc5 a = acc5_zero(), b = acc5_zero();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        gg_step_pd(&a, vd_load(dy + i), vd_load(ggx + i), centered_pd(vd_load(x + i), m, l));
        gg_step_pd(&b, vd_load(dy + i + 4), vd_load(ggx + i + 4),
                   centered_pd(vd_load(x + i + 4), m, l));
    }
    for (; i < n; i += 4) {
        /* dead lanes: dy = ggx = 0 and d = 0 */
        const __m256i mk = vd_mask_first(n - i);
        gg_step_pd(&a, vd_load_part(dy + i, mk), vd_load_part(ggx + i, mk),
                   centered_pd(vd_load_part(x + i, mk), vd_keep(m, mk), vd_keep(l, mk)));
    }
    *out = acc5_add(a, b);
}

/* columns [j, j + cnt) (cnt 1..8) of kr rows from element o, added to acc */
INLINE void ggstats_cols_pd(const double *dy, const double *x, const double *ggx, int64_t o, int64_t j, int64_t w,
                            int64_t kr, int64_t cnt, const cfbn_gg_f64 *p, double *acc)
{
    const vd m0 = ld_cols_pd(p->mhi + j, cnt), l0 = ld_cols_pd(p->mlo + j, cnt);
    const vd m1 = ld_cols_pd(p->mhi + j + 4, cnt - 4), l1 = ld_cols_pd(p->mlo + j + 4, cnt - 4);
    acc5 lo = acc5_zero(), hi = acc5_zero();
    for (int64_t k = 0; k < kr; k++) {
        const int64_t e = o + k * w + j;
        gg_step_pd(&lo, ld_cols_pd(dy + e, cnt), ld_cols_pd(ggx + e, cnt), centered_pd(ld_cols_pd(x + e, cnt), m0, l0));
        if (cnt > 4)
            gg_step_pd(&hi, ld_cols_pd(dy + e + 4, cnt - 4), ld_cols_pd(ggx + e + 4, cnt - 4),
                       centered_pd(ld_cols_pd(x + e + 4, cnt - 4), m1, l1));
    }
    acc5_add_cols(&lo, acc + j, w, cnt);
    if (cnt > 4) acc5_add_cols(&hi, acc + j + 4, w, cnt - 4);
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
    if (4 % w == 0) {
        vd m, l, odd;
        double lanes[5 * 4];
        lanes_pd(p->mhi, w, &m, &odd);
        lanes_pd(p->mlo, w, &l, &odd);
        acc5 a;
        ggstats_flat_pd(dy, x, ggx, rows * w, m, l, &a);
        acc5_store(&a, lanes, 4);
        fold_lanes5(lanes, 4, w, acc);
        return;
    }
    memset(acc, 0, (size_t)(5 * w) * sizeof *acc);
    for (int64_t r = 0; r < rows; r += 8) {
        const int64_t kr = rows - r < 8 ? rows - r : 8, o = r * w;
        for (int64_t j = 0; j < w; j += 8) {
            if (kr == 8 && j + 8 <= w) {
                prefetch_group_l2(dy, o, j, 8);
                prefetch_group_l2(x, o, j, 8);
                prefetch_group_l2(ggx, o, j, 8);
                ggstats_cols_pd(dy, x, ggx, o, j, w, 8, 8, p, acc);
            } else {
                ggstats_cols_pd(dy, x, ggx, o, j, w, kr, w - j < 8 ? w - j : 8, p, acc);
            }
        }
    }
}

/* n elements whose lane l of every 4 has the parameters of lane l of c */
INLINE void ggapply_flat_pd(const double *dy, const double *x, const double *ggx, double *ddy, double *dx, int64_t n,
                            const vd *c)
{
    for (int64_t i = 0; i < n; i += 4) {
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
    if (4 % w == 0) {
        for (int k = 0; k < GG_NPAR; k++) lanes_pd(v[k], w, &c[k], &odd);
        ggapply_flat_pd(dy, x, ggx, ddy, dx, rows * w, c);
        return;
    }
    const int64_t full = w & ~(int64_t)3, cnt = w - full;
    for (int k = 0; k < GG_NPAR; k++) t[k] = ld_cols_pd(v[k] + full, cnt);
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = r * w;
        vd vy, vx;
        for (int64_t j = 0; j < full; j += 4) {
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

const cfbn_kernels cfbn_kernels_avx2 = {
    .name = "avx2",
    .lanes = 8,
    .f32 = { CFBN_FLOAT_TABLE(f32), EXTRA_TABLE(f32), CFBN_GG_TABLE(f32), GG_RUNS_TABLE(f32) },
    .f64 = {
        stats_run_f64, stats_rows_f64, apply_run_f64, apply_rows_f64,
        gstats_run_f64, gstats_rows_f64, gapply_run_f64, gapply_rows_f64,
        .ggstats_run = ggstats_run_f64, .ggstats_rows = ggstats_rows_f64,
        .ggapply_run = ggapply_run_f64, .ggapply_rows = ggapply_rows_f64,
    },
    .f16 = { CFBN_FLOAT_TABLE(f16), EXTRA_TABLE(f16), CFBN_GG_TABLE(f16), GG_RUNS_TABLE(f16) },
    .bf16 = { CFBN_FLOAT_TABLE(bf16), EXTRA_TABLE(bf16), CFBN_GG_TABLE(bf16), GG_RUNS_TABLE(bf16) },
};

#endif
