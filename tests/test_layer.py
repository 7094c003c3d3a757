"""cfbn.BatchNorm: forward/backward against the functional calls, running
statistics in each framework's convention, and no allocations per step."""
import gc
import tracemalloc
import weakref

import numpy as np
import pytest

import cfbn
from cfbn import layer as L
from cfbn import reference

from _checks import BFLOAT16, HALF_DTYPES


def _batches(shape, steps, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(shape) * rng.uniform(0.5, 2) + rng.uniform(-1, 1)).astype(dtype)
            for _ in range(steps)]


def _simulate(batches, axes, momentum, convention, mean0, var0):
    """The framework's running-statistics update, by formula, in float64."""
    new_weight, bessel = L.CONVENTIONS[convention]
    f = momentum if new_weight else 1.0 - momentum
    m, v = mean0.astype(np.float64), var0.astype(np.float64)
    for x in batches:
        xd = x.astype(np.float64)
        n = int(np.prod([x.shape[a] for a in axes]))
        mu = xd.mean(axis=axes)
        var = ((xd - np.expand_dims(mu, axes)) ** 2).mean(axis=axes)
        if bessel and n > 1:
            var = var * n / (n - 1)
        m = (1 - f) * m + f * mu
        v = (1 - f) * v + f * var
    return m, v


@pytest.mark.parametrize("data_format,shape", [("NHWC", (4, 5, 6, 8)), ("NCHW", (4, 8, 5, 6)),
                                               ("NC", (32, 8))])
def test_running_statistics_tensorflow(data_format, shape):
    bn = cfbn.BatchNorm(8, data_format=data_format, momentum=0.9)
    batches = _batches(shape, 5, seed=1)
    for x in batches:
        bn.forward(x)
    axes = reference.reduce_axes(data_format, len(shape))
    m, v = _simulate(batches, axes, 0.9, "tensorflow", np.zeros(8), np.ones(8))
    np.testing.assert_allclose(bn.moving_mean, m, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.moving_variance, v, rtol=1e-5, atol=1e-6)


def test_running_statistics_keras_and_pytorch_by_formula():
    shape = (4, 5, 6, 8)
    axes = (0, 1, 2)
    n = 4 * 5 * 6
    batches = _batches(shape, 6, seed=2)
    bn = cfbn.BatchNorm(8, momentum=0.8)
    bn.moving_variance[:] = 0.0   # so that the variance conversion is exact
    for x in batches:
        bn(x)
    # Keras: the same momentum, biased batch variance
    km, kv = _simulate(batches, axes, 0.8, "keras", np.zeros(8), np.zeros(8))
    np.testing.assert_allclose(bn.moving_mean, km, rtol=1e-5, atol=1e-6)
    as_keras = L.convert_moving_variance(bn.moving_variance, n, "tensorflow", "keras")
    np.testing.assert_allclose(as_keras, kv, rtol=1e-5)
    np.testing.assert_allclose(L.convert_moving_variance(kv, n, "keras", "pytorch"),
                               bn.moving_variance, rtol=1e-5)
    # PyTorch: momentum 0.2 weighs the new batch, as the layer's 0.8 weighs the old value
    p = L.momentum_from_factor(L.exponential_avg_factor(0.8, "keras"), "pytorch")
    assert p == pytest.approx(0.2)
    pm, pv = _simulate(batches, axes, p, "pytorch", np.zeros(8), np.zeros(8))
    np.testing.assert_allclose(bn.moving_mean, pm, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.moving_variance, pv, rtol=1e-5, atol=1e-6)


def test_conversion_helpers():
    assert L.exponential_avg_factor(0.99) == pytest.approx(0.01)
    assert L.exponential_avg_factor(0.99, "keras") == pytest.approx(0.01)
    assert L.exponential_avg_factor(0.1, "pytorch") == pytest.approx(0.1)
    assert L.momentum_from_factor(0.01, "tensorflow") == pytest.approx(0.99)
    np.testing.assert_allclose(L.convert_moving_variance([3.0], 4, "pytorch", "keras"), [2.25])
    np.testing.assert_allclose(L.convert_moving_variance([3.0], 1, "pytorch", "keras"), [3.0])
    with pytest.raises(ValueError, match="source"):
        L.convert_moving_variance([1.0], 4, "mxnet", "keras")
    with pytest.raises(ValueError, match="momentum"):
        L.exponential_avg_factor(1.5)


