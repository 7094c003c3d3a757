/* Fused activation and side input, for every ISA: included by each kernel
 * file, whose plain kernels and activation loops it drives through a table
 * of that file's static functions (so everything stays private to the file
 * and is compiled with its flags).
 *
 * A call is cut into blocks of at most FUSE_BLOCK elements: whole rows when
 * a row fits, else pieces of one row (a run is one row whose parameters do
 * not vary).  Per block, the plain kernel writes the pre-activation into an
 * L1-resident buffer and the activation loop reads it back from there, so
 * memory traffic is that of the plain pass: one read of x (and of side and
 * dy), one write of each output.  Blocks depend only on the shape, so the
 * results are deterministic; block sums are added in block order.
 *
 * Every output is written from block buffers after all inputs of the block
 * have been read, so an output may be the very array of any input (y may be
 * x or side; dx and side_grad may be dy or x).
 *
 * f16 tensors are widened to float per block and use the float kernels: the
 * pre-activation and g are never rounded to half. */
#ifndef CFBN_BN_FUSE_H
#define CFBN_BN_FUSE_H

#include <string.h>

#include "bn_act.h"
#include "cfbn.h"
#include "half.h"

#define FUSE_BLOCK 512

typedef struct {
    int64_t rows, w, r, j;
    int is_run;
} fuse_iter;

typedef struct {
    int64_t off, rows, w, col;   /* col: first parameter column of the block */
} fuse_blk;

static inline fuse_iter fuse_begin(int64_t rows, int64_t w, int is_run)
{
    fuse_iter it = {rows, w, 0, 0, is_run};
    return it;
}

static inline int fuse_next(fuse_iter *it, fuse_blk *b)
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

/* Whether a call takes the fused path: a plain call never does. */
static inline int fuse_apply_on_f32(const cfbn_apply_f32 *p) { return p->act != CFBN_ACT_NONE || p->side != NULL; }
static inline int fuse_apply_on_f64(const cfbn_apply_f64 *p) { return p->act != CFBN_ACT_NONE || p->side != NULL; }
static inline int fuse_gstats_on_f32(const cfbn_grad_f32 *p) { return p->act != CFBN_ACT_NONE; }
static inline int fuse_gstats_on_f64(const cfbn_grad_f64 *p) { return p->act != CFBN_ACT_NONE; }
static inline int fuse_gapply_on_f32(const cfbn_grad_f32 *p) { return p->act != CFBN_ACT_NONE || p->side_grad != NULL; }
static inline int fuse_gapply_on_f64(const cfbn_grad_f64 *p) { return p->act != CFBN_ACT_NONE || p->side_grad != NULL; }

/* ---- float32 and float16 ---- */

typedef struct {
    /* the plain float32 kernels; the fused code hands them act NONE, side
     * NULL and stream 0, so they take their plain path */
    void (*apply_run)(const float *x, float *y, int64_t n, const cfbn_apply_f32 *p);
    void (*apply_rows)(const float *x, float *y, int64_t rows, int64_t w, const cfbn_apply_f32 *p);
    void (*gstats_run)(const float *dy, const float *x, int64_t n, const cfbn_grad_f32 *p, double *acc);
    void (*gstats_rows)(const float *dy, const float *x, int64_t rows, int64_t w, const cfbn_grad_f32 *p, double *acc);
    void (*gapply_run)(const float *dy, const float *x, float *dx, int64_t n, const cfbn_grad_f32 *p);
    void (*gapply_rows)(const float *dy, const float *x, float *dx, int64_t rows, int64_t w, const cfbn_grad_f32 *p);
    /* out[i] = act(t[i] + side[i]) (side may be NULL); side and out are
     * binary16 when half */
    void (*act)(const float *t, const void *side, void *out, int64_t n, int half, int kind, float alpha);
    /* t[i] = dy[i] * act'(t[i] + side[i]); dy and side binary16 when half */
    void (*act_grad)(float *t, const void *dy, const void *side, int64_t n, int half, int kind, float alpha);
    /* dst[i] = src[i], between binary16 and float (half) or float and float */
    void (*widen)(const void *src, float *dst, int64_t n, int half);
    void (*narrow)(const float *src, void *dst, int64_t n, int half);
} fuse_ops_f32;

static inline const void *fuse_at(const void *p, int64_t i, int half)
{
    return p ? (const char *)p + (size_t)i * (half ? 2u : 4u) : NULL;
}

static inline void *fuse_at_w(void *p, int64_t i, int half)
{
    return p ? (char *)p + (size_t)i * (half ? 2u : 4u) : NULL;
}

/* Adds a block's gradient sums (part: 2 for a run, 2 b->w for rows) to the
 * call's (acc: 2, or 2 w laid out as [sums of dy | sums of dy * d]). */
static inline void fuse_add_part(double *acc, const double *part, const fuse_blk *b, int64_t w, int is_run)
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

/* x of the block as float: in place for float tensors, widened into xb for
 * half ones */
