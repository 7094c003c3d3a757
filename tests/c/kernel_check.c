/* Compares every kernel of an ISA table with the scalar reference table on
 * random data, including data at both ends of the exponent range (see
 * case_make's scenarios).
 *
 *   - Inputs (data and parameter arrays) end exactly at a page boundary
 *     followed by a PROT_NONE page, so any read past the end faults.
 *   - Outputs are NaN-filled before each call (every element must be
 *     written) and framed by guard elements (none may be touched).
 *   - apply/gapply may differ from scalar by FMA contraction: the tolerance
 *     is two ulps of the sum of the magnitudes of the terms (plus one ulp of
 *     the result for the 2-byte types, whose final rounding may then flip).
 *   - stats/gstats sums may differ by summation order: 2e-12 relative to the
 *     sum of the magnitudes of the terms; for float and half rows and
 *     gradient runs, whose SIMD kernels may sum blocks of 8 vectors pairwise
 *     in float before adding them in double, 6 float ulps of that sum (half
 *     an ulp for each difference or product, three for the pairwise tree,
 *     with room to spare).
 *   - Fused activations and side input (every activation, with and without a
 *     side input, and side_grad): the SIMD exp/tanh are within a few ulps of
 *     libm, and the pre-activation may differ by FMA contraction, so
 *       value:      L * dpre + 8 ulps of max(1, |act|)
 *       derivative: L2 * dpre + 8 ulps of max(1, alpha), or the whole jump
 *                   when the pre-activation is within dpre of a kink
 *     where dpre = 4 ulps of the sum of the magnitudes of the pre-activation's
 *     terms, L bounds |act'| and L2 bounds |act''| (1, or alpha when larger).
 *     Gradient sums add sum |dy| (resp. |dy * d|) times the derivative bound.
 *   - Second-order gradient (ggstats, ggapply; check_gg_table): its five sums
 *     as the gradient sums, ddy and dx within 4 ulps of the sum of their
 *     terms' magnitudes (plus one ulp of the result for the 2-byte types),
 *     also in place and with the streaming hint on outputs aligned alike and
 *     apart.
 *
 * Build with CFBN_HAVE_AVX2, CFBN_HAVE_AVX512 and/or CFBN_HAVE_NEON and the matching ISA file
 * (or CFBN_HAVE_LANES and lanes_table.c); with none it only checks the
 * scalar table against itself. */
#define _DEFAULT_SOURCE   /* mmap flags and sysconf under -std=c11 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bn_act.h"
#include "bn_route.h"
#include "cfbn.h"
#include "storage.h"

#if defined(CFBN_HAVE_LANES)
/* tests/c/lanes_table.c: the shared loops over a portable header */
extern const cfbn_kernels cfbn_kernels_lanes;
#endif

enum { K_STATS, K_APPLY, K_GSTATS, K_GAPPLY };
static const char *kname[] = {"stats", "apply", "gstats", "gapply"};
/* by enum cfbn_dtype */
#define N_DTYPES 4
static const char *dname[N_DTYPES] = {"f32", "f64", "f16", "bf16"};
static const size_t esize[N_DTYPES] = {4, 8, 2, 2};

static long n_pass, n_fail;

/* Counts one check; returns whether it passed. */
static int tally(int ok)
{
    if (ok) n_pass++;
    else n_fail++;
    return ok;
}

/* KERNEL_CHECK_SHORT set (under valgrind, whose memcheck runs ~50 times
 * slower): fused cases without the streaming repeat in two scenarios
 * (random data, one end of the exponent range), second-order cases in
 * three, and a table without its optional entries only through the fused
 * fallback.  The fused cases were 13 of the 18 s of the short run natively
 * in six scenarios. */
static int g_short;

/* ---- random numbers ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_uniform(void) { return ((double)(rng_next() >> 11) + 0.5) * 0x1p-53; }

static double rng_normal(void)
{
    return sqrt(-2.0 * log(rng_uniform())) * cos(6.283185307179586 * rng_uniform());
}

/* ---- memory ---- */

typedef struct {
    void *base;
    size_t len;
} region;

/* bytes of memory that end where an inaccessible page begins */
static void *alloc_guarded(size_t bytes, region *rg)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    size_t body = (bytes + pg - 1) / pg * pg;
    char *b = mmap(NULL, body + pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED || mprotect(b + body, pg, PROT_NONE) != 0) {
        perror("mmap");
        exit(2);
    }
    rg->base = b;
    rg->len = body + pg;
    return b + body - bytes;
}

static void free_guarded(region *rg) { munmap(rg->base, rg->len); }

#define GUARD 16
static const unsigned char GUARD_BYTE = 0xa5;

/* Output buffer: at least GUARD elements of GUARD_BYTE either side; by
 * default one element of misalignment so no ISA can rely on vector-aligned
 * outputs.  g_misalign = 0 gives a 64-byte aligned output (a cache line's
 * start), the case in which the streaming (non-temporal) paths are taken;
 * 2 gives 16 bytes past a line's start (where malloc puts large blocks). */
static int g_misalign = 1;
/* the stream hint handed to the kernels under test */
static int g_stream = 0;
typedef struct {
    unsigned char *raw;
    unsigned char *p;
    size_t bytes, es, len;
} outbuf;

static void out_init(outbuf *o, size_t count, size_t es)
{
    o->es = es;
    o->bytes = count * es;
    o->len = o->bytes + (2 * GUARD + 1) * es + 64 + 16;
    o->raw = malloc(o->len);
    if (!o->raw) exit(2);
    uintptr_t start = ((uintptr_t)o->raw + GUARD * es + 63) & ~(uintptr_t)63;
    o->p = (unsigned char *)start + (g_misalign == 2 ? 16 : g_misalign * es);
    memset(o->raw, GUARD_BYTE, o->len);
}

static void out_poison(outbuf *o)
{
    memset(o->raw, GUARD_BYTE, o->len);
    size_t n = o->bytes / o->es;
    for (size_t i = 0; i < n; i++) {
        if (o->es == 8) {
            double v = NAN;
            memcpy(o->p + i * 8, &v, 8);
        } else if (o->es == 4) {
            float v = NAN;
            memcpy(o->p + i * 4, &v, 4);
        } else {
            uint16_t v = 0xffff;   /* nan as binary16 and as bfloat16 */
            memcpy(o->p + i * 2, &v, 2);
        }
    }
}

static int out_guards_ok(const outbuf *o)
{
    for (size_t i = 0; i < (size_t)(o->p - o->raw); i++)
        if (o->raw[i] != GUARD_BYTE) return 0;
    for (size_t i = (size_t)(o->p - o->raw) + o->bytes; i < o->len; i++)
        if (o->raw[i] != GUARD_BYTE) return 0;
    return 1;
}

static void out_free(outbuf *o) { free(o->raw); }

/* ---- typed values ---- */

static double get(int dt, const void *p, int64_t i)
{
    if (dt == CFBN_F64) return ((const double *)p)[i];
    return cfbn_load_float(dt, p, i);
}

static void put(int dt, void *p, int64_t i, double v)
{
    if (dt == CFBN_F64) ((double *)p)[i] = v;
    else cfbn_store_float(dt, p, i, (float)v);
}

/* One ulp of a result v stored as dt when that is a 2-byte type (whose final
 * rounding may flip where two kernels' float results differ), else 0. */
static double storage_ulp(int dt, double v)
{
    if (dt == CFBN_F16) return fabs(v) * 0x1p-10 + 0x1p-24;
    if (dt == CFBN_BF16) return fabs(v) * 0x1p-7 + 0x1p-133;
    return 0.0;
}

/* x - mhi - mlo as the kernels form it: in float for f32/f16/bf16, double
 * for f64 */
static double centered(int dt, double x, double mhi, double mlo)
{
    if (dt == CFBN_F64) return (x - mhi) - mlo;
    float d = ((float)x - (float)mhi) - (float)mlo;
    return d;
}

/* ---- one test case: inputs and parameters ---- */

typedef struct {
    int dt;
    int rows_kind;          /* 0: run of n, 1: rows x w */
    int64_t rows, w, n;     /* n = total elements; for runs w = 1 for parameters */
    void *x, *dy;           /* guarded typed inputs */
    double *shift;          /* guarded, w entries (run: 1) */
    void *mhi, *mlo, *pa, *pb, *pc;   /* guarded, typed float or double, w entries */
    void *side;             /* guarded typed input: the fused side input */
    region rg[9];
} tcase;

/* The fusion under test: activation, its alpha, side input on/off.  The
 * gradient's pre-activation uses pa and pb as its alpha and beta. */
static int g_act = CFBN_ACT_NONE;
static double g_alpha = 0.0;
static int g_side = 0;
/* runs and stride handed to the run kernels (cfbn.h) */
static int64_t g_runs = 0, g_stride = 0;
/* with g_side, the side input handed to the table under test when not NULL
 * (an array that is also the output), else the case's own */
static const void *g_side_at = NULL;
/* where the float tables' fused gradient sums store g (cfbn_grad_f32.g_out) */
static void *g_gout = NULL;

static void *alloc_param(tcase *t, int slot, const double *v, int64_t w)
{
    int pdt = t->dt == CFBN_F64 ? CFBN_F64 : CFBN_F32;
    void *p = alloc_guarded((size_t)w * esize[pdt], &t->rg[slot]);
    for (int64_t j = 0; j < w; j++) put(pdt, p, j, v[j]);
    return p;
}

