"""cfbn.torch's C++ operator (cfbn/torch/_native.cpp) against the Python bridge.

The eager calls of cfbn.torch, and the implementations of the torch.ops.cfbn
forward and gradient operators, run the C++ kernels' entry where it takes
the call and the Python bridge otherwise; both must give the same bits, the same
memory formats and the same errors.  Each comparison runs a call twice on
the same data, once with the operator and once with it set aside (as
CFBN_TORCH_NATIVE=0 does), and counts the operator's kernel calls to show
which path ran.
"""
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import cfbn  # noqa: E402
import cfbn.torch as ct  # noqa: E402
from cfbn import _kernels  # noqa: E402
from cfbn.torch import _native  # noqa: E402

ROOT = str(Path(cfbn.__file__).resolve().parent.parent)
DISABLED = os.environ.get("CFBN_TORCH_NATIVE", "1") == "0"
pytestmark = pytest.mark.skipif(DISABLED, reason="CFBN_TORCH_NATIVE=0 sets the operator aside")


@pytest.fixture(scope="module")
def native():
    m = _native.get()
    assert m is not None, "the C++ operator was not built (a RuntimeWarning says why)"
    return m


def _run(native, use, fn):
    """fn() with the operator (use=True) or the bridge; (result, forward
    and backward kernel calls the operator made meanwhile)."""
    before = native.calls()
    _native._module = native if use else None
    try:
        out = fn()
    finally:
        _native._module = native
    after = native.calls()
    return out, (after[0] - before[0], after[1] - before[1])


def _inputs(shape, dtype, memory, side, affine, running, seed):
    """x (in `memory`), weight, bias, running mean and variance, side input
    (each None where not asked for) and an upstream gradient."""
    g = torch.Generator().manual_seed(seed)
    vd = torch.float64 if dtype is torch.float64 else torch.float32
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 3 + 5).to(dtype)
    if memory == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last if x.dim() == 4
                         else torch.channels_last_3d)
    elif memory == "transposed":
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    elif memory == "strided":
        x = torch.cat([x, x], 2)[:, :, ::2]
    x.requires_grad_()
    c = shape[1]
    w = (torch.rand(c, generator=g) + 0.5).to(vd).requires_grad_() if affine else None
    b = torch.randn(c, generator=g).to(vd).requires_grad_() if affine else None
    rm = torch.randn(c, generator=g).to(vd) if running else None
    rv = (torch.rand(c, generator=g) + 0.5).to(vd) if running else None
    s = (torch.randn(shape, generator=g).to(dtype).requires_grad_() if side else None)
    dy = torch.randn(shape, generator=g).to(dtype)
    return x, w, b, rm, rv, s, dy


def _case(shape, dtype, memory, activation, side, training, affine, running, seed=1):
    """A forward and backward of ct.batch_norm: the outputs, gradients and
    running statistics it gives."""
    def fn():
        x, w, b, rm, rv, s, dy = _inputs(shape, dtype, memory, side, affine, running, seed)
        y = ct.batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5, activation=activation,
                          side_input=s)
        y.backward(dy)
        got = {"y": y, "x.grad": x.grad}
        if affine:
            got.update({"weight.grad": w.grad, "bias.grad": b.grad})
        if side:
            got["side.grad"] = s.grad
        if running:
            got.update({"running_mean": rm, "running_var": rv})
        return got
    return fn


def _same(a, b, what):
    assert a.keys() == b.keys()
    for k in a:
        p, q = a[k], b[k]
        assert p.dtype == q.dtype and p.shape == q.shape, (what, k)
        assert p.stride() == q.stride(), (what, k, p.stride(), q.stride())
        assert torch.equal(p, q), (what, k, (p.double() - q.double()).abs().max())


# (shape, memory format): every layout the operator maps, each rank
LAYOUTS = [((6, 5), None), ((3, 4, 6), None), ((3, 4, 6), "transposed"), ((4, 3, 5, 7), None),
           ((4, 3, 5, 7), "channels_last"), ((2, 3, 2, 3, 4), None),
           ((2, 3, 2, 3, 4), "channels_last")]
CASES = [(shape, memory, dtype, activation) for (shape, memory), dtype, activation in
         itertools.product(LAYOUTS, [torch.float32, torch.float64, torch.float16, torch.bfloat16],
                           [None, "relu", "silu"])]


def _compare(native, fn, what):
    """fn() by the operator and by the bridge: the same bits, and one
    forward and one backward by the operator."""
    ours, calls = _run(native, True, fn)
    theirs, none = _run(native, False, fn)
    assert calls == (1, 1) and none == (0, 0), what
    _same(ours, theirs, what)