static inline const float *fuse_x_f32(const fuse_ops_f32 *o, const void *x, const fuse_blk *b, int half, float *xb)
{
    const void *xs = fuse_at(x, b->off, half);
    if (!half) return (const float *)xs;
    o->widen(xs, xb, b->rows * b->w, 1);
    return xb;
}

static inline void fuse_apply_f32(const fuse_ops_f32 *o, const void *x, void *y, int64_t rows, int64_t w, int is_run,
                           const cfbn_apply_f32 *p, int half)
{
    float xb[FUSE_BLOCK], tb[FUSE_BLOCK];
    fuse_iter it = fuse_begin(rows, w, is_run);
    fuse_blk b;
    while (fuse_next(&it, &b)) {
        int64_t n = b.rows * b.w;
        const float *xs = fuse_x_f32(o, x, &b, half, xb);
        cfbn_apply_f32 q = {p->mhi + b.col, p->mlo + b.col, p->alpha + b.col, p->beta + b.col, 0, 0, 0.0f, NULL, 0, 0};
        if (is_run) o->apply_run(xs, tb, n, &q);
        else o->apply_rows(xs, tb, b.rows, b.w, &q);
        o->act(tb, fuse_at(p->side, b.off, half), fuse_at_w(y, b.off, half), n, half, p->act, p->act_alpha);
    }
}

/* tb = g of the block: dy * act'(pre), pre recomputed from xs */
static inline void fuse_g_f32(const fuse_ops_f32 *o, const float *xs, const void *dy, const cfbn_grad_f32 *p,
                              const fuse_blk *b, int is_run, int half, float *tb)
{
    int64_t n = b->rows * b->w;
    if (p->act != CFBN_ACT_NONE) {
        cfbn_apply_f32 q = {p->mhi + b->col, p->mlo + b->col, p->ya + b->col, p->yb + b->col, 0, 0, 0.0f, NULL, 0, 0};
        if (is_run) o->apply_run(xs, tb, n, &q);
        else o->apply_rows(xs, tb, b->rows, b->w, &q);
    } else {
        memset(tb, 0, (size_t)n * sizeof *tb);
    }
    o->act_grad(tb, fuse_at(dy, b->off, half), fuse_at(p->side, b->off, half), n, half, p->act, p->act_alpha);
}

static inline void fuse_gstats_f32(const fuse_ops_f32 *o, const void *dy, const void *x, int64_t rows, int64_t w,
                            int is_run, const cfbn_grad_f32 *p, double *acc, int half)
{
    float xb[FUSE_BLOCK], tb[FUSE_BLOCK];
    double part[2 * FUSE_BLOCK];
    int64_t na = is_run ? 1 : w;
    for (int64_t j = 0; j < 2 * na; j++) acc[j] = 0.0;
    fuse_iter it = fuse_begin(rows, w, is_run);
    fuse_blk b;
    while (fuse_next(&it, &b)) {
        int64_t n = b.rows * b.w;
        const float *xs = fuse_x_f32(o, x, &b, half, xb);
        fuse_g_f32(o, xs, dy, p, &b, is_run, half, tb);
        cfbn_grad_f32 q = {p->mhi + b.col, p->mlo + b.col, NULL, NULL, NULL, 0, 0, 0.0f, NULL, NULL, NULL, NULL, 0, 0};
        if (is_run) o->gstats_run(tb, xs, n, &q, part);
        else o->gstats_rows(tb, xs, b.rows, b.w, &q, part);
        fuse_add_part(acc, part, &b, w, is_run);
    }
}

static inline void fuse_gapply_f32(const fuse_ops_f32 *o, const void *dy, const void *x, void *dx, int64_t rows,
                            int64_t w, int is_run, const cfbn_grad_f32 *p, int half)
{
    float xb[FUSE_BLOCK], tb[FUSE_BLOCK], ub[FUSE_BLOCK];
    fuse_iter it = fuse_begin(rows, w, is_run);
    fuse_blk b;
    while (fuse_next(&it, &b)) {
        int64_t n = b.rows * b.w;
        o->widen(fuse_at(x, b.off, half), xb, n, half);
        fuse_g_f32(o, xb, dy, p, &b, is_run, half, tb);
        cfbn_grad_f32 q = {p->mhi + b.col, p->mlo + b.col, p->a + b.col, p->b + b.col, p->c + b.col,
                           0, 0, 0.0f, NULL, NULL, NULL, NULL, 0, 0};
        if (is_run) o->gapply_run(tb, xb, ub, n, &q);
        else o->gapply_rows(tb, xb, ub, b.rows, b.w, &q);
        if (p->side_grad) o->narrow(tb, fuse_at_w(p->side_grad, b.off, half), n, half);
        o->narrow(ub, fuse_at_w(dx, b.off, half), n, half);
    }
}

/* Portable activation loops (the scalar table's; SIMD tables have their own) */

