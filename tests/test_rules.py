"""Every rule once: each scalar argument rule (csrc/rules.h) gives the same
message, "<name>: expected <what the rule expects>, got <value>", at every
NumPy entrance that takes the argument, and the fast paths accept exactly
what it accepts.  The words expected here are the contract of docs/numpy.md's
argument table, written out, not read from the code under test.

cfbn.torch's entrances (modules, functional form, the C++ and Python
operators, the fake kernels) are held to the same words in
test_torch_rules.py.  The CuPy path checks its scalars through the same
cfbn._args functions before it touches a GPU; with no CuPy installed it
cannot be called, so it is not among the entrances here.
"""
import math
import sys

import numpy as np
import pytest

import cfbn
import cfbn.distributed
from cfbn import _kernels

C = 3
F32 = np.float32

EPSILON = "expected a finite value >= 0, got "
FACTOR = "expected a value in [0, 1], got "
FINITE = "expected a finite value, got "
THREADS = "expected at least 1 and at most 1024, got "

BIG = sys.float_info.max
TINY = 5e-324   # the smallest subnormal


def _x(shape=(2, 2, 2, C)):
    return np.random.default_rng(1).standard_normal(shape).astype(F32)


def _v(fill=1.0):
    return np.full(C, fill, F32)


def _forward(**kw):
    return cfbn.fused_batch_norm(_x(), _v(), _v(0.0), **kw)


def _grad(**kw):
    x = _x()
    return cfbn.fused_batch_norm_grad(x, x, _v(), _v(0.0), _v(), **kw)


def _grad_grad(**kw):
    x = _x()
    return cfbn.fused_batch_norm_grad_grad(x, x, _v(), _v(0.0), _v(), x, None, None, **kw)


def _split_apply(**kw):
    return cfbn.batch_norm_apply(_x(), _v(0.0).astype(np.float64), _v().astype(np.float64),
                                 _v(), _v(0.0), **kw)


def _split_grad_statistics(**kw):
    x = _x()
    return cfbn.batch_norm_grad_statistics(x, x, _v(0.0).astype(np.float64),
                                           _v().astype(np.float64), **kw)


def _sync(**kw):
    # checked before any communicator is looked at: no MPI needed
    return cfbn.distributed.sync_batch_norm(_x(), _v(), _v(0.0), **kw)


def _sync_grad(**kw):
    x = _x()
    return cfbn.distributed.sync_batch_norm_grad(x, x, _v(), _v(0.0), _v(), **kw)


def _layer(epsilon=1e-3, momentum=0.99):
    return cfbn.BatchNorm(C, epsilon=epsilon, momentum=momentum)


def _fold(epsilon):
    return cfbn.fold_batch_norm(np.ones((C, 2), F32), np.zeros(C, F32), _v(), _v(0.0),
                                _v(0.0), _v(), epsilon)


# entrance -> a call with that argument, for each scalar rule
EPSILON_ENTRANCES = {
    "fused_batch_norm": lambda e: _forward(epsilon=e),
    "fused_batch_norm (slow path: float16)": lambda e: cfbn.fused_batch_norm(
        _x().astype(np.float16), _v(), _v(0.0), epsilon=e),
    "fused_batch_norm_grad": lambda e: _grad(epsilon=e),
    "fused_batch_norm_grad_grad": lambda e: _grad_grad(epsilon=e),
    "batch_norm_apply": lambda e: _split_apply(epsilon=e),
    "batch_norm_grad_statistics": lambda e: _split_grad_statistics(epsilon=e),
    "sync_batch_norm": lambda e: _sync(epsilon=e),
    "sync_batch_norm_grad": lambda e: _sync_grad(epsilon=e),
    "BatchNorm": lambda e: _layer(epsilon=e),
    "fold_batch_norm": _fold,
}
FACTOR_ENTRANCES = {
    "fused_batch_norm": lambda f: _forward(exponential_avg_factor=f, mean=_v(0.0),
                                           variance=_v()),
    "sync_batch_norm": lambda f: _sync(exponential_avg_factor=f, mean=_v(0.0), variance=_v()),
}
THREADS_ENTRANCES = {
    "fused_batch_norm": lambda n: _forward(n_threads=n),
    "fused_batch_norm_grad": lambda n: _grad(n_threads=n),
    "fused_batch_norm_grad_grad": lambda n: _grad_grad(n_threads=n),
    "batch_norm_statistics": lambda n: cfbn.batch_norm_statistics(_x(), n_threads=n),
    "batch_norm_apply": lambda n: _split_apply(n_threads=n),
    "sync_batch_norm": lambda n: _sync(n_threads=n),
    "sync_batch_norm_grad": lambda n: _sync_grad(n_threads=n),
}
ALPHA_ENTRANCES = {
    "fused_batch_norm": lambda a: _forward(activation="elu", alpha=a),
    "fused_batch_norm_grad": lambda a: _grad(activation="leaky_relu", alpha=a, offset=_v(0.0)),
}


