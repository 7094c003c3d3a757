"""The plain call (contiguous NumPy arrays of matching dtypes, Python scalars,
plain out= arrays) takes a fast path that skips the Python layer's
validation; every other call takes the general path.  Both must compute
exactly the same thing.  A NumPy bool for is_training is one way to send an
otherwise plain call down the general path."""

import gc
import pickle
import sys

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
    # the general call first: the fast paths take bfloat16 once cfbn._args
    # has seen ml_dtypes' type, whichever test runs first
    general = cfbn.fused_batch_norm(x, scale, offset, *stats,
                                     **dict(kw, is_training=np.bool_(kw["is_training"])))
    # the plain call must really be the fast path's
    assert cfbn._kernels.fast_forward(x, scale, offset, *stats, kw["epsilon"],
                                      kw["exponential_avg_factor"], data_format,
                                      kw["is_training"], None) is not None
    fast = cfbn.fused_batch_norm(x, scale, offset, *stats, **kw)
    assert type(fast) is cfbn.BatchNormOutput
    for name, a, b in zip(fast._fields, fast, general):
        assert _bitwise_equal(a, b), name

    dy = random_x(rng, shape, data_format, dtype)
    gkw = dict(epsilon=1e-3, data_format=data_format, is_training=mode != "inference")
    assert cfbn._kernels.fast_backward(dy, x, scale, fast[3], fast[4], 1e-3, data_format,
                                       gkw["is_training"], None) is not None
    gfast = cfbn.fused_batch_norm_grad(dy, x, scale, fast[3], fast[4], **gkw)
    ggeneral = cfbn.fused_batch_norm_grad(dy, x, scale, fast[3], fast[4],
                                          **dict(gkw, is_training=np.bool_(gkw["is_training"])))
    assert type(gfast) is cfbn.BatchNormGrad
    for name, a, b in zip(gfast._fields, gfast, ggeneral):
        assert _bitwise_equal(a, b), name
    assert vector_dtype(dtype) == gfast.scale_backprop.dtype


def _same_result(fast, cls):
    """fast is an ordinary instance of the named tuple cls: what cls(*fast)
    gives, in every way a caller can look at it."""
    made = cls(*fast)
    assert type(fast) is cls and len(fast) == len(cls._fields)
    assert all(getattr(fast, f) is v for f, v in zip(cls._fields, fast))
    assert all(a is b for a, b in zip(fast, made)) and fast == made
    assert fast._asdict().keys() == made._asdict().keys() and repr(fast) == repr(made)
    assert fast._replace() == made and isinstance(fast, tuple)
    assert gc.is_tracked(fast) == gc.is_tracked(made)
    back = pickle.loads(pickle.dumps(fast))
    assert type(back) is cls and all(_bitwise_equal(a, b) for a, b in zip(back, fast))


def test_fast_path_results_are_plain_named_tuples():
    rng = np.random.default_rng(seed_of("paths", "results"))
    x = random_x(rng, (2, 3, 5, 7), "NHWC", np.float32)
    v = random_vectors(rng, 7, np.float32)
    side = random_x(rng, (2, 3, 5, 7), "NHWC", np.float32)
    fwd = cfbn.fused_batch_norm(x, v["scale"], v["offset"])
    _same_result(fwd, cfbn.BatchNormOutput)
    dy = random_x(rng, x.shape, "NHWC", np.float32)
    _same_result(cfbn.fused_batch_norm_grad(dy, x, v["scale"], fwd[3], fwd[4]), cfbn.BatchNormGrad)
    _same_result(cfbn.fused_batch_norm_grad(dy, x, v["scale"], fwd[3], fwd[4], offset=v["offset"],
                                            activation="relu", side_input=side),
                 cfbn.BatchNormGradSide)
    _same_result(cfbn.fused_batch_norm_grad_grad(dy, x, v["scale"], fwd[3], fwd[4], dy),
                 cfbn.BatchNormGradGrad)


