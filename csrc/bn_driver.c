/* Layouts, work splitting, OpenMP and per-channel parameters.  Baseline
 * flags only: this file calls whichever kernel table dispatch chose.
 *
 * Determinism: every reduction is split into pieces whose boundaries depend
 * only on the shape, each piece is reduced by one kernel call, and piece
 * results are combined serially in a fixed order.  The thread count decides
 * only who computes a piece, never what it contains.
 */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cfbn.h"
#include "storage.h"
#include "bn_route.h"
#include "bn_math.h"
#include "bn_act.h"
#include "scratch.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Below this many elements a parallel region costs more than it saves. */
#define SERIAL_ELEMS 32768
/* Target elements per piece of a channels-last reduction ... */
#define ROWS_PIECE_ELEMS 16384
/* ... and its fewest rows: each piece leaves 2 W partial sums to add up
 * serially, which must stay small beside the piece's rows x W elements. */
#define ROWS_PIECE_MIN_ROWS 64
/* Channels-first: aim for at least this many (channel, piece) tasks ... */
#define FIRST_MIN_TASKS 32
/* ... but never pieces smaller than this. */
#define FIRST_MIN_PIECE 4096
/* Smallest stretch of memory an elementwise channels-first task gets. */
#define FLAT_PIECE_ELEMS 16384
/* Widest row the channels-last kernels are handed when C is widened. */
#define MAX_TILED_WIDTH 1024
/* Bound on the per-piece partial sums kept for channels-last reductions. */
#define MAX_PARTIAL_DOUBLES (1 << 19)


const char *cfbn_act_name(int act)
{
    switch ((enum cfbn_activation)act) {
    case CFBN_ACT_NONE: return "none";
    case CFBN_ACT_RELU: return "relu";
    case CFBN_ACT_RELU6: return "relu6";
    case CFBN_ACT_LEAKY_RELU: return "leaky_relu";
    case CFBN_ACT_ELU: return "elu";
    case CFBN_ACT_SIGMOID: return "sigmoid";
    case CFBN_ACT_TANH: return "tanh";
    case CFBN_ACT_SILU: return "silu";
    }
    return NULL;
}

static double elem_get(const void *p, int dtype, int64_t i)
{
    return dtype == CFBN_F64 ? ((const double *)p)[i] : (double)cfbn_load_float(dtype, p, i);
}

/* Per-channel vectors are double for f64 tensors and float otherwise. */
static double vec_get(const void *v, int dtype, int64_t c)
{
    return dtype == CFBN_F64 ? ((const double *)v)[c] : (double)((const float *)v)[c];
}

static void vec_set(void *v, int dtype, int64_t c, double value)
{
    if (!v) return;
    if (dtype == CFBN_F64) ((double *)v)[c] = value;
    else ((float *)v)[c] = (float)value;
}

/* tensors: how many tensors of x's size the pass reads and writes */
static int stream_output(const cfbn_shape *s, int tensors, int grad)
{
    int64_t bytes = s->outer * s->channels * s->inner * (int64_t)cfbn_storage_size(s->dtype) * tensors;
    return cfbn_route_stream(bytes, grad);
}

/* Set in the child of fork().  GNU libgomp's thread pool does not survive
 * fork: the child has only the forking thread, and its first parallel region
 * waits forever for the pool's other threads.  A forked child (a
 * multiprocessing worker with the fork start method, a data-loader worker)
 * therefore runs every pass on its one thread; the results are the same,
 * since the thread count never changes what a piece contains. */
static volatile sig_atomic_t forked_child;

static void on_fork_child(void)
{
    forked_child = 1;
}

int cfbn_threads_init(void)
{
    static int registered;
    if (registered) return 0;
    if (pthread_atfork(NULL, NULL, on_fork_child) != 0) return -1;
    registered = 1;
    return 0;
}

int cfbn_forked_child(void)
{
    return forked_child != 0;
}

static int thread_count(const cfbn_shape *s)
{
    int64_t total = s->outer * s->channels * s->inner;
    if (total < SERIAL_ELEMS || forked_child) return 1;
    return s->n_threads < CFBN_MAX_THREADS ? s->n_threads : CFBN_MAX_THREADS;
}

/* The runner of this thread's calls (cfbn_set_call_runner): per thread, so
 * that a client's pool never runs another caller's calls. */
static _Thread_local cfbn_run_fn call_runner;

void cfbn_set_call_runner(cfbn_run_fn run)
{
    call_runner = run;
}

/* Run fn(ctx, t) for t in [0, tasks).  With one thread no parallel region
 * is entered at all: even an if(0) region costs a microsecond in libgomp,
 * which is most of a small tensor's call. */
typedef cfbn_task_fn task_fn;

static void parallel_for(int nt, int64_t tasks, task_fn fn, void *ctx)
{
    if (call_runner != NULL && nt > 1 && tasks > 1) {
        call_runner(tasks, fn, ctx);
        return;
    }
#ifdef _OPENMP
    if (nt > 1 && tasks > 1) {
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t t = 0; t < tasks; t++) fn(ctx, t);
        return;
    }
#else
    (void)nt;
#endif
    for (int64_t t = 0; t < tasks; t++) fn(ctx, t);
}

/* ---- work plan ---- */

typedef struct {
    int dtype, layout;
    int64_t C, n;            /* channels, elements per channel */
    /* channels-first */
    int64_t N, S, G;         /* G pieces per channel */
    int planes;              /* reductions plane by plane in memory order */
    /* channels-last */
    int64_t W;               /* row width handed to the kernels, a multiple of C */
    int64_t rows;            /* full rows of W */
    int64_t tail;            /* elements after the full rows (a multiple of C) */
    int64_t piece_rows, pieces;
} plan;

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b) { int64_t t = a % b; a = b; b = t; }
    return a;
}

/* ---- the route trace (CFBN_VERBOSE, cfbn.set_verbose) ----
 * One line per call of the entries below, on stderr, after the call: what
 * was asked, the table and loop family that ran it, the plan's strategy
 * for channels-first tensors (whole planes in memory order, pieces of
 * channels, a task per channel or one pass per channel) or channels-last
 * rows, the threads and the time.  Off, it costs each call one load. */
static int trace_on;
/* the strategy the plan of this thread's present call chose */
static _Thread_local const char *trace_strategy;

void cfbn_set_trace(int on)
{
    trace_on = on != 0;
}

int cfbn_trace_enabled(void)
{
    return trace_on;
}

