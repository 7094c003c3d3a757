"""The float64 second-order gradient reference against what it claims to be.

``reference.fused_batch_norm_grad_grad`` evaluates docs/spec.md's closed forms.
They claim to be the derivatives of
``L = sum(ggx * dx) + sum(ggscale * dscale) + sum(ggoffset * doffset)``,
where ``(dx, dscale, doffset)`` is the first-order gradient, with respect to
``y_backprop``, ``x`` and ``scale``. So they are checked here against central
differences of the float64 first-order reference (which test_grad.py checks
against the forward), against PyTorch's double backward where torch is
installed, and for the properties that must hold exactly.
"""

import warnings

import numpy as np
import pytest

from cfbn import reference

import _gg_checks
from _checks import LAYOUTS, SHAPES, Unmodified, make_shape, random_vectors, random_x, seed_of

EPSILON = 1e-3
FIELDS = ("y_backprop_backprop", "x_backprop", "scale_backprop")
# which of (ggx, ggscale, ggoffset) are given; the others are passed as None
UPSTREAM = [(True, True, True), (False, True, True), (True, False, True), (True, True, False),
            (True, False, False), (False, True, False), (False, False, True)]


def upstream_id(given):
    return "+".join(n for n, g in zip(("ggx", "ggs", "ggo"), given) if g)


def make_case(data_format, is_training, shape_case, given=(True, True, True), seed=None):
    """Inputs of a grad-grad call: the gradient's inputs, then the upstream gradients.

    In training the reserve spaces are the batch statistics of x, as the
    forward pass hands them over.
    """
    rng = np.random.default_rng(seed_of("gg", data_format, is_training, shape_case, given, seed))
    shape = make_shape(data_format, *shape_case)
    c = shape_case[2]
    x = random_x(rng, shape, data_format, np.float64)
    dy = rng.standard_normal(shape)
    v = random_vectors(rng, c, np.float64)
    if is_training:
        fwd = reference.fused_batch_norm(x, v["scale"], v["offset"], epsilon=EPSILON,
                                         data_format=data_format)
        mu, var = fwd.reserve_space_1, fwd.reserve_space_2
    else:
        mu, var = v["mean"], v["variance"]
    upstream = (rng.standard_normal(shape), rng.standard_normal(c), rng.standard_normal(c))
    upstream = tuple(u if g else None for u, g in zip(upstream, given))
    return (dy, x, v["scale"], mu, var) + upstream


def grad_grad(args, data_format, is_training):
    return reference.fused_batch_norm_grad_grad(*args, epsilon=EPSILON, data_format=data_format,
                                                is_training=is_training)


# ---------------------------------------------------------------------------
# central differences of the first-order reference


def first_order_loss(args, data_format, is_training):
    """L(dy, x, scale), with the statistics recomputed from x in training."""
    _, _, _, mean, variance, ggx, ggs, ggo = args

    def loss(dy, x, scale):
        mu, var = mean, variance
        if is_training:
            fwd = reference.fused_batch_norm(x, scale, np.zeros_like(scale), epsilon=EPSILON,
                                             data_format=data_format)
            mu, var = fwd.reserve_space_1, fwd.reserve_space_2
        g = reference.fused_batch_norm_grad(dy, x, scale, mu, var, epsilon=EPSILON,
                                            data_format=data_format, is_training=is_training)
        total = 0.0
        for w, d in zip((ggx, ggs, ggo), g):
            if w is not None:
                total += float(np.sum(w * d))
        return total

    return loss


def partial_derivatives(loss, point, rel_step=1e-6):
    """Central differences of ``loss(*point)`` with respect to every element of every argument."""
    derivatives = []
    for k, a in enumerate(point):
        d = np.empty_like(a)
        for i in np.ndindex(a.shape):
            h = rel_step * max(1.0, abs(a[i]))
            values = []
            for sign in (1.0, -1.0):
                moved = list(point)
                moved[k] = a.copy()
                moved[k][i] += sign * h
                values.append(loss(*moved))
            d[i] = (values[0] - values[1]) / (2.0 * h)
        derivatives.append(d)
    return derivatives


def assert_near(name, got, want, rel):
    """Elementwise ``|got - want| <= rel * (1 + max|want|)``."""
    got = np.asarray(got)
    assert got.dtype == np.float64, f"{name}: dtype {got.dtype}"
    assert got.shape == want.shape, f"{name}: shape {got.shape}, expected {want.shape}"
    err = np.abs(got - want).max(initial=0.0)
    bound = rel * (1.0 + np.abs(want).max(initial=0.0))
    assert err <= bound, f"{name}: max |error| {err:.3e} > {bound:.3e}"


@pytest.mark.parametrize("given", UPSTREAM, ids=upstream_id)
@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
@pytest.mark.parametrize("data_format", LAYOUTS)
def test_matches_finite_differences(data_format, is_training, given):
    args = make_case(data_format, is_training, (3, 4, 3), given)
    want = partial_derivatives(first_order_loss(args, data_format, is_training), args[:3])
    got = grad_grad(args, data_format, is_training)
    assert isinstance(got, reference.BatchNormGradGrad)
    for name, g, w in zip(FIELDS, got, want):
        assert_near(name, g, w, 1e-7)


