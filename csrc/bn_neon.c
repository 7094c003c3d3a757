/* NEON kernels for the aarch64 baseline (Advanced SIMD and the half <-> float
 * conversions are architectural there, so no feature test is needed; bfloat16
 * is converted by integer shifts, so ARMv8.6's BFCVT is not needed either).
 * Same contracts as bn_scalar.c; everything static except the table.
 *
 * f32, f16 and bf16 share their bodies (a constant `dt`, the storage type,
 * that always_inline folds away; bn_entries.h makes the entries); f64 has
 * its own.  Rows kernels whose width divides the stream
 * period (8 floats, 4 doubles) run as one flat stream with per-lane
 * parameters, because then every lane always sees the same column; other
 * widths go row by row with a partial block at the end of each row.
 *
 * Fused activations: relu, relu6 and leaky relu by max/min/select; elu,
 * sigmoid, tanh and silu through exp_s, a Cephes-style expf.  For float and
 * 2-byte tensors they run inside the vector loops of the *_fused entries;
 * float64 tensors take the routing layer's fallback (these plain kernels
 * over L1-sized blocks, bn_math.h's libm formulas).
 *
 * The second-order gradient's entries (gg*) exist for all four dtypes. */
#include "cfbn.h"

#if defined(__aarch64__)

#include <arm_neon.h>
#include <string.h>

#include "bn_act.h"
#include "bn_entries.h"
#include "storage.h"

#define INLINE static inline __attribute__((always_inline))

/* ---- masks: lanes [0, cnt) set ---- */

INLINE uint32x4_t mask_s(int64_t cnt)
{
    static const uint32_t idx[4] = {0, 1, 2, 3};
    return vcltq_u32(vld1q_u32(idx), vdupq_n_u32((uint32_t)cnt));
}

/* lanes of the low (part 0) or high (part 1) double pair of a 4-lane block */
INLINE uint64x2_t mask_d(int64_t cnt, int part)
{
    static const uint64_t idx[4] = {0, 1, 2, 3};
    return vcltq_u64(vld1q_u64(idx + 2 * part), vdupq_n_u64((uint64_t)cnt));
}

INLINE float32x4_t and_s(float32x4_t v, uint32x4_t m)
{
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v), m));
}

INLINE float64x2_t and_d(float64x2_t v, uint64x2_t m)
{
    return vreinterpretq_f64_u64(vandq_u64(vreinterpretq_u64_f64(v), m));
}

/* ---- element access: 4 lanes of float; dt is the tensor's storage
 * (CFBN_F32, CFBN_F16, CFBN_BF16) ---- */

/* 4 halfwords -> 4 floats */
INLINE float32x4_t widen_h(uint16x4_t h, int dt)
{
    if (dt == CFBN_BF16) return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
    return vcvt_f32_f16(vreinterpret_f16_u16(h));
}

/* 4 floats -> 4 halfwords, to nearest even.  bfloat16: storage.h's rule
 * (cfbn_bf16_round_bits, NaN made quiet) on 4 lanes. */
INLINE uint16x4_t narrow_h(float32x4_t v, int dt)
{
    if (dt != CFBN_BF16) return vreinterpret_u16_f16(vcvt_f16_f32(v));
    uint32x4_t b = vreinterpretq_u32_f32(v);
    uint32x4_t lsb = vandq_u32(vshrq_n_u32(b, 16), vdupq_n_u32(1));
    uint32x4_t r = vaddq_u32(b, vaddq_u32(lsb, vdupq_n_u32(CFBN_BF16_ROUND_HALF)));
    uint32x4_t num = vceqq_f32(v, v);
    r = vbslq_u32(num, r, vorrq_u32(b, vdupq_n_u32(CFBN_BF16_QUIET)));
    return vshrn_n_u32(r, 16);
}

INLINE float32x4_t ld4(const void *p, int64_t i, int dt)
{
    if (dt) return widen_h(vld1_u16((const uint16_t *)p + i), dt);
    return vld1q_f32((const float *)p + i);
}

/* The first cnt (1..3) elements at p[i], zero in the other lanes.  avail is
 * how many elements p[i..] holds: nothing past it is read, so a slice that
 * ends at a page boundary never faults. */
INLINE float32x4_t ld_part(const void *p, int64_t i, int64_t cnt, int64_t avail, int dt)
{
    if (avail >= 4) return and_s(ld4(p, i, dt), mask_s(cnt));
    if (dt) {
        uint16_t buf[4] = {0};
        memcpy(buf, (const uint16_t *)p + i, (size_t)cnt * sizeof *buf);
        return widen_h(vld1_u16(buf), dt);
    }
    float buf[4] = {0};
    memcpy(buf, (const float *)p + i, (size_t)cnt * sizeof *buf);
    return vld1q_f32(buf);
}

INLINE void st4(void *p, int64_t i, float32x4_t v, int dt)
{
    if (dt) vst1_u16((uint16_t *)p + i, narrow_h(v, dt));
    else vst1q_f32((float *)p + i, v);
}

/* Writes exactly cnt (1..3) elements: a neighbouring element may belong to
 * another thread's piece (or be the next row's input when y aliases x). */
INLINE void st_part(void *p, int64_t i, float32x4_t v, int64_t cnt, int dt)
{
    if (dt) {
        uint16_t buf[4];
        vst1_u16(buf, narrow_h(v, dt));
        memcpy((uint16_t *)p + i, buf, (size_t)cnt * sizeof *buf);
    } else {
        float buf[4];
        vst1q_f32(buf, v);
        memcpy((float *)p + i, buf, (size_t)cnt * sizeof *buf);
    }
}

/* Double sums for 4 float lanes: s1 = sum d or sum dy, s2 = sum d^2 or sum dy*d. */
typedef struct {
    float64x2_t s1lo, s1hi, s2lo, s2hi;
} acc4;

INLINE acc4 acc4_zero(void)
{
    float64x2_t z = vdupq_n_f64(0.0);
    acc4 a = {z, z, z, z};
    return a;
}

INLINE acc4 acc4_add(acc4 a, acc4 b)
{
    acc4 r = {vaddq_f64(a.s1lo, b.s1lo), vaddq_f64(a.s1hi, b.s1hi), vaddq_f64(a.s2lo, b.s2lo), vaddq_f64(a.s2hi, b.s2hi)};
    return r;
}

INLINE acc4 acc4_load(const double *s1, const double *s2)
{
    acc4 a = {vld1q_f64(s1), vld1q_f64(s1 + 2), vld1q_f64(s2), vld1q_f64(s2 + 2)};
    return a;
}

INLINE void acc4_store(const acc4 *a, double *s1, double *s2)
{
    vst1q_f64(s1, a->s1lo);
    vst1q_f64(s1 + 2, a->s1hi);
    vst1q_f64(s2, a->s2lo);
    vst1q_f64(s2 + 2, a->s2hi);
}

/* The shift is subtracted in double: x - shift is exact there for any float
 * x near the shift, which keeps sum d^2 free of cancellation. */
INLINE void stats_step(acc4 *a, float32x4_t x, float64x2_t shlo, float64x2_t shhi)
{
    float64x2_t dlo = vsubq_f64(vcvt_f64_f32(vget_low_f32(x)), shlo);
    float64x2_t dhi = vsubq_f64(vcvt_high_f64_f32(x), shhi);
    a->s1lo = vaddq_f64(a->s1lo, dlo);
    a->s1hi = vaddq_f64(a->s1hi, dhi);
    a->s2lo = vfmaq_f64(a->s2lo, dlo, dlo);
    a->s2hi = vfmaq_f64(a->s2hi, dhi, dhi);
}

INLINE void gstats_step(acc4 *a, float32x4_t g, float32x4_t d)
{
    float64x2_t glo = vcvt_f64_f32(vget_low_f32(g)), ghi = vcvt_high_f64_f32(g);
    a->s1lo = vaddq_f64(a->s1lo, glo);
    a->s1hi = vaddq_f64(a->s1hi, ghi);
    a->s2lo = vfmaq_f64(a->s2lo, glo, vcvt_f64_f32(vget_low_f32(d)));
    a->s2hi = vfmaq_f64(a->s2hi, ghi, vcvt_high_f64_f32(d));
}

/* Two subtractions in this order: x - mhi is exact when x is near the mean
 * (Sterbenz), so a mean much larger than the spread loses nothing. */
INLINE float32x4_t centered_s(float32x4_t x, float32x4_t mhi, float32x4_t mlo)
{
    return vsubq_f32(vsubq_f32(x, mhi), mlo);
}

INLINE float32x4_t apply_s(float32x4_t x, float32x4_t mhi, float32x4_t mlo, float32x4_t al, float32x4_t be)
{
    return vfmaq_f32(be, centered_s(x, mhi, mlo), al);
}

INLINE float32x4_t gapply_s(float32x4_t g, float32x4_t x, float32x4_t mhi, float32x4_t mlo, float32x4_t a,
                            float32x4_t b, float32x4_t c)
{
    return vfmaq_f32(vfmaq_f32(c, centered_s(x, mhi, mlo), b), g, a);
}

INLINE double sum_acc_s1(acc4 a) { return vaddvq_f64(vaddq_f64(a.s1lo, a.s1hi)); }
INLINE double sum_acc_s2(acc4 a) { return vaddvq_f64(vaddq_f64(a.s2lo, a.s2hi)); }

/* acc[j] = sum of lanes[l] over l = j, j + w, ... < period (w divides period) */
static void fold_lanes(const double *lanes, int64_t period, int64_t w, double *acc)
{
    for (int64_t j = 0; j < w; j++) {
        double s = 0.0;
        for (int64_t l = j; l < period; l += w) s += lanes[l];
        acc[j] = s;
    }
}

/* ---- float-compute flat streams: 4-element blocks with an even index use the
 * first parameter set, odd blocks the second ---- */

/* sh: shift lanes lo, hi of even blocks, then of odd blocks */
INLINE void stats_flat_s(const void *x, int64_t n, const float64x2_t *sh, int dt, acc4 *ea, acc4 *oa)
{
    acc4 a0 = acc4_zero(), b0 = acc4_zero(), a1 = acc4_zero(), b1 = acc4_zero();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        stats_step(&a0, ld4(x, i, dt), sh[0], sh[1]);
        stats_step(&b0, ld4(x, i + 4, dt), sh[2], sh[3]);
        stats_step(&a1, ld4(x, i + 8, dt), sh[0], sh[1]);
        stats_step(&b1, ld4(x, i + 12, dt), sh[2], sh[3]);
    }
    for (; i + 4 <= n; i += 4) {
        if ((i >> 2) & 1) stats_step(&b1, ld4(x, i, dt), sh[2], sh[3]);
        else stats_step(&a1, ld4(x, i, dt), sh[0], sh[1]);
    }
    if (i < n) {
        int64_t cnt = n - i;
        float32x4_t v = ld_part(x, i, cnt, cnt, dt);
        uint64x2_t mlo = mask_d(cnt, 0), mhi = mask_d(cnt, 1);
        /* dead lanes: x reads as 0 and the shift is masked to 0, so d = 0 */
        if ((i >> 2) & 1) stats_step(&b1, v, and_d(sh[2], mlo), and_d(sh[3], mhi));
        else stats_step(&a1, v, and_d(sh[0], mlo), and_d(sh[1], mhi));
    }
    *ea = acc4_add(a0, a1);
    *oa = acc4_add(b0, b1);
}

