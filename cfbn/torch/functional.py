"""cfbn.torch.batch_norm: torch.nn.functional.batch_norm on cfbn's kernels."""
import torch

from . import _bridge, _eager, _native, ops


def _verify_batch_size(size):
    # As torch.nn.functional.batch_norm: one value per channel has no variance.
    size_prods = size[0]
    for i in range(len(size) - 2):
        size_prods *= size[i + 2]
    if size_prods == 1:
        raise ValueError("Expected more than 1 value per channel when training, got input "
                         "size %s" % (size,))


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
    kernels accept.  Differentiable twice, in eager
    mode and under ``torch.compile``, where the call is the operator
    ``torch.ops.cfbn.batch_norm`` (see cfbn.torch.ops).
    """
    if training and input.numel() == input.shape[1]:
        _verify_batch_size(input.shape)
    if torch.compiler.is_compiling():
        y, _, _, new_mean, new_var = ops.batch_norm(
            input, weight, bias, running_mean, running_var, num_batches_tracked, training,
            momentum, eps, activation, alpha, side_input)
        if training and running_mean is not None:
            running_mean.copy_(new_mean)
            running_var.copy_(new_var)
        return y
    factor = ops.momentum_factor(momentum, num_batches_tracked) if training else 0.0
    eps = float(eps)
    native = _native.get()
    if native is not None and type(input) is torch.Tensor:
        # The C++ operator, which returns None for what it leaves to the bridge.
        act, act_alpha = ops.activation_code(activation, alpha)
        try:
            y = native.batch_norm(input, weight, bias, running_mean, running_var, side_input,
                                  bool(training), factor, eps, act, act_alpha, activation,
                                  None if alpha is None else float(alpha))
        except TypeError:
            y = None  # an argument that is no tensor: the bridge's checks name it
        if y is not None:
            return y
    if torch.is_grad_enabled() and (input.requires_grad
                                    or (weight is not None and weight.requires_grad)
                                    or (bias is not None and bias.requires_grad)
                                    or (side_input is not None and side_input.requires_grad)):
        return _eager.BatchNormFunction.apply(input, weight, bias, running_mean, running_var,
                                              side_input, (training, factor, eps, activation,
                                                           alpha))
    return _bridge.forward(input, weight, bias, running_mean, running_var, training, factor,
                           eps, activation, alpha, side_input, True)[0]
