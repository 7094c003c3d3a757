"""cfbn.fused_batch_norm_grad_grad against the float64 reference, on every
kernel table; the reference itself is checked in test_grad_grad_reference.py."""

import numpy as np
import pytest

import cfbn
from cfbn import reference

from _checks import (
    BFLOAT16,
    DTYPES,
    LAYOUTS,
    SHAPES,
    Unmodified,
    check_grad_grad,
    make_shape,
    nan_like,
    random_vectors,
    random_x,
    seed_of,
    vector_dtype,
)
from _gg_checks import GG_FIELDS, torch_grad_grad

EPS = 1e-3
# which of (ggx, ggscale, ggoffset) are given
UPSTREAM = [(True, True, True), (False, True, True), (True, False, False)]


def upstream_id(given):
    return "+".join(n for n, g in zip(("ggx", "ggs", "ggo"), given) if g)


def make_case(data_format, dtype, shape_case, is_training, given=(True, True, True), seed=0,
              loc=None, std=None):
    """(dy, x, scale, mean, variance, ggx, ggscale, ggoffset) in ``dtype``; in
    training the reserve spaces are the batch statistics of x."""
    rng = np.random.default_rng(seed_of("ggcase", data_format, np.dtype(dtype).name, shape_case,
                                        is_training, given, seed))
    shape = make_shape(data_format, *shape_case)
    c = shape_case[2]
    vdt = vector_dtype(dtype)
    x = random_x(rng, shape, data_format, dtype, loc, std)
    dy = random_x(rng, shape, data_format, dtype)
    v = random_vectors(rng, c, dtype)
    if is_training:
        fwd = reference.fused_batch_norm(x, v["scale"], v["offset"], epsilon=EPS,
                                         data_format=data_format)
        mu, var = fwd.reserve_space_1.astype(vdt), fwd.reserve_space_2.astype(vdt)
    else:
        mu, var = v["mean"], v["variance"]
    ggx = random_x(rng, shape, data_format, dtype)
    ggs = rng.standard_normal(c).astype(vdt)
    ggo = rng.standard_normal(c).astype(vdt)
    up = tuple(u if g else None for u, g in zip((ggx, ggs, ggo), given))
    return (dy, x, v["scale"], mu, var) + up


def buffers(x, c):
    vdt = vector_dtype(x.dtype)
    return [nan_like(x.shape, x.dtype), nan_like(x.shape, x.dtype), nan_like((c,), vdt)]


def call(args, data_format, is_training, **kw):
    return cfbn.fused_batch_norm_grad_grad(*args, epsilon=EPS, data_format=data_format,
                                           is_training=is_training, **kw)


