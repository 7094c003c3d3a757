"""NumPy float64 implementation of the cfbn specification.

This module is the executable form of the specification, docs/spec.md:
every compiled kernel is judged against it. It favours clarity over speed,
evaluates everything in float64 with two-pass statistics, and imports
nothing but NumPy.
"""

from collections import namedtuple

import numpy as np

__all__ = [
    "LAYOUTS",
    "BatchNormOutput",
    "BatchNormGrad",
    "BatchNormGradSide",
    "BatchNormGradGrad",
    "ACTIVATIONS",
    "activation",
    "activation_grad",
    "channel_axis",
    "reduce_axes",
    "fused_batch_norm",
    "fused_batch_norm_grad",
    "fused_batch_norm_grad_grad",
]

#: Rank and channel axis of every supported ``data_format``.
LAYOUTS = {
    "NHWC": (4, 3),
    "NCHW": (4, 1),
    "NDHWC": (5, 4),
    "NCDHW": (5, 1),
    "NC": (2, 1),
}

BatchNormOutput = namedtuple(
    "BatchNormOutput",
    ["y", "batch_mean", "batch_variance", "reserve_space_1", "reserve_space_2"],
)
BatchNormGrad = namedtuple(
    "BatchNormGrad", ["x_backprop", "scale_backprop", "offset_backprop"]
)
BatchNormGradSide = namedtuple(
    "BatchNormGradSide",
    ["x_backprop", "scale_backprop", "offset_backprop", "side_input_backprop"],
)
BatchNormGradGrad = namedtuple(
    "BatchNormGradGrad", ["y_backprop_backprop", "x_backprop", "scale_backprop"]
)

#: Fusable activations and their default ``alpha`` (None: takes no alpha).
ACTIVATIONS = {
    None: None,
    "relu": None,
    "relu6": None,
    "leaky_relu": 0.01,
    "elu": 1.0,
    "sigmoid": None,
    "tanh": None,
    "silu": None,
}


def _alpha(name, alpha):
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}")
    default = ACTIVATIONS[name]
    return default if alpha is None else float(alpha)


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


# name -> (act(v, alpha), act'(v, alpha)), both in float64; the derivatives
# at the kinks as TensorFlow and PyTorch take them.  Every name of
# ACTIVATIONS but None has an entry: a name without one raises.
_MAX = np.finfo(np.float64).max

_FORMULAS = {
    "relu": (lambda v, a: np.where(v < 0, 0.0, v),
             lambda v, a: (v > 0).astype(np.float64)),
    "relu6": (lambda v, a: np.where(v < 0, 0.0, np.where(v > 6, 6.0, v)),
              lambda v, a: ((v > 0) & (v < 6)).astype(np.float64)),
    "leaky_relu": (lambda v, a: np.where(v < 0, a * v, v),
                   lambda v, a: np.where(v > 0, 1.0, a)),
    "elu": (lambda v, a: np.where(v < 0, a * np.expm1(np.minimum(v, 0.0)), v),
            lambda v, a: np.where(v > 0, 1.0, a * np.exp(np.minimum(v, 0.0)))),
    "sigmoid": (lambda v, a: _sigmoid(v),
                lambda v, a: _sigmoid(v) * (1.0 - _sigmoid(v))),
    "tanh": (lambda v, a: np.tanh(v),
             lambda v, a: 1.0 - np.tanh(v) ** 2),
    # v held to the finite range where it meets an Inf: silu(-Inf) = -0,
    # silu'(+Inf) = 1 and silu'(-Inf) = 0, the limits (not Inf/Inf, Inf*0)
    "silu": (lambda v, a: np.maximum(v, -_MAX) / (1.0 + np.exp(-v)),
             lambda v, a: _sigmoid(v) * (1.0 + np.clip(v, -_MAX, _MAX) * (1.0 - _sigmoid(v)))),
}


def activation(v, name, alpha=None):
    """The activation ``name`` of the pre-activation ``v``, in float64.

    NaN propagates (relu(NaN) is NaN).
    """
    v = np.asarray(v, dtype=np.float64)
    a = _alpha(name, alpha)
    if name is None:
        return v.copy()
    with np.errstate(over="ignore", invalid="ignore"):
        return _FORMULAS[name][0](v, a)


def activation_grad(v, name, alpha=None):
    """d activation / d v at ``v``, in float64.

    At the kinks, as TensorFlow and PyTorch: relu'(0) = 0, relu6'(0) =
    relu6'(6) = 0, leaky_relu'(0) = alpha, elu'(0) = alpha.  NaN gives NaN.
    """
    v = np.asarray(v, dtype=np.float64)
    a = _alpha(name, alpha)
    if name is None:
        return np.ones_like(v)
    with np.errstate(over="ignore", invalid="ignore"):
        d = _FORMULAS[name][1](v, a)
    return np.where(np.isnan(v), np.nan, d)


