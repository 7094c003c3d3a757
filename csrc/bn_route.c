/* The routing layer (bn_route.h).  Baseline flags only: it calls the table
 * dispatch chose, and its fallbacks are portable C. */
#include <string.h>

#include "bn_act.h"
#include "bn_route.h"
#include "bn_runs.h"
#include "storage.h"

/* ---- pass policy ---- */

/* Channels-first reductions go plane by plane in memory order, each plane's
 * sums kept apart and added per channel in batch order, when planes have at
 * least PLANE_ORDER_MIN_PLANE elements (and there are not so many planes
 * that their sums would take a large buffer).  A channel-major walk jumps
 * between planes C*S elements apart, often a multiple of the page size, so
 * the planes of one channel crowd a few cache sets; measured, memory order
 * wins from 16x16 planes on, even where the fused per-channel passes would
 * find a channel's slice in L2 the second time. */
#define PLANE_ORDER_MIN_PLANE 256
#define PLANE_ORDER_MAX_PLANES ((int64_t)1 << 20)
/* Elementwise channels-first passes walk memory in order when a plane has
 * at least this many elements; smaller planes go channel by channel, all of
 * a channel's planes in one kernel call, since a call per small plane costs
 * more than the prefetch-friendly order saves. */
#define FLAT_MIN_PLANE 128
/* Outputs are written with non-temporal stores when a pass touches at least
 * this many bytes (all its tensors): they cannot stay in the last-level
 * cache anyway, and skipping the read for ownership of every output line
 * saves up to a third of the traffic.  Measured on a 32 MB L3, repeating a
 * pass over the same tensors: the gradient pass (three tensors) gains from
 * 38 MB in all on and ties at 19 MB; the normalization pass (two) ties or
 * loses below 50 MB and gains from 100 MB on.  On a machine with a larger
 * last-level cache the gradient's crossover is higher: with (32,128,28,28)
 * float32 NCHW (38 MB), one thread, 3590 us streaming and 2210 regular; with
 * (32,64,56,56) (77 MB) a tie; with (64,64,112,112) (616 MB), 2 threads,
 * 28.3 ms streaming and 34.7 regular.  Hence 64 MB for both. */
#define STREAM_MIN_BYTES_APPLY ((int64_t)64 << 20)
#define STREAM_MIN_BYTES_GRAD ((int64_t)64 << 20)
/* Channels-first training passes over tensors of CHANNEL_PASS_MIN_BYTES or
 * more (all tensors read) go a channel at a time where plane order applies:
 * the channel's sums plane by plane, then its output while the channel's
 * slice is still in cache, so the inputs come from memory once instead of
 * twice.  The slice (of every tensor read) must fit a core's share of that
 * cache.  Measured on (64,64,112,112) float32 at 2 threads (3.2 MB a
 * channel per tensor) against plane order: training forward 9.0 -> 8.3 ms
 * and gradient 15.0 -> 14.6 ms
 * while the two threads got 61 GB/s of copy bandwidth, gradient 24 -> 19 ms
 * while they got 38.  On (32,64,56,56), whose 51 MB of dy and x still mostly
 * hit a 32 MB L3, the gradient went 1.4 -> 2.1 ms.  On a machine with a
 * larger last-level cache (and 2 MB of L2 a core) channel by channel wins
 * from much smaller tensors on, where the second read comes from L2 rather
 * than L3: float32 NCHW, one thread, plane order -> channel by channel,
 * gradient (16,64,32,32) 696 -> 559 us, (32,128,28,28) 2257 -> 1819 us,
 * (32,64,56,56) 5250 -> 4190 us; training forward (32,64,32,32) 1012 -> 840
 * us, (32,64,56,56) 2786 -> 2282 us; outputs bit for bit the same.  Hence
 * the 8 MB floor. */
#define CHANNEL_PASS_MIN_BYTES ((int64_t)8 << 20)
/* The gradient passes (sums of dy and x, then dx from both) go a channel at
 * a time from 1 MB: read twice plane by plane, their two or three tensors
 * leave a 2 MB L2 before the second read comes, where a channel's slice is
 * still there.  Measured on a 2 MB-L2 machine, float32 NCHW, interleaved,
 * plane order -> channel by channel, gradient at 1 / 2 threads:
 * (8,32,32,32) 190-207 -> 154-157 / 80-84 -> 68-72 us; (8,64,32,32)
 * 453 -> 308-329 / 204-205 -> 165-168 us; (16,64,16,16) 188-202 -> 147-165 /
 * 80-84 -> 78 us; (4,32,32,32) 69-72 -> 64-71 / 39-40 -> 34-35 us.  The
 * forward's one tensor does not gain at that size: (8,32,32,32) 85-92 ->
 * 93-99 / 42-44 -> 46 us, (8,64,32,32) 231-233 -> 204 / 92-93 -> 96-106 us,
 * so it keeps the 8 MB floor.  Same bits either way. */
#define CHANNEL_PASS_MIN_BYTES_GRAD ((int64_t)1 << 20)
/* That holds where a core has 2 MB of L2 or more (the machine above, an
 * Intel Xeon).  On a core with 1 MB of L2 and a 32 MB L3 (AMD EPYC), plane
 * order is the faster walk for the gradient passes up to tens of MB: float32
 * NCHW, interleaved, channel by channel -> plane order, 1 / 2 threads,
 * gradient (8,32,32,32) 77-79 -> 64-66 / 46-49 -> 38-40 us, (8,64,32,32)
 * 152-157 -> 118-125 / 84-85 -> 72-76 us, (16,64,32,32) 275-286 -> 206-226 /
 * 150-152 -> 118-127 us, (32,64,32,32) 685-725 -> 581-604 / 327-375 ->
 * 267-317 us, (32,64,56,56) 2579-2619 -> 2393-2427 / 1806-1926 -> 1692-1828
 * us; second order (8,32,32,32) 125-135 -> 110-121 / 72-75 -> 66-69 us,
 * (16,64,32,32) 548-605 -> 462-475 / 285-307 -> 240-254 us, but
 * (32,64,56,56) (77 MB read) 3070-3158 -> 3395-3529 us at 2 threads.  And
 * beyond the L3 channel by channel wins there too ((64,64,112,112), above).
 * Hence 64 MB where the L2 is known and smaller than 2 MB; where it is not
 * known, 1 MB.  Same bits either way. */
