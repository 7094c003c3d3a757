"""convert: swap a model's torch.nn batch norms for cfbn.torch's, in place."""
import collections
import warnings

import torch.nn as nn

from . import _act_modules, _kinds, blocks
from ._carry import rebuild
from .modules import BatchNorm1d, BatchNorm2d, BatchNorm3d
from .sync import SyncBatchNorm

# The batch norms an activation module after them may fuse into.
_FUSABLE = (BatchNorm1d, BatchNorm2d, BatchNorm3d, SyncBatchNorm)


def _where(prefix, name):
    return prefix + "." + name if prefix else name


def _warn(message):
    warnings.warn("cfbn.torch.convert: " + message, UserWarning, stacklevel=4)


def _build(old, cls, process_group, activation=None, alpha=None):
    """A `cls` module holding `old`'s tensors, children and hooks."""
    args = (old.num_features, old.eps, old.momentum, old.affine, old.track_running_stats)
    if issubclass(cls, _kinds.SYNC):
        args += (process_group,)
    kwargs = {} if activation is None else dict(activation=activation, alpha=alpha)
    return rebuild(old, cls, *args, **kwargs)


def _converted(module, sync, process_group, where, memo):
    """`module` with its batch norms replaced: `module` itself changed in
    place, or its replacement.  A module met twice is converted once."""
    if id(module) in memo:
        return memo[id(module)]
    cls = _kinds.target(module, sync)
    if cls is not None:
        group = process_group if sync else getattr(module, "process_group", None)
        new = _build(module, cls, group, getattr(module, "activation", None),
                     getattr(module, "alpha", None))
    else:
        why = _kinds.refused(module)
        if why is not None:
            _warn("left %r (%s) as it is: %s" % (where or "the model",
                                                type(module).__name__, why))
        for name, child in list(module._modules.items()):
            if child is not None:
                got = _converted(child, sync, process_group, _where(where, name), memo)
                if got is not child:
                    setattr(module, name, got)
        new = module
    memo[id(module)] = new
    return new


def _with_activation(bn, form):
    return _build(bn, type(bn), getattr(bn, "process_group", None), *form)


def _form(bn, act, bn_where, act_where, uses):
    """The ``(activation, alpha)`` that fuses the module `act` into the
    batch norm `bn` run just before it, or None."""
    form = _act_modules.fused_form(act)
    if form is None or bn.activation is not None or uses[id(bn)] != 1 or \
            "forward" in vars(bn):
        return None
    if _act_modules.has_hooks(act):
        _warn("%r is not fused into %r: it has hooks, which would no longer fire"
              % (act_where, bn_where))
        return None
    # pre-hooks see the input, which does not change; these see the output
    if bn._forward_hooks or bn._backward_hooks or bn._backward_pre_hooks:
        _warn("%r is not fused into %r: the batch norm has forward or backward hooks, "
              "which would see the activation's output" % (act_where, bn_where))
        return None
    return form


def _runs_in_order(module):
    """Whether `module` computes as an nn.Sequential: its children one
    after the other."""
    kind = type(module)
    return isinstance(module, nn.Sequential) and "forward" not in vars(module) and all(
        getattr(kind, name) is getattr(nn.Sequential, name)
        for name in ("forward", "__iter__", "__call__", "_call_impl"))


def _fuse_children(seq, where, uses):
    names = list(seq._modules)
    for a, b in zip(names, names[1:]):
        bn, act = seq._modules[a], seq._modules[b]
        if type(bn) in _FUSABLE and isinstance(act, nn.Module):
            form = _form(bn, act, _where(where, a), _where(where, b), uses)
            if form is not None:
                setattr(seq, a, _with_activation(bn, form))
                setattr(seq, b, nn.Identity())


def _fuse_norm_act(module, where, uses):
    drop = module.drop
    if type(drop) is not nn.Identity or _act_modules.has_hooks(drop):
        return module  # the drop layer runs between the two
    form = _form(module, module.act, where, _where(where, "act"), uses)
    if form is None:
        return module
    new = _with_activation(module, form)
    new.act = nn.Identity()
    return new


