/* AVX2 + FMA + F16C primitives: 8 float lanes (4 double), loads and stores
 * of each storage type (whole, partial, non-temporal), float16 / bfloat16
 * widening and narrowing, masks, prefetch and horizontal sums.  Typed static
 * inline functions: included only by files compiled with -mavx2 -mfma
 * -mf16c (bn_avx2.c), each of which gets its own copy (see docs/contributing.md: a
 * helper with external linkage could run on a CPU without AVX2).
 *
 * Lane count: a vector is 8 floats; rows loops take 8 columns at a time
 * (cfbn_kernels_avx2.lanes).  dt (enum cfbn_dtype) is the tensor's storage
 * type, a constant that always_inline folds away: CFBN_F32, CFBN_F16 by
 * F16C, CFBN_BF16 by integer shifts and storage.h's rounding rule. */
#ifndef CFBN_VEC_AVX2_H
#define CFBN_VEC_AVX2_H

#if !(defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#error "vec_avx2.h needs -mavx2 -mfma -mf16c"
#endif

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "cfbn.h"
#include "storage.h"

#define INLINE static inline __attribute__((always_inline))
/* the rarely taken ways back to double sums: out of line, so that the fast
 * loops keep their code and its alignment */
#define COLD static __attribute__((noinline, cold))

/* ---- masks: lanes [0, cnt) set; cnt may be <= 0 or >= the lane count ---- */

INLINE __m256i mask_ps(int64_t cnt)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)cnt), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

INLINE __m256i mask_pd(int64_t cnt)
{
    return _mm256_cmpgt_epi64(_mm256_set1_epi64x(cnt), _mm256_setr_epi64x(0, 1, 2, 3));
}

INLINE __m128i mask_ph(int64_t cnt)
{
    return _mm_cmpgt_epi16(_mm_set1_epi16((short)cnt), _mm_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7));
}

/* ---- element access: 8 lanes of float; dt is the tensor's storage
 * (CFBN_F32, CFBN_F16 by F16C, CFBN_BF16 by integer shifts) ---- */

/* bfloat16 <-> float by byte shuffles within 128-bit lanes.  Widening:
 * halfword k of a lane (the 8 halfwords in both lanes) into the upper half
 * of dword k, lane 1 taking halfwords 4..7; narrowing: the upper halves of
 * a lane's dwords into its low 8 bytes. */
#define BF16_WIDEN_SHUFFLE \
    _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7, \
                     -1, -1, 8, 9, -1, -1, 10, 11, -1, -1, 12, 13, -1, -1, 14, 15)
#define BF16_NARROW_SHUFFLE \
    _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1, \
                     2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1)

/* 8 halfwords -> 8 floats */
INLINE __m256 widen_ph(__m128i h, int dt)
{
    if (dt == CFBN_BF16)
        return _mm256_castsi256_ps(_mm256_shuffle_epi8(_mm256_broadcastsi128_si256(h), BF16_WIDEN_SHUFFLE));
    return _mm256_cvtph_ps(h);
}

/* a float's bits plus the bfloat16 rounding increment (no NaN): storage.h's
 * cfbn_bf16_round_bits on 8 lanes */
INLINE __m256i round_bf16(__m256 v)
{
    __m256i b = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    return _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(CFBN_BF16_ROUND_HALF)));
}

/* 8 floats -> 8 halfwords, to nearest even.  bfloat16: round_bf16 and the
 * upper halves; nan is made quiet instead (storage.h's rule). */
INLINE __m128i narrow_ph(__m256 v, int dt)
{
    if (dt != CFBN_BF16) return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    __m256i b = _mm256_castps_si256(v), r = round_bf16(v);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(b, _mm256_set1_epi32(CFBN_BF16_QUIET)), nan);
    r = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(r, BF16_NARROW_SHUFFLE), 0x08);
    return _mm256_castsi256_si128(r);
}