#define CHANNEL_PASS_MIN_BYTES_GRAD_SMALL_L2 ((int64_t)64 << 20)
#define SMALL_L2_BYTES ((int64_t)2 << 20)
/* Small planes with a side input go pass by pass instead, the elementwise
 * pass in memory order: a channel's planes of side, C*S elements apart (often
 * a multiple of the page size), would compete for the few cache sets that
 * hold the channel's planes of x.  Measured on (32,256,14,14) float32, one
 * thread: relu with a side input, training forward 1590 us channel by
 * channel, 785 us pass by pass (the plain call: 559 us).  The gradient keeps
 * going channel by channel: there, finding dy, x and side in cache for the
 * second pass pays more.  Measured on (32,512,7,7) and (32,256,14,14), one
 * thread, relu with a side input: 1036 and 1960 us pass by pass, 850 and
 * 1660 us channel by channel (the plain calls: 440 and 810 us). */
#define CHANNEL_PASS_MAX_SLICE ((int64_t)8 << 20)

int cfbn_route_stream(int64_t bytes, int grad)
{
    return bytes >= (grad ? STREAM_MIN_BYTES_GRAD : STREAM_MIN_BYTES_APPLY);
}

int cfbn_route_plane_order(int64_t S, int64_t planes)
{
    return S >= PLANE_ORDER_MIN_PLANE && planes <= PLANE_ORDER_MAX_PLANES;
}

int cfbn_route_flat(int64_t S)
{
    return S >= FLAT_MIN_PLANE;
}

/* Set once at import (cfbn_route_set_l2_bytes), read by every call. */
static int64_t channel_pass_min_bytes_grad = CHANNEL_PASS_MIN_BYTES_GRAD;

void cfbn_route_set_l2_bytes(int64_t l2)
{
    channel_pass_min_bytes_grad =
        l2 > 0 && l2 < SMALL_L2_BYTES ? CHANNEL_PASS_MIN_BYTES_GRAD_SMALL_L2 : CHANNEL_PASS_MIN_BYTES_GRAD;
}

int64_t cfbn_route_channel_pass_min_bytes(int grad)
{
    return grad ? channel_pass_min_bytes_grad : CHANNEL_PASS_MIN_BYTES;
}

int cfbn_route_per_channel(int64_t pieces, int planes, int64_t slice, int64_t C, int side, int grad)
{
    if (pieces != 1) return 0;
    if (!planes) return !side;
    return slice <= CHANNEL_PASS_MAX_SLICE && slice * C >= cfbn_route_channel_pass_min_bytes(grad);
}

/* Stored g: float32 tensors only, where g is exactly the float the
 * elementwise pass would form, so dx keeps its bits; a 2-byte g would be
 * rounded to the storage type.  For relu, relu6 and leaky_relu without a side
 * input, act' is a compare: storing g there changed no ratio beyond the
 * noise of two fusion.py runs (relu gradient 0.95-1.47 either way).  When
 * the outputs stream (cfbn_route_stream), only with a side input: g's
 * regular stores then cost a read for ownership of every line, and streaming
 * dx over g's lines writes them back twice, but with a side input the
 * elementwise pass that recomputes g writes two outputs, which it does with
 * regular stores (streaming both was slower: bn_simd_fused.c, fgapply_nt),
 * and reads side again.  (32,56,56,64) float32, relu with a side input, one
 * thread, fusion.py, ratio to the plain gradient: NHWC 6.1 (both outputs
 * streamed) -> 2.1 (regular stores) -> 1.38 (g stored); NCHW 6.5 -> 1.52.
 * Measured with benchmarks/fusion.py before the outputs' streaming changed
 * (float32, the ratio to the plain gradient, recompute -> stored, 1 / 2
 * threads):
 *   silu (32,28,28,128) NHWC 2.03 -> 1.50 / 2.12 -> 1.50, NCHW 3.05 -> 1.97 /
 *   2.98 -> 1.92; (8,32,32,32) NHWC 2.70 -> 1.78 / 3.41 -> 2.30;
 *   relu with a side input (8,32,32,32) NHWC 2.26 -> 1.72 / 2.19 -> 1.62;
 *   but streamed, (32,56,56,64) NCHW: silu 2.17 -> 2.90 / 2.37 -> 3.33,
 *   relu with a side input 1.87 -> 2.47 / 1.82 -> 2.41. */

int cfbn_route_store_g(int dtype, int act, int side_grad, int stream)
{
    if (dtype != CFBN_F32 || act == CFBN_ACT_NONE) return 0;
    return side_grad || (!stream && !cfbn_act_grad_is_compare(act));
}

/* ---- tables ---- */

const cfbn_float_kernels *cfbn_route_float_table(const cfbn_kernels *k, int dtype)
{
    switch ((enum cfbn_dtype)dtype) {
    case CFBN_F32: return &k->f32;
    case CFBN_F16: return &k->f16;
    case CFBN_BF16: return &k->bf16;
    case CFBN_F64: break;   /* k->f64, a cfbn_double_kernels */
    }
    return NULL;
}


