/* AVX-512 (F, BW, VL, DQ) + FMA + F16C primitives: 16 float lanes (8
 * double), the same names and meanings as vec_avx2.h at twice the lanes
 * (tests/c/vec_portable.h is the meaning written out, tests/c/vec_check.c
 * compares the two bit for bit).  Masks are the k registers (__mmask16,
 * __mmask8); vh, the halfwords of two vf, is one __m512i.  For files
 * compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c.
 *
 * Written with the intrinsics that SIMDe 0.7.4 (Debian 12's libsimde-dev)
 * emulates, so that vec_check.c runs this header on CPUs without AVX-512
 * (built with -DCFBN_VEC_SIMDE).  SIMDe lacks the masked loads and stores,
 * _mm512_cvtps_pd / cvtpd_ps / cvtps_epi32 / cvtepu16_epi32, the 512-bit
 * float16 conversions and the 64-byte streaming stores: their 256-bit
 * (AVX2, F16C) forms stand in, two per vector, or a permute, an add or a
 * compare-made mask; the bits are the same, at a few instructions more
 * where the loops widen to double or cross a tail.
 *
 * bfloat16 narrowing is storage.h's rule by integer arithmetic, not the
 * AVX512_BF16 instructions, which flush subnormals. */
#ifndef CFBN_VEC_AVX512_H
#define CFBN_VEC_AVX512_H

#ifdef CFBN_VEC_SIMDE
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>
#include <simde/x86/fma.h>
#else
#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
      defined(__FMA__) && defined(__F16C__))
#error "vec_avx512.h needs -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c"
#endif
#include <immintrin.h>
#endif
#include <stdint.h>
#include <string.h>

#include "cfbn.h"
#include "storage.h"

#define INLINE static inline __attribute__((always_inline))
/* the rarely taken ways back to double sums: out of line, so that the fast
 * loops keep their code and its alignment */
#define COLD static __attribute__((noinline, cold))

typedef __m512 vf;            /* VF_LANES floats */
typedef __mmask16 vf_mask;    /* lanes of a vf, set or clear */
#define VF_LANES 16
typedef __m512d vd;           /* VD_LANES doubles */
typedef __mmask8 vd_mask;
#define VD_LANES 8
/* 2 VF_LANES halfwords: the 2-byte storage of two vf */
typedef __m512i vh;
/* non-temporal stores (vec_avx2.h's meanings): 16-byte pieces at least,
 * whole 64-byte vectors where aligned to them */
#define VF_NT_MIN_ALIGN 16
#define VF_NT_ALIGN 64

/* ---- halves: a vf as two __m256 (8 floats), a vd as two __m256d ---- */

INLINE __m256 lo8(vf v) { return _mm512_castps512_ps256(v); }
INLINE __m256 hi8(vf v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }
INLINE vf join8(__m256 lo, __m256 hi) { return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1); }
INLINE __m256d lo4d(vd v) { return _mm512_castpd512_pd256(v); }
INLINE __m256d hi4d(vd v) { return _mm512_extractf64x4_pd(v, 1); }
INLINE vd join4d(__m256d lo, __m256d hi) { return _mm512_insertf64x4(_mm512_castpd256_pd512(lo), hi, 1); }

/* lanes [0, cnt) of 8 dwords set, for the AVX2 masked loads and stores
 * (cnt <= 0: none) */
INLINE __m256i mask8_epi32(int64_t cnt)
{
    int c = cnt < 0 ? 0 : cnt > 8 ? 8 : (int)cnt;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* 8 floats widened to 8 doubles; exact */
INLINE vd widen8(__m256 f)
{
    return join4d(_mm256_cvtps_pd(_mm256_castps256_ps128(f)), _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)));
}

/* 8 doubles rounded to 8 floats */
INLINE __m256 narrow8d(vd v)
{
    return _mm256_set_m128(_mm256_cvtpd_ps(hi4d(v)), _mm256_cvtpd_ps(lo4d(v)));
}

