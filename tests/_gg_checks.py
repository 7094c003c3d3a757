"""Shared pieces of the second-order gradient tests: PyTorch's double
backward as an independent answer, and error bounds for cfbn's results."""

import numpy as np
import pytest

from cfbn import reference

from _checks import assert_close, per_channel_view, unit, vector_dtype

GG_FIELDS = ("y_backprop_backprop", "x_backprop", "scale_backprop")


def torch_grad_grad(args, data_format, is_training, epsilon):
    """The derivatives by autograd through ``aten.native_batch_norm``, in float64.

    ``args`` = (dy, x, scale, mean, variance, ggx, ggscale, ggoffset), NumPy
    arrays in ``data_format``, an upstream gradient None where not given."""
    torch = pytest.importorskip("torch")
    dy, x, scale, mean, variance, ggx, ggs, ggo = args
    axis = reference.channel_axis(data_format, x.ndim)

    def tensor(a, grad=False):
        a = np.asarray(a, np.float64)
        a = np.ascontiguousarray(np.moveaxis(a, axis, 1) if a.ndim > 1 else a)
        return torch.tensor(a, dtype=torch.float64, requires_grad=grad)

    dy_t, x_t, scale_t = tensor(dy, True), tensor(x, True), tensor(scale, True)
    offset_t = torch.zeros_like(scale_t, requires_grad=True)
    stats = (None, None) if is_training else (tensor(mean), tensor(variance))
    y = torch.ops.aten.native_batch_norm(x_t, scale_t, offset_t, *stats, is_training, 0.0,
                                         epsilon)[0]
    first = torch.autograd.grad(y, (x_t, scale_t, offset_t), dy_t, create_graph=True)
    loss = sum((tensor(w) * d).sum() for w, d in zip((ggx, ggs, ggo), first) if w is not None)
    wrt = (dy_t, x_t, scale_t)
    second = torch.autograd.grad(loss, wrt, allow_unused=True, materialize_grads=True)
    return [np.moveaxis(s.detach().numpy(), 1, axis) if s.ndim > 1 else s.detach().numpy()
            for s in second]


def grad_grad_bounds(args, *, epsilon, data_format, is_training):
    """First-order rounding-error bounds of each output: a unit of the
    compute type times the size of every term of SPEC.md's formulas (sums
    of absolute values, x-hat as rounding sees it: r * (|x| + |mean| +
    |x - mean|))."""
    dy, x, scale, mu, var, ggx, ggs, ggo = args
    u = unit(x.dtype)
    xd = np.asarray(x, np.float64)
    axes = reference.reduce_axes(data_format, xd.ndim)
    n = int(np.prod([xd.shape[a] for a in axes]))

    def bc(v):
        return per_channel_view(v, data_format, xd.ndim)

    c = xd.shape[reference.channel_axis(data_format, xd.ndim)]

    def vec(v):
        return np.zeros(c) if v is None else np.abs(np.asarray(v, np.float64))

    g = np.abs(np.asarray(dy, np.float64))
    q = np.zeros_like(xd) if ggx is None else np.abs(np.asarray(ggx, np.float64))
    r = 1.0 / np.sqrt(np.asarray(var, np.float64) + epsilon)
    a = bc(r) * (np.abs(xd) + np.abs(bc(mu)) + np.abs(xd - bc(np.asarray(mu, np.float64))))
    gam, gs, go = bc(vec(scale)), bc(vec(ggs)), bc(vec(ggo))
    R = bc(r)
    s_qg = np.sum(q * g, axis=axes)
    if is_training and n > 0:
        def mean(t):
            return bc(np.sum(t, axis=axes) / n)
        mg, mgd, mq, mqd, mqg = mean(g), mean(g * a), mean(q), mean(q * a), mean(q * g)
        ddy = gam * R * (q + mq + a * mqd) + gs * a + go
        dx = (gam * R * R * (a * (mq * mg + 3 * mgd * mqd + mqg) + mqd * (g + mg)
                             + mgd * (q + mq))
              + gs * R * (g + mg + a * mgd))
        dscale = r * (s_qg + np.sum(q, axis=axes) * mg.reshape(-1)
                      + np.sum(q * a, axis=axes) * mgd.reshape(-1))
    else:
        ddy = gam * R * q + gs * a + go
        dx = gs * R * g
        dscale = r * s_qg
    # an empty batch's statistics are NaN, and its outputs exact
    return {name: 8 * u * np.nan_to_num(size, nan=0.0) for name, size in
            zip(GG_FIELDS, (ddy, dx, dscale))}


def check_grad_grad(got, args, *, epsilon, data_format, is_training):
    """Compare a cfbn result with the float64 reference; return the reference."""
    ref = reference.fused_batch_norm_grad_grad(*args, epsilon=epsilon, data_format=data_format,
                                               is_training=is_training)
    bounds = grad_grad_bounds(args, epsilon=epsilon, data_format=data_format,
                              is_training=is_training)
    x = args[1]
    for name, dt in zip(GG_FIELDS, (x.dtype, x.dtype, vector_dtype(x.dtype))):
        assert_close(name, getattr(got, name), getattr(ref, name), bounds[name], dt)
    return ref