/* 16 floats (a, then b) -> 16 halfwords, as narrow_ph.  bfloat16: both
 * vectors rounded at once and packed together (packus keeps the lanes of a
 * 128-bit half together; the permute puts a's before b's), which takes half
 * the instructions of two narrow_ph; a pair holding a NaN goes through
 * narrow_ph, which quietens it. */
INLINE __m256i narrow2_ph(__m256 a, __m256 b, int dt)
{
    if (dt == CFBN_BF16 && !_mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_UNORD_Q))) {
        __m256i r = _mm256_packus_epi32(_mm256_srli_epi32(round_bf16(a), 16), _mm256_srli_epi32(round_bf16(b), 16));
        return _mm256_permute4x64_epi64(r, 0xd8);
    }
    return _mm256_set_m128i(narrow_ph(b, dt), narrow_ph(a, dt));
}

INLINE __m256 vf_ld(const void *p, int64_t i, int dt)
{
    if (dt)
        return widen_ph(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)), dt);
    return _mm256_loadu_ps((const float *)p + i);
}

/* The first cnt (1..7) elements at p[i], zero in the other lanes.  avail is
 * how many elements p[i..] holds: nothing past it is read, so a slice that
 * ends at a page boundary never faults. */
INLINE __m256 vf_ld_part(const void *p, int64_t i, int64_t cnt, int64_t avail, int dt)
{
    if (!dt)
        return _mm256_maskload_ps((const float *)p + i, mask_ps(cnt));
    const uint16_t *q = (const uint16_t *)p + i;
    __m128i h;
    if (avail >= 8) {
        h = _mm_and_si128(_mm_loadu_si128((const __m128i *)q), mask_ph(cnt));
    } else {
        /* the whole pairs by a masked load of 32-bit lanes (masked lanes are
         * not read), an odd last element broadcast into its lane */
        h = _mm_maskload_epi32((const int *)q, _mm256_castsi256_si128(mask_ps(cnt >> 1)));
        if (cnt & 1) {
            __m128i lane = _mm_cmpeq_epi16(_mm_set1_epi16((short)(cnt - 1)), _mm_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7));
            h = _mm_blendv_epi8(h, _mm_set1_epi16((short)q[cnt - 1]), lane);
        }
    }
    return widen_ph(h, dt);
}

INLINE void vf_st(void *p, int64_t i, __m256 v, int dt)
{
    if (dt)
        _mm_storeu_si128((__m128i *)((uint16_t *)p + i), narrow_ph(v, dt));
    else
        _mm256_storeu_ps((float *)p + i, v);
}

/* 16 elements: a at p[i], b at p[i + 8] */
INLINE void vf_st2(void *p, int64_t i, __m256 a, __m256 b, int dt)
{
    if (dt) {
        _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), narrow2_ph(a, b, dt));
        return;
    }
    _mm256_storeu_ps((float *)p + i, a);
    _mm256_storeu_ps((float *)p + i + 8, b);
}

/* element i of p, dt storage, as a byte address */
INLINE const char *elem_at(const void *p, int64_t i, int dt)
{
    return (const char *)p + (size_t)i * (dt ? 2 : 4);
}

/* ---- bfloat16 runs: 16 elements as two vectors of float ----
 * Where every lane takes the same parameters (a run), the order of the
 * lanes does not matter to an elementwise pass, nor to a sum beyond its
 * rounding.  16 bfloat16 (one 32-byte load) then widen to the elements of
 * even index (each dword shifted left by 16) and those of odd index (the
 * dword's upper half kept), two integer operations and no shuffle; they
 * narrow back the same way, each rounded to nearest even as narrow_ph
 * does.  A pair holding a NaN is put back in element order and goes through
 * narrow2_ph, which quietens it. */
INLINE void vf_ld_eo(const void *p, int64_t i, __m256 *e, __m256 *o)
{
    __m256i v = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    *e = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    *o = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}

INLINE __m256i vh_narrow_eo(__m256 e, __m256 o)
{
    if (_mm256_movemask_ps(_mm256_cmp_ps(e, o, _CMP_UNORD_Q))) {
        __m256 lo = _mm256_unpacklo_ps(e, o), hi = _mm256_unpackhi_ps(e, o);
        return narrow2_ph(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31), CFBN_BF16);
    }
    /* e's rounded halves into the low halfwords, o's kept in the high ones */
    return _mm256_blend_epi16(_mm256_srli_epi32(round_bf16(e), 16), round_bf16(o), 0xaa);
}

