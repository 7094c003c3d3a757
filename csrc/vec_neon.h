/* AArch64 NEON primitives: 4 float lanes (2 double), the same names and
 * meanings as vec_avx2.h (tests/c/vec_portable.h is the meaning written
 * out, tests/c/vec_check.c compares the two bit for bit under qemu).
 * Advanced SIMD and the float16 conversions are architectural on AArch64:
 * no flags and no feature test.  Masks are all-ones or zero lanes
 * (uint32x4_t, uint64x2_t); vh, the halfwords of two vf, is a uint16x8_t.
 *
 * Where x86 and NEON differ, x86's results are the meaning: min and max
 * return the second operand where either is NaN (a compare and a select,
 * not FMIN/FMAX, which return NaN); bfloat16 by integer operations and
 * storage.h's rule (ARMv8.6's BFCVT is not in the baseline).  There are no
 * non-temporal stores worth their name (STNP takes pairs of registers and
 * is only a hint), so the streaming primitives are plain stores and
 * stream_fence is empty. */
#ifndef CFBN_VEC_NEON_H
#define CFBN_VEC_NEON_H

#if !defined(__aarch64__)
#error "vec_neon.h is for AArch64"
#endif

#include <arm_neon.h>
#include <stdint.h>
#include <string.h>

#include "cfbn.h"
#include "storage.h"

#define INLINE static inline __attribute__((always_inline))
/* the rarely taken ways back to double sums: out of line, so that the fast
 * loops keep their code and its alignment */
#define COLD static __attribute__((noinline, cold))

typedef float32x4_t vf;       /* VF_LANES floats */
typedef uint32x4_t vf_mask;   /* lanes of a vf, all ones or zero */
#define VF_LANES 4
typedef float64x2_t vd;       /* VD_LANES doubles */
typedef uint64x2_t vd_mask;
#define VD_LANES 2
/* 2 VF_LANES halfwords: the 2-byte storage of two vf */
typedef uint16x8_t vh;
/* the streaming stores are plain ones, which need no alignment
 * (vec_avx2.h: VF_NT_MIN_ALIGN and VF_NT_ALIGN) */
#define VF_NT_MIN_ALIGN 1
#define VF_NT_ALIGN 1

/* ---- vd: 2 doubles ---- */

INLINE vd vd_zero(void) { return vdupq_n_f64(0.0); }
INLINE vd vd_set1(double v) { return vdupq_n_f64(v); }
INLINE vd vd_load(const double *p) { return vld1q_f64(p); }
INLINE void vd_store(double *p, vd v) { vst1q_f64(p, v); }
/* lanes [0, cnt) set; cnt may be <= 0 or >= VD_LANES */
INLINE vd_mask vd_mask_first(int64_t cnt)
{
    const int64x2_t lane = {0, 1};
    return vcltq_s64(lane, vdupq_n_s64(cnt));
}
/* the set lanes of m from p (the others read as 0 and are not touched):
 * no masked loads, so lane by lane */
INLINE vd vd_load_part(const double *p, vd_mask m)
{
    double buf[2] = {vgetq_lane_u64(m, 0) ? p[0] : 0.0, vgetq_lane_u64(m, 1) ? p[1] : 0.0};
    return vld1q_f64(buf);
}
INLINE void vd_store_part(double *p, vd_mask m, vd v)
{
    if (vgetq_lane_u64(m, 0)) p[0] = vgetq_lane_f64(v, 0);
    if (vgetq_lane_u64(m, 1)) p[1] = vgetq_lane_f64(v, 1);
}
INLINE vd vd_keep(vd v, vd_mask m) { return vreinterpretq_f64_u64(vandq_u64(vreinterpretq_u64_f64(v), m)); }
INLINE vd vd_add(vd a, vd b) { return vaddq_f64(a, b); }
INLINE vd vd_sub(vd a, vd b) { return vsubq_f64(a, b); }
INLINE vd vd_mul(vd a, vd b) { return vmulq_f64(a, b); }
/* a * b + c, c - a * b: one rounding */
INLINE vd vd_fma(vd a, vd b, vd c) { return vfmaq_f64(c, a, b); }
INLINE vd vd_fnma(vd a, vd b, vd c) { return vfmsq_f64(c, a, b); }
INLINE vd vd_or(vd a, vd b) { return vreinterpretq_f64_u64(vorrq_u64(vreinterpretq_u64_f64(a), vreinterpretq_u64_f64(b))); }
INLINE double vd_hsum(vd v) { return vaddvq_f64(v); }
/* each lane rounded to float and back */
INLINE vd vd_to_float_and_back(vd v) { return vcvt_f64_f32(vcvt_f32_f64(v)); }
/* not (a >= b): true where a < b or either is NaN; a > b, ordered */
INLINE vd_mask vd_nge(vd a, vd b) { return vreinterpretq_u64_u32(vmvnq_u32(vreinterpretq_u32_u64(vcgeq_f64(a, b)))); }
INLINE vd_mask vd_gt(vd a, vd b) { return vcgtq_f64(a, b); }
INLINE vd_mask vd_mask_or(vd_mask a, vd_mask b) { return vorrq_u64(a, b); }
INLINE int vd_mask_any(vd_mask m) { return vmaxvq_u32(vreinterpretq_u32_u64(m)) != 0; }
/* |v|: the sign bit cleared */
INLINE vd vd_abs(vd v) { return vreinterpretq_f64_u64(vbicq_u64(vreinterpretq_u64_f64(v), vdupq_n_u64(1ull << 63))); }
/* set lanes all ones, clear lanes 0; and back (lanes all ones or zero) */
INLINE vd vd_mask_bits(vd_mask m) { return vreinterpretq_f64_u64(m); }
INLINE vd_mask vd_bits_mask(vd v) { return vreinterpretq_u64_f64(v); }

