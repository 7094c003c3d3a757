/* Every primitive of an ISA's header (csrc/vec_<isa>.h) against its meaning
 * in tests/c/vec_portable.h, bit for bit.  This file is compiled twice and
 * linked into one program: once over the ISA's header (-DVEC_AVX2,
 * -DVEC_AVX512 or -DVEC_NEON: vec_run_isa), once over the portable one
 * (-DVEC_REF -DLANES=<the ISA's VD_LANES>: vec_run_ref and main).  Both
 * sides run the same calls (vec_run's cases, one per primitive) on the same
 * inputs into their own output buffers, which must then hold the same
 * bytes, guard bytes around every store included.
 *
 * Inputs: random values, random bit patterns and edge values (NaN of both
 * kinds with payloads, inf, -0, subnormals, huge, rounding ties); every
 * 2-byte pattern through each widening, and the neighbours of every
 * rounding boundary through each narrowing; every count 0..VF_LANES (and
 * beyond) for the masks and the partial loads and stores, the partial ones
 * ending at a PROT_NONE page; loads and stores at every element offset;
 * the streaming stores at every alignment their ISA allows.  Which NaN an
 * arithmetic operation returns is not compared (only that it is one).
 *
 * Exit status 0 when every check passes. */
#define _DEFAULT_SOURCE   /* mmap flags under -std=c11 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(VEC_REF)
#include "vec_portable.h"
#define vec_run vec_run_ref
#define vec_lanes vec_lanes_ref
#else
#if defined(VEC_AVX2)
#include "vec_avx2.h"
#elif defined(VEC_AVX512)
#include "vec_avx512.h"
#elif defined(VEC_NEON)
#include "vec_neon.h"
#else
#error "build with -DVEC_REF -DLANES=n, or -DVEC_AVX2, -DVEC_AVX512 or -DVEC_NEON"
#endif
#define vec_run vec_run_isa
#define vec_lanes vec_lanes_isa
#endif

/* the calls: one per primitive (or pair that only shows together) */
enum vec_op {
    F_ZERO, F_SET1, F_LOAD, F_ADD, F_SUB, F_MUL, F_DIV, F_FMA, F_FNMA, F_FMS, F_MIN, F_MAX, F_AND, F_OR,
    F_ANDNOT, F_ROUND, F_EXP2I, F_LT, F_GT, F_UNORD, F_BLEND, F_KEEP, F_MASK_FIRST, F_MASK_LAST, F_LO_HI_PD,
    F_FROM_PD, F_LOAD_PART, F_LOAD_PART_M,
    D_ZERO, D_SET1, D_LOAD, D_ADD, D_SUB, D_MUL, D_FMA, D_FNMA, D_OR, D_ABS, D_HSUM, D_TO_FLOAT,
    D_NGE, D_GT, D_MASK_OR, D_MASK_ANY, D_KEEP, D_MASK_FIRST, D_BITS_MASK, D_LOAD_PART, D_STORE_PART,
    D_LOAD_PART_M, D_STORE_PART_M,
    S_LD, S_LD_PART, S_ST, S_ST2, S_ST_PART, S_LD1, S_ELEM_AT, S_LD_WIDEN, S_LD_EO, S_ST_EO, S_NARROW_EO,
    S_NARROW_EO2, S_VH_ZERO, S_PREFETCH,
    N_ST_NT, N_STREAM_ALIGNED, N_ST_EO2_NT, N_STREAM_SEQ,
    N_OPS
};

/* The inputs of one call; n is a multiple of 4 VF_LANES where the call
 * loops over vectors.  Results go to dst (floats, doubles, or the
 * storage's elements). */
typedef struct {
    const float *a, *b, *c;     /* n floats each */
    const double *da, *db, *dc; /* n doubles each */
    const int *cnt;             /* a count per vector (masks) */
    const void *src;            /* loads: dt storage */
    void *dst;
    int64_t n, i, cnt1, avail;  /* i: element offset; cnt1, avail: one partial call */
    int dt;
} vec_args;

int vec_lanes(void);
void vec_run(int op, const vec_args *g);

int vec_lanes(void) { return VF_LANES; }

