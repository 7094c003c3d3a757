"""Public functions: argument validation, output allocation, kernel calls."""
import math
import operator
from collections import namedtuple

import numpy as np

from . import _kernels

BatchNormOutput = namedtuple(
    "BatchNormOutput", ["y", "batch_mean", "batch_variance", "reserve_space_1", "reserve_space_2"])
BatchNormGrad = namedtuple("BatchNormGrad", ["x_backprop", "scale_backprop", "offset_backprop"])
# The gradient of a call with side_input= has a fourth output; without one the
# result stays TensorFlow's three fields.
BatchNormGradSide = namedtuple(
    "BatchNormGradSide", ["x_backprop", "scale_backprop", "offset_backprop", "side_input_backprop"])

# activation name -> (code of enum cfbn_activation, default alpha or None if it takes none)
ACTIVATIONS = {None: (0, None), "relu": (1, None), "relu6": (2, None),
               "leaky_relu": (3, 0.01), "elu": (4, 1.0), "sigmoid": (5, None),
               "tanh": (6, None), "silu": (7, None)}

# data_format -> (rank, channels first?).  NC's channel axis is 1 and last.
LAYOUTS = {"NHWC": (4, False), "NDHWC": (5, False), "NC": (2, False),
           "NCHW": (4, True), "NCDHW": (5, True)}
_CHANNELS_LAST, _CHANNELS_FIRST = 0, 1

# tensor dtype -> (kernel dtype code, dtype of the per-channel vectors)
_F32, _F64, _F16 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)
DTYPES = {_F32: (0, _F32), _F64: (1, _F64), _F16: (2, _F32)}


_kernels.set_result_types(BatchNormOutput, BatchNormGrad)


def _is_cupy(a):
    # By the type's module, so that CuPy is never imported for NumPy data.
    return type(a).__module__.startswith("cupy")


def _mixed(name, what="x"):
    return TypeError("%s: got a CuPy array, but %s is a NumPy array (host memory); pass every "
                     "array as NumPy, or every array as CuPy on one device" % (name, what))


def _as_array(a, name):
    if type(a) is np.ndarray:
        return a
    if isinstance(a, np.ma.MaskedArray):
        # Its data without the mask would be a different batch than the one
        # the caller means; masked batch norm is another operation.
        raise TypeError("%s: expected an array without a mask, got a numpy.ma.MaskedArray; "
                        "pass a.filled(...) or a.compressed() as meant" % name)
    if isinstance(a, np.ndarray):
        return a.view(np.ndarray)
    if _is_cupy(a):
        raise _mixed(name)
    if a is None or isinstance(a, (str, bytes, dict)):
        raise TypeError("%s: expected an array, got %s" % (name, type(a).__name__))
    try:
        return np.asarray(a)
    except Exception as exc:  # an object NumPy cannot read as an array
        raise TypeError("%s: expected an array, got %s (%s)" % (name, type(a).__name__, exc)) from None


def _contiguous(a):
    # A strided, reversed or misaligned view is read through one contiguous copy.
    flags = a.flags
    return a if flags.c_contiguous and flags.aligned else np.array(a, order="C")


def _tensor(x, name):
    """Validate the main tensor; returns (array, kernel dtype code, vector dtype)."""
    x = _as_array(x, name)
    kinds = _dtype_kinds(x.dtype, name)
    return _contiguous(x), kinds[0], kinds[1]


def _dtype_kinds(dtype, name):
    """(kernel dtype code, vector dtype) of a tensor dtype, or TypeError."""
    kinds = DTYPES.get(dtype)
    if kinds is None:
        raise TypeError("%s: expected float32, float64 or float16 (native byte order), got %s"
                        % (name, dtype))
    return kinds


def _data_format(data_format):
    """(rank, channels first?) of a data_format name, or ValueError."""
    try:
        return LAYOUTS[data_format]
    except (KeyError, TypeError):
        raise ValueError("data_format: expected one of %s, got %r"
                         % (", ".join(LAYOUTS), data_format)) from None


def _layout(data_format, x):
    """Returns (layout code, outer, channels, inner) for x under data_format."""
    rank, first = _data_format(data_format)
    shape = x.shape
    if len(shape) != rank:
        raise ValueError("x: data_format %r needs a %d-D tensor, got shape %s"
                         % (data_format, rank, shape))
    if first:
        inner = 1
        for d in shape[2:]:
            inner *= d
        return _CHANNELS_FIRST, shape[0], shape[1], inner
    outer = 1
    for d in shape[:-1]:
        outer *= d
    return _CHANNELS_LAST, outer, shape[-1], 1


