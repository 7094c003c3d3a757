"""`python -m cfbn`: what this machine runs, a self-check, and how fast.

Prints runtime_info(), checks the selected kernels against cfbn.reference on
random data (exit status 1 if any check fails), then times three shapes for
the forward pass (training and inference), the gradient and the gradient of
the gradient beside the NumPy reference and, where PyTorch is installed,
beside PyTorch's CPU batch norm on the same memory (a channels_last tensor),
as time per call and effective bandwidth (minimal bytes moved: 2x the size
of x for a forward pass, 3x for a gradient, 5x for the second-order
gradient).  Other processes' CPU use while timing is measured and reported.
``--plot FILE`` also draws that table (and the bandwidth beside this
machine's copy bandwidth) into FILE with matplotlib, the optional ``plot``
extra, which is imported only then.
"""
import argparse
import importlib.util
import sys
import time

import numpy as np

import cfbn
from cfbn import _args, _cpuload, reference

CHECK_CASES = [
    ((4, 7, 9, 17), "NHWC"), ((3, 17, 5, 11), "NCHW"), ((257, 3), "NC"),
    ((2, 3, 4, 5, 8), "NDHWC"), ((2, 5, 3, 4, 7), "NCDHW"), ((1, 1, 1, 1), "NHWC"),
]
BENCH_SHAPES = [(32, 56, 56, 64), (32, 14, 14, 256), (1, 8, 8, 16)]


def _inputs(rng, shape, data_format, dtype, loc=3.0, spread=2.0):
    x = (rng.standard_normal(shape) * spread + loc).astype(dtype)
    c = shape[1] if data_format in ("NCHW", "NCDHW") else shape[-1]
    vdt = _args.dtype_kinds(np.dtype(dtype), "x")[1]
    scale = (rng.standard_normal(c) + 1).astype(vdt)
    offset = rng.standard_normal(c).astype(vdt)
    mean = rng.standard_normal(c).astype(vdt)
    var = (rng.random(c) + 0.5).astype(vdt)
    return x, scale, offset, mean, var


def _close(got, want, tol):
    got = np.asarray(got, dtype=np.float64)
    err = np.abs(got - want)
    bound = tol * (np.abs(want) + 1.0)
    return bool(np.all(err <= bound)), float(np.max(err / bound, initial=0.0))


def check_tolerances():
    """dtype -> relative tolerance of the self-check, bfloat16 included where
    ml_dtypes is installed (cfbn itself never imports it)."""
    tols = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-11,
            np.dtype(np.float16): 4e-3}
    if importlib.util.find_spec("ml_dtypes") is not None:
        import ml_dtypes
        # bfloat16 keeps 8 significant bits: one ulp is 2**-7 of the value
        # at the bottom of a binade, two roundings to nearest at most.
        tols[np.dtype(ml_dtypes.bfloat16)] = 2.0 ** -7
    return tols


def self_check(rng, tols):
    """Compare the active kernels with the float64 reference for each dtype
    of `tols` (dtype -> relative tolerance); return the failures."""
    failures = []
    for shape, fmt in CHECK_CASES:
        for dtype, tol in tols.items():
            for training in (True, False):
                x, scale, offset, mean, var = _inputs(rng, shape, fmt, dtype)
                kw = dict(epsilon=1e-3, data_format=fmt, is_training=training)
                got = cfbn.fused_batch_norm(x, scale, offset, mean, var,
                                            exponential_avg_factor=0.5, **kw)
                want = reference.fused_batch_norm(x, scale, offset, mean, var,
                                                  exponential_avg_factor=0.5, **kw)
                dy = rng.standard_normal(shape).astype(dtype)
                ggot = cfbn.fused_batch_norm_grad(dy, x, scale, got[3], got[4], **kw)
                gwant = reference.fused_batch_norm_grad(dy, x, scale, got[3], got[4], **kw)
                ggx = rng.standard_normal(shape).astype(dtype)
                up = (ggx, scale, offset)
                g2got = cfbn.fused_batch_norm_grad_grad(dy, x, scale, got[3], got[4], *up, **kw)
                g2want = reference.fused_batch_norm_grad_grad(dy, x, scale, got[3], got[4], *up,
                                                              **kw)
                # sums over the batch are compared relative to the summands' size
                n = x.size // scale.size
                for name, g, w, t in (
                        [(f, g, w, tol) for f, g, w in zip(got._fields, got, want)]
                        + [(f, g, w, tol * max(1.0, np.sqrt(n))) for f, g, w in
                           zip(ggot._fields, ggot, gwant)]
                        + [("grad_grad " + f, g, w, tol * max(1.0, np.sqrt(n))) for f, g, w in
                           zip(g2got._fields, g2got, g2want)]):
                    ok, worst = _close(g, w, t)
                    if not ok:
                        failures.append("%s %s %s training=%s %s: %.3g x tolerance"
                                        % (shape, fmt, np.dtype(dtype).name, training, name, worst))
    return failures


def _time(fn, min_time=0.2, max_calls=2000):
    """Median time of one call over repeated calls (after one warm-up call)."""
    fn()
    times, t0 = [], time.perf_counter()
    while len(times) < max_calls and time.perf_counter() - t0 < min_time:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]