INLINE void vf_st_eo(void *p, int64_t i, __m256 e, __m256 o)
{
    _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), vh_narrow_eo(e, o));
}

/* 32 elements from p + i, 32-byte aligned, non-temporal: (e0, o0) and
 * (e1, o1) as vf_st_eo's pairs, one 32-byte store each and one NaN test for
 * both. */
INLINE void vh_narrow_eo2(__m256 e0, __m256 o0, __m256 e1, __m256 o1, __m256i *h0, __m256i *h1)
{
    __m256 nan = _mm256_or_ps(_mm256_cmp_ps(e0, o0, _CMP_UNORD_Q), _mm256_cmp_ps(e1, o1, _CMP_UNORD_Q));
    if (_mm256_movemask_ps(nan)) {
        *h0 = vh_narrow_eo(e0, o0);
        *h1 = vh_narrow_eo(e1, o1);
        return;
    }
    *h0 = _mm256_blend_epi16(_mm256_srli_epi32(round_bf16(e0), 16), round_bf16(o0), 0xaa);
    *h1 = _mm256_blend_epi16(_mm256_srli_epi32(round_bf16(e1), 16), round_bf16(o1), 0xaa);
}

INLINE void vf_st_eo2_nt(void *p, int64_t i, __m256 e0, __m256 o0, __m256 e1, __m256 o1)
{
    __m256i *q = (__m256i *)((uint16_t *)p + i), h0, h1;
    vh_narrow_eo2(e0, o0, e1, o1, &h0, &h1);
    _mm256_stream_si256(q, h0);
    _mm256_stream_si256(q + 1, h1);
}

/* Non-temporal stores of 16-element groups h written in order from p[0]
 * (p 16-byte aligned), 32 bytes at a time: where p is 32-byte aligned each
 * group by itself; where it is 16 bytes past (half), the upper half of the
 * previous group (*prev) joined to the lower half of this one, the first
 * group's lower half by itself, and vh_stream_seq_end stores the last upper
 * half (n: the elements written). */
INLINE void vh_stream_seq(void *p, int64_t i, __m256i h, int half, __m256i *prev)
{
    uint16_t *q = (uint16_t *)p + i;
    if (!half) _mm256_stream_si256((__m256i *)q, h);
    else if (i == 0) _mm_stream_si128((__m128i *)q, _mm256_castsi256_si128(h));
    else _mm256_stream_si256((__m256i *)(q - 8), _mm256_permute2x128_si256(*prev, h, 0x21));
    *prev = h;
}

INLINE void vh_stream_seq_end(void *p, int64_t n, int half, __m256i prev)
{
    if (half && n > 0) _mm_stream_si128((__m128i *)((uint16_t *)p + n - 8), _mm256_extracti128_si256(prev, 1));
}

/* Reductions over runs a few pages long (NCHW planes) restart the hardware
 * prefetchers at every page; a prefetch FLAT_PREFETCH_BYTES ahead of the line
 * of element i keeps the stream going.  Called once per 16 elements.  The
 * streaming bfloat16 loops (tensors far larger than the caches) fetch their
 * inputs the same way: their widening and rounding keep the core busy
 * enough that the hardware prefetchers alone leave the memory bus idle part
 * of the time.  Measured on the normalization loop over 51M elements
 * (103 MB), 2 threads, interleaved: 0.147 -> 0.135 and 0.131 -> 0.116 ns an
 * element on average. */
#define FLAT_PREFETCH_BYTES 4096
INLINE void prefetch_ahead_of(const void *p, int64_t i, int dt)
{
    _mm_prefetch((const char *)p + (size_t)i * (dt ? 2 : 4) + FLAT_PREFETCH_BYTES, _MM_HINT_T0);
}

