/* A kernel table built from the shared plain and streaming loops
 * (csrc/bn_simd_f64.c, csrc/bn_simd_float.c) over a portable stand-in for an
 * ISA header, at lane counts the build machine's CPU may not have: vd is an array of LANES
 * doubles, vf of VF_LANES = 2 LANES floats, a mask an array of flags, and
 * the 2-byte storage types go through storage.h's conversions, so that
 * every result is what an ISA with those lane counts must give.  The
 * streaming stores are plain stores that abort on an address less aligned
 * than the header promises the loops.  kernel_check.c, built with
 * -DCFBN_HAVE_LANES and this file, checks the table as it checks an ISA's.
 * run.sh builds it with LANES = 2, 4 and 8 (NEON, AVX2 and AVX-512).  The
 * fused and second-order loops are not in it: over these struct-of-array
 * vectors GCC takes more than ten minutes for them; NEON's table (4 floats,
 * under qemu), AVX2's (8) and AVX-512's (16, where the CPU has it) check
 * them at their lane counts. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cfbn.h"
#include "storage.h"

#ifndef LANES
#error "build with -DLANES=<doubles per vector>"
#endif

#define INLINE static inline __attribute__((always_inline))
#define COLD static __attribute__((noinline, cold))

#define VD_LANES LANES
#define VF_LANES (2 * LANES)
#define VF_NT_ALIGN (4 * VF_LANES)
#define VF_NT_MIN_ALIGN (2 * VF_LANES < 16 ? 2 * VF_LANES : 16)

typedef struct { double v[VD_LANES]; } vd;
typedef struct { int on[VD_LANES]; } vd_mask;
typedef struct { float v[VF_LANES]; } vf;
typedef struct { int on[VF_LANES]; } vf_mask;
typedef struct { uint16_t h[2 * VF_LANES]; } vh;

static void need_align(const void *p, unsigned a, const char *what)
{
    if ((uintptr_t)p % a) {
        fprintf(stderr, "lanes %d: %s at %p, not %u-byte aligned\n", LANES, what, p, a);
        abort();
    }
}

/* ---- doubles ---- */
INLINE vd vd_zero(void) { vd r; for (int l = 0; l < VD_LANES; l++) r.v[l] = 0.0; return r; }
INLINE vd vd_set1(double x) { vd r; for (int l = 0; l < VD_LANES; l++) r.v[l] = x; return r; }
INLINE vd vd_load(const double *p) { vd r; memcpy(r.v, p, sizeof r.v); return r; }
INLINE void vd_store(double *p, vd v) { memcpy(p, v.v, sizeof v.v); }
INLINE vd_mask vd_mask_first(int64_t cnt) { vd_mask m; for (int l = 0; l < VD_LANES; l++) m.on[l] = l < cnt; return m; }
INLINE vd vd_load_part(const double *p, vd_mask m)
{
    vd r;
    for (int l = 0; l < VD_LANES; l++) r.v[l] = m.on[l] ? p[l] : 0.0;
    return r;
}
INLINE void vd_store_part(double *p, vd_mask m, vd v) { for (int l = 0; l < VD_LANES; l++) if (m.on[l]) p[l] = v.v[l]; }
INLINE vd vd_keep(vd v, vd_mask m) { for (int l = 0; l < VD_LANES; l++) if (!m.on[l]) v.v[l] = 0.0; return v; }
INLINE vd vd_add(vd a, vd b) { for (int l = 0; l < VD_LANES; l++) a.v[l] += b.v[l]; return a; }
INLINE vd vd_sub(vd a, vd b) { for (int l = 0; l < VD_LANES; l++) a.v[l] -= b.v[l]; return a; }
INLINE vd vd_mul(vd a, vd b) { for (int l = 0; l < VD_LANES; l++) a.v[l] *= b.v[l]; return a; }
INLINE vd vd_fma(vd a, vd b, vd c) { for (int l = 0; l < VD_LANES; l++) a.v[l] = fma(a.v[l], b.v[l], c.v[l]); return a; }
INLINE vd vd_fnma(vd a, vd b, vd c) { for (int l = 0; l < VD_LANES; l++) a.v[l] = fma(-a.v[l], b.v[l], c.v[l]); return a; }
INLINE double vd_hsum(vd v) { double s = 0.0; for (int l = 0; l < VD_LANES; l++) s += v.v[l]; return s; }
INLINE vd vd_abs(vd v) { for (int l = 0; l < VD_LANES; l++) v.v[l] = fabs(v.v[l]); return v; }
INLINE vd vd_or(vd a, vd b)
{
    for (int l = 0; l < VD_LANES; l++) {
        uint64_t x, y;
        memcpy(&x, &a.v[l], 8);
        memcpy(&y, &b.v[l], 8);
        x |= y;
        memcpy(&a.v[l], &x, 8);
    }
    return a;
}
/* through a volatile float: GCC 12's SLP vectorizer takes the pair of
 * conversions for a no-op at -O2 */