/* ---- vd: 8 doubles ---- */

INLINE vd vd_zero(void) { return _mm512_setzero_pd(); }
INLINE vd vd_set1(double v) { return _mm512_set1_pd(v); }
INLINE vd vd_load(const double *p) { return _mm512_loadu_pd(p); }
INLINE void vd_store(double *p, vd v) { _mm512_storeu_pd(p, v); }
/* lanes [0, cnt) set; cnt may be <= 0 or >= VD_LANES */
INLINE vd_mask vd_mask_first(int64_t cnt) { return (vd_mask)(cnt <= 0 ? 0u : cnt >= 8 ? 0xffu : (1u << cnt) - 1u); }
/* the set lanes of m from p (the others read as 0 and are not touched) */
INLINE vd vd_load_part(const double *p, vd_mask m)
{
    __m512i v = _mm512_movm_epi64(m);
    return join4d(_mm256_maskload_pd(p, _mm512_castsi512_si256(v)), _mm256_maskload_pd(p + 4, _mm512_extracti64x4_epi64(v, 1)));
}
INLINE void vd_store_part(double *p, vd_mask m, vd v)
{
    __m512i k = _mm512_movm_epi64(m);
    _mm256_maskstore_pd(p, _mm512_castsi512_si256(k), lo4d(v));
    _mm256_maskstore_pd(p + 4, _mm512_extracti64x4_epi64(k, 1), hi4d(v));
}
/* v in the set lanes of m, 0 in the others */
INLINE vd vd_keep(vd v, vd_mask m) { return _mm512_maskz_mov_pd(m, v); }
INLINE vd vd_add(vd a, vd b) { return _mm512_add_pd(a, b); }
INLINE vd vd_sub(vd a, vd b) { return _mm512_sub_pd(a, b); }
INLINE vd vd_mul(vd a, vd b) { return _mm512_mul_pd(a, b); }
/* a * b + c, c - a * b: one rounding */
INLINE vd vd_fma(vd a, vd b, vd c) { return _mm512_fmadd_pd(a, b, c); }
INLINE vd vd_fnma(vd a, vd b, vd c) { return _mm512_fnmadd_pd(a, b, c); }
INLINE vd vd_or(vd a, vd b) { return _mm512_or_pd(a, b); }
/* upper half onto lower half until one lane is left (the portable order) */
INLINE double vd_hsum(vd v)
{
    __m256d s4 = _mm256_add_pd(lo4d(v), hi4d(v));
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}
/* each lane rounded to float and back */
INLINE vd vd_to_float_and_back(vd v) { return widen8(narrow8d(v)); }
/* not (a >= b): true where a < b or either is NaN; a > b, ordered */
INLINE vd_mask vd_nge(vd a, vd b) { return _mm512_cmp_pd_mask(a, b, _CMP_NGE_UQ); }
INLINE vd_mask vd_gt(vd a, vd b) { return _mm512_cmp_pd_mask(a, b, _CMP_GT_OQ); }
INLINE vd_mask vd_mask_or(vd_mask a, vd_mask b) { return (vd_mask)(a | b); }
INLINE int vd_mask_any(vd_mask m) { return m != 0; }
/* |v|: the sign bit cleared */
INLINE vd vd_abs(vd v) { return _mm512_and_pd(v, _mm512_castsi512_pd(_mm512_set1_epi64(0x7fffffffffffffffll))); }
/* set lanes all ones, clear lanes 0; and back (lanes all ones or zero) */
INLINE vd vd_mask_bits(vd_mask m) { return _mm512_castsi512_pd(_mm512_movm_epi64(m)); }
INLINE vd_mask vd_bits_mask(vd v) { return _mm512_movepi64_mask(_mm512_castpd_si512(v)); }

/* ---- vf: 16 floats ---- */

