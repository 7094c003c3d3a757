"""AVX-512 against AVX2 by loop family, through the NumPy API, on one CPU.

The families of issue 51's per-CPU choice: plain (training forward, inference
forward, gradient), the relu family fused (relu, and relu with a side input;
forward and gradient), the exp family fused (silu, elu, sigmoid, tanh; forward
and gradient), the second-order gradient, and bfloat16 plain (training forward
and gradient).  Every cell times both tables in one process on the same
buffers, alternating batch by batch (``_kernels.select_isa`` before each call,
``_bench_common.median_ratio``), the order flipping every round; outputs come
from cfbn's output cache, so neither table pays for fresh pages.  A cell's ratio is the median over the rounds of avx512 / avx2
time; a family's figure the geometric mean of its cells.

    python benchmarks/isa_classes.py [--threads 2] [--rounds 7] [--quick]
"""
import argparse
import math
import sys

import ml_dtypes
import numpy as np

import cfbn
from cfbn import _kernels
from _bench_common import median_ratio

MIN_BATCH_S = 0.01
SHAPES = [(32, 56, 56, 64), (32, 28, 28, 128), (32, 14, 14, 256), (32, 7, 7, 512), (8, 32, 32, 32)]
FAMILIES = {
    "plain": [("training", None), ("inference", None), ("grad", None)],
    "relu family": [("training", "relu"), ("grad", "relu"), ("training", "relu+side"),
                    ("grad", "relu+side")],
    "exp family": [(k, a) for a in ("silu", "elu", "sigmoid", "tanh") for k in ("training", "grad")],
    "second order": [("grad_grad", None)],
    "bfloat16 plain": [("training-bf16", None), ("grad-bf16", None)],
    "float16 plain": [("training-f16", None), ("grad-f16", None)],
}


def cell(kind, act, shape, fmt, threads):
    """A callable of one call of the cell."""
    dtype = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}.get(kind.rpartition("-")[2],
                                                                 np.float32)
    kind = kind.partition("-")[0]
    if fmt == "NCHW":
        shape = (shape[0], shape[3], shape[1], shape[2])
    c = shape[3] if fmt == "NHWC" else shape[1]
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 2 + 1).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    side = rng.standard_normal(shape).astype(dtype) if act == "relu+side" else None
    activation = "relu" if act == "relu+side" else act
    v = np.ones(c, np.float32)
    mean, var = np.full(c, 1.0, np.float32), np.full(c, 4.0, np.float32)
    kw = dict(epsilon=1e-3, data_format=fmt, n_threads=threads)
    fk = dict(kw, activation=activation, side_input=side)
    if kind == "training":
        return lambda: cfbn.fused_batch_norm(x, v, v, mean, var, exponential_avg_factor=0.1, **fk)
    if kind == "inference":
        return lambda: cfbn.fused_batch_norm(x, v, v, mean, var, is_training=False, **fk)
    if kind == "grad":
        return lambda: cfbn.fused_batch_norm_grad(dy, x, v, mean, var, offset=v, **fk)
    return lambda: cfbn.fused_batch_norm_grad_grad(dy, x, v, mean, var, x, v, v, **kw)


def on(isa, call):
    """`call` with `isa`'s table selected."""
    def run():
        _kernels.select_isa(isa)
        call()
    return run


def ratio(call, rounds):
    """Median over rounds of avx512 / avx2 time of `call`."""
    return median_ratio(on("avx512", call), on("avx2", call), rounds, MIN_BATCH_S)


def family_ratios(family, ratio_of, shapes, threads):
    """(ratio_of(call), the cell's name) for every cell of `family`."""
    got = []
    for kind, act in FAMILIES[family]:
        for shape in shapes:
            for fmt in ("NHWC", "NCHW"):
                got.append((ratio_of(cell(kind, act, shape, fmt, threads)),
                            "%s %s %s %s" % (kind, act or "", fmt, "x".join(map(str, shape)))))
    return got


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="two shapes only")
    ap.add_argument("--families", default=",".join(FAMILIES),
                    help="some of: %s" % ", ".join(FAMILIES))
    args = ap.parse_args(argv)
    if "avx512" not in cfbn.runtime_info()["supported_isas"]:
        print("isa_classes.py: this CPU cannot run the AVX-512 table", file=sys.stderr)
        return 2
    shapes = SHAPES[::2] if args.quick else SHAPES
    families = args.families.split(",")
    unknown = set(families) - set(FAMILIES)
    if unknown:
        ap.error("--families: unknown %s" % ", ".join(sorted(unknown)))
    previous = _kernels.selection()
    print("avx512 / avx2 time, %d threads, median of %d rounds; %s"
          % (args.threads, args.rounds, cfbn.runtime_info()["selected_isa"]))
    print("| family | geometric mean | worst cell | cells |\n|---|--:|---|--:|")
    try:
        for family in families:
            got = family_ratios(family, lambda c: ratio(c, args.rounds), shapes, args.threads)
            gm = math.exp(sum(math.log(r) for r, _ in got) / len(got))
            worst = max(got)
            print("| %s | %.3f | %.3f (%s) | %d |" % (family, gm, worst[0], worst[1], len(got)))
            sys.stdout.flush()
    finally:
        _kernels.restore_selection(previous)
    return 0


if __name__ == "__main__":
    sys.exit(main())
