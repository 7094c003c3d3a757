"""cfbn's kernels as PyTorch operators: ``torch.ops.cfbn.*``.

Three functional operators, in the dispatcher, so that everything built on
it sees them: autograd, ``torch.jit.trace``, ``torch.export``,
``torch.compile``, fake and meta tensors, dispatch modes, the profiler.

``cfbn::batch_norm(input, weight, bias, running_mean, running_var,
num_batches_tracked, training, momentum, eps, activation, alpha,
side_input)``
    The forward pass.  Returns ``(out, save_mean, save_var,
    new_running_mean, new_running_var)``.  ``save_mean`` and ``save_var``
    are what the gradient takes (batch mean and biased variance in
    training, the running statistics in inference); the new running
    statistics are empty ``(0,)`` tensors unless training with running
    statistics.  ``momentum`` None is the cumulative average
    ``1 / num_batches_tracked``; ``activation`` is cfbn's activation code
    (`activation_code`) and ``alpha`` its parameter.
``cfbn::batch_norm_backward(grad_out, input, weight, bias, save_mean,
save_var, training, eps, activation, alpha, side_input)``
    Its gradient: ``(grad_input, grad_weight, grad_bias, grad_side_input)``
    (the last empty without a side input).
``cfbn::batch_norm_double_backward(grad_out, input, weight, save_mean,
save_var, grad_grad_input, grad_grad_weight, grad_grad_bias, training,
eps)``
    The plain gradient of the gradient: ``(grad_grad_out, grad_input,
    grad_weight)``; the autograd formula of batch_norm_backward adds what a
    fused activation contributes.  Differentiating it once more (a third
    derivative) is an error.

The kernels are C++ (csrc/torch_ops.cpp, loaded by cfbn.torch._library);
where that library cannot load, the same operators are defined here in
Python over the NumPy bridge, with one warning saying why.  The autograd
formulas and fake kernels are Python in both cases (the stable ABI has no
C++ autograd).

Why the forward returns the new running statistics rather than updating
them in place: autograd formulas are given to functional operators only, so
an operator that mutated the running statistics could not be
differentiated.  The caller copies the new values into its buffers
(cfbn.torch.batch_norm does); under ``torch.compile`` that copy is a buffer
mutation Inductor writes in place.
"""
import warnings
from typing import Optional

import torch
from torch import Tensor

from .. import _args
from . import _bridge, _checks, _library


def activation_code(activation, alpha):
    """(cfbn's activation code, alpha as a float), checked by the validator."""
    return (0, 0.0) if activation is None and alpha is None else _args.activation(activation,
                                                                                    alpha)


def _factor(momentum, num_batches_tracked):
    if momentum is not None:
        return float(momentum)
    if num_batches_tracked is None:
        return 0.0
    # momentum None weighs the batch by 1 / num_batches_tracked
    n = _args.count(int(num_batches_tracked), "num_batches_tracked")
    return 0.0 if n == 0 else 1.0 / n


