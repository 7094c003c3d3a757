import numpy as np
import pytest

import cfbn
from cfbn import reference

from _checks import (
    DTYPES,
    LAYOUTS,
    SHAPES,
    Unmodified,
    check_grad,
    grad_buffers,
    make_shape,
    random_vectors,
    random_x,
    seed_of,
    vector_dtype,
)


def make_grad_case(data_format, dtype, shape_case, is_training, seed):
    """Inputs of a gradient call; in training the reserve spaces come from x itself."""
    rng = np.random.default_rng(seed)
    shape = make_shape(data_format, *shape_case)
    x = random_x(rng, shape, data_format, dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    v = random_vectors(rng, shape_case[2], dtype)
    vdt = vector_dtype(dtype)
    if is_training:
        fwd = reference.fused_batch_norm(x, v["scale"], v["offset"], data_format=data_format)
        mu = fwd.reserve_space_1.astype(vdt)
        var = fwd.reserve_space_2.astype(vdt)
    else:
        mu, var = v["mean"], v["variance"]
    return dy, x, v["scale"], mu, var


@pytest.mark.parametrize("shape_case", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("data_format", LAYOUTS)
def test_grad_matches_reference(isa, data_format, dtype, is_training, shape_case):
    dy, x, scale, mu, var = make_grad_case(
        data_format, dtype, shape_case, is_training,
        seed_of("grad", data_format, np.dtype(dtype).name, is_training, shape_case))
    out = grad_buffers(x.shape, shape_case[2], dtype)
    with Unmodified(dy, x, scale, mu, var):
        res = cfbn.fused_batch_norm_grad(dy, x, scale, mu, var, epsilon=1e-3,
                                         data_format=data_format, is_training=is_training,
                                         out=out)
    assert isinstance(res, cfbn.BatchNormGrad)
    for got, buf in zip(res, out):
        assert got is buf
    check_grad(res, dy, x, scale, mu, var, epsilon=1e-3, data_format=data_format,
               is_training=is_training)
    if shape_case[0] == 0:
        assert res.x_backprop.size == 0
        assert np.all(res.scale_backprop == 0) and np.all(res.offset_backprop == 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("data_format", LAYOUTS)
def test_grad_allocated_outputs_equal_out_buffers(isa, data_format, dtype):
    args = make_grad_case(data_format, dtype, (3, 13, 17), True, seed_of("galloc", data_format))
    fresh = cfbn.fused_batch_norm_grad(*args, data_format=data_format)
    into = cfbn.fused_batch_norm_grad(*args, data_format=data_format,
                                      out=grad_buffers(args[1].shape, 17, dtype))
    for name, a, b in zip(cfbn.BatchNormGrad._fields, fresh, into):
        expected = np.dtype(dtype) if name == "x_backprop" else vector_dtype(dtype)
        assert a.dtype == expected, name
        assert a.flags.c_contiguous, name
        assert a.tobytes() == b.tobytes(), name


def numerical_gradients(x, scale, offset, mean, variance, w, *, data_format, is_training,
                        epsilon, h=1e-5):
    """Central differences of L = sum(y * w) through the float64 reference forward."""

    def loss(x_, scale_, offset_):
        y = reference.fused_batch_norm(x_, scale_, offset_, mean, variance, epsilon=epsilon,
                                       data_format=data_format, is_training=is_training).y
        return float(np.sum(y * w))

    def central(f, a):
        g = np.empty_like(a)
        for i in np.ndindex(a.shape):
            up, down = a.copy(), a.copy()
            up[i] += h
            down[i] -= h
            g[i] = (f(up) - f(down)) / (2 * h)
        return g

    return (
        central(lambda a: loss(a, scale, offset), x),
        central(lambda a: loss(x, a, offset), scale),
        central(lambda a: loss(x, scale, a), offset),
    )


def fd_case(data_format, is_training):
    rng = np.random.default_rng(seed_of("fd", data_format, is_training))
    shape = make_shape(data_format, 2, 3, 3)
    x = random_x(rng, shape, data_format, np.float64)
    w = rng.standard_normal(shape)
    v = random_vectors(rng, 3, np.float64)
    mean, variance = (None, None) if is_training else (v["mean"], v["variance"])
    grads = numerical_gradients(x, v["scale"], v["offset"], mean, variance, w,
                                data_format=data_format, is_training=is_training,
                                epsilon=1e-3)
    if is_training:
        fwd = reference.fused_batch_norm(x, v["scale"], v["offset"], epsilon=1e-3,
                                         data_format=data_format)
        mean, variance = fwd.reserve_space_1, fwd.reserve_space_2
    return (w, x, v["scale"], mean, variance), grads


def assert_matches_fd(got, fd):
    for name, g, want in zip(("x_backprop", "scale_backprop", "offset_backprop"), got, fd):
        err = np.abs(np.asarray(g, np.float64) - want).max()
        assert err <= 1e-7 * (1 + np.abs(want).max()), f"{name}: {err:.2e} from finite differences"


@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
@pytest.mark.parametrize("data_format", LAYOUTS)
def test_reference_gradient_is_the_derivative_of_the_forward(data_format, is_training):
    args, fd = fd_case(data_format, is_training)
    got = reference.fused_batch_norm_grad(*args, epsilon=1e-3, data_format=data_format,
                                          is_training=is_training)
    assert_matches_fd(got, fd)


@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
@pytest.mark.parametrize("data_format", LAYOUTS)
def test_gradient_is_the_derivative_of_the_forward(isa, data_format, is_training):
    args, fd = fd_case(data_format, is_training)
    got = cfbn.fused_batch_norm_grad(*args, epsilon=1e-3, data_format=data_format,
                                     is_training=is_training)
    assert_matches_fd(got, fd)


@pytest.mark.parametrize("reserve", ["nan", "finite"])
@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW", "NC"])
def test_empty_batch_gradient_is_zero(isa, data_format, is_training, reserve):
    # the forward pass of an empty batch returns NaN statistics, and those are
    # what a training step hands back; the sums over no elements are still 0
    shape = make_shape(data_format, 0, 7, 8)
    x = np.zeros(shape, np.float32)
    dy = np.zeros(shape, np.float32)
    scale = np.ones(8, np.float32)
    fill = np.nan if reserve == "nan" else 1.0
    mu, var = np.full(8, fill, np.float32), np.full(8, fill, np.float32)
    res = cfbn.fused_batch_norm_grad(dy, x, scale, mu, var, data_format=data_format,
                                     is_training=is_training,
                                     out=grad_buffers(shape, 8, np.float32))
    assert res.x_backprop.shape == shape
    assert np.array_equal(res.offset_backprop, np.zeros(8, np.float32))
    assert np.array_equal(res.scale_backprop, np.zeros(8, np.float32))
