"""csrc/bn_math.h on the CPU: the expressions the CuPy kernels run, checked here.

The header is compiled with the system C compiler into a small shared
library; the CuPy path's passes (cfbn._gpu: its stats plan, then finalize,
then apply) are replayed with those functions and NumPy, and compared with
cfbn.reference.  The fused activation and side input are replayed the same
way (cfbn_fused_y, cfbn_fused_g) and held to test_activation.py's bounds, and
so is the second-order gradient (cfbn_ggstats_add, cfbn_grad_grad_params,
cfbn_gg_dx), to check_grad_grad's.
No GPU or CuPy needed.
"""
import ctypes
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

import cfbn
from _act_checks import (ALPHA, FUSIONS, check_fused_forward, check_fused_grad, fusion_id,
                         make_case)
from _checks import (BFLOAT16, DTYPES, LAYOUTS, SHAPES, check_forward, check_grad,
                     check_grad_grad, make_shape, random_vectors, random_x, seed_of,
                     vector_dtype)
from cfbn import _args, _gpu, reference

# bn_math.h needs enum cfbn_activation declared first: the declaration the
# CuPy preamble starts with.
WRAPPER = _gpu.activation_enum() + r"""
#include "bn_math.h"
#define LOOP for (long long i = 0; i < count; i++)
long long chan(long long i, long long C, long long inner, int first)
{ return first ? cfbn_channel_first(i, inner, C) : cfbn_channel_last(i, C); }
void apply_f(long long count, const float *x, float *y, const float *p, long long C,
             long long inner, int first)
{ LOOP { long long c = chan(i, C, inner, first);
         y[i] = cfbn_normalize_f(x[i], p[c], p[C + c], p[2 * C + c], p[3 * C + c]); } }
void apply_d(long long count, const double *x, double *y, const double *p, long long C,
             long long inner, int first)
{ LOOP { long long c = chan(i, C, inner, first);
         y[i] = cfbn_normalize_d(x[i], p[c], p[C + c], p[2 * C + c], p[3 * C + c]); } }
void gapply_f(long long count, const float *dy, const float *x, float *dx, const float *p,
              long long C, long long inner, int first)
{ LOOP { long long c = chan(i, C, inner, first);
         dx[i] = cfbn_grad_dx_f(dy[i], x[i], p[c], p[C + c], p[2 * C + c], p[3 * C + c],
                                p[4 * C + c]); } }
void gapply_d(long long count, const double *dy, const double *x, double *dx, const double *p,
              long long C, long long inner, int first)
{ LOOP { long long c = chan(i, C, inner, first);
         dx[i] = cfbn_grad_dx_d(dy[i], x[i], p[c], p[C + c], p[2 * C + c], p[3 * C + c],
                                p[4 * C + c]); } }
/* out: bm, bv, rs1, rs2, mhi, mlo, alpha, beta (8 x C doubles) */
void finalize(long long count, const double *shift, const double *sums, const double *scale,
              const double *offset, const double *mean, const double *var, long long n,
              double eps, double f, int split, double *out)
{ LOOP { double mu, v; cfbn_moments(shift[i], sums[i], sums[count + i], n, &mu, &v);
         double r = cfbn_rstd(v, eps);
         out[i] = cfbn_running(f, mean[i], mu);
         out[count + i] = cfbn_running(f, var[i], cfbn_unbiased(v, n));
         out[2 * count + i] = mu; out[3 * count + i] = v;
         out[4 * count + i] = split ? cfbn_mean_hi_f(mu) : mu;
         out[5 * count + i] = split ? cfbn_mean_lo_f(mu) : 0.0;
         out[6 * count + i] = scale[i] * r; out[7 * count + i] = offset[i]; } }
/* out: scale_bp, offset_bp, a, b, c */
void grad_params(long long count, int training, long long n, const double *gamma,
                 const double *var, double eps, const double *sums, double *out)
{ LOOP { double r = cfbn_rstd(var[i], eps);
         cfbn_grad_params(training, n, gamma[i], r, sums[i], sums[count + i], &out[i],
                          &out[2 * count + i], &out[3 * count + i], &out[4 * count + i]);
         out[count + i] = sums[i]; } }
void gstats_f(long long count, const float *dy, const float *x, float mhi, float mlo, double *s)
{ s[0] = s[1] = 0.0; LOOP cfbn_gstats_add_f(dy[i], x[i], mhi, mlo, &s[0], &s[1]); }
void stats(long long count, const double *x, double shift, double *s)
{ s[0] = s[1] = 0.0; LOOP cfbn_stats_add(x[i], shift, &s[0], &s[1]); }
/* fused: p = mhi, mlo, alpha, beta (forward) or mhi, mlo, ya, yb (g); side may be NULL */
void fused_y_f(long long count, const float *x, const float *side, float *y, const float *p,
               long long C, long long inner, int first, int kind, double act_alpha)
{ LOOP { long long c = chan(i, C, inner, first);
         y[i] = cfbn_fused_y_f(kind, (float)act_alpha, x[i], side != 0, side ? side[i] : 0.0f,
                               p[c], p[C + c], p[2 * C + c], p[3 * C + c]); } }
void fused_y_d(long long count, const double *x, const double *side, double *y, const double *p,
               long long C, long long inner, int first, int kind, double act_alpha)
{ LOOP { long long c = chan(i, C, inner, first);
         y[i] = cfbn_fused_y_d(kind, act_alpha, x[i], side != 0, side ? side[i] : 0.0,
                               p[c], p[C + c], p[2 * C + c], p[3 * C + c]); } }
void fused_g_f(long long count, const float *dy, const float *x, const float *side, float *g,
               const float *p, long long C, long long inner, int first, int kind,
               double act_alpha)
{ LOOP { long long c = chan(i, C, inner, first);
         g[i] = cfbn_fused_g_f(kind, (float)act_alpha, dy[i], x[i], side != 0,
                               side ? side[i] : 0.0f, p[c], p[C + c], p[2 * C + c],
                               p[3 * C + c]); } }
void fused_g_d(long long count, const double *dy, const double *x, const double *side,
               double *g, const double *p, long long C, long long inner, int first, int kind,
               double act_alpha)
{ LOOP { long long c = chan(i, C, inner, first);
         g[i] = cfbn_fused_g_d(kind, act_alpha, dy[i], x[i], side != 0, side ? side[i] : 0.0,
                               p[c], p[C + c], p[2 * C + c], p[3 * C + c]); } }
/* cfbn_grad_prep's ya = scale * rstd */
void grad_ya(long long count, const double *gamma, const double *var, double eps, double *out)
{ LOOP out[i] = gamma[i] * cfbn_rstd(var[i], eps); }
/* second order: one channel's five sums */
void ggstats_f(long long count, const float *g, const float *q, const float *x, float mhi,
               float mlo, double *s)
{ for (int k = 0; k < 5; k++) s[k] = 0.0;
  LOOP cfbn_ggstats_add_f(g[i], q[i], x[i], mhi, mlo, s); }
void ggstats_d(long long count, const double *g, const double *q, const double *x, double mhi,
               double *s)
{ for (int k = 0; k < 5; k++) s[k] = 0.0;
  LOOP cfbn_ggstats_add_d(g[i], q[i], x[i], mhi, 0.0, s); }
/* out: scale_bp, a1, b1, c1, a2, b2, c2, e2 (8 x C); sums: five of C */
void gg_params(long long count, int training, long long n, const double *gamma,
               const double *var, double eps, const double *ggs, const double *ggo,
               const double *sums, double *out)
{ LOOP { double s[5], k[7];
         for (int j = 0; j < 5; j++) s[j] = sums[j * count + i];
         cfbn_grad_grad_params(training, n, gamma[i], cfbn_rstd(var[i], eps), ggs[i], ggo[i], s,
                               &out[i], k);
         for (int j = 0; j < 7; j++) out[(j + 1) * count + i] = k[j]; } }
/* p: mhi, mlo, a2, b2, c2, e2 */
void ggdx_f(long long count, const float *g, const float *q, const float *x, float *dx,
            const float *p, long long C, long long inner, int first)
{ LOOP { long long c = chan(i, C, inner, first);
         dx[i] = cfbn_gg_dx_f(g[i], q[i], x[i], p[c], p[C + c], p[2 * C + c], p[3 * C + c],
                              p[4 * C + c], p[5 * C + c]); } }
void ggdx_d(long long count, const double *g, const double *q, const double *x, double *dx,
            const double *p, long long C, long long inner, int first)
{ LOOP { long long c = chan(i, C, inner, first);
         dx[i] = cfbn_gg_dx_d(g[i], q[i], x[i], p[c], p[C + c], p[2 * C + c], p[3 * C + c],
                              p[4 * C + c], p[5 * C + c]); } }
"""

