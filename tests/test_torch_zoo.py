"""cfbn.torch.convert on real model code: torchvision's and timm's models,
with random weights, in float64, compute what the originals compute."""
import copy

import pytest

torch = pytest.importorskip("torch")
ct = pytest.importorskip("cfbn.torch")
import _zoo  # noqa: E402

nn = torch.nn

# Each model at 32 px, in batches of 2 (float64 convolutions are slow).
_TORCHVISION = {"resnet18": 32, "resnet50": 32, "mobilenet_v2": 32, "mobilenet_v3_small": 32,
                "efficientnet_b0": 32, "regnet_y_400mf": 32, "shufflenet_v2_x0_5": 32,
                "densenet121": 32}
_TIMM = {"efficientnet_b0": 32, "mobilenetv3_small_100": 32, "regnety_002": 32,
         "resnet18": 32}
# Models whose every activation after a batch norm cfbn fuses sits where
# fuse=True looks (Sequential children, torchvision's ResNet blocks, timm's
# BatchNormAct2d); the others keep theirs in forwards cfbn does not read.
_FUSES = {"tv_resnet18", "tv_resnet50", "tv_mobilenet_v2", "tv_mobilenet_v3_small",
          "tv_efficientnet_b0", "tv_regnet_y_400mf", "tv_shufflenet_v2_x0_5",
          "tv_densenet121", "timm_efficientnet_b0", "timm_mobilenetv3_small_100",
          "timm_regnety_002"}
# How far apart two float64 runs that round differently may land: the
# original's own contiguous and channels-last runs (whose convolutions sum
# in other orders) give each tensor's `noise`, the largest elementwise
# difference between them.  Through ~50 training-mode batch norms over
# batches of 2, some dividing by the spread of two values, that noise is
# 1e-16 to 1e-5 of a tensor's largest magnitude, and a gradient that is
# zero but for rounding (a batch norm's bias before another batch norm)
# is all noise.  A converted model may differ from the original by
# _NOISE times that, plus _FLOOR of the tensor's largest magnitude for
# tensors that both runs happened to round alike; a real defect (a dropped
# activation or add) is off by tens of percent.
_NOISE = 64
_FLOOR = 1e-12
NAMES = ["tv_" + n for n in _TORCHVISION] + ["timm_" + n for n in _TIMM]


def _build(name):
    torch.manual_seed(0)
    if name.startswith("tv_"):
        tv = _zoo.torchvision()
        model = getattr(tv.models, name[3:])(weights=None)
        size = _TORCHVISION[name[3:]]
    else:
        timm = _zoo.timm()
        model = timm.create_model(name[5:], pretrained=False)
        size = _TIMM[name[5:]]
    return _zoo.randomized(model.double()), size


def _run(model, x, g, training, seed):
    model.train(training)
    model.zero_grad()
    x = x.clone().requires_grad_()
    torch.manual_seed(seed)  # dropout, stochastic depth
    y = model(x)
    (y * g).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return {"output": y.detach(), "input grad": x.grad}, grads


def _flat(steps):
    """One dict of every tensor a `_steps` result holds."""
    (train, eval_), buffers = steps
    flat = {"buffer " + k: v for k, v in buffers.items()}
    for mode, (values, grads) in (("train", train), ("eval", eval_)):
        flat.update({"%s %s" % (mode, k): v for k, v in values.items()})
        flat.update({"%s grad %s" % (mode, k): v for k, v in grads.items()})
    return flat


def _compare(got, want, other, what):
    """got against want, allowing _NOISE times want's difference from
    `other` (the same model run in the other memory format); the largest
    difference in units of that allowance's noise part."""
    assert got.keys() == want.keys(), what
    worst = 0.0
    for k in want:
        w = want[k].double()
        scale = float(w.abs().max())
        noise = float((other[k].double() - w).abs().max())
        err = float((got[k].double() - w).abs().max())
        assert err <= _NOISE * noise + _FLOOR * scale, \
            "%s, %s: off by %.3g, the original's rounding noise %.3g, its largest " \
            "magnitude %.3g" % (what, k, err, noise, scale)
        worst = max(worst, err / (noise + _FLOOR * scale) if scale else 0.0)
    return worst


def _steps(model, x, g):
    """A training step then an eval step: what each computes, and the
    buffers (running statistics) after."""
    out = []
    for training, seed in ((True, 1), (False, 2)):
        out.append(_run(model, x, g, training, seed))
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    return out, buffers


def _fused_count(model):
    # a string: torchvision's SqueezeExcitation has an `activation` module
    return sum(isinstance(getattr(m, "activation", None), str) for m in model.modules())