/* m: mhi, mlo of even blocks, then of odd blocks */
INLINE void gstats_flat_s(const void *dy, const void *x, int64_t n, const float32x4_t *m, int dt, acc4 *ea, acc4 *oa)
{
    acc4 a0 = acc4_zero(), b0 = acc4_zero(), a1 = acc4_zero(), b1 = acc4_zero();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        gstats_step(&a0, ld4(dy, i, dt), centered_s(ld4(x, i, dt), m[0], m[1]));
        gstats_step(&b0, ld4(dy, i + 4, dt), centered_s(ld4(x, i + 4, dt), m[2], m[3]));
        gstats_step(&a1, ld4(dy, i + 8, dt), centered_s(ld4(x, i + 8, dt), m[0], m[1]));
        gstats_step(&b1, ld4(dy, i + 12, dt), centered_s(ld4(x, i + 12, dt), m[2], m[3]));
    }
    for (; i + 4 <= n; i += 4) {
        if ((i >> 2) & 1) gstats_step(&b1, ld4(dy, i, dt), centered_s(ld4(x, i, dt), m[2], m[3]));
        else gstats_step(&a1, ld4(dy, i, dt), centered_s(ld4(x, i, dt), m[0], m[1]));
    }
    if (i < n) {
        int64_t cnt = n - i;
        uint32x4_t mk = mask_s(cnt);
        float32x4_t g = ld_part(dy, i, cnt, cnt, dt), v = ld_part(x, i, cnt, cnt, dt);
        /* dead lanes: dy = 0 and d = 0, so even an inf mean adds nothing */
        if ((i >> 2) & 1) gstats_step(&b1, g, centered_s(v, and_s(m[2], mk), and_s(m[3], mk)));
        else gstats_step(&a1, g, centered_s(v, and_s(m[0], mk), and_s(m[1], mk)));
    }
    *ea = acc4_add(a0, a1);
    *oa = acc4_add(b0, b1);
}

/* p: mhi, mlo, alpha, beta of even blocks, then of odd blocks */
INLINE void apply_flat_s(const void *x, void *y, int64_t n, const float32x4_t *p, int dt)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        float32x4_t v0 = ld4(x, i, dt), v1 = ld4(x, i + 4, dt);
        float32x4_t v2 = ld4(x, i + 8, dt), v3 = ld4(x, i + 12, dt);
        st4(y, i, apply_s(v0, p[0], p[1], p[2], p[3]), dt);
        st4(y, i + 4, apply_s(v1, p[4], p[5], p[6], p[7]), dt);
        st4(y, i + 8, apply_s(v2, p[0], p[1], p[2], p[3]), dt);
        st4(y, i + 12, apply_s(v3, p[4], p[5], p[6], p[7]), dt);
    }
    for (; i + 4 <= n; i += 4) {
        const float32x4_t *q = p + 4 * ((i >> 2) & 1);
        st4(y, i, apply_s(ld4(x, i, dt), q[0], q[1], q[2], q[3]), dt);
    }
    if (i < n) {
        const float32x4_t *q = p + 4 * ((i >> 2) & 1);
        st_part(y, i, apply_s(ld_part(x, i, n - i, n - i, dt), q[0], q[1], q[2], q[3]), n - i, dt);
    }
}

/* p: mhi, mlo, a, b, c of even blocks, then of odd blocks */
INLINE void gapply_flat_s(const void *dy, const void *x, void *dx, int64_t n, const float32x4_t *p, int dt)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float32x4_t g0 = ld4(dy, i, dt), g1 = ld4(dy, i + 4, dt);
        float32x4_t v0 = ld4(x, i, dt), v1 = ld4(x, i + 4, dt);
        st4(dx, i, gapply_s(g0, v0, p[0], p[1], p[2], p[3], p[4]), dt);
        st4(dx, i + 4, gapply_s(g1, v1, p[5], p[6], p[7], p[8], p[9]), dt);
    }
    if (i + 4 <= n) {
        st4(dx, i, gapply_s(ld4(dy, i, dt), ld4(x, i, dt), p[0], p[1], p[2], p[3], p[4]), dt);
        i += 4;
    }
    if (i < n) {
        const float32x4_t *q = p + 5 * ((i >> 2) & 1);
        int64_t cnt = n - i;
        float32x4_t g = ld_part(dy, i, cnt, cnt, dt), v = ld_part(x, i, cnt, cnt, dt);
        st_part(dx, i, gapply_s(g, v, q[0], q[1], q[2], q[3], q[4]), cnt, dt);
    }
}

/* Per-lane parameter vectors for a width w that divides 8: lane l of the
 * flat stream belongs to column l % w. */
INLINE void lanes_s(const float *v, int64_t w, float32x4_t *even, float32x4_t *odd)
{
    float t[8];
    for (int l = 0; l < 8; l++) t[l] = v[l % w];
    *even = vld1q_f32(t);
    *odd = vld1q_f32(t + 4);
}

/* Loads p[0..cnt) (cnt 1..3) zero-padded, reading nothing past p[cnt). */
INLINE float32x4_t ldparam_s(const float *p, int64_t cnt)
{
    float buf[4] = {0};
    memcpy(buf, p, (size_t)cnt * sizeof *buf);
    return vld1q_f32(buf);
}

INLINE void ldparam_d(const double *p, int64_t cnt, float64x2_t *lo, float64x2_t *hi)
{
    double buf[4] = {0};
    memcpy(buf, p, (size_t)cnt * sizeof *buf);
    *lo = vld1q_f64(buf);
    *hi = vld1q_f64(buf + 2);
}

INLINE void acc4_store_part(const acc4 *a, double *s1, double *s2, int64_t cnt)
{
    double b1[4], b2[4];
    acc4_store(a, b1, b2);
    memcpy(s1, b1, (size_t)cnt * sizeof *b1);
    memcpy(s2, b2, (size_t)cnt * sizeof *b2);
}

/* ---- float-compute kernel bodies ---- */

INLINE void stats_run_s(const void *x, int64_t n, double shift, double *acc, int dt)
{
    float64x2_t s = vdupq_n_f64(shift);
    const float64x2_t sh[4] = {s, s, s, s};
    acc4 a, b;
    stats_flat_s(x, n, sh, dt, &a, &b);
    acc4 t = acc4_add(a, b);
    acc[0] = sum_acc_s1(t);
    acc[1] = sum_acc_s2(t);
}

INLINE void stats_rows_s(const void *x, int64_t rows, int64_t w, const double *shift, double *acc, int dt)
{
    if (w <= 0) return;
    if (8 % w == 0) {
        double t[8], s1[8], s2[8];
        for (int l = 0; l < 8; l++) t[l] = shift[l % w];
        const float64x2_t sh[4] = {vld1q_f64(t), vld1q_f64(t + 2), vld1q_f64(t + 4), vld1q_f64(t + 6)};
        acc4 a, b;
        stats_flat_s(x, rows * w, sh, dt, &a, &b);
        acc4_store(&a, s1, s2);
        acc4_store(&b, s1 + 4, s2 + 4);
        fold_lanes(s1, 8, w, acc);
        fold_lanes(s2, 8, w, acc + w);
        return;
    }
    /* Full 4-column blocks accumulate in acc (L1-resident, two rows per
     * load/store); the partial block sits at the same columns in every row,
     * so its sums stay in registers. */
    const int64_t full = w & ~(int64_t)3, cnt = w - full, n = rows * w;
    memset(acc, 0, (size_t)(2 * w) * sizeof *acc);
    acc4 t = acc4_zero();
    float64x2_t tlo = vdupq_n_f64(0.0), thi = tlo;
    if (cnt) ldparam_d(shift + full, cnt, &tlo, &thi);
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2) {
        const int64_t o0 = r * w, o1 = o0 + w;
        for (int64_t j = 0; j < full; j += 4) {
            acc4 c = acc4_load(acc + j, acc + w + j);
            float64x2_t slo = vld1q_f64(shift + j), shi = vld1q_f64(shift + j + 2);
            stats_step(&c, ld4(x, o0 + j, dt), slo, shi);
            stats_step(&c, ld4(x, o1 + j, dt), slo, shi);
            acc4_store(&c, acc + j, acc + w + j);
        }
        if (cnt) {
            stats_step(&t, ld_part(x, o0 + full, cnt, n - o0 - full, dt), tlo, thi);
            stats_step(&t, ld_part(x, o1 + full, cnt, n - o1 - full, dt), tlo, thi);
        }
    }
    if (r < rows) {
        const int64_t o0 = r * w;
        for (int64_t j = 0; j < full; j += 4) {
            acc4 c = acc4_load(acc + j, acc + w + j);
            stats_step(&c, ld4(x, o0 + j, dt), vld1q_f64(shift + j), vld1q_f64(shift + j + 2));
            acc4_store(&c, acc + j, acc + w + j);
        }
        if (cnt) stats_step(&t, ld_part(x, o0 + full, cnt, n - o0 - full, dt), tlo, thi);
    }
    if (cnt) acc4_store_part(&t, acc + full, acc + w + full, cnt);
}

INLINE void apply_run_s(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p, int dt)
{
    float32x4_t m = vdupq_n_f32(p->mhi[0]), l = vdupq_n_f32(p->mlo[0]);
    float32x4_t a = vdupq_n_f32(p->alpha[0]), b = vdupq_n_f32(p->beta[0]);
    const float32x4_t q[8] = {m, l, a, b, m, l, a, b};
    apply_flat_s(x, y, n, q, dt);
}

INLINE void apply_rows_s(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f32 *p, int dt)
{
    if (w <= 0) return;
    if (8 % w == 0) {
        float32x4_t q[8];
        lanes_s(p->mhi, w, &q[0], &q[4]);
        lanes_s(p->mlo, w, &q[1], &q[5]);
        lanes_s(p->alpha, w, &q[2], &q[6]);
        lanes_s(p->beta, w, &q[3], &q[7]);
        apply_flat_s(x, y, rows * w, q, dt);
        return;
    }
    const int64_t full = w & ~(int64_t)3, cnt = w - full, n = rows * w;
    float32x4_t tm = vdupq_n_f32(0.0f), tl = tm, ta = tm, tb = tm;
    if (cnt) {
        tm = ldparam_s(p->mhi + full, cnt);
        tl = ldparam_s(p->mlo + full, cnt);
        ta = ldparam_s(p->alpha + full, cnt);
        tb = ldparam_s(p->beta + full, cnt);
    }
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = r * w;
        for (int64_t j = 0; j < full; j += 4) {
            float32x4_t v = apply_s(ld4(x, o + j, dt), vld1q_f32(p->mhi + j), vld1q_f32(p->mlo + j),
                                    vld1q_f32(p->alpha + j), vld1q_f32(p->beta + j));
            st4(y, o + j, v, dt);
        }
        if (cnt) {
            float32x4_t v = ld_part(x, o + full, cnt, n - o - full, dt);
            st_part(y, o + full, apply_s(v, tm, tl, ta, tb), cnt, dt);
        }
    }
}

INLINE void gstats_run_s(const void *dy, const void *x, int64_t n, const cfbn_grad_f32 *p, double *acc, int dt)
{
    float32x4_t m = vdupq_n_f32(p->mhi[0]), l = vdupq_n_f32(p->mlo[0]);
    const float32x4_t q[4] = {m, l, m, l};
    acc4 a, b;
    gstats_flat_s(dy, x, n, q, dt, &a, &b);
    acc4 t = acc4_add(a, b);
    acc[0] = sum_acc_s1(t);
    acc[1] = sum_acc_s2(t);
}

