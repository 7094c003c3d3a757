"""cfbn.torch against torch.nn: the modules as drop-ins, the operators, autograd.

Every comparison runs the torch.nn module and cfbn's on the same data, step
by step, in training and inference, for each layout PyTorch's batch norm
takes (contiguous, channels_last, a transposed (N, L, C)).
"""
import copy

import pytest

torch = pytest.importorskip("torch")

import cfbn.torch as ct  # noqa: E402
from cfbn.torch import _bridge, ops  # noqa: E402

# torch's own test utilities (opcheck) decorate with a deprecated torch.jit API
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")

nn = torch.nn
F = torch.nn.functional
OPS = torch.ops.cfbn


def _code(activation, alpha=None):
    """The operators' (activation code, alpha) for an activation's name."""
    return ct.ops.activation_code(activation, alpha)


NN = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}
CFBN = {1: ct.BatchNorm1d, 2: ct.BatchNorm2d, 3: ct.BatchNorm3d}

# name -> (module rank, input shape, memory layout)
LAYOUTS = {
    "1d-NC": (1, (6, 4), None),
    "1d-NCL": (1, (4, 3, 5), None),
    "1d-NLC": (1, (4, 3, 5), "transposed"),
    "2d": (2, (4, 3, 5, 6), None),
    "2d-channels_last": (2, (4, 3, 5, 6), torch.channels_last),
    "3d": (3, (2, 3, 4, 3, 5), None),
    "3d-channels_last": (3, (2, 3, 4, 3, 5), torch.channels_last_3d),
}

OPTIONS = {
    "default": {},
    "momentum-eps": dict(momentum=0.3, eps=1e-3),
    "cumulative": dict(momentum=None),
    "no-affine": dict(affine=False),
    "untracked": dict(track_running_stats=False),
}

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-10),
       torch.bfloat16: dict(rtol=2 ** -7, atol=2 ** -6),
       torch.float16: dict(rtol=2 ** -10, atol=2 ** -9)}


def _input(shape, layout, dtype=torch.float32, seed=0, shift=0.5):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 2 + shift).to(dtype)
    return _in_layout(x, layout)


def _in_layout(x, layout):
    if layout == "transposed":
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    if layout is not None:
        return x.contiguous(memory_format=layout)
    return x


def _same_layout(a, b):
    """Same shape and same order of strides (the memory format), ignoring size-1 axes."""
    assert a.shape == b.shape
    if a.numel() == 0:
        return True
    order = lambda t: sorted((s, i) for i, s in enumerate(t.stride()) if t.shape[i] > 1)  # noqa
    return [i for _, i in order(a)] == [i for _, i in order(b)]


def _pair(rank, channels, dtype=torch.float32, seed=1, **options):
    """An nn module with random parameters and the cfbn module loaded from it."""
    ref = NN[rank](channels, dtype=dtype, **options)
    if ref.weight is not None:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            ref.weight.copy_(torch.rand(channels, generator=g) + 0.5)
            ref.bias.copy_(torch.randn(channels, generator=g))
    ours = CFBN[rank](channels, dtype=dtype, **options)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _step(ref, ours, x, tol, seed=3, side=False):
    """One forward and backward of both modules on copies of x; compares
    outputs, their memory format and every gradient."""
    xr = x.detach().clone().requires_grad_()
    xo = x.detach().clone().requires_grad_()
    yr = ref(xr)
    yo = ours(xo)
    torch.testing.assert_close(yo, yr, **tol)
    assert _same_layout(yo, x)
    g = torch.Generator().manual_seed(seed)
    dy = _in_layout(torch.randn(x.shape, generator=g, dtype=torch.float64).to(x.dtype), None)
    yr.backward(dy)
    yo.backward(dy)
    torch.testing.assert_close(xo.grad, xr.grad, **tol)
    assert _same_layout(xo.grad, x)
    if ref.weight is not None:
        torch.testing.assert_close(ours.weight.grad, ref.weight.grad, **tol)
        torch.testing.assert_close(ours.bias.grad, ref.bias.grad, **tol)
        ref.zero_grad()
        ours.zero_grad()