/* scenario 0: mean 0, std 1, shift and mean at the data
 *          1: mean 1e4, std 1, shift and mean at the data
 *          2: mean 1e4, std 1, shift and mean far (0)
 *          3: mean -3, std 50, shift a sample, mean slightly off
 * and the ends of the exponent range, where sums, squares and products
 * formed in float leave float's range while the double sums do not (half
 * data are scaled to half's range instead, where float sums cannot;
 * bfloat16 has float's range):
 *          4: std 2^62, dy about 2^64: squares and products beyond 2^128
 *          5: x uniform in +-3e38, shift and mean 0: block sums overflow
 *          6: mean and std 2^-70, dy about 2^-60: squares and products
 *             below 2^-126, where float keeps only part of their bits
 *          7: |dy| about 2^125, the sign flipping every 16 rows (runs: 256
 *             elements): float block sums of dy overflow, the total not
 * Parameters scale with the std (mean offset, a, and b from scenario 4 on),
 * so that outputs stay near 1. */
#define SCENARIOS 8

static void case_make(tcase *t, int dt, int rows_kind, int64_t rows, int64_t w, int scenario)
{
    memset(t, 0, sizeof *t);
    t->dt = dt;
    t->rows_kind = rows_kind;
    t->rows = rows;
    t->w = w;
    t->n = rows * w;
    int64_t np = rows_kind ? w : 1;
    int half = dt == CFBN_F16;
    double base = scenario == 0 || scenario >= 4 ? 0.0 : scenario == 3 ? -3.0 : 1e4;
    double sd = scenario == 3 ? 50.0 : 1.0, dys = 0.5, dyo = 0.01;
    if (scenario == 4) sd = half ? 0x1p12 : 0x1p62, dys = half ? 4.0 : 0x1p64, dyo = 0.0;
    if (scenario == 5) sd = half ? 3.5e4 : 1.7e38;
    if (scenario == 6) sd = half ? 0x1p-14 : 0x1p-70, dys = half ? 0x1p-14 : 0x1p-60, dyo = 0.0;
    if (scenario == 7) dys = half ? 0x1p14 : 0x1p125, dyo = 0.0;

    t->x = alloc_guarded((size_t)t->n * esize[dt], &t->rg[0]);
    t->dy = alloc_guarded((size_t)t->n * esize[dt], &t->rg[1]);
    t->side = alloc_guarded((size_t)t->n * esize[dt], &t->rg[8]);
    double *colmean = malloc(sizeof(double) * (size_t)(np + 1));
    for (int64_t j = 0; j < np; j++) colmean[j] = base * (1.0 + 0.001 * (double)(j % 7)) + 0.1 * (double)j;
    if (scenario == 6)
        for (int64_t j = 0; j < np; j++) colmean[j] *= sd;
    for (int64_t i = 0; i < t->n; i++) {
        int64_t j = rows_kind ? i % w : 0;
        if (scenario == 5) put(dt, t->x, i, (2.0 * rng_uniform() - 1.0) * (half ? 6e4 : 3e38));
        else put(dt, t->x, i, colmean[j] + sd * rng_normal());
        if (scenario == 7) {
            int64_t block = rows_kind ? i / w / 16 : i / 256;
            put(dt, t->dy, i, (block & 1 ? -dys : dys) * (1.0 + 0.5 * rng_uniform()));
        } else {
            put(dt, t->dy, i, dys * rng_normal() + dyo);
        }
        put(dt, t->side, i, 1.5 * rng_normal());
    }

    double *sh = malloc(sizeof(double) * (size_t)(np + 1));
    double *mh = malloc(sizeof(double) * (size_t)(np + 1)), *ml = malloc(sizeof(double) * (size_t)(np + 1));
    double *a = malloc(sizeof(double) * (size_t)(np + 1)), *b = malloc(sizeof(double) * (size_t)(np + 1));
    double *c = malloc(sizeof(double) * (size_t)(np + 1));
    for (int64_t j = 0; j < np; j++) {
        double m = colmean[j] + (scenario == 3 ? 0.37 * sd : 0.01 * sd * rng_normal());
        if (scenario == 2 || scenario == 5) m = 0.0;
        /* scenario 1 also gives shifts no float can hold exactly */
        sh[j] = scenario == 2 || scenario == 5 ? 0.0
              : scenario == 1 ? colmean[j] + sd * rng_normal()
                              : (double)(float)(colmean[j] + sd * rng_normal());
        if (dt == CFBN_F64) {
            mh[j] = m;
            ml[j] = m * 1e-17;
        } else {
            mh[j] = (float)m;
            ml[j] = (float)(m - (double)(float)m);
        }
        a[j] = (0.5 + rng_uniform()) / sd;
        b[j] = rng_normal() / (scenario >= 4 ? sd : 1.0);
        c[j] = 0.1 * rng_normal();
    }
    t->shift = alloc_guarded((size_t)np * sizeof(double), &t->rg[2]);
    memcpy(t->shift, sh, (size_t)np * sizeof(double));
    t->mhi = alloc_param(t, 3, mh, np);
    t->mlo = alloc_param(t, 4, ml, np);
    t->pa = alloc_param(t, 5, a, np);
    t->pb = alloc_param(t, 6, b, np);
    t->pc = alloc_param(t, 7, c, np);
    free(colmean);
    free(sh);
    free(mh);
    free(ml);
    free(a);
    free(b);
    free(c);
}

static void case_free(tcase *t)
{
    for (int i = 0; i < 9; i++) free_guarded(&t->rg[i]);
}

/* ---- calling a table ----
 * Through the routing layer, as the driver calls it: the scenarios' flags
 * (several runs, streaming stores, activation, side input) reach the table's
 * optional entries where it has them (runs, stream, fused), its fallbacks
 * where it has not. */

static void call(const cfbn_kernels *k, int kind, const tcase *t, const void *x, const void *dy, void *out,
                 void *side_grad)
{
    int64_t n = t->n, r = t->rows, w = t->w;
    int rows = t->rows_kind;
    int64_t nr = rows ? r : n;
    const void *side = g_side ? (g_side_at ? g_side_at : t->side) : NULL;
    if (kind == K_STATS) {
        if (g_runs > 1) cfbn_route_stats_runs(k, t->dt, x, n, g_runs, g_stride, t->shift[0], out);
        else cfbn_route_stats(k, t->dt, x, nr, w, !rows, t->shift, out);
    } else if (t->dt != CFBN_F64) {
        cfbn_apply_f32 ap = {t->mhi, t->mlo, t->pa, t->pb, g_stream, g_act, (float)g_alpha, side,
                             g_runs, g_stride};
        cfbn_grad_f32 gp = {t->mhi, t->mlo, t->pa, t->pb, t->pc, g_stream, g_act, (float)g_alpha,
                            t->pa, t->pb, side, side_grad, g_runs, g_stride, g_gout};
        if (kind == K_APPLY) cfbn_route_apply_f32(k, t->dt, x, out, nr, w, !rows, &ap);
        else if (kind == K_GSTATS) cfbn_route_gstats_f32(k, t->dt, dy, x, nr, w, !rows, &gp, out);
        else cfbn_route_gapply_f32(k, t->dt, dy, x, out, nr, w, !rows, &gp);
    } else {
        cfbn_apply_f64 ap = {t->mhi, t->mlo, t->pa, t->pb, g_stream, g_act, g_alpha, side, g_runs, g_stride};
        cfbn_grad_f64 gp = {t->mhi, t->mlo, t->pa, t->pb, t->pc, g_stream, g_act, g_alpha,
                            t->pa, t->pb, side, side_grad, g_runs, g_stride};
        if (kind == K_APPLY) cfbn_route_apply_f64(k, x, out, nr, w, !rows, &ap);
        else if (kind == K_GSTATS) cfbn_route_gstats_f64(k, dy, x, nr, w, !rows, &gp, out);
        else cfbn_route_gapply_f64(k, dy, x, out, nr, w, !rows, &gp);
    }
}

/* The optional entries a table fills: which of them the scenarios reach. */
/* How many streaming entries dtype d of table k fills (of 4). */
static int stream_entries(const cfbn_kernels *k, int d)
{
    if (d == CFBN_F64) {
        const cfbn_double_kernels *o = &k->f64;
        return !!o->apply_run_stream + !!o->apply_rows_stream + !!o->gapply_run_stream + !!o->gapply_rows_stream;
    }
    const cfbn_float_kernels *o = cfbn_route_float_table(k, d);
    return !!o->apply_run_stream + !!o->apply_rows_stream + !!o->gapply_run_stream + !!o->gapply_rows_stream;
}