INLINE void gstats_rows_s(const void *dy, const void *x, int64_t rows, int64_t w, const cfbn_grad_f32 *p, double *acc,
                          int dt)
{
    if (w <= 0) return;
    if (8 % w == 0) {
        float32x4_t q[4];
        double s1[8], s2[8];
        lanes_s(p->mhi, w, &q[0], &q[2]);
        lanes_s(p->mlo, w, &q[1], &q[3]);
        acc4 a, b;
        gstats_flat_s(dy, x, rows * w, q, dt, &a, &b);
        acc4_store(&a, s1, s2);
        acc4_store(&b, s1 + 4, s2 + 4);
        fold_lanes(s1, 8, w, acc);
        fold_lanes(s2, 8, w, acc + w);
        return;
    }
    const int64_t full = w & ~(int64_t)3, cnt = w - full, n = rows * w;
    memset(acc, 0, (size_t)(2 * w) * sizeof *acc);
    acc4 t = acc4_zero();
    float32x4_t tm = vdupq_n_f32(0.0f), tl = tm;
    if (cnt) {
        tm = ldparam_s(p->mhi + full, cnt);
        tl = ldparam_s(p->mlo + full, cnt);
    }
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2) {
        const int64_t o0 = r * w, o1 = o0 + w;
        for (int64_t j = 0; j < full; j += 4) {
            acc4 c = acc4_load(acc + j, acc + w + j);
            float32x4_t m = vld1q_f32(p->mhi + j), l = vld1q_f32(p->mlo + j);
            gstats_step(&c, ld4(dy, o0 + j, dt), centered_s(ld4(x, o0 + j, dt), m, l));
            gstats_step(&c, ld4(dy, o1 + j, dt), centered_s(ld4(x, o1 + j, dt), m, l));
            acc4_store(&c, acc + j, acc + w + j);
        }
        if (cnt) {
            gstats_step(&t, ld_part(dy, o0 + full, cnt, n - o0 - full, dt),
                        centered_s(ld_part(x, o0 + full, cnt, n - o0 - full, dt), tm, tl));
            gstats_step(&t, ld_part(dy, o1 + full, cnt, n - o1 - full, dt),
                        centered_s(ld_part(x, o1 + full, cnt, n - o1 - full, dt), tm, tl));
        }
    }
    if (r < rows) {
        const int64_t o0 = r * w;
        for (int64_t j = 0; j < full; j += 4) {
            acc4 c = acc4_load(acc + j, acc + w + j);
            float32x4_t m = vld1q_f32(p->mhi + j), l = vld1q_f32(p->mlo + j);
            gstats_step(&c, ld4(dy, o0 + j, dt), centered_s(ld4(x, o0 + j, dt), m, l));
            acc4_store(&c, acc + j, acc + w + j);
        }
        if (cnt)
            gstats_step(&t, ld_part(dy, o0 + full, cnt, n - o0 - full, dt),
                        centered_s(ld_part(x, o0 + full, cnt, n - o0 - full, dt), tm, tl));
    }
    if (cnt) acc4_store_part(&t, acc + full, acc + w + full, cnt);
}

INLINE void gapply_run_s(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f32 *p, int dt)
{
    float32x4_t m = vdupq_n_f32(p->mhi[0]), l = vdupq_n_f32(p->mlo[0]);
    float32x4_t a = vdupq_n_f32(p->a[0]), b = vdupq_n_f32(p->b[0]), c = vdupq_n_f32(p->c[0]);
    const float32x4_t q[10] = {m, l, a, b, c, m, l, a, b, c};
    gapply_flat_s(dy, x, dx, n, q, dt);
}

INLINE void gapply_rows_s(const void *dy, const void *x, void *dx, int64_t rows, int64_t w, const cfbn_grad_f32 *p,
                          int dt)
{
    if (w <= 0) return;
    if (8 % w == 0) {
        float32x4_t q[10];
        lanes_s(p->mhi, w, &q[0], &q[5]);
        lanes_s(p->mlo, w, &q[1], &q[6]);
        lanes_s(p->a, w, &q[2], &q[7]);
        lanes_s(p->b, w, &q[3], &q[8]);
        lanes_s(p->c, w, &q[4], &q[9]);
        gapply_flat_s(dy, x, dx, rows * w, q, dt);
        return;
    }
    const int64_t full = w & ~(int64_t)3, cnt = w - full, n = rows * w;
    float32x4_t tm = vdupq_n_f32(0.0f), tl = tm, ta = tm, tb = tm, tc = tm;
    if (cnt) {
        tm = ldparam_s(p->mhi + full, cnt);
        tl = ldparam_s(p->mlo + full, cnt);
        ta = ldparam_s(p->a + full, cnt);
        tb = ldparam_s(p->b + full, cnt);
        tc = ldparam_s(p->c + full, cnt);
    }
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = r * w;
        for (int64_t j = 0; j < full; j += 4) {
            float32x4_t v = gapply_s(ld4(dy, o + j, dt), ld4(x, o + j, dt), vld1q_f32(p->mhi + j),
                                     vld1q_f32(p->mlo + j), vld1q_f32(p->a + j), vld1q_f32(p->b + j),
                                     vld1q_f32(p->c + j));
            st4(dx, o + j, v, dt);
        }
        if (cnt) {
            float32x4_t g = ld_part(dy, o + full, cnt, n - o - full, dt);
            float32x4_t v = ld_part(x, o + full, cnt, n - o - full, dt);
            st_part(dx, o + full, gapply_s(g, v, tm, tl, ta, tb, tc), cnt, dt);
        }
    }
}

/* ---- fused activations (f32, f16 and bf16 tensors) ----
 * exp as in Cephes' expf: e^x = 2^k e^r with k = round(x / ln 2), r = x - k ln 2
 * formed in two FMA steps (ln 2 = C1 + C2, C1 with few bits so k * C1 is
 * exact), e^r by a degree-6 polynomial on |r| <= ln 2 / 2, 2^k put into the
 * exponent bits.  About 1 ulp on the clamped range; the clamp keeps 2^k a
 * normal number (k in [-126, 127]); outside it the activations below are
 * flat to float precision anyway.  FMAX/FMIN return NaN for a NaN operand. */
INLINE float32x4_t exp_s(float32x4_t x)
{
    x = vmaxq_f32(vdupq_n_f32(-87.33654f), vminq_f32(vdupq_n_f32(88.0f), x));
    float32x4_t k = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
    float32x4_t r = vfmsq_f32(x, k, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, k, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
    int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(k), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

INLINE float32x4_t sigmoid_s(float32x4_t v)
{
    const float32x4_t one = vdupq_n_f32(1.0f);
    return vdivq_f32(one, vaddq_f32(one, exp_s(vnegq_f32(v))));
}

/* tanh: for |v| < 0.625 Cephes' odd polynomial v + v^3 P(v^2), because
 * 1 - 2/(e^2|v| + 1) loses relative precision as |v| -> 0; above, that
 * formula, whose error is then a couple of ulps of the result. */
INLINE float32x4_t tanh_s(float32x4_t v)
{
    const float32x4_t one = vdupq_n_f32(1.0f);
    float32x4_t a = vabsq_f32(v);
    float32x4_t z = vmulq_f32(v, v);
    float32x4_t p = vdupq_n_f32(-5.70498872745e-3f);
    p = vfmaq_f32(vdupq_n_f32(2.06390887954e-2f), p, z);
    p = vfmaq_f32(vdupq_n_f32(-5.37397155531e-2f), p, z);
    p = vfmaq_f32(vdupq_n_f32(1.33314422036e-1f), p, z);
    p = vfmaq_f32(vdupq_n_f32(-3.33332819422e-1f), p, z);
    float32x4_t small = vfmaq_f32(v, vmulq_f32(p, z), v);
    float32x4_t e = exp_s(vaddq_f32(a, a));
    float32x4_t big = vsubq_f32(one, vdivq_f32(vdupq_n_f32(2.0f), vaddq_f32(e, one)));
    /* copy v's sign onto big (big >= 0 or NaN) */
    big = vbslq_f32(vdupq_n_u32(0x80000000u), v, big);
    return vbslq_f32(vcltq_f32(a, vdupq_n_f32(0.625f)), small, big);
}

INLINE float32x4_t act_s(float32x4_t v, int kind, float32x4_t al)
{
    const float32x4_t zero = vdupq_n_f32(0.0f), one = vdupq_n_f32(1.0f);
    switch ((enum cfbn_activation)kind) {
    case CFBN_ACT_NONE: return v;
    case CFBN_ACT_RELU: return vmaxq_f32(v, zero);
    case CFBN_ACT_RELU6: return vminq_f32(vmaxq_f32(v, zero), vdupq_n_f32(6.0f));
    case CFBN_ACT_LEAKY_RELU: return vbslq_f32(vcltq_f32(v, zero), vmulq_f32(al, v), v);
    case CFBN_ACT_ELU: return vbslq_f32(vcltq_f32(v, zero), vmulq_f32(al, vsubq_f32(exp_s(v), one)), v);
    case CFBN_ACT_SIGMOID: return sigmoid_s(v);
    case CFBN_ACT_TANH: return tanh_s(v);
    case CFBN_ACT_SILU: return vdivq_f32(v, vaddq_f32(one, exp_s(vnegq_f32(v))));
    }
    return vdupq_n_f32(NAN);   /* a code outside the enum */
}

/* d act / d v; a NaN v gives NaN (lanes where v != v are set to v) */
INLINE float32x4_t act_grad_s(float32x4_t v, int kind, float32x4_t al)
{
    const float32x4_t zero = vdupq_n_f32(0.0f), one = vdupq_n_f32(1.0f);
    uint32x4_t num = vceqq_f32(v, v);
    uint32x4_t pos = vcgtq_f32(v, zero);
    switch ((enum cfbn_activation)kind) {
    case CFBN_ACT_NONE: return one;
    case CFBN_ACT_RELU: return vbslq_f32(num, vbslq_f32(pos, one, zero), v);
    case CFBN_ACT_RELU6: {
        uint32x4_t in = vandq_u32(pos, vcltq_f32(v, vdupq_n_f32(6.0f)));
        return vbslq_f32(num, vbslq_f32(in, one, zero), v);
    }
    case CFBN_ACT_LEAKY_RELU: return vbslq_f32(num, vbslq_f32(pos, one, al), v);
    case CFBN_ACT_ELU: return vbslq_f32(pos, one, vmulq_f32(al, exp_s(v)));
    case CFBN_ACT_SIGMOID: {
        float32x4_t s = sigmoid_s(v);
        return vmulq_f32(s, vsubq_f32(one, s));
    }
    case CFBN_ACT_TANH: {
        float32x4_t t = tanh_s(v);
        return vfmsq_f32(one, t, t);
    }
    case CFBN_ACT_SILU: {
        float32x4_t s = sigmoid_s(v);
        return vmulq_f32(s, vfmaq_f32(one, v, vsubq_f32(one, s)));
    }
    }
    return vdupq_n_f32(NAN);   /* a code outside the enum */
}

/* ---- fused activation and side input in one pass (f32, f16 and bf16 tensors) ----
 * The pre-activation, g and the activation stay in registers: x, dy and side
 * are read once, each output written once, with no block buffer between the
 * normalization and the activation.  Element for element these compute what
 * a pass of this file's plain kernels followed by a vector activation loop
 * (exp_s, act_s) would, with the same FMAs in the same order (only the sign
 * of a NaN may differ, as instruction selection negates operands).
 *
 * Aliasing: every vector of every input is loaded before anything is stored
 * at its position, so y may be x or side, and dx or side_grad may be dy or x.
 * A partial vector reads lanes of the next row (masked off) but stores only
 * its own elements.  Callers split multi-run calls (runs <= 1 here) and take
 * regular stores: the stream hint is ignored.
 *
 * Each kernel switches on the activation once per call (CFBN_ACT_SPECIALIZE)
 * into a loop compiled for that activation.  With act NONE the gradient
 * kernels read neither ya, yb nor side (cfbn.h), and g is dy. */

/* Per-lane parameters of one 4-element block: mhi, mlo and the
 * pre-activation's ya, yb (alpha, beta in the forward); a, b, c for dx. */
typedef struct {
    float32x4_t mhi, mlo, ya, yb, a, b, c;
} fpar_s;

INLINE float32x4_t fpre_s(float32x4_t x, float32x4_t side, int has_side, const fpar_s *q)
{
    float32x4_t v = apply_s(x, q->mhi, q->mlo, q->ya, q->yb);
    /* added only when there is a side input, so that a -0 pre-activation
     * keeps its sign (bn_math.h: cfbn_fused_y_f) */
    return has_side ? vaddq_f32(v, side) : v;
}

INLINE float32x4_t fy_s(float32x4_t x, float32x4_t side, int has_side, const fpar_s *q, int kind, float32x4_t al)
{
    return act_s(fpre_s(x, side, has_side, q), kind, al);
}

INLINE float32x4_t fg_s(float32x4_t dy, float32x4_t x, float32x4_t side, int has_side, const fpar_s *q, int kind,
                        float32x4_t al)
{
    if (kind == CFBN_ACT_NONE) return dy;
    return vmulq_f32(dy, act_grad_s(fpre_s(x, side, has_side, q), kind, al));
}

/* side lanes of a block, zero without a side input */
INLINE float32x4_t fside4(const void *side, int64_t i, int dt)
{
    return side ? ld4(side, i, dt) : vdupq_n_f32(0.0f);
}

INLINE float32x4_t fside_part(const void *side, int64_t i, int64_t cnt, int64_t avail, int dt)
{
    return side ? ld_part(side, i, cnt, avail, dt) : vdupq_n_f32(0.0f);
}

/* Parameters broadcast from element 0 (a run) into both block sets.  ya, yb
 * come from alpha, beta for the forward; a, b, c are read when given. */
INLINE void fpar_run(fpar_s *q, const float *mhi, const float *mlo, const float *ya, const float *yb,
                     const float *a, const float *b, const float *c)
{
    const float32x4_t z = vdupq_n_f32(0.0f);
    fpar_s r = {vdupq_n_f32(mhi[0]), vdupq_n_f32(mlo[0]), ya ? vdupq_n_f32(ya[0]) : z, yb ? vdupq_n_f32(yb[0]) : z,
                a ? vdupq_n_f32(a[0]) : z, b ? vdupq_n_f32(b[0]) : z, c ? vdupq_n_f32(c[0]) : z};
    q[0] = r;
    q[1] = r;
}

/* Per-lane parameters of the flat stream for a width w dividing 8: q[0] for
 * even 4-blocks, q[1] for odd ones. */
INLINE void fpar_lanes(fpar_s *q, int64_t w, const float *mhi, const float *mlo, const float *ya, const float *yb,
                       const float *a, const float *b, const float *c)
{
    const float32x4_t z = vdupq_n_f32(0.0f);
    q[0].ya = q[1].ya = q[0].yb = q[1].yb = z;
    q[0].a = q[1].a = q[0].b = q[1].b = q[0].c = q[1].c = z;
    lanes_s(mhi, w, &q[0].mhi, &q[1].mhi);
    lanes_s(mlo, w, &q[0].mlo, &q[1].mlo);
    if (ya) lanes_s(ya, w, &q[0].ya, &q[1].ya);
    if (yb) lanes_s(yb, w, &q[0].yb, &q[1].yb);
    if (a) lanes_s(a, w, &q[0].a, &q[1].a);
    if (b) lanes_s(b, w, &q[0].b, &q[1].b);
    if (c) lanes_s(c, w, &q[0].c, &q[1].c);
}

/* Columns j..j+3 of the parameter arrays (the given ones). */
INLINE fpar_s fpar_cols(int64_t j, const float *mhi, const float *mlo, const float *ya, const float *yb,
                        const float *a, const float *b, const float *c)
{
    const float32x4_t z = vdupq_n_f32(0.0f);
    fpar_s r = {vld1q_f32(mhi + j), vld1q_f32(mlo + j), ya ? vld1q_f32(ya + j) : z, yb ? vld1q_f32(yb + j) : z,
                a ? vld1q_f32(a + j) : z, b ? vld1q_f32(b + j) : z, c ? vld1q_f32(c + j) : z};
    return r;
}

/* The last cnt (1..3) columns from j, zero-padded, read as ldparam_s does. */
INLINE fpar_s fpar_tail(int64_t j, int64_t cnt, const float *mhi, const float *mlo, const float *ya,
                        const float *yb, const float *a, const float *b, const float *c)
{
    const float32x4_t z = vdupq_n_f32(0.0f);
    fpar_s r = {ldparam_s(mhi + j, cnt), ldparam_s(mlo + j, cnt), ya ? ldparam_s(ya + j, cnt) : z,
                yb ? ldparam_s(yb + j, cnt) : z, a ? ldparam_s(a + j, cnt) : z, b ? ldparam_s(b + j, cnt) : z,
                c ? ldparam_s(c + j, cnt) : z};
    return r;
}

/* -- forward: y = act(pre + side) -- */

/* one block of cnt (1..3) elements at i, avail elements readable from i */
INLINE void fapply_part(const void *x, const void *side, void *y, int64_t i, int64_t cnt, int64_t avail,
                        const fpar_s *q, int kind, float32x4_t al, int dt)
{
    float32x4_t v = ld_part(x, i, cnt, avail, dt), s = fside_part(side, i, cnt, avail, dt);
    st_part(y, i, fy_s(v, s, side != NULL, q, kind, al), cnt, dt);
}

INLINE void fapply_flat(const void *x, const void *side, void *y, int64_t n, const fpar_s *q, int kind,
                        float act_alpha, int dt)
{
    const float32x4_t al = vdupq_n_f32(act_alpha);
    const int hs = side != NULL;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float32x4_t v0 = ld4(x, i, dt), v1 = ld4(x, i + 4, dt);
        float32x4_t s0 = fside4(side, i, dt), s1 = fside4(side, i + 4, dt);
        st4(y, i, fy_s(v0, s0, hs, &q[0], kind, al), dt);
        st4(y, i + 4, fy_s(v1, s1, hs, &q[1], kind, al), dt);
    }
    if (i + 4 <= n) {
        st4(y, i, fy_s(ld4(x, i, dt), fside4(side, i, dt), hs, &q[0], kind, al), dt);
        i += 4;
    }
    if (i < n) fapply_part(x, side, y, i, n - i, n - i, &q[(i >> 2) & 1], kind, al, dt);
}

INLINE void apply_run_fused_s(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p, int kind, int dt)
{
    fpar_s q[2];
    fpar_run(q, p->mhi, p->mlo, p->alpha, p->beta, NULL, NULL, NULL);
    fapply_flat(x, p->side, y, n, q, kind, p->act_alpha, dt);
}

INLINE void apply_rows_fused_s(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f32 *p, int kind,
                               int dt)
{
    if (w <= 0) return;
    const void *side = p->side;
    if (8 % w == 0) {
        fpar_s q[2];
        fpar_lanes(q, w, p->mhi, p->mlo, p->alpha, p->beta, NULL, NULL, NULL);
        fapply_flat(x, side, y, rows * w, q, kind, p->act_alpha, dt);
        return;
    }
    const float32x4_t al = vdupq_n_f32(p->act_alpha);
    const int hs = side != NULL;
    const int64_t full = w & ~(int64_t)3, cnt = w - full, n = rows * w;
    fpar_s t = fpar_tail(full, cnt, p->mhi, p->mlo, p->alpha, p->beta, NULL, NULL, NULL);
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = r * w;
        for (int64_t j = 0; j < full; j += 4) {
            fpar_s q = fpar_cols(j, p->mhi, p->mlo, p->alpha, p->beta, NULL, NULL, NULL);
            float32x4_t v = ld4(x, o + j, dt), s = fside4(side, o + j, dt);
            st4(y, o + j, fy_s(v, s, hs, &q, kind, al), dt);
        }
        if (cnt) fapply_part(x, side, y, o + full, cnt, n - o - full, &t, kind, al, dt);
    }
}

