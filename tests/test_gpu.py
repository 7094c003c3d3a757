"""The CuPy path against cfbn.reference and the CPU path; the array-type dispatch.

Execution tests need a GPU and are skipped, with the reason, where CuPy is
missing or cupy.is_available() is false.  The fused activation and side input
are held to test_activation.py's bounds (tests/_act_checks.py).  The dispatch tests run anywhere.
"""
import subprocess
import sys

import numpy as np
import pytest

import cfbn
from _act_checks import (ACTIVATIONS, ALPHA, FUSIONS, KINKS, check_fused_forward,
                         check_fused_grad, fusion_id, make_case)
from _checks import (BFLOAT16, DTYPES, LAYOUTS, check_forward, check_grad, check_grad_grad,
                     make_shape, random_vectors, random_x, seed_of, vector_dtype)

try:
    import cupy
except ImportError:
    cupy = None

if cupy is None:
    _WHY = "cupy is not installed"
elif not cupy.is_available():
    _WHY = "cupy.is_available() is false: no usable CUDA device or driver"
else:
    _WHY = ""
needs_gpu = pytest.mark.skipif(bool(_WHY), reason=_WHY or "GPU available")

GPU_SHAPES = [(2, 7, 3), (3, 33, 17), (1, 7, 257), (1, 1, 5), (0, 7, 8), (8, 4096, 16)]


def to_host(result):
    return type(result)(*(cupy.asnumpy(a) for a in result))


def cpu_tolerance(dtype):
    """GPU against CPU results: both are float32 results rounded once, so a
    2-byte output may be one ulp apart (2**-7 of the value for bfloat16)."""
    return {np.dtype(np.float16): 1e-2, BFLOAT16: 4e-2}.get(np.dtype(dtype), 1e-5)


@needs_gpu
@pytest.mark.parametrize("dims", GPU_SHAPES, ids=str)
@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
def test_forward_matches_reference_and_cpu(dtype, data_format, dims, is_training):
    rng = np.random.default_rng(seed_of("gpu-fwd", dtype, data_format, dims, is_training))
    shape = make_shape(data_format, *dims)
    x = random_x(rng, shape, data_format, dtype)
    v = random_vectors(rng, dims[2], dtype)
    f = 0.25 if is_training else 1.0
    kw = dict(epsilon=1e-3, data_format=data_format, is_training=is_training,
              exponential_avg_factor=f)
    got = cfbn.fused_batch_norm(cupy.asarray(x), *(cupy.asarray(v[k]) for k in
                                ("scale", "offset", "mean", "variance")), **kw)
    assert all(isinstance(a, cupy.ndarray) for a in got)
    host = to_host(got)
    check_forward(host, x, v["scale"], v["offset"], v["mean"], v["variance"], **kw)
    cpu = cfbn.fused_batch_norm(x, v["scale"], v["offset"], v["mean"], v["variance"], **kw)
    for g, c in zip(host, cpu):
        np.testing.assert_allclose(g.astype(np.float64), c.astype(np.float64),
                                   rtol=cpu_tolerance(dtype), atol=cpu_tolerance(dtype))


@needs_gpu
@pytest.mark.parametrize("dims", GPU_SHAPES, ids=str)
@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
def test_grad_matches_reference(dtype, data_format, dims, is_training):
    rng = np.random.default_rng(seed_of("gpu-grad", dtype, data_format, dims, is_training))
    shape = make_shape(data_format, *dims)
    x = random_x(rng, shape, data_format, dtype)
    dy = random_x(rng, shape, data_format, dtype, loc=0.0, std=1.0)
    v = random_vectors(rng, dims[2], dtype)
    kw = dict(epsilon=1e-3, data_format=data_format, is_training=is_training)
    got = cfbn.fused_batch_norm_grad(*(cupy.asarray(a) for a in
                                       (dy, x, v["scale"], v["mean"], v["variance"])), **kw)
    check_grad(to_host(got), dy, x, v["scale"], v["mean"], v["variance"], **kw)


@needs_gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BFLOAT16],
                         ids=lambda d: np.dtype(d).name)