# the entry points below take an `activation` argument that hides the function
_activation_fn = activation


def channel_axis(data_format, ndim):
    """Return the channel axis of an array laid out as ``data_format``.

    Parameters
    ----------
    data_format : str
        One of ``"NHWC"``, ``"NCHW"``, ``"NDHWC"``, ``"NCDHW"``, ``"NC"``.
    ndim : int
        Rank of the array; must match the layout.

    Returns
    -------
    int
        Index of the channel axis.

    Raises
    ------
    ValueError
        If the layout is unknown or ``ndim`` does not match it.
    """
    if data_format not in LAYOUTS:
        raise ValueError(
            f"data_format must be one of {sorted(LAYOUTS)}, got {data_format!r}"
        )
    rank, axis = LAYOUTS[data_format]
    if ndim != rank:
        raise ValueError(
            f"x must have rank {rank} for data_format {data_format!r}, got {ndim}"
        )
    return axis


def reduce_axes(data_format, ndim):
    """Return the axes a per-channel reduction runs over.

    Parameters
    ----------
    data_format : str
        Layout name, see :func:`channel_axis`.
    ndim : int
        Rank of the array.

    Returns
    -------
    tuple of int
        Every axis except the channel axis.
    """
    c = channel_axis(data_format, ndim)
    return tuple(a for a in range(ndim) if a != c)


def _per_channel(v, ndim, axis):
    """Reshape a length-C vector so that it broadcasts along ``axis``."""
    shape = [1] * ndim
    shape[axis] = -1
    return np.asarray(v, dtype=np.float64).reshape(shape)


def _batch_moments(x, axes):
    """Two-pass mean and biased variance of float64 ``x`` over ``axes``.

    Returns ``(n, mu, var)``; with ``n == 0`` both statistics are NaN.
    """
    n = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    if n == 0:
        (c_axis,) = set(range(x.ndim)) - set(axes)
        nan = np.full(x.shape[c_axis], np.nan)
        return n, nan, nan.copy()
    mu = np.mean(x, axis=axes)
    d = x - np.expand_dims(mu, axes)
    var = np.mean(d * d, axis=axes)
    return n, mu, var


def fused_batch_norm(
    x,
    scale,
    offset,
    mean=None,
    variance=None,
    *,
    epsilon=1e-4,
    exponential_avg_factor=1.0,
    data_format="NHWC",
    is_training=True,
    activation=None,
    alpha=None,
    side_input=None,
):
    """Batch normalization forward pass, evaluated in float64.

    Parameters
    ----------
    x : array_like
        Input activations laid out as ``data_format``.
    scale, offset : array_like
        Per-channel gamma and beta, length C.
    mean, variance : array_like, optional
        Running statistics, length C. Required for inference and for
        training with ``exponential_avg_factor != 1``.
    epsilon : float, optional
        Added to the variance before the square root.
    exponential_avg_factor : float, optional
        Weight ``f`` of the batch statistics in the running averages.
    data_format : str, optional
        Layout of ``x``.
    is_training : bool, optional
        Use batch statistics (True) or the given population ones (False).
    activation, alpha : optional
        A fused activation (see ``ACTIVATIONS``) and its parameter.
    side_input : array_like, optional
        Added to the normalized value before the activation.

    Returns
    -------
    BatchNormOutput
        ``(y, batch_mean, batch_variance, reserve_space_1, reserve_space_2)``,
        all float64.
    """
    # NaN and Inf in x propagate by design (and n = 0 divides by zero), so
    # their floating-point warnings carry no information.
    with np.errstate(invalid="ignore", divide="ignore"):
        out = _forward(
            np.asarray(x, dtype=np.float64), scale, offset, mean, variance, epsilon,
            float(exponential_avg_factor), data_format, is_training,
        )
        pre = out.y
        if side_input is not None:
            pre = pre + np.asarray(side_input, dtype=np.float64)
        return out._replace(y=_activation_fn(pre, activation, alpha))


