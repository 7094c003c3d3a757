/* cfbn kernel interface: the table of kernels every ISA file exports, and
 * the driver entry points the Cython layer calls.  How the files fit
 * together (driver -> bn_route.c -> table), and how to add an ISA or a
 * dtype: csrc/README.md.
 *
 * Two shapes of data cover every layout:
 *   - a "run": n contiguous elements of one channel (NCHW, NCDHW: one (n, c)
 *     plane, or part of it).  Per-channel parameters are single values.
 *   - "rows": rows x w elements, row-major, where column j belongs to channel
 *     j % C (NHWC, NDHWC, NC).  The driver may widen w to a multiple of C so
 *     that SIMD lanes always see whole vectors; parameters are arrays of w.
 *
 * Every kernel writes its outputs (it never accumulates into them), so a
 * piece of work is a pure function of its inputs: the driver splits a tensor
 * into pieces that depend only on the shape, never on the thread count, and
 * combines piece results in a fixed order.  That is what makes results
 * bit-identical for any number of threads.
 *
 * Numerics shared by all kernels:
 *   - statistics are sums of (x - shift) and (x - shift)^2 accumulated in
 *     double, with shift a sample of the channel, so a large mean relative to
 *     the spread does not cancel catastrophically;
 *   - x - mean is formed as (x - mhi) - mlo, where mhi + mlo is the mean
 *     split into two numbers of the compute type: x - mhi is exact whenever x
 *     is near the mean (Sterbenz), so normalization keeps full precision even
 *     when |mean| >> std.
 * Half precision tensors are stored as IEEE binary16 in uint16_t and computed
 * in float; their per-channel parameters are float.
 */
#ifndef CFBN_H
#define CFBN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Tensor dtypes.  f16 and bf16 tensors are 2-byte storage computed in float
 * with float per-channel vectors, as f32 tensors.  This is the one list of
 * storage types: code that depends on the type switches on this enum with no
 * `default:` (setup.py and tests/c/run.sh compile with -Werror=switch), so a
 * new member is a compile error at every place that must learn it
 * (csrc/README.md, "Adding a dtype"). */
enum cfbn_dtype { CFBN_F32 = 0, CFBN_F64 = 1, CFBN_F16 = 2, CFBN_BF16 = 3 };
enum cfbn_layout { CFBN_CHANNELS_LAST = 0, CFBN_CHANNELS_FIRST = 1 };
enum cfbn_isa { CFBN_ISA_SCALAR = 0, CFBN_ISA_AVX2 = 1, CFBN_ISA_NEON = 2, CFBN_ISA_AVX512 = 3, CFBN_ISA_COUNT = 4 };

/* A fused activation: y = act(pre-activation).  The one list of activations:
 * every switch on it has a case per member and no `default:` (-Werror=switch
 * makes a missing case a compile error), and cfbn_act_name gives each its
 * Python name, which cfbn._kernels checks against cfbn._args.ACTIVATIONS at
 * import (a mismatch raises).  Derivatives at the kinks
 * follow TensorFlow and PyTorch: relu'(0) = relu6'(0) = relu6'(6) = 0,
 * leaky_relu'(0) = alpha, elu'(0) = alpha (PyTorch's x <= 0 branch).  A NaN
 * pre-activation gives a NaN value and a NaN derivative. */
enum cfbn_activation {
    CFBN_ACT_NONE = 0,
    CFBN_ACT_RELU = 1,        /* max(v, 0) */
    CFBN_ACT_RELU6 = 2,       /* min(max(v, 0), 6) */
    CFBN_ACT_LEAKY_RELU = 3,  /* v > 0 ? v : alpha * v */
    CFBN_ACT_ELU = 4,         /* v > 0 ? v : alpha * (exp(v) - 1) */
    CFBN_ACT_SIGMOID = 5,     /* 1 / (1 + exp(-v)) */
    CFBN_ACT_TANH = 6,
    CFBN_ACT_SILU = 7         /* v * sigmoid(v) */
};
#define CFBN_ACT_COUNT (CFBN_ACT_SILU + 1)

/* The name cfbn's Python API gives activation code `act` ("none" for
 * CFBN_ACT_NONE), or NULL for a code outside the enum. */
const char *cfbn_act_name(int act);

