"""Argument tables and validation: the one place the argument rules live.

Every entry point (the NumPy and CuPy calls, the split kernels,
cfbn.distributed, BatchNorm, fold_batch_norm) checks its arguments with these
functions, and the Cython fast paths take their tables from here; they only
recognize a call these rules accept and leave every other call, and every
error message, to this module.
"""
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
BatchNormGradGrad = namedtuple(
    "BatchNormGradGrad", ["y_backprop_backprop", "x_backprop", "scale_backprop"])

# activation name -> (code of enum cfbn_activation, default alpha or None if it takes none)
ACTIVATIONS = {None: (0, None), "relu": (1, None), "relu6": (2, None),
               "leaky_relu": (3, 0.01), "elu": (4, 1.0), "sigmoid": (5, None),
               "tanh": (6, None), "silu": (7, None)}

# data_format -> (rank, channels first?).  NC's channel axis is 1 and last.
LAYOUTS = {"NHWC": (4, False), "NDHWC": (5, False), "NC": (2, False),
           "NCHW": (4, True), "NCDHW": (5, True)}
CHANNELS_LAST, CHANNELS_FIRST = 0, 1

# tensor dtype -> (kernel dtype code, dtype of the per-channel vectors).
# bfloat16 (code 3) joins on first sight: see bfloat16_kinds.
_F32, _F64, _F16 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)
DTYPES = {_F32: (0, _F32), _F64: (1, _F64), _F16: (2, _F32)}
BF16_KINDS = (3, _F32)


def is_cupy(a):
    # By the type's module, so that CuPy is never imported for NumPy data.
    return type(a).__module__.startswith("cupy")


def mixed(name, what="x"):
    return TypeError("%s: got a CuPy array, but %s is a NumPy array (host memory); pass every "
                     "array as NumPy, or every array as CuPy on one device" % (name, what))


def as_array(a, name):
    if type(a) is np.ndarray:
        return a
    if isinstance(a, np.ma.MaskedArray):
        # Its data without the mask would be a different batch than the one
        # the caller means; masked batch norm is another operation.
        raise TypeError("%s: expected an array without a mask, got a numpy.ma.MaskedArray; "
                        "pass a.filled(...) or a.compressed() as meant" % name)
    if isinstance(a, np.ndarray):
        return a.view(np.ndarray)
    if is_cupy(a):
        raise mixed(name)
    if a is None or isinstance(a, (str, bytes, dict)):
        raise TypeError("%s: expected an array, got %s" % (name, type(a).__name__))
    try:
        return np.asarray(a)
    except Exception as exc:  # an object NumPy cannot read as an array
        raise TypeError("%s: expected an array, got %s (%s)" % (name, type(a).__name__, exc)) from None


def contiguous(a):
    # A strided, reversed or misaligned view is read through one contiguous copy.
    flags = a.flags
    return a if flags.c_contiguous and flags.aligned else np.array(a, order="C")


def tensor(x, name):
    """Validate the main tensor; returns (array, kernel dtype code, vector dtype)."""
    if isinstance(x, (list, tuple, int, float, complex)):
        # NumPy would guess the dtype (float64 for floats), and the error
        # would then name whichever argument kept its own
        raise TypeError("%s: expected an array (numpy.ndarray), got %s; pass "
                        "numpy.asarray(%s, dtype=...) with the dtype meant"
                        % (name, type(x).__name__, name))
    x = as_array(x, name)
    kinds = dtype_kinds(x.dtype, name)
    return contiguous(x), kinds[0], kinds[1]


def dtype_kinds(dtype, name):
    """(kernel dtype code, vector dtype) of a tensor dtype, or TypeError."""
    kinds = DTYPES.get(dtype)
    if kinds is None:
        kinds = bfloat16_kinds(dtype)
        if kinds is None:
            raise TypeError("%s: expected float32, float64, float16 or bfloat16 (native byte "
                            "order), got %s" % (name, dtype))
    return kinds


