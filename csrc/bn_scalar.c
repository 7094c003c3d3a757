/* Portable reference kernels: plain C, one element at a time.  Every SIMD
 * table is tested against these.  Baseline flags only.  A fused activation
 * or side input runs through bn_fuse.h's blocks with bn_act.h's libm
 * formulas. */
#include "bn_fuse.h"
#include "cfbn.h"
#include "bn_runs.h"
#include "half.h"

/* defined at the end: the fused paths call back into the plain kernels */
static const fuse_ops_f32 ops_f32;
static const fuse_ops_f64 ops_f64;

/* ---- float32 ---- */

static void stats_run_f32(const float *x, int64_t n, double shift, double *acc)
{
    double s1 = 0.0, s2 = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)x[i] - shift;
        s1 += d;
        s2 += d * d;
    }
    acc[0] = s1;
    acc[1] = s2;
}

static void stats_rows_f32(const float *x, int64_t rows, int64_t w, const double *shift, double *acc)
{
    for (int64_t j = 0; j < 2 * w; j++) acc[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * w;
        for (int64_t j = 0; j < w; j++) {
            double d = (double)row[j] - shift[j];
            acc[j] += d;
            acc[w + j] += d * d;
        }
    }
}

static void apply_run_f32(const float *x, float *y, int64_t n, const cfbn_apply_f32 *p)
{
    if (runs_apply_f32(apply_run_f32, x, y, n, p)) return;
    if (fuse_apply_on_f32(p)) {
        fuse_apply_f32(&ops_f32, x, y, 1, n, 1, p, 0);
        return;
    }
    const float mhi = p->mhi[0], mlo = p->mlo[0], a = p->alpha[0], b = p->beta[0];
    for (int64_t i = 0; i < n; i++) y[i] = ((x[i] - mhi) - mlo) * a + b;
}

static void apply_rows_f32(const float *x, float *y, int64_t rows, int64_t w, const cfbn_apply_f32 *p)
{
    if (fuse_apply_on_f32(p)) {
        fuse_apply_f32(&ops_f32, x, y, rows, w, 0, p, 0);
        return;
    }
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * w;
        float *yr = y + r * w;
        for (int64_t j = 0; j < w; j++) yr[j] = ((xr[j] - p->mhi[j]) - p->mlo[j]) * p->alpha[j] + p->beta[j];
    }
}

static void gstats_run_f32(const float *dy, const float *x, int64_t n, const cfbn_grad_f32 *p, double *acc)
{
    if (runs_gstats_f32(gstats_run_f32, dy, x, n, p, acc)) return;
    if (fuse_gstats_on_f32(p)) {
        fuse_gstats_f32(&ops_f32, dy, x, 1, n, 1, p, acc, 0);
        return;
    }
    const float mhi = p->mhi[0], mlo = p->mlo[0];
    double s1 = 0.0, s2 = 0.0;
    for (int64_t i = 0; i < n; i++) {
        float d = (x[i] - mhi) - mlo;
        s1 += (double)dy[i];
        s2 += (double)dy[i] * (double)d;
    }
    acc[0] = s1;
    acc[1] = s2;
}

static void gstats_rows_f32(const float *dy, const float *x, int64_t rows, int64_t w, const cfbn_grad_f32 *p, double *acc)
{
    if (fuse_gstats_on_f32(p)) {
        fuse_gstats_f32(&ops_f32, dy, x, rows, w, 0, p, acc, 0);
        return;
    }
    for (int64_t j = 0; j < 2 * w; j++) acc[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * w, *dr = dy + r * w;
        for (int64_t j = 0; j < w; j++) {
            float d = (xr[j] - p->mhi[j]) - p->mlo[j];
            acc[j] += (double)dr[j];
            acc[w + j] += (double)dr[j] * (double)d;
        }
    }
}