/* Per-channel (or per-column) parameters of the normalization pass:
 *   y = act(((x - mhi) - mlo) * alpha + beta + side)
 * stream: a hint that the output is far larger than the caches, so it may
 * be written with non-temporal stores; results are the same either way.
 * act, act_alpha: the fused activation (CFBN_ACT_NONE: identity).
 * side: NULL, or a side input added before the activation, in x's type and
 * at x's offset for this call (f16 and bf16 tensors: uint16_t).  With act
 * NONE and side NULL a call is the plain normalization; the router (bn_route.c) reads
 * these fields to pick a table entry, and the plain entries ignore them. */
typedef struct {
    const float *mhi, *mlo, *alpha, *beta;
    int stream;
    int act;
    float act_alpha;
    const void *side;
    int64_t runs, stride;   /* run kernels: see below */
} cfbn_apply_f32;
typedef struct {
    const double *mhi, *mlo, *alpha, *beta;
    int stream;
    int act;
    double act_alpha;
    const void *side;
    int64_t runs, stride;   /* run kernels: see below */
} cfbn_apply_f64;

/* Parameters of the gradient passes (read by the router as the apply ones),
 * with g = dy * act'(pre) and
 * pre = ((x - mhi) - mlo) * ya + yb + side (the forward's pre-activation,
 * recomputed; g = dy when act is NONE):
 *   gstats: sum(g), sum(g * ((x - mhi) - mlo))        (a, b, c unused)
 *   gapply: dx = g * a + (((x - mhi) - mlo) * b + c), and side_grad = g
 *           when side_grad is not NULL
 * ya, yb and side are read only when act is not NONE; with act NONE and
 * side_grad NULL the kernels run exactly the plain gradient.
 * g_out: NULL, or where the fused gstats entries (act not NONE) also store
 * each g they sum, in the storage type, at the element's offset; it overlaps
 * none of the inputs.  The driver then runs the plain gapply on g rather
 * than forming act' a second time (bn_route.h: cfbn_route_store_g). */
typedef struct {
    const float *mhi, *mlo, *a, *b, *c;
    int stream;
    int act;
    float act_alpha;
    const float *ya, *yb;
    const void *side;
    void *side_grad;
    int64_t runs, stride;   /* run kernels: see below */
    void *g_out;
} cfbn_grad_f32;
typedef struct {
    const double *mhi, *mlo, *a, *b, *c;
    int stream;
    int act;
    double act_alpha;
    const double *ya, *yb;
    const void *side;
    void *side_grad;
    int64_t runs, stride;   /* run kernels: see below */
} cfbn_grad_f64;

/* Parameters of the second-order gradient passes, with g = dy, q = ggx (the
 * upstream gradient of dx) and d = (x - mhi) - mlo:
 *   ggstats: sum(g), sum(g * d), sum(q), sum(q * d), sum(q * g)
 *   ggapply: ddy = q * a1 + (d * b1 + c1)
 *            dx  = g * a2 + (q * b2 + (d * c2 + e2))
 * stream: a hint, as in the apply structs, that the outputs may be written
 * with non-temporal stores.  runs, stride: for the gg*_runs entries, as in
 * the other structs (below); the router sets them. */
typedef struct {
    const float *mhi, *mlo, *a1, *b1, *c1, *a2, *b2, *c2, *e2;
    int stream;
    int64_t runs, stride;
} cfbn_gg_f32;
typedef struct {
    const double *mhi, *mlo, *a1, *b1, *c1, *a2, *b2, *c2, *e2;
    int stream;
    int64_t runs, stride;
} cfbn_gg_f64;

