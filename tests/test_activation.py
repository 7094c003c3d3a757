"""Fused activation and side input, forward and gradient, against the float64 reference.

Bounds: the pre-activation gets the plain forward's bound (plus a rounding of
the side input); the activation then adds L times that (L bounds |act'|) and
8 units of max(1, |act|), the error of the vectorized exp/tanh.  The gradient
differentiates at the recomputed pre-activation: act' is off by L2 times the
pre-activation's error (L2 bounds |act''|) plus 8 units, or by the whole jump
where the pre-activation is that close to a kink; that error of g = dy * act'
is carried through the gradient's sums.
"""
import numpy as np
import pytest

import cfbn
from cfbn import reference

from _checks import (
    DTYPES,
    LAYOUTS,
    Unmodified,
    forward_buffers,
    grad_buffers,
    make_shape,
    nan_like,
    random_vectors,
    random_x,
    seed_of,
    vector_dtype,
)

from _act_checks import (ACTIVATIONS, ALPHA, FUSIONS, check_fused_forward, check_fused_grad,
                         make_case)

# (batch, spatial, channels); the last has enough small planes per channel
# for the run kernels that take 8 runs at a time
SHAPES = [(3, 33, 17), (1, 7, 257), (2, 5, 3), (19, 7, 5)]


def _ids(v):
    return "none" if v is None else str(v)


# training on every shape, inference on one
MODES = [(True, s) for s in SHAPES] + [(False, SHAPES[0])]


def _fusion_id(v):
    return _ids(v) if not isinstance(v, bool) else ("side" if v else "noside")


def _mode_id(v):
    return ("train" if v else "infer") if isinstance(v, bool) else "x".join(map(str, v))


