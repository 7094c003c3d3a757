"""The split kernels (statistics, merge, apply, gradient sums, gradient apply).

Every ISA this CPU runs x every layout x every dtype, against the float64
reference, and against the fused calls, which they must reproduce bit for bit.
"""
import numpy as np
import pytest

import cfbn
from cfbn import reference

from _checks import (DTYPES, LAYOUTS, SHAPES, Unmodified, assert_close, forward_bounds,
                     grad_bounds, is_half, make_shape, random_vectors, random_x, seed_of, unit,
                     vector_dtype)

EPS = 1e-3


def _case(data_format, dtype, shape, tag=""):
    batch, spatial, c = shape
    rng = np.random.default_rng(seed_of("split", tag, data_format, np.dtype(dtype).name, shape))
    xs = make_shape(data_format, batch, spatial, c)
    x = random_x(rng, xs, data_format, dtype)
    dy = random_x(rng, xs, data_format, dtype, loc=0.0, std=1.0)
    return x, dy, random_vectors(rng, c, dtype)


def _reduce_axes(data_format, ndim):
    return reference.reduce_axes(data_format, ndim)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("data_format", LAYOUTS)
def test_split_forward_matches_reference_and_fused(isa, data_format, dtype, shape):
    x, _, v = _case(data_format, dtype, shape)
    with Unmodified(x, v["scale"], v["offset"]):
        st = cfbn.batch_norm_statistics(x, data_format=data_format)
        var = st.variance()
        y = cfbn.batch_norm_apply(x, st.mean, var, v["scale"], v["offset"], epsilon=EPS,
                                  data_format=data_format)
    ref = reference.fused_batch_norm(x, v["scale"], v["offset"], epsilon=EPS,
                                     data_format=data_format)
    n = int(np.prod([x.shape[a] for a in _reduce_axes(data_format, x.ndim)]))
    assert st.count == n and isinstance(st.count, int)
    assert st.mean.dtype == np.float64 and st.m2.dtype == np.float64
    b = forward_bounds(x, v["scale"], v["offset"], None, None, ref, epsilon=EPS,
                       data_format=data_format, is_training=True)
    assert_close("mean", st.mean, ref.reserve_space_1, b["reserve_space_1"], np.float64)
    assert_close("variance", var, ref.reserve_space_2, b["reserve_space_2"], np.float64)
    assert_close("y", y, ref.y, b["y"], x.dtype)
    fused = cfbn.fused_batch_norm(x, v["scale"], v["offset"], epsilon=EPS,
                                  data_format=data_format)
    vdt = vector_dtype(dtype)
    assert y.tobytes() == fused.y.tobytes()
    assert st.mean.astype(vdt).tobytes() == fused.reserve_space_1.tobytes()
    assert var.astype(vdt).tobytes() == fused.reserve_space_2.tobytes()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("data_format", LAYOUTS)
def test_split_grad_matches_reference_and_fused(isa, data_format, dtype, shape):
    x, dy, v = _case(data_format, dtype, shape)
    fwd = cfbn.fused_batch_norm(x, v["scale"], v["offset"], epsilon=EPS, data_format=data_format)
    mu, var = fwd.reserve_space_1, fwd.reserve_space_2
    with Unmodified(x, dy, v["scale"], mu, var):
        # float32 reserve spaces are taken as they are (widened exactly)
        gs = cfbn.batch_norm_grad_statistics(dy, x, mu, var, epsilon=EPS,
                                             data_format=data_format)
        n = cfbn.batch_norm_statistics(x, data_format=data_format).count
        dx = cfbn.batch_norm_grad_apply(dy, x, v["scale"], mu, var, gs.sum_dy, gs.sum_dy_xhat,
                                        n, epsilon=EPS, data_format=data_format)
    ref = reference.fused_batch_norm_grad(dy, x, v["scale"], mu, var, epsilon=EPS,
                                          data_format=data_format)
    b = grad_bounds(dy, x, v["scale"], mu, var, epsilon=EPS, data_format=data_format,
                    is_training=True)
    assert_close("sum_dy", gs.sum_dy, ref.offset_backprop, b["offset_backprop"], np.float64)
    assert_close("sum_dy_xhat", gs.sum_dy_xhat, ref.scale_backprop, b["scale_backprop"],
                 np.float64)
    assert_close("dx", dx, ref.x_backprop, b["x_backprop"], x.dtype)
    fused = cfbn.fused_batch_norm_grad(dy, x, v["scale"], mu, var, epsilon=EPS,
                                       data_format=data_format)
    vdt = vector_dtype(dtype)
    assert dx.tobytes() == fused.x_backprop.tobytes()
    assert gs.sum_dy.astype(vdt).tobytes() == fused.offset_backprop.tobytes()
    assert gs.sum_dy_xhat.astype(vdt).tobytes() == fused.scale_backprop.tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW", "NC"])