INLINE vf vf_zero(void) { return _mm512_setzero_ps(); }
INLINE vf vf_set1(float v) { return _mm512_set1_ps(v); }
INLINE vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
INLINE void vf_store(float *p, vf v) { _mm512_storeu_ps(p, v); }
/* lanes [0, cnt) set; cnt may be <= 0 or >= VF_LANES */
INLINE vf_mask vf_mask_first(int64_t cnt) { return (vf_mask)(cnt <= 0 ? 0u : cnt >= 16 ? 0xffffu : (1u << cnt) - 1u); }
/* lanes [VF_LANES - cnt, VF_LANES) set */
INLINE vf_mask vf_mask_last(int64_t cnt) { return (vf_mask)(0xffffu & ~(unsigned)vf_mask_first(16 - cnt)); }
/* the set lanes of m from p (the others read as 0, their memory untouched) */
INLINE vf vf_load_part(const float *p, vf_mask m)
{
    __m512i k = _mm512_movm_epi32(m);
    return join8(_mm256_maskload_ps(p, _mm512_castsi512_si256(k)), _mm256_maskload_ps(p + 8, _mm512_extracti64x4_epi64(k, 1)));
}
INLINE vf vf_keep(vf v, vf_mask m) { return _mm512_maskz_mov_ps(m, v); }
INLINE vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
INLINE vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
INLINE vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
INLINE vf vf_div(vf a, vf b) { return _mm512_div_ps(a, b); }
/* a * b + c, c - a * b, a * b - c: one rounding each */
INLINE vf vf_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
INLINE vf vf_fnma(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
INLINE vf vf_fms(vf a, vf b, vf c) { return _mm512_fmsub_ps(a, b, c); }
/* the second operand where either is NaN (x86's rule) */
INLINE vf vf_min(vf a, vf b) { return _mm512_min_ps(a, b); }
INLINE vf vf_max(vf a, vf b) { return _mm512_max_ps(a, b); }
INLINE vf vf_and(vf a, vf b) { return _mm512_and_ps(a, b); }
INLINE vf vf_or(vf a, vf b) { return _mm512_or_ps(a, b); }
/* ~a & b */
INLINE vf vf_andnot(vf a, vf b) { return _mm512_andnot_ps(a, b); }
/* to the nearest integer, ties to even */
INLINE vf vf_round(vf v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* 2^k for integral k in [-126, 127]: k + 1.5 2^23 holds k (rounded to
 * nearest even, as vec_avx2.h's conversion) in its low mantissa bits, and
 * the shift drops the rest */
INLINE vf vf_exp2i(vf k)
{
    __m512i b = _mm512_castps_si512(_mm512_add_ps(k, _mm512_set1_ps(12582912.0f)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(127)), 23));
}
/* ordered and quiet (false where either is NaN); unordered */
INLINE vf_mask vf_lt(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
INLINE vf_mask vf_gt(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
INLINE vf_mask vf_unord(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q); }
/* set lanes all ones, clear lanes 0 */
INLINE vf vf_mask_bits(vf_mask m) { return _mm512_castsi512_ps(_mm512_movm_epi32(m)); }
/* b in the set lanes of m, a in the others */
INLINE vf vf_blend(vf a, vf b, vf_mask m) { return _mm512_mask_blend_ps(m, a, b); }

/* lanes [0, 8) and [8, 16) widened to double; exact */
INLINE vd vf_lo_pd(vf v) { return widen8(lo8(v)); }
INLINE vd vf_hi_pd(vf v) { return widen8(hi8(v)); }
/* lo's lanes then hi's, each rounded to float */
INLINE vf vf_from_pd(vd lo, vd hi) { return join8(narrow8d(lo), narrow8d(hi)); }

/* orders the non-temporal stores before the caller's barrier */
INLINE void stream_fence(void) { _mm_sfence(); }

/* ---- element access: 16 lanes of float in dt storage ---- */

/* halfword k of a vector (k < 32) into the upper half of dword k (the even
 * halfwords, masked, are zero); the upper halves of the 32 dwords of two
 * vectors, in order */
static const uint16_t BF16_WIDEN_IDX[32] = {0, 0, 0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 7,
                                            0, 8, 0, 9, 0, 10, 0, 11, 0, 12, 0, 13, 0, 14, 0, 15};
static const uint16_t UPPER_HALVES_IDX[32] = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
                                              33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};

/* 16 halfwords -> 16 floats (float16: a signalling NaN made quiet) */
INLINE vf widen16(__m256i h, int dt)
{
    if (dt == CFBN_BF16)
        return _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xaaaaaaaau, _mm512_loadu_si512(BF16_WIDEN_IDX),
                                                                  _mm512_castsi256_si512(h)));
    return join8(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
}

/* storage.h's bfloat16 rule on 16 lanes: the rounded bits in the upper
 * half of each dword, a NaN made quiet instead */
INLINE __m512i bf16_bits(vf v)
{
    __m512i b = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(CFBN_BF16_ROUND_HALF)));
    return _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), b, _mm512_set1_epi32(CFBN_BF16_QUIET));
}

