"""Which batch norms convert replaces, and what the new module keeps."""
import copy
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
ct = pytest.importorskip("cfbn.torch")
import _zoo  # noqa: E402

from torch.nn.utils import parametrize, prune  # noqa: E402

nn = torch.nn


def _bn(c=3):
    bn = nn.BatchNorm2d(c, dtype=torch.float64)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    return bn


def _same(original, model, x):
    for training in (True, False):
        torch.manual_seed(0)
        want = original.train(training)(x)
        torch.manual_seed(0)
        got = model.train(training)(x)
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


# ---- defect 3: subclasses

class _Scaled(nn.BatchNorm2d):
    """A subclass with a forward of its own."""

    def forward(self, x):
        return 2 * super().forward(x)


class _Named(nn.BatchNorm2d):
    """A subclass adding only a constructor."""

    def __init__(self, c):
        super().__init__(c, eps=1e-3, dtype=torch.float64)


def test_a_subclass_with_its_own_forward_is_left_alone():
    original = nn.Sequential(_Scaled(3, dtype=torch.float64))
    model = copy.deepcopy(original)
    with pytest.warns(UserWarning, match=r"left '0' \(_Scaled\) as it is"):
        ct.convert(model)
    assert type(model[0]) is _Scaled
    _same(original, model, torch.randn(4, 3, 2, 2, dtype=torch.float64))


def test_a_subclass_adding_only_a_constructor_is_converted():
    model = ct.convert(nn.Sequential(_Named(3)))
    assert type(model[0]) is ct.BatchNorm2d and model[0].eps == 1e-3


def test_an_instance_with_its_own_forward_is_left_alone():
    bn = _bn()
    bn.forward = lambda x: x
    with pytest.warns(UserWarning, match="a forward of its own"):
        model = ct.convert(nn.Sequential(bn))
    assert model[0] is bn


def _norm_act(act, drop=None):
    timm = _zoo.timm()
    torch.manual_seed(0)
    m = timm.layers.BatchNormAct2d(4, act_layer=act, drop_layer=drop).double()
    with torch.no_grad():
        m.weight.uniform_(0.5, 1.5)
        m.bias.uniform_(-0.5, 0.5)
    return m


@pytest.mark.parametrize("act, fused", [("relu", "relu"), ("silu", "silu"),
                                        ("leaky_relu", "leaky_relu"), ("gelu", None),
                                        ("hard_swish", None)])
@pytest.mark.parametrize("fuse", [False, True])
def test_timm_batch_norm_act_keeps_its_activation(act, fused, fuse):
    original = _norm_act(act)
    model = ct.convert(copy.deepcopy(original), fuse=fuse)
    assert type(model) is ct.normact.BatchNormAct2d
    assert model.activation == (fused if fuse else None)
    assert (type(model.act) is nn.Identity) == bool(fuse and fused)
    assert model.state_dict().keys() == original.state_dict().keys()
    _same(original, model, torch.randn(4, 4, 3, 3, dtype=torch.float64))


def test_timm_batch_norm_act_keeps_its_drop_layer():
    original = _norm_act("relu", drop=lambda: nn.Dropout(0.5))
    model = ct.convert(copy.deepcopy(original), fuse=True)
    # the drop runs between the batch norm and the activation: not fused
    assert model.activation is None and type(model.drop) is nn.Dropout
    assert type(model.act) is nn.ReLU
    _same(original, model, torch.randn(4, 4, 3, 3, dtype=torch.float64))


def test_convert_imports_neither_timm_nor_torchvision():
    code = ("import sys, torch, cfbn.torch as ct\n"
            "ct.convert(torch.nn.Sequential(torch.nn.BatchNorm2d(3), torch.nn.ReLU()), True)\n"
            "print(sorted(m for m in ('timm', 'torchvision') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


# ---- defect 13: parametrized and pruned weights

class _Positive(nn.Module):
    def forward(self, w):
        return w.abs()


def test_a_parametrized_batch_norm_is_left_alone_with_its_name():
    original = nn.Sequential(nn.Sequential(_bn()))
    parametrize.register_parametrization(original[0][0], "weight", _Positive())
    model = copy.deepcopy(original)
    with pytest.warns(UserWarning, match=r"'0\.0'.*parametrized"):
        ct.convert(model)
    assert parametrize.is_parametrized(model[0][0])
    _same(original, model, torch.randn(4, 3, 2, 2, dtype=torch.float64))


def test_a_pruned_batch_norm_is_converted_with_its_pruning():
    def pruned():  # not deep-copyable: its weight is computed
        torch.manual_seed(1)
        m = nn.Sequential(_bn(6))
        prune.l1_unstructured(m[0], "weight", amount=0.5)
        return m

    original = pruned()
    model = ct.convert(pruned())
    assert type(model[0]) is ct.BatchNorm2d
    assert list(model.state_dict()) == list(original.state_dict())
    x = torch.randn(4, 6, 2, 2, dtype=torch.float64)
    _same(original, model, x)
    prune.remove(model[0], "weight")
    assert isinstance(model[0].weight, nn.Parameter)
    assert (model[0].weight == 0).sum() == 3


# ---- what the new module keeps

def test_an_optimizer_made_before_still_trains_the_model():
    model = nn.Sequential(nn.Conv2d(3, 3, 1, dtype=torch.float64), _bn())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    bias = model[1].bias
    before = bias.detach().clone()
    model[1].qconfig = "kept"
    model[1].eval()
    ct.convert(model, fuse=True)
    assert model[1].bias is bias and model[1].qconfig == "kept" and not model[1].training
    model(torch.randn(4, 3, 2, 2, dtype=torch.float64)).pow(2).sum().backward()
    opt.step()
    assert not torch.equal(model[1].bias.detach(), before)


def test_a_batch_norm_met_twice_stays_one_module():
    bn = _bn()
    model = ct.convert(nn.ModuleList([bn, nn.Sequential(bn)]))
    assert type(model[0]) is ct.BatchNorm2d and model[1][0] is model[0]
