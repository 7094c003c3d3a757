/* The primitives of the shared loops in portable C: the reference meaning of
 * every name that csrc/vec_avx2.h, vec_avx512.h and vec_neon.h define, at
 * any lane count.  Build with -DLANES=<VD_LANES> (VF_LANES = 2 LANES) and
 * -ffp-contract=off (each operation rounds once, as the vector instructions
 * do).  A vector is a struct of arrays, a mask an array of flags; the
 * 2-byte storage types go through storage.h's scalar conversions.
 *
 * NaN rules are AVX2's, which every ISA follows bit for bit: min and max
 * return the second operand (its bits) where either is NaN; bfloat16
 * narrowing makes a NaN quiet; float16 widening and float -> double widening
 * make a signalling NaN quiet (F16C's and the conversion instructions' rule;
 * storage.h's cfbn_half_to_float keeps the payload as it is); float16
 * narrowing rounds to nearest even as F16C.  Which NaN an arithmetic
 * operation returns is not part of the meaning (x86's FMA forms differ).
 *
 * tests/c/vec_check.c compares each ISA's header with this one;
 * tests/c/lanes_table.c builds the shared plain loops over it. */
#ifndef CFBN_VEC_PORTABLE_H
#define CFBN_VEC_PORTABLE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cfbn.h"
#include "storage.h"

#ifndef LANES
#error "build with -DLANES=<doubles per vector>"
#endif

#define INLINE static inline __attribute__((always_inline))
#define COLD static __attribute__((noinline, cold))

/* With PORTABLE_CHECK_ALIGN (tests/c/lanes_table.c), a streaming store to an
 * address less aligned than its primitive requires aborts: the loops must
 * meet every ISA's rule, also where these stores would not fault. */
#ifdef PORTABLE_CHECK_ALIGN
#include <stdio.h>
#include <stdlib.h>
static void need_align(const void *p, unsigned a, const char *what)
{
    if ((uintptr_t)p % a) {
        fprintf(stderr, "lanes %d: %s at %p, not %u-byte aligned\n", LANES, what, p, a);
        abort();
    }
}
#else
#define need_align(p, a, what) ((void)(p), (void)(a), (void)(what))
#endif

#define VD_LANES LANES
#define VF_LANES (2 * LANES)
/* Non-temporal stores.  VF_NT_MIN_ALIGN: the alignment in bytes that
 * vf_st_nt and vh_stream_seq need of their address; at most 16 (the router
 * streams rows 16-byte aligned) and at most the bytes of VF_LANES halfwords
 * (a run's peel to it is one vf_st_part).  VF_NT_ALIGN: the alignment at
 * which a whole vector streams in one store: vf_stream_aligned,
 * vf_st_eo2_nt, and vh_stream_seq where half is 0 (half: the output is
 * VF_NT_MIN_ALIGN- but not VF_NT_ALIGN-aligned).  Each ISA's values; here
 * those of an ISA that streams whole vectors of 16-byte pieces. */
#define VF_NT_MIN_ALIGN (2 * VF_LANES < 16 ? 2 * VF_LANES : 16)
#define VF_NT_ALIGN (4 * VF_LANES)

typedef struct { double v[VD_LANES]; } vd;
typedef struct { int on[VD_LANES]; } vd_mask;
typedef struct { float v[VF_LANES]; } vf;
typedef struct { int on[VF_LANES]; } vf_mask;
/* 2 VF_LANES halfwords: the 2-byte storage of two vf */
typedef struct { uint16_t h[2 * VF_LANES]; } vh;

INLINE uint32_t port_f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
INLINE float port_u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
INLINE uint64_t port_d2u(double d) { uint64_t u; memcpy(&u, &d, 8); return u; }
INLINE double port_u2d(uint64_t u) { double d; memcpy(&d, &u, 8); return d; }

/* float -> double, exact; a signalling NaN made quiet */
INLINE double port_widen(float f)
{
    double d = (double)f;
    return isnan(d) ? port_u2d(port_d2u(d) | 0x0008000000000000u) : d;
}

