"""The argument rules of cfbn.torch's calls, in PyTorch's words.

Checked in Python before the operator runs, so that a wrong call raises a
ValueError or TypeError naming the argument, the user's shapes and dtypes,
rather than an operator's RuntimeError about its internal views.  The C++
operators check the same things again (a direct ``torch.ops.cfbn`` call has
no Python in front of it); those checks only keep memory safe.
"""
import math

import torch

from . import _bridge

_HALF = (torch.float16, torch.bfloat16)


def _shape(t):
    return tuple(t.shape)


def channel_vector(v, name, x, vdt):
    """A per-channel tensor: one value per channel of x, in x's vector dtype
    (or a 16-bit x's own dtype)."""
    if v is None:
        return
    if not isinstance(v, torch.Tensor):
        raise TypeError("%s: expected a torch.Tensor or None, got %s" % (name, type(v).__name__))
    channels = x.shape[1]
    if v.dim() != 1 or v.shape[0] != channels:
        raise ValueError("%s: expected %d values, one per channel of input of shape %s, got "
                         "shape %s" % (name, channels, _shape(x), _shape(v)))
    if v.dtype is not vdt and not (v.dtype is x.dtype and x.dtype in _HALF):
        # PyTorch's own error for this, with its type
        raise RuntimeError(_bridge.mixed_dtype(x.dtype, v.dtype, vdt, name))


def like_input(t, name, x):
    """A tensor of x's shape and dtype (a side input)."""
    if t is None:
        return
    if not isinstance(t, torch.Tensor):
        raise TypeError("%s: expected a torch.Tensor or None, got %s" % (name, type(t).__name__))
    if t.shape != x.shape:
        raise ValueError("%s: expected the input's shape %s, got %s"
                         % (name, _shape(x), _shape(t)))
    if t.dtype is not x.dtype:
        raise TypeError("%s: expected the input's dtype %s, got %s" % (name, x.dtype, t.dtype))


def same_device(x, named):
    """Every tensor of `named` ((tensor or None, name) pairs) on x's device.

    A meta tensor beside a CPU input sends the whole call to the operators'
    fake kernels (the dispatcher's Meta key outranks CPU), which would
    return uninitialized CPU tensors: refused here, at every entrance, as
    nn refuses it."""
    for t, name in named:
        if isinstance(t, torch.Tensor) and t.device != x.device:
            raise ValueError("%s: expected a tensor on the input's device %s, got one on %s"
                             % (name, x.device, t.device))


def number(value, name, low):
    """A finite float >= low (or any finite float for low None)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError("%s: expected a number, got %r" % (name, value)) from None
    if not math.isfinite(v) or (low is not None and v < low):
        raise ValueError("%s: expected a finite number%s, got %r"
                         % (name, "" if low is None else " >= %g" % low, value))
    return v


def call(x, weight, bias, running_mean, running_var, side_input, training, momentum, eps):
    """Every rule of one batch-norm call; returns eps as a float."""
    vdt = _bridge.check_input(x, meta=True)
    for v, name in ((weight, "weight"), (bias, "bias"), (running_mean, "running_mean"),
                    (running_var, "running_var")):
        channel_vector(v, name, x, vdt)
    if (running_mean is None) != (running_var is None):
        raise ValueError("running_mean, running_var: pass both or neither (got %s None)"
                         % ("running_mean" if running_mean is None else "running_var"))
    if not training and running_mean is None:
        raise ValueError("running_mean, running_var: required when training is False")
    like_input(side_input, "side_input", x)
    same_device(x, ((weight, "weight"), (bias, "bias"), (running_mean, "running_mean"),
                    (running_var, "running_var"), (side_input, "side_input")))
    if momentum is not None:
        # nn.BatchNorm takes any momentum: (1 - m) * old + m * batch
        number(momentum, "momentum", None)
    if training and x.numel() == x.shape[1]:
        # as torch.nn.functional.batch_norm: one value per channel has no variance
        raise ValueError("Expected more than 1 value per channel when training, got input "
                         "size %s" % (x.shape,))
    return number(eps, "eps", 0.0)
