"""PyTorch tensors as the NumPy arrays cfbn's kernels take, without copies.

Every layout PyTorch's batch norm accepts maps onto one of two of cfbn's:

- channels first, contiguous ``(N, C, *spatial)`` is NCHW with the spatial
  axes flattened into one, ``(N, C, L, 1)``;
- channels last (``torch.channels_last``, ``channels_last_3d``, or an
  ``(N, L, C)`` tensor transposed to ``(N, C, L)``, and any ``(N, C)``) is
  NC with every non-channel axis flattened into the rows, ``(N*L, C)``.

Both are views of the tensor's memory (``tensor.numpy()``, a transpose and a
reshape), so the kernels read and write torch's storage directly.  Outputs
are tensors from PyTorch's allocator, in the input's memory format, written
through the same views.  A tensor in neither layout (a
slice, an odd permutation) is read through one copy, as cfbn reads a strided
NumPy array.

The argument rules are cfbn's own (cfbn._args, reached through
cfbn.fused_batch_norm and its gradients, and for a tensor dtype cfbn does
not compute); this module adds only what PyTorch adds: its dtype pairings,
CPU tensors, and its empty-batch behaviour.
"""
import math

import numpy as np
import torch

from .. import _api, _args
from . import _activation

# The per-channel vectors of each input dtype, as cfbn's kernels want them
# (float32 for the 16-bit types, as PyTorch's own CPU kernels keep them).
VECTOR_DTYPES = {torch.float32: torch.float32, torch.float64: torch.float64,
                 torch.float16: torch.float32, torch.bfloat16: torch.float32}
HALF = (torch.float16, torch.bfloat16)
_NUMPY_VECTOR = {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}
_NUMPY_TENSOR = dict(_NUMPY_VECTOR)
_NUMPY_TENSOR[torch.float16] = np.dtype(np.float16)

# Layout kinds: channels first as (N, C, L, 1) "NCHW", channels last as (rows, C) "NC".
FIRST, LAST = 0, 1
FORMATS = ("NCHW", "NC")
# Axis order that makes a channels-last tensor's NumPy view C-contiguous.
_TO_LAST = {3: (0, 2, 1), 4: (0, 2, 3, 1), 5: (0, 2, 3, 4, 1)}
_FROM_LAST = {3: (0, 2, 1), 4: (0, 3, 1, 2), 5: (0, 4, 1, 2, 3)}
_MEMORY_FORMATS = {4: torch.channels_last, 5: torch.channels_last_3d}

_bfloat16 = None


def _numpy_bfloat16():
    global _bfloat16
    if _bfloat16 is None:
        try:
            import ml_dtypes
        except ImportError as exc:
            raise ImportError("cfbn.torch: bfloat16 tensors need ml_dtypes "
                              "(pip install cfbn[torch] installs it)") from exc
        _bfloat16 = np.dtype(ml_dtypes.bfloat16)
    return _bfloat16


def array(t):
    """The NumPy view of a CPU tensor's memory (bfloat16 as ml_dtypes')."""
    try:
        if t.dtype is torch.bfloat16:
            return t.view(torch.int16).numpy().view(_numpy_bfloat16())
        return t.numpy()
    except RuntimeError:
        # .numpy() refuses a tensor that requires grad while grad mode is on
        # (an op called directly, outside autograd); the memory is the same.
        return array(t.detach())


