"""Folding an inference-mode batch normalization into the layer before it."""
import numpy as np

from . import _args

__all__ = ["fold_batch_norm"]


def _vec(v, name, c):
    a = _args.as_array(v, name)
    if a.shape != (c,):
        raise ValueError("%s: expected shape (%d,) (one value per output channel), got %s"
                         % (name, c, a.shape))
    if not _args.is_floating(a.dtype):
        raise TypeError("%s: expected a floating-point array, got %s" % (name, a.dtype))
    return a.astype(np.float64)


def fold_batch_norm(weight, bias, scale, offset, mean, variance, epsilon, out_axis=0):
    """Fold ``BN(conv(x, weight) + bias)`` (inference mode) into one convolution.

    With ``k = scale / sqrt(variance + epsilon)`` per output channel,
    ``BN(conv(x, w) + b) = conv(x, w * k) + ((b - mean) * k + offset)``.

    Parameters
    ----------
    weight : ndarray
        Weights of the convolution or linear layer: real floating-point
        (bfloat16 included) or integer.
    bias : ndarray or None
        Its bias, length C_out; None for a layer without one.
    scale, offset, mean, variance : ndarray
        The batch normalization's gamma, beta and population statistics,
        length C_out.
    epsilon : float
        The batch normalization's epsilon.
    out_axis : int
        The weight's output-channel axis: 0 for PyTorch's OIHW convolutions
        and (out, in) linear weights, -1 for TensorFlow's HWIO kernels and
        (in, out) dense kernels.

    Returns
    -------
    (folded_weight, folded_bias)
        In weight's dtype (float64 for an integer weight); computed in float64.
    """
    w = _args.as_array(weight, "weight")
    floating = _args.is_floating(w.dtype)
    if not (floating or np.issubdtype(w.dtype, np.integer)):
        # a complex weight would lose its imaginary part, a bool one mean nothing
        raise TypeError("weight: expected a real floating-point or integer array, got %s"
                        % w.dtype)
    if w.ndim < 1:
        raise ValueError("weight: expected at least one dimension, got a scalar")
    axis = _args.index(out_axis, "out_axis")
    eps = _args.epsilon(epsilon)
    if not -w.ndim <= axis < w.ndim:
        raise ValueError("out_axis: %d is out of range for a %d-D weight" % (axis, w.ndim))
    axis %= w.ndim
    c = w.shape[axis]
    k = _vec(scale, "scale", c) / np.sqrt(_vec(variance, "variance", c) + eps)
    b = np.zeros(c) if bias is None else _vec(bias, "bias", c)
    folded_bias = (b - _vec(mean, "mean", c)) * k + _vec(offset, "offset", c)
    shape = [1] * w.ndim
    shape[axis] = c
    out_dtype = w.dtype if floating else np.dtype(np.float64)
    folded_weight = (w.astype(np.float64) * k.reshape(shape)).astype(out_dtype)
    return folded_weight, folded_bias.astype(out_dtype)