INLINE vd vd_to_float_and_back(vd v)
{
    for (int l = 0; l < VD_LANES; l++) {
        volatile float f = (float)v.v[l];
        v.v[l] = f;
    }
    return v;
}
INLINE vd_mask vd_nge(vd a, vd b) { vd_mask m; for (int l = 0; l < VD_LANES; l++) m.on[l] = !(a.v[l] >= b.v[l]); return m; }
INLINE vd_mask vd_gt(vd a, vd b) { vd_mask m; for (int l = 0; l < VD_LANES; l++) m.on[l] = a.v[l] > b.v[l]; return m; }
INLINE vd_mask vd_mask_or(vd_mask a, vd_mask b) { for (int l = 0; l < VD_LANES; l++) a.on[l] |= b.on[l]; return a; }
INLINE int vd_mask_any(vd_mask m) { int r = 0; for (int l = 0; l < VD_LANES; l++) r |= m.on[l]; return r; }
INLINE vd vd_mask_bits(vd_mask m)
{
    vd r;
    for (int l = 0; l < VD_LANES; l++) {
        uint64_t x = m.on[l] ? ~(uint64_t)0 : 0;
        memcpy(&r.v[l], &x, 8);
    }
    return r;
}
INLINE vd_mask vd_bits_mask(vd v)
{
    vd_mask m;
    for (int l = 0; l < VD_LANES; l++) {
        uint64_t x;
        memcpy(&x, &v.v[l], 8);
        m.on[l] = x != 0;
    }
    return m;
}

/* ---- floats ---- */
INLINE vf vf_zero(void) { vf r; for (int l = 0; l < VF_LANES; l++) r.v[l] = 0.0f; return r; }
INLINE vf vf_set1(float x) { vf r; for (int l = 0; l < VF_LANES; l++) r.v[l] = x; return r; }
INLINE vf vf_load(const float *p) { vf r; memcpy(r.v, p, sizeof r.v); return r; }
INLINE void vf_store(float *p, vf v) { memcpy(p, v.v, sizeof v.v); }
INLINE vf_mask vf_mask_first(int64_t cnt) { vf_mask m; for (int l = 0; l < VF_LANES; l++) m.on[l] = l < cnt; return m; }
INLINE vf vf_load_part(const float *p, vf_mask m)
{
    vf r;
    for (int l = 0; l < VF_LANES; l++) r.v[l] = m.on[l] ? p[l] : 0.0f;
    return r;
}
INLINE vf vf_keep(vf v, vf_mask m) { for (int l = 0; l < VF_LANES; l++) if (!m.on[l]) v.v[l] = 0.0f; return v; }
INLINE vf vf_add(vf a, vf b) { for (int l = 0; l < VF_LANES; l++) a.v[l] += b.v[l]; return a; }
INLINE vf vf_sub(vf a, vf b) { for (int l = 0; l < VF_LANES; l++) a.v[l] -= b.v[l]; return a; }
INLINE vf vf_mul(vf a, vf b) { for (int l = 0; l < VF_LANES; l++) a.v[l] *= b.v[l]; return a; }
INLINE vf vf_fma(vf a, vf b, vf c) { for (int l = 0; l < VF_LANES; l++) a.v[l] = fmaf(a.v[l], b.v[l], c.v[l]); return a; }
INLINE vf vf_fms(vf a, vf b, vf c) { for (int l = 0; l < VF_LANES; l++) a.v[l] = fmaf(a.v[l], b.v[l], -c.v[l]); return a; }
INLINE vd vf_lo_pd(vf v) { vd r; for (int l = 0; l < VD_LANES; l++) r.v[l] = v.v[l]; return r; }
INLINE vd vf_hi_pd(vf v) { vd r; for (int l = 0; l < VD_LANES; l++) r.v[l] = v.v[VD_LANES + l]; return r; }
INLINE vf vf_from_pd(vd lo, vd hi)
{
    vf r;
    for (int l = 0; l < VD_LANES; l++) r.v[l] = (float)lo.v[l], r.v[VD_LANES + l] = (float)hi.v[l];
    return r;
}

