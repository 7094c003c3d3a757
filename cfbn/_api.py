"""Public functions: the validation call, output allocation, array-type dispatch.

The argument rules are cfbn._args's; this module calls them and the kernels.
"""
import numpy as np

from . import _args, _kernels
from ._args import BatchNormGrad, BatchNormGradGrad, BatchNormGradSide, BatchNormOutput
from ._version import __version__


def fused_batch_norm(x, scale, offset, mean=None, variance=None, *, epsilon=1e-4,
                     exponential_avg_factor=1.0, data_format="NHWC", is_training=True,
                     n_threads=None, out=None, activation=None, alpha=None, side_input=None):
    """Batch normalization of `x`, forward, as TensorFlow's FusedBatchNormV3.

    Parameters
    ----------
    x : ndarray
        float32, float64, float16 or bfloat16 (``ml_dtypes.bfloat16``) tensor
        laid out as `data_format`.
    scale, offset : ndarray
        Per-channel gamma and beta, 1-D of length C (float32 for float16 and
        bfloat16 x, else x's dtype).
    mean, variance : ndarray, optional
        Running (population) statistics.  Required when `is_training` is False,
        and in training when `exponential_avg_factor` is not 1.
    epsilon : float
        Added to the variance before the square root.
    exponential_avg_factor : float
        Weight f of this batch in the running statistics (0 <= f <= 1).
    data_format : {"NHWC", "NCHW", "NDHWC", "NCDHW", "NC"}
        Position of the channel axis.
    is_training : bool
        Normalize with the batch statistics (True) or with `mean`/`variance`.
    n_threads : int, optional
        OpenMP threads; None uses OpenMP's default.  Results do not depend on it.
    out : tuple, list or dict, optional
        Preallocated outputs (some or all), written in place and returned.
    activation : {None, "relu", "relu6", "leaky_relu", "elu", "sigmoid", "tanh", "silu"}
        Applied to the normalized value in the same pass that writes y.
    alpha : float, optional
        leaky_relu's negative slope (default 0.01) or elu's scale (default
        1.0); an error for the other activations.
    side_input : ndarray, optional
        A tensor of x's shape and dtype added before the activation:
        ``y = act(scale * (x - mean) / sqrt(variance + epsilon) + offset + side_input)``
        (a residual connection, as cuDNN's BN-add-activation).  y may be this
        very array (computed in place).

    Returns
    -------
    BatchNormOutput
        ``(y, batch_mean, batch_variance, reserve_space_1, reserve_space_2)``:
        y has x's shape and dtype; in training batch_mean and batch_variance
        are the updated running statistics (Bessel-corrected variance) and the
        reserve spaces hold the batch mean and biased variance; in inference
        all four repeat `mean` and `variance`.

    Notes
    -----
    A non-contiguous input is read through one contiguous copy.  CuPy arrays
    (all on one device) run on that GPU and give CuPy arrays; `n_threads` is
    then checked but has no effect.
    """
    result = _kernels.fast_forward(x, scale, offset, mean, variance, epsilon,
                                   exponential_avg_factor, data_format, is_training, n_threads,
                                   out, activation, alpha, side_input)
    if result is not None:
        return result
    return _forward(x, scale, offset, mean, variance, epsilon, exponential_avg_factor,
                    data_format, is_training, n_threads, out, activation, alpha, side_input)