@pytest.mark.parametrize("is_training,shape_case", MODES, ids=_mode_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("act,with_side", FUSIONS, ids=_fusion_id)
def test_forward(isa, act, data_format, dtype, with_side, is_training, shape_case):
    x, v, side, _ = make_case(data_format, dtype, shape_case,
                              seed_of("act-fwd", act, data_format, np.dtype(dtype).name,
                                      with_side, shape_case), with_side)
    alpha = ALPHA.get(act)
    mean, var = (None, None) if is_training else (v["mean"], v["variance"])
    out = forward_buffers(x.shape, shape_case[2], dtype)
    with Unmodified(x, side, *v.values()):
        got = cfbn.fused_batch_norm(x, v["scale"], v["offset"], mean, var, epsilon=1e-3,
                                    data_format=data_format, is_training=is_training,
                                    activation=act, alpha=alpha, side_input=side, out=out)
    assert all(a is b for a, b in zip(got, out))
    check_fused_forward(got, x, v["scale"], v["offset"], mean, var, side, act, alpha, epsilon=1e-3,
                        data_format=data_format, is_training=is_training)


@pytest.mark.parametrize("is_training,shape_case", MODES, ids=_mode_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("act,with_side", FUSIONS, ids=_fusion_id)
def test_grad(isa, act, data_format, dtype, with_side, is_training, shape_case):
    x, v, side, dy = make_case(data_format, dtype, shape_case,
                               seed_of("act-grad", act, data_format, np.dtype(dtype).name,
                                       with_side, shape_case), with_side)
    alpha = ALPHA.get(act)
    vdt = vector_dtype(dtype)
    if is_training:
        fwd = reference.fused_batch_norm(x, v["scale"], v["offset"], data_format=data_format)
        mu, var = fwd.reserve_space_1.astype(vdt), fwd.reserve_space_2.astype(vdt)
    else:
        mu, var = v["mean"], v["variance"]
    out = grad_buffers(x.shape, shape_case[2], dtype)
    if with_side:
        out.append(nan_like(x.shape, dtype))
    with Unmodified(dy, x, side, *v.values()):
        got = cfbn.fused_batch_norm_grad(dy, x, v["scale"], mu, var, epsilon=1e-3,
                                         data_format=data_format, is_training=is_training,
                                         offset=v["offset"], activation=act, alpha=alpha,
                                         side_input=side, out=out)
    assert isinstance(got, cfbn.BatchNormGradSide if with_side else cfbn.BatchNormGrad)
    assert all(a is b for a, b in zip(got, out))
    check_fused_grad(got, dy, x, v["scale"], v["offset"], mu, var, side, act, alpha, epsilon=1e-3,
                     data_format=data_format, is_training=is_training)


def _loss(x, scale, offset, side, w, act, alpha, data_format, is_training, mean, var):
    y = reference.fused_batch_norm(x, scale, offset, mean, var, epsilon=1e-3,
                                   data_format=data_format, is_training=is_training,
                                   activation=act, alpha=alpha, side_input=side).y
    return float(np.sum(w * y))


@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW", "NC"])
@pytest.mark.parametrize("act", ["elu", "sigmoid", "tanh", "silu"])
def test_grad_finite_differences(act, data_format, is_training):
    """Central differences of the float64 reference's loss sum(dy * y)."""
    rng = np.random.default_rng(seed_of("act-fd", act, data_format, is_training))
    shape = make_shape(data_format, 2, 6, 3)
    x = random_x(rng, shape, data_format, np.float64)
    v = random_vectors(rng, 3, np.float64)
    side = rng.standard_normal(shape)
    w = rng.standard_normal(shape)
    alpha = 1.0 if act == "elu" else None   # elu with alpha 1 is smooth at 0
    mean, var = (None, None) if is_training else (v["mean"], v["variance"])
    fwd = cfbn.fused_batch_norm(x, v["scale"], v["offset"], mean, var, epsilon=1e-3,
                                data_format=data_format, is_training=is_training,
                                activation=act, alpha=alpha, side_input=side)
    got = cfbn.fused_batch_norm_grad(w, x, v["scale"], fwd.reserve_space_1, fwd.reserve_space_2,
                                     epsilon=1e-3, data_format=data_format,
                                     is_training=is_training, offset=v["offset"],
                                     activation=act, alpha=alpha, side_input=side)
    h = 1e-6
    args = dict(act=act, alpha=alpha, data_format=data_format, is_training=is_training,
                mean=mean, var=var)

    def fd(name, arr, i):
        inputs = {"x": x, "scale": v["scale"], "offset": v["offset"], "side": side}
        plus = {k: a.copy() for k, a in inputs.items()}
        minus = {k: a.copy() for k, a in inputs.items()}
        plus[name][i] += h
        minus[name][i] -= h
        lp = _loss(plus["x"], plus["scale"], plus["offset"], plus["side"], w, **args)
        lm = _loss(minus["x"], minus["scale"], minus["offset"], minus["side"], w, **args)
        return (lp - lm) / (2 * h)

    for i in np.ndindex(*shape):
        np.testing.assert_allclose(got.x_backprop[i], fd("x", x, i), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got.side_input_backprop[i], fd("side", side, i),
                                   rtol=1e-5, atol=1e-6)
    for c in range(3):
        np.testing.assert_allclose(got.scale_backprop[c], fd("scale", v["scale"], (c,)),
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got.offset_backprop[c], fd("offset", v["offset"], (c,)),
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("act", ["relu", "relu6", "leaky_relu", "elu"])
def test_derivative_at_kinks(isa, act):
    """relu'(0) = 0, relu6'(0) = relu6'(6) = 0, leaky_relu'(0) = elu'(0) = alpha."""
    # inference with mean 0, variance 1, epsilon 0, scale 1, offset 0: pre = x exactly
    x = np.array([[0.0, 6.0, -1.0, 2.0]], np.float32)
    ones, zeros = np.ones(4, np.float32), np.zeros(4, np.float32)
    dy = np.ones_like(x)
    g = cfbn.fused_batch_norm_grad(dy, x, ones, zeros, ones, epsilon=0.0, data_format="NC",
                                   is_training=False, offset=zeros, activation=act)
    alpha = {"leaky_relu": 0.01, "elu": 1.0}.get(act, 0.0)
    want = {"relu": [0, 1, 0, 1], "relu6": [0, 0, 0, 1],
            "leaky_relu": [alpha, 1, alpha, 1], "elu": [alpha, 1, np.exp(-1.0), 1]}[act]
    np.testing.assert_allclose(g.x_backprop[0], want, rtol=1e-6)
    np.testing.assert_array_equal(reference.activation_grad([0.0, 6.0], act)[:1], want[:1])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("act", ["sigmoid", "silu", "tanh", "elu"])
def test_far_tails_round_as_the_reference(isa, act, dtype):
    """Pre-activations of |v| from 89 to 1e4, enough of them for every lane
    count: where the exact activation or derivative is below float's
    normal range (sigmoid and silu far left, elu' far left) the kernels give
    exactly the reference rounded to the storage type, a zero (a float such
    as 1 / (1 + e^88) = 6e-39, which bfloat16 keeps, would be a value the
    reference does not have); elsewhere exactly +-1, -alpha or v."""
    v = np.array([-1e4, -1000.0, -200.0, -110.0, 89.0, 110.0, 200.0, 1e4] * 5)
    x = v.astype(dtype)[None, :]
    n = x.shape[1]
    vdt = vector_dtype(dtype)
    ones, zeros = np.ones(n, vdt), np.zeros(n, vdt)
    # inference with mean 0, variance 1, epsilon 0, scale 1, offset 0: pre = x exactly
    y = cfbn.fused_batch_norm(x, ones, zeros, zeros, ones, epsilon=0.0, data_format="NC",
                              is_training=False, activation=act).y
    want = reference.activation(x.astype(np.float64), act).astype(dtype)
    np.testing.assert_array_equal(y.astype(np.float64), want.astype(np.float64))
    g = cfbn.fused_batch_norm_grad(np.ones_like(x), x, ones, zeros, ones, epsilon=0.0, data_format="NC",
                                   is_training=False, offset=zeros, activation=act).x_backprop
    gwant = reference.activation_grad(x.astype(np.float64), act).astype(dtype)
    np.testing.assert_array_equal(g.astype(np.float64), gwant.astype(np.float64))


@pytest.mark.parametrize("act", ACTIVATIONS[1:], ids=_ids)
def test_nan_propagates(isa, act):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 5, 5, 3)).astype(np.float32)
    x[1, 2, 3, 1] = np.nan
    s, o = np.ones(3, np.float32), np.zeros(3, np.float32)
    y = cfbn.fused_batch_norm(x, s, o, activation=act)
    assert np.isnan(y.y[..., 1]).all() and not np.isnan(y.y[..., [0, 2]]).any()
    g = cfbn.fused_batch_norm_grad(np.ones_like(x), x, s, y.reserve_space_1, y.reserve_space_2,
                                   offset=o, activation=act)
    assert np.isnan(g.x_backprop[..., 1]).all() and not np.isnan(g.x_backprop[..., [0, 2]]).any()
    assert np.isnan(g.scale_backprop[1]) and np.isnan(g.offset_backprop[1])


def test_in_place_on_side_input_and_dy(isa):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 9, 7, 19)).astype(np.float32)
    side = rng.standard_normal(x.shape).astype(np.float32)
    s, o = np.ones(19, np.float32), np.zeros(19, np.float32)
    want = cfbn.fused_batch_norm(x, s, o, activation="relu", side_input=side)
    buf = side.copy()
    got = cfbn.fused_batch_norm(x, s, o, activation="relu", side_input=buf, out={"y": buf})
    assert got.y is buf
    np.testing.assert_array_equal(buf, want.y)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    gw = cfbn.fused_batch_norm_grad(dy, x, s, want.reserve_space_1, want.reserve_space_2,
                                    offset=o, activation="silu", side_input=side)
    dyb = dy.copy()
    gg = cfbn.fused_batch_norm_grad(dyb, x, s, want.reserve_space_1, want.reserve_space_2,
                                    offset=o, activation="silu", side_input=side,
                                    out={"x_backprop": dyb})
    assert gg.x_backprop is dyb
    np.testing.assert_array_equal(dyb, gw.x_backprop)
    np.testing.assert_array_equal(gg.side_input_backprop, gw.side_input_backprop)