static void print_entries(const cfbn_kernels *k)
{
    /* the driver widens channels-last rows to a multiple of the table's lanes */
    if (!tally(k->lanes >= 1 && k->lanes <= 64 && (k->lanes & (k->lanes - 1)) == 0))
        printf("FAIL %s: lanes %d, not a power of two in [1, 64]\n", k->name, k->lanes);
    for (int d = 0; d < N_DTYPES; d++) {
        int runs, fused, gg;
        if (d == CFBN_F64) {
            const cfbn_double_kernels *o = &k->f64;
            runs = !!o->apply_runs + !!o->gstats_runs + !!o->gapply_runs;
            fused = !!o->apply_run_fused + !!o->apply_rows_fused + !!o->gstats_run_fused + !!o->gstats_rows_fused +
                    !!o->gapply_run_fused + !!o->gapply_rows_fused + !!o->apply_runs_fused +
                    !!o->gstats_runs_fused + !!o->gapply_runs_fused;
            gg = !!o->ggstats_run + !!o->ggstats_rows + !!o->ggapply_run + !!o->ggapply_rows + !!o->ggstats_runs +
                 !!o->ggapply_runs;
        } else {
            const cfbn_float_kernels *o = cfbn_route_float_table(k, d);
            runs = !!o->apply_runs + !!o->gstats_runs + !!o->gapply_runs + !!o->stats_runs;
            fused = !!o->apply_run_fused + !!o->apply_rows_fused + !!o->gstats_run_fused + !!o->gstats_rows_fused +
                    !!o->gapply_run_fused + !!o->gapply_rows_fused + !!o->apply_runs_fused +
                    !!o->gstats_runs_fused + !!o->gapply_runs_fused;
            gg = !!o->ggstats_run + !!o->ggstats_rows + !!o->ggapply_run + !!o->ggapply_rows + !!o->ggstats_runs +
                 !!o->ggapply_runs;
        }
        printf("%s %s: optional entries runs %d/%d, stream %d/4, fused %d/9, second order %d/6\n", k->name, dname[d],
               runs, d == CFBN_F64 ? 3 : 4, stream_entries(k, d), fused, gg);
    }
}

/* ---- comparison ---- */

static int report(const cfbn_kernels *k, int kind, const tcase *t, int scenario, const char *what, int64_t i,
                  double got, double want, double tol)
{
    if (n_fail < 40)
        fprintf(stderr, "FAIL %s %s_%s_%s n=%lld rows=%lld w=%lld scenario=%d: %s at %lld: got %.17g want %.17g tol %.3g\n",
                k->name, kname[kind], t->rows_kind ? "rows" : "run", dname[t->dt], (long long)t->n,
                (long long)t->rows, (long long)t->w, scenario, what, (long long)i, got, want, tol);
    return 0;
}

static double pget(const tcase *t, const void *p, int64_t j)
{
    return t->dt == CFBN_F64 ? ((const double *)p)[j] : ((const float *)p)[j];
}

/* inplace: 0 separate output, 1 output aliases x (apply) or dy (gapply) */
static int check_one(const cfbn_kernels *k, int kind, const tcase *t, int scenario, int inplace)
{
    int dt = t->dt;
    int is_stats = kind == K_STATS || kind == K_GSTATS;
    int64_t np = t->rows_kind ? t->w : 1;
    size_t cnt = is_stats ? (size_t)(2 * np) : (size_t)t->n;
    size_t es = is_stats ? 8 : esize[dt];
    outbuf ref, got;
    out_init(&ref, cnt, es);
    out_init(&got, cnt, es);
    out_poison(&ref);
    out_poison(&got);

    const void *x = t->x, *dy = t->dy;
    if (inplace) {
        memcpy(got.p, kind == K_APPLY ? t->x : t->dy, got.bytes);
        if (kind == K_APPLY) x = got.p;
        else dy = got.p;
    }
    call(&cfbn_kernels_scalar, kind, t, t->x, t->dy, ref.p, NULL);
    call(k, kind, t, x, dy, got.p, NULL);

    int ok = 1;
    if (!out_guards_ok(&got)) ok = report(k, kind, t, scenario, "guard overwritten", -1, 0, 0, 0);
    if (!out_guards_ok(&ref)) ok = report(&cfbn_kernels_scalar, kind, t, scenario, "guard overwritten", -1, 0, 0, 0);

    if (is_stats) {
        const double *r = (const double *)ref.p, *g = (const double *)got.p;
        for (int64_t j = 0; j < np && ok; j++) {
            double m1 = 0.0, m2 = 0.0;   /* sums of |terms| */
            int64_t nr = t->rows_kind ? t->rows : t->n, step = t->rows_kind ? t->w : 1;
            for (int64_t q = 0; q < nr; q++) {
                int64_t i = j + q * step;
                double xv = get(dt, t->x, i);
                if (kind == K_STATS) {
                    double d = xv - t->shift[j];
                    m1 += fabs(d);
                    m2 += d * d;
                } else {
                    double gv = get(dt, t->dy, i);
                    double d = centered(dt, xv, pget(t, t->mhi, j), pget(t, t->mlo, j));
                    m1 += fabs(gv);
                    m2 += fabs(gv * d);
                }
            }
            /* the kernels that may sum blocks in float (cfbn.h): rows, the
             * gradient sums, and the statistics of 2-byte runs */
            int in_float = dt != CFBN_F64 && (t->rows_kind || kind == K_GSTATS || dt != CFBN_F32);
            double blk = in_float ? 6.0 * FLT_EPSILON : 0.0;
            double tol1 = (2e-12 + blk) * m1 + 1e-300, tol2 = (2e-12 + blk) * m2 + 1e-300;
            if (!(fabs(g[j] - r[j]) <= tol1)) ok = report(k, kind, t, scenario, "sum1", j, g[j], r[j], tol1);
            else if (!(fabs(g[np + j] - r[np + j]) <= tol2))
                ok = report(k, kind, t, scenario, "sum2", j, g[np + j], r[np + j], tol2);
        }
    } else {
        double eps = dt == CFBN_F64 ? DBL_EPSILON : FLT_EPSILON;
        for (int64_t i = 0; i < t->n && ok; i++) {
            int64_t j = t->rows_kind ? i % t->w : 0;
            double xv = get(dt, t->x, i);
            double d = centered(dt, xv, pget(t, t->mhi, j), pget(t, t->mlo, j));
            double mag;
            if (kind == K_APPLY) {
                mag = fabs(d * pget(t, t->pa, j)) + fabs(pget(t, t->pb, j));
            } else {
                double gv = get(dt, t->dy, i);
                mag = fabs(gv * pget(t, t->pa, j)) + fabs(d * pget(t, t->pb, j)) + fabs(pget(t, t->pc, j));
            }
            double want = get(dt, ref.p, i), have = get(dt, got.p, i);
            double tol = 2.0 * eps * mag + 1e-300;
            tol += storage_ulp(dt, want);
            /* equal infinities: overflow in both (their difference is NaN) */
            if (!(have == want || fabs(have - want) <= tol))
                ok = report(k, kind, t, scenario, inplace ? "value (in place)" : "value", i, have, want, tol);
        }
    }
    out_free(&ref);
    out_free(&got);
    return tally(ok);
}

/* ---- fused activation and side input ---- */

/* bounds on |act'| and |act''| (see the header comment) */
static double act_lip(int kind)
{
    switch (kind) {
    case CFBN_ACT_SIGMOID: return 0.25;
    case CFBN_ACT_SILU: return 1.1;
    case CFBN_ACT_LEAKY_RELU:
    case CFBN_ACT_ELU: return fmax(1.0, fabs(g_alpha));
    default: return 1.0;
    }
}

static double act_lip2(int kind)
{
    switch (kind) {
    case CFBN_ACT_NONE:
    case CFBN_ACT_RELU:
    case CFBN_ACT_RELU6:
    case CFBN_ACT_LEAKY_RELU: return 0.0;
    case CFBN_ACT_ELU: return fmax(1.0, fabs(g_alpha));
    default: return 1.0;
    }
}

static int near_kink(int kind, double pre, double dpre)
{
    switch (kind) {
    case CFBN_ACT_RELU:
    case CFBN_ACT_LEAKY_RELU:
    case CFBN_ACT_ELU: return fabs(pre) <= dpre;
    case CFBN_ACT_RELU6: return fabs(pre) <= dpre || fabs(pre - 6.0) <= dpre;
    default: return 0;
    }
}

/* element i: the pre-activation (pa, pb as its alpha and beta), the bound on
 * how far two tables' pre-activations may be apart, and the bound on the
 * difference of their act' values */
static void fused_elem(const tcase *t, int64_t i, double *pre, double *dpre, double *der_tol)
{
    int dt = t->dt;
    double eps = dt == CFBN_F64 ? DBL_EPSILON : FLT_EPSILON;
    int64_t j = t->rows_kind ? i % t->w : 0;
    double d = centered(dt, get(dt, t->x, i), pget(t, t->mhi, j), pget(t, t->mlo, j));
    double sd = g_side ? get(dt, t->side, i) : 0.0;
    *pre = d * pget(t, t->pa, j) + pget(t, t->pb, j) + sd;
    *dpre = 4.0 * eps * (fabs(d * pget(t, t->pa, j)) + fabs(pget(t, t->pb, j)) + fabs(sd)) + 1e-300;
    *der_tol = act_lip2(g_act) * *dpre + 8.0 * eps * fmax(1.0, fabs(g_alpha));
    if (near_kink(g_act, *pre, 2.0 * *dpre)) *der_tol += fmax(1.0, fabs(g_alpha)) + 1.0;
}

/* Adds element i's share of the bounds of column j's fused gradient sums to
 * b: b[0], b[1] the magnitudes of the two sums' terms, b[2], b[3] what the
 * activation's derivative may contribute. */