def _same_state(ref, ours, tol):
    sr, so = ref.state_dict(), ours.state_dict()
    assert list(sr) == list(so)
    for k in sr:
        assert so[k].dtype == sr[k].dtype, k
        torch.testing.assert_close(so[k], sr[k], **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_matches_nn_in_training_then_inference(layout, option, dtype):
    rank, shape, mem = LAYOUTS[layout]
    ref, ours = _pair(rank, shape[1], dtype, **OPTIONS[option])
    tol = TOL[dtype]
    for step in range(3):
        _step(ref, ours, _input(shape, mem, dtype, seed=10 + step, shift=step), tol, seed=step)
        _same_state(ref, ours, tol)
    ref.eval()
    ours.eval()
    _step(ref, ours, _input(shape, mem, dtype, seed=20), tol)
    _same_state(ref, ours, tol)


@pytest.mark.parametrize("params", ["float32", "same"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["1d-NC", "1d-NLC", "2d", "2d-channels_last", "3d"])
def test_16_bit_inputs_match_nn(layout, dtype, params):
    # float32 parameters with 16-bit data (as under autocast), or a module
    # moved to the 16-bit dtype entirely: PyTorch's CPU kernels take both.
    rank, shape, mem = LAYOUTS[layout]
    ref, ours = _pair(rank, shape[1], torch.float32 if params == "float32" else dtype)
    tol = TOL[dtype]
    for step in range(2):
        _step(ref, ours, _input(shape, mem, dtype, seed=step), tol, seed=step)
    _same_state(ref, ours, tol)
    ref.eval()
    ours.eval()
    _step(ref, ours, _input(shape, mem, dtype, seed=5), tol)


def test_autocast_bfloat16_behaves_as_nn():
    # Under CPU autocast nn.BatchNorm2d runs in its input's dtype: a bfloat16
    # convolution output stays bfloat16, the statistics stay float32.
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    ours = copy.deepcopy(ref)
    ours[1] = ct.BatchNorm2d(4)
    ours[1].load_state_dict(ref[1].state_dict())
    x = torch.randn(2, 3, 6, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yr, yo = ref(x), ours(x)
        x32 = torch.randn(2, 4, 5, 5)
        yr32, yo32 = ref[1](x32), ours[1](x32)
    assert yo.dtype == yr.dtype == torch.bfloat16
    assert yo32.dtype == yr32.dtype == torch.float32
    torch.testing.assert_close(yo, yr, **TOL[torch.bfloat16])
    torch.testing.assert_close(yo32, yr32, **TOL[torch.float32])
    yr.float().sum().backward()
    yo.float().sum().backward()
    torch.testing.assert_close(ours[0].weight.grad, ref[0].weight.grad, rtol=2e-2, atol=2e-2)
    _same_state(ref[1], ours[1], TOL[torch.float32])
    assert ours[1].running_mean.dtype == torch.float32


ACTIVATIONS = {
    "relu": (F.relu, {}),
    "relu6": (F.relu6, {}),
    "leaky_relu": (lambda y: F.leaky_relu(y, 0.2), dict(alpha=0.2)),
    "elu": (lambda y: F.elu(y, 0.7), dict(alpha=0.7)),
    "sigmoid": (torch.sigmoid, {}),
    "tanh": (torch.tanh, {}),
    "silu": (F.silu, {}),
}


@pytest.mark.parametrize("side", [False, True])
@pytest.mark.parametrize("mem", [None, torch.channels_last])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_fused_activation_and_side_input_match_nn_composition(activation, mem, side):
    act, kw = ACTIVATIONS[activation]
    shape = (4, 3, 5, 6)
    ref, ours = _pair(2, 3)
    ours = ct.BatchNorm2d(3, activation=activation, **kw)
    ours.load_state_dict(ref.state_dict())
    for training in (True, False):
        ref.train(training)
        ours.train(training)
        x = _input(shape, mem, seed=1)
        s = _input(shape, mem, seed=2, shift=-0.5)
        xr, sr = x.clone().requires_grad_(), s.clone().requires_grad_()
        xo, so = x.clone().requires_grad_(), s.clone().requires_grad_()
        yr = act(ref(xr) + sr) if side else act(ref(xr))
        yo = ours(xo, side_input=so) if side else ours(xo)
        torch.testing.assert_close(yo, yr, rtol=1e-5, atol=1e-5)
        assert _same_layout(yo, x)
        dy = torch.randn(shape, generator=torch.Generator().manual_seed(4))
        yr.backward(dy)
        yo.backward(dy)
        torch.testing.assert_close(xo.grad, xr.grad, rtol=1e-4, atol=1e-5)
        if side:
            torch.testing.assert_close(so.grad, sr.grad, rtol=1e-5, atol=1e-5)
            assert _same_layout(so.grad, x)
        torch.testing.assert_close(ours.weight.grad, ref.weight.grad, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(ours.bias.grad, ref.bias.grad, rtol=1e-4, atol=1e-4)
        ref.zero_grad()
        ours.zero_grad()
    _same_state(ref, ours, TOL[torch.float32])


def test_side_input_in_another_layout_is_read_in_the_inputs():
    x = _input((4, 3, 5, 6), torch.channels_last)
    s = _input((4, 3, 5, 6), None, seed=2)
    m = ct.BatchNorm2d(3, activation="relu")
    m.eval()
    torch.testing.assert_close(m(x, side_input=s),
                               m(x, side_input=_in_layout(s, torch.channels_last)))


def test_double_backward_matches_nn():
    # A gradient penalty: d/d(x, weight, bias) of |d(sum(w * y))/dx|^2.
    shape = (4, 3, 5, 6)
    for training in (True, False):
        for mem in (None, torch.channels_last):
            ref, ours = _pair(2, 3, torch.float64)
            ref.train(training)
            ours.train(training)
            w = _input(shape, None, torch.float64, seed=7)
            grads = []
            for m in (ref, ours):
                x = _input(shape, mem, torch.float64, seed=8).requires_grad_()
                (gx,) = torch.autograd.grad((m(x) * w).sum(), x, create_graph=True)
                gx.square().sum().backward()
                grads.append((x.grad, m.weight.grad, m.bias.grad))
            for a, b in zip(*grads):
                if a is None:
                    assert b is None or not b.abs().max() > 1e-12
                else:
                    torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-9)


def _gradcheck_cases():
    g = torch.Generator().manual_seed(0)

    def t(*shape):
        return torch.randn(shape, generator=g, dtype=torch.float64)
    return g, t


@pytest.mark.parametrize("path", ["eager", "op"])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("case", ["NCHW", "channels_last", "NC", "no-affine", "side_input"])
def test_gradcheck_and_gradgradcheck(case, training, path):
    _, t = _gradcheck_cases()
    shape = {"NC": (5, 3)}.get(case, (3, 2, 3, 2))
    mem = torch.channels_last if case == "channels_last" else None
    x = _in_layout(t(*shape), mem).requires_grad_()
    c = shape[1]
    w = (t(c).abs() + 0.5).requires_grad_()
    b = t(c).requires_grad_()
    s = t(*shape).requires_grad_()
    rm, rv = t(c), t(c).abs() + 0.5

    def f(x, w, b, s):
        if case == "no-affine":
            w = b = None
        side = s if case == "side_input" else None
        if path == "op":
            return OPS.batch_norm(x, w, b, rm.clone(), rv.clone(), None, training, 0.1, 1e-5,
                                  0, 0.0, side)[0]
        return ct.batch_norm(x, rm.clone(), rv.clone(), w, b, training, 0.1, 1e-5,
                             side_input=side)

    inputs = (x, w, b, s)
    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradgradcheck(f, inputs)


@pytest.mark.parametrize("path", ["eager", "op"])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_gradcheck_and_gradgradcheck_of_fused_activations(activation, training, path):
    _, t = _gradcheck_cases()
    x = t(3, 2, 3, 2).requires_grad_()
    w = (t(2).abs() + 0.5).requires_grad_()
    b = t(2).requires_grad_()
    s = t(3, 2, 3, 2).requires_grad_()
    rm, rv = t(2), t(2).abs() + 0.5
    alpha = ACTIVATIONS[activation][1].get("alpha")
    if activation in ("relu", "relu6"):
        # keep every pre-activation off the kinks, by more than gradcheck's step
        with torch.no_grad():
            z = ct.batch_norm(x, rm, rv, w, b, training, side_input=s)
            s += torch.where(z.abs() < 0.05, 0.1, 0.0) - torch.where((z - 6).abs() < 0.05, 0.1,
                                                                        0.0)

    def f(x, w, b, s):
        if path == "op":
            return OPS.batch_norm(x, w, b, rm.clone(), rv.clone(), None, training, 0.1, 1e-5,
                                  *_code(activation, alpha), s)[0]
        return ct.batch_norm(x, rm.clone(), rv.clone(), w, b, training, activation=activation,
                             alpha=alpha, side_input=s)

    assert torch.autograd.gradcheck(f, (x, w, b, s))
    assert torch.autograd.gradgradcheck(f, (x, w, b, s))


@pytest.mark.parametrize("activation", ["relu", "silu", "elu"])
def test_double_backward_of_fused_activation_matches_nn_composition(activation):
    act, kw = ACTIVATIONS[activation]
    shape = (4, 3, 5, 6)
    ref, _ = _pair(2, 3, torch.float64)
    ours = ct.BatchNorm2d(3, dtype=torch.float64, activation=activation, **kw)
    ours.load_state_dict(ref.state_dict())
    w = _input(shape, None, torch.float64, seed=7)
    grads = []
    for m in (ref, ours):
        x = _input(shape, torch.channels_last, torch.float64, seed=8).requires_grad_()
        s = _input(shape, None, torch.float64, seed=9).requires_grad_()
        y = act(m(x) + s) if m is ref else m(x, side_input=s)
        gx, gs = torch.autograd.grad((y * w).sum(), (x, s), create_graph=True)
        (gx.square().sum() + (gs * w).sum()).backward()
        # a gradient that is zero may come as None (relu' is piecewise constant)
        grads.append([torch.zeros_like(t) if g is None else g
                      for g, t in ((x.grad, x), (s.grad, s), (m.weight.grad, m.weight),
                                   (m.bias.grad, m.bias))])
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-9)


def _op_samples():
    g, t = _gradcheck_cases()
    samples = []
    for mem, training, side, act in [(None, True, False, None),
                                     (torch.channels_last, True, True, "relu"),
                                     (None, False, False, "silu"),
                                     (torch.channels_last, False, True, None),
                                     (None, True, True, "elu")]:
        x = _in_layout(t(3, 4, 2, 3), mem).requires_grad_()
        w = (t(4).abs() + 0.5).requires_grad_()
        b = t(4).requires_grad_()
        s = _in_layout(t(3, 4, 2, 3), mem).requires_grad_() if side else None
        samples.append((x, w, b, t(4), t(4).abs() + 0.5, training, act, s))
    return samples


@pytest.mark.parametrize("i", range(5))
def test_opcheck_batch_norm(i):
    x, w, b, rm, rv, training, act, s = _op_samples()[i]
    torch.library.opcheck(OPS.batch_norm, (x, w, b, rm, rv, None, training, 0.1, 1e-5,
                                           *_code(act), s))


def test_opcheck_batch_norm_cumulative_average_and_no_parameters():
    x = _input((5, 3), None, torch.float64)
    count = torch.tensor(4)
    rm, rv = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    torch.library.opcheck(OPS.batch_norm, (x, None, None, rm, rv, count, True, None, 1e-5, 0,
                                           0.0, None))
    new_mean = OPS.batch_norm(x, None, None, rm, rv, count, True, None, 1e-5, 0, 0.0, None)[3]
    torch.testing.assert_close(new_mean, 0.25 * x.mean(0))


@pytest.mark.parametrize("i", range(5))
def test_opcheck_batch_norm_backward(i):
    x, w, b, rm, rv, training, act, s = _op_samples()[i]
    y, sm, sv, _, _ = OPS.batch_norm(x, w, b, rm, rv, None, training, 0.1, 1e-5, *_code(act), s)
    dy = torch.randn_like(y).requires_grad_()
    torch.library.opcheck(OPS.batch_norm_backward, (dy, x, w, b, sm, sv, training, 1e-5,
                                                    *_code(act), s))


@pytest.mark.parametrize("i", [0, 3])
def test_opcheck_batch_norm_double_backward(i):
    x, w, b, rm, rv, training, _, _ = _op_samples()[i]
    x, w = x.detach(), w.detach()
    _, sm, sv, _, _ = OPS.batch_norm(x, w, b, rm, rv, None, training, 0.1, 1e-5, 0, 0.0, None)
    dy = torch.randn_like(x)
    for gg in [(torch.randn_like(x), torch.randn_like(w), torch.randn_like(w)),
               (torch.randn_like(x), None, None), (None, torch.randn_like(w), None)]:
        torch.library.opcheck(OPS.batch_norm_double_backward,
                              (dy, x, w, sm, sv) + gg + (training, 1e-5))


def test_operator_gives_the_eager_bits():
    # A compiled graph calls the operator and copies the new running
    # statistics; an eager call updates them in place: the same values.
    for mem in (None, torch.channels_last):
        x = _input((4, 3, 5, 6), mem)
        s = _input((4, 3, 5, 6), mem, seed=3)
        eager = ct.BatchNorm2d(3, activation="silu")
        rm, rv = eager.running_mean.clone(), eager.running_var.clone()
        y = eager(x, side_input=s)
        y_op, _, _, new_mean, new_var = OPS.batch_norm(x, eager.weight, eager.bias, rm, rv, None,
                                                       True, 0.1, 1e-5, *_code("silu"), s)
        assert torch.equal(y_op, y) and y_op.stride() == y.stride()
        assert torch.equal(new_mean, eager.running_mean)
        assert torch.equal(new_var, eager.running_var)
        assert torch.equal(rm, torch.zeros(3)) and torch.equal(rv, torch.ones(3))


class _Block(nn.Module):
    def __init__(self, bn2d, bn1d):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        fused = dict(activation="relu") if bn2d is ct.BatchNorm2d else {}
        self.bn1 = bn2d(4, **fused)
        self.bn2 = bn2d(4, momentum=None, **fused)
        self.fc = nn.Linear(4, 5)
        self.bn3 = bn1d(5)

    def forward(self, x):
        h = self.bn1(self.conv(x))
        if not isinstance(self.bn1, ct.BatchNorm2d):
            h = F.relu(h)
        if isinstance(self.bn2, ct.BatchNorm2d):
            h = self.bn2(h, side_input=h)
        else:
            h = F.relu(self.bn2(h) + h)
        return self.bn3(self.fc(h.mean((2, 3))))


def test_compiles_fullgraph_forward_and_backward():
    torch.manual_seed(0)
    model = _Block(ct.BatchNorm2d, ct.BatchNorm1d)
    twin = copy.deepcopy(model)
    compiled = torch.compile(twin, fullgraph=True)
    x = torch.randn(4, 3, 6, 6).to(memory_format=torch.channels_last)
    w = torch.randn(4, 5)
    for _ in range(2):
        ye, yc = model(x), compiled(x)
        torch.testing.assert_close(yc, ye)
        (ye * w).sum().backward()
        (yc * w).sum().backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-4, msg=name)
    for (name, b), c in zip(model.named_buffers(), twin.buffers()):
        torch.testing.assert_close(c, b, msg=name)
    # and the same as torch.nn's modules
    ref = _Block(nn.BatchNorm2d, nn.BatchNorm1d)
    ref.load_state_dict(model.state_dict())
    torch.testing.assert_close(ref(x), model(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("option", ["default", "no-affine", "untracked"])
def test_state_dict_loads_both_ways(rank, option):
    ref, _ = _pair(rank, 5, **OPTIONS[option])
    x = _input((4, 5, 3, 2, 2)[:rank + 2], None)
    ref(x)
    ours = CFBN[rank](5, **OPTIONS[option])
    assert ours.load_state_dict(ref.state_dict()) is not None
    _same_state(ref, ours, dict(rtol=0, atol=0))
    ours(x * 2)
    back = NN[rank](5, **OPTIONS[option])
    back.load_state_dict(ours.state_dict())
    _same_state(ours, back, dict(rtol=0, atol=0))
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert [n for n, _ in ours.named_buffers()] == [n for n, _ in ref.named_buffers()]


def test_modules_are_their_nn_namesakes():
    m = ct.BatchNorm2d(8, eps=1e-3, momentum=0.2, activation="leaky_relu", alpha=0.1)
    assert isinstance(m, nn.BatchNorm2d)
    assert repr(m) == repr(nn.BatchNorm2d(8, eps=1e-3, momentum=0.2))[:-1] + (
        ", activation='leaky_relu', alpha=0.1)")
    assert repr(ct.BatchNorm1d(3)) == repr(nn.BatchNorm1d(3))
    assert m.train(False) is m and not m.training


@pytest.mark.parametrize("rank,bad", [(1, (2, 3, 4, 5)), (1, (4,)), (2, (2, 3, 4)),
                                      (3, (2, 3, 4, 5))])
def test_input_dims_are_checked_as_nn(rank, bad):
    x = torch.randn(bad)
    with pytest.raises(ValueError) as expected:
        NN[rank](3)(x)
    with pytest.raises(ValueError) as got:
        CFBN[rank](3)(x)
    assert str(got.value) == str(expected.value)


def test_one_value_per_channel_in_training_is_an_error_as_nn():
    x = torch.randn(1, 3, 1, 1)
    with pytest.raises(ValueError) as expected:
        nn.BatchNorm2d(3)(x)
    with pytest.raises(ValueError) as got:
        ct.BatchNorm2d(3)(x)
    assert str(got.value) == str(expected.value)
    ct.BatchNorm2d(3).eval()(x)  # inference takes it


def test_errors():
    m = ct.BatchNorm2d(3)
    with pytest.raises(ValueError, match="channel|shape"):
        m(torch.randn(2, 4, 3, 3))
    with pytest.raises(TypeError, match="float32, float64, float16 or bfloat16"):
        m(torch.ones(2, 3, 3, 3, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="mixed dtype"):
        m(torch.randn(2, 3, 3, 3, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="mixed dtype"):
        ct.BatchNorm2d(3, dtype=torch.bfloat16)(torch.randn(2, 3, 3, 3))
    with pytest.raises(ValueError, match="activation"):
        ct.BatchNorm2d(3, activation="gelu")
    with pytest.raises(ValueError, match="alpha"):
        ct.BatchNorm2d(3, activation="relu", alpha=0.1)
    with pytest.raises(TypeError, match="side_input"):
        ct.BatchNorm2d(3)(torch.randn(2, 3, 3, 3), side_input=torch.randn(2, 3, 3, 3).double())
    with pytest.raises(ValueError, match="running_mean, running_var"):
        ct.batch_norm(torch.randn(2, 3), torch.zeros(3), None, training=True)


def test_empty_batch_as_nn():
    ref, ours = _pair(2, 3)
    x = torch.randn(0, 3, 4, 4)
    _step(ref, ours, x, TOL[torch.float32])
    _same_state(ref, ours, dict(rtol=0, atol=0))
    assert int(ours.num_batches_tracked) == 1


def test_non_dense_input_is_read_through_one_copy():
    ref, ours = _pair(2, 3)
    x = _input((4, 3, 10, 6), None)[:, :, ::2]
    _step(ref, ours, x, TOL[torch.float32])
    _same_state(ref, ours, TOL[torch.float32])


def test_no_grad_inference_mode_and_frozen_parameters():
    ref, ours = _pair(2, 3)
    x = _input((4, 3, 5, 6), torch.channels_last)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x))
    with torch.inference_mode():
        torch.testing.assert_close(ours(x), ref(x))
    for m in (ref, ours):
        m.weight.requires_grad_(False)
    xr, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref(xr).sum().backward()
    ours(xo).sum().backward()
    torch.testing.assert_close(xo.grad, xr.grad, rtol=1e-5, atol=1e-5)
    assert ours.weight.grad is None and ours.bias.grad is not None
    _same_state(ref, ours, TOL[torch.float32])


def test_outputs_own_their_memory():
    # The output is new memory, not a view of the input.
    x = _input((4, 3, 5, 6), None)
    y = ct.BatchNorm2d(3)(x)
    assert y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert _bridge.empty_like(x).stride() == y.stride()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_outputs_may_be_modified_in_place(layout, dtype):
    # nn.ReLU(inplace=True) after a batch norm, as ResNets write it: autograd
    # refuses an in-place change of a custom Function's output that is a
    # view, so no layout or dtype may hand out one.
    rank, shape, mem = LAYOUTS[layout]
    ref, ours = _pair(rank, shape[1], dtype=torch.float32)
    x = _input(shape, mem, dtype)
    grads = []
    for m in (ref, ours):
        xi = x.detach().clone().requires_grad_()
        y = m(xi)
        assert y._base is None
        (torch.relu_(y) * 2).sum().backward()
        grads.append((y.detach(), xi.grad, m.weight.grad))
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, **TOL[dtype])


@pytest.mark.parametrize("training", [True, False])
def test_export_records_the_operator(training):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), ct.BatchNorm2d(4, activation="relu"))
    model.train(training)
    twin = copy.deepcopy(model)
    x = torch.randn(2, 3, 6, 6)
    program = torch.export.export(twin, (x,))
    assert "torch.ops.cfbn.batch_norm.default" in program.graph_module.code
    torch.testing.assert_close(program.module()(x), model(x))