def _torch_ops(torch, x, scale, offset, mean, var, dy, eps):
    """PyTorch's batch norm on the same memory: NHWC arrays seen as
    channels_last NCHW tensors (no copy); op name -> callable."""
    F = torch.nn.functional
    xt, dyt = (torch.from_numpy(a).permute(0, 3, 1, 2) for a in (x, dy))
    w, b = torch.from_numpy(scale), torch.from_numpy(offset)
    # training updates its running statistics in place; inference reads its own
    rm, rv = torch.from_numpy(mean.copy()), torch.from_numpy(var.copy())
    m, v = torch.from_numpy(mean), torch.from_numpy(var)
    _, save_mean, save_invstd = torch.ops.aten.native_batch_norm(xt, w, b, rm, rv, True, 0.1, eps)
    return {
        "forward train": lambda: F.batch_norm(xt, rm, rv, w, b, True, 0.1, eps),
        "forward infer": lambda: F.batch_norm(xt, m, v, w, b, False, 0.1, eps),
        "gradient": lambda: torch.ops.aten.native_batch_norm_backward(
            dyt, xt, w, rm, rv, save_mean, save_invstd, True, eps, [True, True, True]),
    }


def speed_table(rng, torch=None):
    """Rows (shape, op, cfbn s, cfbn GB/s, reference s, PyTorch s or None)."""
    rows = []
    eps = 1e-3
    for shape in BENCH_SHAPES:
        x, scale, offset, mean, var = _inputs(rng, shape, "NHWC", np.float32)
        dy = rng.standard_normal(shape).astype(np.float32)
        fwd = cfbn.fused_batch_norm(x, scale, offset, epsilon=eps)
        nbytes = x.nbytes
        ops = [
            ("forward train", 2 * nbytes,
             lambda: cfbn.fused_batch_norm(x, scale, offset, mean, var, epsilon=eps,
                                           exponential_avg_factor=0.1),
             lambda: reference.fused_batch_norm(x, scale, offset, mean, var, epsilon=eps,
                                                exponential_avg_factor=0.1)),
            ("forward infer", 2 * nbytes,
             lambda: cfbn.fused_batch_norm(x, scale, offset, mean, var, epsilon=eps,
                                           is_training=False),
             lambda: reference.fused_batch_norm(x, scale, offset, mean, var, epsilon=eps,
                                                is_training=False)),
            ("gradient", 3 * nbytes,
             lambda: cfbn.fused_batch_norm_grad(dy, x, scale, fwd[3], fwd[4], epsilon=eps),
             lambda: reference.fused_batch_norm_grad(dy, x, scale, fwd[3], fwd[4], epsilon=eps)),
            ("grad of grad", 5 * nbytes,
             lambda: cfbn.fused_batch_norm_grad_grad(dy, x, scale, fwd[3], fwd[4], x, scale,
                                                     epsilon=eps),
             lambda: reference.fused_batch_norm_grad_grad(dy, x, scale, fwd[3], fwd[4], x, scale,
                                                          epsilon=eps)),
        ]
        theirs = _torch_ops(torch, x, scale, offset, mean, var, dy, eps) if torch else {}
        for name, moved, ours, ref in ops:
            t = _time(ours)
            tt = _time(theirs[name]) if name in theirs else None
            tr = _time(ref, min_time=0.1, max_calls=20)
            rows.append((shape, name, t, moved / t / 1e9, tr, tt))
    return rows


def _parse(argv):
    ap = argparse.ArgumentParser(
        prog="python -m cfbn",
        description="Print what this machine runs (ISAs, threads), check the selected "
                    "kernels against the float64 reference, then time cfbn beside the NumPy "
                    "reference and, where installed, PyTorch. Exit status 1 if the "
                    "self-check fails.")
    ap.add_argument("--check", action="store_true",
                    help="the self-check only, without the speed table (for slow or "
                         "emulated machines)")
    ap.add_argument("--no-torch", action="store_true",
                    help="leave PyTorch out of the speed table even where it is installed")
    ap.add_argument("--plot", metavar="FILE",
                    help="also draw the speed table into FILE (.svg, .png or .pdf); needs "
                         "matplotlib: pip install \"cfbn[plot]\"")
    args = ap.parse_args(argv)
    if args.plot and args.check:
        ap.error("--plot draws the speed table, which --check leaves out")
    return args