static void fused_sum_bounds(const tcase *t, int64_t i, int64_t j, double *b)
{
    int dt = t->dt;
    double pre, dpre, der_tol;
    fused_elem(t, i, &pre, &dpre, &der_tol);
    double gv = get(dt, t->dy, i);
    double d = centered(dt, get(dt, t->x, i), pget(t, t->mhi, j), pget(t, t->mlo, j));
    double gg = gv * cfbn_act_grad_f64(g_act, pre, g_alpha);
    b[0] += fabs(gg);
    b[1] += fabs(gg * d);
    b[2] += fabs(gv) * der_tol;
    b[3] += fabs(gv * d) * der_tol;
}

/* The bound of sum s (0 or 1) from fused_sum_bounds' b */
static double fused_sum_tol(int dt, const double *b, int s)
{
    double eps = dt == CFBN_F64 ? DBL_EPSILON : FLT_EPSILON;
    return 2e-12 * b[s] + 4.0 * eps * b[s] + b[2 + s] + 1e-300;
}

/* The bound of fused output element i of column j against the reference's
 * value want, and (gradients) of its side_grad against sw in *stol */
static double fused_out_tol(const tcase *t, int kind, int64_t i, int64_t j, double want, double sw, double *stol)
{
    int dt = t->dt;
    double eps = dt == CFBN_F64 ? DBL_EPSILON : FLT_EPSILON;
    double pre, dpre, der_tol, tol;
    fused_elem(t, i, &pre, &dpre, &der_tol);
    if (kind == K_APPLY) {
        tol = act_lip(g_act) * dpre + 8.0 * eps * fmax(1.0, fabs(cfbn_act_f64(g_act, pre, g_alpha)));
    } else {
        double gv = get(dt, t->dy, i);
        double gg = gv * cfbn_act_grad_f64(g_act, pre, g_alpha);
        double d = centered(dt, get(dt, t->x, i), pget(t, t->mhi, j), pget(t, t->mlo, j));
        double a = pget(t, t->pa, j);
        tol = 2.0 * eps * (fabs(gg * a) + fabs(d * pget(t, t->pb, j)) + fabs(pget(t, t->pc, j)))
              + fabs(gv * a) * der_tol;
        *stol = fabs(gv) * der_tol + 2.0 * eps * fabs(gg) + 1e-300 + storage_ulp(dt, sw);
    }
    return tol + 1e-300 + storage_ulp(dt, want);
}

/* inplace: 0 separate outputs;
 *          1 the output is x (apply) or dy (gradients), side_grad is x;
 *          2 the output is side (apply) or x (gapply), side_grad is dy.
 * An aliased input holds a copy of the case's array; the scalar table gets
 * the case's own, unaliased. */
static int check_fused(const cfbn_kernels *k, int kind, const tcase *t, int scenario, int inplace)
{
    int dt = t->dt;
    int is_stats = kind == K_GSTATS;
    int with_sg = kind == K_GAPPLY && g_side;
    int64_t np = t->rows_kind ? t->w : 1;
    size_t cnt = is_stats ? (size_t)(2 * np) : (size_t)t->n;
    size_t es = is_stats ? 8 : esize[dt];
    outbuf ref, got, sref, sgot;
    out_init(&ref, cnt, es);
    out_init(&got, cnt, es);
    out_init(&sref, (size_t)t->n, esize[dt]);
    out_init(&sgot, (size_t)t->n, esize[dt]);
    out_poison(&ref);
    out_poison(&got);
    out_poison(&sref);
    out_poison(&sgot);

    const void *x = t->x, *dy = t->dy, *side_at = NULL;
    if (inplace == 1) {
        memcpy(got.p, kind == K_APPLY ? t->x : t->dy, got.bytes);
        if (kind == K_APPLY) x = got.p;
        else dy = got.p;
        if (with_sg) {
            memcpy(sgot.p, t->x, sgot.bytes);
            x = sgot.p;
        }
    } else if (inplace == 2) {
        memcpy(got.p, kind == K_APPLY ? t->side : t->x, got.bytes);
        if (kind == K_APPLY) side_at = got.p;
        else x = got.p;
        if (with_sg) {
            memcpy(sgot.p, t->dy, sgot.bytes);
            dy = sgot.p;
        }
    }
    call(&cfbn_kernels_scalar, kind, t, t->x, t->dy, ref.p, with_sg ? sref.p : NULL);
    g_side_at = side_at;
    call(k, kind, t, x, dy, got.p, with_sg ? sgot.p : NULL);
    g_side_at = NULL;

    char what[64];
    snprintf(what, sizeof what, "act %d side %d%s", g_act, g_side, inplace == 1 ? " in place" : inplace ? " in place 2" : "");
    int ok = 1;
    if (!out_guards_ok(&got) || !out_guards_ok(&sgot)) ok = report(k, kind, t, scenario, "guard overwritten", -1, 0, 0, 0);
    if (is_stats) {
        const double *r = (const double *)ref.p, *g = (const double *)got.p;
        for (int64_t j = 0; j < np && ok; j++) {
            double b[4] = {0.0, 0.0, 0.0, 0.0};
            int64_t nr = t->rows_kind ? t->rows : t->n, step = t->rows_kind ? t->w : 1;
            for (int64_t q = 0; q < nr; q++) fused_sum_bounds(t, j + q * step, j, b);
            double tol1 = fused_sum_tol(dt, b, 0), tol2 = fused_sum_tol(dt, b, 1);
            if (!(fabs(g[j] - r[j]) <= tol1)) ok = report(k, kind, t, scenario, what, j, g[j], r[j], tol1);
            else if (!(fabs(g[np + j] - r[np + j]) <= tol2))
                ok = report(k, kind, t, scenario, what, np + j, g[np + j], r[np + j], tol2);
        }
    } else {
        for (int64_t i = 0; i < t->n && ok; i++) {
            int64_t j = t->rows_kind ? i % t->w : 0;
            double want = get(dt, ref.p, i), have = get(dt, got.p, i), stol = 0.0;
            double sw = with_sg ? get(dt, sref.p, i) : 0.0;
            double tol = fused_out_tol(t, kind, i, j, want, sw, &stol);
            if (with_sg) {
                double sh = get(dt, sgot.p, i);
                if (!(fabs(sh - sw) <= stol)) ok = report(k, kind, t, scenario, "side_grad", i, sh, sw, stol);
            }
            if (ok && !(fabs(have - want) <= tol)) ok = report(k, kind, t, scenario, what, i, have, want, tol);
        }
    }
    out_free(&ref);
    out_free(&got);
    out_free(&sref);
    out_free(&sgot);
    return tally(ok);
}

/* Several fused runs in one call (*_runs_fused where the table has them):
 * the table under test with runs = R against the scalar table called once
 * per run, as check_runs does for the plain kernels, within check_fused's
 * bounds summed over the runs.  Elements between the runs, of the output
 * and of side_grad, must keep their poison. */
static int check_fused_runs(const cfbn_kernels *k, int kind, const tcase *t, int scenario, int64_t R, int64_t len)
{
    int dt = t->dt;
    int is_stats = kind == K_GSTATS;
    int with_sg = kind == K_GAPPLY && g_side;
    int64_t stride = t->n / R;
    size_t es = esize[dt];
    outbuf ref, got, sref, sgot;
    out_init(&ref, (size_t)t->n, es);
    out_init(&got, (size_t)t->n, es);
    out_init(&sref, (size_t)t->n, es);
    out_init(&sgot, (size_t)t->n, es);
    out_poison(&ref);
    out_poison(&got);
    out_poison(&sref);
    out_poison(&sgot);
    double rs[2] = {0.0, 0.0}, gs[2] = {NAN, NAN}, b[4] = {0.0, 0.0, 0.0, 0.0};
    tcase one = *t;
    one.n = len;
    for (int64_t q = 0; q < R; q++) {
        size_t off = (size_t)(q * stride) * es;
        double part[2];
        g_side_at = g_side ? (const char *)t->side + off : NULL;
        call(&cfbn_kernels_scalar, kind, &one, (const char *)t->x + off, (const char *)t->dy + off,
             is_stats ? (void *)part : (void *)(ref.p + off), with_sg ? (void *)(sref.p + off) : NULL);
        if (is_stats) {
            rs[0] += part[0];
            rs[1] += part[1];
            for (int64_t i = 0; i < len; i++) fused_sum_bounds(t, q * stride + i, 0, b);
        }
    }
    g_side_at = NULL;
    g_runs = R;
    g_stride = stride;
    call(k, kind, &one, t->x, t->dy, is_stats ? (void *)gs : (void *)got.p, with_sg ? sgot.p : NULL);
    g_runs = g_stride = 0;

    char what[64];
    snprintf(what, sizeof what, "runs: act %d side %d", g_act, g_side);
    int ok = 1;
    if (!out_guards_ok(&got) || !out_guards_ok(&sgot))
        ok = report(k, kind, &one, scenario, "runs: guard overwritten", -1, 0, 0, 0);
    if (is_stats) {
        double tol1 = fused_sum_tol(dt, b, 0), tol2 = fused_sum_tol(dt, b, 1);
        if (!(fabs(gs[0] - rs[0]) <= tol1)) ok = report(k, kind, &one, scenario, what, 0, gs[0], rs[0], tol1);
        else if (!(fabs(gs[1] - rs[1]) <= tol2)) ok = report(k, kind, &one, scenario, what, 1, gs[1], rs[1], tol2);
    } else {
        for (int64_t i = 0; i < t->n && ok; i++) {
            double want = get(dt, ref.p, i), have = get(dt, got.p, i);
            double sw = get(dt, sref.p, i), sh = get(dt, sgot.p, i), stol = 0.0;
            if (i % stride >= len || i >= R * stride) {
                if (!isnan(have) || !isnan(sh))
                    ok = report(k, kind, &one, scenario, "runs: wrote outside the runs", i, have, want, 0);
                continue;
            }
            double tol = fused_out_tol(t, kind, i, 0, want, sw, &stol);
            if (with_sg && !(fabs(sh - sw) <= stol))
                ok = report(k, kind, &one, scenario, "runs: side_grad", i, sh, sw, stol);
            if (ok && !(fabs(have - want) <= tol)) ok = report(k, kind, &one, scenario, what, i, have, want, tol);
        }
    }
    out_free(&ref);
    out_free(&got);
    out_free(&sref);
    out_free(&sgot);
    return tally(ok);
}