def check_input(x, name="input", meta=False):
    """x's vector dtype; a TypeError for a tensor cfbn cannot compute.  With
    `meta`, meta tensors pass too (the operators' fake kernels take them)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError("%s: expected a torch.Tensor, got %s" % (name, type(x).__name__))
    vdt = VECTOR_DTYPES.get(x.dtype)
    if vdt is None:
        _wrong_dtype(x, name)
    if not x.is_cpu and not (meta and x.is_meta):
        raise TypeError("%s: cfbn.torch computes CPU tensors, got one on %s" % (name, x.device))
    if not 2 <= x.dim() <= 5:
        raise ValueError("%s: expected a 2-D to 5-D tensor (N, C, ...), got shape %s"
                         % (name, tuple(x.shape)))
    return vdt


def _wrong_dtype(x, name):
    """The validator's TypeError for a dtype cfbn does not compute."""
    try:
        a = array(x)
    except (TypeError, RuntimeError):
        # no NumPy dtype at all (a quantized or complex-half tensor)
        raise TypeError("%s: expected float32, float64, float16 or bfloat16, got %s"
                        % (name, x.dtype)) from None
    _args.dtype_kinds(a.dtype, name)
    raise AssertionError("cfbn's validator accepted %s, which cfbn.torch does not map"
                         % x.dtype)


def layout_kind(t):
    """FIRST or LAST for a tensor whose memory cfbn can read as it is, else None."""
    if t.is_contiguous():
        return LAST if t.dim() == 2 else FIRST
    nd = t.dim()
    if nd == 3:
        return LAST if t.transpose(1, 2).is_contiguous() else None
    if nd > 3 and t.is_contiguous(memory_format=_MEMORY_FORMATS[nd]):
        return LAST
    return None


def kind_of(x):
    """The layout cfbn computes x in: its own, else channels first (one copy)."""
    kind = layout_kind(x)
    return FIRST if kind is None else kind


def _last_shape(shape):
    return [shape[0]] + list(shape[2:]) + [shape[1]]


def empty_like(x):
    """An output tensor for x, in the layout cfbn computes x in, with torch's
    allocator: the shape and strides `output` gives, for the fake (meta)
    implementations, so that compiled graphs see the kernels' strides."""
    if kind_of(x) == FIRST or x.dim() == 2:
        return x.new_empty(x.shape)
    return x.new_empty(_last_shape(x.shape)).permute(_FROM_LAST[x.dim()])


def output(x, kind):
    """(tensor, cfbn's view of it): an uninitialized output of x's shape and
    dtype in layout `kind`, from PyTorch's allocator (the profiler counts
    it, and no cache of cfbn's holds memory inside PyTorch)."""
    shape = x.shape
    if kind == FIRST or len(shape) == 2:
        t = torch.empty(shape, dtype=x.dtype)
        a = array(t)
        v = a.reshape(shape[0], shape[1], math.prod(shape[2:]), 1) if kind == FIRST else a
        return t, v
    # A tensor of its own with channels-last strides, not a permuted view:
    # autograd forbids modifying a custom Function's view output in place,
    # as nn.ReLU(inplace=True) after a batch norm does.
    last = _last_shape(shape)
    strides = [0] * len(last)
    step = 1
    for i in range(len(last) - 1, -1, -1):
        strides[i] = step
        step *= last[i]
    order = _FROM_LAST[len(shape)]
    t = torch.empty_strided(shape, [strides[d] for d in order], dtype=x.dtype)
    return t, view(t, kind)


def _vector_output(channels, vdt):
    """(tensor, array) of an uninitialized per-channel vector of dtype vdt."""
    a = np.empty(channels, _NUMPY_VECTOR[vdt])
    return torch.from_numpy(a), a


def in_layout(t, kind):
    """t with the memory layout `kind` (itself, or one copy)."""
    if t.numel() == 0 or layout_kind(t) == kind:
        return t
    if kind == FIRST or t.dim() == 2:
        return t.contiguous()
    if t.dim() == 3:
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    return t.contiguous(memory_format=_MEMORY_FORMATS[t.dim()])


def view(t, kind):
    """The NumPy view of t (in layout `kind`) that cfbn's kernels take."""
    a = array(t)
    if kind == FIRST:
        return a.reshape(a.shape[0], a.shape[1], math.prod(a.shape[2:]), 1)
    if a.ndim == 2:
        return a
    return a.transpose(_TO_LAST[a.ndim]).reshape(-1, a.shape[1])


