/* The routing layer: the one place that decides, per call, which entry of a
 * kernel table runs and how a pass walks the tensor.  Baseline flags only.
 *
 * Per kernel call (cfbn_route_*): plain or fused, one run or several,
 * regular or streaming stores.  An optional table entry that is NULL falls
 * back on the plain entries with the same results: several runs become one
 * call per run (their sums added in run order), streaming stores become
 * regular ones, and a fused call becomes two passes over L1-sized blocks
 * (the plain kernel, then a portable activation loop).
 *
 * Per pass (cfbn_route_stream, cfbn_route_plane_order, ...): the size
 * thresholds the driver asks before it splits a pass into pieces.  Every
 * ISA gets the same policy. */
#ifndef CFBN_BN_ROUTE_H
#define CFBN_BN_ROUTE_H

#include "cfbn.h"

/* The sub-table of a float-compute dtype (CFBN_F32, CFBN_F16, CFBN_BF16). */
const cfbn_float_kernels *cfbn_route_float_table(const cfbn_kernels *k, int dtype);

/* Statistics: one run (rows == n elements, w unused) or rows of w. */
void cfbn_route_stats(const cfbn_kernels *k, int dtype, const void *x, int64_t rows, int64_t w, int is_run,
                      const double *shift, double *acc);
/* Statistics over `runs` runs of n elements, stride elements apart, all of
 * one channel: the sums of every run added up. */
void cfbn_route_stats_runs(const cfbn_kernels *k, int dtype, const void *x, int64_t n, int64_t runs,
                           int64_t stride, double shift, double *acc);

/* Float compute: dtype names the storage of the tensors (f32, f16 or bf16). */
void cfbn_route_apply_f32(const cfbn_kernels *k, int dtype, const void *x, void *y, int64_t rows, int64_t w,
                          int is_run, const cfbn_apply_f32 *p);
void cfbn_route_gstats_f32(const cfbn_kernels *k, int dtype, const void *dy, const void *x, int64_t rows,
                           int64_t w, int is_run, const cfbn_grad_f32 *p, double *acc);
void cfbn_route_gapply_f32(const cfbn_kernels *k, int dtype, const void *dy, const void *x, void *dx,
                           int64_t rows, int64_t w, int is_run, const cfbn_grad_f32 *p);

void cfbn_route_apply_f64(const cfbn_kernels *k, const void *x, void *y, int64_t rows, int64_t w, int is_run,
                          const cfbn_apply_f64 *p);
void cfbn_route_gstats_f64(const cfbn_kernels *k, const void *dy, const void *x, int64_t rows, int64_t w,
                           int is_run, const cfbn_grad_f64 *p, double *acc);
void cfbn_route_gapply_f64(const cfbn_kernels *k, const void *dy, const void *x, void *dx, int64_t rows,
                           int64_t w, int is_run, const cfbn_grad_f64 *p);

/* Second-order gradient (cfbn_gg_f32 or, for CFBN_F64, cfbn_gg_f64 at p):
 * one run (rows == n elements, w unused) or rows of w; a run call covers
 * `runs` runs `stride` elements apart, as the runs field of the other
 * parameter structs.  Run sums: acc[0..5), rows sums: acc[k * w + j]. */
void cfbn_route_ggstats(const cfbn_kernels *k, int dtype, const void *dy, const void *x, const void *ggx,
                        int64_t rows, int64_t w, int is_run, int64_t runs, int64_t stride, const void *p,
                        double *acc);
void cfbn_route_ggapply(const cfbn_kernels *k, int dtype, const void *dy, const void *x, const void *ggx,
                        void *ddy, void *dx, int64_t rows, int64_t w, int is_run, int64_t runs, int64_t stride,
                        const void *p);

/* ---- pass policy ---- */

/* Whether a fused gradient's sums pass stores g = dy * act'(pre) (in
 * side_grad, or else in dx) for the elementwise pass to read back, instead of
 * that pass forming act' again from dy, x and side: where act' costs more
 * than the store, or a side input makes the store save a read.  stream: the
 * gradient's outputs are written with non-temporal stores. */
int cfbn_route_store_g(int dtype, int act, int side_grad, int stream);

/* Whether a pass touching `bytes` in all its tensors writes its output with
 * non-temporal stores; grad: the gradient's elementwise pass (three tensors),
 * else a normalization pass. */
int cfbn_route_stream(int64_t bytes, int grad);

/* Channels-first reductions: plane by plane in memory order (planes of S
 * elements, `planes` of them in all) rather than channel by channel. */
int cfbn_route_plane_order(int64_t S, int64_t planes);

/* Channels-first elementwise passes: in memory order, plane by plane, rather
 * than channel by channel with all of a channel's planes in one call. */
int cfbn_route_flat(int64_t S);

/* Channels-first training passes: one task per channel, its sums then its
 * output.  pieces: pieces per channel; planes: cfbn_route_plane_order's
 * answer; slice: bytes of one channel in all tensors read; C channels;
 * side: a forward pass reads a fused side input too (the gradient passes
 * 0: bn_route.c); grad: a gradient pass (first or second order), whose
 * floor is lower than the forward's. */
int cfbn_route_per_channel(int64_t pieces, int planes, int64_t slice, int64_t C, int side, int grad);

/* The gradient passes' floor for cfbn_route_per_channel follows one core's
 * L2 cache (l2 bytes, 0 if unknown; cfbn_cpu_l2_bytes): set once, at import,
 * before any call.  cfbn_route_channel_pass_min_bytes: the floor in use. */
void cfbn_route_set_l2_bytes(int64_t l2);
int64_t cfbn_route_channel_pass_min_bytes(int grad);

#endif
