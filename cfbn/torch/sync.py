"""SyncBatchNorm: batch normalization synchronized over torch.distributed.

Each rank normalizes its shard of the batch with the whole batch's
statistics, as ``torch.nn.SyncBatchNorm`` does, computed by cfbn's split
kernels (cfbn.torch._sync_function), the ranks first agreeing on channels
and dtype (cfbn.torch._sync_check).  CPU tensors, any backend that
all-gathers float64 and int64 tensors (gloo).

It subclasses ``nn.modules.batchnorm._BatchNorm``, not ``nn.SyncBatchNorm``:
DistributedDataParallel refuses a CPU model holding an ``nn.SyncBatchNorm``
(that class's forward is CUDA's), and CPU data-parallel training is what
this one is for.
"""
import torch
import torch.distributed as dist
import torch.nn as nn

from . import _bridge, _sync_check
from ._sync_function import SyncFunction
from .modules import _Fused


def _flat(t):
    # cfbn.torch.batch_norm takes up to 5-D; more spatial axes are the same
    # normalization of the flattened view, which the kernels read the same way
    return t if t is None or t.dim() <= 5 else t.flatten(2)


def _check_side_input(side_input, input):
    if not isinstance(side_input, torch.Tensor):
        raise TypeError("side_input: expected a torch.Tensor, got %s"
                        % type(side_input).__name__)
    if side_input.shape != input.shape:
        raise ValueError("side_input: expected the input's shape %s, got %s"
                         % (list(input.shape), list(side_input.shape)))
    if side_input.dtype != input.dtype:
        raise TypeError("side_input: expected the input's dtype %s, got %s"
                        % (input.dtype, side_input.dtype))
    _bridge.check_input(_flat(side_input), "side_input")