@pytest.mark.parametrize("given", UPSTREAM, ids=upstream_id)
@pytest.mark.parametrize("shape_case", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("data_format", LAYOUTS)
def test_matches_reference(isa, data_format, dtype, is_training, shape_case, given):
    args = make_case(data_format, dtype, shape_case, is_training, given)
    out = buffers(args[1], shape_case[2])
    with Unmodified(*args):
        res = call(args, data_format, is_training, out=out)
    assert isinstance(res, cfbn.BatchNormGradGrad)
    for got, buf in zip(res, out):
        assert got is buf
    check_grad_grad(res, *args, epsilon=EPS, data_format=data_format, is_training=is_training)
    if shape_case[0] == 0:
        assert res.x_backprop.size == 0 and np.all(res.scale_backprop == 0)


# One element per channel in training: d = x - mean = 0, so scale_backprop,
# r (sum q g - sum q sum g / n - ...), and dx vanish identically.  The
# kernels' sums must cancel exactly, as the scalar table's do: a product
# q g rounded to float would leave about 1e-7.  The channel counts take the
# rows kernels' flat streams (widths dividing the vector), their row loops
# and, channels-first, the run kernels.
@pytest.mark.parametrize("channels", [1, 2, 4, 8, 13])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("data_format", LAYOUTS)
def test_one_element_per_channel_is_exact(isa, data_format, dtype, channels):
    args = make_case(data_format, dtype, (1, 1, channels), True)
    res = call(args, data_format, True)
    assert np.all(res.scale_backprop == 0), res.scale_backprop
    assert np.all(res.x_backprop == 0)


# Large mean relative to spread in x, dy and ggx: the sums and the outputs
# must not lose the small deviations to cancellation.
@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW", "NC"])
def test_hard_data(isa, data_format, dtype, is_training):
    args = list(make_case(data_format, dtype, (3, 33, 17), is_training, loc=1e4, std=1e-1))
    check_grad_grad(call(args, data_format, is_training), *args, epsilon=EPS,
                    data_format=data_format, is_training=is_training)


# Tensors big enough for every path of the driver: several threads, the
# per-channel tasks of channels-first tensors, wide and widened rows.
@pytest.mark.parametrize("shape_case", [(4, 3136, 64), (2, 49, 512), (8, 196, 3), (3, 1001, 33)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_large(isa, data_format, dtype, shape_case):
    args = make_case(data_format, dtype, shape_case, True)
    out = buffers(args[1], shape_case[2])
    res = call(args, data_format, True, out=out, n_threads=2)
    check_grad_grad(res, *args, epsilon=EPS, data_format=data_format, is_training=True)


@pytest.mark.parametrize("given", UPSTREAM, ids=upstream_id)
@pytest.mark.parametrize("shape_case", [(4, 3136, 64), (16, 49, 96), (2, 20000, 3)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_bit_identical_across_thread_counts(isa, data_format, shape_case, given):
    args = make_case(data_format, np.float32, shape_case, True, given)
    first = call(args, data_format, True, n_threads=1)
    for nt in (2, 3, 8):
        again = call(args, data_format, True, n_threads=nt)
        for name, a, b in zip(GG_FIELDS, first, again):
            assert a.tobytes() == b.tobytes(), f"{name} differs with {nt} threads"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("data_format", LAYOUTS)
def test_allocated_outputs_equal_out_buffers(isa, data_format, dtype):
    args = make_case(data_format, dtype, (3, 13, 17), True)
    fresh = call(args, data_format, True)
    into = call(args, data_format, True, out=buffers(args[1], 17))
    for name, a, b in zip(GG_FIELDS, fresh, into):
        expected = vector_dtype(dtype) if name == "scale_backprop" else np.dtype(dtype)
        assert a.dtype == expected and a.flags.c_contiguous, name
        assert a.tobytes() == b.tobytes(), name


def test_none_upstream_equals_zeros(isa):
    # None means zeros: the same numbers (to rounding: None takes the first
    # order kernels) as zero arrays passed in
    args = make_case("NCHW", np.float64, (3, 13, 5), True)
    zeros = list(args)
    zeros[5] = np.zeros_like(args[1])
    a = call(args[:5] + (None,) + args[6:], "NCHW", True)
    b = call(zeros, "NCHW", True)
    for name, u, v in zip(GG_FIELDS, a, b):
        np.testing.assert_allclose(u, v, rtol=1e-12, atol=1e-12, err_msg=name)
    c = call(args[:5] + (None, None, None), "NCHW", True)
    for name, v in zip(GG_FIELDS, c):
        assert np.all(v == 0), name


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_inference_x_backprop_ignores_x_and_ggx(isa, data_format):
    # in inference dx = ggscale * r * dy: a NaN in x or ggx stays out
    args = list(make_case(data_format, np.float32, (2, 9, 5), False))
    args[1] = args[1].copy()
    args[5] = args[5].copy()
    args[1].flat[::7] = np.nan
    args[5].flat[::5] = np.nan
    res = call(args, data_format, False)
    assert np.all(np.isfinite(res.x_backprop))
    check_grad_grad(res, *args, epsilon=EPS, data_format=data_format, is_training=False)


@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_matches_torch_double_backward(isa, data_format, is_training):
    args = make_case(data_format, np.float64, (3, 20, 7), is_training)
    want = torch_grad_grad(args, data_format, is_training, EPS)
    got = call(args, data_format, is_training)
    for name, g, w in zip(GG_FIELDS, got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10 * np.abs(w).max(), err_msg=name)


def test_non_contiguous_inputs_are_read_through_copies(isa):
    args = list(make_case("NHWC", np.float32, (2, 16, 6), True))
    want = call(args, "NHWC", True)
    wide = [np.repeat(a, 2, axis=-1)[..., ::2] if a is not None and a.ndim > 1 else a
            for a in args]
    assert not wide[0].flags.c_contiguous
    got = call(wide, "NHWC", True)
    for name, a, b in zip(GG_FIELDS, want, got):
        assert a.tobytes() == b.tobytes(), name


# ---------------------------------------------------------------------------
# bad input


def good():
    return list(make_case("NHWC", np.float32, (2, 4, 3), True))


def test_grad_x_backprop_dtype_and_shape():
    a = good()
    a[5] = a[5].astype(np.float64)
    with pytest.raises(TypeError, match="grad_x_backprop"):
        call(a, "NHWC", True)
    a = good()
    a[5] = a[5][:1]
    with pytest.raises(ValueError, match="grad_x_backprop"):
        call(a, "NHWC", True)


@pytest.mark.parametrize("k,name", [(6, "grad_scale_backprop"), (7, "grad_offset_backprop"),
                                    (2, "scale"), (3, "reserve_space_1")])
def test_vector_lengths(k, name):
    a = good()
    a[k] = np.ones(4, np.float32)
    with pytest.raises(ValueError, match=name):
        call(a, "NHWC", True)


def test_y_backprop_dtype():
    a = good()
    a[0] = a[0].astype(np.float16)
    with pytest.raises(TypeError, match="y_backprop"):
        call(a, "NHWC", True)


def test_no_activation_or_side_input():
    with pytest.raises(TypeError):
        call(good(), "NHWC", True, activation="relu")
    with pytest.raises(TypeError):
        call(good(), "NHWC", True, side_input=good()[1])


def test_outputs_may_not_alias_inputs():
    a = good()
    with pytest.raises(ValueError, match="y_backprop_backprop"):
        call(a, "NHWC", True, out={"y_backprop_backprop": a[0]})
    with pytest.raises(ValueError, match="x_backprop"):
        call(a, "NHWC", True, out={"x_backprop": a[5]})


def test_out_dtype_checked():
    a = good()
    with pytest.raises((TypeError, ValueError), match="x_backprop"):
        call(a, "NHWC", True, out={"x_backprop": np.empty(a[1].shape, np.float64)})


def test_bfloat16_outputs_are_bfloat16():
    a = make_case("NCHW", BFLOAT16, (2, 9, 3), True)
    res = call(a, "NCHW", True)
    assert res.y_backprop_backprop.dtype == BFLOAT16 and res.x_backprop.dtype == BFLOAT16
    assert res.scale_backprop.dtype == np.float32


def test_gradient_penalty_matches_finite_differences():
    # README's example: d/d scale of 10 * (|d score / d x| - 1)^2, where the
    # critic's score is sum(w * y), against central differences of the
    # penalty computed with the float64 reference
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 3, 3, 5))
    scale, offset = rng.uniform(0.5, 1.5, 5), np.zeros(5)
    w = rng.standard_normal(x.shape)

    def penalty(s):
        f = reference.fused_batch_norm(x, s, offset)
        g = reference.fused_batch_norm_grad(w, x, s, f.reserve_space_1, f.reserve_space_2)
        return 10.0 * (np.sqrt(np.sum(g.x_backprop ** 2)) - 1.0) ** 2

    f = cfbn.fused_batch_norm(x, scale, offset)
    g = cfbn.fused_batch_norm_grad(w, x, scale, f.reserve_space_1, f.reserve_space_2)
    norm = np.sqrt(np.sum(g.x_backprop ** 2))
    ggx = 20.0 * (norm - 1.0) / norm * g.x_backprop
    gg = cfbn.fused_batch_norm_grad_grad(w, x, scale, f.reserve_space_1, f.reserve_space_2, ggx)
    h = 1e-6
    fd = [(penalty(scale + h * e) - penalty(scale - h * e)) / (2 * h) for e in np.eye(5)]
    np.testing.assert_allclose(gg.scale_backprop, fd, rtol=1e-6, atol=1e-6)