# channels-last rows of 16 and 40 columns, channels-first planes of 49
# (several runs per call) and of 1024 (one task per channel)
STORED_G_SHAPES = [("NHWC", (4, 9, 9, 16)), ("NHWC", (3, 5, 7, 40)), ("NCHW", (32, 7, 7, 7)),
                   ("NCHW", (8, 32, 32, 32))]


@pytest.mark.parametrize("layout,shape", STORED_G_SHAPES, ids=lambda v: v if isinstance(v, str) else
                         "x".join(map(str, v)))
@pytest.mark.parametrize("act", ["silu", "tanh", "elu", "relu"])
@pytest.mark.parametrize("with_side", [False, True], ids=["noside", "side"])
def test_stored_g_keeps_the_bits(isa, layout, shape, act, with_side):
    """A float32 gradient whose sums pass stores g (in side_input_backprop,
    else in x_backprop) gives the bits of the one that forms g twice, which
    the driver takes when the output that would hold g is an input's memory
    (here dy's)."""
    check_stored_g_keeps_the_bits(layout, shape, act, with_side)


@pytest.mark.parametrize("layout,shape", [("NHWC", (32, 56, 56, 64)), ("NCHW", (32, 64, 56, 56))],
                         ids=["NHWC", "NCHW"])
@pytest.mark.parametrize("act", ["relu", "silu"])
def test_stored_g_keeps_the_bits_when_streaming(isa, layout, shape, act):
    """The same at a size where the router asks for streaming stores (the
    gradient's passes touch more than 64 MiB), with a side input: there the
    sums pass stores g where the output that holds it is free, and the
    elementwise pass writes with regular stores where streaming two outputs
    was slower (bn_simd_fused.c, fgapply_nt)."""
    check_stored_g_keeps_the_bits(layout, shape, act, True)