def test_large_mean_keeps_precision(dtype):
    rng = np.random.default_rng(seed_of("gpu-shift", dtype))
    shape = make_shape("NHWC", 4, 1000, 8)
    x = random_x(rng, shape, "NHWC", dtype, loc=100.0 if dtype == np.float16 else 1e4,
                 std=1.0)
    v = random_vectors(rng, 8, dtype)
    got = cfbn.fused_batch_norm(cupy.asarray(x), cupy.asarray(v["scale"]),
                                cupy.asarray(v["offset"]))
    check_forward(to_host(got), x, v["scale"], v["offset"], None, None, epsilon=1e-4,
                  data_format="NHWC", is_training=True)


@needs_gpu
def test_out_and_in_place_running_statistics():
    rng = np.random.default_rng(seed_of("gpu-out"))
    x = cupy.asarray(random_x(rng, (2, 3, 5, 4), "NHWC", np.float32))
    v = {k: cupy.asarray(a) for k, a in random_vectors(rng, 4, np.float32).items()}
    mean0, var0 = v["mean"].copy(), v["variance"].copy()
    y = cupy.full(x.shape, cupy.nan, np.float32)
    res = cfbn.fused_batch_norm(x, v["scale"], v["offset"], v["mean"], v["variance"],
                                exponential_avg_factor=0.1,
                                out={"y": y, "batch_mean": v["mean"],
                                     "batch_variance": v["variance"]})
    assert res.y is y and res.batch_mean is v["mean"]
    ref = cfbn.fused_batch_norm(cupy.asnumpy(x), *(cupy.asnumpy(a) for a in
                                (v["scale"], v["offset"], mean0, var0)),
                                exponential_avg_factor=0.1)
    np.testing.assert_allclose(cupy.asnumpy(res.batch_mean), ref.batch_mean, rtol=1e-6)
    np.testing.assert_allclose(cupy.asnumpy(res.y), ref.y, rtol=1e-5, atol=1e-5)


@needs_gpu
def test_gpu_errors_match_cpu_wording():
    x = cupy.zeros((2, 3, 3, 4), np.float32)
    s = cupy.ones(4, np.float32)
    with pytest.raises(ValueError, match="scale"):
        cfbn.fused_batch_norm(x, cupy.ones(5, np.float32), s)
    with pytest.raises(TypeError, match="offset"):
        cfbn.fused_batch_norm(x, s, cupy.ones(4, np.float64))
    with pytest.raises(ValueError, match="mean"):
        cfbn.fused_batch_norm(x, s, s, is_training=False)
    with pytest.raises(TypeError, match="offset.*host memory.*CuPy"):
        cfbn.fused_batch_norm(x, s, np.ones(4, np.float32))
    with pytest.raises(ValueError, match="data_format"):
        cfbn.fused_batch_norm(x, s, s, data_format="NWHC")


# ---- fused activation and side input ----

# training on every shape, inference on one
FUSED_MODES = [(True, d) for d in [(3, 33, 17), (1, 7, 257), (0, 7, 8), (8, 4096, 16)]] + [
    (False, (3, 33, 17))]


def _mode_id(v):
    return ("train" if v else "infer") if isinstance(v, bool) else "x".join(map(str, v))