/* ---- vf: 4 floats ---- */

INLINE vf vf_zero(void) { return vdupq_n_f32(0.0f); }
INLINE vf vf_set1(float v) { return vdupq_n_f32(v); }
INLINE vf vf_load(const float *p) { return vld1q_f32(p); }
INLINE void vf_store(float *p, vf v) { vst1q_f32(p, v); }
/* lanes [0, cnt) set; cnt may be <= 0 or >= VF_LANES */
INLINE vf_mask vf_mask_first(int64_t cnt)
{
    const int32x4_t lane = {0, 1, 2, 3};
    return vcltq_s32(lane, vdupq_n_s32(cnt < 0 ? 0 : cnt > 4 ? 4 : (int32_t)cnt));
}
/* lanes [VF_LANES - cnt, VF_LANES) set */
INLINE vf_mask vf_mask_last(int64_t cnt)
{
    const int32x4_t lane = {0, 1, 2, 3};
    return vcgeq_s32(lane, vdupq_n_s32(4 - (cnt < 0 ? 0 : cnt > 4 ? 4 : (int32_t)cnt)));
}
/* the set lanes of m from p (the others read as 0, their memory untouched) */
INLINE vf vf_load_part(const float *p, vf_mask m)
{
    uint32_t on[4];
    float buf[4];
    vst1q_u32(on, m);
    for (int l = 0; l < 4; l++) buf[l] = on[l] ? p[l] : 0.0f;
    return vld1q_f32(buf);
}
INLINE vf vf_keep(vf v, vf_mask m) { return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v), m)); }
INLINE vf vf_add(vf a, vf b) { return vaddq_f32(a, b); }
INLINE vf vf_sub(vf a, vf b) { return vsubq_f32(a, b); }
INLINE vf vf_mul(vf a, vf b) { return vmulq_f32(a, b); }
INLINE vf vf_div(vf a, vf b) { return vdivq_f32(a, b); }
/* a * b + c, c - a * b, a * b - c: one rounding each */
INLINE vf vf_fma(vf a, vf b, vf c) { return vfmaq_f32(c, a, b); }
INLINE vf vf_fnma(vf a, vf b, vf c) { return vfmsq_f32(c, a, b); }
INLINE vf vf_fms(vf a, vf b, vf c) { return vfmaq_f32(vnegq_f32(c), a, b); }
/* x86's rule: a where a < b (a > b), else b, so b where either is NaN */
INLINE vf vf_min(vf a, vf b) { return vbslq_f32(vcltq_f32(a, b), a, b); }
INLINE vf vf_max(vf a, vf b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }
INLINE vf vf_and(vf a, vf b) { return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(a), vreinterpretq_u32_f32(b))); }
INLINE vf vf_or(vf a, vf b) { return vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(a), vreinterpretq_u32_f32(b))); }
/* ~a & b */
INLINE vf vf_andnot(vf a, vf b) { return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(b), vreinterpretq_u32_f32(a))); }
/* to the nearest integer, ties to even */
INLINE vf vf_round(vf v) { return vrndnq_f32(v); }
/* 2^k for integral k in [-126, 127], by the exponent bits (k converted
 * to nearest even, as vec_avx2.h's conversion) */
