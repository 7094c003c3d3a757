"""The size from which cfbn.torch's path beats PyTorch's own batch norm in a module.

cfbn.torch.BatchNorm2d forward + backward, training, with ``set_path("cfbn")``
against ``set_path("native")`` (PyTorch's batch norm, add and activation),
interleaved batch by batch in one process on the same tensors
(``_bench_common.median_ratio``), for inputs (N, C, H, W) from
(1, 16, 4, 4) to (8, 64, 64, 64), contiguous and channels_last, float32, one
and two threads (``--dtype`` for another input dtype; 16-bit inputs take
float32 parameters, as under autocast).  Printed: each size's native / cfbn time ratio (above 1:
cfbn's path is faster), and per memory format the smallest size from which
cfbn's path is faster at every larger size and both thread counts, the
figure cfbn.torch._paths.CROSSOVER holds.

    python benchmarks/torch_crossover.py [--rounds 15] [--activation relu] [--dtype float64]
"""
import argparse
import sys

import torch

import cfbn.torch as ct
from _bench_common import median_ratio

MIN_BATCH_S = 0.01

SHAPES = [(1, 16, 4, 4), (2, 16, 8, 8), (8, 16, 8, 8), (4, 32, 8, 8), (8, 32, 8, 8),
          (8, 16, 16, 16), (4, 64, 8, 8), (8, 64, 8, 8), (8, 32, 16, 16), (8, 64, 16, 16),
          (8, 32, 32, 32), (8, 64, 32, 32), (16, 64, 32, 32), (8, 64, 64, 64)]


def step(module, x, dy, path):
    """One forward + backward of `module` on `path`."""
    def run():
        ct.set_path(path)
        x.grad = None
        module(x).backward(dy)
    return run


def ratios(shape, fmt, threads, rounds, activation, dtype):
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).to(dtype).contiguous(memory_format=fmt).requires_grad_()
    dy = torch.randn(shape, generator=gen).to(dtype).contiguous(memory_format=fmt)
    m = ct.BatchNorm2d(shape[1], activation=activation,
                       dtype=torch.float64 if dtype is torch.float64 else torch.float32)
    return median_ratio(step(m, x, dy, "native"), step(m, x, dy, "cfbn"), rounds, MIN_BATCH_S)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--activation", default=None)
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64", "bfloat16", "float16"))
    args = ap.parse_args(argv)
    old = ct.get_path()
    dtype = getattr(torch, args.dtype)
    print("native / cfbn time, module forward + backward, %s, median of %d rounds; "
          "torch %s" % (args.dtype, args.rounds, torch.__version__))
    print("| shape | elements | format | 1 thread | 2 threads |\n|---|--:|---|--:|--:|")
    try:
        for name, fmt in (("contiguous", torch.contiguous_format),
                          ("channels_last", torch.channels_last)):
            rows = []
            for shape in SHAPES:
                r = [ratios(shape, fmt, t, args.rounds, args.activation, dtype) for t in (1, 2)]
                n = 1
                for s in shape:
                    n *= s
                rows.append((n, r))
                print("| %s | %d | %s | %.2f | %.2f |" % ("x".join(map(str, shape)), n, name,
                                                          r[0], r[1]))
                sys.stdout.flush()
            cross = None
            for n, r in reversed(rows):
                if min(r) < 1.0:
                    break
                cross = n
            print("crossover, %s: %s" % (name, cross if cross is not None else "none measured"))
    finally:
        ct.set_path(old)
    return 0


if __name__ == "__main__":
    sys.exit(main())