def _vector(v, name, channels, dtype):
    v = _as_array(v, name)
    _check_vector(v, name, channels, dtype)
    return _contiguous(v)


def _check_vector(v, name, channels, dtype):
    if v.dtype != dtype:
        raise TypeError("%s: expected %s to match x, got %s" % (name, dtype, v.dtype))
    if v.shape != (channels,):
        raise ValueError("%s: expected shape (%d,) (one value per channel), got %s"
                         % (name, channels, v.shape))


def _real(value, name):
    """A real number as a float; strings, bools, complex numbers and other
    non-numbers are a TypeError (float() would parse "1e-3", which no caller
    means), a number beyond the float range a ValueError."""
    if isinstance(value, (str, bytes, bool, np.bool_, complex, np.complexfloating)):
        raise TypeError("%s: expected a real number, got %r" % (name, value))
    try:
        return float(value)
    except OverflowError:
        raise ValueError("%s: expected a value within the float range (|value| < 1.8e308), "
                         "got %s" % (name, _short(value))) from None
    except (TypeError, ValueError):
        raise TypeError("%s: expected a real number, got %r" % (name, value)) from None


def _short(value):
    # repr() of a huge int has hundreds of digits; an error message needs few.
    text = repr(value)
    return text if len(text) <= 40 else "%s... (%d characters)" % (text[:20], len(text))


def _flag(value, name):
    """A bool (Python's or NumPy's) as a bool; anything else is a TypeError:
    truthiness would read None as False and the string "False" as True."""
    if value is True or value is False:
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    raise TypeError("%s: expected a bool, got %r" % (name, value))


def _epsilon(epsilon):
    e = _real(epsilon, "epsilon")
    if not (e >= 0.0 and math.isfinite(e)):
        raise ValueError("epsilon: expected a finite value >= 0, got %r" % (epsilon,))
    return e


def _factor(exponential_avg_factor):
    factor = _real(exponential_avg_factor, "exponential_avg_factor")
    if not (0.0 <= factor <= 1.0):
        raise ValueError("exponential_avg_factor: expected a value in [0, 1], got %r"
                         % (exponential_avg_factor,))
    return factor


def _check_stats_given(training, factor, mean, variance):
    if ((not training) or factor != 1.0) and (mean is None or variance is None):
        missing = "mean" if mean is None else "variance"
        why = "is_training=False" if not training else "exponential_avg_factor != 1"
        raise ValueError("%s: required when %s" % (missing, why))


def _optional_stats(training, factor, mean, variance):
    """mean and variance, each None where it may be omitted (training with
    exponential_avg_factor 1) and was omitted or given as a zero-length array,
    as TensorFlow's and Keras' callers pass it."""
    if training and factor == 1.0:
        mean = None if _empty_vector(mean) else mean
        variance = None if _empty_vector(variance) else variance
    _check_stats_given(training, factor, mean, variance)
    return mean, variance


def _empty_vector(v):
    if isinstance(v, (list, tuple)):
        return len(v) == 0
    return getattr(v, "shape", None) == (0,)


def _activation(activation, alpha):
    """(activation code, alpha as a float) after checking both."""
    try:
        code, default = ACTIVATIONS[activation]
    except (KeyError, TypeError):
        names = ", ".join(repr(k) for k in ACTIVATIONS)
        raise ValueError("activation: expected one of %s, got %r" % (names, activation)) from None
    if default is None:
        if alpha is not None:
            raise ValueError("alpha: only leaky_relu and elu take alpha, got alpha=%r with "
                             "activation=%r" % (alpha, activation))
        return code, 0.0
    if alpha is None:
        return code, default
    a = _real(alpha, "alpha")
    if not math.isfinite(a):
        raise ValueError("alpha: expected a finite value, got %r" % (alpha,))
    return code, a


def _side_input(side_input, x):
    side = _as_array(side_input, "side_input")
    _check_side_input(side, x)
    return _contiguous(side)


def _check_side_input(side, x):
    if side.dtype != x.dtype:
        raise TypeError("side_input: expected dtype %s to match x, got %s" % (x.dtype, side.dtype))
    if side.shape != x.shape:
        raise ValueError("side_input: expected x's shape %s, got %s" % (x.shape, side.shape))