INLINE vf vf_exp2i(vf k)
{
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(k), vdupq_n_s32(127)), 23));
}
/* comparisons, ordered (false where either is NaN), and unordered */
INLINE vf_mask vf_lt(vf a, vf b) { return vcltq_f32(a, b); }
INLINE vf_mask vf_gt(vf a, vf b) { return vcgtq_f32(a, b); }
INLINE vf_mask vf_unord(vf a, vf b) { return vmvnq_u32(vandq_u32(vceqq_f32(a, a), vceqq_f32(b, b))); }
/* set lanes all ones, clear lanes 0 */
INLINE vf vf_mask_bits(vf_mask m) { return vreinterpretq_f32_u32(m); }
/* b in the set lanes of m, a in the others */
INLINE vf vf_blend(vf a, vf b, vf_mask m) { return vbslq_f32(m, b, a); }

/* lanes [0, 2) and [2, 4) widened to double; exact */
INLINE vd vf_lo_pd(vf v) { return vcvt_f64_f32(vget_low_f32(v)); }
INLINE vd vf_hi_pd(vf v) { return vcvt_high_f64_f32(v); }
/* lo's lanes then hi's, each rounded to float */
INLINE vf vf_from_pd(vd lo, vd hi) { return vcvt_high_f32_f64(vcvt_f32_f64(lo), hi); }

/* no non-temporal stores to order */
INLINE void stream_fence(void) {}

/* ---- element access: 4 lanes of float in dt storage ---- */

/* 4 halfwords -> 4 floats (float16: a signalling NaN made quiet) */
INLINE vf widen4(uint16x4_t h, int dt)
{
    if (dt == CFBN_BF16) return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
    return vcvt_f32_f16(vreinterpret_f16_u16(h));
}

/* storage.h's bfloat16 rule on 4 lanes: the rounded bits in the upper half
 * of each word, a NaN made quiet instead */
INLINE uint32x4_t bf16_bits(vf v)
{
    uint32x4_t b = vreinterpretq_u32_f32(v);
    uint32x4_t r = vaddq_u32(b, vaddq_u32(vandq_u32(vshrq_n_u32(b, 16), vdupq_n_u32(1)), vdupq_n_u32(CFBN_BF16_ROUND_HALF)));
    return vbslq_u32(vceqq_f32(v, v), r, vorrq_u32(b, vdupq_n_u32(CFBN_BF16_QUIET)));
}

/* 4 floats -> 4 halfwords, to nearest even */
INLINE uint16x4_t narrow4(vf v, int dt)
{
    if (dt == CFBN_BF16) return vshrn_n_u32(bf16_bits(v), 16);
    return vreinterpret_u16_f16(vcvt_f16_f32(v));
}

INLINE vf vf_ld(const void *p, int64_t i, int dt)
{
    if (dt) return widen4(vld1_u16((const uint16_t *)p + i), dt);
    return vld1q_f32((const float *)p + i);
}

/* The first cnt (0..4) elements at p[i], zero in the other lanes.  avail
 * is how many elements p[i..] holds: nothing past it is read. */
INLINE vf vf_ld_part(const void *p, int64_t i, int64_t cnt, int64_t avail, int dt)
{
    if (avail >= 4) return vf_keep(vf_ld(p, i, dt), vf_mask_first(cnt));
    if (dt) {
        uint16_t buf[4] = {0};
        memcpy(buf, (const uint16_t *)p + i, (size_t)cnt * sizeof *buf);
        return widen4(vld1_u16(buf), dt);
    }
    float buf[4] = {0};
    memcpy(buf, (const float *)p + i, (size_t)cnt * sizeof *buf);
    return vld1q_f32(buf);
}

INLINE void vf_st(void *p, int64_t i, vf v, int dt)
{
    if (dt) vst1_u16((uint16_t *)p + i, narrow4(v, dt));
    else vst1q_f32((float *)p + i, v);
}

/* 8 elements: a at p[i], b at p[i + 4] */
INLINE void vf_st2(void *p, int64_t i, vf a, vf b, int dt)
{
    if (dt) {
        vst1q_u16((uint16_t *)p + i, vcombine_u16(narrow4(a, dt), narrow4(b, dt)));
        return;
    }
    vst1q_f32((float *)p + i, a);
    vst1q_f32((float *)p + i + 4, b);
}

