"""The CuPy path against cfbn.reference and the CPU path; the array-type dispatch.

Execution tests need a GPU and are skipped, with the reason, where CuPy is
missing or cupy.is_available() is false.  The dispatch tests run anywhere.
"""
import subprocess
import sys

import numpy as np
import pytest

import cfbn
from _checks import (DTYPES, LAYOUTS, check_forward, check_grad, make_shape, random_vectors,
                     random_x, seed_of, vector_dtype)

try:
    import cupy
except ImportError:
    cupy = None

if cupy is None:
    _WHY = "cupy is not installed"
elif not cupy.is_available():
    _WHY = "cupy.is_available() is false: no usable CUDA device or driver"
else:
    _WHY = ""
needs_gpu = pytest.mark.skipif(bool(_WHY), reason=_WHY or "GPU available")

GPU_SHAPES = [(2, 7, 3), (3, 33, 17), (1, 7, 257), (1, 1, 5), (0, 7, 8), (8, 4096, 16)]


def to_host(result):
    return type(result)(*(cupy.asnumpy(a) for a in result))


@needs_gpu
@pytest.mark.parametrize("dims", GPU_SHAPES, ids=str)
@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
def test_forward_matches_reference_and_cpu(dtype, data_format, dims, is_training):
    rng = np.random.default_rng(seed_of("gpu-fwd", dtype, data_format, dims, is_training))
    shape = make_shape(data_format, *dims)
    x = random_x(rng, shape, data_format, dtype)
    v = random_vectors(rng, dims[2], dtype)
    f = 0.25 if is_training else 1.0
    kw = dict(epsilon=1e-3, data_format=data_format, is_training=is_training,
              exponential_avg_factor=f)
    got = cfbn.fused_batch_norm(cupy.asarray(x), *(cupy.asarray(v[k]) for k in
                                ("scale", "offset", "mean", "variance")), **kw)
    assert all(isinstance(a, cupy.ndarray) for a in got)
    host = to_host(got)
    check_forward(host, x, v["scale"], v["offset"], v["mean"], v["variance"], **kw)
    cpu = cfbn.fused_batch_norm(x, v["scale"], v["offset"], v["mean"], v["variance"], **kw)
    for g, c in zip(host, cpu):
        np.testing.assert_allclose(g.astype(np.float64), c.astype(np.float64),
                                   rtol=1e-2 if dtype == np.float16 else 1e-5, atol=1e-5)


@needs_gpu
@pytest.mark.parametrize("dims", GPU_SHAPES, ids=str)
@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
def test_grad_matches_reference(dtype, data_format, dims, is_training):
    rng = np.random.default_rng(seed_of("gpu-grad", dtype, data_format, dims, is_training))
    shape = make_shape(data_format, *dims)
    x = random_x(rng, shape, data_format, dtype)
    dy = random_x(rng, shape, data_format, dtype, loc=0.0, std=1.0)
    v = random_vectors(rng, dims[2], dtype)
    kw = dict(epsilon=1e-3, data_format=data_format, is_training=is_training)
    got = cfbn.fused_batch_norm_grad(*(cupy.asarray(a) for a in
                                       (dy, x, v["scale"], v["mean"], v["variance"])), **kw)
    check_grad(to_host(got), dy, x, v["scale"], v["mean"], v["variance"], **kw)


@needs_gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: np.dtype(d).name)
def test_large_mean_keeps_precision(dtype):
    rng = np.random.default_rng(seed_of("gpu-shift", dtype))
    shape = make_shape("NHWC", 4, 1000, 8)
    x = random_x(rng, shape, "NHWC", dtype, loc=1e4 if dtype == np.float32 else 100.0,
                 std=1.0)
    v = random_vectors(rng, 8, dtype)
    got = cfbn.fused_batch_norm(cupy.asarray(x), cupy.asarray(v["scale"]),
                                cupy.asarray(v["offset"]))
    check_forward(to_host(got), x, v["scale"], v["offset"], None, None, epsilon=1e-4,
                  data_format="NHWC", is_training=True)