def test_grad_with_float64_statistics_within_rounding(data_format, dtype):
    # With statistics' float64 mean instead of the float32 reserve space, x_hat
    # is centred on a slightly different mean: equal within rounding, not bits.
    x, dy, v = _case(data_format, dtype, (3, 33, 17))
    st = cfbn.batch_norm_statistics(x, data_format=data_format)
    gs = cfbn.batch_norm_grad_statistics(dy, x, st.mean, st.variance(), epsilon=EPS,
                                         data_format=data_format)
    dx = cfbn.batch_norm_grad_apply(dy, x, v["scale"], st.mean, st.variance(), gs.sum_dy,
                                    gs.sum_dy_xhat, st.count, epsilon=EPS,
                                    data_format=data_format)
    ref = reference.fused_batch_norm_grad(dy, x, v["scale"], st.mean, st.variance(),
                                          epsilon=EPS, data_format=data_format)
    b = grad_bounds(dy, x, v["scale"], st.mean, st.variance(), epsilon=EPS,
                    data_format=data_format, is_training=True)
    assert_close("dx", dx, ref.x_backprop, b["x_backprop"], x.dtype)


def _micro_batches(x, data_format, cuts):
    """Split x along the batch axis at `cuts` (in samples), keeping empty pieces."""
    return np.split(x, cuts, axis=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("data_format", LAYOUTS)
def test_merge_of_micro_batches_equals_whole(isa, data_format, dtype):
    rng = np.random.default_rng(seed_of("merge", data_format, np.dtype(dtype).name))
    shape = make_shape(data_format, 9, 6, 7)
    # a mean far from zero next to the spread: merging (count, mean, m2) is exact
    x = random_x(rng, shape, data_format, dtype, loc=30.0 if is_half(dtype) else 300.0)
    rows = shape[0] // 9
    cuts = [0, 2 * rows, 2 * rows, 5 * rows, shape[0]]  # an empty piece at each end, one inside
    parts = [cfbn.batch_norm_statistics(p, data_format=data_format)
             for p in _micro_batches(x, data_format, cuts)]
    assert [p.count for p in parts].count(0) == 3
    whole = cfbn.batch_norm_statistics(x, data_format=data_format)
    merged = cfbn.merge_statistics_many(parts)
    assert merged.count == whole.count
    # a few ulps of the data's size, in the arithmetic the sums are formed
    # in: float64 data in double; float32, float16 and bfloat16 data in blocks of float
    # partial sums on the SIMD tables (added up in double); each squared
    # deviation (x - mean)**2 is off by about 2|x - mean| * ulp(x)
    sigma = np.sqrt(whole.variance())
    size = np.abs(whole.mean) + sigma
    tol = 64 * np.finfo(np.float64).eps if dtype == np.float64 else 8 * unit(dtype)
    assert np.all(np.abs(merged.mean - whole.mean) <= tol * size)
    assert np.all(np.abs(merged.m2 - whole.m2) <= tol * (whole.m2 + whole.count * size * sigma))
    pair = cfbn.merge_statistics(cfbn.merge_statistics(parts[1], parts[3]), parts[4])
    assert np.all(np.abs(pair.mean - whole.mean) <= tol * size)
    ref = reference.fused_batch_norm(x, np.ones(7), np.zeros(7), data_format=data_format)
    assert np.all(np.abs(merged.mean - ref.reserve_space_1) <= 8 * unit(dtype) * size)


def test_merge_with_empty_is_identity_bit_for_bit():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 3, 5, 6)).astype(np.float32)
    a = cfbn.batch_norm_statistics(x)
    empty = cfbn.batch_norm_statistics(x[:0])
    assert empty.count == 0 and np.all(np.isnan(empty.mean)) and np.all(np.isnan(empty.m2))
    for m in (cfbn.merge_statistics(a, empty), cfbn.merge_statistics(empty, a),
              cfbn.merge_statistics_many([empty, a, empty, empty])):
        assert m.count == a.count
        assert m.mean.tobytes() == a.mean.tobytes() and m.m2.tobytes() == a.m2.tobytes()
        assert m.mean is not a.mean and not np.shares_memory(m.mean, a.mean)
    both_empty = cfbn.merge_statistics(empty, empty)
    assert both_empty.count == 0 and np.all(np.isnan(both_empty.variance()))