static void gapply_run_f32(const float *dy, const float *x, float *dx, int64_t n, const cfbn_grad_f32 *p)
{
    if (runs_gapply_f32(gapply_run_f32, dy, x, dx, n, p)) return;
    if (fuse_gapply_on_f32(p)) {
        fuse_gapply_f32(&ops_f32, dy, x, dx, 1, n, 1, p, 0);
        return;
    }
    const float mhi = p->mhi[0], mlo = p->mlo[0], a = p->a[0], b = p->b[0], c = p->c[0];
    for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * a + (((x[i] - mhi) - mlo) * b + c);
}

static void gapply_rows_f32(const float *dy, const float *x, float *dx, int64_t rows, int64_t w, const cfbn_grad_f32 *p)
{
    if (fuse_gapply_on_f32(p)) {
        fuse_gapply_f32(&ops_f32, dy, x, dx, rows, w, 0, p, 0);
        return;
    }
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * w, *dr = dy + r * w;
        float *o = dx + r * w;
        for (int64_t j = 0; j < w; j++)
            o[j] = dr[j] * p->a[j] + (((xr[j] - p->mhi[j]) - p->mlo[j]) * p->b[j] + p->c[j]);
    }
}

/* ---- float64 ---- */

static void stats_run_f64(const double *x, int64_t n, double shift, double *acc)
{
    double s1 = 0.0, s2 = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = x[i] - shift;
        s1 += d;
        s2 += d * d;
    }
    acc[0] = s1;
    acc[1] = s2;
}

static void stats_rows_f64(const double *x, int64_t rows, int64_t w, const double *shift, double *acc)
{
    for (int64_t j = 0; j < 2 * w; j++) acc[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const double *row = x + r * w;
        for (int64_t j = 0; j < w; j++) {
            double d = row[j] - shift[j];
            acc[j] += d;
            acc[w + j] += d * d;
        }
    }
}

static void apply_run_f64(const double *x, double *y, int64_t n, const cfbn_apply_f64 *p)
{
    if (runs_apply_f64(apply_run_f64, x, y, n, p)) return;
    if (fuse_apply_on_f64(p)) {
        fuse_apply_f64(&ops_f64, x, y, 1, n, 1, p);
        return;
    }
    const double mhi = p->mhi[0], mlo = p->mlo[0], a = p->alpha[0], b = p->beta[0];
    for (int64_t i = 0; i < n; i++) y[i] = ((x[i] - mhi) - mlo) * a + b;
}

static void apply_rows_f64(const double *x, double *y, int64_t rows, int64_t w, const cfbn_apply_f64 *p)
{
    if (fuse_apply_on_f64(p)) {
        fuse_apply_f64(&ops_f64, x, y, rows, w, 0, p);
        return;
    }
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * w;
        double *yr = y + r * w;
        for (int64_t j = 0; j < w; j++) yr[j] = ((xr[j] - p->mhi[j]) - p->mlo[j]) * p->alpha[j] + p->beta[j];
    }
}

static void gstats_run_f64(const double *dy, const double *x, int64_t n, const cfbn_grad_f64 *p, double *acc)
{
    if (runs_gstats_f64(gstats_run_f64, dy, x, n, p, acc)) return;
    if (fuse_gstats_on_f64(p)) {
        fuse_gstats_f64(&ops_f64, dy, x, 1, n, 1, p, acc);
        return;
    }
    const double mhi = p->mhi[0], mlo = p->mlo[0];
    double s1 = 0.0, s2 = 0.0;
    for (int64_t i = 0; i < n; i++) {
        s1 += dy[i];
        s2 += dy[i] * ((x[i] - mhi) - mlo);
    }
    acc[0] = s1;
    acc[1] = s2;
}

static void gstats_rows_f64(const double *dy, const double *x, int64_t rows, int64_t w, const cfbn_grad_f64 *p, double *acc)
{
    if (fuse_gstats_on_f64(p)) {
        fuse_gstats_f64(&ops_f64, dy, x, rows, w, 0, p, acc);
        return;
    }
    for (int64_t j = 0; j < 2 * w; j++) acc[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * w, *dr = dy + r * w;
        for (int64_t j = 0; j < w; j++) {
            acc[j] += dr[j];
            acc[w + j] += dr[j] * ((xr[j] - p->mhi[j]) - p->mlo[j]);
        }
    }
}