static const void *at(const void *p, int64_t i, size_t esize)
{
    return p ? (const char *)p + (size_t)i * esize : NULL;
}

static void *at_w(void *p, int64_t i, size_t esize)
{
    return p ? (char *)p + (size_t)i * esize : NULL;
}

/* Streaming stores pay only with whole 16-byte aligned rows of at least 64
 * bytes: a row that straddles lines would mix streamed and cached writes. */
static int rows_stream_ok(const void *out, int64_t w, size_t esize)
{
    int64_t bytes = w * (int64_t)esize;
    return ((uintptr_t)out & 15) == 0 && (bytes & 15) == 0 && bytes >= 64;
}

void cfbn_route_stats(const cfbn_kernels *k, int dtype, const void *x, int64_t rows, int64_t w, int is_run,
                      const double *shift, double *acc)
{
    cfbn_stats_run_fn run;
    cfbn_stats_rows_fn rw;
    if (dtype == CFBN_F64) {
        run = k->f64.stats_run;
        rw = k->f64.stats_rows;
    } else {
        const cfbn_float_kernels *o = cfbn_route_float_table(k, dtype);
        run = o->stats_run;
        rw = o->stats_rows;
    }
    if (is_run) run(x, rows, shift[0], acc);
    else rw(x, rows, w, shift, acc);
}

void cfbn_route_stats_runs(const cfbn_kernels *k, int dtype, const void *x, int64_t n, int64_t runs,
                           int64_t stride, double shift, double *acc)
{
    if (runs > 1 && dtype != CFBN_F64 && cfbn_route_float_table(k, dtype)->stats_runs) {
        cfbn_route_float_table(k, dtype)->stats_runs(x, n, runs, stride, shift, acc);
        return;
    }
    size_t es = cfbn_storage_size(dtype);
    acc[0] = acc[1] = 0.0;
    for (int64_t r = 0; r < runs; r++) {
        double one[2];
        prefetch_next_run(at(x, r * stride, es), n * (int64_t)es);
        cfbn_route_stats(k, dtype, at(x, r * stride, es), n, 1, 1, &shift, one);
        acc[0] += one[0];
        acc[1] += one[1];
    }
}

/* ---- the fused fallback: L1-sized blocks ----
 * A call is cut into blocks of at most FUSE_BLOCK elements: whole rows when
 * a row fits, else pieces of one row (a run is one row whose parameters do
 * not vary).  Per block, the plain kernel writes the pre-activation into an
 * L1-resident buffer and the activation loop reads it back from there, so
 * memory traffic is that of the plain pass.  Blocks depend only on the
 * shape, so results are deterministic; block sums are added in block order.
 * Every output is written from block buffers after all inputs of the block
 * have been read, so an output may be the very array of any input (y may be
 * x or side; dx and side_grad may be dy or x).  2-byte tensors are widened
 * to float per block and run the float32 kernels: the pre-activation and g
 * are never rounded to the storage type. */

#define FUSE_BLOCK 512

typedef struct {
    int64_t rows, w, r, j;
    int is_run;
} fuse_iter;

typedef struct {
    int64_t off, rows, w, col;   /* col: first parameter column of the block */
} fuse_blk;

static fuse_iter fuse_begin(int64_t rows, int64_t w, int is_run)
{
    fuse_iter it = {rows, w, 0, 0, is_run};
    return it;
}

static int fuse_next(fuse_iter *it, fuse_blk *b)
{
    if (it->w <= 0 || it->r >= it->rows) return 0;
    if (it->is_run || it->w > FUSE_BLOCK) {
        int64_t k = it->w - it->j < FUSE_BLOCK ? it->w - it->j : FUSE_BLOCK;
        b->off = it->r * it->w + it->j;
        b->rows = 1;
        b->w = k;
        b->col = it->is_run ? 0 : it->j;
        it->j += k;
        if (it->j >= it->w) {
            it->j = 0;
            it->r++;
        }
    } else {
        int64_t kr = FUSE_BLOCK / it->w;
        if (kr > it->rows - it->r) kr = it->rows - it->r;
        b->off = it->r * it->w;
        b->rows = kr;
        b->w = it->w;
        b->col = 0;
        it->r += kr;
    }
    return 1;
}

/* Adds a block's gradient sums (part: 2 for a run, 2 b->w for rows) to the
 * call's (acc: 2, or 2 w laid out as [sums of dy | sums of dy * d]). */
static void fuse_add_part(double *acc, const double *part, const fuse_blk *b, int64_t w, int is_run)
{
    if (is_run) {
        acc[0] += part[0];
        acc[1] += part[1];
        return;
    }
    for (int64_t j = 0; j < b->w; j++) {
        acc[b->col + j] += part[j];
        acc[w + b->col + j] += part[b->w + j];
    }
}


static void widen_f(int dtype, const void *src, float *dst, int64_t n)
{
    if (dtype == CFBN_F32) {
        memcpy(dst, src, (size_t)n * sizeof *dst);
        return;
    }
    for (int64_t i = 0; i < n; i++) dst[i] = cfbn_load_float(dtype, src, i);
}

static void narrow_f(int dtype, const float *src, void *dst, int64_t n)
{
    if (dtype == CFBN_F32) {
        memmove(dst, src, (size_t)n * sizeof *src);
        return;
    }
    for (int64_t i = 0; i < n; i++) cfbn_store_float(dtype, dst, i, src[i]);
}

/* x of the block as float: in place for float tensors, widened into xb for
 * 2-byte ones */