def _forward(x, scale, offset, mean, variance, epsilon, exponential_avg_factor, data_format,
             is_training, n_threads, out, activation, alpha, side_input):
    """fused_batch_norm through the validator: every call the fast path
    does not take, and every error."""
    if type(x) is not np.ndarray and _args.is_cupy(x):
        from . import _gpu
        return _gpu.forward(x, scale, offset, mean, variance, epsilon, exponential_avg_factor,
                            data_format, is_training, n_threads, out, activation, alpha,
                            side_input)
    x, dt, vdt = _args.tensor(x, "x")
    layout, outer, channels, inner = _args.layout(data_format, x)
    scale = _args.vector(scale, "scale", channels, vdt)
    offset = _args.vector(offset, "offset", channels, vdt)
    eps = _args.epsilon(epsilon)
    factor = _args.factor(exponential_avg_factor)
    training = _args.flag(is_training, "is_training")
    mean, variance = _args.optional_stats(training, factor, mean, variance)
    if mean is not None:
        mean = _args.vector(mean, "mean", channels, vdt)
    if variance is not None:
        variance = _args.vector(variance, "variance", channels, vdt)
    act, act_alpha = _args.activation(activation, alpha)
    side = _args.side_input(side_input, x) if side_input is not None else None
    fusion = (act, act_alpha, side, None, None) if act or side is not None else None
    nt = _args.threads(n_threads)
    vshape = (channels,)
    (y, bm, bv, rs1, rs2), write_back = _args.outputs(
        out, BatchNormOutput._fields,
        ((x.shape, x.dtype), (vshape, vdt), (vshape, vdt), (vshape, vdt), (vshape, vdt)),
        (("x", x), ("scale", scale), ("offset", offset), ("mean", mean), ("variance", variance),
         ("side_input", side)), _args.FORWARD_IN_PLACE)
    if training:
        _kernels.forward_training(dt, layout, outer, channels, inner, nt, x, scale, offset,
                                  mean if factor != 1.0 else None,
                                  variance if factor != 1.0 else None,
                                  eps, factor, y, bm, bv, rs1, rs2, fusion)
    else:
        _kernels.forward_inference(dt, layout, outer, channels, inner, nt, x, scale, offset,
                                   mean, variance, eps, y, bm, bv, rs1, rs2, fusion)
    if write_back:
        y, bm, bv, rs1, rs2 = _args.write_back((y, bm, bv, rs1, rs2), write_back)
    return BatchNormOutput(y, bm, bv, rs1, rs2)


def fused_batch_norm_grad(y_backprop, x, scale, reserve_space_1, reserve_space_2, *,
                          epsilon=1e-4, data_format="NHWC", is_training=True, n_threads=None,
                          out=None, offset=None, activation=None, alpha=None, side_input=None):
    """Gradient of batch normalization, as TensorFlow's FusedBatchNormGradV3.

    Parameters
    ----------
    y_backprop : ndarray
        Gradient of the loss with respect to y; x's shape and dtype.
    x : ndarray
        The forward pass's input.
    scale : ndarray
        Per-channel gamma, 1-D of length C.
    reserve_space_1, reserve_space_2 : ndarray
        In training, the forward pass's reserve spaces (batch mean and biased
        variance); in inference, the population mean and variance.
    epsilon, data_format, is_training, n_threads
        As for `fused_batch_norm`; use the forward pass's values.
    out : tuple, list or dict, optional
        Preallocated outputs (some or all), written in place and returned;
        with `side_input` it has the fourth field ``side_input_backprop``.
    offset : ndarray, optional
        The forward pass's per-channel beta; required with an `activation`
        (the pre-activation is recomputed from x, the statistics, scale and
        offset: no mask or workspace is kept between the passes).
    activation, alpha, side_input
        The forward pass's values.  With an activation, y_backprop is first
        multiplied by act'(pre-activation); act'(0) is 0 for relu and relu6
        (and relu6'(6) = 0), alpha for leaky_relu and elu, as TensorFlow and
        PyTorch define them.

    Returns
    -------
    BatchNormGrad or BatchNormGradSide
        ``(x_backprop, scale_backprop, offset_backprop)``; with `side_input`,
        a BatchNormGradSide with ``side_input_backprop = y_backprop * act'``
        as a fourth field.

    Notes
    -----
    CuPy arrays (all on one device) run on that GPU and give CuPy arrays.
    """
    result = _kernels.fast_backward(y_backprop, x, scale, reserve_space_1, reserve_space_2,
                                    epsilon, data_format, is_training, n_threads, out, offset,
                                    activation, alpha, side_input)
    if result is not None:
        return result
    return _backward(y_backprop, x, scale, reserve_space_1, reserve_space_2, epsilon,
                     data_format, is_training, n_threads, out, offset, activation, alpha,
                     side_input)


