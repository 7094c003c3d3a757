"""Data at both ends of the exponent range, on every ISA, against the reference.

The SIMD kernels sum blocks of values, squares and products dy * (x - mean)
in float before adding the block sums in double; float overflows (and loses
bits to gradual underflow) where the scalar table, which forms every term in
double, does not.  docs/spec.md: for every finite input whose exact results are
finite in the output dtype, every kernel variant gives finite results within
the stated accuracy.  The named tests are the reported cases; the property
test draws per-channel locations, spreads, spikes and gradient scales across
the whole exponent range of float32, of float16 and of bfloat16 (whose
range is float32's: only its precision is less).

Tolerances are those of tests/_checks.py, plus one unit in the last place of
the output type: every output is rounded to it once, and below the smallest
normal number that rounding is larger than the relative bounds.
"""


import numpy as np
import pytest

import cfbn
from cfbn import reference

from _checks import (
    BFLOAT16,
    finfo,
    assert_close,
    forward_bounds,
    grad_bounds,
    is_half,
    make_shape,
    per_channel_view,
    random_vectors,
    selected,
    vector_dtype,
)

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, note, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SUPPORTED_ISAS = list(cfbn.runtime_info()["supported_isas"])
FORMATS = ["NHWC", "NCHW", "NC"]
FLOAT_MAX = {np.dtype(np.float32): float(np.finfo(np.float32).max),
             np.dtype(np.float16): float(np.finfo(np.float16).max),
             BFLOAT16: float(finfo(BFLOAT16).max)}
DTYPES = [np.dtype(np.float32), np.dtype(np.float16), BFLOAT16]
FWD_VECTORS = ("batch_mean", "batch_variance", "reserve_space_1", "reserve_space_2")


