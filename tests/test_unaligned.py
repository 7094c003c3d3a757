"""out= arrays that are not aligned to their dtype (NumPy allows them: a view
into a bytearray at an odd offset) are written correctly on every path,
including past the sizes where the kernels switch to streaming stores, which
need aligned addresses.  Each output is poisoned first and compared bit for
bit with the same call into fresh aligned outputs (checked against the
reference elsewhere)."""
import numpy as np
import pytest

import cfbn

from _checks import BFLOAT16

# Elements of a float32 tensor past every streaming-store threshold of the
# C driver: the normalization pass (2 tensors) and the gradient pass (3
# tensors) stream from 64 MB.
BIG = (33 << 20) // 4


def unaligned(shape, dtype, offset):
    """A C-contiguous array `offset` bytes past a 64-byte boundary, NaN-filled."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    a = raw[start:start + nbytes].view(dtype).reshape(shape)
    assert a.flags.c_contiguous and a.flags.writeable
    a[...] = np.nan
    return a


def big_shape(data_format, channels=8):
    s = 1
    while 16 * channels * s * s * 4 < BIG * 4:
        s += 1
    return (16, channels, s, s) if data_format == "NCHW" else (16, s, s, channels)


def assert_same(got, want):
    for name, g, w in zip(got._fields, got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert np.array_equal(g, w, equal_nan=True), name


def data(shape, data_format, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    c = shape[1] if data_format == "NCHW" else shape[-1]
    vdt = np.float64 if np.dtype(dtype) == np.float64 else np.float32
    x = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    dy = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    side = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    v = {k: rng.uniform(0.5, 2.0, c).astype(vdt) for k in ("scale", "offset", "mean", "variance")}
    return x, dy, side, v


@pytest.mark.parametrize("offset", [1, 2])
@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
def test_large_forward_and_inference_into_unaligned_y(isa, data_format, offset):
    shape = big_shape(data_format)
    x, _, _, v = data(shape, data_format)
    for training in (True, False):
        want = cfbn.fused_batch_norm(x, v["scale"], v["offset"], v["mean"], v["variance"],
                                     data_format=data_format, is_training=training)
        y = unaligned(shape, np.float32, offset)
        got = cfbn.fused_batch_norm(x, v["scale"], v["offset"], v["mean"], v["variance"],
                                    data_format=data_format, is_training=training, out={"y": y})
        assert got.y is y
        assert_same(got, want)


@pytest.mark.parametrize("offset", [1, 3])
@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
def test_large_gradient_into_unaligned_dx(isa, data_format, offset):
    shape = big_shape(data_format)
    x, dy, _, v = data(shape, data_format)
    f = cfbn.fused_batch_norm(x, v["scale"], v["offset"], data_format=data_format)
    for training in (True, False):
        want = cfbn.fused_batch_norm_grad(dy, x, v["scale"], f.reserve_space_1,
                                          f.reserve_space_2, data_format=data_format,
                                          is_training=training)
        dx = unaligned(shape, np.float32, offset)
        got = cfbn.fused_batch_norm_grad(dy, x, v["scale"], f.reserve_space_1,
                                         f.reserve_space_2, data_format=data_format,
                                         is_training=training, out=(dx, None, None))
        assert got.x_backprop is dx
        assert_same(got, want)


@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
def test_large_split_passes_into_unaligned_out(isa, data_format):
    shape = big_shape(data_format)
    x, dy, _, v = data(shape, data_format)
    st = cfbn.batch_norm_statistics(x, data_format=data_format)
    var = st.variance()
    want = cfbn.batch_norm_apply(x, st.mean, var, v["scale"], v["offset"],
                                 data_format=data_format)
    y = unaligned(shape, np.float32, 1)
    assert cfbn.batch_norm_apply(x, st.mean, var, v["scale"], v["offset"],
                                 data_format=data_format, out=y) is y
    assert np.array_equal(y, want)
    gs = cfbn.batch_norm_grad_statistics(dy, x, st.mean, var, data_format=data_format)
    want = cfbn.batch_norm_grad_apply(dy, x, v["scale"], st.mean, var, gs.sum_dy,
                                      gs.sum_dy_xhat, st.count, data_format=data_format)
    dx = unaligned(shape, np.float32, 2)
    assert cfbn.batch_norm_grad_apply(dy, x, v["scale"], st.mean, var, gs.sum_dy,
                                      gs.sum_dy_xhat, st.count, data_format=data_format,
                                      out=dx) is dx
    assert np.array_equal(dx, want)


@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
def test_large_fused_into_unaligned_outputs(isa, data_format):
    shape = big_shape(data_format)
    x, dy, side, v = data(shape, data_format)
    kw = dict(data_format=data_format, activation="relu", side_input=side)
    want = cfbn.fused_batch_norm(x, v["scale"], v["offset"], **kw)
    y = unaligned(shape, np.float32, 1)
    got = cfbn.fused_batch_norm(x, v["scale"], v["offset"], out={"y": y}, **kw)
    assert got.y is y
    assert_same(got, want)
    g_kw = dict(kw, offset=v["offset"])
    gw = cfbn.fused_batch_norm_grad(dy, x, v["scale"], want.reserve_space_1,
                                    want.reserve_space_2, **g_kw)
    dx, ds = unaligned(shape, np.float32, 2), unaligned(shape, np.float32, 3)
    gg = cfbn.fused_batch_norm_grad(dy, x, v["scale"], want.reserve_space_1,
                                    want.reserve_space_2,
                                    out={"x_backprop": dx, "side_input_backprop": ds}, **g_kw)
    assert gg.x_backprop is dx and gg.side_input_backprop is ds
    assert_same(gg, gw)


@pytest.mark.parametrize("dtype,offset", [(np.float32, 1), (np.float32, 2), (np.float16, 1),
                                          (BFLOAT16, 1), (np.float64, 4), (np.float64, 1)],
                         ids=["f32+1", "f32+2", "f16+1", "bf16+1", "f64+4", "f64+1"])
@pytest.mark.parametrize("data_format", ["NCHW", "NHWC", "NC"])
def test_every_output_unaligned_small(isa, data_format, dtype, offset):
    """Every output of both calls at once, tensors and per-channel vectors, on a
    shape with SIMD tails."""
    shape = {"NCHW": (3, 5, 7, 9), "NHWC": (3, 7, 9, 5), "NC": (33, 5)}[data_format]
    x, dy, _, v = data(shape, data_format, dtype)
    vdt = v["scale"].dtype
    for training in (True, False):
        args = (x, v["scale"], v["offset"], v["mean"], v["variance"])
        kw = dict(data_format=data_format, is_training=training, exponential_avg_factor=0.5)
        want = cfbn.fused_batch_norm(*args, **kw)
        out = [unaligned(shape, dtype, offset)] + [unaligned((5,), vdt, offset)
                                                   for _ in range(4)]
        got = cfbn.fused_batch_norm(*args, out=out, **kw)
        assert all(g is o for g, o in zip(got, out))
        assert_same(got, want)
        g_args = (dy, x, v["scale"], want.reserve_space_1, want.reserve_space_2)
        g_kw = dict(data_format=data_format, is_training=training)
        gw = cfbn.fused_batch_norm_grad(*g_args, **g_kw)
        g_out = (unaligned(shape, dtype, offset), unaligned((5,), vdt, offset),
                 unaligned((5,), vdt, offset))
        gg = cfbn.fused_batch_norm_grad(*g_args, out=g_out, **g_kw)
        assert all(g is o for g, o in zip(gg, g_out))
        assert_same(gg, gw)


def test_unaligned_running_statistics_updated_in_place(isa):
    """An unaligned running mean passed as both input and output is updated
    as an aligned one would be."""
    x, _, _, v = data((3, 7, 9, 5), "NHWC")
    mean, var = unaligned((5,), np.float32, 1), unaligned((5,), np.float32, 2)
    mean[...], var[...] = v["mean"], v["variance"]
    want = cfbn.fused_batch_norm(x, v["scale"], v["offset"], v["mean"], v["variance"],
                                 exponential_avg_factor=0.25)
    got = cfbn.fused_batch_norm(x, v["scale"], v["offset"], mean, var,
                                exponential_avg_factor=0.25,
                                out={"batch_mean": mean, "batch_variance": var})
    assert got.batch_mean is mean and got.batch_variance is var
    assert_same(got, want)


def test_unaligned_dx_into_dy_in_place(isa):
    x, dy0, _, v = data((3, 7, 9, 5), "NHWC")
    f = cfbn.fused_batch_norm(x, v["scale"], v["offset"])
    dy = unaligned(x.shape, np.float32, 1)
    dy[...] = dy0
    want = cfbn.fused_batch_norm_grad(dy0, x, v["scale"], f.reserve_space_1, f.reserve_space_2)
    got = cfbn.fused_batch_norm_grad(dy, x, v["scale"], f.reserve_space_1, f.reserve_space_2,
                                     out={"x_backprop": dy})
    assert got.x_backprop is dy
    assert_same(got, want)


def test_unaligned_outputs_sharing_memory_are_rejected():
    x, dy, side, v = data((3, 7, 9, 5), "NHWC")
    f = cfbn.fused_batch_norm(x, v["scale"], v["offset"])
    dx = unaligned(x.shape, np.float32, 1)
    with pytest.raises(ValueError, match="side_input_backprop"):
        cfbn.fused_batch_norm_grad(dy, x, v["scale"], f.reserve_space_1, f.reserve_space_2,
                                   offset=v["offset"], activation="relu", side_input=side,
                                   out={"x_backprop": dx, "side_input_backprop": dx})
    raw = unaligned((11,), np.float32, 1)
    with pytest.raises(ValueError, match="batch_variance"):
        cfbn.fused_batch_norm(x, v["scale"], v["offset"],
                              out={"batch_mean": raw[:5], "batch_variance": raw[4:9]})