/* 16 floats -> 16 halfwords, to nearest even */
INLINE __m256i narrow16(vf v, int dt)
{
    if (dt == CFBN_BF16)
        return _mm512_castsi512_si256(_mm512_permutexvar_epi16(_mm512_loadu_si512(UPPER_HALVES_IDX), bf16_bits(v)));
    return _mm256_set_m128i(_mm256_cvtps_ph(hi8(v), _MM_FROUND_TO_NEAREST_INT),
                            _mm256_cvtps_ph(lo8(v), _MM_FROUND_TO_NEAREST_INT));
}

/* 32 floats (a, then b) -> 32 halfwords; bfloat16: one two-source permute */
INLINE vh narrow32(vf a, vf b, int dt)
{
    if (dt == CFBN_BF16)
        return _mm512_permutex2var_epi16(bf16_bits(a), _mm512_loadu_si512(UPPER_HALVES_IDX), bf16_bits(b));
    return _mm512_inserti64x4(_mm512_castsi256_si512(narrow16(a, dt)), narrow16(b, dt), 1);
}

INLINE vf vf_ld(const void *p, int64_t i, int dt)
{
    if (dt) return widen16(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)), dt);
    return _mm512_loadu_ps((const float *)p + i);
}

/* The first cnt (0..16) elements at p[i], zero in the other lanes.  avail
 * is how many elements p[i..] holds: nothing past it is read. */
INLINE vf vf_ld_part(const void *p, int64_t i, int64_t cnt, int64_t avail, int dt)
{
    if (!dt) {
        const float *q = (const float *)p + i;
        return join8(_mm256_maskload_ps(q, mask8_epi32(cnt)), _mm256_maskload_ps(q + 8, mask8_epi32(cnt - 8)));
    }
    const uint16_t *q = (const uint16_t *)p + i;
    const __m256i lane = _mm256_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m256i h;
    if (avail >= 16) {
        h = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)q), _mm256_cmpgt_epi16(_mm256_set1_epi16((short)cnt), lane));
    } else {
        /* the whole pairs by a masked load of dwords (masked lanes are not
         * read), an odd last element broadcast into its lane */
        h = _mm256_maskload_epi32((const int *)q, mask8_epi32(cnt >> 1));
        if (cnt & 1)
            h = _mm256_blendv_epi8(h, _mm256_set1_epi16((short)q[cnt - 1]),
                                   _mm256_cmpeq_epi16(_mm256_set1_epi16((short)(cnt - 1)), lane));
    }
    return widen16(h, dt);
}

INLINE void vf_st(void *p, int64_t i, vf v, int dt)
{
    if (dt) _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), narrow16(v, dt));
    else _mm512_storeu_ps((float *)p + i, v);
}

/* 32 elements: a at p[i], b at p[i + 16] */
INLINE void vf_st2(void *p, int64_t i, vf a, vf b, int dt)
{
    if (dt) {
        _mm512_storeu_si512((uint16_t *)p + i, narrow32(a, b, dt));
        return;
    }
    _mm512_storeu_ps((float *)p + i, a);
    _mm512_storeu_ps((float *)p + i + 16, b);
}