@pytest.mark.parametrize("name", NAMES)
def test_model_matches(name):
    original, size = _build(name)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, size, size, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        g = torch.randn_like(copy.deepcopy(original).eval()(x), dtype=torch.float64)
    formats = (torch.contiguous_format, torch.channels_last)
    bases = [copy.deepcopy(original).to(memory_format=f) for f in formats]
    inputs = [x.contiguous(memory_format=f) for f in formats]
    wants = [_flat(_steps(copy.deepcopy(b), xf, g)) for b, xf in zip(bases, inputs)]
    worst = 0.0
    for i, (base, xf) in enumerate(zip(bases, inputs)):
        for fuse in (False, True):
            model = ct.convert(copy.deepcopy(base), fuse=fuse)
            kinds = {type(m) for m in model.modules()}
            assert not kinds & {nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d}, kinds
            assert (_fused_count(model) > 0) == (fuse and name in _FUSES)
            assert model.state_dict().keys() == base.state_dict().keys()
            got = _flat(_steps(model, xf, g))
            what = "%s fuse=%s %s" % (name, fuse, formats[i])
            worst = max(worst, _compare(got, wants[i], wants[1 - i], what))
    print("%s: worst difference %.3g times the rounding noise" % (name, worst))


@pytest.mark.parametrize("act, name", [(nn.SiLU(), "silu"), (nn.LeakyReLU(0.1), "leaky_relu"),
                                       (nn.GELU(), None)], ids=str)
def test_torchvision_blocks_fuse_the_activation_they_hold(act, name):
    tv = _zoo.torchvision()
    torch.manual_seed(0)
    down = nn.Sequential(nn.Conv2d(8, 16, 1, 2, bias=False), nn.BatchNorm2d(16))
    blocks = nn.Sequential(tv.models.resnet.BasicBlock(8, 8),
                           tv.models.resnet.Bottleneck(8, 4, 2, down))
    for block in blocks:
        block.relu = act
    original = _zoo.randomized(blocks.double())
    model = ct.convert(copy.deepcopy(original), fuse=True)
    assert [m.activation for m in model.modules() if isinstance(m, ct.BatchNorm2d)] == \
        [name] * 5 + [None]
    x = torch.randn(2, 8, 6, 6, dtype=torch.float64)
    for training in (True, False):
        torch.testing.assert_close(model.train(training)(x), original.train(training)(x),
                                   rtol=1e-9, atol=1e-9)


def test_a_torchvision_block_whose_relu_has_hooks_is_not_fused():
    tv = _zoo.torchvision()
    block = tv.models.resnet.BasicBlock(4, 4)
    calls = []
    block.relu.register_forward_hook(lambda m, a, y: calls.append(1))
    with pytest.warns(UserWarning, match="'relu' is not fused into 'bn1'"):
        ct.convert(block, fuse=True)
    assert block.bn1.activation is None and "forward" not in vars(block)
    block(torch.randn(2, 4, 3, 3))
    assert len(calls) == 2


@pytest.mark.parametrize("arch", ["resnet18", "resnet50"])
def test_the_torchvision_resnet_stem_is_fused(arch):
    """The stem's bn1 takes its relu (the network's largest batch-norm
    output), so that every batch norm that a relu follows in ResNet's code
    (after a residual add in each block's last) carries it: 17 of
    resnet18's 20, 49 of resnet50's 53; the others are the downsample
    branches'."""
    tv = _zoo.torchvision()
    torch.manual_seed(0)
    model = ct.convert(getattr(tv.models, arch)(weights=None, num_classes=10), fuse=True)
    assert model.bn1.activation == "relu" and "forward" in vars(model)
    norms = [m for m in model.modules() if isinstance(m, ct.BatchNorm2d)]
    assert sum(m.activation == "relu" for m in norms) == {"resnet18": 17, "resnet50": 49}[arch]
    # what the fused model computes: test_model_matches (tv_resnet18, tv_resnet50)


def test_a_resnet_whose_stem_relu_has_hooks_keeps_its_forward():
    tv = _zoo.torchvision()
    model = tv.models.resnet18(weights=None, num_classes=10)
    model.relu.register_forward_hook(lambda m, a, y: None)
    with pytest.warns(UserWarning, match="'relu' is not fused into 'bn1'"):
        ct.convert(model, fuse=True)
    assert model.bn1.activation is None and "forward" not in vars(model)


def _resnet18():
    tv = _zoo.torchvision()
    torch.manual_seed(0)
    model = ct.convert(_zoo.randomized(tv.models.resnet18(weights=None, num_classes=10)),
                       fuse=True)
    return model.eval()


# torch's tracers see the fused model's batch norms as cfbn's operators
@pytest.mark.parametrize("how", ["jit.trace", "export", "compile"])
def test_fused_resnet18_traces_exports_and_compiles(how):
    model = _resnet18()
    x = torch.randn(2, 3, 32, 32)
    want = model(x)
    if how == "jit.trace":
        other = torch.jit.trace(model, (x,), check_trace=False)
    elif how == "export":
        other = torch.export.export(model, (x,)).module()
    else:
        other = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(other(x), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(other(x + 1), model(x + 1), rtol=1e-5, atol=1e-5)
    if how != "export":  # an exported program holds its own parameters
        # the parameters are read at run time, not captured as constants
        with torch.no_grad():
            model.layer1[0].bn2.weight.mul_(2)
            model.layer1[0].bn2.running_mean.add_(1)
        torch.testing.assert_close(other(x), model(x), rtol=1e-5, atol=1e-5)
