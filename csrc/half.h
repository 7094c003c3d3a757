/* IEEE binary16 <-> binary32 conversion in portable C.  Static inline so that
 * each ISA file gets its own copy compiled with its own flags. */
#ifndef CFBN_HALF_H
#define CFBN_HALF_H

#include <stdint.h>
#include <string.h>

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

#endif