/* ---- storage ---- */
INLINE const char *elem_at(const void *p, int64_t i, int dt) { return (const char *)p + (size_t)i * (dt ? 2 : 4); }
INLINE float ld1(const void *p, int64_t i, int dt) { return cfbn_load_float(dt, p, i); }
INLINE vf vf_ld(const void *p, int64_t i, int dt)
{
    vf r;
    for (int l = 0; l < VF_LANES; l++) r.v[l] = cfbn_load_float(dt, p, i + l);
    return r;
}
INLINE vf vf_ld_part(const void *p, int64_t i, int64_t cnt, int64_t avail, int dt)
{
    vf r;
    if (cnt > avail) abort();
    for (int l = 0; l < VF_LANES; l++) r.v[l] = l < cnt ? cfbn_load_float(dt, p, i + l) : 0.0f;
    return r;
}
INLINE void vf_st(void *p, int64_t i, vf v, int dt) { for (int l = 0; l < VF_LANES; l++) cfbn_store_float(dt, p, i + l, v.v[l]); }
INLINE void vf_st2(void *p, int64_t i, vf a, vf b, int dt)
{
    vf_st(p, i, a, dt);
    vf_st(p, i + VF_LANES, b, dt);
}
INLINE void vf_st_part(void *p, int64_t i, vf v, int64_t cnt, int dt)
{
    for (int l = 0; l < VF_LANES && l < cnt; l++) cfbn_store_float(dt, p, i + l, v.v[l]);
}
INLINE vd vd_ld_widen(const void *p, int64_t i, int dt)
{
    vd r;
    for (int l = 0; l < VD_LANES; l++) r.v[l] = cfbn_load_float(dt, p, i + l);
    return r;
}
/* bfloat16 even/odd: lane l of e is element i + 2 l, of o element i + 2 l + 1 */
INLINE void vf_ld_eo(const void *p, int64_t i, vf *e, vf *o)
{
    for (int l = 0; l < VF_LANES; l++) {
        e->v[l] = cfbn_load_float(CFBN_BF16, p, i + 2 * l);
        o->v[l] = cfbn_load_float(CFBN_BF16, p, i + 2 * l + 1);
    }
}
INLINE vh vh_narrow_eo(vf e, vf o)
{
    vh h;
    for (int l = 0; l < VF_LANES; l++) {
        cfbn_store_float(CFBN_BF16, h.h, 2 * l, e.v[l]);
        cfbn_store_float(CFBN_BF16, h.h, 2 * l + 1, o.v[l]);
    }
    return h;
}
INLINE void vh_narrow_eo2(vf e0, vf o0, vf e1, vf o1, vh *h0, vh *h1)
{
    *h0 = vh_narrow_eo(e0, o0);
    *h1 = vh_narrow_eo(e1, o1);
}
INLINE vh vh_zero(void) { vh h; memset(&h, 0, sizeof h); return h; }
INLINE void vh_st(void *p, int64_t i, vh h) { memcpy((uint16_t *)p + i, h.h, sizeof h.h); }
INLINE void vf_st_eo(void *p, int64_t i, vf e, vf o) { vh_st(p, i, vh_narrow_eo(e, o)); }

/* ---- streaming: plain stores, with the alignment the loops promise ---- */
INLINE void vf_st_eo2_nt(void *p, int64_t i, vf e0, vf o0, vf e1, vf o1)
{
    need_align((uint16_t *)p + i, VF_NT_ALIGN, "vf_st_eo2_nt");
    vh_st(p, i, vh_narrow_eo(e0, o0));
    vh_st(p, i + 2 * VF_LANES, vh_narrow_eo(e1, o1));
}
INLINE void vh_stream_seq(void *p, int64_t i, vh h, int half, vh *prev)
{
    need_align((uint16_t *)p + i, half ? VF_NT_MIN_ALIGN : VF_NT_ALIGN, "vh_stream_seq");
    vh_st(p, i, h);
    *prev = h;
}
INLINE void vh_stream_seq_end(void *p, int64_t n, int half, vh prev) { (void)p, (void)n, (void)half, (void)prev; }
INLINE void vf_st_nt(void *p, int64_t i, vf v, int dt)
{
    need_align(elem_at(p, i, dt), VF_NT_MIN_ALIGN, "vf_st_nt");
    vf_st(p, i, v, dt);
}
INLINE void vf_stream_aligned(float *p, int64_t i, vf v)
{
    need_align(p + i, VF_NT_ALIGN, "vf_stream_aligned");
    vf_store(p + i, v);
}
INLINE void stream_fence(void) {}
INLINE void prefetch_ahead_of(const void *p, int64_t i, int dt) { (void)p, (void)i, (void)dt; }
INLINE void prefetch_l1(const char *p) { (void)p; }
INLINE void prefetch_l2(const char *p) { (void)p; }

