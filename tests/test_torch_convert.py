"""cfbn.torch.convert: a model with its batch norms replaced computes the same."""
import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
ct = pytest.importorskip("cfbn.torch")

TOL = dict(rtol=1e-5, atol=1e-5)


def _close(got, want):
    """Equal within float32 rounding of a network's values: the two models'
    batch norms round differently, and the convolutions around them carry
    that to every element of a tensor, so the allowance follows the
    tensor's largest magnitude (gradients of 10-100 differ by a few 1e-5
    between two float32 runs, against a float64 run as much as each other)."""
    scale = max(1.0, float(want.detach().abs().max()))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * scale)


def _randomized(model, seed=0):
    """model with its 2-D batch norms' parameters drawn away from 1 and 0."""
    if seed is not None:
        torch.manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return model


def _cnn():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()),
        nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8, momentum=None),
                      nn.ReLU(inplace=True)),
        nn.Flatten(), nn.Linear(8 * 6 * 6, 10), nn.BatchNorm1d(10, affine=False))
    return _randomized(model, seed=None)


def _step(model, x, g):
    x = x.clone().requires_grad_()
    y = model(x)
    (y * g).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return y.detach(), x.grad, grads


def _same_steps(original, model, shape, classes, memory_format=torch.contiguous_format):
    """Two training steps and one in eval mode give both models the same
    outputs, input gradients and parameter gradients."""
    gen = torch.Generator().manual_seed(1)
    for training in (True, True, False):
        original.train(training)
        model.train(training)
        x = (torch.randn(*shape, generator=gen) * 2 + 1).to(memory_format=memory_format)
        g = torch.randn(shape[0], classes, generator=gen)
        ya, dxa, ga = _step(original, x, g)
        yb, dxb, gb = _step(model, x, g)
        _close(yb, ya)
        _close(dxb, dxa)
        for a, b in zip(ga, gb):
            _close(b, a)


@pytest.mark.parametrize("fuse", [False, True])
def test_converted_cnn_matches_the_original(fuse):
    original = _cnn()
    model = ct.convert(copy.deepcopy(original), fuse=fuse)
    kinds = [type(m) for m in model.modules()]
    assert nn.BatchNorm2d not in kinds and ct.BatchNorm2d in kinds and ct.BatchNorm1d in kinds
    if fuse:
        assert kinds.count(nn.ReLU) == 0 and kinds.count(nn.Identity) == 2
        assert [m.activation for m in model.modules() if isinstance(m, ct.BatchNorm2d)] == \
            ["relu", "relu"]
    else:
        assert kinds.count(nn.ReLU) == 2
    _same_steps(original, model, (4, 3, 6, 6), 10)
    state = model.state_dict()
    assert state.keys() == original.state_dict().keys()
    for k, v in original.state_dict().items():
        _close(state[k], v)
    fresh = _cnn()
    fresh.load_state_dict(state)


def test_convert_keeps_objects_flags_and_dtype():
    bn = nn.BatchNorm3d(4, eps=1e-3, momentum=0.2, dtype=torch.float64).eval()
    bn.weight.requires_grad_(False)
    weight = bn.weight
    model = nn.ModuleDict({"block": nn.ModuleList([bn])})
    assert ct.convert(model) is model
    new = model["block"][0]
    assert type(new) is ct.BatchNorm3d
    assert new.weight is weight and not new.weight.requires_grad
    assert new.running_mean.dtype == torch.float64 and not new.training
    assert (new.eps, new.momentum) == (1e-3, 0.2)
    # a batch norm passed alone comes back replaced
    assert type(ct.convert(nn.BatchNorm1d(3))) is ct.BatchNorm1d
    # a lazy one waits for its channel count
    lazy = nn.Sequential(nn.LazyBatchNorm2d())
    assert type(ct.convert(lazy)[0]) is nn.LazyBatchNorm2d