def _backward(y_backprop, x, scale, reserve_space_1, reserve_space_2, epsilon, data_format,
              is_training, n_threads, out, offset, activation, alpha, side_input):
    """fused_batch_norm_grad through the validator: every call the fast
    path does not take, and every error."""
    if type(x) is not np.ndarray and _args.is_cupy(x):
        from . import _gpu
        return _gpu.backward(y_backprop, x, scale, reserve_space_1, reserve_space_2, epsilon,
                             data_format, is_training, n_threads, out, offset, activation,
                             alpha, side_input)
    x, dt, vdt = _args.tensor(x, "x")
    dy = _args.as_array(y_backprop, "y_backprop")
    _args.check_dy(dy, x)
    dy = _args.contiguous(dy)
    layout, outer, channels, inner = _args.layout(data_format, x)
    scale = _args.vector(scale, "scale", channels, vdt)
    mu = _args.vector(reserve_space_1, "reserve_space_1", channels, vdt)
    var = _args.vector(reserve_space_2, "reserve_space_2", channels, vdt)
    eps = _args.epsilon(epsilon)
    training = _args.flag(is_training, "is_training")
    act, act_alpha = _args.activation(activation, alpha)
    _args.check_offset_given(act, offset)
    if offset is not None:
        offset = _args.vector(offset, "offset", channels, vdt)
    side = _args.side_input(side_input, x) if side_input is not None else None
    nt = _args.threads(n_threads)
    vshape = (channels,)
    result_type = BatchNormGradSide if side is not None else BatchNormGrad
    specs = ((x.shape, x.dtype), (vshape, vdt), (vshape, vdt), (x.shape, x.dtype))
    outs, write_back = _args.outputs(
        out, result_type._fields, specs[:len(result_type._fields)],
        (("y_backprop", dy), ("x", x), ("scale", scale), ("reserve_space_1", mu),
         ("reserve_space_2", var), ("offset", offset), ("side_input", side)), _args.GRAD_IN_PLACE)
    dx, dscale, doffset = outs[:3]
    fusion = None
    if act or side is not None:
        fusion = (act, act_alpha, side, offset, outs[3] if side is not None else None)
    _kernels.backward(dt, layout, outer, channels, inner, nt, training, dy, x, scale,
                      mu, var, eps, dx, dscale, doffset, fusion)
    if write_back:
        outs = _args.write_back(outs, write_back)
    return result_type(*outs)


def fused_batch_norm_grad_grad(y_backprop, x, scale, reserve_space_1, reserve_space_2,
                               grad_x_backprop, grad_scale_backprop=None,
                               grad_offset_backprop=None, *, epsilon=1e-4, data_format="NHWC",
                               is_training=True, n_threads=None, out=None):
    """Second-order gradient of batch normalization: the gradient of the gradient.

    With ``(x_backprop, scale_backprop, offset_backprop) =
    fused_batch_norm_grad(y_backprop, x, scale, reserve_space_1,
    reserve_space_2, ...)`` and upstream gradients ``ggx``, ``ggscale`` and
    ``ggoffset`` of those three outputs, returns the derivatives of ``L =
    sum(ggx * x_backprop) + sum(ggscale * scale_backprop) + sum(ggoffset *
    offset_backprop)`` with respect to `y_backprop`, `x` and `scale`: the
    backward pass of `fused_batch_norm_grad` itself, as a gradient penalty,
    second-order MAML or a Hessian-vector product needs it.  In training the
    batch statistics (the reserve spaces) depend on `x` and are
    differentiated through; in inference they are constants.

    Parameters
    ----------
    y_backprop, x, scale, reserve_space_1, reserve_space_2
        The inputs of the `fused_batch_norm_grad` call being differentiated.
    grad_x_backprop : ndarray or None
        ggx, x's shape and dtype; None means zeros.
    grad_scale_backprop, grad_offset_backprop : ndarray, optional
        ggscale and ggoffset, per-channel vectors as `scale`; None means zeros.
    epsilon, data_format, is_training, n_threads
        As for `fused_batch_norm_grad`; use the same values.
    out : tuple, list or dict, optional
        Preallocated outputs (some or all), written in place and returned.
        They may not share memory with any input.

    Returns
    -------
    BatchNormGradGrad
        ``(y_backprop_backprop, x_backprop, scale_backprop)``: x's shape and
        dtype for the first two, `scale`'s for the third.

    Notes
    -----
    Training mode is two passes over the tensors: five per-channel sums
    (of dy, dy * (x - mean), ggx, ggx * (x - mean) and ggx * dy), then one
    pass that writes both tensor outputs.  Results do not depend on
    `n_threads`.  No activation or side input is taken.  CuPy arrays run on
    their GPU and give CuPy arrays.
    """
    result = _kernels.fast_grad_grad(y_backprop, x, scale, reserve_space_1, reserve_space_2,
                                     grad_x_backprop, grad_scale_backprop, grad_offset_backprop,
                                     epsilon, data_format, is_training, n_threads, out)
    if result is not None:
        return result
    return _grad_grad(y_backprop, x, scale, reserve_space_1, reserve_space_2, grad_x_backprop,
                      grad_scale_backprop, grad_offset_backprop, epsilon, data_format,
                      is_training, n_threads, out)


