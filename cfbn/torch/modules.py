"""BatchNorm1d, BatchNorm2d and BatchNorm3d on cfbn's kernels.

Each is a subclass of its torch.nn namesake: the same constructor,
parameters, buffers, state_dict (loadable both ways), train()/eval() and
input checks, with the forward computed by cfbn.torch.batch_norm (or, for an eager call
below the measured crossover, by PyTorch's own batch norm: cfbn.torch._paths).  Two
additions: ``activation=`` (with ``alpha=``) fuses an activation, and
``forward(input, side_input=None)`` a residual add before it.
"""
import torch
import torch.nn as nn

from . import _bridge, _paths, functional


class _Fused:
    """The forward and the added arguments, shared by the three classes."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None, *, activation=None,
                 alpha=None, **kwargs):
        # Checked now rather than at the first forward: a typo in a model
        # definition should fail where it is written.
        _bridge.check_activation(activation, alpha)
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device,
                         dtype, **kwargs)
        self.activation = activation
        self.alpha = alpha

    def forward(self, input, side_input=None):
        """Normalize `input` (add `side_input`, apply the activation).

        Parameters
        ----------
        input : Tensor
            As for the torch.nn module: (N, C, ...) with num_features
            channels, on the CPU, contiguous or channels-last.
        side_input : Tensor, optional
            Added after the normalization and before the activation; the
            input's shape and dtype.

        Returns
        -------
        Tensor
            The input's shape, dtype and memory format.
        """
        self._check_input_dim(input)
        # A module with neither weight nor running statistics has nothing of
        # num_features' length, and nn computes any channel count with it.
        if input.shape[1] != self.num_features and (
                self.weight is not None or self.running_mean is not None) and \
                not torch.jit.is_tracing():
            raise ValueError("num_features: %s(%d) expects %d channels, got input of shape %s"
                             % (type(self).__name__, self.num_features, self.num_features,
                                tuple(input.shape)))
        # nn.BatchNorm's own bookkeeping, step for step, with each buffer
        # looked up once (a Module attribute lookup is a dict search).
        training = self.training
        momentum = self.momentum
        factor = 0.0 if momentum is None else momentum
        count = None
        running_mean, running_var = self.running_mean, self.running_var
        if training and self.track_running_stats:
            num_batches_tracked = self.num_batches_tracked
            if num_batches_tracked is not None:
                num_batches_tracked.add_(1)
                if momentum is None:
                    # the operator reads the count, which keeps this a tensor
                    # under torch.compile rather than a float() of one
                    factor, count = None, num_batches_tracked
        if training:
            bn_training = True
            if not self.track_running_stats:
                running_mean = running_var = None
        else:
            bn_training = running_mean is None and running_var is None
        if _paths.native(input):
            if count is not None:
                factor = 1.0 / float(count)   # nn's cumulative average, as nn computes it
            return _paths.batch_norm(input, running_mean, running_var, self.weight, self.bias,
                                     bn_training, factor, self.eps, self.activation, self.alpha,
                                     side_input)
        return functional.batch_norm(
            input, running_mean, running_var, self.weight, self.bias, bn_training, factor,
            self.eps, activation=self.activation, alpha=self.alpha, side_input=side_input,
            num_batches_tracked=count)

    def extra_repr(self):
        s = super().extra_repr()
        if self.activation is not None:
            s += ", activation=%r" % self.activation
            if self.alpha is not None:
                s += ", alpha=%r" % self.alpha
        return s


class BatchNorm1d(_Fused, nn.BatchNorm1d):
    """torch.nn.BatchNorm1d on cfbn's kernels, with ``activation=`` and
    ``forward(input, side_input=None)``.  Input (N, C) or (N, C, L);
    (N, C, L) may be contiguous or an (N, L, C) tensor transposed."""


class BatchNorm2d(_Fused, nn.BatchNorm2d):
    """torch.nn.BatchNorm2d on cfbn's kernels, with ``activation=`` and
    ``forward(input, side_input=None)``.  Input (N, C, H, W), contiguous or
    ``torch.channels_last``."""


class BatchNorm3d(_Fused, nn.BatchNorm3d):
    """torch.nn.BatchNorm3d on cfbn's kernels, with ``activation=`` and
    ``forward(input, side_input=None)``.  Input (N, C, D, H, W), contiguous
    or ``torch.channels_last_3d``."""
