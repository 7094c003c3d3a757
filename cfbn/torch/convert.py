"""convert: swap a model's torch.nn batch norms for cfbn.torch's, in place."""
import torch
import torch.nn as nn

from . import fuse as _fx
from .modules import BatchNorm1d, BatchNorm2d, BatchNorm3d
from .sync import SyncBatchNorm

# Most specific first: cfbn's classes subclass their torch namesakes.
_KINDS = ((nn.SyncBatchNorm, SyncBatchNorm), (nn.BatchNorm3d, BatchNorm3d),
          (nn.BatchNorm2d, BatchNorm2d), (nn.BatchNorm1d, BatchNorm1d))
_OURS = (BatchNorm1d, BatchNorm2d, BatchNorm3d, SyncBatchNorm)
_FUSABLE = (BatchNorm1d, BatchNorm2d, BatchNorm3d)


def _target(module, sync):
    if sync:
        return SyncBatchNorm
    for theirs, ours in _KINDS:
        if isinstance(module, theirs):
            return ours
    return None


def _swap(old, cls, process_group, activation=None):
    """A cfbn module of class `cls` holding `old`'s parameters and buffers."""
    ref = old.weight if old.weight is not None else old.running_mean
    kwargs = {}
    if ref is not None:
        kwargs = dict(device=ref.device, dtype=ref.dtype)
    if cls is SyncBatchNorm:
        if activation is not None:
            raise AssertionError("SyncBatchNorm takes no activation")
        new = cls(old.num_features, old.eps, old.momentum, old.affine,
                  old.track_running_stats, process_group, **kwargs)
    else:
        new = cls(old.num_features, old.eps, old.momentum, old.affine,
                  old.track_running_stats, activation=activation, **kwargs)
    # The same Parameter and buffer objects, not copies: an optimizer built
    # before the conversion keeps updating the model's parameters.
    with torch.no_grad():
        if old.affine:
            new.weight = old.weight
            new.bias = old.bias
        new.running_mean = old.running_mean
        new.running_var = old.running_var
        if hasattr(old, "num_batches_tracked"):
            new.num_batches_tracked = old.num_batches_tracked
    if hasattr(old, "qconfig"):
        new.qconfig = old.qconfig
    new.train(old.training)
    return new


def _wanted(module, sync):
    """Whether `module` is a batch norm that convert replaces."""
    if not isinstance(module, nn.modules.batchnorm._BatchNorm) or \
            isinstance(module, SyncBatchNorm):
        return False
    if isinstance(module, nn.modules.lazy.LazyModuleMixin) and \
            module.has_uninitialized_params():
        # its channel count is known only after the first forward
        return False
    if isinstance(module, _OURS):
        # already cfbn's; only sync=True changes it, and a fused activation
        # has no SyncBatchNorm form
        return sync and module.activation is None
    return _target(module, sync) is not None


def _replacement(module, sync, process_group):
    group = process_group if sync else getattr(module, "process_group", None)
    return _swap(module, _target(module, sync), group)


def _convert(module, fuse, sync, process_group):
    for name, child in list(module.named_children()):
        if _wanted(child, sync):
            setattr(module, name, _replacement(child, sync, process_group))
        else:
            _convert(child, fuse, sync, process_group)
            traced = _fused_forward(child) if fuse else None
            if traced is not None:
                setattr(module, name, traced)
    if fuse and isinstance(module, nn.Sequential):
        _fuse_relu(module)


def _with_relu(bn):
    return _swap(bn, type(bn), None, activation="relu")


def _fuse_relu(seq):
    names = [name for name, _ in seq.named_children()]
    for a, b in zip(names, names[1:]):
        bn, act = getattr(seq, a), getattr(seq, b)
        if type(bn) in _FUSABLE and bn.activation is None and type(act) is nn.ReLU:
            setattr(seq, a, _with_relu(bn))
            setattr(seq, b, nn.Identity())


def _fused_forward(module):
    """`module` as a GraphModule with the ReLU and residual-add patterns of
    its own forward fused, or None (see cfbn.torch.fuse)."""
    if isinstance(module, (nn.Sequential,) + _OURS) or not any(
            type(m) in _FUSABLE and m.activation is None for m in module.modules()):
        return None
    return _fx.fuse_graph(module, _FUSABLE, _with_relu)


def convert(model, fuse=False, *, sync=False, process_group=None):
    """Replace `model`'s torch.nn batch norms with cfbn.torch's, in place.

    Every ``nn.BatchNorm1d``, ``nn.BatchNorm2d``, ``nn.BatchNorm3d`` and
    ``nn.SyncBatchNorm`` submodule (recursively; `model` itself too when it
    is one; a lazy one only once initialized) becomes the cfbn.torch module of the same kind:
    ``BatchNorm1d/2d/3d``, or `SyncBatchNorm` keeping its process group.
    The new module holds the same Parameter and buffer objects (so an
    optimizer made before still updates them), and keeps the training flag,
    requires_grad, device and dtype; the state_dict is unchanged and still
    loads into the original model.

    Parameters
    ----------
    model : torch.nn.Module
        Converted in place.
    fuse : bool
        Also fold a ReLU, or a residual add and a ReLU, into the
        (converted) ``BatchNorm1d/2d/3d`` before it (``activation="relu"``,
        the add as its ``side_input``).  Two places are looked at:

        - consecutive children of an ``nn.Sequential``: a batch norm then
          an ``nn.ReLU`` module, whose slot becomes ``nn.Identity()``;
        - the ``forward`` of any other module that holds a batch norm
          (a ResNet ``BasicBlock`` or ``Bottleneck``, the model itself),
          traced with torch.fx, every submodule a leaf:
          ``relu(bn(x))`` and ``relu(bn(x) + other)`` (or ``other +
          bn(x)``; ``+``, ``+=``, ``torch.add``, ``.add``), where the
          ReLU is an ``nn.ReLU`` module, ``F.relu``, ``torch.relu`` or
          ``.relu()`` (in place or not), the batch norm is called once,
          and neither it nor the sum is used elsewhere.  Such a module is
          replaced by a ``torch.fx.GraphModule`` of its class's name
          running the rewritten forward, holding the same submodules,
          parameters and buffers (the state_dict is unchanged); it is no
          longer an instance of its class, and hooks on the module itself
          are not carried over.  A forward that cannot be traced, or that
          traces differently in training and in eval mode, is left alone.
          The added tensor must have the batch norm output's shape, as in
          ResNet blocks (no broadcasting).

        SyncBatchNorm is never fused.
    sync : bool
        Produce `SyncBatchNorm` for every batch norm, as
        ``nn.SyncBatchNorm.convert_sync_batchnorm`` does.
    process_group : torch.distributed.ProcessGroup, optional
        With ``sync=True``, the group the new modules synchronize over
        (None: the default group).

    Returns
    -------
    torch.nn.Module
        `model`; the new module when `model` itself is a batch norm; with
        ``fuse=True``, a GraphModule in `model`'s place when `model`'s own
        forward had a pattern fused (use the returned module).
    """
    if _wanted(model, sync):
        return _replacement(model, sync, process_group)
    _convert(model, fuse, sync, process_group)
    traced = _fused_forward(model) if fuse else None
    return model if traced is None else traced
