/* Times a few kernel-table entries single-threaded on an in-cache size, in
 * ns per element, to check the direction of benchmarks/mca_loops.py's
 * static estimates against a real core.  Prints "entry ns_per_element"
 * lines that `mca_loops.py --timings FILE` reads.
 *
 * Build it against the very code mca_loops.py analysed (its --save-asm
 * output), with the scalar table and the router as tests/c/run.sh does:
 *
 *   python3 benchmarks/mca_loops.py avx2 --save-asm /tmp/bn_avx2.s --json /tmp/avx2.json
 *   gcc -c /tmp/bn_avx2.s -o /tmp/bn_avx2.o
 *   gcc -O2 -Icsrc -DCFBN_HAVE_AVX2 benchmarks/mca_timer.c csrc/bn_scalar.c csrc/bn_route.c \
 *       /tmp/bn_avx2.o -lm -o /tmp/mca_timer
 *   /tmp/mca_timer [n_elements] [samples] > /tmp/timings.txt
 *
 * Each sample times enough back-to-back calls to last about 50 us; the best
 * sample counts, because on a shared machine noise only ever adds time.
 * n defaults to 1024: llvm-mca assumes every access hits L1, and at 1024
 * elements the widest case here (gapply_run_f64: three 8 KiB arrays;
 * ggapply_run_f32: five 4 KiB) still fits a 32 KiB L1D; at 4096 the f64
 * entries already stream from L2.  The per-call setup is then a few
 * percent of a call. */
#define _DEFAULT_SOURCE   /* clock_gettime under -std=c11 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cfbn.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static volatile double sink;

enum { STATS, APPLY, GSTATS, GAPPLY, GGSTATS, GGAPPLY };

typedef struct {
    const char *name;   /* the entry's symbol, as mca_loops.py names it */
    int dtype;          /* enum cfbn_dtype */
    int kind;
} entry;

static const entry ENTRIES[] = {
    {"stats_run_f32", CFBN_F32, STATS},     {"apply_run_f32", CFBN_F32, APPLY},
    {"gstats_run_f32", CFBN_F32, GSTATS},   {"gapply_run_f32", CFBN_F32, GAPPLY},
    {"ggstats_run_f32", CFBN_F32, GGSTATS}, {"ggapply_run_f32", CFBN_F32, GGAPPLY},
    {"stats_run_f16", CFBN_F16, STATS},     {"apply_run_f16", CFBN_F16, APPLY},
    {"gapply_run_f16", CFBN_F16, GAPPLY},   {"stats_run_bf16", CFBN_BF16, STATS},
    {"apply_run_bf16", CFBN_BF16, APPLY},   {"gapply_run_bf16", CFBN_BF16, GAPPLY},
    {"stats_run_f64", CFBN_F64, STATS},     {"apply_run_f64", CFBN_F64, APPLY},
    {"gapply_run_f64", CFBN_F64, GAPPLY},
};

typedef struct {
    const void *x, *dy, *ggx;
    void *y, *dx;
    int64_t n;
} buffers;

static void call(const cfbn_kernels *k, const entry *e, const buffers *b, double *acc)
{
    static const float fm = 0.25f, fl = 1e-3f, fa = 0.75f, fb = 0.5f;
    static const double dm = 0.25, dl = 1e-3, da = 0.75, db = 0.5;
    if (e->dtype == CFBN_F64) {
        const cfbn_double_kernels *t = &k->f64;
        cfbn_apply_f64 ap = {&dm, &dl, &da, &db, 0, 0, 0.0, NULL, 0, 0};
        cfbn_grad_f64 gp = {&dm, &dl, &da, &db, &dl, 0, 0, 0.0, NULL, NULL, NULL, NULL, 0, 0};
        switch (e->kind) {
        case STATS: t->stats_run(b->x, b->n, 0.25, acc); break;
        case APPLY: t->apply_run(b->x, b->y, b->n, &ap); break;
        case GAPPLY: t->gapply_run(b->dy, b->x, b->dx, b->n, &gp); break;
        default: break;
        }
        return;
    }
    const cfbn_float_kernels *t = e->dtype == CFBN_F32 ? &k->f32 : e->dtype == CFBN_F16 ? &k->f16 : &k->bf16;
    cfbn_apply_f32 ap = {&fm, &fl, &fa, &fb, 0, 0, 0.0f, NULL, 0, 0};
    cfbn_grad_f32 gp = {&fm, &fl, &fa, &fb, &fl, 0, 0, 0.0f, NULL, NULL, NULL, NULL, 0, 0, NULL};
    cfbn_gg_f32 gg = {&fm, &fl, &fa, &fb, &fl, &fa, &fb, &fl, &fl, 0, 0, 0};
    switch (e->kind) {
    case STATS: t->stats_run(b->x, b->n, 0.25, acc); break;
    case APPLY: t->apply_run(b->x, b->y, b->n, &ap); break;
    case GSTATS: t->gstats_run(b->dy, b->x, b->n, &gp, acc); break;
    case GAPPLY: t->gapply_run(b->dy, b->x, b->dx, b->n, &gp); break;
    case GGSTATS: t->ggstats_run(b->dy, b->x, b->ggx, b->n, &gg, acc); break;
    case GGAPPLY: t->ggapply_run(b->dy, b->x, b->ggx, b->y, b->dx, b->n, &gg); break;
    }
}

