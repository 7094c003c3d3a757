"""convert(fuse=True) fuses only what it knows computes the same: every
activation the kernels fuse, where it runs right after a batch norm; never
inside a forward cfbn does not know."""
import copy
import random
import warnings

import pytest

torch = pytest.importorskip("torch")
ct = pytest.importorskip("cfbn.torch")
nn = torch.nn

ACTIVATIONS = [(nn.ReLU(), "relu", None), (nn.ReLU6(inplace=True), "relu6", None),
               (nn.LeakyReLU(0.2), "leaky_relu", 0.2), (nn.ELU(0.7), "elu", 0.7),
               (nn.Sigmoid(), "sigmoid", None), (nn.Tanh(), "tanh", None),
               (nn.SiLU(), "silu", None)]


def _bn(c, dtype=torch.float64):
    bn = nn.BatchNorm2d(c, dtype=dtype)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    return bn


def _assert_same(original, model, *inputs, training=(True, False)):
    """Outputs and every gradient of the two models agree."""
    for mode in training:
        original.train(mode)
        model.train(mode)
        got, want = [], []
        for m, out in ((original, want), (model, got)):
            xs = [x.clone().requires_grad_() for x in inputs]
            torch.manual_seed(0)
            y = m(*xs)
            y.backward(torch.ones_like(y) + torch.linspace(0, 1, y.numel()).view_as(y))
            out.extend([y] + [x.grad for x in xs] + [p.grad for p in m.parameters()])
            m.zero_grad()
        for a, b in zip(got, want):
            assert a.dtype == b.dtype
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


# ---- defect 11: every activation the kernels fuse

@pytest.mark.parametrize("act, name, alpha", ACTIVATIONS, ids=[a[1] for a in ACTIVATIONS])
def test_every_fusable_activation_fuses_in_a_sequential(act, name, alpha):
    torch.manual_seed(0)
    original = nn.Sequential(nn.Conv2d(3, 4, 3, dtype=torch.float64), _bn(4), act)
    model = ct.convert(copy.deepcopy(original), fuse=True)
    assert (model[1].activation, model[1].alpha) == (name, alpha)
    assert type(model[2]) is nn.Identity
    x = torch.randn(4, 3, 6, 6, dtype=torch.float64) * 3
    _assert_same(original, model, x)


@pytest.mark.parametrize("act", [nn.Hardtanh(0.0, 6.0), nn.GELU(), nn.Hardswish(),
                                 nn.PReLU(dtype=torch.float64)], ids=str)
def test_other_activations_stay_modules(act):
    original = nn.Sequential(_bn(3), act)
    model = ct.convert(copy.deepcopy(original), fuse=True)
    assert model[0].activation is None and type(model[1]) is type(act)
    _assert_same(original, model, torch.randn(4, 3, 5, 5, dtype=torch.float64))


# ---- defect 7: nothing is traced; only what is known is fused

class _OwnSequential(nn.Sequential):
    """An nn.Sequential subclass whose forward is not its children in turn."""

    def forward(self, x):
        y = self[0](x)
        return self[1](y) + y


class _Stateful(nn.Module):
    """A forward reading Python state: a random skip and a float attribute,
    and counting its calls."""

    def __init__(self):
        super().__init__()
        self.bn = _bn(3)
        self.scale = 1.0
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.training and random.random() < 0.5:
            return x
        return torch.relu(self.bn(x)) * self.scale


class _InPlaceBetween(nn.Module):
    """Writes the batch norm's input in place between it and the ReLU
    (autograd refuses that: the models are compared without it)."""

    def __init__(self):
        super().__init__()
        self.bn = _bn(3)

    def forward(self, x):
        x = x.clone()
        y = self.bn(x)
        x.mul_(2)
        return torch.relu(y) + x


class _Broadcast(nn.Module):
    """relu(bn(x) + other) with an `other` of another shape, or dtype."""

    def __init__(self, other):
        super().__init__()
        self.bn = _bn(3)
        self.register_buffer("other", other)

    def forward(self, x):
        return torch.relu(self.bn(x) + self.other)


def test_a_sequential_subclass_with_its_own_forward_is_not_fused():
    original = _OwnSequential(_bn(3), nn.ReLU())
    model = ct.convert(copy.deepcopy(original), fuse=True)
    assert model[0].activation is None and type(model[1]) is nn.ReLU
    _assert_same(original, model, torch.randn(4, 3, 5, 5, dtype=torch.float64))


def test_a_forward_is_neither_run_nor_traced():
    model = _Stateful()
    ct.convert(model, fuse=True)
    assert model.calls == 0 and model.bn.activation is None
    assert not any(isinstance(v, torch.fx.Proxy) for v in vars(model).values())
    # its Python state still decides what it computes
    x = torch.randn(4, 3, 5, 5, dtype=torch.float64)
    model.eval()
    model.scale = 2.0
    torch.testing.assert_close(model(x), 2 * torch.relu(model.bn(x)))
    model.train()
    random.seed(0)
    skipped = [model(x) is x for _ in range(20)]
    assert any(skipped) and not all(skipped)