def test_convert_to_sync_and_back_from_sync():
    model = nn.Sequential(nn.BatchNorm2d(3, track_running_stats=False), nn.SyncBatchNorm(3))
    group = object()
    ct.convert(model, sync=True, process_group=group)
    assert [type(m) for m in model] == [ct.SyncBatchNorm, ct.SyncBatchNorm]
    assert all(m.process_group is group for m in model)
    assert model[0].running_mean is None
    model = nn.Sequential(nn.SyncBatchNorm(3, process_group=group))
    ct.convert(model)
    assert type(model[0]) is ct.SyncBatchNorm and model[0].process_group is group
    # without a process group SyncBatchNorm is the plain batch norm
    x = torch.randn(5, 3, 2, 2)
    torch.testing.assert_close(model[0](x), nn.BatchNorm2d(3)(x), **TOL)


# ---- fuse=True in a block class declared with register_block

class _Block(nn.Module):
    """A ResNet basic block as torchvision writes it: one ReLU module used
    twice, `out += identity`, an optional downsample."""

    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


def _fused_block(block, x):
    """_Block.forward with bn1 and bn2 fused."""
    out = block.conv2(block.bn1(block.conv1(x)))
    identity = x if block.downsample is None else block.downsample(x)
    return ct.residual(block.bn2, out, identity, inplace=True)


ct.register_block(_Block, _fused_block, {"bn1": "relu", "bn2": "relu"})


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.layer1 = nn.Sequential(_Block(8, 8), _Block(8, 16, 2))
        self.register_buffer("unused", torch.arange(3.0))
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        x = torch.nn.functional.relu(self.bn1(self.conv1(x)))
        x = self.layer1(x)
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


def _activations(model):
    return {n: m.activation for n, m in model.named_modules() if isinstance(m, ct.BatchNorm2d)}


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_fuse_declared_blocks(memory_format):
    original = _randomized(_Net()).to(memory_format=memory_format)
    model = ct.convert(copy.deepcopy(original), fuse=True)
    # each block's bn1 -> relu and bn2 + identity -> relu; the stem's F.relu
    # is in _Net's own forward, which convert does not read; the
    # downsample's batch norm has nothing after it to fuse
    assert _activations(model) == {
        "bn1": None, "layer1.0.bn1": "relu", "layer1.0.bn2": "relu", "layer1.1.bn1": "relu",
        "layer1.1.bn2": "relu", "layer1.1.downsample.1": None}
    for block in model.layer1:
        assert type(block) is _Block and isinstance(block.forward, ct.blocks.FusedForward)
    assert model.layer1[0].downsample is None and model.layer1[1].stride == 2
    assert list(model.state_dict()) == list(original.state_dict())
    _same_steps(original, model, (4, 3, 8, 8), 5, memory_format)
    for k, v in original.state_dict().items():
        _close(model.state_dict()[k], v)
    _Net().load_state_dict(model.state_dict())
    # converting again changes nothing
    assert ct.convert(model, fuse=True) is model and _activations(model)["layer1.0.bn1"] == "relu"


def test_fused_model_pickles_copies_and_compiles(tmp_path):
    model = ct.convert(_randomized(_Net()), fuse=True).eval()
    x = torch.randn(2, 3, 8, 8)
    want = model(x)
    torch.save(model, tmp_path / "m.pt")
    for other in (torch.load(tmp_path / "m.pt", weights_only=False), copy.deepcopy(model),
                  torch.compile(model, fullgraph=True)):
        torch.testing.assert_close(other(x), want, rtol=1e-6, atol=1e-6)
    copied = copy.deepcopy(model)
    assert copied.layer1[0].forward.block is copied.layer1[0]


def test_fuse_keeps_training_flags_of_submodules():
    model = _Net()
    model.layer1[1].bn1.eval()
    model = ct.convert(model, fuse=True)
    assert model.training and not model.layer1[1].bn1.training
    assert model.layer1[0].bn1.training


def test_a_block_declared_none_is_never_fused():
    class Mine(_Block):
        pass

    ct.register_block(Mine, None)
    model = ct.convert(nn.Sequential(Mine(3, 3), _Block(3, 3)), fuse=True)
    assert model[0].bn1.activation is None and "forward" not in vars(model[0])
    assert model[1].bn1.activation == "relu"
    with pytest.raises(ValueError, match="activations"):
        ct.register_block(Mine, _fused_block, {})