/* -- gradient sums: sum g, sum g * ((x - mhi) - mlo), in double as
 * gstats_step forms them (each g and d widened, the product an FMA in
 * double) -- */

INLINE void fgstats_blk(acc4 *acc, const void *dy, const void *x, const void *side, void *go, int64_t i, int hs,
                        const fpar_s *q, int kind, float32x4_t al, int dt)
{
    float32x4_t v = ld4(x, i, dt);
    float32x4_t g = fg_s(ld4(dy, i, dt), v, fside4(side, i, dt), hs, q, kind, al);
    if (go) st4(go, i, g, dt);
    gstats_step(acc, g, centered_s(v, q->mhi, q->mlo));
}

/* A partial block: its dead lanes read as 0, but g and d are formed from
 * whatever the parameters make of them (an inf mean, a NaN act'), so both
 * are masked to +0 before they reach the sums. */
INLINE void fgstats_part(acc4 *acc, const void *dy, const void *x, const void *side, void *go, int64_t i, int64_t cnt,
                         int64_t avail, const fpar_s *q, int kind, float32x4_t al, int dt)
{
    uint32x4_t mk = mask_s(cnt);
    float32x4_t g = ld_part(dy, i, cnt, avail, dt), v = ld_part(x, i, cnt, avail, dt);
    float32x4_t s = fside_part(side, i, cnt, avail, dt);
    g = fg_s(g, v, s, side != NULL, q, kind, al);
    if (go) st_part(go, i, g, cnt, dt);
    gstats_step(acc, and_s(g, mk), and_s(centered_s(v, q->mhi, q->mlo), mk));
}

INLINE void fgstats_flat(const void *dy, const void *x, const void *side, void *go, int64_t n, const fpar_s *q,
                         int kind, float act_alpha, int dt, acc4 *ea, acc4 *oa)
{
    const float32x4_t al = vdupq_n_f32(act_alpha);
    const int hs = side != NULL;
    acc4 a = acc4_zero(), b = acc4_zero();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        fgstats_blk(&a, dy, x, side, go, i, hs, &q[0], kind, al, dt);
        fgstats_blk(&b, dy, x, side, go, i + 4, hs, &q[1], kind, al, dt);
    }
    if (i + 4 <= n) {
        fgstats_blk(&a, dy, x, side, go, i, hs, &q[0], kind, al, dt);
        i += 4;
    }
    if (i < n) {
        if ((i >> 2) & 1) fgstats_part(&b, dy, x, side, go, i, n - i, n - i, &q[1], kind, al, dt);
        else fgstats_part(&a, dy, x, side, go, i, n - i, n - i, &q[0], kind, al, dt);
    }
    *ea = a;
    *oa = b;
}

INLINE void gstats_run_fused_s(const void *dy, const void *x, int64_t n, const cfbn_grad_f32 *p, double *acc,
                               int kind, int dt)
{
    const int on = kind != CFBN_ACT_NONE;
    fpar_s q[2];
    fpar_run(q, p->mhi, p->mlo, on ? p->ya : NULL, on ? p->yb : NULL, NULL, NULL, NULL);
    acc4 a, b;
    fgstats_flat(dy, x, on ? p->side : NULL, p->g_out, n, q, kind, p->act_alpha, dt, &a, &b);
    acc4 t = acc4_add(a, b);
    acc[0] = sum_acc_s1(t);
    acc[1] = sum_acc_s2(t);
}

INLINE void gstats_rows_fused_s(const void *dy, const void *x, int64_t rows, int64_t w, const cfbn_grad_f32 *p,
                                double *acc, int kind, int dt)
{
    if (w <= 0) return;
    const int on = kind != CFBN_ACT_NONE;
    const float *ya = on ? p->ya : NULL, *yb = on ? p->yb : NULL;
    const void *side = on ? p->side : NULL;
    if (8 % w == 0) {
        fpar_s q[2];
        double s1[8], s2[8];
        fpar_lanes(q, w, p->mhi, p->mlo, ya, yb, NULL, NULL, NULL);
        acc4 a, b;
        fgstats_flat(dy, x, side, p->g_out, rows * w, q, kind, p->act_alpha, dt, &a, &b);
        acc4_store(&a, s1, s2);
        acc4_store(&b, s1 + 4, s2 + 4);
        fold_lanes(s1, 8, w, acc);
        fold_lanes(s2, 8, w, acc + w);
        return;
    }
    /* as gstats_rows_s: full 4-column blocks accumulate in acc, two rows per
     * load/store; the partial block's sums stay in registers */
    const float32x4_t al = vdupq_n_f32(p->act_alpha);
    const int hs = side != NULL;
    const int64_t full = w & ~(int64_t)3, cnt = w - full, n = rows * w;
    void *go = p->g_out;
    memset(acc, 0, (size_t)(2 * w) * sizeof *acc);
    acc4 t = acc4_zero();
    fpar_s tq = fpar_tail(full, cnt, p->mhi, p->mlo, ya, yb, NULL, NULL, NULL);
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2) {
        const int64_t o0 = r * w, o1 = o0 + w;
        for (int64_t j = 0; j < full; j += 4) {
            fpar_s q = fpar_cols(j, p->mhi, p->mlo, ya, yb, NULL, NULL, NULL);
            acc4 c = acc4_load(acc + j, acc + w + j);
            fgstats_blk(&c, dy, x, side, go, o0 + j, hs, &q, kind, al, dt);
            fgstats_blk(&c, dy, x, side, go, o1 + j, hs, &q, kind, al, dt);
            acc4_store(&c, acc + j, acc + w + j);
        }
        if (cnt) {
            fgstats_part(&t, dy, x, side, go, o0 + full, cnt, n - o0 - full, &tq, kind, al, dt);
            fgstats_part(&t, dy, x, side, go, o1 + full, cnt, n - o1 - full, &tq, kind, al, dt);
        }
    }
    if (r < rows) {
        const int64_t o0 = r * w;
        for (int64_t j = 0; j < full; j += 4) {
            fpar_s q = fpar_cols(j, p->mhi, p->mlo, ya, yb, NULL, NULL, NULL);
            acc4 c = acc4_load(acc + j, acc + w + j);
            fgstats_blk(&c, dy, x, side, go, o0 + j, hs, &q, kind, al, dt);
            acc4_store(&c, acc + j, acc + w + j);
        }
        if (cnt) fgstats_part(&t, dy, x, side, go, o0 + full, cnt, n - o0 - full, &tq, kind, al, dt);
    }
    if (cnt) acc4_store_part(&t, acc + full, acc + w + full, cnt);
}