/* One dtype's kernels, in one ISA.  Tensors are `const void *` in the
 * storage type (float, binary16 or double); float-compute sub-tables
 * (cfbn_float_kernels: float32 and float16 storage) take float parameters,
 * cfbn_double_kernels double ones.  Contracts (n, rows, w >= 0; "acc"
 * outputs are double):
 *   stats_run   acc[0] = sum(x - shift), acc[1] = sum((x - shift)^2)
 *   stats_rows  acc[j] = sum_r(x[r][j] - shift[j]), acc[w + j] = sum_r(...^2)
 *   apply_run   y[i] = ((x[i] - mhi[0]) - mlo[0]) * alpha[0] + beta[0]
 *   apply_rows  y[r][j] = ((x[r][j] - mhi[j]) - mlo[j]) * alpha[j] + beta[j]
 *   gstats_run  acc[0] = sum(dy), acc[1] = sum(dy * ((x - mhi[0]) - mlo[0]))
 *   gstats_rows acc[j], acc[w + j]: the same per column
 *   gapply_run  dx[i] = dy[i] * a[0] + (((x[i] - mhi[0]) - mlo[0]) * b[0] + c[0])
 *   gapply_rows the same per column
 * The eight plain entries are required; they see one run (p->runs <= 1),
 * no activation, no side input and regular stores, and ignore those fields.
 * The other entries are optional (NULL: bn_route.c falls back on the plain
 * ones, with the same results):
 *   *_runs      p->runs > 1 runs of one channel in one call (see runs,
 *               stride below), plain, regular stores
 *   stats_runs  (float tables only) runs > 1 runs of n elements, stride
 *               elements apart, as stats_run over all of them: their two
 *               sums added up
 *   *_stream    the plain pass with non-temporal stores (p->stream set); the
 *               rows variant is called only on whole 16-byte aligned rows
 *   *_fused     one run or rows with the activation and side input of the
 *               parameter structs, in one pass (the fallback is two passes
 *               over L1-sized blocks)
 *   *_runs_fused  p->runs > 1 runs as *_runs, with the activation and side
 *               input as *_fused, regular stores (the fallback: one *_fused
 *               call per run)
 *   gg*         the second-order gradient (cfbn_gg_*): ggstats_run writes
 *               its five sums to acc[0..5), ggstats_rows sum k of column j
 *               to acc[k * w + j]; ggapply writes ddy and dx.  One run per
 *               call.  The scalar table has all four; a NULL entry in
 *               another table runs the scalar table's.
 *   gg*_runs    optional: p->runs > 1 runs of one channel in one call, as
 *               *_runs (ggapply_runs with regular stores)
 * Differences x - mhi - mlo are formed in the compute type (float for f32,
 * f16 and bf16, double for f64); products for sums are formed and summed in
 * double.
 * A kernel may instead sum small blocks in float where that is faster, if it
 * sums again in double every column (or run) whose float sums left float's
 * range: sums must not overflow, or lose bits below 2^-126, where the
 * double sums do not (bn_avx2.c: needs_double). */
typedef void (*cfbn_stats_run_fn)(const void *x, int64_t n, double shift, double *acc);
typedef void (*cfbn_stats_rows_fn)(const void *x, int64_t rows, int64_t w, const double *shift, double *acc);
typedef void (*cfbn_stats_runs_fn)(const void *x, int64_t n, int64_t runs, int64_t stride, double shift,
                                   double *acc);

typedef void (*cfbn_apply_run_f32_fn)(const void *x, void *y, int64_t n, const cfbn_apply_f32 *p);
typedef void (*cfbn_apply_rows_f32_fn)(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f32 *p);
typedef void (*cfbn_gstats_run_f32_fn)(const void *dy, const void *x, int64_t n, const cfbn_grad_f32 *p,
                                       double *acc);
typedef void (*cfbn_gstats_rows_f32_fn)(const void *dy, const void *x, int64_t rows, int64_t w,
                                        const cfbn_grad_f32 *p, double *acc);
typedef void (*cfbn_gapply_run_f32_fn)(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f32 *p);
typedef void (*cfbn_gapply_rows_f32_fn)(const void *dy, const void *x, void *dx, int64_t rows, int64_t w,
                                        const cfbn_grad_f32 *p);

typedef void (*cfbn_apply_run_f64_fn)(const void *x, void *y, int64_t n, const cfbn_apply_f64 *p);
typedef void (*cfbn_apply_rows_f64_fn)(const void *x, void *y, int64_t rows, int64_t w, const cfbn_apply_f64 *p);
typedef void (*cfbn_gstats_run_f64_fn)(const void *dy, const void *x, int64_t n, const cfbn_grad_f64 *p,
                                       double *acc);
typedef void (*cfbn_gstats_rows_f64_fn)(const void *dy, const void *x, int64_t rows, int64_t w,
                                        const cfbn_grad_f64 *p, double *acc);