@pytest.mark.parametrize("shape_case", [(1, 1, 3), (2, 1, 3), (1, 2, 3)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW", "NC"])
def test_tiny_batches_match_finite_differences(data_format, shape_case):
    # n = 1 (σ² = 0) and n = 2 (x̂ = ±1 exactly) in training
    args = make_case(data_format, True, shape_case)
    want = partial_derivatives(first_order_loss(args, data_format, True), args[:3])
    for name, g, w in zip(FIELDS, grad_grad(args, data_format, True), want):
        assert_near(name, g, w, 1e-7)


@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
@pytest.mark.parametrize("data_format", LAYOUTS)
def test_y_backprop_backprop_is_the_forward_derivative(data_format, is_training):
    # L is linear in dy with coefficient J·(ggx, ggscale, ggoffset), J the
    # Jacobian of the forward y(x, scale, offset): an independent check of the
    # first output against the forward pass alone
    dy, x, scale, mean, variance, ggx, ggs, ggo = make_case(data_format, is_training, (3, 4, 3))
    offset = np.zeros_like(scale)
    stats = (None, None) if is_training else (mean, variance)

    def y_along(t):
        return reference.fused_batch_norm(x + t * ggx, scale + t * ggs, offset + t * ggo, *stats,
                                          epsilon=EPSILON, data_format=data_format,
                                          is_training=is_training).y

    h = 1e-6
    want = (y_along(h) - y_along(-h)) / (2 * h)
    got = grad_grad((dy, x, scale, mean, variance, ggx, ggs, ggo), data_format, is_training)
    assert_near("y_backprop_backprop", got.y_backprop_backprop, want, 1e-6)


# ---------------------------------------------------------------------------
# PyTorch's double backward


def torch_grad_grad(args, data_format, is_training):
    return _gg_checks.torch_grad_grad(args, data_format, is_training, EPSILON)


@pytest.mark.parametrize("given", UPSTREAM, ids=upstream_id)
@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
@pytest.mark.parametrize("data_format", LAYOUTS)
def test_matches_torch_double_backward(data_format, is_training, given):
    args = make_case(data_format, is_training, (3, 4, 3), given)
    want = torch_grad_grad(args, data_format, is_training)
    for name, g, w in zip(FIELDS, grad_grad(args, data_format, is_training), want):
        assert_near(name, g, w, 1e-12)


@pytest.mark.parametrize("shape_case", [s for s in SHAPES if s[0] > 0],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
@pytest.mark.parametrize("data_format", LAYOUTS)
def test_matches_torch_on_test_shapes(data_format, is_training, shape_case):
    # larger n, C = 1 and one element per channel (n = 1, where PyTorch, too,
    # keeps everything finite)
    args = make_case(data_format, is_training, shape_case)
    want = torch_grad_grad(args, data_format, is_training)
    for name, g, w in zip(FIELDS, grad_grad(args, data_format, is_training), want):
        assert_near(name, g, w, 1e-11)


# ---------------------------------------------------------------------------
# properties that hold exactly


@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
@pytest.mark.parametrize("data_format", LAYOUTS)
def test_empty_batch(data_format, is_training):
    # the training forward of an empty batch returns NaN statistics, and those
    # are what the gradient calls get back
    shape = make_shape(data_format, 0, 4, 3)
    x = np.zeros(shape)
    nan = np.full(3, np.nan)
    stats = (nan, nan) if is_training else (np.zeros(3), np.ones(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = reference.fused_batch_norm_grad_grad(
            x, x, np.ones(3), *stats, x, np.ones(3), np.ones(3), data_format=data_format,
            is_training=is_training)
    assert res.y_backprop_backprop.shape == shape and res.x_backprop.shape == shape
    assert res.scale_backprop.shape == (3,) and np.all(res.scale_backprop == 0)


@pytest.mark.parametrize("data_format", LAYOUTS)
def test_one_element_per_channel_in_training(data_format):
    # σ² = 0, so x̂ = 0 whatever x is: dx = 0 and dscale = 0 identically and
    # doffset = dy, hence L = Σ ggoffset·dy
    dy, x, scale, mu, var, ggx, ggs, ggo = make_case(data_format, True, (1, 1, 4))
    assert np.all(var == 0)
    res = reference.fused_batch_norm_grad_grad(dy, x, scale, mu, var, ggx, ggs, ggo,
                                               epsilon=EPSILON, data_format=data_format)
    axis = reference.channel_axis(data_format, x.ndim)
    assert np.array_equal(res.y_backprop_backprop, np.broadcast_to(
        ggo.reshape([-1 if a == axis else 1 for a in range(x.ndim)]), x.shape))
    assert np.all(res.x_backprop == 0)
    assert np.all(res.scale_backprop == 0)


@pytest.mark.parametrize("position", [0, 1, 2])
@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
@pytest.mark.parametrize("data_format", LAYOUTS)
def test_none_means_zeros(data_format, is_training, position):
    args = list(make_case(data_format, is_training, (2, 4, 3)))
    zeros = np.zeros_like(args[5 + position])
    with_none = grad_grad(args[:5 + position] + [None] + args[6 + position:], data_format,
                          is_training)
    args[5 + position] = zeros
    for name, a, b in zip(FIELDS, with_none, grad_grad(args, data_format, is_training)):
        assert a.tobytes() == b.tobytes(), name


@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
@pytest.mark.parametrize("data_format", LAYOUTS)
def test_unaffected_outputs_are_exact_zeros(data_format, is_training):
    # with only ggoffset, L = Σ ggoffset·Σdy does not depend on x or scale
    args = make_case(data_format, is_training, (2, 4, 3), (False, False, True))
    res = grad_grad(args, data_format, is_training)
    assert np.all(res.x_backprop == 0) and np.all(res.scale_backprop == 0)


@pytest.mark.parametrize("x_dtype, vector_dtype",
                         [(np.float32, np.float32), (np.float16, np.float32),
                          (np.float16, np.float16), (np.float64, np.float32)])
@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_narrow_inputs_are_evaluated_in_float64(data_format, is_training, x_dtype,
                                                vector_dtype):
    # the reference rounds nothing: narrow inputs give, bit for bit, the float64
    # result for the values they hold, which a kernel's output is then
    # compared with
    args = make_case(data_format, is_training, (2, 5, 3))
    narrow = [a.astype(x_dtype if a.ndim > 1 else vector_dtype) for a in args]
    wide = [a.astype(np.float64) for a in narrow]
    with Unmodified(*narrow):
        got = grad_grad(narrow, data_format, is_training)
    for name, a, b in zip(FIELDS, got, grad_grad(wide, data_format, is_training)):
        assert a.dtype == np.float64, name
        assert a.tobytes() == b.tobytes(), name


@pytest.mark.parametrize("data_format", LAYOUTS)
def test_nan_stays_in_its_channel(data_format):
    dy, x, scale, _, _, ggx, ggs, ggo = make_case(data_format, True, (2, 4, 3))
    axis = reference.channel_axis(data_format, x.ndim)
    index = [0] * x.ndim
    index[axis] = 1
    x[tuple(index)] = np.nan
    fwd = reference.fused_batch_norm(x, scale, np.zeros(3), epsilon=EPSILON,
                                     data_format=data_format)
    res = reference.fused_batch_norm_grad_grad(
        dy, x, scale, fwd.reserve_space_1, fwd.reserve_space_2, ggx, ggs, ggo,
        epsilon=EPSILON, data_format=data_format)
    for name, out in zip(FIELDS, res):
        per_channel = np.moveaxis(out, axis, 0).reshape(3, -1) if out.ndim > 1 else out[:, None]
        assert np.all(np.isnan(per_channel[1])), name
        assert np.all(np.isfinite(per_channel[[0, 2]])), name


def test_inputs_are_not_modified():
    args = make_case("NCHW", True, (2, 4, 3))
    with Unmodified(*args):
        grad_grad(args, "NCHW", True)


BAD_ARGUMENTS = [
    ("y_backprop", lambda a: a[0][:1]),
    ("grad_x_backprop", lambda a: a[5][:1]),
    ("grad_x_backprop", lambda a: a[5][..., :2]),
    ("scale", lambda a: a[2][:2]),
    ("reserve_space_1", lambda a: np.append(a[3], 0.0)),
    ("reserve_space_2", lambda a: a[4][:, None]),
    ("grad_scale_backprop", lambda a: a[6][:1]),
    ("grad_offset_backprop", lambda a: np.float64(1.0)),
]


@pytest.mark.parametrize("name, spoil", BAD_ARGUMENTS,
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(BAD_ARGUMENTS)])
def test_wrong_shapes_name_the_argument(name, spoil):
    args = list(make_case("NHWC", True, (2, 4, 3)))
    position = ("y_backprop", "x", "scale", "reserve_space_1", "reserve_space_2",
                "grad_x_backprop", "grad_scale_backprop", "grad_offset_backprop").index(name)
    args[position] = spoil(args)
    with pytest.raises(ValueError, match=name):
        grad_grad(args, "NHWC", True)


def test_layout_errors():
    args = make_case("NHWC", True, (2, 4, 3))
    with pytest.raises(ValueError, match="data_format"):
        reference.fused_batch_norm_grad_grad(*args, data_format="HWCN")
    with pytest.raises(ValueError, match="rank"):
        reference.fused_batch_norm_grad_grad(*args, data_format="NCDHW")


def test_takes_no_activation():
    args = make_case("NHWC", True, (2, 4, 3))
    with pytest.raises(TypeError, match="activation"):
        reference.fused_batch_norm_grad_grad(*args, activation="relu")
