"""Many calls keep memory flat: resident set size and Python allocations.

Each round makes a forward and a gradient call on small tensors (fast path,
general path with out=, every dtype and layout kind, one call large enough to
run an OpenMP team) and calls that raise.  CFBN_LEAK_ROUNDS sets the number
of rounds (default 100,000; a tenth as many run again under tracemalloc).
"""

import gc
import os
import tracemalloc

import numpy as np

import cfbn

from _checks import BFLOAT16, make_shape, random_vectors, random_x

PAGE = os.sysconf("SC_PAGE_SIZE")
ROUNDS = int(os.environ.get("CFBN_LEAK_ROUNDS", "100000"))


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def make_cases():
    cases = []
    for i, (df, dtype) in enumerate([("NHWC", np.float32), ("NCHW", np.float64),
                                     ("NC", np.float16), ("NDHWC", np.float32),
                                     ("NCHW", BFLOAT16)]):
        shape = make_shape(df, 2, 9, 5)
        rng = np.random.default_rng(i)
        x = random_x(rng, shape, df, dtype)
        dy = rng.standard_normal(shape).astype(dtype)
        cases.append((df, x, dy, random_vectors(rng, 5, dtype)))
    return cases


def one_round(cases, j, big):
    df, x, dy, v = cases[j % len(cases)]
    s, o, m, var = v["scale"], v["offset"], v["mean"], v["variance"]
    if j % 2:
        f = cfbn.fused_batch_norm(x, s, o, m, var, exponential_avg_factor=0.5, data_format=df)
        g = cfbn.fused_batch_norm_grad(dy, x, s, f.reserve_space_1, f.reserve_space_2,
                                       data_format=df)
    else:
        f = cfbn.fused_batch_norm(x, s, o, m, var, data_format=df, is_training=False,
                                  out={"y": np.empty_like(x)})
        g = cfbn.fused_batch_norm_grad(dy, x, s, m, var, data_format=df, is_training=False,
                                       out=(None, np.empty_like(s), None))
    # calls that raise, from the fast path's checks and from the general path's
    for bad in ({"epsilon": float("nan")}, {"data_format": "XYZ"}, {"n_threads": 0},
                {"out": {"y": x[:1]}}):
        try:
            cfbn.fused_batch_norm(x, s, o, m, var, **{"data_format": df, **bad})
        except (ValueError, TypeError):
            pass
        else:
            raise AssertionError(f"no error for {bad}")
    try:
        cfbn.fused_batch_norm_grad(dy[:1], x, s, m, var, data_format=df)
    except ValueError:
        pass
    if j % 1000 == 0:
        bx, bs = big
        cfbn.fused_batch_norm(bx, bs, bs, data_format="NC", n_threads=2)
    return f, g


def run_rounds(n, rss_slack):
    cases = make_cases()
    big = (np.ones((40000, 3), np.float32), np.ones(3, np.float32))
    for j in range(2000):          # warm up: caches, OpenMP team, allocator pools
        one_round(cases, j, big)
    gc.collect()
    rss0 = rss_bytes()
    for j in range(n):
        one_round(cases, j, big)
    gc.collect()
    growth = rss_bytes() - rss0
    print(f"{n} rounds: RSS {rss0 / 2**20:.1f} MiB, growth {growth / 1024:.0f} KiB")
    # a leak of one malloc chunk (32 bytes) per round would be 32 * n bytes
    assert growth <= rss_slack, f"RSS grew by {growth / 1024:.0f} KiB over {n} rounds"

    tracemalloc.start()
    try:
        for j in range(2000):
            one_round(cases, j, big)
        gc.collect()
        before = tracemalloc.take_snapshot()
        traced0 = tracemalloc.get_traced_memory()[0]
        for j in range(n // 10):
            one_round(cases, j, big)
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] - traced0
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    top = after.compare_to(before, "lineno")[:3]
    print(f"{n // 10} rounds under tracemalloc: traced growth {traced} bytes")
    assert traced <= 16 * 1024, f"traced memory grew by {traced} bytes: {top}"


def test_rss_and_traced_memory_flat():
    run_rounds(ROUNDS, rss_slack=1024 * 1024)