@needs_gpu
@pytest.mark.parametrize("is_training,dims", FUSED_MODES, ids=_mode_id)
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW", "NC"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("act,with_side", FUSIONS, ids=fusion_id)
def test_fused_matches_reference_and_cpu(act, with_side, dtype, data_format, dims, is_training):
    x, v, side, dy = make_case(data_format, dtype, dims,
                               seed_of("gpu-fused", act, with_side, dtype, data_format, dims,
                                       is_training), with_side)
    alpha = ALPHA.get(act)
    kw = dict(epsilon=1e-3, data_format=data_format, is_training=is_training)
    mean, var = (None, None) if is_training else (v["mean"], v["variance"])
    dev = lambda a: None if a is None else cupy.asarray(a)  # noqa: E731
    got = cfbn.fused_batch_norm(dev(x), dev(v["scale"]), dev(v["offset"]), dev(mean), dev(var),
                                activation=act, alpha=alpha, side_input=dev(side), **kw)
    host = to_host(got)
    check_fused_forward(host, x, v["scale"], v["offset"], mean, var, side, act, alpha, **kw)
    cpu = cfbn.fused_batch_norm(x, v["scale"], v["offset"], mean, var, activation=act,
                                alpha=alpha, side_input=side, **kw)
    tol = cpu_tolerance(dtype)
    for g, c in zip(host, cpu):
        np.testing.assert_allclose(g.astype(np.float64), c.astype(np.float64), rtol=tol,
                                   atol=tol)
    mu, sv = (host.reserve_space_1, host.reserve_space_2) if is_training else (mean, var)
    grad = cfbn.fused_batch_norm_grad(dev(dy), dev(x), dev(v["scale"]), dev(mu), dev(sv),
                                      offset=dev(v["offset"]), activation=act, alpha=alpha,
                                      side_input=dev(side), **kw)
    assert type(grad) is (cfbn.BatchNormGradSide if with_side else cfbn.BatchNormGrad)
    hg = to_host(grad)
    check_fused_grad(hg, dy, x, v["scale"], v["offset"], mu, sv, side, act, alpha, **kw)
    if act in KINKS:
        # a pre-activation within rounding of a kink may take either side's
        # derivative on either path; the reference bounds above allow for it
        return
    cg = cfbn.fused_batch_norm_grad(dy, x, v["scale"], mu, sv, offset=v["offset"],
                                    activation=act, alpha=alpha, side_input=side, **kw)
    for g, c in zip(hg, cg):
        np.testing.assert_allclose(g.astype(np.float64), c.astype(np.float64), rtol=tol,
                                   atol=tol * 10)


@needs_gpu
@pytest.mark.parametrize("act", ["relu", "relu6", "leaky_relu", "elu"])
def test_fused_derivative_at_kinks(act):
    """relu'(0) = 0, relu6'(0) = relu6'(6) = 0, leaky_relu'(0) = elu'(0) = alpha."""
    x = cupy.asarray(np.array([[0.0, 6.0, -1.0, 2.0]], np.float32))
    ones, zeros = cupy.ones(4, np.float32), cupy.zeros(4, np.float32)
    g = cfbn.fused_batch_norm_grad(cupy.ones_like(x), x, ones, zeros, ones, epsilon=0.0,
                                   data_format="NC", is_training=False, offset=zeros,
                                   activation=act)
    alpha = {"leaky_relu": 0.01, "elu": 1.0}.get(act, 0.0)
    want = {"relu": [0, 1, 0, 1], "relu6": [0, 0, 0, 1],
            "leaky_relu": [alpha, 1, alpha, 1], "elu": [alpha, 1, np.exp(-1.0), 1]}[act]
    np.testing.assert_allclose(cupy.asnumpy(g.x_backprop[0]), want, rtol=1e-6)


@needs_gpu
@pytest.mark.parametrize("act", ACTIVATIONS[1:], ids=fusion_id)
def test_fused_nan_propagates(act):
    rng = np.random.default_rng(3)
    xh = rng.standard_normal((4, 5, 5, 3)).astype(np.float32)
    xh[1, 2, 3, 1] = np.nan
    x = cupy.asarray(xh)
    s, o = cupy.ones(3, np.float32), cupy.zeros(3, np.float32)
    y = cfbn.fused_batch_norm(x, s, o, activation=act)
    yy = cupy.asnumpy(y.y)
    assert np.isnan(yy[..., 1]).all() and not np.isnan(yy[..., [0, 2]]).any()
    g = to_host(cfbn.fused_batch_norm_grad(cupy.ones_like(x), x, s, y.reserve_space_1,
                                           y.reserve_space_2, offset=o, activation=act))
    assert np.isnan(g.x_backprop[..., 1]).all() and not np.isnan(g.x_backprop[..., [0, 2]]).any()
    assert np.isnan(g.scale_backprop[1]) and np.isnan(g.offset_backprop[1])