def test_fast_path_results_hold_each_item_once():
    x = np.ones((2, 3, 5, 7), np.float32)
    scale, offset = np.ones(7, np.float32), np.zeros(7, np.float32)
    result = cfbn.fused_batch_norm(x, scale, offset)
    items = list(result)
    before = [sys.getrefcount(v) for v in items]
    del result
    assert [sys.getrefcount(v) for v in items] == [n - 1 for n in before]


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


@pytest.mark.parametrize("form", ["tuple", "list", "dict"])
def test_fast_path_takes_plain_outputs(form):
    """Preallocated outputs keep the fast path, are written in place and
    come back as the very same objects; the results equal a plain call."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 5, 5, 6)).astype(np.float32)
    scale, offset = np.ones(6, np.float32), np.zeros(6, np.float32)
    want = cfbn.fused_batch_norm(x, scale, offset, epsilon=1e-3)
    bufs = [np.full_like(a, np.nan) for a in want]
    bufs[2] = None  # one left for cfbn to allocate
    out = {"tuple": tuple(bufs), "list": list(bufs),
           "dict": {f: b for f, b in zip(cfbn.BatchNormOutput._fields, bufs) if b is not None}}[form]
    assert cfbn._kernels.fast_forward(x, scale, offset, None, None, 1e-3, 1.0, "NHWC", True,
                                      None, out) is not None
    got = cfbn.fused_batch_norm(x, scale, offset, epsilon=1e-3, out=out)
    for i, (a, b) in enumerate(zip(got, want)):
        assert _bitwise_equal(a, b)
        if bufs[i] is not None:
            assert a is bufs[i]
    dy = rng.standard_normal(x.shape).astype(np.float32)
    gwant = cfbn.fused_batch_norm_grad(dy, x, scale, want[3], want[4], epsilon=1e-3)
    gbufs = [np.full_like(a, np.nan) for a in gwant]
    gout = {"tuple": tuple(gbufs), "list": list(gbufs),
            "dict": dict(zip(cfbn.BatchNormGrad._fields, gbufs))}[form]
    ggot = cfbn.fused_batch_norm_grad(dy, x, scale, want[3], want[4], epsilon=1e-3, out=gout)
    for a, b, buf in zip(ggot, gwant, gbufs):
        assert a is buf and _bitwise_equal(a, b)


def test_fast_path_leaves_bad_outputs_to_the_general_path():
    """Outputs the fast path does not take get the general path's errors."""
    x = np.ones((1, 2, 2, 3), np.float32)
    s = np.ones(3, np.float32)
    y = np.empty_like(x)
    for out, exc, words in (
            ((y, y[0, 0, 0], None, None, None), ValueError, "shares memory"),
            ((x.reshape(-1)[1:].reshape(1, 1, 11, 1)[..., :1], None, None, None, None),
             ValueError, "shape"),
            ({"z": y}, ValueError, "unknown"),
            ((np.empty((1, 2, 2, 3), np.float64), None, None, None, None), TypeError, "dtype")):
        assert cfbn._kernels.fast_forward(x, s, s, None, None, 1e-3, 1.0, "NHWC", True, None,
                                          out) is None
        with pytest.raises(exc, match=words):
            cfbn.fused_batch_norm(x, s, s, epsilon=1e-3, out=out)
    # an output that partly overlaps an input
    big = np.zeros(13, np.float32)
    xin = big[:12].reshape(1, 2, 2, 3)
    yout = big[1:13].reshape(1, 2, 2, 3)
    assert cfbn._kernels.fast_forward(xin, s, s, None, None, 1e-3, 1.0, "NHWC", True, None,
                                      (yout, None, None, None, None)) is None
    with pytest.raises(ValueError, match="overlaps"):
        cfbn.fused_batch_norm(xin, s, s, epsilon=1e-3, out=(yout, None, None, None, None))
