"""CuPy path: fused_batch_norm and its first and second gradients on CuPy arrays.

cfbn._api sends a call here when `x` is a CuPy array.  The arithmetic is the
C driver's, pass for pass, with the per-element and per-channel expressions
taken from csrc/bn_math.h (the kernels' preamble):

    stats     per-column partial sums of x - shift and (x - shift)^2 in double
              (shift = the channel's first element), one thread per column of
              a fixed plan; CuPy's sum then adds the partials per channel
    finalize  one thread per channel: mean, variance, running statistics and
              the normalization parameters, in double
    apply     one thread per element: y = ((x - mhi) - mlo) * alpha + beta

The gradient is the same three passes with its own sums and parameters.
So is the second-order gradient (fused_batch_norm_grad_grad): five sums of
dy, x and ggx, a finalize that calls bn_math.h's cfbn_grad_grad_params (the
C driver's formulas), and one pass writing ddy and dx; in inference dx is
the normalization pass of dy alone.  Without ggx it is the forward's and the
gradient's passes with ggscale for scale, as the C driver computes it.

A fused activation or side input (y = act(normalize(x) + side)) runs in the
apply pass, through bn_math.h's cfbn_fused_y (the activations there are the
C kernels' too).  Its gradient recomputes the pre-activation per element
from x, the saved statistics, scale, offset and side, and uses
g = dy * act'(pre) (cfbn_fused_g) in place of dy in the sums and in dx; the
side input's gradient is g, written by the same dx pass.  In inference, dx
is then g * a + (center(x) * 0 + 0), as the C driver's fused pass computes it.  The
plan depends only on the shape, and every sum has a fixed order, so results
do not change from run to run.

Kernels are ElementwiseKernels named ``cfbn_<pass>_<dtype>[_<layout>]``,
built once per name on first use and kept for the process.  CuPy is imported
inside the functions that need it, so this module's plan and kernel sources
can be inspected (and compile-checked) without a GPU.
"""
import os

import numpy as np

from . import _args

# Threads the partial-sum pass aims for: enough to fill a large GPU (an H100
# or H200 holds about 270 000 resident threads) while keeping the partial
# sums a small fraction of the tensor.
TARGET_THREADS = 1 << 17
# Each stats thread sums at least about this many elements.
MIN_PER_THREAD = 16
# Channels-last rows are widened to at least this many columns (a multiple of
# C) so that a warp's loads are contiguous even when C is small.
MIN_WIDTH = 128

LAYOUT_NAMES = {_args.CHANNELS_LAST: "last", _args.CHANNELS_FIRST: "first"}

# kernel dtype code of x (cfbn._args.DTYPES) -> (suffix, x type, vector type,
# compute type, math suffix).  Keyed by code, not by dtype, so that bfloat16
# (ml_dtypes', which CuPy takes since v14) needs no import of ml_dtypes here.
_TYPES = {
    0: ("f32", "float32", "float32", "float", "f"),
    1: ("f64", "float64", "float64", "double", "d"),
    2: ("f16", "float16", "float32", "float", "f"),
    3: ("bf16", "bfloat16", "float32", "float", "f"),
}

# Parameters that the calls pass as Python scalars (everything else is an array).
SCALAR_PARAMS = frozenset({"C", "inner", "W", "P", "total", "S", "N", "G", "L", "n", "eps", "f",
                           "training", "act_kind", "act_alpha", "has_side"})


def header_path():
    """Path of bn_math.h: inside the package when installed, else the source tree."""
    here = os.path.dirname(os.path.abspath(__file__))
    for path in (os.path.join(here, "bn_math.h"),
                 os.path.join(os.path.dirname(here), "csrc", "bn_math.h")):
        if os.path.exists(path):
            return path
    raise FileNotFoundError("cfbn: bn_math.h is neither in the package nor in ../csrc")


_PREAMBLE = None


def activation_enum():
    """C declaration of enum cfbn_activation from the codes of cfbn._args.ACTIVATIONS.

    bn_math.h switches on these names; in C they come from cfbn.h, under
    NVRTC (no cfbn.h in the package) from this declaration.
    """
    items = sorted((code, "CFBN_ACT_" + ("NONE" if name is None else name.upper()))
                   for name, (code, _) in _args.ACTIVATIONS.items())
    return ("enum cfbn_activation { %s };\n"
            % ", ".join("%s = %d" % (n, c) for c, n in items))


def preamble():
    """The kernels' preamble: enum cfbn_activation, then the text of bn_math.h."""
    global _PREAMBLE
    if _PREAMBLE is None:
        with open(header_path()) as f:
            _PREAMBLE = activation_enum() + f.read()
    return _PREAMBLE


# ---- the plan of the stats passes (pure Python: also used by the tests) ----