@needs_gpu
def test_fused_in_place_on_side_input_and_dy():
    rng = np.random.default_rng(5)
    x = cupy.asarray(rng.standard_normal((2, 9, 7, 19)).astype(np.float32))
    side = cupy.asarray(rng.standard_normal(x.shape).astype(np.float32))
    s, o = cupy.ones(19, np.float32), cupy.zeros(19, np.float32)
    want = cfbn.fused_batch_norm(x, s, o, activation="relu", side_input=side)
    buf = side.copy()
    got = cfbn.fused_batch_norm(x, s, o, activation="relu", side_input=buf, out={"y": buf})
    assert got.y is buf
    cupy.testing.assert_array_equal(buf, want.y)
    dy = cupy.asarray(rng.standard_normal(x.shape).astype(np.float32))
    gw = cfbn.fused_batch_norm_grad(dy, x, s, want.reserve_space_1, want.reserve_space_2,
                                    offset=o, activation="silu", side_input=side)
    dyb = dy.copy()
    gg = cfbn.fused_batch_norm_grad(dyb, x, s, want.reserve_space_1, want.reserve_space_2,
                                    offset=o, activation="silu", side_input=side,
                                    out={"x_backprop": dyb})
    assert gg.x_backprop is dyb
    cupy.testing.assert_array_equal(dyb, gw.x_backprop)
    cupy.testing.assert_array_equal(gg.side_input_backprop, gw.side_input_backprop)


@needs_gpu
def test_fused_errors_match_cpu_wording():
    x = cupy.ones((2, 3), np.float32)
    s = cupy.ones(3, np.float32)
    kw = {"data_format": "NC"}
    with pytest.raises(ValueError, match="activation"):
        cfbn.fused_batch_norm(x, s, s, activation="gelu", **kw)
    with pytest.raises(ValueError, match="alpha"):
        cfbn.fused_batch_norm(x, s, s, activation="relu", alpha=0.1, **kw)
    with pytest.raises(ValueError, match="side_input"):
        cfbn.fused_batch_norm(x, s, s, side_input=cupy.ones((3, 2), np.float32), **kw)
    with pytest.raises(TypeError, match="side_input"):
        cfbn.fused_batch_norm(x, s, s, side_input=cupy.ones((2, 3), np.float64), **kw)
    with pytest.raises(TypeError, match="side_input.*host memory.*CuPy"):
        cfbn.fused_batch_norm(x, s, s, side_input=np.ones((2, 3), np.float32), **kw)
    with pytest.raises(ValueError, match="offset"):
        cfbn.fused_batch_norm_grad(x, x, s, s, s, activation="relu", **kw)
    with pytest.raises(TypeError, match="offset.*host memory"):
        cfbn.fused_batch_norm_grad(x, x, s, s, s, offset=np.ones(3, np.float32),
                                   activation="relu", **kw)
    with pytest.raises(ValueError, match="4 entries"):
        cfbn.fused_batch_norm_grad(x, x, s, s, s, side_input=x, out=(None, None, None), **kw)


# ---- second-order gradient ----

def _gg_case(dtype, data_format, dims, is_training, with_ggx):
    """(args of fused_batch_norm_grad_grad as NumPy arrays, its keywords)."""
    rng = np.random.default_rng(seed_of("gpu-gg", dtype, data_format, dims, is_training,
                                        with_ggx))
    shape = make_shape(data_format, *dims)
    x = random_x(rng, shape, data_format, dtype)
    dy = random_x(rng, shape, data_format, dtype, loc=0.0, std=1.0)
    ggx = random_x(rng, shape, data_format, dtype, loc=0.0, std=1.0) if with_ggx else None
    v = random_vectors(rng, dims[2], dtype)
    w = random_vectors(rng, dims[2], dtype)
    args = (dy, x, v["scale"], v["mean"], v["variance"], ggx, w["scale"], w["offset"])
    return args, dict(epsilon=1e-3, data_format=data_format, is_training=is_training)


def _dev(args):
    return [None if a is None else cupy.asarray(a) for a in args]


def assert_near_cpu(got, cpu, dtype):
    """GPU against CPU, relative to each output's largest value: the two
    round differently (FMA contraction, the order of the sums), and the
    second-order outputs cancel where their terms do."""
    tol = cpu_tolerance(dtype)
    for name, g, c in zip(cfbn.BatchNormGradGrad._fields, got, cpu):
        c = c.astype(np.float64)
        scale = max(1.0, float(np.max(np.abs(c)))) if c.size else 1.0
        np.testing.assert_allclose(g.astype(np.float64), c, rtol=tol, atol=tol * scale,
                                   err_msg=name)