CC = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
if CC is None:
    pytest.skip("no C compiler to build bn_math.h", allow_module_level=True)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    d = tmp_path_factory.mktemp("bn_math")
    src = d / "wrap.c"
    src.write_text(WRAPPER)
    so = d / "libbnmath.so"
    inc = os.path.dirname(_gpu.header_path())
    # -ffp-contract=off: GCC keeps each product and sum rounded as written
    subprocess.run([CC, "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off",
                    "-shared", "-fPIC", "-I", inc, str(src), "-o", str(so), "-lm"], check=True)
    return ctypes.CDLL(str(so))


def _p(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def _plan_sums(layout, outer, channels, inner, values):
    """Per-channel sums of `values` (a flat float64 array), partialled as _gpu plans."""
    total = values.size
    kind, p1, p2 = _gpu.stats_plan(layout, outer, channels, inner)
    if kind == "last":
        width, pieces = p1, p2
        stride = width * pieces
        padded = np.zeros(-(-total // stride) * stride)
        padded[:total] = values
        part = padded.reshape(-1, stride).sum(axis=0)          # one partial per thread
        return part.reshape(-1, channels).sum(axis=0)
    groups, lanes = p1, p2
    planes = values.reshape(outer, channels, inner)
    part = np.zeros((channels, groups, lanes))
    for g in range(groups):
        for j in range(lanes):
            part[:, g, j] = planes[g::groups, :, j::lanes].sum(axis=(0, 2))
    return part.reshape(channels, -1).sum(axis=1)


def _fused_args(act, alpha, side, comp):
    """(act code, act alpha, side as the compute type or None)."""
    code, a = _args.activation(act, alpha)
    if side is not None:
        side = np.ascontiguousarray(side).reshape(-1).astype(comp)
    return code, a, side


def _types(x, data_format):
    """x contiguous, its layout (code, outer, channels, inner), the vector
    dtype, whether the compute type is float, and the compute type."""
    xc = np.ascontiguousarray(x)
    vdt = vector_dtype(x.dtype)
    f32 = vdt == np.float32
    return xc, _args.layout(data_format, xc), vdt, f32, np.float32 if f32 else np.float64


def emulate_forward(lib, x, v, *, epsilon, data_format, is_training, factor, act=None,
                    alpha=None, side=None):
    xc, (layout, outer, channels, inner), vdt, f32, comp = _types(x, data_format)
    flat = xc.reshape(-1).astype(comp)
    n = outer * inner
    d = lambda a: np.ascontiguousarray(a, np.float64)  # noqa: E731
    if is_training:
        first = xc.reshape(outer, channels, inner)[0, :, 0] if n else np.zeros(channels)
        shift = d(np.asarray(first, comp))
        shifted = flat.astype(np.float64).reshape(outer, channels, inner) - shift[None, :, None]
        s1 = _plan_sums(layout, outer, channels, inner, shifted.reshape(-1))
        s2 = _plan_sums(layout, outer, channels, inner, (shifted * shifted).reshape(-1))
        sums = d(np.concatenate([s1, s2]))
        out = np.empty(8 * channels)
        lib.finalize(ctypes.c_longlong(channels), _p(shift), _p(sums), _p(d(v["scale"])),
                     _p(d(v["offset"])), _p(d(v["mean"])), _p(d(v["variance"])),
                     ctypes.c_longlong(n), ctypes.c_double(epsilon), ctypes.c_double(factor),
                     ctypes.c_int(int(f32)), _p(out))
        vec = out.reshape(8, channels)
    else:
        mu, var = d(v["mean"]), d(v["variance"])
        r = 1.0 / np.sqrt(var + epsilon)
        hi = mu.astype(comp).astype(np.float64)
        vec = np.stack([mu, var, mu, var, hi, (mu - hi).astype(comp), d(v["scale"]) * r,
                        d(v["offset"])])
        if n == 0:
            vec[:2] = np.nan      # cfbn._gpu's empty inference batch, as TensorFlow's
    params = np.ascontiguousarray(vec[4:], comp)
    y = np.empty_like(flat)
    args = (ctypes.c_longlong(channels), ctypes.c_longlong(max(inner, 1)), ctypes.c_int(layout))
    code, act_alpha, side = _fused_args(act, alpha, side, comp)
    if code or side is not None:
        fn = lib.fused_y_f if f32 else lib.fused_y_d
        fn(ctypes.c_longlong(flat.size), _p(flat), None if side is None else _p(side), _p(y),
           _p(params), *args, ctypes.c_int(code), ctypes.c_double(act_alpha))
    else:
        fn = lib.apply_f if f32 else lib.apply_d
        fn(ctypes.c_longlong(flat.size), _p(flat), _p(y), _p(params), *args)
    stats = [vec[k].astype(vdt) for k in range(4)]
    return reference.BatchNormOutput(y.astype(x.dtype).reshape(x.shape), *stats)


def emulate_grad(lib, dy, x, scale, mu, var, *, epsilon, data_format, is_training, offset=None,
                 act=None, alpha=None, side=None):
    xc, (layout, outer, channels, inner), vdt, f32, comp = _types(x, data_format)
    n = outer * inner
    xf = xc.reshape(outer, channels, inner).astype(comp)
    gf = np.ascontiguousarray(dy).reshape(outer, channels, inner).astype(comp)
    mu64 = np.asarray(mu, np.float64)
    hi = mu64.astype(comp)
    lo = (mu64 - hi.astype(np.float64)).astype(comp)
    centered = (xf - hi[None, :, None]) - lo[None, :, None]      # in the compute type
    args = (ctypes.c_longlong(channels), ctypes.c_longlong(max(inner, 1)), ctypes.c_int(layout))
    code, act_alpha, side_c = _fused_args(act, alpha, side, comp)
    fused = bool(code) or side is not None
    g_out = None
    if code:
        # cfbn_grad_prep, then g = dy * act'(pre) in place of dy, as cfbn_gstats_act
        # and cfbn_gapply_act/_side compute it per element
        ya = np.empty(channels)
        lib.grad_ya(ctypes.c_longlong(channels), _p(np.ascontiguousarray(scale, np.float64)),
                    _p(np.ascontiguousarray(var, np.float64)), ctypes.c_double(epsilon), _p(ya))
        gp = np.ascontiguousarray(np.stack([hi, lo, ya.astype(comp), np.asarray(offset, comp)]),
                                  comp)
        g = np.empty(xf.size, comp)
        fn = lib.fused_g_f if f32 else lib.fused_g_d
        fn(ctypes.c_longlong(g.size), _p(np.ascontiguousarray(gf.reshape(-1))),
           _p(np.ascontiguousarray(xf.reshape(-1))),
           None if side_c is None else _p(side_c), _p(g), _p(gp), *args, ctypes.c_int(code),
           ctypes.c_double(act_alpha))
        gf = g.reshape(gf.shape)
    if side is not None:
        g_out = gf.reshape(-1).astype(x.dtype).reshape(x.shape)
    s1 = _plan_sums(layout, outer, channels, inner, gf.astype(np.float64).reshape(-1))
    s2 = _plan_sums(layout, outer, channels, inner,
                    (gf.astype(np.float64) * centered.astype(np.float64)).reshape(-1))
    sums = np.ascontiguousarray(np.concatenate([s1, s2]))
    out = np.empty(5 * channels)
    lib.grad_params(ctypes.c_longlong(channels), ctypes.c_int(int(is_training)),
                    ctypes.c_longlong(n), _p(np.ascontiguousarray(scale, np.float64)),
                    _p(np.ascontiguousarray(var, np.float64)), ctypes.c_double(epsilon),
                    _p(sums), _p(out))
    vec = out.reshape(5, channels)
    flat_x, flat_g = xf.reshape(-1).copy(), gf.reshape(-1).copy()
    dx = np.empty_like(flat_x)
    if is_training or fused:
        params = np.ascontiguousarray(np.stack([hi, lo, *vec[2:].astype(comp)]), comp)
        fn = lib.gapply_f if f32 else lib.gapply_d
        fn(ctypes.c_longlong(dx.size), _p(flat_g), _p(flat_x), _p(dx), _p(params), *args)
    else:
        zero = np.zeros(channels, comp)
        params = np.ascontiguousarray(np.stack([zero, zero, vec[2].astype(comp), zero]), comp)
        fn = lib.apply_f if f32 else lib.apply_d
        fn(ctypes.c_longlong(dx.size), _p(flat_g), _p(dx), _p(params), *args)
    result = (dx.astype(x.dtype).reshape(x.shape), vec[0].astype(vdt), vec[1].astype(vdt))
    if side is not None:
        return reference.BatchNormGradSide(*result, g_out)
    return reference.BatchNormGrad(*result)


def emulate_grad_grad(lib, dy, x, scale, mu, var, ggx, ggs, ggo, *, epsilon, data_format,
                      is_training):
    """cfbn._gpu's second-order passes with ggx: the five sums (partialled as
    planned), cfbn_grad_grad_params, then ddy = cfbn_grad_dx of ggx and
    dx = cfbn_gg_dx in training, dx = the normalization of dy in inference."""
    xc, (layout, outer, channels, inner), vdt, f32, comp = _types(x, data_format)
    n = outer * inner
    flat = [np.ascontiguousarray(a).reshape(-1).astype(comp) for a in (dy, xc, ggx)]
    g, xf, q = flat
    mu64 = np.asarray(mu, np.float64)
    hi = mu64.astype(comp)
    lo = (mu64 - hi.astype(np.float64)).astype(comp)
    shape3 = (outer, channels, inner)
    d = ((xf.reshape(shape3) - hi[None, :, None]) - lo[None, :, None]).astype(np.float64)
    g64, q64 = g.reshape(shape3).astype(np.float64), q.reshape(shape3).astype(np.float64)
    sums = np.ascontiguousarray(np.concatenate([
        _plan_sums(layout, outer, channels, inner, v.reshape(-1))
        for v in (g64, g64 * d, q64, q64 * d, q64 * g64)]))
    vec = lambda a: np.ascontiguousarray(a, np.float64)  # noqa: E731
    zero = np.zeros(channels)
    out = np.empty(8 * channels)
    lib.gg_params(ctypes.c_longlong(channels), ctypes.c_int(int(is_training)),
                  ctypes.c_longlong(n), _p(vec(scale)), _p(vec(var)), ctypes.c_double(epsilon),
                  _p(vec(zero if ggs is None else ggs)), _p(vec(zero if ggo is None else ggo)),
                  _p(sums), _p(out))
    k = out.reshape(8, channels)[1:].astype(comp)
    args = (ctypes.c_longlong(channels), ctypes.c_longlong(max(inner, 1)), ctypes.c_int(layout))
    ddy, dx = np.empty_like(xf), np.empty_like(xf)
    fn = lib.gapply_f if f32 else lib.gapply_d
    fn(ctypes.c_longlong(xf.size), _p(q), _p(xf), _p(ddy),
       _p(np.ascontiguousarray(np.stack([hi, lo, k[0], k[1], k[2]]))), *args)
    if is_training:
        fn = lib.ggdx_f if f32 else lib.ggdx_d
        fn(ctypes.c_longlong(xf.size), _p(g), _p(q), _p(xf), _p(dx),
           _p(np.ascontiguousarray(np.stack([hi, lo, k[3], k[4], k[5], k[6]]))), *args)
    else:
        z = np.zeros(channels, comp)
        fn = lib.apply_f if f32 else lib.apply_d
        fn(ctypes.c_longlong(xf.size), _p(g), _p(dx),
           _p(np.ascontiguousarray(np.stack([z, z, k[3], z]))), *args)
    return reference.BatchNormGradGrad(ddy.astype(x.dtype).reshape(x.shape),
                                       dx.astype(x.dtype).reshape(x.shape),
                                       out[:channels].astype(vdt))


@pytest.mark.parametrize("dims", SHAPES + [(64, 4096, 3), (2, 70000, 2)], ids=str)
@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
def test_gpu_formulas_forward(lib, dtype, data_format, dims, is_training):
    rng = np.random.default_rng(seed_of("bn_math-fwd", dtype, data_format, dims, is_training))
    shape = make_shape(data_format, *dims)
    x = random_x(rng, shape, data_format, dtype)
    v = random_vectors(rng, dims[2], dtype)
    f = 0.3 if is_training else 1.0
    kw = dict(epsilon=1e-3, data_format=data_format, is_training=is_training)
    got = emulate_forward(lib, x, v, factor=f, **kw)
    with np.errstate(invalid="ignore"):
        check_forward(got, x, v["scale"], v["offset"], v["mean"], v["variance"],
                      exponential_avg_factor=f, **kw)


def grad_cases(test):
    """The gradients' cases: every shape, layout and dtype, training and inference."""
    for mark in (pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"]),
                 pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name),
                 pytest.mark.parametrize("data_format", LAYOUTS),
                 pytest.mark.parametrize("dims", SHAPES + [(64, 4096, 3)], ids=str)):
        test = mark(test)
    return test


@grad_cases
def test_gpu_formulas_grad(lib, dtype, data_format, dims, is_training):
    rng = np.random.default_rng(seed_of("bn_math-grad", dtype, data_format, dims, is_training))
    shape = make_shape(data_format, *dims)
    x = random_x(rng, shape, data_format, dtype)
    dy = random_x(rng, shape, data_format, dtype, loc=0.0, std=1.0)
    v = random_vectors(rng, dims[2], dtype)
    kw = dict(epsilon=1e-3, data_format=data_format, is_training=is_training)
    got = emulate_grad(lib, dy, x, v["scale"], v["mean"], v["variance"], **kw)
    check_grad(got, dy, x, v["scale"], v["mean"], v["variance"], **kw)


@grad_cases
def test_gpu_formulas_grad_grad(lib, dtype, data_format, dims, is_training):
    rng = np.random.default_rng(seed_of("bn_math-gg", dtype, data_format, dims, is_training))
    shape = make_shape(data_format, *dims)
    x = random_x(rng, shape, data_format, dtype)
    dy, ggx = (random_x(rng, shape, data_format, dtype, loc=0.0, std=1.0) for _ in range(2))
    v, w = random_vectors(rng, dims[2], dtype), random_vectors(rng, dims[2], dtype)
    args = (dy, x, v["scale"], v["mean"], v["variance"], ggx, w["scale"], w["offset"])
    kw = dict(epsilon=1e-3, data_format=data_format, is_training=is_training)
    got = emulate_grad_grad(lib, *args, **kw)
    check_grad_grad(got, *args, **kw)
    cpu = cfbn.fused_batch_norm_grad_grad(*args, **kw)
    tol = {np.dtype(np.float16): 1e-2, BFLOAT16: 4e-2,
           np.dtype(np.float32): 1e-5}.get(np.dtype(dtype), 1e-12)
    for a, b in zip(got, cpu):
        b = b.astype(np.float64)
        scale = max(1.0, float(np.max(np.abs(b)))) if b.size else 1.0
        np.testing.assert_allclose(a.astype(np.float64), b, rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_ggstats_add_sums(lib, dtype):
    """cfbn_ggstats_add's five sums: centered in the compute type, products in double."""
    rng = np.random.default_rng(seed_of("bn_math-ggstats", np.dtype(dtype).name))
    g, q, x = (rng.standard_normal(1000).astype(dtype) for _ in range(3))
    m = 0.3
    s = np.empty(5)
    if dtype == np.float32:
        mhi = np.float32(m)
        mlo = np.float32(m - float(mhi))
        lib.ggstats_f(ctypes.c_longlong(x.size), _p(g), _p(q), _p(x), ctypes.c_float(mhi),
                      ctypes.c_float(mlo), _p(s))
        d = ((x - mhi) - mlo).astype(np.float64)
    else:
        lib.ggstats_d(ctypes.c_longlong(x.size), _p(g), _p(q), _p(x), ctypes.c_double(m), _p(s))
        d = x - m
    g64, q64 = g.astype(np.float64), q.astype(np.float64)
    want = [np.sum(v) for v in (g64, g64 * d, q64, q64 * d, q64 * g64)]
    np.testing.assert_allclose(s, want, rtol=1e-12, atol=1e-12)


def test_large_mean_float32(lib):
    rng = np.random.default_rng(seed_of("bn_math-shift"))
    shape = make_shape("NCHW", 4, 999, 5)
    x = random_x(rng, shape, "NCHW", np.float32, loc=1e4, std=1.0)
    v = random_vectors(rng, 5, np.float32)
    kw = dict(epsilon=1e-4, data_format="NCHW", is_training=True)
    got = emulate_forward(lib, x, v, factor=1.0, **kw)
    check_forward(got, x, v["scale"], v["offset"], None, None, **kw)


def test_stats_plan_covers_every_element_once():
    for layout, (outer, c, inner) in [(0, (1000, 3, 1)), (0, (7, 1000, 1)), (0, (3, 1, 1)),
                                      (1, (5, 7, 100000)), (1, (256, 256, 49)), (1, (1, 1, 3))]:
        total = outer * c * inner
        idx = np.arange(total, dtype=np.float64)
        assert _plan_sums(layout, outer, c, inner, idx).sum() == idx.sum()
        kind, p1, p2 = _gpu.stats_plan(layout, outer, c, inner)
        if kind == "last":
            assert p1 % c == 0 and p1 * p2 <= max(_gpu.TARGET_THREADS, p1)
        else:
            assert 1 <= p1 <= outer and 1 <= p2 <= inner


# training on several shapes (one empty batch), inference on one
LARGE = (64, 4096, 3)
FUSED_MODES = [(True, (3, 33, 17)), (True, (1, 7, 257)), (True, (2, 5, 3)), (True, (0, 7, 8)),
               (True, LARGE), (False, (3, 33, 17))]
# The large batch is there for the multi-block statistics plans, which are the
# same for every activation: a plain, a select and an exp-based fusion.
LARGE_FUSIONS = [(None, True), ("relu", False), ("silu", True)]
FUSED_CASES = [
    pytest.param(act, side, train, shape, id="-".join(
        (fusion_id(act), fusion_id(side), "train" if train else "infer", "x".join(map(str, shape)))))
    for act, side in FUSIONS for train, shape in FUSED_MODES
    if shape != LARGE or (act, side) in LARGE_FUSIONS]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW", "NC"])
@pytest.mark.parametrize("act,with_side,is_training,shape_case", FUSED_CASES)
def test_gpu_formulas_fused(lib, act, with_side, data_format, dtype, is_training, shape_case):
    x, v, side, dy = make_case(data_format, dtype, shape_case,
                               seed_of("bn_math-fused", act, data_format, np.dtype(dtype).name,
                                       with_side, is_training, shape_case), with_side)
    alpha = ALPHA.get(act)
    kw = dict(epsilon=1e-3, data_format=data_format, is_training=is_training)
    mean, var = (None, None) if is_training else (v["mean"], v["variance"])
    stats = {k: (v[k] if mean is not None else np.full_like(v[k], np.nan))
             for k in ("mean", "variance")}
    with np.errstate(invalid="ignore"):
        got = emulate_forward(lib, x, dict(v, **stats), factor=1.0, act=act, alpha=alpha,
                              side=side, **kw)
    check_fused_forward(got, x, v["scale"], v["offset"], mean, var, side, act, alpha, **kw)
    vdt = vector_dtype(dtype)
    if is_training:
        fwd = reference.fused_batch_norm(x, v["scale"], v["offset"], data_format=data_format)
        mu, var = fwd.reserve_space_1.astype(vdt), fwd.reserve_space_2.astype(vdt)
    else:
        mu, var = v["mean"], v["variance"]
    with np.errstate(invalid="ignore"):
        grad = emulate_grad(lib, dy, x, v["scale"], mu, var, offset=v["offset"], act=act,
                            alpha=alpha, side=side, **kw)
    assert isinstance(grad, reference.BatchNormGradSide if with_side else reference.BatchNormGrad)
    check_fused_grad(grad, dy, x, v["scale"], v["offset"], mu, var, side, act, alpha, **kw)


@pytest.mark.parametrize("act", ["relu", "relu6", "leaky_relu", "elu"])
def test_fused_derivative_at_kinks(lib, act):
    """relu'(0) = 0, relu6'(0) = relu6'(6) = 0, leaky_relu'(0) = elu'(0) = alpha."""
    x = np.array([[0.0, 6.0, -1.0, 2.0]], np.float32)
    ones, zeros = np.ones(4, np.float32), np.zeros(4, np.float32)
    g = emulate_grad(lib, np.ones_like(x), x, ones, zeros, ones, epsilon=0.0, data_format="NC",
                     is_training=False, offset=zeros, act=act)
    alpha = {"leaky_relu": 0.01, "elu": 1.0}.get(act, 0.0)
    want = {"relu": [0, 1, 0, 1], "relu6": [0, 0, 0, 1],
            "leaky_relu": [alpha, 1, alpha, 1], "elu": [alpha, 1, np.exp(-1.0), 1]}[act]
    np.testing.assert_allclose(g.x_backprop[0], want, rtol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_fused_matches_cpu_path(lib, dtype):
    """The replayed GPU formulas against the C kernels, every activation with a side input."""
    for act in [None, "relu", "relu6", "leaky_relu", "elu", "sigmoid", "tanh", "silu"]:
        x, v, side, dy = make_case("NHWC", dtype, (2, 9, 5), seed_of("bn_math-cpu", act), True)
        alpha = ALPHA.get(act)
        kw = dict(epsilon=1e-3, data_format="NHWC", is_training=True)
        cpu = cfbn.fused_batch_norm(x, v["scale"], v["offset"], activation=act, alpha=alpha,
                                    side_input=side, **kw)
        got = emulate_forward(lib, x, v, factor=1.0, act=act, alpha=alpha, side=side, **kw)
        tol = {np.dtype(np.float16): 1e-2, BFLOAT16: 4e-2,
               np.dtype(np.float32): 1e-5}.get(np.dtype(dtype), 1e-12)
        np.testing.assert_allclose(got.y.astype(np.float64), cpu.y.astype(np.float64),
                                   rtol=tol, atol=tol)
        cg = cfbn.fused_batch_norm_grad(dy, x, v["scale"], cpu.reserve_space_1,
                                        cpu.reserve_space_2, offset=v["offset"], activation=act,
                                        alpha=alpha, side_input=side, **kw)
        gg = emulate_grad(lib, dy, x, v["scale"], cpu.reserve_space_1, cpu.reserve_space_2,
                          offset=v["offset"], act=act, alpha=alpha, side=side, **kw)
        assert type(gg).__name__ == type(cg).__name__
        for a, b in zip(gg, cg):
            np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64),
                                       rtol=tol, atol=tol * 10)


def test_preamble_enum_matches_cfbn_h():
    """The activation codes the CuPy preamble declares are cfbn.h's."""
    header = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc",
                          "cfbn.h")
    if not os.path.exists(header):
        pytest.skip("csrc/cfbn.h is not next to the tests (an installed wheel)")
    with open(header) as f:
        body = re.search(r"enum cfbn_activation \{(.*?)\};", f.read(), re.S).group(1)
    # CFBN_ACT_COUNT is a macro after the enum, not a member
    want = {name: int(code) for name, code in re.findall(r"(CFBN_ACT_\w+) = (\d+)", body)}
    got = {name: int(code) for name, code in
           re.findall(r"(CFBN_ACT_\w+) = (\d+)", _gpu.activation_enum())}
    assert got == want