typedef void (*cfbn_gapply_run_f64_fn)(const void *dy, const void *x, void *dx, int64_t n, const cfbn_grad_f64 *p);
typedef void (*cfbn_gapply_rows_f64_fn)(const void *dy, const void *x, void *dx, int64_t rows, int64_t w,
                                        const cfbn_grad_f64 *p);

typedef void (*cfbn_ggstats_run_f32_fn)(const void *dy, const void *x, const void *ggx, int64_t n,
                                        const cfbn_gg_f32 *p, double *acc);
typedef void (*cfbn_ggstats_rows_f32_fn)(const void *dy, const void *x, const void *ggx, int64_t rows, int64_t w,
                                         const cfbn_gg_f32 *p, double *acc);
typedef void (*cfbn_ggapply_run_f32_fn)(const void *dy, const void *x, const void *ggx, void *ddy, void *dx,
                                        int64_t n, const cfbn_gg_f32 *p);
typedef void (*cfbn_ggapply_rows_f32_fn)(const void *dy, const void *x, const void *ggx, void *ddy, void *dx,
                                         int64_t rows, int64_t w, const cfbn_gg_f32 *p);
typedef void (*cfbn_ggstats_run_f64_fn)(const void *dy, const void *x, const void *ggx, int64_t n,
                                        const cfbn_gg_f64 *p, double *acc);
typedef void (*cfbn_ggstats_rows_f64_fn)(const void *dy, const void *x, const void *ggx, int64_t rows, int64_t w,
                                         const cfbn_gg_f64 *p, double *acc);
typedef void (*cfbn_ggapply_run_f64_fn)(const void *dy, const void *x, const void *ggx, void *ddy, void *dx,
                                        int64_t n, const cfbn_gg_f64 *p);
typedef void (*cfbn_ggapply_rows_f64_fn)(const void *dy, const void *x, const void *ggx, void *ddy, void *dx,
                                         int64_t rows, int64_t w, const cfbn_gg_f64 *p);

typedef struct {
    /* required */
    cfbn_stats_run_fn stats_run;
    cfbn_stats_rows_fn stats_rows;
    cfbn_apply_run_f32_fn apply_run;
    cfbn_apply_rows_f32_fn apply_rows;
    cfbn_gstats_run_f32_fn gstats_run;
    cfbn_gstats_rows_f32_fn gstats_rows;
    cfbn_gapply_run_f32_fn gapply_run;
    cfbn_gapply_rows_f32_fn gapply_rows;
    /* optional */
    cfbn_apply_run_f32_fn apply_runs;
    cfbn_gstats_run_f32_fn gstats_runs;
    cfbn_gapply_run_f32_fn gapply_runs;
    cfbn_stats_runs_fn stats_runs;
    cfbn_apply_run_f32_fn apply_run_stream;
    cfbn_apply_rows_f32_fn apply_rows_stream;
    cfbn_gapply_run_f32_fn gapply_run_stream;
    cfbn_gapply_rows_f32_fn gapply_rows_stream;
    cfbn_apply_run_f32_fn apply_run_fused;
    cfbn_apply_rows_f32_fn apply_rows_fused;
    cfbn_gstats_run_f32_fn gstats_run_fused;
    cfbn_gstats_rows_f32_fn gstats_rows_fused;
    cfbn_gapply_run_f32_fn gapply_run_fused;
    cfbn_gapply_rows_f32_fn gapply_rows_fused;
    cfbn_apply_run_f32_fn apply_runs_fused;
    cfbn_gstats_run_f32_fn gstats_runs_fused;
    cfbn_gapply_run_f32_fn gapply_runs_fused;
    cfbn_ggstats_run_f32_fn ggstats_run;
    cfbn_ggstats_rows_f32_fn ggstats_rows;
    cfbn_ggapply_run_f32_fn ggapply_run;
    cfbn_ggapply_rows_f32_fn ggapply_rows;
    cfbn_ggstats_run_f32_fn ggstats_runs;
    cfbn_ggapply_run_f32_fn ggapply_runs;
} cfbn_float_kernels;

