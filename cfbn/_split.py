"""Split batch-normalization kernels: statistics, merge, apply, and the gradient's two passes.

``fused_batch_norm`` is one call that reduces and normalizes the same tensor.
These functions cut it at the point where the per-channel statistics are
known, so that statistics of several tensors (micro-batches, or the shards of
a batch held by several processes) can be merged before normalizing.
Statistics travel as float64 ``(count, mean, m2)`` with
``m2 = sum((x - mean)**2)``: unlike ``(sum x, sum x**2)`` they merge without
cancellation however large the mean is next to the spread.
"""
from collections import namedtuple

import numpy as np

from . import _kernels
from . import _args

_F64 = np.dtype(np.float64)
_STAT_DTYPES = (np.dtype(np.float32), _F64)


class BatchNormStatistics(namedtuple("BatchNormStatistics", ["count", "mean", "m2"])):
    """Per-channel statistics of a tensor: ``(count, mean, m2)``.

    ``count`` is the number of elements reduced per channel (an int), and
    ``mean`` and ``m2 = sum((x - mean)**2)`` are float64 arrays of length C.
    """

    __slots__ = ()

    def variance(self):
        """Biased variance ``m2 / count`` (float64; NaN where count is 0).

        This is the division ``fused_batch_norm`` makes, so passing it to
        `batch_norm_apply` reproduces the fused result bit for bit.
        """
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.m2 / float(self.count) if self.count else np.full_like(self.m2, np.nan)


BatchNormGradStatistics = namedtuple("BatchNormGradStatistics", ["sum_dy", "sum_dy_xhat"])


def _host_tensor(x, name):
    if type(x) is not np.ndarray and _args.is_cupy(x):
        raise TypeError("%s: the split kernels take NumPy arrays (host memory), got a CuPy array"
                        % name)
    return _args.tensor(x, name)


def _stat_vector(v, name, channels):
    """A per-channel statistic as a C-contiguous float64 array of length `channels`.

    float32 is accepted and widened exactly; any other dtype is a TypeError,
    so that an integer or complex array is never silently reinterpreted.
    """
    a = _args.as_array(v, name)
    if a.dtype not in _STAT_DTYPES:
        raise TypeError("%s: expected float64 (or float32), got %s" % (name, a.dtype))
    if channels is None:
        if a.ndim != 1:
            raise ValueError("%s: expected a 1-D array (one value per channel), got shape %s"
                             % (name, a.shape))
    elif a.shape != (channels,):
        raise ValueError("%s: expected shape (%d,) (one value per channel), got shape %s"
                         % (name, channels, a.shape))
    return np.ascontiguousarray(a, dtype=_F64)


def _count(count, name):
    n = _args.index(count, name)
    if n < 0:
        raise ValueError("%s: expected a count >= 0, got %d" % (name, n))
    if n >= 1 << 63:
        raise ValueError("%s: expected a count below 2**63, got %s" % (name, _args.short(n)))
    return n


def _result(out, x, inputs, in_place):
    """The output array for the kernels and the caller's array to copy it
    into afterwards (None when the kernels write the caller's array).

    A new array, or the caller's `out` checked against the inputs (name,
    array) by cfbn._args's rules: it may be exactly the memory of an input
    named in `in_place`, no other.
    """
    if out is None:
        return _kernels.empty_output(x.shape, x.dtype), None
    target = _args.given_output(out, "out", "out", x.shape, x.dtype, inputs,
                           frozenset(("out", name) for name in in_place))
    return target, (None if target is out else out)


def _finish(result, dest):
    if dest is None:
        return result
    np.copyto(dest, result)
    return dest


