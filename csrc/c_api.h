/* cfbn's C API for other compiled extensions (cfbn.torch's operator).
 *
 * cfbn._kernels exports one `cfbn_c_api` table in the capsule named
 * CFBN_C_API_CAPSULE (the attribute `c_api` of cfbn._kernels).  A client
 * gets it with PyCapsule_Import, checks `version`, and calls the driver
 * through it, without linking against cfbn: the kernels are the ones the
 * Python calls run, with the ISA cfbn selected at import (or a test
 * selected since).
 *
 * This header stands alone (only <stdint.h> and <stddef.h>): it is copied
 * into the installed package, where csrc/ is not.  The entries take a
 * tensor's shape and fusion as plain arguments and mean what
 * cfbn_forward_training, cfbn_forward_inference, cfbn_backward and
 * cfbn_backward_backward of cfbn.h mean; arguments are not checked (the client validates them, as
 * cfbn._args does for the Python calls).
 *
 *   dtype      enum cfbn_dtype: 0 float32, 1 float64, 2 float16, 3 bfloat16
 *   layout     enum cfbn_layout: 0 channels last (outer = rows, inner = 1),
 *              1 channels first (outer = N, inner = the plane)
 *   n_threads  >= 1, or 0 for cfbn's default
 *   act        enum cfbn_activation (0: none), alpha its parameter; side the
 *              residual input (NULL: none); the gradient's offset is needed
 *              when act != 0 and side_grad (NULL: not wanted) gets dy * act'.
 *
 * Each returns 0, or -1 when scratch memory could not be allocated.
 */
#ifndef CFBN_C_API_H
#define CFBN_C_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CFBN_C_API_VERSION 3
#define CFBN_C_API_CAPSULE "cfbn._kernels.c_api"

/* A client's thread pool (set_runner): run(tasks, task, ctx) calls
 * task(ctx, t) once for every t in [0, tasks), on any threads, and returns
 * when all are done. */
typedef void (*cfbn_c_api_task_fn)(void *ctx, int64_t t);
typedef void (*cfbn_c_api_run_fn)(int64_t tasks, cfbn_c_api_task_fn task, void *ctx);

typedef struct {
    int version;  /* CFBN_C_API_VERSION */
    int (*forward_training)(int dtype, int layout, int64_t outer, int64_t channels, int64_t inner,
                            int n_threads, const void *x, const void *scale, const void *offset,
                            const void *mean, const void *variance, double epsilon, double factor,
                            void *y, void *batch_mean, void *batch_variance, void *saved_mean,
                            void *saved_variance, int act, double alpha, const void *side);
    int (*forward_inference)(int dtype, int layout, int64_t outer, int64_t channels,
                             int64_t inner, int n_threads, const void *x, const void *scale,
                             const void *offset, const void *mean, const void *variance,
                             double epsilon, void *y, void *saved_mean, void *saved_variance,
                             int act, double alpha, const void *side);
    int (*backward)(int dtype, int layout, int64_t outer, int64_t channels, int64_t inner,
                    int n_threads, int training, const void *dy, const void *x, const void *scale,
                    const void *saved_mean, const void *saved_variance, double epsilon, void *dx,
                    void *scale_backprop, void *offset_backprop, int act, double alpha,
                    const void *side, const void *offset, void *side_grad);
    /* A buffer for a large output from cfbn's output cache (out_cache.h), or
     * NULL when nbytes is not worth caching (the client allocates it); a
     * buffer it gave goes back through output_free with the same nbytes. */
    void *(*output_alloc)(size_t nbytes);
    void (*output_free)(void *p, size_t nbytes);
    /* cfbn_backward_backward of cfbn.h (version 2): ggx, ggscale and
     * ggoffset may be NULL (zeros). */
    int (*backward_backward)(int dtype, int layout, int64_t outer, int64_t channels,
                             int64_t inner, int n_threads, int training, const void *dy,
                             const void *x, const void *scale, const void *saved_mean,
                             const void *saved_variance, double epsilon, const void *ggx,
                             const void *ggscale, const void *ggoffset, void *ddy, void *dx,
                             void *scale_backprop);
    /* The pool that runs the driver's parallel loops in the calls made
     * through this table (version 3): NULL, the default, is cfbn's OpenMP
     * loop.  Set once, before the calls; the results are the same bits. */
    void (*set_runner)(cfbn_c_api_run_fn run);
} cfbn_c_api;

#ifdef __cplusplus
}
#endif

#endif