_constants = {}


def _constant(channels, dtype, value):
    """A read-only vector of ones or zeros, kept per (channels, dtype): the
    scale and offset of affine=False."""
    key = (channels, dtype, value)
    a = _constants.get(key)
    if a is None:
        a = np.full(channels, value, dtype)
        a.setflags(write=False)
        _constants[key] = a
    return a


def vector(v, vdt, x_dtype, name):
    """A per-channel tensor as a NumPy vector of dtype vdt: a view, or for a
    16-bit x, the float32 copy of a vector of x's own dtype (a module moved
    to bfloat16 or float16 entirely), as PyTorch's CPU kernels accept both."""
    if v.dtype is vdt:
        return array(v)
    if v.dtype is x_dtype and x_dtype in HALF:
        return array(v.to(vdt))
    raise RuntimeError(mixed_dtype(x_dtype, v.dtype, vdt, name))


def mixed_dtype(x_dtype, v_dtype, vdt, name):
    if x_dtype in HALF:
        return ("mixed dtype (CPU): %s: expected float32 or %s for %s input, got %s"
                % (name, x_dtype, x_dtype, v_dtype))
    return ("mixed dtype (CPU): %s: expected %s to match the input, got %s"
            % (name, vdt, v_dtype))


def _vector_or(v, vdt, x_dtype, name, channels, value):
    if v is None:
        return _constant(channels, _NUMPY_VECTOR[vdt], value)
    return vector(v, vdt, x_dtype, name)


def _prepare(x):
    """(x in the layout cfbn computes it in, vector dtype, channels, layout kind)."""
    vdt = check_input(x)
    kind = layout_kind(x)
    if kind is None:
        kind = FIRST
        x = x.contiguous()
    return x, vdt, x.shape[1], kind


def forward(x, weight, bias, running_mean, running_var, training, factor, eps, activation,
            alpha, side_input, in_place):
    """Batch norm of x, as PyTorch's batch_norm computes it.

    Normalizes with the batch statistics when `training` (and updates the
    running ones with weight `factor` when they are given), else with the
    running statistics.  With `in_place` the running statistics are updated
    in their own tensors; without, the new values are returned in new
    tensors and the inputs are left alone (as a functional operator must).

    Returns (y, save_mean, save_var, new_running_mean, new_running_var):
    save_mean and save_var are what `backward` takes (the batch mean and
    biased variance in training, copies of the running statistics in
    inference); the new running statistics are empty (0,) tensors when none
    are updated, and the running tensors themselves with `in_place`.
    """
    x, vdt, channels, kind = _prepare(x)
    y, y_view = output(x, kind)
    save_mean, mean_out = _vector_output(channels, vdt)
    save_var, var_out = _vector_output(channels, vdt)
    update = training and running_mean is not None
    if x.numel() == 0:
        # PyTorch's batch_norm on an empty batch: an empty output, the running
        # statistics untouched (cfbn would average NaN statistics into them).
        mean_out[...] = 0.0
        var_out[...] = 1.0
        new_mean = new_var = None
        if update:
            if in_place:
                new_mean, new_var = running_mean, running_var
            else:
                new_mean = running_mean.to(vdt, copy=True)
                new_var = running_var.to(vdt, copy=True)
        return y, save_mean, save_var, _or_empty(new_mean, vdt), _or_empty(new_var, vdt)
    xdt = x.dtype
    scale = _vector_or(weight, vdt, xdt, "weight", channels, 1.0)
    offset = _vector_or(bias, vdt, xdt, "bias", channels, 0.0)
    mean = var = None
    if running_mean is not None:
        mean = vector(running_mean, vdt, xdt, "running_mean")
        var = vector(running_var, vdt, xdt, "running_var")
    side = None
    if side_input is not None:
        side = view(in_layout(side_input, kind), kind)
    if not update:
        _api.fused_batch_norm(view(x, kind), scale, offset, mean, var, epsilon=eps,
                              data_format=FORMATS[kind], is_training=training,
                              out=(y_view, None, None, mean_out, var_out),
                              activation=activation, alpha=alpha, side_input=side)
        return y, save_mean, save_var, _or_empty(None, vdt), _or_empty(None, vdt)
    direct = (in_place and running_mean.dtype is vdt and running_var.dtype is vdt
              and running_mean.is_contiguous() and running_var.is_contiguous())
    if direct:
        # the kernels update the running statistics where they are
        new_mean, new_var, running_out = running_mean, running_var, (mean, var)
    else:
        new_mean, new_mean_out = _vector_output(channels, vdt)
        new_var, new_var_out = _vector_output(channels, vdt)
        running_out = (new_mean_out, new_var_out)
    _api.fused_batch_norm(view(x, kind), scale, offset, mean, var, epsilon=eps,
                          exponential_avg_factor=factor, data_format=FORMATS[kind],
                          is_training=True, out=(y_view,) + running_out + (mean_out, var_out),
                          activation=activation, alpha=alpha, side_input=side)
    if in_place and not direct:
        running_mean.copy_(new_mean)
        running_var.copy_(new_var)
        new_mean, new_var = running_mean, running_var
    return y, save_mean, save_var, new_mean, new_var


