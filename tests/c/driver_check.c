/* Calls the driver entry points (cfbn_forward_training, cfbn_forward_inference,
 * cfbn_backward) directly, with every kernel table this CPU supports, for a
 * handful of shapes whose sizes leave tails for every vector width, and
 * compares the results with a plain double-precision computation.
 *
 * Meant to run under valgrind's memcheck (tests/c/valgrind_check.sh): every
 * buffer is a malloc of exactly its size, so a read or write past either end
 * is reported; outputs are left uninitialized, so an element the driver does
 * not write makes the comparison below depend on undefined memory, which is
 * reported too.
 *
 * Also calls the driver from inside an OpenMP parallel region (each outer
 * thread asking for a team of its own) and checks the results are the
 * single-threaded ones, bit for bit, and from more threads, one after
 * another, than there are pools of kept scratch blocks (scratch.h): the
 * last ones take every buffer from malloc, and memcheck's leak check sees
 * what the others kept still reachable.
 *
 * Exit status 0 when every check passes. */
#define _DEFAULT_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "cfbn.h"
#include "scratch.h"
#include "storage.h"

/* The fused-operation argument of the driver calls, where the driver has one. */
#ifdef CFBN_DRIVER_FUSION
#define NOFUSION , NULL
#else
#define NOFUSION
#endif

static long n_checks, n_fail;

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static double rng_uniform(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return ((double)(z >> 11) + 0.5) * 0x1p-53;
}

static const size_t esize[] = {4, 8, 2};
static const char *dname[] = {"f32", "f64", "f16"};

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        perror("malloc");
        exit(2);
    }
    return p;
}

static double get(const void *p, int dt, int64_t i)
{
    switch (dt) {
    case CFBN_F32: return ((const float *)p)[i];
    case CFBN_F64: return ((const double *)p)[i];
    default: return cfbn_half_to_float(((const uint16_t *)p)[i]);
    }
}

static void set(void *p, int dt, int64_t i, double v)
{
    switch (dt) {
    case CFBN_F32: ((float *)p)[i] = (float)v; break;
    case CFBN_F64: ((double *)p)[i] = v; break;
    default: ((uint16_t *)p)[i] = cfbn_float_to_half((float)v); break;
    }
}

/* vectors are float for f32 and f16 tensors, double for f64 */
static int vdt(int dt) { return dt == CFBN_F64 ? CFBN_F64 : CFBN_F32; }

static int64_t channel_of(const cfbn_shape *s, int64_t i)
{
    return s->layout == CFBN_CHANNELS_LAST ? i % s->channels : (i / s->inner) % s->channels;
}

static void check(const char *what, const char *ctx, int64_t i, double got, double want, double tol)
{
    n_checks++;
    /* the comparison reads every output element: valgrind flags unwritten ones here */
    /* a NaN wanted is a NaN got */
    if (isnan(want) ? !isnan(got) : !(fabs(got - want) <= tol)) {
        if (n_fail++ < 20)
            fprintf(stderr, "FAIL %s %s [%lld]: got %.9g, want %.9g (tol %.3g)\n", ctx, what,
                    (long long)i, got, want, tol);
    }
}

typedef struct {
    cfbn_shape s;
    int64_t total;
    void *x, *dy, *ggx, *scale, *offset, *mean, *var;
} problem;

