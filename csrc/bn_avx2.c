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
 * The second-order gradient's entries (gg*) exist for all four dtypes; their
 * loops are bn_simd_gg.c's. */
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

/* ---- fused activations (f32, f16 and bf16 tensors) ----
 * exp as in Cephes' expf: e^x = 2^k e^r with k = round(x / ln 2), r = x - k ln 2
 * formed in two FMA steps (ln 2 = C1 + C2, C1 with few bits so k * C1 is
 * exact), e^r by a degree-6 polynomial on |r| <= ln 2 / 2, 2^k put into the
 * exponent bits.  About 1 ulp on the clamped range; the clamp keeps 2^k a
 * normal number (k in [-126, 127]); outside it the activations below are
 * flat to float precision anyway.  min/max take the NaN operand second so a
 * NaN stays NaN. */
INLINE vf exp_ps(vf x)
{
    x = vf_max(vf_set1(-87.33654f), vf_min(vf_set1(88.0f), x));
    vf k = _mm256_round_ps(vf_mul(x, vf_set1(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf r = vf_fnma(k, vf_set1(0.693359375f), x);
    r = vf_fnma(k, vf_set1(-2.12194440e-4f), r);
    vf p = vf_set1(1.9875691500e-4f);
    p = vf_fma(p, r, vf_set1(1.3981999507e-3f));
    p = vf_fma(p, r, vf_set1(8.3334519073e-3f));
    p = vf_fma(p, r, vf_set1(4.1665795894e-2f));
    p = vf_fma(p, r, vf_set1(1.6666665459e-1f));
    p = vf_fma(p, r, vf_set1(5.0000001201e-1f));
    p = vf_fma(p, vf_mul(r, r), vf_add(r, vf_set1(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return vf_mul(p, _mm256_castsi256_ps(e));
}

INLINE vf sigmoid_ps(vf v)
{
    const vf one = vf_set1(1.0f);
    return vf_div(one, vf_add(one, exp_ps(vf_sub(vf_zero(), v))));
}

/* tanh: for |v| < 0.625 Cephes' odd polynomial v + v^3 P(v^2), because
 * 1 - 2/(e^2|v| + 1) loses relative precision as |v| -> 0; above, that
 * formula, whose error is then a couple of ulps of the result. */
INLINE vf tanh_ps(vf v)
{
    const vf sign = vf_set1(-0.0f), one = vf_set1(1.0f);
    vf a = vf_andnot(sign, v);
    vf z = vf_mul(v, v);
    vf p = vf_set1(-5.70498872745e-3f);
    p = vf_fma(p, z, vf_set1(2.06390887954e-2f));
    p = vf_fma(p, z, vf_set1(-5.37397155531e-2f));
    p = vf_fma(p, z, vf_set1(1.33314422036e-1f));
    p = vf_fma(p, z, vf_set1(-3.33332819422e-1f));
    vf small = vf_fma(vf_mul(p, z), v, v);
    vf e = exp_ps(vf_add(a, a));
    vf big = vf_sub(one, vf_div(vf_set1(2.0f), vf_add(e, one)));
    big = vf_or(big, vf_and(sign, v));
    return _mm256_blendv_ps(big, small, _mm256_cmp_ps(a, vf_set1(0.625f), _CMP_LT_OQ));
}

INLINE vf act_ps(vf v, int kind, vf al)
{
    const vf zero = vf_zero(), one = vf_set1(1.0f);
    switch ((enum cfbn_activation)kind) {
    case CFBN_ACT_NONE: return v;
    case CFBN_ACT_RELU: return vf_max(zero, v);
    case CFBN_ACT_RELU6: return vf_min(vf_set1(6.0f), vf_max(zero, v));
    case CFBN_ACT_LEAKY_RELU:
        return _mm256_blendv_ps(v, vf_mul(al, v), _mm256_cmp_ps(v, zero, _CMP_LT_OQ));
    case CFBN_ACT_ELU:
        return _mm256_blendv_ps(v, vf_mul(al, vf_sub(exp_ps(v), one)), _mm256_cmp_ps(v, zero, _CMP_LT_OQ));
    case CFBN_ACT_SIGMOID: return sigmoid_ps(v);
    case CFBN_ACT_TANH: return tanh_ps(v);
    case CFBN_ACT_SILU:
        return vf_div(v, vf_add(one, exp_ps(vf_sub(zero, v))));
    }
    return vf_set1(NAN);   /* a code outside the enum */
}

/* d act / d v; a NaN v gives NaN (the unordered mask is all ones, a NaN) */
INLINE vf act_grad_ps(vf v, int kind, vf al)
{
    const vf zero = vf_zero(), one = vf_set1(1.0f);
    vf nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    vf pos = _mm256_cmp_ps(v, zero, _CMP_GT_OQ);
    switch ((enum cfbn_activation)kind) {
    case CFBN_ACT_NONE: return one;
    case CFBN_ACT_RELU: return vf_or(vf_and(pos, one), nan);
    case CFBN_ACT_RELU6: {
        vf in = vf_and(pos, _mm256_cmp_ps(v, vf_set1(6.0f), _CMP_LT_OQ));
        return vf_or(vf_and(in, one), nan);
    }
    case CFBN_ACT_LEAKY_RELU: return vf_or(_mm256_blendv_ps(al, one, pos), nan);
    case CFBN_ACT_ELU: return _mm256_blendv_ps(vf_mul(al, exp_ps(v)), one, pos);
    case CFBN_ACT_SIGMOID: {
        vf s = sigmoid_ps(v);
        return vf_mul(s, vf_sub(one, s));
    }
    case CFBN_ACT_TANH: {
        vf t = tanh_ps(v);
        return vf_fnma(t, t, one);
    }
    case CFBN_ACT_SILU: {
        vf s = sigmoid_ps(v);
        return vf_mul(s, vf_fma(v, vf_sub(one, s), one));
    }
    }
    return vf_set1(NAN);   /* a code outside the enum */
}

/* ---- fused activation and side input inside the vector loops ----
 * One pass per call, everything in registers: the pre-activation, the
 * activation or its derivative and the side input are formed in the loop
 * that reads x, so a fused call costs the plain call's memory traffic (plus
 * side's) and a few vector operations per element.  The activation kind, the
 * presence of a side input and the storage type are constants of each loop
 * (CFBN_ACT_SPECIALIZE): the kind is chosen once per call.
 *
 * The pre-activation is formed with the plain kernels' FMA, then side is
 * added and act_ps or act_grad_ps applied, element for element.  Every vector is read in full before its position is written, so y
 * may be x or side, and dx and side_grad may be dy or x.
 *
 * The gradient sums are accumulated in double directly (gstats_step): the
 * product of two floats is exact in double, so there is no float block sum
 * that could leave float's range and no second pass to redo it; the
 * conversions it costs are hidden behind the activation's arithmetic and the
 * loads (benchmarks/fusion.py). */

/* The pre-activation's parameter set of one 8-lane block: mhi, mlo, alpha
 * (ya for the gradient), beta (yb). */
INLINE vf fused_pre_ps(vf x, vf s, const vf *q, int has_side)
{
    vf v = apply_ps(x, q[0], q[1], q[2], q[3]);
    return has_side ? vf_add(v, s) : v;
}

/* g = dy * act'(pre); dy itself without an activation (side unread then) */
INLINE vf fused_g_ps(vf dy, vf x, vf s, const vf *q, int kind, int has_side, vf al)
{
    if (kind == CFBN_ACT_NONE) return dy;
    return vf_mul(dy, act_grad_ps(fused_pre_ps(x, s, q, has_side), kind, al));
}

/* Parameters of the masked tail columns [full, full + cnt) of a row; the
 * dead lanes are 0, whatever they compute is never stored or summed. */
INLINE void tail_params_ps(const float *const *v, int k, int64_t full, int64_t cnt, vf *out)
{
    __m256i mk = vf_mask_first(cnt);
    for (int i = 0; i < k; i++) out[i] = cnt ? vf_load_part(v[i] + full, mk) : vf_zero();
}

/* ya or yb, which are given only with an activation: without one they are
 * never used, and mhi (of the same w columns) stands in for them so that
 * the loops' parameter loads stay in bounds */
INLINE const float *yab_ps(const float *v, const cfbn_grad_f32 *p)
{
    return p->act != CFBN_ACT_NONE ? v : p->mhi;
}

INLINE void col_params_ps(const float *const *v, int k, int64_t j, vf *out)
{
    for (int i = 0; i < k; i++) out[i] = vf_load(v[i] + j);
}

/* Whole vectors of fused outputs: with nt, non-temporal stores (outputs
 * 16-byte aligned at every vector, as the plain *_nt kernels write when the
 * router asks for streaming); tails use regular stores. */
INLINE void st8_out(void *p, int64_t i, vf v, int dt, int nt)
{
    if (nt) vf_st_nt(p, i, v, dt);
    else vf_st(p, i, v, dt);
}

/* Streaming for a fused call: asked for, and every vector of the outputs
 * (8 elements from the start of the call or of a row) 16-byte aligned:
 * rows of a multiple of 16 bytes. */
INLINE int fused_nt(int stream, int dt, const void *out, const void *out2, int64_t w)
{
    return stream && ((uintptr_t)out & 15) == 0 && ((uintptr_t)out2 & 15) == 0 && (w & (dt ? 7 : 3)) == 0;
}

/* ---- forward: y = act(pre + side) ---- */

/* q: mhi, mlo, alpha, beta of even 8-blocks, then of odd blocks */
INLINE void fapply_flat_ps(const void *x, const void *side, void *y, int64_t n, const vf *q, int kind, int hs,
                           vf al, int dt, int nt)
{
    const vf z = vf_zero();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        vf x0 = vf_ld(x, i, dt), x1 = vf_ld(x, i + 8, dt), x2 = vf_ld(x, i + 16, dt), x3 = vf_ld(x, i + 24, dt);
        vf s0 = hs ? vf_ld(side, i, dt) : z, s1 = hs ? vf_ld(side, i + 8, dt) : z;
        vf s2 = hs ? vf_ld(side, i + 16, dt) : z, s3 = hs ? vf_ld(side, i + 24, dt) : z;
        st8_out(y, i, act_ps(fused_pre_ps(x0, s0, q, hs), kind, al), dt, nt);
        st8_out(y, i + 8, act_ps(fused_pre_ps(x1, s1, q + 4, hs), kind, al), dt, nt);
        st8_out(y, i + 16, act_ps(fused_pre_ps(x2, s2, q, hs), kind, al), dt, nt);
        st8_out(y, i + 24, act_ps(fused_pre_ps(x3, s3, q + 4, hs), kind, al), dt, nt);
    }
    for (; i + 16 <= n; i += 16) {
        vf x0 = vf_ld(x, i, dt), x1 = vf_ld(x, i + 8, dt);
        vf s0 = hs ? vf_ld(side, i, dt) : z, s1 = hs ? vf_ld(side, i + 8, dt) : z;
        st8_out(y, i, act_ps(fused_pre_ps(x0, s0, q, hs), kind, al), dt, nt);
        st8_out(y, i + 8, act_ps(fused_pre_ps(x1, s1, q + 4, hs), kind, al), dt, nt);
    }
    if (i + 8 <= n) {
        vf x0 = vf_ld(x, i, dt), s0 = hs ? vf_ld(side, i, dt) : z;
        st8_out(y, i, act_ps(fused_pre_ps(x0, s0, q, hs), kind, al), dt, nt);
        i += 8;
    }
    if (i < n) {
        const vf *r = q + 4 * ((i >> 3) & 1);
        int64_t cnt = n - i;
        vf x0 = vf_ld_part(x, i, cnt, cnt, dt), s0 = hs ? vf_ld_part(side, i, cnt, cnt, dt) : z;
        vf_st_part(y, i, act_ps(fused_pre_ps(x0, s0, r, hs), kind, al), cnt, dt);
    }
}

/* rows of a width that 16 does not divide: 8 columns at a time, a masked
 * tail at the same columns of every row */
INLINE void fapply_rows_w_ps(const void *x, const void *side, void *y, int64_t rows, int64_t w,
                             const cfbn_apply_f32 *p, int kind, int hs, vf al, int dt, int nt)
{
    const float *const v[4] = {p->mhi, p->mlo, p->alpha, p->beta};
    const int64_t full = w & ~(int64_t)7, cnt = w - full, n = rows * w;
    const vf z = vf_zero();
    vf t[4];
    tail_params_ps(v, 4, full, cnt, t);
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = r * w;
        for (int64_t j = 0; j < full; j += 8) {
            vf q[4];
            col_params_ps(v, 4, j, q);
            vf x0 = vf_ld(x, o + j, dt), s0 = hs ? vf_ld(side, o + j, dt) : z;
            st8_out(y, o + j, act_ps(fused_pre_ps(x0, s0, q, hs), kind, al), dt, nt);
        }
        if (cnt) {
            const int64_t av = n - o - full;
            vf x0 = vf_ld_part(x, o + full, cnt, av, dt), s0 = hs ? vf_ld_part(side, o + full, cnt, av, dt) : z;
            vf_st_part(y, o + full, act_ps(fused_pre_ps(x0, s0, t, hs), kind, al), cnt, dt);
        }
    }
}

/* One run's broadcast parameters of a fused forward kernel: mhi, mlo,
 * alpha, beta, twice (even and odd 8-blocks) */
INLINE void fapply_params_ps(const cfbn_apply_f32 *p, vf *q)
{
    q[0] = q[4] = vf_set1(p->mhi[0]);
    q[1] = q[5] = vf_set1(p->mlo[0]);
    q[2] = q[6] = vf_set1(p->alpha[0]);
    q[3] = q[7] = vf_set1(p->beta[0]);
}

/* One run's broadcast parameters of a fused gradient kernel: mhi, mlo, ya,
 * yb (0 without an activation, which never reads them), then for the
 * gapply kernels also a, b, c; the set twice, for even and odd 8-blocks
 * (q: 8 or 14 vectors). */
INLINE void fgrad_params_ps(const cfbn_grad_f32 *p, int gapply, vf *q)
{
    const int w = gapply ? 7 : 4;
    q[0] = vf_set1(p->mhi[0]);
    q[1] = vf_set1(p->mlo[0]);
    q[2] = q[3] = vf_zero();
    if (p->act != CFBN_ACT_NONE) {
        q[2] = vf_set1(p->ya[0]);
        q[3] = vf_set1(p->yb[0]);
    }
    if (gapply) {
        q[4] = vf_set1(p->a[0]);
        q[5] = vf_set1(p->b[0]);
        q[6] = vf_set1(p->c[0]);
    }
    for (int i = 0; i < w; i++) q[w + i] = q[i];
}

INLINE void fapply_run_ps(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p, int dt)
{
    const int nt = fused_nt(p->stream, dt, y, y, 0);
    const vf al = vf_set1(p->act_alpha);
    vf q[8];
    fapply_params_ps(p, q);
    const void *side = p->side;
#define FAPPLY_RUN(k)                                                   \
    if (side) fapply_flat_ps(x, side, y, n, q, k, 1, al, dt, nt);     \
    else fapply_flat_ps(x, NULL, y, n, q, k, 0, al, dt, nt)
    CFBN_ACT_SPECIALIZE(p->act, FAPPLY_RUN)
#undef FAPPLY_RUN
    if (nt) stream_fence();
}

INLINE void fapply_rows_ps(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f32 *p, int dt)
{
    const int nt = fused_nt(p->stream, dt, y, y, w);
    if (w <= 0) return;
    const void *side = p->side;
    const vf al = vf_set1(p->act_alpha);
    if (16 % w == 0) {
        vf q[8];
        lanes_ps(p->mhi, w, &q[0], &q[4]);
        lanes_ps(p->mlo, w, &q[1], &q[5]);
        lanes_ps(p->alpha, w, &q[2], &q[6]);
        lanes_ps(p->beta, w, &q[3], &q[7]);
#define FAPPLY_FLAT(k)                                                          \
    if (side) fapply_flat_ps(x, side, y, rows * w, q, k, 1, al, dt, nt);      \
    else fapply_flat_ps(x, NULL, y, rows * w, q, k, 0, al, dt, nt)
        CFBN_ACT_SPECIALIZE(p->act, FAPPLY_FLAT)
#undef FAPPLY_FLAT
        if (nt) stream_fence();
        return;
    }
#define FAPPLY_ROWS(k)                                                          \
    if (side) fapply_rows_w_ps(x, side, y, rows, w, p, k, 1, al, dt, nt);     \
    else fapply_rows_w_ps(x, NULL, y, rows, w, p, k, 0, al, dt, nt)
    CFBN_ACT_SPECIALIZE(p->act, FAPPLY_ROWS)
#undef FAPPLY_ROWS
    if (nt) stream_fence();
}

/* ---- gradient sums: sum g, sum g * ((x - mhi) - mlo), in double ----
 * go (cfbn_grad_f32.g_out): NULL, or where each g summed is also stored.
 * The loops that prefetch their inputs prefetch go's lines with them:
 * without, the stores waited on their lines (perf: a quarter of the rows
 * loop's samples on one store); (32,28,28,128) NHWC, relu with a side
 * input, gradient, one thread: 4.4-5.4 -> 3.7-3.8 ms (plain: 2.4 ms). */

INLINE void st_g(void *go, int64_t i, vf g, int dt)
{
    if (go) vf_st(go, i, g, dt);
}

INLINE void st_g_part(void *go, int64_t i, vf g, int64_t cnt, int dt)
{
    if (go) vf_st_part(go, i, g, cnt, dt);
}

/* q: mhi, mlo, ya, yb of even 8-blocks, then of odd blocks */
INLINE void fgstats_flat_ps(const void *dy, const void *x, const void *side, void *go, int64_t n, const vf *q,
                            int kind, int hs, vf al, int dt, acc8 *ea, acc8 *oa)
{
    const vf z = vf_zero();
    acc8 a = acc8_zero(), b = acc8_zero();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        prefetch_ahead_of(x, i, dt);
        prefetch_ahead_of(dy, i, dt);
        if (go) prefetch_ahead_of(go, i, dt);
        vf x0 = vf_ld(x, i, dt), x1 = vf_ld(x, i + 8, dt);
        vf s0 = hs ? vf_ld(side, i, dt) : z, s1 = hs ? vf_ld(side, i + 8, dt) : z;
        vf g0 = fused_g_ps(vf_ld(dy, i, dt), x0, s0, q, kind, hs, al);
        vf g1 = fused_g_ps(vf_ld(dy, i + 8, dt), x1, s1, q + 4, kind, hs, al);
        st_g(go, i, g0, dt);
        st_g(go, i + 8, g1, dt);
        gstats_step(&a, g0, centered_ps(x0, q[0], q[1]));
        gstats_step(&b, g1, centered_ps(x1, q[4], q[5]));
    }
    int odd = 0;
    if (i + 8 <= n) {
        vf x0 = vf_ld(x, i, dt), s0 = hs ? vf_ld(side, i, dt) : z;
        vf g0 = fused_g_ps(vf_ld(dy, i, dt), x0, s0, q, kind, hs, al);
        st_g(go, i, g0, dt);
        gstats_step(&a, g0, centered_ps(x0, q[0], q[1]));
        i += 8;
        odd = 1;
    }
    if (i < n) {
        const vf *r = q + 4 * odd;
        int64_t cnt = n - i;
        __m256i mk = vf_mask_first(cnt);
        vf x0 = vf_ld_part(x, i, cnt, cnt, dt), s0 = hs ? vf_ld_part(side, i, cnt, cnt, dt) : z;
        /* dead lanes: g and d are masked to 0, whatever the activation of
         * a zero pre-activation gives */
        vf g = vf_keep(fused_g_ps(vf_ld_part(dy, i, cnt, cnt, dt), x0, s0, r, kind, hs, al), mk);
        vf d = vf_keep(centered_ps(x0, r[0], r[1]), mk);
        st_g_part(go, i, g, cnt, dt);
        gstats_step(odd ? &b : &a, g, d);
    }
    *ea = a;
    *oa = b;
}

INLINE void acc8_add_to(const acc8 *a, double *s1, double *s2)
{
    acc8 c = acc8_load(s1, s2);
    c.s1lo = vd_add(c.s1lo, a->s1lo);
    c.s1hi = vd_add(c.s1hi, a->s1hi);
    c.s2lo = vd_add(c.s2lo, a->s2lo);
    c.s2hi = vd_add(c.s2hi, a->s2hi);
    acc8_store(&c, s1, s2);
}

/* rows of a width that 16 does not divide: blocks of 8 rows keep each
 * 8-column group's sums in registers, added to acc (2 w doubles, in L1)
 * once per block */
INLINE void fgstats_rows_w_ps(const void *dy, const void *x, const void *side, int64_t rows, int64_t w,
                              const cfbn_grad_f32 *p, int kind, int hs, vf al, int dt, double *acc)
{
    const float *ya = yab_ps(p->ya, p), *yb = yab_ps(p->yb, p);
    const float *const v[4] = {p->mhi, p->mlo, ya, yb};
    const int64_t full = w & ~(int64_t)7, cnt = w - full, n = rows * w;
    const size_t es = dt ? 2 : 4;
    const vf z = vf_zero();
    const __m256i mk = vf_mask_first(cnt);
    void *go = p->g_out;
    vf t[4];
    tail_params_ps(v, 4, full, cnt, t);
    memset(acc, 0, (size_t)(2 * w) * sizeof *acc);
    acc8 ta = acc8_zero();
    int64_t r = 0;
    while (r < rows) {
        const int64_t kr = rows - r < 8 ? rows - r : 8, o = r * w;
        for (int64_t j = 0; j < full; j += 8) {
            vf q[4];
            col_params_ps(v, 4, j, q);
            if (kr == 8) {
                prefetch_group_l2(dy, o, j, es);
                prefetch_group_l2(x, o, j, es);
                if (go) prefetch_group_l2(go, o, j, es);
            }
            acc8 c = acc8_zero();
            for (int64_t k = 0; k < kr; k++) {
                const int64_t e = o + k * w + j;
                vf x0 = vf_ld(x, e, dt), s0 = hs ? vf_ld(side, e, dt) : z;
                vf g = fused_g_ps(vf_ld(dy, e, dt), x0, s0, q, kind, hs, al);
                st_g(go, e, g, dt);
                gstats_step(&c, g, centered_ps(x0, q[0], q[1]));
            }
            acc8_add_to(&c, acc + j, acc + w + j);
        }
        if (cnt) {
            for (int64_t k = 0; k < kr; k++) {
                const int64_t e = o + k * w + full, av = n - e;
                vf x0 = vf_ld_part(x, e, cnt, av, dt), s0 = hs ? vf_ld_part(side, e, cnt, av, dt) : z;
                vf g = vf_keep(fused_g_ps(vf_ld_part(dy, e, cnt, av, dt), x0, s0, t, kind, hs, al), mk);
                st_g_part(go, e, g, cnt, dt);
                gstats_step(&ta, g, vf_keep(centered_ps(x0, t[0], t[1]), mk));
            }
        }
        r += kr;
    }
    if (cnt) acc8_store_part(&ta, acc + full, acc + w + full, cnt);
}

/* Fused gradient sums in float blocks, as the plain kernels sum (8 rows, or
 * 128-element stretches of a run, pairwise in float, then added in double):
 * the double accumulation above converts every g and d, which costs more
 * than the pass's loads.  A column (or run) whose float sums need double
 * (needs_double) is summed again one element at a time, g recomputed with
 * bn_math.h's formulas. */
COLD void fgstats_column_pd(const void *dy, const void *x, int64_t rows, int64_t w, int64_t j,
                            const cfbn_grad_f32 *p, int64_t c, double *s1, double *s2, int dt)
{
    const void *side = p->side;
    float mhi = p->mhi[c], mlo = p->mlo[c], ya = p->ya[c], yb = p->yb[c];
    double a = 0.0, b = 0.0;
    for (int64_t r = 0; r < rows && b == b; r++) {
        int64_t i = r * w + j;
        float xv = ld1(x, i, dt), sv = side ? ld1(side, i, dt) : 0.0f;
        float g = cfbn_fused_g_f(p->act, p->act_alpha, ld1(dy, i, dt), xv, side != NULL, sv, mhi, mlo, ya, yb);
        float d = (xv - mhi) - mlo;
        a += (double)g;
        b += (double)g * (double)d;
    }
    *s1 = a;
    *s2 = b;
}

INLINE void fgstats_redo_columns(const void *dy, const void *x, int64_t rows, int64_t w, const cfbn_grad_f32 *p,
                                 double *acc, int dt)
{
    for (int64_t j = 0; j < w; j++) {
        int redo = needs_double(acc[j], acc[w + j], (double)rows, fabs(p->mhi[j]),
                                finite_f(p->mhi[j]) && finite_f(p->mlo[j]));
        if (redo) fgstats_column_pd(dy, x, rows, w, j, p, j, acc + j, acc + w + j, dt);
    }
}

/* rows of a multiple of 8 wider than 16 (gstats_rows8_ps with g for dy) */
INLINE void fgstats_rows8_ps(const void *dy, const void *x, const void *side, int64_t rows, int64_t w,
                             const cfbn_grad_f32 *p, int kind, int hs, vf al, int dt, double *acc)
{
    memset(acc, 0, (size_t)(2 * w) * sizeof *acc);
    const size_t es = dt ? 2 : 4, rs = (size_t)w * es;
    const vf z = vf_zero();
    void *go = p->g_out;
    int64_t r = 0;
    for (; r + 8 <= rows; r += 8) {
        const int64_t o = r * w;
        const char *bd = (const char *)dy + (size_t)o * es, *bx = (const char *)x + (size_t)o * es;
        const char *bs = hs ? (const char *)side + (size_t)o * es : NULL;
        for (int64_t j = 0; j < w; j += 8, bd += 8 * es, bx += 8 * es, bs = hs ? bs + 8 * es : NULL) {
            prefetch_group_l2(dy, o, j, es);
            prefetch_group_l2(x, o, j, es);
            if (hs) prefetch_group_l2(side, o, j, es);
            if (go) prefetch_group_l2(go, o, j, es);
            const vf q[4] = {vf_load(p->mhi + j), vf_load(p->mlo + j),
                                 vf_load(p->ya + j), vf_load(p->yb + j)};
            vf sg[4], sq[4];
            for (int k = 0; k < 4; k++) {
                vf x0 = vf_ld(bx + 2 * k * rs, 0, dt), x1 = vf_ld(bx + (2 * k + 1) * rs, 0, dt);
                vf s0 = hs ? vf_ld(bs + 2 * k * rs, 0, dt) : z, s1 = hs ? vf_ld(bs + (2 * k + 1) * rs, 0, dt) : z;
                vf g0 = fused_g_ps(vf_ld(bd + 2 * k * rs, 0, dt), x0, s0, q, kind, hs, al);
                vf g1 = fused_g_ps(vf_ld(bd + (2 * k + 1) * rs, 0, dt), x1, s1, q, kind, hs, al);
                st_g(go, o + 2 * k * w + j, g0, dt);
                st_g(go, o + (2 * k + 1) * w + j, g1, dt);
                vf u0 = vf_sub(x0, q[0]), u1 = vf_sub(x1, q[0]);
                sg[k] = vf_add(g0, g1);
                sq[k] = vf_fma(g1, u1, vf_mul(g0, u0));
            }
            vf t1 = vf_add(vf_add(sg[0], sg[1]), vf_add(sg[2], sg[3]));
            vf t2 = vf_add(vf_add(sq[0], sq[1]), vf_add(sq[2], sq[3]));
            add_block_mlo(acc, w, j, t1, t2, q[1]);
        }
    }
    for (; r < rows; r++) {
        for (int64_t j = 0; j < w; j += 8) {
            const vf q[4] = {vf_load(p->mhi + j), vf_load(p->mlo + j),
                                 vf_load(p->ya + j), vf_load(p->yb + j)};
            vf x0 = vf_ld(x, r * w + j, dt), s0 = hs ? vf_ld(side, r * w + j, dt) : z;
            vf g = fused_g_ps(vf_ld(dy, r * w + j, dt), x0, s0, q, kind, hs, al);
            st_g(go, r * w + j, g, dt);
            add_block(acc, w, j, g, vf_mul(g, centered_ps(x0, q[0], q[1])));
        }
    }
    if (any_suspect(acc, w, (double)rows)) fgstats_redo_columns(dy, x, rows, w, p, acc, dt);
}

/* a run: 128-element stretches summed as gstats_flat_ps's tree, the rest by
 * fgstats_flat_ps's double steps */
INLINE void fgstats_tree_vec(const void *dy, const void *x, const void *side, void *go, int64_t n, const vf *q,
                             int kind, int hs, vf al, int dt, vd *v1, vd *v2)
{
    const vf z = vf_zero();
    acc8 a = acc8_zero(), b = acc8_zero(), e, o;
    int64_t i = 0;
    for (; i + 128 <= n; i += 128) {
        vf g[8], d[8];
        for (int h = 0; h < 2; h++) {
            for (int k = 0; k < 8; k++) {
                int64_t e0 = i + 16 * k + 8 * h;
                if (!h) {
                    prefetch_ahead_of(x, e0, dt);
                    prefetch_ahead_of(dy, e0, dt);
                    if (hs) prefetch_ahead_of(side, e0, dt);
                    if (go) prefetch_ahead_of(go, e0, dt);
                }
                vf x0 = vf_ld(x, e0, dt), s0 = hs ? vf_ld(side, e0, dt) : z;
                g[k] = fused_g_ps(vf_ld(dy, e0, dt), x0, s0, q, kind, hs, al);
                st_g(go, e0, g[k], dt);
                d[k] = vf_sub(x0, q[0]);
            }
            gstats_tree_step(h ? &b : &a, g, d, q[1]);
        }
    }
    fgstats_flat_ps(elem_at(dy, i, dt), elem_at(x, i, dt), hs ? elem_at(side, i, dt) : NULL,
                    go ? (void *)elem_at(go, i, dt) : NULL, n - i, q, kind, hs, al, dt, &e, &o);
    *v1 = vd_add(vd_add(vd_add(a.s1lo, a.s1hi), vd_add(b.s1lo, b.s1hi)),
                        vd_add(vd_add(e.s1lo, e.s1hi), vd_add(o.s1lo, o.s1hi)));
    *v2 = vd_add(vd_add(vd_add(a.s2lo, a.s2hi), vd_add(b.s2lo, b.s2hi)),
                        vd_add(vd_add(e.s2lo, e.s2hi), vd_add(o.s2lo, o.s2hi)));
}

INLINE void fgstats_tree_ps(const void *dy, const void *x, const void *side, void *go, int64_t n, const vf *q,
                            int kind, int hs, vf al, int dt, double *acc)
{
    vd v1, v2;
    fgstats_tree_vec(dy, x, side, go, n, q, kind, hs, al, dt, &v1, &v2);
    acc[0] = vd_hsum(v1);
    acc[1] = vd_hsum(v2);
}

INLINE void fgstats_run_ps(const void *dy, const void *x, int64_t n, const cfbn_grad_f32 *p, double *acc, int dt)
{
    const vf al = vf_set1(p->act_alpha);
    vf q[8];
    fgrad_params_ps(p, 0, q);
    const void *side = p->side;
#define FGSTATS_RUN(k)                                                          \
    if (side) fgstats_tree_ps(dy, x, side, p->g_out, n, q, k, 1, al, dt, acc); \
    else fgstats_tree_ps(dy, x, NULL, p->g_out, n, q, k, 0, al, dt, acc)
    CFBN_ACT_SPECIALIZE(p->act, FGSTATS_RUN)
#undef FGSTATS_RUN
    if (n >= 128 && run_needs_double(acc, n, p)) fgstats_column_pd(dy, x, n, 1, 0, p, 0, acc, acc + 1, dt);
}

INLINE void fgstats_rows_ps(const void *dy, const void *x, int64_t rows, int64_t w, const cfbn_grad_f32 *p,
                            double *acc, int dt)
{
    if (w <= 0) return;
    const void *side = p->side;
    const vf al = vf_set1(p->act_alpha);
    if (w % 8 == 0 && w > 16) {
#define FGSTATS_ROWS8(k)                                                                \
    if (side) fgstats_rows8_ps(dy, x, side, rows, w, p, k, 1, al, dt, acc);           \
    else fgstats_rows8_ps(dy, x, NULL, rows, w, p, k, 0, al, dt, acc)
        CFBN_ACT_SPECIALIZE(p->act, FGSTATS_ROWS8)
#undef FGSTATS_ROWS8
        return;
    }
    if (16 % w == 0) {
        vf q[8];
        double s1[16], s2[16];
        lanes_ps(p->mhi, w, &q[0], &q[4]);
        lanes_ps(p->mlo, w, &q[1], &q[5]);
        q[2] = q[3] = q[6] = q[7] = vf_zero();
        if (p->act != CFBN_ACT_NONE) {
            lanes_ps(p->ya, w, &q[2], &q[6]);
            lanes_ps(p->yb, w, &q[3], &q[7]);
        }
        /* zero for a code outside enum cfbn_activation, which reaches no
         * call below (and -Wmaybe-uninitialized sees that path) */
        acc8 e = acc8_zero(), o = acc8_zero();
#define FGSTATS_FLAT(k)                                                                 \
    if (side) fgstats_flat_ps(dy, x, side, p->g_out, rows * w, q, k, 1, al, dt, &e, &o); \
    else fgstats_flat_ps(dy, x, NULL, p->g_out, rows * w, q, k, 0, al, dt, &e, &o)
        CFBN_ACT_SPECIALIZE(p->act, FGSTATS_FLAT)
#undef FGSTATS_FLAT
        acc8_store(&e, s1, s2);
        acc8_store(&o, s1 + 8, s2 + 8);
        fold_lanes(s1, 16, w, acc);
        fold_lanes(s2, 16, w, acc + w);
        return;
    }
#define FGSTATS_ROWS(k)                                                                 \
    if (side) fgstats_rows_w_ps(dy, x, side, rows, w, p, k, 1, al, dt, acc);          \
    else fgstats_rows_w_ps(dy, x, NULL, rows, w, p, k, 0, al, dt, acc)
    CFBN_ACT_SPECIALIZE(p->act, FGSTATS_ROWS)
#undef FGSTATS_ROWS
}

/* ---- gradient apply: dx = g a + ((x - mhi) - mlo) b + c, side_grad = g ---- */

/* q: mhi, mlo, ya, yb, a, b, c of even 8-blocks, then of odd blocks */
INLINE void fgapply_flat_ps(const void *dy, const void *x, const void *side, void *dx, void *sg, int64_t n,
                            const vf *q, int kind, int hs, vf al, int dt, int nt)
{
    const vf z = vf_zero();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        vf x0 = vf_ld(x, i, dt), x1 = vf_ld(x, i + 8, dt);
        vf s0 = hs ? vf_ld(side, i, dt) : z, s1 = hs ? vf_ld(side, i + 8, dt) : z;
        vf g0 = fused_g_ps(vf_ld(dy, i, dt), x0, s0, q, kind, hs, al);
        vf g1 = fused_g_ps(vf_ld(dy, i + 8, dt), x1, s1, q + 7, kind, hs, al);
        if (sg) {
            st8_out(sg, i, g0, dt, nt);
            st8_out(sg, i + 8, g1, dt, nt);
        }
        st8_out(dx, i, gapply_ps(g0, x0, q[0], q[1], q[4], q[5], q[6]), dt, nt);
        st8_out(dx, i + 8, gapply_ps(g1, x1, q[7], q[8], q[11], q[12], q[13]), dt, nt);
    }
    if (i + 8 <= n) {
        vf x0 = vf_ld(x, i, dt), s0 = hs ? vf_ld(side, i, dt) : z;
        vf g0 = fused_g_ps(vf_ld(dy, i, dt), x0, s0, q, kind, hs, al);
        if (sg) st8_out(sg, i, g0, dt, nt);
        st8_out(dx, i, gapply_ps(g0, x0, q[0], q[1], q[4], q[5], q[6]), dt, nt);
        i += 8;
    }
    if (i < n) {
        const vf *r = q + 7 * ((i >> 3) & 1);
        int64_t cnt = n - i;
        vf x0 = vf_ld_part(x, i, cnt, cnt, dt), s0 = hs ? vf_ld_part(side, i, cnt, cnt, dt) : z;
        vf g0 = fused_g_ps(vf_ld_part(dy, i, cnt, cnt, dt), x0, s0, r, kind, hs, al);
        if (sg) vf_st_part(sg, i, g0, cnt, dt);
        vf_st_part(dx, i, gapply_ps(g0, x0, r[0], r[1], r[4], r[5], r[6]), cnt, dt);
    }
}

INLINE void fgapply_rows_w_ps(const void *dy, const void *x, const void *side, void *dx, void *sg, int64_t rows,
                              int64_t w, const cfbn_grad_f32 *p, int kind, int hs, vf al, int dt, int nt)
{
    const float *ya = yab_ps(p->ya, p), *yb = yab_ps(p->yb, p);
    const float *const v[7] = {p->mhi, p->mlo, ya, yb, p->a, p->b, p->c};
    const int64_t full = w & ~(int64_t)7, cnt = w - full, n = rows * w;
    const vf z = vf_zero();
    vf t[7];
    tail_params_ps(v, 7, full, cnt, t);
    /* blocks of 8 rows, each 8-column group's 7 parameters loaded once per
     * block (loaded per row, they outnumber the data loads); one row at a
     * time with streaming stores, which must fill each line in turn.  A
     * block's loads come from 8 rows at once, which the hardware
     * prefetchers follow poorly from DRAM: each column group prefetches its
     * share of the inputs ahead, as gstats_rows8_ps does (measured on 25088
     * rows of 128, relu, one thread: 1.00 -> 0.40 ns an element, the plain
     * gapply_rows 0.38).  The streaming walk, a row at a time, prefetches a
     * line of each input FLAT_PREFETCH_BYTES ahead, as the plain streaming
     * loops do: without it its loads waited on memory ((32,56,56,64) relu,
     * one thread: 11.1 -> 7.6 ms). */
    const int64_t kb = nt ? 1 : 8;
    const size_t es = dt ? 2 : 4;
    for (int64_t r = 0; r < rows; r += kb) {
        const int64_t kr = rows - r < kb ? rows - r : kb, o = r * w;
        for (int64_t j = 0; j < full; j += 8) {
            if (kr == 8) {
                prefetch_group_l2(dy, o, j, es);
                prefetch_group_l2(x, o, j, es);
                if (hs) prefetch_group_l2(side, o, j, es);
                prefetch_group_l2(dx, o, j, es);
            } else if (nt && !((o + j) & (int64_t)(64 / es - 1))) {
                prefetch_ahead_of(dy, o + j, dt);
                prefetch_ahead_of(x, o + j, dt);
                if (hs) prefetch_ahead_of(side, o + j, dt);
            }
            vf q[7];
            col_params_ps(v, 7, j, q);
            for (int64_t k = 0; k < kr; k++) {
                const int64_t e = o + k * w + j;
                vf x0 = vf_ld(x, e, dt), s0 = hs ? vf_ld(side, e, dt) : z;
                vf g0 = fused_g_ps(vf_ld(dy, e, dt), x0, s0, q, kind, hs, al);
                if (sg) st8_out(sg, e, g0, dt, nt);
                st8_out(dx, e, gapply_ps(g0, x0, q[0], q[1], q[4], q[5], q[6]), dt, nt);
            }
        }
        for (int64_t k = 0; cnt && k < kr; k++) {
            const int64_t e = o + k * w + full, av = n - e;
            vf x0 = vf_ld_part(x, e, cnt, av, dt), s0 = hs ? vf_ld_part(side, e, cnt, av, dt) : z;
            vf g0 = fused_g_ps(vf_ld_part(dy, e, cnt, av, dt), x0, s0, t, kind, hs, al);
            if (sg) vf_st_part(sg, e, g0, cnt, dt);
            vf_st_part(dx, e, gapply_ps(g0, x0, t[0], t[1], t[4], t[5], t[6]), cnt, dt);
        }
    }
}

INLINE void fgapply_run_ps(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f32 *p, int dt)
{
    const int nt = fused_nt(p->stream, dt, dx, p->side_grad ? p->side_grad : dx, 0);
    const vf al = vf_set1(p->act_alpha);
    vf q[14];
    fgrad_params_ps(p, 1, q);
    const void *side = p->side;
    void *sg = p->side_grad;
#define FGAPPLY_RUN(k)                                                          \
    if (side) fgapply_flat_ps(dy, x, side, dx, sg, n, q, k, 1, al, dt, nt);   \
    else fgapply_flat_ps(dy, x, NULL, dx, sg, n, q, k, 0, al, dt, nt)
    CFBN_ACT_SPECIALIZE(p->act, FGAPPLY_RUN)
#undef FGAPPLY_RUN
    if (nt) stream_fence();
}

INLINE void fgapply_rows_ps(const void *dy, const void *x, void *dx, int64_t rows, int64_t w, const cfbn_grad_f32 *p,
                            int dt)
{
    const int nt = fused_nt(p->stream, dt, dx, p->side_grad ? p->side_grad : dx, w);
    if (w <= 0) return;
    const void *side = p->side;
    void *sg = p->side_grad;
    const vf al = vf_set1(p->act_alpha);
    if (16 % w == 0) {
        vf q[14];
        lanes_ps(p->mhi, w, &q[0], &q[7]);
        lanes_ps(p->mlo, w, &q[1], &q[8]);
        q[2] = q[3] = q[9] = q[10] = vf_zero();
        if (p->act != CFBN_ACT_NONE) {
            lanes_ps(p->ya, w, &q[2], &q[9]);
            lanes_ps(p->yb, w, &q[3], &q[10]);
        }
        lanes_ps(p->a, w, &q[4], &q[11]);
        lanes_ps(p->b, w, &q[5], &q[12]);
        lanes_ps(p->c, w, &q[6], &q[13]);
#define FGAPPLY_FLAT(k)                                                                 \
    if (side) fgapply_flat_ps(dy, x, side, dx, sg, rows * w, q, k, 1, al, dt, nt);    \
    else fgapply_flat_ps(dy, x, NULL, dx, sg, rows * w, q, k, 0, al, dt, nt)
        CFBN_ACT_SPECIALIZE(p->act, FGAPPLY_FLAT)
#undef FGAPPLY_FLAT
        if (nt) stream_fence();
        return;
    }
#define FGAPPLY_ROWS(k)                                                                 \
    if (side) fgapply_rows_w_ps(dy, x, side, dx, sg, rows, w, p, k, 1, al, dt, nt);   \
    else fgapply_rows_w_ps(dy, x, NULL, dx, sg, rows, w, p, k, 0, al, dt, nt)
    CFBN_ACT_SPECIALIZE(p->act, FGAPPLY_ROWS)
#undef FGAPPLY_ROWS
    if (nt) stream_fence();
}

/* Several runs of one channel (cfbn.h: runs, stride) in one call, without the
 * fused or streaming variants: parameters broadcast once, and the gradient
 * sums stay in vector registers across runs, added up once at the end.
 * Each run first prefetches the next channel's (bn_runs.h). */

INLINE void apply_runs_ps(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p, int dt)
{
    vf m = vf_set1(p->mhi[0]), l = vf_set1(p->mlo[0]);
    vf a = vf_set1(p->alpha[0]), b = vf_set1(p->beta[0]);
    const vf q[8] = {m, l, a, b, m, l, a, b};
    for (int64_t k = 0; k < p->runs; k++) {
        prefetch_next_run(elem_at(x, k * p->stride, dt), n * (dt ? 2 : 4));
        if (k + 1 < p->runs) prefetch_run_out(elem_at(y, (k + 1) * p->stride, dt), n * (dt ? 2 : 4));
        apply_uni_ps(elem_at(x, k * p->stride, dt), (void *)elem_at(y, k * p->stride, dt), n, q, dt);
    }
}

/* Short runs (up to SHORT_RUN elements, such as 7x7 planes) go 8 runs at a
 * time: the 8 runs' vectors at each position are summed pairwise in float,
 * like 8 rows of the rows kernels, and widened once, which halves the work
 * per element against one run after another.  Not when the stride is a
 * multiple of 4 KB: the 8 runs' lines of both tensors would then share one
 * L1 set, more than its 8 ways. */
#define SHORT_RUN 256

/* The first runs of a call taken 8 at a time while 8 remain, for short runs
 * (see above): their sums added to s1, s2; returns the number of runs done.
 * g = fused_g_ps(dy, ...) (dy itself with CFBN_ACT_NONE), q its parameters
 * (mhi, mlo, ya, yb).  Dead lanes of a run's tail: g masked to 0, d = 0 - 0. */
INLINE int64_t gstats_runs8_ps(const void *dy, const void *x, const void *side, void *go, int64_t n, int64_t runs,
                               int64_t st, const vf *q, int kind, int hs, vf al, int dt, vd *s1,
                               vd *s2)
{
    const vf z = vf_zero();
    const int64_t full = n & ~(int64_t)7, cnt = n - full;
    const __m256i mk = vf_mask_first(cnt);
    const vf tm = vf_keep(q[0], mk), tl = vf_keep(q[1], mk);
    int64_t k = 0;
    for (; k + 8 <= runs; k += 8) {
        acc8 a = acc8_zero();
        vf g[8], d[8];
        for (int64_t i = 0; i < full; i += 8) {
            for (int r = 0; r < 8; r++) {
                const int64_t e = (k + r) * st + i;
                vf x0 = vf_ld(x, e, dt), s0 = hs ? vf_ld(side, e, dt) : z;
                g[r] = fused_g_ps(vf_ld(dy, e, dt), x0, s0, q, kind, hs, al);
                st_g(go, e, g[r], dt);
                d[r] = vf_sub(x0, q[0]);
            }
            gstats_tree_step(&a, g, d, q[1]);
        }
        if (cnt) {
            for (int r = 0; r < 8; r++) {
                const int64_t e = (k + r) * st + full;
                vf x0 = vf_ld_part(x, e, cnt, cnt, dt), s0 = hs ? vf_ld_part(side, e, cnt, cnt, dt) : z;
                g[r] = vf_keep(fused_g_ps(vf_ld_part(dy, e, cnt, cnt, dt), x0, s0, q, kind, hs, al), mk);
                st_g_part(go, e, g[r], cnt, dt);
                d[r] = vf_sub(x0, tm);
            }
            gstats_tree_step(&a, g, d, tl);
        }
        *s1 = vd_add(*s1, vd_add(a.s1lo, a.s1hi));
        *s2 = vd_add(*s2, vd_add(a.s2lo, a.s2hi));
    }
    return k;
}

INLINE void gstats_runs_ps(const void *dy, const void *x, int64_t n, const cfbn_grad_f32 *p, double *acc, int dt)
{
    vf m = vf_set1(p->mhi[0]), l = vf_set1(p->mlo[0]);
    const vf q[4] = {m, l, m, l};
    vd s1 = vd_zero(), s2 = vd_zero();
    const int64_t st = p->stride;
    int64_t k = 0;
    if (n <= SHORT_RUN && (st * (dt ? 2 : 4)) % 4096 != 0)
        k = gstats_runs8_ps(dy, x, NULL, NULL, n, p->runs, st, q, CFBN_ACT_NONE, 0, vf_zero(), dt, &s1,
                            &s2);
    for (; k < p->runs; k++) {
        acc8 a, b;
        prefetch_next_run(elem_at(dy, k * st, dt), n * (dt ? 2 : 4));
        prefetch_next_run(elem_at(x, k * st, dt), n * (dt ? 2 : 4));
        gstats_flat_ps(elem_at(dy, k * st, dt), elem_at(x, k * st, dt), n, q, dt, 1, &a, &b);
        s1 = vd_add(s1, vd_add(vd_add(a.s1lo, a.s1hi), vd_add(b.s1lo, b.s1hi)));
        s2 = vd_add(s2, vd_add(vd_add(a.s2lo, a.s2hi), vd_add(b.s2lo, b.s2hi)));
    }
    acc[0] = vd_hsum(s1);
    acc[1] = vd_hsum(s2);
    /* one channel's runs: checked once, on the totals (the losses bound by
     * needs_double add up over the runs as the sums do) */
    if (run_needs_double(acc, n * p->runs, p)) gstats_runs_pd(dy, x, n, p->runs, st, p, acc, dt);
}

/* Statistics of one channel's runs.  Short runs go 8 at a time as
 * gstats_runs8_ps's: d = x - k, k the shift rounded to float, the 8 runs'
 * vectors at each position summed pairwise in float and widened once; the
 * runs left over and the rounding of k (as in stats_run_ps), checked once
 * on the totals.  Long runs go one by one through stats_run_ps. */
/* Adds the sums of runs [r0, runs) to s, one run at a time: by stats_run_ps,
 * or with pd by stats_run_pd (every element in double) */
INLINE void stats_each_run(const void *x, int64_t n, int64_t r0, int64_t runs, int64_t st, double shift, int pd,
                           double *s, int dt)
{
    for (int64_t r = r0; r < runs; r++) {
        double one[2];
        prefetch_next_run(elem_at(x, r * st, dt), n * (dt ? 2 : 4));
        if (pd) stats_run_pd(elem_at(x, r * st, dt), n, shift, one, dt);
        else stats_run_ps(elem_at(x, r * st, dt), n, shift, one, dt);
        s[0] += one[0];
        s[1] += one[1];
    }
}

INLINE void stats_runs_ps(const void *x, int64_t n, int64_t runs, int64_t st, double shift, double *acc, int dt)
{
    acc[0] = acc[1] = 0.0;
    if (n > SHORT_RUN || (st * (dt ? 2 : 4)) % 4096 == 0 || runs < 8) {
        stats_each_run(x, n, 0, runs, st, shift, 0, acc, dt);
        return;
    }
    const float kf = (float)shift;
    const vf k = vf_set1(kf);
    const int64_t full = n & ~(int64_t)7, cnt = n - full;
    /* dead lanes of a run shorter than 8: x reads as 0 and k is masked to 0 */
    const vf tk = vf_keep(k, vf_mask_first(cnt));
    const __m256i last = _mm256_cmpgt_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                            _mm256_set1_epi32((int)(7 - cnt)));
    acc8 a = acc8_zero();
    int64_t r = 0;
    for (; r + 8 <= runs; r += 8) {
        vf d[8];
        for (int64_t i = 0; i < full; i += 8) {
            for (int j = 0; j < 8; j++) d[j] = sub_ps(vf_ld(x, (r + j) * st + i, dt), k);
            stats_block_add(&a, d);
        }
        if (cnt && full) {
            /* the run's last 8 elements, the lanes already summed masked off */
            for (int j = 0; j < 8; j++) d[j] = vf_keep(vf_sub(vf_ld(x, (r + j) * st + n - 8, dt), k), last);
            stats_block_add(&a, d);
        } else if (cnt) {
            for (int j = 0; j < 8; j++) d[j] = vf_sub(vf_ld_part(x, (r + j) * st, cnt, cnt, dt), tk);
            stats_block_add(&a, d);
        }
    }
    double s[2] = {vd_hsum(vd_add(a.s1lo, a.s1hi)), vd_hsum(vd_add(a.s2lo, a.s2hi))};
    stats_each_run(x, n, r, runs, st, (double)kf, 1, s, dt);
    const double count = (double)n * (double)runs, e = (double)kf - shift, ne = count * e;
    acc[0] = s[0] + ne;
    acc[1] = s[1] + e * (2.0 * s[0] + ne);
    if (needs_double(acc[0], acc[1], count, -1.0, 1)) {
        acc[0] = acc[1] = 0.0;
        stats_each_run(x, n, 0, runs, st, shift, 1, acc, dt);
    }
}

INLINE void gapply_runs_ps(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f32 *p, int dt)
{
    vf m = vf_set1(p->mhi[0]), l = vf_set1(p->mlo[0]);
    vf a = vf_set1(p->a[0]), b = vf_set1(p->b[0]), c = vf_set1(p->c[0]);
    const vf q[10] = {m, l, a, b, c, m, l, a, b, c};
    for (int64_t k = 0; k < p->runs; k++) {
        prefetch_next_run(elem_at(dy, k * p->stride, dt), n * (dt ? 2 : 4));
        prefetch_next_run(elem_at(x, k * p->stride, dt), n * (dt ? 2 : 4));
        if (k + 1 < p->runs) prefetch_run_out(elem_at(dx, (k + 1) * p->stride, dt), n * (dt ? 2 : 4));
        gapply_uni_ps(elem_at(dy, k * p->stride, dt), elem_at(x, k * p->stride, dt),
                       (void *)elem_at(dx, k * p->stride, dt), n, q, dt);
    }
}

/* Fused runs (cfbn.h: *_runs_fused): as the plain runs kernels, with the
 * activation chosen and the parameters broadcast once per call rather than
 * once per run, and regular stores.  The gradient sums of short runs go 8
 * runs at a time as gstats_runs_ps's, longer ones run by run as
 * fgstats_tree_ps sums, all added up in vector registers.  Unlike the plain
 * sums, 8 at a time also at strides of a multiple of 4 KB: the activation's
 * arithmetic hides the L1 set conflicts there.  Measured on (32,256,14,14)
 * NCHW (strides of 49 pages), relu gradient over the plain one, one thread:
 * 1.32 run by run, 1.18 8 runs at a time. */
INLINE void fapply_runs_k(const void *x, const void *side, void *y, int64_t n, int64_t runs, int64_t st,
                          const vf *q, int kind, int hs, vf al, int dt)
{
    for (int64_t k = 0; k < runs; k++) {
        prefetch_next_run(elem_at(x, k * st, dt), n * (dt ? 2 : 4));
        if (hs) prefetch_next_run(elem_at(side, k * st, dt), n * (dt ? 2 : 4));
        if (k + 1 < runs) prefetch_run_out(elem_at(y, (k + 1) * st, dt), n * (dt ? 2 : 4));
        fapply_flat_ps(elem_at(x, k * st, dt), hs ? elem_at(side, k * st, dt) : NULL,
                       (void *)elem_at(y, k * st, dt), n, q, kind, hs, al, dt, 0);
    }
}

INLINE void fapply_runs_ps(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p, int dt)
{
    const vf al = vf_set1(p->act_alpha);
    vf q[8];
    fapply_params_ps(p, q);
    const void *side = p->side;
#define FAPPLY_RUNS(k)                                                              \
    if (side) fapply_runs_k(x, side, y, n, p->runs, p->stride, q, k, 1, al, dt);  \
    else fapply_runs_k(x, NULL, y, n, p->runs, p->stride, q, k, 0, al, dt)
    CFBN_ACT_SPECIALIZE(p->act, FAPPLY_RUNS)
#undef FAPPLY_RUNS
}

/* The fused gradient sums of runs, every product and sum in double (for
 * sums whose float blocks left float's range, needs_double) */
COLD void fgstats_runs_pd(const void *dy, const void *x, int64_t n, const cfbn_grad_f32 *p, double *acc, int dt)
{
    cfbn_grad_f32 q = *p;
    double s1 = 0.0, s2 = 0.0;
    for (int64_t k = 0; k < p->runs; k++) {
        double a, b;
        q.side = p->side ? elem_at(p->side, k * p->stride, dt) : NULL;
        fgstats_column_pd(elem_at(dy, k * p->stride, dt), elem_at(x, k * p->stride, dt), n, 1, 0, &q, 0, &a, &b,
                          dt);
        s1 += a;
        s2 += b;
    }
    acc[0] = s1;
    acc[1] = s2;
}

INLINE void fgstats_runs_k(const void *dy, const void *x, const void *side, void *go, int64_t n, int64_t runs,
                           int64_t st, const vf *q, int kind, int hs, vf al, int dt, double *acc)
{
    vd s1 = vd_zero(), s2 = vd_zero();
    int64_t k = 0;
    if (n <= SHORT_RUN) k = gstats_runs8_ps(dy, x, side, go, n, runs, st, q, kind, hs, al, dt, &s1, &s2);
    for (; k < runs; k++) {
        vd v1, v2;
        prefetch_next_run(elem_at(dy, k * st, dt), n * (dt ? 2 : 4));
        prefetch_next_run(elem_at(x, k * st, dt), n * (dt ? 2 : 4));
        if (hs) prefetch_next_run(elem_at(side, k * st, dt), n * (dt ? 2 : 4));
        fgstats_tree_vec(elem_at(dy, k * st, dt), elem_at(x, k * st, dt), hs ? elem_at(side, k * st, dt) : NULL,
                         go ? (void *)elem_at(go, k * st, dt) : NULL, n, q, kind, hs, al, dt, &v1, &v2);
        s1 = vd_add(s1, v1);
        s2 = vd_add(s2, v2);
    }
    acc[0] = vd_hsum(s1);
    acc[1] = vd_hsum(s2);
}

INLINE void fgstats_runs_ps(const void *dy, const void *x, int64_t n, const cfbn_grad_f32 *p, double *acc, int dt)
{
    const vf al = vf_set1(p->act_alpha);
    vf q[8];
    fgrad_params_ps(p, 0, q);
    const void *side = p->side;
#define FGSTATS_RUNS(k)                                                                      \
    if (side) fgstats_runs_k(dy, x, side, p->g_out, n, p->runs, p->stride, q, k, 1, al, dt, acc); \
    else fgstats_runs_k(dy, x, NULL, p->g_out, n, p->runs, p->stride, q, k, 0, al, dt, acc)
    CFBN_ACT_SPECIALIZE(p->act, FGSTATS_RUNS)
#undef FGSTATS_RUNS
    /* checked once, on the totals, as gstats_runs_ps does */
    if (run_needs_double(acc, n * p->runs, p)) fgstats_runs_pd(dy, x, n, p, acc, dt);
}

INLINE void fgapply_runs_k(const void *dy, const void *x, const void *side, void *dx, void *sg, int64_t n,
                           int64_t runs, int64_t st, const vf *q, int kind, int hs, vf al, int dt)
{
    for (int64_t k = 0; k < runs; k++) {
        prefetch_next_run(elem_at(dy, k * st, dt), n * (dt ? 2 : 4));
        prefetch_next_run(elem_at(x, k * st, dt), n * (dt ? 2 : 4));
        if (hs) prefetch_next_run(elem_at(side, k * st, dt), n * (dt ? 2 : 4));
        if (k + 1 < runs) {
            prefetch_run_out(elem_at(dx, (k + 1) * st, dt), n * (dt ? 2 : 4));
            if (sg) prefetch_run_out(elem_at(sg, (k + 1) * st, dt), n * (dt ? 2 : 4));
        }
        fgapply_flat_ps(elem_at(dy, k * st, dt), elem_at(x, k * st, dt), hs ? elem_at(side, k * st, dt) : NULL,
                        (void *)elem_at(dx, k * st, dt), sg ? (void *)elem_at(sg, k * st, dt) : NULL, n, q, kind,
                        hs, al, dt, 0);
    }
}

INLINE void fgapply_runs_ps(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f32 *p, int dt)
{
    const vf al = vf_set1(p->act_alpha);
    vf q[14];
    fgrad_params_ps(p, 1, q);
    const void *side = p->side;
    void *sg = p->side_grad;
#define FGAPPLY_RUNS(k)                                                                      \
    if (side) fgapply_runs_k(dy, x, side, dx, sg, n, p->runs, p->stride, q, k, 1, al, dt);  \
    else fgapply_runs_k(dy, x, NULL, dx, sg, n, p->runs, p->stride, q, k, 0, al, dt)
    CFBN_ACT_SPECIALIZE(p->act, FGAPPLY_RUNS)
#undef FGAPPLY_RUNS
}

/* The runs and streaming entries of a storage type, like bn_entries.h's. */
#define EXTRA_ENTRIES(sfx, DT)                                                                                \
    static void apply_runs_##sfx(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p)                 \
    {                                                                                                         \
        apply_runs_ps(x, y, n, p, DT);                                                                        \
    }                                                                                                         \
    static void gstats_runs_##sfx(const void *dy, const void *x, int64_t n, const cfbn_grad_f32 *p,           \
                                  double *acc)                                                                \
    {                                                                                                         \
        gstats_runs_ps(dy, x, n, p, acc, DT);                                                                 \
    }                                                                                                         \
    static void gapply_runs_##sfx(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f32 *p) \
    {                                                                                                         \
        gapply_runs_ps(dy, x, dx, n, p, DT);                                                                  \
    }                                                                                                         \
    static void stats_runs_##sfx(const void *x, int64_t n, int64_t runs, int64_t stride, double shift,        \
                                 double *acc)                                                                 \
    {                                                                                                         \
        stats_runs_ps(x, n, runs, stride, shift, acc, DT);                                                    \
    }                                                                                                         \
    static void apply_runs_fused_##sfx(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p)            \
    {                                                                                                         \
        fapply_runs_ps(x, y, n, p, DT);                                                                       \
    }                                                                                                         \
    static void gstats_runs_fused_##sfx(const void *dy, const void *x, int64_t n, const cfbn_grad_f32 *p,     \
                                        double *acc)                                                          \
    {                                                                                                         \
        fgstats_runs_ps(dy, x, n, p, acc, DT);                                                                \
    }                                                                                                         \
    static void gapply_runs_fused_##sfx(const void *dy, const void *x, void *dx, int64_t n,                   \
                                        const cfbn_grad_f32 *p)                                               \
    {                                                                                                         \
        fgapply_runs_ps(dy, x, dx, n, p, DT);                                                                 \
    }                                                                                                         \
    static void apply_run_nt_##sfx(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p)               \
    {                                                                                                         \
        apply_run_nt_ps(x, y, n, p, DT);                                                                      \
    }                                                                                                         \
    static void apply_rows_nt_##sfx(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f32 *p) \
    {                                                                                                         \
        apply_rows_nt_ps(x, y, rows, w, p, DT);                                                               \
    }                                                                                                         \
    static void gapply_run_nt_##sfx(const void *dy, const void *x, void *dx, int64_t n,                       \
                                    const cfbn_grad_f32 *p)                                                   \
    {                                                                                                         \
        gapply_run_nt_ps(dy, x, dx, n, p, DT);                                                                \
    }                                                                                                         \
    static void gapply_rows_nt_##sfx(const void *dy, const void *x, void *dx, int64_t rows, int64_t w,        \
                                     const cfbn_grad_f32 *p)                                                  \
    {                                                                                                         \
        gapply_rows_nt_ps(dy, x, dx, rows, w, p, DT);                                                         \
    }
