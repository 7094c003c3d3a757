import numpy as np
import pytest

import cfbn
from cfbn import reference

from _checks import (
    DTYPES,
    LAYOUTS,
    SHAPES,
    Unmodified,
    check_forward,
    forward_buffers,
    make_shape,
    random_vectors,
    random_x,
    seed_of,
    vector_dtype,
)

# (name, is_training, exponential_avg_factor, pass running statistics)
MODES = [
    ("train", True, 1.0, False),
    ("train-avg", True, 0.25, True),
    ("infer", False, 1.0, True),
]


def make_case(data_format, dtype, shape_case, with_stats, seed):
    rng = np.random.default_rng(seed)
    shape = make_shape(data_format, *shape_case)
    x = random_x(rng, shape, data_format, dtype)
    v = random_vectors(rng, shape_case[2], dtype)
    if not with_stats:
        v["mean"] = v["variance"] = None
    return x, v


@pytest.mark.parametrize("shape_case", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m[0])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("data_format", LAYOUTS)
def test_forward_matches_reference(isa, data_format, dtype, mode, shape_case):
    name, is_training, factor, with_stats = mode
    x, v = make_case(data_format, dtype, shape_case, with_stats,
                     seed_of(data_format, np.dtype(dtype).name, name, shape_case))
    c = shape_case[2]
    out = forward_buffers(x.shape, c, dtype)
    with Unmodified(x, *[a for a in v.values() if a is not None]):
        res = cfbn.fused_batch_norm(
            x, v["scale"], v["offset"], v["mean"], v["variance"], epsilon=1e-3,
            exponential_avg_factor=factor, data_format=data_format, is_training=is_training,
            out=out,
        )
    assert isinstance(res, cfbn.BatchNormOutput)
    for got, buf in zip(res, out):
        assert got is buf
    check_forward(res, x, v["scale"], v["offset"], v["mean"], v["variance"], epsilon=1e-3,
                  data_format=data_format, is_training=is_training,
                  exponential_avg_factor=factor)
    if shape_case[0] == 0:
        assert res.y.size == 0
        if is_training:
            assert np.isnan(res.reserve_space_1).all() and np.isnan(res.reserve_space_2).all()
    if shape_case[:2] == (1, 1) and is_training:
        # one element per channel: zero variance and no Bessel blow-up, as TensorFlow's CPU op
        assert np.all(res.reserve_space_2 == 0)
        assert np.array_equal(res.reserve_space_1, x.reshape(-1).astype(vector_dtype(dtype)))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("data_format", LAYOUTS)
def test_forward_allocated_outputs_equal_out_buffers(isa, data_format, dtype):
    x, v = make_case(data_format, dtype, (3, 13, 17), True, seed_of("alloc", data_format))
    kw = dict(exponential_avg_factor=0.5, data_format=data_format)
    args = (x, v["scale"], v["offset"], v["mean"], v["variance"])
    fresh = cfbn.fused_batch_norm(*args, **kw)
    into = cfbn.fused_batch_norm(*args, **kw, out=forward_buffers(x.shape, 17, dtype))
    vdt = vector_dtype(dtype)
    for name, a, b in zip(cfbn.BatchNormOutput._fields, fresh, into):
        expected = np.dtype(dtype) if name == "y" else vdt
        assert a.dtype == expected, name
        assert a.flags.c_contiguous, name
        assert a.tobytes() == b.tobytes(), name