class SyncBatchNorm(_Fused, nn.modules.batchnorm._BatchNorm):
    """torch.nn.SyncBatchNorm on cfbn's kernels, with ``activation=`` and
    ``forward(input, side_input=None)``.

    ``nn.SyncBatchNorm``'s constructor (``num_features, eps, momentum,
    affine, track_running_stats, process_group, device, dtype``),
    parameters, buffers and state_dict (loadable both ways), for inputs
    (N, C, ...) of any rank >= 2; plus ``activation=`` and ``alpha=`` (as
    cfbn.torch.BatchNorm2d's) applied after the normalization and the
    residual `side_input`.  Accepted by DistributedDataParallel on the CPU.

    In training with an initialized process group of more than one rank,
    each rank's shard is normalized with the statistics of the whole batch
    (the shards concatenated in rank order; shards may differ in size,
    including empty ones), identical bit for bit on every rank.  The running
    statistics take the global mean and the variance Bessel-corrected by the
    global count.  The backward sums the per-rank gradient sums in rank
    order; ``weight.grad`` and ``bias.grad`` are this rank's shard's, as with
    ``nn.SyncBatchNorm`` (DDP averages them across ranks).  Ranks whose
    inputs disagree in channel count or dtype, or whose module's
    num_features differ, all raise the same ValueError or TypeError; a rank
    whose own input is refused raises its error and the others a
    RuntimeError, rather than one waiting on the others.  Otherwise (eval,
    one rank, no process group) it is cfbn.torch.batch_norm, except that a
    momentum outside [0, 1], which nn.BatchNorm takes, is averaged with by
    the split kernels.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_group=None, device=None, dtype=None, *,
                 activation=None, alpha=None, **kwargs):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device,
                         dtype, activation=activation, alpha=alpha, **kwargs)
        self.process_group = process_group

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got %dD input)" % input.dim())

    def _check_non_zero_input_channels(self, input):
        if input.size(1) == 0:
            raise ValueError("SyncBatchNorm number of input channels should be non-zero")

    def _sized(self):
        """The names of the per-channel tensors the input must match."""
        names = [n for n in ("weight", "running_mean") if getattr(self, n) is not None]
        return " and ".join(names)

    def _check_input(self, input, side_input, group):
        """nn.SyncBatchNorm's input checks, cfbn.torch's, and the side input's."""
        self._check_input_dim(input)
        self._check_non_zero_input_channels(input)
        _bridge.check_input(_flat(input))
        if side_input is not None:
            _check_side_input(side_input, input)
        if group is None and self._sized() and input.shape[1] != self.num_features:
            # (with a group, the ranks' prefixes check it on every rank)
            raise ValueError("input: expected num_features=%d channels (the length of %s), "
                             "got input of shape %s"
                             % (self.num_features, self._sized(), list(input.shape)))

    def _group(self):
        """The process group to synchronize over, or None."""
        if not (self.training and dist.is_available() and dist.is_initialized()):
            return None
        group = self.process_group or dist.group.WORLD
        return group if dist.get_world_size(group) > 1 else None

    def _agree(self, input, side_input, group):
        """(row prefix, names, pending prefix gather or None) for the
        statistics' gather, once this rank's checks and, where known, every
        rank's allow it; else the error every rank raises."""
        names = self._sized()
        num_features = self.num_features if names else None
        error = None
        try:
            self._check_input(input, side_input, group)
        except Exception as exc:
            error = exc
        row_prefix = _sync_check.prefix(input, num_features, error is not None)
        if num_features is not None and _sync_check.agreed(self, group):
            if error is None and row_prefix[2] == num_features:
                return row_prefix, names, None
            # The peers gather rows of the agreed size; this rank sends one
            # too, so that they raise with it rather than wait or abort.
            table = _sync_check.stand_in(group, row_prefix, num_features)
            if error is None:
                _sync_check.check(table, names)
        else:
            pending = _sync_check.start(group, row_prefix, names,
                                        None if num_features is None else self)
            if error is None:
                return row_prefix, names, pending
            pending.wait()
        # Raised with this frame's reference to it dropped: the traceback
        # holds this frame, and a frame holding its own exception is a cycle
        # that only the garbage collector frees, at any later time, keeping
        # the group and the gather's buffers alive past destroy_process_group.
        try:
            raise error
        finally:
            error = pending = None

    def forward(self, input, side_input=None):
        """Normalize this rank's shard `input` (N, C, ...) of the batch.

        Parameters
        ----------
        input : Tensor
            (N, C, ...) CPU tensor with num_features channels.
        side_input : Tensor, optional
            Added after the normalization and before the activation; the
            input's shape and dtype.

        Returns
        -------
        Tensor
            The input's shape and dtype.
        """
        group = self._group()
        if group is None:
            self._check_input(input, side_input, None)
            momentum = self.momentum
            if momentum is None or 0.0 <= momentum <= 1.0 or not self.training \
                    or not self.track_running_stats:
                y = super().forward(_flat(input), _flat(side_input))
                return y.reshape(input.shape) if input.dim() > 5 else y
            # cfbn's fused kernels take a running-average weight in [0, 1];
            # nn.BatchNorm takes any momentum, which the split kernels
            # average with (one process: no gathers, no header).
            return self._split_forward(input, side_input, None, None)
        return self._split_forward(input, side_input, group,
                                   self._agree(input, side_input, group))

    def _split_forward(self, input, side_input, group, sync):
        """Training on the split kernels (over `group` when one is given)."""
        momentum = self.momentum
        factor = 0.0 if momentum is None else momentum
        running_mean = running_var = None
        if self.track_running_stats:
            running_mean, running_var = self.running_mean, self.running_var
            if self.num_batches_tracked is not None:
                self.num_batches_tracked.add_(1)
                if momentum is None:
                    factor = 1.0 / float(self.num_batches_tracked)
        return SyncFunction.apply(input, self.weight, self.bias, side_input, running_mean,
                                  running_var, factor, self.eps, self.activation, self.alpha,
                                  group, sync)

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        """Replace `module`'s batch norms with SyncBatchNorm, as
        ``nn.SyncBatchNorm.convert_sync_batchnorm`` does.

        Parameters
        ----------
        module : torch.nn.Module
            Converted in place.
        process_group : torch.distributed.ProcessGroup, optional
            The group the new modules synchronize over (None: the default
            group).

        Returns
        -------
        torch.nn.Module
            `module`, or the new module when `module` itself is a batch norm.
        """
        from .convert import convert
        return convert(module, sync=True, process_group=process_group)