def _check_offset_given(act, offset):
    if act and offset is None:
        raise ValueError("offset: required when activation is set (the gradient recomputes "
                         "the pre-activation from it)")


def _check_dy(dy, x):
    if dy.dtype != x.dtype:
        raise TypeError("y_backprop: expected dtype %s to match x, got %s" % (x.dtype, dy.dtype))
    if dy.shape != x.shape:
        raise ValueError("y_backprop: expected x's shape %s, got %s" % (x.shape, dy.shape))


def _index(value, name, expected="an int"):
    """`value` as a Python int; a bool, float or other type is a TypeError
    naming the argument."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError("%s: expected %s, got bool" % (name, expected))
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError("%s: expected %s, got %r" % (name, expected, value)) from None


def _threads(n_threads):
    if n_threads is None:
        return 0
    n = _index(n_threads, "n_threads", "an int or None")
    if n < 1:
        raise ValueError("n_threads: expected at least 1, got %d" % n)
    if n > 1024:
        raise ValueError("n_threads: expected at most 1024, got %d" % n)
    return n


# Outputs that may be the very memory of an input: updates the kernels make
# in place because they read each element (or channel) of that input before
# they write the output's.  Any other output that touches an input's memory,
# even exactly, would be written before the input is read.
FORWARD_IN_PLACE = frozenset([("y", "x"), ("y", "side_input"), ("batch_mean", "mean"),
                              ("batch_variance", "variance")])
GRAD_IN_PLACE = frozenset([("x_backprop", "y_backprop"), ("x_backprop", "x"),
                           ("side_input_backprop", "y_backprop")])


def _outputs(out, fields, specs, inputs, in_place=frozenset()):
    """Allocate or check the output arrays.

    `specs` gives (shape, dtype) per field; each caller's array is checked by
    `_given_output`, and no two of them may share memory.

    Returns (arrays, write_back): the arrays to hand the kernels, one per
    field, and (caller's array, temporary) pairs for `_write_back` once the
    kernels have run.
    """
    if out is None:
        return [_kernels.empty_output(shape, dtype) for shape, dtype in specs], ()
    given = _out_given(out, fields)
    result, write_back, checked = [], [], []
    for field, (shape, dtype), a in zip(fields, specs, given):
        if a is None:
            result.append(_kernels.empty_output(shape, dtype))
            continue
        name = "out[%r]" % field
        target = _given_output(a, name, field, shape, dtype, inputs, in_place)
        for prev_field, prev in checked:
            if _kernels.touches(a, prev):
                raise ValueError("%s: shares memory with out[%r]" % (name, prev_field))
        checked.append((field, a))
        if target is not a:
            write_back.append((a, target))
        result.append(target)
    return result, write_back


def _given_output(a, name, field, shape, dtype, inputs, in_place):
    """Check a caller's output array; returns the array the kernels write.

    `a` must be an ndarray of exactly that shape and dtype, C-contiguous and
    writeable.  Its memory must not meet an input's (name, array), except
    that a (field, input name) pair of `in_place` may be the same memory, of
    the same shape and dtype.  An array not aligned to its dtype is computed
    in an aligned temporary, returned instead (the kernels store whole
    elements, and SIMD stores would fault on such an address), as a
    misaligned input is read through an aligned copy.
    """
    if not isinstance(a, np.ndarray):
        if _is_cupy(a):
            raise _mixed(name, "the input x")
        raise TypeError("%s: expected a numpy array, got %s" % (name, type(a).__name__))
    _check_out_array(a, name, shape, dtype)
    if not a.flags.writeable:
        raise ValueError("%s: array is read-only" % name)
    for iname, b in inputs:
        if b is not None:
            _check_alias(name, field, a, iname, b, in_place,
                         _kernels.touches(a, b), _kernels.overlaps(a, b))
    return a if a.flags.aligned else _kernels.empty_output(shape, dtype)


def _check_alias(name, field, a, iname, b, in_place, touches, partial):
    """The rule for output `a` against input `b`, given whether their memory
    meets (touches) and whether it meets without being the same range."""
    if not touches:
        return
    if partial:
        raise ValueError("%s: partly overlaps input %s; pass the same array for an "
                         "in-place call or a separate one" % (name, iname))
    if (field, iname) in in_place and a.shape == b.shape and a.dtype == b.dtype:
        return
    allowed = sorted(i for f, i in in_place if f == field)
    raise ValueError("%s: is the memory of input %s, which is read after this output is "
                     "written; pass a separate array%s"
                     % (name, iname, " (it may be %s itself)" % " or ".join(allowed)
                        if allowed else ""))


def _write_back(arrays, pairs):
    """Copy the outputs computed in temporaries into the caller's arrays;
    returns `arrays` with the caller's arrays in place of the temporaries."""
    for dest, tmp in pairs:
        np.copyto(dest, tmp)
    caller = {id(tmp): dest for dest, tmp in pairs}
    return [caller.get(id(a), a) for a in arrays]


def _out_given(out, fields):
    """The caller's out= as one entry (an array or None) per field."""
    if isinstance(out, dict):
        unknown = set(out) - set(fields)
        if unknown:
            raise ValueError("out: unknown output name(s) %s; expected some of %s"
                             % (sorted(unknown), ", ".join(fields)))
        return [out.get(f) for f in fields]
    if isinstance(out, (tuple, list)):
        if len(out) != len(fields):
            raise ValueError("out: expected %d entries (%s), got %d"
                             % (len(fields), ", ".join(fields), len(out)))
        return list(out)
    raise TypeError("out: expected a tuple, list or dict of arrays, got %s" % type(out).__name__)


def _check_out_array(a, name, shape, dtype):
    if a.dtype != dtype:
        raise TypeError("%s: expected dtype %s, got %s" % (name, dtype, a.dtype))
    if a.shape != tuple(shape):
        raise ValueError("%s: expected shape %s, got %s" % (name, tuple(shape), a.shape))
    if not a.flags.c_contiguous:
        raise ValueError("%s: expected a C-contiguous array" % name)


def fused_batch_norm(x, scale, offset, mean=None, variance=None, *, epsilon=1e-4,
                     exponential_avg_factor=1.0, data_format="NHWC", is_training=True,
                     n_threads=None, out=None, activation=None, alpha=None, side_input=None):
    """Batch normalization of `x`, forward, as TensorFlow's FusedBatchNormV3.

    Parameters
    ----------
    x : ndarray
        float32, float64 or float16 tensor laid out as `data_format`.
    scale, offset : ndarray
        Per-channel gamma and beta, 1-D of length C (float32 for float16 x,
        else x's dtype).
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
    if activation is None and alpha is None and side_input is None:
        result = _kernels.fast_forward(x, scale, offset, mean, variance, epsilon,
                                       exponential_avg_factor, data_format, is_training,
                                       n_threads, out)
        if result is not None:
            return result
    if type(x) is not np.ndarray and _is_cupy(x):
        from . import _gpu
        return _gpu.forward(x, scale, offset, mean, variance, epsilon, exponential_avg_factor,
                            data_format, is_training, n_threads, out, activation, alpha,
                            side_input)
    x, dt, vdt = _tensor(x, "x")
    layout, outer, channels, inner = _layout(data_format, x)
    scale = _vector(scale, "scale", channels, vdt)
    offset = _vector(offset, "offset", channels, vdt)
    eps = _epsilon(epsilon)
    factor = _factor(exponential_avg_factor)
    training = _flag(is_training, "is_training")
    mean, variance = _optional_stats(training, factor, mean, variance)
    if mean is not None:
        mean = _vector(mean, "mean", channels, vdt)
    if variance is not None:
        variance = _vector(variance, "variance", channels, vdt)
    act, act_alpha = _activation(activation, alpha)
    side = _side_input(side_input, x) if side_input is not None else None
    fusion = (act, act_alpha, side, None, None) if act or side is not None else None
    nt = _threads(n_threads)
    vshape = (channels,)
    (y, bm, bv, rs1, rs2), write_back = _outputs(
        out, BatchNormOutput._fields,
        ((x.shape, x.dtype), (vshape, vdt), (vshape, vdt), (vshape, vdt), (vshape, vdt)),
        (("x", x), ("scale", scale), ("offset", offset), ("mean", mean), ("variance", variance),
         ("side_input", side)), FORWARD_IN_PLACE)
    if training:
        _kernels.forward_training(dt, layout, outer, channels, inner, nt, x, scale, offset,
                                  mean if factor != 1.0 else None,
                                  variance if factor != 1.0 else None,
                                  eps, factor, y, bm, bv, rs1, rs2, fusion)
    else:
        _kernels.forward_inference(dt, layout, outer, channels, inner, nt, x, scale, offset,
                                   mean, variance, eps, y, bm, bv, rs1, rs2, fusion)
    if write_back:
        y, bm, bv, rs1, rs2 = _write_back((y, bm, bv, rs1, rs2), write_back)
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
    if activation is None and side_input is None and alpha is None:
        result = _kernels.fast_backward(y_backprop, x, scale, reserve_space_1, reserve_space_2,
                                        epsilon, data_format, is_training, n_threads, out)
        if result is not None:
            return result
    if type(x) is not np.ndarray and _is_cupy(x):
        from . import _gpu
        return _gpu.backward(y_backprop, x, scale, reserve_space_1, reserve_space_2, epsilon,
                             data_format, is_training, n_threads, out, offset, activation,
                             alpha, side_input)
    x, dt, vdt = _tensor(x, "x")
    dy = _as_array(y_backprop, "y_backprop")
    _check_dy(dy, x)
    dy = _contiguous(dy)
    layout, outer, channels, inner = _layout(data_format, x)
    scale = _vector(scale, "scale", channels, vdt)
    mu = _vector(reserve_space_1, "reserve_space_1", channels, vdt)
    var = _vector(reserve_space_2, "reserve_space_2", channels, vdt)
    eps = _epsilon(epsilon)
    training = _flag(is_training, "is_training")
    act, act_alpha = _activation(activation, alpha)
    _check_offset_given(act, offset)
    if offset is not None:
        offset = _vector(offset, "offset", channels, vdt)
    side = _side_input(side_input, x) if side_input is not None else None
    nt = _threads(n_threads)
    vshape = (channels,)
    result_type = BatchNormGradSide if side is not None else BatchNormGrad
    specs = ((x.shape, x.dtype), (vshape, vdt), (vshape, vdt), (x.shape, x.dtype))
    outs, write_back = _outputs(
        out, result_type._fields, specs[:len(result_type._fields)],
        (("y_backprop", dy), ("x", x), ("scale", scale), ("reserve_space_1", mu),
         ("reserve_space_2", var), ("offset", offset), ("side_input", side)), GRAD_IN_PLACE)
    dx, dscale, doffset = outs[:3]
    fusion = None
    if act or side is not None:
        fusion = (act, act_alpha, side, offset, outs[3] if side is not None else None)
    _kernels.backward(dt, layout, outer, channels, inner, nt, training, dy, x, scale,
                      mu, var, eps, dx, dscale, doffset, fusion)
    if write_back:
        outs = _write_back(outs, write_back)
    return result_type(*outs)


def runtime_info():
    """What this process runs: version, ISAs, the selected table, OpenMP.

    Returns
    -------
    dict
        ``version``, ``compiled_isas``, ``supported_isas``, ``selected_isa``,
        ``openmp`` (bool), ``max_threads`` (threads used when n_threads is None),
        ``forked_child`` (True in the child of a ``fork()``, where every call
        runs on one thread) and ``output_cache_limit``.
    """
    from . import __version__
    return {
        "version": __version__,
        "compiled_isas": _kernels.compiled_isas(),
        "supported_isas": _kernels.supported_isas(),
        "selected_isa": _kernels.selected_isa(),
        "openmp": _kernels.openmp_enabled(),
        "max_threads": _kernels.max_threads(),
        "forked_child": _kernels.forked_child(),
        "output_cache_limit": _kernels.output_cache_stats()["limit"],
    }


def output_cache_info():
    """What the output cache holds and has done.

    Outputs of at least ``min_bytes`` (32 MiB) that cfbn allocates are made
    through a cache: when such an array is freed, its buffer is kept (up to
    ``limit`` bytes in all, oldest dropped first) and the next output of the
    same size reuses it.  A fresh buffer that large is a new memory mapping,
    which the OS faults in and zeroes on first touch, at about the cost of a
    whole normalization pass.  Pass ``out=`` arrays to avoid allocation
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
    n = _index(nbytes, "nbytes")
    if n < 0:
        raise ValueError("nbytes: expected 0 or more, got %d" % n)
    if n >= 1 << 63:
        raise ValueError("nbytes: expected less than 2**63, got %d" % n)
    return _kernels.set_output_cache_limit(n)


def release_output_cache():
    """Free every buffer the output cache holds (the limit is unchanged)."""
    _kernels.release_output_cache()
