"""The autograd function of SyncBatchNorm: cfbn's split kernels and the
all-gathers between them.

Every rank reduces its shard to per-channel ``(count, mean, m2)``, the rows
are all-gathered and merged in rank order, so every rank holds the same
statistics bit for bit; the backward does the same with the gradient sums.
The residual add and the activation follow the kernels' normalization as
torch operations (the split kernels take neither).  With no group (one
process) the same steps run without the gathers.
"""
import weakref

import numpy as np
import torch

from .. import _kernels
from .._split import (_merge, batch_norm_apply, batch_norm_grad_apply,
                      batch_norm_grad_statistics, batch_norm_statistics)
from . import _activation, _bridge, _sync_check
from ._sync_check import BACKWARD, PREFIX, gather

_F64 = np.dtype(np.float64)


def _rows(x):
    """x as a contiguous (N, C, L, 1) tensor, read by the kernels as NCHW."""
    inner = 1
    for d in x.shape[2:]:
        inner *= d
    return x.detach().contiguous().reshape(x.shape[0], x.shape[1], inner, 1)


def _param(p, x, channels, value):
    """A per-channel parameter in the dtype the kernels take for x's dtype."""
    dtype = _bridge.VECTOR_DTYPES[x.dtype]
    if p is None:
        return np.full(channels, value, dtype=np.float64).astype(
            np.float32 if dtype is torch.float32 else _F64)
    return _bridge.array(p.detach().to(dtype).contiguous())


def _like_input(y, x):
    y = y.reshape(x.shape)
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return y.contiguous(memory_format=torch.channels_last)
    if x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d):
        return y.contiguous(memory_format=torch.channels_last_3d)
    return y


def _merged_statistics(x, xa, group, sync):
    """The whole batch's (count, mean, biased-variance numerator m2)."""
    channels = x.shape[1]
    try:
        s = batch_norm_statistics(xa, data_format="NCHW")
    except BaseException:
        if sync is not None and sync[2] is not None:
            # a gather is never left in flight, whatever the pass raised
            sync[2].wait()
        raise
    local = np.empty(PREFIX + 1 + 2 * channels, _F64)
    if group is not None:
        row_prefix, names, pending = sync
        if pending is not None:
            # Only now, with this rank's pass done: the prefixes' gather has
            # been in flight during it.  Raises on every rank alike.
            pending.finish()
        local[:PREFIX] = row_prefix
    local[PREFIX] = s.count
    local[PREFIX + 1:PREFIX + 1 + channels] = s.mean
    local[PREFIX + 1 + channels:] = s.m2
    rows = gather(local, group)
    if group is not None:
        _sync_check.check(rows, names)
    # All-gather then merge in rank order rather than all-reduce sums:
    # (count, mean, m2) merges without cancellation, and a fixed order
    # gives the same bits on every rank (a reduction's order is not
    # promised).  Fixed-size rows carry the count, so shards may differ
    # in size, and an empty shard (count 0, NaN moments) is the identity.
    n, mu, m2 = 0, np.zeros(channels), np.zeros(channels)
    for row in rows[:, PREFIX:]:
        n, mu, m2 = _merge(n, mu, m2, int(row[0]), row[1:channels + 1], row[channels + 1:])
    if n < 2:
        raise ValueError("Expected more than 1 value per channel when training, got "
                         "input size %s (summed over the process group: %d)"
                         % (list(x.shape), n))
    return n, mu, m2


def _update_running(n, mu, m2, running_mean, running_var, factor):
    """The biased variance; the running statistics updated in place."""
    channels = mu.shape[0]
    var, bm, bv = (np.empty(channels, _F64) for _ in range(3))
    running = running_mean is not None and factor != 1.0
    # The fused kernel's own per-channel step (biased variance, Bessel
    # correction with the global count, running averages).
    _kernels.train_statistics(
        n, mu, m2, factor if running else 1.0,
        running_mean.detach().double().numpy() if running else None,
        running_var.detach().double().numpy() if running else None, var, bm, bv)
    if running_mean is not None:
        with torch.no_grad():
            running_mean.copy_(torch.from_numpy(bm))
            running_var.copy_(torch.from_numpy(bv))
    return var