@pytest.mark.parametrize("shape, memory, dtype, activation", CASES)
def test_operator_gives_the_bridges_bits(native, shape, memory, dtype, activation):
    for side, training, affine, running in itertools.product([False, True], [True, False],
                                                             [True, False], [True, False]):
        if not training and not running:
            continue  # inference needs running statistics
        fn = _case(shape, dtype, memory, activation, side, training, affine, running)
        _compare(native, fn, (side, training, affine, running))


def _op_case(shape, memory, dtype, training, running):
    """torch.ops.cfbn.batch_norm and its registered gradient (what compiled
    graphs run): every output and gradient."""
    def fn():
        x, w, b, rm, rv, s, dy = _inputs(shape, dtype, memory, True, True, running, 2)
        y, sm, sv, nm, nv = torch.ops.cfbn.batch_norm(x, w, b, rm, rv, None, training, 0.1,
                                                      1e-5, "relu", None, s)
        y.backward(dy)
        return {"y": y, "save_mean": sm, "save_var": sv, "new_mean": nm, "new_var": nv,
                "x.grad": x.grad, "weight.grad": w.grad, "bias.grad": b.grad, "side.grad": s.grad}
    return fn


@pytest.mark.parametrize("shape, memory", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_operators_give_the_bridges_bits(native, shape, memory, dtype):
    for training, running in [(True, True), (True, False), (False, True)]:
        _compare(native, _op_case(shape, memory, dtype, training, running), (training, running))


def test_large_outputs_come_from_the_output_cache(native):
    # 2 MiB per output: above the cache's threshold, so the operator's outputs
    # are cfbn's cached buffers; freed, they serve the next call's.
    fn = _case((8, 64, 32, 32), torch.float32, "channels_last", "relu", True, True, True, True)
    _compare(native, fn, "large")
    hits = _kernels.output_cache_stats()["hits"]
    for _ in range(3):
        _, calls = _run(native, True, fn)
        assert calls == (1, 1)
    # y, dx and the side input's gradient each call
    assert _kernels.output_cache_stats()["hits"] >= hits + 9


def test_non_dense_input_is_read_through_one_copy(native):
    fn = _case((4, 3, 6, 5), torch.float32, "strided", "relu", True, True, True, True)
    _compare(native, fn, "strided")


def test_calls_it_does_not_take_go_to_the_bridge(native):
    x = torch.randn(4, 3, 5, 5)
    half = ct.BatchNorm2d(3).to(torch.bfloat16)  # bfloat16 parameters: converted by the bridge
    strided_weight = torch.rand(6)[::2]
    cases = {
        "bfloat16 parameters": lambda: half(x.to(torch.bfloat16)),
        "empty batch": lambda: ct.BatchNorm2d(3)(torch.randn(0, 3, 5, 5)),
        "strided weight": lambda: ct.batch_norm(x, None, None, strided_weight, None, True),
        "strided running statistics": lambda: ct.batch_norm(
            x, torch.zeros(6)[::2], torch.ones(6)[::2], training=True),
    }
    for what, call in cases.items():
        ours, calls = _run(native, True, call)
        theirs, _ = _run(native, False, call)
        assert calls == (0, 0), what
        assert torch.equal(ours, theirs), what


def _error(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 (the type and message are compared)
        return type(e), str(e)
    return None


def test_bad_arguments_raise_what_the_bridge_raises(native):
    x = torch.randn(2, 3, 4, 4)
    rm, both, w = torch.zeros(3), torch.zeros(6), torch.rand(3) + 0.5
    x_before, w_before = x.clone(), w.clone()
    bad = {
        "channels": lambda: ct.BatchNorm2d(4)(x),
        "weight dtype": lambda: ct.batch_norm(x, None, None, torch.ones(3, dtype=torch.float64),
                                              None, True),
        "weight not a tensor": lambda: ct.batch_norm(x, None, None, [1.0, 1.0, 1.0], None, True),
        "negative eps": lambda: ct.batch_norm(x, None, None, training=True, eps=-1.0),
        "nan eps": lambda: ct.batch_norm(x, None, None, training=True, eps=float("nan")),
        "momentum above 1": lambda: ct.batch_norm(x, torch.zeros(3), torch.ones(3),
                                                  training=True, momentum=1.5),
        "side dtype": lambda: ct.batch_norm(x, None, None, training=True,
                                            side_input=x.double()),
        "side shape": lambda: ct.batch_norm(x, None, None, training=True,
                                            side_input=torch.randn(2, 3, 4, 5)),
        "running statistics' dtype": lambda: ct.batch_norm(
            x, torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64),
            training=True),
        "running statistics in one tensor": lambda: ct.batch_norm(x, rm, rm, training=True),
        "running statistics overlapping": lambda: ct.batch_norm(x, both[:3], both[2:5],
                                                                training=True),
        "running mean in the weight": lambda: ct.batch_norm(x, w, torch.ones(3), w,
                                                            training=True),
        "running statistics inside x": lambda: ct.batch_norm(
            x, x.view(-1)[:3], x.view(-1)[3:6], training=True),
        "one running statistic": lambda: ct.batch_norm(x, torch.zeros(3), None, training=True),
        "inference without statistics": lambda: ct.batch_norm(x, None, None, training=False),
        "int input": lambda: ct.BatchNorm2d(3)(torch.ones(2, 3, 4, 4, dtype=torch.int32)),
    }
    for what, call in bad.items():
        ours, calls = _run(native, True, lambda: _error(call))
        theirs, _ = _run(native, False, lambda: _error(call))
        assert ours is not None, what
        assert ours == theirs, what
        assert calls == (0, 0), what
    # the refused calls wrote nothing
    assert torch.equal(x, x_before) and torch.equal(w, w_before)
    assert not rm.any() and not both.any()


def test_its_output_may_be_modified_in_place(native):
    x = torch.randn(4, 3, 5, 5, requires_grad=True)
    m = ct.BatchNorm2d(3)
    _, calls = _run(native, True, lambda: torch.relu_(m(x)).sum().backward())
    assert calls == (1, 1)
    ref = torch.nn.BatchNorm2d(3)
    xr = x.detach().clone().requires_grad_()
    torch.relu_(ref(xr)).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-5, atol=1e-5)