def test_merge_order_independent_within_rounding_and_deterministic():
    rng = np.random.default_rng(2)
    parts = []
    for k in (1, 5, 2, 9, 3):
        x = rng.normal(50.0, 3.0, (k, 4, 4, 8))
        parts.append(cfbn.batch_norm_statistics(x))
    forward = cfbn.merge_statistics_many(parts)
    backward = cfbn.merge_statistics_many(parts[::-1])
    again = cfbn.merge_statistics_many(parts)
    assert forward.mean.tobytes() == again.mean.tobytes()
    assert forward.m2.tobytes() == again.m2.tobytes()
    np.testing.assert_allclose(forward.mean, backward.mean, rtol=1e-14)
    np.testing.assert_allclose(forward.m2, backward.m2, rtol=1e-12)


def test_merge_accepts_tuples_and_float32_without_modifying():
    a = (3, np.array([1.0, 2.0], np.float32), np.array([2.0, 8.0], np.float32))
    b = cfbn.BatchNormStatistics(1, np.array([5.0, 2.0]), np.array([0.0, 0.0]))
    with Unmodified(a[1], a[2], b.mean, b.m2):
        m = cfbn.merge_statistics(a, b)
    # [x, x, x, 5] with mean 1 and m2 2 for the three: mean 2, m2 = 2 + 16*3/4
    np.testing.assert_array_equal(m.mean, [2.0, 2.0])
    np.testing.assert_array_equal(m.m2, [2.0 + 12.0, 8.0])
    assert m.count == 4 and m.mean.dtype == np.float64


def test_apply_in_place_and_out():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 3, 4)).astype(np.float32)
    s = cfbn.batch_norm_statistics(x)
    scale, offset = np.ones(4, np.float32), np.zeros(4, np.float32)
    y = cfbn.batch_norm_apply(x, s.mean, s.variance(), scale, offset)
    out = np.empty_like(x)
    assert cfbn.batch_norm_apply(x, s.mean, s.variance(), scale, offset, out=out) is out
    assert out.tobytes() == y.tobytes()
    xc = x.copy()
    cfbn.batch_norm_apply(xc, s.mean, s.variance(), scale, offset, out=xc)
    assert xc.tobytes() == y.tobytes()
    # float32 statistics are widened: the same as passing them as float64
    y32 = cfbn.batch_norm_apply(x, s.mean.astype(np.float32), s.variance().astype(np.float32),
                                scale, offset)
    y64 = cfbn.batch_norm_apply(x, s.mean.astype(np.float32).astype(np.float64),
                                s.variance().astype(np.float32).astype(np.float64), scale, offset)
    assert y32.tobytes() == y64.tobytes()


def test_grad_apply_shard_with_global_sums():
    # two shards with the whole batch's sums and count give the whole batch's dx
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 2, 3, 6))
    dy = rng.standard_normal(x.shape)
    scale = rng.uniform(0.5, 1.5, 6)
    st = cfbn.batch_norm_statistics(x)
    mu, var = st.mean, st.variance()
    parts = [(dy[:2], x[:2]), (dy[2:], x[2:])]
    sums = [cfbn.batch_norm_grad_statistics(d, xx, mu, var) for d, xx in parts]
    sdy = sums[0].sum_dy + sums[1].sum_dy
    sdx = sums[0].sum_dy_xhat + sums[1].sum_dy_xhat
    dx = np.concatenate([cfbn.batch_norm_grad_apply(d, xx, scale, mu, var, sdy, sdx, st.count)
                         for d, xx in parts])
    ref = reference.fused_batch_norm_grad(dy, x, scale, mu, var)
    np.testing.assert_allclose(dx, ref.x_backprop, rtol=1e-10, atol=1e-12)


