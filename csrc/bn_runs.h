/* Multi-run calls of the run kernels (cfbn.h: runs, stride) split into
 * single-run calls of the same kernel.  Static inline: each ISA file gets its
 * own copy, compiled with its own flags.  A kernel with a faster way to walk
 * several runs takes it before falling back on these.  Each returns 1 when it
 * made the call (runs > 1), 0 when the caller should run its single-run code. */
#ifndef CFBN_RUNS_H
#define CFBN_RUNS_H

#include <stddef.h>

#include "cfbn.h"

static inline const void *runs_at(const void *p, int64_t k, int64_t stride, size_t esize)
{
    return p ? (const char *)p + (size_t)(k * stride) * esize : NULL;
}

static inline int runs_apply_f32(void (*fn)(const float *, float *, int64_t, const cfbn_apply_f32 *),
                                 const float *x, float *y, int64_t n, const cfbn_apply_f32 *p)
{
    if (p->runs <= 1) return 0;
    cfbn_apply_f32 q = *p;
    q.runs = 1;
    for (int64_t k = 0; k < p->runs; k++) {
        q.side = runs_at(p->side, k, p->stride, sizeof(float));
        fn(x + k * p->stride, y + k * p->stride, n, &q);
    }
    return 1;
}

static inline int runs_gstats_f32(void (*fn)(const float *, const float *, int64_t, const cfbn_grad_f32 *, double *),
                                  const float *dy, const float *x, int64_t n, const cfbn_grad_f32 *p, double *acc)
{
    if (p->runs <= 1) return 0;
    cfbn_grad_f32 q = *p;
    q.runs = 1;
    double s1 = 0.0, s2 = 0.0, part[2];
    for (int64_t k = 0; k < p->runs; k++) {
        q.side = runs_at(p->side, k, p->stride, sizeof(float));
        fn(dy + k * p->stride, x + k * p->stride, n, &q, part);
        s1 += part[0];
        s2 += part[1];
    }
    acc[0] = s1;
    acc[1] = s2;
    return 1;
}

static inline int runs_gapply_f32(void (*fn)(const float *, const float *, float *, int64_t, const cfbn_grad_f32 *),
                                  const float *dy, const float *x, float *dx, int64_t n, const cfbn_grad_f32 *p)
{
    if (p->runs <= 1) return 0;
    cfbn_grad_f32 q = *p;
    q.runs = 1;
    for (int64_t k = 0; k < p->runs; k++) {
        q.side = runs_at(p->side, k, p->stride, sizeof(float));
        q.side_grad = (void *)runs_at(p->side_grad, k, p->stride, sizeof(float));
        fn(dy + k * p->stride, x + k * p->stride, dx + k * p->stride, n, &q);
    }
    return 1;
}

static inline int runs_apply_f16(void (*fn)(const uint16_t *, uint16_t *, int64_t, const cfbn_apply_f32 *),
                                 const uint16_t *x, uint16_t *y, int64_t n, const cfbn_apply_f32 *p)
{
    if (p->runs <= 1) return 0;
    cfbn_apply_f32 q = *p;
    q.runs = 1;
    for (int64_t k = 0; k < p->runs; k++) {
        q.side = runs_at(p->side, k, p->stride, sizeof(uint16_t));
        fn(x + k * p->stride, y + k * p->stride, n, &q);
    }
    return 1;
}

static inline int runs_gstats_f16(void (*fn)(const uint16_t *, const uint16_t *, int64_t, const cfbn_grad_f32 *, double *),
                                  const uint16_t *dy, const uint16_t *x, int64_t n, const cfbn_grad_f32 *p, double *acc)
{
    if (p->runs <= 1) return 0;
    cfbn_grad_f32 q = *p;
    q.runs = 1;
    double s1 = 0.0, s2 = 0.0, part[2];
    for (int64_t k = 0; k < p->runs; k++) {
        q.side = runs_at(p->side, k, p->stride, sizeof(uint16_t));
        fn(dy + k * p->stride, x + k * p->stride, n, &q, part);
        s1 += part[0];
        s2 += part[1];
    }
    acc[0] = s1;
    acc[1] = s2;
    return 1;
}

static inline int runs_gapply_f16(void (*fn)(const uint16_t *, const uint16_t *, uint16_t *, int64_t, const cfbn_grad_f32 *),
                                  const uint16_t *dy, const uint16_t *x, uint16_t *dx, int64_t n, const cfbn_grad_f32 *p)
{
    if (p->runs <= 1) return 0;
    cfbn_grad_f32 q = *p;
    q.runs = 1;
    for (int64_t k = 0; k < p->runs; k++) {
        q.side = runs_at(p->side, k, p->stride, sizeof(uint16_t));
        q.side_grad = (void *)runs_at(p->side_grad, k, p->stride, sizeof(uint16_t));
        fn(dy + k * p->stride, x + k * p->stride, dx + k * p->stride, n, &q);
    }
    return 1;
}

static inline int runs_apply_f64(void (*fn)(const double *, double *, int64_t, const cfbn_apply_f64 *),
                                 const double *x, double *y, int64_t n, const cfbn_apply_f64 *p)
{
    if (p->runs <= 1) return 0;
    cfbn_apply_f64 q = *p;
    q.runs = 1;
    for (int64_t k = 0; k < p->runs; k++) {
        q.side = runs_at(p->side, k, p->stride, sizeof(double));
        fn(x + k * p->stride, y + k * p->stride, n, &q);
    }
    return 1;
}

static inline int runs_gstats_f64(void (*fn)(const double *, const double *, int64_t, const cfbn_grad_f64 *, double *),
                                  const double *dy, const double *x, int64_t n, const cfbn_grad_f64 *p, double *acc)
{
    if (p->runs <= 1) return 0;
    cfbn_grad_f64 q = *p;
    q.runs = 1;
    double s1 = 0.0, s2 = 0.0, part[2];
    for (int64_t k = 0; k < p->runs; k++) {
        q.side = runs_at(p->side, k, p->stride, sizeof(double));
        fn(dy + k * p->stride, x + k * p->stride, n, &q, part);
        s1 += part[0];
        s2 += part[1];
    }
    acc[0] = s1;
    acc[1] = s2;
    return 1;
}

static inline int runs_gapply_f64(void (*fn)(const double *, const double *, double *, int64_t, const cfbn_grad_f64 *),
                                  const double *dy, const double *x, double *dx, int64_t n, const cfbn_grad_f64 *p)
{
    if (p->runs <= 1) return 0;
    cfbn_grad_f64 q = *p;
    q.runs = 1;
    for (int64_t k = 0; k < p->runs; k++) {
        q.side = runs_at(p->side, k, p->stride, sizeof(double));
        q.side_grad = (void *)runs_at(p->side_grad, k, p->stride, sizeof(double));
        fn(dy + k * p->stride, x + k * p->stride, dx + k * p->stride, n, &q);
    }
    return 1;
}

#endif