def test_a_write_between_batch_norm_and_relu_is_seen_as_before():
    original = _InPlaceBetween()
    model = ct.convert(copy.deepcopy(original), fuse=True)
    assert model.bn.activation is None
    x = torch.randn(4, 3, 5, 5, dtype=torch.float64)
    with torch.no_grad():
        for training in (True, False):
            torch.testing.assert_close(model.train(training)(x), original.train(training)(x))


@pytest.mark.parametrize("cls, args", [
    (_Broadcast, (torch.randn(3, 1, 1, dtype=torch.float64),)),
    (_Broadcast, (torch.randn(4, 3, 5, 5, dtype=torch.float32),)),
], ids=["broadcast", "other dtype"])
def test_unknown_forwards_compute_as_before(cls, args):
    original = cls(*args)
    model = ct.convert(copy.deepcopy(original), fuse=True)
    assert model.bn.activation is None
    _assert_same(original, model, torch.randn(4, 3, 5, 5, dtype=torch.float64))


class _Residual(nn.Module):
    """A declared block: relu(bn(x) + other), `other` given at call time."""

    def __init__(self):
        super().__init__()
        self.bn = _bn(3)
        self.act = nn.ReLU()

    def forward(self, x, other):
        return self.act(self.bn(x) + other)


def _fused_residual(block, x, other):
    return ct.residual(block.bn, x, other)


ct.register_block(_Residual, _fused_residual, {"bn": "act"})


@pytest.mark.parametrize("shape, dtype", [((4, 3, 5, 5), torch.float64),
                                          ((3, 1, 1), torch.float64),
                                          ((4, 3, 5, 5), torch.float32),
                                          ((1, 3, 5, 5), torch.float64)],
                         ids=["same", "broadcast", "float32", "batch-broadcast"])
def test_a_side_input_only_when_it_is_exactly_the_output(shape, dtype):
    original = _Residual()
    model = ct.convert(copy.deepcopy(original), fuse=True)
    assert model.bn.activation == "relu"
    x = torch.randn(4, 3, 5, 5, dtype=torch.float64)
    other = torch.randn(*shape, dtype=dtype)
    _assert_same(original, model, x, other)


# ---- defect 9: hooks

def test_hooks_of_a_converted_batch_norm_still_fire_and_remove():
    model = nn.Sequential(_bn(3))
    seen = []
    handles = [
        model[0].register_forward_pre_hook(lambda m, a: seen.append("pre")),
        model[0].register_forward_hook(lambda m, a, y: seen.append("forward")),
        model[0].register_full_backward_hook(lambda m, gi, go: seen.append("backward")),
    ]
    ct.convert(model)
    assert type(model[0]) is ct.BatchNorm2d
    x = torch.randn(4, 3, 2, 2, dtype=torch.float64, requires_grad=True)
    model(x).sum().backward()
    assert seen == ["pre", "forward", "backward"]
    for h in handles:
        h.remove()
    model(x).sum().backward()
    assert len(seen) == 3


@pytest.mark.parametrize("hooked, message", [
    (1, "'1' is not fused into '0': it has hooks"),    # would no longer fire
    (0, "the batch norm has forward or backward hooks"),  # would see the ReLU's output
])
def test_hooks_that_fusion_would_change_stop_it(hooked, message):
    model = nn.Sequential(_bn(3), nn.ReLU())
    outputs = []
    model[hooked].register_forward_hook(lambda m, a, y: outputs.append((m, y)))
    with pytest.warns(UserWarning, match=message):
        ct.convert(model, fuse=True)
    assert model[0].activation is None and type(model[1]) is nn.ReLU
    model(torch.randn(4, 3, 2, 2, dtype=torch.float64))
    [(module, y)] = outputs
    assert module is model[hooked] and bool((y < 0).any()) == (hooked == 0)


def test_a_pre_hook_does_not_stop_fusion():
    model = nn.Sequential(_bn(3), nn.ReLU())
    model[0].register_forward_pre_hook(lambda m, a: (a[0] * 2,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ct.convert(model, fuse=True)
    assert model[0].activation == "relu"
    x = torch.randn(4, 3, 2, 2, dtype=torch.float64)
    want = torch.relu(nn.functional.batch_norm(2 * x, None, None, model[0].weight,
                                               model[0].bias, True))
    torch.testing.assert_close(model(x), want)


def test_a_batch_norm_used_twice_is_not_fused():
    bn = _bn(3)
    original = nn.Sequential(nn.Sequential(bn, nn.ReLU()), nn.Sequential(bn))
    model = ct.convert(copy.deepcopy(original), fuse=True)
    assert model[0][0] is model[1][0] and model[0][0].activation is None
    _assert_same(original, model, torch.randn(4, 3, 5, 5, dtype=torch.float64))
