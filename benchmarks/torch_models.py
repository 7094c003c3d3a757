"""Whole networks, measured: CPU training steps of torchvision's ResNet-18,
MobileNetV2 and EfficientNet-B0 under PyTorch and under cfbn.torch.

Each model is torchvision's code with random weights (``weights=None``:
nothing is downloaded), built once from seed 0; every variant starts from a
deep copy of those weights:

- ``eager``: PyTorch as written;
- ``compiled``: the same under ``torch.compile``;
- ``fused``: ``cfbn.torch.convert(copy, fuse=True)``, eager;
- ``fused+compiled``: that converted copy under ``torch.compile``.

Each trains with SGD (momentum 0.9, cross-entropy on random labels), in
contiguous (NCHW) and in channels_last memory.  Dropout and stochastic
depth are built with probability 0: they draw random numbers, which eager
and compiled code draw differently, and without them every variant's first
step can be checked against PyTorch's.  The check is that first step, on the
same batch: a converted variant whose loss differs from eager PyTorch's by
more than float32 rounding (1e-4 relative, or 4 times the drift of eager's
own loss when its weights move by 1e-7 relative, where that is larger) is
not timed and the script exits 1, so a broken conversion cannot show as a
fast one.  That first step also compiles the compiled variants; one more
step each warms up before timing.

Timing is interleaved, in one process: each round runs ``--steps`` steps of
every variant in turn (the order reversed every round), and a round's sample
is its mean step time.  The table gives the median and the least over the
rounds, and their ratios to eager and to compiled PyTorch.

The share of batch norm + activations + adds is measured on eager
PyTorch's step with torch.profiler: the self CPU time of ATen's batch-norm
ops, the activations (relu, hardtanh for ReLU6, silu, sigmoid, their
in-place forms and backwards) and add / add_ (the residual adds, and the
gradient sums autograd makes where a tensor feeds two branches), over the
profiled step's whole time.  The optimizer's own add_ calls are left out:
convert does not touch them.  1 minus the share bounds from below the step
time a free batch norm, activation and add would give.

Peak memory is the resident set (RSS) high-water mark, measured in a fresh
child process per variant, since one process's high-water mark would hold
every variant before it.  The child builds the model alike, runs two
warm-up steps (compiling where the variant compiles), resets the kernel's
high-water mark (``/proc/self/clear_refs``, Linux) and runs ``--steps``
steps: "peak RSS" is VmHWM over those steps, "step growth" that peak less
the RSS just before them (activations kept for backward, gradients: what
a step adds to the resident model, optimizer state and library code).
Where the mark cannot be reset, the child's whole-life ``ru_maxrss`` is
given instead and the JSON says so.  Memory runs come after the timing,
so the children do not disturb it.

    python benchmarks/torch_models.py [--models resnet18,mobilenet_v2,efficientnet_b0]
        [--memory-format both] [--batch 32] [--size 112] [--threads 2]
        [--rounds 5] [--steps 3] [--no-compile] [--no-memory] [--json FILE]
"""
import argparse
import copy
import datetime
import itertools
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys

import torch

import cfbn.torch as ct

from _bench_common import BUSY, CpuMeter, batch, log, machine_info
from torch_resnet import BN_OPS, Trainer, batches

MODELS = {
    "resnet18": ("ResNet-18", {}),
    "mobilenet_v2": ("MobileNetV2", {"dropout": 0.0}),
    "efficientnet_b0": ("EfficientNet-B0", {"dropout": 0.0, "stochastic_depth_prob": 0.0}),
}
FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}
VARIANTS = ("eager", "compiled", "fused", "fused+compiled")

# What convert(fuse=True) may take over beyond torch_resnet's ReLU and adds:
# ReLU6 runs as hardtanh, SiLU and the squeeze-excitation sigmoid as themselves.
SHARE_OPS = frozenset(BN_OPS + (
    "aten::batch_norm", "aten::_batch_norm_impl_index", "aten::native_batch_norm_backward",
    "aten::hardtanh", "aten::hardtanh_", "aten::hardtanh_backward",
    "aten::silu", "aten::silu_", "aten::silu_backward",
    "aten::sigmoid", "aten::sigmoid_", "aten::sigmoid_backward"))
STEP_MARK = "torch_models.step"
LOSS_RTOL = 1e-4


def torchvision():
    """torchvision, imported.  A torchvision built for another torch cannot
    load its compiled operators, and its import then fails registering fake
    kernels for two of them; the model code needs none, so their schemas are
    declared here and the import retried."""
    try:
        import torchvision as tv
    except RuntimeError:
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        torchvision.keep = lib  # the schemas live as long as this object
        import torchvision as tv
    return tv