def check_stored_g_keeps_the_bits(layout, shape, act, with_side):
    rng = np.random.default_rng(seed_of(layout, shape, act, with_side))
    C = shape[-1] if layout == "NHWC" else shape[1]
    x = (rng.standard_normal(shape) * 3 + 2).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    side = rng.standard_normal(shape).astype(np.float32) if with_side else None
    s = rng.uniform(0.5, 2, C).astype(np.float32)
    o = rng.standard_normal(C).astype(np.float32)
    f = cfbn.fused_batch_norm(x, s, o, data_format=layout, activation=act, side_input=side)
    kw = dict(data_format=layout, offset=o, activation=act, side_input=side)
    stored = cfbn.fused_batch_norm_grad(dy, x, s, f.reserve_space_1, f.reserve_space_2, **kw)
    dyb = dy.copy()
    out = {"side_input_backprop": dyb} if with_side else {"x_backprop": dyb}
    twice = cfbn.fused_batch_norm_grad(dyb, x, s, f.reserve_space_1, f.reserve_space_2, out=out, **kw)
    for a, b in zip(stored, twice):
        if a is not None:
            np.testing.assert_array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_thread_count_does_not_matter(isa, layout):
    rng = np.random.default_rng(11)
    shape = (8, 32, 32, 24) if layout == "NHWC" else (8, 24, 32, 32)
    x = rng.standard_normal(shape).astype(np.float32)
    side = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    s = rng.uniform(0.5, 2, 24).astype(np.float32)
    o = rng.standard_normal(24).astype(np.float32)
    res = []
    for nt in (1, 3, 8):
        f = cfbn.fused_batch_norm(x, s, o, data_format=layout, activation="tanh",
                                  side_input=side, n_threads=nt)
        g = cfbn.fused_batch_norm_grad(dy, x, s, f.reserve_space_1, f.reserve_space_2,
                                       data_format=layout, offset=o, activation="tanh",
                                       side_input=side, n_threads=nt)
        res.append((f, g))
    for f, g in res[1:]:
        for a, b in zip(f + g, res[0][0] + res[0][1]):
            np.testing.assert_array_equal(a, b)


