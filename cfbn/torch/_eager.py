"""The eager path: the operators' implementations under plain autograd.Functions.

A call through the dispatcher to a Python custom operator costs a few
hundred microseconds of Python per forward and backward (the generated
autograd.Function, the redispatch, schema handling); a plain autograd.Function
costs a fraction of that.  Outside torch.compile, cfbn.torch.batch_norm runs
these Functions, which call the same functions of cfbn.torch._bridge as the
operators, with the same arguments: the operators are what a compiled
graph records, these are the shortcut eager mode takes to the same kernels.

The one difference is where the running statistics go: here the kernels
write them in place (an eager call is free to mutate its buffers), where
the functional operator returns them for the caller to copy.  The values are
the same bits.
"""
import torch
from torch.autograd.function import once_differentiable

from . import _bridge


class BatchNormFunction(torch.autograd.Function):
    """cfbn::batch_norm with the running statistics updated in place."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, side_input, options):
        # the non-tensor arguments in one tuple: apply() inspects every argument
        training, factor, eps, activation, alpha = options
        y, save_mean, save_var, _, _ = _bridge.forward(
            x, weight, bias, running_mean, running_var, training, factor, eps, activation,
            alpha, side_input, True)
        # x and the parameters through save_for_backward, so that modifying
        # them in place before backward is an error; the statistics are ours.
        ctx.save_for_backward(x, weight, bias, side_input)
        ctx.stats = (save_mean, save_var)
        ctx.options = (training, eps, activation, alpha)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, bias, side_input = ctx.saved_tensors
        save_mean, save_var = ctx.stats
        training, eps, activation, alpha = ctx.options
        if torch.is_grad_enabled():
            # create_graph=True: the gradient itself must be differentiable.
            grads = BatchNormBackwardFunction.apply(grad_out, x, weight, bias, side_input,
                                                    save_mean, save_var, ctx.options)
            dx, dweight, dbias = grads[:3]
            dside = grads[3] if side_input is not None else None
        else:
            dx, dweight, dbias, dside = _bridge.backward(grad_out, x, weight, bias, save_mean,
                                                         save_var, training, eps, activation,
                                                         alpha, side_input)
        need = ctx.needs_input_grad
        return (dx if need[0] else None, dweight if need[1] else None,
                dbias if need[2] else None, None, None, dside if need[5] else None, None)


class BatchNormBackwardFunction(torch.autograd.Function):
    """cfbn::batch_norm_backward, differentiable once more."""

    @staticmethod
    def forward(ctx, grad_out, x, weight, bias, side_input, save_mean, save_var, options):
        training, eps, activation, alpha = options
        dx, dweight, dbias, dside = _bridge.backward(grad_out, x, weight, bias, save_mean,
                                                     save_var, training, eps, activation, alpha,
                                                     side_input)
        ctx.save_for_backward(grad_out, x, weight, bias, side_input)
        ctx.stats = (save_mean, save_var)
        ctx.options = options
        ctx.set_materialize_grads(False)
        if dside is None:
            return dx, dweight, dbias
        return dx, dweight, dbias, dside

    @staticmethod
    @once_differentiable
    def backward(ctx, gg_input, gg_weight, gg_bias, gg_side=None):
        grad_out, x, weight, bias, side_input = ctx.saved_tensors
        save_mean, save_var = ctx.stats
        saved = (grad_out, x, weight, bias, save_mean, save_var, side_input)
        ddy, dx, dweight, dbias, dside = _bridge.backward_of_backward(
            _bridge.double_backward, _bridge.backward, saved, ctx.options, gg_input, gg_weight,
            gg_bias, gg_side)
        need = ctx.needs_input_grad
        return (ddy if need[0] else None, dx if need[1] else None, dweight if need[2] else None,
                dbias if need[3] else None, dside if need[4] else None, None, None, None)