static const float *block_x_f(int dtype, const void *x, const fuse_blk *b, float *xb)
{
    const void *xs = at(x, b->off, cfbn_storage_size(dtype));
    if (dtype == CFBN_F32) return (const float *)xs;
    widen_f(dtype, xs, xb, b->rows * b->w);
    return xb;
}

static void fallback_apply_f32(const cfbn_float_kernels *o, int dtype, const void *x, void *y, int64_t rows,
                               int64_t w, int is_run, const cfbn_apply_f32 *p)
{
    float xb[FUSE_BLOCK], tb[FUSE_BLOCK];
    size_t es = cfbn_storage_size(dtype);
    fuse_iter it = fuse_begin(rows, w, is_run);
    fuse_blk b;
    while (fuse_next(&it, &b)) {
        int64_t n = b.rows * b.w;
        const float *xs = block_x_f(dtype, x, &b, xb);
        cfbn_apply_f32 q = {p->mhi + b.col, p->mlo + b.col, p->alpha + b.col, p->beta + b.col, 0, 0, 0.0f, NULL, 0, 0};
        if (is_run) o->apply_run(xs, tb, n, &q);
        else o->apply_rows(xs, tb, b.rows, b.w, &q);
        const void *side = at(p->side, b.off, es);
        void *out = at_w(y, b.off, es);
        for (int64_t i = 0; i < n; i++) {
            float v = tb[i];
            if (side) v += cfbn_load_float(dtype, side, i);
            tb[i] = cfbn_act_f32(p->act, v, p->act_alpha);
        }
        narrow_f(dtype, tb, out, n);
    }
}

/* tb = g of the block: dy * act'(pre), pre recomputed from xs */
static void block_g_f32(const cfbn_float_kernels *o, int dtype, const float *xs, const void *dy,
                        const cfbn_grad_f32 *p, const fuse_blk *b, int is_run, float *tb)
{
    int64_t n = b->rows * b->w;
    size_t es = cfbn_storage_size(dtype);
    if (p->act != CFBN_ACT_NONE) {
        cfbn_apply_f32 q = {p->mhi + b->col, p->mlo + b->col, p->ya + b->col, p->yb + b->col, 0, 0, 0.0f, NULL, 0, 0};
        if (is_run) o->apply_run(xs, tb, n, &q);
        else o->apply_rows(xs, tb, b->rows, b->w, &q);
    } else {
        memset(tb, 0, (size_t)n * sizeof *tb);
    }
    const void *d = at(dy, b->off, es), *side = at(p->side, b->off, es);
    for (int64_t i = 0; i < n; i++) {
        float v = tb[i];
        if (side) v += cfbn_load_float(dtype, side, i);
        tb[i] = cfbn_load_float(dtype, d, i) * cfbn_act_grad_f32(p->act, v, p->act_alpha);
    }
}

static void fallback_gstats_f32(const cfbn_float_kernels *o, int dtype, const void *dy, const void *x,
                                int64_t rows, int64_t w, int is_run, const cfbn_grad_f32 *p, double *acc)
{
    float xb[FUSE_BLOCK], tb[FUSE_BLOCK];
    double part[2 * FUSE_BLOCK];
    size_t es = cfbn_storage_size(dtype);
    int64_t na = is_run ? 1 : w;
    for (int64_t j = 0; j < 2 * na; j++) acc[j] = 0.0;
    fuse_iter it = fuse_begin(rows, w, is_run);
    fuse_blk b;
    while (fuse_next(&it, &b)) {
        int64_t n = b.rows * b.w;
        const float *xs = block_x_f(dtype, x, &b, xb);
        block_g_f32(o, dtype, xs, dy, p, &b, is_run, tb);
        if (p->g_out) narrow_f(dtype, tb, at_w(p->g_out, b.off, es), n);
        cfbn_grad_f32 q = {p->mhi + b.col, p->mlo + b.col, NULL, NULL, NULL, 0, 0, 0.0f, NULL, NULL, NULL, NULL, 0, 0,
                           NULL};
        if (is_run) o->gstats_run(tb, xs, n, &q, part);
        else o->gstats_rows(tb, xs, b.rows, b.w, &q, part);
        fuse_add_part(acc, part, &b, w, is_run);
    }
}

static void fallback_gapply_f32(const cfbn_float_kernels *o, int dtype, const void *dy, const void *x, void *dx,
                                int64_t rows, int64_t w, int is_run, const cfbn_grad_f32 *p)
{
    float xb[FUSE_BLOCK], tb[FUSE_BLOCK], ub[FUSE_BLOCK];
    size_t es = cfbn_storage_size(dtype);
    fuse_iter it = fuse_begin(rows, w, is_run);
    fuse_blk b;
    while (fuse_next(&it, &b)) {
        int64_t n = b.rows * b.w;
        widen_f(dtype, at(x, b.off, es), xb, n);
        block_g_f32(o, dtype, xb, dy, p, &b, is_run, tb);
        cfbn_grad_f32 q = {p->mhi + b.col, p->mlo + b.col, p->a + b.col, p->b + b.col, p->c + b.col,
                           0, 0, 0.0f, NULL, NULL, NULL, NULL, 0, 0, NULL};
        if (is_run) o->gapply_run(tb, xb, ub, n, &q);
        else o->gapply_rows(tb, xb, ub, b.rows, b.w, &q);
        if (p->side_grad) narrow_f(dtype, tb, at_w(p->side_grad, b.off, es), n);
        narrow_f(dtype, ub, at_w(dx, b.off, es), n);
    }
}

/* Float64 activations run the libm formulas of bn_math.h one element at a
 * time. */