def test_errors_speak_pytorchs_words():
    x = torch.randn(2, 4, 3, 3)
    # nn takes any momentum: (1 - m) * old + m * batch
    ours, ref = ct.BatchNorm2d(4, momentum=1.5), nn.BatchNorm2d(4, momentum=1.5)
    torch.testing.assert_close(ours(x), ref(x))
    torch.testing.assert_close(ours.running_var, ref.running_var)
    with pytest.raises(ValueError, match=r"num_features: BatchNorm2d\(5\) expects 5 channels, "
                                         r"got input of shape \(2, 4, 3, 3\)"):
        ct.BatchNorm2d(5)(x)
    bn = ct.BatchNorm2d(4, activation="relu")
    with pytest.raises(ValueError, match=r"side_input: expected the input's shape "
                                         r"\(2, 4, 3, 3\), got \(2, 4, 9\)"):
        bn(x, side_input=torch.randn(2, 4, 9))
    with pytest.raises(ValueError, match=r"running_mean: expected 4 values, one per channel of "
                                         r"input of shape \(2, 4, 3, 3\), got shape \(5,\)"):
        ct.batch_norm(x, torch.zeros(5), torch.ones(5))
    with pytest.raises(ValueError, match="momentum: expected a finite value, got nan"):
        ct.batch_norm(x, torch.zeros(4), torch.ones(4), training=True, momentum=float("nan"))
    # nothing of num_features' length: nn computes any channel count, and so do these
    bare = dict(affine=False, track_running_stats=False)
    torch.testing.assert_close(ct.BatchNorm2d(5, **bare)(x), nn.BatchNorm2d(5, **bare)(x))


