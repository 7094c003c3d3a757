"""The output cache: large outputs reuse the buffers of freed ones.

Each test sets its own limit and empties the cache before and after.  A
buffer handed out again is poisoned before it goes back, so a result equal
to one computed into a fresh array proves that every element was written.
"""

import gc
import pickle
import threading

import numpy as np
import pytest

import cfbn

from test_dispatch import run_python

MIN = cfbn.output_cache_info()["min_bytes"]
# just above the cache's threshold, with an odd channel count
SHAPE_NHWC = (2, 16, 16, MIN // (2 * 16 * 16 * 4) + 3)
SHAPE_NCHW = (3, 5, 29, MIN // (3 * 5 * 29 * 4) + 1)

try:
    from numpy._core.multiarray import get_handler_name
except ImportError:  # NumPy 1.x
    from numpy.core.multiarray import get_handler_name


@pytest.fixture
def cache():
    old = cfbn.set_output_cache_limit(4 * MIN + (1 << 20))
    cfbn.release_output_cache()
    yield
    cfbn.set_output_cache_limit(old)
    cfbn.release_output_cache()


def data(shape, data_format, seed=0):
    rng = np.random.default_rng(seed)
    c = shape[-1] if data_format == "NHWC" else shape[1]
    x = (rng.standard_normal(shape, dtype=np.float32) * 3 + 100).astype(np.float32)
    dy = rng.standard_normal(shape, dtype=np.float32)
    vec = lambda: rng.uniform(0.5, 2, c).astype(np.float32)  # noqa: E731
    return x, dy, vec(), vec(), vec(), vec()


def forward_y(x, s, o, m, v, df, **kw):
    return cfbn.fused_batch_norm(x, s, o, m, v, data_format=df, **kw).y


def grad_dx(x, dy, s, m, v, df, **kw):
    # m and v stand for the forward's saved mean and variance
    return cfbn.fused_batch_norm_grad(dy, x, s, m * 100, v, data_format=df, **kw).x_backprop


def split_y(x, s, o, m, v, df, **kw):
    return cfbn.batch_norm_apply(x, m.astype(np.float64), v.astype(np.float64), s, o,
                                 data_format=df, **kw)


# (name, call(x, dy, s, o, m, v, df, **kw)): each makes one large output
CALLS = [
    ("forward training, fast path", lambda x, dy, s, o, m, v, df, **kw: forward_y(x, s, o, m, v, df, **kw)),
    ("forward training, general path",
     lambda x, dy, s, o, m, v, df, **kw: forward_y(x, s, o, m, v, df, activation="relu", **kw)),
    ("forward inference",
     lambda x, dy, s, o, m, v, df, **kw: forward_y(x, s, o, m, v, df, is_training=False, **kw)),
    ("gradient", lambda x, dy, s, o, m, v, df, **kw: grad_dx(x, dy, s, m, v, df, **kw)),
    ("batch_norm_apply", lambda x, dy, s, o, m, v, df, **kw: split_y(x, s, o, m, v, df, **kw)),
]


@pytest.mark.parametrize("df,shape", [("NHWC", SHAPE_NHWC), ("NCHW", SHAPE_NCHW)])
@pytest.mark.parametrize("name,call", CALLS, ids=[c[0] for c in CALLS])
def test_freed_output_is_reused_and_fully_written(cache, df, shape, name, call):
    x, dy, s, o, m, v = data(shape, df)
    x0, dy0 = x.copy(), dy.copy()
    expected = call(x, dy, s, o, m, v, df, n_threads=1)
    assert expected.nbytes >= MIN
    first = call(x, dy, s, o, m, v, df)
    np.testing.assert_array_equal(first, expected)
    assert get_handler_name(first) == "cfbn_output_cache"
    address = first.ctypes.data
    first[...] = np.nan
    del first
    gc.collect()
    before = cfbn.output_cache_info()
    assert before["held_buffers"] >= 1
    again = call(x, dy, s, o, m, v, df)
    after = cfbn.output_cache_info()
    assert after["hits"] >= before["hits"] + 1
    assert again.ctypes.data == address
    np.testing.assert_array_equal(again, expected)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(dy, dy0)


def test_reused_buffer_is_the_freed_one(cache):
    x, dy, s, o, m, v = data(SHAPE_NHWC, "NHWC")
    y = forward_y(x, s, o, m, v, "NHWC")
    address = y.ctypes.data
    del y
    hits = cfbn.output_cache_info()["hits"]
    y = forward_y(x, s, o, m, v, "NHWC")
    assert y.ctypes.data == address
    assert cfbn.output_cache_info()["hits"] == hits + 1


def test_cached_outputs_are_ordinary_arrays(cache):
    x, dy, s, o, m, v = data(SHAPE_NHWC, "NHWC")
    y = forward_y(x, s, o, m, v, "NHWC")
    assert y.flags.owndata and y.base is None and y.flags.writeable
    assert not np.shares_memory(y, x)
    z = pickle.loads(pickle.dumps(y))
    np.testing.assert_array_equal(z, y)
    # resizing goes through the handler's realloc, which must keep the data
    head = y.reshape(-1)[:1000].copy()
    y.resize((y.size // 2,), refcheck=False)
    np.testing.assert_array_equal(y[:1000], head)
    y.resize((y.size * 2 + 7,), refcheck=False)
    np.testing.assert_array_equal(y[:1000], head)
    del y
    gc.collect()
    assert cfbn.output_cache_info()["held_bytes"] <= cfbn.output_cache_info()["limit"]


def test_small_outputs_bypass_the_cache(cache):
    x, dy, s, o, m, v = data((2, 8, 8, 5), "NHWC")
    before = cfbn.output_cache_info()
    y = forward_y(x, s, o, m, v, "NHWC")
    assert get_handler_name(y) != "cfbn_output_cache"
    del y
    after = cfbn.output_cache_info()
    assert (after["hits"], after["misses"], after["held_bytes"]) == (
        before["hits"], before["misses"], 0)


def test_limit_zero_turns_the_cache_off(cache):
    cfbn.set_output_cache_limit(0)
    x, dy, s, o, m, v = data(SHAPE_NHWC, "NHWC")
    before = cfbn.output_cache_info()
    y = forward_y(x, s, o, m, v, "NHWC")
    assert get_handler_name(y) != "cfbn_output_cache"
    del y
    after = cfbn.output_cache_info()
    assert after["held_bytes"] == 0
    assert (after["hits"], after["misses"]) == (before["hits"], before["misses"])


def test_limit_bounds_what_is_held(cache):
    x, dy, s, o, m, v = data(SHAPE_NHWC, "NHWC")
    size = x.nbytes
    cfbn.set_output_cache_limit(size + size // 2)
    ys = [forward_y(x, s, o, m, v, "NHWC") for _ in range(3)]
    del ys
    gc.collect()
    info = cfbn.output_cache_info()
    assert info["held_buffers"] == 1 and info["held_bytes"] == size
    cfbn.set_output_cache_limit(3 * size)
    ys = [forward_y(x, s, o, m, v, "NHWC") for _ in range(4)]
    del ys
    gc.collect()
    info = cfbn.output_cache_info()
    assert info["held_buffers"] == 3 and info["held_bytes"] == 3 * size
    assert cfbn.set_output_cache_limit(size) == 3 * size
    info = cfbn.output_cache_info()
    assert info["held_buffers"] == 1 and info["held_bytes"] == size
    cfbn.release_output_cache()
    info = cfbn.output_cache_info()
    assert info["held_buffers"] == 0 and info["held_bytes"] == 0 and info["limit"] == size


def test_sizes_are_matched_exactly(cache):
    x, dy, s, o, m, v = data(SHAPE_NHWC, "NHWC")
    y = forward_y(x, s, o, m, v, "NHWC")
    del y
    hits = cfbn.output_cache_info()["hits"]
    shape = SHAPE_NHWC[:-1] + (SHAPE_NHWC[-1] + 2,)
    x2, dy2, s2, o2, m2, v2 = data(shape, "NHWC", seed=1)
    expected = forward_y(x2, s2, o2, m2, v2, "NHWC", out={"y": np.empty_like(x2)})
    y2 = forward_y(x2, s2, o2, m2, v2, "NHWC")
    assert cfbn.output_cache_info()["hits"] == hits
    np.testing.assert_array_equal(y2, expected)


def test_outputs_freed_on_other_threads(cache):
    x, dy, s, o, m, v = data(SHAPE_NHWC, "NHWC")
    expected = forward_y(x, s, o, m, v, "NHWC", out={"y": np.empty_like(x)})
    errors = []

    def work():
        try:
            for _ in range(6):
                y = forward_y(x, s, o, m, v, "NHWC", n_threads=1)
                if not np.array_equal(y, expected):
                    errors.append("wrong result")
                y[...] = np.nan
                del y
        except Exception as e:  # pragma: no cover - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert cfbn.output_cache_info()["held_bytes"] <= cfbn.output_cache_info()["limit"]


@pytest.mark.parametrize("bad,err", [(True, TypeError), ("1", TypeError), (1.5, TypeError),
                                     (None, TypeError), (-1, ValueError), (1 << 64, ValueError)])
def test_bad_limit(cache, bad, err):
    with pytest.raises(err, match="nbytes"):
        cfbn.set_output_cache_limit(bad)


def test_limit_from_environment():
    code = "import cfbn; print(cfbn.output_cache_info()['limit'], cfbn.runtime_info()['output_cache_limit'])"
    r = run_python(code, CFBN_OUTPUT_CACHE_MB="64")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(64 << 20)] * 2
    r = run_python(code, CFBN_OUTPUT_CACHE_MB="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "0"]
    for bad in ("lots", "-5", "1.5", str(1 << 50)):
        r = run_python(code, CFBN_OUTPUT_CACHE_MB=bad)
        assert r.returncode != 0
        assert "CFBN_OUTPUT_CACHE_MB" in r.stderr and "ValueError" in r.stderr


def test_default_limit_is_bounded():
    r = run_python("import cfbn; print(cfbn.output_cache_info()['limit'])", CFBN_OUTPUT_CACHE_MB="")
    assert r.returncode == 0, r.stderr
    with open("/proc/meminfo") as f:
        total_kb = int(f.readline().split()[1])
    limit = int(r.stdout)
    assert 0 < limit <= 1 << 30
    assert limit <= total_kb * 1024 // 16 + (1 << 20)