/* one element of dt storage as float (float16: a signalling NaN made quiet) */
INLINE float port_load(const void *p, int64_t i, int dt)
{
    float f = cfbn_load_float(dt, p, i);
    return dt == CFBN_F16 && isnan(f) ? port_u2f(port_f2u(f) | 0x400000u) : f;
}

/* ---- vd: VD_LANES doubles ---- */

INLINE vd vd_zero(void) { vd r; for (int l = 0; l < VD_LANES; l++) r.v[l] = 0.0; return r; }
INLINE vd vd_set1(double x) { vd r; for (int l = 0; l < VD_LANES; l++) r.v[l] = x; return r; }
INLINE vd vd_load(const double *p) { vd r; memcpy(r.v, p, sizeof r.v); return r; }
INLINE void vd_store(double *p, vd v) { memcpy(p, v.v, sizeof v.v); }
/* lanes [0, cnt) set; cnt may be <= 0 or >= VD_LANES */
INLINE vd_mask vd_mask_first(int64_t cnt) { vd_mask m; for (int l = 0; l < VD_LANES; l++) m.on[l] = l < cnt; return m; }
/* the set lanes of m from p (the others read as 0, their memory not read) */
INLINE vd vd_load_part(const double *p, vd_mask m)
{
    vd r;
    for (int l = 0; l < VD_LANES; l++) r.v[l] = m.on[l] ? p[l] : 0.0;
    return r;
}
INLINE void vd_store_part(double *p, vd_mask m, vd v) { for (int l = 0; l < VD_LANES; l++) if (m.on[l]) p[l] = v.v[l]; }
/* v in the set lanes of m, +0 in the others */
INLINE vd vd_keep(vd v, vd_mask m) { for (int l = 0; l < VD_LANES; l++) if (!m.on[l]) v.v[l] = 0.0; return v; }
INLINE vd vd_add(vd a, vd b) { for (int l = 0; l < VD_LANES; l++) a.v[l] += b.v[l]; return a; }
INLINE vd vd_sub(vd a, vd b) { for (int l = 0; l < VD_LANES; l++) a.v[l] -= b.v[l]; return a; }
INLINE vd vd_mul(vd a, vd b) { for (int l = 0; l < VD_LANES; l++) a.v[l] *= b.v[l]; return a; }
/* a * b + c and c - a * b, one rounding */
INLINE vd vd_fma(vd a, vd b, vd c) { for (int l = 0; l < VD_LANES; l++) a.v[l] = fma(a.v[l], b.v[l], c.v[l]); return a; }
INLINE vd vd_fnma(vd a, vd b, vd c) { for (int l = 0; l < VD_LANES; l++) a.v[l] = fma(-a.v[l], b.v[l], c.v[l]); return a; }
INLINE vd vd_or(vd a, vd b) { for (int l = 0; l < VD_LANES; l++) a.v[l] = port_u2d(port_d2u(a.v[l]) | port_d2u(b.v[l])); return a; }
/* The lanes summed pairwise, upper half onto lower half until one is left:
 * for 4 lanes (v0 + v2) + (v1 + v3).  The order is part of the meaning, so
 * that every ISA's sums keep their bits. */
INLINE double vd_hsum(vd v)
{
    for (int h = VD_LANES / 2; h >= 1; h /= 2)
        for (int l = 0; l < h; l++) v.v[l] += v.v[l + h];
    return v.v[0];
}
/* each lane rounded to float (to nearest even) and back */
/* through a volatile float: GCC 12's SLP vectorizer takes the pair of
 * conversions for a no-op at -O2 */