def test_one_list_of_activations():
    """cfbn.torch's one table of torch forms (in place, new tensor, the
    derivatives of the double backward) names exactly cfbn._args.ACTIVATIONS'
    activations; each form refuses a name outside it with the validator's
    message."""
    from cfbn import _args
    from cfbn.torch import _activation
    names = set(_args.ACTIVATIONS) - {None}
    assert set(_activation.FORMS) == names
    z = torch.tensor([-1.0, 0.5])
    with pytest.raises(ValueError) as want:
        _args.activation("gelu", None)
    for form in (_activation.activate, _activation.activate_, _activation.derivatives):
        with pytest.raises(ValueError) as got:
            form(z.clone(), "gelu", None)
        assert str(got.value) == str(want.value)


# ---- a meta tensor beside a CPU input ----
#
# A meta argument sends the whole call to the operators' fake kernels (the
# dispatcher's Meta key outranks CPU), which allocate like the input: real
# CPU tensors, never written.  Every entrance refuses it, with one message.

def _meta_message(name):
    return "%s: expected a tensor on the input's device cpu, got one on meta" % name


@pytest.mark.parametrize("name", ["weight", "bias", "running_mean", "running_var",
                                  "num_batches_tracked"])
def test_module_with_a_meta_buffer_refuses_the_call(name):
    m = ct.BatchNorm2d(3, momentum=None if name == "num_batches_tracked" else 0.1)
    t = getattr(m, name)
    meta = torch.empty_like(t, device="meta")
    if isinstance(t, nn.Parameter):
        meta = nn.Parameter(meta)
    setattr(m, name, meta)
    x = _input((4, 3, 5, 6), None)
    for training in (True, False):
        if name == "num_batches_tracked" and not training:
            continue
        m.train(training)
        with pytest.raises(ValueError, match=_meta_message(name)):
            m(x)