def _grad_grad(y_backprop, x, scale, reserve_space_1, reserve_space_2, grad_x_backprop,
               grad_scale_backprop, grad_offset_backprop, epsilon, data_format, is_training,
               n_threads, out):
    """fused_batch_norm_grad_grad through the validator: every call the
    fast path does not take, and every error."""
    if type(x) is not np.ndarray and _args.is_cupy(x):
        from . import _gpu
        return _gpu.grad_grad(y_backprop, x, scale, reserve_space_1, reserve_space_2,
                              grad_x_backprop, grad_scale_backprop, grad_offset_backprop,
                              epsilon, data_format, is_training, n_threads, out)
    x, dt, vdt = _args.tensor(x, "x")
    dy = _args.as_array(y_backprop, "y_backprop")
    _args.check_dy(dy, x)
    dy = _args.contiguous(dy)
    ggx = None
    if grad_x_backprop is not None:
        ggx = _args.as_array(grad_x_backprop, "grad_x_backprop")
        _args.check_like_x(ggx, x, "grad_x_backprop")
        ggx = _args.contiguous(ggx)
    layout, outer, channels, inner = _args.layout(data_format, x)
    scale = _args.vector(scale, "scale", channels, vdt)
    mu = _args.vector(reserve_space_1, "reserve_space_1", channels, vdt)
    var = _args.vector(reserve_space_2, "reserve_space_2", channels, vdt)
    ggs = None
    if grad_scale_backprop is not None:
        ggs = _args.vector(grad_scale_backprop, "grad_scale_backprop", channels, vdt)
    ggo = None
    if grad_offset_backprop is not None:
        ggo = _args.vector(grad_offset_backprop, "grad_offset_backprop", channels, vdt)
    eps = _args.epsilon(epsilon)
    training = _args.flag(is_training, "is_training")
    nt = _args.threads(n_threads)
    vshape = (channels,)
    outs, write_back = _args.outputs(
        out, BatchNormGradGrad._fields,
        ((x.shape, x.dtype), (x.shape, x.dtype), (vshape, vdt)),
        (("y_backprop", dy), ("x", x), ("scale", scale), ("reserve_space_1", mu),
         ("reserve_space_2", var), ("grad_x_backprop", ggx), ("grad_scale_backprop", ggs),
         ("grad_offset_backprop", ggo)))
    ddy, dx, dscale = outs
    _kernels.backward_backward(dt, layout, outer, channels, inner, nt, training, dy, x, scale,
                               mu, var, eps, ggx, ggs, ggo, ddy, dx, dscale)
    if write_back:
        outs = _args.write_back(outs, write_back)
    return BatchNormGradGrad(*outs)