void vec_run(int op, const vec_args *g)
{
    const float *a = g->a, *b = g->b, *c = g->c;
    const double *da = g->da, *db = g->db, *dc = g->dc;
    float *fo = (float *)g->dst;
    double *dout = (double *)g->dst;
    const int64_t n = g->n, i = g->i;
    const int dt = g->dt;
    const vf z = vf_zero();
    switch ((enum vec_op)op) {
    case F_ZERO: for (int64_t v = 0; v < n; v += VF_LANES) vf_store(fo + v, vf_zero()); break;
    case F_SET1: for (int64_t v = 0; v < n; v += VF_LANES) vf_store(fo + v, vf_set1(a[v])); break;
    case F_LOAD: for (int64_t v = 0; v < n; v += VF_LANES) vf_store(fo + v, vf_load(a + v)); break;
#define BIN(OP, F) case OP: for (int64_t v = 0; v < n; v += VF_LANES) vf_store(fo + v, F(vf_load(a + v), vf_load(b + v))); break;
#define TRI(OP, F) case OP: for (int64_t v = 0; v < n; v += VF_LANES) vf_store(fo + v, F(vf_load(a + v), vf_load(b + v), vf_load(c + v))); break;
#define CMP(OP, F) case OP: for (int64_t v = 0; v < n; v += VF_LANES) vf_store(fo + v, vf_mask_bits(F(vf_load(a + v), vf_load(b + v)))); break;
    BIN(F_ADD, vf_add) BIN(F_SUB, vf_sub) BIN(F_MUL, vf_mul) BIN(F_DIV, vf_div)
    TRI(F_FMA, vf_fma) TRI(F_FNMA, vf_fnma) TRI(F_FMS, vf_fms)
    BIN(F_MIN, vf_min) BIN(F_MAX, vf_max) BIN(F_AND, vf_and) BIN(F_OR, vf_or) BIN(F_ANDNOT, vf_andnot)
    CMP(F_LT, vf_lt) CMP(F_GT, vf_gt) CMP(F_UNORD, vf_unord)
    case F_ROUND: for (int64_t v = 0; v < n; v += VF_LANES) vf_store(fo + v, vf_round(vf_load(a + v))); break;
    case F_EXP2I: for (int64_t v = 0; v < n; v += VF_LANES) vf_store(fo + v, vf_exp2i(vf_load(a + v))); break;
    case F_BLEND:
        for (int64_t v = 0; v < n; v += VF_LANES) vf_store(fo + v, vf_blend(vf_load(a + v), vf_load(b + v), vf_lt(vf_load(c + v), z)));
        break;
    case F_KEEP: for (int64_t v = 0; v < n; v += VF_LANES) vf_store(fo + v, vf_keep(vf_load(a + v), vf_lt(vf_load(c + v), z))); break;
    case F_MASK_FIRST:
    case F_MASK_LAST:
        for (int64_t v = 0; v < n; v += VF_LANES) {
            int64_t k = g->cnt[v / VF_LANES];
            vf_store(fo + v, vf_mask_bits(op == F_MASK_FIRST ? vf_mask_first(k) : vf_mask_last(k)));
        }
        break;
    case F_LO_HI_PD:
        for (int64_t v = 0; v < n; v += VF_LANES) {
            vd_store(dout + v, vf_lo_pd(vf_load(a + v)));
            vd_store(dout + v + VD_LANES, vf_hi_pd(vf_load(a + v)));
        }
        break;
    case F_FROM_PD:
        for (int64_t v = 0; v < n; v += VF_LANES) vf_store(fo + v, vf_from_pd(vd_load(da + v), vd_load(da + v + VD_LANES)));
        break;
    /* one call each: cnt1 lanes from (float *)src + i, or to dst + i */
    case F_LOAD_PART: vf_store(fo, vf_load_part((const float *)g->src + i, vf_mask_first(g->cnt1))); break;
    case F_LOAD_PART_M: vf_store(fo, vf_load_part((const float *)g->src + i, vf_lt(vf_load(c), z))); break;

    case D_ZERO: for (int64_t v = 0; v < n; v += VD_LANES) vd_store(dout + v, vd_zero()); break;
    case D_SET1: for (int64_t v = 0; v < n; v += VD_LANES) vd_store(dout + v, vd_set1(da[v])); break;
    case D_LOAD: for (int64_t v = 0; v < n; v += VD_LANES) vd_store(dout + v, vd_load(da + v)); break;
#define DBIN(OP, F) case OP: for (int64_t v = 0; v < n; v += VD_LANES) vd_store(dout + v, F(vd_load(da + v), vd_load(db + v))); break;
#define DTRI(OP, F) case OP: for (int64_t v = 0; v < n; v += VD_LANES) vd_store(dout + v, F(vd_load(da + v), vd_load(db + v), vd_load(dc + v))); break;
#define DCMP(OP, F) case OP: for (int64_t v = 0; v < n; v += VD_LANES) vd_store(dout + v, vd_mask_bits(F(vd_load(da + v), vd_load(db + v)))); break;
    DBIN(D_ADD, vd_add) DBIN(D_SUB, vd_sub) DBIN(D_MUL, vd_mul) DBIN(D_OR, vd_or)
    DTRI(D_FMA, vd_fma) DTRI(D_FNMA, vd_fnma)
    DCMP(D_NGE, vd_nge) DCMP(D_GT, vd_gt)
    case D_ABS: for (int64_t v = 0; v < n; v += VD_LANES) vd_store(dout + v, vd_abs(vd_load(da + v))); break;
    case D_HSUM: for (int64_t v = 0; v < n; v += VD_LANES) dout[v] = vd_hsum(vd_load(da + v)); break;
    case D_TO_FLOAT: for (int64_t v = 0; v < n; v += VD_LANES) vd_store(dout + v, vd_to_float_and_back(vd_load(da + v))); break;
    case D_MASK_OR:
    case D_MASK_ANY:
        for (int64_t v = 0; v < n; v += VD_LANES) {
            vd_mask p = vd_gt(vd_load(da + v), vd_load(db + v)), q = vd_gt(vd_load(dc + v), vd_zero());
            if (op == D_MASK_OR) vd_store(dout + v, vd_mask_bits(vd_mask_or(p, q)));
            else dout[v] = vd_mask_any(vd_mask_or(p, q)) + 2 * vd_mask_any(vd_mask_first(0));
        }
        break;
    case D_KEEP: for (int64_t v = 0; v < n; v += VD_LANES) vd_store(dout + v, vd_keep(vd_load(da + v), vd_gt(vd_load(dc + v), vd_zero()))); break;
    case D_MASK_FIRST:
        for (int64_t v = 0; v < n; v += VD_LANES) vd_store(dout + v, vd_mask_bits(vd_mask_first(g->cnt[v / VD_LANES])));
        break;
    case D_BITS_MASK:
        for (int64_t v = 0; v < n; v += VD_LANES) {
            vd m = vd_or(vd_mask_bits(vd_gt(vd_load(da + v), vd_load(db + v))), vd_mask_bits(vd_nge(vd_load(dc + v), vd_zero())));
            vd_store(dout + v, vd_keep(vd_load(db + v), vd_bits_mask(m)));
        }
        break;
    case D_LOAD_PART: vd_store(dout, vd_load_part((const double *)g->src + i, vd_mask_first(g->cnt1))); break;
    case D_STORE_PART: vd_store_part(dout + i, vd_mask_first(g->cnt1), vd_load(da)); break;
    case D_LOAD_PART_M: vd_store(dout, vd_load_part((const double *)g->src + i, vd_gt(vd_load(dc), vd_zero()))); break;
    case D_STORE_PART_M: vd_store_part(dout + i, vd_gt(vd_load(dc), vd_zero()), vd_load(da)); break;

    /* storage: elements [i, i + n) of src, or a's values stored at dst[i..] */
    case S_LD: for (int64_t v = 0; v < n; v += VF_LANES) vf_store(fo + v, vf_ld(g->src, i + v, dt)); break;
    case S_LD_PART: vf_store(fo, vf_ld_part(g->src, i, g->cnt1, g->avail, dt)); break;
    case S_ST: for (int64_t v = 0; v < n; v += VF_LANES) vf_st(g->dst, i + v, vf_load(a + v), dt); break;
    case S_ST2:
        for (int64_t v = 0; v < n; v += 2 * VF_LANES) vf_st2(g->dst, i + v, vf_load(a + v), vf_load(a + v + VF_LANES), dt);
        break;
    case S_ST_PART: vf_st_part(g->dst, i, vf_load(a), g->cnt1, dt); break;
    case S_LD1: for (int64_t v = 0; v < n; v++) fo[v] = ld1(g->src, i + v, dt); break;
    case S_ELEM_AT:
        for (int64_t v = 0; v < n; v++) ((int64_t *)g->dst)[v] = elem_at(g->src, i + v, dt) - (const char *)g->src;
        break;
    case S_LD_WIDEN: for (int64_t v = 0; v < n; v += VD_LANES) vd_store(dout + v, vd_ld_widen(g->src, i + v, dt)); break;
    case S_LD_EO:
        for (int64_t v = 0; v < n; v += 2 * VF_LANES) {
            vf e, o;
            vf_ld_eo(g->src, i + v, &e, &o);
            vf_store(fo + v, e);
            vf_store(fo + v + VF_LANES, o);
        }
        break;
    case S_ST_EO:
        for (int64_t v = 0; v < n; v += 2 * VF_LANES) vf_st_eo(g->dst, i + v, vf_load(a + v), vf_load(a + v + VF_LANES));
        break;
    case S_NARROW_EO:
        for (int64_t v = 0; v < n; v += 2 * VF_LANES) vh_st(g->dst, i + v, vh_narrow_eo(vf_load(a + v), vf_load(a + v + VF_LANES)));
        break;
    case S_NARROW_EO2:
        for (int64_t v = 0; v < n; v += 4 * VF_LANES) {
            vh h0, h1;
            vh_narrow_eo2(vf_load(a + v), vf_load(a + v + VF_LANES), vf_load(a + v + 2 * VF_LANES),
                          vf_load(a + v + 3 * VF_LANES), &h0, &h1);
            vh_st(g->dst, i + v, h0);
            vh_st(g->dst, i + v + 2 * VF_LANES, h1);
        }
        break;
    case S_VH_ZERO: for (int64_t v = 0; v < n; v += 2 * VF_LANES) vh_st(g->dst, i + v, vh_zero()); break;
    case S_PREFETCH:
        /* hints only: they must neither fault (even far past the data) nor
         * change a value */
        for (int64_t v = 0; v < n; v += VF_LANES) {
            prefetch_ahead_of(g->src, i + v, dt);
            prefetch_l1(elem_at(g->src, i + v, dt));
            prefetch_l2(elem_at(g->src, i + v, dt) + 1000000);
            vf_store(fo + v, vf_ld(g->src, i + v, dt));
        }
        break;

    /* non-temporal: dst + i at the alignment each needs (the caller's) */
    case N_ST_NT: for (int64_t v = 0; v < n; v += VF_LANES) vf_st_nt(g->dst, i + v, vf_load(a + v), dt); stream_fence(); break;
    case N_STREAM_ALIGNED:
        for (int64_t v = 0; v < n; v += VF_LANES) vf_stream_aligned(fo, i + v, vf_load(a + v));
        stream_fence();
        break;
    case N_ST_EO2_NT:
        for (int64_t v = 0; v < n; v += 4 * VF_LANES)
            vf_st_eo2_nt(g->dst, i + v, vf_load(a + v), vf_load(a + v + VF_LANES), vf_load(a + v + 2 * VF_LANES),
                         vf_load(a + v + 3 * VF_LANES));
        stream_fence();
        break;
    case N_STREAM_SEQ: {
        /* the sequence starts at p = dst + i, VF_NT_MIN_ALIGN-aligned */
        uint16_t *p = (uint16_t *)g->dst + i;
        const int half = ((uintptr_t)p % VF_NT_ALIGN) != 0;
        vh prev = vh_zero();
        for (int64_t v = 0; v < n; v += 2 * VF_LANES)
            vh_stream_seq(p, v, vh_narrow_eo(vf_load(a + v), vf_load(a + v + VF_LANES)), half, &prev);
        vh_stream_seq_end(p, n, half, prev);
        stream_fence();
        break;
    }
    case N_OPS: break;
    }
}