@pytest.mark.parametrize("data_format", LAYOUTS)
def test_default_epsilon_is_tensorflows(isa, data_format):
    x, v = make_case(data_format, np.float64, (2, 7, 3), False, seed_of("eps", data_format))
    got = cfbn.fused_batch_norm(x, v["scale"], v["offset"], data_format=data_format)
    check_forward(got, x, v["scale"], v["offset"], None, None, epsilon=1e-4,
                  data_format=data_format, is_training=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_boundary_attributes_are_accepted(isa, dtype):
    # factor 0 keeps the running statistics; epsilon 0 is allowed when variance > 0
    x, v = make_case("NHWC", dtype, (2, 7, 9), True, seed_of("boundary", np.dtype(dtype).name))
    for factor, epsilon in ((0.0, 1e-3), (1.0, 0.0), (0.0, 0.0)):
        res = cfbn.fused_batch_norm(x, v["scale"], v["offset"], v["mean"], v["variance"],
                                    epsilon=epsilon, exponential_avg_factor=factor,
                                    out=forward_buffers(x.shape, 9, dtype))
        check_forward(res, x, v["scale"], v["offset"], v["mean"], v["variance"],
                      epsilon=epsilon, data_format="NHWC", is_training=True,
                      exponential_avg_factor=factor)
        if factor == 0.0:
            assert np.array_equal(res.batch_mean, v["mean"])
            assert np.array_equal(res.batch_variance, v["variance"])


# Data whose mean is far from zero compared with its spread: sums of squares
# in float32 (E[x^2] - E[x]^2) lose every digit here.
HARD = [(1e4, 1.0), (1.0, 1e-3)]


@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
@pytest.mark.parametrize("loc_std", HARD, ids=["mean1e4-std1", "mean1-std1e-3"])
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_large_mean_small_spread_float32(isa, data_format, loc_std, is_training):
    loc, std = loc_std
    rng = np.random.default_rng(seed_of("hard", data_format, loc_std))
    shape = make_shape(data_format, 8, 13 * 13, 5)
    x = random_x(rng, shape, data_format, np.float32, loc=loc, std=std)
    v = random_vectors(rng, 5, np.float32)
    if is_training:
        mean = variance = None
    else:
        exact = reference.fused_batch_norm(x, v["scale"], v["offset"], data_format=data_format)
        mean = exact.reserve_space_1.astype(np.float32)
        variance = exact.reserve_space_2.astype(np.float32)
    res = cfbn.fused_batch_norm(x, v["scale"], v["offset"], mean, variance,
                                data_format=data_format, is_training=is_training,
                                out=forward_buffers(x.shape, 5, np.float32))
    ref = check_forward(res, x, v["scale"], v["offset"], mean, variance, epsilon=1e-4,
                        data_format=data_format, is_training=is_training)
    for name in ("batch_mean", "batch_variance", "reserve_space_1", "reserve_space_2"):
        got = getattr(res, name).astype(np.float64)
        want = getattr(ref, name)
        rel = np.abs(got - want) / np.abs(want)
        assert rel.max() <= 1e-5, f"{name}: relative error {rel.max():.2e}"
    err = np.abs(res.y.astype(np.float64) - ref.y).max()
    assert err <= 1e-4, f"y: absolute error {err:.2e}"


@pytest.mark.parametrize("value", [np.nan, np.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("data_format", LAYOUTS)
def test_nonfinite_input_stays_in_its_channel(isa, data_format, value):
    rng = np.random.default_rng(seed_of("nonfinite", data_format))
    shape = make_shape(data_format, 2, 7, 9)
    x = random_x(rng, shape, data_format, np.float32)
    v = random_vectors(rng, 9, np.float32)
    axis = reference.channel_axis(data_format, x.ndim)
    index = [0] * x.ndim
    index[axis] = 4
    x[tuple(index)] = value
    res = cfbn.fused_batch_norm(x, v["scale"], v["offset"], data_format=data_format,
                                out=forward_buffers(x.shape, 9, np.float32))
    bad = np.zeros(9, bool)
    bad[4] = True
    y = np.moveaxis(res.y, axis, -1)
    assert not np.isfinite(y[..., 4]).any()
    assert not np.isfinite(res.reserve_space_2[4]) and not np.isfinite(res.batch_variance[4])
    clean = np.delete(x, 4, axis=axis)
    keep = ~bad
    sub = cfbn.BatchNormOutput(np.delete(res.y, 4, axis=axis),
                               *[a[keep] for a in res[1:]])
    check_forward(sub, clean, v["scale"][keep], v["offset"][keep], None, None,
                  epsilon=1e-4, data_format=data_format, is_training=True)