def _fuse_block(block, spec, where, uses):
    if spec is None or "forward" in vars(block):
        return
    forms = {}
    for bn_name, act_name in spec.activations.items():
        bn, act = getattr(block, bn_name, None), getattr(block, act_name, None)
        if type(bn) not in _FUSABLE or not isinstance(act, nn.Module):
            return
        forms[bn_name] = _form(bn, act, _where(where, bn_name), _where(where, act_name),
                               uses)
        if forms[bn_name] is None:
            return
    for bn_name, form in forms.items():
        setattr(block, bn_name, _with_activation(getattr(block, bn_name), form))
    block.forward = blocks.FusedForward(spec.forward, block)


def _fused(module, where, uses, seen):
    """`module` with what can be fused fused, in place or replaced."""
    for name, child in list(module._modules.items()):
        if child is not None and id(child) not in seen:
            seen.add(id(child))
            got = _fused(child, _where(where, name), uses, seen)
            if got is not child:
                setattr(module, name, got)
    if type(module) in _kinds.NORM_ACT:
        return _fuse_norm_act(module, where, uses)
    if _runs_in_order(module):
        _fuse_children(module, where, uses)
    else:
        _fuse_block(module, blocks.lookup(module), where, uses)
    return module


def convert(model, fuse=False, *, sync=False, process_group=None):
    """Replace `model`'s batch norms with cfbn.torch's, in place, without
    changing what the model computes.

    Replaced (recursively; `model` itself too when it is one):

    - ``nn.BatchNorm1d``, ``nn.BatchNorm2d``, ``nn.BatchNorm3d``, and a
      subclass of one that defines nothing but ``__init__``, by cfbn's
      ``BatchNorm1d/2d/3d``; ``nn.SyncBatchNorm`` by `SyncBatchNorm`,
      keeping its process group;
    - timm's ``BatchNormAct2d`` (batch norm, drop layer, activation) by
      ``cfbn.torch.normact.BatchNormAct2d``, holding the same ``drop`` and
      ``act`` modules.

    Any other batch norm class (a subclass with a forward or other methods
    of its own, a parametrized one) is left as it is, with a warning naming
    it; so is a lazy one not yet initialized.  The new module holds the same
    Parameter and buffer objects (an optimizer made before still updates
    them), children, hooks (their handles still remove them), training
    flag and other attributes (``qconfig``, pruning's); the state_dict and
    its keys are unchanged and still load into the original model.

    Parameters
    ----------
    model : torch.nn.Module
        Converted in place.
    fuse : bool
        Also fuse an activation module run right after a batch norm into it
        (``activation=``, with ``alpha=`` for ``nn.LeakyReLU``'s
        negative_slope and ``nn.ELU``'s alpha), where that is certain not
        to change what is computed.  The activations: ``nn.ReLU``,
        ``nn.ReLU6``, ``nn.LeakyReLU``, ``nn.ELU``, ``nn.Sigmoid``,
        ``nn.Tanh``, ``nn.SiLU`` (exact types).  The places:

        - consecutive children of an ``nn.Sequential``, or of a subclass
          that keeps its forward (torchvision's ``Conv2dNormActivation``):
          the activation's slot becomes ``nn.Identity()``;
        - the ``act`` of timm's ``BatchNormAct2d`` when its ``drop`` is an
          ``nn.Identity``: ``act`` becomes ``nn.Identity()``;
        - the blocks cfbn.torch.blocks knows by exact type: torchvision's
          ``BasicBlock`` and ``Bottleneck`` (their residual add as the
          side input), and the classes declared with `register_block`.

        Nothing else is fused: other modules' own forwards are not read.
        A batch norm used in two places, or with forward or backward hooks
        (which would see the activation's output), is not fused, nor is an
        activation module with hooks (which would no longer fire); a
        warning says which.  SyncBatchNorm fuses as the others.
    sync : bool
        Produce `SyncBatchNorm` for every batch norm, as
        ``nn.SyncBatchNorm.convert_sync_batchnorm`` does, keeping a fused
        activation (and timm's ``drop`` and ``act``: ``SyncBatchNormAct``).
    process_group : torch.distributed.ProcessGroup, optional
        With ``sync=True``, the group the new modules synchronize over
        (None: the default group).

    Returns
    -------
    torch.nn.Module
        `model`, or the new module when `model` itself is replaced.
    """
    model = _converted(model, sync, process_group, "", {})
    if fuse:
        uses = collections.Counter(id(m) for _, m in model.named_modules(
            remove_duplicate=False))
        model = _fused(model, "", uses, {id(model)})
    return model