static void make_problem(problem *p, int dt, int layout, int64_t outer, int64_t c, int64_t inner)
{
    p->s.dtype = dt;
    p->s.layout = layout;
    p->s.outer = outer;
    p->s.channels = c;
    p->s.inner = inner;
    p->s.n_threads = 1;
    p->total = outer * c * inner;
    size_t e = esize[dt], ve = esize[vdt(dt)];
    p->x = xmalloc((size_t)p->total * e);
    p->dy = xmalloc((size_t)p->total * e);
    p->ggx = xmalloc((size_t)p->total * e);
    for (int64_t i = 0; i < p->total; i++) {
        double ch = (double)channel_of(&p->s, i);
        set(p->x, dt, i, 2.0 * rng_uniform() - 1.0 + 0.5 * ch);
        set(p->dy, dt, i, 2.0 * rng_uniform() - 1.0);
        set(p->ggx, dt, i, 2.0 * rng_uniform() - 1.0);
    }
    p->scale = xmalloc((size_t)c * ve);
    p->offset = xmalloc((size_t)c * ve);
    p->mean = xmalloc((size_t)c * ve);
    p->var = xmalloc((size_t)c * ve);
    for (int64_t j = 0; j < c; j++) {
        set(p->scale, vdt(dt), j, 0.5 + rng_uniform());
        set(p->offset, vdt(dt), j, rng_uniform() - 0.5);
        set(p->mean, vdt(dt), j, rng_uniform() - 0.5);
        set(p->var, vdt(dt), j, 0.5 + rng_uniform());
    }
}

static void free_problem(problem *p)
{
    free(p->x); free(p->dy); free(p->ggx); free(p->scale); free(p->offset); free(p->mean); free(p->var);
}

/* per-channel double statistics of x */
static void moments(const problem *p, double *mu, double *var, int64_t *n)
{
    int64_t C = p->s.channels;
    *n = p->s.outer * p->s.inner;
    for (int64_t j = 0; j < C; j++) mu[j] = var[j] = 0.0;
    for (int64_t i = 0; i < p->total; i++) mu[channel_of(&p->s, i)] += get(p->x, p->s.dtype, i);
    for (int64_t j = 0; j < C; j++) mu[j] /= (double)*n;
    for (int64_t i = 0; i < p->total; i++) {
        int64_t j = channel_of(&p->s, i);
        double d = get(p->x, p->s.dtype, i) - mu[j];
        var[j] += d * d;
    }
    for (int64_t j = 0; j < C; j++) var[j] /= (double)*n;
}

static double tol_of(int dt) { return dt == CFBN_F64 ? 1e-10 : dt == CFBN_F32 ? 2e-5 : 4e-3; }

/* The second-order gradient against docs/spec.md's formulas in double, with the
 * statistics mu, var (the saved ones in training) and the problem's offset
 * and mean vectors standing in for the upstream ggscale and ggoffset. */