static void fallback_apply_f64(const cfbn_double_kernels *o, const double *x, double *y, int64_t rows, int64_t w,
                               int is_run, const cfbn_apply_f64 *p)
{
    double tb[FUSE_BLOCK];
    const double *side = p->side;
    fuse_iter it = fuse_begin(rows, w, is_run);
    fuse_blk b;
    while (fuse_next(&it, &b)) {
        int64_t n = b.rows * b.w;
        cfbn_apply_f64 q = {p->mhi + b.col, p->mlo + b.col, p->alpha + b.col, p->beta + b.col, 0, 0, 0.0, NULL, 0, 0};
        if (is_run) o->apply_run(x + b.off, tb, n, &q);
        else o->apply_rows(x + b.off, tb, b.rows, b.w, &q);
        for (int64_t i = 0; i < n; i++) {
            double v = tb[i];
            if (side) v += side[b.off + i];
            y[b.off + i] = cfbn_act_f64(p->act, v, p->act_alpha);
        }
    }
}

static void block_g_f64(const cfbn_double_kernels *o, const double *dy, const double *x, const cfbn_grad_f64 *p,
                        const fuse_blk *b, int is_run, double *tb)
{
    int64_t n = b->rows * b->w;
    const double *side = p->side;
    if (p->act == CFBN_ACT_NONE) {
        memcpy(tb, dy + b->off, (size_t)n * sizeof *tb);
        return;
    }
    cfbn_apply_f64 q = {p->mhi + b->col, p->mlo + b->col, p->ya + b->col, p->yb + b->col, 0, 0, 0.0, NULL, 0, 0};
    if (is_run) o->apply_run(x + b->off, tb, n, &q);
    else o->apply_rows(x + b->off, tb, b->rows, b->w, &q);
    for (int64_t i = 0; i < n; i++) {
        double v = tb[i];
        if (side) v += side[b->off + i];
        tb[i] = dy[b->off + i] * cfbn_act_grad_f64(p->act, v, p->act_alpha);
    }
}

static void fallback_gstats_f64(const cfbn_double_kernels *o, const double *dy, const double *x, int64_t rows,
                                int64_t w, int is_run, const cfbn_grad_f64 *p, double *acc)
{
    double tb[FUSE_BLOCK], part[2 * FUSE_BLOCK];
    int64_t na = is_run ? 1 : w;
    for (int64_t j = 0; j < 2 * na; j++) acc[j] = 0.0;
    fuse_iter it = fuse_begin(rows, w, is_run);
    fuse_blk b;
    while (fuse_next(&it, &b)) {
        int64_t n = b.rows * b.w;
        block_g_f64(o, dy, x, p, &b, is_run, tb);
        cfbn_grad_f64 q = {p->mhi + b.col, p->mlo + b.col, NULL, NULL, NULL, 0, 0, 0.0, NULL, NULL, NULL, NULL, 0, 0};
        if (is_run) o->gstats_run(tb, x + b.off, n, &q, part);
        else o->gstats_rows(tb, x + b.off, b.rows, b.w, &q, part);
        fuse_add_part(acc, part, &b, w, is_run);
    }
}

static void fallback_gapply_f64(const cfbn_double_kernels *o, const double *dy, const double *x, double *dx,
                                int64_t rows, int64_t w, int is_run, const cfbn_grad_f64 *p)
{
    double xb[FUSE_BLOCK], tb[FUSE_BLOCK], ub[FUSE_BLOCK];
    fuse_iter it = fuse_begin(rows, w, is_run);
    fuse_blk b;
    while (fuse_next(&it, &b)) {
        int64_t n = b.rows * b.w;
        memcpy(xb, x + b.off, (size_t)n * sizeof *xb);
        block_g_f64(o, dy, x, p, &b, is_run, tb);
        cfbn_grad_f64 q = {p->mhi + b.col, p->mlo + b.col, p->a + b.col, p->b + b.col, p->c + b.col,
                           0, 0, 0.0, NULL, NULL, NULL, NULL, 0, 0};
        if (is_run) o->gapply_run(tb, xb, ub, n, &q);
        else o->gapply_rows(tb, xb, ub, b.rows, b.w, &q);
        if (p->side_grad) memmove((double *)p->side_grad + b.off, tb, (size_t)n * sizeof *tb);
        memmove(dx + b.off, ub, (size_t)n * sizeof *ub);
    }
}

/* A call split into runs (a channel-first channel, one call per plane)
 * first asks for what follows each run of the tensors it reads, as the
 * *_runs entries do (bn_runs.h): the next channel's plane, which the same
 * thread usually reads next.  Prefetches only; results are unchanged. */
static void prefetch_run_inputs(const void *a, const void *b, int64_t bytes)
{
    if (a) prefetch_next_run(a, bytes);
    if (b) prefetch_next_run(b, bytes);
}

/* ---- routing ----
 * Each call: several runs go to the *_runs entry (plain calls) or the
 * *_runs_fused entry (fused calls) when there is one and the call takes
 * regular stores (gradient sums: always), else one routed call per run; one
 * run or rows: fused entry (or the block fallback) when fused, the streaming
 * entry when asked for and present, else the plain entry. */

static int apply_fused(int act, const void *side)
{
    return act != CFBN_ACT_NONE || side != NULL;
}

