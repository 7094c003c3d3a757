/* Two builds of the AVX2 table timed side by side in one process: the
 * fused and plain float32 entries, one thread, each cell's calls alternating
 * between the builds batch by batch, the order flipping every repeat; a
 * ratio is the median over 9 repeats of new time / old time.  Built and run
 * by benchmarks/table_ab.sh, which compiles the old table from a git
 * revision with its symbol renamed to old_kernels.
 *
 * Cells: six entries (apply, gstats, gapply; run and rows, rows at widths 64
 * and 24), each plain, with a side input alone, with relu, relu6, leaky
 * relu, elu and silu, and with relu and a side input; at 24K elements (in
 * L2) and 8M (DRAM), and, for 8M, with non-temporal stores asked for, as
 * the driver asks for them at that size. */
#define _DEFAULT_SOURCE   /* clock_gettime under -std=c11 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cfbn.h"

extern const cfbn_kernels old_kernels;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float *X, *DY, *Y, *S, *SG;
static double acc[4096];
static float cols[4096], colb[4096], ya[4096], yb[4096];

static void call(const cfbn_kernels *k, int e, int act, int side, int stream, int64_t n, int64_t w)
{
    const int fused = act || side;
    cfbn_apply_f32 ap = {cols, colb, cols, colb, stream, act, 0.1f, side ? S : NULL, 0, 0};
    cfbn_grad_f32 gp = {cols, colb, cols, colb, cols, stream, act, 0.1f, ya, yb,
                        side ? S : NULL, side ? SG : NULL, 0, 0, NULL};
    const cfbn_float_kernels *f = &k->f32;
    switch (e) {
    case 0: (fused ? f->apply_run_fused : stream ? f->apply_run_stream : f->apply_run)(X, Y, n, &ap); break;
    case 1: (fused ? f->apply_rows_fused : stream ? f->apply_rows_stream : f->apply_rows)(X, Y, n / w, w, &ap); break;
    case 2: (fused ? f->gstats_run_fused : f->gstats_run)(DY, X, n, &gp, acc); break;
    case 3: (fused ? f->gstats_rows_fused : f->gstats_rows)(DY, X, n / w, w, &gp, acc); break;
    case 4: (fused ? f->gapply_run_fused : stream ? f->gapply_run_stream : f->gapply_run)(DY, X, Y, n, &gp); break;
    default:
        (fused ? f->gapply_rows_fused : stream ? f->gapply_rows_stream : f->gapply_rows)(DY, X, Y, n / w, w, &gp);
        break;
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : NULL;   /* one entry's cells, e.g. gstats_run */
    const int64_t N = 8 << 20;
    float **bufs[] = {&X, &DY, &Y, &S, &SG};
    for (int b = 0; b < 5; b++) *bufs[b] = aligned_alloc(64, (size_t)N * sizeof(float));
    for (int64_t i = 0; i < N; i++) {
        X[i] = (float)((i * 7919) % 1000) / 250.0f - 2.0f;
        DY[i] = (float)((i * 104729) % 997) / 500.0f - 1.0f;
        S[i] = 0.1f * X[i];
    }
    for (int j = 0; j < 4096; j++) {
        cols[j] = 0.5f + 0.001f * (float)j;
        colb[j] = 0.01f * (float)(j % 7);
        ya[j] = 1.1f;
        yb[j] = 0.2f;
    }
    static const char *entries[] = {"apply_run", "apply_rows", "gstats_run", "gstats_rows", "gapply_run",
                                    "gapply_rows"};
    int known = !only;
    for (int e = 0; e < 6; e++) known |= only && !strcmp(only, entries[e]);
    if (!known) {
        fprintf(stderr, "table_ab: no entry %s (apply_run, apply_rows, gstats_run, gstats_rows, gapply_run, "
                        "gapply_rows)\n", only);
        return 2;
    }
    static const struct {
        const char *name;
        int act, side;
    } variants[] = {{"plain", CFBN_ACT_NONE, 0}, {"side", CFBN_ACT_NONE, 1}, {"relu", CFBN_ACT_RELU, 0},
                    {"relu6", CFBN_ACT_RELU6, 0}, {"leaky", CFBN_ACT_LEAKY_RELU, 0}, {"elu", CFBN_ACT_ELU, 0},
                    {"silu", CFBN_ACT_SILU, 0}, {"relu+side", CFBN_ACT_RELU, 1}};
    static const struct {
        const char *name;
        int64_t n;
        int stream, inner;
    } sizes[] = {{"L2", 24 * 1024, 0, 300}, {"DRAM", 8 << 20, 0, 3}, {"DRAM-nt", 8 << 20, 1, 3}};
    /* the second width: 24, or another (isa_ab.sh gives 48, the driver's
     * widening of 24 channels to AVX-512's 16 lanes) */
#ifndef TABLE_AB_WIDTH2
#define TABLE_AB_WIDTH2 24
#endif
    static const int64_t widths[] = {64, TABLE_AB_WIDTH2};
    const int nv = (int)(sizeof variants / sizeof variants[0]);
    printf("new/old, median of 9, one thread, float32\n");
    double logsum = 0;
    int cells = 0;
    for (int si = 0; si < 3; si++)
        for (int e = 0; e < 6; e++)
            for (int v = 0; v < nv && (!only || !strcmp(only, entries[e])); v++)
                for (int wi = 0; wi < ((e & 1) ? 2 : 1); wi++) {
                    const int64_t w = widths[wi], n = sizes[si].n / w * w;
                    const int act = variants[v].act, side = variants[v].side, st = sizes[si].stream;
                    double r[9];
                    for (int rep = 0; rep < 9; rep++) {
                        double t[2];
                        for (int o = 0; o < 2; o++) {
                            const int is_new = (o + rep) & 1;
                            const cfbn_kernels *k = is_new ? &cfbn_kernels_avx2 : &old_kernels;
                            call(k, e, act, side, st, n, w);
                            double t0 = now();
                            for (int i = 0; i < sizes[si].inner; i++) call(k, e, act, side, st, n, w);
                            t[is_new] = now() - t0;
                        }
                        r[rep] = t[1] / t[0];
                    }
                    qsort(r, 9, sizeof r[0], cmp_double);
                    printf("%-8s %-11s w=%-3d %-10s %.3f\n", sizes[si].name, entries[e], (e & 1) ? (int)w : 0,
                           variants[v].name, r[4]);
                    logsum += log(r[4]);
                    cells++;
                }
    printf("geometric mean %.3f over %d cells\n", exp(logsum / cells), cells);
    return 0;
}
