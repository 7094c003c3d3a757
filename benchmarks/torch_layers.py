"""Forward + backward of one batch-norm layer: torch.nn against cfbn.torch.

For each shape (compare.py's, as NCHW, and the smaller planes of a ResNet-18
at 112 px) and memory format (contiguous, channels_last), three forms:

- ``BN``: ``nn.BatchNorm2d`` against ``cfbn.torch.BatchNorm2d``;
- ``BN+ReLU``: ``torch.relu(nn.BatchNorm2d(x))`` against the module with
  ``activation="relu"``;
- ``BN+add+ReLU``: ``torch.relu(bn(x) + side)`` against
  ``forward(x, side_input=side)``.

Each call is a training forward (running statistics updated) and a backward
to x, the parameters and side; gradients are reset to None before each, so
no accumulation is timed.  Before timing, each pair's outputs and gradients
are compared (float32 rounding, relative to each tensor's largest element).
The two run alternately, batch by batch; the table shows median times and
the ratio cfbn / torch (below 1: cfbn faster), and says when other processes
loaded the CPUs meanwhile.  ``--compile`` adds a third contender, torch's
own layer under ``torch.compile`` (Inductor, compiled once per cell before
timing, untimed), alternating with the other two.  ``--json FILE`` writes
every cell and the machine for ``benchmarks/plot.py``.

    python benchmarks/torch_layers.py [--threads 2] [--repeats 5] [--shapes 32x64x56x56,...]
        [--forms BN,BN+add+ReLU] [--formats contiguous,channels_last] [--compile] [--json FILE]
"""
import argparse
import datetime
import json
import platform
import shlex
import statistics
import sys

import torch
import torch.nn as nn

import cfbn.torch as ct
from _bench_common import BUSY, SHAPES, CpuMeter, cpu_model, interleaved

RESNET_112 = [(32, 64, 28, 28), (32, 128, 14, 14), (32, 256, 7, 7), (32, 512, 4, 4)]
FORMS = ("BN", "BN+ReLU", "BN+add+ReLU")


def default_shapes():
    nchw = [(n, c, h, w) for n, h, w, c in SHAPES]
    return nchw + [s for s in RESNET_112 if s not in nchw]


class Case:
    """One shape, format and form: the torch and cfbn callables."""

    def __init__(self, shape, fmt, form):
        gen = torch.Generator().manual_seed(1)
        self.x = torch.randn(shape, generator=gen).to(memory_format=fmt).requires_grad_()
        self.side = torch.randn(shape, generator=gen).to(memory_format=fmt).requires_grad_()
        self.dy = torch.randn(shape, generator=gen).to(memory_format=fmt)
        c = shape[1]
        self.ref = nn.BatchNorm2d(c)
        self.ours = ct.BatchNorm2d(c, activation=None if form == "BN" else "relu")
        with torch.no_grad():
            for m in (self.ref, self.ours):
                m.weight.copy_(torch.linspace(0.5, 1.5, c))
                m.bias.copy_(torch.linspace(-0.2, 0.2, c))
        self.form = form

    def _inputs(self):
        return [self.x, self.side] if self.form == "BN+add+ReLU" else [self.x]

    def _clear(self, m):
        for t in self._inputs() + [m.weight, m.bias]:
            t.grad = None

    def torch_step(self):
        self._clear(self.ref)
        y = self.ref(self.x)
        if self.form == "BN+ReLU":
            y = torch.relu(y)
        elif self.form == "BN+add+ReLU":
            y = torch.relu(y + self.side)
        y.backward(self.dy)
        return y

    def compiled_step(self):
        """The torch step's forward under torch.compile (built on first use)."""
        if not hasattr(self, "_compiled"):
            ref, form = self.ref, self.form

            def fwd(x, side):
                y = ref(x)
                if form == "BN+ReLU":
                    y = torch.relu(y)
                elif form == "BN+add+ReLU":
                    y = torch.relu(y + side)
                return y
            # Every cell compiles the same function's code afresh: without a
            # reset, dynamo's per-code cache fills after a few cells and the
            # rest would silently run eager.
            torch._dynamo.reset()
            self._compiled = torch.compile(fwd, dynamic=False)
        self._clear(self.ref)
        y = self._compiled(self.x, self.side)
        y.backward(self.dy)
        return y

    def cfbn_step(self):
        self._clear(self.ours)
        side = self.side if self.form == "BN+add+ReLU" else None
        y = self.ours(self.x, side_input=side)
        y.backward(self.dy)
        return y

    def _kinks(self):
        """Elements whose pre-activation is within float32 rounding of ReLU's
        kink (computed in float64), where either may round to the other
        side: their dx and side gradients are not compared, and their share
        of the weight and bias gradients widens those bounds.  None without
        an activation."""
        if self.form == "BN":
            return None
        with torch.no_grad():
            x = self.x.double()
            mean = x.mean((0, 2, 3), keepdim=True)
            xhat = (x - mean) / (x.var((0, 2, 3), unbiased=False, keepdim=True) + self.ref.eps).sqrt()
            pre = xhat * self.ref.weight.double()[:, None, None] + self.ref.bias.double()[:, None, None]
            if self.form == "BN+add+ReLU":
                pre = pre + self.side.double()
            scale = max(float(pre.abs().max()), 1.0)
            return pre.abs() < 1e-5 * scale, xhat

    def check(self):
        """Largest difference of outputs and gradients, relative to each
        tensor's largest element (and the kinks' share of it)."""
        want = [self.torch_step().detach()] + [t.grad.clone() for t in self._inputs()] + [
            self.ref.weight.grad.clone(), self.ref.bias.grad.clone()]
        got = [self.cfbn_step().detach()] + [t.grad for t in self._inputs()] + [
            self.ours.weight.grad, self.ours.bias.grad]
        kinks = self._kinks()
        n_elem = 1 + len(self._inputs())
        worst = 0.0
        for i, (g, w) in enumerate(zip(got, want)):
            top = max(float(w.abs().max()), 1e-30)
            diff = (g - w).abs().double()
            slack = 0.0
            if kinks is not None and 0 < i < n_elem:
                diff = diff.masked_fill(kinks[0], 0.0)
            elif kinks is not None and i >= n_elem:
                # a flipped element moves a channel's weight gradient by
                # dy * xhat and its bias gradient by dy
                dy = self.dy.double().abs().masked_fill(~kinks[0], 0.0)
                share = dy * kinks[1].abs() if i == n_elem else dy
                slack = share.sum((0, 2, 3))
            worst = max(worst, float(((diff - slack).clamp(min=0.0)).max() / top))
        return worst


FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


def _names(text, allowed, what):
    names = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in names if v not in allowed]
    if bad:
        raise SystemExit("unknown %s %s; expected some of %s" % (what, ", ".join(bad), ", ".join(allowed)))
    return names


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5, help="alternating batches per cell")
    ap.add_argument("--min-batch-ms", type=float, default=30.0)
    ap.add_argument("--shapes", default="", help="NxCxHxW,... (default: compare.py's and ResNet-18's at 112 px)")
    ap.add_argument("--forms", default=",".join(FORMS), help="some of %s" % ", ".join(FORMS))
    ap.add_argument("--formats", default=",".join(FORMATS), help="some of %s" % ", ".join(FORMATS))
    ap.add_argument("--compile", action="store_true",
                    help="also time torch's layer under torch.compile (compiled once per cell)")
    ap.add_argument("--json", metavar="FILE", help="write every cell and the machine here")
    args = ap.parse_args(argv)
    forms = _names(args.forms, FORMS, "form")
    formats = _names(args.formats, FORMATS, "memory format")
    torch.set_num_threads(args.threads)
    shapes = ([tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
              if args.shapes else default_shapes())
    print("One batch-norm layer, forward + backward, float32, %d threads; torch %s; %s"
          % (args.threads, torch.__version__, cpu_model()))
    head = "| shape (N,C,H,W) | memory format | form | torch us | cfbn us | cfbn / torch |"
    rule = "|---|---|---|---:|---:|---:|"
    if args.compile:
        head += " compiled us | cfbn / compiled |"
        rule += "---:|---:|"
    print("\n" + head + " check |")
    print(rule + "---:|")
    meter = CpuMeter()
    worst = 0.0
    cells = []
    for shape in shapes:
        for fname in formats:
            for form in forms:
                case = Case(shape, FORMATS[fname], form)
                err = case.check()
                worst = max(worst, err)
                fns = [case.torch_step, case.cfbn_step]
                if args.compile:
                    case.compiled_step()          # compile outside the timing
                    fns.append(case.compiled_step)
                samples = interleaved(fns, args.repeats, args.min_batch_ms / 1e3)
                ts, cs = samples[0], samples[1]
                cell = {"shape": list(shape), "format": fname, "form": form,
                        "torch_s": statistics.median(ts), "cfbn_s": statistics.median(cs),
                        "ratio": statistics.median([c / t for t, c in zip(ts, cs)]), "check": err}
                line = "| %s | %s | %s | %.0f | %.0f | %.2f |" % (
                    ",".join(map(str, shape)), fname, form, cell["torch_s"] * 1e6,
                    cell["cfbn_s"] * 1e6, cell["ratio"])
                if args.compile:
                    ks = samples[2]
                    cell["compiled_s"] = statistics.median(ks)
                    cell["ratio_compiled"] = statistics.median([c / k for k, c in zip(ks, cs)])
                    line += " %.0f | %.2f |" % (cell["compiled_s"] * 1e6, cell["ratio_compiled"])
                cells.append(cell)
                print(line + " %.1e |" % err)
                sys.stdout.flush()
    others = meter.others()
    if others is not None and others > BUSY:
        print("\nwarning: other processes used %.1f CPUs meanwhile; the ratios are not reliable" % others)
    if args.json:
        machine = {"cpu": cpu_model(), "threads": args.threads, "torch": torch.__version__,
                   "python": platform.python_version(),
                   "date": datetime.date.today().isoformat(), "others_cpus": others,
                   "command": shlex.join(["python"] + sys.argv)}
        with open(args.json, "w") as f:
            json.dump({"benchmark": "torch_layers", "machine": machine,
                       "settings": {"repeats": args.repeats, "min_batch_ms": args.min_batch_ms,
                                    "compile": args.compile},
                       "cells": cells}, f, indent=1)
    if worst > 1e-3:
        print("\nCHECK FAILED: a cfbn output or gradient differs from torch's by %.1e of its "
              "largest element" % worst)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