void cfbn_route_apply_f32(const cfbn_kernels *k, int dtype, const void *x, void *y, int64_t rows, int64_t w,
                          int is_run, const cfbn_apply_f32 *p)
{
    const cfbn_float_kernels *o = cfbn_route_float_table(k, dtype);
    size_t es = cfbn_storage_size(dtype);
    int fused = apply_fused(p->act, p->side);
    if (is_run && p->runs > 1) {
        if (o->apply_runs && !fused && !p->stream) {
            o->apply_runs(x, y, rows, p);
            return;
        }
        if (o->apply_runs_fused && fused && !p->stream) {
            o->apply_runs_fused(x, y, rows, p);
            return;
        }
        cfbn_apply_f32 q = *p;
        q.runs = 1;
        for (int64_t r = 0; r < p->runs; r++) {
            q.side = at(p->side, r * p->stride, es);
            prefetch_run_inputs(at(x, r * p->stride, es), q.side, rows * (int64_t)es);
            cfbn_route_apply_f32(k, dtype, at(x, r * p->stride, es), at_w(y, r * p->stride, es), rows, w, 1, &q);
        }
        return;
    }
    if (fused) {
        if (is_run && o->apply_run_fused) o->apply_run_fused(x, y, rows, p);
        else if (!is_run && o->apply_rows_fused) o->apply_rows_fused(x, y, rows, w, p);
        else fallback_apply_f32(&k->f32, dtype, x, y, is_run ? 1 : rows, is_run ? rows : w, is_run, p);
        return;
    }
    if (is_run) {
        if (p->stream && o->apply_run_stream) o->apply_run_stream(x, y, rows, p);
        else o->apply_run(x, y, rows, p);
    } else {
        if (p->stream && o->apply_rows_stream && rows_stream_ok(y, w, es)) o->apply_rows_stream(x, y, rows, w, p);
        else o->apply_rows(x, y, rows, w, p);
    }
}

void cfbn_route_gstats_f32(const cfbn_kernels *k, int dtype, const void *dy, const void *x, int64_t rows,
                           int64_t w, int is_run, const cfbn_grad_f32 *p, double *acc)
{
    const cfbn_float_kernels *o = cfbn_route_float_table(k, dtype);
    size_t es = cfbn_storage_size(dtype);
    int fused = p->act != CFBN_ACT_NONE;
    if (is_run && p->runs > 1) {
        if (o->gstats_runs && !fused) {
            o->gstats_runs(dy, x, rows, p, acc);
            return;
        }
        if (o->gstats_runs_fused && fused) {
            o->gstats_runs_fused(dy, x, rows, p, acc);
            return;
        }
        cfbn_grad_f32 q = *p;
        q.runs = 1;
        double s1 = 0.0, s2 = 0.0, part[2];
        for (int64_t r = 0; r < p->runs; r++) {
            q.side = at(p->side, r * p->stride, es);
            q.g_out = at_w(p->g_out, r * p->stride, es);
            prefetch_run_inputs(at(dy, r * p->stride, es), at(x, r * p->stride, es), rows * (int64_t)es);
            if (q.side) prefetch_next_run(q.side, rows * (int64_t)es);
            cfbn_route_gstats_f32(k, dtype, at(dy, r * p->stride, es), at(x, r * p->stride, es), rows, w, 1, &q,
                                  part);
            s1 += part[0];
            s2 += part[1];
        }
        acc[0] = s1;
        acc[1] = s2;
        return;
    }
    if (fused) {
        if (is_run && o->gstats_run_fused) o->gstats_run_fused(dy, x, rows, p, acc);
        else if (!is_run && o->gstats_rows_fused) o->gstats_rows_fused(dy, x, rows, w, p, acc);
        else fallback_gstats_f32(&k->f32, dtype, dy, x, is_run ? 1 : rows, is_run ? rows : w, is_run, p, acc);
        return;
    }
    if (is_run) o->gstats_run(dy, x, rows, p, acc);
    else o->gstats_rows(dy, x, rows, w, p, acc);
}

void cfbn_route_gapply_f32(const cfbn_kernels *k, int dtype, const void *dy, const void *x, void *dx,
                           int64_t rows, int64_t w, int is_run, const cfbn_grad_f32 *p)
{
    const cfbn_float_kernels *o = cfbn_route_float_table(k, dtype);
    size_t es = cfbn_storage_size(dtype);
    int fused = p->act != CFBN_ACT_NONE || p->side_grad != NULL;
    if (is_run && p->runs > 1) {
        if (o->gapply_runs && !fused && !p->stream) {
            o->gapply_runs(dy, x, dx, rows, p);
            return;
        }
        if (o->gapply_runs_fused && fused && !p->stream) {
            o->gapply_runs_fused(dy, x, dx, rows, p);
            return;
        }
        cfbn_grad_f32 q = *p;
        q.runs = 1;
        for (int64_t r = 0; r < p->runs; r++) {
            q.side = at(p->side, r * p->stride, es);
            q.side_grad = at_w(p->side_grad, r * p->stride, es);
            prefetch_run_inputs(at(dy, r * p->stride, es), at(x, r * p->stride, es), rows * (int64_t)es);
            if (q.side) prefetch_next_run(q.side, rows * (int64_t)es);
            cfbn_route_gapply_f32(k, dtype, at(dy, r * p->stride, es), at(x, r * p->stride, es),
                                  at_w(dx, r * p->stride, es), rows, w, 1, &q);
        }
        return;
    }
    if (fused) {
        if (is_run && o->gapply_run_fused) o->gapply_run_fused(dy, x, dx, rows, p);
        else if (!is_run && o->gapply_rows_fused) o->gapply_rows_fused(dy, x, dx, rows, w, p);
        else fallback_gapply_f32(&k->f32, dtype, dy, x, dx, is_run ? 1 : rows, is_run ? rows : w, is_run, p);
        return;
    }
    if (is_run) {
        if (p->stream && o->gapply_run_stream) o->gapply_run_stream(dy, x, dx, rows, p);
        else o->gapply_run(dy, x, dx, rows, p);
    } else {
        if (p->stream && o->gapply_rows_stream && rows_stream_ok(dx, w, es)) o->gapply_rows_stream(dy, x, dx, rows, w, p);
        else o->gapply_rows(dy, x, dx, rows, w, p);
    }
}

