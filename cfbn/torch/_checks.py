"""The argument rules of cfbn.torch's calls, in PyTorch's words.

Checked in Python before the operator runs, so that a wrong call raises a
ValueError or TypeError naming the argument, the user's shapes and dtypes,
rather than an operator's RuntimeError about its internal views.  The C++
operators check the same rules again (a direct ``torch.ops.cfbn`` call has
no Python in front of it), in these words (tests/test_torch_rules.py); the
scalar rules' ranges and words are csrc/rules.h's, through cfbn._args.
"""
import torch

from .. import _args
from . import _bridge


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
    if v.dtype is not vdt and not (v.dtype is x.dtype and x.dtype in _bridge.HALF):
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


def scalars(eps, activation, alpha):
    """The scalar arguments of a ``torch.ops.cfbn`` operator, by cfbn's
    rules (csrc/rules.h), as its C++ form checks them: eps, the activation
    code and alpha (finite, whether or not the activation reads it).
    Returns (eps, activation name, alpha or None where the activation takes
    none)."""
    eps = _args.epsilon(eps, "eps")
    name = _NAMES[_args.activation_code(activation)]
    alpha = _args.finite(alpha, "alpha")
    return eps, name, alpha if _args.ACTIVATIONS[name][1] is not None else None


# activation code -> cfbn's activation name
_NAMES = {code: name for name, (code, _) in _args.ACTIVATIONS.items()}


def running_pair(running_mean, running_var, training):
    """Both running statistics or neither, and both when not training."""
    if (running_mean is None) != (running_var is None):
        raise ValueError("running_mean, running_var: pass both or neither (got %s None)"
                         % ("running_mean" if running_mean is None else "running_var"))
    if not training and running_mean is None:
        raise ValueError("running_mean, running_var: required when training is False")


def _forward_arguments(x, weight, bias, running_mean, running_var, side_input, training,
                       momentum, more=()):
    """The tensors' and momentum's rules of a forward call; `more`: other
    (tensor or None, name) pairs held to x's device."""
    vdt = _bridge.check_input(x, meta=True)
    for v, name in ((weight, "weight"), (bias, "bias"), (running_mean, "running_mean"),
                    (running_var, "running_var")):
        channel_vector(v, name, x, vdt)
    running_pair(running_mean, running_var, training)
    like_input(side_input, "side_input", x)
    same_device(x, ((weight, "weight"), (bias, "bias"), (running_mean, "running_mean"),
                    (running_var, "running_var"), (side_input, "side_input")) + more)
    if momentum is not None:
        # nn.BatchNorm takes any momentum: (1 - m) * old + m * batch
        _args.finite(momentum, "momentum")


def call(x, weight, bias, running_mean, running_var, side_input, training, momentum, eps):
    """Every rule of one batch-norm call; returns eps as a float."""
    _forward_arguments(x, weight, bias, running_mean, running_var, side_input, training,
                       momentum)
    if training and x.numel() == x.shape[1]:
        # as torch.nn.functional.batch_norm: one value per channel has no variance
        raise ValueError("Expected more than 1 value per channel when training, got input "
                         "size %s" % (x.shape,))
    return _args.epsilon(eps, "eps")


# The rules of the three torch.ops.cfbn operators, for their Python forms
# and their fake kernels: what their C++ forms check (csrc/torch_ops.cpp).

def forward_operator(input, weight, bias, running_mean, running_var, num_batches_tracked,
                     training, momentum, eps, activation, alpha, side_input):
    """Every rule of a cfbn::batch_norm call but the one on its data (the
    count in num_batches_tracked, `_args.count`); returns `scalars`'."""
    _forward_arguments(input, weight, bias, running_mean, running_var, side_input, training,
                       momentum, ((num_batches_tracked, "num_batches_tracked"),))
    return scalars(eps, activation, alpha)


def backward_operator(grad_out, input, weight, bias, save_mean, save_var, eps, activation,
                      alpha, side_input):
    """Every rule of a cfbn::batch_norm_backward call; returns `scalars`'."""
    _gradient_tensors(grad_out, input, weight, save_mean, save_var,
                      ((bias, "bias"),), ((side_input, "side_input"),))
    return scalars(eps, activation, alpha)


def double_backward_operator(grad_out, input, weight, save_mean, save_var, grad_grad_input,
                             grad_grad_weight, grad_grad_bias, eps):
    """Every rule of a cfbn::batch_norm_double_backward call; returns eps."""
    _gradient_tensors(grad_out, input, weight, save_mean, save_var,
                      ((grad_grad_weight, "grad_grad_weight"),
                       (grad_grad_bias, "grad_grad_bias")),
                      ((grad_grad_input, "grad_grad_input"),))
    return _args.epsilon(eps, "eps")


def _gradient_tensors(grad_out, input, weight, save_mean, save_var, vectors, like):
    vdt = _bridge.check_input(input, meta=True)
    like_input(grad_out, "grad_out", input)
    for v, name in ((weight, "weight"),) + vectors:
        channel_vector(v, name, input, vdt)
    for v, name in ((save_mean, "save_mean"), (save_var, "save_var")):
        # the forward's statistics: always of the vector dtype
        if not isinstance(v, torch.Tensor) or v.dtype is not vdt:
            raise TypeError("%s: expected the forward's statistics, a tensor of dtype %s, "
                            "got %s" % (name, vdt, getattr(v, "dtype", type(v).__name__)))
        channel_vector(v, name, input, vdt)
    for t, name in like:
        like_input(t, name, input)
    same_device(input, ((grad_out, "grad_out"), (weight, "weight"), (save_mean, "save_mean"),
                        (save_var, "save_var")) + vectors + like)
