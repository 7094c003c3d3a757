"""cfbn.fold_batch_norm: the folded layer gives conv/linear + BN's outputs."""
import ml_dtypes
import numpy as np
import pytest

import cfbn


def _bn(v, gamma, beta, mean, var, eps, axis):
    shape = [1] * v.ndim
    shape[axis] = -1
    r = lambda a: np.asarray(a, np.float64).reshape(shape)  # noqa: E731
    return r(gamma) * (v - r(mean)) / np.sqrt(r(var) + eps) + r(beta)


def _conv_nchw(x, w_oihw, b):
    """Valid 2-D convolution (cross-correlation), NCHW input, OIHW weight."""
    kh, kw = w_oihw.shape[2:]
    hout, wout = x.shape[2] - kh + 1, x.shape[3] - kw + 1
    patches = np.stack([x[:, :, i:i + hout, j:j + wout] for i in range(kh) for j in range(kw)],
                       axis=-1).reshape(x.shape[0], x.shape[1], hout, wout, kh, kw)
    y = np.einsum("nchwij,ocij->nohw", patches, w_oihw)
    return y if b is None else y + b.reshape(1, -1, 1, 1)


def _conv_nhwc(x, w_hwio, b):
    y = _conv_nchw(x.transpose(0, 3, 1, 2), w_hwio.transpose(3, 2, 0, 1), None)
    y = y.transpose(0, 2, 3, 1)
    return y if b is None else y + b


def _params(rng, c):
    return (rng.uniform(0.5, 2, c), rng.standard_normal(c), rng.standard_normal(c),
            rng.uniform(0.2, 3, c))


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv_oihw(with_bias, dtype):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 9, 8))
    w = rng.standard_normal((5, 3, 3, 3)).astype(dtype)
    b = rng.standard_normal(5).astype(dtype) if with_bias else None
    gamma, beta, mean, var = _params(rng, 5)
    want = _bn(_conv_nchw(x, w.astype(np.float64), None if b is None else b.astype(np.float64)),
               gamma, beta, mean, var, 1e-3, 1)
    fw, fb = cfbn.fold_batch_norm(w, b, gamma, beta, mean, var, 1e-3, out_axis=0)
    assert fw.dtype == dtype and fb.dtype == dtype and fw.shape == w.shape and fb.shape == (5,)
    got = _conv_nchw(x, fw.astype(np.float64), fb.astype(np.float64))
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 10)


def test_conv_hwio():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 7, 6, 4))
    w = rng.standard_normal((3, 2, 4, 6))
    b = rng.standard_normal(6)
    gamma, beta, mean, var = _params(rng, 6)
    want = _bn(_conv_nhwc(x, w, b), gamma, beta, mean, var, 1e-5, 3)
    fw, fb = cfbn.fold_batch_norm(w, b, gamma, beta, mean, var, 1e-5, out_axis=-1)
    np.testing.assert_allclose(_conv_nhwc(x, fw, fb), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("with_bias", [True, False])
def test_linear(with_bias):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((10, 7))
    w = rng.standard_normal((4, 7))           # PyTorch (out, in)
    b = rng.standard_normal(4) if with_bias else None
    gamma, beta, mean, var = _params(rng, 4)
    lin = x @ w.T + (0 if b is None else b)
    want = _bn(lin, gamma, beta, mean, var, 1e-3, 1)
    fw, fb = cfbn.fold_batch_norm(w, b, gamma, beta, mean, var, 1e-3)
    np.testing.assert_allclose(x @ fw.T + fb, want, rtol=1e-12, atol=1e-12)
    # and cfbn's own inference-mode batch norm agrees with the folded layer
    y = cfbn.fused_batch_norm(lin, gamma, beta, mean, var, epsilon=1e-3, data_format="NC",
                              is_training=False).y
    np.testing.assert_allclose(x @ fw.T + fb, y, rtol=1e-12, atol=1e-12)
    # a TensorFlow dense kernel is (in, out)
    fw2, fb2 = cfbn.fold_batch_norm(w.T, b, gamma, beta, mean, var, 1e-3, out_axis=-1)
    np.testing.assert_allclose(fw2, fw.T)
    np.testing.assert_allclose(fb2, fb)


def test_inputs_unmodified_and_errors():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((3, 2))
    vecs = [rng.uniform(0.5, 2, 3) for _ in range(4)]
    saved = [a.copy() for a in [w] + vecs]
    cfbn.fold_batch_norm(w, None, *vecs, 1e-3)
    for a, s in zip([w] + vecs, saved):
        np.testing.assert_array_equal(a, s)
    with pytest.raises(ValueError, match="scale"):
        cfbn.fold_batch_norm(w, None, np.ones(2), *vecs[1:], 1e-3)
    with pytest.raises(ValueError, match="out_axis"):
        cfbn.fold_batch_norm(w, None, *vecs, 1e-3, out_axis=2)
    with pytest.raises(ValueError, match="bias"):
        cfbn.fold_batch_norm(w, np.ones(4), *vecs, 1e-3)


def test_bfloat16_weights_and_vectors():
    """A bfloat16 model folds in float64 and keeps its dtype; bfloat16 vectors
    are floating-point vectors too.  Other 2-byte types are refused."""
    bf16 = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(5)
    w64 = rng.standard_normal((4, 7))
    w = w64.astype(bf16)
    gamma, beta, mean, var = _params(rng, 4)
    fw, fb = cfbn.fold_batch_norm(w, None, gamma.astype(bf16), beta, mean, var, 1e-3)
    assert fw.dtype == bf16 and fb.dtype == bf16
    g = gamma.astype(bf16).astype(np.float64)
    k = g / np.sqrt(var + 1e-3)
    want_w = (w.astype(np.float64) * k[:, None]).astype(bf16)
    want_b = ((0 - mean) * k + beta).astype(bf16)
    assert fw.tobytes() == want_w.tobytes() and fb.tobytes() == want_b.tobytes()
    with pytest.raises(TypeError, match="weight"):
        cfbn.fold_batch_norm(np.ones((4, 7), np.float16).view(np.uint16).view("V2"), None,
                             gamma, beta, mean, var, 1e-3)
    with pytest.raises(TypeError, match="scale"):
        cfbn.fold_batch_norm(w, None, np.ones(4, np.int16), beta, mean, var, 1e-3)