static double trace_now(void)
{
    struct timespec t;
    timespec_get(&t, TIME_UTC);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- loop families (cfbn.h) ---- */

int cfbn_family_of(int second_order, int dtype, int act)
{
    if (second_order) return CFBN_FAMILY_SECOND_ORDER;
    if (act == CFBN_ACT_NONE)
        return dtype == CFBN_F16 ? CFBN_FAMILY_PLAIN_F16
             : dtype == CFBN_BF16 ? CFBN_FAMILY_PLAIN_BF16 : CFBN_FAMILY_PLAIN;
    return cfbn_act_grad_is_compare(act) ? CFBN_FAMILY_RELU : CFBN_FAMILY_EXP;
}

const char *cfbn_family_name(int family)
{
    static const char *const names[CFBN_FAMILY_COUNT] = {
        "plain", "plain_float16", "plain_bfloat16", "relu_family", "exp_family", "second_order"};
    return family >= 0 && family < CFBN_FAMILY_COUNT ? names[family] : NULL;
}

const cfbn_kernels *cfbn_family_table(const cfbn_kernels *k, int family)
{
    return k->by_family ? k->by_family[family] : k;
}

/* The table one call runs on: its family's, where k routes families. */
static const cfbn_kernels *routed(const cfbn_kernels *k, int second_order, const cfbn_shape *s,
                                  const cfbn_fusion *f)
{
    if (!k->by_family) return k;
    return k->by_family[cfbn_family_of(second_order, s->dtype, f ? f->act : CFBN_ACT_NONE)];
}

static void trace_line(const char *op, const cfbn_kernels *k, const cfbn_shape *s, const cfbn_fusion *f,
                       double t0, int rc)
{
    static const char *const dtypes[] = {"float32", "float64", "float16", "bfloat16"};
    const int act = f ? f->act : CFBN_ACT_NONE;
    const int dt = s->dtype >= 0 && s->dtype < 4 ? s->dtype : 0;
    const char *name = cfbn_act_name(act);
    fprintf(stderr,
            "cfbn-trace op=%s dtype=%s layout=%s outer=%lld channels=%lld inner=%lld act=%s side=%d "
            "table=%s family=%s strategy=%s threads=%d us=%.1f rc=%d\n",
            op, dtypes[dt], s->layout == CFBN_CHANNELS_FIRST ? "channels_first" : "channels_last",
            (long long)s->outer, (long long)s->channels, (long long)s->inner, name ? name : "none",
            f && f->side != NULL, k->name,
            cfbn_family_name(cfbn_family_of(!strcmp(op, "backward_backward"), s->dtype, act)),
            trace_strategy ? trace_strategy : "none", thread_count(s), 1e6 * (trace_now() - t0), rc);
}

/* rc = the call; traced when the trace is on */
#define TRACED(op, f, call)                       \
    do {                                          \
        if (!trace_on) return call;               \
        trace_strategy = NULL;                    \
        double t0_ = trace_now();                 \
        int rc_ = call;                           \
        trace_line(op, k, s, f, t0_, rc_);        \
        return rc_;                               \
    } while (0)

static void make_plan(const cfbn_kernels *k, const cfbn_shape *s, plan *p)
{
    memset(p, 0, sizeof *p);
    p->dtype = s->dtype;
    p->layout = s->layout;
    p->C = s->channels;
    p->n = s->outer * s->inner;
    if (s->layout == CFBN_CHANNELS_FIRST) {
        p->N = s->outer;
        p->S = s->inner;
        int64_t g = (FIRST_MIN_TASKS + p->C - 1) / (p->C ? p->C : 1);
        int64_t gmax = p->n / FIRST_MIN_PIECE;
        if (g > gmax) g = gmax;
        p->G = g < 1 ? 1 : g;
        p->planes = cfbn_route_plane_order(p->S, p->N * p->C);
        trace_strategy = p->planes ? "planes" : p->G > 1 ? "pieces" : "channels";
        return;
    }
    /* Channels-last: widen the row to a multiple of the table's lanes where
     * that stays small, so its vector loops see whole vectors and no per-row
     * tail. */
    int64_t C = p->C ? p->C : 1, lanes = k->lanes;
    int64_t W = C / gcd64(C, lanes) * lanes;
    if (W > MAX_TILED_WIDTH) W = C;
    if (W < 64) W *= (64 + W - 1) / W;
    int64_t total = s->outer * p->C;
    p->W = W;
    p->rows = total / W;
    p->tail = total - p->rows * W;
    int64_t pr = (ROWS_PIECE_ELEMS + W - 1) / W;
    if (pr < ROWS_PIECE_MIN_ROWS) pr = ROWS_PIECE_MIN_ROWS;
    int64_t max_pieces = MAX_PARTIAL_DOUBLES / (2 * W);
    if (max_pieces < 1) max_pieces = 1;
    if (max_pieces > 256) max_pieces = 256;
    if (p->rows > pr * max_pieces) pr = (p->rows + max_pieces - 1) / max_pieces;
    p->piece_rows = pr;
    p->pieces = (p->rows + pr - 1) / pr;
    trace_strategy = "rows";
}

/* Whether a channels-first training pass that reads `tensors` tensors goes
 * one task per channel, its sums then its output (bn_route.h). */
static int per_channel(const plan *p, int tensors, int side)
{
    if (p->layout != CFBN_CHANNELS_FIRST) return 0;
    int64_t slice = p->n * (int64_t)cfbn_storage_size(p->dtype) * tensors;
    /* the forward reads one tensor, the gradients two or three */
    int by_channel = cfbn_route_per_channel(p->G, p->planes, slice, p->C, side, tensors > 1);
    if (by_channel) trace_strategy = "per_channel";
    return by_channel;
}

/* Channels-first: the piece g of channel c covers the channel's elements
 * [lo, hi) in (n, s) order. */
static void piece_bounds(const plan *p, int64_t g, int64_t *lo, int64_t *hi)
{
    *lo = p->n * g / p->G;
    *hi = p->n * (g + 1) / p->G;
}

/* ---- kernel calls by dtype ---- */

/* Per-channel parameters in the compute type (float for f32, f16 and bf16, double
 * for f64), stored as k arrays of length len each. */
typedef struct {
    int dtype;
    int64_t len;
    float *f;
    double *d;
    int stream;          /* write outputs with non-temporal stores */
    int act;             /* fused activation (enum cfbn_activation) and its alpha */
    double act_alpha;
} params;

static int params_init(params *pp, int dtype, int64_t len, int k)
{
    pp->dtype = dtype;
    pp->len = len;
    pp->f = NULL;
    pp->d = NULL;
    pp->stream = 0;
    pp->act = CFBN_ACT_NONE;
    pp->act_alpha = 0.0;
    size_t count = (size_t)(len > 0 ? len : 1) * (size_t)k;
    if (dtype == CFBN_F64) pp->d = cfbn_scratch_alloc(count * sizeof(double));
    else pp->f = cfbn_scratch_alloc(count * sizeof(float));
    return (pp->f || pp->d) ? 0 : -1;
}

static void params_free(params *pp)
{
    cfbn_scratch_free(pp->f);
    cfbn_scratch_free(pp->d);
}

static void params_set(params *pp, int which, int64_t i, double value)
{
    if (pp->d) pp->d[which * pp->len + i] = value;
    else pp->f[which * pp->len + i] = (float)value;
}

/* The mean as two numbers of the compute type whose sum is the mean to
 * twice the compute precision: x - hi is then exact near the mean. */
static void params_set_mean(params *pp, int hi, int lo, int64_t i, double mean)
{
    if (pp->d) {
        pp->d[hi * pp->len + i] = mean;
        pp->d[lo * pp->len + i] = 0.0;
    } else {
        float h = (float)mean;
        pp->f[hi * pp->len + i] = h;
        pp->f[lo * pp->len + i] = (float)(mean - (double)h);
    }
}

/* The activation the kernels fuse into this call's passes. */
static void params_set_fusion(params *pp, const cfbn_fusion *fusion)
{
    if (!fusion) return;
    pp->act = fusion->act;
    pp->act_alpha = fusion->alpha;
}

enum { P_MHI, P_MLO, P_ALPHA, P_BETA, P_APPLY_COUNT };
/* G_YA, G_YB: the forward's alpha and beta, to recompute the pre-activation */
enum { G_MHI, G_MLO, G_A, G_B, G_C, G_YA, G_YB, G_COUNT };

/* apply over a run (at = channel index) or over rows (at = 0, arrays of w). */
static void call_apply(const cfbn_kernels *k, const params *pp, int64_t at, const void *x, void *y,
                       int64_t rows, int64_t w, int is_run, const void *side, int64_t runs, int64_t stride)
{
    int64_t L = pp->len;
    if (pp->d) {
        const double *d = pp->d + at;
        cfbn_apply_f64 a = { d + P_MHI * L, d + P_MLO * L, d + P_ALPHA * L, d + P_BETA * L, pp->stream,
                             pp->act, pp->act_alpha, side, runs, stride };
        cfbn_route_apply_f64(k, x, y, rows, w, is_run, &a);
    } else {
        const float *f = pp->f + at;
        cfbn_apply_f32 a = { f + P_MHI * L, f + P_MLO * L, f + P_ALPHA * L, f + P_BETA * L, pp->stream,
                             pp->act, (float)pp->act_alpha, side, runs, stride };
        cfbn_route_apply_f32(k, pp->dtype, x, y, rows, w, is_run, &a);
    }
}

static void call_gstats(const cfbn_kernels *k, const params *pp, int64_t at, const void *dy, const void *x,
                        int64_t rows, int64_t w, int is_run, double *acc, const void *side, void *g_out,
                        int64_t runs, int64_t stride)
{
    int64_t L = pp->len;
    if (pp->d) {
        const double *d = pp->d + at;
        cfbn_grad_f64 g = { d + G_MHI * L, d + G_MLO * L, d + G_A * L, d + G_B * L, d + G_C * L, pp->stream,
                            pp->act, pp->act_alpha, d + G_YA * L, d + G_YB * L, side, NULL, runs, stride };
        cfbn_route_gstats_f64(k, dy, x, rows, w, is_run, &g, acc);
    } else {
        const float *f = pp->f + at;
        cfbn_grad_f32 g = { f + G_MHI * L, f + G_MLO * L, f + G_A * L, f + G_B * L, f + G_C * L, pp->stream,
                            pp->act, (float)pp->act_alpha, f + G_YA * L, f + G_YB * L, side, NULL, runs,
                            stride, g_out };
        cfbn_route_gstats_f32(k, pp->dtype, dy, x, rows, w, is_run, &g, acc);
    }
}

static void call_gapply(const cfbn_kernels *k, const params *pp, int64_t at, const void *dy, const void *x,
                        void *dx, int64_t rows, int64_t w, int is_run, const void *side, void *side_grad,
                        int64_t runs, int64_t stride)
{
    int64_t L = pp->len;
    if (pp->d) {
        const double *d = pp->d + at;
        cfbn_grad_f64 g = { d + G_MHI * L, d + G_MLO * L, d + G_A * L, d + G_B * L, d + G_C * L, pp->stream,
                            pp->act, pp->act_alpha, d + G_YA * L, d + G_YB * L, side, side_grad, runs,
                            stride };
        cfbn_route_gapply_f64(k, dy, x, dx, rows, w, is_run, &g);
    } else {
        const float *f = pp->f + at;
        cfbn_grad_f32 g = { f + G_MHI * L, f + G_MLO * L, f + G_A * L, f + G_B * L, f + G_C * L, pp->stream,
                            pp->act, (float)pp->act_alpha, f + G_YA * L, f + G_YB * L, side, side_grad, runs,
                            stride, NULL };
        cfbn_route_gapply_f32(k, pp->dtype, dy, x, dx, rows, w, is_run, &g);
    }
}

/* Second-order gradient parameters: cfbn_gg_f32/f64 from the arrays of a
 * params of GG_COUNT (at = channel index, or 0 for rows). */
enum { GG_MHI, GG_MLO, GG_A1, GG_B1, GG_C1, GG_A2, GG_B2, GG_C2, GG_E2, GG_COUNT };

static void gg_f32(const params *pp, int64_t at, cfbn_gg_f32 *g)
{
    const float *f = pp->f + at;
    int64_t L = pp->len;
    *g = (cfbn_gg_f32){ f + GG_MHI * L, f + GG_MLO * L, f + GG_A1 * L, f + GG_B1 * L, f + GG_C1 * L,
                        f + GG_A2 * L, f + GG_B2 * L, f + GG_C2 * L, f + GG_E2 * L, pp->stream, 0, 0 };
}

static void gg_f64(const params *pp, int64_t at, cfbn_gg_f64 *g)
{
    const double *d = pp->d + at;
    int64_t L = pp->len;
    *g = (cfbn_gg_f64){ d + GG_MHI * L, d + GG_MLO * L, d + GG_A1 * L, d + GG_B1 * L, d + GG_C1 * L,
                        d + GG_A2 * L, d + GG_B2 * L, d + GG_C2 * L, d + GG_E2 * L, pp->stream, 0, 0 };
}

static void call_ggstats(const cfbn_kernels *k, const params *pp, int64_t at, const void *dy, const void *x,
                         const void *ggx, int64_t rows, int64_t w, int is_run, int64_t runs, int64_t stride,
                         double *acc)
{
    cfbn_gg_f32 f;
    cfbn_gg_f64 d;
    if (pp->d) gg_f64(pp, at, &d);
    else gg_f32(pp, at, &f);
    cfbn_route_ggstats(k, pp->dtype, dy, x, ggx, rows, w, is_run, runs, stride, pp->d ? (const void *)&d : &f,
                       acc);
}

static void call_ggapply(const cfbn_kernels *k, const params *pp, int64_t at, const void *dy, const void *x,
                         const void *ggx, void *ddy, void *dx, int64_t rows, int64_t w, int is_run, int64_t runs,
                         int64_t stride)
{
    cfbn_gg_f32 f;
    cfbn_gg_f64 d;
    if (pp->d) gg_f64(pp, at, &d);
    else gg_f32(pp, at, &f);
    cfbn_route_ggapply(k, pp->dtype, dy, x, ggx, ddy, dx, rows, w, is_run, runs, stride,
                       pp->d ? (const void *)&d : &f);
}

/* ---- passes over the tensor ---- */

/* What a pass does with one contiguous stretch of data. */
enum pass_kind { PASS_STATS, PASS_APPLY, PASS_GSTATS, PASS_GAPPLY, PASS_GGSTATS, PASS_GGAPPLY };

/* The most sums per channel a reduction gives (PASS_GGSTATS). */
#define MAX_SUMS 5

typedef struct {
    const cfbn_kernels *k;
    const plan *p;
    const params *pp;
    int kind;
    const void *a;      /* x (stats, apply) or dy (gradient passes) */
    const void *b;      /* x for gradient passes */
    void *out;          /* y, dx, or ddy (second-order apply) */
    const void *side;   /* fused side input, or NULL */
    void *side_grad;    /* gradient apply: dy * act'(pre), or NULL */
    const void *q;      /* second order: ggx */
    void *out2;         /* second-order apply: dx */
    void *g_out;        /* gradient sums: where g is stored too, or NULL */
} pass;

/* Sums per channel of a reduction pass. */
static int pass_sums(const pass *ps)
{
    return ps->kind == PASS_GGSTATS ? 5 : 2;
}

/* Whether tensors a and b of shape s share a byte (b may be NULL). */
static int overlaps(const void *a, const void *b, const cfbn_shape *s)
{
    if (!a || !b) return 0;
    uintptr_t n = (uintptr_t)(s->outer * s->channels * s->inner) * cfbn_storage_size(s->dtype);
    uintptr_t u = (uintptr_t)a, v = (uintptr_t)b;
    return u < v + n && v < u + n;
}

static const void *at_elem(const void *base, int dtype, int64_t i)
{
    return base ? (const char *)base + (size_t)i * cfbn_storage_size(dtype) : NULL;
}

/* Channels-first: the pass over `runs` runs of len contiguous elements of
 * channel c, the first at element off and the others one sample (C*S
 * elements) apart.  Reductions write their sums (pass_sums) to part. */
static void first_stretch(const pass *ps, const double *shift, int64_t c, int64_t off, int64_t len,
                          int64_t runs, double *part)
{
    const plan *p = ps->p;
    int dt = p->dtype;
    int64_t stride = p->C * p->S;
    switch (ps->kind) {
    case PASS_STATS:
        cfbn_route_stats_runs(ps->k, dt, at_elem(ps->a, dt, off), len, runs, stride, shift[c], part);
        break;
    case PASS_APPLY:
        call_apply(ps->k, ps->pp, c, at_elem(ps->a, dt, off), (void *)at_elem(ps->out, dt, off), len, 1, 1,
                   at_elem(ps->side, dt, off), runs, stride);
        break;
    case PASS_GSTATS:
        call_gstats(ps->k, ps->pp, c, at_elem(ps->a, dt, off), at_elem(ps->b, dt, off), len, 1, 1, part,
                    at_elem(ps->side, dt, off), (void *)at_elem(ps->g_out, dt, off), runs, stride);
        break;
    case PASS_GAPPLY:
        call_gapply(ps->k, ps->pp, c, at_elem(ps->a, dt, off), at_elem(ps->b, dt, off),
                    (void *)at_elem(ps->out, dt, off), len, 1, 1, at_elem(ps->side, dt, off),
                    (void *)at_elem(ps->side_grad, dt, off), runs, stride);
        break;
    case PASS_GGSTATS:
        call_ggstats(ps->k, ps->pp, c, at_elem(ps->a, dt, off), at_elem(ps->b, dt, off), at_elem(ps->q, dt, off),
                     len, 1, 1, runs, stride, part);
        break;
    case PASS_GGAPPLY:
        call_ggapply(ps->k, ps->pp, c, at_elem(ps->a, dt, off), at_elem(ps->b, dt, off), at_elem(ps->q, dt, off),
                     (void *)at_elem(ps->out, dt, off), (void *)at_elem(ps->out2, dt, off), len, 1, 1, runs,
                     stride);
        break;
    }
}

static void clear_sums(double *acc, int k)
{
    for (int j = 0; j < k; j++) acc[j] = 0.0;
}

static void add_sums(double *acc, const double *part, int k)
{
    for (int j = 0; j < k; j++) acc[j] += part[j];
}

/* Channels-first: run the pass over piece g of channel c.  For reductions,
 * the sub-run sums are added in order into acc[0..pass_sums). */
static void first_piece(const pass *ps, const double *shift, int64_t c, int64_t g, double *acc)
{
    const plan *p = ps->p;
    int ns = pass_sums(ps);
    int64_t lo, hi;
    piece_bounds(p, g, &lo, &hi);
    clear_sums(acc, ns);
    if (p->S > 0 && lo % p->S == 0 && hi % p->S == 0 && hi > lo) {
        /* whole planes: one call for all of them */
        first_stretch(ps, shift, c, (lo / p->S * p->C + c) * p->S, p->S, (hi - lo) / p->S, acc);
        return;
    }
    for (int64_t pos = lo; pos < hi;) {
        int64_t n = pos / p->S, i = pos - n * p->S;
        int64_t len = p->S - i < hi - pos ? p->S - i : hi - pos;
        double part[MAX_SUMS] = { 0.0 };
        first_stretch(ps, shift, c, (n * p->C + c) * p->S + i, len, 1, part);
        add_sums(acc, part, ns);
        pos += len;
    }
}

/* Channels-first, elementwise passes: elements [lo, hi) in memory order,
 * plane by plane.  Long sequential streams suit the prefetchers, where a
 * channel-major walk jumps between planes C*S elements apart. */
static void first_flat(const pass *ps, int64_t lo, int64_t hi)
{
    const plan *p = ps->p;
    for (int64_t pos = lo; pos < hi;) {
        int64_t plane = pos / p->S, i = pos - plane * p->S;
        int64_t len = p->S - i < hi - pos ? p->S - i : hi - pos;
        first_stretch(ps, NULL, plane % p->C, pos, len, 1, NULL);
        pos += len;
    }
}

/* Channels-last: run the pass over piece q (q == pieces is the tail).
 * Reductions write pass_sums * w sums to acc. */
static void last_piece(const pass *ps, const double *shift, int64_t q, double *acc)
{
    const plan *p = ps->p;
    int dt = p->dtype;
    int64_t r0, nrows, w = p->W;
    if (q == p->pieces) {
        r0 = p->rows;
        nrows = 1;
        w = p->tail;
    } else {
        r0 = q * p->piece_rows;
        nrows = p->rows - r0 < p->piece_rows ? p->rows - r0 : p->piece_rows;
    }
    int64_t off = r0 * p->W;
    switch (ps->kind) {
    case PASS_STATS:
        cfbn_route_stats(ps->k, dt, at_elem(ps->a, dt, off), nrows, w, 0, shift, acc);
        break;
    case PASS_APPLY:
        call_apply(ps->k, ps->pp, 0, at_elem(ps->a, dt, off), (void *)at_elem(ps->out, dt, off), nrows, w, 0,
                   at_elem(ps->side, dt, off), 1, 0);
        break;
    case PASS_GSTATS:
        call_gstats(ps->k, ps->pp, 0, at_elem(ps->a, dt, off), at_elem(ps->b, dt, off), nrows, w, 0, acc,
                    at_elem(ps->side, dt, off), (void *)at_elem(ps->g_out, dt, off), 1, 0);
        break;
    case PASS_GAPPLY:
        call_gapply(ps->k, ps->pp, 0, at_elem(ps->a, dt, off), at_elem(ps->b, dt, off),
                    (void *)at_elem(ps->out, dt, off), nrows, w, 0, at_elem(ps->side, dt, off),
                    (void *)at_elem(ps->side_grad, dt, off), 1, 0);
        break;
    case PASS_GGSTATS:
        call_ggstats(ps->k, ps->pp, 0, at_elem(ps->a, dt, off), at_elem(ps->b, dt, off), at_elem(ps->q, dt, off),
                     nrows, w, 0, 1, 0, acc);
        break;
    case PASS_GGAPPLY:
        call_ggapply(ps->k, ps->pp, 0, at_elem(ps->a, dt, off), at_elem(ps->b, dt, off), at_elem(ps->q, dt, off),
                     (void *)at_elem(ps->out, dt, off), (void *)at_elem(ps->out2, dt, off), nrows, w, 0, 1, 0);
        break;
    }
}

static int is_reduction(int kind)
{
    return kind == PASS_STATS || kind == PASS_GSTATS || kind == PASS_GGSTATS;
}

typedef struct {
    const pass *ps;
    const double *shift;
    double *part;
} pass_task;

static void first_task(void *ctx, int64_t t)
{
    const pass_task *pt = ctx;
    double dummy[MAX_SUMS];
    int64_t G = pt->ps->p->G;
    first_piece(pt->ps, pt->shift, t / G, t % G, pt->part ? pt->part + pass_sums(pt->ps) * t : dummy);
}

/* Channels-first, plane order: the sums of plane t = n * C + c. */
static void plane_task(void *ctx, int64_t t)
{
    const pass_task *pt = ctx;
    const plan *p = pt->ps->p;
    first_stretch(pt->ps, pt->shift, t % p->C, t * p->S, p->S, 1, pt->part + pass_sums(pt->ps) * t);
}

/* Channels-first, plane order within one channel: its planes' sums added in
 * batch order, the same bits as the plane order of run_pass. */
static void channel_plane_sums(const pass *ps, const double *shift, int64_t c, double *acc)
{
    const plan *p = ps->p;
    int ns = pass_sums(ps);
    clear_sums(acc, ns);
    for (int64_t n = 0; n < p->N; n++) {
        double part[MAX_SUMS] = { 0.0 };
        first_stretch(ps, shift, c, (n * p->C + c) * p->S, p->S, 1, part);
        add_sums(acc, part, ns);
    }
}

static void last_task(void *ctx, int64_t q)
{
    const pass_task *pt = ctx;
    last_piece(pt->ps, pt->shift, q, pt->part ? pt->part + pass_sums(pt->ps) * pt->ps->p->W * q : NULL);
}

typedef struct {
    const pass *ps;
    int64_t total, tasks;
} flat_task;

static void first_flat_task(void *ctx, int64_t t)
{
    const flat_task *ft = ctx;
    first_flat(ft->ps, ft->total * t / ft->tasks, ft->total * (t + 1) / ft->tasks);
}

/* Adds the ns column sums a[k*w .. (k+1)*w) of a channels-last piece to
 * the channel sums: column j is channel j mod C (w is a multiple of C). */
static void fold_columns(const double *a, int64_t w, int64_t C, int ns, double *sums)
{
    for (int64_t j0 = 0; j0 < w; j0 += C) {
        for (int64_t c = 0; c < C; c++) {
            for (int k = 0; k < ns; k++) sums[ns * c + k] += a[k * w + j0 + c];
        }
    }
}

/* Run one pass over the whole tensor.  For reductions, sums[ns*c + k]
 * receives the channel's sum k (ns = pass_sums).  Returns -1 on allocation
 * failure. */
static int run_pass(const pass *ps, const double *shift, int nt, double *sums)
{
    const plan *p = ps->p;
    int64_t C = p->C;
    int red = is_reduction(ps->kind);
    int ns = pass_sums(ps);
    pass_task pt = { ps, shift, NULL };
    if (p->layout == CFBN_CHANNELS_FIRST && !red && cfbn_route_flat(p->S)) {
        /* elementwise: equal stretches of memory, one or more per thread */
        int64_t total = p->N * C * p->S;
        int64_t tasks = total / FLAT_PIECE_ELEMS;
        if (tasks > 4 * (int64_t)nt) tasks = 4 * (int64_t)nt;
        if (tasks < 1) tasks = 1;
        flat_task ft = { ps, total, tasks };
        parallel_for(nt, tasks, first_flat_task, &ft);
        return 0;
    }
    if (p->layout == CFBN_CHANNELS_FIRST && red && p->planes) {
        /* one task per plane, in memory order; per channel, the planes' sums
         * are added in batch order */
        int64_t tasks = p->N * C;
        pt.part = cfbn_scratch_alloc((size_t)(tasks > 0 ? tasks : 1) * ns * sizeof(double));
        if (!pt.part) return -1;
        parallel_for(nt, tasks, plane_task, &pt);
        for (int64_t c = 0; c < C; c++) {
            clear_sums(sums + ns * c, ns);
            for (int64_t n = 0; n < p->N; n++) add_sums(sums + ns * c, pt.part + ns * (n * C + c), ns);
        }
        cfbn_scratch_free(pt.part);
        return 0;
    }
    if (p->layout == CFBN_CHANNELS_FIRST) {
        /* channels-first reductions, and elementwise passes over small
         * planes: tasks are (channel, piece) */
        int64_t tasks = C * p->G;
        if (red) {
            pt.part = cfbn_scratch_alloc((size_t)(tasks > 0 ? tasks : 1) * ns * sizeof(double));
            if (!pt.part) return -1;
        }
        parallel_for(nt, tasks, first_task, &pt);
        if (red) {
            for (int64_t c = 0; c < C; c++) {
                clear_sums(sums + ns * c, ns);
                for (int64_t g = 0; g < p->G; g++) add_sums(sums + ns * c, pt.part + ns * (c * p->G + g), ns);
            }
            cfbn_scratch_free(pt.part);
        }
        return 0;
    }
    /* channels-last: tasks are row pieces, plus the tail */
    int64_t tasks = p->pieces + (p->tail > 0);
    int64_t W = p->W;
    if (red) {
        pt.part = cfbn_scratch_alloc((size_t)(tasks > 0 ? tasks : 1) * ns * (size_t)W * sizeof(double));
        if (!pt.part) return -1;
    }
    parallel_for(nt, tasks, last_task, &pt);
    if (red) {
        /* the full pieces' column sums, in piece order, into piece 0's */
        double *a0 = pt.part;
        for (int64_t q = 1; q < p->pieces; q++) {
            const double *a = pt.part + ns * W * q;
            for (int64_t j = 0; j < ns * W; j++) a0[j] += a[j];
        }
        for (int64_t j = 0; j < ns * C; j++) sums[j] = 0.0;
        if (p->pieces > 0) fold_columns(a0, W, C, ns, sums);
        if (p->tail > 0) fold_columns(pt.part + ns * W * p->pieces, p->tail, C, ns, sums);
        cfbn_scratch_free(pt.part);
    }
    return 0;
}

/* Repeat the first C elements of an array of len elements (a multiple of C)
 * across the rest, doubling the copied block each time. */
static void repeat_block(char *base, size_t esize, int64_t C, int64_t len)
{
    for (int64_t have = C; have < len;) {
        int64_t n = have < len - have ? have : len - have;
        memcpy(base + (size_t)have * esize, base, (size_t)n * esize);
        have += n;
    }
}

/* Channels-last parameters are laid out per column of the widened row. */
static void tile_params(params *pp, int count, int64_t C)
{
    if (C == 0) return;
    size_t esize = pp->d ? sizeof(double) : sizeof(float);
    char *base = pp->d ? (char *)pp->d : (char *)pp->f;
    for (int k = 0; k < count; k++) {
        repeat_block(base + (size_t)(k * pp->len) * esize, esize, C, pp->len);
    }
}

static void tile_param(params *pp, int which, int64_t C)
{
    if (C == 0) return;
    size_t esize = pp->d ? sizeof(double) : sizeof(float);
    char *base = pp->d ? (char *)pp->d : (char *)pp->f;
    repeat_block(base + (size_t)(which * pp->len) * esize, esize, C, pp->len);
}

static int64_t param_len(const plan *p, int layout)
{
    return layout == CFBN_CHANNELS_FIRST ? p->C : (p->W > p->C ? p->W : p->C);
}

/* Elements a channel's shift is estimated from. */
#define SHIFT_SAMPLE 32

/* The shift for channel c's statistics: the mean of its first few elements
 * (a whole leading row block of a channels-last tensor, the start of the
 * first plane of a channels-first one), rounded to the compute type.  Sums
 * of x - shift then stay small, so the variance, taken as a difference of
 * sums, loses nothing to cancellation, and the SIMD kernels can form x - shift
 * exactly in float when |mean| >> std.  The estimate depends only on the data
 * and the shape. */
static double finish_shift(const plan *p, double sum, int64_t k)
{
    double m = k > 0 && p->n > 0 ? sum / (double)k : 0.0;
    /* a non-finite sample leaves the channel's sums non-finite anyway */
    if (!isfinite(m)) m = 0.0;
    return p->dtype == CFBN_F64 ? m : (double)(float)m;
}

static double channel_shift(const plan *p, const cfbn_shape *s, const void *x, int64_t c)
{
    int first = s->layout == CFBN_CHANNELS_FIRST;
    int64_t k = first ? (p->S < SHIFT_SAMPLE ? p->S : SHIFT_SAMPLE)
                      : (s->outer < SHIFT_SAMPLE ? s->outer : SHIFT_SAMPLE);
    double sum = 0.0;
    for (int64_t i = 0; i < k && p->n > 0; i++)
        sum += elem_get(x, p->dtype, first ? c * p->S + i : i * p->C + c);
    return finish_shift(p, sum, k);
}

/* The shifts of the four channels from c0 of a channels-first tensor: four
 * sums, each in channel_shift's order (so the same values), whose chains of
 * dependent additions overlap instead of following one another (on a
 * (1,16,8,8) float32 forward those chains were a quarter of the call). */
static void channel_shifts4(const plan *p, const void *x, int64_t c0, double *out)
{
    int64_t k = p->S < SHIFT_SAMPLE ? p->S : SHIFT_SAMPLE, S = p->S;
    int dt = p->dtype;
    /* four variables, not an array: they stay in registers */
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    for (int64_t i = 0; i < k && p->n > 0; i++) {
        s0 += elem_get(x, dt, c0 * S + i);
        s1 += elem_get(x, dt, (c0 + 1) * S + i);
        s2 += elem_get(x, dt, (c0 + 2) * S + i);
        s3 += elem_get(x, dt, (c0 + 3) * S + i);
    }
    out[0] = finish_shift(p, s0, k);
    out[1] = finish_shift(p, s1, k);
    out[2] = finish_shift(p, s2, k);
    out[3] = finish_shift(p, s3, k);
}

/* sum[c] += element c of the C-element row at x, for every c (one loop per
 * dtype, which the compiler vectorizes) */
static void add_row(double *restrict sum, const void *restrict x, int dt, int64_t C)
{
    switch ((enum cfbn_dtype)dt) {
    case CFBN_F64: {
        const double *v = x;
        for (int64_t c = 0; c < C; c++) sum[c] += v[c];
        break;
    }
    case CFBN_F32: {
        const float *v = x;
        for (int64_t c = 0; c < C; c++) sum[c] += (double)v[c];
        break;
    }
    case CFBN_BF16: {
        const uint16_t *v = x;
        for (int64_t c = 0; c < C; c++) sum[c] += (double)cfbn_bf16_to_float(v[c]);
        break;
    }
    case CFBN_F16: {
        const uint16_t *v = x;
        for (int64_t c = 0; c < C; c++) sum[c] += (double)cfbn_half_to_float(v[c]);
        break;
    }
    }
}

/* Every channel's shift, tiled to the parameter length; with fill 0 the
 * array only, for a caller that sets shift[c] itself (channels-first).
 * Channels-first shifts are taken four channels at a time.
 * Channels-last samples are added a row at a time, each channel's in the
 * order channel_shift adds them (so the same values), without its chain of
 * dependent additions or its column-order reads. */
static double *make_shift(const plan *p, const cfbn_shape *s, const void *x, int fill)
{
    int64_t len = param_len(p, s->layout);
    double *shift = cfbn_scratch_alloc((size_t)(len > 0 ? len : 1) * sizeof(double));
    if (!shift || !fill) return shift;
    if (s->layout == CFBN_CHANNELS_FIRST) {
        int64_t c = 0;
        for (; c + 4 <= p->C; c += 4) channel_shifts4(p, x, c, shift + c);
        for (; c < p->C; c++) shift[c] = channel_shift(p, s, x, c);
    } else if (p->n == 0) {
        for (int64_t c = 0; c < p->C; c++) shift[c] = channel_shift(p, s, x, c);
    } else {
        int64_t k = s->outer < SHIFT_SAMPLE ? s->outer : SHIFT_SAMPLE;
        size_t es = cfbn_storage_size(p->dtype);
        for (int64_t c = 0; c < p->C; c++) shift[c] = 0.0;
        for (int64_t i = 0; i < k; i++) add_row(shift, (const char *)x + (size_t)(i * p->C) * es, p->dtype, p->C);
        for (int64_t c = 0; c < p->C; c++) shift[c] = finish_shift(p, shift[c], k);
    }
    if (p->C > 0) repeat_block((char *)shift, sizeof(double), p->C, len);
    return shift;
}

/* ---- per-channel arithmetic shared by the fused and the split calls ---- */

/* Normalization parameters of channel c from its mean and variance. */
static void set_apply_params(params *pp, int64_t c, double mean, double var, double gamma, double beta,
                             double epsilon)
{
    double r = cfbn_rstd(var, epsilon);
    params_set_mean(pp, P_MHI, P_MLO, c, mean);
    params_set(pp, P_ALPHA, c, gamma * r);
    params_set(pp, P_BETA, c, beta);
}

/* Gradient parameters of channel c: dx = dy*a + (x - mean)*b + c, where
 * count is the number of elements the statistics were taken over (the whole
 * batch, which for a synchronized batch norm is more than this tensor). */
static void set_grad_params(params *pp, int64_t c, int training, int64_t count, double gamma, double r,
                            double sum_dy, double sum_dy_xhat)
{
    double ga, gb, gc;
    cfbn_grad_coeffs(training, (long long)count, gamma, r, sum_dy, sum_dy_xhat, &ga, &gb, &gc);
    params_set(pp, G_A, c, ga);
    params_set(pp, G_B, c, gb);
    params_set(pp, G_C, c, gc);
}

/* ---- forward ---- */

typedef struct {
    const void *scale, *offset, *mean, *variance;
    double epsilon, factor;
    void *batch_mean, *batch_variance, *saved_mean, *saved_variance;
} fwd_args;

/* Turn a channel's sums into its statistics, outputs and apply parameters. */
static void forward_channel(const plan *p, const fwd_args *a, params *pp, int64_t c,
                            double shift, double s1, double s2)
{
    int dt = p->dtype;
    /* Read every input of this channel before writing any output: an output
     * may be the very array an input came from (a running mean updated in
     * place). */
    double gamma = vec_get(a->scale, dt, c), beta = vec_get(a->offset, dt, c);
    double f = a->factor;
    double run_mean = f != 1.0 ? vec_get(a->mean, dt, c) : 0.0;
    double run_var = f != 1.0 ? vec_get(a->variance, dt, c) : 0.0;
    double mu, m2, var, bm, bv;
    cfbn_mean_m2(shift, s1, s2, p->n, &mu, &m2);
    cfbn_train_stats(p->n, mu, m2, f, run_mean, run_var, &var, &bm, &bv);
    vec_set(a->batch_mean, dt, c, bm);
    vec_set(a->batch_variance, dt, c, bv);
    vec_set(a->saved_mean, dt, c, mu);
    vec_set(a->saved_variance, dt, c, var);
    set_apply_params(pp, c, mu, var, gamma, beta, a->epsilon);
}

typedef struct {
    const pass *stats, *apply;
    const fwd_args *a;
    params *pp;
    double *shift;
    const cfbn_shape *s;
    int shifted;             /* shift[] already holds every channel's shift */
} fused_fwd;

/* With several threads the shift too is taken here, by the thread that
 * reads the channel: its first plane then comes into this core's cache for
 * the sums that follow, rather than being read one channel after another
 * before the pass.  One thread takes them all first, four channels at a
 * time (make_shift). */
static void fused_forward_task(void *ctx, int64_t c)
{
    const fused_fwd *f = ctx;
    double acc[2];
    if (!f->shifted) f->shift[c] = channel_shift(f->stats->p, f->s, f->stats->a, c);
    if (f->stats->p->planes) channel_plane_sums(f->stats, f->shift, c, acc);
    else first_piece(f->stats, f->shift, c, 0, acc);
    forward_channel(f->stats->p, f->a, f->pp, c, f->shift[c], acc[0], acc[1]);
    first_piece(f->apply, f->shift, c, 0, acc);
}

static int run_forward_training(const cfbn_kernels *k, const cfbn_shape *s,
                                const void *x, const void *scale, const void *offset,
                                const void *mean, const void *variance,
                                double epsilon, double factor,
                                void *y, void *batch_mean, void *batch_variance,
                                void *saved_mean, void *saved_variance, const cfbn_fusion *fusion)
{
    plan p;
    make_plan(k, s, &p);
    int nt = thread_count(s);
    fwd_args a = { scale, offset, mean, variance, epsilon, factor,
                   batch_mean, batch_variance, saved_mean, saved_variance };
    params pp;
    if (params_init(&pp, s->dtype, param_len(&p, s->layout), P_APPLY_COUNT) < 0) return -1;
    pp.stream = stream_output(s, fusion && fusion->side ? 3 : 2, 0);
    params_set_fusion(&pp, fusion);
    int by_channel = per_channel(&p, 1, fusion && fusion->side);
    int shifted = !by_channel || nt == 1;
    double *shift = make_shift(&p, s, x, shifted);
    double *sums = cfbn_scratch_alloc((size_t)(p.C > 0 ? p.C : 1) * 2 * sizeof(double));
    int rc = -1;
    if (!shift || !sums) goto done;
    pass st = { .k = k, .p = &p, .pp = &pp, .kind = PASS_STATS, .a = x };
    pass ap = { .k = k, .p = &p, .pp = &pp, .kind = PASS_APPLY,
                .a = x, .out = y, .side = fusion ? fusion->side : NULL };

    if (by_channel) {
        /* One task per channel: its statistics, then its normalization while
         * the channel's planes are still in this core's cache. */
        fused_fwd ctx = { &st, &ap, &a, &pp, shift, s, shifted };
        parallel_for(nt, p.C, fused_forward_task, &ctx);
        rc = 0;
        goto done;
    }
    if (run_pass(&st, shift, nt, sums) < 0) goto done;
    for (int64_t c = 0; c < p.C; c++) forward_channel(&p, &a, &pp, c, shift[c], sums[2 * c], sums[2 * c + 1]);
    if (s->layout == CFBN_CHANNELS_LAST) tile_params(&pp, P_APPLY_COUNT, p.C);
    rc = run_pass(&ap, shift, nt, NULL);
done:
    cfbn_scratch_free(shift);
    cfbn_scratch_free(sums);
    params_free(&pp);
    return rc;
}

/* The normalization pass with given statistics.  stats_dt says how mean and
 * variance are stored: CFBN_F64 for double, else as the tensor's vectors. */
static int apply_with_stats(const cfbn_kernels *k, const cfbn_shape *s, const void *x, const void *scale,
                            const void *offset, const void *mean, const void *variance, int stats_dt,
                            double epsilon, void *y, const cfbn_fusion *fusion)
{
    plan p;
    make_plan(k, s, &p);
    params pp;
    if (params_init(&pp, s->dtype, param_len(&p, s->layout), P_APPLY_COUNT) < 0) return -1;
    pp.stream = stream_output(s, fusion && fusion->side ? 3 : 2, 0);
    params_set_fusion(&pp, fusion);
    for (int64_t c = 0; c < p.C; c++) {
        set_apply_params(&pp, c, vec_get(mean, stats_dt, c), vec_get(variance, stats_dt, c),
                         vec_get(scale, s->dtype, c), vec_get(offset, s->dtype, c), epsilon);
    }
    if (s->layout == CFBN_CHANNELS_LAST) tile_params(&pp, P_APPLY_COUNT, p.C);
    pass ap = { .k = k, .p = &p, .pp = &pp, .kind = PASS_APPLY,
                .a = x, .out = y, .side = fusion ? fusion->side : NULL };
    int rc = run_pass(&ap, NULL, thread_count(s), NULL);
    params_free(&pp);
    return rc;
}

static int run_forward_inference(const cfbn_kernels *k, const cfbn_shape *s,
                                 const void *x, const void *scale, const void *offset,
                                 const void *mean, const void *variance, double epsilon,
                                 void *y, void *batch_mean, void *batch_variance,
                                 void *saved_mean, void *saved_variance, const cfbn_fusion *fusion)
{
    int dt = s->dtype;
    int rc = apply_with_stats(k, s, x, scale, offset, mean, variance, dt, epsilon, y, fusion);
    /* after the pass: an output may be the array mean or variance came in.
     * An empty batch's batch_mean and batch_variance are NaN, as TensorFlow's
     * kernel returns them; the reserve spaces keep mean and variance, which an
     * inference-mode gradient takes back. */
    int empty = s->outer * s->inner == 0;
    for (int64_t c = 0; rc == 0 && c < s->channels; c++) {
        double mu = vec_get(mean, dt, c), var = vec_get(variance, dt, c);
        vec_set(batch_mean, dt, c, empty ? NAN : mu);
        vec_set(batch_variance, dt, c, empty ? NAN : var);
        vec_set(saved_mean, dt, c, mu);
        vec_set(saved_variance, dt, c, var);
    }
    return rc;
}

static int run_statistics(const cfbn_kernels *k, const cfbn_shape *s, const void *x, double *mean, double *m2)
{
    plan p;
    make_plan(k, s, &p);
    params pp;
    if (params_init(&pp, s->dtype, param_len(&p, s->layout), P_APPLY_COUNT) < 0) return -1;
    double *shift = make_shift(&p, s, x, 1);
    double *sums = cfbn_scratch_alloc((size_t)(p.C > 0 ? p.C : 1) * 2 * sizeof(double));
    int rc = -1;
    if (shift && sums) {
        pass st = { .k = k, .p = &p, .pp = &pp, .kind = PASS_STATS, .a = x };
        rc = run_pass(&st, shift, thread_count(s), sums);
        for (int64_t c = 0; rc == 0 && c < p.C; c++)
            cfbn_mean_m2(shift[c], sums[2 * c], sums[2 * c + 1], p.n, &mean[c], &m2[c]);
    }
    cfbn_scratch_free(shift);
    cfbn_scratch_free(sums);
    params_free(&pp);
    return rc;
}

void cfbn_train_statistics(int64_t channels, int64_t count, const double *mean, const double *m2,
                           double factor, const double *running_mean, const double *running_variance,
                           double *variance, double *batch_mean, double *batch_variance)
{
    for (int64_t c = 0; c < channels; c++) {
        double rm = factor != 1.0 ? running_mean[c] : 0.0, rv = factor != 1.0 ? running_variance[c] : 0.0;
        double mu = mean[c], v, bm, bv;
        cfbn_train_stats(count, mu, m2[c], factor, rm, rv, &v, &bm, &bv);
        variance[c] = v;
        batch_mean[c] = bm;
        batch_variance[c] = bv;
    }
}

static int run_apply(const cfbn_kernels *k, const cfbn_shape *s, const void *x, const void *scale,
                     const void *offset, const double *mean, const double *variance, double epsilon, void *y)
{
    return apply_with_stats(k, s, x, scale, offset, mean, variance, CFBN_F64, epsilon, y, NULL);
}

/* ---- gradient ---- */

typedef struct {
    int training;
    const void *scale, *saved_mean, *saved_variance;
    int stats_dt;          /* how saved_mean and saved_variance are stored */
    double epsilon;
    void *scale_backprop, *offset_backprop;
} bwd_args;

static double inv_std(const bwd_args *a, int64_t c)
{
    return cfbn_rstd(vec_get(a->saved_variance, a->stats_dt, c), a->epsilon);
}

/* Turn a channel's gradient sums into its outputs and apply parameters. */
static void backward_channel(const plan *p, const bwd_args *a, params *pp, int64_t c,
                             double sum_dy, double sum_dy_xc)
{
    int dt = p->dtype;
    double r = inv_std(a, c);
    double gamma = a->scale ? vec_get(a->scale, dt, c) : 1.0;
    /* An empty batch has zero sums; its saved variance is NaN, and a zero
     * sum times NaN would make the gradient NaN instead of the empty sum. */
    double scale_bp = p->n > 0 ? sum_dy_xc * r : 0.0;
    vec_set(a->scale_backprop, a->stats_dt == CFBN_F64 ? CFBN_F64 : dt, c, scale_bp);
    vec_set(a->offset_backprop, a->stats_dt == CFBN_F64 ? CFBN_F64 : dt, c, sum_dy);
    set_grad_params(pp, c, a->training, p->n, gamma, r, sum_dy, scale_bp);
}

typedef struct {
    const pass *stats, *apply;
    const bwd_args *a;
    params *pp;
} fused_bwd;

static void fused_backward_task(void *ctx, int64_t c)
{
    const fused_bwd *f = ctx;
    double acc[2];
    if (f->stats->p->planes) channel_plane_sums(f->stats, NULL, c, acc);
    else first_piece(f->stats, NULL, c, 0, acc);
    backward_channel(f->stats->p, f->a, f->pp, c, acc[0], acc[1]);
    first_piece(f->apply, NULL, c, 0, acc);
}

/* The gradient: its sums (always) and dx (when dx is not NULL).  With
 * a->stats_dt == CFBN_F64 the sums are written as double. */
static int backward_run(const cfbn_kernels *k, const cfbn_shape *s, const bwd_args *a,
                        const void *dy, const void *x, void *dx, const cfbn_fusion *fusion)
{
    plan p;
    make_plan(k, s, &p);
    int nt = thread_count(s);
    params pp, ip;
    int rc = -1;
    double *sums = NULL;
    if (params_init(&pp, s->dtype, param_len(&p, s->layout), G_COUNT) < 0) return -1;
    if (params_init(&ip, s->dtype, param_len(&p, s->layout), P_APPLY_COUNT) < 0) {
        params_free(&pp);
        return -1;
    }
    pp.stream = stream_output(s, 3, 1);
    ip.stream = stream_output(s, 2, 0);
    sums = cfbn_scratch_alloc((size_t)(p.C > 0 ? p.C : 1) * 2 * sizeof(double));
    if (!sums) goto done;
    for (int64_t c = 0; c < p.C; c++)
        params_set_mean(&pp, G_MHI, G_MLO, c, vec_get(a->saved_mean, a->stats_dt, c));
    /* A fused activation is differentiated at the forward's pre-activation,
     * recomputed with the forward's own per-channel alpha and beta. */
    int fused = fusion && (fusion->act != CFBN_ACT_NONE || fusion->side_grad);
    params_set_fusion(&pp, fusion);
    if (fusion && fusion->act != CFBN_ACT_NONE) {
        for (int64_t c = 0; c < p.C; c++) {
            double gamma = a->scale ? vec_get(a->scale, s->dtype, c) : 1.0;
            params_set(&pp, G_YA, c, gamma * inv_std(a, c));
            params_set(&pp, G_YB, c, fusion->offset ? vec_get(fusion->offset, s->dtype, c) : 0.0);
        }
        if (s->layout == CFBN_CHANNELS_LAST) {
            tile_param(&pp, G_YA, p.C);
            tile_param(&pp, G_YB, p.C);
        }
    }

    const void *side = fusion ? fusion->side : NULL;
    void *side_grad = fusion ? fusion->side_grad : NULL;
    pass gs = { .k = k, .p = &p, .pp = &pp, .kind = PASS_GSTATS, .a = dy, .b = x, .side = side };
    pass ga = { .k = k, .p = &p, .pp = &pp, .kind = PASS_GAPPLY,
                .a = dy, .b = x, .out = dx, .side = side, .side_grad = side_grad };
    /* Where the router asks for it, the sums pass stores g (in side_grad,
     * which must receive it anyway, else in dx) and dx is the plain
     * gradient of g: act' is formed once, and side is read once. */
    params plain_pp = pp;
    void *g_out = fused && dx ? (side_grad ? side_grad : dx) : NULL;
    if (g_out && cfbn_route_store_g(s->dtype, pp.act, side_grad != NULL, pp.stream) &&
        !overlaps(g_out, dy, s) && !overlaps(g_out, x, s) && !overlaps(g_out, side, s)) {
        gs.g_out = g_out;
        plain_pp.act = CFBN_ACT_NONE;
        ga = (pass){ .k = k, .p = &p, .pp = &plain_pp, .kind = PASS_GAPPLY, .a = g_out, .b = x, .out = dx };
    }
    /* (a side input does not send the gradient pass by pass, bn_route.c) */
    if (dx && a->training && per_channel(&p, 2, 0)) {
        /* One task per channel: sums, then dx while dy and x are in cache. */
        fused_bwd ctx = { &gs, &ga, a, &pp };
        parallel_for(nt, p.C, fused_backward_task, &ctx);
        rc = 0;
        goto done;
    }
    if (s->layout == CFBN_CHANNELS_LAST) tile_params(&pp, 2, p.C);
    if (run_pass(&gs, NULL, nt, sums) < 0) goto done;
    for (int64_t c = 0; c < p.C; c++) backward_channel(&p, a, &pp, c, sums[2 * c], sums[2 * c + 1]);
    if (!dx) {
        rc = 0;
    } else if (a->training || fused) {
        /* (inference with an activation: b = c = 0, dx = scale * r * g) */
        if (s->layout == CFBN_CHANNELS_LAST) tile_params(&pp, G_COUNT, p.C);
        rc = run_pass(&ga, NULL, nt, NULL);
    } else {
        /* Inference: dx = scale * r * dy does not depend on x, so it is the
         * normalization pass applied to dy (a NaN in x stays out of dx). */
        for (int64_t c = 0; c < p.C; c++) {
            params_set(&ip, P_MHI, c, 0.0);
            params_set(&ip, P_MLO, c, 0.0);
            params_set(&ip, P_ALPHA, c, pp.d ? pp.d[G_A * pp.len + c] : pp.f[G_A * pp.len + c]);
            params_set(&ip, P_BETA, c, 0.0);
        }
        if (s->layout == CFBN_CHANNELS_LAST) tile_params(&ip, P_APPLY_COUNT, p.C);
        pass ap = { .k = k, .p = &p, .pp = &ip, .kind = PASS_APPLY, .a = dy, .out = dx };
        rc = run_pass(&ap, NULL, nt, NULL);
    }
done:
    cfbn_scratch_free(sums);
    params_free(&pp);
    params_free(&ip);
    return rc;
}

static int run_backward(const cfbn_kernels *k, const cfbn_shape *s, int training,
                        const void *dy, const void *x, const void *scale,
                        const void *saved_mean, const void *saved_variance, double epsilon,
                        void *dx, void *scale_backprop, void *offset_backprop, const cfbn_fusion *fusion)
{
    bwd_args a = { training, scale, saved_mean, saved_variance, s->dtype, epsilon,
                   scale_backprop, offset_backprop };
    return backward_run(k, s, &a, dy, x, dx, fusion);
}

static int run_grad_statistics(const cfbn_kernels *k, const cfbn_shape *s, const void *dy, const void *x,
                               const double *mean, const double *variance, double epsilon,
                               double *sum_dy, double *sum_dy_xhat)
{
    bwd_args a = { 1, NULL, mean, variance, CFBN_F64, epsilon, sum_dy_xhat, sum_dy };
    return backward_run(k, s, &a, dy, x, NULL, NULL);
}

static int run_grad_apply(const cfbn_kernels *k, const cfbn_shape *s, const void *dy, const void *x,
                          const void *scale, const double *mean, const double *variance, double epsilon,
                          const double *sum_dy, const double *sum_dy_xhat, double count, void *dx)
{
    plan p;
    make_plan(k, s, &p);
    params pp;
    if (params_init(&pp, s->dtype, param_len(&p, s->layout), G_COUNT) < 0) return -1;
    pp.stream = stream_output(s, 3, 1);
    for (int64_t c = 0; c < p.C; c++) {
        double r = cfbn_rstd(variance[c], epsilon);
        params_set_mean(&pp, G_MHI, G_MLO, c, mean[c]);
        set_grad_params(&pp, c, 1, (int64_t)count, vec_get(scale, s->dtype, c), r, sum_dy[c], sum_dy_xhat[c]);
    }
    if (s->layout == CFBN_CHANNELS_LAST) tile_params(&pp, G_COUNT, p.C);
    pass ga = { .k = k, .p = &p, .pp = &pp, .kind = PASS_GAPPLY, .a = dy, .b = x, .out = dx };
    int rc = run_pass(&ga, NULL, thread_count(s), NULL);
    params_free(&pp);
    return rc;
}

/* ---- second-order gradient ---- */

typedef struct {
    int training;
    const void *scale, *saved_variance, *ggscale, *ggoffset;
    double epsilon;
    void *scale_backprop;
} gg_args;

/* Turn a channel's five sums into scale_backprop and its apply parameters. */
static void gg_channel(const plan *p, const gg_args *a, params *pp, int64_t c, const double *sums)
{
    int dt = p->dtype;
    double r = cfbn_rstd(vec_get(a->saved_variance, dt, c), a->epsilon);
    double gamma = vec_get(a->scale, dt, c);
    double ggs = a->ggscale ? vec_get(a->ggscale, dt, c) : 0.0;
    double ggo = a->ggoffset ? vec_get(a->ggoffset, dt, c) : 0.0;
    double sbp, kc[7];
    cfbn_grad_grad_params(a->training, (long long)p->n, gamma, r, ggs, ggo, sums, &sbp, kc);
    vec_set(a->scale_backprop, dt, c, sbp);
    for (int j = 0; j < 7; j++) params_set(pp, GG_A1 + j, c, kc[j]);
}

typedef struct {
    const pass *stats, *apply;
    const gg_args *a;
    params *pp;
} fused_gg;

static void fused_gg_task(void *ctx, int64_t c)
{
    const fused_gg *f = ctx;
    double acc[MAX_SUMS];
    if (f->stats->p->planes) channel_plane_sums(f->stats, NULL, c, acc);
    else first_piece(f->stats, NULL, c, 0, acc);
    gg_channel(f->stats->p, f->a, f->pp, c, acc);
    first_piece(f->apply, NULL, c, 0, acc);
}

/* Inference: dx = ggscale * r * dy, the normalization pass of dy (so that a
 * NaN in x or ggx stays out of dx, which does not depend on them). */
static int gg_inference_dx(const cfbn_kernels *k, const cfbn_shape *s, const plan *p, const gg_args *a,
                           const void *dy, void *dx)
{
    int dt = s->dtype;
    params ap;
    if (params_init(&ap, dt, param_len(p, s->layout), P_APPLY_COUNT) < 0) return -1;
    ap.stream = stream_output(s, 2, 0);
    for (int64_t c = 0; c < p->C; c++) {
        double ggs = a->ggscale ? vec_get(a->ggscale, dt, c) : 0.0;
        set_apply_params(&ap, c, 0.0, vec_get(a->saved_variance, dt, c), ggs, 0.0, a->epsilon);
    }
    if (s->layout == CFBN_CHANNELS_LAST) tile_params(&ap, P_APPLY_COUNT, p->C);
    pass pd = { .k = k, .p = p, .pp = &ap, .kind = PASS_APPLY, .a = dy, .out = dx };
    int rc = run_pass(&pd, NULL, thread_count(s), NULL);
    params_free(&ap);
    return rc;
}

/* ggx NULL: ddy = ggscale * r * (x - mean) + ggoffset is the normalization
 * pass of x, dx the gradient's pass with gamma = ggscale (training: ggscale
 * * r * (g - <g> - xhat * <g xhat>)), and scale_backprop is 0. */
static int gg_without_ggx(const cfbn_kernels *k, const cfbn_shape *s, const plan *p, const gg_args *a,
                          const void *dy, const void *x, const void *saved_mean, void *ddy, void *dx)
{
    int dt = s->dtype, nt = thread_count(s);
    params gp, ap;
    double *sums = cfbn_scratch_alloc((size_t)(p->C > 0 ? p->C : 1) * 2 * sizeof(double));
    if (!sums) return -1;
    if (params_init(&gp, dt, param_len(p, s->layout), G_COUNT) < 0) {
        cfbn_scratch_free(sums);
        return -1;
    }
    if (params_init(&ap, dt, param_len(p, s->layout), P_APPLY_COUNT) < 0) {
        cfbn_scratch_free(sums);
        params_free(&gp);
        return -1;
    }
    int rc = -1;
    gp.stream = stream_output(s, 3, 1);
    ap.stream = stream_output(s, 2, 0);
    for (int64_t c = 0; c < p->C; c++) {
        params_set_mean(&gp, G_MHI, G_MLO, c, vec_get(saved_mean, dt, c));
        vec_set(a->scale_backprop, dt, c, 0.0);
    }
    if (s->layout == CFBN_CHANNELS_LAST) tile_params(&gp, 2, p->C);
    pass gs = { .k = k, .p = p, .pp = &gp, .kind = PASS_GSTATS, .a = dy, .b = x };
    if (a->training && run_pass(&gs, NULL, nt, sums) < 0) goto done;
    for (int64_t c = 0; c < p->C; c++) {
        double var = vec_get(a->saved_variance, dt, c), r = cfbn_rstd(var, a->epsilon);
        double ggs = a->ggscale ? vec_get(a->ggscale, dt, c) : 0.0;
        double ggo = a->ggoffset ? vec_get(a->ggoffset, dt, c) : 0.0;
        if (a->training)
            set_grad_params(&gp, c, 1, p->n, ggs, r, sums[2 * c], p->n > 0 ? sums[2 * c + 1] * r : 0.0);
        set_apply_params(&ap, c, vec_get(saved_mean, dt, c), var, ggs, ggo, a->epsilon);
    }
    if (s->layout == CFBN_CHANNELS_LAST) {
        tile_params(&gp, G_COUNT, p->C);
        tile_params(&ap, P_APPLY_COUNT, p->C);
    }
    pass ga = { .k = k, .p = p, .pp = &gp, .kind = PASS_GAPPLY, .a = dy, .b = x, .out = dx };
    pass px = { .k = k, .p = p, .pp = &ap, .kind = PASS_APPLY, .a = x, .out = ddy };
    if (a->training ? run_pass(&ga, NULL, nt, NULL) : gg_inference_dx(k, s, p, a, dy, dx)) goto done;
    rc = run_pass(&px, NULL, nt, NULL);
done:
    cfbn_scratch_free(sums);
    params_free(&gp);
    params_free(&ap);
    return rc;
}

static int run_backward_backward(const cfbn_kernels *k, const cfbn_shape *s, int training,
                                 const void *dy, const void *x, const void *scale,
                                 const void *saved_mean, const void *saved_variance, double epsilon,
                                 const void *ggx, const void *ggscale, const void *ggoffset,
                                 void *ddy, void *dx, void *scale_backprop)
{
    plan p;
    make_plan(k, s, &p);
    gg_args a = { training, scale, saved_variance, ggscale, ggoffset, epsilon, scale_backprop };
    if (!ggx) return gg_without_ggx(k, s, &p, &a, dy, x, saved_mean, ddy, dx);
    int nt = thread_count(s);
    params pp;
    if (params_init(&pp, s->dtype, param_len(&p, s->layout), GG_COUNT) < 0) return -1;
    /* the pass reads three tensors and writes two */
    pp.stream = stream_output(s, 5, 1);
    int rc = -1;
    double *sums = cfbn_scratch_alloc((size_t)(p.C > 0 ? p.C : 1) * 5 * sizeof(double));
    if (!sums) goto done;
    for (int64_t c = 0; c < p.C; c++)
        params_set_mean(&pp, GG_MHI, GG_MLO, c, vec_get(saved_mean, s->dtype, c));
    pass gs = { .k = k, .p = &p, .pp = &pp, .kind = PASS_GGSTATS, .a = dy, .b = x, .q = ggx };
    pass ga = { .k = k, .p = &p, .pp = &pp, .kind = PASS_GGAPPLY,
                .a = dy, .b = x, .out = ddy, .q = ggx, .out2 = dx };
    if (per_channel(&p, 3, 0)) {
        /* One task per channel: its sums, then its outputs while the
         * channel's three inputs are in cache. */
        fused_gg ctx = { &gs, &ga, &a, &pp };
        parallel_for(nt, p.C, fused_gg_task, &ctx);
        rc = training ? 0 : gg_inference_dx(k, s, &p, &a, dy, dx);
        goto done;
    }
    if (s->layout == CFBN_CHANNELS_LAST) tile_params(&pp, 2, p.C);
    if (run_pass(&gs, NULL, nt, sums) < 0) goto done;
    for (int64_t c = 0; c < p.C; c++) gg_channel(&p, &a, &pp, c, sums + 5 * c);
    if (s->layout == CFBN_CHANNELS_LAST) tile_params(&pp, GG_COUNT, p.C);
    rc = run_pass(&ga, NULL, nt, NULL);
    if (rc == 0 && !training) rc = gg_inference_dx(k, s, &p, &a, dy, dx);
done:
    cfbn_scratch_free(sums);
    params_free(&pp);
    return rc;
}

/* ---- the entries (cfbn.h): each one call of its run_ on its family's table, traced ---- */

int cfbn_forward_training(const cfbn_kernels *k, const cfbn_shape *s,
                          const void *x, const void *scale, const void *offset,
                          const void *mean, const void *variance,
                          double epsilon, double factor,
                          void *y, void *batch_mean, void *batch_variance,
                          void *saved_mean, void *saved_variance, const cfbn_fusion *fusion)
{
    k = routed(k, 0, s, fusion);
    TRACED("forward_training", fusion,
           run_forward_training(k, s, x, scale, offset, mean, variance, epsilon, factor, y, batch_mean,
                                batch_variance, saved_mean, saved_variance, fusion));
}

int cfbn_forward_inference(const cfbn_kernels *k, const cfbn_shape *s,
                           const void *x, const void *scale, const void *offset,
                           const void *mean, const void *variance, double epsilon,
                           void *y, void *batch_mean, void *batch_variance,
                           void *saved_mean, void *saved_variance, const cfbn_fusion *fusion)
{
    k = routed(k, 0, s, fusion);
    TRACED("forward_inference", fusion,
           run_forward_inference(k, s, x, scale, offset, mean, variance, epsilon, y, batch_mean,
                                 batch_variance, saved_mean, saved_variance, fusion));
}

int cfbn_statistics(const cfbn_kernels *k, const cfbn_shape *s, const void *x, double *mean, double *m2)
{
    k = routed(k, 0, s, NULL);
    TRACED("statistics", NULL, run_statistics(k, s, x, mean, m2));
}

int cfbn_apply(const cfbn_kernels *k, const cfbn_shape *s, const void *x, const void *scale,
               const void *offset, const double *mean, const double *variance, double epsilon, void *y)
{
    k = routed(k, 0, s, NULL);
    TRACED("apply", NULL, run_apply(k, s, x, scale, offset, mean, variance, epsilon, y));
}

int cfbn_backward(const cfbn_kernels *k, const cfbn_shape *s, int training,
                  const void *dy, const void *x, const void *scale,
                  const void *saved_mean, const void *saved_variance, double epsilon,
                  void *dx, void *scale_backprop, void *offset_backprop, const cfbn_fusion *fusion)
{
    k = routed(k, 0, s, fusion);
    TRACED(training ? "backward_training" : "backward_inference", fusion,
           run_backward(k, s, training, dy, x, scale, saved_mean, saved_variance, epsilon, dx,
                        scale_backprop, offset_backprop, fusion));
}

int cfbn_grad_statistics(const cfbn_kernels *k, const cfbn_shape *s, const void *dy, const void *x,
                         const double *mean, const double *variance, double epsilon,
                         double *sum_dy, double *sum_dy_xhat)
{
    k = routed(k, 0, s, NULL);
    TRACED("grad_statistics", NULL,
           run_grad_statistics(k, s, dy, x, mean, variance, epsilon, sum_dy, sum_dy_xhat));
}

int cfbn_grad_apply(const cfbn_kernels *k, const cfbn_shape *s, const void *dy, const void *x,
                    const void *scale, const double *mean, const double *variance, double epsilon,
                    const double *sum_dy, const double *sum_dy_xhat, double count, void *dx)
{
    k = routed(k, 0, s, NULL);
    TRACED("grad_apply", NULL,
           run_grad_apply(k, s, dy, x, scale, mean, variance, epsilon, sum_dy, sum_dy_xhat, count, dx));
}

int cfbn_backward_backward(const cfbn_kernels *k, const cfbn_shape *s, int training,
                           const void *dy, const void *x, const void *scale,
                           const void *saved_mean, const void *saved_variance, double epsilon,
                           const void *ggx, const void *ggscale, const void *ggoffset,
                           void *ddy, void *dx, void *scale_backprop)
{
    k = routed(k, 1, s, NULL);
    TRACED("backward_backward", NULL,
           run_backward_backward(k, s, training, dy, x, scale, saved_mean, saved_variance, epsilon, ggx,
                                 ggscale, ggoffset, ddy, dx, scale_backprop));
}

int cfbn_openmp_enabled(void)
{
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

int cfbn_openmp_max_threads(void)
{
#ifdef _OPENMP
    if (forked_child) return 1;
    int n = omp_get_max_threads();
    return n < CFBN_MAX_THREADS ? n : CFBN_MAX_THREADS;
#else
    return 1;
#endif
}