def test_empty_grad_statistics_are_zero():
    x = np.zeros((0, 3, 3, 4), np.float32)
    nan = np.full(4, np.nan)
    gs = cfbn.batch_norm_grad_statistics(x, x, nan, nan)
    assert not gs.sum_dy.any() and not gs.sum_dy_xhat.any()
    dx = cfbn.batch_norm_grad_apply(x, x, np.ones(4, np.float32), np.zeros(4), np.ones(4),
                                    gs.sum_dy, gs.sum_dy_xhat, 10)
    assert dx.shape == x.shape


X = np.ones((2, 2, 2, 3), np.float32)
V64 = np.zeros(3)
S32 = np.ones(3, np.float32)


@pytest.mark.parametrize("call, exc, match", [
    (lambda: cfbn.batch_norm_statistics(X.astype(np.int32)), TypeError, "x: expected float32"),
    (lambda: cfbn.batch_norm_statistics(X, data_format="NCW"), ValueError, "data_format"),
    (lambda: cfbn.batch_norm_statistics(X, data_format="NC"), ValueError, "x: data_format"),
    (lambda: cfbn.batch_norm_statistics(X, n_threads=0), ValueError, "n_threads"),
    (lambda: cfbn.batch_norm_apply(X, np.zeros(4), V64, S32, S32), ValueError,
     "mean: expected shape"),
    (lambda: cfbn.batch_norm_apply(X, V64, np.zeros(3, np.int64), S32, S32), TypeError,
     "variance: expected float64"),
    (lambda: cfbn.batch_norm_apply(X, V64, V64, V64, S32), TypeError, "scale"),
    (lambda: cfbn.batch_norm_apply(X, V64, V64, S32, S32, epsilon=-1.0), ValueError, "epsilon"),
    (lambda: cfbn.batch_norm_apply(X, V64, V64, S32, S32, out=np.empty(3, np.float32)),
     ValueError, "out"),
    (lambda: cfbn.batch_norm_apply(X, V64, V64, S32, S32, out=X.astype(np.float64)), TypeError,
     "out"),
    (lambda: cfbn.batch_norm_apply(X, V64, V64, S32, S32, out=[1]), TypeError, "out"),
    (lambda: cfbn.batch_norm_grad_statistics(X[:1], X, V64, V64), ValueError, "dy"),
    (lambda: cfbn.batch_norm_grad_statistics(X.astype(np.float64), X, V64, V64), TypeError, "dy"),
    (lambda: cfbn.batch_norm_grad_statistics(X, X, None, V64), TypeError, "mean"),
    (lambda: cfbn.batch_norm_grad_apply(X, X, S32, V64, V64, V64, V64, 3), ValueError, "count"),
    (lambda: cfbn.batch_norm_grad_apply(X, X, S32, V64, V64, V64, V64, -1), ValueError, "count"),
    (lambda: cfbn.batch_norm_grad_apply(X, X, S32, V64, V64, V64, V64, 8.0), TypeError, "count"),
    (lambda: cfbn.batch_norm_grad_apply(X, X, S32, V64, V64, V64, V64, True), TypeError, "count"),
    (lambda: cfbn.batch_norm_grad_apply(X, X, S32, V64, V64, np.zeros(2), V64, 8), ValueError,
     "sum_dy: expected shape"),
    (lambda: cfbn.batch_norm_grad_apply(X, X, S32, V64, V64, V64, V64.astype(complex), 8),
     TypeError, "sum_dy_xhat"),
    (lambda: cfbn.merge_statistics((1, V64, V64), (1, np.zeros(4), np.zeros(4))), ValueError,
     r"b\.mean: expected shape \(3,\)"),
    (lambda: cfbn.merge_statistics((-1, V64, V64), (1, V64, V64)), ValueError, "a.count"),
    (lambda: cfbn.merge_statistics((1, V64, np.zeros(2)), (1, V64, V64)), ValueError, "a.m2"),
    (lambda: cfbn.merge_statistics((1, V64, V64), 5), TypeError, "b: expected BatchNormStatistics"),
    (lambda: cfbn.merge_statistics((1.5, V64, V64), (1, V64, V64)), TypeError, "a.count"),
    (lambda: cfbn.merge_statistics((1, np.zeros((3, 1)), V64), (1, V64, V64)), ValueError,
     "a.mean: expected a 1-D"),
    (lambda: cfbn.merge_statistics_many([]), ValueError, "at least one"),
    (lambda: cfbn.merge_statistics_many([(1, V64, V64), (1, np.zeros(2), np.zeros(2))]),
     ValueError, r"statistics\[1\]\.mean"),
])
def test_errors_name_the_argument(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_channel_at_a_time_matches_split_and_is_thread_independent(isa):
    # Channels-first training tensors of 128 MB and more, with planes of 256+
    # elements and a small slice per channel, go a channel at a time (sums
    # plane by plane, then the output while the slice is in cache); the split
    # calls go plane by plane over the whole tensor.  Same bits either way.
    x, dy, v = _case("NCHW", np.float32, (32, 16384, 64), tag="channel")
    assert x.shape == (32, 64, 128, 128) and x.nbytes >= 128 << 20
    fused = {nt: cfbn.fused_batch_norm(x, v["scale"], v["offset"], epsilon=EPS,
                                       data_format="NCHW", n_threads=nt) for nt in (1, 2, 3)}
    mu, var = fused[1].reserve_space_1, fused[1].reserve_space_2
    grads = {nt: cfbn.fused_batch_norm_grad(dy, x, v["scale"], mu, var, epsilon=EPS,
                                            data_format="NCHW", n_threads=nt) for nt in (1, 2, 3)}
    for nt in (2, 3):
        for a, b in zip(list(fused[1]) + list(grads[1]), list(fused[nt]) + list(grads[nt])):
            assert a.tobytes() == b.tobytes()
    st = cfbn.batch_norm_statistics(x, data_format="NCHW")
    y = cfbn.batch_norm_apply(x, st.mean, st.variance(), v["scale"], v["offset"], epsilon=EPS,
                              data_format="NCHW")
    assert y.tobytes() == fused[1].y.tobytes()
    assert st.mean.astype(np.float32).tobytes() == mu.tobytes()
    assert st.variance().astype(np.float32).tobytes() == var.tobytes()
    gs = cfbn.batch_norm_grad_statistics(dy, x, mu, var, epsilon=EPS, data_format="NCHW")
    dx = cfbn.batch_norm_grad_apply(dy, x, v["scale"], mu, var, gs.sum_dy, gs.sum_dy_xhat,
                                    st.count, epsilon=EPS, data_format="NCHW")
    assert dx.tobytes() == grads[1].x_backprop.tobytes()
    assert gs.sum_dy.astype(np.float32).tobytes() == grads[1].offset_backprop.tobytes()
    assert gs.sum_dy_xhat.astype(np.float32).tobytes() == grads[1].scale_backprop.tobytes()
    # and right: one channel's slice against the float64 reference
    ref = reference.fused_batch_norm_grad(dy[:, 5:6], x[:, 5:6], v["scale"][5:6], mu[5:6],
                                          var[5:6], epsilon=EPS, data_format="NCHW")
    b = grad_bounds(dy[:, 5:6], x[:, 5:6], v["scale"][5:6], mu[5:6], var[5:6], epsilon=EPS,
                    data_format="NCHW", is_training=True)
    assert_close("dx", grads[1].x_backprop[:, 5:6], ref.x_backprop, b["x_backprop"], np.float32)
    fref = reference.fused_batch_norm(x[:, 5:6], v["scale"][5:6], v["offset"][5:6], epsilon=EPS,
                                      data_format="NCHW")
    fb = forward_bounds(x[:, 5:6], v["scale"][5:6], v["offset"][5:6], None, None, fref,
                        epsilon=EPS, data_format="NCHW", is_training=True)
    assert_close("y", fused[1].y[:, 5:6], fref.y, fb["y"], np.float32)
    assert_close("mean", mu[5:6], fref.reserve_space_1, fb["reserve_space_1"], np.float32)