def batch_norm_statistics(x, *, data_format="NHWC", n_threads=None):
    """Per-channel count, mean and sum of squared deviations of `x`, in one pass.

    Parameters
    ----------
    x : ndarray
        float32, float64, float16 or bfloat16 tensor laid out as `data_format`.
    data_format : {"NHWC", "NCHW", "NDHWC", "NCDHW", "NC"}
        Position of the channel axis.
    n_threads : int, optional
        OpenMP threads; None uses OpenMP's default.  Results do not depend on it.

    Returns
    -------
    BatchNormStatistics
        ``(count, mean, m2)``: count (int) elements per channel, and float64
        arrays of length C with the mean and ``m2 = sum((x - mean)**2)``.
        For an empty `x` count is 0 and mean and m2 are NaN.

    Notes
    -----
    The sums are the ones `fused_batch_norm` accumulates (shifted, in
    float64), so ``variance = m2 / count`` is its biased variance bit for bit.
    """
    x, dt, _ = _host_tensor(x, "x")
    layout, outer, channels, inner = _args.layout(data_format, x)
    nt = _args.threads(n_threads)
    mean = np.empty(channels, _F64)
    m2 = np.empty(channels, _F64)
    _kernels.statistics(dt, layout, outer, channels, inner, nt, x, mean, m2)
    return BatchNormStatistics(outer * inner, mean, m2)


def _statistics_arg(s, name, channels=None):
    """(count, mean, m2) from a BatchNormStatistics or any 3-sequence, validated."""
    try:
        count, mean, m2 = s
    except (TypeError, ValueError):
        raise TypeError("%s: expected BatchNormStatistics (count, mean, m2), got %s"
                        % (name, type(s).__name__)) from None
    count = _count(count, name + ".count")
    mean = _stat_vector(mean, name + ".mean", channels)
    m2 = _stat_vector(m2, name + ".m2", mean.shape[0])
    return count, mean, m2


def _merge(na, ma, qa, nb, mb, qb):
    """Chan, Golub and LeVeque's pairwise update of (count, mean, m2), in float64.

    A count of 0 is the identity (its mean and m2, NaN for an empty tensor,
    are never read), so empty shards cost nothing and change nothing.
    """
    if nb == 0:
        return na, ma.copy(), qa.copy()
    if na == 0:
        return nb, mb.copy(), qb.copy()
    n = na + nb
    delta = mb - ma
    # delta * (nb / n) keeps the update small next to ma when the two means
    # are close, which is the common case; m2 gets the between-part term.
    mean = ma + delta * (nb / n)
    m2 = (qa + qb) + delta * delta * (na * (nb / n))
    return n, mean, m2


def merge_statistics(a, b):
    """Statistics of the concatenation of two tensors, from theirs.

    Parameters
    ----------
    a, b : BatchNormStatistics
        As returned by `batch_norm_statistics` (or any ``(count, mean, m2)``
        with the same number of channels; float32 vectors are widened to
        float64).

    Returns
    -------
    BatchNormStatistics
        ``(a.count + b.count, mean, m2)`` by Chan et al.'s parallel update in
        float64.  A count of 0 is the identity.  New arrays; the inputs are
        not modified.

    Notes
    -----
    Merging is exact in real arithmetic and commutative up to rounding;
    `merge_statistics_many` fixes the order so results are reproducible.
    """
    na, ma, qa = _statistics_arg(a, "a")
    nb, mb, qb = _statistics_arg(b, "b", ma.shape[0])
    return BatchNormStatistics(*_merge(na, ma, qa, nb, mb, qb))


def merge_statistics_many(statistics):
    """Merge a sequence of statistics, left to right.

    Parameters
    ----------
    statistics : sequence of BatchNormStatistics
        At least one; all with the same number of channels.

    Returns
    -------
    BatchNormStatistics
        Statistics of the concatenation of all the tensors.  The fixed
        left-to-right order makes the result deterministic: the same list
        gives the same bits on every process.
    """
    items = list(statistics)
    if not items:
        raise ValueError("statistics: expected at least one BatchNormStatistics, got none")
    n, mean, m2 = _statistics_arg(items[0], "statistics[0]")
    mean, m2 = mean.copy(), m2.copy()
    for i, s in enumerate(items[1:], 1):
        nb, mb, qb = _statistics_arg(s, "statistics[%d]" % i, mean.shape[0])
        n, mean, m2 = _merge(n, mean, m2, nb, mb, qb)
    return BatchNormStatistics(n, mean, m2)