def copy_bandwidth(nbytes):
    """GB/s of np.copyto between two float32 arrays of `nbytes` (2 x bytes
    moved per copy): the memory speed one thread of this machine reaches."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    return 2 * nbytes / _time(lambda: np.copyto(dst, src)) / 1e9


def draw(path, plt, rows, info, torch_version, copy_gbps, others):
    """The speed table as a figure: speed-ups over the other libraries and
    cfbn's bandwidth beside the copy's."""
    import datetime
    import platform

    from cfbn import _plot
    short = {"forward train": "fwd train", "forward infer": "fwd infer", "gradient": "grad",
             "grad of grad": "grad grad"}
    labels = ["%s %s" % ("x".join(map(str, shape)), short.get(name, name))
              for shape, name, *_ in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    speedups = {"over the NumPy reference": [tr / t for _, _, t, _, tr, _ in rows]}
    if torch_version is not None:
        speedups["over PyTorch %s" % torch_version] = [
            tt / t if tt is not None else None for _, _, t, _, _, tt in rows]
    _plot.bars(left, labels, speedups, ylabel="speed-up of cfbn (other's time / cfbn's)",
               title="cfbn against the others, per call", log=True, reference=1.0,
               reference_label="as fast")
    _plot.bars(right, labels, {"cfbn": [gbs for _, _, _, gbs, _, _ in rows]},
               ylabel="effective bandwidth, GB/s", reference=copy_gbps,
               reference_label="np.copyto, 1 thread (%.1f GB/s)" % copy_gbps,
               value_format="%.1f", title="cfbn's bandwidth (minimal bytes moved / time)")
    text = ("python -m cfbn --plot, %s, on this %s machine (%s kernels, %d threads), cfbn %s, "
            "NumPy %s, Python %s. float32 NHWC, median of repeated calls." % (
                datetime.date.today().isoformat(), platform.machine(), info["selected_isa"],
                info["max_threads"], info["version"], np.__version__,
                platform.python_version()))
    if others is not None and others > _cpuload.BUSY:
        text += (" Other processes used %.1f CPUs while these were timed: the figures are not "
                 "reliable." % others)
    _plot.caption(fig, text)
    _plot.save(fig, path)
    plt.close(fig)


def _fmt_ratio(t, other):
    """Another's time per call and how many times cfbn's it is."""
    ratio = other / t
    return "%.1f us | %s" % (other * 1e6, ("%.0fx" if ratio >= 10 else "%.2fx") % ratio)


def main(argv=None):
    args = _parse(argv)
    plt = None
    if args.plot:
        from cfbn import _plot
        try:
            plt = _plot.pyplot()
        except ImportError as exc:
            print("python -m cfbn: --plot: %s" % exc, file=sys.stderr)
            return 2
    info = cfbn.runtime_info()
    print("cfbn %s" % info["version"])
    for key in ("compiled_isas", "supported_isas", "selected_isa", "openmp", "max_threads",
                "output_cache_limit", "l2_cache_bytes"):
        print("  %-15s %s" % (key, info[key]))
    others = {f: isa for f, isa in info["family_isas"].items() if isa != info["selected_isa"]}
    if others:
        print("  %-15s %s (CPU row %s)" % ("family_isas", ", ".join(
            "%s %s" % kv for kv in sorted(others.items())), info["cpu_row"]))
    rng = np.random.default_rng(2024)
    tols = check_tolerances()
    failures = self_check(rng, tols)
    if failures:
        print("\nself-check FAILED (%d):" % len(failures))
        for f in failures:
            print("  " + f)
        return 1
    print("\nself-check passed: %d shapes over 5 layouts x %s, forward, gradient and "
          "second-order gradient, against "
          "cfbn.reference (float64)" % (len(CHECK_CASES), "/".join(d.name for d in tols)))
    if args.check:
        return 0
    torch = None
    if not args.no_torch and importlib.util.find_spec("torch") is not None:
        try:
            import torch
        except (ImportError, OSError) as exc:   # installed but broken: time cfbn alone
            print("\nPyTorch left out: import torch failed (%s)" % exc)
        else:
            torch.set_num_threads(info["max_threads"])
    print("\nfloat32 NHWC, %s kernels, %d threads; median of repeated calls, outputs allocated "
          "by each call; the speed-ups are the other's time over cfbn's\n"
          % (info["selected_isa"], info["max_threads"]))
    head = "| shape (N,H,W,C) | op | cfbn | GB/s | NumPy reference | speed-up |"
    rule = "|---|---|---:|---:|---:|---:|"
    if torch is not None:
        head += " PyTorch %s (channels_last) | speed-up |" % torch.__version__
        rule += "---:|---:|"
    meter = _cpuload.CpuMeter()
    rows = speed_table(rng, torch)
    others = meter.others()
    print(head)
    print(rule)
    for shape, name, t, gbs, tr, tt in rows:
        line = "| %s | %s | %.1f us | %.1f | %s |" % (
            ",".join(map(str, shape)), name, t * 1e6, gbs, _fmt_ratio(t, tr))
        if torch is not None:
            line += " %s |" % (_fmt_ratio(t, tt) if tt is not None else "- | -")
        print(line)
    if torch is not None:
        print("\nPyTorch has no second-order batch-norm operator to time by itself: its double "
              "backward runs through autograd.")
    if others is not None and others > _cpuload.BUSY:
        print("\nwarning: other processes used %.1f of this machine's CPUs while these were "
              "timed; the times and speed-ups are not reliable" % others)
    if plt is not None:
        nbytes = max(int(np.prod(shape)) for shape in BENCH_SHAPES) * 4
        draw(args.plot, plt, rows, info, torch.__version__ if torch is not None else None,
             copy_bandwidth(nbytes), others)
        print("\nfigure written to %s" % args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
