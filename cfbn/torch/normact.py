"""Batch norm, then a drop layer, then an activation module: timm's
``BatchNormAct2d`` on cfbn's kernels.

timm's ``timm.layers.BatchNormAct2d`` is an ``nn.BatchNorm2d`` subclass whose
forward runs ``act(drop(batch_norm(x)))`` with ``drop`` and ``act`` child
modules.  cfbn.torch.convert turns one into `BatchNormAct2d` (or, with
``sync=True``, `SyncBatchNormAct`) holding the same parameters, buffers and
children, so the state_dict is timm's.  With ``fuse=True``, an activation the
kernels fuse moves into ``activation=`` when ``drop`` is an ``nn.Identity``,
and ``act`` becomes an ``nn.Identity``.
"""
import torch.nn as nn

from .modules import BatchNorm2d
from .sync import SyncBatchNorm


class _DropAct:
    """The forward shared by the two classes: drop, then act, after the
    batch norm (whose own activation, if any, comes first)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.drop = nn.Identity()
        self.act = nn.Identity()

    def forward(self, input):
        """``act(drop(batch_norm(input)))``.

        Parameters
        ----------
        input : Tensor
            As for the batch norm class.

        Returns
        -------
        Tensor
        """
        return self.act(self.drop(super().forward(input)))


class BatchNormAct2d(_DropAct, BatchNorm2d):
    """cfbn.torch.BatchNorm2d followed by the child modules ``drop`` and
    ``act`` (both ``nn.Identity`` until set), as timm's BatchNormAct2d."""


class SyncBatchNormAct(_DropAct, SyncBatchNorm):
    """cfbn.torch.SyncBatchNorm followed by the child modules ``drop`` and
    ``act`` (both ``nn.Identity`` until set), as timm's SyncBatchNormAct."""
