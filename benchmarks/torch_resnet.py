"""A ResNet-18 CPU training step: PyTorch's batch norms against cfbn.torch's.

The network is built here (torchvision's ResNet-18 layout: basic blocks,
[2, 2, 2, 2], a 7x7 stem and max-pool), so torchvision is not needed.  Three
copies start from the same weights:

- ``torch``: the model as written, ``nn.BatchNorm2d`` and ``nn.ReLU``;
- ``drop-in``: ``cfbn.torch.convert(model)``, every batch norm replaced;
- ``fused``: ``cfbn.torch.convert(model, fuse=True)``, each BN -> ReLU and
  residual BN + add -> ReLU one call.

Each trains with SGD (momentum 0.9) on the same random batches, in NCHW and
in channels_last memory.  The script checks the first step (loss within
1e-5, every parameter's gradient within 1e-3 of its largest element) and the
losses of the next steps (within 1e-3).  Where the original itself moves
further when its weights move by 1e-7 relative (float32 rounding flips ReLU
and max-pool choices, and small batches make training chaotic), 4 times
that drift is the bound instead.  It then times steps
interleaved (the three models in turn, the order reversed every round) and
prints the median step time of each and its ratio to the original's.

    python benchmarks/torch_resnet.py [--batch 32] [--size 112] [--steps 8]
                                      [--threads 2] [--formats nchw,channels_last]
                                      [--json FILE]

``--json FILE`` writes the step times and the machine for ``benchmarks/plot.py``.

``--profile`` instead profiles the original alone and prints the share of
its forward + backward that batch norm, its ReLUs and the residual adds
take: 1 minus that bounds from below the step time any batch norm can give
the converted model (run it on a quiet machine: it is one profile, not
interleaved rounds).
"""
import argparse
import copy
import datetime
import json
import platform
import shlex
import statistics
import sys
import time

import torch
import torch.nn as nn

import cfbn.torch as ct

from _bench_common import CpuMeter, cpu_model


class BasicBlock(nn.Module):
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

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet18(nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class Trainer:
    def __init__(self, model, memory_format):
        self.model = model.to(memory_format=memory_format).train()
        self.memory_format = memory_format
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.loss_fn = nn.CrossEntropyLoss()

    def step(self, x, labels):
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(x.to(memory_format=self.memory_format)), labels)
        loss.backward()
        grads = [p.grad for p in self.model.parameters()]
        self.opt.step()
        return loss.item(), grads


def batches(n, args):
    gen = torch.Generator().manual_seed(7)
    for _ in range(n):
        x = torch.randn(args.batch, 3, args.size, args.size, generator=gen)
        yield x, torch.randint(0, 1000, (args.batch,), generator=gen)


def _grad_error(grads, base):
    """The largest difference of a gradient tensor from its base, relative
    to that base tensor's largest element."""
    return max(float((g - b).abs().max() / max(b.abs().max(), 1e-30))
               for g, b in zip(grads, base))


def check(trainers, args):
    """First-step loss and gradients, then the first steps' losses, of each
    converted model against the original; the worst differences, and the
    rounding drift: how far the original itself moves when its weights move
    by 1e-7 relative (float32 rounding) and it is trained alike."""
    nudged = copy.deepcopy(trainers["torch"].model)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in nudged.parameters():
            p.mul_(1 + 1e-7 * torch.randn(p.shape, generator=gen))
    nudged = Trainer(nudged, trainers["torch"].memory_format)
    (x, labels), = batches(1, args)
    base_loss, base_grads = trainers["torch"].step(x, labels)
    # ReLU and max-pool choices that flip under rounding move whole
    # gradient elements: the original's own drift is the yardstick
    drift = [0.0, _grad_error(nudged.step(x, labels)[1], base_grads)]
    worst = {}
    for name in ("drop-in", "fused"):
        loss, grads = trainers[name].step(x, labels)
        worst[name] = [abs(loss - base_loss), _grad_error(grads, base_grads), 0.0]
    for x, labels in batches(args.check_steps, args):
        base_loss, _ = trainers["torch"].step(x, labels)
        drift[0] = max(drift[0], abs(nudged.step(x, labels)[0] - base_loss))
        for name in ("drop-in", "fused"):
            loss, _ = trainers[name].step(x, labels)
            worst[name][2] = max(worst[name][2], abs(loss - base_loss))
    return drift, worst


def timed(trainers, args):
    names = list(trainers)
    samples = {name: [] for name in names}
    data = list(batches(2, args))
    for t in trainers.values():        # one warm-up step each
        t.step(*data[0])
    for r in range(args.steps):
        for name in (names if r % 2 == 0 else names[::-1]):
            t0 = time.perf_counter()
            trainers[name].step(*data[r % 2])
            samples[name].append(time.perf_counter() - t0)
    return {name: statistics.median(s) for name, s in samples.items()}


