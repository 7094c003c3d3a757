#!/usr/bin/env python
"""cfbn against PyTorch's CPU batch norm on the performance targets.

    python benchmarks/compare.py                 # full run
    python benchmarks/compare.py --quick         # fewer repeats
    python benchmarks/compare.py --markdown-out results.md
    python benchmarks/compare.py --json results.json   # every figure, for benchmarks/plot.py
    python benchmarks/compare.py --only-grad-grad --quick

Prints a markdown report:

* every target cell -- shapes (32,56,56,64) (32,28,28,128) (32,14,14,256)
  (32,7,7,512) (8,32,32,32) (1,8,8,16), layouts NHWC and NCHW, training
  forward (running averages updated, factor 0.1), inference forward and
  training gradient, 1 and 2 threads -- with cfbn's and PyTorch's time, the
  ratio cfbn/PyTorch and the effective bandwidth (minimal bytes / time:
  forward 2 x bytes(x), gradient 3 x bytes(x)); then the geometric mean of
  the ratios and the largest ratio;
* the large tensor (64,112,112,64) at 2 threads: effective bandwidth of the
  three ops as a fraction of the copy bandwidth timed interleaved with
  each row's calls (np.copyto, and torch's copy_ at 2 threads);
* the per-call overhead on (1,8,8,16);
* bfloat16 (ml_dtypes.bfloat16, float32 per-channel vectors): training
  forward and gradient of every target shape and the large tensor, both
  layouts, 2 threads, with cfbn's float32 and PyTorch's bfloat16 (mixed
  type: float32 weight and statistics, as ``torch.autocast`` keeps them)
  timed alongside: cfbn's speed-up over its own float32 and its ratio to
  PyTorch;
* the second-order gradient in training (cfbn.fused_batch_norm_grad_grad),
  float32, every target shape, both layouts, --threads: its time beside
  cfbn's gradient on the same inputs (target: at most 1.5 times), beside
  PyTorch's double backward through torch.nn.functional.batch_norm
  (contiguous for NCHW, channels_last for NHWC; the first-order graph is
  built once, untimed, and each call runs its backward), and beside the
  float64 NumPy reference on the shapes up to 2^20 elements; effective
  bandwidth 5 x bytes(x) (dy, x and ggx read, ddy and dx written) / time
  against a copy of bytes(x) timed with it.  Before timing, cfbn's and
  PyTorch's second-order gradients are checked against each other once in
  float64 and in every cell in float32.

Method: cfbn and PyTorch run in this one process on the same NumPy memory
(torch.from_numpy; NHWC is the channels_last view), alternately: each repeat
times a batch of calls lasting at least --min-batch-ms for one and then the
other, in alternating order, after a warm-up.  Times are medians over the
repeats; a cell's ratio is the median of the per-repeat ratios, each taken
from two neighbouring batches.  Before a cell is timed, its cfbn and PyTorch
outputs are checked against each other.  Progress goes to stderr.
--only-bf16 and --only-grad-grad run their sections alone (or together);
--no-bf16 and --no-grad-grad skip them.
"""
import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench_common as bc  # noqa: E402

import cfbn  # noqa: E402

TARGET_GEOMEAN = 0.6
TARGET_MAX_RATIO = 1.05
TARGET_FRACTION = {"infer": 0.8, "train": 0.55, "grad": 0.5}
TARGET_OVERHEAD_US = 3.0

#: Largest normalized difference between cfbn's and PyTorch's outputs
#: (max |a - b| / max |b|) accepted as the same computation in float32.
CHECK_TOLERANCE = 2e-4
#: ... and with bfloat16 tensors: a few of bfloat16's 2^-8 rounding units.
CHECK_TOLERANCE_2BYTE = 2e-2
#: bfloat16 against cfbn's float32 on the large tensor: at least this speed-up.
TARGET_BF16_SPEEDUP = 1.6
#: cfbn's grad-grad against its gradient on the same inputs: at most this
#: time ratio (it reads three tensors and writes two, the gradient reads two
#: and writes one).
TARGET_GRAD_GRAD_RATIO = 1.5
#: float64 differences from PyTorch: rounding only.
CHECK_TOLERANCE_FLOAT64 = 1e-12
#: The shape of the float64 check of the second-order gradient.
GRAD_GRAD_CHECK_SHAPE = (4, 5, 5, 8)


class Retries:
    """Re-measures a cell while other processes loaded the CPUs, within a
    total time budget; keeps the attempt with the least foreign load."""

    def __init__(self, count, threshold, budget_s):
        self.count, self.threshold, self.left = count, threshold, budget_s

    def measure(self, fns, repeats, min_batch):
        best = None
        for attempt in range(1 + self.count):
            start = time.perf_counter()
            meter = bc.CpuMeter()
            samples = bc.interleaved(fns, repeats, min_batch)
            load = meter.others()
            if attempt:
                self.left -= time.perf_counter() - start
            if best is None or (load is not None and load < best[1]):
                best = (samples, load)
            if load is None or load <= self.threshold or self.left <= 0 or attempt == self.count:
                break
            bc.log("    other processes used %.2f cores meanwhile; measuring again" % load)
        return best