#ifdef VEC_REF
/* ---- the driver: inputs, both sides, comparison ---- */

int vec_lanes_isa(void);
void vec_run_isa(int op, const vec_args *g);

#define VFL VF_LANES
#define GUARD 64               /* bytes around every output */
#define POISON 0xa5

static long n_pass, n_fail;
static int64_t pagesz;

/* comparison of results: bytes, or floats / doubles where any NaN equals
 * any NaN (the arithmetic operations) */
enum cmp_kind { CMP_BYTES, CMP_F32_ARITH, CMP_F64_ARITH };

static const char *op_name(int op)
{
    static const char *const names[N_OPS] = {
        "vf_zero", "vf_set1", "vf_load/store", "vf_add", "vf_sub", "vf_mul", "vf_div", "vf_fma", "vf_fnma", "vf_fms",
        "vf_min", "vf_max", "vf_and", "vf_or", "vf_andnot", "vf_round", "vf_exp2i", "vf_lt", "vf_gt", "vf_unord",
        "vf_blend", "vf_keep", "vf_mask_first", "vf_mask_last", "vf_lo_pd/hi_pd", "vf_from_pd", "vf_load_part",
        "vf_load_part (any mask)",
        "vd_zero", "vd_set1", "vd_load/store", "vd_add", "vd_sub", "vd_mul", "vd_fma", "vd_fnma", "vd_or",
        "vd_abs", "vd_hsum", "vd_to_float_and_back", "vd_nge", "vd_gt", "vd_mask_or", "vd_mask_any", "vd_keep",
        "vd_mask_first", "vd_bits_mask", "vd_load_part", "vd_store_part", "vd_load_part (any mask)",
        "vd_store_part (any mask)",
        "vf_ld", "vf_ld_part", "vf_st", "vf_st2", "vf_st_part", "ld1", "elem_at", "vd_ld_widen", "vf_ld_eo", "vf_st_eo",
        "vh_narrow_eo/vh_st", "vh_narrow_eo2", "vh_zero", "prefetch_ahead_of/l1/l2",
        "vf_st_nt", "vf_stream_aligned", "vf_st_eo2_nt", "vh_stream_seq(_end)",
    };
    return names[op];
}