#define EXTRA_TABLE(sfx)                                                                                      \
    .apply_runs = apply_runs_##sfx, .gstats_runs = gstats_runs_##sfx, .gapply_runs = gapply_runs_##sfx,       \
    .stats_runs = stats_runs_##sfx,                                                                           \
    .apply_runs_fused = apply_runs_fused_##sfx, .gstats_runs_fused = gstats_runs_fused_##sfx,                 \
    .gapply_runs_fused = gapply_runs_fused_##sfx,                                                             \
    .apply_run_stream = apply_run_nt_##sfx, .apply_rows_stream = apply_rows_nt_##sfx,                         \
    .gapply_run_stream = gapply_run_nt_##sfx, .gapply_rows_stream = gapply_rows_nt_##sfx

EXTRA_ENTRIES(f32, CFBN_F32)
EXTRA_ENTRIES(f16, CFBN_F16)
EXTRA_ENTRIES(bf16, CFBN_BF16)

/* ---- second-order gradient: its loops, written once for every ISA ---- */
#include "bn_simd_gg.c"

/* ---- float32, float16 and bfloat16 entries ---- */

CFBN_FLOAT_ENTRIES(f32, CFBN_F32, ps)
CFBN_FLOAT_ENTRIES(f16, CFBN_F16, ps)
CFBN_FLOAT_ENTRIES(bf16, CFBN_BF16, ps)

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