def _or_empty(t, vdt):
    return torch.empty(0, dtype=vdt) if t is None else t


def _grad_vector(g, param):
    """A per-channel gradient in the parameter's dtype."""
    if param is None or param.dtype is g.dtype:
        return g
    return g.to(param.dtype)


def backward(grad_out, x, weight, bias, save_mean, save_var, training, eps, activation,
             alpha, side_input):
    """The gradient of `forward`: (grad_input, grad_weight, grad_bias,
    grad_side_input or None).  The parameter gradients have the
    parameters' dtype (the vector dtype when there are none)."""
    x, vdt, channels, kind = _prepare(x)
    dx, dx_view = output(x, kind)
    dscale, dscale_out = _vector_output(channels, vdt)
    doffset, doffset_out = _vector_output(channels, vdt)
    dside = None
    out = [dx_view, dscale_out, doffset_out]
    if side_input is not None:
        dside, dside_view = output(x, kind)
        out.append(dside_view)
    if x.numel() == 0:
        dscale_out[...] = 0.0
        doffset_out[...] = 0.0
        return dx, _grad_vector(dscale, weight), _grad_vector(doffset, bias), dside
    xdt = x.dtype
    dy = in_layout(grad_out, kind)
    scale = _vector_or(weight, vdt, xdt, "weight", channels, 1.0)
    offset = None
    if activation is not None:
        offset = _vector_or(bias, vdt, xdt, "bias", channels, 0.0)
    side = None
    if side_input is not None:
        side = view(in_layout(side_input, kind), kind)
    _api.fused_batch_norm_grad(view(dy, kind), view(x, kind), scale, array(save_mean),
                               array(save_var), epsilon=eps, data_format=FORMATS[kind],
                               is_training=training, out=out, offset=offset,
                               activation=activation, alpha=alpha, side_input=side)
    return dx, _grad_vector(dscale, weight), _grad_vector(doffset, bias), dside