INLINE vd vd_to_float_and_back(vd v)
{
    for (int l = 0; l < VD_LANES; l++) {
        volatile float f = (float)v.v[l];
        v.v[l] = port_widen(f);
    }
    return v;
}
/* not (a >= b): true where a < b or either is NaN; a > b, false on NaN */
INLINE vd_mask vd_nge(vd a, vd b) { vd_mask m; for (int l = 0; l < VD_LANES; l++) m.on[l] = !(a.v[l] >= b.v[l]); return m; }
INLINE vd_mask vd_gt(vd a, vd b) { vd_mask m; for (int l = 0; l < VD_LANES; l++) m.on[l] = a.v[l] > b.v[l]; return m; }
INLINE vd_mask vd_mask_or(vd_mask a, vd_mask b) { for (int l = 0; l < VD_LANES; l++) a.on[l] |= b.on[l]; return a; }
INLINE int vd_mask_any(vd_mask m) { int r = 0; for (int l = 0; l < VD_LANES; l++) r |= m.on[l]; return r; }
/* |v|: the sign bit cleared (a NaN stays NaN) */
INLINE vd vd_abs(vd v) { for (int l = 0; l < VD_LANES; l++) v.v[l] = port_u2d(port_d2u(v.v[l]) & 0x7fffffffffffffffu); return v; }
/* set lanes all ones, clear lanes 0 (as vf_mask_bits) */
INLINE vd vd_mask_bits(vd_mask m) { vd r; for (int l = 0; l < VD_LANES; l++) r.v[l] = port_u2d(m.on[l] ? ~(uint64_t)0 : 0u); return r; }
/* the reverse: a vd whose lanes are each all ones or all zeros as the mask
 * of its all-ones lanes (other lanes: not part of the meaning) */
INLINE vd_mask vd_bits_mask(vd v) { vd_mask m; for (int l = 0; l < VD_LANES; l++) m.on[l] = port_d2u(v.v[l]) >> 63; return m; }

/* ---- vf: VF_LANES floats, its masks, arithmetic and comparisons ---- */

INLINE vf vf_zero(void) { vf r; for (int l = 0; l < VF_LANES; l++) r.v[l] = 0.0f; return r; }
INLINE vf vf_set1(float x) { vf r; for (int l = 0; l < VF_LANES; l++) r.v[l] = x; return r; }
INLINE vf vf_load(const float *p) { vf r; memcpy(r.v, p, sizeof r.v); return r; }
INLINE void vf_store(float *p, vf v) { memcpy(p, v.v, sizeof v.v); }
/* lanes [0, cnt) set; cnt may be <= 0 or >= VF_LANES (within int range) */
INLINE vf_mask vf_mask_first(int64_t cnt) { vf_mask m; for (int l = 0; l < VF_LANES; l++) m.on[l] = l < cnt; return m; }
/* lanes [VF_LANES - cnt, VF_LANES) set: the last cnt lanes */
INLINE vf_mask vf_mask_last(int64_t cnt) { vf_mask m; for (int l = 0; l < VF_LANES; l++) m.on[l] = l >= VF_LANES - cnt; return m; }
/* the set lanes of m from p (the others read as 0, their memory not read) */
INLINE vf vf_load_part(const float *p, vf_mask m)
{
    vf r;
    for (int l = 0; l < VF_LANES; l++) r.v[l] = m.on[l] ? p[l] : 0.0f;
    return r;
}
/* v in the set lanes of m, +0 in the others */
INLINE vf vf_keep(vf v, vf_mask m) { for (int l = 0; l < VF_LANES; l++) if (!m.on[l]) v.v[l] = 0.0f; return v; }
INLINE vf vf_add(vf a, vf b) { for (int l = 0; l < VF_LANES; l++) a.v[l] += b.v[l]; return a; }
INLINE vf vf_sub(vf a, vf b) { for (int l = 0; l < VF_LANES; l++) a.v[l] -= b.v[l]; return a; }
INLINE vf vf_mul(vf a, vf b) { for (int l = 0; l < VF_LANES; l++) a.v[l] *= b.v[l]; return a; }
INLINE vf vf_div(vf a, vf b) { for (int l = 0; l < VF_LANES; l++) a.v[l] /= b.v[l]; return a; }
/* a * b + c, c - a * b, a * b - c: one rounding each */
INLINE vf vf_fma(vf a, vf b, vf c) { for (int l = 0; l < VF_LANES; l++) a.v[l] = fmaf(a.v[l], b.v[l], c.v[l]); return a; }
INLINE vf vf_fnma(vf a, vf b, vf c) { for (int l = 0; l < VF_LANES; l++) a.v[l] = fmaf(-a.v[l], b.v[l], c.v[l]); return a; }
INLINE vf vf_fms(vf a, vf b, vf c) { for (int l = 0; l < VF_LANES; l++) a.v[l] = fmaf(a.v[l], b.v[l], -c.v[l]); return a; }
/* x86's rule: a where a < b (a > b), else b, so b (its bits) where either
 * is NaN, and b for -0 against +0 */
