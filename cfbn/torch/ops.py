"""cfbn's kernels as PyTorch operators: ``torch.ops.cfbn.*``.

Three functional operators, each with a fake (meta) implementation so that
``torch.compile`` and ``torch.export`` can trace them, and the first two with
an autograd formula that calls the next:

``cfbn::batch_norm``
    The forward pass.  Returns ``(out, save_mean, save_var, new_running_mean,
    new_running_var)``.  ``save_mean`` and ``save_var`` are what the gradient
    takes (batch mean and biased variance in training, the running
    statistics in inference); the new running statistics are empty ``(0,)``
    tensors unless training with running statistics.
``cfbn::batch_norm_backward``
    Its gradient: ``(grad_input, grad_weight, grad_bias, grad_side_input)``
    (the last empty without a side input).
``cfbn::batch_norm_double_backward``
    The plain gradient of the gradient: ``(grad_grad_out, grad_input,
    grad_weight)``; the autograd formula of batch_norm_backward adds what a
    fused activation contributes.

The forward and the gradient run the C++ operator's kernels entry
(cfbn/torch/_native.cpp) where it takes the call, else the Python bridge;
both give the same bits.

Why the forward returns the new running statistics rather than updating
them in place: ``torch.library`` gives autograd formulas to functional
operators only, so an operator that declared ``mutates_args`` for the running
statistics could not be differentiated.  The caller copies the new values
into its buffers (``cfbn.torch.batch_norm`` does); under ``torch.compile``
that copy is a buffer mutation Inductor writes in place.  The values are the
fused kernel's own, so eager and compiled models keep the same bits.
"""
from typing import Optional

import torch
from torch import Tensor

from .. import _args
from . import _bridge, _native

_LIB = "cfbn"


