"""Shared pieces of the benchmark suites and compare.py.

Shapes, inputs, the minimal-traffic byte counts, and zero-argument callables
for every implementation measured: cfbn, the float64 NumPy reference,
PyTorch (ATen's native batch norm, and autograd's double backward through it)
and TensorFlow (FusedBatchNormV3), each on the same NumPy data.
"""
import functools
import gc
import importlib.util
import math
import os
import platform
import sys
import time

import numpy as np

import cfbn
from cfbn import _cpuload

CpuMeter = _cpuload.CpuMeter
BUSY = _cpuload.BUSY

#: The performance targets' shapes, as (N, H, W, C).
SHAPES = [
    (32, 56, 56, 64),
    (32, 28, 28, 128),
    (32, 14, 14, 256),
    (32, 7, 7, 512),
    (8, 32, 32, 32),
    (1, 8, 8, 16),
]
#: The bandwidth shape: far larger than any cache.
LARGE_SHAPE = (64, 112, 112, 64)
#: The per-call overhead shape.
TINY_SHAPE = (1, 8, 8, 16)

LAYOUTS = ("NHWC", "NCHW")
THREADS = (1, 2)
#: The float64 reference is timed on shapes up to this many elements only
#: unless a full run asks for all.
REFERENCE_MAX_ELEMENTS = 1 << 20

#: op key -> label.  "train": training forward updating the running averages;
#: "infer": inference forward; "grad": training gradient.
OPS = {
    "train": "training forward",
    "infer": "inference forward",
    "grad": "training gradient",
}
#: The second-order gradient in training ("gradgrad") is timed by its own
#: sections, not in every loop over OPS.
LABELS = {**OPS, "gradgrad": "training grad-grad"}
#: cfbn's result fields in the order of PyTorch's outputs.
FIELDS = {
    "grad": ("x_backprop", "scale_backprop", "offset_backprop"),
    "gradgrad": ("y_backprop_backprop", "x_backprop", "scale_backprop"),
}

EPSILON = 1e-4
FACTOR = 0.1
DTYPE = np.float32


def shape_str(shape):
    return "x".join(str(d) for d in shape)


def layout_shape(shape_nhwc, layout):
    """The array shape of an (N, H, W, C) tensor stored as `layout`."""
    n, h, w, c = shape_nhwc
    return (n, h, w, c) if layout == "NHWC" else (n, c, h, w)


def reduce_axes(layout):
    return (0, 1, 2) if layout == "NHWC" else (0, 2, 3)


def elements(shape):
    return math.prod(shape)


def minimal_bytes(op, nbytes):
    """The traffic no implementation can avoid: read x and write y (forward),
    read dy and x and write dx (gradient), read dy, x and ggx and write ddy
    and dx (grad-grad)."""
    return {"grad": 3, "gradgrad": 5}.get(op, 2) * nbytes


def gbps(op, nbytes, seconds):
    return minimal_bytes(op, nbytes) / seconds / 1e9


def make_inputs(shape_nhwc, layout, seed=0, dtype=DTYPE):
    """Random inputs for every op: x, dy, the per-channel parameters, running
    statistics, and the reserve spaces (batch mean and biased variance of x)
    that the gradient consumes."""
    rng = np.random.default_rng(seed)
    c = shape_nhwc[3]
    shape = layout_shape(shape_nhwc, layout)
    x = rng.standard_normal(shape, dtype=np.float32)
    x *= 1.5
    x += 0.25
    dy = rng.standard_normal(shape, dtype=np.float32)
    x = x.astype(dtype, copy=False)
    dy = dy.astype(dtype, copy=False)
    # float16 and bfloat16 tensors have float32 per-channel vectors
    vdt = np.float32 if np.dtype(dtype).itemsize == 2 else dtype
    axes = reduce_axes(layout)
    return {
        "shape": shape_nhwc,
        "layout": layout,
        "x": x,
        "dy": dy,
        "scale": rng.uniform(0.5, 1.5, c).astype(vdt),
        "offset": rng.uniform(-0.5, 0.5, c).astype(vdt),
        "mean": rng.uniform(-0.1, 0.1, c).astype(vdt),
        "variance": rng.uniform(0.9, 1.1, c).astype(vdt),
        "rs1": x.mean(axis=axes, dtype=np.float64).astype(vdt),
        "rs2": x.var(axis=axes, dtype=np.float64).astype(vdt),
    }