INLINE vf vf_min(vf a, vf b) { for (int l = 0; l < VF_LANES; l++) a.v[l] = a.v[l] < b.v[l] ? a.v[l] : b.v[l]; return a; }
INLINE vf vf_max(vf a, vf b) { for (int l = 0; l < VF_LANES; l++) a.v[l] = a.v[l] > b.v[l] ? a.v[l] : b.v[l]; return a; }
/* bitwise; vf_andnot is ~a & b */
INLINE vf vf_and(vf a, vf b) { for (int l = 0; l < VF_LANES; l++) a.v[l] = port_u2f(port_f2u(a.v[l]) & port_f2u(b.v[l])); return a; }
INLINE vf vf_or(vf a, vf b) { for (int l = 0; l < VF_LANES; l++) a.v[l] = port_u2f(port_f2u(a.v[l]) | port_f2u(b.v[l])); return a; }
INLINE vf vf_andnot(vf a, vf b) { for (int l = 0; l < VF_LANES; l++) a.v[l] = port_u2f(~port_f2u(a.v[l]) & port_f2u(b.v[l])); return a; }
/* to the nearest integer, ties to even (-0 stays -0; a NaN comes out quiet) */
INLINE vf vf_round(vf v)
{
    for (int l = 0; l < VF_LANES; l++) v.v[l] = isnan(v.v[l]) ? port_u2f(port_f2u(v.v[l]) | 0x400000u) : rintf(v.v[l]);
    return v;
}
/* 2^k for k in [-126, 127], k rounded to the nearest integer (ties to
 * even) first: the exponent bits of k + 127 */
INLINE vf vf_exp2i(vf k)
{
    for (int l = 0; l < VF_LANES; l++) k.v[l] = port_u2f((uint32_t)((int32_t)rintf(k.v[l]) + 127) << 23);
    return k;
}
/* ordered comparisons (false where either is NaN) and unordered (true
 * where either is NaN) */
INLINE vf_mask vf_lt(vf a, vf b) { vf_mask m; for (int l = 0; l < VF_LANES; l++) m.on[l] = a.v[l] < b.v[l]; return m; }
INLINE vf_mask vf_gt(vf a, vf b) { vf_mask m; for (int l = 0; l < VF_LANES; l++) m.on[l] = a.v[l] > b.v[l]; return m; }
INLINE vf_mask vf_unord(vf a, vf b) { vf_mask m; for (int l = 0; l < VF_LANES; l++) m.on[l] = isnan(a.v[l]) || isnan(b.v[l]); return m; }
/* set lanes all ones, clear lanes 0 */
INLINE vf vf_mask_bits(vf_mask m) { vf r; for (int l = 0; l < VF_LANES; l++) r.v[l] = port_u2f(m.on[l] ? 0xffffffffu : 0u); return r; }
/* b in the set lanes of m, a in the others */
INLINE vf vf_blend(vf a, vf b, vf_mask m) { for (int l = 0; l < VF_LANES; l++) if (m.on[l]) a.v[l] = b.v[l]; return a; }