@needs_gpu
@pytest.mark.parametrize("with_ggx", [True, False], ids=["ggx", "no_ggx"])
@pytest.mark.parametrize("dims", GPU_SHAPES, ids=str)
@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
def test_grad_grad_matches_reference_and_cpu(dtype, data_format, dims, is_training, with_ggx):
    args, kw = _gg_case(dtype, data_format, dims, is_training, with_ggx)
    got = cfbn.fused_batch_norm_grad_grad(*_dev(args), **kw)
    assert type(got) is cfbn.BatchNormGradGrad
    assert all(isinstance(a, cupy.ndarray) for a in got)
    host = to_host(got)
    check_grad_grad(host, *args, **kw)
    assert_near_cpu(host, cfbn.fused_batch_norm_grad_grad(*args, **kw), dtype)


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
def test_grad_grad_none_means_zeros(dtype, is_training):
    args, kw = _gg_case(dtype, "NCHW", (3, 33, 17), is_training, True)
    dev = _dev(args)
    zeros = cupy.zeros_like(dev[6])
    # None vectors are zeros for the same kernels: the same numbers
    for i in (6, 7):
        want = cfbn.fused_batch_norm_grad_grad(*dev[:i], zeros, *dev[i + 1:], **kw)
        got = cfbn.fused_batch_norm_grad_grad(*dev[:i], None, *dev[i + 1:], **kw)
        for g, w in zip(got, want):
            cupy.testing.assert_array_equal(g, w)
    # ggx None takes other passes (the C driver's), with ggx zeros' values
    # and a scale_backprop of exactly 0
    none = to_host(cfbn.fused_batch_norm_grad_grad(*dev[:5], None, *dev[6:], **kw))
    zero = to_host(cfbn.fused_batch_norm_grad_grad(*dev[:5], cupy.zeros_like(dev[1]), *dev[6:],
                                                   **kw))
    assert_near_cpu(none, zero, dtype)
    assert not none.scale_backprop.any()
    assert_near_cpu(none, cfbn.fused_batch_norm_grad_grad(*args[:5], None, *args[6:], **kw),
                    dtype)


@needs_gpu
@pytest.mark.parametrize("with_ggx", [True, False], ids=["ggx", "no_ggx"])
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_grad_grad_inference_dx_from_dy_alone(data_format, with_ggx):
    """dx = ggscale * r * dy: a NaN in x or ggx stays out of it (and of the
    other channels), as on the CPU."""
    args, kw = _gg_case(np.float32, data_format, (2, 7, 3), False, with_ggx)
    args = list(args)
    axis = 1 if data_format == "NCHW" else -1
    x = args[1].copy()
    np.moveaxis(x, axis, -1)[0, 0, 1, 1] = np.nan
    args[1] = x
    if with_ggx:
        q = args[5].copy()
        np.moveaxis(q, axis, -1)[1, 0, 0, 2] = np.nan
        args[5] = q
    got = to_host(cfbn.fused_batch_norm_grad_grad(*_dev(args), **kw))
    assert np.isfinite(got.x_backprop).all()
    cpu = cfbn.fused_batch_norm_grad_grad(*args, **kw)
    np.testing.assert_allclose(got.x_backprop, cpu.x_backprop, rtol=1e-6, atol=1e-6)
    want = np.isnan(args[1]) | (np.isnan(args[5]) if with_ggx else False)
    np.testing.assert_array_equal(np.isnan(got.y_backprop_backprop), want)
    np.testing.assert_array_equal(np.isnan(got.scale_backprop), np.isnan(cpu.scale_backprop))


@needs_gpu
def test_grad_grad_one_element_per_channel_and_empty_batch():
    for dims in [(1, 1, 5), (0, 7, 8)]:
        for is_training in (True, False):
            args, kw = _gg_case(np.float32, "NHWC", dims, is_training, True)
            host = to_host(cfbn.fused_batch_norm_grad_grad(*_dev(args), **kw))
            check_grad_grad(host, *args, **kw)
            if dims[0] == 0:
                assert host.y_backprop_backprop.shape == args[1].shape
                np.testing.assert_array_equal(host.scale_backprop, 0.0)
    # one element that is its channel's mean: dx is exactly 0 and ddy ggoffset
    args, kw = _gg_case(np.float32, "NC", (1, 1, 5), True, True)
    args = list(args)
    args[3] = args[1][0].copy()
    host = to_host(cfbn.fused_batch_norm_grad_grad(*_dev(args), **kw))
    np.testing.assert_array_equal(host.x_backprop, 0.0)
    np.testing.assert_array_equal(host.y_backprop_backprop[0], args[7])