static void gapply_run_f64(const double *dy, const double *x, double *dx, int64_t n, const cfbn_grad_f64 *p)
{
    if (runs_gapply_f64(gapply_run_f64, dy, x, dx, n, p)) return;
    if (fuse_gapply_on_f64(p)) {
        fuse_gapply_f64(&ops_f64, dy, x, dx, 1, n, 1, p);
        return;
    }
    const double mhi = p->mhi[0], mlo = p->mlo[0], a = p->a[0], b = p->b[0], c = p->c[0];
    for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * a + (((x[i] - mhi) - mlo) * b + c);
}

static void gapply_rows_f64(const double *dy, const double *x, double *dx, int64_t rows, int64_t w, const cfbn_grad_f64 *p)
{
    if (fuse_gapply_on_f64(p)) {
        fuse_gapply_f64(&ops_f64, dy, x, dx, rows, w, 0, p);
        return;
    }
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * w, *dr = dy + r * w;
        double *o = dx + r * w;
        for (int64_t j = 0; j < w; j++)
            o[j] = dr[j] * p->a[j] + (((xr[j] - p->mhi[j]) - p->mlo[j]) * p->b[j] + p->c[j]);
    }
}

/* ---- float16 storage, float compute ---- */

static void stats_run_f16(const uint16_t *x, int64_t n, double shift, double *acc)
{
    double s1 = 0.0, s2 = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)cfbn_half_to_float(x[i]) - shift;
        s1 += d;
        s2 += d * d;
    }
    acc[0] = s1;
    acc[1] = s2;
}

static void stats_rows_f16(const uint16_t *x, int64_t rows, int64_t w, const double *shift, double *acc)
{
    for (int64_t j = 0; j < 2 * w; j++) acc[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *row = x + r * w;
        for (int64_t j = 0; j < w; j++) {
            double d = (double)cfbn_half_to_float(row[j]) - shift[j];
            acc[j] += d;
            acc[w + j] += d * d;
        }
    }
}

static void apply_run_f16(const uint16_t *x, uint16_t *y, int64_t n, const cfbn_apply_f32 *p)
{
    if (runs_apply_f16(apply_run_f16, x, y, n, p)) return;
    if (fuse_apply_on_f32(p)) {
        fuse_apply_f32(&ops_f32, x, y, 1, n, 1, p, 1);
        return;
    }
    const float mhi = p->mhi[0], mlo = p->mlo[0], a = p->alpha[0], b = p->beta[0];
    for (int64_t i = 0; i < n; i++)
        y[i] = cfbn_float_to_half(((cfbn_half_to_float(x[i]) - mhi) - mlo) * a + b);
}

static void apply_rows_f16(const uint16_t *x, uint16_t *y, int64_t rows, int64_t w, const cfbn_apply_f32 *p)
{
    if (fuse_apply_on_f32(p)) {
        fuse_apply_f32(&ops_f32, x, y, rows, w, 0, p, 1);
        return;
    }
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *xr = x + r * w;
        uint16_t *yr = y + r * w;
        for (int64_t j = 0; j < w; j++)
            yr[j] = cfbn_float_to_half(((cfbn_half_to_float(xr[j]) - p->mhi[j]) - p->mlo[j]) * p->alpha[j] + p->beta[j]);
    }
}

static void gstats_run_f16(const uint16_t *dy, const uint16_t *x, int64_t n, const cfbn_grad_f32 *p, double *acc)
{
    if (runs_gstats_f16(gstats_run_f16, dy, x, n, p, acc)) return;
    if (fuse_gstats_on_f32(p)) {
        fuse_gstats_f32(&ops_f32, dy, x, 1, n, 1, p, acc, 1);
        return;
    }
    const float mhi = p->mhi[0], mlo = p->mlo[0];
    double s1 = 0.0, s2 = 0.0;
    for (int64_t i = 0; i < n; i++) {
        float g = cfbn_half_to_float(dy[i]);
        float d = (cfbn_half_to_float(x[i]) - mhi) - mlo;
        s1 += (double)g;
        s2 += (double)g * (double)d;
    }
    acc[0] = s1;
    acc[1] = s2;
}

