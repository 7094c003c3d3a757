/* How tensors are stored: element sizes, and the 2-byte storage types <->
 * binary32 in portable C (IEEE binary16, and bfloat16: the upper half of a
 * binary32).  Static inline so that each ISA file gets its own copy
 * compiled with its own flags. */
#ifndef CFBN_STORAGE_H
#define CFBN_STORAGE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cfbn.h"

static inline float cfbn_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1fu) {                 /* inf or nan: keep the payload */
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {              /* normal */
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {              /* zero */
        bits = sign;
    } else {                            /* subnormal: normalize */
        int e = -1;
        do { man <<= 1; e++; } while ((man & 0x400u) == 0);
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Round to nearest, ties to even; overflow gives inf; nan stays nan. */
static inline uint16_t cfbn_float_to_half(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    uint32_t absb = bits & 0x7fffffffu;
    if (absb >= 0x7f800000u) {          /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (absb > 0x7f800000u ? 0x200u | ((absb >> 13) & 0x3ffu) : 0u));
    }
    if (absb >= 0x477ff000u) {          /* rounds to >= 65520: inf */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (absb < 0x38800000u) {           /* below the smallest normal half: subnormal or zero */
        if (absb < 0x33000000u) {       /* below half the smallest subnormal: zero */
            return sign;
        }
        uint32_t e = absb >> 23;
        uint32_t man = (absb & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e;      /* 14..24 */
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1u);
        uint32_t mid = 1u << (shift - 1u);
        if (rem > mid || (rem == mid && (half & 1u))) {
            half++;
        }
        return (uint16_t)(sign | half);
    }
    /* normal: rebias the exponent, round the 13 dropped bits */
    uint32_t h = ((absb - 0x38000000u) >> 13);
    uint32_t rem = absb & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) {
        h++;                            /* may carry into the exponent: correct */
    }
    return (uint16_t)(sign | h);
}

/* bfloat16 -> float is exact: the bits are the float's upper half. */
static inline float cfbn_bf16_to_float(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* The bfloat16 rounding rule, which every ISA's narrowing follows bit for
 * bit (vec_avx2.h: round_bf16, narrow_ph; bn_neon.c: narrow_h): to nearest,
 * ties to even, by adding CFBN_BF16_ROUND_HALF plus the kept lsb (bit 16) to
 * the float's bits and dropping the low half; the carry out of the mantissa
 * is the exponent's increment, up to inf.  A NaN is not rounded (that could
 * carry it into inf) but made quiet, CFBN_BF16_QUIET set.  Subnormals round
 * like any other value (the native AVX-512 BF16 conversion flushes them
 * instead, so it is not this rule). */
#define CFBN_BF16_ROUND_HALF 0x7fffu
#define CFBN_BF16_QUIET 0x400000u

static inline uint32_t cfbn_bf16_round_bits(uint32_t bits)
{
    return bits + CFBN_BF16_ROUND_HALF + ((bits >> 16) & 1u);
}

static inline uint16_t cfbn_float_to_bf16(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits | CFBN_BF16_QUIET) >> 16);
    return (uint16_t)(cfbn_bf16_round_bits(bits) >> 16);
}

/* Bytes per element of a tensor of dtype dt (enum cfbn_dtype); 0 for a
 * code outside the enum. */
static inline size_t cfbn_storage_size(int dt)
{
    switch ((enum cfbn_dtype)dt) {
    case CFBN_F32: return 4;
    case CFBN_F64: return 8;
    case CFBN_F16: return 2;
    case CFBN_BF16: return 2;
    }
    return 0;
}

/* Element i of a float-compute tensor (f32, f16, bf16) as float, exactly;
 * NaN for float64 (a double-compute type: the callers read it as double). */
static inline float cfbn_load_float(int dt, const void *p, int64_t i)
{
    switch ((enum cfbn_dtype)dt) {
    case CFBN_F32: return ((const float *)p)[i];
    case CFBN_F16: return cfbn_half_to_float(((const uint16_t *)p)[i]);
    case CFBN_BF16: return cfbn_bf16_to_float(((const uint16_t *)p)[i]);
    case CFBN_F64: break;
    }
    return (float)NAN;
}

/* Stores v as element i of a float-compute tensor, rounded to nearest even
 * (nothing for float64, which the callers store as double). */
static inline void cfbn_store_float(int dt, void *p, int64_t i, float v)
{
    switch ((enum cfbn_dtype)dt) {
    case CFBN_F32: ((float *)p)[i] = v; break;
    case CFBN_F16: ((uint16_t *)p)[i] = cfbn_float_to_half(v); break;
    case CFBN_BF16: ((uint16_t *)p)[i] = cfbn_float_to_bf16(v); break;
    case CFBN_F64: break;
    }
}

#endif
