"""torch.nn activation modules that cfbn's kernels fuse.

The kernels' formulas (cfbn.reference.activation) are torch's, kinks and
all: relu'(0) = 0, relu6'(0) = relu6'(6) = 0, leaky_relu'(0) = alpha (torch's
negative_slope), elu'(0) = alpha (torch's ``alpha``; elu's input and output
scales are 1 in nn.ELU).  So an activation module after a batch norm may
become the batch norm's ``activation=`` without changing a value.
"""
import torch.nn as nn

from .. import _args

# Matched by exact type: a subclass may compute something else (nn.ReLU6
# is itself an nn.Hardtanh, which is not fused in general).
_PLAIN = {nn.ReLU: "relu", nn.ReLU6: "relu6", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh",
          nn.SiLU: "silu"}


def has_hooks(module):
    """Whether `module` has forward or backward hooks of its own, which a
    module no longer called (or one whose output changes) would not fire."""
    return bool(module._forward_hooks or module._forward_pre_hooks or
                module._backward_hooks or module._backward_pre_hooks)


def fused_form(module):
    """cfbn's ``(activation, alpha)`` computing what `module` computes, or
    None when `module` is not an activation module the kernels fuse.
    Hooks are not looked at (see `has_hooks`)."""
    if "forward" in vars(module):
        return None
    kind = type(module)
    if kind in _PLAIN:
        return _PLAIN[kind], None
    if kind is nn.LeakyReLU:
        return _finite("leaky_relu", module.negative_slope)
    if kind is nn.ELU:
        return _finite("elu", module.alpha)
    return None


def _finite(name, alpha):
    # the kernels take a finite alpha only (csrc/rules.h); torch takes any float
    alpha = float(alpha)
    return (name, alpha) if _args.holds("finite", alpha) else None
