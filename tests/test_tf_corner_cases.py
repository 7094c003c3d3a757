"""Corner cases from TensorFlow's own fused batch-norm tests and kernels
(fused_batch_norm_op.cc, nn_fused_batchnorm_test.py, Keras' batch
normalization tests), on every ISA and dtype."""
import numpy as np
import pytest

import cfbn
from _checks import DTYPES, make_shape, random_vectors, random_x, seed_of, vector_dtype

FORMATS = ["NHWC", "NCHW", "NC", "NDHWC", "NCDHW"]


def _setup(data_format, dtype, batch, spatial, channels=7, tag=""):
    rng = np.random.default_rng(seed_of("tf-corner", tag, data_format, np.dtype(dtype).name))
    shape = make_shape(data_format, batch, spatial, channels)
    x = random_x(rng, shape, data_format, dtype)
    dy = random_x(rng, shape, data_format, dtype, loc=0.0, std=1.0)
    return x, dy, random_vectors(rng, channels, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("data_format", FORMATS)
def test_inference_on_an_empty_batch(isa, data_format, dtype):
    """TensorFlow: "If input is empty, return NaN mean/variance"; the reserve
    spaces keep mean and variance, so the inference gradient takes them back."""
    x, dy, v = _setup(data_format, dtype, 0, 3)
    vdt = vector_dtype(dtype)
    out = [np.full(x.shape, 7, dtype)] + [np.full(7, 7, vdt) for _ in range(4)]
    got = cfbn.fused_batch_norm(x, v["scale"], v["offset"], v["mean"], v["variance"],
                                is_training=False, data_format=data_format, out=out)
    assert got.y.shape == x.shape
    assert np.isnan(got.batch_mean).all() and np.isnan(got.batch_variance).all()
    np.testing.assert_array_equal(got.reserve_space_1, v["mean"])
    np.testing.assert_array_equal(got.reserve_space_2, v["variance"])
    g = cfbn.fused_batch_norm_grad(dy, x, v["scale"], got.reserve_space_1, got.reserve_space_2,
                                   is_training=False, data_format=data_format)
    assert g.x_backprop.shape == x.shape
    assert (g.scale_backprop == 0).all() and (g.offset_backprop == 0).all()


def test_inference_on_an_empty_batch_updating_running_statistics_in_place(isa):
    """The NaN statistics land in the caller's arrays when they are the
    outputs, as TensorFlow's kernel writes them."""
    x, _, v = _setup("NHWC", np.float32, 0, 3)
    mean, var = v["mean"].copy(), v["variance"].copy()
    got = cfbn.fused_batch_norm(x, v["scale"], v["offset"], mean, var, is_training=False,
                                out={"batch_mean": mean, "batch_variance": var})
    assert got.batch_mean is mean and np.isnan(mean).all() and np.isnan(var).all()
    np.testing.assert_array_equal(got.reserve_space_1, v["mean"])


def test_reference_empty_inference_batch():
    x, _, v = _setup("NHWC", np.float64, 0, 3)
    ref = cfbn.reference.fused_batch_norm(x, v["scale"], v["offset"], v["mean"], v["variance"],
                                          is_training=False)
    assert np.isnan(ref.batch_mean).all() and np.isnan(ref.batch_variance).all()
    np.testing.assert_array_equal(ref.reserve_space_1, v["mean"])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW", "NC"])
def test_zero_length_statistics_mean_none_in_training(isa, data_format, dtype):
    """TensorFlow's and Keras' callers pass empty mean/variance in training
    with exponential_avg_factor 1."""
    x, _, v = _setup(data_format, dtype, 3, 5)
    vdt = vector_dtype(dtype)
    empty = np.zeros(0, vdt)
    want = cfbn.fused_batch_norm(x, v["scale"], v["offset"], data_format=data_format)
    for mean, var in ((empty, empty), (empty, None), (None, empty), ([], [])):
        got = cfbn.fused_batch_norm(x, v["scale"], v["offset"], mean, var,
                                    data_format=data_format)
        for w, g in zip(want, got):
            np.testing.assert_array_equal(w, g)
    got = cfbn.fused_batch_norm(x, v["scale"], v["offset"], empty, empty,
                                data_format=data_format, activation="relu")
    np.testing.assert_array_equal(got.y, np.maximum(want.y, 0))


def test_zero_length_statistics_only_where_none_is_accepted():
    x, _, v = _setup("NHWC", np.float32, 3, 5)
    empty = np.zeros(0, np.float32)
    with pytest.raises(ValueError, match="mean"):
        cfbn.fused_batch_norm(x, v["scale"], v["offset"], empty, v["variance"],
                              exponential_avg_factor=0.5)
    with pytest.raises(ValueError, match="variance"):
        cfbn.fused_batch_norm(x, v["scale"], v["offset"], v["mean"], empty,
                              is_training=False)
    with pytest.raises(ValueError, match="mean"):
        cfbn.fused_batch_norm(x, v["scale"], v["offset"], empty, empty, is_training=False)


ONE = [("NC", (1, 7)), ("NHWC", (1, 1, 1, 7)), ("NCHW", (1, 7, 1, 1)),
       ("NDHWC", (1, 1, 1, 1, 7)), ("NCDHW", (1, 7, 1, 1, 1))]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("data_format,shape", ONE, ids=[f for f, _ in ONE])
def test_one_element_per_channel_gives_zero_x_backprop(isa, data_format, shape, dtype):
    """n = 1 (a dense layer at batch size 1): x_hat = 0 and dy - mean(dy) = 0,
    so x_backprop is exactly 0, as TensorFlow gives."""
    rng = np.random.default_rng(seed_of("tf-one", data_format, np.dtype(dtype).name))
    vdt = vector_dtype(dtype)
    x = (rng.standard_normal(shape) * 3 + 100).astype(dtype)
    dy = (rng.standard_normal(shape) * 1e3).astype(dtype)
    s = rng.uniform(0.5, 4.0, 7).astype(vdt)
    o = rng.standard_normal(7).astype(vdt)
    for eps in (1e-3, 1e-5):
        f = cfbn.fused_batch_norm(x, s, o, epsilon=eps, data_format=data_format)
        dx = np.full(shape, np.nan, dtype)
        g = cfbn.fused_batch_norm_grad(dy, x, s, f.reserve_space_1, f.reserve_space_2,
                                       epsilon=eps, data_format=data_format,
                                       out={"x_backprop": dx})
        assert (dx == 0).all(), dx
        assert (g.scale_backprop == 0).all()
        np.testing.assert_array_equal(g.offset_backprop, dy.reshape(-1).astype(vdt))
        for act, side in (("relu", None), ("silu", None), (None, x.copy()), ("tanh", -x)):
            g = cfbn.fused_batch_norm_grad(dy, x, s, f.reserve_space_1, f.reserve_space_2,
                                           epsilon=eps, data_format=data_format, offset=o,
                                           activation=act, side_input=side)
            assert (g.x_backprop == 0).all(), (act, g.x_backprop)


def test_one_element_per_channel_split_gradient(isa):
    x = np.array([[3.0, -2.0, 1e4]], np.float32)
    dy = np.array([[0.7, -11.0, 3e3]], np.float32)
    s = np.array([1.5, 0.25, 3.0], np.float32)
    st = cfbn.batch_norm_statistics(x, data_format="NC")
    var = st.variance()
    gs = cfbn.batch_norm_grad_statistics(dy, x, st.mean, var, data_format="NC")
    dx = cfbn.batch_norm_grad_apply(dy, x, s, st.mean, var, gs.sum_dy, gs.sum_dy_xhat, 1,
                                    data_format="NC")
    assert (dx == 0).all(), dx


def test_one_element_per_channel_with_other_statistics_follows_the_formula(isa):
    """Reserve spaces that are not x's own statistics: x_hat is not 0 and the
    formula's dx = -gamma * r * x_hat**2 * dy is not 0 either."""
    x = np.array([[3.0, -2.0, 5.0]], np.float64)
    dy = np.array([[0.5, -1.0, 2.0]], np.float64)
    s = np.array([1.5, 0.25, 3.0])
    mu, var = np.array([1.0, 0.0, 4.0]), np.array([2.0, 0.5, 1.0])
    g = cfbn.fused_batch_norm_grad(dy, x, s, mu, var, epsilon=0.0, data_format="NC")
    ref = cfbn.reference.fused_batch_norm_grad(dy, x, s, mu, var, epsilon=0.0, data_format="NC")
    np.testing.assert_allclose(g.x_backprop, ref.x_backprop, rtol=1e-14)
    assert (g.x_backprop != 0).all()
