#!/usr/bin/env python
"""What a fused activation or side input costs beside the plain call.

    python benchmarks/fusion.py                      # 1 and 2 threads
    python benchmarks/fusion.py --threads 2 --repeat 9
    python benchmarks/fusion.py --shapes 32x7x7x512 --layouts NCHW

For the shapes (32,56,56,64) (32,28,28,128) (32,14,14,256) (8,32,32,32), as
NHWC and as NCHW (the same sizes, channels first), float32, it times the
training forward (cfbn.fused_batch_norm, running averages updated) and the
training gradient (cfbn.fused_batch_norm_grad) with each activation, and with
relu and a side input, against the same call without fusion, and prints
fused time / plain time per cell with the cell's target:

* relu, relu6, leaky_relu: 1.10;
* elu, sigmoid, tanh, silu: 1.3;
* relu with side_input: 1.10 times the ratio of the tensors a pass moves,
  4/3 forward (x twice and y, plus side) and 8/5 gradient (dy and x twice
  and dx, plus side twice and side_input_backprop).

Method: every output is preallocated (out=), so no call allocates.  Within
a cell the plain call and each fused call are timed alternately, a batch of
calls lasting at least --min-batch-ms each, the order flipping every repeat;
a ratio is the median over --repeat repeats of the ratio of two neighbouring
batches.  Progress goes to stderr.
"""
import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench_common as bc  # noqa: E402

import cfbn  # noqa: E402

SHAPES = [(32, 56, 56, 64), (32, 28, 28, 128), (32, 14, 14, 256), (8, 32, 32, 32)]

#: column label -> (activation, with a side input)
VARIANTS = {
    "relu": ("relu", False),
    "relu6": ("relu6", False),
    "leaky": ("leaky_relu", False),
    "elu": ("elu", False),
    "sigmoid": ("sigmoid", False),
    "tanh": ("tanh", False),
    "silu": ("silu", False),
    "add+relu": ("relu", True),
}

#: the tensors a pass reads and writes, with a side input and without
TRAFFIC = {"train": (4, 3), "grad": (8, 5)}


def target(op, label):
    act, side = VARIANTS[label]
    if side:
        with_side, plain = TRAFFIC[op]
        return 1.10 * with_side / plain
    return 1.10 if act in ("relu", "relu6", "leaky_relu") else 1.3


def parse_shape(text):
    """'32x7x7x512' -> (32, 7, 7, 512)"""
    try:
        shape = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) < 1:
        raise argparse.ArgumentTypeError("expected four positive sizes NxHxWxC, got %r" % text)
    return shape


def ratio(plain, fused, repeats, min_batch):
    """Median over `repeats` of fused / plain, from neighbouring batches."""
    cp, cf = bc.calls_for(plain, min_batch), bc.calls_for(fused, min_batch)
    ratios = []
    for r in range(repeats):
        if r % 2 == 0:
            tp = bc.batch(plain, cp)
            tf = bc.batch(fused, cf)
        else:
            tf = bc.batch(fused, cf)
            tp = bc.batch(plain, cp)
        ratios.append(tf / tp)
    return float(np.median(ratios))


def calls(op, d, side, threads):
    """The plain call and a function (activation, with_side) -> fused call,
    all with preallocated outputs."""
    layout = d["layout"]
    x, c = d["x"], d["shape"][3]
    vdt = d["scale"].dtype
    if op == "train":
        out = {"y": np.empty_like(x), "batch_mean": np.empty(c, vdt),
               "batch_variance": np.empty(c, vdt), "reserve_space_1": np.empty(c, vdt),
               "reserve_space_2": np.empty(c, vdt)}

        def run(**fusion):
            return cfbn.fused_batch_norm(
                x, d["scale"], d["offset"], d["mean"], d["variance"], epsilon=bc.EPSILON,
                exponential_avg_factor=bc.FACTOR, data_format=layout, is_training=True,
                n_threads=threads, out=out, **fusion)
    else:
        out = {"x_backprop": np.empty_like(x), "scale_backprop": np.empty(c, vdt),
               "offset_backprop": np.empty(c, vdt)}
        out_side = dict(out, side_input_backprop=np.empty_like(x))

        def run(**fusion):
            o = out_side if "side_input" in fusion else out
            if fusion:
                fusion = dict(fusion, offset=d["offset"])
            return cfbn.fused_batch_norm_grad(
                d["dy"], x, d["scale"], d["rs1"], d["rs2"], epsilon=bc.EPSILON,
                data_format=layout, is_training=True, n_threads=threads, out=o, **fusion)

    def fused(act, with_side):
        kw = {"activation": act}
        if with_side:
            kw["side_input"] = side
        return lambda: run(**kw)

    return (lambda: run()), fused


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=7, help="repeats per cell (default 7)")
    ap.add_argument("--min-batch-ms", type=float, default=15.0,
                    help="least duration of one timed batch (default 15)")
    ap.add_argument("--shapes", nargs="+", type=parse_shape, default=SHAPES, metavar="NxHxWxC",
                    help="shapes, as NHWC sizes (default: the four above)")
    ap.add_argument("--layouts", nargs="+", choices=bc.LAYOUTS, default=list(bc.LAYOUTS))
    args = ap.parse_args(argv)
    min_batch = args.min_batch_ms / 1e3

    info = cfbn.runtime_info()
    print("cfbn %s, kernels %s, OpenMP %s, float32, repeats %d" % (
        info["version"], info["selected_isa"], "on" if info["openmp"] else "off", args.repeat))
    print("fused time / plain time; target per column:")
    labels = list(VARIANTS)
    for op in ("train", "grad"):
        print("  %-5s %s" % (op, "  ".join("%s %.2f" % (lab, target(op, lab)) for lab in labels)))
    print()
    head = "%-16s %-4s %2s %-5s " % ("shape", "fmt", "t", "op") + " ".join("%9s" % lab for lab in labels)
    print(head)
    print("-" * len(head))

    held = total = 0
    worst = {}
    meter = bc.CpuMeter()
    for shape in args.shapes:
        for layout in args.layouts:
            d = bc.make_inputs(shape, layout)
            side = np.random.default_rng(1).standard_normal(d["x"].shape, dtype=np.float32)
            for threads in args.threads:
                for op in ("train", "grad"):
                    bc.log("%s %s %d threads %s" % (bc.shape_str(shape), layout, threads, op))
                    plain, fused = calls(op, d, side, threads)
                    cells = []
                    for lab in labels:
                        r = ratio(plain, fused(*VARIANTS[lab]), args.repeat, min_batch)
                        ok = r <= target(op, lab)
                        held += ok
                        total += 1
                        key = (op, lab)
                        if key not in worst or r > worst[key][0]:
                            worst[key] = (r, "%s %s t%d" % (bc.shape_str(shape), layout, threads))
                        cells.append("%6.3f %s" % (r, "ok" if ok else "NO"))
                    print("%-16s %-4s %2d %-5s " % (bc.shape_str(shape), layout, threads, op)
                          + " ".join("%9s" % c for c in cells), flush=True)
            del d, side
    print()
    print("%d of %d cells within their target" % (held, total))
    load = meter.others()
    if load is not None:
        print("other processes kept %.2f of %d cores busy meanwhile" % (load, os.cpu_count() or 0))
    print("largest ratio per column:")
    for op in ("train", "grad"):
        print("  %-5s %s" % (op, "  ".join(
            "%s %.3f (%s)" % (lab, worst[(op, lab)][0], worst[(op, lab)][1]) for lab in labels
            if (op, lab) in worst)))
    return 0 if held == total else 1


if __name__ == "__main__":
    sys.exit(main())