typedef struct {
    /* required */
    cfbn_stats_run_fn stats_run;
    cfbn_stats_rows_fn stats_rows;
    cfbn_apply_run_f64_fn apply_run;
    cfbn_apply_rows_f64_fn apply_rows;
    cfbn_gstats_run_f64_fn gstats_run;
    cfbn_gstats_rows_f64_fn gstats_rows;
    cfbn_gapply_run_f64_fn gapply_run;
    cfbn_gapply_rows_f64_fn gapply_rows;
    /* optional */
    cfbn_apply_run_f64_fn apply_runs;
    cfbn_gstats_run_f64_fn gstats_runs;
    cfbn_gapply_run_f64_fn gapply_runs;
    cfbn_apply_run_f64_fn apply_run_stream;
    cfbn_apply_rows_f64_fn apply_rows_stream;
    cfbn_gapply_run_f64_fn gapply_run_stream;
    cfbn_gapply_rows_f64_fn gapply_rows_stream;
    cfbn_apply_run_f64_fn apply_run_fused;
    cfbn_apply_rows_f64_fn apply_rows_fused;
    cfbn_gstats_run_f64_fn gstats_run_fused;
    cfbn_gstats_rows_f64_fn gstats_rows_fused;
    cfbn_gapply_run_f64_fn gapply_run_fused;
    cfbn_gapply_rows_f64_fn gapply_rows_fused;
    cfbn_apply_run_f64_fn apply_runs_fused;
    cfbn_gstats_run_f64_fn gstats_runs_fused;
    cfbn_gapply_run_f64_fn gapply_runs_fused;
    cfbn_ggstats_run_f64_fn ggstats_run;
    cfbn_ggstats_rows_f64_fn ggstats_rows;
    cfbn_ggapply_run_f64_fn ggapply_run;
    cfbn_ggapply_rows_f64_fn ggapply_rows;
    cfbn_ggstats_run_f64_fn ggstats_runs;
    cfbn_ggapply_run_f64_fn ggapply_runs;
} cfbn_double_kernels;

/* One ISA's table: a sub-table per dtype (enum cfbn_dtype).  A storage type
 * computed in float is a cfbn_float_kernels member, a case in
 * cfbn_route_float_table and the element access of each ISA's float loops
 * (bn_entries.h makes its entries from them). */
/* The loop families a CPU may run from different ISAs (dispatch.c's CPU
 * rows): which loops a call runs, by its order, dtype and activation. */
enum cfbn_family {
    CFBN_FAMILY_PLAIN = 0,        /* no activation, float32 or float64 */
    CFBN_FAMILY_PLAIN_F16 = 1,    /* no activation, float16 */
    CFBN_FAMILY_PLAIN_BF16 = 2,   /* no activation, bfloat16 */
    CFBN_FAMILY_RELU = 3,         /* an activation whose derivative is a compare */
    CFBN_FAMILY_EXP = 4,          /* elu, sigmoid, tanh, silu */
    CFBN_FAMILY_SECOND_ORDER = 5, /* the gradient of the gradient */
    CFBN_FAMILY_COUNT = 6
};

typedef struct cfbn_kernels {
    const char *name;
    /* Floats its rows loops take at a time (one vector: 8 for AVX2, 4 for
     * NEON, 1 for the scalar loops).  The driver widens channels-last rows
     * to a multiple of it, so that those loops see whole vectors and no
     * per-row tail; a table must set it (kernel_check tests that it does). */
    int lanes;
    cfbn_float_kernels f32;
    cfbn_double_kernels f64;
    cfbn_float_kernels f16;
    cfbn_float_kernels bf16;
    /* NULL in an ISA's table.  In the table dispatch.c makes for a CPU whose
     * row routes families: the table each family runs on (enum
     * cfbn_family), which the driver's entries switch to first. */
    const struct cfbn_kernels *const *by_family;
} cfbn_kernels;

/* The tables.  Each exists only where its ISA file is compiled in. */
extern const cfbn_kernels cfbn_kernels_scalar;
#if defined(CFBN_HAVE_AVX2)
extern const cfbn_kernels cfbn_kernels_avx2;
#endif
#if defined(CFBN_HAVE_NEON)
extern const cfbn_kernels cfbn_kernels_neon;
#endif
#if defined(CFBN_HAVE_AVX512)
extern const cfbn_kernels cfbn_kernels_avx512;
#endif