@torch.library.custom_op(_LIB + "::batch_norm", mutates_args=(), device_types="cpu")
def batch_norm(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
               running_mean: Optional[Tensor], running_var: Optional[Tensor],
               num_batches_tracked: Optional[Tensor], training: bool,
               momentum: Optional[float], eps: float, activation: Optional[str],
               alpha: Optional[float], side_input: Optional[Tensor]
               ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Batch norm of `input`, PyTorch's semantics: batch statistics when
    `training` (new running statistics, weight `momentum`, or
    1/num_batches_tracked when `momentum` is None), else the running ones."""
    factor = momentum_factor(momentum, num_batches_tracked) if training else 0.0
    native = _native.get()
    if native is not None:
        # the C++ kernels' entry, which returns None for what it leaves to the bridge
        act, act_alpha = activation_code(activation, alpha)
        out = native.forward_op(input, weight, bias, running_mean, running_var, side_input,
                                training, factor, eps, act, act_alpha)
        if out is not None:
            return out
    return _bridge.forward(input, weight, bias, running_mean, running_var, training, factor,
                           eps, activation, alpha, side_input, False)


def activation_code(activation, alpha):
    """(cfbn's activation code, alpha as a float), checked: what the C++
    entries take."""
    return (0, 0.0) if activation is None else _args.activation(activation, alpha)


def momentum_factor(momentum, num_batches_tracked):
    """The running statistics' weight of this batch: PyTorch's momentum, or
    for momentum=None the cumulative average's 1/num_batches_tracked (0.0
    without a count, as nn.BatchNorm)."""
    if momentum is not None:
        return float(momentum)
    if num_batches_tracked is None:
        return 0.0
    return 1.0 / float(num_batches_tracked)


def _vector_dtype(x):
    vdt = _bridge.VECTOR_DTYPES.get(x.dtype)
    if vdt is None:
        raise TypeError("input: expected float32, float64, float16 or bfloat16, got %s" % x.dtype)
    return vdt


@batch_norm.register_fake
def _(input, weight, bias, running_mean, running_var, num_batches_tracked, training, momentum,
      eps, activation, alpha, side_input):
    vdt = _vector_dtype(input)
    channels = input.shape[1]
    updated = channels if training and running_mean is not None else 0
    return (_bridge.empty_like(input), input.new_empty(channels, dtype=vdt),
            input.new_empty(channels, dtype=vdt), input.new_empty(updated, dtype=vdt),
            input.new_empty(updated, dtype=vdt))


def _setup_batch_norm(ctx, inputs, output):
    x, weight, bias, _, _, _, training, _, eps, activation, alpha, side_input = inputs
    _, save_mean, save_var, new_mean, new_var = output
    ctx.mark_non_differentiable(save_mean, save_var, new_mean, new_var)
    ctx.save_for_backward(x, weight, bias, save_mean, save_var, side_input)
    ctx.options = (training, eps, activation, alpha)


def _batch_norm_grad(ctx, grad_out, _save_mean, _save_var, _new_mean, _new_var):
    x, weight, bias, save_mean, save_var, side_input = ctx.saved_tensors
    training, eps, activation, alpha = ctx.options
    dx, dweight, dbias, dside = batch_norm_backward(grad_out, x, weight, bias, save_mean,
                                                    save_var, training, eps, activation, alpha,
                                                    side_input)
    need = ctx.needs_input_grad
    return (dx if need[0] else None, dweight if need[1] else None, dbias if need[2] else None,
            None, None, None, None, None, None, None, None,
            dside if side_input is not None and need[11] else None)


@torch.library.custom_op(_LIB + "::batch_norm_backward", mutates_args=(), device_types="cpu")
def batch_norm_backward(grad_out: Tensor, input: Tensor, weight: Optional[Tensor],
                        bias: Optional[Tensor], save_mean: Tensor, save_var: Tensor,
                        training: bool, eps: float, activation: Optional[str],
                        alpha: Optional[float], side_input: Optional[Tensor]
                        ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradient of cfbn::batch_norm: (grad_input, grad_weight,
    grad_bias, grad_side_input), the last empty without a side input."""
    native = _native.get()
    if native is not None:
        act, act_alpha = activation_code(activation, alpha)
        out = native.backward_op(grad_out, input, weight, bias, save_mean, save_var, training,
                                 eps, act, act_alpha, side_input)
        if out is not None:
            return out
    dx, dweight, dbias, dside = _bridge.backward(grad_out, input, weight, bias, save_mean,
                                                 save_var, training, eps, activation, alpha,
                                                 side_input)
    if dside is None:
        dside = input.new_empty(0)
    return dx, dweight, dbias, dside


def _grad_vector_dtype(weight, vdt):
    return vdt if weight is None else weight.dtype


@batch_norm_backward.register_fake
def _(grad_out, input, weight, bias, save_mean, save_var, training, eps, activation, alpha,
      side_input):
    vdt = _vector_dtype(input)
    channels = input.shape[1]
    dside = _bridge.empty_like(input) if side_input is not None else input.new_empty(0)
    return (_bridge.empty_like(input),
            input.new_empty(channels, dtype=_grad_vector_dtype(weight, vdt)),
            input.new_empty(channels, dtype=_grad_vector_dtype(bias, vdt)), dside)


def _setup_batch_norm_backward(ctx, inputs, output):
    grad_out, x, weight, bias, save_mean, save_var, training, eps, activation, alpha, side = inputs
    ctx.save_for_backward(grad_out, x, weight, bias, save_mean, save_var, side)
    ctx.options = (training, eps, activation, alpha)
    # An unused gradient arrives as None, which the kernels read as zeros
    # without a tensor of them.
    ctx.set_materialize_grads(False)


def _batch_norm_backward_grad(ctx, gg_input, gg_weight, gg_bias, gg_side):
    ddy, dx, dweight, dbias, dside = _bridge.backward_of_backward(
        batch_norm_double_backward, batch_norm_backward, ctx.saved_tensors, ctx.options,
        gg_input, gg_weight, gg_bias, gg_side)
    need = ctx.needs_input_grad
    return (ddy if need[0] else None, dx if need[1] else None, dweight if need[2] else None,
            dbias if need[3] else None, None, None, None, None, None, None,
            dside if need[10] else None)


@torch.library.custom_op(_LIB + "::batch_norm_double_backward", mutates_args=(),
                         device_types="cpu")
def batch_norm_double_backward(grad_out: Tensor, input: Tensor, weight: Optional[Tensor],
                               save_mean: Tensor, save_var: Tensor,
                               grad_grad_input: Optional[Tensor],
                               grad_grad_weight: Optional[Tensor],
                               grad_grad_bias: Optional[Tensor], training: bool, eps: float
                               ) -> tuple[Tensor, Tensor, Tensor]:
    """The gradient of cfbn::batch_norm_backward without an activation: the
    derivatives of sum(gg_input * grad_input) + sum(gg_weight * grad_weight)
    + sum(gg_bias * grad_bias) with respect to grad_out, input and weight."""
    return _bridge.double_backward(grad_out, input, weight, save_mean, save_var,
                                   grad_grad_input, grad_grad_weight, grad_grad_bias, training,
                                   eps)


@batch_norm_double_backward.register_fake
def _(grad_out, input, weight, save_mean, save_var, grad_grad_input, grad_grad_weight,
      grad_grad_bias, training, eps):
    vdt = _vector_dtype(input)
    return (_bridge.empty_like(input), _bridge.empty_like(input),
            input.new_empty(input.shape[1], dtype=_grad_vector_dtype(weight, vdt)))


batch_norm.register_autograd(_batch_norm_grad, setup_context=_setup_batch_norm)
batch_norm_backward.register_autograd(_batch_norm_backward_grad,
                                      setup_context=_setup_batch_norm_backward)