def batch_norm_apply(x, mean, variance, scale, offset, *, epsilon=1e-4, data_format="NHWC",
                     n_threads=None, out=None):
    """Normalize `x` with given per-channel statistics.

    ``y = scale * (x - mean) / sqrt(variance + epsilon) + offset``.

    Parameters
    ----------
    x : ndarray
        float32, float64, float16 or bfloat16 tensor laid out as `data_format`.
    mean, variance : ndarray
        Per-channel mean and biased variance, float64 of length C (float32 is
        accepted and widened exactly).  For batch statistics use
        ``stats.mean`` and ``stats.variance()``.
    scale, offset : ndarray
        Per-channel gamma and beta (float32 for float16 and bfloat16 x, else
        x's dtype).
    epsilon : float
        Added to the variance before the square root.
    data_format : {"NHWC", "NCHW", "NDHWC", "NCDHW", "NC"}
        Position of the channel axis.
    n_threads : int, optional
        OpenMP threads; None uses OpenMP's default.
    out : ndarray, optional
        Array of x's shape and dtype, C-contiguous, to write y into; may be
        `x` itself.

    Returns
    -------
    ndarray
        y, with x's shape and dtype.

    Notes
    -----
    With ``mean, variance`` from `batch_norm_statistics` (variance as
    ``m2 / count``) the result equals `fused_batch_norm`'s y bit for bit.
    """
    x, dt, vdt = _host_tensor(x, "x")
    layout, outer, channels, inner = _args.layout(data_format, x)
    mean = _stat_vector(mean, "mean", channels)
    variance = _stat_vector(variance, "variance", channels)
    scale = _args.vector(scale, "scale", channels, vdt)
    offset = _args.vector(offset, "offset", channels, vdt)
    eps = _args.epsilon(epsilon)
    nt = _args.threads(n_threads)
    y, dest = _result(out, x, (("x", x), ("scale", scale), ("offset", offset), ("mean", mean),
                               ("variance", variance)), ("x",))
    _kernels.apply(dt, layout, outer, channels, inner, nt, x, scale, offset, mean, variance,
                   eps, y)
    return _finish(y, dest)


def _grad_inputs(dy, x, mean, variance, epsilon, data_format, n_threads):
    x, dt, vdt = _host_tensor(x, "x")
    if type(dy) is not np.ndarray and _args.is_cupy(dy):
        raise TypeError("dy: the split kernels take NumPy arrays (host memory), got a CuPy array")
    dy = _args.as_array(dy, "dy")
    if dy.dtype != x.dtype:
        raise TypeError("dy: expected dtype %s to match x, got %s" % (x.dtype, dy.dtype))
    if dy.shape != x.shape:
        raise ValueError("dy: expected x's shape %s, got %s" % (x.shape, dy.shape))
    dy = _args.contiguous(dy)
    layout, outer, channels, inner = _args.layout(data_format, x)
    mean = _stat_vector(mean, "mean", channels)
    variance = _stat_vector(variance, "variance", channels)
    return (dy, x, dt, vdt, (layout, outer, channels, inner), mean, variance,
            _args.epsilon(epsilon), _args.threads(n_threads))