def median(v):
    return float(np.median(np.asarray(v, dtype=np.float64)))


def geomean(v):
    return math.exp(sum(math.log(q) for q in v) / len(v))


def target_shapes(args):
    return [s for s in bc.SHAPES if not args.shapes or bc.shape_str(s) in args.shapes]


# ---------------------------------------------------------------- checks


def _err(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return math.inf
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    if b.size == 0:
        return 0.0
    return float(np.max(np.abs(a - b))) / max(scale, 1e-30)


def check_cell(torch, op, d, threads):
    """cfbn and PyTorch compute the same thing on `d`: their outputs agree.

    Returns the largest normalized difference; raises SystemExit otherwise.
    """
    layout = d["layout"]
    t = bc.torch_args(torch, d)  # fresh running statistics
    r = bc.cfbn_call(op, d, threads)()
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        p = bc.torch_call(torch, op, t)()
    finally:
        torch.set_num_threads(prev)
    if op in bc.FIELDS:
        pairs = bc.paired_outputs(op, r, p, layout)
    else:
        pairs = [("y", r.y, bc.torch_to_numpy(p[0], layout))]
        if op == "train":
            invstd = 1.0 / np.sqrt(r.reserve_space_2.astype(np.float64) + bc.EPSILON)
            pairs += [("running mean", r.batch_mean, t["running_mean"].numpy()),
                      ("running variance", r.batch_variance, t["running_var"].numpy()),
                      ("batch mean", r.reserve_space_1, p[1].numpy()),
                      ("batch inverse std", invstd, p[2].numpy())]
    worst = 0.0
    tolerance = {8: CHECK_TOLERANCE_FLOAT64, 4: CHECK_TOLERANCE}.get(d["x"].dtype.itemsize,
                                                                   CHECK_TOLERANCE_2BYTE)
    for name, a, b in pairs:
        e = _err(a, b)
        worst = max(worst, e)
        if not e <= tolerance:
            raise SystemExit(
                "compare.py: cfbn and PyTorch disagree on %s %s %s %s threads=%d, %s: "
                "normalized max difference %.3g > %.3g; timing them would compare different "
                "computations" % (bc.LABELS[op], d["x"].dtype, layout, bc.shape_str(d["shape"]),
                                  threads, name, e, tolerance))
    return worst


# ---------------------------------------------------------------- sections


def fmt_us(seconds):
    us = seconds * 1e6
    if us < 100:
        return "%.2f" % us
    if us < 10000:
        return "%.1f" % us
    return "%.0f" % us


def fmt_load(load):
    return "?" if load is None else "%.2f" % load


def fmt_ms(seconds):
    return "%.2f" % (seconds * 1e3)


def table_head(w, columns, left):
    """Writes a markdown table's header: `columns`' titles, the first `left`
    aligned left, the others (numbers) right."""
    w("| " + " | ".join(columns) + " |")
    w("|" + "|".join("---" if i < left else "--:" for i in range(len(columns))) + "|")


def measure_cell(args, torch, op, d, threads, fns, extra=(), repeats=None):
    """Times the cfbn calls `fns`, then (where PyTorch is installed) PyTorch's
    `op` on the inputs `d` at `threads` threads, then the calls `extra`, all
    interleaved; first checks that cfbn and PyTorch agree on `d`.  Returns
    (samples in that order, others' load, the check's difference or None)."""
    fns = list(fns)
    check = None
    prev = None
    if torch is not None:
        check = check_cell(torch, op, d, threads)
        fns.append(bc.torch_call(torch, op, bc.torch_args(torch, d)))
        prev = torch.get_num_threads()
        torch.set_num_threads(threads)
    try:
        samples, load = args.retry.measure(fns + list(extra), repeats or args.repeats,
                                           args.min_batch)
    finally:
        if prev is not None:
            torch.set_num_threads(prev)
    return samples, load, check


def target_cells(args, torch):
    """Times every target cell; returns the result rows."""
    rows = []
    shapes = target_shapes(args)
    total = len(shapes) * len(bc.LAYOUTS) * len(bc.OPS) * len(args.threads)
    done = 0
    for shape in shapes:
        for layout in bc.LAYOUTS:
            d = bc.make_inputs(shape, layout)
            nbytes = d["x"].nbytes
            for op in bc.OPS:
                for threads in args.threads:
                    done += 1
                    samples, load, check = measure_cell(
                        args, torch, op, d, threads, [bc.cfbn_call(op, d, threads)])
                    row = {"shape": shape, "layout": layout, "op": op, "threads": threads,
                           "bytes": nbytes, "cfbn": median(samples[0]), "check": check,
                           "load": load}
                    row["cfbn_gbps"] = bc.gbps(op, nbytes, row["cfbn"])
                    if torch is not None:
                        row["torch"] = median(samples[1])
                        row["torch_gbps"] = bc.gbps(op, nbytes, row["torch"])
                        row["ratio"] = median([a / b for a, b in zip(samples[0], samples[1])])
                    rows.append(row)
                    bc.log("[%d/%d] %s %s %s t%d: cfbn %s us%s; others' load %s" % (
                        done, total, bc.shape_str(shape), layout, op, threads,
                        fmt_us(row["cfbn"]),
                        "" if torch is None else ", torch %s us, ratio %.3f"
                        % (fmt_us(row["torch"]), row["ratio"]), fmt_load(load)))
            del d
    return rows


def copy_calls(torch, nbytes):
    """Copies of a `nbytes` float32 array, by name: into an existing array
    (np.copyto; torch's dst.copy_(src), which the caller runs at 2 threads)
    and, for context, into a fresh array each time (np.copy, torch clone),
    which pay for the new pages as a plain cfbn call with the output cache
    off pays for its outputs.  Returns (into existing, into fresh)."""
    src = np.random.default_rng(1).standard_normal(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    into = {"np.copyto (1 thread)": lambda: np.copyto(dst, src)}
    fresh = {"np.copy (1 thread)": lambda: np.copy(src)}
    if torch is not None:
        ts, td = torch.from_numpy(src), torch.from_numpy(dst)
        into["torch copy_ (2 threads)"] = lambda: td.copy_(ts)
        fresh["torch clone (2 threads)"] = lambda: ts.clone()
    return into, fresh


def copy_bandwidth(torch, calls, nbytes, repeats, retry):
    """Bandwidth (2 x bytes / time) of each copy in `calls` (name: fn) of a
    `nbytes` array, torch at 2 threads; returns {name: GB/s}."""
    fns = list(calls.values())
    prev = None
    if torch is not None:
        prev = torch.get_num_threads()
        torch.set_num_threads(2)
    try:
        samples, load = retry.measure(fns, repeats, 0.02)
    finally:
        if prev is not None:
            torch.set_num_threads(prev)
    bc.log("  others' load %s" % fmt_load(load))
    return {name: 2 * nbytes / median(v) / 1e9 for name, v in zip(calls, samples)}


def large_section(args, torch):
    shape = bc.LARGE_SHAPE
    threads = 2
    nbytes = shape[0] * shape[1] * shape[2] * shape[3] * 4
    bc.log("copy bandwidth on %.0f MB ..." % (nbytes / 1e6))
    into, into_fresh = copy_calls(torch, nbytes)
    measured = copy_bandwidth(torch, {**into, **into_fresh}, nbytes, args.large_repeats, args.retry)
    copy = {name: measured[name] for name in into}
    fresh = {name: measured[name] for name in into_fresh}
    copy_name, copy_bw = max(copy.items(), key=lambda kv: kv[1])
    # Each cell is measured interleaved with the copies, and its fraction is
    # taken against the copy bandwidth of that same measurement: on a shared
    # machine the bandwidth two threads get moves between minutes.
    copies = list(into.values())
    rows = []
    for layout in bc.LAYOUTS:
        bc.log("large tensor %s %s: inputs ..." % (bc.shape_str(shape), layout))
        d = bc.make_inputs(shape, layout)
        for op in bc.OPS:
            out = bc.cfbn_out(op, d)
            fns = [bc.cfbn_call(op, d, threads), bc.cfbn_call(op, d, threads, out=out)]
            samples, load, check = measure_cell(args, torch, op, d, threads, fns, extra=copies,
                                                repeats=args.large_repeats)
            n_ops = len(samples) - len(copies)
            # the plain call again with the output cache off: each output a
            # fresh mapping (measured apart, since turning the cache off empties it)
            old_limit = cfbn.set_output_cache_limit(0)
            try:
                nocache, _ = args.retry.measure(fns[:1], args.large_repeats, args.min_batch)
            finally:
                cfbn.set_output_cache_limit(old_limit)
            row = {"layout": layout, "op": op, "cfbn": median(samples[0]),
                   "cfbn_out": median(samples[1]), "cfbn_nocache": median(nocache[0]),
                   "check": check, "load": load}
            row["cfbn_gbps"] = bc.gbps(op, d["x"].nbytes, row["cfbn"])
            row["cfbn_out_gbps"] = bc.gbps(op, d["x"].nbytes, row["cfbn_out"])
            row["copy_gbps"] = max(2 * nbytes / median(samples[k]) / 1e9
                                   for k in range(n_ops, len(samples)))
            row["fraction"] = row["cfbn_gbps"] / row["copy_gbps"]
            row["out_fraction"] = row["cfbn_out_gbps"] / row["copy_gbps"]
            row["nocache_fraction"] = (bc.gbps(op, d["x"].nbytes, row["cfbn_nocache"])
                                       / row["copy_gbps"])
            if torch is not None:
                row["torch"] = median(samples[2])
                row["torch_gbps"] = bc.gbps(op, d["x"].nbytes, row["torch"])
            rows.append(row)
            bc.log("  %s: copy %.2f GB/s; cfbn %.2f GB/s (%.2f of copy), out= %.2f GB/s, "
                "cache off %.2f of copy%s" % (
                op, row["copy_gbps"], row["cfbn_gbps"], row["fraction"], row["cfbn_out_gbps"],
                row["nocache_fraction"],
                "" if torch is None else ", torch %.2f GB/s" % row["torch_gbps"]))
            del out
        del d
    return copy, fresh, copy_name, copy_bw, rows


def overhead_section(args, torch):
    """Per-call time of the smallest target shape: median over many repeats."""
    d = bc.make_inputs(bc.TINY_SHAPE, "NHWC")
    x, s, o, m, v = d["x"], d["scale"], d["offset"], d["mean"], d["variance"]
    fbn, grad = cfbn.fused_batch_norm, cfbn.fused_batch_norm_grad
    calls = [
        ("fused_batch_norm(x, scale, offset): training, defaults",
         lambda: fbn(x, s, o), "plain"),
        ("training, running averages (exponential_avg_factor=0.1)",
         lambda: fbn(x, s, o, m, v, exponential_avg_factor=0.1), "train"),
        ("inference (is_training=False)",
         lambda: fbn(x, s, o, m, v, is_training=False), "infer"),
        ("fused_batch_norm_grad, training",
         lambda: grad(d["dy"], x, s, d["rs1"], d["rs2"]), "grad"),
    ]
    rows = []
    t = bc.torch_args(torch, d) if torch is not None else None
    for label, fn, op in calls:
        fns = [fn]
        if torch is not None:
            if op == "plain":
                aten = torch.ops.aten
                fns.append(lambda: aten.native_batch_norm(t["x"], t["weight"], t["bias"], None,
                                                          None, True, bc.FACTOR, bc.EPSILON))
            else:
                fns.append(bc.torch_call(torch, op, t))
        samples, load = args.retry.measure(fns, args.overhead_repeats, args.min_batch)
        row = {"label": label, "op": op, "cfbn": median(samples[0]), "load": load}
        if torch is not None:
            row["torch"] = median(samples[1])
        rows.append(row)
        bc.log("overhead %s: cfbn %.2f us%s" % (op, row["cfbn"] * 1e6, "" if torch is None
                                              else ", torch %.2f us" % (row["torch"] * 1e6)))
    return rows


def bf16_section(args, torch):
    """bfloat16 training forward and gradient, 2 threads: cfbn bfloat16, cfbn
    float32 and PyTorch bfloat16 timed interleaved on the same values."""
    import ml_dtypes

    threads = 2
    shapes = target_shapes(args)
    if not args.no_large:
        shapes.append(bc.LARGE_SHAPE)
    rows = []
    for shape in shapes:
        for layout in bc.LAYOUTS:
            d16 = bc.make_inputs(shape, layout, dtype=ml_dtypes.bfloat16)
            d32 = bc.make_inputs(shape, layout)
            for op in ("train", "grad"):
                fns = [bc.cfbn_call(op, d16, threads), bc.cfbn_call(op, d32, threads)]
                samples, load, check = measure_cell(args, torch, op, d16, threads, fns)
                row = {"shape": shape, "layout": layout, "op": op, "bf16": median(samples[0]),
                       "f32": median(samples[1]), "check": check, "load": load,
                       "large": shape == bc.LARGE_SHAPE,
                       "speedup": median([b / a for a, b in zip(samples[0], samples[1])]),
                       "gbps": bc.gbps(op, d16["x"].nbytes, median(samples[0]))}
                if torch is not None:
                    row["torch"] = median(samples[2])
                    row["ratio"] = median([a / b for a, b in zip(samples[0], samples[2])])
                rows.append(row)
                bc.log("bfloat16 %s %s %s: cfbn %s us, float32 %s us (x%.2f)%s; others' load %s" % (
                    bc.shape_str(shape), layout, op, fmt_us(row["bf16"]), fmt_us(row["f32"]),
                    row["speedup"], "" if torch is None else ", torch %s us, ratio %.3f"
                    % (fmt_us(row["torch"]), row["ratio"]), fmt_load(load)))
            del d16, d32
    return rows


def bf16_report(w, rows, torch, summary):
    w("")
    w("### bfloat16, 2 threads")
    w("")
    w("cfbn's bfloat16 beside its float32 on the same values, and PyTorch's bfloat16 batch norm "
      "(float32 weight and statistics); speed-up = cfbn float32 time / cfbn bfloat16 time, "
      "GB/s = minimal bytes of the bfloat16 tensors / time.")
    w("")
    table_head(w, ["shape", "layout", "op", "cfbn bf16 µs", "cfbn f32 µs", "speed-up",
                   "bf16 GB/s"]
               + (["PyTorch bf16 µs", "cfbn/PyTorch"] if torch is not None else [])
               + ["others' load"], 3)
    for r in rows:
        cells = ["(%s)" % ",".join(map(str, r["shape"])), r["layout"], bc.OPS[r["op"]],
                 fmt_us(r["bf16"]), fmt_us(r["f32"]), "%.2f" % r["speedup"], "%.2f" % r["gbps"]]
        if torch is not None:
            ratio = "%.3f" % r["ratio"]
            cells += [fmt_us(r["torch"]), ratio if r["ratio"] < 1.0 else "**%s**" % ratio]
        cells.append(fmt_load(r["load"]))
        w("| " + " | ".join(cells) + " |")
    for r in rows:
        if r["large"]:
            summary.append(("bfloat16 large %s %s speed-up %.2f >= %.1f" % (
                r["layout"], bc.OPS[r["op"]], r["speedup"], TARGET_BF16_SPEEDUP),
                r["speedup"] >= TARGET_BF16_SPEEDUP))
    if torch is not None and rows:
        worst = max(rows, key=lambda r: r["ratio"])
        w("")
        w("Largest cfbn/PyTorch ratio in bfloat16: **%.3f** at (%s) %s %s" % (
            worst["ratio"], ",".join(map(str, worst["shape"])), worst["layout"],
            bc.OPS[worst["op"]]))
        summary.append(("bfloat16 largest ratio to PyTorch %.3f < 1" % worst["ratio"],
                        worst["ratio"] < 1.0))


def grad_grad_section(args, torch):
    """The second-order gradient in training, float32: for every target cell,
    cfbn grad-grad, cfbn gradient on the same inputs, PyTorch's double
    backward, copies of x's size and (on the smaller shapes) the reference,
    all interleaved.  Returns (the float64 check's difference or None, rows)."""
    check64 = None
    if torch is not None:
        # once in float64, where only rounding separates the two: the
        # double backward timed below is the computation cfbn's grad-grad does
        check64 = max(check_cell(torch, "gradgrad", bc.add_upstream(bc.make_inputs(
            GRAD_GRAD_CHECK_SHAPE, layout, dtype=np.float64)), 1) for layout in bc.LAYOUTS)
        bc.log("grad-grad: cfbn and PyTorch agree in float64 (normalized difference %.2g)"
               % check64)
    rows = []
    for shape in target_shapes(args):
        nbytes = bc.elements(shape) * np.dtype(bc.DTYPE).itemsize
        copies = list(copy_calls(torch, nbytes)[0].values())
        with_reference = bc.elements(shape) <= bc.REFERENCE_MAX_ELEMENTS
        for layout in bc.LAYOUTS:
            d = bc.add_upstream(bc.make_inputs(shape, layout))
            for threads in args.threads:
                fns = [bc.cfbn_call("gradgrad", d, threads), bc.cfbn_call("grad", d, threads)]
                extra = copies + ([bc.reference_call("gradgrad", d)] if with_reference else [])
                samples, load, check = measure_cell(args, torch, "gradgrad", d, threads, fns,
                                                    extra=extra)
                k = len(fns) + (torch is not None)
                row = {"shape": shape, "layout": layout, "threads": threads,
                       "gg": median(samples[0]), "grad": median(samples[1]),
                       "ratio": median([a / b for a, b in zip(samples[0], samples[1])]),
                       "copy_gbps": max(2 * nbytes / median(v) / 1e9
                                        for v in samples[k:k + len(copies)]),
                       "reference": median(samples[-1]) if with_reference else None,
                       "check": check, "load": load}
                row["gbps"] = bc.gbps("gradgrad", nbytes, row["gg"])
                if torch is not None:
                    row["torch"] = median(samples[2])
                    row["torch_ratio"] = median([a / b for a, b in zip(samples[0], samples[2])])
                rows.append(row)
                bc.log("grad-grad %s %s t%d: %s us, gradient %s us (x%.2f), %.2f GB/s (copy "
                       "%.2f)%s; others' load %s" % (
                           bc.shape_str(shape), layout, threads, fmt_us(row["gg"]),
                           fmt_us(row["grad"]), row["ratio"], row["gbps"], row["copy_gbps"],
                           "" if torch is None else ", torch %s us, ratio %.3f"
                           % (fmt_us(row["torch"]), row["torch_ratio"]), fmt_load(load)))
            del d
    return check64, rows


def grad_grad_report(w, section, torch, summary):
    check64, rows = section
    w("")
    w("### Second-order gradient (grad-grad), float32, training")
    w("")
    w("cfbn's `fused_batch_norm_grad_grad` beside its `fused_batch_norm_grad` on the same "
      "inputs (target: grad-grad / gradient <= %.1f); GB/s = 5 x bytes(x) / time (dy, x, ggx "
      "read, ddy, dx written) beside a copy of bytes(x) timed with it (2 x bytes / time: "
      "np.copyto%s)%s; the NumPy float64 reference on shapes up to %d elements." % (
          TARGET_GRAD_GRAD_RATIO,
          "" if torch is None else ", or torch's copy_ at the cell's threads where faster",
          "" if torch is None else "; PyTorch: autograd's double backward through "
          "torch.nn.functional.batch_norm (NCHW contiguous, NHWC channels_last), only the "
          "backward of the first-order graph timed", bc.REFERENCE_MAX_ELEMENTS))
    w("")
    table_head(w, ["shape", "layout", "threads", "grad-grad µs", "gradient µs",
                   "grad-grad/gradient", "GB/s", "copy GB/s"]
               + (["PyTorch µs", "cfbn/PyTorch"] if torch is not None else [])
               + ["reference µs", "others' load"], 2)
    for r in rows:
        ratio = "%.3f" % r["ratio"]
        cells = ["(%s)" % ",".join(map(str, r["shape"])), r["layout"], str(r["threads"]),
                 fmt_us(r["gg"]), fmt_us(r["grad"]),
                 ratio if r["ratio"] <= TARGET_GRAD_GRAD_RATIO else "**%s**" % ratio,
                 "%.2f" % r["gbps"], "%.2f" % r["copy_gbps"]]
        if torch is not None:
            tr = "%.3f" % r["torch_ratio"]
            cells += [fmt_us(r["torch"]), tr if r["torch_ratio"] < 1.0 else "**%s**" % tr]
        cells += ["-" if r["reference"] is None else fmt_us(r["reference"]), fmt_load(r["load"])]
        w("| " + " | ".join(cells) + " |")
    if not rows:
        return
    met = sum(r["ratio"] <= TARGET_GRAD_GRAD_RATIO for r in rows)
    worst = max(rows, key=lambda r: r["ratio"])
    line = ("Grad-grad within %.1f x the gradient in **%d of %d** cells; geometric mean "
            "grad-grad/gradient **%.3f**, largest %.3f at (%s) %s, %d thread(s)" % (
                TARGET_GRAD_GRAD_RATIO, met, len(rows), geomean([r["ratio"] for r in rows]),
                worst["ratio"], ",".join(map(str, worst["shape"])), worst["layout"],
                worst["threads"]))
    summary.append(("grad-grad <= %.1f x gradient in %d of %d cells"
                    % (TARGET_GRAD_GRAD_RATIO, met, len(rows)), met == len(rows)))
    if torch is not None:
        beat = sum(r["torch_ratio"] < 1.0 for r in rows)
        line += ("; faster than PyTorch's double backward in **%d of %d** cells (geometric "
                 "mean cfbn/PyTorch %.3f)" % (beat, len(rows),
                                               geomean([r["torch_ratio"] for r in rows])))
        summary.append(("grad-grad faster than PyTorch in %d of %d cells" % (beat, len(rows)),
                        beat == len(rows)))
    w("")
    w(line + ".")
    if check64 is not None:
        checks = [r["check"] for r in rows]
        w("")
        w("Second-order gradients checked against PyTorch's: in float64 on (%s), normalized "
          "difference %.2g (limit %.0g); in float32 in every cell before timing, largest %.2g "
          "(limit %.0g)." % (",".join(map(str, GRAD_GRAD_CHECK_SHAPE)), check64,
                             CHECK_TOLERANCE_FLOAT64, max(checks), CHECK_TOLERANCE))


# ---------------------------------------------------------------- report


def machine_line(info):
    return ("Machine: %s, %d cores usable (%d online), ISA %s, OpenMP %s (max threads %d), "
            "output cache %d MiB; cfbn %s, NumPy %s, PyTorch %s, Python %s" % (
                info["cpu"], info["cores"], info["cpu_count"], info["isa"],
                "on" if info["openmp"] else "off", info["max_threads"], info["output_cache_mb"],
                info["cfbn"],
                info["numpy"], info["torch"] or "not installed", info["python"]))


def verdict(ok):
    return "pass" if ok else "**FAIL**"


def report(args, info, torch, rows, large, overhead, bf16, grad_grad, elapsed, load):
    out = []
    w = out.append
    w("## cfbn vs PyTorch: float32, bfloat16, second-order gradient")
    w("")
    w(machine_line(info))
    w("")
    w("Run: %s, %d repeats per cell (batches of >= %.0f ms%s), medians; load average %s "
      "at start, %s at end; %.0f s in all."
      % ("quick" if args.quick else "full", args.repeats, args.min_batch * 1e3,
         ", cfbn and PyTorch alternating" if torch is not None else "",
         load[0], load[1], elapsed))
    if torch is None:
        w("")
        w("PyTorch not installed (or --no-torch): cfbn's times only, no ratios.")
    summary = []

    if rows:
        w("")
        w("### Target shapes (N,H,W,C)")
        w("")
        if torch is not None:
            w("| shape | layout | op | threads | cfbn µs | PyTorch µs | cfbn/PyTorch "
              "| cfbn GB/s | PyTorch GB/s | others' load |")
            w("|---|---|---|--:|--:|--:|--:|--:|--:|--:|")
        else:
            w("| shape | layout | op | threads | cfbn µs | cfbn GB/s | others' load |")
            w("|---|---|---|--:|--:|--:|--:|")
        for r in rows:
            cells = ["(%s)" % ",".join(map(str, r["shape"])), r["layout"], bc.OPS[r["op"]],
                     str(r["threads"]), fmt_us(r["cfbn"])]
            if torch is not None:
                ratio = "%.3f" % r["ratio"]
                if r["ratio"] > TARGET_MAX_RATIO:
                    ratio = "**%s**" % ratio
                cells += [fmt_us(r["torch"]), ratio, "%.2f" % r["cfbn_gbps"],
                          "%.2f" % r["torch_gbps"]]
            else:
                cells += ["%.2f" % r["cfbn_gbps"]]
            cells.append(fmt_load(r["load"]))
            w("| " + " | ".join(cells) + " |")
        loads = [r["load"] for r in rows if r["load"] is not None]
        if loads:
            w("")
            w("Others' load: CPU cores other processes used while the cell was measured "
              "(median %.2f, max %.2f; %d of %d cells above %.2f after re-measuring)."
              % (median(loads), max(loads), sum(q > args.busy for q in loads), len(rows),
                 args.busy))
        if torch is not None:
            ratios = [r["ratio"] for r in rows]
            geo = geomean(ratios)
            worst = max(rows, key=lambda r: r["ratio"])
            above = [r for r in rows if r["ratio"] > TARGET_MAX_RATIO]
            w("")
            w("Geometric mean of cfbn/PyTorch over %d cells: **%.3f** (target <= %.2f: %s)"
              % (len(ratios), geo, TARGET_GEOMEAN, verdict(geo <= TARGET_GEOMEAN)))
            w("")
            w("Largest ratio: **%.3f** at (%s) %s %s, %d thread(s) (target <= %.2f: %s); "
              "%d cell(s) above %.2f"
              % (worst["ratio"], ",".join(map(str, worst["shape"])), worst["layout"],
                 bc.OPS[worst["op"]], worst["threads"], TARGET_MAX_RATIO,
                 verdict(worst["ratio"] <= TARGET_MAX_RATIO), len(above), TARGET_MAX_RATIO))
            summary.append(("geometric mean %.3f <= %.2f" % (geo, TARGET_GEOMEAN),
                            geo <= TARGET_GEOMEAN))
            summary.append(("largest ratio %.3f <= %.2f" % (worst["ratio"], TARGET_MAX_RATIO),
                            worst["ratio"] <= TARGET_MAX_RATIO))
            checks = [r["check"] for r in rows if r["check"] is not None]
            if checks:
                w("")
                w("Outputs checked against PyTorch in every cell before timing: largest "
                  "normalized difference %.2g (limit %.0g)." % (max(checks), CHECK_TOLERANCE))

    if large is not None:
        copy, fresh, copy_name, copy_bw, lrows = large
        w("")
        w("### Large tensor (%s) float32, 2 threads" % ",".join(map(str, bc.LARGE_SHAPE)))
        w("")
        w("Copy bandwidth (2 x bytes / time, %.0f MB array) measured first: %s (the higher, "
          "%.2f GB/s, %s).  Each row's fraction is taken against the higher of the same two "
          "copies timed interleaved with that row's calls (its copy column)." % (
              bc.LARGE_SHAPE[0] * bc.LARGE_SHAPE[1] * bc.LARGE_SHAPE[2] * bc.LARGE_SHAPE[3]
              * 4 / 1e6,
              ", ".join("%s %.2f GB/s" % kv for kv in copy.items()), copy_bw, copy_name))
        w("")
        head = "| layout | op | copy GB/s | cfbn ms | cfbn GB/s | fraction of copy | target | result " \
               "| cfbn out= GB/s (fraction) | cache off (fraction) |"
        sep = "|---|---|--:|--:|--:|--:|--:|---|--:|--:|"
        if torch is not None:
            head += " PyTorch ms | PyTorch GB/s |"
            sep += "--:|--:|"
        head += " others' load |"
        sep += "--:|"
        w(head)
        w(sep)
        for r in lrows:
            target = TARGET_FRACTION[r["op"]]
            ok = r["fraction"] >= target
            cells = [r["layout"], bc.OPS[r["op"]], "%.2f" % r["copy_gbps"], fmt_ms(r["cfbn"]),
                     "%.2f" % r["cfbn_gbps"],
                     "%.3f" % r["fraction"], "%.2f" % target, verdict(ok),
                     "%.2f (%.3f)" % (r["cfbn_out_gbps"], r["out_fraction"]),
                     "%.3f" % r["nocache_fraction"]]
            if torch is not None:
                cells += [fmt_ms(r["torch"]), "%.2f" % r["torch_gbps"]]
            cells.append(fmt_load(r["load"]))
            w("| " + " | ".join(cells) + " |")
            summary.append(("large %s %s %.3f >= %.2f of copy" % (
                r["layout"], bc.OPS[r["op"]], r["fraction"], target), ok))
        w("")
        w("Fractions use the plain call (outputs allocated by cfbn, as users call it, with "
          "the output cache at its default limit, so each call reuses the previous call's "
          "freed output); the out= column passes preallocated outputs; the cache-off column "
          "is the plain call with `set_output_cache_limit(0)`, each output a fresh mapping "
          "that the OS faults in and zeroes.  For context, copies into a fresh array each "
          "time: %s." % ", ".join("%s %.2f GB/s" % kv for kv in fresh.items()))

    if overhead is not None:
        w("")
        w("### Per-call overhead, (1,8,8,16) float32 NHWC, default threads")
        w("")
        if torch is not None:
            w("| call | cfbn µs | PyTorch µs | target | result |")
            w("|---|--:|--:|--:|---|")
        else:
            w("| call | cfbn µs | target | result |")
            w("|---|--:|--:|---|")
        for r in overhead:
            fwd = r["op"] != "grad"
            ok = r["cfbn"] * 1e6 <= TARGET_OVERHEAD_US
            cells = [r["label"], "%.2f" % (r["cfbn"] * 1e6)]
            if torch is not None:
                cells.append("%.2f" % (r["torch"] * 1e6))
            cells += ["<= %.0f" % TARGET_OVERHEAD_US if fwd else "-",
                      verdict(ok) if fwd else "-"]
            w("| " + " | ".join(cells) + " |")
            if fwd:
                summary.append(("overhead %s %.2f us <= %.0f" % (
                    r["op"], r["cfbn"] * 1e6, TARGET_OVERHEAD_US), ok))

    if bf16:
        bf16_report(w, bf16, torch, summary)

    if grad_grad is not None:
        grad_grad_report(w, grad_grad, torch, summary)

    if summary:
        failed = [name for name, ok in summary if not ok]
        w("")
        w("### Targets")
        w("")
        w("%d of %d met." % (len(summary) - len(failed), len(summary)))
        if failed:
            w("Not met: " + "; ".join(failed) + ".")
    w("")
    return "\n".join(out)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer repeats (about a third of the time)")
    p.add_argument("--markdown-out", metavar="FILE", help="also write the report to FILE")
    p.add_argument("--json", metavar="FILE",
                   help="also write every measured figure and the machine to FILE "
                        "(what benchmarks/plot.py draws)")
    p.add_argument("--repeats", type=int, help="repeats per target cell (default 9, quick 3)")
    p.add_argument("--min-batch-ms", type=float, default=20.0,
                   help="least duration of one timed batch of calls (default 20)")
    p.add_argument("--threads", default="1,2", help="thread counts of the target cells")
    p.add_argument("--shapes", default="",
                   help="only these target shapes, e.g. 32x56x56x64,1x8x8x16")
    p.add_argument("--retries", type=int, default=2,
                   help="re-measure a cell up to this many times while other processes load "
                        "the CPUs (within 90 s in all, 30 s with --quick; default 2)")
    p.add_argument("--busy", type=float, default=bc.BUSY,
                   help="foreign CPU load, in cores, that triggers a re-measurement "
                        "(default %(default)s)")
    p.add_argument("--no-large", action="store_true", help="skip the large-tensor section")
    p.add_argument("--no-overhead", action="store_true", help="skip the per-call overhead")
    p.add_argument("--no-torch", action="store_true", help="time cfbn only")
    p.add_argument("--no-bf16", action="store_true", help="skip the bfloat16 section")
    p.add_argument("--only-bf16", action="store_true",
                   help="only the bfloat16 section (with the large tensor unless --no-large)")
    p.add_argument("--no-grad-grad", action="store_true",
                   help="skip the second-order gradient section")
    p.add_argument("--only-grad-grad", action="store_true",
                   help="only the second-order gradient section (with --only-bf16: both)")
    args = p.parse_args(argv)
    args.threads = [int(t) for t in args.threads.split(",") if t.strip()]
    args.shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    if args.repeats is None:
        args.repeats = 3 if args.quick else 9
    args.large_repeats = 3 if args.quick else 7
    args.overhead_repeats = 9 if args.quick else 31
    args.min_batch = args.min_batch_ms / 1e3
    args.retry = Retries(args.retries, args.busy, 30.0 if args.quick else 90.0)
    return args


def main(argv=None):
    args = parse_args(argv)
    start = time.perf_counter()
    load_start = "%.2f" % os.getloadavg()[0]
    torch = None if args.no_torch else bc.torch_module()
    if torch is None:
        bc.log("PyTorch is not installed (or --no-torch): timing cfbn only")
    info = bc.machine_info()
    bc.log(machine_line(info))
    only = args.only_bf16 or args.only_grad_grad
    rows = [] if only else target_cells(args, torch)
    large = None if args.no_large or only else large_section(args, torch)
    overhead = None if args.no_overhead or only else overhead_section(args, torch)
    bf16 = None
    if not args.no_bf16 and (args.only_bf16 or not only):
        if bc.have_module("ml_dtypes"):
            bf16 = bf16_section(args, torch)
        else:
            bc.log("ml_dtypes is not installed: no bfloat16 section")
    grad_grad = None
    if not args.no_grad_grad and (args.only_grad_grad or not only):
        grad_grad = grad_grad_section(args, torch)
    elapsed = time.perf_counter() - start
    load = (load_start, "%.2f" % os.getloadavg()[0])
    text = report(args, info, torch, rows, large, overhead, bf16, grad_grad, elapsed, load)
    print(text)
    if args.markdown_out:
        Path(args.markdown_out).write_text(text + "\n")
        bc.log("written to %s" % args.markdown_out)
    if args.json:
        write_json(args.json, info, torch, rows, large, overhead, bf16, grad_grad, load)
        bc.log("written to %s" % args.json)
    return 0


def write_json(path, info, torch, rows, large, overhead, bf16, grad_grad, load):
    """Every section's rows as measured (seconds, GB/s, ratios) and the machine."""
    import datetime
    import json
    import shlex

    def plain(v):
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, np.generic):
            return v.item()
        return v

    doc = {"benchmark": "compare",
           "machine": dict(info, date=datetime.date.today().isoformat(), load=list(load),
                           command=shlex.join(["python"] + sys.argv)),
           "cells": rows, "overhead": overhead, "bf16": bf16, "grad_grad": grad_grad,
           "large": None}
    if large is not None:
        copy, fresh, copy_name, copy_bw, large_rows = large
        doc["large"] = {"shape": bc.LARGE_SHAPE, "copy_gbps": copy, "fresh_copy_gbps": fresh,
                        "best_copy": copy_name, "rows": large_rows}
    with open(path, "w") as f:
        json.dump(plain(doc), f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