def is_bfloat16(dtype):
    """Whether `dtype` is ml_dtypes.bfloat16 in native byte order.

    NumPy has no bfloat16; ml_dtypes registers one as a user-defined type
    whose type number depends on the order of registration, so it is known
    by its name, size and the module of its scalar type.  Nothing here
    imports ml_dtypes: an array of that dtype exists only once its user has.
    """
    if getattr(dtype, "name", None) != "bfloat16" or dtype.itemsize != 2 or not dtype.isnative:
        return False
    module = getattr(dtype.type, "__module__", None) or ""
    return module == "ml_dtypes" or module.startswith("ml_dtypes.")


def is_floating(dtype):
    """Whether `dtype` is a real floating-point type, bfloat16 included
    (NumPy files ml_dtypes' types under no abstract type of its own)."""
    return np.issubdtype(dtype, np.floating) or is_bfloat16(dtype)


def bfloat16_kinds(dtype):
    """The kinds of a bfloat16 dtype, entered in DTYPES (and the fast
    paths' type number set) on first sight so that later calls find it in
    one lookup; None for any other dtype."""
    if not is_bfloat16(dtype):
        return None
    _kernels.set_bfloat16_type(dtype.num)
    DTYPES[dtype] = BF16_KINDS
    return BF16_KINDS


def format_spec(data_format):
    """(rank, channels first?) of a data_format name, or ValueError."""
    try:
        return LAYOUTS[data_format]
    except (KeyError, TypeError):
        raise ValueError("data_format: expected one of %s, got %r"
                         % (", ".join(LAYOUTS), data_format)) from None


def layout(data_format, x):
    """Returns (layout code, outer, channels, inner) for x under data_format."""
    rank, first = format_spec(data_format)
    shape = x.shape
    if len(shape) != rank:
        raise ValueError("x: data_format %r needs a %d-D tensor, got shape %s"
                         % (data_format, rank, shape))
    if first:
        inner = 1
        for d in shape[2:]:
            inner *= d
        return CHANNELS_FIRST, shape[0], shape[1], inner
    outer = 1
    for d in shape[:-1]:
        outer *= d
    return CHANNELS_LAST, outer, shape[-1], 1


def channel_axis(data_format, ndim):
    """The channel axis of a `ndim`-D tensor laid out as `data_format`."""
    rank, first = format_spec(data_format)
    if ndim != rank:
        raise ValueError("x: data_format %r needs a %d-D tensor, got %d dimensions"
                         % (data_format, rank, ndim))
    return 1 if first else rank - 1


def reduce_axes(data_format, ndim):
    """The axes a per-channel reduction of such a tensor runs over."""
    c = channel_axis(data_format, ndim)
    return tuple(a for a in range(ndim) if a != c)


def vector(v, name, channels, dtype):
    v = as_array(v, name)
    check_vector(v, name, channels, dtype)
    return contiguous(v)


def check_vector(v, name, channels, dtype):
    if v.dtype != dtype:
        raise TypeError("%s: expected %s to match x, got %s" % (name, dtype, v.dtype))
    if v.shape != (channels,):
        raise ValueError("%s: expected shape (%d,) (one value per channel), got %s"
                         % (name, channels, v.shape))


def real(value, name):
    """A real number as a float; strings, bools, complex numbers and other
    non-numbers are a TypeError (float() would parse "1e-3", which no caller
    means), a number beyond the float range a ValueError."""
    if isinstance(value, (str, bytes, bool, np.bool_, complex, np.complexfloating)):
        raise TypeError("%s: expected a real number, got %r" % (name, value))
    try:
        return float(value)
    except OverflowError:
        raise ValueError("%s: expected a value within the float range (|value| < 1.8e308), "
                         "got %s" % (name, short(value))) from None
    except (TypeError, ValueError):
        raise TypeError("%s: expected a real number, got %r" % (name, value)) from None


def short(value):
    # repr() of a huge int has hundreds of digits; an error message needs few.
    text = repr(value)
    return text if len(text) <= 40 else "%s... (%d characters)" % (text[:20], len(text))


