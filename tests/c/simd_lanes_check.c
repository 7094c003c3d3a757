/* The loops of csrc/bn_simd.c, which every ISA compiles over its own
 * primitives, at lane counts the build machine's CPU may not have:
 * vec_portable.h (the primitives in portable C, -DLANES doubles a vector)
 * stands in for vec_<isa>.h, and each entry is compared with the scalar
 * table on random data, for lengths and widths that leave every tail, with guard elements after each output that must
 * stay untouched.  run.sh builds it with LANES = 2, 4, 8 and 16 (NEON,
 * AVX2, AVX-512 and wider float64 vectors).
 *
 *   sums:    1e-12 of the sum of the terms' magnitudes (summation order)
 *   outputs: 4 ulps of the sum of the terms' magnitudes (FMA contraction)
 *
 * Exit status 0 when every check passes. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cfbn.h"
#include "vec_portable.h"

#include "bn_simd.c"

#define GUARD 24
#define MAXN 700
static long n_pass, n_fail;

static double rnd(void) { return (double)rand() / RAND_MAX * 4.0 - 1.5; }

static void fill(double *p, int64_t n) { for (int64_t i = 0; i < n; i++) p[i] = rnd(); }

static void check(int ok, const char *what, int64_t n, int64_t w, int64_t i, double got, double want)
{
    if (ok) { n_pass++; return; }
    if (n_fail++ < 20)
        printf("FAIL lanes %d %s n=%lld w=%lld at %lld: got %.17g want %.17g\n", LANES, what, (long long)n,
               (long long)w, (long long)i, got, want);
}

static int close_to(double got, double want, double mag, double rel)
{
    return fabs(got - want) <= rel * mag || (got == want);
}

/* one call of each entry on rows x w elements (w == 0: one run of rows) */
static void check_shape(int64_t rows, int64_t w)
{
    const cfbn_double_kernels *s = &cfbn_kernels_scalar.f64;
    int run = w == 0;
    int64_t cols = run ? 1 : w, n = run ? rows : rows * w;
    static double x[MAXN * 8], dy[MAXN * 8], out[MAXN * 8 + GUARD], ref[MAXN * 8], acc[128], racc[128];
    static double par[8][64];
    fill(x, n);
    fill(dy, n);
    for (int k = 0; k < 8; k++) fill(par[k], cols);
    double shift[64];
    memcpy(shift, par[0], sizeof shift);
    const cfbn_apply_f64 ap = { par[0], par[1], par[2], par[3], 0, CFBN_ACT_NONE, 0.0, NULL, 1, 0 };
    const cfbn_grad_f64 gp = { par[0], par[1], par[2], par[3], par[4], 0, CFBN_ACT_NONE, 0.0, NULL, NULL, NULL, NULL, 1, 0 };

    /* sums: stats, gstats */
    for (int kind = 0; kind < 2; kind++) {
        for (int64_t j = 0; j < 2 * cols + GUARD; j++) acc[j] = racc[j] = NAN;
        if (kind == 0) {
            if (run) { stats_run_f64(x, n, shift[0], acc); s->stats_run(x, n, shift[0], racc); }
            else { stats_rows_f64(x, rows, w, shift, acc); s->stats_rows(x, rows, w, shift, racc); }
        } else {
            if (run) { gstats_run_f64(dy, x, n, &gp, acc); s->gstats_run(dy, x, n, &gp, racc); }
            else { gstats_rows_f64(dy, x, rows, w, &gp, acc); s->gstats_rows(dy, x, rows, w, &gp, racc); }
        }
        for (int64_t j = 0; j < 2 * cols; j++) {
            double mag = 0.0;
            for (int64_t r = 0; r < rows; r++) {
                int64_t i = run ? r : r * w + j % cols;
                double d = fabs(x[i]) + fabs(par[0][j % cols]) + fabs(par[1][j % cols]) + 1.0;
                mag += kind == 0 ? d * d : fabs(dy[i]) * d;
            }
            check(close_to(acc[j], racc[j], mag, 1e-12), kind ? "gstats" : "stats", n, w, j, acc[j], racc[j]);
        }
        for (int64_t j = 2 * cols; j < 2 * cols + GUARD; j++) check(isnan(acc[j]), "sums guard", n, w, j, acc[j], NAN);
    }
    /* elementwise: apply, gapply */
    for (int kind = 0; kind < 2; kind++) {
        for (int64_t i = 0; i < n + GUARD; i++) out[i] = NAN;
        if (kind == 0) {
            if (run) { apply_run_f64(x, out, n, &ap); s->apply_run(x, ref, n, &ap); }
            else { apply_rows_f64(x, out, rows, w, &ap); s->apply_rows(x, ref, rows, w, &ap); }
        } else {
            if (run) { gapply_run_f64(dy, x, out, n, &gp); s->gapply_run(dy, x, ref, n, &gp); }
            else { gapply_rows_f64(dy, x, out, rows, w, &gp); s->gapply_rows(dy, x, ref, rows, w, &gp); }
        }
        for (int64_t i = 0; i < n; i++) {
            int64_t j = run ? 0 : i % w;
            double d = fabs(x[i]) + fabs(par[0][j]) + fabs(par[1][j]);
            double mag = kind == 0 ? d * fabs(par[2][j]) + fabs(par[3][j])
                                   : fabs(dy[i] * par[2][j]) + d * fabs(par[3][j]) + fabs(par[4][j]);
            check(close_to(out[i], ref[i], mag, 4 * 0x1p-52), kind ? "gapply" : "apply", n, w, i, out[i], ref[i]);
        }
        for (int64_t i = n; i < n + GUARD; i++) check(isnan(out[i]), "output guard", n, w, i, out[i], NAN);
    }
}

int main(void)
{
    srand(41);
    for (int64_t n = 0; n <= MAXN; n += n < 70 ? 1 : 37) check_shape(n, 0);
    for (int64_t w = 1; w <= 40; w++)
        for (int64_t rows = 0; rows <= 9; rows++) check_shape(rows, w);
    check_shape(MAXN, 8);
    printf("simd_lanes_check lanes %d: %ld passed, %ld failed\n", LANES, n_pass, n_fail);
    return n_fail != 0;
}
