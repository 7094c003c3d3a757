"""The plain call (no out=, contiguous arrays) takes a fast path that skips the
Python layer's validation; every other call takes the general path.  Both
must compute exactly the same thing."""

import numpy as np
import pytest

import cfbn
from _checks import DTYPES, LAYOUTS, make_shape, random_vectors, random_x, seed_of, vector_dtype


def _bitwise_equal(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("mode", ["train", "train_factor", "inference"])
def test_fast_and_general_paths_agree(isa, data_format, dtype, mode):
    rng = np.random.default_rng(seed_of("paths", data_format, np.dtype(dtype).name, mode))
    shape = make_shape(data_format, 3, 13, 17)
    x = random_x(rng, shape, data_format, dtype)
    c = 17
    v = random_vectors(rng, c, dtype)
    scale, offset, mean, variance = v["scale"], v["offset"], v["mean"], v["variance"]
    kw = dict(epsilon=1e-3, data_format=data_format, is_training=mode != "inference",
              exponential_avg_factor=0.25 if mode == "train_factor" else 1.0)
    stats = (mean, variance) if mode != "train" else (None, None)
    # the plain call must really be the fast path's
    assert cfbn._kernels.fast_forward(x, scale, offset, *stats, kw["epsilon"],
                                      kw["exponential_avg_factor"], data_format,
                                      kw["is_training"], None) is not None
    fast = cfbn.fused_batch_norm(x, scale, offset, *stats, **kw)
    general = cfbn.fused_batch_norm(x, scale, offset, *stats, out={}, **kw)
    assert type(fast) is cfbn.BatchNormOutput
    for name, a, b in zip(fast._fields, fast, general):
        assert _bitwise_equal(a, b), name

    dy = random_x(rng, shape, data_format, dtype)
    gkw = dict(epsilon=1e-3, data_format=data_format, is_training=mode != "inference")
    assert cfbn._kernels.fast_backward(dy, x, scale, fast[3], fast[4], 1e-3, data_format,
                                       gkw["is_training"], None) is not None
    gfast = cfbn.fused_batch_norm_grad(dy, x, scale, fast[3], fast[4], **gkw)
    ggeneral = cfbn.fused_batch_norm_grad(dy, x, scale, fast[3], fast[4], out={}, **gkw)
    assert type(gfast) is cfbn.BatchNormGrad
    for name, a, b in zip(gfast._fields, gfast, ggeneral):
        assert _bitwise_equal(a, b), name
    assert vector_dtype(dtype) == gfast.scale_backprop.dtype


def test_unusual_arguments_take_the_general_path():
    """Arguments the fast path does not take (ints for floats, numpy bools,
    numpy integer thread counts) still work through the general path."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 3, 4)).astype(np.float32)
    scale, offset = np.ones(4, np.float32), np.zeros(4, np.float32)
    want = cfbn.fused_batch_norm(x, scale, offset, epsilon=1e-3)
    for kw in (dict(epsilon=np.float64(1e-3)), dict(epsilon=1e-3, is_training=np.bool_(True)),
               dict(epsilon=1e-3, n_threads=np.int64(2)), dict(epsilon=1e-3, exponential_avg_factor=1)):
        got = cfbn.fused_batch_norm(x, scale, offset, **kw)
        for a, b in zip(got, want):
            assert _bitwise_equal(a, b), kw