/* dispatch.c */
const char *cfbn_isa_name(int isa);
int cfbn_isa_compiled(int isa);          /* the table is in this build */
int cfbn_isa_supported(int isa);         /* compiled and this CPU/OS can run it */
int cfbn_isa_best(void);                 /* the best supported ISA */
const cfbn_kernels *cfbn_isa_table(int isa);  /* NULL unless supported */
int64_t cfbn_cpu_l2_bytes(void);         /* one core's L2 cache as the OS reports it, 0 if unknown */
/* The table a call selects by default: cfbn_isa_best()'s, or where a CPU row
 * of dispatch.c matches this CPU, one that runs each family from the ISA
 * measured fastest for it there. */
const cfbn_kernels *cfbn_default_table(void);
const char *cfbn_cpu_row(void);          /* the matching CPU row's name, or NULL */
/* The family of a call and the table it runs on under k (k itself unless k
 * routes families). */
int cfbn_family_of(int second_order, int dtype, int act);
const char *cfbn_family_name(int family);
const cfbn_kernels *cfbn_family_table(const cfbn_kernels *k, int family);

/* bn_driver.c: a tensor seen as outer x channels x inner.
 * channels-last: outer = number of rows (N*H*W), inner = 1.
 * channels-first: outer = N, inner = spatial size. */
/* runs, stride (parameter structs): with runs > 1, a routed apply, gstats or
 * gapply run call covers `runs` runs of n elements, run k starting
 * `k * stride` elements after the given pointers (in every tensor it reads or
 * writes), with the same parameters; sums cover all runs.  A channel-first
 * channel is N such runs, one per plane: one call instead of N keeps small
 * planes from being dominated by per-call costs.  runs <= 1 means one run.
 * Rows calls ignore both fields. */

typedef struct {
    int dtype;            /* enum cfbn_dtype of x, y, dy, dx */
    int layout;           /* enum cfbn_layout */
    int64_t outer, channels, inner;
    int n_threads;        /* >= 1 */
} cfbn_shape;

/* What is fused into a forward or gradient call; a NULL cfbn_fusion means
 * none of it.  side and side_grad are tensors of x's shape and dtype; offset
 * (the forward's beta, a per-channel vector) is needed by the gradient to
 * recompute the pre-activation when act is not NONE. */
typedef struct {
    int act;                 /* enum cfbn_activation */
    double alpha;            /* leaky_relu's slope, elu's scale */
    const void *side;        /* y = act(BN(x) + side); may be NULL */
    const void *offset;      /* gradient only */
    void *side_grad;         /* gradient only: dy * act'(pre); may be NULL */
} cfbn_fusion;

/* Per-channel vectors are float for f32, f16 and bf16 tensors, double for f64.
 * Return 0, or -1 when scratch memory could not be allocated. */
int cfbn_forward_training(const cfbn_kernels *k, const cfbn_shape *s,
                          const void *x, const void *scale, const void *offset,
                          const void *mean, const void *variance,   /* may be NULL when factor == 1 */
                          double epsilon, double factor,
                          void *y, void *batch_mean, void *batch_variance,
                          void *saved_mean, void *saved_variance, const cfbn_fusion *fusion);

/* Inference also copies mean and variance to the four per-channel outputs
 * (any of which may be NULL), so that a gradient can take them straight back. */
int cfbn_forward_inference(const cfbn_kernels *k, const cfbn_shape *s,
                           const void *x, const void *scale, const void *offset,
                           const void *mean, const void *variance, double epsilon,
                           void *y, void *batch_mean, void *batch_variance,
                           void *saved_mean, void *saved_variance, const cfbn_fusion *fusion);

/* With an activation, an inference-mode gradient is dx = scale * r * g. */
int cfbn_backward(const cfbn_kernels *k, const cfbn_shape *s, int training,
                  const void *dy, const void *x, const void *scale,
                  const void *saved_mean, const void *saved_variance, double epsilon,
                  void *dx, void *scale_backprop, void *offset_backprop, const cfbn_fusion *fusion);

/* The second-order gradient (docs/spec.md): the derivatives of
 * sum(ggx * dx) + sum(ggscale * scale_backprop) + sum(ggoffset * offset_backprop)
 * of cfbn_backward's outputs with respect to dy, x and scale.  ggx, ggscale
 * and ggoffset may be NULL (zeros); saved_mean and saved_variance are the
 * gradient's.  Outputs must not overlap inputs.  In inference dx =
 * ggscale * r * dy, computed from dy alone. */
