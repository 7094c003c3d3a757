/* The cfbn_c_api table (c_api.h): the driver's entry points with plain
 * arguments, on the kernel table cfbn._kernels selected. */
#include "c_api.h"

#include "cfbn.h"
#include "out_cache.h"

static const cfbn_kernels *selected;
static cfbn_c_api_run_fn client_runner;

static void set_runner(cfbn_c_api_run_fn run)
{
    client_runner = run;
}

/* Each entry below runs its call with the client's pool, if it set one
 * (cfbn_set_call_runner: for this thread, until it is reset). */

void cfbn_c_api_select(const cfbn_kernels *k)
{
    selected = k;
}

static void shape_of(cfbn_shape *s, int dtype, int layout, int64_t outer, int64_t channels,
                     int64_t inner, int n_threads)
{
    s->dtype = dtype;
    s->layout = layout;
    s->outer = outer;
    s->channels = channels;
    s->inner = inner;
    s->n_threads = n_threads > 0 ? n_threads : cfbn_openmp_max_threads();
}

/* NULL (no fusion) when there is nothing to fuse, as the Python calls pass. */
static const cfbn_fusion *fusion_of(cfbn_fusion *f, int act, double alpha, const void *side,
                                    const void *offset, void *side_grad)
{
    if (act == CFBN_ACT_NONE && side == NULL)
        return NULL;
    f->act = act;
    f->alpha = alpha;
    f->side = side;
    f->offset = offset;
    f->side_grad = side_grad;
    return f;
}

static int forward_training(int dtype, int layout, int64_t outer, int64_t channels, int64_t inner,
                            int n_threads, const void *x, const void *scale, const void *offset,
                            const void *mean, const void *variance, double epsilon, double factor,
                            void *y, void *batch_mean, void *batch_variance, void *saved_mean,
                            void *saved_variance, int act, double alpha, const void *side)
{
    cfbn_shape s;
    cfbn_fusion f;
    shape_of(&s, dtype, layout, outer, channels, inner, n_threads);
    cfbn_set_call_runner(client_runner);
    int rc = cfbn_forward_training(selected, &s, x, scale, offset, mean, variance, epsilon, factor,
                                   y, batch_mean, batch_variance, saved_mean, saved_variance,
                                   fusion_of(&f, act, alpha, side, NULL, NULL));
    cfbn_set_call_runner(NULL);
    return rc;
}

static int forward_inference(int dtype, int layout, int64_t outer, int64_t channels,
                             int64_t inner, int n_threads, const void *x, const void *scale,
                             const void *offset, const void *mean, const void *variance,
                             double epsilon, void *y, void *saved_mean, void *saved_variance,
                             int act, double alpha, const void *side)
{
    cfbn_shape s;
    cfbn_fusion f;
    shape_of(&s, dtype, layout, outer, channels, inner, n_threads);
    cfbn_set_call_runner(client_runner);
    int rc = cfbn_forward_inference(selected, &s, x, scale, offset, mean, variance, epsilon, y,
                                    NULL, NULL, saved_mean, saved_variance,
                                    fusion_of(&f, act, alpha, side, NULL, NULL));
    cfbn_set_call_runner(NULL);
    return rc;
}

static int backward(int dtype, int layout, int64_t outer, int64_t channels, int64_t inner,
                    int n_threads, int training, const void *dy, const void *x, const void *scale,
                    const void *saved_mean, const void *saved_variance, double epsilon, void *dx,
                    void *scale_backprop, void *offset_backprop, int act, double alpha,
                    const void *side, const void *offset, void *side_grad)
{
    cfbn_shape s;
    cfbn_fusion f;
    shape_of(&s, dtype, layout, outer, channels, inner, n_threads);
    cfbn_set_call_runner(client_runner);
    int rc = cfbn_backward(selected, &s, training, dy, x, scale, saved_mean, saved_variance,
                           epsilon, dx, scale_backprop, offset_backprop,
                           fusion_of(&f, act, alpha, side, offset, side_grad));
    cfbn_set_call_runner(NULL);
    return rc;
}

static void *output_alloc(size_t nbytes)
{
    cfbn_cache_stats st;
    cfbn_allocator a;
    if (nbytes < CFBN_CACHE_MIN_BYTES)
        return NULL;
    cfbn_cache_stats_get(&st);
    if (nbytes > st.limit)
        return NULL;
    cfbn_cache_allocator(&a);
    return a.malloc(a.ctx, nbytes);
}

static void output_free(void *p, size_t nbytes)
{
    cfbn_allocator a;
    cfbn_cache_allocator(&a);
    a.free(a.ctx, p, nbytes);
}

static int backward_backward(int dtype, int layout, int64_t outer, int64_t channels,
                             int64_t inner, int n_threads, int training, const void *dy,
                             const void *x, const void *scale, const void *saved_mean,
                             const void *saved_variance, double epsilon, const void *ggx,
                             const void *ggscale, const void *ggoffset, void *ddy, void *dx,
                             void *scale_backprop)
{
    cfbn_shape s;
    shape_of(&s, dtype, layout, outer, channels, inner, n_threads);
    cfbn_set_call_runner(client_runner);
    int rc = cfbn_backward_backward(selected, &s, training, dy, x, scale, saved_mean,
                                    saved_variance, epsilon, ggx, ggscale, ggoffset, ddy, dx,
                                    scale_backprop);
    cfbn_set_call_runner(NULL);
    return rc;
}

static const cfbn_c_api table = {
    CFBN_C_API_VERSION, forward_training, forward_inference, backward, output_alloc, output_free,
    backward_backward, set_runner,
};

const void *cfbn_c_api_get(void)
{
    return &table;
}