/* Writes exactly cnt (1..7) elements: a neighbouring element may belong to
 * another thread's piece (or be the next row's input when y aliases x). */
INLINE void vf_st_part(void *p, int64_t i, __m256 v, int64_t cnt, int dt)
{
    if (!dt) {
        _mm256_maskstore_ps((float *)p + i, mask_ps(cnt), v);
        return;
    }
    /* the whole pairs by a masked store of 32-bit lanes, an odd last
     * element on its own */
    uint16_t *q = (uint16_t *)p + i;
    __m128i h = narrow_ph(v, dt);
    _mm_maskstore_epi32((int *)q, _mm256_castsi256_si128(mask_ps(cnt >> 1)), h);
    if (cnt & 1) {
        uint16_t buf[8];
        _mm_storeu_si128((__m128i *)buf, h);
        q[cnt - 1] = buf[cnt - 1];
    }
}

/* Four elements widened to double; float -> double is exact. */
INLINE __m256d vd_ld_widen(const void *p, int64_t i, int dt)
{
    if (dt == CFBN_BF16) {
        __m128i h = _mm_loadl_epi64((const __m128i *)((const uint16_t *)p + i));
        return _mm256_cvtps_pd(_mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16)));
    }
    if (dt)
        return _mm256_cvtps_pd(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)((const uint16_t *)p + i))));
    return _mm256_cvtps_pd(_mm_loadu_ps((const float *)p + i));
}