def test_against_pytorch():
    torch = pytest.importorskip("torch")
    shape = (4, 8, 5, 6)
    batches = _batches(shape, 4, seed=3)
    bn = cfbn.BatchNorm(8, data_format="NCHW", momentum=0.9, epsilon=1e-5)
    tb = torch.nn.BatchNorm2d(8, eps=1e-5, momentum=L.momentum_from_factor(
        L.exponential_avg_factor(0.9), "pytorch")).double()
    for x in batches:
        y = bn(x)
        ty = tb(torch.from_numpy(x.astype(np.float64)))
        np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(bn.moving_mean, tb.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.moving_variance, tb.running_var.numpy(), rtol=1e-5, atol=1e-6)
    # gradients with a fused relu and a residual input
    rng = np.random.default_rng(4)
    x = batches[0]
    side = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    bn2 = cfbn.BatchNorm(8, data_format="NCHW", epsilon=1e-5, activation="relu")
    bn2.scale[:] = rng.uniform(0.5, 2, 8)
    bn2.offset[:] = rng.standard_normal(8)
    y = bn2.forward(x, side_input=side).copy()
    dx = bn2.backward(dy)
    tx = torch.from_numpy(x.astype(np.float64)).requires_grad_()
    ts = torch.from_numpy(side.astype(np.float64)).requires_grad_()
    tb2 = torch.nn.BatchNorm2d(8, eps=1e-5).double()
    with torch.no_grad():
        tb2.weight.copy_(torch.from_numpy(bn2.scale.astype(np.float64)))
        tb2.bias.copy_(torch.from_numpy(bn2.offset.astype(np.float64)))
    ty = torch.relu(tb2(tx) + ts)
    ty.backward(torch.from_numpy(dy.astype(np.float64)))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(bn2.side_input_grad, ts.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(bn2.scale_grad, tb2.weight.grad.numpy(), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(bn2.offset_grad, tb2.bias.grad.numpy(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", [np.float32, BFLOAT16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("activation", [None, "silu"])
def test_forward_backward_match_functional(activation, dtype):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4, 4, 6)).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    bn = cfbn.BatchNorm(6, activation=activation, dtype=dtype)
    bn.scale[:] = rng.uniform(0.5, 2, 6)
    bn.offset[:] = rng.standard_normal(6)
    y = bn.forward(x).copy()
    dx = bn.backward(dy).copy()
    f = cfbn.fused_batch_norm(x, bn.scale, bn.offset, epsilon=1e-3, activation=activation)
    g = cfbn.fused_batch_norm_grad(dy, x, bn.scale, f.reserve_space_1, f.reserve_space_2,
                                   epsilon=1e-3, offset=bn.offset, activation=activation)
    np.testing.assert_array_equal(y, f.y)
    np.testing.assert_array_equal(dx, g.x_backprop)
    np.testing.assert_array_equal(bn.scale_grad, g.scale_backprop)
    np.testing.assert_array_equal(bn.offset_grad, g.offset_backprop)
    assert bn.side_input_grad is None
    # eval: the running statistics, which stay put; the gradient is the inference one
    mm, mv = bn.moving_mean.copy(), bn.moving_variance.copy()
    bn.eval()
    y2 = bn(x).copy()
    np.testing.assert_array_equal(bn.moving_mean, mm)
    f2 = cfbn.fused_batch_norm(x, bn.scale, bn.offset, mm, mv, epsilon=1e-3, is_training=False,
                               activation=activation)
    np.testing.assert_array_equal(y2, f2.y)
    dx2 = bn.backward(dy)
    g2 = cfbn.fused_batch_norm_grad(dy, x, bn.scale, mm, mv, epsilon=1e-3, is_training=False,
                                    offset=bn.offset, activation=activation)
    np.testing.assert_array_equal(dx2, g2.x_backprop)
    assert bn.train() is bn and bn.training
    bn.forward(x, training=False)
    np.testing.assert_array_equal(bn.moving_mean, mm)


@pytest.mark.parametrize("dtype", [np.float32, BFLOAT16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("side", [False, True])
def test_training_step_allocates_nothing(side, dtype):
    rng = np.random.default_rng(6)
    shape = (4, 8, 8, 512)
    x = rng.standard_normal(shape).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    s = rng.standard_normal(shape).astype(dtype) if side else None
    bn = cfbn.BatchNorm(512, activation="relu", dtype=dtype)
    bn.forward(x, side_input=s)
    bn.backward(dy)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for _ in range(3):
            bn.forward(x, side_input=s)
            bn.backward(dy)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    # the smallest array a step could allocate is a per-channel vector (2 KiB)
    grown = [st for st in after.compare_to(before, "lineno") if st.size_diff >= 1024]
    assert not grown, grown[:5]
    peak_blocks = [st for st in after.statistics("lineno") if st.size >= 1024
                   and "cfbn" in str(st.traceback)]
    assert not peak_blocks, peak_blocks[:5]


def test_errors():
    with pytest.raises(ValueError, match="activation"):
        cfbn.BatchNorm(4, activation="gelu")
    with pytest.raises(ValueError, match="data_format"):
        cfbn.BatchNorm(4, data_format="HWC")
    with pytest.raises(TypeError, match="dtype"):
        cfbn.BatchNorm(4, dtype=np.int32)
    with pytest.raises(TypeError, match=r"^dtype: expected float32, float64, float16 or bfloat16"):
        cfbn.BatchNorm(4, dtype=np.uint16)
    with pytest.raises(RuntimeError, match="forward"):
        cfbn.BatchNorm(4).backward(np.zeros((1, 1, 1, 4), np.float32))


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=lambda d: d.name)
def test_half_parameters_are_float32(dtype):
    bn = cfbn.BatchNorm(3, dtype=dtype, data_format="NC")
    assert bn.scale.dtype == np.float32 and bn.moving_variance.dtype == np.float32
    y = bn(np.arange(12).reshape(4, 3).astype(dtype))
    assert y.dtype == dtype
    assert bn.backward(np.ones((4, 3), dtype)).dtype == dtype


# --- constructor arguments ----------------------------------------------------------------

@pytest.mark.parametrize("value,exc", [(3.7, TypeError), (3.0, TypeError), (True, TypeError),
                                       (np.bool_(True), TypeError), ("3", TypeError),
                                       (None, TypeError), (0, ValueError), (-2, ValueError)])
def test_num_features_is_a_positive_int(value, exc):
    with pytest.raises(exc, match="num_features"):
        cfbn.BatchNorm(value)


def test_num_features_accepts_integer_types():
    assert cfbn.BatchNorm(np.int64(3)).scale.shape == (3,)
    assert type(cfbn.BatchNorm(np.int32(2)).num_features) is int


@pytest.mark.parametrize("kwargs,exc,word", [
    (dict(epsilon=-1e-3), ValueError, "epsilon"),
    (dict(epsilon=float("nan")), ValueError, "epsilon"),
    (dict(epsilon=float("inf")), ValueError, "epsilon"),
    (dict(epsilon="1e-3"), TypeError, "epsilon"),
    (dict(epsilon=None), TypeError, "epsilon"),
    (dict(momentum=1.5), ValueError, "momentum"),
    (dict(momentum=-0.1), ValueError, "momentum"),
    (dict(momentum=float("nan")), ValueError, "momentum"),
    (dict(momentum="0.9"), TypeError, "momentum"),
    (dict(momentum=True), TypeError, "momentum"),
    (dict(data_format=["NHWC"]), ValueError, "data_format"),
    (dict(data_format="nhwc"), ValueError, "data_format"),
    (dict(activation=["relu"]), ValueError, "activation"),
    (dict(activation="gelu"), ValueError, "activation"),
    (dict(dtype="float8"), TypeError, "dtype"),
    (dict(dtype=None), TypeError, "dtype"),
    (dict(dtype=np.dtype(">f4")), TypeError, "dtype"),
    (dict(dtype=np.int32), TypeError, "dtype"),
])
def test_constructor_checks_every_argument(kwargs, exc, word):
    with pytest.raises(exc, match=word):
        cfbn.BatchNorm(4, **kwargs)


def test_settings_are_checked_when_set():
    bn = cfbn.BatchNorm(4, epsilon=1e-5, momentum=0.9)
    assert type(bn.epsilon) is float and bn.epsilon == 1e-5 and bn.momentum == 0.9
    for name, value, exc in [("epsilon", -1.0, ValueError), ("momentum", 2.0, ValueError),
                             ("momentum", "0.5", TypeError), ("activation", "gelu", ValueError),
                             ("training", "yes", TypeError)]:
        with pytest.raises(exc, match=name):
            setattr(bn, name, value)
    assert bn.epsilon == 1e-5 and bn.momentum == 0.9 and bn.activation is None and bn.training
    # the settings that fix the parameters' shape and dtype cannot change
    for name, value in [("num_features", 8), ("data_format", "NCHW"), ("dtype", np.float64)]:
        with pytest.raises(AttributeError):
            setattr(bn, name, value)
    bn.momentum = 0.5
    bn.epsilon = 0.0
    bn.activation = "relu"
    x = _batches((2, 3, 3, 4), 1, seed=7)[0]
    y = bn(x).copy()
    f = cfbn.fused_batch_norm(x, bn.scale, bn.offset, np.zeros(4, np.float32),
                              np.ones(4, np.float32), epsilon=0.0, exponential_avg_factor=0.5,
                              activation="relu")
    np.testing.assert_array_equal(y, f.y)
    np.testing.assert_array_equal(bn.moving_mean, f.batch_mean)


def test_convention_helpers_check_their_arguments():
    with pytest.raises(TypeError, match="momentum"):
        L.exponential_avg_factor("0.9")
    with pytest.raises(ValueError, match="momentum"):
        L.exponential_avg_factor(float("nan"))
    with pytest.raises(TypeError, match="count"):
        L.convert_moving_variance([1.0], 3.7, "pytorch", "keras")
    with pytest.raises(ValueError, match="convention"):
        L.exponential_avg_factor(0.9, ["pytorch"])


# --- inputs of forward and backward -------------------------------------------------------

def test_input_of_another_dtype_names_x_and_the_dtype():
    bn = cfbn.BatchNorm(4)
    x = np.zeros((2, 3, 3, 4))
    with pytest.raises(TypeError, match=r"^x: .*float32.*float64"):
        bn(x)
    with pytest.raises(TypeError, match=r"^x: .*float16"):
        cfbn.BatchNorm(4, dtype=np.float16).forward(x.astype(np.float32))
    with pytest.raises(TypeError, match=r"^x: .*bfloat16.*float16"):
        cfbn.BatchNorm(4, dtype=BFLOAT16).forward(x.astype(np.float16))
    bn(x.astype(np.float32))
    with pytest.raises(TypeError, match=r"^dy: .*float32.*float64"):
        bn.backward(x)
    with pytest.raises(TypeError, match=r"^x: expected an array"):
        bn("abc")


def test_input_of_another_shape_names_x():
    bn = cfbn.BatchNorm(4)
    with pytest.raises(ValueError, match=r"^x: .*4-D"):
        bn(np.zeros((3, 4), np.float32))
    with pytest.raises(ValueError, match=r"^x: .*4 channels"):
        bn(np.zeros((2, 3, 3, 5), np.float32))
    with pytest.raises(ValueError, match=r"^x: .*4 channels"):
        cfbn.BatchNorm(4, data_format="NCHW")(np.zeros((2, 3, 3, 4), np.float32))
    bn(np.zeros((2, 3, 3, 4), np.float32))
    with pytest.raises(ValueError, match=r"^dy: .*\(2, 3, 3, 4\)"):
        bn.backward(np.zeros((2, 3, 4, 4), np.float32))


@pytest.mark.parametrize("value", [1, 0, "yes", None, 1.0])
def test_mode_flags_are_bools(value):
    bn = cfbn.BatchNorm(4)
    x = np.zeros((2, 3, 3, 4), np.float32)
    with pytest.raises(TypeError, match="mode"):
        bn.train(value)
    if value is not None:      # None is forward's "the layer's mode"
        with pytest.raises(TypeError, match="training"):
            bn.forward(x, training=value)
    assert bn.training is True
    bn.train(np.bool_(False))
    assert bn.training is False
    bn.forward(x, training=np.bool_(True))
    assert bn.moving_variance[0] != 1.0    # a training call updated the running variance


def test_backward_before_forward():
    with pytest.raises(RuntimeError, match="forward"):
        cfbn.BatchNorm(4).backward(np.zeros((1, 1, 1, 4), np.float32))


# --- an inference call between a training forward and its backward ------------------------

def _reference_step(bn, x, dy, side=None):
    """The functional forward and gradient of a training step of `bn` (a fresh copy)."""
    f = cfbn.fused_batch_norm(x, bn.scale, bn.offset, epsilon=bn.epsilon,
                              data_format=bn.data_format, activation=bn.activation,
                              side_input=side)
    g = cfbn.fused_batch_norm_grad(dy, x, bn.scale, f.reserve_space_1, f.reserve_space_2,
                                   epsilon=bn.epsilon, data_format=bn.data_format,
                                   offset=bn.offset, activation=bn.activation, side_input=side)
    return f, g


@pytest.mark.parametrize("side", [False, True])
@pytest.mark.parametrize("how", ["training=False", "eval()"])
def test_inference_call_between_forward_and_backward(side, how):
    rng = np.random.default_rng(8)
    shape = (4, 3, 3, 6)
    x = rng.standard_normal(shape).astype(np.float32) * 2 + 1
    dy = rng.standard_normal(shape).astype(np.float32)
    s = rng.standard_normal(shape).astype(np.float32) if side else None
    bn = cfbn.BatchNorm(6, activation="relu")
    bn.scale[:] = rng.uniform(0.5, 2, 6)
    bn.offset[:] = rng.standard_normal(6)
    f, g = _reference_step(bn, x, dy, s)
    y = bn.forward(x, side_input=s)
    y_copy = y.copy()
    # validation batches, of the same shape and of another, in the middle of the step
    for v in (rng.standard_normal(shape), rng.standard_normal((2, 3, 3, 6))):
        v = v.astype(np.float32)
        if how == "eval()":
            bn.eval()
            yv = bn(v)
            bn.train()
        else:
            yv = bn.forward(v, training=False)
        assert yv is not y
        np.testing.assert_array_equal(yv, cfbn.fused_batch_norm(
            v, bn.scale, bn.offset, bn.moving_mean, bn.moving_variance, epsilon=bn.epsilon,
            is_training=False, activation="relu").y)
    np.testing.assert_array_equal(y, y_copy)      # the training y is the caller's still
    dx = bn.backward(dy)
    np.testing.assert_array_equal(dx, g.x_backprop)
    np.testing.assert_array_equal(bn.scale_grad, g.scale_backprop)
    np.testing.assert_array_equal(bn.offset_grad, g.offset_backprop)
    if side:
        np.testing.assert_array_equal(bn.side_input_grad, g.side_input_backprop)
    # the step is done: the next inference call is what backward differentiates (frozen
    # statistics, as when fine-tuning with the layer in eval mode)
    bn.eval()
    v = rng.standard_normal((2, 3, 3, 6)).astype(np.float32)
    bn(v)
    dv = rng.standard_normal(v.shape).astype(np.float32)
    gi = cfbn.fused_batch_norm_grad(dv, v, bn.scale, bn.moving_mean, bn.moving_variance,
                                    epsilon=bn.epsilon, is_training=False, offset=bn.offset,
                                    activation="relu")
    np.testing.assert_array_equal(bn.backward(dv), gi.x_backprop)


def test_validation_pass_through_a_stack_of_layers():
    # bn2's pending x is bn1's training y: a validation pass through bn1 must not write it
    rng = np.random.default_rng(11)
    shape = (4, 3, 3, 5)
    x = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    bn1, bn2 = cfbn.BatchNorm(5), cfbn.BatchNorm(5, activation="relu")
    bn2.offset[:] = 0.3
    f1, _ = _reference_step(bn1, x, dy)
    f2, g2 = _reference_step(bn2, f1.y, dy)
    g1 = cfbn.fused_batch_norm_grad(g2.x_backprop, x, bn1.scale, f1.reserve_space_1,
                                    f1.reserve_space_2, epsilon=bn1.epsilon)
    bn2(bn1(x))
    v = rng.standard_normal(shape).astype(np.float32)
    bn2(bn1(v, training=False), training=False)
    np.testing.assert_array_equal(bn1.backward(bn2.backward(dy)), g1.x_backprop)
    np.testing.assert_array_equal(bn2.scale_grad, g2.scale_backprop)


def test_a_pending_backward_needs_the_training_shape():
    bn = cfbn.BatchNorm(4)
    bn(np.ones((2, 3, 3, 4), np.float32))
    bn(np.ones((5, 3, 3, 4), np.float32), training=False)
    # dy of the validation batch is not taken for the pending training step's
    with pytest.raises(ValueError, match=r"^dy: .*\(2, 3, 3, 4\)"):
        bn.backward(np.ones((5, 3, 3, 4), np.float32))


# --- the per-shape buffers ------------------------------------------------------------------

def test_buffers_kept_for_a_few_shapes_only():
    bn = cfbn.BatchNorm(3, data_format="NC")
    refs = []
    for n in range(2, 202):
        x = np.ones((n, 3), np.float32)
        y = bn(x)
        bn.backward(x)
        refs.append((weakref.ref(y), weakref.ref(bn.backward(x))))
        del y
    gc.collect()
    alive = sum(r() is not None for pair in refs for r in pair)
    assert 0 < alive <= 2 * 4, alive
    assert refs[-1][0]() is not None          # the most recent shape keeps its buffers


def test_buffers_are_reused_per_shape_and_mode():
    bn = cfbn.BatchNorm(3, data_format="NC")
    a, b = np.ones((4, 3), np.float32), np.ones((5, 3), np.float32)
    ya, dxa = bn(a), bn.backward(a)
    assert bn(b) is not ya
    assert bn(a) is ya and bn.backward(a) is dxa
    ye = bn(a, training=False)
    assert ye is not ya and bn(a, training=False) is ye


def test_evicted_buffers_are_left_to_their_holders():
    rng = np.random.default_rng(9)
    bn = cfbn.BatchNorm(3, data_format="NC", buffer_shapes=2)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    y = bn(x)
    kept = y.copy()
    bn.backward(x)
    for n in (5, 6, 7):           # push (4, 3) out of the cache
        bn(np.ones((n, 3), np.float32))
    y2 = bn(x * 3)
    assert y2 is not y
    np.testing.assert_array_equal(y, kept)


def test_pending_backward_survives_eviction():
    rng = np.random.default_rng(10)
    bn = cfbn.BatchNorm(3, data_format="NC", buffer_shapes=1)
    x = rng.standard_normal((6, 3)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    _, g = _reference_step(bn, x, dy)
    bn(x * 2)
    dx_before = bn.backward(dy)                   # a dx buffer of this shape, still held
    kept = dx_before.copy()
    bn(x)
    for n in (5, 7, 9):
        bn(rng.standard_normal((n, 3)).astype(np.float32), training=False)
    dx = bn.backward(dy)
    np.testing.assert_array_equal(dx, g.x_backprop)
    assert dx is not dx_before                    # (6, 3)'s dropped dx is the caller's
    np.testing.assert_array_equal(dx_before, kept)


def test_buffer_shapes_zero_returns_new_arrays():
    bn = cfbn.BatchNorm(3, data_format="NC", buffer_shapes=0)
    x = np.ones((4, 3), np.float32)
    y1, y2 = bn(x), bn(x)
    assert y1 is not y2
    dx1 = bn.backward(x)
    assert bn.backward(x) is not dx1
    for value, exc in [(-1, ValueError), (2.0, TypeError), (True, TypeError)]:
        with pytest.raises(exc, match="buffer_shapes"):
            cfbn.BatchNorm(3, buffer_shapes=value)


def test_release_buffers():
    bn = cfbn.BatchNorm(3, data_format="NC")
    y = bn(np.ones((5, 3), np.float32))
    y_copy = y.copy()
    x = np.ones((4, 3), np.float32)
    s = np.ones((4, 3), np.float32)
    refs = [weakref.ref(bn(x, side_input=s)), weakref.ref(bn.backward(x)),
            weakref.ref(bn.side_input_grad), weakref.ref(x), weakref.ref(s)]
    bn.release_buffers()
    del x, s
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)
    assert bn.side_input_grad is None
    np.testing.assert_array_equal(y, y_copy)
    with pytest.raises(RuntimeError, match="forward"):
        bn.backward(np.ones((4, 3), np.float32))
    y2 = bn(np.ones((5, 3), np.float32))          # the layer works on
    assert y2 is not y
    bn.backward(y2.copy())


@pytest.mark.parametrize("name", ["epsilon", "momentum"])
def test_constructor_numbers_beyond_the_float_range(name):
    with pytest.raises(ValueError, match=name):
        cfbn.BatchNorm(4, **{name: 10 ** 400})


def test_inference_on_an_empty_batch_keeps_the_running_statistics():
    """An empty inference batch's statistics are NaN (as TensorFlow's); they
    must not reach the layer's running statistics."""
    bn = cfbn.BatchNorm(3)
    bn.forward(np.random.default_rng(0).standard_normal((4, 2, 2, 3)).astype(np.float32))
    mean, var = bn.moving_mean.copy(), bn.moving_variance.copy()
    y = bn.forward(np.zeros((0, 2, 2, 3), np.float32), training=False)
    assert y.shape == (0, 2, 2, 3)
    np.testing.assert_array_equal(bn.moving_mean, mean)
    np.testing.assert_array_equal(bn.moving_variance, var)
    x = np.ones((2, 2, 2, 3), np.float32)
    want = cfbn.fused_batch_norm(x, bn.scale, bn.offset, mean, var, epsilon=bn.epsilon,
                                 is_training=False).y
    np.testing.assert_array_equal(bn.forward(x, training=False), want)