static inline float fuse_ld_f32(const void *p, int64_t i, int half)
{
    return half ? cfbn_half_to_float(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline void fuse_act_scalar_f32(const float *t, const void *side, void *out, int64_t n, int half, int kind,
                                float alpha)
{
    for (int64_t i = 0; i < n; i++) {
        float v = t[i];
        if (side) v += fuse_ld_f32(side, i, half);
        v = cfbn_act_f32(kind, v, alpha);
        if (half) ((uint16_t *)out)[i] = cfbn_float_to_half(v);
        else ((float *)out)[i] = v;
    }
}

static inline void fuse_act_grad_scalar_f32(float *t, const void *dy, const void *side, int64_t n, int half, int kind,
                                     float alpha)
{
    for (int64_t i = 0; i < n; i++) {
        float v = t[i];
        if (side) v += fuse_ld_f32(side, i, half);
        t[i] = fuse_ld_f32(dy, i, half) * cfbn_act_grad_f32(kind, v, alpha);
    }
}

static inline void fuse_widen_scalar(const void *src, float *dst, int64_t n, int half)
{
    if (!half) {
        memcpy(dst, src, (size_t)n * sizeof *dst);
        return;
    }
    for (int64_t i = 0; i < n; i++) dst[i] = cfbn_half_to_float(((const uint16_t *)src)[i]);
}

static inline void fuse_narrow_scalar(const float *src, void *dst, int64_t n, int half)
{
    if (!half) {
        memmove(dst, src, (size_t)n * sizeof *src);
        return;
    }
    for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = cfbn_float_to_half(src[i]);
}

/* ---- float64 ----
 * Activations of float64 tensors run the libm formulas of bn_act.h one
 * element at a time on every ISA: a vectorized double exp would be a second
 * polynomial set to maintain for the dtype that is never the hot path; the
 * normalization itself still runs the ISA's kernels. */

typedef struct {
    void (*apply_run)(const double *x, double *y, int64_t n, const cfbn_apply_f64 *p);
    void (*apply_rows)(const double *x, double *y, int64_t rows, int64_t w, const cfbn_apply_f64 *p);
    void (*gstats_run)(const double *dy, const double *x, int64_t n, const cfbn_grad_f64 *p, double *acc);
    void (*gstats_rows)(const double *dy, const double *x, int64_t rows, int64_t w, const cfbn_grad_f64 *p,
                        double *acc);
    void (*gapply_run)(const double *dy, const double *x, double *dx, int64_t n, const cfbn_grad_f64 *p);
    void (*gapply_rows)(const double *dy, const double *x, double *dx, int64_t rows, int64_t w,
                        const cfbn_grad_f64 *p);
} fuse_ops_f64;

static inline void fuse_apply_f64(const fuse_ops_f64 *o, const double *x, double *y, int64_t rows, int64_t w, int is_run,
                           const cfbn_apply_f64 *p)
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

static inline void fuse_g_f64(const fuse_ops_f64 *o, const double *dy, const double *x, const cfbn_grad_f64 *p,
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

static inline void fuse_gstats_f64(const fuse_ops_f64 *o, const double *dy, const double *x, int64_t rows, int64_t w,
                            int is_run, const cfbn_grad_f64 *p, double *acc)
{
    double tb[FUSE_BLOCK], part[2 * FUSE_BLOCK];
    int64_t na = is_run ? 1 : w;
    for (int64_t j = 0; j < 2 * na; j++) acc[j] = 0.0;
    fuse_iter it = fuse_begin(rows, w, is_run);
    fuse_blk b;
    while (fuse_next(&it, &b)) {
        int64_t n = b.rows * b.w;
        fuse_g_f64(o, dy, x, p, &b, is_run, tb);
        cfbn_grad_f64 q = {p->mhi + b.col, p->mlo + b.col, NULL, NULL, NULL, 0, 0, 0.0, NULL, NULL, NULL, NULL, 0, 0};
        if (is_run) o->gstats_run(tb, x + b.off, n, &q, part);
        else o->gstats_rows(tb, x + b.off, b.rows, b.w, &q, part);
        fuse_add_part(acc, part, &b, w, is_run);
    }
}

static inline void fuse_gapply_f64(const fuse_ops_f64 *o, const double *dy, const double *x, double *dx, int64_t rows,
                            int64_t w, int is_run, const cfbn_grad_f64 *p)
{
    double xb[FUSE_BLOCK], tb[FUSE_BLOCK], ub[FUSE_BLOCK];
    fuse_iter it = fuse_begin(rows, w, is_run);
    fuse_blk b;
    while (fuse_next(&it, &b)) {
        int64_t n = b.rows * b.w;
        memcpy(xb, x + b.off, (size_t)n * sizeof *xb);
        fuse_g_f64(o, dy, x, p, &b, is_run, tb);
        cfbn_grad_f64 q = {p->mhi + b.col, p->mlo + b.col, p->a + b.col, p->b + b.col, p->c + b.col,
                           0, 0, 0.0, NULL, NULL, NULL, NULL, 0, 0};
        if (is_run) o->gapply_run(tb, xb, ub, n, &q);
        else o->gapply_rows(tb, xb, ub, b.rows, b.w, &q);
        if (p->side_grad) memmove((double *)p->side_grad + b.off, tb, (size_t)n * sizeof *tb);
        memmove(dx + b.off, ub, (size_t)n * sizeof *ub);
    }
}

#endif
