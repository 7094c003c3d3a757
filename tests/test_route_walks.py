"""Channels-first gradients walk memory one of two ways, chosen by the
router from the tensors' size and the core's L2 cache: a channel at a time
(its sums, then its output while its planes are in cache) or plane by plane
in memory order.  The choice is about speed only: both walks must give the
same bits, for every gradient form that goes through it."""

import os

import numpy as np
import pytest

import cfbn
from _checks import BFLOAT16, seed_of

kernels = cfbn._kernels

#: an L2 the router treats as small (plane order up to 64 MB) and one it
#: treats as large (a channel at a time from 1 MB)
SMALL_L2, LARGE_L2 = 1 << 20, 2 << 20


@pytest.fixture
def route():
    """Sets the router as for a given L2; puts back this machine's at the end."""
    yield kernels._route_for_l2
    kernels._route_for_l2(kernels.l2_cache_bytes())


def _forms(rng, shape, dtype):
    """(name, call) for every gradient form that the walk choice covers."""
    c = shape[1]
    x = (rng.standard_normal(shape) * 3 + 5).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    side = rng.standard_normal(shape).astype(dtype)
    ggx = rng.standard_normal(shape).astype(dtype)
    vdt = np.float32 if dtype != np.float64 else np.float64
    scale = (rng.random(c) + 0.5).astype(vdt)
    offset = rng.standard_normal(c).astype(vdt)
    fwd = cfbn.fused_batch_norm(x, scale, offset, data_format="NCHW")
    mu, var = fwd.reserve_space_1, fwd.reserve_space_2
    grad = lambda **kw: cfbn.fused_batch_norm_grad(dy, x, scale, mu, var, data_format="NCHW", **kw)
    forms = [
        ("gradient", lambda: grad()),
        ("relu gradient", lambda: grad(activation="relu", offset=offset)),
        ("silu gradient", lambda: grad(activation="silu", offset=offset)),
        ("relu + side input gradient", lambda: grad(activation="relu", offset=offset, side_input=side)),
        ("second order", lambda: cfbn.fused_batch_norm_grad_grad(
            dy, x, scale, mu, var, ggx, scale, offset, data_format="NCHW")),
    ]
    return forms


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, BFLOAT16],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(8, 32, 32, 32), (9, 37, 29, 31), (2, 33, 64, 64)],
                         ids=lambda s: "x".join(map(str, s)))
def test_both_walks_give_the_same_bits(isa, route, shape, dtype):
    # Where the floor decides (bn_route.c): at least 32 channels (one piece
    # per channel), planes of at least 256 elements (plane order applies),
    # and between 1 and 64 MB read by the first-order gradient.
    n, c, h, w = shape
    read = 2 * n * c * h * w * np.dtype(dtype).itemsize
    assert c >= 32 and h * w >= 256 and (1 << 20) <= read < (64 << 20) // 3
    rng = np.random.default_rng(seed_of("walks", shape, np.dtype(dtype).name))
    forms = _forms(rng, shape, dtype)
    assert route(SMALL_L2) == 64 << 20
    plane_order = [(name, call()) for name, call in forms]
    assert route(LARGE_L2) == 1 << 20
    for (name, call), (_, want) in zip(forms, plane_order):
        got = call()
        for field, a, b in zip(got._fields, got, want):
            assert a.tobytes() == b.tobytes(), "%s: %s" % (name, field)


def test_unknown_l2_keeps_the_default_floor(route):
    assert route(0) == 1 << 20
    assert route(3 << 20) == 1 << 20
    assert route(512 << 10) == 64 << 20


def _sysfs_l2():
    base = "/sys/devices/system/cpu/cpu0/cache"
    if not os.path.isdir(base):
        return None
    for name in sorted(os.listdir(base)):
        d = os.path.join(base, name)
        try:
            with open(os.path.join(d, "level")) as f:
                level = int(f.read())
            with open(os.path.join(d, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(d, "size")) as f:
                size = f.read().strip()
        except (OSError, ValueError):
            continue
        if level == 2 and kind != "Instruction":
            scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
            return int(size.rstrip("KM")) * scale
    return 0


def test_l2_size_is_what_the_os_reports():
    want = _sysfs_l2()
    if want is None:
        pytest.skip("no /sys/devices/system/cpu/cpu0/cache on this system")
    assert cfbn.runtime_info()["l2_cache_bytes"] == want