def flag(value, name):
    """A bool (Python's or NumPy's) as a bool; anything else is a TypeError:
    truthiness would read None as False and the string "False" as True."""
    if value is True or value is False:
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    raise TypeError("%s: expected a bool, got %r" % (name, value))


def holds(rule, value):
    """Whether `value` (a float, or an int for the integer rules) lies in
    `rule`'s range (csrc/rules.h; a NaN lies in none)."""
    low, high, _ = _kernels.RULES[rule]
    return low <= value <= high


def refused(name, rule, value):
    """The ValueError of a value that breaks `rule`, in the words every
    entrance uses: "<name>: expected <what the rule expects>, got <value>"."""
    return ValueError("%s: expected %s, got %s" % (name, _kernels.RULES[rule][2], short(value)))


def epsilon(value, name="epsilon"):
    e = real(value, name)
    if not holds("epsilon", e):
        raise refused(name, "epsilon", value)
    return e


def factor(value, name="exponential_avg_factor"):
    f = real(value, name)
    if not holds("factor", f):
        raise refused(name, "factor", value)
    return f


def finite(value, name):
    """A finite real number as a float (alpha; cfbn.torch's momentum)."""
    v = real(value, name)
    if not holds("finite", v):
        raise refused(name, "finite", value)
    return v


def count(value, name):
    """A count >= 0 as an int (cfbn.torch's num_batches_tracked)."""
    n = index(value, name)
    if not holds("count", n):
        raise refused(name, "count", n)
    return n


def activation_code(value, name="activation"):
    """An activation code (the value of ACTIVATIONS' entries), as cfbn.torch's
    operators take it."""
    n = index(value, name)
    if not holds("activation", n):
        raise refused(name, "activation", n)
    return n


def check_stats_given(training, factor, mean, variance):
    if ((not training) or factor != 1.0) and (mean is None or variance is None):
        missing = "mean" if mean is None else "variance"
        why = "is_training=False" if not training else "exponential_avg_factor != 1"
        raise ValueError("%s: required when %s" % (missing, why))


def optional_stats(training, factor, mean, variance):
    """mean and variance, each None where it may be omitted (training with
    exponential_avg_factor 1) and was omitted or given as a zero-length array,
    as TensorFlow's and Keras' callers pass it."""
    if training and factor == 1.0:
        mean = None if empty_vector(mean) else mean
        variance = None if empty_vector(variance) else variance
    check_stats_given(training, factor, mean, variance)
    return mean, variance


def empty_vector(v):
    if isinstance(v, (list, tuple)):
        return len(v) == 0
    return getattr(v, "shape", None) == (0,)


def activation(activation, alpha):
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
    return code, finite(alpha, "alpha")


def side_input(side_input, x):
    side = as_array(side_input, "side_input")
    check_side_input(side, x)
    return contiguous(side)


def check_side_input(side, x):
    check_like_x(side, x, "side_input")


def check_offset_given(act, offset):
    if act and offset is None:
        raise ValueError("offset: required when activation is set (the gradient recomputes "
                         "the pre-activation from it)")


def check_like_x(a, x, name):
    """A tensor argument that must have x's dtype and shape."""
    if a.dtype != x.dtype:
        raise TypeError("%s: expected dtype %s to match x, got %s" % (name, x.dtype, a.dtype))
    if a.shape != x.shape:
        raise ValueError("%s: expected x's shape %s, got %s" % (name, x.shape, a.shape))


def check_dy(dy, x):
    check_like_x(dy, x, "y_backprop")