def test_plain_call_keeps_three_fields():
    x = np.ones((2, 3), np.float32)
    s = np.ones(3, np.float32)
    g = cfbn.fused_batch_norm_grad(x, x, s, s, s, activation=None, side_input=None,
                                   data_format="NC")
    assert type(g) is cfbn.BatchNormGrad and len(g) == 3
    g = cfbn.fused_batch_norm_grad(x, x, s, s, s, offset=s, activation="relu", data_format="NC")
    assert type(g) is cfbn.BatchNormGrad


def test_errors():
    x = np.ones((2, 3), np.float32)
    s = np.ones(3, np.float32)
    kw = {"data_format": "NC"}
    with pytest.raises(ValueError, match="activation"):
        cfbn.fused_batch_norm(x, s, s, activation="gelu", **kw)
    with pytest.raises(ValueError, match="alpha"):
        cfbn.fused_batch_norm(x, s, s, activation="relu", alpha=0.1, **kw)
    with pytest.raises(ValueError, match="alpha"):
        cfbn.fused_batch_norm(x, s, s, alpha=0.1, **kw)
    with pytest.raises(ValueError, match="alpha"):
        cfbn.fused_batch_norm(x, s, s, activation="elu", alpha=float("nan"), **kw)
    with pytest.raises(TypeError, match="alpha"):
        cfbn.fused_batch_norm(x, s, s, activation="elu", alpha="big", **kw)
    with pytest.raises(ValueError, match="side_input"):
        cfbn.fused_batch_norm(x, s, s, side_input=np.ones((3, 2), np.float32), **kw)
    with pytest.raises(TypeError, match="side_input"):
        cfbn.fused_batch_norm(x, s, s, side_input=np.ones((2, 3), np.float64), **kw)
    with pytest.raises(ValueError, match="offset"):
        cfbn.fused_batch_norm_grad(x, x, s, s, s, activation="relu", **kw)
    with pytest.raises(ValueError, match="activation"):
        cfbn.fused_batch_norm_grad(x, x, s, s, s, offset=s, activation="Relu", **kw)
    with pytest.raises(ValueError, match="side_input_backprop"):
        cfbn.fused_batch_norm_grad(x, x, s, s, s, out={"side_input_backprop": x.copy()}, **kw)
    with pytest.raises(ValueError, match="4 entries"):
        cfbn.fused_batch_norm_grad(x, x, s, s, s, side_input=x, out=(None, None, None), **kw)


def test_one_list_of_activations():
    """cfbn._args.ACTIVATIONS is the one list: the reference's formulas and
    defaults and these tests' list name exactly its activations, and a name
    outside it is refused, never computed as another."""
    from cfbn import _args
    names = set(_args.ACTIVATIONS)
    assert set(reference.ACTIVATIONS) == names
    assert set(reference._FORMULAS) == names - {None}
    assert set(ACTIVATIONS) == names
    for name, (_, default) in _args.ACTIVATIONS.items():
        assert reference.ACTIVATIONS[name] == default
    v = np.array([-1.0, 0.5])
    for bad in ("gelu", "RELU", 3):
        with pytest.raises(ValueError):
            reference.activation(v, bad)
        with pytest.raises(ValueError):
            reference.activation_grad(v, bad)