void cfbn_route_apply_f64(const cfbn_kernels *k, const void *x, void *y, int64_t rows, int64_t w, int is_run,
                          const cfbn_apply_f64 *p)
{
    const cfbn_double_kernels *o = &k->f64;
    int fused = apply_fused(p->act, p->side);
    if (is_run && p->runs > 1) {
        if (o->apply_runs && !fused && !p->stream) {
            o->apply_runs(x, y, rows, p);
            return;
        }
        if (o->apply_runs_fused && fused && !p->stream) {
            o->apply_runs_fused(x, y, rows, p);
            return;
        }
        cfbn_apply_f64 q = *p;
        q.runs = 1;
        for (int64_t r = 0; r < p->runs; r++) {
            q.side = at(p->side, r * p->stride, 8);
            cfbn_route_apply_f64(k, at(x, r * p->stride, 8), at_w(y, r * p->stride, 8), rows, w, 1, &q);
        }
        return;
    }
    if (fused) {
        if (is_run && o->apply_run_fused) o->apply_run_fused(x, y, rows, p);
        else if (!is_run && o->apply_rows_fused) o->apply_rows_fused(x, y, rows, w, p);
        else fallback_apply_f64(o, x, y, is_run ? 1 : rows, is_run ? rows : w, is_run, p);
        return;
    }
    if (is_run) {
        if (p->stream && o->apply_run_stream) o->apply_run_stream(x, y, rows, p);
        else o->apply_run(x, y, rows, p);
    } else {
        if (p->stream && o->apply_rows_stream && rows_stream_ok(y, w, 8)) o->apply_rows_stream(x, y, rows, w, p);
        else o->apply_rows(x, y, rows, w, p);
    }
}

void cfbn_route_gstats_f64(const cfbn_kernels *k, const void *dy, const void *x, int64_t rows, int64_t w,
                           int is_run, const cfbn_grad_f64 *p, double *acc)
{
    const cfbn_double_kernels *o = &k->f64;
    int fused = p->act != CFBN_ACT_NONE;
    if (is_run && p->runs > 1) {
        if (o->gstats_runs && !fused) {
            o->gstats_runs(dy, x, rows, p, acc);
            return;
        }
        if (o->gstats_runs_fused && fused) {
            o->gstats_runs_fused(dy, x, rows, p, acc);
            return;
        }
        cfbn_grad_f64 q = *p;
        q.runs = 1;
        double s1 = 0.0, s2 = 0.0, part[2];
        for (int64_t r = 0; r < p->runs; r++) {
            q.side = at(p->side, r * p->stride, 8);
            cfbn_route_gstats_f64(k, at(dy, r * p->stride, 8), at(x, r * p->stride, 8), rows, w, 1, &q, part);
            s1 += part[0];
            s2 += part[1];
        }
        acc[0] = s1;
        acc[1] = s2;
        return;
    }
    if (fused) {
        if (is_run && o->gstats_run_fused) o->gstats_run_fused(dy, x, rows, p, acc);
        else if (!is_run && o->gstats_rows_fused) o->gstats_rows_fused(dy, x, rows, w, p, acc);
        else fallback_gstats_f64(o, dy, x, is_run ? 1 : rows, is_run ? rows : w, is_run, p, acc);
        return;
    }
    if (is_run) o->gstats_run(dy, x, rows, p, acc);
    else o->gstats_rows(dy, x, rows, w, p, acc);
}

void cfbn_route_gapply_f64(const cfbn_kernels *k, const void *dy, const void *x, void *dx, int64_t rows,
                           int64_t w, int is_run, const cfbn_grad_f64 *p)
{
    const cfbn_double_kernels *o = &k->f64;
    int fused = p->act != CFBN_ACT_NONE || p->side_grad != NULL;
    if (is_run && p->runs > 1) {
        if (o->gapply_runs && !fused && !p->stream) {
            o->gapply_runs(dy, x, dx, rows, p);
            return;
        }
        if (o->gapply_runs_fused && fused && !p->stream) {
            o->gapply_runs_fused(dy, x, dx, rows, p);
            return;
        }
        cfbn_grad_f64 q = *p;
        q.runs = 1;
        for (int64_t r = 0; r < p->runs; r++) {
            q.side = at(p->side, r * p->stride, 8);
            q.side_grad = at_w(p->side_grad, r * p->stride, 8);
            cfbn_route_gapply_f64(k, at(dy, r * p->stride, 8), at(x, r * p->stride, 8),
                                  at_w(dx, r * p->stride, 8), rows, w, 1, &q);
        }
        return;
    }
    if (fused) {
        if (is_run && o->gapply_run_fused) o->gapply_run_fused(dy, x, dx, rows, p);
        else if (!is_run && o->gapply_rows_fused) o->gapply_rows_fused(dy, x, dx, rows, w, p);
        else fallback_gapply_f64(o, dy, x, dx, is_run ? 1 : rows, is_run ? rows : w, is_run, p);
        return;
    }
    if (is_run) {
        if (p->stream && o->gapply_run_stream) o->gapply_run_stream(dy, x, dx, rows, p);
        else o->gapply_run(dy, x, dx, rows, p);
    } else {
        if (p->stream && o->gapply_rows_stream && rows_stream_ok(dx, w, 8)) o->gapply_rows_stream(dy, x, dx, rows, w, p);
        else o->gapply_rows(dy, x, dx, rows, w, p);
    }
}