/* -- gradient: dx = g * a + (d * b + c), side_grad = g -- */

INLINE void fgapply_blk(const void *dy, const void *x, const void *side, void *dx, void *sg, int64_t i,
                        const fpar_s *q, int kind, float32x4_t al, int dt)
{
    float32x4_t v = ld4(x, i, dt);
    float32x4_t g = fg_s(ld4(dy, i, dt), v, fside4(side, i, dt), side != NULL, q, kind, al);
    float32x4_t o = gapply_s(g, v, q->mhi, q->mlo, q->a, q->b, q->c);
    if (sg) st4(sg, i, g, dt);
    st4(dx, i, o, dt);
}

INLINE void fgapply_part(const void *dy, const void *x, const void *side, void *dx, void *sg, int64_t i, int64_t cnt,
                         int64_t avail, const fpar_s *q, int kind, float32x4_t al, int dt)
{
    float32x4_t v = ld_part(x, i, cnt, avail, dt);
    float32x4_t g = fg_s(ld_part(dy, i, cnt, avail, dt), v, fside_part(side, i, cnt, avail, dt), side != NULL, q,
                         kind, al);
    float32x4_t o = gapply_s(g, v, q->mhi, q->mlo, q->a, q->b, q->c);
    if (sg) st_part(sg, i, g, cnt, dt);
    st_part(dx, i, o, cnt, dt);
}

INLINE void fgapply_flat(const void *dy, const void *x, const void *side, void *dx, void *sg, int64_t n,
                         const fpar_s *q, int kind, float act_alpha, int dt)
{
    const float32x4_t al = vdupq_n_f32(act_alpha);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        fgapply_blk(dy, x, side, dx, sg, i, &q[0], kind, al, dt);
        fgapply_blk(dy, x, side, dx, sg, i + 4, &q[1], kind, al, dt);
    }
    if (i + 4 <= n) {
        fgapply_blk(dy, x, side, dx, sg, i, &q[0], kind, al, dt);
        i += 4;
    }
    if (i < n) fgapply_part(dy, x, side, dx, sg, i, n - i, n - i, &q[(i >> 2) & 1], kind, al, dt);
}

INLINE void gapply_run_fused_s(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f32 *p, int kind,
                               int dt)
{
    const int on = kind != CFBN_ACT_NONE;
    fpar_s q[2];
    fpar_run(q, p->mhi, p->mlo, on ? p->ya : NULL, on ? p->yb : NULL, p->a, p->b, p->c);
    fgapply_flat(dy, x, on ? p->side : NULL, dx, p->side_grad, n, q, kind, p->act_alpha, dt);
}

INLINE void gapply_rows_fused_s(const void *dy, const void *x, void *dx, int64_t rows, int64_t w,
                                const cfbn_grad_f32 *p, int kind, int dt)
{
    if (w <= 0) return;
    const int on = kind != CFBN_ACT_NONE;
    const float *ya = on ? p->ya : NULL, *yb = on ? p->yb : NULL;
    const void *side = on ? p->side : NULL;
    void *sg = p->side_grad;
    if (8 % w == 0) {
        fpar_s q[2];
        fpar_lanes(q, w, p->mhi, p->mlo, ya, yb, p->a, p->b, p->c);
        fgapply_flat(dy, x, side, dx, sg, rows * w, q, kind, p->act_alpha, dt);
        return;
    }
    const float32x4_t al = vdupq_n_f32(p->act_alpha);
    const int64_t full = w & ~(int64_t)3, cnt = w - full, n = rows * w;
    fpar_s t = fpar_tail(full, cnt, p->mhi, p->mlo, ya, yb, p->a, p->b, p->c);
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = r * w;
        for (int64_t j = 0; j < full; j += 4) {
            fpar_s q = fpar_cols(j, p->mhi, p->mlo, ya, yb, p->a, p->b, p->c);
            fgapply_blk(dy, x, side, dx, sg, o + j, &q, kind, al, dt);
        }
        if (cnt) fgapply_part(dy, x, side, dx, sg, o + full, cnt, n - o - full, &t, kind, al, dt);
    }
}

/* -- one loop per activation -- */

INLINE void fapply_run_s(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p, int dt)
{
#define FUSED(k) apply_run_fused_s(x, y, n, p, k, dt)
    CFBN_ACT_SPECIALIZE(p->act, FUSED)
#undef FUSED
}

INLINE void fapply_rows_s(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f32 *p, int dt)
{
#define FUSED(k) apply_rows_fused_s(x, y, rows, w, p, k, dt)
    CFBN_ACT_SPECIALIZE(p->act, FUSED)
#undef FUSED
}

INLINE void fgstats_run_s(const void *dy, const void *x, int64_t n, const cfbn_grad_f32 *p, double *acc, int dt)
{
#define FUSED(k) gstats_run_fused_s(dy, x, n, p, acc, k, dt)
    CFBN_ACT_SPECIALIZE(p->act, FUSED)
#undef FUSED
}

INLINE void fgstats_rows_s(const void *dy, const void *x, int64_t rows, int64_t w, const cfbn_grad_f32 *p,
                           double *acc, int dt)
{
#define FUSED(k) gstats_rows_fused_s(dy, x, rows, w, p, acc, k, dt)
    CFBN_ACT_SPECIALIZE(p->act, FUSED)
#undef FUSED
}

INLINE void fgapply_run_s(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f32 *p, int dt)
{
#define FUSED(k) gapply_run_fused_s(dy, x, dx, n, p, k, dt)
    CFBN_ACT_SPECIALIZE(p->act, FUSED)
#undef FUSED
}

INLINE void fgapply_rows_s(const void *dy, const void *x, void *dx, int64_t rows, int64_t w, const cfbn_grad_f32 *p,
                           int dt)
{
#define FUSED(k) gapply_rows_fused_s(dy, x, dx, rows, w, p, k, dt)
    CFBN_ACT_SPECIALIZE(p->act, FUSED)
#undef FUSED
}

/* ---- second-order gradient (cfbn_gg_f32: f32, f16 and bf16 storage) ----
 * g = dy, q = ggx and d = (x - mhi) - mlo, formed in float as bn_scalar.c
 * forms it; the five sums g, g d, q, q d and q g in double, as gstats_step
 * forms the gradient's (each value widened, the products FMAs in double),
 * so no sum can leave float's range.  Rows go in blocks of 8 rows, the sums
 * of a group of 4 columns in registers and added to acc (5 w doubles, in
 * L1) once per block; widths dividing 4 go as one flat stream with
 * per-lane parameters. */

/* The five sums of 2 lanes. */
typedef struct {
    float64x2_t g, gd, q, qd, qg;
} acc5;

INLINE acc5 acc5_zero(void)
{
    const float64x2_t z = vdupq_n_f64(0.0);
    acc5 a = {z, z, z, z, z};
    return a;
}

INLINE acc5 acc5_add(acc5 a, acc5 b)
{
    acc5 r = {vaddq_f64(a.g, b.g), vaddq_f64(a.gd, b.gd), vaddq_f64(a.q, b.q), vaddq_f64(a.qd, b.qd),
              vaddq_f64(a.qg, b.qg)};
    return r;
}

INLINE void gg_step_d(acc5 *a, float64x2_t g, float64x2_t q, float64x2_t d)
{
    a->g = vaddq_f64(a->g, g);
    a->gd = vfmaq_f64(a->gd, g, d);
    a->q = vaddq_f64(a->q, q);
    a->qd = vfmaq_f64(a->qd, q, d);
    a->qg = vfmaq_f64(a->qg, q, g);
}

/* 4 float lanes: lanes 0, 1 into lo, 2, 3 into hi */
INLINE void gg_step_s(acc5 *lo, acc5 *hi, float32x4_t g, float32x4_t q, float32x4_t d)
{
    gg_step_d(lo, vcvt_f64_f32(vget_low_f32(g)), vcvt_f64_f32(vget_low_f32(q)), vcvt_f64_f32(vget_low_f32(d)));
    gg_step_d(hi, vcvt_high_f64_f32(g), vcvt_high_f64_f32(q), vcvt_high_f64_f32(d));
}

/* acc[0..5): the five sums over the lanes of a */
INLINE void acc5_total(acc5 a, double *acc)
{
    acc[0] = vaddvq_f64(a.g);
    acc[1] = vaddvq_f64(a.gd);
    acc[2] = vaddvq_f64(a.q);
    acc[3] = vaddvq_f64(a.qd);
    acc[4] = vaddvq_f64(a.qg);
}

/* The lanes of a into lanes[k * stride ...] for sum k. */
INLINE void acc5_store(const acc5 *a, double *lanes, int64_t stride)
{
    vst1q_f64(lanes, a->g);
    vst1q_f64(lanes + stride, a->gd);
    vst1q_f64(lanes + 2 * stride, a->q);
    vst1q_f64(lanes + 3 * stride, a->qd);
    vst1q_f64(lanes + 4 * stride, a->qg);
}

/* Lane sums of a flat stream (lanes[k * period + l], lane l being column
 * l % w, w dividing period) folded into the five sums of w columns. */
static void fold_lanes5(const double *lanes, int64_t period, int64_t w, double *acc)
{
    for (int k = 0; k < 5; k++) fold_lanes(lanes + k * period, period, w, acc + k * w);
}

/* Adds lanes [0, cnt) of a (cnt >= 2: both) to columns j.. of the five
 * sums at acc + j (sum k of column j at acc[k * w + j]). */
INLINE void acc5_add_cols(const acc5 *a, double *acc, int64_t w, int64_t cnt)
{
    const float64x2_t v[5] = {a->g, a->gd, a->q, a->qd, a->qg};
    for (int k = 0; k < 5; k++) {
        double *s = acc + k * w;
        if (cnt >= 2) vst1q_f64(s, vaddq_f64(vld1q_f64(s), v[k]));
        else s[0] += vgetq_lane_f64(v[k], 0);
    }
}

/* the nine parameter arrays, in ggapply_s's order */
#define GG_NPAR 9
INLINE void gg_arrays_s(const cfbn_gg_f32 *p, const float **v)
{
    v[0] = p->mhi, v[1] = p->mlo, v[2] = p->a1, v[3] = p->b1, v[4] = p->c1;
    v[5] = p->a2, v[6] = p->b2, v[7] = p->c2, v[8] = p->e2;
}

/* c: mhi, mlo, a1, b1, c1, a2, b2, c2, e2 */
INLINE void ggapply_s(float32x4_t g, float32x4_t q, float32x4_t x, const float32x4_t *c, float32x4_t *ddy,
                      float32x4_t *dx)
{
    float32x4_t d = centered_s(x, c[0], c[1]);
    *ddy = vfmaq_f32(vfmaq_f32(c[4], d, c[3]), q, c[2]);
    *dx = vfmaq_f32(vfmaq_f32(vfmaq_f32(c[8], d, c[7]), q, c[6]), g, c[5]);
}

/* n elements whose lane l of every 4 has the parameters of lane l of m, l
 * (a run: broadcast) */