class SyncFunction(torch.autograd.Function):
    """Forward and backward of the synchronized batch norm; collectives in both.

    ``apply(x, weight, bias, side_input, running_mean, running_var, factor,
    eps, activation, alpha, group, sync)``: with a group, `sync` is this
    rank's (row prefix, per-channel tensor names, pending prefix gather or
    None) from cfbn.torch._sync_check; without one, None.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, side_input, running_mean, running_var, factor, eps,
                activation, alpha, group, sync):
        channels = x.shape[1]
        xr = _rows(x)
        xa = _bridge.array(xr)
        n, mu, m2 = _merged_statistics(x, xa, group, sync)
        var = _update_running(n, mu, m2, running_mean, running_var, factor)
        scale = _param(weight, x, channels, 1.0)
        offset = _param(bias, x, channels, 0.0)
        y = torch.empty_like(xr)
        if xr.numel():
            batch_norm_apply(xa, mu, var, scale, offset, epsilon=eps, data_format="NCHW",
                             out=_bridge.array(y))
        if side_input is not None:
            y += _rows(side_input)
        _activation.activate_(y, activation, alpha)
        ctx.save_for_backward(x, weight, bias, side_input)
        # The group weakly: a graph kept past destroy_process_group (an
        # output held to the end) must not keep the group to interpreter
        # exit, where gloo's destructors abort the process.
        ctx.stats = (mu, var, n, scale, eps, None if group is None else weakref.ref(group))
        ctx.activation = (activation, alpha)
        return _like_input(y, x)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        x, weight, bias, side_input = ctx.saved_tensors
        mu, var, n, scale, eps, group = ctx.stats
        if group is not None:
            group = group()
            if group is None:
                raise RuntimeError("SyncBatchNorm: the process group of this forward was "
                                   "destroyed before its backward")
        channels = x.shape[1]
        dz = _pre_activation_grad(ctx, grad_out, x, weight, bias, side_input)
        xa = _bridge.array(_rows(x))
        dyr = _rows(dz)
        dya = _bridge.array(dyr)
        g = batch_norm_grad_statistics(dya, xa, mu, var, epsilon=eps, data_format="NCHW")
        # The forward's row size, tagged as a backward's (cfbn.torch._sync_check)
        local = np.empty(PREFIX + 1 + 2 * channels, _F64)
        local[:PREFIX] = _sync_check.prefix(x, channels, False, BACKWARD)
        local[PREFIX] = n
        local[PREFIX + 1:PREFIX + 1 + channels] = g.sum_dy
        local[PREFIX + 1 + channels:] = g.sum_dy_xhat
        # Summed in rank order on every rank, so dx does not depend on a
        # reduction order; weight and bias keep this shard's sums, as
        # nn.SyncBatchNorm's do (DDP averages them afterwards).
        rows = gather(local, group)
        _sync_check.check_kinds(rows[:, 0].astype(int).tolist())
        total = rows[0, PREFIX + 1:].copy()
        for row in rows[1:, PREFIX + 1:]:
            total += row
        grad_x = None
        if ctx.needs_input_grad[0]:
            dx = torch.empty_like(dyr)
            if dyr.numel():
                batch_norm_grad_apply(dya, xa, scale, mu, var, total[:channels],
                                      total[channels:], n, epsilon=eps, data_format="NCHW",
                                      out=_bridge.array(dx))
            grad_x = _like_input(dx, x)
        grad_w = grad_b = None
        if weight is not None and ctx.needs_input_grad[1]:
            grad_w = torch.from_numpy(g.sum_dy_xhat).to(weight.dtype)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_b = torch.from_numpy(g.sum_dy).to(bias.dtype)
        # the side input enters the pre-activation with weight one
        grad_side = dz if side_input is not None and ctx.needs_input_grad[3] else None
        return (grad_x, grad_w, grad_b, grad_side) + (None,) * 8


def _pre_activation_grad(ctx, grad_out, x, weight, bias, side_input):
    """The gradient with respect to the pre-activation, in x's dtype."""
    activation, alpha = ctx.activation
    grad_out = grad_out.to(x.dtype)
    if activation is None:
        return grad_out
    mu, var, _, _, eps, _ = ctx.stats
    # Recomputed rather than saved: one tensor of memory less between the
    # passes, and the same vector-dtype arithmetic the fused path uses.
    vdt = _bridge.VECTOR_DTYPES[x.dtype]
    z = _bridge._pre_activation(x.detach(), weight, bias, torch.from_numpy(mu).to(vdt),
                                torch.from_numpy(var).to(vdt), eps, side_input)
    d1, _ = _activation.derivatives(z, activation, alpha)
    return (grad_out * d1).to(x.dtype)