def _define_in_python():
    """The operators over the Python bridge, for where the C++ library is not loaded."""

    @torch.library.custom_op("cfbn::batch_norm", mutates_args=(), device_types="cpu")
    def batch_norm(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                   running_mean: Optional[Tensor], running_var: Optional[Tensor],
                   num_batches_tracked: Optional[Tensor], training: bool,
                   momentum: Optional[float], eps: float, activation: int, alpha: float,
                   side_input: Optional[Tensor]
                   ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        eps, name, a = _checks.forward_operator(input, weight, bias, running_mean, running_var,
                                                num_batches_tracked, training, momentum, eps,
                                                activation, alpha, side_input)
        factor = _factor(momentum, num_batches_tracked) if training else 0.0
        if training and running_mean is not None and not 0.0 <= factor <= 1.0:
            # cfbn's kernels take TensorFlow's factor, in [0, 1]; nn takes any
            # momentum.  Factor 1 gives the batch's statistics (the variance
            # Bessel-corrected, as nn keeps it), blended here as nn does.
            y, save_mean, save_var, batch_mean, batch_var = _bridge.forward(
                input, weight, bias, running_mean, running_var, training, 1.0, eps, name, a,
                side_input, False)
            vdt = batch_mean.dtype
            return (y, save_mean, save_var,
                    running_mean.to(vdt) * (1 - factor) + batch_mean * factor,
                    running_var.to(vdt) * (1 - factor) + batch_var * factor)
        return _bridge.forward(input, weight, bias, running_mean, running_var, training,
                               factor, eps, name, a, side_input, False)

    @torch.library.custom_op("cfbn::batch_norm_backward", mutates_args=(), device_types="cpu")
    def batch_norm_backward(grad_out: Tensor, input: Tensor, weight: Optional[Tensor],
                            bias: Optional[Tensor], save_mean: Tensor, save_var: Tensor,
                            training: bool, eps: float, activation: int, alpha: float,
                            side_input: Optional[Tensor]
                            ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        eps, name, a = _checks.backward_operator(grad_out, input, weight, bias, save_mean,
                                                 save_var, eps, activation, alpha, side_input)
        dx, dweight, dbias, dside = _bridge.backward(grad_out, input, weight, bias, save_mean,
                                                     save_var, training, eps, name, a,
                                                     side_input)
        return dx, dweight, dbias, input.new_empty(0) if dside is None else dside

    @torch.library.custom_op("cfbn::batch_norm_double_backward", mutates_args=(),
                             device_types="cpu")
    def batch_norm_double_backward(grad_out: Tensor, input: Tensor, weight: Optional[Tensor],
                                   save_mean: Tensor, save_var: Tensor,
                                   grad_grad_input: Optional[Tensor],
                                   grad_grad_weight: Optional[Tensor],
                                   grad_grad_bias: Optional[Tensor], training: bool, eps: float
                                   ) -> tuple[Tensor, Tensor, Tensor]:
        eps = _checks.double_backward_operator(grad_out, input, weight, save_mean, save_var,
                                               grad_grad_input, grad_grad_weight,
                                               grad_grad_bias, eps)
        return _bridge.double_backward(grad_out, input, weight, save_mean, save_var,
                                       grad_grad_input, grad_grad_weight, grad_grad_bias,
                                       training, eps)


# Why the C++ library is not in use (None: it is).
NOT_LOADED = _library.load()
if NOT_LOADED is not None:
    warnings.warn("cfbn.torch: %s; its operators run in Python over NumPy views instead "
                  "(the same results, at tens of microseconds more per call)" % NOT_LOADED,
                  RuntimeWarning, stacklevel=2)
    _define_in_python()

batch_norm = torch.ops.cfbn.batch_norm.default
batch_norm_backward = torch.ops.cfbn.batch_norm_backward.default
batch_norm_double_backward = torch.ops.cfbn.batch_norm_double_backward.default


def _grad_vector_dtype(param, vdt):
    return vdt if param is None else param.dtype


@torch.library.register_fake("cfbn::batch_norm")
def _(input, weight, bias, running_mean, running_var, num_batches_tracked, training, momentum,
      eps, activation, alpha, side_input):
    _checks.forward_operator(input, weight, bias, running_mean, running_var,
                             num_batches_tracked, training, momentum, eps, activation, alpha,
                             side_input)
    vdt = _bridge.VECTOR_DTYPES[input.dtype]
    channels = input.shape[1]
    updated = channels if training and running_mean is not None else 0
    return (_bridge.empty_like(input), input.new_empty(channels, dtype=vdt),
            input.new_empty(channels, dtype=vdt), input.new_empty(updated, dtype=vdt),
            input.new_empty(updated, dtype=vdt))


@torch.library.register_fake("cfbn::batch_norm_backward")
def _(grad_out, input, weight, bias, save_mean, save_var, training, eps, activation, alpha,
      side_input):
    _checks.backward_operator(grad_out, input, weight, bias, save_mean, save_var, eps,
                              activation, alpha, side_input)
    vdt = _bridge.VECTOR_DTYPES[input.dtype]
    channels = input.shape[1]
    dside = _bridge.empty_like(input) if side_input is not None else input.new_empty(0)
    return (_bridge.empty_like(input),
            input.new_empty(channels, dtype=_grad_vector_dtype(weight, vdt)),
            input.new_empty(channels, dtype=_grad_vector_dtype(bias, vdt)), dside)


@torch.library.register_fake("cfbn::batch_norm_double_backward")
def _(grad_out, input, weight, save_mean, save_var, grad_grad_input, grad_grad_weight,
      grad_grad_bias, training, eps):
    _checks.double_backward_operator(grad_out, input, weight, save_mean, save_var,
                                     grad_grad_input, grad_grad_weight, grad_grad_bias, eps)
    vdt = _bridge.VECTOR_DTYPES[input.dtype]
    return (_bridge.empty_like(input), _bridge.empty_like(input),
            input.new_empty(input.shape[1], dtype=_grad_vector_dtype(weight, vdt)))


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


def _setup_batch_norm_backward(ctx, inputs, output):
    grad_out, x, weight, bias, save_mean, save_var, training, eps, activation, alpha, side = inputs
    ctx.save_for_backward(grad_out, x, weight, bias, save_mean, save_var, side)
    ctx.options = (training, eps, activation, alpha)
    # An unused gradient arrives as None, which the kernels read as zeros
    # without a tensor of them.
    ctx.set_materialize_grads(False)


def _batch_norm_backward_grad(ctx, gg_input, gg_weight, gg_bias, gg_side):
    training, eps, activation, alpha = ctx.options
    _, name, a = _checks.scalars(eps, activation, alpha)
    ddy, dx, dweight, dbias, dside = _bridge.backward_of_backward(
        batch_norm_double_backward, _plain_backward, ctx.saved_tensors,
        (training, eps, name, a), gg_input, gg_weight, gg_bias, gg_side)
    need = ctx.needs_input_grad
    return (ddy if need[0] else None, dx if need[1] else None, dweight if need[2] else None,
            dbias if need[3] else None, None, None, None, None, None, None,
            dside if need[10] else None)


def _plain_backward(grad_out, x, weight, bias, save_mean, save_var, training, eps, _activation,
                    _alpha, side_input):
    """batch_norm_backward without an activation, as backward_of_backward calls it."""
    dx, dweight, dbias, dside = batch_norm_backward(grad_out, x, weight, bias, save_mean,
                                                    save_var, training, eps, 0, 0.0, side_input)
    return dx, dweight, dbias, dside if side_input is not None else None


def _setup_double_backward(ctx, inputs, output):
    pass


def _double_backward_grad(ctx, *grads):
    raise NotImplementedError(
        "cfbn.torch: batch_norm is differentiable twice; a third derivative (the gradient of "
        "cfbn::batch_norm_double_backward) is not implemented")


torch.library.register_autograd("cfbn::batch_norm", _batch_norm_grad,
                                setup_context=_setup_batch_norm)
torch.library.register_autograd("cfbn::batch_norm_backward", _batch_norm_backward_grad,
                                setup_context=_setup_batch_norm_backward)
torch.library.register_autograd("cfbn::batch_norm_double_backward", _double_backward_grad,
                                setup_context=_setup_double_backward)