static void check_grad_grad(const cfbn_kernels *k, const problem *p, const cfbn_shape *s, int training,
                            const void *mu, const void *var, const char *ctx)
{
    int dt = p->s.dtype, vd = vdt(dt);
    int64_t C = p->s.channels, n = p->s.outer * p->s.inner;
    double eps = 1e-3, tol = tol_of(dt);
    void *ddy = xmalloc((size_t)p->total * esize[dt]), *dx = xmalloc((size_t)p->total * esize[dt]);
    void *ds = xmalloc((size_t)C * esize[vd]);
    const void *ggs = p->offset, *ggo = p->mean;
    if (cfbn_backward_backward(k, s, training, p->dy, p->x, p->scale, mu, var, eps, p->ggx, ggs, ggo, ddy, dx,
                               ds) != 0) {
        fprintf(stderr, "FAIL %s: backward_backward returned an error\n", ctx);
        n_fail++;
    }
    /* per channel: <g>, <g xhat>, <q>, <q xhat>, <q g> */
    double *m = calloc((size_t)(C ? C : 1) * 5, sizeof(double));
    for (int64_t i = 0; i < p->total; i++) {
        int64_t j = channel_of(s, i);
        double r = 1.0 / sqrt(get(var, vd, j) + eps), xh = (get(p->x, dt, i) - get(mu, vd, j)) * r;
        double g = get(p->dy, dt, i), q = get(p->ggx, dt, i);
        m[5 * j] += g;
        m[5 * j + 1] += g * xh;
        m[5 * j + 2] += q;
        m[5 * j + 3] += q * xh;
        m[5 * j + 4] += q * g;
    }
    for (int64_t j = 0; j < C; j++) {
        double r = 1.0 / sqrt(get(var, vd, j) + eps), *a = m + 5 * j;
        double want = !n ? 0.0 : training ? r * (a[4] - a[2] * a[0] / (double)n - a[3] * a[1] / (double)n)
                                          : r * a[4];
        check("scale_backprop (grad grad)", ctx, j, get(ds, vd, j), want, tol * (double)(n + 1) * 8);
        for (int t = 0; t < 5; t++) a[t] /= n ? (double)n : 1.0;
    }
    for (int64_t i = 0; i < p->total; i++) {
        int64_t j = channel_of(s, i);
        const double *a = m + 5 * j;
        double r = 1.0 / sqrt(get(var, vd, j) + eps), xh = (get(p->x, dt, i) - get(mu, vd, j)) * r;
        double g = get(p->dy, dt, i), q = get(p->ggx, dt, i), gam = get(p->scale, vd, j);
        double gs = get(ggs, vd, j), go = get(ggo, vd, j), wy, wx;
        if (training) {
            wy = gam * r * (q - a[2] - xh * a[3]) + gs * xh + go;
            wx = gam * r * r * (xh * (a[2] * a[0] + 3 * a[1] * a[3] - a[4]) - a[3] * (g - a[0]) - a[1] * (q - a[2]))
                 + gs * r * (g - a[0] - xh * a[1]);
        } else {
            wy = gam * r * q + gs * xh + go;
            wx = gs * r * g;
        }
        check("ddy (grad grad)", ctx, i, get(ddy, dt, i), wy, tol * 64 * (1 + fabs(wy)));
        check("dx (grad grad)", ctx, i, get(dx, dt, i), wx, tol * 64 * (1 + fabs(wx)));
    }
    free(m); free(ddy); free(dx); free(ds);
}

