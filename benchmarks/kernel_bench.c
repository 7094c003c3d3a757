/* Single-thread throughput of a few kernels against memcpy, in GB/s of bytes
 * read plus written.  Usage: kernel_bench [n_elements] [repeats]. */
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

/* best of `reps` runs of `what` (an index below), GB/s */
static double bench(const cfbn_kernels *k, int what, float *x, float *dy, float *y, int64_t n, int reps)
{
    float one = 1.0f, zero = 0.0f, mlo = 1e-3f, b = 0.5f;
    float cols[256];
    double shifts[256];
    for (int j = 0; j < 256; j++) cols[j] = 1.0f, shifts[j] = 0.25;
    cfbn_apply_f32 ap = {&b, &mlo, &one, &zero, 0, 0, 0.0f, NULL, 0, 0};
    cfbn_apply_f32 apr = {cols, cols, cols, cols, 0, 0, 0.0f, NULL, 0, 0};
    cfbn_grad_f32 gp = {&b, &mlo, &one, &b, &zero, 0, 0, 0.0f, NULL, NULL, NULL, NULL, 0, 0};
    double acc[512];
    double best = 1e30, bytes = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        switch (what) {
        case 0: memcpy(y, x, (size_t)n * 4); bytes = 8.0 * (double)n; break;
        case 1: k->f32.apply_run(x, y, n, &ap); bytes = 8.0 * (double)n; break;
        case 2: k->f32.stats_run(x, n, 0.25, acc); bytes = 4.0 * (double)n; break;
        case 3: k->f32.gstats_run(dy, x, n, &gp, acc); bytes = 8.0 * (double)n; break;
        case 4: k->f32.gapply_run(dy, x, y, n, &gp); bytes = 12.0 * (double)n; break;
        case 5: k->f32.apply_rows(x, y, n / 64, 64, &apr); bytes = 8.0 * (double)n; break;
        case 6: k->f32.stats_rows(x, n / 64, 64, shifts, acc); bytes = 4.0 * (double)n; break;
        default: k->f32.stats_rows(x, n / 24, 24, shifts, acc); bytes = 4.0 * (double)n; break;
        }
        double t = now() - t0;
        if (t < best) best = t;
        sink += acc[0];
    }
    return bytes / best * 1e-9;
}

int main(int argc, char **argv)
{
    int64_t n = argc > 1 ? atoll(argv[1]) : 1 << 20;
    int reps = argc > 2 ? atoi(argv[2]) : 50;
    float *x = malloc((size_t)n * 4), *dy = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(i % 1000) * 1e-3f, dy[i] = 0.5f, y[i] = 0.0f;
    static const char *names[] = {"memcpy", "apply_run", "stats_run", "gstats_run", "gapply_run",
                                  "apply_rows w=64", "stats_rows w=64", "stats_rows w=24"};
    const cfbn_kernels *tables[3] = {&cfbn_kernels_scalar, NULL, NULL};
#if defined(CFBN_HAVE_AVX2)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        tables[1] = &cfbn_kernels_avx2;
#endif
#if defined(CFBN_HAVE_NEON)
    tables[1] = &cfbn_kernels_neon;
#endif
    printf("n = %lld float32, best of %d, GB/s (bytes read + written)\n", (long long)n, reps);
    for (int what = 0; what < 8; what++) {
        printf("%-18s", names[what]);
        for (int t = 0; t < 3 && tables[t]; t++) printf("  %s %7.2f", tables[t]->name, bench(tables[t], what, x, dy, y, n, reps));
        printf("\n");
    }
    free(x);
    free(dy);
    free(y);
    return 0;
}
