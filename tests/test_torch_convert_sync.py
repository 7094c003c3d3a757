"""convert(sync=True) after convert(fuse=True): every batch norm
synchronized, each keeping its fused activation."""
import copy

import pytest

torch = pytest.importorskip("torch")
ct = pytest.importorskip("cfbn.torch")
import _zoo  # noqa: E402

nn = torch.nn


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1, dtype=torch.float64)
        self.bn = nn.BatchNorm2d(3, dtype=torch.float64)
        self.act = nn.LeakyReLU(0.3)

    def forward(self, x):
        return self.act(self.bn(self.conv(x)) + x)


def _fused_block(block, x):
    return ct.residual(block.bn, block.conv(x), x)


ct.register_block(_Block, _fused_block, {"bn": "act"})


def _model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 3, 1, dtype=torch.float64),
                          nn.BatchNorm2d(3, dtype=torch.float64), nn.ELU(0.5), _Block(),
                          nn.BatchNorm2d(3, dtype=torch.float64))
    return _zoo.randomized(model)


def _same(original, model, x):
    for training in (True, False):
        want = original.train(training)(x)
        got = model.train(training)(x)
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_sync_after_fuse_keeps_the_activations():
    original = _model()
    model = ct.convert(copy.deepcopy(original), fuse=True)
    weight = model[1].weight
    group = object()
    ct.convert(model, sync=True, process_group=group)
    bns = [model[1], model[3].bn, model[4]]
    assert all(type(m) is ct.SyncBatchNorm and m.process_group is group for m in bns)
    assert [(m.activation, m.alpha) for m in bns] == [("elu", 0.5), ("leaky_relu", 0.3),
                                                      (None, None)]
    assert model[1].weight is weight
    # without an initialized process group a SyncBatchNorm computes locally
    _same(original, model, torch.randn(4, 3, 5, 5, dtype=torch.float64))


def test_sync_timm_batch_norm_act():
    timm = _zoo.timm()
    torch.manual_seed(0)
    original = timm.layers.BatchNormAct2d(3, act_layer="silu").double()
    fused = ct.convert(ct.convert(copy.deepcopy(original), fuse=True), sync=True)
    kept = ct.convert(copy.deepcopy(original), sync=True)
    assert type(fused) is type(kept) is ct.normact.SyncBatchNormAct
    assert fused.activation == "silu" and type(fused.act) is nn.Identity
    assert kept.activation is None and type(kept.act) is nn.SiLU
    x = torch.randn(4, 3, 5, 5, dtype=torch.float64)
    _same(copy.deepcopy(original), fused, x)
    _same(original, kept, x)