static const char *const dt_name[] = {"f32", "f64", "f16", "bf16"};

static uint32_t rng_state = 41;
static uint32_t rnd32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}
static uint64_t rnd64(void) { return (uint64_t)rnd32() << 32 | rnd32(); }

static const uint32_t f_edge[] = {
    0x00000000, 0x80000000, 0x3f800000, 0xbf800000, 0x3f000000, 0x3fc00000, 0x40200000, 0xc0200000, /* 0, +-1, .5, 1.5, +-2.5 */
    0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001, 0x7fa00000, 0x7fc12345, 0xff812345, /* inf, NaNs */
    0x00800000, 0x80800000, 0x00000001, 0x807fffff, 0x00400000, 0x7f7fffff, 0xff7fffff,             /* min, subnormal, max */
    0x477fe000, 0x477ff000, 0x477fefff, 0x33000000, 0x33000001, 0x387fc000, 0x38800000,             /* float16 edges */
    0x3f808000, 0x3f818000, 0x3f80ffff, 0x3f807fff, 0x7f7f8000, 0x7f7f7fff, 0x80008000,             /* bfloat16 ties */
    0x4b400000, 0xcb000000, 0x4effffff, 0x3effffff, 0x3f000001,
};
static const uint64_t d_edge[] = {
    0x0000000000000000u, 0x8000000000000000u, 0x3ff0000000000000u, 0xbff0000000000000u, 0x7ff0000000000000u,
    0xfff0000000000000u, 0x7ff8000000000000u, 0xfff8000000000000u, 0x7ff0000000000001u, 0x7ff4000000000000u,
    0x7ff8123456789abcu, 0x0010000000000000u, 0x0000000000000001u, 0x800fffffffffffffu, 0x7fefffffffffffffu,
    0x47efffffe0000000u, 0x47efffffefffffffu, 0x47effffff0000000u, 0x3810000000000000u, 0x36a0000000000000u,
    0x3ff0000010000000u, 0x3ff0000030000000u, 0x3ff000001fffffffu, 0x3e80000000000000u, 0x4330000000000000u,
};