# The original's batch norms, their ReLUs and the residual adds: what
# convert(fuse=True) replaces.  Everything else (convolutions, pooling, the
# loss) the converted model runs as the original does.
BN_OPS = ("aten::native_batch_norm", "aten::native_batch_norm_backward",
          "aten::_native_batch_norm_legit", "aten::_native_batch_norm_legit_functional",
          "aten::_batch_norm_with_update", "aten::batch_norm_backward", "aten::relu_",
          "aten::relu", "aten::clamp_min_", "aten::clamp_min", "aten::threshold_backward",
          "aten::add_", "aten::add")


def bn_share(trainer, args):
    """The share of the original's forward + backward (the optimizer left
    out, so that its own add_ calls are not counted) spent in BN_OPS: self
    CPU time over two profiled passes.  With batch norm, ReLU and the adds
    free, a whole step would take at least 1 minus it (more: the optimizer's
    time is not in the share's denominator)."""
    from torch.profiler import ProfilerActivity, profile

    data = list(batches(2, args))
    model, fmt = trainer.model, trainer.memory_format

    def forward_backward(x, labels):
        model.zero_grad(set_to_none=True)
        trainer.loss_fn(model(x.to(memory_format=fmt)), labels).backward()

    forward_backward(*data[0])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for x, labels in data:
            forward_backward(x, labels)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    bn = sum(e.self_cpu_time_total for e in events if e.key in BN_OPS)
    return bn / total


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=112, help="image height and width")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per model")
    ap.add_argument("--check-steps", type=int, default=3,
                    help="steps after the first whose losses are compared")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--formats", default="nchw,channels_last")
    ap.add_argument("--json", metavar="FILE", help="write the step times and the machine here")
    ap.add_argument("--profile", action="store_true",
                    help="only profile the original: batch norm's (with its ReLUs and adds) "
                         "share of a step, and so the least step time a faster batch norm "
                         "can give")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    formats = {"nchw": torch.contiguous_format, "channels_last": torch.channels_last}
    if args.profile:
        print("ResNet-18, batch %d, 3x%dx%d, %d threads, SGD; torch %s; %s\n"
              % (args.batch, args.size, args.size, args.threads, torch.__version__, cpu_model()))
        print("| memory format | batch norm, ReLU and adds: share of the original's forward + "
              "backward | least step time (of the original's) if they were free |")
        print("|---|---:|---:|")
        for fmt in args.formats.split(","):
            torch.manual_seed(0)
            share = bn_share(Trainer(ResNet18(), formats[fmt]), args)
            print("| %s | %.1f%% | %.3f |" % (fmt, 100 * share, 1 - share))
        return 0
    print("ResNet-18, batch %d, 3x%dx%d, %d threads, SGD; torch %s; %s"
          % (args.batch, args.size, args.size, args.threads, torch.__version__, cpu_model()))
    print("\n| memory format | check: first loss, first grads, losses (drop-in / fused) "
          "| rounding drift: grads, losses | torch ms | drop-in ms | fused ms | drop-in / torch "
          "| fused / torch |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    failed = False
    results = []
    for fmt in args.formats.split(","):
        torch.manual_seed(0)
        model = ResNet18()
        models = {"torch": model, "drop-in": ct.convert(copy.deepcopy(model)),
                  "fused": ct.convert(copy.deepcopy(model), fuse=True)}
        meter = CpuMeter()
        trainers = {k: Trainer(m, formats[fmt]) for k, m in models.items()}
        drift, worst = check(trainers, args)
        for name, (l1, g1, ls) in worst.items():
            if l1 > 1e-5 or g1 > max(1e-3, 4 * drift[1]) or ls > max(1e-3, 4 * drift[0]):
                failed = True
        times = timed(trainers, args)
        others = meter.others()
        note = "; %.1f other cores busy" % others if others and others > 0.2 else ""
        print("| %s | %s%s | %.1e, %.1e | %.0f | %.0f | %.0f | %.3f | %.3f |" % (
            fmt, " / ".join("%.1e, %.1e, %.1e" % tuple(worst[n]) for n in ("drop-in", "fused")),
            note, drift[1], drift[0], times["torch"] * 1e3, times["drop-in"] * 1e3, times["fused"] * 1e3,
            times["drop-in"] / times["torch"], times["fused"] / times["torch"]))
        sys.stdout.flush()
        results.append({"model": "ResNet-18", "memory_format": fmt, "other_cores_busy": others,
                        "median_s": times})
    if args.json:
        machine = {"cpu": cpu_model(), "threads": args.threads, "torch": torch.__version__,
                   "python": platform.python_version(), "date": datetime.date.today().isoformat(),
                   "command": shlex.join(["python"] + sys.argv)}
        with open(args.json, "w") as f:
            json.dump({"benchmark": "torch_resnet", "machine": machine,
                       "settings": {"batch": args.batch, "size": args.size, "steps": args.steps},
                       "results": results}, f, indent=1)
    if failed:
        print("\nCHECK FAILED: a converted model's first step or losses differ beyond "
              "1e-5 (loss), max(1e-3, 4 x the rounding drift) (gradients, relative to each "
              "tensor's largest element) or, over the next steps, max(1e-3, 4 x the "
              "rounding drift) (losses)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