def finite_in(values, dtype):
    """Where ``values`` (float64) stay finite when rounded to ``dtype``."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.isfinite(np.asarray(values, np.float64).astype(dtype))


def ulp(ref, dtype):
    """One unit in the last place of ``ref`` rounded to ``dtype`` (float16 and
    bfloat16: 0, which assert_close adds itself)."""
    if is_half(dtype):
        return 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        r = np.abs(np.asarray(ref, np.float64)).astype(dtype)
    return np.where(np.isfinite(r), np.spacing(r), 0.0).astype(np.float64)


def check(name, got, ref, tol, dtype, where):
    """assert_close on the elements ``where`` selects, with one more ulp."""
    got, ref = np.asarray(got), np.asarray(ref, np.float64)
    where = np.broadcast_to(where, ref.shape)
    tol = np.broadcast_to(np.asarray(tol, np.float64), ref.shape) + ulp(ref, dtype)
    # (float16: the ulp assert_close adds at 65504 is Inf, with a warning)
    with np.errstate(over="ignore"):
        assert_close(name, got[where], ref[where], tol[where], dtype)


def channel_mask(per_channel, data_format, ndim):
    return per_channel_view(per_channel, data_format, ndim) > 0


def forward_everywhere(x, scale, offset, epsilon, data_format, *, mean=None, variance=None,
                       factor=1.0):
    """The training forward on every ISA; returns the float64 reference and the
    channels whose exact statistics are finite in float32 (in them every
    output is compared; elsewhere only the statistics that are finite)."""
    dtype = x.dtype
    vdt = vector_dtype(dtype)
    with np.errstate(all="ignore"):
        ref = reference.fused_batch_norm(x, scale, offset, mean, variance, epsilon=epsilon,
                                         exponential_avg_factor=factor, data_format=data_format)
        bounds = forward_bounds(x, scale, offset, mean, variance, ref, epsilon=epsilon,
                                data_format=data_format, is_training=True,
                                exponential_avg_factor=factor)
    ok = np.logical_and.reduce([finite_in(getattr(ref, k), vdt) for k in FWD_VECTORS])
    for isa in SUPPORTED_ISAS:
        with selected(isa):
            got = cfbn.fused_batch_norm(x, scale, offset, mean, variance, epsilon=epsilon,
                                        exponential_avg_factor=factor, data_format=data_format)
        for k in FWD_VECTORS:
            check(f"{isa} {k}", getattr(got, k), getattr(ref, k), bounds[k], vdt,
                  finite_in(getattr(ref, k), vdt))
        check(f"{isa} y", got.y, ref.y, bounds["y"], dtype,
              channel_mask(ok, data_format, x.ndim) & finite_in(ref.y, dtype))
    return ref, ok


def grad_everywhere(dy, x, scale, mu, var, epsilon, data_format, channels=None):
    """The training gradient on every ISA against the reference, with the
    statistics ``mu``, ``var`` (finite, of the vector dtype)."""
    dtype = x.dtype
    vdt = vector_dtype(dtype)
    with np.errstate(all="ignore"):
        ref = reference.fused_batch_norm_grad(dy, x, scale, mu, var, epsilon=epsilon,
                                              data_format=data_format)
        bounds = grad_bounds(dy, x, scale, mu, var, epsilon=epsilon, data_format=data_format,
                             is_training=True)
    ok = finite_in(ref.scale_backprop, vdt) & finite_in(ref.offset_backprop, vdt)
    if channels is not None:
        ok &= channels
    for isa in SUPPORTED_ISAS:
        with selected(isa):
            got = cfbn.fused_batch_norm_grad(dy, x, scale, mu, var, epsilon=epsilon,
                                             data_format=data_format)
        for k in ("scale_backprop", "offset_backprop"):
            check(f"{isa} {k}", getattr(got, k), getattr(ref, k), bounds[k], vdt, ok)
        check(f"{isa} x_backprop", got.x_backprop, ref.x_backprop, bounds["x_backprop"], dtype,
              channel_mask(ok, data_format, x.ndim) & finite_in(ref.x_backprop, dtype))
    return ref


def same_bits_for_any_thread_count(call):
    """``call(n_threads)`` gives the same bits with 1, 2 and 3 threads on every
    ISA: a column summed again in double is chosen by its piece's data, and
    pieces depend only on the shape."""
    for isa in SUPPORTED_ISAS:
        with selected(isa):
            results = [call(nt) for nt in (1, 2, 3)]
        for other in results[1:]:
            for name, a, b in zip(results[0]._fields, results[0], other):
                assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), f"{isa} {name}"


def unit_case(data_format, dtype, shape, seed):
    rng = np.random.default_rng(seed)
    c = shape[reference.channel_axis(data_format, len(shape))]
    x = rng.standard_normal(shape).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    v = random_vectors(rng, c, dtype)
    return x, dy, v, c


def at(shape, data_format, channel, k):
    """The index of element k (in the channel's own order) of one channel."""
    axis = reference.channel_axis(data_format, len(shape))
    rest = [s for i, s in enumerate(shape) if i != axis]
    idx = list(np.unravel_index(k, rest))
    idx.insert(axis, channel)
    return tuple(int(i) for i in idx)


# (N, spatial, C) with 65536 elements per channel, as in the report
BIG = (4, 16384, 8)
# bfloat16 has float32's exponent range: the same values, to 8 bits
HUGE = {np.dtype(np.float32): 2e19, np.dtype(np.float16): 6e4, BFLOAT16: 2e19}
LARGE_DY = {np.dtype(np.float32): 1e20, np.dtype(np.float16): 6e4, BFLOAT16: 1e20}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("data_format", FORMATS)
def test_one_huge_value_keeps_the_variance_finite(data_format, dtype):
    """One 2e19 among unit values: its square overflows float, the variance
    (about 6.1e33) does not; neither may the running variance, nor y turn
    into the offset.  (float16: 6e4, the same paths at half's top.)"""
    dtype = np.dtype(dtype)
    shape = make_shape(data_format, *BIG)
    x, _, v, c = unit_case(data_format, dtype, shape, 13)
    x[at(shape, data_format, 5, 40000)] = HUGE[dtype]
    ref, ok = forward_everywhere(x, v["scale"], v["offset"], 1e-4, data_format,
                                 mean=v["mean"], variance=v["variance"], factor=0.5)
    assert ok.all()
    if dtype != np.float16:
        assert 6.0e33 < ref.reserve_space_2[5] < 6.2e33
    same_bits_for_any_thread_count(lambda nt: cfbn.fused_batch_norm(
        x, v["scale"], v["offset"], v["mean"], v["variance"], exponential_avg_factor=0.5,
        data_format=data_format, n_threads=nt))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("data_format", FORMATS)
def test_values_near_the_largest_float_keep_a_finite_mean(data_format, dtype):
    """Values spread over +-3e38: block sums of x - shift overflow float (the
    mean came out NaN); the mean is finite and must be right, the variance is
    beyond float and must be Inf as the reference's.  (float16: +-6e4, where
    every output is finite; bfloat16: +-3e38, as float32.)"""
    dtype = np.dtype(dtype)
    shape = make_shape(data_format, 4, 1024, 8)
    rng = np.random.default_rng(7)
    top = 6e4 if dtype == np.float16 else 3e38
    x = (rng.uniform(-1.0, 1.0, shape) * top).astype(dtype)
    v = random_vectors(rng, 8, dtype)
    ref, ok = forward_everywhere(x, v["scale"], v["offset"], 1e-4, data_format)
    assert np.isfinite(ref.reserve_space_1).all()
    if dtype != np.float16:
        assert not ok.any()
        for isa in SUPPORTED_ISAS:
            with selected(isa):
                got = cfbn.fused_batch_norm(x, v["scale"], v["offset"], data_format=data_format)
            assert np.isposinf(got.reserve_space_2).all() and np.isposinf(got.batch_variance).all()
    else:
        assert ok.all()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("data_format", FORMATS)
def test_huge_gradient_products_keep_scale_backprop_finite(data_format, dtype):
    """dy = 1e20 where x = 2e19: dy * (x - mean) overflows float, while
    scale_backprop (about 1.3e22) is finite; then x_backprop must be right."""
    dtype = np.dtype(dtype)
    shape = make_shape(data_format, *BIG)
    x, dy, v, c = unit_case(data_format, dtype, shape, 17)
    i = at(shape, data_format, 3, 30000)
    x[i], dy[i] = HUGE[dtype], LARGE_DY[dtype]
    vdt = vector_dtype(dtype)
    with np.errstate(all="ignore"):
        fwd = reference.fused_batch_norm(x, v["scale"], v["offset"], data_format=data_format)
    mu, var = fwd.reserve_space_1.astype(vdt), fwd.reserve_space_2.astype(vdt)
    ref = grad_everywhere(dy, x, v["scale"], mu, var, 1e-4, data_format)
    if dtype != np.float16:
        assert 1e22 < ref.scale_backprop[3] < 4e22
    same_bits_for_any_thread_count(lambda nt: cfbn.fused_batch_norm_grad(
        dy, x, v["scale"], mu, var, data_format=data_format, n_threads=nt))


@pytest.mark.parametrize("data_format", FORMATS)
def test_squares_and_products_below_the_normal_range(data_format):
    """Spread 2^-70 and dy of 2^-60: squares and products fall below 2^-126,
    where float keeps only some of their bits.  With epsilon 0 the variance
    sets y's scale, so it must be right to float's precision, not to 2^-149."""
    shape = make_shape(data_format, 4, 1024, 8)
    x, dy, v, c = unit_case(data_format, np.float32, shape, 23)
    x = (x.astype(np.float64) * 2.0**-70).astype(np.float32)
    dy = (dy.astype(np.float64) * 2.0**-60).astype(np.float32)
    ref, ok = forward_everywhere(x, v["scale"], v["offset"], 0.0, data_format)
    assert ok.all()
    grad_everywhere(dy, x, v["scale"], ref.reserve_space_1.astype(np.float32),
                    ref.reserve_space_2.astype(np.float32), 1e-4, data_format)


# ---- property test ----

#: float32, float16 and bfloat16: (lowest, highest) binary exponent of
#: locations, spreads, spikes and dy.  Spreads stop where the variance would
#: leave float (2^64 squared), locations and spikes where the data would;
#: bfloat16's smallest subnormal is 2^-133.
RANGES = {
    np.dtype(np.float32): dict(loc=(-149, 126), spread=(-149, 60), spike=(-149, 64), dy=(-149, 100)),
    np.dtype(np.float16): dict(loc=(-24, 13), spread=(-24, 11), spike=(-24, 14), dy=(-24, 12)),
    BFLOAT16: dict(loc=(-133, 126), spread=(-133, 60), spike=(-133, 64), dy=(-133, 100)),
}


def normal_or_zero(v):
    """float32 holds v to full precision (or exactly, as 0)."""
    a = np.abs(np.asarray(v, np.float64))
    return (a == 0) | ((a >= float(np.finfo(np.float32).tiny)) & (a <= FLOAT_MAX[np.dtype(np.float32)]))


def parameters_fit(ref_grad, scale, var, epsilon, n):
    """Channels whose float32 gradient parameters are normal numbers.

    The kernels take x_backprop = dy * a + (x - mean) * b + c with a = scale * r,
    b = -scale * r^2 * scale_backprop / n and c = -scale * r * offset_backprop / n
    stored as float (bn_driver.c); where b or c falls below float's normal
    range it loses bits on every ISA alike, a limit of that parametrization
    rather than of any kernel's sums, so such channels are not compared."""
    r = 1.0 / np.sqrt(np.asarray(var, np.float64) + epsilon)
    g = np.asarray(scale, np.float64)
    with np.errstate(all="ignore"):
        b = -g * r * r * np.asarray(ref_grad.scale_backprop, np.float64) / n
        c = -g * r * np.asarray(ref_grad.offset_backprop, np.float64) / n
    return normal_or_zero(g * r) & normal_or_zero(b) & normal_or_zero(c)


@st.composite
def exponent_cases(draw):
    data_format = draw(st.sampled_from(FORMATS))
    dtype = draw(st.sampled_from(DTYPES))
    lim = RANGES[dtype]
    batch = draw(st.integers(1, 9))
    spatial = draw(st.sampled_from([1, 7, 16, 49, 130, 300]))
    c = draw(st.integers(1, 20))
    while batch * spatial * c > 12000:
        c = max(1, c // 2)
        batch = max(1, batch // 2)

    def exponent(kind):
        return draw(st.integers(*lim[kind]))

    case = dict(
        data_format=data_format, dtype=dtype, shape=make_shape(data_format, batch, spatial, c),
        loc=exponent("loc"), loc_zero=draw(st.booleans()), spread=exponent("spread"),
        spike=draw(st.one_of(st.none(), st.integers(*lim["spike"]))), dy=exponent("dy"),
        epsilon=draw(st.sampled_from([1e-4, 1e-3, 1e-2])), seed=draw(st.integers(0, 2**32 - 1)),
    )
    note(repr(case))
    return case


def exponent_inputs(case):
    """x = loc + spread * z per channel, the exponents jittered by channel,
    perhaps one spike per channel; dy of its own scale."""
    rng = np.random.default_rng(case["seed"])
    dtype, df, shape = case["dtype"], case["data_format"], case["shape"]
    lim = RANGES[dtype]
    axis = reference.channel_axis(df, len(shape))
    c = shape[axis]

    def scales(kind, centre):
        e = np.clip(centre + rng.integers(-6, 7, c), *lim[kind])
        return np.ldexp(rng.uniform(1.0, 2.0, c), e) * rng.choice([-1.0, 1.0], c)

    loc = np.zeros(c) if case["loc_zero"] else scales("loc", case["loc"])
    spread = np.abs(scales("spread", case["spread"]))
    x = per_channel_view(loc, df, len(shape)) + per_channel_view(spread, df, len(shape)) * \
        rng.standard_normal(shape)
    if case["spike"] is not None:
        spikes = scales("spike", case["spike"])
        n = x.size // c
        for ch in range(c):
            x[at(shape, df, ch, int(rng.integers(0, n)))] = spikes[ch]
    dy = per_channel_view(np.abs(scales("dy", case["dy"])), df, len(shape)) * rng.standard_normal(shape)
    v = random_vectors(rng, c, dtype)
    with np.errstate(over="ignore"):
        x, dy = x.astype(dtype), dy.astype(dtype)
    assert np.isfinite(x).all() and np.isfinite(dy).all()
    return x, dy, v


@settings(max_examples=30, deadline=None)
@given(case=exponent_cases())
def test_every_isa_matches_the_reference_across_the_exponent_range(case):
    x, dy, v = exponent_inputs(case)
    df, eps, vdt = case["data_format"], case["epsilon"], vector_dtype(case["dtype"])
    ref, ok = forward_everywhere(x, v["scale"], v["offset"], eps, df)
    with np.errstate(over="ignore"):
        mu, var = ref.reserve_space_1.astype(vdt), ref.reserve_space_2.astype(vdt)
    with np.errstate(all="ignore"):
        gref = reference.fused_batch_norm_grad(dy, x, v["scale"], np.where(ok, mu, 0),
                                               np.where(ok, var, 1), epsilon=eps, data_format=df)
    n = x.size // max(len(mu), 1)
    fit = ok & parameters_fit(gref, v["scale"], np.where(ok, var, 1), eps, n)
    note(f"channels compared: forward {int(ok.sum())}, gradient {int(fit.sum())} of {len(ok)}")
    grad_everywhere(dy, x, v["scale"], np.where(ok, mu, 0).astype(vdt),
                    np.where(ok, var, 1).astype(vdt), eps, df, channels=fit)


# ---- a pre-activation beyond float's range ----

OVERFLOW_ACTIVATIONS = [("relu", None), ("relu6", None), ("leaky_relu", 0.1), ("elu", 0.7),
                        ("sigmoid", None), ("tanh", None), ("silu", None)]


@pytest.mark.parametrize("dtype", [np.float32, BFLOAT16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("act, alpha", OVERFLOW_ACTIVATIONS, ids=lambda a: str(a))
def test_fused_pre_activation_that_overflows_float(isa, act, alpha, dtype):
    """x = +-1e38 with 1 / sqrt(var + eps) > 1: the pre-activation (about
    +-1e39) is +-Inf in float (docs/numerics.md).  The outputs are the
    activation's and its derivative's limits there (silu(-Inf) = -0,
    silu'(+Inf) = 1, silu'(-Inf) = 0, ...), never the NaN of Inf / Inf or
    Inf * 0: no output is NaN where the float64 reference is not, the sums
    (whose terms are x - mean, in range) are the reference's, and so are
    the elements whose pre-activation is in range."""
    c = 3
    x = np.tile(np.array([1e38, -1e38, 0.5, -0.3, 0.1, 2.0], np.float32)[:, None], (1, c))
    x = x.astype(dtype)
    rng = np.random.default_rng(7)
    dy = (1.0 + rng.random(x.shape)).astype(dtype)
    vdt = vector_dtype(dtype)
    scale = np.array([1.0, -2.0, 0.5], vdt)
    offset = np.array([0.0, 0.25, -1.0], vdt)
    mean, var = np.zeros(c, vdt), np.full(c, 0.01, vdt)
    kw = dict(epsilon=1e-3, data_format="NC", is_training=False, activation=act, alpha=alpha)
    y = cfbn.fused_batch_norm(x, scale, offset, mean, var, **kw).y
    g = cfbn.fused_batch_norm_grad(dy, x, scale, mean, var, offset=offset, **kw)
    with np.errstate(all="ignore"):
        ry = reference.fused_batch_norm(x, scale, offset, mean, var, **kw).y
        rg = reference.fused_batch_norm_grad(dy, x, scale, mean, var, offset=offset, **kw)
    tol = 2e-2 if is_half(dtype) else 1e-4
    in_range = np.arange(x.shape[0]) >= 2
    for name, got, ref in [("y", y, ry)] + [(n, getattr(g, n), getattr(rg, n))
                                            for n in ("x_backprop", "scale_backprop",
                                                      "offset_backprop")]:
        g64 = np.asarray(got).astype(np.float64)
        with np.errstate(over="ignore"):
            r = np.asarray(ref, np.float64).astype(np.asarray(got).dtype).astype(np.float64)
        assert not np.isnan(r).any(), f"{name}: the reference itself has a NaN"
        assert not np.isnan(g64).any(), f"{name}: NaN from an overflowed pre-activation: {g64}"
        if g64.ndim == 2:          # elementwise: the rows whose pre-activation is in range
            g64, r = g64[in_range], r[in_range]
        assert np.array_equal(np.isfinite(g64), np.isfinite(r)), \
            f"{name}: got {g64}, reference {r}"
        fin = np.isfinite(r)
        assert np.all(np.abs(g64[fin] - r[fin]) <= tol * (np.abs(r[fin]) + 1.0)), \
            f"{name}: got {g64}, reference {r}"
