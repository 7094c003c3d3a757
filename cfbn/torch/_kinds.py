"""Which batch norm classes convert replaces, and by what.

Only classes whose forward cfbn knows exactly: torch's own batch norms, a
subclass of one that adds nothing but ``__init__`` (its methods are the
base's), timm's ``BatchNormAct2d`` (looked up only when timm is already
imported), and cfbn's.  Anything else, even an ``nn.BatchNorm2d`` subclass,
may compute something else in its own forward and is left alone.
"""
import sys

import torch.nn as nn

from .modules import BatchNorm1d, BatchNorm2d, BatchNorm3d
from .normact import BatchNormAct2d, SyncBatchNormAct
from .sync import SyncBatchNorm

_LOCAL = {nn.BatchNorm1d: BatchNorm1d, nn.BatchNorm2d: BatchNorm2d,
          nn.BatchNorm3d: BatchNorm3d, nn.SyncBatchNorm: SyncBatchNorm}
OURS = (BatchNorm1d, BatchNorm2d, BatchNorm3d, SyncBatchNorm, BatchNormAct2d,
        SyncBatchNormAct)
NORM_ACT = (BatchNormAct2d, SyncBatchNormAct)
SYNC = (SyncBatchNorm, SyncBatchNormAct)


def _timm_norm_act():
    home = sys.modules.get("timm.layers.norm_act")
    return getattr(home, "BatchNormAct2d", None)


def _torch_base(kind):
    """The torch batch norm class `kind` is, or adds only ``__init__`` to."""
    for base in kind.__mro__:
        if base in _LOCAL:
            return base
        if any(callable(v) or isinstance(v, (property, classmethod, staticmethod))
               for name, v in vars(base).items() if name != "__init__"):
            return None
    return None


def target(module, sync):
    """The cfbn class that replaces `module` (None: keep it).

    Parameters
    ----------
    module : torch.nn.Module
    sync : bool
        Whether every batch norm becomes synchronized.

    Returns
    -------
    type or None
    """
    kind = type(module)
    if "forward" in vars(module):
        return None  # an instance with a forward of its own
    if kind in NORM_ACT or kind is _timm_norm_act():
        want = SyncBatchNormAct if sync else BatchNormAct2d
        return None if kind in (want, SyncBatchNormAct) else want
    if kind in OURS:
        return SyncBatchNorm if sync and kind is not SyncBatchNorm else None
    base = _torch_base(kind)
    if base is None:
        return None
    return SyncBatchNorm if sync else _LOCAL[base]


def refused(module):
    """Why a batch norm `module` is left alone (None: it is not, or it is
    not a batch norm at all, or a lazy one still without its size)."""
    if not isinstance(module, nn.modules.batchnorm._BatchNorm) or \
            target(module, False) is not None or isinstance(module, OURS):
        return None
    if isinstance(module, nn.modules.lazy.LazyModuleMixin):
        return None
    if "forward" in vars(module):
        return "it has a forward of its own"
    if nn.utils.parametrize.is_parametrized(module):
        return "it is parametrized (torch.nn.utils.parametrize)"
    return "its class %s defines methods of its own" % type(module).__qualname__