@needs_gpu
def test_out_and_in_place_running_statistics():
    rng = np.random.default_rng(seed_of("gpu-out"))
    x = cupy.asarray(random_x(rng, (2, 3, 5, 4), "NHWC", np.float32))
    v = {k: cupy.asarray(a) for k, a in random_vectors(rng, 4, np.float32).items()}
    mean0, var0 = v["mean"].copy(), v["variance"].copy()
    y = cupy.full(x.shape, cupy.nan, np.float32)
    res = cfbn.fused_batch_norm(x, v["scale"], v["offset"], v["mean"], v["variance"],
                                exponential_avg_factor=0.1,
                                out={"y": y, "batch_mean": v["mean"],
                                     "batch_variance": v["variance"]})
    assert res.y is y and res.batch_mean is v["mean"]
    ref = cfbn.fused_batch_norm(cupy.asnumpy(x), *(cupy.asnumpy(a) for a in
                                (v["scale"], v["offset"], mean0, var0)),
                                exponential_avg_factor=0.1)
    np.testing.assert_allclose(cupy.asnumpy(res.batch_mean), ref.batch_mean, rtol=1e-6)
    np.testing.assert_allclose(cupy.asnumpy(res.y), ref.y, rtol=1e-5, atol=1e-5)


@needs_gpu
def test_gpu_errors_match_cpu_wording():
    x = cupy.zeros((2, 3, 3, 4), np.float32)
    s = cupy.ones(4, np.float32)
    with pytest.raises(ValueError, match="scale"):
        cfbn.fused_batch_norm(x, cupy.ones(5, np.float32), s)
    with pytest.raises(TypeError, match="offset"):
        cfbn.fused_batch_norm(x, s, cupy.ones(4, np.float64))
    with pytest.raises(ValueError, match="mean"):
        cfbn.fused_batch_norm(x, s, s, is_training=False)
    with pytest.raises(TypeError, match="offset.*host memory.*CuPy"):
        cfbn.fused_batch_norm(x, s, np.ones(4, np.float32))
    with pytest.raises(ValueError, match="data_format"):
        cfbn.fused_batch_norm(x, s, s, data_format="NWHC")


# ---- dispatch: no GPU needed ----

class _FakeCupyArray:
    """Stands in for a CuPy array: the dispatch looks only at the type's module."""


_FakeCupyArray.__module__ = "cupy._fake"


def test_mixed_numpy_and_cupy_names_the_argument():
    x = np.zeros((2, 2, 2, 3), np.float32)
    s = np.ones(3, np.float32)
    with pytest.raises(TypeError, match=r"scale: got a CuPy array, but x is a NumPy array"):
        cfbn.fused_batch_norm(x, _FakeCupyArray(), s)
    with pytest.raises(TypeError, match=r"y_backprop: got a CuPy array, but x is a NumPy"):
        cfbn.fused_batch_norm_grad(_FakeCupyArray(), x, s, s, s)
    with pytest.raises(TypeError, match=r"out\['y'\]: got a CuPy array"):
        cfbn.fused_batch_norm(x, s, s, out={"y": _FakeCupyArray()})


def test_numpy_calls_never_import_cupy():
    code = ("import sys, numpy as np, cfbn\n"
            "x = np.ones((2, 2, 2, 3), np.float32); s = np.ones(3, np.float32)\n"
            "cfbn.fused_batch_norm(x, s, s)\n"
            "cfbn.fused_batch_norm(x, s, s, out={'y': np.empty_like(x)})\n"
            "cfbn.fused_batch_norm_grad(x, x, s, s, s)\n"
            "assert not any(m == 'cupy' or m.startswith('cupy.') for m in sys.modules)\n")
    subprocess.run([sys.executable, "-c", code], check=True)