INLINE __m256d lo_pd(__m256 v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
INLINE __m256d hi_pd(__m256 v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }

INLINE __m256 and_ps(__m256 v, __m256i m) { return _mm256_and_ps(v, _mm256_castsi256_ps(m)); }
INLINE __m256d and_pd(__m256d v, __m256i m) { return _mm256_and_pd(v, _mm256_castsi256_pd(m)); }

INLINE double hsum_pd(__m256d v)
{
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

/* ---- the primitives of the shared loops (bn_simd.c): a vector of doubles
 * and its masks; each ISA's header defines the same names ---- */

typedef __m256d vd;           /* VD_LANES doubles */
typedef __m256i vd_mask;      /* lanes of a vd, set or clear */
#define VD_LANES 4

INLINE vd vd_zero(void) { return _mm256_setzero_pd(); }
INLINE vd vd_set1(double v) { return _mm256_set1_pd(v); }
INLINE vd vd_load(const double *p) { return _mm256_loadu_pd(p); }
INLINE void vd_store(double *p, vd v) { _mm256_storeu_pd(p, v); }
/* lanes [0, cnt) set; cnt may be <= 0 or >= VD_LANES */
INLINE vd_mask vd_mask_first(int64_t cnt) { return mask_pd(cnt); }
/* the set lanes of m from p (the others read as 0 and are not touched) */
INLINE vd vd_load_part(const double *p, vd_mask m) { return _mm256_maskload_pd(p, m); }
INLINE void vd_store_part(double *p, vd_mask m, vd v) { _mm256_maskstore_pd(p, m, v); }
/* v in the set lanes of m, 0 in the others */
INLINE vd vd_keep(vd v, vd_mask m) { return and_pd(v, m); }
INLINE vd vd_add(vd a, vd b) { return _mm256_add_pd(a, b); }
INLINE vd vd_sub(vd a, vd b) { return _mm256_sub_pd(a, b); }
/* a * b + c, one rounding */
INLINE vd vd_fma(vd a, vd b, vd c) { return _mm256_fmadd_pd(a, b, c); }
INLINE double vd_hsum(vd v) { return hsum_pd(v); }


/* ---- the float primitives of the shared loops: a vector of VF_LANES
 * floats (VF_LANES == 2 VD_LANES on every ISA), its masks, arithmetic,
 * comparisons, widening to and narrowing from vd, and the fences and
 * stores that stream.  Each ISA's header defines the same names with the
 * same meaning; a comparison gives a vf_mask, whose set lanes are all ones
 * when it is seen as a vf (vf_mask_bits). ---- */

typedef __m256 vf;            /* VF_LANES floats */
typedef __m256i vf_mask;      /* lanes of a vf, set or clear */
#define VF_LANES 8

INLINE vf vf_zero(void) { return _mm256_setzero_ps(); }
INLINE vf vf_set1(float v) { return _mm256_set1_ps(v); }
INLINE vf vf_load(const float *p) { return _mm256_loadu_ps(p); }
INLINE void vf_store(float *p, vf v) { _mm256_storeu_ps(p, v); }
/* lanes [0, cnt) set; cnt may be <= 0 or >= VF_LANES */
INLINE vf_mask vf_mask_first(int64_t cnt) { return mask_ps(cnt); }
/* the set lanes of m from p (the others read as 0, their memory untouched) */
INLINE vf vf_load_part(const float *p, vf_mask m) { return _mm256_maskload_ps(p, m); }
INLINE vf vf_keep(vf v, vf_mask m) { return and_ps(v, m); }
INLINE vf vf_add(vf a, vf b) { return _mm256_add_ps(a, b); }
INLINE vf vf_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
INLINE vf vf_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
INLINE vf vf_div(vf a, vf b) { return _mm256_div_ps(a, b); }
/* a * b + c, c - a * b, a * b - c: one rounding each */
INLINE vf vf_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
INLINE vf vf_fnma(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
INLINE vf vf_fms(vf a, vf b, vf c) { return _mm256_fmsub_ps(a, b, c); }
/* the second operand where either is NaN (x86's rule; the loops put the
 * operand that must stay NaN second) */
INLINE vf vf_min(vf a, vf b) { return _mm256_min_ps(a, b); }
INLINE vf vf_max(vf a, vf b) { return _mm256_max_ps(a, b); }
/* bitwise */
INLINE vf vf_and(vf a, vf b) { return _mm256_and_ps(a, b); }
INLINE vf vf_or(vf a, vf b) { return _mm256_or_ps(a, b); }
/* ~a & b */
INLINE vf vf_andnot(vf a, vf b) { return _mm256_andnot_ps(a, b); }
/* to the nearest integer, ties to even */
INLINE vf vf_round(vf v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* 2^k for integral k in [-126, 127], by the exponent bits */
INLINE vf vf_exp2i(vf k)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23));
}
/* comparisons, ordered and quiet (false where either is NaN), and
 * unordered (true where either is NaN) */
INLINE vf_mask vf_lt(vf a, vf b) { return _mm256_castps_si256(_mm256_cmp_ps(a, b, _CMP_LT_OQ)); }
INLINE vf_mask vf_gt(vf a, vf b) { return _mm256_castps_si256(_mm256_cmp_ps(a, b, _CMP_GT_OQ)); }
INLINE vf_mask vf_unord(vf a, vf b) { return _mm256_castps_si256(_mm256_cmp_ps(a, b, _CMP_UNORD_Q)); }
/* set lanes all ones, clear lanes 0 */
INLINE vf vf_mask_bits(vf_mask m) { return _mm256_castsi256_ps(m); }
/* b in the set lanes of m, a in the others */
INLINE vf vf_blend(vf a, vf b, vf_mask m) { return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(m)); }

/* lanes [0, VD_LANES) and [VD_LANES, VF_LANES) widened to double; exact */
INLINE vd vf_lo_pd(vf v) { return lo_pd(v); }
INLINE vd vf_hi_pd(vf v) { return hi_pd(v); }
/* lo's lanes then hi's, each rounded to float */
INLINE vf vf_from_pd(vd lo, vd hi) { return _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo)); }