/* lanes [0, VD_LANES) and [VD_LANES, VF_LANES) widened to double; exact */
INLINE vd vf_lo_pd(vf v) { vd r; for (int l = 0; l < VD_LANES; l++) r.v[l] = port_widen(v.v[l]); return r; }
INLINE vd vf_hi_pd(vf v) { vd r; for (int l = 0; l < VD_LANES; l++) r.v[l] = port_widen(v.v[VD_LANES + l]); return r; }
/* lo's lanes then hi's, each rounded to float (to nearest even) */
INLINE vf vf_from_pd(vd lo, vd hi)
{
    vf r;
    for (int l = 0; l < VD_LANES; l++) r.v[l] = (float)lo.v[l], r.v[VD_LANES + l] = (float)hi.v[l];
    return r;
}

/* ---- element access in dt storage (CFBN_F32, CFBN_F16, CFBN_BF16) ---- */

/* VF_LANES elements from p[i] */
INLINE vf vf_ld(const void *p, int64_t i, int dt)
{
    vf r;
    for (int l = 0; l < VF_LANES; l++) r.v[l] = port_load(p, i + l, dt);
    return r;
}

/* The first cnt (0..VF_LANES) elements at p[i], +0 in the other lanes.
 * avail (>= cnt) is how many elements p[i..] holds: nothing past it is
 * read. */
INLINE vf vf_ld_part(const void *p, int64_t i, int64_t cnt, int64_t avail, int dt)
{
    (void)avail;
    vf r = vf_zero();
    for (int l = 0; l < cnt && l < VF_LANES; l++) r.v[l] = port_load(p, i + l, dt);
    return r;
}

/* VF_LANES elements at p[i], rounded to the storage (storage.h's rules) */
INLINE void vf_st(void *p, int64_t i, vf v, int dt)
{
    for (int l = 0; l < VF_LANES; l++) cfbn_store_float(dt, p, i + l, v.v[l]);
}

/* 2 VF_LANES elements: a at p[i], b at p[i + VF_LANES] */
INLINE void vf_st2(void *p, int64_t i, vf a, vf b, int dt)
{
    vf_st(p, i, a, dt);
    vf_st(p, i + VF_LANES, b, dt);
}

/* exactly cnt (0..VF_LANES) elements at p[i]: nothing else is written */
INLINE void vf_st_part(void *p, int64_t i, vf v, int64_t cnt, int dt)
{
    for (int l = 0; l < cnt && l < VF_LANES; l++) cfbn_store_float(dt, p, i + l, v.v[l]);
}

/* element i of p, dt storage, as a byte address */
INLINE const char *elem_at(const void *p, int64_t i, int dt)
{
    return (const char *)p + (size_t)i * (dt ? 2 : 4);
}

/* element i of p as float, as vf_ld's lanes */
INLINE float ld1(const void *p, int64_t i, int dt) { return port_load(p, i, dt); }

/* VD_LANES elements from p[i] widened to double; exact */
INLINE vd vd_ld_widen(const void *p, int64_t i, int dt)
{
    vd r;
    for (int l = 0; l < VD_LANES; l++) r.v[l] = port_widen(port_load(p, i + l, dt));
    return r;
}

/* 2 VF_LANES halfwords: zero; stored at p[i..] (2-byte storage), no
 * alignment needed */
INLINE vh vh_zero(void) { vh h; memset(h.h, 0, sizeof h.h); return h; }
INLINE void vh_st(void *p, int64_t i, vh h) { memcpy((uint16_t *)p + i, h.h, sizeof h.h); }

/* ---- bfloat16 in even/odd order: 2 VF_LANES elements as two vf ----
 * vf_ld_eo: lane l of e is element i + 2l, lane l of o element i + 2l + 1;
 * vh_narrow_eo puts them back in element order, each rounded as
 * storage.h's cfbn_float_to_bf16 (a NaN made quiet). */
INLINE void vf_ld_eo(const void *p, int64_t i, vf *e, vf *o)
{
    for (int l = 0; l < VF_LANES; l++) {
        e->v[l] = cfbn_bf16_to_float(((const uint16_t *)p)[i + 2 * l]);
        o->v[l] = cfbn_bf16_to_float(((const uint16_t *)p)[i + 2 * l + 1]);
    }
}

