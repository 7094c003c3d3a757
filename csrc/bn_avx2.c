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
#include "bn_simd_float.c"

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