int cfbn_backward_backward(const cfbn_kernels *k, const cfbn_shape *s, int training,
                           const void *dy, const void *x, const void *scale,
                           const void *saved_mean, const void *saved_variance, double epsilon,
                           const void *ggx, const void *ggscale, const void *ggoffset,
                           void *ddy, void *dx, void *scale_backprop);

/* Split passes, one pass over the tensor each, for statistics that are
 * merged across micro-batches or processes.  Per-channel statistics and sums
 * are double; scale and offset are the tensor's vector type.
 *   statistics:      mean and m2 = sum((x - mean)^2) of each channel (NaN for an
 *                    empty tensor); count is outer * inner
 *   apply:           y as the forward pass computes it from mean and variance
 *   grad_statistics: sum_dy = sum(dy), sum_dy_xhat = sum(dy * (x - mean) / sqrt(variance + eps))
 *   grad_apply:      dx of the training-mode gradient, from the sums over all
 *                    `count` elements of the batch
 * Statistics then apply computes exactly what cfbn_forward_training does. */
int cfbn_statistics(const cfbn_kernels *k, const cfbn_shape *s, const void *x, double *mean, double *m2);
/* The training statistics of merged moments (count elements per channel, the
 * mean and m2 of each, as cfbn_statistics gives them and merged across
 * shards): the biased variance and the running outputs, computed as
 * cfbn_forward_training computes them.  running_mean and running_variance are
 * read only when factor != 1; an output may be the array an input came in. */
void cfbn_train_statistics(int64_t channels, int64_t count, const double *mean, const double *m2,
                           double factor, const double *running_mean, const double *running_variance,
                           double *variance, double *batch_mean, double *batch_variance);
int cfbn_apply(const cfbn_kernels *k, const cfbn_shape *s, const void *x, const void *scale,
               const void *offset, const double *mean, const double *variance, double epsilon, void *y);
int cfbn_grad_statistics(const cfbn_kernels *k, const cfbn_shape *s, const void *dy, const void *x,
                         const double *mean, const double *variance, double epsilon,
                         double *sum_dy, double *sum_dy_xhat);
int cfbn_grad_apply(const cfbn_kernels *k, const cfbn_shape *s, const void *dy, const void *x,
                    const void *scale, const double *mean, const double *variance, double epsilon,
                    const double *sum_dy, const double *sum_dy_xhat, double count, void *dx);

/* c_api.c: the cfbn_c_api table of c_api.h (returned as const void *, so
 * that this header does not need that one), calling the driver above with
 * the kernel table last passed to cfbn_c_api_select. */
void cfbn_c_api_select(const cfbn_kernels *k);
const void *cfbn_c_api_get(void);

/* Threads: n_threads and the default (OMP_NUM_THREADS or the core count)
 * are capped at CFBN_MAX_THREADS; in the child of a fork() every call runs on
 * one thread.  cfbn_threads_init registers the fork handler (once; 0 or -1). */
#define CFBN_MAX_THREADS 1024
int cfbn_openmp_enabled(void);
int cfbn_openmp_max_threads(void);
int cfbn_threads_init(void);
/* The route trace: one line per driver call on stderr while on (bn_driver.c
 * says what it holds).  Set before calls, from one thread. */
void cfbn_set_trace(int on);
int cfbn_trace_enabled(void);
int cfbn_forked_child(void);

/* Another thread pool for the calls of this thread (the C API's clients:
 * PyTorch's intra-op pool for cfbn.torch): run(tasks, task, ctx) calls
 * task(ctx, t) once for every t in [0, tasks), on any of its threads, and
 * returns when all are done.  NULL (the default) is cfbn's OpenMP loop.
 * The tasks are the same whichever runs them, and so are the results. */
typedef void (*cfbn_task_fn)(void *ctx, int64_t t);
typedef void (*cfbn_run_fn)(int64_t tasks, cfbn_task_fn task, void *ctx);
void cfbn_set_call_runner(cfbn_run_fn run);

#ifdef __cplusplus
}
#endif
#endif
