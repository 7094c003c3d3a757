"""NaN and Inf in the inputs, and epsilon 0 over a constant channel.

What cfbn does with them (the behaviour these tests pin down):

- A NaN or Inf in ``x``, ``scale``, ``offset``, ``dy``, or in the statistics of
  one channel makes only that channel's outputs non-finite; every other
  channel's outputs are bit for bit those of the same call without it.
- Within the affected channel an output is non-finite exactly where the
  float64 reference (the formulas of docs/spec.md) is: in training a NaN in ``x``
  reaches the channel's statistics and so all of its ``y``; in inference it
  reaches only the ``y`` at its own position; ``scale`` and ``offset`` never
  reach the statistics; an infinite running variance gives ``y = offset``.
- With ``epsilon = 0`` a constant channel has ``sigma^2 = 0``, so
  ``y = gamma * 0 / 0 + beta`` is NaN (the statistics stay finite and exact);
  in inference with a zero variance, ``y = +-Inf`` wherever ``x != mean``.
- float16 and bfloat16 outputs are the float32 result rounded to nearest
  even: ties go to the even neighbour, NaN stays NaN, +-Inf stays +-Inf, and
  a finite value at or beyond the largest one plus half an ulp becomes Inf.
- None of this crashes, hangs or warns from C.
"""

import numpy as np
import pytest

import cfbn
from cfbn import reference

from _checks import (BFLOAT16, DTYPES, HALF_DTYPES, finfo, make_shape, random_vectors, random_x,
                     seed_of, vector_dtype)

FORMATS = ["NHWC", "NCHW", "NC", "NDHWC", "NCDHW"]
C, K = 5, 2          # channels; the channel that gets the special value
NAN, INF = float("nan"), float("inf")

# finite results of an affected channel only need to be right, not precise:
# precision is the other tests' business
RTOL = {np.dtype(np.float64): 1e-9, np.dtype(np.float32): 1e-4, np.dtype(np.float16): 2e-2,
        BFLOAT16: 6e-2}