#include "bn_simd_f64.c"
#include "bn_simd_float.c"

/* the table's entries: the float-compute loops with their storage type */
#define FLOAT_ENTRIES(sfx, DT)                                                                                \
    static void stats_run_##sfx(const void *x, int64_t n, double shift, double *acc)                          \
    { stats_run_ps(x, n, shift, acc, DT); }                                                                   \
    static void stats_rows_##sfx(const void *x, int64_t rows, int64_t w, const double *shift, double *acc)    \
    { stats_rows_ps(x, rows, w, shift, acc, DT); }                                                            \
    static void apply_run_##sfx(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p)                   \
    { apply_run_ps(x, y, n, p, DT); }                                                                         \
    static void apply_rows_##sfx(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f32 *p)    \
    { apply_rows_ps(x, y, rows, w, p, DT); }                                                                  \
    static void gstats_run_##sfx(const void *dy, const void *x, int64_t n, const cfbn_grad_f32 *p, double *acc) \
    { gstats_run_ps(dy, x, n, p, acc, DT); }                                                                  \
    static void gstats_rows_##sfx(const void *dy, const void *x, int64_t rows, int64_t w,                     \
                                  const cfbn_grad_f32 *p, double *acc)                                        \
    { gstats_rows_ps(dy, x, rows, w, p, acc, DT); }                                                           \
    static void gapply_run_##sfx(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f32 *p)  \
    { gapply_run_ps(dy, x, dx, n, p, DT); }                                                                   \
    static void gapply_rows_##sfx(const void *dy, const void *x, void *dx, int64_t rows, int64_t w,           \
                                  const cfbn_grad_f32 *p)                                                     \
    { gapply_rows_ps(dy, x, dx, rows, w, p, DT); }                                                            \
    static void apply_run_nt_##sfx(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p)                \
    { apply_run_nt_ps(x, y, n, p, DT); }                                                                      \
    static void apply_rows_nt_##sfx(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f32 *p) \
    { apply_rows_nt_ps(x, y, rows, w, p, DT); }                                                               \
    static void gapply_run_nt_##sfx(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f32 *p) \
    { gapply_run_nt_ps(dy, x, dx, n, p, DT); }                                                                \
    static void gapply_rows_nt_##sfx(const void *dy, const void *x, void *dx, int64_t rows, int64_t w,        \
                                     const cfbn_grad_f32 *p)                                                  \
    { gapply_rows_nt_ps(dy, x, dx, rows, w, p, DT); }
#define FLOAT_TABLE(sfx)                                                                                      \
    stats_run_##sfx, stats_rows_##sfx, apply_run_##sfx, apply_rows_##sfx,                                     \
    gstats_run_##sfx, gstats_rows_##sfx, gapply_run_##sfx, gapply_rows_##sfx,                                 \
    .apply_run_stream = apply_run_nt_##sfx, .apply_rows_stream = apply_rows_nt_##sfx,                         \
    .gapply_run_stream = gapply_run_nt_##sfx, .gapply_rows_stream = gapply_rows_nt_##sfx

FLOAT_ENTRIES(f32, CFBN_F32)
FLOAT_ENTRIES(f16, CFBN_F16)
FLOAT_ENTRIES(bf16, CFBN_BF16)

#define STR2(x) #x
#define STR(x) STR2(x)

const cfbn_kernels cfbn_kernels_lanes = {
    .name = "lanes-vd" STR(LANES),
    .lanes = VF_LANES,
    .f32 = { FLOAT_TABLE(f32) },
    .f64 = { stats_run_f64, stats_rows_f64, apply_run_f64, apply_rows_f64,
             gstats_run_f64, gstats_rows_f64, gapply_run_f64, gapply_rows_f64 },
    .f16 = { FLOAT_TABLE(f16) },
    .bf16 = { FLOAT_TABLE(bf16) },
};