/* Finite values of modest size in each storage type, so that no entry
 * takes a NaN or overflow path. */
static void fill(void *p, int dtype, int64_t n, int seed)
{
    for (int64_t i = 0; i < n; i++) {
        double v = 0.5 + 1e-3 * (double)((i * 7 + seed) % 1000);
        switch (dtype) {
        case CFBN_F64: ((double *)p)[i] = v; break;
        case CFBN_F32: ((float *)p)[i] = (float)v; break;
        case CFBN_F16: ((uint16_t *)p)[i] = (uint16_t)(0x3800 + (i * 7 + seed) % 1000); break;
        default: {
            float f = (float)v;
            uint32_t u;
            memcpy(&u, &f, 4);
            ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
        }
        }
    }
}

static size_t element_size(int dtype)
{
    return dtype == CFBN_F64 ? 8 : dtype == CFBN_F32 ? 4 : 2;
}

int main(int argc, char **argv)
{
    int64_t n = argc > 1 ? atoll(argv[1]) : 1024;
    int samples = argc > 2 ? atoi(argv[2]) : 2000;
    const cfbn_kernels *k = NULL;
#if defined(CFBN_HAVE_AVX2)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        k = &cfbn_kernels_avx2;
#endif
#if defined(CFBN_HAVE_NEON)
    k = &cfbn_kernels_neon;
#endif
    if (!k) {
        fprintf(stderr, "mca_timer: no vector table in this build or on this CPU\n");
        return 1;
    }
    size_t bytes = (size_t)n * 8 + 64;
    void *mem[5];
    for (int i = 0; i < 5; i++)
        if (!(mem[i] = aligned_alloc(64, (bytes + 63) / 64 * 64))) return 1;
    printf("# %s table, n = %lld, best of %d samples of ~50 us, single thread, ns per element\n", k->name,
           (long long)n, samples);
    double acc[16] = {0};
    for (size_t i = 0; i < sizeof ENTRIES / sizeof ENTRIES[0]; i++) {
        const entry *e = &ENTRIES[i];
        fill(mem[0], e->dtype, n, 1);
        fill(mem[1], e->dtype, n, 2);
        fill(mem[2], e->dtype, n, 3);
        memset(mem[3], 0, (size_t)n * element_size(e->dtype));
        memset(mem[4], 0, (size_t)n * element_size(e->dtype));
        buffers b = {mem[0], mem[1], mem[2], mem[3], mem[4], n};
        /* calls per sample: about 50 us worth, from a first estimate */
        double t0 = now();
        for (int r = 0; r < 100; r++) call(k, e, &b, acc);
        double per_call = (now() - t0) / 100.0;
        int calls = per_call > 0 ? (int)(50e-6 / per_call) + 1 : 1000;
        double best = 1e30;
        for (int s = 0; s < samples; s++) {
            t0 = now();
            for (int r = 0; r < calls; r++) call(k, e, &b, acc);
            double t = (now() - t0) / calls;
            if (t < best) best = t;
            sink += acc[0];
        }
        printf("%-20s %.4f\n", e->name, best * 1e9 / (double)n);
        fflush(stdout);
    }
    for (int i = 0; i < 5; i++) free(mem[i]);
    return 0;
}
