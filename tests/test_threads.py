"""Results must not depend on the number of threads, bit for bit."""

import numpy as np
import pytest

import cfbn
from cfbn import reference

from _checks import (DTYPES, check_forward, check_grad, random_vectors, random_x, seed_of,
                     vector_dtype)

# large enough for the work to be split between threads
SHAPES = [
    ("NHWC", (8, 32, 32, 33)),
    ("NCHW", (8, 33, 32, 32)),
    ("NCHW", (4, 3, 64, 64)),
    ("NCHW", (128, 3, 32, 33)),      # reductions plane by plane in memory order
    ("NCHW", (64, 35, 7, 7)),        # small planes: channel by channel ...
    ("NCHW", (256, 5, 9, 9)),        # ... and in several pieces per channel
    ("NC", (4096, 37)),
    ("NC", (4099, 37)),              # rows and a tail of fewer than 8 rows
    ("NDHWC", (2, 8, 16, 16, 19)),
]


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def make(data_format, shape, dtype):
    rng = np.random.default_rng(seed_of("threads", data_format, shape, np.dtype(dtype).name))
    c = shape[reference.channel_axis(data_format, len(shape))]
    x = random_x(rng, shape, data_format, dtype, loc=3.0)
    dy = rng.standard_normal(shape).astype(dtype)
    return x, dy, random_vectors(rng, c, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("layout_shape", SHAPES,
                         ids=lambda s: s[0] + "-" + "x".join(map(str, s[1])))
def test_thread_count_does_not_change_results(isa, layout_shape, dtype):
    data_format, shape = layout_shape
    x, dy, v = make(data_format, shape, dtype)
    vdt = vector_dtype(dtype)
    runs = {}
    for n_threads in (1, 2, 3, None):
        fwd = cfbn.fused_batch_norm(x, v["scale"], v["offset"], v["mean"], v["variance"],
                                    exponential_avg_factor=0.25, data_format=data_format,
                                    n_threads=n_threads)
        inf = cfbn.fused_batch_norm(x, v["scale"], v["offset"], v["mean"], v["variance"],
                                    data_format=data_format, is_training=False,
                                    n_threads=n_threads)
        grad = cfbn.fused_batch_norm_grad(dy, x, v["scale"], fwd.reserve_space_1,
                                          fwd.reserve_space_2, data_format=data_format,
                                          n_threads=n_threads)
        igrad = cfbn.fused_batch_norm_grad(dy, x, v["scale"], v["mean"], v["variance"],
                                           data_format=data_format, is_training=False,
                                           n_threads=n_threads)
        runs[n_threads] = list(fwd) + list(inf) + list(grad) + list(igrad)
        if n_threads == 2:
            # the split work must also be right, not only reproducible
            check_forward(fwd, x, v["scale"], v["offset"], v["mean"], v["variance"],
                          epsilon=1e-4, exponential_avg_factor=0.25, data_format=data_format,
                          is_training=True)
            check_grad(grad, dy, x, v["scale"], fwd.reserve_space_1, fwd.reserve_space_2,
                       epsilon=1e-4, data_format=data_format, is_training=True)
    assert runs[1][1].dtype == vdt
    names = ([f"forward.{f}" for f in cfbn.BatchNormOutput._fields]
             + [f"inference.{f}" for f in cfbn.BatchNormOutput._fields]
             + [f"grad.{f}" for f in cfbn.BatchNormGrad._fields]
             + [f"inference_grad.{f}" for f in cfbn.BatchNormGrad._fields])
    for n_threads in (2, 3, None):
        for name, a, b in zip(names, runs[1], runs[n_threads]):
            assert same_bits(a, b), f"{name} differs between n_threads=1 and n_threads={n_threads}"