def double_backward(grad_out, x, weight, save_mean, save_var, gg_input, gg_weight, gg_bias,
                    training, eps):
    """The gradient of `backward` (no activation): (grad_grad_out,
    grad_input, grad_weight) for upstream gradients gg_* of backward's
    grad_input, grad_weight and grad_bias (None means zeros)."""
    x, vdt, channels, kind = _prepare(x)
    ddy, ddy_view = output(x, kind)
    dx, dx_view = output(x, kind)
    dscale, dscale_out = _vector_output(channels, vdt)
    if x.numel() == 0:
        dscale_out[...] = 0.0
        return ddy, dx, _grad_vector(dscale, weight)
    xdt = x.dtype
    dy = in_layout(grad_out, kind)
    ggx = None if gg_input is None else view(in_layout(gg_input, kind), kind)
    # the parameters' dtypes, as the parameters themselves: never a cast
    # from another dtype (an int64 or complex tensor is refused, not read)
    ggs = None if gg_weight is None else vector(gg_weight, vdt, xdt, "grad_grad_weight")
    ggo = None if gg_bias is None else vector(gg_bias, vdt, xdt, "grad_grad_bias")
    _api.fused_batch_norm_grad_grad(
        view(dy, kind), view(x, kind), _vector_or(weight, vdt, xdt, "weight", channels, 1.0),
        array(save_mean), array(save_var), ggx, ggs, ggo, epsilon=eps,
        data_format=FORMATS[kind], is_training=training, out=(ddy_view, dx_view, dscale_out))
    return ddy, dx, _grad_vector(dscale, weight)


def _pre_activation(x, weight, bias, save_mean, save_var, eps, side_input):
    """The normalized value plus the side input, before the activation, in
    the vector dtype (torch operations: it is differentiated no further)."""
    vdt = save_mean.dtype
    shape = [1, x.shape[1]] + [1] * (x.dim() - 2)
    z = (x.to(vdt) - save_mean.view(shape)) * torch.rsqrt(save_var + eps).view(shape)
    if weight is not None:
        z = z * weight.to(vdt).view(shape)
    if bias is not None:
        z = z + bias.to(vdt).view(shape)
    if side_input is not None:
        z = z + side_input.to(vdt)
    return z


def backward_of_backward(double_backward_fn, backward_fn, saved, options, gg_input, gg_weight,
                         gg_bias, gg_side):
    """The gradient of `backward` for the autograd formulas.

    `saved` is backward's (grad_out, x, weight, bias, save_mean, save_var,
    side_input), `options` its (training, eps, activation, alpha), and the
    gg_* the upstream gradients of its outputs (None for zeros).  Returns the
    gradients of grad_out, x, weight, bias and side_input (the last two None
    where they are zero), computed by `double_backward_fn` and `backward_fn`
    (the operators, or `double_backward` and `backward`).

    With an activation, backward is the plain gradient of dz = grad_out *
    act'(z) at the pre-activation z: the plain second derivative at dz, and
    through act'(z) a first-order term, the plain gradient of
    ddz * grad_out * act''(z) (for the relu family act'' is 0).  save_mean
    and save_var get no gradient: in training their dependence on x is
    inside x's gradient (the kernels differentiate the batch statistics), in
    inference they are constants.
    """
    grad_out, x, weight, bias, save_mean, save_var, side_input = saved
    training, eps, activation, alpha = options
    dz = grad_out
    if activation is not None:
        z = _pre_activation(x, weight, bias, save_mean, save_var, eps, side_input)
        d1, d2 = _activation.derivatives(z, activation, alpha)
        dz = (grad_out * d1).to(x.dtype)
    ddz, dx, dweight = double_backward_fn(dz, x, weight, save_mean, save_var, gg_input,
                                          gg_weight, gg_bias, training, eps)
    if side_input is not None and gg_side is not None:
        # grad_side_input is dz itself: its upstream gradient passes to dz.
        ddz = ddz + gg_side
    if activation is None:
        return ddz, dx, dweight, None, None
    ddy = (ddz * d1).to(x.dtype)
    if d2 is None:
        return ddy, dx, dweight, None, None
    gz = (ddz * grad_out * d2).to(x.dtype)
    dx_z, dweight_z, dbias, _ = backward_fn(gz, x, weight, bias, save_mean, save_var, training,
                                            eps, None, None, None)
    return ddy, dx + dx_z, dweight + dweight_z, dbias, gz if side_input is not None else None


def check_activation(activation, alpha):
    """The one validator's rule for activation and alpha (ValueError,
    TypeError), for the modules' constructors."""
    _args.activation(activation, alpha)