/* Writes exactly cnt (0..4) elements: a neighbouring element may belong to
 * another thread's piece. */
INLINE void vf_st_part(void *p, int64_t i, vf v, int64_t cnt, int dt)
{
    if (dt) {
        uint16_t buf[4];
        vst1_u16(buf, narrow4(v, dt));
        memcpy((uint16_t *)p + i, buf, (size_t)cnt * sizeof *buf);
    } else {
        float buf[4];
        vst1q_f32(buf, v);
        memcpy((float *)p + i, buf, (size_t)cnt * sizeof *buf);
    }
}

/* element i of p, dt storage, as a byte address */
INLINE const char *elem_at(const void *p, int64_t i, int dt)
{
    return (const char *)p + (size_t)i * (dt ? 2 : 4);
}

INLINE float ld1(const void *p, int64_t i, int dt)
{
    if (dt == CFBN_BF16) return cfbn_bf16_to_float(((const uint16_t *)p)[i]);
    if (dt) return vgetq_lane_f32(widen4(vdup_n_u16(((const uint16_t *)p)[i]), dt), 0);
    return ((const float *)p)[i];
}

/* Two elements widened to double; exact. */
INLINE vd vd_ld_widen(const void *p, int64_t i, int dt)
{
    if (dt) {
        uint16_t buf[4] = {0};
        memcpy(buf, (const uint16_t *)p + i, 2 * sizeof *buf);
        return vcvt_f64_f32(vget_low_f32(widen4(vld1_u16(buf), dt)));
    }
    return vcvt_f64_f32(vld1_f32((const float *)p + i));
}

/* 8 halfwords: zero; stored at p[i..], no alignment needed */
INLINE vh vh_zero(void) { return vdupq_n_u16(0); }
INLINE void vh_st(void *p, int64_t i, vh h) { vst1q_u16((uint16_t *)p + i, h); }

/* ---- bfloat16 in even/odd order: 8 elements as two vf (vec_avx2.h says
 * why: a shift and an and, no shuffle) ---- */

INLINE void vf_ld_eo(const void *p, int64_t i, vf *e, vf *o)
{
    uint32x4_t v = vreinterpretq_u32_u16(vld1q_u16((const uint16_t *)p + i));
    *e = vreinterpretq_f32_u32(vshlq_n_u32(v, 16));
    *o = vreinterpretq_f32_u32(vandq_u32(v, vdupq_n_u32(0xffff0000u)));
}

/* e's rounded upper halves into the low halfwords, o's into the high ones */
INLINE vh vh_narrow_eo(vf e, vf o)
{
    return vreinterpretq_u16_u32(vsriq_n_u32(bf16_bits(o), bf16_bits(e), 16));
}

INLINE void vf_st_eo(void *p, int64_t i, vf e, vf o)
{
    vst1q_u16((uint16_t *)p + i, vh_narrow_eo(e, o));
}

INLINE void vh_narrow_eo2(vf e0, vf o0, vf e1, vf o1, vh *h0, vh *h1)
{
    *h0 = vh_narrow_eo(e0, o0);
    *h1 = vh_narrow_eo(e1, o1);
}

/* ---- the streaming stores, as plain ones ---- */

INLINE void vf_st_eo2_nt(void *p, int64_t i, vf e0, vf o0, vf e1, vf o1)
{
    vf_st_eo(p, i, e0, o0);
    vf_st_eo(p, i + 8, e1, o1);
}

INLINE void vf_st_nt(void *p, int64_t i, vf v, int dt) { vf_st(p, i, v, dt); }

INLINE void vf_stream_aligned(float *p, int64_t i, vf v) { vst1q_f32(p + i, v); }

/* each group where it belongs: nothing is held back, whatever half says */
INLINE void vh_stream_seq(void *p, int64_t i, vh h, int half, vh *prev)
{
    (void)half;
    vst1q_u16((uint16_t *)p + i, h);
    *prev = h;
}

INLINE void vh_stream_seq_end(void *p, int64_t n, int half, vh prev)
{
    (void)p, (void)n, (void)half, (void)prev;
}

/* No software prefetch: vec_avx2.h's were measured on x86 only, and
 * bn_neon.c's loops have done without them. */
#define FLAT_PREFETCH_BYTES 4096
INLINE void prefetch_ahead_of(const void *p, int64_t i, int dt) { (void)p, (void)i, (void)dt; }
INLINE void prefetch_l1(const char *p) { (void)p; }
INLINE void prefetch_l2(const char *p) { (void)p; }

#endif