def test_second_order_through_the_operator_matches_the_bridge(native):
    # create_graph=True: the operator's backward hands over to the bridge's
    # differentiable one, so the second order is the bridge's.
    def fn():
        g = torch.Generator().manual_seed(5)
        x = torch.randn(4, 3, 5, 5, generator=g, dtype=torch.float64).requires_grad_()
        w = (torch.rand(3, generator=g, dtype=torch.float64) + 0.5).requires_grad_()
        b = torch.randn(3, generator=g, dtype=torch.float64).requires_grad_()
        s = torch.randn(4, 3, 5, 5, generator=g, dtype=torch.float64).requires_grad_()
        y = ct.batch_norm(x, None, None, w, b, True, activation="silu", side_input=s)
        gx, gw = torch.autograd.grad((y * y).sum(), (x, w), create_graph=True)
        return torch.autograd.grad((gx * gx).sum() + gw.sum(), (x, w, b, s))
    ours, calls = _run(native, True, fn)
    theirs, _ = _run(native, False, fn)
    assert calls[0] == 1
    for p, q in zip(ours, theirs):
        assert torch.equal(p, q)


def test_follows_the_selected_isa(native):
    if "scalar" not in _kernels.supported_isas():
        pytest.skip("no scalar table in this build")
    selected = _kernels.selected_isa()
    fn = _case((4, 5, 7, 3), torch.float32, "channels_last", "silu", True, True, True, True)
    try:
        _kernels.select_isa("scalar")
        ours, calls = _run(native, True, fn)
        theirs, _ = _run(native, False, fn)
    finally:
        _kernels.select_isa(selected)
    assert calls == (1, 1)
    _same(ours, theirs, "scalar")


def test_a_failed_build_warns_and_leaves_the_bridge(monkeypatch, native):
    def fail():
        raise OSError("no compiler here")
    monkeypatch.setattr(_native, "_build", fail)
    monkeypatch.setattr(_native, "_tried", False)
    monkeypatch.setattr(_native, "_module", None)
    with pytest.warns(RuntimeWarning, match=r"could not be built \(OSError: no compiler here\)"):
        assert _native.get() is None
    x = torch.randn(4, 3, 5, 5)
    assert torch.equal(ct.batch_norm(x, None, None, training=True),
                       _run(native, False, lambda: ct.batch_norm(x, None, None, training=True))[0])


def test_disabled_by_the_environment():
    env = dict(os.environ, CFBN_TORCH_NATIVE="0",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = ("import torch, cfbn.torch as ct\n"
            "from cfbn.torch import _native\n"
            "y = ct.BatchNorm2d(3)(torch.randn(4, 3, 5, 5))\n"
            "print(_native.get(), _native._tried)\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "None True"
    assert "compiling" not in r.stderr