static void gstats_rows_f16(const uint16_t *dy, const uint16_t *x, int64_t rows, int64_t w, const cfbn_grad_f32 *p, double *acc)
{
    if (fuse_gstats_on_f32(p)) {
        fuse_gstats_f32(&ops_f32, dy, x, rows, w, 0, p, acc, 1);
        return;
    }
    for (int64_t j = 0; j < 2 * w; j++) acc[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *xr = x + r * w, *dr = dy + r * w;
        for (int64_t j = 0; j < w; j++) {
            float g = cfbn_half_to_float(dr[j]);
            float d = (cfbn_half_to_float(xr[j]) - p->mhi[j]) - p->mlo[j];
            acc[j] += (double)g;
            acc[w + j] += (double)g * (double)d;
        }
    }
}

static void gapply_run_f16(const uint16_t *dy, const uint16_t *x, uint16_t *dx, int64_t n, const cfbn_grad_f32 *p)
{
    if (runs_gapply_f16(gapply_run_f16, dy, x, dx, n, p)) return;
    if (fuse_gapply_on_f32(p)) {
        fuse_gapply_f32(&ops_f32, dy, x, dx, 1, n, 1, p, 1);
        return;
    }
    const float mhi = p->mhi[0], mlo = p->mlo[0], a = p->a[0], b = p->b[0], c = p->c[0];
    for (int64_t i = 0; i < n; i++) {
        float d = (cfbn_half_to_float(x[i]) - mhi) - mlo;
        dx[i] = cfbn_float_to_half(cfbn_half_to_float(dy[i]) * a + (d * b + c));
    }
}

static void gapply_rows_f16(const uint16_t *dy, const uint16_t *x, uint16_t *dx, int64_t rows, int64_t w, const cfbn_grad_f32 *p)
{
    if (fuse_gapply_on_f32(p)) {
        fuse_gapply_f32(&ops_f32, dy, x, dx, rows, w, 0, p, 1);
        return;
    }
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *xr = x + r * w, *dr = dy + r * w;
        uint16_t *o = dx + r * w;
        for (int64_t j = 0; j < w; j++) {
            float d = (cfbn_half_to_float(xr[j]) - p->mhi[j]) - p->mlo[j];
            o[j] = cfbn_float_to_half(cfbn_half_to_float(dr[j]) * p->a[j] + (d * p->b[j] + p->c[j]));
        }
    }
}

static const fuse_ops_f32 ops_f32 = {
    apply_run_f32, apply_rows_f32, gstats_run_f32, gstats_rows_f32, gapply_run_f32, gapply_rows_f32,
    fuse_act_scalar_f32, fuse_act_grad_scalar_f32, fuse_widen_scalar, fuse_narrow_scalar,
};

static const fuse_ops_f64 ops_f64 = {
    apply_run_f64, apply_rows_f64, gstats_run_f64, gstats_rows_f64, gapply_run_f64, gapply_rows_f64,
};

const cfbn_kernels cfbn_kernels_scalar = {
    "scalar",
    stats_run_f32, stats_rows_f32, apply_run_f32, apply_rows_f32,
    gstats_run_f32, gstats_rows_f32, gapply_run_f32, gapply_rows_f32,
    stats_run_f64, stats_rows_f64, apply_run_f64, apply_rows_f64,
    gstats_run_f64, gstats_rows_f64, gapply_run_f64, gapply_rows_f64,
    stats_run_f16, stats_rows_f16, apply_run_f16, apply_rows_f16,
    gstats_run_f16, gstats_rows_f16, gapply_run_f16, gapply_rows_f16,
};