def runtime_info():
    """What this process runs: version, ISAs, the selected table, OpenMP.

    Returns
    -------
    dict
        ``version``, ``compiled_isas``, ``supported_isas``, ``selected_isa``,
        ``family_isas`` (the ISA each loop family runs on: ``selected_isa``'s
        for every family, except on a CPU that ``cpu_row`` names, where the
        default runs some from the ISA measured faster for them there; a
        forced ISA runs every family), ``cpu_row`` (or None), ``openmp``
        (bool), ``max_threads`` (threads used when n_threads is None),
        ``forked_child`` (True in the child of a ``fork()``, where every call
        runs on one thread), ``output_cache_limit`` and ``l2_cache_bytes`` (one
        core's L2 cache as the OS reports it, 0 if it does not; the router
        chooses how channels-first gradients walk memory by it), ``verbose``
        (whether the route trace is on: `set_verbose`).
    """
    return {
        "version": __version__,
        "compiled_isas": _kernels.compiled_isas(),
        "supported_isas": _kernels.supported_isas(),
        "selected_isa": _kernels.selected_isa(),
        "family_isas": _kernels.family_isas(),
        "cpu_row": _kernels.cpu_row(),
        "openmp": _kernels.openmp_enabled(),
        "max_threads": _kernels.max_threads(),
        "forked_child": _kernels.forked_child(),
        "output_cache_limit": _kernels.output_cache_stats()["limit"],
        "l2_cache_bytes": _kernels.l2_cache_bytes(),
        "verbose": _kernels.trace_enabled(),
    }


def set_verbose(on):
    """Trace every kernel call: one line on stderr per call, after it.

    The line is ``cfbn-trace`` followed by ``key=value`` fields: ``op``
    (forward_training, forward_inference, backward_training,
    backward_inference, backward_backward, statistics, apply,
    grad_statistics, grad_apply), ``dtype``, ``layout`` (channels_first or
    channels_last), the shape as the kernels see it (``outer``, ``channels``,
    ``inner``), ``act`` and ``side`` (the fused activation and whether a side
    input is added), ``table`` (the ISA table that ran), ``family`` (plain,
    plain_float16, plain_bfloat16, relu_family, exp_family, second_order),
    ``strategy`` (how the plan walks the tensor: rows, planes, pieces,
    channels or per_channel), ``threads``, ``us`` (the call's time) and ``rc`` (0, or
    the C driver's error code).  ``CFBN_VERBOSE=1`` turns it on at import.
    It traces every entrance's calls (NumPy, the split functions,
    cfbn.torch's operators); CuPy calls run no driver and print nothing.

    Parameters
    ----------
    on : bool
        Whether to trace.

    Returns
    -------
    bool
        Whether the trace was on before.
    """
    return _kernels.set_trace(bool(on))


def output_cache_info():
    """What the output cache holds and has done.

    Outputs of at least ``min_bytes`` (1 MiB) that cfbn allocates are made
    through a cache: when such an array is freed, its buffer is kept (up to
    ``limit`` bytes in all, oldest dropped first) and the next output of the
    same size reuses it.  A fresh buffer that large is memory the OS faults
    in and zeroes on first touch (glibc maps it anew or trims it from the
    heap when freed), at about the cost of a whole normalization pass.  Pass ``out=`` arrays to avoid allocation
    altogether.

    Returns
    -------
    dict
        ``limit``, ``held_bytes``, ``held_buffers``, ``min_bytes``, and the
        counts ``hits`` (outputs served from the cache) and ``misses``.
    """
    return _kernels.output_cache_stats()


def set_output_cache_limit(nbytes):
    """Set how many bytes of freed output buffers the cache may keep.

    The default is ``CFBN_OUTPUT_CACHE_MB`` MiB when that variable is set at
    import, else 1/16 of the machine's memory, at most 1 GiB.  0 turns the
    cache off.  Buffers beyond a lower limit are freed at once.

    Parameters
    ----------
    nbytes : int
        The new limit in bytes, 0 or more.

    Returns
    -------
    int
        The previous limit.
    """
    n = _args.index(nbytes, "nbytes")
    if n < 0:
        raise ValueError("nbytes: expected 0 or more, got %d" % n)
    if n >= 1 << 63:
        raise ValueError("nbytes: expected less than 2**63, got %d" % n)
    return _kernels.set_output_cache_limit(n)


def release_output_cache():
    """Free every buffer the output cache holds (the limit is unchanged)."""
    _kernels.release_output_cache()
