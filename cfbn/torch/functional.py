"""cfbn.torch.batch_norm: torch.nn.functional.batch_norm on cfbn's kernels."""
import torch

from . import _checks, ops


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5, *, activation=None, alpha=None, side_input=None,
               num_batches_tracked=None):
    """Batch normalization, as ``torch.nn.functional.batch_norm``, with a fused
    residual add and activation.

    ``act(weight * (input - mean) / sqrt(var + eps) + bias + side_input)``,
    with the batch's mean and biased variance when `training` (updating
    `running_mean` and `running_var` in place when given:
    ``new = (1 - momentum) * old + momentum * batch``, the batch variance
    Bessel-corrected), else the running statistics.

    Parameters
    ----------
    input : Tensor
        ``(N, C)`` or ``(N, C, *spatial)`` with up to three spatial axes, on
        the CPU: float32, float64, float16 or bfloat16.  Contiguous and
        channels-last memory are computed as they are; the output has the
        input's memory format.
    running_mean, running_var : Tensor or None
        Running statistics, length C.
    weight, bias : Tensor, optional
        Per-channel scale and offset (None: 1 and 0).
    training : bool
        Use (and fold into the running statistics) the batch statistics.
    momentum : float or None
        Weight of the batch in the running statistics; None is the
        cumulative average, ``1 / num_batches_tracked``.
    eps : float
        Added to the variance before the square root.
    activation : str, optional
        One of cfbn's fused activations: "relu", "relu6", "leaky_relu",
        "elu", "sigmoid", "tanh", "silu".
    alpha : float, optional
        leaky_relu's slope or elu's scale.
    side_input : Tensor, optional
        Added before the activation (a residual branch); input's shape and
        dtype.
    num_batches_tracked : Tensor, optional
        The batch count (already incremented for this batch), read when
        `momentum` is None.

    Returns
    -------
    Tensor
        The output, input's shape, dtype and memory format.

    Notes
    -----
    The per-channel tensors are float32 for float16 and bfloat16 input, or
    the input's dtype (a module moved to that dtype), as PyTorch's CPU
    kernels accept.  Every call is the operator ``torch.ops.cfbn.batch_norm``
    (see cfbn.torch.ops), so tracing, export, compile and the profiler see
    it.  Differentiable twice; forward-mode AD is not implemented (an
    error).
    """
    if torch.jit.is_tracing():
        # shapes are traced values here, and the operator checks them again
        eps = float(eps)
    else:
        eps = _checks.call(input, weight, bias, running_mean, running_var, side_input, training,
                           momentum, eps)
    act, act_alpha = ops.activation_code(activation, alpha)
    _refuse_forward_ad(input, weight, bias, running_mean, running_var, side_input)
    args = (input, weight, bias, running_mean, running_var, num_batches_tracked, bool(training),
            momentum, eps, act, act_alpha, side_input)
    if _traced(input, weight, bias, side_input):
        y, _, _, new_mean, new_var = ops.batch_norm(*args)
    elif torch.is_grad_enabled() and (input.requires_grad or _requires_grad(weight)
                                      or _requires_grad(bias) or _requires_grad(side_input)):
        # the running statistics are written inside: one output, not three
        # (each output of a Python autograd node costs microseconds)
        return _Eager.apply(input, weight, bias, side_input, args)
    else:
        with _below_autograd():
            y, _, _, new_mean, new_var = ops.batch_norm(*args)
    _update(running_mean, running_var, training, new_mean, new_var)
    return y


def _update(running_mean, running_var, training, new_mean, new_var):
    """Write the operator's new running statistics into the caller's
    (new_mean and new_var never require grad: no autograd to step around)."""
    if training and running_mean is not None:
        running_mean.copy_(new_mean)
        running_var.copy_(new_var)


# The operators' autograd formulas are Python (cfbn.torch.ops registers
# them), and a call through them pays for Python's dispatch twice: tens of
# microseconds, more than the kernels take on small tensors.  An eager call
# takes a shorter way to the same operators: a plain autograd.Function whose
# forward and backward call them below the autograd keys (still through the
# dispatcher, so dispatch modes, fake tensors and the profiler see them).
# Tracing, torch.compile and functorch transforms see the operators with
# their registered formulas instead, which they need to record.
_below_autograd = torch._C._AutoDispatchBelowAutograd
# The overloads' C++ callables: OpOverload.__call__ is a Python frame that
# only forwards to them (still the dispatcher, modes and profiler included).
_forward = ops.batch_norm._op
_backward = ops.batch_norm_backward._op
_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


def _requires_grad(t):
    return t is not None and t.requires_grad


def _traced(*tensors):
    if torch.jit.is_tracing() or torch.compiler.is_compiling():
        return True
    return any(t is not None and _wrapped(t) for t in tensors)


class _Eager(torch.autograd.Function):
    """cfbn::batch_norm with cfbn::batch_norm_backward as its gradient; the
    running statistics updated in its forward."""

    @staticmethod
    def forward(ctx, x, weight, bias, side_input, args):
        # the differentiable tensors, then the operator's arguments in one
        # tuple: apply() inspects each of its own arguments, at a cost per
        # argument
        _, _, _, running_mean, running_var, _, training, _, eps, act, alpha, _ = args
        with _below_autograd():
            y, save_mean, save_var, new_mean, new_var = _forward(*args)
            _update(running_mean, running_var, training, new_mean, new_var)
        # x and the parameters through save_for_backward, so that modifying
        # them in place before the backward is an error; the statistics are ours.
        ctx.save_for_backward(x, weight, bias, side_input)
        ctx.stats = (save_mean, save_var)
        ctx.options = (training, eps, act, alpha)
        # an undefined gradient (a consumer that returned None) stays None:
        # no zero tensor is made for it and no backward computed
        ctx.set_materialize_grads(False)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        if grad_out is None:
            return None, None, None, None, None
        x, weight, bias, side_input = ctx.saved_tensors
        args = (grad_out, x, weight, bias) + ctx.stats + ctx.options + (side_input,)
        if torch.is_grad_enabled():
            # create_graph=True: the operator's own formula differentiates it again
            dx, dweight, dbias, dside = ops.batch_norm_backward(*args)
        else:
            with _below_autograd():
                dx, dweight, dbias, dside = _backward(*args)
        need = ctx.needs_input_grad
        return (dx if need[0] else None, dweight if need[1] else None,
                dbias if need[2] else None, dside if need[3] else None, None)


def _refuse_forward_ad(*tensors):
    """A clear error for dual tensors: the operators have no forward-mode
    formula, and autograd would otherwise run them without the tangent."""
    if torch.compiler.is_compiling() or not torch._C._is_fwd_grad_enabled() or \
            torch.autograd.forward_ad._current_level < 0:
        return
    for t in tensors:
        if t is not None and torch.autograd.forward_ad.unpack_dual(t).tangent is not None:
            raise NotImplementedError(
                "cfbn.torch.batch_norm: forward-mode AD (torch.autograd.forward_ad, "
                "torch.func.jvp) is not implemented; use torch.nn.functional.batch_norm "
                "there, or reverse mode")
