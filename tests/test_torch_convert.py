"""cfbn.torch.convert: a model with its batch norms replaced computes the same."""
import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
ct = pytest.importorskip("cfbn.torch")

TOL = dict(rtol=1e-5, atol=1e-5)


def _cnn():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()),
        nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8, momentum=None),
                      nn.ReLU(inplace=True)),
        nn.Flatten(), nn.Linear(8 * 6 * 6, 10), nn.BatchNorm1d(10, affine=False))
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return model


def _step(model, x, g):
    x = x.clone().requires_grad_()
    y = model(x)
    (y * g).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return y.detach(), x.grad, grads


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
    gen = torch.Generator().manual_seed(1)
    for training in (True, True, False):
        original.train(training)
        model.train(training)
        x = torch.randn(4, 3, 6, 6, generator=gen) * 2 + 1
        g = torch.randn(4, 10, generator=gen)
        ya, dxa, ga = _step(original, x, g)
        yb, dxb, gb = _step(model, x, g)
        torch.testing.assert_close(yb, ya, **TOL)
        torch.testing.assert_close(dxb, dxa, **TOL)
        for a, b in zip(ga, gb):
            torch.testing.assert_close(b, a, **TOL)
    state = model.state_dict()
    assert state.keys() == original.state_dict().keys()
    for k, v in original.state_dict().items():
        torch.testing.assert_close(state[k], v, **TOL)
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