/* ---- second-order gradient ----
 * Several runs go to the table's gg*_runs entry where it has one (ggapply:
 * not with the streaming hint), else one entry call per run, their sums
 * added in run order; a table without the entry runs the scalar table's. */

static const cfbn_float_kernels *gg_float_table(const cfbn_kernels *k, int dtype, int stats, int is_run)
{
    const cfbn_float_kernels *o = cfbn_route_float_table(k, dtype);
    int have = stats ? (is_run ? o->ggstats_run != NULL : o->ggstats_rows != NULL)
                     : (is_run ? o->ggapply_run != NULL : o->ggapply_rows != NULL);
    return have ? o : cfbn_route_float_table(&cfbn_kernels_scalar, dtype);
}

static const cfbn_double_kernels *gg_double_table(const cfbn_kernels *k, int stats, int is_run)
{
    const cfbn_double_kernels *o = &k->f64;
    int have = stats ? (is_run ? o->ggstats_run != NULL : o->ggstats_rows != NULL)
                     : (is_run ? o->ggapply_run != NULL : o->ggapply_rows != NULL);
    return have ? o : &cfbn_kernels_scalar.f64;
}

void cfbn_route_ggstats(const cfbn_kernels *k, int dtype, const void *dy, const void *x, const void *ggx,
                        int64_t rows, int64_t w, int is_run, int64_t runs, int64_t stride, const void *p,
                        double *acc)
{
    size_t es = cfbn_storage_size(dtype);
    if (!is_run) {
        if (dtype == CFBN_F64) gg_double_table(k, 1, 0)->ggstats_rows(dy, x, ggx, rows, w, p, acc);
        else gg_float_table(k, dtype, 1, 0)->ggstats_rows(dy, x, ggx, rows, w, p, acc);
        return;
    }
    /* the table's own entry for several runs, when it has one */
    if (runs > 1 && dtype == CFBN_F64 && k->f64.ggstats_runs) {
        cfbn_gg_f64 q = *(const cfbn_gg_f64 *)p;
        q.runs = runs, q.stride = stride;
        k->f64.ggstats_runs(dy, x, ggx, rows, &q, acc);
        return;
    }
    if (runs > 1 && dtype != CFBN_F64 && cfbn_route_float_table(k, dtype)->ggstats_runs) {
        cfbn_gg_f32 q = *(const cfbn_gg_f32 *)p;
        q.runs = runs, q.stride = stride;
        cfbn_route_float_table(k, dtype)->ggstats_runs(dy, x, ggx, rows, &q, acc);
        return;
    }
    double sum[5] = { 0.0, 0.0, 0.0, 0.0, 0.0 }, part[5];
    if (runs < 1) runs = 1;
    for (int64_t r = 0; r < runs; r++) {
        const void *a = at(dy, r * stride, es), *b = at(x, r * stride, es), *q = at(ggx, r * stride, es);
        if (runs > 1) {
            prefetch_run_inputs(a, b, rows * (int64_t)es);
            prefetch_next_run(q, rows * (int64_t)es);
        }
        if (dtype == CFBN_F64) gg_double_table(k, 1, 1)->ggstats_run(a, b, q, rows, p, part);
        else gg_float_table(k, dtype, 1, 1)->ggstats_run(a, b, q, rows, p, part);
        for (int j = 0; j < 5; j++) sum[j] += part[j];
    }
    for (int j = 0; j < 5; j++) acc[j] = sum[j];
}

void cfbn_route_ggapply(const cfbn_kernels *k, int dtype, const void *dy, const void *x, const void *ggx,
                        void *ddy, void *dx, int64_t rows, int64_t w, int is_run, int64_t runs, int64_t stride,
                        const void *p)
{
    size_t es = cfbn_storage_size(dtype);
    if (!is_run) {
        if (dtype == CFBN_F64) gg_double_table(k, 0, 0)->ggapply_rows(dy, x, ggx, ddy, dx, rows, w, p);
        else gg_float_table(k, dtype, 0, 0)->ggapply_rows(dy, x, ggx, ddy, dx, rows, w, p);
        return;
    }
    /* the table's own entry for several runs, regular stores only */
    if (runs > 1 && dtype == CFBN_F64 && k->f64.ggapply_runs && !((const cfbn_gg_f64 *)p)->stream) {
        cfbn_gg_f64 q = *(const cfbn_gg_f64 *)p;
        q.runs = runs, q.stride = stride;
        k->f64.ggapply_runs(dy, x, ggx, ddy, dx, rows, &q);
        return;
    }
    if (runs > 1 && dtype != CFBN_F64 && cfbn_route_float_table(k, dtype)->ggapply_runs &&
        !((const cfbn_gg_f32 *)p)->stream) {
        cfbn_gg_f32 q = *(const cfbn_gg_f32 *)p;
        q.runs = runs, q.stride = stride;
        cfbn_route_float_table(k, dtype)->ggapply_runs(dy, x, ggx, ddy, dx, rows, &q);
        return;
    }
    if (runs < 1) runs = 1;
    for (int64_t r = 0; r < runs; r++) {
        const void *a = at(dy, r * stride, es), *b = at(x, r * stride, es), *q = at(ggx, r * stride, es);
        void *oy = at_w(ddy, r * stride, es), *ox = at_w(dx, r * stride, es);
        if (runs > 1) {
            prefetch_run_inputs(a, b, rows * (int64_t)es);
            prefetch_next_run(q, rows * (int64_t)es);
        }
        if (dtype == CFBN_F64) gg_double_table(k, 0, 1)->ggapply_run(a, b, q, oy, ox, rows, p);
        else gg_float_table(k, dtype, 0, 1)->ggapply_run(a, b, q, oy, ox, rows, p);
    }
}