INLINE void ggstats_flat_s(const void *dy, const void *x, const void *ggx, int64_t n, float32x4_t m, float32x4_t l,
                           int dt, acc5 *lo, acc5 *hi)
{
    acc5 a = acc5_zero(), b = acc5_zero(), c = acc5_zero(), d = acc5_zero();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        gg_step_s(&a, &b, ld4(dy, i, dt), ld4(ggx, i, dt), centered_s(ld4(x, i, dt), m, l));
        gg_step_s(&c, &d, ld4(dy, i + 4, dt), ld4(ggx, i + 4, dt), centered_s(ld4(x, i + 4, dt), m, l));
    }
    if (i + 4 <= n) {
        gg_step_s(&a, &b, ld4(dy, i, dt), ld4(ggx, i, dt), centered_s(ld4(x, i, dt), m, l));
        i += 4;
    }
    if (i < n) {
        const int64_t cnt = n - i;
        const uint32x4_t mk = mask_s(cnt);
        /* dead lanes: dy = ggx = 0 and d = 0, whatever the parameters */
        gg_step_s(&c, &d, ld_part(dy, i, cnt, cnt, dt), ld_part(ggx, i, cnt, cnt, dt),
                  centered_s(ld_part(x, i, cnt, cnt, dt), and_s(m, mk), and_s(l, mk)));
    }
    *lo = acc5_add(a, c);
    *hi = acc5_add(b, d);
}

/* columns [j, j + cnt) (cnt 1..4) of kr rows from element o of n, added to
 * acc; m, l: the columns' parameters (zero past cnt) */
INLINE void ggstats_cols_s(const void *dy, const void *x, const void *ggx, int64_t n, int64_t o, int64_t j,
                           int64_t w, int64_t kr, int64_t cnt, float32x4_t m, float32x4_t l, double *acc, int dt)
{
    acc5 lo = acc5_zero(), hi = acc5_zero();
    for (int64_t k = 0; k < kr; k++) {
        const int64_t e = o + k * w + j;
        if (cnt == 4)
            gg_step_s(&lo, &hi, ld4(dy, e, dt), ld4(ggx, e, dt), centered_s(ld4(x, e, dt), m, l));
        else
            gg_step_s(&lo, &hi, ld_part(dy, e, cnt, n - e, dt), ld_part(ggx, e, cnt, n - e, dt),
                      centered_s(ld_part(x, e, cnt, n - e, dt), m, l));
    }
    acc5_add_cols(&lo, acc + j, w, cnt);
    if (cnt > 2) acc5_add_cols(&hi, acc + j + 2, w, cnt - 2);
}

INLINE void ggstats_run_s(const void *dy, const void *x, const void *ggx, int64_t n, const cfbn_gg_f32 *p,
                          double *acc, int dt)
{
    acc5 lo, hi;
    ggstats_flat_s(dy, x, ggx, n, vdupq_n_f32(p->mhi[0]), vdupq_n_f32(p->mlo[0]), dt, &lo, &hi);
    acc5_total(acc5_add(lo, hi), acc);
}

INLINE void ggstats_rows_s(const void *dy, const void *x, const void *ggx, int64_t rows, int64_t w,
                           const cfbn_gg_f32 *p, double *acc, int dt)
{
    if (w <= 0) return;
    if (4 % w == 0) {
        float32x4_t m, l, odd;
        double lanes[5 * 4];
        lanes_s(p->mhi, w, &m, &odd);
        lanes_s(p->mlo, w, &l, &odd);
        acc5 lo, hi;
        ggstats_flat_s(dy, x, ggx, rows * w, m, l, dt, &lo, &hi);
        acc5_store(&lo, lanes, 4);
        acc5_store(&hi, lanes + 2, 4);
        fold_lanes5(lanes, 4, w, acc);
        return;
    }
    const int64_t full = w & ~(int64_t)3, cnt = w - full, n = rows * w;
    float32x4_t tm = vdupq_n_f32(0.0f), tl = tm;
    if (cnt) {
        tm = ldparam_s(p->mhi + full, cnt);
        tl = ldparam_s(p->mlo + full, cnt);
    }
    memset(acc, 0, (size_t)(5 * w) * sizeof *acc);
    for (int64_t r = 0; r < rows; r += 8) {
        const int64_t kr = rows - r < 8 ? rows - r : 8, o = r * w;
        for (int64_t j = 0; j < full; j += 4)
            ggstats_cols_s(dy, x, ggx, n, o, j, w, kr, 4, vld1q_f32(p->mhi + j), vld1q_f32(p->mlo + j), acc, dt);
        if (cnt) ggstats_cols_s(dy, x, ggx, n, o, full, w, kr, cnt, tm, tl, acc, dt);
    }
}

/* n elements whose lane l of every 4 has the parameters of lane l of c */
INLINE void ggapply_flat_s(const void *dy, const void *x, const void *ggx, void *ddy, void *dx, int64_t n,
                           const float32x4_t *c, int dt)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t vy, vx;
        ggapply_s(ld4(dy, i, dt), ld4(ggx, i, dt), ld4(x, i, dt), c, &vy, &vx);
        st4(ddy, i, vy, dt);
        st4(dx, i, vx, dt);
    }
    if (i < n) {
        const int64_t cnt = n - i;
        float32x4_t vy, vx;
        ggapply_s(ld_part(dy, i, cnt, cnt, dt), ld_part(ggx, i, cnt, cnt, dt), ld_part(x, i, cnt, cnt, dt), c, &vy,
                  &vx);
        st_part(ddy, i, vy, cnt, dt);
        st_part(dx, i, vx, cnt, dt);
    }
}

INLINE void ggapply_run_s(const void *dy, const void *x, const void *ggx, void *ddy, void *dx, int64_t n,
                          const cfbn_gg_f32 *p, int dt)
{
    const float *v[GG_NPAR];
    float32x4_t c[GG_NPAR];
    gg_arrays_s(p, v);
    for (int k = 0; k < GG_NPAR; k++) c[k] = vdupq_n_f32(v[k][0]);
    ggapply_flat_s(dy, x, ggx, ddy, dx, n, c, dt);
}

INLINE void ggapply_rows_s(const void *dy, const void *x, const void *ggx, void *ddy, void *dx, int64_t rows,
                           int64_t w, const cfbn_gg_f32 *p, int dt)
{
    if (w <= 0) return;
    const float *v[GG_NPAR];
    float32x4_t c[GG_NPAR], t[GG_NPAR], odd;
    gg_arrays_s(p, v);
    if (4 % w == 0) {
        for (int k = 0; k < GG_NPAR; k++) lanes_s(v[k], w, &c[k], &odd);
        ggapply_flat_s(dy, x, ggx, ddy, dx, rows * w, c, dt);
        return;
    }
    const int64_t full = w & ~(int64_t)3, cnt = w - full, n = rows * w;
    for (int k = 0; k < GG_NPAR; k++) t[k] = cnt ? ldparam_s(v[k] + full, cnt) : vdupq_n_f32(0.0f);
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = r * w;
        float32x4_t vy, vx;
        for (int64_t j = 0; j < full; j += 4) {
            for (int k = 0; k < GG_NPAR; k++) c[k] = vld1q_f32(v[k] + j);
            ggapply_s(ld4(dy, o + j, dt), ld4(ggx, o + j, dt), ld4(x, o + j, dt), c, &vy, &vx);
            st4(ddy, o + j, vy, dt);
            st4(dx, o + j, vx, dt);
        }
        if (cnt) {
            const int64_t e = o + full, av = n - e;
            ggapply_s(ld_part(dy, e, cnt, av, dt), ld_part(ggx, e, cnt, av, dt), ld_part(x, e, cnt, av, dt), t, &vy,
                      &vx);
            st_part(ddy, e, vy, cnt, dt);
            st_part(dx, e, vx, cnt, dt);
        }
    }
}

/* ---- float32, float16 and bfloat16 entries ---- */

CFBN_FLOAT_ENTRIES(f32, CFBN_F32, s)
CFBN_FLOAT_ENTRIES(f16, CFBN_F16, s)
CFBN_FLOAT_ENTRIES(bf16, CFBN_BF16, s)
CFBN_GG_ENTRIES(f32, CFBN_F32, s)
CFBN_GG_ENTRIES(f16, CFBN_F16, s)
CFBN_GG_ENTRIES(bf16, CFBN_BF16, s)

/* ---- float64: 2 lanes; flat streams alternate two parameter sets over
 * 2-element blocks, so widths dividing 4 see whole columns per lane ---- */

typedef struct {
    float64x2_t s1, s2;
} acc2;

INLINE acc2 acc2_zero(void)
{
    acc2 a = {vdupq_n_f64(0.0), vdupq_n_f64(0.0)};
    return a;
}

INLINE acc2 acc2_add(acc2 a, acc2 b)
{
    acc2 r = {vaddq_f64(a.s1, b.s1), vaddq_f64(a.s2, b.s2)};
    return r;
}

INLINE void stats_step_d(acc2 *a, float64x2_t x, float64x2_t sh)
{
    float64x2_t d = vsubq_f64(x, sh);
    a->s1 = vaddq_f64(a->s1, d);
    a->s2 = vfmaq_f64(a->s2, d, d);
}

INLINE float64x2_t centered_d(float64x2_t x, float64x2_t mhi, float64x2_t mlo)
{
    return vsubq_f64(vsubq_f64(x, mhi), mlo);
}

INLINE void gstats_step_d(acc2 *a, float64x2_t g, float64x2_t d)
{
    a->s1 = vaddq_f64(a->s1, g);
    a->s2 = vfmaq_f64(a->s2, g, d);
}

INLINE float64x2_t apply_d(float64x2_t x, float64x2_t mhi, float64x2_t mlo, float64x2_t al, float64x2_t be)
{
    return vfmaq_f64(be, centered_d(x, mhi, mlo), al);
}

INLINE float64x2_t gapply_d(float64x2_t g, float64x2_t x, float64x2_t mhi, float64x2_t mlo, float64x2_t a,
                            float64x2_t b, float64x2_t c)
{
    return vfmaq_f64(vfmaq_f64(c, centered_d(x, mhi, mlo), b), g, a);
}

/* the one element p[0] in lane 0, zero in lane 1 */
INLINE float64x2_t ld1_d(const double *p) { return vsetq_lane_f64(p[0], vdupq_n_f64(0.0), 0); }

/* sh[0] for even 2-blocks, sh[1] for odd; sums of even blocks in *ea */
INLINE void stats_flat_d(const double *x, int64_t n, const float64x2_t *sh, acc2 *ea, acc2 *oa)
{
    acc2 a0 = acc2_zero(), b0 = acc2_zero(), a1 = acc2_zero(), b1 = acc2_zero();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        stats_step_d(&a0, vld1q_f64(x + i), sh[0]);
        stats_step_d(&b0, vld1q_f64(x + i + 2), sh[1]);
        stats_step_d(&a1, vld1q_f64(x + i + 4), sh[0]);
        stats_step_d(&b1, vld1q_f64(x + i + 6), sh[1]);
    }
    for (; i + 2 <= n; i += 2) {
        if ((i >> 1) & 1) stats_step_d(&b1, vld1q_f64(x + i), sh[1]);
        else stats_step_d(&a1, vld1q_f64(x + i), sh[0]);
    }
    if (i < n) {
        /* one element left: lane 1 of x and of the shift are 0, so d = 0 */
        if ((i >> 1) & 1) stats_step_d(&b1, ld1_d(x + i), vsetq_lane_f64(0.0, sh[1], 1));
        else stats_step_d(&a1, ld1_d(x + i), vsetq_lane_f64(0.0, sh[0], 1));
    }
    *ea = acc2_add(a0, a1);
    *oa = acc2_add(b0, b1);
}