def _message(call, value):
    with pytest.raises(ValueError) as info:
        call(value)
    return str(info.value)


@pytest.mark.parametrize("value", [-1.0, -TINY, math.inf, -math.inf, math.nan, -2])
@pytest.mark.parametrize("entrance", sorted(EPSILON_ENTRANCES))
def test_a_bad_epsilon_has_one_message(entrance, value):
    assert _message(EPSILON_ENTRANCES[entrance], value) == "epsilon: " + EPSILON + repr(value)


@pytest.mark.parametrize("value", [-TINY, 1.0 + 2 ** -52, math.nan, -math.inf, 2])
@pytest.mark.parametrize("entrance", sorted(FACTOR_ENTRANCES))
def test_a_bad_factor_has_one_message(entrance, value):
    assert _message(FACTOR_ENTRANCES[entrance], value) == (
        "exponential_avg_factor: " + FACTOR + repr(value))


@pytest.mark.parametrize("value", [-TINY, 1.5, math.nan])
def test_the_layers_momentum_is_a_factor(value):
    assert _message(lambda m: _layer(momentum=m), value) == "momentum: " + FACTOR + repr(value)


@pytest.mark.parametrize("value", [0, -1, 1025, 2 ** 64, -2 ** 70])
@pytest.mark.parametrize("entrance", sorted(THREADS_ENTRANCES))
def test_a_bad_thread_count_has_one_message(entrance, value):
    assert _message(THREADS_ENTRANCES[entrance], value) == "n_threads: " + THREADS + repr(value)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("entrance", sorted(ALPHA_ENTRANCES))
def test_a_bad_alpha_has_one_message(entrance, value):
    assert _message(ALPHA_ENTRANCES[entrance], value).endswith("alpha: " + FINITE + repr(value))


# the entrances that run without MPI (a collective call needs a communicator)
def _local(entrances):
    return sorted(e for e in entrances if not e.startswith("sync_"))


@pytest.mark.parametrize("value", [0.0, -0.0, TINY, 1e-3, BIG])
@pytest.mark.parametrize("entrance", _local(EPSILON_ENTRANCES))
def test_every_entrance_takes_the_edges_of_epsilon(entrance, value):
    EPSILON_ENTRANCES[entrance](value)


@pytest.mark.parametrize("value", [0.0, TINY, 0.5, 1.0 - 2 ** -53, 1.0, 0, 1])
@pytest.mark.parametrize("entrance", _local(FACTOR_ENTRANCES))
def test_every_entrance_takes_the_edges_of_the_factor(entrance, value):
    FACTOR_ENTRANCES[entrance](value)


@pytest.mark.parametrize("value", [1, 1024, None])
@pytest.mark.parametrize("entrance", _local(THREADS_ENTRANCES))
def test_every_entrance_takes_the_edges_of_the_thread_count(entrance, value):
    THREADS_ENTRANCES[entrance](value)


@pytest.mark.parametrize("value", [0.0, -0.0, TINY, 1.0, BIG])
def test_the_fast_path_takes_what_the_rule_takes(value):
    """Values at each bound of epsilon's rule run on the fast path (it
    returns a result, where it returns None for a call it leaves to the
    validator)."""
    x = _x()
    assert _kernels.fast_forward(x, _v(), _v(0.0), None, None, value, 1.0, "NHWC", True,
                                 None) is not None
    assert _kernels.fast_backward(x, x, _v(), _v(0.0), _v(), value, "NHWC", True,
                                  None) is not None


@pytest.mark.parametrize("value", [-TINY, math.inf, math.nan, -1.0])
def test_the_fast_path_leaves_a_bad_epsilon_to_the_validator(value):
    x = _x()
    assert _kernels.fast_forward(x, _v(), _v(0.0), None, None, value, 1.0, "NHWC", True,
                                 None) is None
    assert _kernels.fast_backward(x, x, _v(), _v(0.0), _v(), value, "NHWC", True,
                                  None) is None


@pytest.mark.parametrize("n", [0, 1025, 2 ** 63, -2 ** 63 - 1, 2 ** 100])
def test_the_fast_path_leaves_a_bad_thread_count_to_the_validator(n):
    x = _x()
    assert _kernels.fast_forward(x, _v(), _v(0.0), None, None, 1e-3, 1.0, "NHWC", True,
                                 n) is None


def test_the_rules_are_the_ones_documented():
    """rules.h as the Python face sees it: the documented ranges and words."""
    assert _kernels.RULES == {
        "epsilon": (0.0, BIG, "a finite value >= 0"),
        "factor": (0.0, 1.0, "a value in [0, 1]"),
        "finite": (-BIG, BIG, "a finite value"),
        "threads": (1, 1024, "at least 1 and at most 1024"),
        "count": (0, 2 ** 63 - 1, "a count >= 0"),
        "activation": (0, 7, "a code in [0, 8)")}
    assert sorted(code for code, _ in cfbn._args.ACTIVATIONS.values()) == list(range(8))