@pytest.mark.parametrize("name", ["weight", "bias", "running_mean", "running_var",
                                  "side_input"])
def test_functional_with_a_meta_tensor_refuses_the_call(name):
    x = _input((4, 3, 5, 6), None)
    args = dict(running_mean=torch.zeros(3), running_var=torch.ones(3), weight=torch.ones(3),
                bias=torch.zeros(3), side_input=torch.zeros_like(x))
    args[name] = torch.empty_like(args[name], device="meta")
    with pytest.raises(ValueError, match=_meta_message(name)):
        ct.batch_norm(x, args.pop("running_mean"), args.pop("running_var"), training=True,
                      **args)


def _operator_args(x):
    c = x.shape[1]
    fwd = dict(input=x, weight=torch.ones(c), bias=torch.zeros(c), running_mean=torch.zeros(c),
               running_var=torch.ones(c), num_batches_tracked=torch.tensor(1), training=True,
               momentum=None, eps=1e-5, activation=1, alpha=0.0,
               side_input=torch.zeros_like(x))
    bwd = dict(grad_out=torch.ones_like(x), input=x, weight=torch.ones(c), bias=torch.zeros(c),
               save_mean=torch.zeros(c), save_var=torch.ones(c), training=True, eps=1e-5,
               activation=1, alpha=0.0, side_input=torch.zeros_like(x))
    gg = dict(grad_out=torch.ones_like(x), input=x, weight=torch.ones(c),
              save_mean=torch.zeros(c), save_var=torch.ones(c),
              grad_grad_input=torch.ones_like(x), grad_grad_weight=torch.ones(c),
              grad_grad_bias=torch.ones(c), training=True, eps=1e-5)
    return {"batch_norm": fwd, "batch_norm_backward": bwd, "batch_norm_double_backward": gg}


