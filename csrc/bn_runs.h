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

/* A run of a channel-first tensor is often one short plane, too short for
 * the hardware prefetchers to catch: before reading it, ask (into L2) for as
 * many bytes from just past its end.  In NCHW that is the next channel's run,
 * which the same thread usually reads next.  Runs longer than
 * NEXT_RUN_PREFETCH_MAX bytes are left to the hardware. */
#define NEXT_RUN_PREFETCH_MAX 8192
static inline void prefetch_next_run(const void *run, int64_t bytes)
{
    if (bytes > NEXT_RUN_PREFETCH_MAX) return;
    const char *q = (const char *)run + bytes;
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(q + b, 0, 2);
}

/* The three splitters for one storage type T (its parameter structs AP and
 * GP): runs_apply_SFX, runs_gstats_SFX and runs_gapply_SFX. */
#define CFBN_RUNS_SPLITTERS(SFX, T, AP, GP)                                                              \
    static inline int runs_apply_##SFX(void (*fn)(const T *, T *, int64_t, const AP *), const T *x, T *y, \
                                       int64_t n, const AP *p)                                            \
    {                                                                                                     \
        if (p->runs <= 1) return 0;                                                                       \
        AP q = *p;                                                                                        \
        q.runs = 1;                                                                                       \
        for (int64_t k = 0; k < p->runs; k++) {                                                           \
            q.side = runs_at(p->side, k, p->stride, sizeof(T));                                           \
            fn(x + k * p->stride, y + k * p->stride, n, &q);                                              \
        }                                                                                                 \
        return 1;                                                                                         \
    }                                                                                                     \
                                                                                                          \
    static inline int runs_gstats_##SFX(void (*fn)(const T *, const T *, int64_t, const GP *, double *),  \
                                        const T *dy, const T *x, int64_t n, const GP *p, double *acc)     \
    {                                                                                                     \
        if (p->runs <= 1) return 0;                                                                       \
        GP q = *p;                                                                                        \
        q.runs = 1;                                                                                       \
        double s1 = 0.0, s2 = 0.0, part[2];                                                               \
        for (int64_t k = 0; k < p->runs; k++) {                                                           \
            q.side = runs_at(p->side, k, p->stride, sizeof(T));                                           \
            fn(dy + k * p->stride, x + k * p->stride, n, &q, part);                                       \
            s1 += part[0];                                                                                \
            s2 += part[1];                                                                                \
        }                                                                                                 \
        acc[0] = s1;                                                                                      \
        acc[1] = s2;                                                                                      \
        return 1;                                                                                         \
    }                                                                                                     \
                                                                                                          \
    static inline int runs_gapply_##SFX(void (*fn)(const T *, const T *, T *, int64_t, const GP *),       \
                                        const T *dy, const T *x, T *dx, int64_t n, const GP *p)           \
    {                                                                                                     \
        if (p->runs <= 1) return 0;                                                                       \
        GP q = *p;                                                                                        \
        q.runs = 1;                                                                                       \
        for (int64_t k = 0; k < p->runs; k++) {                                                           \
            q.side = runs_at(p->side, k, p->stride, sizeof(T));                                           \
            q.side_grad = (void *)runs_at(p->side_grad, k, p->stride, sizeof(T));                         \
            fn(dy + k * p->stride, x + k * p->stride, dx + k * p->stride, n, &q);                         \
        }                                                                                                 \
        return 1;                                                                                         \
    }

CFBN_RUNS_SPLITTERS(f32, float, cfbn_apply_f32, cfbn_grad_f32)
CFBN_RUNS_SPLITTERS(f16, uint16_t, cfbn_apply_f32, cfbn_grad_f32)
CFBN_RUNS_SPLITTERS(f64, double, cfbn_apply_f64, cfbn_grad_f64)

#endif
