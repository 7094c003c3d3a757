"""cfbn against outputs of TensorFlow's CPU FusedBatchNormV3 / FusedBatchNormGradV3."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

import cfbn

from cfbn import reference

from _checks import assert_close, forward_bounds, grad_bounds, vector_dtype

NAME = "tensorflow_fused_batch_norm"


def golden_dir():
    env = os.environ.get("CFBN_GOLDEN_DIR")
    if env:
        return Path(env)
    # the repository sits at <root>/main next to <root>/shared
    return Path(__file__).resolve().parents[2] / "shared" / "golden"


GOLDEN = golden_dir()
if not (GOLDEN / f"{NAME}.json").is_file() or not (GOLDEN / f"{NAME}.npz").is_file():
    pytest.skip(f"TensorFlow golden files not found in {GOLDEN} (set CFBN_GOLDEN_DIR)",
                allow_module_level=True)

CASES = json.loads((GOLDEN / f"{NAME}.json").read_text())["cases"]
with np.load(GOLDEN / f"{NAME}.npz") as _npz:
    ARRAYS = {k: _npz[k] for k in _npz.files}

# channels-last layout -> (channels-first layout, axis permutation)
TO_CHANNELS_FIRST = {"NHWC": ("NCHW", (0, 3, 1, 2)), "NDHWC": ("NCDHW", (0, 4, 1, 2, 3))}

# A float64 evaluation of the specification agrees with every case to 3e-7 of
# the data's size (README.md); cfbn may be off the exact result by its own
# rounding bound, so the distance to TensorFlow is at most the sum of the two.
TF_RTOL = 5e-7


def arrays_of(case):
    prefix = case["name"] + "/"
    return {k[len(prefix):]: v for k, v in ARRAYS.items() if k.startswith(prefix)}


def in_layout(case, channels_first):
    """The case's tensors and data_format, transposed to channels-first if asked."""
    a = arrays_of(case)
    fmt = case["data_format"]
    back = lambda t: t  # noqa: E731
    if channels_first:
        fmt, perm = TO_CHANNELS_FIRST[fmt]
        inverse = tuple(np.argsort(perm))
        for k in ("x", "y", "y_backprop", "x_backprop"):
            a[k] = np.ascontiguousarray(a[k].transpose(perm))
        back = lambda t: t.transpose(inverse)  # noqa: E731
    return a, fmt, back


def close(name, got, want, own_bound):
    want = np.asarray(want, dtype=np.float64)
    scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    assert_close(name, got, want, own_bound + TF_RTOL * scale)


@pytest.mark.parametrize("channels_first", [False, True], ids=["native", "channels-first"])
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_forward_matches_tensorflow(isa, case, channels_first):
    a, fmt, back = in_layout(case, channels_first)
    assert a["x"].dtype == np.dtype(case["dtype"])
    res = cfbn.fused_batch_norm(
        a["x"], a["scale"], a["offset"], a["mean"], a["variance"], epsilon=case["epsilon"],
        exponential_avg_factor=case["exponential_avg_factor"], data_format=fmt,
        is_training=case["is_training"],
    )
    attrs = dict(epsilon=case["epsilon"], data_format=fmt, is_training=case["is_training"])
    exact = reference.fused_batch_norm(
        a["x"], a["scale"], a["offset"], a["mean"], a["variance"],
        exponential_avg_factor=case["exponential_avg_factor"], **attrs)
    bound = forward_bounds(a["x"], a["scale"], a["offset"], a["mean"], a["variance"], exact,
                           exponential_avg_factor=case["exponential_avg_factor"], **attrs)
    close("y", back(res.y), back(a["y"]), back(bound["y"]))
    close("batch_mean", res.batch_mean, a["batch_mean"], bound["batch_mean"])
    close("batch_variance", res.batch_variance, a["batch_variance"], bound["batch_variance"])
    if case["is_training"]:
        for name in ("reserve_space_1", "reserve_space_2"):
            close(name, getattr(res, name), a[name], bound[name])
    else:
        # TensorFlow leaves them unwritten; cfbn repeats the given statistics
        assert np.array_equal(res.reserve_space_1, a["mean"])
        assert np.array_equal(res.reserve_space_2, a["variance"])
    assert res.batch_mean.dtype == vector_dtype(a["x"].dtype)


@pytest.mark.parametrize("channels_first", [False, True], ids=["native", "channels-first"])
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_gradient_matches_tensorflow(isa, case, channels_first):
    a, fmt, back = in_layout(case, channels_first)
    if case["is_training"]:
        mu, var = a["reserve_space_1"], a["reserve_space_2"]
    else:
        mu, var = a["mean"], a["variance"]
    attrs = dict(epsilon=case["epsilon"], data_format=fmt, is_training=case["is_training"])
    res = cfbn.fused_batch_norm_grad(a["y_backprop"], a["x"], a["scale"], mu, var, **attrs)
    bound = grad_bounds(a["y_backprop"], a["x"], a["scale"], mu, var, **attrs)
    close("x_backprop", back(res.x_backprop), back(a["x_backprop"]), back(bound["x_backprop"]))
    for name in ("scale_backprop", "offset_backprop"):
        close(name, getattr(res, name), a[name], bound[name])
