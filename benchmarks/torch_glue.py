"""Each layer of a small cfbn.torch call, timed alone.

A (8,16,8,8) float32 training forward + backward on cfbn's path
(``set_path("cfbn")``) is mostly fixed cost.  This prints what each piece
costs by itself, the best of 7 batches of calls, one thread:

- the two operators, called below autograd (dispatcher, checks in C++,
  output allocation, the kernels);
- the Python pieces of ``cfbn.torch.batch_norm``: the argument checks, the
  tracing test, the running-statistics copies, the batch counter;
- Python autograd nodes that do no batch-norm work: one input and one
  output (as cheap as ``x.mul(1.0)``'s C++ node), and one with cfbn's
  arity (three differentiable inputs, four saved tensors, one output);
- the whole module step on cfbn's path and ``nn.BatchNorm2d``'s beside it
  (torch_overhead.py's ``cfbn path`` and ``nn``).

    python benchmarks/torch_glue.py [--threads 1]
"""
import argparse
import sys
import time

import torch

import cfbn.torch as ct
from cfbn.torch import _checks, functional, ops
from torch_overhead import calls


def best_us(fn, n=1500, batches=7):
    for _ in range(200):
        fn()
    best = float("inf")
    for _ in range(batches):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e6


class _One(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g


class _Arity(torch.autograd.Function):
    """cfbn's node without its work: clones and sums instead of kernels."""

    @staticmethod
    def forward(ctx, x, w, b, s, args):
        ctx.save_for_backward(x, w, b, s)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        ctx.saved_tensors
        return g, g.sum((0, 2, 3)), g.sum((0, 2, 3)), None, None


def pieces(shape):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).requires_grad_()
    dy = torch.randn(shape, generator=gen)
    c = shape[1]
    mod = ct.BatchNorm2d(c)
    w, b = mod.weight, mod.bias
    wd, bd, xd = w.detach(), b.detach(), x.detach()
    rm, rv = torch.zeros(c), torch.ones(c)
    below = torch._C._AutoDispatchBelowAutograd
    with below():
        _, sm, sv, nm, nv = ops.batch_norm(xd, wd, bd, rm, rv, None, True, 0.1, 1e-5, 0, 0.0,
                                           None)

    def op_forward():
        with below():
            ops.batch_norm(xd, wd, bd, rm, rv, None, True, 0.1, 1e-5, 0, 0.0, None)

    def op_backward():
        with below():
            ops.batch_norm_backward(dy, xd, wd, bd, sm, sv, True, 1e-5, 0, 0.0, None)

    def clear(*ts):
        for t in ts:
            t.grad = None

    def one_node():
        clear(x)
        _One.apply(x).backward(dy)

    def arity_node():
        clear(x, w, b)
        _Arity.apply(x, w, b, None, ()).backward(dy)

    # the floor, cfbn's path and nn as torch_overhead.py times them
    steps = calls(shape, compiled=False)
    return [
        ("operator cfbn::batch_norm, below autograd", op_forward),
        ("operator cfbn::batch_norm_backward, below autograd", op_backward),
        ("argument checks (_checks.call)", lambda: _checks.call(x, w, b, rm, rv, None, True,
                                                                  0.1, 1e-5)),
        ("tracing test (_traced)", lambda: functional._traced(x, w, b, None)),
        ("running-statistics copies", lambda: (rm.copy_(nm), rv.copy_(nv))),
        ("batch counter add_(1)", lambda: mod.num_batches_tracked.add_(1)),
        ("x.mul(1.0) forward + backward (C++ node)", steps["floor"]),
        ("Python node, 1 input, 1 output", one_node),
        ("Python node of cfbn's arity, clones for kernels", arity_node),
        ("cfbn.torch.BatchNorm2d step, cfbn's path", steps["cfbn path"]),
        ("nn.BatchNorm2d step", steps["nn"]),
    ]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="8x16x8x8")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    shape = tuple(int(v) for v in args.shape.split("x"))
    torch.set_num_threads(args.threads)
    rows = [(name, best_us(fn)) for name, fn in pieces(shape)]
    print("%s float32, %d thread(s), torch %s; best of 7 batches" %
          (shape, args.threads, torch.__version__))
    print("| piece | us |\n|---|---:|")
    for name, us in rows:
        print("| %s | %.1f |" % (name, us))
    return 0


if __name__ == "__main__":
    sys.exit(main())