/* g stored by the fused gradient sums (cfbn.h: g_out), float tables: the
 * sums must be those of the same call without g_out, and g the side_grad of
 * the same table's fused gapply, bit for bit (both form g in one way).  R > 1
 * runs of len elements, t->n / R apart, as check_fused_runs; the elements
 * between them keep their poison (as the gapply's side_grad must). */
static int check_stored_g(const cfbn_kernels *k, const tcase *t, int scenario, int64_t R, int64_t len)
{
    int dt = t->dt;
    size_t es = esize[dt];
    int64_t np = t->rows_kind ? t->w : 1;
    tcase one = *t;
    if (R > 1) one.n = len;
    outbuf g, sg, dx;
    out_init(&g, (size_t)t->n, es);
    out_init(&sg, (size_t)t->n, es);
    out_init(&dx, (size_t)t->n, es);
    out_poison(&g);
    out_poison(&sg);
    out_poison(&dx);
    double *plain = malloc((size_t)(2 * np) * sizeof *plain), *stored = malloc((size_t)(2 * np) * sizeof *stored);
    if (!plain || !stored) exit(2);
    g_runs = R > 1 ? R : 0;
    g_stride = R > 1 ? t->n / R : 0;
    call(k, K_GSTATS, &one, t->x, t->dy, plain, NULL);
    g_gout = g.p;
    call(k, K_GSTATS, &one, t->x, t->dy, stored, NULL);
    g_gout = NULL;
    call(k, K_GAPPLY, &one, t->x, t->dy, dx.p, sg.p);
    g_runs = g_stride = 0;
    int ok = 1;
    if (!out_guards_ok(&g)) ok = report(k, K_GSTATS, &one, scenario, "stored g: guard overwritten", -1, 0, 0, 0);
    else if (memcmp(plain, stored, (size_t)(2 * np) * sizeof *plain) != 0)
        ok = report(k, K_GSTATS, &one, scenario, "stored g: sums changed", -1, 0, 0, 0);
    for (int64_t i = 0; i < t->n && ok; i++) {
        if (memcmp(g.p + (size_t)i * es, sg.p + (size_t)i * es, es) != 0)
            ok = report(k, K_GSTATS, &one, scenario, "stored g against gapply's side_grad", i, get(dt, g.p, i),
                        get(dt, sg.p, i), 0);
    }
    free(plain);
    free(stored);
    out_free(&g);
    out_free(&sg);
    out_free(&dx);
    return tally(ok);
}

/* Rounding to the 2-byte types, bit for bit: every 2-byte pattern x times
 * alpha (mhi = mlo = beta = 0, so the float result is the one rounding of
 * x * alpha + 0 with or without FMA) must be stored as storage.h rounds that
 * float, nan as any nan and a zero of either sign as zero (FMA keeps the
 * sign of a product that underflows; mul then add gives +0). */
static void check_narrowing(const cfbn_kernels *k)
{
    static const float alphas[] = {1.0f, 1.00390625f, 1.0029296875f, 0.3333333f, 1.5f, 0x1p-20f, 0x1p20f, -7.77f};
    const int64_t n = 65536;
    long bad = 0, checks = 0;
    uint16_t *x = malloc((size_t)n * 2), *y = malloc((size_t)(n + 1) * 2);
    if (!x || !y) exit(2);
    for (int64_t i = 0; i < n; i++) x[i] = (uint16_t)i;
    for (int dt = CFBN_F16; dt <= CFBN_BF16; dt++) {
        for (size_t a = 0; a < sizeof alphas / sizeof *alphas; a++) {
            float zero = 0.0f, al = alphas[a];
            cfbn_apply_f32 ap = {&zero, &zero, &al, &zero, 0, CFBN_ACT_NONE, 0.0f, NULL, 0, 0};
            for (int misalign = 0; misalign <= 1; misalign++) {
                uint16_t *out = y + misalign;
                for (int64_t i = 0; i < n; i++) out[i] = 0xffff;
                cfbn_route_apply_f32(k, dt, x, out, n, 1, 1, &ap);
                for (int64_t i = 0; i < n; i++) {
                    float want_f = (float)((double)cfbn_load_float(dt, x, i) * (double)al) + zero;
                    uint16_t want = 0;
                    cfbn_store_float(dt, &want, 0, want_f);
                    float got = cfbn_load_float(dt, out, i), wv = cfbn_load_float(dt, &want, 0);
                    int ok = out[i] == want || (got != got && wv != wv) || (got == 0.0f && wv == 0.0f);
                    checks++;
                    if (!ok && bad++ < 5)
                        printf("FAIL narrowing %s %s: x=0x%04x alpha=%g got 0x%04x want 0x%04x\n", k->name,
                               dname[dt], (unsigned)x[i], (double)al, (unsigned)out[i], (unsigned)want);
                }
            }
        }
    }
    free(x);
    free(y);
    n_pass += checks - bad;
    n_fail += bad;
    printf("kernel_check %s narrowing: %ld checks, %ld failed\n", k->name, checks, bad);
}

/* Whether k has streaming entries.  Only such a table's kernels read the
 * stream hint (bn_scalar.c and bn_neon.c take regular stores, and the
 * router's fallbacks ignore the hint), so only its fused cases are repeated
 * with the hint asked for: for the others the repeat ran the same code. */
static int has_stream_entries(const cfbn_kernels *k)
{
    for (int d = 0; d < N_DTYPES; d++)
        if (stream_entries(k, d)) return 1;
    return 0;
}

static void check_fused_table(const cfbn_kernels *k)
{
    static const int64_t ns[] = {0, 1, 3, 8, 17, 33, 511, 512, 513, 1100};
    static const int64_t rows[] = {1, 3, 33};
    static const int64_t ws[] = {1, 2, 3, 8, 9, 16, 17, 100, 600};
    static const double alphas[CFBN_ACT_COUNT] = {0.0, 0.0, 0.0, 0.2, 1.3, 0.0, 0.0, 0.0};
    const int streams = g_short || !has_stream_entries(k) ? 1 : 2;
    long before_pass = n_pass, before_fail = n_fail;
    for (int dt = 0; dt < N_DTYPES; dt++) {
        /* scenarios 0 and 3 for every kernel; the exponent-range ones (4 to
         * 7), which exist for the sums, for the gradient sums */
        for (int s = 0; s < SCENARIOS; s += s == 0 ? 3 : 1) {
            if (g_short && s != 0 && s != 4) continue;
            for (size_t a = 0; a < sizeof ns / sizeof *ns + sizeof rows / sizeof *rows * (sizeof ws / sizeof *ws); a++) {
                tcase t;
                size_t nn = sizeof ns / sizeof *ns, nw = sizeof ws / sizeof *ws;
                if (a < nn) case_make(&t, dt, 0, ns[a], 1, s);
                else case_make(&t, dt, 1, rows[(a - nn) / nw], ws[(a - nn) % nw], s);
                for (g_act = 0; g_act < CFBN_ACT_COUNT; g_act++) {
                    g_alpha = alphas[g_act];
                    for (g_side = 0; g_side < 2; g_side++) {
                        if (g_act == CFBN_ACT_NONE && !g_side) continue;   /* the plain kernels */
                        /* with and without streaming stores asked for */
                        for (g_stream = 0; g_stream < streams; g_stream++) {
                            for (int kind = K_APPLY; kind <= K_GAPPLY; kind++) {
                                if (s >= 4 && kind != K_GSTATS) continue;
                                check_fused(k, kind, &t, s, 0);
                                if (kind == K_GSTATS && g_act != CFBN_ACT_NONE && dt != CFBN_F64) {
                                    check_stored_g(k, &t, s, 1, 0);
                                    if (a < nn && t.n >= 19) {
                                        check_stored_g(k, &t, s, 3, t.n / 3 - 1);
                                        check_stored_g(k, &t, s, 19, t.n / 19 - 1);
                                    }
                                }
                                if (kind != K_GSTATS) check_fused(k, kind, &t, s, 1);
                                if (kind == K_GAPPLY || (kind == K_APPLY && g_side)) check_fused(k, kind, &t, s, 2);
                                /* several runs per call: long runs with tails, and
                                 * short ones, 8 at a time and the rest */
                                if (a < nn && !g_stream && t.n >= 19) {
                                    check_fused_runs(k, kind, &t, s, 3, t.n / 3 - 1);
                                    check_fused_runs(k, kind, &t, s, 19, t.n / 19);
                                    if (!g_short) check_fused_runs(k, kind, &t, s, 19, t.n / 19 - 1);
                                }
                            }
                        }
                        g_stream = 0;
                    }
                }
                g_act = CFBN_ACT_NONE;
                g_side = 0;
                g_alpha = 0.0;
                case_free(&t);
            }
        }
    }
    printf("kernel_check %s fused activation/side input: %ld passed, %ld failed\n", k->name,
           n_pass - before_pass, n_fail - before_fail);
}