def add_upstream(d, seed=1):
    """Adds to inputs `d` (in place, once) the upstream gradients a grad-grad
    call takes: ggx (x's shape and dtype), ggscale and ggoffset (the
    per-channel dtype).  Returns `d`.

    Kept out of make_inputs: the other ops do not need a third tensor, and
    the large shapes would pay for one."""
    if "ggx" not in d:
        rng = np.random.default_rng(seed)
        c = d["shape"][3]
        vdt = d["scale"].dtype
        d["ggx"] = rng.standard_normal(d["x"].shape, dtype=np.float32).astype(
            d["x"].dtype, copy=False)
        d["ggs"] = rng.standard_normal(c).astype(vdt)
        d["ggo"] = rng.standard_normal(c).astype(vdt)
    return d


class InputCache:
    """Keeps the most recent inputs only: the large shapes take hundreds of MB."""

    def __init__(self):
        self._key = None
        self._value = None

    def get(self, shape_nhwc, layout):
        key = (tuple(shape_nhwc), layout)
        if key != self._key:
            self._key, self._value = None, None
            self._value = make_inputs(shape_nhwc, layout)
            self._key = key
        return self._value


# ---------------------------------------------------------------- cfbn


def cfbn_call(op, d, threads, out=None):
    """A zero-argument callable running `op` with cfbn on inputs `d`.

    `out` (a dict of preallocated outputs) makes the call allocation-free; the
    plain call (out=None) is what users run.
    """
    layout = d["layout"]
    if op == "train":
        return functools.partial(
            cfbn.fused_batch_norm, d["x"], d["scale"], d["offset"], d["mean"], d["variance"],
            epsilon=EPSILON, exponential_avg_factor=FACTOR, data_format=layout,
            is_training=True, n_threads=threads, out=out)
    if op == "infer":
        return functools.partial(
            cfbn.fused_batch_norm, d["x"], d["scale"], d["offset"], d["mean"], d["variance"],
            epsilon=EPSILON, data_format=layout, is_training=False, n_threads=threads, out=out)
    if op == "grad":
        return functools.partial(
            cfbn.fused_batch_norm_grad, d["dy"], d["x"], d["scale"], d["rs1"], d["rs2"],
            epsilon=EPSILON, data_format=layout, is_training=True, n_threads=threads, out=out)
    if op == "gradgrad":
        return functools.partial(
            cfbn.fused_batch_norm_grad_grad, d["dy"], d["x"], d["scale"], d["rs1"], d["rs2"],
            d["ggx"], d["ggs"], d["ggo"], epsilon=EPSILON, data_format=layout, is_training=True,
            n_threads=threads, out=out)
    raise ValueError(op)


def cfbn_out(op, d):
    """Preallocated outputs for `cfbn_call(..., out=...)`."""
    x, c = d["x"], d["shape"][3]
    vdt = d["scale"].dtype
    if op == "grad":
        return {"x_backprop": np.empty_like(x), "scale_backprop": np.empty(c, vdt),
                "offset_backprop": np.empty(c, vdt)}
    if op == "gradgrad":
        return {"y_backprop_backprop": np.empty_like(x), "x_backprop": np.empty_like(x),
                "scale_backprop": np.empty(c, vdt)}
    return {"y": np.empty_like(x), "batch_mean": np.empty(c, vdt),
            "batch_variance": np.empty(c, vdt), "reserve_space_1": np.empty(c, vdt),
            "reserve_space_2": np.empty(c, vdt)}


def reference_call(op, d):
    ref = cfbn.reference
    layout = d["layout"]
    if op == "train":
        return functools.partial(
            ref.fused_batch_norm, d["x"], d["scale"], d["offset"], d["mean"], d["variance"],
            epsilon=EPSILON, exponential_avg_factor=FACTOR, data_format=layout, is_training=True)
    if op == "infer":
        return functools.partial(
            ref.fused_batch_norm, d["x"], d["scale"], d["offset"], d["mean"], d["variance"],
            epsilon=EPSILON, data_format=layout, is_training=False)
    if op == "grad":
        return functools.partial(
            ref.fused_batch_norm_grad, d["dy"], d["x"], d["scale"], d["rs1"], d["rs2"],
            epsilon=EPSILON, data_format=layout, is_training=True)
    if op == "gradgrad":
        return functools.partial(
            ref.fused_batch_norm_grad_grad, d["dy"], d["x"], d["scale"], d["rs1"], d["rs2"],
            d["ggx"], d["ggs"], d["ggo"], epsilon=EPSILON, data_format=layout, is_training=True)
    raise ValueError(op)