INLINE vh vh_narrow_eo(vf e, vf o)
{
    vh h;
    for (int l = 0; l < VF_LANES; l++) {
        h.h[2 * l] = cfbn_float_to_bf16(e.v[l]);
        h.h[2 * l + 1] = cfbn_float_to_bf16(o.v[l]);
    }
    return h;
}

INLINE void vf_st_eo(void *p, int64_t i, vf e, vf o)
{
    vh h = vh_narrow_eo(e, o);
    memcpy((uint16_t *)p + i, h.h, sizeof h.h);
}

/* two vh_narrow_eo at once (an ISA may test the four for NaN together) */
INLINE void vh_narrow_eo2(vf e0, vf o0, vf e1, vf o1, vh *h0, vh *h1)
{
    *h0 = vh_narrow_eo(e0, o0);
    *h1 = vh_narrow_eo(e1, o1);
}

/* ---- non-temporal stores: where each ISA's alignment rule is met, the
 * same elements as the regular stores; they may reach memory late, so
 * stream_fence orders them before the caller's barrier ---- */

/* 4 VF_LANES bfloat16 from p + i, which is VF_NT_ALIGN-aligned: (e0, o0) then
 * (e1, o1) as vf_st_eo's pairs */
INLINE void vf_st_eo2_nt(void *p, int64_t i, vf e0, vf o0, vf e1, vf o1)
{
    need_align((uint16_t *)p + i, VF_NT_ALIGN, "vf_st_eo2_nt");
    vf_st_eo(p, i, e0, o0);
    vf_st_eo(p, i + 2 * VF_LANES, e1, o1);
}

/* vf_st's VF_LANES elements; p + i VF_NT_MIN_ALIGN-aligned */
INLINE void vf_st_nt(void *p, int64_t i, vf v, int dt)
{
    need_align(elem_at(p, i, dt), VF_NT_MIN_ALIGN, "vf_st_nt");
    vf_st(p, i, v, dt);
}

/* VF_LANES floats at p + i, VF_NT_ALIGN-aligned */
INLINE void vf_stream_aligned(float *p, int64_t i, vf v)
{
    need_align(p + i, VF_NT_ALIGN, "vf_stream_aligned");
    vf_store(p + i, v);
}

/* Groups h of 2 VF_LANES halfwords written in order from p[0] (i = 0,
 * 2 VF_LANES, ...; p VF_NT_MIN_ALIGN-aligned; half: p is not
 * VF_NT_ALIGN-aligned),
 * then vh_stream_seq_end (n: the elements written).  Afterwards p[0..n)
 * holds the groups and nothing else was written; before the end an ISA
 * may hold back the last bytes of the previous group (*prev): where p is
 * off = p % VF_NT_ALIGN bytes past alignment, each store is one aligned
 * vector of the previous group's last off bytes and this group's first,
 * the first group's head stored by itself and the last group's tail by
 * vh_stream_seq_end. */
INLINE void vh_stream_seq(void *p, int64_t i, vh h, int half, vh *prev)
{
    need_align((uint16_t *)p + i, half ? VF_NT_MIN_ALIGN : VF_NT_ALIGN, "vh_stream_seq");
    memcpy((uint16_t *)p + i, h.h, sizeof h.h);
    *prev = h;
}

INLINE void vh_stream_seq_end(void *p, int64_t n, int half, vh prev)
{
    (void)p, (void)n, (void)half, (void)prev;
}

INLINE void stream_fence(void) {}

/* a hint that element i of p is read soon, FLAT_PREFETCH_BYTES ahead; no
 * effect on any value */
#define FLAT_PREFETCH_BYTES 4096
INLINE void prefetch_ahead_of(const void *p, int64_t i, int dt) { (void)p, (void)i, (void)dt; }
/* hints: the 64-byte line holding p into L1, or into L2 and not L1 (a
 * no-op where the ISA has no such hint) */
INLINE void prefetch_l1(const char *p) { (void)p; }
INLINE void prefetch_l2(const char *p) { (void)p; }

#endif