/* Several runs in one call (cfbn.h: runs, stride): the table under test
 * with runs = R against the scalar table called once per run.  A run case's
 * n elements are cut into R runs of `stride` elements of which the first len
 * are processed; the rest must keep their poison. */
static int check_runs(const cfbn_kernels *k, int kind, const tcase *t, int scenario, int64_t R, int64_t len)
{
    int dt = t->dt;
    int is_stats = kind == K_STATS || kind == K_GSTATS;
    int64_t stride = t->n / R;
    size_t es = esize[dt];
    outbuf ref, got;
    out_init(&ref, (size_t)t->n, es);
    out_init(&got, (size_t)t->n, es);
    out_poison(&ref);
    out_poison(&got);
    double rs[2] = {0.0, 0.0}, gs[2] = {NAN, NAN}, m1 = 0.0, m2 = 0.0;
    tcase one = *t;
    one.n = len;
    for (int64_t q = 0; q < R; q++) {
        size_t off = (size_t)(q * stride) * es;
        double part[2];
        call(&cfbn_kernels_scalar, kind, &one, (const char *)t->x + off, (const char *)t->dy + off,
             is_stats ? (void *)part : (void *)(ref.p + off), NULL);
        if (is_stats) {
            rs[0] += part[0];
            rs[1] += part[1];
        }
        for (int64_t i = 0; i < len && kind == K_STATS; i++) {
            double d = get(dt, t->x, q * stride + i) - t->shift[0];
            m1 += fabs(d);
            m2 += d * d;
        }
        for (int64_t i = 0; i < len && kind != K_STATS; i++) {
            double gv = get(dt, t->dy, q * stride + i);
            double d = centered(dt, get(dt, t->x, q * stride + i), pget(t, t->mhi, 0), pget(t, t->mlo, 0));
            m1 += fabs(gv);
            m2 += fabs(gv * d);
        }
    }
    g_runs = R;
    g_stride = stride;
    call(k, kind, &one, t->x, t->dy, is_stats ? (void *)gs : (void *)got.p, NULL);
    g_runs = g_stride = 0;
    int ok = out_guards_ok(&got) ? 1 : report(k, kind, &one, scenario, "runs: guard overwritten", -1, 0, 0, 0);
    if (is_stats) {
        double tol1 = 2e-12 * m1 + 1e-300, tol2 = 2e-12 * m2 + 1e-300;
        if (dt != CFBN_F64) tol1 += 6.0 * FLT_EPSILON * m1, tol2 += 6.0 * FLT_EPSILON * m2;
        if (!(fabs(gs[0] - rs[0]) <= tol1)) ok = report(k, kind, &one, scenario, "runs: sum1", 0, gs[0], rs[0], tol1);
        else if (!(fabs(gs[1] - rs[1]) <= tol2))
            ok = report(k, kind, &one, scenario, "runs: sum2", 0, gs[1], rs[1], tol2);
    } else {
        double eps = dt == CFBN_F64 ? DBL_EPSILON : FLT_EPSILON;
        for (int64_t i = 0; i < t->n && ok; i++) {
            double want = get(dt, ref.p, i), have = get(dt, got.p, i);
            if (i % stride >= len || i >= R * stride) {
                if (!isnan(have)) ok = report(k, kind, &one, scenario, "runs: wrote outside the runs", i, have, want, 0);
                continue;
            }
            double d = centered(dt, get(dt, t->x, i), pget(t, t->mhi, 0), pget(t, t->mlo, 0));
            double mag = kind == K_APPLY ? fabs(d * pget(t, t->pa, 0)) + fabs(pget(t, t->pb, 0))
                                         : fabs(get(dt, t->dy, i) * pget(t, t->pa, 0)) + fabs(d * pget(t, t->pb, 0))
                                               + fabs(pget(t, t->pc, 0));
            double tol = 2.0 * eps * mag + 1e-300;
            tol += storage_ulp(dt, want);
            if (!(fabs(have - want) <= tol)) ok = report(k, kind, &one, scenario, "runs: value", i, have, want, tol);
        }
    }
    out_free(&ref);
    out_free(&got);
    return tally(ok);
}

static void check_case(const cfbn_kernels *k, int dt, int rows_kind, int64_t rows, int64_t w, int scenario)
{
    tcase t;
    case_make(&t, dt, rows_kind, rows, w, scenario);
    for (int kind = 0; kind < 4; kind++) {
        check_one(k, kind, &t, scenario, 0);
        if (kind == K_APPLY || kind == K_GAPPLY) {
            check_one(k, kind, &t, scenario, 1);
            /* the streaming-store hint, on aligned and misaligned outputs
             * (16 bytes past a line only where there are streaming entries) */
            g_stream = 1;
            for (g_misalign = 0; g_misalign <= (has_stream_entries(k) ? 2 : 1); g_misalign++) {
                check_one(k, kind, &t, scenario, 0);
                check_one(k, kind, &t, scenario, 1);
            }
            g_stream = 0;
            g_misalign = 1;
        }
        /* several runs per call: whole, shortened and empty runs */
        if (!rows_kind && t.n >= 3) {
            int64_t stride = t.n / 3;
            check_runs(k, kind, &t, scenario, 3, stride);
            check_runs(k, kind, &t, scenario, 3, stride - 1);
            check_runs(k, kind, &t, scenario, 3, 0);
        }
        /* enough short runs for kernels that take them 8 at a time */
        if (!rows_kind && t.n >= 19) {
            int64_t stride = t.n / 19;
            check_runs(k, kind, &t, scenario, 19, stride);
            check_runs(k, kind, &t, scenario, 19, stride - 1);
        }
    }
    case_free(&t);
}

static void check_table(const cfbn_kernels *k)
{
    static const int64_t ns[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 23, 31, 32, 33, 63, 64, 65, 257, 1000, 4099};
    static const int64_t rows[] = {0, 1, 2, 3, 7, 9, 33};
    static const int64_t ws[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 15, 16, 17, 20, 24, 31, 32, 33, 36, 64, 100, 257, 1000};
    long before_pass = n_pass, before_fail = n_fail;
    for (int dt = 0; dt < N_DTYPES; dt++) {
        for (int s = 0; s < SCENARIOS; s++) {
            for (size_t a = 0; a < sizeof ns / sizeof *ns; a++) check_case(k, dt, 0, ns[a], 1, s);
            for (size_t a = 0; a < sizeof rows / sizeof *rows; a++)
                for (size_t b = 0; b < sizeof ws / sizeof *ws; b++) check_case(k, dt, 1, rows[a], ws[b], s);
        }
    }
    printf("kernel_check %s: %ld passed, %ld failed\n", k->name, n_pass - before_pass, n_fail - before_fail);
}

/* ---- second-order gradient (cfbn_gg_*) ----
 * Every table's ggstats and ggapply through the router (a table without an
 * entry runs the scalar table's) against the scalar table.  ggx is the
 * case's side input; the seven apply parameters a1, b1, c1, a2, b2, c2, e2
 * are drawn per column.
 *   - sums: as the gradient sums (check_one), 2e-12 of the sum of the
 *     terms' magnitudes, plus 6 float ulps of it for the float-compute types
 *     (kernels may sum float blocks, cfbn.h);
 *   - ddy and dx: 4 ulps of the sum of the terms' magnitudes (FMAs against
 *     separate roundings: ddy's at most 2.5 ulps apart, dx's 3.5), plus one
 *     storage ulp (storage_ulp) of the result. */

#define GG_NPAR 7

typedef struct {
    tcase t;
    void *par[GG_NPAR];   /* a1, b1, c1, a2, b2, c2, e2: float or double, w entries */
    region rg[GG_NPAR];
} ggcase;

static void gg_make(ggcase *g, int dt, int rows_kind, int64_t rows, int64_t w, int scenario)
{
    case_make(&g->t, dt, rows_kind, rows, w, scenario);
    int64_t np = rows_kind ? w : 1;
    int pdt = dt == CFBN_F64 ? CFBN_F64 : CFBN_F32;
    for (int k = 0; k < GG_NPAR; k++) {
        g->par[k] = alloc_guarded((size_t)np * esize[pdt], &g->rg[k]);
        /* c1 and e2 are the offsets */
        for (int64_t j = 0; j < np; j++) put(pdt, g->par[k], j, (k == 2 || k == 6 ? 0.1 : 1.0) * rng_normal());
    }
}

static void gg_free(ggcase *g)
{
    for (int k = 0; k < GG_NPAR; k++) free_guarded(&g->rg[k]);
    case_free(&g->t);
}

/* stats: sums to o1; else ddy to o1 and dx to o2.  A run case: runs of n
 * elements, stride apart (runs 1, n the case's for one run). */