/* Writes exactly cnt (0..16) elements: a neighbouring element may belong
 * to another thread's piece. */
INLINE void vf_st_part(void *p, int64_t i, vf v, int64_t cnt, int dt)
{
    if (!dt) {
        float *q = (float *)p + i;
        _mm256_maskstore_ps(q, mask8_epi32(cnt), lo8(v));
        _mm256_maskstore_ps(q + 8, mask8_epi32(cnt - 8), hi8(v));
        return;
    }
    uint16_t *q = (uint16_t *)p + i;
    __m256i h = narrow16(v, dt);
    _mm256_maskstore_epi32((int *)q, mask8_epi32(cnt >> 1), h);
    if (cnt & 1) {
        uint16_t buf[16];
        _mm256_storeu_si256((__m256i *)buf, h);
        q[cnt - 1] = buf[cnt - 1];
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
    if (dt) return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(((const uint16_t *)p)[i])));
    return ((const float *)p)[i];
}

/* Eight elements widened to double; exact. */
INLINE vd vd_ld_widen(const void *p, int64_t i, int dt)
{
    const __m128i *q = (const __m128i *)((const uint16_t *)p + i);
    if (dt == CFBN_BF16) return widen8(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(q)), 16)));
    if (dt) return widen8(_mm256_cvtph_ps(_mm_loadu_si128(q)));
    return widen8(_mm256_loadu_ps((const float *)p + i));
}

/* 32 halfwords: zero; stored at p[i..], no alignment needed */
INLINE vh vh_zero(void) { return _mm512_setzero_si512(); }
INLINE void vh_st(void *p, int64_t i, vh h) { _mm512_storeu_si512((uint16_t *)p + i, h); }

/* ---- bfloat16 in even/odd order: 32 elements as two vf (vec_avx2.h
 * says why); with masks the NaN case costs nothing extra ---- */

INLINE void vf_ld_eo(const void *p, int64_t i, vf *e, vf *o)
{
    __m512i v = _mm512_loadu_si512((const uint16_t *)p + i);
    *e = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    *o = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u)));
}

INLINE vh vh_narrow_eo(vf e, vf o)
{
    return _mm512_mask_blend_epi16(0xaaaaaaaau, _mm512_srli_epi32(bf16_bits(e), 16), bf16_bits(o));
}

INLINE void vf_st_eo(void *p, int64_t i, vf e, vf o)
{
    _mm512_storeu_si512((uint16_t *)p + i, vh_narrow_eo(e, o));
}

INLINE void vh_narrow_eo2(vf e0, vf o0, vf e1, vf o1, vh *h0, vh *h1)
{
    *h0 = vh_narrow_eo(e0, o0);
    *h1 = vh_narrow_eo(e1, o1);
}

/* ---- non-temporal stores ----
 * 64 bytes where the address is 64-byte aligned (as two 32-byte streams,
 * which fill the same line), else 32- or 16-byte pieces as the address
 * allows; p is VF_NT_MIN_ALIGN (16)-aligned. */

INLINE void stream64(void *q, vh h)
{
    _mm256_stream_si256((__m256i *)q, _mm512_castsi512_si256(h));
    _mm256_stream_si256((__m256i *)q + 1, _mm512_extracti64x4_epi64(h, 1));
}

/* 16-byte piece c (0..3) of h at q */
INLINE void stream16(void *q, vh h, int c)
{
    __m128i x = c == 0 ? _mm512_castsi512_si128(h)
              : c == 1 ? _mm512_extracti32x4_epi32(h, 1)
              : c == 2 ? _mm512_extracti32x4_epi32(h, 2) : _mm512_extracti32x4_epi32(h, 3);
    _mm_stream_si128((__m128i *)q, x);
}

