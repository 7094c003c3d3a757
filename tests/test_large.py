"""Tensors of more than 2**31 elements: every index needs 64 bits.

Opt-in: ``pytest -m slow tests/test_large.py`` (or CFBN_RUN_SLOW=1).  Each
test holds two float32 tensors of about 8.6 GB (x, and y that the gradient
then overwrites in place as dy -> dx), so it is skipped when the machine has
less memory available than that plus a margin.  Statistics are compared with
a chunked float64 computation over every element; y and dx are checked at
positions past 2**31 against the formulas, and in full through their
per-channel mean (which would be off if any element were left unwritten).
"""

import os
import time

import numpy as np
import pytest

import cfbn

pytestmark = pytest.mark.slow

ELEMS = 2**31 + 2**20 + 7          # at least this many, rounded up to whole shapes
CHUNK = 1 << 24
EPS = 1e-3
U = float(np.finfo(np.float32).eps)


def slow_enabled(config):
    return "slow" in (config.option.markexpr or "") or os.environ.get("CFBN_RUN_SLOW") == "1"


def available_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def shape_for(data_format):
    if data_format == "NC":
        c = 3
        return (-(-ELEMS // c), c)
    n, c = 3, 2                    # NCHW with one long row per (n, c) plane
    return (n, c, 1, -(-ELEMS // (n * c)))


def pieces(x, data_format, c):
    """Views that together hold channel c, each at most CHUNK elements."""
    if data_format == "NC":
        for i in range(0, x.shape[0], CHUNK):
            yield x[i:i + CHUNK, c]
    else:
        for n in range(x.shape[0]):
            row = x[n, c].reshape(-1)
            for i in range(0, row.size, CHUNK):
                yield row[i:i + CHUNK]


def flat_to_channel(shape, data_format, i):
    return int(np.unravel_index(i, shape)[1])


@pytest.mark.parametrize("data_format", ["NC", "NCHW"])
def test_more_than_2_31_elements(request, data_format):
    if not slow_enabled(request.config):
        pytest.skip("slow: run with -m slow or CFBN_RUN_SLOW=1")
    shape = shape_for(data_format)
    size = int(np.prod(shape))
    need = 2 * 4 * size + (2 << 30)
    if available_bytes() < need:
        pytest.skip(f"needs {need / 2**30:.1f} GiB available, have "
                    f"{available_bytes() / 2**30:.1f}")
    assert size > 2**31
    C = shape[1]
    t_start = time.perf_counter()

    rng = np.random.default_rng(2024)
    loc = np.array([3.0, -1.5, 0.25][:C])
    std = np.array([0.5, 2.0, 1.0][:C])
    x = np.empty(shape, np.float32)
    for c in range(C):
        for p in pieces(x, data_format, c):
            p[...] = rng.standard_normal(p.shape, dtype=np.float32) * std[c] + loc[c]
    scale = np.array([1.5, -0.75, 2.0][:C], np.float32)
    offset = np.array([0.5, 0.0, -1.0][:C], np.float32)

    # float64 reference statistics, two passes over every element
    n = size // C
    mu = np.array([sum(p.sum(dtype=np.float64) for p in pieces(x, data_format, c)) / n
                   for c in range(C)])
    var = np.array([sum(np.square(p.astype(np.float64) - mu[c]).sum()
                        for p in pieces(x, data_format, c)) / n for c in range(C)])
    t_ref = time.perf_counter()

    t0 = time.perf_counter()
    got = cfbn.fused_batch_norm(x, scale, offset, epsilon=EPS, data_format=data_format)
    t_fwd = time.perf_counter() - t0
    sigma = np.sqrt(var)
    size_c = np.abs(mu) + sigma
    assert np.all(np.abs(got.reserve_space_1 - mu) <= 8 * U * size_c + 1e-7 * sigma)
    assert np.all(np.abs(got.reserve_space_2 - var) <= 8 * U * var + (U * size_c) ** 2)
    assert np.all(np.abs(got.batch_variance - var * n / (n - 1)) <= 8 * U * var)

    y = got.y
    alpha = scale / np.sqrt(var + EPS)
    beta = offset.astype(np.float64)
    flat_x, flat_y = x.reshape(-1), y.reshape(-1)
    spots = [2**31 - 1, 2**31, 2**31 + 1, 2**31 + C, 2**32 - 1 if size > 2**32 else size - 2,
             size - 1] + list(rng.integers(2**31, size, 64))
    for i in spots:
        c = flat_to_channel(shape, data_format, int(i))
        xi = float(flat_x[i])
        want = alpha[c] * (xi - mu[c]) + beta[c]
        tol = 8 * U * (abs(alpha[c]) * (abs(xi) + abs(mu[c]) + 6 * abs(xi - mu[c]))
                       + abs(beta[c]) + abs(want))
        assert abs(float(flat_y[i]) - want) <= tol, (i, float(flat_y[i]), want)
    # every element written: per channel, y has mean beta and variance alpha^2 var
    for c in range(C):
        s1 = sum(p.sum(dtype=np.float64) for p in pieces(y, data_format, c))
        s2 = sum(np.square(p.astype(np.float64) - beta[c]).sum() for p in pieces(y, data_format, c))
        assert abs(s1 / n - beta[c]) <= 1e-4 * abs(alpha[c]) * sigma[c] + 1e-6, (c, s1 / n)
        assert abs(s2 / n - alpha[c] ** 2 * var[c]) <= 1e-4 * alpha[c] ** 2 * var[c], (c, s2 / n)

    # gradient, with dy = y overwritten in place by dx
    sums = np.zeros((C, 4))        # sum dy, sum dy * x_hat, and their magnitudes
    for c in range(C):
        r = 1.0 / np.sqrt(var[c] + EPS)
        for px, py in zip(pieces(x, data_format, c), pieces(y, data_format, c)):
            d = py.astype(np.float64)
            dxh = d * ((px.astype(np.float64) - mu[c]) * r)
            sums[c] += (d.sum(), dxh.sum(), np.abs(d).sum(), np.abs(dxh).sum())
    dy_spots = {int(i): float(flat_y[i]) for i in spots}
    t0 = time.perf_counter()
    g = cfbn.fused_batch_norm_grad(y, x, scale, got.reserve_space_1, got.reserve_space_2,
                                   epsilon=EPS, data_format=data_format,
                                   out={"x_backprop": y})
    t_grad = time.perf_counter() - t0
    assert g.x_backprop is y
    for c in range(C):
        assert abs(g.offset_backprop[c] - sums[c, 0]) <= 16 * U * sums[c, 2], \
            (c, g.offset_backprop[c], sums[c, 0])
        assert abs(g.scale_backprop[c] - sums[c, 1]) <= 16 * U * sums[c, 3], \
            (c, g.scale_backprop[c], sums[c, 1])
    flat_dx = y.reshape(-1)
    for i, dyi in dy_spots.items():
        c = flat_to_channel(shape, data_format, i)
        r = 1.0 / np.sqrt(var[c] + EPS)
        xhat = (float(flat_x[i]) - mu[c]) * r
        want = scale[c] * r / n * (n * dyi - sums[c, 0] - xhat * sums[c, 1])
        # the terms as rounding sees them; x_hat is formed from x and mu in float32
        xsize = (abs(float(flat_x[i])) + abs(mu[c]) + abs(float(flat_x[i]) - mu[c])) * r
        size_i = abs(scale[c]) * r * (abs(dyi) + (abs(sums[c, 0]) + xsize * abs(sums[c, 1])) / n)
        assert abs(float(flat_dx[i]) - want) <= 16 * U * size_i, (i, float(flat_dx[i]), want)
    print(f"{data_format} {shape} ({size} elements, {size * 4 / 1e9:.2f} GB per tensor): "
          f"forward {t_fwd:.1f} s, gradient {t_grad:.1f} s, "
          f"reference {t_ref - t_start:.1f} s, total {time.perf_counter() - t_start:.1f} s")