/* m: mhi, mlo of even 2-blocks, then of odd ones */
INLINE void gstats_flat_d(const double *dy, const double *x, int64_t n, const float64x2_t *m, acc2 *ea, acc2 *oa)
{
    acc2 a0 = acc2_zero(), b0 = acc2_zero(), a1 = acc2_zero(), b1 = acc2_zero();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        gstats_step_d(&a0, vld1q_f64(dy + i), centered_d(vld1q_f64(x + i), m[0], m[1]));
        gstats_step_d(&b0, vld1q_f64(dy + i + 2), centered_d(vld1q_f64(x + i + 2), m[2], m[3]));
        gstats_step_d(&a1, vld1q_f64(dy + i + 4), centered_d(vld1q_f64(x + i + 4), m[0], m[1]));
        gstats_step_d(&b1, vld1q_f64(dy + i + 6), centered_d(vld1q_f64(x + i + 6), m[2], m[3]));
    }
    for (; i + 2 <= n; i += 2) {
        if ((i >> 1) & 1) gstats_step_d(&b1, vld1q_f64(dy + i), centered_d(vld1q_f64(x + i), m[2], m[3]));
        else gstats_step_d(&a1, vld1q_f64(dy + i), centered_d(vld1q_f64(x + i), m[0], m[1]));
    }
    if (i < n) {
        /* one element left: lane 1 gets dy = 0 and d = 0 */
        const float64x2_t *q = m + 2 * ((i >> 1) & 1);
        float64x2_t d = centered_d(ld1_d(x + i), vsetq_lane_f64(0.0, q[0], 1), vsetq_lane_f64(0.0, q[1], 1));
        if ((i >> 1) & 1) gstats_step_d(&b1, ld1_d(dy + i), d);
        else gstats_step_d(&a1, ld1_d(dy + i), d);
    }
    *ea = acc2_add(a0, a1);
    *oa = acc2_add(b0, b1);
}

/* p: mhi, mlo, alpha, beta of even 2-blocks, then of odd ones */
INLINE void apply_flat_d(const double *x, double *y, int64_t n, const float64x2_t *p)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float64x2_t v0 = vld1q_f64(x + i), v1 = vld1q_f64(x + i + 2);
        float64x2_t v2 = vld1q_f64(x + i + 4), v3 = vld1q_f64(x + i + 6);
        vst1q_f64(y + i, apply_d(v0, p[0], p[1], p[2], p[3]));
        vst1q_f64(y + i + 2, apply_d(v1, p[4], p[5], p[6], p[7]));
        vst1q_f64(y + i + 4, apply_d(v2, p[0], p[1], p[2], p[3]));
        vst1q_f64(y + i + 6, apply_d(v3, p[4], p[5], p[6], p[7]));
    }
    for (; i + 2 <= n; i += 2) {
        const float64x2_t *q = p + 4 * ((i >> 1) & 1);
        vst1q_f64(y + i, apply_d(vld1q_f64(x + i), q[0], q[1], q[2], q[3]));
    }
    if (i < n) {
        const float64x2_t *q = p + 4 * ((i >> 1) & 1);
        y[i] = vgetq_lane_f64(apply_d(ld1_d(x + i), q[0], q[1], q[2], q[3]), 0);
    }
}

/* p: mhi, mlo, a, b, c of even 2-blocks, then of odd ones */
INLINE void gapply_flat_d(const double *dy, const double *x, double *dx, int64_t n, const float64x2_t *p)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        float64x2_t g0 = vld1q_f64(dy + i), g1 = vld1q_f64(dy + i + 2);
        float64x2_t v0 = vld1q_f64(x + i), v1 = vld1q_f64(x + i + 2);
        vst1q_f64(dx + i, gapply_d(g0, v0, p[0], p[1], p[2], p[3], p[4]));
        vst1q_f64(dx + i + 2, gapply_d(g1, v1, p[5], p[6], p[7], p[8], p[9]));
    }
    if (i + 2 <= n) {
        vst1q_f64(dx + i, gapply_d(vld1q_f64(dy + i), vld1q_f64(x + i), p[0], p[1], p[2], p[3], p[4]));
        i += 2;
    }
    if (i < n) {
        const float64x2_t *q = p + 5 * ((i >> 1) & 1);
        dx[i] = vgetq_lane_f64(gapply_d(ld1_d(dy + i), ld1_d(x + i), q[0], q[1], q[2], q[3], q[4]), 0);
    }
}

INLINE void lanes_d(const double *v, int64_t w, float64x2_t *even, float64x2_t *odd)
{
    double t[4];
    for (int l = 0; l < 4; l++) t[l] = v[l % w];
    *even = vld1q_f64(t);
    *odd = vld1q_f64(t + 2);
}

static void stats_run_f64(const void *x_, int64_t n, double shift, double *acc)
{
    const double *x = x_;
    float64x2_t s = vdupq_n_f64(shift);
    const float64x2_t sh[2] = {s, s};
    acc2 a, b;
    stats_flat_d(x, n, sh, &a, &b);
    acc2 t = acc2_add(a, b);
    acc[0] = vaddvq_f64(t.s1);
    acc[1] = vaddvq_f64(t.s2);
}

static void stats_rows_f64(const void *x_, int64_t rows, int64_t w, const double *shift, double *acc)
{
    const double *x = x_;
    if (w <= 0) return;
    if (4 % w == 0) {
        float64x2_t sh[2];
        double s1[4], s2[4];
        lanes_d(shift, w, &sh[0], &sh[1]);
        acc2 a, b;
        stats_flat_d(x, rows * w, sh, &a, &b);
        vst1q_f64(s1, a.s1);
        vst1q_f64(s1 + 2, b.s1);
        vst1q_f64(s2, a.s2);
        vst1q_f64(s2 + 2, b.s2);
        fold_lanes(s1, 4, w, acc);
        fold_lanes(s2, 4, w, acc + w);
        return;
    }
    const int64_t full = w & ~(int64_t)1, cnt = w - full;
    memset(acc, 0, (size_t)(2 * w) * sizeof *acc);
    acc2 t = acc2_zero();
    float64x2_t ts = cnt ? ld1_d(shift + full) : vdupq_n_f64(0.0);
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2) {
        const double *x0 = x + r * w, *x1 = x0 + w;
        for (int64_t j = 0; j < full; j += 2) {
            acc2 c = {vld1q_f64(acc + j), vld1q_f64(acc + w + j)};
            float64x2_t s = vld1q_f64(shift + j);
            stats_step_d(&c, vld1q_f64(x0 + j), s);
            stats_step_d(&c, vld1q_f64(x1 + j), s);
            vst1q_f64(acc + j, c.s1);
            vst1q_f64(acc + w + j, c.s2);
        }
        if (cnt) {
            stats_step_d(&t, ld1_d(x0 + full), ts);
            stats_step_d(&t, ld1_d(x1 + full), ts);
        }
    }
    if (r < rows) {
        const double *x0 = x + r * w;
        for (int64_t j = 0; j < full; j += 2) {
            acc2 c = {vld1q_f64(acc + j), vld1q_f64(acc + w + j)};
            stats_step_d(&c, vld1q_f64(x0 + j), vld1q_f64(shift + j));
            vst1q_f64(acc + j, c.s1);
            vst1q_f64(acc + w + j, c.s2);
        }
        if (cnt) stats_step_d(&t, ld1_d(x0 + full), ts);
    }
    if (cnt) {
        acc[full] = vgetq_lane_f64(t.s1, 0);
        acc[w + full] = vgetq_lane_f64(t.s2, 0);
    }
}

static void apply_run_f64(const void *x_, void *y_, int64_t n, const cfbn_apply_f64 *p)
{
    const double *x = x_;
    double *y = y_;
    float64x2_t m = vdupq_n_f64(p->mhi[0]), l = vdupq_n_f64(p->mlo[0]);
    float64x2_t a = vdupq_n_f64(p->alpha[0]), b = vdupq_n_f64(p->beta[0]);
    const float64x2_t q[8] = {m, l, a, b, m, l, a, b};
    apply_flat_d(x, y, n, q);
}

static void apply_rows_f64(const void *x_, void *y_, int64_t rows, int64_t w, const cfbn_apply_f64 *p)
{
    const double *x = x_;
    double *y = y_;
    if (w <= 0) return;
    if (4 % w == 0) {
        float64x2_t q[8];
        lanes_d(p->mhi, w, &q[0], &q[4]);
        lanes_d(p->mlo, w, &q[1], &q[5]);
        lanes_d(p->alpha, w, &q[2], &q[6]);
        lanes_d(p->beta, w, &q[3], &q[7]);
        apply_flat_d(x, y, rows * w, q);
        return;
    }
    const int64_t full = w & ~(int64_t)1, cnt = w - full;
    float64x2_t tm = vdupq_n_f64(0.0), tl = tm, ta = tm, tb = tm;
    if (cnt) {
        tm = ld1_d(p->mhi + full);
        tl = ld1_d(p->mlo + full);
        ta = ld1_d(p->alpha + full);
        tb = ld1_d(p->beta + full);
    }
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * w;
        double *yr = y + r * w;
        for (int64_t j = 0; j < full; j += 2)
            vst1q_f64(yr + j, apply_d(vld1q_f64(xr + j), vld1q_f64(p->mhi + j), vld1q_f64(p->mlo + j),
                                      vld1q_f64(p->alpha + j), vld1q_f64(p->beta + j)));
        if (cnt) yr[full] = vgetq_lane_f64(apply_d(ld1_d(xr + full), tm, tl, ta, tb), 0);
    }
}

static void gstats_run_f64(const void *dy_, const void *x_, int64_t n, const cfbn_grad_f64 *p, double *acc)
{
    const double *dy = dy_;
    const double *x = x_;
    float64x2_t m = vdupq_n_f64(p->mhi[0]), l = vdupq_n_f64(p->mlo[0]);
    const float64x2_t q[4] = {m, l, m, l};
    acc2 a, b;
    gstats_flat_d(dy, x, n, q, &a, &b);
    acc2 t = acc2_add(a, b);
    acc[0] = vaddvq_f64(t.s1);
    acc[1] = vaddvq_f64(t.s2);
}

static void gstats_rows_f64(const void *dy_, const void *x_, int64_t rows, int64_t w, const cfbn_grad_f64 *p, double *acc)
{
    const double *dy = dy_;
    const double *x = x_;
    if (w <= 0) return;
    if (4 % w == 0) {
        float64x2_t q[4];
        double s1[4], s2[4];
        lanes_d(p->mhi, w, &q[0], &q[2]);
        lanes_d(p->mlo, w, &q[1], &q[3]);
        acc2 a, b;
        gstats_flat_d(dy, x, rows * w, q, &a, &b);
        vst1q_f64(s1, a.s1);
        vst1q_f64(s1 + 2, b.s1);
        vst1q_f64(s2, a.s2);
        vst1q_f64(s2 + 2, b.s2);
        fold_lanes(s1, 4, w, acc);
        fold_lanes(s2, 4, w, acc + w);
        return;
    }
    const int64_t full = w & ~(int64_t)1, cnt = w - full;
    memset(acc, 0, (size_t)(2 * w) * sizeof *acc);
    acc2 t = acc2_zero();
    float64x2_t tm = vdupq_n_f64(0.0), tl = tm;
    if (cnt) {
        tm = ld1_d(p->mhi + full);
        tl = ld1_d(p->mlo + full);
    }
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2) {
        const double *x0 = x + r * w, *x1 = x0 + w, *g0 = dy + r * w, *g1 = g0 + w;
        for (int64_t j = 0; j < full; j += 2) {
            acc2 c = {vld1q_f64(acc + j), vld1q_f64(acc + w + j)};
            float64x2_t m = vld1q_f64(p->mhi + j), l = vld1q_f64(p->mlo + j);
            gstats_step_d(&c, vld1q_f64(g0 + j), centered_d(vld1q_f64(x0 + j), m, l));
            gstats_step_d(&c, vld1q_f64(g1 + j), centered_d(vld1q_f64(x1 + j), m, l));
            vst1q_f64(acc + j, c.s1);
            vst1q_f64(acc + w + j, c.s2);
        }
        if (cnt) {
            gstats_step_d(&t, ld1_d(g0 + full), centered_d(ld1_d(x0 + full), tm, tl));
            gstats_step_d(&t, ld1_d(g1 + full), centered_d(ld1_d(x1 + full), tm, tl));
        }
    }
    if (r < rows) {
        const double *x0 = x + r * w, *g0 = dy + r * w;
        for (int64_t j = 0; j < full; j += 2) {
            acc2 c = {vld1q_f64(acc + j), vld1q_f64(acc + w + j)};
            gstats_step_d(&c, vld1q_f64(g0 + j), centered_d(vld1q_f64(x0 + j), vld1q_f64(p->mhi + j), vld1q_f64(p->mlo + j)));
            vst1q_f64(acc + j, c.s1);
            vst1q_f64(acc + w + j, c.s2);
        }
        if (cnt) gstats_step_d(&t, ld1_d(g0 + full), centered_d(ld1_d(x0 + full), tm, tl));
    }
    if (cnt) {
        acc[full] = vgetq_lane_f64(t.s1, 0);
        acc[w + full] = vgetq_lane_f64(t.s2, 0);
    }
}