@pytest.mark.parametrize("op, name", [(op, n) for op, kw in _operator_args(torch.ones(2, 3, 2, 2))
                                      .items() for n, v in kw.items()
                                      if isinstance(v, torch.Tensor) and n != "input"])
def test_operator_with_a_meta_tensor_refuses_the_call(op, name):
    x = _input((4, 3, 5, 6), None)
    kw = _operator_args(x)[op]
    kw[name] = torch.empty_like(kw[name], device="meta")
    with pytest.raises(ValueError, match=_meta_message(name)):
        getattr(OPS, op)(**kw)


def test_operators_on_meta_inputs_still_give_meta_outputs():
    x = torch.empty(4, 3, 5, 6, device="meta")
    for op, kw in _operator_args(x).items():
        kw = {k: (v.to("meta") if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        for out in getattr(OPS, op)(**kw):
            assert out.is_meta, op


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64, torch.float64])
@pytest.mark.parametrize("name", ["grad_grad_weight", "grad_grad_bias"])
def test_double_backward_refuses_parameter_gradients_of_another_dtype(name, dtype):
    x = _input((4, 3, 5, 6), None)
    kw = _operator_args(x)["batch_norm_double_backward"]
    kw[name] = torch.ones(3, dtype=dtype)
    with pytest.raises(RuntimeError, match=name):
        OPS.batch_norm_double_backward(**kw)