def setup(data_format, dtype, batch=2, spatial=15):
    shape = make_shape(data_format, batch, spatial, C)
    rng = np.random.default_rng(seed_of("special", data_format, np.dtype(dtype).name, shape))
    x = random_x(rng, shape, data_format, dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    return x, dy, random_vectors(rng, C, dtype)


def axis_of(data_format, a):
    return reference.channel_axis(data_format, a.ndim) if a.ndim > 1 else 0


def channel(a, data_format, c):
    a = np.asarray(a)
    return np.take(a, c, axis=axis_of(data_format, a))


def poke(a, data_format, c, value, where="one"):
    """A copy of ``a`` with ``value`` at one element (or all) of channel ``c``."""
    a = a.copy()
    m = np.moveaxis(a, axis_of(data_format, a), 0)
    rest = m.shape[1:]
    if where == "one" and rest:
        m[(c,) + np.unravel_index(int(np.prod(rest)) // 2, rest)] = value
    else:
        m[c] = value
    changed = channel(a, data_format, c)
    assert (np.isnan(changed) if value != value else changed == value).any()
    return a


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def check_channels(name, got, clean, ref, data_format, affected):
    """Unaffected channels as in ``clean``, bit for bit; affected ones like ``ref``."""
    got = np.asarray(got)
    for c in range(C):
        g = channel(got, data_format, c)
        if c not in affected:
            assert same_bits(g, channel(clean, data_format, c)), \
                f"{name}: channel {c} changed by a special value in channel(s) {affected}"
            continue
        r = channel(ref, data_format, c).astype(np.float64)
        g64 = g.astype(np.float64)
        bad = np.isfinite(g64) != np.isfinite(r)
        assert not bad.any(), (
            f"{name}: channel {c}: {int(bad.sum())} of {r.size} elements finite in one and not "
            f"the other; first at {np.argwhere(bad)[0]}: got {g64[bad][0]!r}, "
            f"reference {r[bad][0]!r}")
        fin = np.isfinite(r)
        if fin.any():
            scale = np.max(np.abs(r[fin])) + 1.0
            err = np.abs(g64[fin] - r[fin])
            assert np.all(err <= RTOL[got.dtype] * scale), \
                f"{name}: channel {c}: finite values off by up to {err.max():.3g}"


def forward(x, v, data_format, training, epsilon=1e-3):
    kw = dict(epsilon=epsilon, data_format=data_format, is_training=training,
              exponential_avg_factor=1.0 if not training else 0.5)
    got = cfbn.fused_batch_norm(x, v["scale"], v["offset"], v["mean"], v["variance"], **kw)
    ref = reference.fused_batch_norm(x, v["scale"], v["offset"], v["mean"], v["variance"], **kw)
    return got, ref


def grad(dy, x, v, mu, var, data_format, training, epsilon=1e-3):
    kw = dict(epsilon=epsilon, data_format=data_format, is_training=training)
    got = cfbn.fused_batch_norm_grad(dy, x, v["scale"], mu, var, **kw)
    with np.errstate(all="ignore"):
        ref = reference.fused_batch_norm_grad(dy, x, v["scale"], mu, var, **kw)
    return got, ref


# (id, input that gets the value, value, one element or the whole channel, modes)
FORWARD_CASES = [
    ("x-nan", "x", NAN, "one", (True, False)),
    ("x-inf", "x", INF, "one", (True, False)),
    ("x-neg-inf", "x", -INF, "one", (True, False)),
    ("x-all-inf", "x", INF, "all", (True, False)),
    ("scale-nan", "scale", NAN, "one", (True, False)),
    ("scale-inf", "scale", INF, "one", (True, False)),
    ("offset-nan", "offset", NAN, "one", (True, False)),
    ("offset-inf", "offset", -INF, "one", (True, False)),
    ("mean-nan", "mean", NAN, "one", (True, False)),
    ("mean-inf", "mean", INF, "one", (False,)),
    ("variance-nan", "variance", NAN, "one", (True, False)),
    ("variance-inf", "variance", INF, "one", (False,)),
    ("variance-negative", "variance", -4.0, "one", (False,)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("data_format", FORMATS)
@pytest.mark.parametrize("case", FORWARD_CASES, ids=lambda c: c[0])
def test_forward_special_values_stay_in_their_channel(isa, case, data_format, dtype):
    _, what, value, where, modes = case
    x, _, v = setup(data_format, dtype)
    for training in modes:
        clean, _ = forward(x, v, data_format, training)
        if what == "x":
            x2, v2 = poke(x, data_format, K, value, where), v
        else:
            x2, v2 = x, dict(v, **{what: poke(v[what], data_format, K, value, where)})
        got, ref = forward(x2, v2, data_format, training)
        for name in cfbn.BatchNormOutput._fields:
            check_channels(f"{name} (training={training})", getattr(got, name),
                           getattr(clean, name), getattr(ref, name), data_format, {K})


# (id, input that gets the value, value, modes)
GRAD_CASES = [
    ("dy-nan", "dy", NAN),
    ("dy-inf", "dy", INF),
    ("x-nan", "x", NAN),
    ("x-inf", "x", -INF),
    ("scale-nan", "scale", NAN),
    ("scale-inf", "scale", INF),
    ("mean-nan", "mu", NAN),
    ("variance-nan", "var", NAN),
    ("variance-inf", "var", INF),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("data_format", FORMATS)
@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: c[0])
@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
def test_grad_special_values_stay_in_their_channel(isa, case, data_format, dtype, training):
    _, what, value = case
    x, dy, v = setup(data_format, dtype)
    fwd = cfbn.fused_batch_norm(x, v["scale"], v["offset"], epsilon=1e-3, data_format=data_format)
    mu, var = (fwd.reserve_space_1, fwd.reserve_space_2) if training else (v["mean"], v["variance"])
    clean, _ = grad(dy, x, v, mu, var, data_format, training)
    args = dict(dy=dy, x=x, v=v, mu=mu, var=var)
    if what in ("dy", "x", "mu", "var"):
        args[what] = poke(args[what], data_format, K, value)
    else:
        args["v"] = dict(v, **{what: poke(v[what], data_format, K, value)})
    got, ref = grad(args["dy"], args["x"], args["v"], args["mu"], args["var"], data_format,
                    training)
    for name in cfbn.BatchNormGrad._fields:
        check_channels(name, getattr(got, name), getattr(clean, name), getattr(ref, name),
                       data_format, {K})


# ---- epsilon 0 ----

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("data_format", FORMATS)
def test_epsilon_zero_constant_channel_training(isa, data_format, dtype):
    """sigma^2 = 0 exactly, so y = gamma * 0/0 + beta = NaN in that channel only."""
    x, dy, v = setup(data_format, dtype)
    level = np.asarray(0.3, dtype).item()       # not a power of two: the mean must be exact anyway
    x = poke(x, data_format, K, level, "all")
    got = cfbn.fused_batch_norm(x, v["scale"], v["offset"], epsilon=0.0, data_format=data_format)
    vdt = vector_dtype(dtype)
    assert got.reserve_space_1[K] == np.asarray(level, vdt)
    assert got.reserve_space_2[K] == 0 and got.batch_variance[K] == 0
    assert np.isnan(channel(got.y, data_format, K)).all()
    others = [c for c in range(C) if c != K]
    for c in others:
        assert np.isfinite(channel(got.y, data_format, c)).all()
        assert got.reserve_space_2[c] > 0

    g = cfbn.fused_batch_norm_grad(dy, x, v["scale"], got.reserve_space_1, got.reserve_space_2,
                                   epsilon=0.0, data_format=data_format)
    # r = 1/sqrt(0) = Inf and x_hat = 0 * Inf: NaN wherever x_hat enters
    assert np.isnan(channel(g.x_backprop, data_format, K)).all()
    assert np.isnan(g.scale_backprop[K])
    want = channel(dy, data_format, K).astype(np.float64).sum()
    assert abs(float(g.offset_backprop[K]) - want) <= RTOL[np.dtype(dtype)] * (1 + abs(want)) * 10
    for c in others:
        assert np.isfinite(channel(g.x_backprop, data_format, c)).all()
    assert np.isfinite(np.delete(g.scale_backprop, K)).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("data_format", FORMATS)
def test_epsilon_zero_one_element_per_channel(isa, data_format, dtype):
    """n = 1: every channel is constant; every y is NaN, nothing crashes."""
    x, dy, v = setup(data_format, dtype, batch=1, spatial=1)
    got = cfbn.fused_batch_norm(x, v["scale"], v["offset"], epsilon=0.0, data_format=data_format)
    assert np.isnan(got.y).all()
    assert np.array_equal(got.reserve_space_1, x.reshape(-1).astype(got.reserve_space_1.dtype))
    assert (got.reserve_space_2 == 0).all() and (got.batch_variance == 0).all()
    g = cfbn.fused_batch_norm_grad(dy, x, v["scale"], got.reserve_space_1, got.reserve_space_2,
                                   epsilon=0.0, data_format=data_format)
    assert np.isnan(g.x_backprop).all() and np.isnan(g.scale_backprop).all()
    assert np.array_equal(g.offset_backprop, dy.reshape(-1).astype(g.offset_backprop.dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("data_format", FORMATS)
def test_epsilon_zero_zero_variance_inference(isa, data_format, dtype):
    """Inference with variance 0: y = gamma * (x - mean) / 0 + beta = +-Inf, NaN where x = mean."""
    x, dy, v = setup(data_format, dtype)
    variance = poke(v["variance"], data_format, K, 0.0)
    mean = v["mean"].copy()
    mean[K] = np.asarray(mean[K], dtype)          # representable in x's dtype
    x = poke(x, data_format, K, mean[K])          # one element equal to the mean
    got = cfbn.fused_batch_norm(x, v["scale"], v["offset"], mean, variance, epsilon=0.0,
                                data_format=data_format, is_training=False)
    d = channel(x, data_format, K).astype(np.float64) - float(mean[K])
    with np.errstate(invalid="ignore"):
        want = np.where(d == 0, np.nan, np.sign(d) * np.sign(float(v["scale"][K])) * np.inf)
    y = channel(got.y, data_format, K).astype(np.float64)
    assert np.array_equal(np.isnan(y), np.isnan(want))
    assert np.array_equal(y[~np.isnan(want)], want[~np.isnan(want)])
    for c in range(C):
        if c != K:
            assert np.isfinite(channel(got.y, data_format, c)).all()


# ---- rounding of float16 and bfloat16 outputs ----

def exact_cases(dtype):
    """(x values, scale, offset): inference with mean 0, variance 1 and
    epsilon 0 gives y = x * scale + offset, exact in float32 (and float64),
    so the only rounding is the output's.  The offsets and scales put y on
    ties, just off them, beyond the largest finite value and among the
    subnormals."""
    fi = finfo(dtype)
    u, top = float(fi.eps), float(fi.max)
    tiny, sub = float(fi.smallest_normal), float(fi.smallest_subnormal)
    half_ulp_top = np.ldexp(u / 2, fi.maxexp - 1)     # top + this is a tie: to Inf
    grid = np.arange(1.0, 4.0, u / 2)           # every value of [1, 4), and more
    grid = grid[grid.astype(dtype).astype(np.float64) == grid]
    return [
        (grid, 1.0, u / 2),                     # ties at the bottom of [1, 2)
        (grid, 1.0, -u / 2),
        (-grid, 1.0, u / 4),                    # a quarter ulp: rounds back
        (grid, 1.0, 3 * u / 4),
        (grid, 1.0 + u / 2, 0.0),               # ties from the product
        (np.arange(1, 64) * sub, 0.5, 0.0),     # half of odd subnormals: ties
        (np.array([tiny, -tiny, tiny - sub]), 1.0 - u / 4, 0.0),
        (np.array([top, -top]), 1.0, half_ulp_top / 2),   # back to +-top
        (np.array([top, top]), 1.0, half_ulp_top),        # half an ulp past top: Inf
        (np.array([top, -top]), 2.0, 0.0),             # +-Inf
    ]


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=lambda d: d.name)
def test_half_outputs_round_to_nearest_even(isa, dtype):
    with np.errstate(over="ignore"):
        for i, (values, scale, offset) in enumerate(exact_cases(dtype)):
            x = np.asarray(values, np.float64).astype(dtype)
            assert np.array_equal(x.astype(np.float64), values), f"case {i}: x not exact"
            c = len(values)
            xs = x.reshape(1, c)
            ones = np.ones(c, np.float32)
            sv = np.full(c, scale, np.float32)
            ov = np.full(c, offset, np.float32)
            assert float(sv[0]) == scale and float(ov[0]) == offset
            want = (values * scale + offset).astype(dtype)
            got = cfbn.fused_batch_norm(xs, sv, ov, np.zeros(c, np.float32), ones, epsilon=0.0,
                                        data_format="NC", is_training=False)
            assert got.y.tobytes() == want.reshape(1, c).tobytes(), (
                f"case {i}: y {got.y.reshape(-1)[:8]} != {want[:8]}")
            # the inference gradient is dx = scale * dy: the same products
            g = cfbn.fused_batch_norm_grad(xs, xs, sv, np.zeros(c, np.float32), ones,
                                           epsilon=0.0, data_format="NC", is_training=False)
            want_dx = (values * scale).astype(dtype)
            assert g.x_backprop.tobytes() == want_dx.reshape(1, c).tobytes(), f"case {i}: dx"


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
def test_half_nan_and_inf_stay_what_they_are(isa, dtype, training):
    """NaN, +Inf and -Inf in x, each alone in its channel: y keeps them
    through the rounding to the output type (a carry of the rounding must not
    turn a NaN into Inf)."""
    specials = np.array([NAN, INF, -INF, NAN], np.float64).astype(dtype)
    # a (signalling) NaN whose payload is only the lowest bit of the 2-byte type
    exponent = 0x7c00 if dtype == np.float16 else 0x7f80
    specials[3:] = np.array([exponent | 1], np.uint16).view(dtype)
    with np.errstate(invalid="ignore"):      # widening a signalling NaN says so
        assert np.isnan(specials.astype(np.float64)).sum() == 2
    x = np.ones((3, 4), np.float64).astype(dtype)
    x[1] = specials
    c = 4
    ones = np.ones(c, np.float32)
    got = cfbn.fused_batch_norm(x, ones, np.zeros(c, np.float32), np.zeros(c, np.float32), ones,
                                epsilon=0.0, data_format="NC", is_training=training)
    y = got.y.astype(np.float64)
    if training:
        # the statistics of every channel are NaN or Inf: NaN everywhere
        assert np.isnan(y).all()
    else:
        assert np.isnan(y[1, [0, 3]]).all()
        assert y[1, 1] == INF and y[1, 2] == -INF
        assert (y[[0, 2]] == 1.0).all()
    g = cfbn.fused_batch_norm_grad(x, x, ones, np.zeros(c, np.float32), ones, epsilon=0.0,
                                   data_format="NC", is_training=False)
    dx = g.x_backprop.astype(np.float64)
    assert np.isnan(dx[1, [0, 3]]).all() and dx[1, 1] == INF and dx[1, 2] == -INF


# ---- an infinite x where the activation's derivative is 0 ----
#
# Inference-mode fused gradient: where x is +-Inf and act'(pre) is 0 there,
# g = dy act' = 0 exactly, so sum g (offset_backprop) stays finite while
# sum g x_hat (scale_backprop) is NaN.  The vector tables' float sums see the
# NaN and sum the channel again in double; that redo must not stop at the
# first NaN product while sum g is still finite.  The shapes reach the long
# runs (tree blocks), short runs, flat rows and wide rows of each table.

ZERO_SLOPE_ACTIVATIONS = ["relu", "relu6", "elu", "sigmoid", "tanh", "silu"]
INF_SHAPES = {"NCHW": [(1, 3, 5000, 1), (6, 3, 7, 7)], "NCDHW": [(1, 3, 2, 1500, 1)],
              "NHWC": [(2, 40, 50, 3), (2, 16, 16, 48)], "NDHWC": [(2, 4, 5, 100, 3)],
              "NC": [(4096, 3), (700, 48)]}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("data_format", FORMATS)
@pytest.mark.parametrize("act", ZERO_SLOPE_ACTIVATIONS)
def test_fused_grad_infinite_x_keeps_sum_of_g(isa, act, data_format, dtype):
    vdt = vector_dtype(dtype)
    k = 1
    for shape in INF_SHAPES[data_format]:
        axis = reference.channel_axis(data_format, len(shape))
        c = shape[axis]
        n = int(np.prod(shape))
        rng = np.random.default_rng(seed_of("inf-g", act, data_format, shape))
        # x = linspace(-1, 1) in memory order, so every channel spans zero
        base = np.linspace(-1.0, 1.0, n).reshape(shape).astype(dtype)
        dy = (1.0 + rng.random(shape)).astype(dtype)
        mean, var = np.zeros(c, vdt), np.ones(c, vdt)
        offset = np.zeros(c, vdt)
        for side in (None, rng.standard_normal(shape).astype(dtype)):
            for sign, where in ((1.0, "first"), (-1.0, "middle"), (1.0, "last")):
                for inf in (INF, -INF):
                    scale = np.full(c, sign, vdt)
                    x = base.copy()
                    idx = np.argwhere(np.take(np.ones(shape, bool), k, axis=axis))
                    pos = {"first": 0, "middle": len(idx) // 2, "last": len(idx) - 1}[where]
                    full = list(idx[pos])
                    full.insert(axis, k)
                    x[tuple(full)] = inf
                    kw = dict(epsilon=1e-3, data_format=data_format, is_training=False,
                              offset=offset, activation=act, side_input=side)
                    got = cfbn.fused_batch_norm_grad(dy, x, scale, mean, var, **kw)
                    clean = cfbn.fused_batch_norm_grad(dy, base, scale, mean, var, **kw)
                    with np.errstate(all="ignore"):
                        ref = reference.fused_batch_norm_grad(dy, x, scale, mean, var, **kw)
                    case = f"{shape} side={side is not None} x={inf} at {where}, scale {sign}"
                    for name in ("scale_backprop", "offset_backprop"):
                        g = np.asarray(getattr(got, name), np.float64)
                        r = np.asarray(getattr(ref, name), np.float64)
                        cl = np.asarray(getattr(clean, name))
                        others = np.arange(c) != k
                        assert same_bits(np.asarray(getattr(got, name))[others], cl[others]), \
                            f"{name}: {case}: other channels changed"
                        assert np.isfinite(g[k]) == np.isfinite(r[k]), \
                            f"{name}: {case}: got {g[k]!r}, reference {r[k]!r}"
                        if np.isfinite(r[k]):
                            tol = RTOL[np.dtype(dtype)] * (np.sum(np.abs(dy.astype(np.float64)
                                                                  .take(k, axis=axis))) + 1.0)
                            assert abs(g[k] - r[k]) <= tol, \
                                f"{name}: {case}: got {g[k]!r}, reference {r[k]!r}"


# ---- 16-bit outputs: one ulp of max(1, |v|) ----

@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("act", [None, "relu", "silu", "elu", "tanh"])
@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
def test_half_outputs_within_one_ulp_of_max_one(isa, dtype, act, training):
    """docs/numerics.md's bound for float16 and bfloat16 y and x_backprop:
    within one ulp of max(1, |v|) in their type of the float64 reference's v
    (relative to |v| alone it fails near zero, where x_backprop cancels)."""
    bits = 10 if dtype == np.dtype(np.float16) else 7
    for i, (fmt, shape, loc, std) in enumerate([("NHWC", (8, 7, 7, 33), 3.0, 1.0),
                                                ("NCHW", (2, 3, 31, 31), 100.0, 10.0),
                                                ("NC", (64, 5), 0.0, 0.1)]):
        rng = np.random.default_rng(seed_of("half-ulp", dtype.name, str(act), training, i))
        c = shape[1] if fmt in ("NCHW", "NC") else shape[-1]
        x = (rng.standard_normal(shape) * std + loc).astype(dtype)
        dy = rng.standard_normal(shape).astype(dtype)
        scale, offset = (rng.standard_normal(c).astype(np.float32) for _ in range(2))
        mean = (rng.standard_normal(c) * std + loc).astype(np.float32)
        var = (rng.random(c) * std * std + 0.1).astype(np.float32)
        kw = dict(epsilon=1e-3, data_format=fmt, is_training=training, activation=act)
        f = cfbn.fused_batch_norm(x, scale, offset, mean, var, **kw)
        rf = reference.fused_batch_norm(x, scale, offset, mean, var, **kw)
        mu, v = (f.reserve_space_1, f.reserve_space_2) if training else (mean, var)
        g = cfbn.fused_batch_norm_grad(dy, x, scale, mu, v, offset=offset, **kw)
        rg = reference.fused_batch_norm_grad(dy, x, scale, mu, v, offset=offset, **kw)
        for name, got, ref in (("y", f.y, rf.y), ("x_backprop", g.x_backprop, rg.x_backprop)):
            got = np.asarray(got).astype(np.float64)
            ref = np.asarray(ref, np.float64)
            ulp = 2.0 ** (np.floor(np.log2(np.maximum(1.0, np.abs(ref)))) - bits)
            err = np.abs(got - ref) / ulp
            assert err.max() <= 1.0, f"{name} ({fmt} {shape}): {err.max():.2f} ulps of max(1, |v|)"