/* 64 bfloat16 at p + i, 64-byte aligned: vf_st_eo's pairs (e0, o0), (e1, o1) */
INLINE void vf_st_eo2_nt(void *p, int64_t i, vf e0, vf o0, vf e1, vf o1)
{
    uint16_t *q = (uint16_t *)p + i;
    stream64(q, vh_narrow_eo(e0, o0));
    stream64(q + 32, vh_narrow_eo(e1, o1));
}

INLINE void vf_st_nt(void *p, int64_t i, vf v, int dt)
{
    if (dt) {
        uint16_t *q = (uint16_t *)p + i;
        __m256i h = narrow16(v, dt);
        if (!((uintptr_t)q & 31)) {
            _mm256_stream_si256((__m256i *)q, h);
        } else {
            _mm_stream_si128((__m128i *)q, _mm256_castsi256_si128(h));
            _mm_stream_si128((__m128i *)(q + 8), _mm256_extracti128_si256(h, 1));
        }
        return;
    }
    float *q = (float *)p + i;
    if (!((uintptr_t)q & 31)) {
        _mm256_stream_ps(q, lo8(v));
        _mm256_stream_ps(q + 8, hi8(v));
        return;
    }
    __m256 lo = lo8(v), hi = hi8(v);
    _mm_stream_ps(q, _mm256_castps256_ps128(lo));
    _mm_stream_ps(q + 4, _mm256_extractf128_ps(lo, 1));
    _mm_stream_ps(q + 8, _mm256_castps256_ps128(hi));
    _mm_stream_ps(q + 12, _mm256_extractf128_ps(hi, 1));
}

/* 16 floats at p + i, 64-byte aligned */
INLINE void vf_stream_aligned(float *p, int64_t i, vf v)
{
    _mm256_stream_ps(p + i, lo8(v));
    _mm256_stream_ps(p + i + 8, hi8(v));
}

/* Groups of 32 halfwords from p[0] in order, 64 bytes a store: where p is
 * off = 16, 32 or 48 bytes past 64-byte alignment (half), each store is the
 * previous group's last off bytes joined to this group's first 64 - off
 * (one two-source permute), the first group's head goes by itself in
 * 16-byte pieces and vh_stream_seq_end stores the last group's tail. */
INLINE void vh_stream_seq(void *p, int64_t i, vh h, int half, vh *prev)
{
    uint16_t *q = (uint16_t *)p + i;
    const int off = half ? (int)((uintptr_t)p & 63) : 0;
    if (!off) {
        stream64(q, h);
    } else if (i == 0) {
        for (int c = 0; c < (64 - off) / 16; c++) stream16(q + 8 * c, h, c);
    } else {
        const __m512i idx = _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             _mm512_set1_epi32(16 - off / 4));
        stream64(q - off / 2, _mm512_permutex2var_epi32(*prev, idx, h));
    }
    *prev = h;
}

INLINE void vh_stream_seq_end(void *p, int64_t n, int half, vh prev)
{
    const int off = half ? (int)((uintptr_t)p & 63) : 0;
    if (!off || n <= 0) return;
    uint16_t *end = (uint16_t *)p + n;
    for (int c = (64 - off) / 16; c < 4; c++) stream16(end - (4 - c) * 8, prev, c);
}

/* A prefetch FLAT_PREFETCH_BYTES ahead of element i: vec_avx2.h says why
 * (measured there; the same hardware prefetchers). */
#define FLAT_PREFETCH_BYTES 4096
INLINE void prefetch_ahead_of(const void *p, int64_t i, int dt)
{
    _mm_prefetch((const char *)p + (size_t)i * (dt ? 2 : 4) + FLAT_PREFETCH_BYTES, _MM_HINT_T0);
}
/* the line holding p into L1, or into L2 and not L1 */
INLINE void prefetch_l1(const char *p) { _mm_prefetch(p, _MM_HINT_T0); }
INLINE void prefetch_l2(const char *p) { _mm_prefetch(p, _MM_HINT_T1); }

#endif