def test_a_negative_batch_count_is_refused():
    m = ct.BatchNorm2d(3, momentum=None)
    m.num_batches_tracked.fill_(-2)   # -1 once this batch is counted
    before = m.running_mean.clone()
    # the C++ operator's RuntimeError, or the Python operator's ValueError
    with pytest.raises((RuntimeError, ValueError),
                       match=r"num_batches_tracked: expected a count >= 0, got -1"):
        m(_input((4, 3, 5, 6), None))
    assert torch.equal(m.running_mean, before)


# ---- small calls on PyTorch's own path ----

def _ran_cfbn(module, *args):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        module(*args)
    return any(e.name == "cfbn::batch_norm" for e in prof.events())


@pytest.mark.torch_path
def test_the_path_follows_the_measured_crossover():
    from cfbn.torch import _paths
    assert ct.get_path() == "auto"
    m = ct.BatchNorm2d(16)
    for layout, channels_last in ((None, False), (torch.channels_last, True)):
        cross = _paths.CROSSOVER[(channels_last, torch.float32)]
        small = _input((2, 16, 4, 4), layout)
        side = cross // 16 // 16          # large: at least the crossover
        large = _input((16, 16, side, 1), layout) if layout is None else \
            _input((16, 16, side // 2 + 1, 2), layout)
        assert small.numel() < cross <= large.numel()
        assert not _ran_cfbn(m, small)
        assert _ran_cfbn(m, large)
    old = ct.set_path("cfbn")
    try:
        assert _ran_cfbn(m, _input((2, 16, 4, 4), None))
        ct.set_path("native")
        assert not _ran_cfbn(m, _input((64, 16, 32, 32), None))
    finally:
        ct.set_path(old)
    with pytest.raises(ValueError, match=r"path: expected one of 'auto', 'cfbn', 'native'"):
        ct.set_path("fast")


@pytest.mark.torch_path
@pytest.mark.parametrize("activation", [None, "relu", "relu6", ("leaky_relu", 0.2), ("elu", 0.7),
                                        ("leaky_relu", -0.2),
                                        "sigmoid", "tanh", "silu"], ids=str)
@pytest.mark.parametrize("options", ["default", "cumulative", "untracked", "no-affine"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_native_path_is_nn_with_the_activation(activation, options, dtype):
    """The native path is nn's batch norm, the add and the activation: the same
    outputs, gradients and running statistics as those modules in a row."""
    name, alpha = activation if isinstance(activation, tuple) else (activation, None)
    acts = {None: nn.Identity(), "relu": nn.ReLU(), "relu6": nn.ReLU6(),
            "leaky_relu": nn.LeakyReLU(alpha or 0.01), "elu": nn.ELU(alpha or 1.0),
            "sigmoid": nn.Sigmoid(), "tanh": nn.Tanh(), "silu": nn.SiLU()}
    pdt = torch.float32 if dtype is torch.bfloat16 else dtype
    ours = ct.BatchNorm2d(3, activation=name, alpha=alpha, dtype=pdt, **OPTIONS[options])
    ref = nn.BatchNorm2d(3, dtype=pdt, **OPTIONS[options])
    ref.load_state_dict(ours.state_dict())
    old = ct.set_path("native")
    try:
        for step, training in enumerate((True, True, False)):
            ours.train(training)
            ref.train(training)
            x = _input((4, 3, 5, 6), None, dtype, seed=step).requires_grad_()
            xr = x.detach().clone().requires_grad_()
            s = _input((4, 3, 5, 6), None, dtype, seed=10 + step)
            y = ours(x, s)
            yr = acts[name](ref(xr) + s)
            torch.testing.assert_close(y, yr, rtol=0, atol=0)
            g = _input((4, 3, 5, 6), None, dtype, seed=20 + step)
            y.backward(g)
            yr.backward(g)
            torch.testing.assert_close(x.grad, xr.grad, rtol=0, atol=0)
            for b in ("running_mean", "running_var", "num_batches_tracked"):
                if getattr(ref, b) is not None:
                    torch.testing.assert_close(getattr(ours, b), getattr(ref, b), rtol=0, atol=0)
        with pytest.raises(ValueError, match="side_input: expected the input's shape"):
            ours(x, s[:, :, :1, :1])     # torch's add would broadcast it
    finally:
        ct.set_path(old)