def _forward(x, scale, offset, mean, variance, epsilon, f, data_format, is_training):
    axis = channel_axis(data_format, x.ndim)
    axes = reduce_axes(data_format, x.ndim)
    if (not is_training or f != 1.0) and (mean is None or variance is None):
        raise ValueError(
            "mean and variance are required for inference and for "
            "exponential_avg_factor != 1"
        )
    gamma = np.asarray(scale, dtype=np.float64)
    beta = np.asarray(offset, dtype=np.float64)

    if is_training:
        n, mu, var = _batch_moments(x, axes)
        bessel = n / (n - 1) if n > 1 else 1.0
        if f == 1.0:
            batch_mean = mu.copy()
            batch_variance = var * bessel
        else:
            m = np.asarray(mean, dtype=np.float64)
            v = np.asarray(variance, dtype=np.float64)
            batch_mean = (1.0 - f) * m + f * mu
            batch_variance = (1.0 - f) * v + f * (var * bessel)
        reserve_1, reserve_2 = mu, var
    else:
        mu = np.asarray(mean, dtype=np.float64).copy()
        var = np.asarray(variance, dtype=np.float64).copy()
        batch_mean, batch_variance = mu.copy(), var.copy()
        if x.size == 0:
            # TensorFlow: "If input is empty, return NaN mean/variance".
            batch_mean[...] = np.nan
            batch_variance[...] = np.nan
        reserve_1, reserve_2 = mu.copy(), var.copy()

    r = 1.0 / np.sqrt(var + epsilon)
    y = _per_channel(gamma * r, x.ndim, axis) * (
        x - _per_channel(mu, x.ndim, axis)
    ) + _per_channel(beta, x.ndim, axis)
    return BatchNormOutput(y, batch_mean, batch_variance, reserve_1, reserve_2)