static void run_problem(const cfbn_kernels *k, const problem *p, int n_threads, const char *ctx)
{
    int dt = p->s.dtype, vd = vdt(dt);
    int64_t C = p->s.channels, n;
    size_t e = esize[dt], ve = esize[vd];
    cfbn_shape s = p->s;
    s.n_threads = n_threads;
    double eps = 1e-3, factor = 0.25, tol = tol_of(dt);
    double *mu = xmalloc((size_t)(C ? C : 1) * sizeof(double));
    double *var = xmalloc((size_t)(C ? C : 1) * sizeof(double));
    moments(p, mu, var, &n);

    void *y = xmalloc((size_t)p->total * e), *dx = xmalloc((size_t)p->total * e);
    void *bm = xmalloc((size_t)C * ve), *bv = xmalloc((size_t)C * ve);
    void *sm = xmalloc((size_t)C * ve), *sv = xmalloc((size_t)C * ve);
    void *ds = xmalloc((size_t)C * ve), *doff = xmalloc((size_t)C * ve);

    /* training forward */
    if (cfbn_forward_training(k, &s, p->x, p->scale, p->offset, p->mean, p->var, eps, factor,
                              y, bm, bv, sm, sv NOFUSION) != 0) {
        fprintf(stderr, "FAIL %s: forward_training returned an error\n", ctx);
        n_fail++;
    }
    for (int64_t j = 0; j < C && n > 0; j++) {
        double bessel = n > 1 ? (double)n / (double)(n - 1) : 1.0;
        check("saved_mean", ctx, j, get(sm, vd, j), mu[j], tol * (1 + fabs(mu[j])));
        check("saved_variance", ctx, j, get(sv, vd, j), var[j], tol * (1 + var[j]));
        check("batch_mean", ctx, j, get(bm, vd, j),
              (1 - factor) * get(p->mean, vd, j) + factor * mu[j], tol * 4);
        check("batch_variance", ctx, j, get(bv, vd, j),
              (1 - factor) * get(p->var, vd, j) + factor * var[j] * bessel, tol * 4);
    }
    for (int64_t i = 0; i < p->total; i++) {
        int64_t j = channel_of(&s, i);
        double r = 1.0 / sqrt(var[j] + eps);
        double want = get(p->scale, vd, j) * r * (get(p->x, dt, i) - mu[j]) + get(p->offset, vd, j);
        check("y (training)", ctx, i, get(y, dt, i), want, tol * (4 + fabs(want)) * 4);
    }

    /* training gradient against the saved statistics */
    if (cfbn_backward(k, &s, 1, p->dy, p->x, p->scale, sm, sv, eps, dx, ds, doff NOFUSION) != 0) {
        fprintf(stderr, "FAIL %s: backward returned an error\n", ctx);
        n_fail++;
    }
    double *s1 = calloc((size_t)(C ? C : 1), sizeof(double));
    double *s2 = calloc((size_t)(C ? C : 1), sizeof(double));
    for (int64_t i = 0; i < p->total; i++) {
        int64_t j = channel_of(&s, i);
        double g = get(p->dy, dt, i);
        s1[j] += g;
        s2[j] += g * (get(p->x, dt, i) - get(sm, vd, j)) / sqrt(get(sv, vd, j) + eps);
    }
    for (int64_t j = 0; j < C; j++) {
        check("offset_backprop", ctx, j, get(doff, vd, j), s1[j], tol * (double)(n + 1));
        check("scale_backprop", ctx, j, get(ds, vd, j), s2[j], tol * (double)(n + 1) * 4);
    }
    for (int64_t i = 0; i < p->total; i++) {
        int64_t j = channel_of(&s, i);
        double r = 1.0 / sqrt(get(sv, vd, j) + eps);
        double xh = (get(p->x, dt, i) - get(sm, vd, j)) * r;
        double want = get(p->scale, vd, j) * r / (double)n *
                      ((double)n * get(p->dy, dt, i) - s1[j] - xh * s2[j]);
        check("dx (training)", ctx, i, get(dx, dt, i), want, tol * 64 * (1 + fabs(want)));
    }
    check_grad_grad(k, p, &s, 1, sm, sv, ctx);

    /* inference forward and gradient */
    if (cfbn_forward_inference(k, &s, p->x, p->scale, p->offset, p->mean, p->var, eps,
                               y, bm, bv, sm, sv NOFUSION) != 0) {
        fprintf(stderr, "FAIL %s: forward_inference returned an error\n", ctx);
        n_fail++;
    }
    for (int64_t i = 0; i < p->total; i++) {
        int64_t j = channel_of(&s, i);
        double r = 1.0 / sqrt(get(p->var, vd, j) + eps);
        double want = get(p->scale, vd, j) * r * (get(p->x, dt, i) - get(p->mean, vd, j)) +
                      get(p->offset, vd, j);
        check("y (inference)", ctx, i, get(y, dt, i), want, tol * (4 + fabs(want)) * 4);
    }
    for (int64_t j = 0; j < C; j++) {
        /* an empty batch's statistics are NaN, as TensorFlow's; the reserve
         * spaces keep mean and variance */
        check("batch_mean (inference)", ctx, j, get(bm, vd, j), n ? get(p->mean, vd, j) : NAN, 0.0);
        check("batch_variance (inference)", ctx, j, get(bv, vd, j), n ? get(p->var, vd, j) : NAN, 0.0);
        check("saved_mean (inference)", ctx, j, get(sm, vd, j), get(p->mean, vd, j), 0.0);
        check("saved_variance (inference)", ctx, j, get(sv, vd, j), get(p->var, vd, j), 0.0);
    }
    if (cfbn_backward(k, &s, 0, p->dy, p->x, p->scale, p->mean, p->var, eps, dx, ds, doff
                      NOFUSION) != 0) {
        fprintf(stderr, "FAIL %s: inference backward returned an error\n", ctx);
        n_fail++;
    }
    for (int64_t i = 0; i < p->total; i++) {
        int64_t j = channel_of(&s, i);
        double want = get(p->scale, vd, j) / sqrt(get(p->var, vd, j) + eps) * get(p->dy, dt, i);
        check("dx (inference)", ctx, i, get(dx, dt, i), want, tol * 4 * (1 + fabs(want)));
    }
    for (int64_t j = 0; j < C; j++)
        check("offset_backprop (inference)", ctx, j, get(doff, vd, j), s1[j], tol * (double)(n + 1));
    check_grad_grad(k, p, &s, 0, p->mean, p->var, ctx);

    free(s1); free(s2); free(mu); free(var);
    free(y); free(dx); free(bm); free(bv); free(sm); free(sv); free(ds); free(doff);
}