@needs_gpu
def test_grad_grad_out():
    args, kw = _gg_case(np.float32, "NHWC", (2, 9, 6), True, True)
    dev = _dev(args)
    want = cfbn.fused_batch_norm_grad_grad(*dev, **kw)
    ddy = cupy.full(dev[1].shape, cupy.nan, np.float32)
    sbp = cupy.full(6, cupy.nan, np.float32)
    got = cfbn.fused_batch_norm_grad_grad(*dev, out={"y_backprop_backprop": ddy,
                                                     "scale_backprop": sbp}, **kw)
    assert got.y_backprop_backprop is ddy and got.scale_backprop is sbp
    for g, w in zip(got, want):
        cupy.testing.assert_array_equal(g, w)
    got = cfbn.fused_batch_norm_grad_grad(*dev, out=(None, ddy, None), **kw)
    assert got.x_backprop is ddy
    cupy.testing.assert_array_equal(ddy, want.x_backprop)


@needs_gpu
@pytest.mark.parametrize("field,name,index", [
    ("x_backprop", "y_backprop", 0), ("y_backprop_backprop", "x", 1),
    ("x_backprop", "grad_x_backprop", 5), ("scale_backprop", "scale", 2),
    ("scale_backprop", "grad_offset_backprop", 7)])
def test_grad_grad_refuses_outputs_in_inputs(field, name, index):
    """No in-place pairs: an output may not be, nor overlap, any input."""
    args, kw = _gg_case(np.float32, "NHWC", (2, 9, 6), True, True)
    dev = _dev(args)
    with pytest.raises(ValueError, match=r"out\[%r\]: is the memory of input %s"
                       % (field, name)):
        cfbn.fused_batch_norm_grad_grad(*dev, out={field: dev[index]}, **kw)
    # the input and the output one element apart in one buffer
    a = dev[index]
    buf = cupy.empty(a.size + 1, a.dtype)
    buf[:-1] = a.reshape(-1)
    dev[index] = buf[:-1].reshape(a.shape)
    with pytest.raises(ValueError, match=r"out\[%r\]: partly overlaps input %s"
                       % (field, name)):
        cfbn.fused_batch_norm_grad_grad(*dev, out={field: buf[1:].reshape(a.shape)}, **kw)


def _error_of(call):
    try:
        call()
    except (TypeError, ValueError) as exc:
        return type(exc), str(exc)
    raise AssertionError("no error")


@needs_gpu
def test_grad_grad_errors_match_cpu():
    """Each bad argument gives the CPU path's error, type and message."""
    args, kw = _gg_case(np.float32, "NHWC", (2, 9, 6), True, True)
    f64 = [a.astype(np.float64) for a in args]
    bad = {
        "grad_x_backprop dtype": (5, f64[5]),
        "grad_x_backprop shape": (5, args[5][:1]),
        "y_backprop dtype": (0, f64[0]),
        "scale shape": (2, args[2][:5]),
        "reserve_space_2 dtype": (4, f64[4]),
        "grad_scale_backprop shape": (6, np.ones(7, np.float32)),
        "grad_offset_backprop dtype": (7, f64[7]),
    }
    for what, (i, value) in bad.items():
        cpu_args, gpu_args = list(args), _dev(args)
        cpu_args[i], gpu_args[i] = value, cupy.asarray(value)
        want = _error_of(lambda: cfbn.fused_batch_norm_grad_grad(*cpu_args, **kw))
        got = _error_of(lambda: cfbn.fused_batch_norm_grad_grad(*gpu_args, **kw))
        assert got == want, what
        assert want[1].startswith(what.split()[0] + ":"), want
    dev = _dev(args)
    wrong = cupy.empty(dev[1].shape, np.float64)
    for kwargs in ({"data_format": "NCHW"}, {"epsilon": -1.0}, {"is_training": 1},
                   {"n_threads": 0}, {"out": (None, None)}, {"out": {"x_backprop": wrong}},
                   {"out": {"dx": wrong}}):
        gpu_kw = dict(kw, **kwargs)
        cpu_kw = dict(gpu_kw)
        if isinstance(kwargs.get("out"), dict):
            cpu_kw["out"] = {k: cupy.asnumpy(v) for k, v in kwargs["out"].items()}
        want = _error_of(lambda: cfbn.fused_batch_norm_grad_grad(*args, **cpu_kw))
        got = _error_of(lambda: cfbn.fused_batch_norm_grad_grad(*dev, **gpu_kw))
        assert got == want, kwargs