def batch_norm_grad_statistics(dy, x, mean, variance, *, epsilon=1e-4, data_format="NHWC",
                               n_threads=None):
    """Per-channel gradient sums ``sum(dy)`` and ``sum(dy * x_hat)``, in one pass.

    Parameters
    ----------
    dy : ndarray
        Gradient of the loss with respect to y; x's shape and dtype.
    x : ndarray
        The forward pass's input.
    mean, variance : ndarray
        The statistics the forward pass normalized with (float64 of length C;
        float32, e.g. the reserve spaces, is widened exactly).
    epsilon, data_format, n_threads
        As for `batch_norm_apply`; use the forward pass's values.

    Returns
    -------
    BatchNormGradStatistics
        ``(sum_dy, sum_dy_xhat)``, float64 arrays of length C, with
        ``x_hat = (x - mean) / sqrt(variance + epsilon)``.  They are
        `fused_batch_norm_grad`'s offset_backprop and scale_backprop; summed
        over every shard of a batch they are the whole batch's.  Both are 0
        for an empty `x`.
    """
    dy, x, dt, _, geo, mean, variance, eps, nt = _grad_inputs(
        dy, x, mean, variance, epsilon, data_format, n_threads)
    layout, outer, channels, inner = geo
    sum_dy = np.empty(channels, _F64)
    sum_dy_xhat = np.empty(channels, _F64)
    _kernels.grad_statistics(dt, layout, outer, channels, inner, nt, dy, x, mean, variance, eps,
                             sum_dy, sum_dy_xhat)
    return BatchNormGradStatistics(sum_dy, sum_dy_xhat)


def batch_norm_grad_apply(dy, x, scale, mean, variance, sum_dy, sum_dy_xhat, count, *,
                          epsilon=1e-4, data_format="NHWC", n_threads=None, out=None):
    """Training-mode x_backprop of (a shard of) a batch, from the whole batch's sums.

    ``dx = scale * r / count * (count * dy - sum_dy - x_hat * sum_dy_xhat)``
    with ``r = 1 / sqrt(variance + epsilon)`` and ``x_hat = (x - mean) * r``.

    Parameters
    ----------
    dy, x : ndarray
        This shard's gradient with respect to y and forward input.
    scale : ndarray
        Per-channel gamma (float32 for float16 and bfloat16 x, else x's dtype).
    mean, variance : ndarray
        The statistics the forward pass normalized with (float64 of length C;
        float32 is widened exactly).
    sum_dy, sum_dy_xhat : ndarray
        The whole batch's sums (from `batch_norm_grad_statistics`, added over
        every shard); float64 of length C (float32 is widened).
    count : int
        Elements per channel of the whole batch, at least this shard's.
    epsilon, data_format, n_threads
        As for `batch_norm_apply`.
    out : ndarray, optional
        Array of x's shape and dtype, C-contiguous, to write dx into; may be
        `dy` or `x` itself.

    Returns
    -------
    ndarray
        dx, with x's shape and dtype.

    Notes
    -----
    Given the forward pass's reserve spaces as mean and variance, the sums
    of `batch_norm_grad_statistics` and count = n, the result equals
    `fused_batch_norm_grad`'s x_backprop bit for bit.  With the float64 mean
    of `batch_norm_statistics` instead of the float32 reserve space it can
    differ by float32 rounding, since x_hat is then centred on a slightly
    different mean.
    """
    dy, x, dt, vdt, geo, mean, variance, eps, nt = _grad_inputs(
        dy, x, mean, variance, epsilon, data_format, n_threads)
    layout, outer, channels, inner = geo
    scale = _args.vector(scale, "scale", channels, vdt)
    sum_dy = _stat_vector(sum_dy, "sum_dy", channels)
    sum_dy_xhat = _stat_vector(sum_dy_xhat, "sum_dy_xhat", channels)
    n = _count(count, "count")
    if n < outer * inner:
        raise ValueError("count: expected the whole batch's elements per channel, at least "
                         "this x's %d, got %d" % (outer * inner, n))
    dx, dest = _result(out, x, (("dy", dy), ("x", x), ("scale", scale), ("mean", mean),
                                ("variance", variance), ("sum_dy", sum_dy),
                                ("sum_dy_xhat", sum_dy_xhat)), ("dy", "x"))
    _kernels.grad_apply(dt, layout, outer, channels, inner, nt, dy, x, scale, mean, variance,
                        eps, sum_dy, sum_dy_xhat, float(n), dx)
    return _finish(dx, dest)