static void gapply_run_f64(const void *dy_, const void *x_, void *dx_, int64_t n, const cfbn_grad_f64 *p)
{
    const double *dy = dy_;
    const double *x = x_;
    double *dx = dx_;
    float64x2_t m = vdupq_n_f64(p->mhi[0]), l = vdupq_n_f64(p->mlo[0]);
    float64x2_t a = vdupq_n_f64(p->a[0]), b = vdupq_n_f64(p->b[0]), c = vdupq_n_f64(p->c[0]);
    const float64x2_t q[10] = {m, l, a, b, c, m, l, a, b, c};
    gapply_flat_d(dy, x, dx, n, q);
}

static void gapply_rows_f64(const void *dy_, const void *x_, void *dx_, int64_t rows, int64_t w, const cfbn_grad_f64 *p)
{
    const double *dy = dy_;
    const double *x = x_;
    double *dx = dx_;
    if (w <= 0) return;
    if (4 % w == 0) {
        float64x2_t q[10];
        lanes_d(p->mhi, w, &q[0], &q[5]);
        lanes_d(p->mlo, w, &q[1], &q[6]);
        lanes_d(p->a, w, &q[2], &q[7]);
        lanes_d(p->b, w, &q[3], &q[8]);
        lanes_d(p->c, w, &q[4], &q[9]);
        gapply_flat_d(dy, x, dx, rows * w, q);
        return;
    }
    const int64_t full = w & ~(int64_t)1, cnt = w - full;
    float64x2_t tm = vdupq_n_f64(0.0), tl = tm, ta = tm, tb = tm, tc = tm;
    if (cnt) {
        tm = ld1_d(p->mhi + full);
        tl = ld1_d(p->mlo + full);
        ta = ld1_d(p->a + full);
        tb = ld1_d(p->b + full);
        tc = ld1_d(p->c + full);
    }
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * w, *gr = dy + r * w;
        double *o = dx + r * w;
        for (int64_t j = 0; j < full; j += 2)
            vst1q_f64(o + j, gapply_d(vld1q_f64(gr + j), vld1q_f64(xr + j), vld1q_f64(p->mhi + j), vld1q_f64(p->mlo + j),
                                      vld1q_f64(p->a + j), vld1q_f64(p->b + j), vld1q_f64(p->c + j)));
        if (cnt) o[full] = vgetq_lane_f64(gapply_d(ld1_d(gr + full), ld1_d(xr + full), tm, tl, ta, tb, tc), 0);
    }
}

/* ---- second-order gradient, float64 (cfbn_gg_f64) ----
 * In double throughout; rows as the float kernels walk them (blocks of 8
 * rows, groups of 4 columns as two pairs), widths dividing 2 as one flat
 * stream. */

/* cnt elements at p (cnt >= 2: both), zero past them */
INLINE float64x2_t ld_cols_d(const double *p, int64_t cnt)
{
    return cnt >= 2 ? vld1q_f64(p) : cnt == 1 ? ld1_d(p) : vdupq_n_f64(0.0);
}

INLINE void st_cols_d(double *p, float64x2_t v, int64_t cnt)
{
    if (cnt >= 2) vst1q_f64(p, v);
    else p[0] = vgetq_lane_f64(v, 0);
}

INLINE void gg_arrays_d(const cfbn_gg_f64 *p, const double **v)
{
    v[0] = p->mhi, v[1] = p->mlo, v[2] = p->a1, v[3] = p->b1, v[4] = p->c1;
    v[5] = p->a2, v[6] = p->b2, v[7] = p->c2, v[8] = p->e2;
}

/* c: mhi, mlo, a1, b1, c1, a2, b2, c2, e2 */
INLINE void ggapply_d(float64x2_t g, float64x2_t q, float64x2_t x, const float64x2_t *c, float64x2_t *ddy,
                      float64x2_t *dx)
{
    float64x2_t d = centered_d(x, c[0], c[1]);
    *ddy = vfmaq_f64(vfmaq_f64(c[4], d, c[3]), q, c[2]);
    *dx = vfmaq_f64(vfmaq_f64(vfmaq_f64(c[8], d, c[7]), q, c[6]), g, c[5]);
}

/* n elements whose lane l of every 2 has the parameters of lane l of m, l */
INLINE void ggstats_flat_d(const double *dy, const double *x, const double *ggx, int64_t n, float64x2_t m,
                           float64x2_t l, acc5 *out)
{
    acc5 a = acc5_zero(), b = acc5_zero();
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        gg_step_d(&a, vld1q_f64(dy + i), vld1q_f64(ggx + i), centered_d(vld1q_f64(x + i), m, l));
        gg_step_d(&b, vld1q_f64(dy + i + 2), vld1q_f64(ggx + i + 2), centered_d(vld1q_f64(x + i + 2), m, l));
    }
    for (; i < n; i += 2) {
        /* one element left: lane 1 gets dy = ggx = 0 and d = 0 */
        const int64_t k = n - i;
        float64x2_t mk = k >= 2 ? m : vsetq_lane_f64(0.0, m, 1), lk = k >= 2 ? l : vsetq_lane_f64(0.0, l, 1);
        gg_step_d(&a, ld_cols_d(dy + i, k), ld_cols_d(ggx + i, k), centered_d(ld_cols_d(x + i, k), mk, lk));
    }
    *out = acc5_add(a, b);
}

/* columns [j, j + cnt) (cnt 1..4) of kr rows from element o, added to acc */
INLINE void ggstats_cols_d(const double *dy, const double *x, const double *ggx, int64_t o, int64_t j, int64_t w,
                           int64_t kr, int64_t cnt, const cfbn_gg_f64 *p, double *acc)
{
    const float64x2_t m0 = ld_cols_d(p->mhi + j, cnt), l0 = ld_cols_d(p->mlo + j, cnt);
    const float64x2_t m1 = ld_cols_d(p->mhi + j + 2, cnt - 2), l1 = ld_cols_d(p->mlo + j + 2, cnt - 2);
    acc5 lo = acc5_zero(), hi = acc5_zero();
    for (int64_t k = 0; k < kr; k++) {
        const int64_t e = o + k * w + j;
        gg_step_d(&lo, ld_cols_d(dy + e, cnt), ld_cols_d(ggx + e, cnt), centered_d(ld_cols_d(x + e, cnt), m0, l0));
        if (cnt > 2)
            gg_step_d(&hi, ld_cols_d(dy + e + 2, cnt - 2), ld_cols_d(ggx + e + 2, cnt - 2),
                      centered_d(ld_cols_d(x + e + 2, cnt - 2), m1, l1));
    }
    acc5_add_cols(&lo, acc + j, w, cnt);
    if (cnt > 2) acc5_add_cols(&hi, acc + j + 2, w, cnt - 2);
}

static void ggstats_run_f64(const void *dy, const void *x, const void *ggx, int64_t n, const cfbn_gg_f64 *p,
                            double *acc)
{
    acc5 a;
    ggstats_flat_d(dy, x, ggx, n, vdupq_n_f64(p->mhi[0]), vdupq_n_f64(p->mlo[0]), &a);
    acc5_total(a, acc);
}

static void ggstats_rows_f64(const void *dy_, const void *x_, const void *ggx_, int64_t rows, int64_t w,
                             const cfbn_gg_f64 *p, double *acc)
{
    const double *dy = dy_, *x = x_, *ggx = ggx_;
    if (w <= 0) return;
    if (2 % w == 0) {
        float64x2_t m, l, odd;
        double lanes[5 * 2];
        lanes_d(p->mhi, w, &m, &odd);
        lanes_d(p->mlo, w, &l, &odd);
        acc5 a;
        ggstats_flat_d(dy, x, ggx, rows * w, m, l, &a);
        acc5_store(&a, lanes, 2);
        fold_lanes5(lanes, 2, w, acc);
        return;
    }
    memset(acc, 0, (size_t)(5 * w) * sizeof *acc);
    for (int64_t r = 0; r < rows; r += 8) {
        const int64_t kr = rows - r < 8 ? rows - r : 8, o = r * w;
        for (int64_t j = 0; j < w; j += 4) {
            if (j + 4 <= w) ggstats_cols_d(dy, x, ggx, o, j, w, kr, 4, p, acc);
            else ggstats_cols_d(dy, x, ggx, o, j, w, kr, w - j, p, acc);
        }
    }
}

/* n elements whose lane l of every 2 has the parameters of lane l of c */
INLINE void ggapply_flat_d(const double *dy, const double *x, const double *ggx, double *ddy, double *dx, int64_t n,
                           const float64x2_t *c)
{
    for (int64_t i = 0; i < n; i += 2) {
        const int64_t k = n - i;
        float64x2_t vy, vx;
        ggapply_d(ld_cols_d(dy + i, k), ld_cols_d(ggx + i, k), ld_cols_d(x + i, k), c, &vy, &vx);
        st_cols_d(ddy + i, vy, k);
        st_cols_d(dx + i, vx, k);
    }
}

static void ggapply_run_f64(const void *dy, const void *x, const void *ggx, void *ddy, void *dx, int64_t n,
                            const cfbn_gg_f64 *p)
{
    const double *v[GG_NPAR];
    float64x2_t c[GG_NPAR];
    gg_arrays_d(p, v);
    for (int k = 0; k < GG_NPAR; k++) c[k] = vdupq_n_f64(v[k][0]);
    ggapply_flat_d(dy, x, ggx, ddy, dx, n, c);
}

static void ggapply_rows_f64(const void *dy_, const void *x_, const void *ggx_, void *ddy_, void *dx_, int64_t rows,
                             int64_t w, const cfbn_gg_f64 *p)
{
    const double *dy = dy_, *x = x_, *ggx = ggx_;
    double *ddy = ddy_, *dx = dx_;
    if (w <= 0) return;
    const double *v[GG_NPAR];
    float64x2_t c[GG_NPAR], t[GG_NPAR], odd;
    gg_arrays_d(p, v);
    if (2 % w == 0) {
        for (int k = 0; k < GG_NPAR; k++) lanes_d(v[k], w, &c[k], &odd);
        ggapply_flat_d(dy, x, ggx, ddy, dx, rows * w, c);
        return;
    }
    const int64_t full = w & ~(int64_t)1, cnt = w - full;
    for (int k = 0; k < GG_NPAR; k++) t[k] = ld_cols_d(v[k] + full, cnt);
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = r * w;
        float64x2_t vy, vx;
        for (int64_t j = 0; j < full; j += 2) {
            for (int k = 0; k < GG_NPAR; k++) c[k] = vld1q_f64(v[k] + j);
            ggapply_d(vld1q_f64(dy + o + j), vld1q_f64(ggx + o + j), vld1q_f64(x + o + j), c, &vy, &vx);
            vst1q_f64(ddy + o + j, vy);
            vst1q_f64(dx + o + j, vx);
        }
        if (cnt) {
            const int64_t e = o + full;
            ggapply_d(ld1_d(dy + e), ld1_d(ggx + e), ld1_d(x + e), t, &vy, &vx);
            dx[e] = vgetq_lane_f64(vx, 0);
            ddy[e] = vgetq_lane_f64(vy, 0);
        }
    }
}

const cfbn_kernels cfbn_kernels_neon = {
    .name = "neon",
    .lanes = 4,
    .f32 = { CFBN_FLOAT_TABLE(f32), CFBN_GG_TABLE(f32) },
    .f64 = {
        stats_run_f64, stats_rows_f64, apply_run_f64, apply_rows_f64,
        gstats_run_f64, gstats_rows_f64, gapply_run_f64, gapply_rows_f64,
        .ggstats_run = ggstats_run_f64, .ggstats_rows = ggstats_rows_f64,
        .ggapply_run = ggapply_run_f64, .ggapply_rows = ggapply_rows_f64,
    },
    .f16 = { CFBN_FLOAT_TABLE(f16), CFBN_GG_TABLE(f16) },
    .bf16 = { CFBN_FLOAT_TABLE(bf16), CFBN_GG_TABLE(bf16) },
};

#endif