@needs_gpu
def test_grad_grad_host_arrays_are_named():
    args, kw = _gg_case(np.float32, "NHWC", (2, 9, 6), True, True)
    for i, name in [(0, "y_backprop"), (5, "grad_x_backprop"), (2, "scale"),
                    (3, "reserve_space_1"), (6, "grad_scale_backprop"),
                    (7, "grad_offset_backprop")]:
        dev = _dev(args)
        dev[i] = args[i]
        with pytest.raises(TypeError, match=r"^%s: got numpy.ndarray \(host memory\), but x "
                           r"is a CuPy array" % name):
            cfbn.fused_batch_norm_grad_grad(*dev, **kw)
    with pytest.raises(TypeError, match=r"out\['x_backprop'\]: got numpy.ndarray"):
        cfbn.fused_batch_norm_grad_grad(*_dev(args), out={"x_backprop": np.empty_like(args[1])},
                                        **kw)


# ---- dispatch: no GPU needed ----

class _FakeCupyArray:
    """Stands in for a CuPy array: the dispatch looks only at the type's module."""


_FakeCupyArray.__module__ = "cupy._fake"


@needs_gpu
def test_gpu_other_two_byte_dtypes_are_type_errors():
    v = cupy.ones(3, np.float32)
    for dt in (np.int16, np.uint16):
        x = cupy.zeros((2, 3), dt)
        with pytest.raises(TypeError, match=r"^x: expected float32, float64, float16 or bfloat16"):
            cfbn.fused_batch_norm(x, v, v, data_format="NC")


def test_mixed_numpy_and_cupy_names_the_argument():
    x = np.zeros((2, 2, 2, 3), np.float32)
    s = np.ones(3, np.float32)
    with pytest.raises(TypeError, match=r"scale: got a CuPy array, but x is a NumPy array"):
        cfbn.fused_batch_norm(x, _FakeCupyArray(), s)
    with pytest.raises(TypeError, match=r"y_backprop: got a CuPy array, but x is a NumPy"):
        cfbn.fused_batch_norm_grad(_FakeCupyArray(), x, s, s, s)
    with pytest.raises(TypeError, match=r"out\['y'\]: got a CuPy array"):
        cfbn.fused_batch_norm(x, s, s, out={"y": _FakeCupyArray()})
    with pytest.raises(TypeError, match=r"grad_x_backprop: got a CuPy array, but x is a NumPy"):
        cfbn.fused_batch_norm_grad_grad(x, x, s, s, s, _FakeCupyArray())
    with pytest.raises(TypeError, match=r"grad_offset_backprop: got a CuPy array, but x is a"):
        cfbn.fused_batch_norm_grad_grad(x, x, s, s, s, x, s, _FakeCupyArray())


def test_numpy_calls_never_import_cupy():
    code = ("import sys, numpy as np, cfbn\n"
            "x = np.ones((2, 2, 2, 3), np.float32); s = np.ones(3, np.float32)\n"
            "cfbn.fused_batch_norm(x, s, s)\n"
            "cfbn.fused_batch_norm(x, s, s, out={'y': np.empty_like(x)})\n"
            "cfbn.fused_batch_norm_grad(x, x, s, s, s)\n"
            "cfbn.fused_batch_norm_grad_grad(x, x, s, s, s, x, s, s)\n"
            "cfbn.fused_batch_norm_grad_grad(x, x, s, s, s, None, is_training=False)\n"
            "assert not any(m == 'cupy' or m.startswith('cupy.') for m in sys.modules)\n")
    subprocess.run([sys.executable, "-c", code], check=True)