def index(value, name, expected="an int"):
    """`value` as a Python int; a bool, float or other type is a TypeError
    naming the argument."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError("%s: expected %s, got bool" % (name, expected))
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError("%s: expected %s, got %r" % (name, expected, value)) from None


def threads(n_threads):
    if n_threads is None:
        return 0
    n = index(n_threads, "n_threads", "an int or None")
    if not holds("threads", n):
        raise refused("n_threads", "threads", n)
    return n


# Outputs that may be the very memory of an input: updates the kernels make
# in place because they read each element (or channel) of that input before
# they write the output's.  Any other output that touches an input's memory,
# even exactly, would be written before the input is read.
FORWARD_IN_PLACE = frozenset([("y", "x"), ("y", "side_input"), ("batch_mean", "mean"),
                              ("batch_variance", "variance")])
GRAD_IN_PLACE = frozenset([("x_backprop", "y_backprop"), ("x_backprop", "x"),
                           ("side_input_backprop", "y_backprop")])


def outputs(out, fields, specs, inputs, in_place=frozenset()):
    """Allocate or check the output arrays.

    `specs` gives (shape, dtype) per field; each caller's array is checked by
    `given_output`, and no two of them may share memory.

    Returns (arrays, write_back): the arrays to hand the kernels, one per
    field, and (caller's array, temporary) pairs for `write_back` once the
    kernels have run.
    """
    if out is None:
        return [_kernels.empty_output(shape, dtype) for shape, dtype in specs], ()
    given = out_given(out, fields)
    result, write_back, checked = [], [], []
    for field, (shape, dtype), a in zip(fields, specs, given):
        if a is None:
            result.append(_kernels.empty_output(shape, dtype))
            continue
        name = "out[%r]" % field
        target = given_output(a, name, field, shape, dtype, inputs, in_place)
        for prev_field, prev in checked:
            if _kernels.touches(a, prev):
                raise ValueError("%s: shares memory with out[%r]" % (name, prev_field))
        checked.append((field, a))
        if target is not a:
            write_back.append((a, target))
        result.append(target)
    return result, write_back


def given_output(a, name, field, shape, dtype, inputs, in_place):
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
        if is_cupy(a):
            raise mixed(name, "the input x")
        raise TypeError("%s: expected a numpy array, got %s" % (name, type(a).__name__))
    check_out_array(a, name, shape, dtype)
    if not a.flags.writeable:
        raise ValueError("%s: array is read-only" % name)
    for iname, b in inputs:
        if b is not None:
            check_alias(name, field, a, iname, b, in_place,
                         _kernels.touches(a, b), _kernels.overlaps(a, b))
    return a if a.flags.aligned else _kernels.empty_output(shape, dtype)


def check_alias(name, field, a, iname, b, in_place, touches, partial):
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


def write_back(arrays, pairs):
    """Copy the outputs computed in temporaries into the caller's arrays;
    returns `arrays` with the caller's arrays in place of the temporaries."""
    for dest, tmp in pairs:
        np.copyto(dest, tmp)
    caller = {id(tmp): dest for dest, tmp in pairs}
    return [caller.get(id(a), a) for a in arrays]


def out_given(out, fields):
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


def check_out_array(a, name, shape, dtype):
    if a.dtype != dtype:
        raise TypeError("%s: expected dtype %s, got %s" % (name, dtype, a.dtype))
    if a.shape != tuple(shape):
        raise ValueError("%s: expected shape %s, got %s" % (name, tuple(shape), a.shape))
    if not a.flags.c_contiguous:
        raise ValueError("%s: expected a C-contiguous array" % name)


def in_place_masks(fields, inputs, in_place):
    """Per output field, a bit per input (in `inputs` order) that the field
    may be exactly: `in_place` as the Cython fast paths test it."""
    return tuple(sum(1 << j for j, i in enumerate(inputs) if (f, i) in in_place) for f in fields)


# The fast paths recognize the plain call by these tables, not by copies of
# them: what they accept is what the rules above accept.  Their argument
# orders are those of fused_batch_norm and fused_batch_norm_grad.
_kernels.set_fast_path_rules(
    BatchNormOutput, BatchNormGrad, BatchNormGradSide, BatchNormGradGrad, LAYOUTS, CHANNELS_FIRST,
    ACTIVATIONS,
    in_place_masks(BatchNormOutput._fields,
                   ("x", "scale", "offset", "mean", "variance", "side_input"), FORWARD_IN_PLACE),
    in_place_masks(BatchNormGradSide._fields,
                   ("y_backprop", "x", "scale", "reserve_space_1", "reserve_space_2", "offset",
                    "side_input"), GRAD_IN_PLACE))
