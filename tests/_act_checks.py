"""Checks of a fused activation / side input result against cfbn.reference.

The bounds are test_activation.py's (see its docstring), as functions of the
inputs, so that the CuPy path (tests/test_gpu.py) and the CPU replay of its
formulas (tests/test_bn_math.py) are held to the same ones as the C kernels.
"""
import numpy as np

from cfbn import reference

from _checks import (assert_close, forward_bounds, grad_bounds, make_shape, per_channel_view,
                     random_vectors, random_x, unit, vector_dtype)

ACTIVATIONS = [None, "relu", "relu6", "leaky_relu", "elu", "sigmoid", "tanh", "silu"]
# a non-default alpha, so that it demonstrably reaches the kernels
ALPHA = {"leaky_relu": 0.2, "elu": 1.3}
LIP = {None: 1.0, "relu": 1.0, "relu6": 1.0, "leaky_relu": 1.0, "elu": 1.3, "sigmoid": 0.25,
       "tanh": 1.0, "silu": 1.1}
LIP2 = {None: 0.0, "relu": 0.0, "relu6": 0.0, "leaky_relu": 0.0, "elu": 1.3, "sigmoid": 0.1,
        "tanh": 0.8, "silu": 0.5}
KINKS = {"relu": (0.0,), "relu6": (0.0, 6.0), "leaky_relu": (0.0,), "elu": (0.0,)}
# every activation with and without a side input (None without one is the plain call)
FUSIONS = [(a, side) for a in ACTIVATIONS for side in (False, True) if a is not None or side]


def fusion_id(v):
    if isinstance(v, bool):
        return "side" if v else "noside"
    return "none" if v is None else str(v)


def make_case(data_format, dtype, shape_case, seed, with_side):
    rng = np.random.default_rng(seed)
    shape = make_shape(data_format, *shape_case)
    x = random_x(rng, shape, data_format, dtype)
    v = random_vectors(rng, shape_case[2], dtype)
    side = (1.5 * rng.standard_normal(shape)).astype(dtype) if with_side else None
    dy = rng.standard_normal(shape).astype(dtype)
    return x, v, side, dy


def pre_activation(x, scale, offset, mu, var, side, epsilon, data_format):
    xd = np.asarray(x, np.float64)

    def bc(v):
        return per_channel_view(v, data_format, xd.ndim)

    r = 1.0 / np.sqrt(np.asarray(var, np.float64) + epsilon)
    pre = bc(np.asarray(scale, np.float64) * r) * (xd - bc(mu)) + bc(offset)
    if side is not None:
        pre = pre + np.asarray(side, np.float64)
    return pre


def derivative_error(act, pre, pre_err, u):
    """Bound on |act'| error at each element."""
    tol = LIP2[act] * pre_err + 8 * u * 1.3
    for k in KINKS.get(act, ()):
        tol = np.where(np.abs(pre - k) <= 2 * pre_err, tol + 2.3, tol)
    return tol


def check_fused_forward(got, x, scale, offset, mean, var, side, act, alpha, *, epsilon,
                        data_format, is_training):
    dtype = x.dtype
    kw = dict(epsilon=epsilon, data_format=data_format, is_training=is_training)
    ref = reference.fused_batch_norm(x, scale, offset, mean, var, activation=act, alpha=alpha,
                                     side_input=side, **kw)
    plain = reference.fused_batch_norm(x, scale, offset, mean, var, **kw)
    b = forward_bounds(x, scale, offset, mean, var, plain, **kw)
    u = unit(dtype)
    pre = plain.y + (0.0 if side is None else side.astype(np.float64))
    pre_err = b["y"] + 2 * u * np.abs(pre)
    tol = LIP[act] * pre_err + 8 * u * np.maximum(1.0, np.abs(ref.y))
    assert_close("y", got.y, ref.y, tol, dtype)
    for name in ("batch_mean", "batch_variance", "reserve_space_1", "reserve_space_2"):
        assert_close(name, getattr(got, name), getattr(plain, name), b[name], vector_dtype(dtype))


def check_fused_grad(got, dy, x, scale, offset, mu, var, side, act, alpha, *, epsilon,
                     data_format, is_training):
    dtype = x.dtype
    vdt = vector_dtype(dtype)
    ref = reference.fused_batch_norm_grad(dy, x, scale, mu, var, epsilon=epsilon,
                                          data_format=data_format, is_training=is_training,
                                          offset=offset, activation=act, alpha=alpha,
                                          side_input=side)
    u = unit(dtype)
    xd = x.astype(np.float64)
    pre = pre_activation(x, scale, offset, mu, var, side, epsilon, data_format)

    def bc(a):
        return per_channel_view(a, data_format, x.ndim)

    ar = bc(np.abs(scale.astype(np.float64)) / np.sqrt(var.astype(np.float64) + epsilon))
    mud = bc(mu)
    pre_err = 4 * u * (ar * (np.abs(xd) + np.abs(mud) + np.abs(xd - mud))
                       + np.abs(bc(offset)) + np.abs(pre)
                       + (0.0 if side is None else np.abs(side.astype(np.float64))))
    dyd = dy.astype(np.float64)
    g = dyd * reference.activation_grad(pre, act, alpha)
    dg = np.abs(dyd) * derivative_error(act, pre, pre_err, u)
    b = grad_bounds(g, x, scale, mu, var, epsilon=epsilon, data_format=data_format,
                    is_training=is_training)
    axes = reference.reduce_axes(data_format, x.ndim)
    n = int(np.prod([x.shape[a] for a in axes]))
    xhat = np.abs(xd - mud) / np.sqrt(bc(var.astype(np.float64)) + epsilon)
    e1 = np.sum(dg, axis=axes)
    e2 = np.sum(dg * xhat, axis=axes)
    if is_training and n > 0:
        edx = ar * (dg + (bc(e1) + xhat * bc(e2)) / n)
    else:
        edx = ar * dg
    assert_close("x_backprop", got.x_backprop, ref.x_backprop, b["x_backprop"] + edx, dtype)
    assert_close("scale_backprop", got.scale_backprop, ref.scale_backprop,
                 b["scale_backprop"] + e2, vdt)
    assert_close("offset_backprop", got.offset_backprop, ref.offset_backprop,
                 b["offset_backprop"] + e1, vdt)
    if side is not None:
        assert_close("side_input_backprop", got.side_input_backprop, ref.side_input_backprop,
                     dg + 2 * u * np.abs(g), dtype)