/* One check: `failed` calls of `what` gave other bits than the reference
 * call on the main thread. */
static void same_bits(const char *isa, const char *what, int failed)
{
    n_checks++;
    if (failed) {
        n_fail++;
        fprintf(stderr, "FAIL %s %s: %d calls differ from the main thread's\n", isa, what, failed);
    }
}

/* Outer OpenMP threads each run the same training forward and gradient with a
 * team of their own; every result must equal the single-threaded call's. */
static void nested_openmp(const cfbn_kernels *k, const char *isa)
{
#ifdef _OPENMP
    problem p;
    make_problem(&p, CFBN_F32, CFBN_CHANNELS_FIRST, 4, 3, 20011);   /* above the serial cut-off */
    size_t bytes = (size_t)p.total * 4, vb = 3 * sizeof(float);
    char *ref = xmalloc(2 * bytes + 6 * vb);
    cfbn_shape s1 = p.s;
    s1.n_threads = 1;
    char *r_y = ref, *r_dx = ref + bytes, *r_v = ref + 2 * bytes;
    cfbn_forward_training(k, &s1, p.x, p.scale, p.offset, NULL, NULL, 1e-3, 1.0, r_y, r_v,
                          r_v + vb, r_v + 2 * vb, r_v + 3 * vb NOFUSION);
    cfbn_backward(k, &s1, 1, p.dy, p.x, p.scale, r_v + 2 * vb, r_v + 3 * vb, 1e-3, r_dx,
                  r_v + 4 * vb, r_v + 5 * vb NOFUSION);
    int failed = 0;
#pragma omp parallel num_threads(3) reduction(+ : failed)
    {
        char *mine = xmalloc(2 * bytes + 6 * vb);
        char *y = mine, *dx = mine + bytes, *v = mine + 2 * bytes;
        cfbn_shape s = p.s;
        s.n_threads = 2;
        for (int rep = 0; rep < 2; rep++) {
            cfbn_forward_training(k, &s, p.x, p.scale, p.offset, NULL, NULL, 1e-3, 1.0, y, v,
                                  v + vb, v + 2 * vb, v + 3 * vb NOFUSION);
            cfbn_backward(k, &s, 1, p.dy, p.x, p.scale, v + 2 * vb, v + 3 * vb, 1e-3, dx,
                          v + 4 * vb, v + 5 * vb NOFUSION);
            failed += memcmp(mine, ref, 2 * bytes + 6 * vb) != 0;
        }
        free(mine);
    }
    same_bits(isa, "nested OpenMP", failed);
    free(ref);
    free_problem(&p);
#else
    (void)k;
    (void)isa;
#endif
}

/* A training forward and gradient of p into out: y, dx, then the six vectors. */
typedef struct {
    const cfbn_kernels *k;
    const problem *p;
    char *out;
} exit_call;

static void *forward_and_gradient(void *arg)
{
    const exit_call *c = arg;
    const problem *p = c->p;
    size_t bytes = (size_t)p->total * esize[p->s.dtype], vb = (size_t)p->s.channels * esize[vdt(p->s.dtype)];
    char *y = c->out, *dx = c->out + bytes, *v = c->out + 2 * bytes;
    cfbn_forward_training(c->k, &p->s, p->x, p->scale, p->offset, NULL, NULL, 1e-3, 1.0, y, v,
                          v + vb, v + 2 * vb, v + 3 * vb NOFUSION);
    cfbn_backward(c->k, &p->s, 1, p->dy, p->x, p->scale, v + 2 * vb, v + 3 * vb, 1e-3, dx,
                  v + 4 * vb, v + 5 * vb NOFUSION);
    return NULL;
}