def fused_batch_norm_grad(
    y_backprop,
    x,
    scale,
    reserve_space_1,
    reserve_space_2,
    *,
    epsilon=1e-4,
    data_format="NHWC",
    is_training=True,
    offset=None,
    activation=None,
    alpha=None,
    side_input=None,
):
    """Batch normalization gradient, evaluated in float64.

    Parameters
    ----------
    y_backprop : array_like
        Upstream gradient ``dy``, same shape as ``x``.
    x : array_like
        Forward input laid out as ``data_format``.
    scale : array_like
        Per-channel gamma, length C.
    reserve_space_1, reserve_space_2 : array_like
        Mean and biased variance used by the forward pass (batch statistics
        in training, population statistics in inference).
    epsilon : float, optional
        Added to the variance before the square root.
    data_format : str, optional
        Layout of ``x`` and ``y_backprop``.
    is_training : bool, optional
        Whether the statistics were computed from ``x`` itself.
    offset, activation, alpha, side_input : optional
        With an activation, ``y_backprop`` is first multiplied by act' at the
        pre-activation ``scale * (x - mean) * r + offset + side_input``
        (``offset`` is then required).

    Returns
    -------
    BatchNormGrad or BatchNormGradSide
        ``(x_backprop, scale_backprop, offset_backprop)``, all float64, and
        ``side_input_backprop`` (y_backprop times act') when ``side_input``
        is given.
    """
    dy = np.asarray(y_backprop, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        if activation is not None:
            if offset is None:
                raise ValueError("offset is required with an activation")
            axis = channel_axis(data_format, x.ndim)
            r = 1.0 / np.sqrt(np.asarray(reserve_space_2, dtype=np.float64) + epsilon)
            pre = _per_channel(np.asarray(scale, dtype=np.float64) * r, x.ndim, axis) * (
                x - _per_channel(reserve_space_1, x.ndim, axis)
            ) + _per_channel(offset, x.ndim, axis)
            if side_input is not None:
                pre = pre + np.asarray(side_input, dtype=np.float64)
            dy = dy * activation_grad(pre, activation, alpha)
        g = _grad(dy, x, scale, reserve_space_1, reserve_space_2, epsilon, data_format,
                  is_training)
        if side_input is None:
            return g
        return BatchNormGradSide(*g, dy)


def _grad(dy, x, scale, reserve_space_1, reserve_space_2, epsilon, data_format, is_training):
    if dy.shape != x.shape:
        raise ValueError(
            f"y_backprop must have the shape of x {x.shape}, got {dy.shape}"
        )
    axis = channel_axis(data_format, x.ndim)
    axes = reduce_axes(data_format, x.ndim)
    n = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    gamma = np.asarray(scale, dtype=np.float64)
    mu = np.asarray(reserve_space_1, dtype=np.float64)
    var = np.asarray(reserve_space_2, dtype=np.float64)

    def bc(v):
        return _per_channel(v, x.ndim, axis)

    r = 1.0 / np.sqrt(var + epsilon)
    x_hat = (x - bc(mu)) * bc(r)
    offset_backprop = np.sum(dy, axis=axes)
    scale_backprop = np.sum(dy * x_hat, axis=axes)
    if is_training and n > 0:
        x_backprop = bc(gamma * r / n) * (
            n * dy - bc(offset_backprop) - x_hat * bc(scale_backprop)
        )
    else:
        x_backprop = bc(gamma * r) * dy
    return BatchNormGrad(x_backprop, scale_backprop, offset_backprop)


def fused_batch_norm_grad_grad(
    y_backprop,
    x,
    scale,
    reserve_space_1,
    reserve_space_2,
    grad_x_backprop,
    grad_scale_backprop=None,
    grad_offset_backprop=None,
    *,
    epsilon=1e-4,
    data_format="NHWC",
    is_training=True,
):
    """Second-order batch normalization gradient, evaluated in float64.

    With ``(dx, dscale, doffset) = fused_batch_norm_grad(y_backprop, x, ...)``
    this returns the derivatives of ``L = sum(ggx * dx) + sum(ggscale *
    dscale) + sum(ggoffset * doffset)`` with respect to ``y_backprop``, ``x``
    and ``scale``, by the closed forms of docs/spec.md: five per-channel
    means in training, where the reserve spaces are the batch statistics of ``x`` and
    are differentiated through, and constants in inference.

    Parameters
    ----------
    y_backprop, x, scale, reserve_space_1, reserve_space_2 : array_like
        The inputs of the gradient call, see :func:`fused_batch_norm_grad`.
    grad_x_backprop : array_like or None
        Upstream gradient ``ggx`` of ``x_backprop``, same shape as ``x``;
        ``None`` means zeros.
    grad_scale_backprop, grad_offset_backprop : array_like, optional
        Upstream gradients ``ggscale`` and ``ggoffset`` of the per-channel
        outputs, length C; ``None`` means zeros.
    epsilon, data_format, is_training : optional
        As for :func:`fused_batch_norm_grad`.

    Returns
    -------
    BatchNormGradGrad
        ``(y_backprop_backprop, x_backprop, scale_backprop)``, all float64.
        An empty batch gives empty tensors and ``scale_backprop = 0``.
    """
    dy = np.asarray(y_backprop, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    ggx = np.zeros(x.shape) if grad_x_backprop is None else np.asarray(
        grad_x_backprop, dtype=np.float64)
    axis = channel_axis(data_format, x.ndim)
    for name, a in (("y_backprop", dy), ("grad_x_backprop", ggx)):
        if a.shape != x.shape:
            raise ValueError(f"{name} must have the shape of x {x.shape}, got {a.shape}")
    c = x.shape[axis]
    gamma, mu, var, ggs, ggo = (
        _channel_vector(name, v, c)
        for name, v in (
            ("scale", scale),
            ("reserve_space_1", reserve_space_1),
            ("reserve_space_2", reserve_space_2),
            ("grad_scale_backprop", grad_scale_backprop),
            ("grad_offset_backprop", grad_offset_backprop),
        )
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        return _grad_grad(dy, x, gamma, mu, var, ggx, ggs, ggo, epsilon, data_format,
                          is_training)


def _channel_vector(name, v, c):
    """``v`` as a float64 vector of length ``c`` (zeros for None), or a ValueError."""
    if v is None:
        return np.zeros(c)
    v = np.asarray(v, dtype=np.float64)
    if v.shape != (c,):
        raise ValueError(f"{name} must have shape ({c},), one value per channel, got {v.shape}")
    return v


def _grad_grad(dy, x, gamma, mu, var, ggx, ggs, ggo, epsilon, data_format, is_training):
    axis = channel_axis(data_format, x.ndim)
    axes = reduce_axes(data_format, x.ndim)
    n = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))

    def bc(v):
        return _per_channel(v, x.ndim, axis)

    if n == 0:
        # every sum is over no elements; the statistics of an empty training
        # batch are NaN and would otherwise turn 0 into NaN
        return BatchNormGradGrad(np.zeros(x.shape), np.zeros(x.shape), np.zeros(gamma.shape))
    r = 1.0 / np.sqrt(var + epsilon)
    x_hat = (x - bc(mu)) * bc(r)
    if not is_training:
        return BatchNormGradGrad(
            bc(gamma * r) * ggx + bc(ggs) * x_hat + bc(ggo),
            bc(ggs * r) * dy,
            r * np.sum(ggx * dy, axis=axes),
        )

    def avg(a):
        return bc(np.mean(a, axis=axes))

    g_mean = avg(dy)  # A
    g_xhat = avg(dy * x_hat)  # B
    ggx_mean = avg(ggx)  # A-bar
    ggx_xhat = avg(ggx * x_hat)  # C
    ggx_g = avg(ggx * dy)  # D
    g_r, ggs_r = bc(gamma * r), bc(ggs * r)
    y_backprop_backprop = g_r * (ggx - ggx_mean - x_hat * ggx_xhat) + bc(ggs) * x_hat + bc(ggo)
    scale_backprop = (n * r) * (ggx_g - ggx_mean * g_mean - ggx_xhat * g_xhat).reshape(-1)
    x_backprop = g_r * bc(r) * (
        x_hat * (ggx_mean * g_mean + 3.0 * g_xhat * ggx_xhat - ggx_g)
        - ggx_xhat * (dy - g_mean)
        - g_xhat * (ggx - ggx_mean)
    ) + ggs_r * (dy - g_mean - x_hat * g_xhat)
    return BatchNormGradGrad(y_backprop_backprop, x_backprop, scale_backprop)