def build(name):
    """Model `name` with seed 0's random weights: the same in every process."""
    torch.manual_seed(0)
    return getattr(torchvision().models, name)(weights=None, **MODELS[name][1])


def trainer(base, variant, fmt):
    """A Trainer of a deep copy of `base` as `variant`, in memory format `fmt`."""
    model = copy.deepcopy(base)
    if variant.startswith("fused"):
        model = ct.convert(model, fuse=True)
    t = Trainer(model, FORMATS[fmt])
    if variant.endswith("compiled"):
        # the optimizer holds the same parameters: compiling wraps, not copies
        t.model = torch.compile(t.model)
    return t


def stepper(t, data):
    """A zero-argument step of trainer `t` cycling through `data`."""
    it = itertools.cycle(data)
    return lambda: t.step(*next(it))


def check(base, trainers, fmt, data):
    """Each variant's first-step loss on data[0], its difference from eager
    PyTorch's, and the converted variants beyond the tolerance: LOSS_RTOL
    relative, or 4 times the rounding drift where that is larger (how far
    eager's loss moves when the weights move by 1e-7 relative: small batches
    and maps make batch statistics ill-conditioned).  Compiled PyTorch's
    difference is reported, not checked: it is PyTorch's own compiler, and
    on such small inputs it moves further than that."""
    losses = {name: t.step(*data[0])[0] for name, t in trainers.items()}
    nudged = copy.deepcopy(base)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in nudged.parameters():
            p.mul_(1 + 1e-7 * torch.randn(p.shape, generator=gen))
    ref = losses["eager"]
    drift = abs(Trainer(nudged, FORMATS[fmt]).step(*data[0])[0] - ref)
    tol = max(LOSS_RTOL * max(1.0, abs(ref)), 4 * drift)
    result = {name: {"first_loss": loss, "loss_diff": loss - ref, "loss_tolerance": tol}
              for name, loss in losses.items()}
    return result, [name for name, loss in losses.items()
                    if name.startswith("fused") and not abs(loss - ref) <= tol]


