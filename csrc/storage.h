/* How tensors are stored: element sizes, and the 2-byte storage types <->
 * binary32 in portable C (IEEE binary16, and bfloat16: the upper half of a
 * binary32).  Static inline so that each ISA file gets its own copy
 * compiled with its own flags. */
#ifndef CFBN_STORAGE_H
#define CFBN_STORAGE_H

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

/* Round to nearest, ties to even (the carry out of the mantissa is the
 * exponent's increment, up to inf); nan stays nan, made quiet. */
static inline uint16_t cfbn_float_to_bf16(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

/* Bytes per element of a tensor of dtype dt (enum cfbn_dtype). */
static inline size_t cfbn_storage_size(int dt)
{
    return dt == CFBN_F64 ? 8 : dt == CFBN_F32 ? 4 : 2;
}

/* Element i of a float-compute tensor (f32, f16, bf16) as float, exactly. */
static inline float cfbn_load_float(int dt, const void *p, int64_t i)
{
    if (dt == CFBN_F16) return cfbn_half_to_float(((const uint16_t *)p)[i]);
    if (dt == CFBN_BF16) return cfbn_bf16_to_float(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* Stores v as element i of a float-compute tensor, rounded to nearest even. */
static inline void cfbn_store_float(int dt, void *p, int64_t i, float v)
{
    if (dt == CFBN_F16) ((uint16_t *)p)[i] = cfbn_float_to_half(v);
    else if (dt == CFBN_BF16) ((uint16_t *)p)[i] = cfbn_float_to_bf16(v);
    else ((float *)p)[i] = v;
}

#endif