static void gg_call_runs(const cfbn_kernels *k, const ggcase *g, int stats, const void *dy, const void *x,
                         const void *q, void *o1, void *o2, int64_t n, int64_t runs, int64_t stride)
{
    const tcase *t = &g->t;
    cfbn_gg_f32 pf = {t->mhi, t->mlo, g->par[0], g->par[1], g->par[2], g->par[3], g->par[4], g->par[5],
                      g->par[6], g_stream, 0, 0};
    cfbn_gg_f64 pd = {t->mhi, t->mlo, g->par[0], g->par[1], g->par[2], g->par[3], g->par[4], g->par[5],
                      g->par[6], g_stream, 0, 0};
    const void *p = t->dt == CFBN_F64 ? (const void *)&pd : &pf;
    if (stats) cfbn_route_ggstats(k, t->dt, dy, x, q, n, t->w, !t->rows_kind, runs, stride, p, o1);
    else cfbn_route_ggapply(k, t->dt, dy, x, q, o1, o2, n, t->w, !t->rows_kind, runs, stride, p);
}

static void gg_call(const cfbn_kernels *k, const ggcase *g, int stats, const void *dy, const void *x, const void *q,
                    void *o1, void *o2)
{
    const tcase *t = &g->t;
    gg_call_runs(k, g, stats, dy, x, q, o1, o2, t->rows_kind ? t->rows : t->n, 1, 0);
}

static int gg_report(const cfbn_kernels *k, const ggcase *g, int scenario, const char *what, int64_t i,
                     double got, double want, double tol)
{
    const tcase *t = &g->t;
    if (n_fail < 40)
        fprintf(stderr, "FAIL %s %s_%s n=%lld rows=%lld w=%lld scenario=%d stream=%d: %s at %lld: got %.17g want "
                "%.17g tol %.3g\n", k->name, t->rows_kind ? "gg_rows" : "gg_run", dname[t->dt], (long long)t->n,
                (long long)t->rows, (long long)t->w, scenario, g_stream, what, (long long)i, got, want, tol);
    return 0;
}

/* Adds the magnitudes of element i's five sum terms (column j's
 * parameters) to m: the base of the sums' tolerance. */
static void gg_sum_mags(const ggcase *g, int64_t i, int64_t j, double *m)
{
    const tcase *t = &g->t;
    double gv = get(t->dt, t->dy, i), qv = get(t->dt, t->side, i);
    double d = centered(t->dt, get(t->dt, t->x, i), pget(t, t->mhi, j), pget(t, t->mlo, j));
    m[0] += fabs(gv);
    m[1] += fabs(gv * d);
    m[2] += fabs(qv);
    m[3] += fabs(qv * d);
    m[4] += fabs(qv * gv);
}

/* The tolerance of output o (0: ddy, 1: dx) at element i (column j's
 * parameters) whose reference value is want. */
static double gg_out_tol(const ggcase *g, int64_t i, int64_t j, int o, double want)
{
    const tcase *t = &g->t;
    int dt = t->dt;
    double gv = get(dt, t->dy, i), qv = get(dt, t->side, i);
    double d = centered(dt, get(dt, t->x, i), pget(t, t->mhi, j), pget(t, t->mlo, j));
    double a[GG_NPAR];
    for (int c = 0; c < GG_NPAR; c++) a[c] = pget(t, g->par[c], j);
    double mag = o ? fabs(gv * a[3]) + fabs(qv * a[4]) + fabs(d * a[5]) + fabs(a[6])
                   : fabs(qv * a[0]) + fabs(d * a[1]) + fabs(a[2]);
    return 4.0 * (dt == CFBN_F64 ? DBL_EPSILON : FLT_EPSILON) * mag + storage_ulp(dt, want) + 1e-300;
}

static int check_ggstats(const cfbn_kernels *k, const ggcase *g, int scenario)
{
    static const char *sname[5] = {"sum g", "sum g d", "sum q", "sum q d", "sum q g"};
    const tcase *t = &g->t;
    int dt = t->dt;
    int64_t np = t->rows_kind ? t->w : 1, nr = t->rows_kind ? t->rows : t->n, step = t->rows_kind ? t->w : 1;
    outbuf ref, got;
    out_init(&ref, (size_t)(5 * np), 8);
    out_init(&got, (size_t)(5 * np), 8);
    out_poison(&ref);
    out_poison(&got);
    gg_call(&cfbn_kernels_scalar, g, 1, t->dy, t->x, t->side, ref.p, NULL);
    gg_call(k, g, 1, t->dy, t->x, t->side, got.p, NULL);
    int ok = out_guards_ok(&got) ? 1 : gg_report(k, g, scenario, "sums: guard overwritten", -1, 0, 0, 0);
    const double *r = (const double *)ref.p, *s = (const double *)got.p;
    double blk = dt != CFBN_F64 ? 6.0 * FLT_EPSILON : 0.0;
    for (int64_t j = 0; j < np && ok; j++) {
        double m[5] = {0.0, 0.0, 0.0, 0.0, 0.0};   /* sums of |terms| */
        for (int64_t e = 0; e < nr; e++) gg_sum_mags(g, j + e * step, j, m);
        for (int q = 0; q < 5 && ok; q++) {
            double tol = (2e-12 + blk) * m[q] + 1e-300, have = s[q * np + j], want = r[q * np + j];
            if (!(fabs(have - want) <= tol)) ok = gg_report(k, g, scenario, sname[q], j, have, want, tol);
        }
    }
    out_free(&ref);
    out_free(&got);
    return tally(ok);
}

/* inplace: 0 separate outputs; 1 ddy is dy's array and dx x's; 2 ddy is
 * ggx's and dx dy's.  mis_ddy, mis_dx: the outputs' misalignment in
 * elements (out_init). */
static int check_ggapply(const cfbn_kernels *k, const ggcase *g, int scenario, int inplace, int mis_ddy, int mis_dx)
{
    const tcase *t = &g->t;
    int dt = t->dt;
    size_t es = esize[dt];
    outbuf ry, rx, oy, ox;
    out_init(&ry, (size_t)t->n, es);
    out_init(&rx, (size_t)t->n, es);
    g_misalign = mis_ddy;
    out_init(&oy, (size_t)t->n, es);
    g_misalign = mis_dx;
    out_init(&ox, (size_t)t->n, es);
    g_misalign = 1;
    out_poison(&ry);
    out_poison(&rx);
    out_poison(&oy);
    out_poison(&ox);
    const void *dy = t->dy, *x = t->x, *q = t->side;
    if (inplace) {
        memcpy(oy.p, inplace == 1 ? t->dy : t->side, oy.bytes);
        memcpy(ox.p, inplace == 1 ? t->x : t->dy, ox.bytes);
        if (inplace == 1) dy = oy.p, x = ox.p;
        else q = oy.p, dy = ox.p;
    }
    gg_call(&cfbn_kernels_scalar, g, 0, t->dy, t->x, t->side, ry.p, rx.p);
    gg_call(k, g, 0, dy, x, q, oy.p, ox.p);
    const char *how = inplace == 1 ? " in place" : inplace ? " in place 2" : "";
    int ok = out_guards_ok(&oy) && out_guards_ok(&ox) ? 1 : gg_report(k, g, scenario, "guard overwritten", -1, 0, 0, 0);
    for (int64_t i = 0; i < t->n && ok; i++) {
        int64_t j = t->rows_kind ? i % t->w : 0;
        const outbuf *want_b[2] = {&ry, &rx}, *have_b[2] = {&oy, &ox};
        for (int o = 0; o < 2 && ok; o++) {
            double want = get(dt, want_b[o]->p, i), have = get(dt, have_b[o]->p, i);
            double tol = gg_out_tol(g, i, j, o, want);
            if (!(have == want || fabs(have - want) <= tol)) {
                char msg[80];
                snprintf(msg, sizeof msg, "%s%s (misaligned %d %d)", o ? "dx" : "ddy", how, mis_ddy, mis_dx);
                ok = gg_report(k, g, scenario, msg, i, have, want, tol);
            }
        }
    }
    out_free(&ry);
    out_free(&rx);
    out_free(&oy);
    out_free(&ox);
    return tally(ok);
}

/* Several runs in one call (gg*_runs where the table has them): R runs of
 * len elements, the case's n elements apart by n / R, against the scalar
 * table called once per run; the sums with check_ggstats's tolerance, the
 * outputs with check_ggapply's, the elements between runs left alone. */