def timed(steps, rounds, per_round):
    """Per-step seconds of each of `steps` (name -> zero-argument step), one
    sample a round: the mean of `per_round` back-to-back steps."""
    names = list(steps)
    samples = {name: [] for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            samples[name].append(batch(steps[name], per_round))
    return samples


def _under_optimizer(event):
    while event is not None:
        if event.name.startswith("Optimizer.step"):
            return True
        event = event.cpu_parent
    return False


def bn_act_add_share(step, n):
    """The share of `n` profiled calls of `step` spent in SHARE_OPS (self CPU
    time, the optimizer's ops left out) and each op's milliseconds a step."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            with record_function(STEP_MARK):
                step()
    events = prof.events()
    total = sum(e.cpu_time_total for e in events if e.name == STEP_MARK)
    ops = {}
    for e in events:
        if e.name in SHARE_OPS and not _under_optimizer(e):
            ops[e.name] = ops.get(e.name, 0.0) + e.self_cpu_time_total
    share = sum(ops.values()) / total if total else float("nan")
    return share, {k: v / n / 1e3 for k, v in sorted(ops.items())}, total / n / 1e3


# ---------------------------------------------------------------- memory


def _status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def memory_child(args):
    """Runs in the child: one variant's steps, and its RSS figures as JSON."""
    t = trainer(build(args.models), args.child, args.memory_format)
    step = stepper(t, list(batches(2, args)))
    step()
    step()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the present RSS (Linux 4.0 on)
        rest = _status_kb("VmRSS")
        method = "VmHWM after reset"
    except (OSError, KeyError):
        rest, method = None, "ru_maxrss"
    for _ in range(args.steps):
        step()
    life_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak_kb = _status_kb("VmHWM") if rest is not None else life_kb
    print(json.dumps({
        "method": method,
        "peak_rss_mb": peak_kb / 1024,
        "step_growth_mb": (peak_kb - rest) / 1024 if rest is not None else None,
        "process_peak_rss_mb": life_kb / 1024,
    }))


def memory(name, fmt, variant, args):
    """memory_child's figures for one variant, from a fresh process."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", variant, "--models", name,
           "--memory-format", fmt, "--batch", str(args.batch), "--size", str(args.size),
           "--threads", str(args.threads), "--steps", str(args.steps)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        log(run.stderr[-2000:])
        return {"error": "memory child exited %d" % run.returncode}
    return json.loads(run.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- report


def measure(name, fmt, args, variants):
    """Every figure for model `name` in memory format `fmt`."""
    base = build(name)
    trainers = {v: trainer(base, v, fmt) for v in variants}
    data = list(batches(2, args))
    checked, failed = check(base, trainers, fmt, data)
    if failed:
        log("%s %s: CHECK FAILED for %s" % (name, fmt, ", ".join(failed)))
    steps = {v: stepper(t, data) for v, t in trainers.items() if v not in failed}
    for step in steps.values():
        step()
    meter = CpuMeter()
    samples = timed(steps, args.rounds, args.steps)
    others = meter.others()
    share, ops, profiled = bn_act_add_share(steps["eager"], args.steps)
    group = {"model": name, "memory_format": fmt, "other_cores_busy": others,
             "bn_act_add_share": share, "share_ops_ms": ops, "profiled_step_ms": profiled,
             "variants": {}}
    for v in variants:
        r = dict(checked[v], check_ok=v not in failed)
        if v in samples:
            r.update(samples_s=samples[v], median_s=statistics.median(samples[v]),
                     min_s=min(samples[v]))
        group["variants"][v] = r
    for ref in ("eager", "compiled"):
        if ref in samples:
            for r in group["variants"].values():
                if "median_s" in r:
                    r["median_vs_" + ref] = r["median_s"] / group["variants"][ref]["median_s"]
    if not args.no_memory:
        for v in variants:
            log("%s %s %s: peak memory in a child process" % (name, fmt, v))
            group["variants"][v]["memory"] = memory(name, fmt, v, args)
    return group


def rows(group, variants):
    for v in variants:
        r = group["variants"][v]
        mem = r.get("memory", {})
        if "peak_rss_mb" in mem:
            rss = "%.0f" % mem["peak_rss_mb"]
            if mem.get("step_growth_mb") is not None:
                rss += " (+%.0f)" % max(0.0, mem["step_growth_mb"])
        else:
            rss = mem.get("error", "")
        if "median_s" not in r:
            times = "CHECK FAILED: loss %+.2e | | |" % r["loss_diff"]
        else:
            times = "%.1f | %.1f | %s | %s" % (
                r["median_s"] * 1e3, r["min_s"] * 1e3,
                "%.3f" % r["median_vs_eager"] if "median_vs_eager" in r else "",
                "%.3f" % r["median_vs_compiled"] if "median_vs_compiled" in r else "")
        share = "%.1f%%" % (100 * group["bn_act_add_share"]) if v == "eager" else ""
        busy = group["other_cores_busy"]
        note = " (%.1f other cores busy)" % busy if v == "eager" and busy and busy > BUSY else ""
        diff = ("tolerance %.1e" % r["loss_tolerance"] if v == "eager"
                else "%+.1e" % r["loss_diff"])
        yield "| %s | %s | %s%s | %s | %s | %s | %s |" % (
            MODELS[group["model"]][0], group["memory_format"], v, note, times, diff, share, rss)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS),
                    help="comma-separated, of: %s" % ", ".join(MODELS))
    ap.add_argument("--memory-format", default="both", choices=("both",) + tuple(FORMATS))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=112, help="image height and width")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    ap.add_argument("--steps", type=int, default=3,
                    help="steps of each variant per round (and profiled, and in a memory run)")
    ap.add_argument("--no-compile", action="store_true",
                    help="eager PyTorch and eager fused only")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory children")
    ap.add_argument("--json", metavar="FILE", help="write every figure and the machine here")
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.child:
        memory_child(args)
        return 0
    names = args.models.split(",")
    for name in names:
        if name not in MODELS:
            ap.error("unknown model %r (known: %s)" % (name, ", ".join(MODELS)))
    formats = list(FORMATS) if args.memory_format == "both" else [args.memory_format]
    variants = [v for v in VARIANTS if not (args.no_compile and v.endswith("compiled"))]
    machine = dict(machine_info(), torchvision=torchvision().__version__,
                   date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                   command=shlex.join([sys.executable] + sys.argv))
    print("batch %d, 3x%dx%d, %d threads, SGD, %d rounds of %d steps; torch %s; %s\n" % (
        args.batch, args.size, args.size, args.threads, args.rounds, args.steps,
        torch.__version__, machine["cpu"]))
    print("| model | memory format | variant | median ms | min ms | / eager | / compiled "
          "| first loss - eager's | BN + act + add share | peak RSS MB (step growth) |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    groups = []
    for name in names:
        for fmt in formats:
            log("%s %s: check, then %d rounds" % (name, fmt, args.rounds))
            groups.append(measure(name, fmt, args, variants))
            for line in rows(groups[-1], variants):
                print(line)
            sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "settings": {
                "models": names, "memory_formats": formats, "variants": variants,
                "batch": args.batch, "size": args.size, "threads": args.threads,
                "rounds": args.rounds, "steps": args.steps},
                "results": groups}, f, indent=1)
    if any(not r["check_ok"] for g in groups for r in g["variants"].values()):
        print("\nCHECK FAILED: a variant's first-step loss differs from eager PyTorch's by "
              "more than float32 rounding explains (see the docstring); it was not timed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
