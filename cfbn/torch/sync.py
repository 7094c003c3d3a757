"""SyncBatchNorm: batch normalization synchronized over torch.distributed.

Each rank normalizes its shard of the batch with the whole batch's
statistics, as ``torch.nn.SyncBatchNorm`` does, computed by cfbn's split
kernels (cfbn._split): every rank reduces its shard to per-channel
``(count, mean, m2)``, the rows are all-gathered and merged in rank order, so
every rank holds the same statistics bit for bit.  CPU tensors, any backend
that all-gathers float64 tensors (gloo).
"""
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from .. import _kernels
from .._split import (_merge, batch_norm_apply, batch_norm_grad_apply,
                      batch_norm_grad_statistics, batch_norm_statistics)
from . import _bridge, functional

_F64 = np.dtype(np.float64)
_HALF = (torch.float16, torch.bfloat16)


def _rows(x):
    """x as a contiguous (N, C, L, 1) tensor, read by the kernels as NCHW."""
    inner = 1
    for d in x.shape[2:]:
        inner *= d
    return x.detach().contiguous().reshape(x.shape[0], x.shape[1], inner, 1)


def _param(p, x, channels, value):
    """A per-channel parameter in the dtype the kernels take for x's dtype."""
    dtype = torch.float32 if x.dtype in _HALF else x.dtype
    if p is None:
        return np.full(channels, value, dtype=np.float64).astype(
            np.float32 if dtype is torch.float32 else _F64)
    return _bridge.array(p.detach().to(dtype).contiguous())


def _gather(local, group):
    """The rows of every rank of `group`, in rank order, as one (world, k) array."""
    world = dist.get_world_size(group)
    t = torch.from_numpy(local)
    rows = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(rows, t, group=group)
    return torch.stack(rows).numpy()


def _like_input(y, x):
    y = y.reshape(x.shape)
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return y.contiguous(memory_format=torch.channels_last)
    if x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d):
        return y.contiguous(memory_format=torch.channels_last_3d)
    return y


class _SyncFunction(torch.autograd.Function):
    """Forward and backward of the synchronized batch norm; collectives in both."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, factor, eps, group):
        channels = x.shape[1]
        xr = _rows(x)
        xa = _bridge.array(xr)
        s = batch_norm_statistics(xa, data_format="NCHW")
        local = np.empty(2 * channels + 1, _F64)
        local[0] = s.count
        local[1:channels + 1] = s.mean
        local[channels + 1:] = s.m2
        # All-gather then merge in rank order rather than all-reduce sums:
        # (count, mean, m2) merges without cancellation, and a fixed order
        # gives the same bits on every rank (a reduction's order is not
        # promised).  Fixed-size rows carry the count, so shards may differ
        # in size, and an empty shard (count 0, NaN moments) is the identity.
        n, mu, m2 = 0, np.zeros(channels), np.zeros(channels)
        for row in _gather(local, group):
            n, mu, m2 = _merge(n, mu, m2, int(row[0]), row[1:channels + 1],
                               row[channels + 1:])
        if n < 2:
            raise ValueError("Expected more than 1 value per channel when training, got "
                             "input size %s (summed over the process group: %d)"
                             % (list(x.shape), n))
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
        scale = _param(weight, x, channels, 1.0)
        offset = _param(bias, x, channels, 0.0)
        y = torch.empty_like(xr)
        if xr.numel():
            batch_norm_apply(xa, mu, var, scale, offset, epsilon=eps, data_format="NCHW",
                             out=_bridge.array(y))
        ctx.save_for_backward(x, weight)
        ctx.stats = (mu, var, n, scale, eps, group)
        ctx.has_bias = bias is not None
        return _like_input(y, x)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        mu, var, n, scale, eps, group = ctx.stats
        channels = x.shape[1]
        xa = _bridge.array(_rows(x))
        dyr = _rows(grad_out.to(x.dtype))
        dya = _bridge.array(dyr)
        g = batch_norm_grad_statistics(dya, xa, mu, var, epsilon=eps, data_format="NCHW")
        local = np.concatenate([g.sum_dy, g.sum_dy_xhat])
        # Summed in rank order on every rank, so dx does not depend on a
        # reduction order; weight and bias keep this shard's sums, as
        # nn.SyncBatchNorm's do (DDP averages them afterwards).
        rows = _gather(local, group)
        total = rows[0].copy()
        for row in rows[1:]:
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
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = torch.from_numpy(g.sum_dy).to(weight.dtype if weight is not None
                                                   else x.dtype)
        return grad_x, grad_w, grad_b, None, None, None, None, None


class SyncBatchNorm(nn.SyncBatchNorm):
    """torch.nn.SyncBatchNorm on cfbn's kernels.

    The same constructor (``num_features, eps, momentum, affine,
    track_running_stats, process_group, device, dtype``), parameters,
    buffers and state_dict as ``nn.SyncBatchNorm`` (and so
    ``nn.BatchNorm2d``'s), for inputs (N, C, ...) of any rank >= 2.

    In training with an initialized process group of more than one rank,
    each rank's shard is normalized with the statistics of the whole batch
    (the shards concatenated in rank order; shards may differ in size,
    including empty ones), identical bit for bit on every rank.  The running
    statistics take the global mean and the variance Bessel-corrected by the
    global count.  The backward sums the per-rank gradient sums in rank
    order; ``weight.grad`` and ``bias.grad`` are this rank's shard's, as with
    ``nn.SyncBatchNorm`` (DDP averages them across ranks).  Otherwise (eval,
    one rank, no process group) it is cfbn.torch.batch_norm.
    """

    def forward(self, input):
        """Normalize this rank's shard `input` (N, C, ...) of the batch.

        Parameters
        ----------
        input : Tensor
            (N, C, ...) CPU tensor with num_features channels.

        Returns
        -------
        Tensor
            The input's shape and dtype.
        """
        self._check_input_dim(input)
        self._check_non_zero_input_channels(input)
        momentum = self.momentum
        factor = 0.0 if momentum is None else momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        if self.training:
            bn_training = True
        else:
            bn_training = self.running_mean is None and self.running_var is None
        running_mean = self.running_mean if not self.training or self.track_running_stats \
            else None
        running_var = self.running_var if not self.training or self.track_running_stats \
            else None
        need_sync = bn_training and self.training and dist.is_available() \
            and dist.is_initialized()
        if need_sync:
            group = self.process_group or dist.group.WORLD
            need_sync = dist.get_world_size(group) > 1
        if not need_sync:
            # cfbn.torch.batch_norm takes up to 5-D; more spatial axes are
            # the same normalization of the flattened view
            x = input if input.dim() <= 5 else input.flatten(2)
            y = functional.batch_norm(x, running_mean, running_var, self.weight, self.bias,
                                      bn_training, factor, self.eps)
            return y if x is input else y.reshape(input.shape)
        # cfbn.torch's rules (CPU, a dtype cfbn computes); ranks above 5 are
        # checked through a view with the spatial axes flattened, which the
        # kernels read the same way.
        _bridge.check_input(input if input.dim() <= 5 else input.flatten(2))
        return _SyncFunction.apply(input, self.weight, self.bias, running_mean, running_var,
                                   factor, self.eps, group)