static float u2f_(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static double u2d_(uint64_t u) { double d; memcpy(&d, &u, 8); return d; }

/* a value: random in [-8, 8), random bits, an edge value, or a small integer */
static float rnd_float(void)
{
    uint32_t k = rnd32() % 16;
    if (k < 7) return (float)((int32_t)rnd32() >> 4) * 0x1p-24f;
    if (k < 10) return u2f_(rnd32());
    if (k < 15) return u2f_(f_edge[rnd32() % (sizeof f_edge / sizeof *f_edge)]);
    return (float)((int)(rnd32() % 9) - 4) * 0.5f;
}

static double rnd_double(void)
{
    uint32_t k = rnd32() % 16;
    if (k < 6) return (double)((int64_t)rnd64() >> 11) * 0x1p-50;
    if (k < 8) return u2d_(rnd64());
    if (k < 10) return (double)rnd_float();
    if (k < 15) return u2d_(d_edge[rnd32() % (sizeof d_edge / sizeof *d_edge)]);
    return (double)rnd_float() + (double)rnd_float() * 0x1p-26;   /* near float rounding ties */
}

/* n bytes ending at a PROT_NONE page, so that a read or write past them faults */
static void *page_end(size_t n)
{
    size_t body = (n + (size_t)pagesz - 1) / (size_t)pagesz * (size_t)pagesz;
    char *b = mmap(NULL, body + (size_t)pagesz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED || mprotect(b + body, (size_t)pagesz, PROT_NONE) != 0) {
        perror("mmap");
        exit(2);
    }
    return b + body - n;
}

static void report(int ok, int op, int dt, const vec_args *g, const char *what, int64_t at, uint64_t got, uint64_t want)
{
    if (ok) {
        n_pass++;
        return;
    }
    if (n_fail++ < 30)
        printf("FAIL lanes %d %s dt %s i=%lld cnt=%lld avail=%lld n=%lld: %s at %lld: got %#llx want %#llx\n", VFL,
               op_name(op), dt_name[dt], (long long)g->i, (long long)g->cnt1, (long long)g->avail, (long long)g->n, what,
               (long long)at, (unsigned long long)got, (unsigned long long)want);
}

/* Runs op on both sides with out_bytes of output at each side's buffer
 * (offset base bytes into a poisoned block of base + out_bytes + GUARD, or
 * ending at a page when at_end) and compares the blocks. */
static void run_both(int op, vec_args g, int64_t base, int64_t out_bytes, enum cmp_kind kind, int at_end)
{
    static unsigned char *blk[2];
    static int64_t cap;
    int64_t total = base + out_bytes + (at_end ? 0 : GUARD);
    unsigned char *buf[2];
    if (at_end) {
        static unsigned char *end_blk[2];
        static int64_t end_cap;
        if (total > end_cap) {
            end_cap = total + 4096;
            for (int s = 0; s < 2; s++) end_blk[s] = (unsigned char *)page_end((size_t)end_cap) + end_cap;
        }
        for (int s = 0; s < 2; s++) buf[s] = end_blk[s] - total;
    } else {
        if (total > cap) {
            cap = total + 4096;
            for (int s = 0; s < 2; s++) {
                free(blk[s]);
                /* 64-byte aligned, so that base sets each alignment */
                if (posix_memalign((void **)&blk[s], 64, (size_t)cap)) exit(2);
            }
        }
        buf[0] = blk[0], buf[1] = blk[1];
    }
    for (int s = 0; s < 2; s++) memset(buf[s], POISON, (size_t)total);
    g.dst = buf[0] + base;
    vec_run_isa(op, &g);
    g.dst = buf[1] + base;
    vec_run_ref(op, &g);
    for (int64_t k = 0; k < total;) {
        int64_t in = k - base, w = kind == CMP_F64_ARITH ? 8 : kind == CMP_F32_ARITH ? 4 : 1;
        if (in < 0 || in >= out_bytes || kind == CMP_BYTES || in % w) {
            report(buf[0][k] == buf[1][k], op, g.dt, &g, in < 0 || in >= out_bytes ? "guard byte" : "byte", in, buf[0][k],
                   buf[1][k]);
            k++;
            continue;
        }
        int ok;
        uint64_t x = 0, y = 0;
        if (w == 8) {
            double p, q;
            memcpy(&p, buf[0] + k, 8), memcpy(&q, buf[1] + k, 8), memcpy(&x, &p, 8), memcpy(&y, &q, 8);
            ok = x == y || (isnan(p) && isnan(q));
        } else {
            float p, q;
            uint32_t xs, ys;
            memcpy(&p, buf[0] + k, 4), memcpy(&q, buf[1] + k, 4), memcpy(&xs, &p, 4), memcpy(&ys, &q, 4);
            ok = xs == ys || (isnan(p) && isnan(q));
            x = xs, y = ys;
        }
        report(ok, op, g.dt, &g, "element", in / w, x, y);
        k += w;
    }
}

#define N 8192                 /* elements of the random inputs: a multiple of 4 VF_LANES */

static float fa[N], fb[N], fc[N], fk[N];
static double dA[N], dB[N], dC[N];
static int cnts[N];

static void fill_random(void)
{
    for (int k = 0; k < N; k++) {
        fa[k] = rnd_float(), fb[k] = rnd_float(), fc[k] = rnd_float();
        dA[k] = rnd_double(), dB[k] = rnd_double(), dC[k] = rnd_double();
        /* exp2i: integers in [-126, 127] and halves between them */
        fk[k] = (float)((int)(rnd32() % 254) - 126) + (rnd32() % 4 == 0 ? 0.5f : 0.0f);
        if (fk[k] > 127.0f) fk[k] = 127.0f;
        cnts[k] = (int)(rnd32() % (2 * VFL + 7)) - 3;
    }
    for (int k = 0; k < 2 * VFL + 7 && k < N; k++) cnts[k] = k - 3;   /* every count, and beyond */
}

static void check_vectors(void)
{
    vec_args g = {fa, fb, fc, dA, dB, dC, cnts, NULL, NULL, N, 0, 0, 0, 0};
    const int fops[] = {F_ZERO, F_SET1, F_LOAD, F_MIN, F_MAX, F_AND, F_OR, F_ANDNOT, F_ROUND, F_LT, F_GT, F_UNORD,
                        F_BLEND, F_KEEP, F_MASK_FIRST, F_MASK_LAST};
    for (size_t k = 0; k < sizeof fops / sizeof *fops; k++) run_both(fops[k], g, 0, N * 4, CMP_BYTES, 0);
    const int arith[] = {F_ADD, F_SUB, F_MUL, F_DIV, F_FMA, F_FNMA, F_FMS};
    for (size_t k = 0; k < sizeof arith / sizeof *arith; k++) run_both(arith[k], g, 0, N * 4, CMP_F32_ARITH, 0);
    run_both(F_LO_HI_PD, g, 0, N * 8, CMP_BYTES, 0);
    run_both(F_FROM_PD, g, 0, N * 4, CMP_BYTES, 0);
    vec_args ge = g;
    ge.a = fk;
    run_both(F_EXP2I, ge, 0, N * 4, CMP_BYTES, 0);

    const int dops[] = {D_ZERO, D_SET1, D_LOAD, D_OR, D_ABS, D_TO_FLOAT, D_NGE, D_GT, D_MASK_OR, D_MASK_ANY,
                        D_KEEP, D_MASK_FIRST, D_BITS_MASK};
    for (size_t k = 0; k < sizeof dops / sizeof *dops; k++) run_both(dops[k], g, 0, N * 8, CMP_BYTES, 0);
    const int darith[] = {D_ADD, D_SUB, D_MUL, D_FMA, D_FNMA, D_HSUM};
    for (size_t k = 0; k < sizeof darith / sizeof *darith; k++) run_both(darith[k], g, 0, N * 8, CMP_F64_ARITH, 0);
    /* hsum on finite values of mixed magnitude: the order of the additions */
    static double mixed[N];
    for (int k = 0; k < N; k++) mixed[k] = (double)((int64_t)rnd64() >> 11) * (rnd32() % 2 ? 0x1p-30 : 0x1p+10);
    vec_args gm = g;
    gm.da = mixed;
    run_both(D_HSUM, gm, 0, N * 8, CMP_BYTES, 0);
}

/* the masked loads and stores of float and double: every count, lanes
 * ending at a PROT_NONE page, every offset */
static void check_masked(void)
{
    float *fsrc = page_end((size_t)VFL * 4);
    double *dsrc = page_end((size_t)VFL * 8);
    for (int k = 0; k < VFL; k++) fsrc[k] = rnd_float(), dsrc[k] = rnd_double();
    for (int64_t cnt = -1; cnt <= VFL + 1; cnt++) {
        int64_t cf = cnt < 0 ? 0 : cnt > VFL ? VFL : cnt, cd = cnt < 0 ? 0 : cnt > VFL / 2 ? VFL / 2 : cnt;
        vec_args g = {fa, fb, fc, dA, dB, dC, cnts, NULL, NULL, 0, 0, cnt, 0, 0};
        /* loads: the cnt lanes end at the page */
        g.src = fsrc + VFL - cf;
        run_both(F_LOAD_PART, g, 0, VFL * 4, CMP_BYTES, 0);
        g.src = dsrc + VFL - cd;
        run_both(D_LOAD_PART, g, 0, VFL * 4, CMP_BYTES, 0);
        /* stores: ending at the page, and at every offset in a guarded block */
        g.i = 0;
        run_both(D_STORE_PART, g, VFL * 4, cd * 8, CMP_BYTES, 1);
        for (g.i = 0; g.i < VFL; g.i++) {
            run_both(D_STORE_PART, g, 0, (g.i + VFL) * 8, CMP_BYTES, 0);
        }
    }
    /* any mask (from c's signs): the source fully readable */
    static float fs[4 * 64];
    static double ds[4 * 64];
    for (int k = 0; k < 4 * 64; k++) fs[k] = rnd_float(), ds[k] = rnd_double();
    for (int rep = 0; rep < 200; rep++) {
        vec_args g = {fa + rep * 4, fb, fc + rep * 8, dA + rep * 4, dB, dC + rep * 8, cnts, NULL, NULL, 0, 0, 0, 0, 0};
        g.src = fs + rep % 64;
        run_both(F_LOAD_PART_M, g, 0, VFL * 4, CMP_BYTES, 0);
        g.src = ds + rep % 64;
        run_both(D_LOAD_PART_M, g, 0, VFL * 4, CMP_BYTES, 0);
        run_both(D_STORE_PART_M, g, 0, VFL * 4, CMP_BYTES, 0);
    }
}

/* element offsets for the loads and stores: 0..3 and one past a vector */
#define FOR_OFFSETS(g) for ((g).i = 0; (g).i <= VFL + 2; (g).i += (g).i < 3 ? 1 : VFL - 1)

/* the loads of dt storage from s (n + 4 VFL elements) */
static void check_loads(int dt, const void *s, int64_t n)
{
    vec_args g = {fa, fb, fc, dA, dB, dC, cnts, s, NULL, n, 0, 0, 0, dt};
    FOR_OFFSETS(g) {
        run_both(S_LD, g, 0, n * 4, CMP_BYTES, 0);
        run_both(S_LD1, g, 0, n * 4, CMP_BYTES, 0);
        run_both(S_LD_WIDEN, g, 0, n * 8, CMP_BYTES, 0);
        run_both(S_PREFETCH, g, 0, n * 4, CMP_BYTES, 0);
        if (dt == CFBN_BF16) run_both(S_LD_EO, g, 0, n * 4, CMP_BYTES, 0);
    }
    vec_args ge = g;
    ge.n = 64, ge.i = 5;
    run_both(S_ELEM_AT, ge, 0, 64 * 8, CMP_BYTES, 0);
}

/* the stores of the floats v (n of them) into dt storage */
static void check_stores(int dt, const float *v, int64_t n, int all_offsets)
{
    const int64_t es = dt == CFBN_F32 ? 4 : 2;
    vec_args g = {v, fb, fc, dA, dB, dC, cnts, NULL, NULL, n, 0, 0, 0, dt};
    FOR_OFFSETS(g) {
        run_both(S_ST, g, 0, (g.i + n) * es, CMP_BYTES, 0);
        run_both(S_ST2, g, 0, (g.i + n) * es, CMP_BYTES, 0);
        if (dt == CFBN_BF16) {
            run_both(S_ST_EO, g, 0, (g.i + n) * 2, CMP_BYTES, 0);
            run_both(S_NARROW_EO, g, 0, (g.i + n) * 2, CMP_BYTES, 0);
            run_both(S_NARROW_EO2, g, 0, (g.i + n) * 2, CMP_BYTES, 0);
            run_both(S_VH_ZERO, g, 0, (g.i + n) * 2, CMP_BYTES, 0);
        }
        if (!all_offsets) break;
    }
}

/* partial element access: every count and avail, ending at a page */
static void check_partial(int dt)
{
    const int64_t es = dt == CFBN_F32 ? 4 : 2;
    unsigned char *end = (unsigned char *)page_end((size_t)(4 * VFL) * 4) + 4 * VFL * 4;
    for (int64_t k = 0; k < 4 * VFL; k++) {
        float f = rnd_float();
        uint16_t h = (uint16_t)rnd32();
        if (dt == CFBN_F32) memcpy(end - (4 * VFL - k) * 4, &f, 4);
        else memcpy(end - (4 * VFL - k) * 2, &h, 2);
    }
    for (int64_t cnt = 0; cnt <= VFL; cnt++) {
        for (int64_t avail = cnt; avail <= VFL + 2; avail++) {
            for (int64_t i = 0; i < 3; i++) {
                /* reads src[i .. i + avail) at most: they end at the page */
                vec_args g = {fa + i * VFL, fb, fc, dA, dB, dC, cnts, NULL, NULL, 0, i, cnt, avail, dt};
                g.src = end - (i + avail) * es;
                run_both(S_LD_PART, g, 0, VFL * 4, CMP_BYTES, 0);
            }
        }
        for (int64_t i = 0; i < VFL; i++) {
            vec_args g = {fa + i * VFL, fb, fc, dA, dB, dC, cnts, NULL, NULL, 0, i, cnt, cnt, dt};
            run_both(S_ST_PART, g, 0, (i + VFL) * es, CMP_BYTES, 0);
            /* dst[0 .. cnt) ending at the page */
            g.i = 0;
            run_both(S_ST_PART, g, VFL * es, cnt * es, CMP_BYTES, 1);
        }
    }
}

/* the non-temporal stores at each alignment their ISA allows */
static void check_streaming(int dt, const float *v, int64_t n)
{
    const int64_t es = dt == CFBN_F32 ? 4 : 2;
    vec_args g = {v, fb, fc, dA, dB, dC, cnts, NULL, NULL, n, 0, 0, 0, dt};
    /* base bytes into a 64-byte aligned block: every multiple of the
     * alignment below 64 */
    for (int64_t base = 0; base < 64; base += VF_NT_MIN_ALIGN < 4 ? 4 : VF_NT_MIN_ALIGN) {
        if (base % es) continue;
        run_both(N_ST_NT, g, base, n * es, CMP_BYTES, 0);
        if (dt == CFBN_BF16) {
            for (int64_t len = 2 * VFL; len <= 8 * VFL && len <= n; len += 2 * VFL) {
                vec_args gs = g;
                gs.n = len;
                run_both(N_STREAM_SEQ, gs, base, len * 2, CMP_BYTES, 0);
            }
            run_both(N_STREAM_SEQ, g, base, n * 2, CMP_BYTES, 0);
        }
    }
    for (int64_t base = 0; base < 128; base += VF_NT_ALIGN < 4 ? 4 : VF_NT_ALIGN) {
        if (dt == CFBN_F32) run_both(N_STREAM_ALIGNED, g, base, n * 4, CMP_BYTES, 0);
        if (dt == CFBN_BF16) run_both(N_ST_EO2_NT, g, base, n * 2, CMP_BYTES, 0);
    }
}

int main(void)
{
    pagesz = sysconf(_SC_PAGESIZE);
    if (vec_lanes_isa() != VFL) {
        printf("vec_check: the ISA has %d float lanes, the portable side %d (-DLANES)\n", vec_lanes_isa(), VFL);
        return 1;
    }
    fill_random();
    check_vectors();
    check_masked();

    /* every 2-byte pattern, and floats around every rounding boundary */
    const int64_t nh = 65536, nf = 65536 * 12;
    uint16_t *halves = malloc((size_t)(nh + 4 * VFL) * 2);
    float *wide = malloc((size_t)(nf + 4 * VFL) * 4);
    if (!halves || !wide) return 2;
    for (int64_t k = 0; k < nh + 4 * VFL; k++) halves[k] = (uint16_t)k;
    static const uint32_t lows[9] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x7fff, 0x8000, 0x8001, 0xffff};
    for (int64_t k = 0, u = 0; u < 65536; u++) {
        for (int l = 0; l < 9; l++) wide[k++] = u2f_((uint32_t)u << 16 | lows[l]);
        /* float16: the midpoint between u's value and the next, and its
         * neighbours (u a float16 here) */
        float lo = cfbn_half_to_float((uint16_t)u), hi = cfbn_half_to_float((uint16_t)(u + 1));
        float mid = (u & 0x7fff) < 0x7c00 ? lo + (hi - lo) / 2 : lo;
        uint32_t m;
        memcpy(&m, &mid, 4);
        wide[k++] = mid, wide[k++] = u2f_(m + 1), wide[k++] = u2f_(m - 1);
    }
    for (int64_t k = nf; k < nf + 4 * VFL; k++) wide[k] = rnd_float();
    for (int dt = 0; dt < 4; dt++) {
        if (dt == CFBN_F64) continue;
        if (dt == CFBN_F32) {
            check_loads(dt, fb, N - 4 * VFL);
            check_loads(dt, wide, nf);
        } else {
            check_loads(dt, halves, nh);
        }
        check_stores(dt, fa, N - 4 * VFL, 1);
        check_stores(dt, wide, nf, 0);
        check_partial(dt);
        check_streaming(dt, fa, N - 4 * VFL);
        check_streaming(dt, wide, 4096);
    }
    printf("vec_check lanes %d: %ld passed, %ld failed\n", VFL, n_pass, n_fail);
    free(halves);
    free(wide);
    return n_fail != 0;
}
#endif