INLINE vd vd_mul(vd a, vd b) { return _mm256_mul_pd(a, b); }
/* c - a * b, one rounding */
INLINE vd vd_fnma(vd a, vd b, vd c) { return _mm256_fnmadd_pd(a, b, c); }
INLINE vd vd_or(vd a, vd b) { return _mm256_or_pd(a, b); }
/* each lane rounded to float and back */
INLINE vd vd_to_float_and_back(vd v) { return _mm256_cvtps_pd(_mm256_cvtpd_ps(v)); }
/* not (a >= b): true where a < b or either is NaN; a > b, ordered */
INLINE vd_mask vd_nge(vd a, vd b) { return _mm256_castpd_si256(_mm256_cmp_pd(a, b, _CMP_NGE_UQ)); }
INLINE vd_mask vd_gt(vd a, vd b) { return _mm256_castpd_si256(_mm256_cmp_pd(a, b, _CMP_GT_OQ)); }
INLINE vd_mask vd_mask_or(vd_mask a, vd_mask b) { return _mm256_or_si256(a, b); }
INLINE int vd_mask_any(vd_mask m) { return _mm256_movemask_pd(_mm256_castsi256_pd(m)) != 0; }

/* orders the non-temporal stores before the caller's barrier */
INLINE void stream_fence(void) { _mm_sfence(); }

/* 2 VF_LANES halfwords: the 2-byte storage of two vf */
typedef __m256i vh;

/* ---- for the plain and streaming loops ---- */

/* 2 VF_LANES halfwords: zero; stored at p[i..] (p uint16_t storage), no
 * alignment needed */
INLINE vh vh_zero(void) { return _mm256_setzero_si256(); }
INLINE void vh_st(void *p, int64_t i, vh h) { _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), h); }

/* |v| in each lane, by clearing the sign bit (NaN stays NaN) */
INLINE vd vd_abs(vd v) { return _mm256_and_pd(v, _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffll))); }
/* a mask as a vd: set lanes all ones, clear lanes 0 (as vf_mask_bits) */
INLINE vd vd_mask_bits(vd_mask m) { return _mm256_castsi256_pd(m); }
/* the reverse: a vd whose lanes are each all ones or all zeros (such as
 * vd_or of vd_mask_bits) as a mask of its all-ones lanes */
INLINE vd_mask vd_bits_mask(vd v) { return _mm256_castpd_si256(v); }

/* element i of p, dt storage, as a float (exact) */
INLINE float ld1(const void *p, int64_t i, int dt)
{
    if (dt == CFBN_BF16) return cfbn_bf16_to_float(((const uint16_t *)p)[i]);
    return dt ? _cvtsh_ss(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* a hint: the 64-byte line holding p into L1 (prefetch_l1) or into L2 and
 * not L1 (prefetch_l2); a no-op where the ISA has no such hint */
INLINE void prefetch_l1(const char *p) { _mm_prefetch(p, _MM_HINT_T0); }
INLINE void prefetch_l2(const char *p) { _mm_prefetch(p, _MM_HINT_T1); }

/* Non-temporal stores.  VF_NT_MIN_ALIGN: the alignment in bytes that
 * vf_st_nt and vh_stream_seq need of their address; at most 16 (the
 * router streams rows 16-byte aligned) and at most the bytes of VF_LANES
 * halfwords (a run's peel to it is one vf_st_part).  VF_NT_ALIGN: the
 * alignment at which a whole vector streams in one store: vf_stream_aligned,
 * vf_st_eo2_nt, and vh_stream_seq where half is 0 (half: the output is
 * VF_NT_MIN_ALIGN- but not VF_NT_ALIGN-aligned).  An ISA without streaming
 * stores makes them plain stores (and may set both to 1). */
#define VF_NT_MIN_ALIGN 16
#define VF_NT_ALIGN 32

/* VF_LANES elements at p + i (VF_NT_MIN_ALIGN-aligned), non-temporal, in
 * pieces of VF_NT_MIN_ALIGN bytes */
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

/* VF_LANES floats at p + i, VF_NT_ALIGN-aligned, non-temporal: one store */
INLINE void vf_stream_aligned(float *p, int64_t i, vf v)
{
    _mm256_stream_ps(p + i, v);
}

/* ---- for the fused loops ---- */

/* lanes [VF_LANES - cnt, VF_LANES) set: the last cnt lanes; cnt may be <= 0
 * or >= VF_LANES */
INLINE vf_mask vf_mask_last(int64_t cnt)
{
    return _mm256_cmpgt_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)(7 - cnt)));
}

#endif
