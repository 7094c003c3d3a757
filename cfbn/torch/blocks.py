"""Blocks whose forward ``convert(fuse=True)`` replaces by a fused one.

A block class is known by its exact type: torchvision's ResNet
``BasicBlock`` and ``Bottleneck`` and the ``ResNet`` itself (its stem; looked
up only when torchvision is already imported), and any class declared with
`register_block`.  Fusing a block gives some of its batch norms the
activation of one of its activation modules and sets, on that instance
only, a ``forward`` that calls them instead of the activation modules; its
children, parameters, buffers, state_dict and hooks on the block itself
stay as they were.
"""
import collections
import copy
import functools
import sys

import torch

from . import _activation

Block = collections.namedtuple("Block", ["forward", "activations"])
Block.__doc__ = """How to fuse one block class (see `register_block`)."""

_DECLARED = {}


def register_block(cls, forward, activations=None):
    """Declare how ``convert(fuse=True)`` fuses blocks of class `cls`.

    Parameters
    ----------
    cls : type
        A torch.nn.Module subclass, matched by exact type (a subclass of
        `cls` is not fused unless declared too).
    forward : callable or None
        ``forward(block, *args, **kwargs)``: what the block computes once
        fused, calling its fused batch norms (use `residual` for a residual
        add before the activation).  A module-level function, so that a
        fused model pickles.  None: blocks of `cls` are never fused, also
        where cfbn knows the class.
    activations : dict of str to str
        For each batch norm attribute the block's fused forward calls
        fused, the attribute name of the activation module it replaces,
        e.g. ``{"bn1": "relu", "bn2": "relu"}``.  A block is fused only
        when every one of these batch norms is a cfbn.torch batch norm
        without an activation, used nowhere else in the model and without
        forward or backward hooks, and every activation module is one the
        kernels fuse (``nn.ReLU``, ``nn.ReLU6``, ``nn.LeakyReLU``,
        ``nn.ELU``, ``nn.Sigmoid``, ``nn.Tanh``, ``nn.SiLU``) without
        hooks; otherwise it is left as it is.

    Examples
    --------
    >>> def fused(block, x):
    ...     return cfbn.torch.residual(block.bn, block.conv(x), x)
    >>> cfbn.torch.register_block(MyBlock, fused, {"bn": "act"})
    """
    if forward is None:
        _DECLARED[cls] = None
        return
    if not callable(forward):
        raise TypeError("forward: expected a callable or None, got %r" % (forward,))
    if not activations:
        raise ValueError("activations: expected a non-empty dict of batch norm to "
                         "activation attribute names, got %r" % (activations,))
    _DECLARED[cls] = Block(forward, dict(activations))


def lookup(module):
    """The `Block` that fuses `module`'s class, or None."""
    kind = type(module)
    if kind in _DECLARED:
        return _DECLARED[kind]
    for where, name, block in _KNOWN:
        home = sys.modules.get(where)
        if home is not None and getattr(home, name, None) is kind:
            return block
    return None


class FusedForward(functools.partial):
    """``FusedForward(forward, block)``: a fused block's ``forward``, set on
    the instance, calling ``forward(block, ...)``.  A partial (not a bound
    method) so that the block pickles and deep-copies with it, and so that
    torch.export, which reads a root module's forward code, finds the fused
    function's."""

    @property
    def forward(self):
        return self.func

    @property
    def block(self):
        return self.args[0]

    def __repr__(self):
        return "FusedForward(%s)" % getattr(self.func, "__qualname__", self.func)


def residual(bn, input, identity, inplace=False):
    """``act(bn(input) + identity)``, act being `bn`'s fused activation.

    One fused call, `identity` as the side input, when `identity` is a
    tensor of exactly the input's shape, dtype and device (as in ResNet
    blocks).  Otherwise, where a side input would change the result
    (broadcasting, type promotion), the steps are taken one by one, as an
    unfused block takes them: `bn` without its activation, the add, the
    activation.

    Parameters
    ----------
    bn : cfbn.torch batch norm
        With its ``activation`` (possibly None).
    input : Tensor
        The batch norm's input.
    identity : Tensor
        Added to the batch norm's output before the activation.
    inplace : bool
        In the unfused case, add as ``out += identity`` does (the result
        keeps the batch norm output's dtype and shape) rather than as
        ``out + identity``.

    Returns
    -------
    Tensor
    """
    if isinstance(identity, torch.Tensor) and identity.shape == input.shape and \
            identity.dtype == input.dtype and identity.device == input.device:
        return bn(input, identity)
    # A shallow copy shares bn's parameters, buffers and hooks; only its
    # activation differs, and bn itself is never changed (another thread
    # may be running it).
    plain = copy.copy(bn)
    plain.activation = plain.alpha = None
    out = plain(input)
    out = out.add_(identity) if inplace else out + identity
    return _activation.activate(out, bn.activation, bn.alpha)


def _basic_block(block, x):
    """torchvision BasicBlock.forward with bn1 and bn2 fused."""
    out = block.conv2(block.bn1(block.conv1(x)))
    identity = x if block.downsample is None else block.downsample(x)
    return residual(block.bn2, out, identity, inplace=True)


def _bottleneck(block, x):
    """torchvision Bottleneck.forward with bn1, bn2 and bn3 fused."""
    out = block.conv2(block.bn1(block.conv1(x)))
    out = block.conv3(block.bn2(out))
    identity = x if block.downsample is None else block.downsample(x)
    return residual(block.bn3, out, identity, inplace=True)


def _resnet(model, x):
    """torchvision ResNet.forward with the stem's bn1 fused: its relu runs on
    the network's largest batch-norm output."""
    x = model.maxpool(model.bn1(model.conv1(x)))
    x = model.layer4(model.layer3(model.layer2(model.layer1(x))))
    return model.fc(torch.flatten(model.avgpool(x), 1))


# (module, class name, how to fuse it); the module is looked at only when
# it is already imported, so cfbn never imports it.
_KNOWN = (
    ("torchvision.models.resnet", "BasicBlock",
     Block(_basic_block, {"bn1": "relu", "bn2": "relu"})),
    ("torchvision.models.resnet", "Bottleneck",
     Block(_bottleneck, {"bn1": "relu", "bn2": "relu", "bn3": "relu"})),
    ("torchvision.models.resnet", "ResNet", Block(_resnet, {"bn1": "relu"})),
)