static int check_gg_runs(const cfbn_kernels *k, const ggcase *g, int scenario, int64_t R, int64_t len)
{
    const tcase *t = &g->t;
    int dt = t->dt;
    size_t es = esize[dt];
    int64_t stride = t->n / R;
    outbuf ry, rx, oy, ox;
    out_init(&ry, (size_t)t->n, es);
    out_init(&rx, (size_t)t->n, es);
    out_init(&oy, (size_t)t->n, es);
    out_init(&ox, (size_t)t->n, es);
    out_poison(&ry);
    out_poison(&rx);
    out_poison(&oy);
    out_poison(&ox);
    double want[5] = {0.0, 0.0, 0.0, 0.0, 0.0}, have[5], mag[5] = {0.0, 0.0, 0.0, 0.0, 0.0};
    for (int64_t r = 0; r < R; r++) {
        size_t off = (size_t)(r * stride) * es;
        double part[5];
        gg_call_runs(&cfbn_kernels_scalar, g, 1, (const char *)t->dy + off, (const char *)t->x + off,
                     (const char *)t->side + off, part, NULL, len, 1, 0);
        gg_call_runs(&cfbn_kernels_scalar, g, 0, (const char *)t->dy + off, (const char *)t->x + off,
                     (const char *)t->side + off, ry.p + off, rx.p + off, len, 1, 0);
        for (int j = 0; j < 5; j++) want[j] += part[j];
        for (int64_t e = 0; e < len; e++) gg_sum_mags(g, r * stride + e, 0, mag);
    }
    gg_call_runs(k, g, 1, t->dy, t->x, t->side, have, NULL, len, R, stride);
    gg_call_runs(k, g, 0, t->dy, t->x, t->side, oy.p, ox.p, len, R, stride);
    int ok = out_guards_ok(&oy) && out_guards_ok(&ox) ? 1 : gg_report(k, g, scenario, "runs: guard overwritten",
                                                                      -1, 0, 0, 0);
    double blk = dt != CFBN_F64 ? 6.0 * FLT_EPSILON : 0.0;
    for (int q = 0; q < 5 && ok; q++) {
        double tol = (2e-12 + blk) * mag[q] + 1e-300;
        if (!(fabs(have[q] - want[q]) <= tol)) ok = gg_report(k, g, scenario, "runs: sum", q, have[q], want[q], tol);
    }
    for (int64_t i = 0; i < t->n && ok && scenario < 4; i++) {
        const outbuf *want_b[2] = {&ry, &rx}, *have_b[2] = {&oy, &ox};
        if (i % stride >= len || i >= R * stride) {
            for (int o = 0; o < 2; o++)
                if (!isnan(get(dt, have_b[o]->p, i)))
                    ok = gg_report(k, g, scenario, "runs: wrote outside the runs", i, get(dt, have_b[o]->p, i), 0, 0);
            continue;
        }
        for (int o = 0; o < 2 && ok; o++) {
            double w = get(dt, want_b[o]->p, i), h = get(dt, have_b[o]->p, i);
            double tol = gg_out_tol(g, i, 0, o, w);
            if (!(h == w || fabs(h - w) <= tol)) ok = gg_report(k, g, scenario, o ? "runs: dx" : "runs: ddy", i, h, w, tol);
        }
    }
    out_free(&ry);
    out_free(&rx);
    out_free(&oy);
    out_free(&ox);
    return tally(ok);
}

static void check_gg_case(const cfbn_kernels *k, int dt, int rows_kind, int64_t rows, int64_t w, int scenario)
{
    ggcase g;
    gg_make(&g, dt, rows_kind, rows, w, scenario);
    check_ggstats(k, &g, scenario);
    /* several runs per call: whole, shortened and empty runs; 8 runs, and
     * enough for kernels that take them 8 at a time with runs left over */
    if (!rows_kind && g.t.n >= 3) {
        int64_t st = g.t.n / 3;
        check_gg_runs(k, &g, scenario, 3, st);
        check_gg_runs(k, &g, scenario, 3, st - 1);
        check_gg_runs(k, &g, scenario, 3, 0);
    }
    if (!rows_kind && g.t.n >= 16) {
        check_gg_runs(k, &g, scenario, 8, g.t.n / 8);
        check_gg_runs(k, &g, scenario, 8, g.t.n / 8 - 1);
    }
    if (!rows_kind && g.t.n >= 19) {
        int64_t st = g.t.n / 19;
        check_gg_runs(k, &g, scenario, 19, st);
        check_gg_runs(k, &g, scenario, 19, st - 1);
    }
    /* the exponent-range scenarios (4 to 7) exist for the sums */
    if (scenario < 4) {
        for (int inplace = 0; inplace <= 2; inplace++) check_ggapply(k, &g, scenario, inplace, 1, 1);
        /* the streaming hint: outputs aligned, misaligned alike, and apart */
        g_stream = 1;
        for (int m = 0; m < 4; m++) check_ggapply(k, &g, scenario, 0, m & 1, m >> 1);
        g_stream = 0;
    }
    gg_free(&g);
}

static void check_gg_table(const cfbn_kernels *k)
{
    static const int64_t ns[] = {0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 49, 57, 63, 64, 100, 127, 200, 1000};
    static const int64_t rows[] = {0, 1, 2, 3, 4, 5, 64};
    static const int64_t ws[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 24, 64, 72, 1024, 1032};
    long before_pass = n_pass, before_fail = n_fail;
    for (int dt = 0; dt < N_DTYPES; dt++) {
        for (int s = 0; s < SCENARIOS; s++) {
            /* short: random data, a large mean and one end of the exponent range */
            if (g_short && s != 0 && s != 1 && s != 4) continue;
            for (size_t a = 0; a < sizeof ns / sizeof *ns; a++) check_gg_case(k, dt, 0, ns[a], 1, s);
            for (size_t a = 0; a < sizeof rows / sizeof *rows; a++)
                for (size_t b = 0; b < sizeof ws / sizeof *ws; b++) check_gg_case(k, dt, 1, rows[a], ws[b], s);
        }
    }
    printf("kernel_check %s second-order gradient: %ld passed, %ld failed\n", k->name, n_pass - before_pass,
           n_fail - before_fail);
}

/* A copy of k without its optional entries, named "<name>-plain": the
 * routing layer's fallbacks over k's plain kernels (and the scalar table's
 * second-order entries). */
static cfbn_kernels plain_only(const cfbn_kernels *k, char *name, size_t len)
{
    cfbn_kernels b = *k;
    snprintf(name, len, "%s-plain", k->name);
    b.name = name;
    cfbn_float_kernels *fl[] = {&b.f32, &b.f16, &b.bf16};
    for (int i = 0; i < 3; i++) {
        cfbn_float_kernels *o = fl[i];
        o->apply_runs = NULL; o->gstats_runs = NULL; o->gapply_runs = NULL; o->stats_runs = NULL;
        o->apply_run_stream = NULL; o->apply_rows_stream = NULL;
        o->gapply_run_stream = NULL; o->gapply_rows_stream = NULL;
        o->apply_run_fused = NULL; o->apply_rows_fused = NULL; o->gstats_run_fused = NULL;
        o->gstats_rows_fused = NULL; o->gapply_run_fused = NULL; o->gapply_rows_fused = NULL;
        o->apply_runs_fused = NULL; o->gstats_runs_fused = NULL; o->gapply_runs_fused = NULL;
        o->ggstats_run = NULL; o->ggstats_rows = NULL; o->ggapply_run = NULL; o->ggapply_rows = NULL;
        o->ggstats_runs = NULL; o->ggapply_runs = NULL;
    }
    cfbn_double_kernels *d = &b.f64;
    d->apply_runs = NULL; d->gstats_runs = NULL; d->gapply_runs = NULL;
    d->apply_run_stream = NULL; d->apply_rows_stream = NULL;
    d->gapply_run_stream = NULL; d->gapply_rows_stream = NULL;
    d->apply_run_fused = NULL; d->apply_rows_fused = NULL; d->gstats_run_fused = NULL;
    d->gstats_rows_fused = NULL; d->gapply_run_fused = NULL; d->gapply_rows_fused = NULL;
    d->apply_runs_fused = NULL; d->gstats_runs_fused = NULL; d->gapply_runs_fused = NULL;
    d->ggstats_run = NULL; d->ggstats_rows = NULL; d->ggapply_run = NULL; d->ggapply_rows = NULL;
    d->ggstats_runs = NULL; d->ggapply_runs = NULL;
    return b;
}

/* Every entry of k through the routing layer, then its plain entries alone
 * (the fallbacks). */
static void check_all(const cfbn_kernels *k)
{
    char name[64];
    print_entries(k);
    check_narrowing(k);
    check_table(k);
    check_gg_table(k);
    check_fused_table(k);
    cfbn_kernels b = plain_only(k, name, sizeof name);
    if (!g_short) {
        check_table(&b);
        check_gg_table(&b);
    }
    check_fused_table(&b);
}

int main(void)
{
    g_short = getenv("KERNEL_CHECK_SHORT") != NULL;
    /* the scalar table's fused entries against the float64 formulas, and its
     * plain entries under the fallbacks */
    char name[64];
    print_entries(&cfbn_kernels_scalar);
    check_narrowing(&cfbn_kernels_scalar);
    check_fused_table(&cfbn_kernels_scalar);
    cfbn_kernels sb = plain_only(&cfbn_kernels_scalar, name, sizeof name);
    check_fused_table(&sb);
    int tested = 0;
#if defined(CFBN_HAVE_AVX2)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
        check_all(&cfbn_kernels_avx2);
        tested++;
    } else {
        printf("kernel_check avx2: skipped, this CPU lacks AVX2/FMA/F16C\n");
    }
#endif
#if defined(CFBN_HAVE_NEON)
    check_all(&cfbn_kernels_neon);
    tested++;
#endif
#if defined(CFBN_HAVE_AVX512)
    /* bn_avx512.c with the real intrinsics (run.sh runs it only where the
     * CPU has AVX-512) or through SIMDe's emulation of them */
    check_all(&cfbn_kernels_avx512);
    tested++;
#endif
#if defined(CFBN_HAVE_LANES)
    check_all(&cfbn_kernels_lanes);
    tested++;
#endif
    if (!tested) {
        check_table(&cfbn_kernels_scalar);
        check_gg_table(&cfbn_kernels_scalar);
    }
    return n_fail != 0;
}