# ---------------------------------------------------------------- PyTorch


def have_module(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def torch_module():
    """torch, or None when it is not installed."""
    if not have_module("torch"):
        return None
    import torch
    return torch


def torch_tensor(torch, a, layout):
    """The NumPy array `a` as a logical NCHW torch tensor sharing its memory.

    An NHWC array becomes the permuted view, i.e. a channels_last tensor, so
    torch computes on exactly the bytes cfbn reads.
    """
    if a.dtype.name == "bfloat16":   # ml_dtypes' bfloat16: the same bits as torch's
        t = torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(a)
    if a.ndim == 4 and layout == "NHWC":
        t = t.permute(0, 3, 1, 2)
    return t


def torch_to_numpy(t, layout):
    """A logical NCHW torch result back in `layout` as a NumPy array."""
    if t.dim() == 4 and layout == "NHWC":
        t = t.permute(0, 2, 3, 1)
    t = t.contiguous()
    if str(t.dtype) == "torch.bfloat16":
        import ml_dtypes
        import torch
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def torch_args(torch, d):
    """Torch views of the inputs (with the upstream gradients where `d` has
    them); the running statistics are private copies (ATen updates them in
    place in training)."""
    layout = d["layout"]
    invstd = (1.0 / np.sqrt(d["rs2"].astype(np.float64) + EPSILON)).astype(d["rs2"].dtype)
    upstream = {}
    if "ggx" in d:
        upstream = {"ggx": torch_tensor(torch, d["ggx"], layout),
                    "ggs": torch.from_numpy(d["ggs"]), "ggo": torch.from_numpy(d["ggo"])}
    return {
        **upstream,
        "layout": layout,
        "x": torch_tensor(torch, d["x"], layout),
        "dy": torch_tensor(torch, d["dy"], layout),
        "weight": torch.from_numpy(d["scale"]),
        "bias": torch.from_numpy(d["offset"]),
        "running_mean": torch.from_numpy(d["mean"].copy()),
        "running_var": torch.from_numpy(d["variance"].copy()),
        "save_mean": torch.from_numpy(d["rs1"]),
        "save_invstd": torch.from_numpy(invstd),
    }


def torch_call(torch, op, t):
    """A zero-argument callable running `op` with ATen on torch_args `t`.

    Threads follow torch.set_num_threads, set by the caller.
    """
    aten = torch.ops.aten
    if op == "train":
        return functools.partial(aten.native_batch_norm, t["x"], t["weight"], t["bias"],
                                 t["running_mean"], t["running_var"], True, FACTOR, EPSILON)
    if op == "infer":
        return functools.partial(aten.native_batch_norm, t["x"], t["weight"], t["bias"],
                                 t["running_mean"], t["running_var"], False, FACTOR, EPSILON)
    if op == "grad":
        return functools.partial(aten.native_batch_norm_backward, t["dy"], t["x"], t["weight"],
                                 t["running_mean"], t["running_var"], t["save_mean"],
                                 t["save_invstd"], True, EPSILON, [True, True, True])
    if op == "gradgrad":
        return torch_double_backward(torch, t)
    raise ValueError(op)


def torch_double_backward(torch, t):
    """A zero-argument callable giving what cfbn's grad-grad gives, by
    autograd's double backward through torch.nn.functional.batch_norm.

    The first-order graph (forward, then the gradient with create_graph) is
    built here, once; each call runs only its backward, retained between
    calls, with ggx, ggscale and ggoffset as the gradients of dx, dscale and
    doffset.  By linearity that is the gradient of sum(ggx * dx) +
    sum(ggscale * dscale) + sum(ggoffset * doffset) without the elementwise
    product and sum a loss written out would add.  Returns
    (d/d dy, d/dx, d/d scale).
    """
    x, weight, bias, dy = (t[k].detach().requires_grad_() for k in ("x", "weight", "bias", "dy"))
    y = torch.nn.functional.batch_norm(x, None, None, weight, bias, training=True, eps=EPSILON)
    first = torch.autograd.grad(y, (x, weight, bias), dy, create_graph=True)
    return functools.partial(torch.autograd.grad, first, (dy, x, weight),
                             (t["ggx"], t["ggs"], t["ggo"]), retain_graph=True)


def paired_outputs(op, r, p, layout):
    """(name, cfbn's output, PyTorch's as a NumPy array in `layout`) for each
    output of the gradient ops, from cfbn's result `r` and PyTorch's `p`."""
    return [(name, getattr(r, name), torch_to_numpy(q.detach(), layout))
            for name, q in zip(FIELDS[op], p)]


# ---------------------------------------------------------------- TensorFlow


def tensorflow_call(tf, op, d):
    """A zero-argument callable running `op` with tf.raw_ops on the CPU.

    The gradient takes its reserve spaces from TensorFlow's own training
    forward pass on x, as a TensorFlow model would.
    """
    layout = d["layout"]
    with tf.device("/CPU:0"):
        x = tf.constant(d["x"])
        dy = tf.constant(d["dy"])
        scale = tf.constant(d["scale"])
        offset = tf.constant(d["offset"])
        mean = tf.constant(d["mean"])
        variance = tf.constant(d["variance"])
        fwd = tf.raw_ops.FusedBatchNormV3
        if op == "grad":
            r = fwd(x=x, scale=scale, offset=offset, mean=mean, variance=variance,
                    epsilon=EPSILON, exponential_avg_factor=1.0, data_format=layout,
                    is_training=True)
            rs1, rs2, rs3 = r.reserve_space_1, r.reserve_space_2, r.reserve_space_3
    if op == "train":
        kwargs = dict(x=x, scale=scale, offset=offset, mean=mean, variance=variance,
                      epsilon=EPSILON, exponential_avg_factor=FACTOR, data_format=layout,
                      is_training=True)
        fn = fwd
    elif op == "infer":
        kwargs = dict(x=x, scale=scale, offset=offset, mean=mean, variance=variance,
                      epsilon=EPSILON, data_format=layout, is_training=False)
        fn = fwd
    elif op == "grad":
        kwargs = dict(y_backprop=dy, x=x, scale=scale, reserve_space_1=rs1,
                      reserve_space_2=rs2, reserve_space_3=rs3, epsilon=EPSILON,
                      data_format=layout, is_training=True)
        fn = tf.raw_ops.FusedBatchNormGradV3
    else:
        raise ValueError(op)

    def call():
        with tf.device("/CPU:0"):
            return fn(**kwargs)

    return call


# ---------------------------------------------------------------- timing


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def batch(fn, calls):
    """Seconds per call over `calls` back-to-back calls, collector off."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) / calls
    finally:
        if enabled:
            gc.enable()


def calls_for(fn, min_batch):
    """Warm `fn` up; return the number of calls that lasts `min_batch` seconds."""
    start = time.perf_counter()
    n = 0
    while n < 3 or time.perf_counter() - start < min(0.05, 2 * min_batch):
        fn()
        n += 1
    single = min(batch(fn, 1) for _ in range(3))
    return max(1, math.ceil(min_batch / max(single, 1e-9)))


def interleaved(fns, repeats, min_batch):
    """Per-call times of each callable in `fns`, one list of `repeats` samples
    each, measured alternately (the order flips every repeat)."""
    calls = [calls_for(fn, min_batch) for fn in fns]
    samples = [[] for _ in fns]
    order = list(range(len(fns)))
    for r in range(repeats):
        seq = order if r % 2 == 0 else order[::-1]
        for i in seq:
            samples[i].append(batch(fns[i], calls[i]))
    return samples


def median_ratio(fn_a, fn_b, repeats, min_batch):
    """Median over `repeats` interleaved rounds of fn_a's time per call over
    fn_b's (a ratio per round, so that a slow round slows both alike)."""
    a, b = interleaved([fn_a, fn_b], repeats, min_batch)
    r = sorted(x / y for x, y in zip(a, b))
    return r[len(r) // 2]


# ---------------------------------------------------------------- machine


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count()


def machine_info():
    info = cfbn.runtime_info()
    torch = torch_module()
    return {
        "cpu": cpu_model(),
        "cores": usable_cores(),
        "cpu_count": os.cpu_count(),
        "isa": info["selected_isa"],
        "max_threads": info["max_threads"],
        "openmp": info["openmp"],
        "output_cache_mb": info["output_cache_limit"] >> 20,
        "cfbn": cfbn.__version__,
        "numpy": np.__version__,
        "torch": torch.__version__ if torch is not None else None,
        "python": platform.python_version(),
        "platform": sys.platform,
    }