/* Threads that each call the driver and exit, more of them than there are
 * scratch pools: results equal the main thread's, bit for bit. */
static void threads_that_exit(const cfbn_kernels *k, const char *isa)
{
    problem p;
    make_problem(&p, CFBN_F32, CFBN_CHANNELS_LAST, 13, 17, 1);
    size_t n = (size_t)p.total * 4 * 2 + 6 * 17 * 4;
    exit_call ref = { k, &p, xmalloc(n) }, got = { k, &p, xmalloc(n) };
    forward_and_gradient(&ref);
    int failed = 0;
    for (int t = 0; t < CFBN_SCRATCH_POOLS + 4; t++) {
        pthread_t th;
        if (pthread_create(&th, NULL, forward_and_gradient, &got) != 0) {
            perror("pthread_create");
            exit(2);
        }
        pthread_join(th, NULL);
        failed += memcmp(got.out, ref.out, n) != 0;
    }
    same_bits(isa, "threads that exit", failed);
    free(ref.out);
    free(got.out);
    free_problem(&p);
}

int main(void)
{
    /* (layout, outer, channels, inner): odd sizes leave tails for 4, 8 and 16 lanes;
     * an empty batch, one element per channel, C = 1, and C wider than the tiling */
    static const int64_t shapes[][4] = {
        {CFBN_CHANNELS_LAST, 7, 3, 1},    {CFBN_CHANNELS_LAST, 13, 17, 1},
        {CFBN_CHANNELS_LAST, 1, 5, 1},    {CFBN_CHANNELS_LAST, 33, 1, 1},
        {CFBN_CHANNELS_LAST, 5, 1031, 1}, {CFBN_CHANNELS_LAST, 0, 6, 1},
        {CFBN_CHANNELS_LAST, 2051, 9, 1}, {CFBN_CHANNELS_FIRST, 2, 3, 7},
        {CFBN_CHANNELS_FIRST, 3, 5, 31},  {CFBN_CHANNELS_FIRST, 1, 2, 1},
        {CFBN_CHANNELS_FIRST, 1, 1, 8195}, {CFBN_CHANNELS_FIRST, 0, 4, 9},
        {CFBN_CHANNELS_FIRST, 5, 2, 4099},
    };
    const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
    int isas = 0;
    for (int isa = 0; isa < CFBN_ISA_COUNT; isa++) {
        if (!cfbn_isa_supported(isa)) continue;
        const cfbn_kernels *k = cfbn_isa_table(isa);
        isas++;
        long before = n_fail;
        for (int si = 0; si < nshapes; si++)
            for (int dt = 0; dt < 3; dt++) {
                problem p;
                make_problem(&p, dt, (int)shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3]);
                for (int nt = 1; nt <= 3; nt += 2) {
                    char ctx[128];
                    snprintf(ctx, sizeof ctx, "%s %s %s %lldx%lldx%lld threads=%d",
                             cfbn_isa_name(isa), dname[dt], shapes[si][0] ? "first" : "last",
                             (long long)shapes[si][1], (long long)shapes[si][2],
                             (long long)shapes[si][3], nt);
                    run_problem(k, &p, nt, ctx);
                }
                free_problem(&p);
            }
        nested_openmp(k, cfbn_isa_name(isa));
        threads_that_exit(k, cfbn_isa_name(isa));
        printf("driver_check %s: %s\n", cfbn_isa_name(isa), n_fail == before ? "ok" : "FAILED");
    }
    printf("driver_check: %d ISA(s), %ld checks, %ld failures\n", isas, n_checks, n_fail);
    return n_fail ? 1 : 0;
}