def stats_plan(layout, outer, channels, inner):
    """Thread layout of the partial-sum pass; depends only on the shape.

    Channels-last (rows of C): thread t = p * W + j sums the elements
    e = t, t + P*W, t + 2*P*W, ... of the flat tensor; W is a multiple of C, so
    every element a thread sees is channel j % C, and neighbouring threads read
    neighbouring addresses.  Returns ("last", W, P); partials are (P, W).

    Channels-first (N, C, S): thread t = (c * G + g) * L + j sums, for
    n = g, g + G, ..., the elements s = j, j + L, ... of plane (n, c).
    Returns ("first", G, L); partials are (C, G * L).
    """
    total = outer * channels * inner
    want = max(1, min(TARGET_THREADS, -(-total // MIN_PER_THREAD)))
    if layout == _args.CHANNELS_LAST:
        width = channels * max(1, -(-MIN_WIDTH // channels))
        rows = -(-total // width)
        pieces = max(1, min(want // width, rows))
        return "last", width, pieces
    per_channel = max(1, -(-want // channels))
    lanes = min(inner, per_channel)
    if lanes > 32:
        lanes -= lanes % 32
    groups = max(1, min(outer, per_channel // lanes))
    return "first", groups, lanes


# ---- kernel sources ----

def _apply_spec(key, layout):
    sfx, xt, vt, ct, m = key
    chan = ("cfbn_channel_last(i, C)" if layout == "last"
            else "cfbn_channel_first(i, inner, C)")
    return ("%s x, raw %s mhi, raw %s mlo, raw %s alpha, raw %s beta, int64 C, int64 inner"
            % (xt, vt, vt, vt, vt),
            "%s y" % xt,
            "const long long c = %s;\n"
            "y = cfbn_normalize_%s((%s)x, mhi[c], mlo[c], alpha[c], beta[c]);" % (chan, m, ct))


def _gapply_spec(key, layout):
    sfx, xt, vt, ct, m = key
    chan = ("cfbn_channel_last(i, C)" if layout == "last"
            else "cfbn_channel_first(i, inner, C)")
    return ("%s dy, %s x, raw %s mhi, raw %s mlo, raw %s a, raw %s b, raw %s cc, "
            "int64 C, int64 inner" % (xt, xt, vt, vt, vt, vt, vt),
            "%s dx" % xt,
            "const long long c = %s;\n"
            "dx = cfbn_grad_dx_%s((%s)dy, (%s)x, mhi[c], mlo[c], a[c], b[c], cc[c]);"
            % (chan, m, ct, ct))


def _chan(layout):
    return ("cfbn_channel_last(i, C)" if layout == "last"
            else "cfbn_channel_first(i, inner, C)")


def _side_value(ct, index):
    # The side input is read only where it is used (a stand-in array is
    # passed when there is none).
    return "has_side ? (%s)side[%s] : (%s)0" % (ct, index, ct)


def _apply_act_spec(key, layout):
    sfx, xt, vt, ct, m = key
    return ("%s x, raw %s side, raw %s mhi, raw %s mlo, raw %s alpha, raw %s beta, int64 C, "
            "int64 inner, int32 act_kind, float64 act_alpha, int32 has_side"
            % (xt, xt, vt, vt, vt, vt),
            "%s y" % xt,
            "const long long c = %s;\n"
            "y = cfbn_fused_y_%s(act_kind, (%s)act_alpha, (%s)x, has_side, %s,\n"
            "                   mhi[c], mlo[c], alpha[c], beta[c]);"
            % (_chan(layout), m, ct, ct, _side_value(ct, "i")))


def _gapply_act_spec(key, layout, with_side):
    """dx of a fused gradient; with_side also writes side_input_backprop = g."""
    sfx, xt, vt, ct, m = key
    outs = "%s dx, %s side_bp" % (xt, xt) if with_side else "%s dx" % xt
    return ("%s dy, %s x, raw %s side, raw %s mhi, raw %s mlo, raw %s a, raw %s b, raw %s cc, "
            "raw %s ya, raw %s yb, int64 C, int64 inner, int32 act_kind, float64 act_alpha, "
            "int32 has_side" % (xt, xt, xt, vt, vt, vt, vt, vt, vt, vt),
            outs,
            "const long long c = %s;\n"
            "const %s g = cfbn_fused_g_%s(act_kind, (%s)act_alpha, (%s)dy, (%s)x, has_side, %s,\n"
            "                              mhi[c], mlo[c], ya[c], yb[c]);\n"
            "dx = cfbn_grad_dx_%s(g, (%s)x, mhi[c], mlo[c], a[c], b[c], cc[c]);%s"
            % (_chan(layout), ct, m, ct, ct, ct, _side_value(ct, "i"), m, ct,
               "\nside_bp = g;" if with_side else ""))


# Loop bodies of the stats passes over one thread's elements; `ADD(e)` is the
# accumulation of element e into ACC's accumulators, CH the thread's channel,
# and STORE writes the thread's sums.
_LOOP_LAST = ("const long long CH = (i % W) % C;\n"
              "{SETUP}"
              "{ACC}\n"
              "for (long long e = i; e < total; e += P * W) {{ {ADD} }}\n"
              "{STORE}")
_LOOP_FIRST = ("const long long j = i % L, t = i / L;\n"
               "const long long CH = t / G;\n"
               "{SETUP}"
               "{ACC}\n"
               "for (long long n = t % G; n < N; n += G) {{\n"
               "  const long long base = (n * C + CH) * S;\n"
               "  for (long long e = base + j; e < base + S; e += L) {{ {ADD} }}\n"
               "}}\n"
               "{STORE}")
# Two sums in scalars (a1, a2 -> s1, s2); the second-order pass's five in an
# array (a[0..5) -> s1..s5), as cfbn_ggstats_add and cfbn_grad_grad_params take them.
_SUMS = {2: ("double a1 = 0.0, a2 = 0.0;", "s1 = a1;\ns2 = a2;"),
         5: ("double a[5] = {0.0, 0.0, 0.0, 0.0, 0.0};",
             "\n".join("s%d = a[%d];" % (k + 1, k) for k in range(5)))}
_LOOP_PARAMS = {"last": "int64 C, int64 W, int64 P, int64 total",
                "first": "int64 C, int64 S, int64 N, int64 G, int64 L"}


def _loop(layout, setup, add, nsums=2):
    acc, store = _SUMS[nsums]
    return (_LOOP_LAST if layout == "last" else _LOOP_FIRST).format(
        SETUP=setup, ADD=add, ACC=acc, STORE=store)


def _sum_outputs(nsums):
    return ", ".join("float64 s%d" % (k + 1) for k in range(nsums))


def _stats_spec(key, layout):
    sfx, xt, vt, ct, m = key
    first = "CH * S" if layout == "first" else "CH"
    body = _loop(layout, "const double shift = (double)(%s)x[%s];\n" % (ct, first),
                 "cfbn_stats_add((double)(%s)x[e], shift, &a1, &a2);" % ct)
    return ("raw %s x, %s" % (xt, _LOOP_PARAMS[layout]), _sum_outputs(2), body)


def _mean_setup(m):
    # The thread's channel mean, split as the apply passes split it.
    if m == "f":
        return ("const float mhi = cfbn_mean_hi_f((double)mean[CH]);\n"
                "const float mlo = cfbn_mean_lo_f((double)mean[CH]);\n")
    return "const double mhi = mean[CH], mlo = 0.0;\n"


def _gstats_spec(key, layout):
    sfx, xt, vt, ct, m = key
    body = _loop(layout, _mean_setup(m),
                 "cfbn_gstats_add_%s((%s)dy[e], (%s)x[e], mhi, mlo, &a1, &a2);" % (m, ct, ct))
    return ("raw %s dy, raw %s x, raw %s mean, %s" % (xt, xt, vt, _LOOP_PARAMS[layout]),
            _sum_outputs(2), body)


def _gstats_act_spec(key, layout):
    """The gradient sums of g = dy * act'(pre) instead of dy."""
    sfx, xt, vt, ct, m = key
    setup = _mean_setup(m) + ("const %s yac = ya[CH], ybc = yb[CH], aa = (%s)act_alpha;\n"
                              % (ct, ct))
    body = _loop(layout, setup,
                 "const %s xe = (%s)x[e];\n"
                 "    const %s g = cfbn_fused_g_%s(act_kind, aa, (%s)dy[e], xe, has_side, %s,\n"
                 "                                  mhi, mlo, yac, ybc);\n"
                 "    cfbn_gstats_add_%s(g, xe, mhi, mlo, &a1, &a2);"
                 % (ct, ct, ct, m, ct, _side_value(ct, "e"), m))
    return ("raw %s dy, raw %s x, raw %s side, raw %s mean, raw %s ya, raw %s yb, "
            "int32 act_kind, float64 act_alpha, int32 has_side, %s"
            % (xt, xt, xt, vt, vt, vt, _LOOP_PARAMS[layout]),
            _sum_outputs(2), body)


def _ggstats_spec(key, layout):
    """The second-order gradient's five sums (cfbn_ggstats_add) of dy, x and ggx."""
    sfx, xt, vt, ct, m = key
    body = _loop(layout, _mean_setup(m),
                 "cfbn_ggstats_add_%s((%s)dy[e], (%s)ggx[e], (%s)x[e], mhi, mlo, a);"
                 % (m, ct, ct, ct), 5)
    return ("raw %s dy, raw %s x, raw %s ggx, raw %s mean, %s"
            % (xt, xt, xt, vt, _LOOP_PARAMS[layout]), _sum_outputs(5), body)


def _ggapply_spec(key, layout):
    """Training's ddy and dx in one pass (cfbn_grad_dx of ggx, cfbn_gg_dx)."""
    sfx, xt, vt, ct, m = key
    return ("%s dy, %s x, %s ggx, raw %s mhi, raw %s mlo, raw %s a1, raw %s b1, raw %s c1, "
            "raw %s a2, raw %s b2, raw %s c2, raw %s e2, int64 C, int64 inner"
            % ((xt,) * 3 + (vt,) * 9),
            "%s ddy, %s dx" % (xt, xt),
            "const long long c = %s;\n"
            "const %s q = (%s)ggx, xe = (%s)x;\n"
            "ddy = cfbn_grad_dx_%s(q, xe, mhi[c], mlo[c], a1[c], b1[c], c1[c]);\n"
            "dx = cfbn_gg_dx_%s((%s)dy, q, xe, mhi[c], mlo[c], a2[c], b2[c], c2[c], e2[c]);"
            % (_chan(layout), ct, ct, ct, m, m, ct))


def _grad_prep_spec(key):
    """ya = scale * rstd: the forward's alpha, to recompute the pre-activation."""
    sfx, xt, vt, ct, m = key
    return ("%s scale, %s saved_variance, float64 eps" % (vt, vt), "%s ya" % vt,
            "ya = (double)scale * cfbn_rstd((double)saved_variance, eps);")


def _split_mean(m, target_hi, target_lo, value):
    if m == "f":
        return ("%s = cfbn_mean_hi_f(%s);\n%s = cfbn_mean_lo_f(%s);\n"
                % (target_hi, value, target_lo, value))
    return "%s = %s;\n%s = 0.0;\n" % (target_hi, value, target_lo)


_PARAM_OUTS = "%s batch_mean, %s batch_variance, %s saved_mean, %s saved_variance, " \
              "%s mhi, %s mlo, %s alpha, %s beta"


def _forward_finalize_spec(key):
    sfx, xt, vt, ct, m = key
    # Every input is read before any output is written: an output may be the
    # very array an input came from (a running mean updated in place).
    body = ("const double gamma = (double)scale, off = (double)offset;\n"
            "const double run_mean = f != 1.0 ? (double)mean[i] : 0.0;\n"
            "const double run_var = f != 1.0 ? (double)variance[i] : 0.0;\n"
            "const double shift = n > 0 ? (double)(%s)x[i * inner] : 0.0;\n"
            "double mu, var;\n"
            "cfbn_moments(shift, sums[i], sums[C + i], n, &mu, &var);\n"
            "const double r = cfbn_rstd(var, eps);\n"
            "batch_mean = cfbn_running(f, run_mean, mu);\n"
            "batch_variance = cfbn_running(f, run_var, cfbn_unbiased(var, n));\n"
            "saved_mean = mu;\nsaved_variance = var;\n"
            "%s"
            "alpha = gamma * r;\nbeta = off;" % (ct, _split_mean(m, "mhi", "mlo", "mu")))
    return ("raw %s x, raw float64 sums, %s scale, %s offset, raw %s mean, raw %s variance, "
            "int64 C, int64 inner, int64 n, float64 eps, float64 f" % (xt, vt, vt, vt, vt),
            _PARAM_OUTS % ((vt,) * 8), body)


def _inference_finalize_spec(key):
    sfx, xt, vt, ct, m = key
    body = ("const double mu = (double)mean, var = (double)variance;\n"
            "const double gamma = (double)scale, off = (double)offset;\n"
            "const double r = cfbn_rstd(var, eps);\n"
            "batch_mean = mu;\nbatch_variance = var;\nsaved_mean = mu;\nsaved_variance = var;\n"
            "%s"
            "alpha = gamma * r;\nbeta = off;" % _split_mean(m, "mhi", "mlo", "mu"))
    return ("%s mean, %s variance, %s scale, %s offset, float64 eps" % (vt, vt, vt, vt),
            _PARAM_OUTS % ((vt,) * 8), body)


def _grad_finalize_spec(key):
    sfx, xt, vt, ct, m = key
    body = ("const double gamma = (double)scale, mu = (double)saved_mean;\n"
            "const double r = cfbn_rstd((double)saved_variance, eps);\n"
            "const double sum_dy = sums[i], sum_dy_xc = sums[C + i];\n"
            "double sbp, pa, pb, pc;\n"
            "cfbn_grad_params(training, n, gamma, r, sum_dy, sum_dy_xc, &sbp, &pa, &pb, &pc);\n"
            "scale_backprop = sbp;\noffset_backprop = sum_dy;\n"
            "%s"
            "a = pa;\nb = pb;\ncc = pc;" % _split_mean(m, "mhi", "mlo", "mu"))
    return ("raw float64 sums, %s scale, %s saved_mean, %s saved_variance, "
            "int64 C, int64 n, float64 eps, int32 training" % (vt, vt, vt),
            "%s scale_backprop, %s offset_backprop, %s mhi, %s mlo, %s a, %s b, %s cc"
            % ((vt,) * 7), body)


def _gg_finalize_spec(key):
    """scale_backprop and the ddy/dx parameters of the second-order gradient,
    from the five sums (cfbn_grad_grad_params: the C driver's formulas)."""
    sfx, xt, vt, ct, m = key
    body = ("const double mu = (double)saved_mean;\n"
            "const double r = cfbn_rstd((double)saved_variance, eps);\n"
            "const double s[5] = {sums[i], sums[C + i], sums[2 * C + i], sums[3 * C + i],\n"
            "                     sums[4 * C + i]};\n"
            "double sbp, k[7];\n"
            "cfbn_grad_grad_params(training, n, (double)scale, r, (double)ggscale,\n"
            "                      (double)ggoffset, s, &sbp, k);\n"
            "scale_backprop = sbp;\n"
            "%s"
            "a1 = k[0];\nb1 = k[1];\nc1 = k[2];\na2 = k[3];\nb2 = k[4];\nc2 = k[5];\ne2 = k[6];"
            % _split_mean(m, "mhi", "mlo", "mu"))
    return ("raw float64 sums, %s scale, %s saved_mean, %s saved_variance, %s ggscale, "
            "%s ggoffset, int64 C, int64 n, float64 eps, int32 training" % ((vt,) * 5),
            "%s scale_backprop, %s mhi, %s mlo, %s a1, %s b1, %s c1, %s a2, %s b2, %s c2, %s e2"
            % ((vt,) * 10), body)


def _all_specs():
    specs = {}
    for key in _TYPES.values():
        sfx = key[0]
        for layout in ("last", "first"):
            specs["cfbn_stats_%s_%s" % (sfx, layout)] = _stats_spec(key, layout)
            specs["cfbn_apply_%s_%s" % (sfx, layout)] = _apply_spec(key, layout)
            specs["cfbn_gstats_%s_%s" % (sfx, layout)] = _gstats_spec(key, layout)
            specs["cfbn_gapply_%s_%s" % (sfx, layout)] = _gapply_spec(key, layout)
            specs["cfbn_apply_act_%s_%s" % (sfx, layout)] = _apply_act_spec(key, layout)
            specs["cfbn_gstats_act_%s_%s" % (sfx, layout)] = _gstats_act_spec(key, layout)
            specs["cfbn_gapply_act_%s_%s" % (sfx, layout)] = _gapply_act_spec(key, layout, False)
            specs["cfbn_gapply_side_%s_%s" % (sfx, layout)] = _gapply_act_spec(key, layout, True)
            specs["cfbn_ggstats_%s_%s" % (sfx, layout)] = _ggstats_spec(key, layout)
            specs["cfbn_ggapply_%s_%s" % (sfx, layout)] = _ggapply_spec(key, layout)
        specs["cfbn_finalize_%s" % sfx] = _forward_finalize_spec(key)
        if sfx not in ("f16", "bf16"):
            # float16 and bfloat16 tensors have float32 vectors: they share
            # the f32 kernels.
            specs["cfbn_infer_finalize_%s" % sfx] = _inference_finalize_spec(key)
            specs["cfbn_grad_finalize_%s" % sfx] = _grad_finalize_spec(key)
            specs["cfbn_grad_prep_%s" % sfx] = _grad_prep_spec(key)
            specs["cfbn_gg_finalize_%s" % sfx] = _gg_finalize_spec(key)
    return specs


KERNEL_SPECS = _all_specs()
_KERNELS = {}


def kernel(name):
    """The ElementwiseKernel `name`, built on first use and cached."""
    k = _KERNELS.get(name)
    if k is None:
        import cupy
        in_params, out_params, body = KERNEL_SPECS[name]
        k = cupy.ElementwiseKernel(in_params, out_params, body, name, preamble=preamble())
        _KERNELS[name] = k
    return k


# ---- validation ----

def _side(a):
    if _args.is_cupy(a):
        return "a CuPy array"
    return "%s.%s (host memory)" % (type(a).__module__, type(a).__name__)


def _device_array(cupy, a, name, device):
    """`a` as a contiguous CuPy array on `device`, or TypeError/ValueError."""
    if not isinstance(a, cupy.ndarray):
        raise TypeError("%s: got %s, but x is a CuPy array on device %d; pass every array as "
                        "CuPy on one device, or every array as NumPy" % (name, _side(a), device))
    if a.device.id != device:
        raise ValueError("%s: on device %d, but x is on device %d; put every array on one "
                         "device" % (name, a.device.id, device))
    return cupy.ascontiguousarray(a)


def _touches(a, b):
    # Byte ranges of two contiguous arrays meet, as _kernels.touches on the CPU.
    na, nb = a.nbytes, b.nbytes
    if na == 0 or nb == 0:
        return False
    pa, pb = a.data.ptr, b.data.ptr
    return pa < pb + nb and pb < pa + na


def _overlaps(a, b):
    # They meet but are not the same range, as _kernels.overlaps.
    return _touches(a, b) and not (a.data.ptr == b.data.ptr and a.nbytes == b.nbytes)


def _outputs(cupy, out, fields, specs, inputs, device, in_place):
    """Allocate or check the outputs, with the CPU path's rules (_args.outputs)."""
    if out is None:
        return [cupy.empty(shape, dtype) for shape, dtype in specs]
    given = _args.out_given(out, fields)
    result = []
    for field, (shape, dtype), a in zip(fields, specs, given):
        if a is None:
            result.append(cupy.empty(shape, dtype))
            continue
        name = "out[%r]" % field
        if not isinstance(a, cupy.ndarray):
            raise TypeError("%s: got %s, but x is a CuPy array on device %d; pass CuPy "
                            "outputs on that device" % (name, _side(a), device))
        if a.device.id != device:
            raise ValueError("%s: on device %d, but x is on device %d"
                             % (name, a.device.id, device))
        _args.check_out_array(a, name, shape, dtype)
        for iname, b in inputs:
            if b is not None:
                _args.check_alias(name, field, a, iname, b, in_place, _touches(a, b),
                                  _overlaps(a, b))
        for prev_field, prev in zip(fields, result):
            if _touches(a, prev):
                raise ValueError("%s: shares memory with out[%r]" % (name, prev_field))
        result.append(a)
    return result


def _tensor(cupy, x):
    code = _args.dtype_kinds(x.dtype, "x")[0]
    return cupy.ascontiguousarray(x), _TYPES[code][0]


def _partial_sums(cupy, name, layout, outer, channels, inner, tensors, nsums=2):
    """Per-channel sums 1..nsums as one (nsums * C,) float64 array, sum k of
    channel c at k * C + c."""
    total = outer * channels * inner
    if total == 0:
        return cupy.zeros(nsums * channels, np.float64)
    kind, p1, p2 = stats_plan(layout, outer, channels, inner)
    if kind == "last":
        width, pieces = p1, p2
        part = cupy.empty((nsums, pieces * width), np.float64)
        kernel(name)(*tensors, channels, width, pieces, total, *(part[k] for k in range(nsums)))
        sums = part.reshape(nsums, -1, channels).sum(axis=1)
    else:
        groups, lanes = p1, p2
        part = cupy.empty((nsums, channels * groups * lanes), np.float64)
        kernel(name)(*tensors, channels, inner, outer, groups, lanes,
                     *(part[k] for k in range(nsums)))
        sums = part.reshape(nsums, channels, groups * lanes).sum(axis=2)
    return sums.reshape(-1)


# ---- the entry points ----

def _side_input(cupy, side_input, x, device):
    side = _device_array(cupy, side_input, "side_input", device)
    _args.check_side_input(side, x)
    return side


def forward(x, scale, offset, mean, variance, epsilon, exponential_avg_factor, data_format,
            is_training, n_threads, out, activation=None, alpha=None, side_input=None):
    """fused_batch_norm on CuPy arrays; arguments as cfbn.fused_batch_norm."""
    import cupy
    if not isinstance(x, cupy.ndarray):
        raise TypeError("x: expected a cupy.ndarray, got %s" % type(x).__name__)
    with cupy.cuda.Device(x.device.id):
        return _forward(cupy, x, scale, offset, mean, variance, epsilon, exponential_avg_factor,
                        data_format, is_training, n_threads, out, activation, alpha, side_input)


def _forward(cupy, x, scale, offset, mean, variance, epsilon, exponential_avg_factor,
             data_format, is_training, n_threads, out, activation, alpha, side_input):
    device = x.device.id
    x, sfx = _tensor(cupy, x)
    layout, outer, channels, inner = _args.layout(data_format, x)
    vdt = _args.DTYPES[x.dtype][1]
    scale = _device_array(cupy, scale, "scale", device)
    _args.check_vector(scale, "scale", channels, vdt)
    offset = _device_array(cupy, offset, "offset", device)
    _args.check_vector(offset, "offset", channels, vdt)
    eps = _args.epsilon(epsilon)
    factor = _args.factor(exponential_avg_factor)
    training = _args.flag(is_training, "is_training")
    mean, variance = _args.optional_stats(training, factor, mean, variance)
    if mean is not None:
        mean = _device_array(cupy, mean, "mean", device)
        _args.check_vector(mean, "mean", channels, vdt)
    if variance is not None:
        variance = _device_array(cupy, variance, "variance", device)
        _args.check_vector(variance, "variance", channels, vdt)
    act, act_alpha = _args.activation(activation, alpha)
    side = _side_input(cupy, side_input, x, device) if side_input is not None else None
    _args.threads(n_threads)
    vshape = (channels,)
    lname = LAYOUT_NAMES[layout]
    vsfx = "f64" if sfx == "f64" else "f32"
    y, bm, bv, rs1, rs2 = _outputs(
        cupy, out, _args.BatchNormOutput._fields,
        ((x.shape, x.dtype), (vshape, vdt), (vshape, vdt), (vshape, vdt), (vshape, vdt)),
        (("x", x), ("scale", scale), ("offset", offset), ("mean", mean),
         ("variance", variance), ("side_input", side)), device, _args.FORWARD_IN_PLACE)
    params = cupy.empty((4, channels), vdt)
    mhi, mlo, alpha, beta = params
    if training:
        sums = _partial_sums(cupy, "cfbn_stats_%s_%s" % (sfx, lname), layout, outer,
                             channels, inner, (x.reshape(-1),))
        use_stats = factor != 1.0
        kernel("cfbn_finalize_%s" % sfx)(
            x.reshape(-1), sums, scale, offset,
            mean if use_stats else scale, variance if use_stats else scale,
            channels, inner, outer * inner, eps, factor,
            bm, bv, rs1, rs2, mhi, mlo, alpha, beta)
    else:
        kernel("cfbn_infer_finalize_%s" % vsfx)(
            mean, variance, scale, offset, eps, bm, bv, rs1, rs2, mhi, mlo, alpha, beta)
        if x.size == 0:
            # As TensorFlow: an empty batch's statistics are NaN; the reserve
            # spaces keep mean and variance for the gradient.
            bm.fill(float("nan"))
            bv.fill(float("nan"))
    if x.size and (act or side is not None):
        # y may be x or side (an in-place call): each element reads both
        # before it writes y.
        kernel("cfbn_apply_act_%s_%s" % (sfx, lname))(
            x.reshape(-1), (x if side is None else side).reshape(-1), mhi, mlo, alpha, beta,
            channels, inner, act, act_alpha, int(side is not None), y.reshape(-1))
    elif x.size:
        kernel("cfbn_apply_%s_%s" % (sfx, lname))(
            x.reshape(-1), mhi, mlo, alpha, beta, channels, inner, y.reshape(-1))
    return _args.BatchNormOutput(y, bm, bv, rs1, rs2)


def backward(y_backprop, x, scale, reserve_space_1, reserve_space_2, epsilon, data_format,
             is_training, n_threads, out, offset=None, activation=None, alpha=None,
             side_input=None):
    """fused_batch_norm_grad on CuPy arrays; arguments as cfbn.fused_batch_norm_grad."""
    import cupy
    if not isinstance(x, cupy.ndarray):
        raise TypeError("x: expected a cupy.ndarray, got %s" % type(x).__name__)
    with cupy.cuda.Device(x.device.id):
        return _backward(cupy, y_backprop, x, scale, reserve_space_1, reserve_space_2, epsilon,
                         data_format, is_training, n_threads, out, offset, activation, alpha,
                         side_input)


def _backward(cupy, y_backprop, x, scale, reserve_space_1, reserve_space_2, epsilon,
              data_format, is_training, n_threads, out, offset, activation, alpha, side_input):
    device = x.device.id
    x, sfx = _tensor(cupy, x)
    dy = _device_array(cupy, y_backprop, "y_backprop", device)
    _args.check_dy(dy, x)
    layout, outer, channels, inner = _args.layout(data_format, x)
    vdt = _args.DTYPES[x.dtype][1]
    scale = _device_array(cupy, scale, "scale", device)
    _args.check_vector(scale, "scale", channels, vdt)
    mu = _device_array(cupy, reserve_space_1, "reserve_space_1", device)
    _args.check_vector(mu, "reserve_space_1", channels, vdt)
    var = _device_array(cupy, reserve_space_2, "reserve_space_2", device)
    _args.check_vector(var, "reserve_space_2", channels, vdt)
    eps = _args.epsilon(epsilon)
    training = _args.flag(is_training, "is_training")
    act, act_alpha = _args.activation(activation, alpha)
    _args.check_offset_given(act, offset)
    if offset is not None:
        offset = _device_array(cupy, offset, "offset", device)
        _args.check_vector(offset, "offset", channels, vdt)
    side = _side_input(cupy, side_input, x, device) if side_input is not None else None
    _args.threads(n_threads)
    vshape = (channels,)
    lname = LAYOUT_NAMES[layout]
    vsfx = "f64" if sfx == "f64" else "f32"
    result_type = _args.BatchNormGradSide if side is not None else _args.BatchNormGrad
    specs = ((x.shape, x.dtype), (vshape, vdt), (vshape, vdt), (x.shape, x.dtype))
    outs = _outputs(
        cupy, out, result_type._fields, specs[:len(result_type._fields)],
        (("y_backprop", dy), ("x", x), ("scale", scale), ("reserve_space_1", mu),
         ("reserve_space_2", var), ("offset", offset), ("side_input", side)), device,
        _args.GRAD_IN_PLACE)
    dx, dscale, doffset = outs[:3]
    flat_dy, flat_x = dy.reshape(-1), x.reshape(-1)
    if act:
        # The forward's alpha (scale * rstd) and beta (offset) recompute the
        # pre-activation; the side input is read only with an activation.
        ya = cupy.empty(channels, vdt)
        kernel("cfbn_grad_prep_%s" % vsfx)(scale, var, eps, ya)
        fused = (flat_x if side is None else side.reshape(-1), ya, offset, act, act_alpha,
                 int(side is not None))
        sums = _partial_sums(cupy, "cfbn_gstats_act_%s_%s" % (sfx, lname), layout, outer,
                             channels, inner, (flat_dy, flat_x, fused[0], mu) + fused[1:])
    else:
        fused = (flat_x if side is None else side.reshape(-1), scale, scale, 0, 0.0, 0)
        sums = _partial_sums(cupy, "cfbn_gstats_%s_%s" % (sfx, lname), layout, outer,
                             channels, inner, (flat_dy, flat_x, mu))
    params = cupy.empty((5, channels), vdt)
    mhi, mlo, a, b, c = params
    kernel("cfbn_grad_finalize_%s" % vsfx)(
        sums, scale, mu, var, channels, outer * inner, eps, int(training),
        dscale, doffset, mhi, mlo, a, b, c)
    if x.size and (act or side is not None):
        # g in place of dy, in training and in inference (b = c = 0 there);
        # dx and side_input_backprop may be dy or x: each element reads its
        # inputs before it writes.
        side_arr, ya, yb, kind, aa, has_side = fused
        if side is not None:
            kernel("cfbn_gapply_side_%s_%s" % (sfx, lname))(
                flat_dy, flat_x, side_arr, mhi, mlo, a, b, c, ya, yb, channels, inner, kind,
                aa, has_side, dx.reshape(-1), outs[3].reshape(-1))
        else:
            kernel("cfbn_gapply_act_%s_%s" % (sfx, lname))(
                flat_dy, flat_x, side_arr, mhi, mlo, a, b, c, ya, yb, channels, inner, kind,
                aa, has_side, dx.reshape(-1))
    elif x.size:
        if training:
            kernel("cfbn_gapply_%s_%s" % (sfx, lname))(
                dy.reshape(-1), x.reshape(-1), mhi, mlo, a, b, c, channels, inner,
                dx.reshape(-1))
        else:
            # dx = scale * r * dy does not depend on x (a NaN in x stays out of
            # dx): the normalization of dy with mhi = mlo = beta = 0, which is b
            # in inference.
            kernel("cfbn_apply_%s_%s" % (sfx, lname))(
                dy.reshape(-1), b, b, a, b, channels, inner, dx.reshape(-1))
    return result_type(*outs)


def grad_grad(y_backprop, x, scale, reserve_space_1, reserve_space_2, grad_x_backprop,
              grad_scale_backprop, grad_offset_backprop, epsilon, data_format, is_training,
              n_threads, out):
    """fused_batch_norm_grad_grad on CuPy arrays; arguments as
    cfbn.fused_batch_norm_grad_grad."""
    import cupy
    if not isinstance(x, cupy.ndarray):
        raise TypeError("x: expected a cupy.ndarray, got %s" % type(x).__name__)
    with cupy.cuda.Device(x.device.id):
        return _grad_grad(cupy, y_backprop, x, scale, reserve_space_1, reserve_space_2,
                          grad_x_backprop, grad_scale_backprop, grad_offset_backprop, epsilon,
                          data_format, is_training, n_threads, out)


def _device_vector(cupy, v, name, channels, vdt, device):
    v = _device_array(cupy, v, name, device)
    _args.check_vector(v, name, channels, vdt)
    return v


def _grad_grad(cupy, y_backprop, x, scale, reserve_space_1, reserve_space_2, grad_x_backprop,
               grad_scale_backprop, grad_offset_backprop, epsilon, data_format, is_training,
               n_threads, out):
    device = x.device.id
    x, sfx = _tensor(cupy, x)
    dy = _device_array(cupy, y_backprop, "y_backprop", device)
    _args.check_dy(dy, x)
    ggx = None
    if grad_x_backprop is not None:
        ggx = _device_array(cupy, grad_x_backprop, "grad_x_backprop", device)
        _args.check_like_x(ggx, x, "grad_x_backprop")
    layout, outer, channels, inner = _args.layout(data_format, x)
    vdt = _args.DTYPES[x.dtype][1]
    scale = _device_vector(cupy, scale, "scale", channels, vdt, device)
    mu = _device_vector(cupy, reserve_space_1, "reserve_space_1", channels, vdt, device)
    var = _device_vector(cupy, reserve_space_2, "reserve_space_2", channels, vdt, device)
    ggs = ggo = None
    if grad_scale_backprop is not None:
        ggs = _device_vector(cupy, grad_scale_backprop, "grad_scale_backprop", channels, vdt,
                             device)
    if grad_offset_backprop is not None:
        ggo = _device_vector(cupy, grad_offset_backprop, "grad_offset_backprop", channels, vdt,
                             device)
    eps = _args.epsilon(epsilon)
    training = _args.flag(is_training, "is_training")
    _args.threads(n_threads)
    vshape = (channels,)
    # No output may be an input's memory, as on the CPU: in inference ddy
    # is written before the pass of dx reads dy.
    ddy, dx, dscale = _outputs(
        cupy, out, _args.BatchNormGradGrad._fields,
        ((x.shape, x.dtype), (x.shape, x.dtype), (vshape, vdt)),
        (("y_backprop", dy), ("x", x), ("scale", scale), ("reserve_space_1", mu),
         ("reserve_space_2", var), ("grad_x_backprop", ggx), ("grad_scale_backprop", ggs),
         ("grad_offset_backprop", ggo)), device, frozenset())
    ggs = cupy.zeros(channels, vdt) if ggs is None else ggs
    ggo = cupy.zeros(channels, vdt) if ggo is None else ggo
    case = (layout, outer, channels, inner, sfx, training, eps)
    flat = (dy.reshape(-1), x.reshape(-1), ddy.reshape(-1), dx.reshape(-1))
    if ggx is None:
        _gg_without_ggx(cupy, case, flat, mu, var, ggs, ggo, dscale)
    else:
        _gg_with_ggx(cupy, case, flat, ggx.reshape(-1), scale, mu, var, ggs, ggo, dscale)
    return _args.BatchNormGradGrad(ddy, dx, dscale)


def _gg_with_ggx(cupy, case, flat, q, scale, mu, var, ggs, ggo, dscale):
    """The five sums, the parameters from them (cfbn_grad_grad_params), then
    ddy and dx in one pass in training; in inference ddy and dx by separate
    passes, dx from dy alone."""
    layout, outer, channels, inner, sfx, training, eps = case
    g, x, ddy, dx = flat
    lname = LAYOUT_NAMES[layout]
    sums = _partial_sums(cupy, "cfbn_ggstats_%s_%s" % (sfx, lname), layout, outer, channels,
                         inner, (g, x, q, mu), 5)
    mhi, mlo, a1, b1, c1, a2, b2, c2, e2 = params = cupy.empty((9, channels), mu.dtype)
    kernel("cfbn_gg_finalize_%s" % ("f64" if sfx == "f64" else "f32"))(
        sums, scale, mu, var, ggs, ggo, channels, outer * inner, eps, int(training), dscale,
        *params)
    if not x.size:
        return
    if training:
        kernel("cfbn_ggapply_%s_%s" % (sfx, lname))(
            g, x, q, mhi, mlo, a1, b1, c1, a2, b2, c2, e2, channels, inner, ddy, dx)
        return
    # ddy = ggx * a1 + (center(x) * b1 + c1) is the gradient's dx pass of
    # ggx; dx = ggscale * r * dy does not depend on x or ggx (a NaN in them
    # stays out of dx): the normalization of dy with mhi = mlo = beta = 0,
    # which is b2 in inference.
    kernel("cfbn_gapply_%s_%s" % (sfx, lname))(q, x, mhi, mlo, a1, b1, c1, channels, inner, ddy)
    kernel("cfbn_apply_%s_%s" % (sfx, lname))(g, b2, b2, a2, b2, channels, inner, dx)


def _gg_without_ggx(cupy, case, flat, mu, var, ggs, ggo, dscale):
    """ggx = 0, as the C driver computes it: ddy = ggscale * r * (x - mean) +
    ggoffset is the forward's normalization of x, dx the gradient's passes
    with gamma = ggscale, and scale_backprop is 0."""
    layout, outer, channels, inner, sfx, training, eps = case
    g, x, ddy, dx = flat
    vdt = mu.dtype
    lname = LAYOUT_NAMES[layout]
    vsfx = "f64" if sfx == "f64" else "f32"
    dscale.fill(0)
    if training:
        sums = _partial_sums(cupy, "cfbn_gstats_%s_%s" % (sfx, lname), layout, outer, channels,
                             inner, (g, x, mu))
    else:
        sums = cupy.zeros(2 * channels, np.float64)
    gp = cupy.empty((7, channels), vdt)
    kernel("cfbn_grad_finalize_%s" % vsfx)(sums, ggs, mu, var, channels, outer * inner, eps,
                                           int(training), *gp)
    ap = cupy.empty((8, channels), vdt)
    kernel("cfbn_infer_finalize_%s" % vsfx)(mu, var, ggs, ggo, eps, *ap)
    if not x.size:
        return
    mhi, mlo, a, b, c = gp[2:]
    if training:
        kernel("cfbn_gapply_%s_%s" % (sfx, lname))(g, x, mhi, mlo, a, b, c, channels, inner, dx)
    else:
        # from dy alone, as with ggx (b = c = 0 in inference)
        kernel("cfbn_apply_%s_%s" % (sfx, lname))(g, b, b, a, b, channels, inner, dx)
    kernel("cfbn_apply_%s_%s" % (sfx, lname))(x, *ap[4:], channels, inner, ddy)
