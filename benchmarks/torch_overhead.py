"""Per-call cost of cfbn.torch: the autograd floor, the raw kernels, the operators.

On a small tensor (default (8,16,8,8) float32, one thread) a training
forward + backward is mostly fixed cost.  Timed in interleaved rounds, each
a batch of calls:

- ``floor``: ``x.mul(1.0)`` forward and backward, PyTorch's autograd cost
  for an op that does nothing;
- ``raw``: ``cfbn.fused_batch_norm`` and ``cfbn.fused_batch_norm_grad`` on
  NumPy views of the same memory (the kernels and cfbn's own Python);
- ``cfbn.torch``: ``cfbn.torch.BatchNorm2d`` forward and backward as a user
  gets it (``set_path("auto")``: PyTorch's own batch norm below the
  measured crossover, cfbn.torch._paths);
- ``cfbn path``: the same with ``set_path("cfbn")`` (eager: the operators
  through the dispatcher below autograd, under a plain
  ``autograd.Function``);
- ``operator``: ``torch.ops.cfbn.batch_norm`` with its registered (Python)
  autograd formula, called eagerly (what a traced graph runs);
- ``nn``: ``nn.BatchNorm2d`` forward and backward;
- with ``--compiled``: both modules under ``torch.compile(fullgraph=True)``.

Printed: the minimum over rounds of each (the least disturbed), and the
glue, ``cfbn path - floor - raw``: what the PyTorch side adds beyond
autograd's own cost and the kernels' NumPy call.

    python benchmarks/torch_overhead.py [--shape 8x16x8x8] [--threads 1] [--rounds 15] [--compiled]
"""
import argparse
import sys

import torch
import torch.nn as nn

import cfbn
import cfbn.torch as ct
from _bench_common import BUSY, CpuMeter, cpu_model, interleaved


def calls(shape, compiled):
    """name -> callable of one forward + backward."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).requires_grad_()
    dy = torch.randn(shape, generator=gen)
    c = shape[1]
    ours, ref = ct.BatchNorm2d(c), nn.BatchNorm2d(c)
    w, b = ours.weight, ours.bias
    rm, rv = torch.zeros(c), torch.ones(c)

    def clear(*ts):
        for t in ts:
            t.grad = None

    def floor():
        clear(x)
        x.mul(1.0).backward(dy)

    xa = x.detach().numpy()
    dya = dy.numpy()
    wa, ba = w.detach().numpy(), b.detach().numpy()
    ma, va = rm.numpy(), rv.numpy()

    def raw():
        f = cfbn.fused_batch_norm(xa, wa, ba, ma, va, epsilon=1e-5, data_format="NCHW",
                                  exponential_avg_factor=0.1)
        cfbn.fused_batch_norm_grad(dya, xa, wa, f[3], f[4], epsilon=1e-5, data_format="NCHW")

    def module():
        clear(x, w, b)
        ours(x).backward(dy)

    def bridge():
        old = ct.set_path("cfbn")
        try:
            module()
        finally:
            ct.set_path(old)

    def operator():
        clear(x, w, b)
        y = torch.ops.cfbn.batch_norm(x, w, b, rm, rv, None, True, 0.1, 1e-5, 0, 0.0, None)[0]
        y.backward(dy)

    def torch_nn():
        clear(x, ref.weight, ref.bias)
        ref(x).backward(dy)

    fns = {"floor": floor, "raw": raw, "cfbn.torch": module, "cfbn path": bridge,
           "operator": operator, "nn": torch_nn}
    if compiled:
        ours_c = torch.compile(ours, fullgraph=True)
        ref_c = torch.compile(ref, fullgraph=True)

        def compiled_ours():
            clear(x, w, b)
            ours_c(x).backward(dy)

        def compiled_nn():
            clear(x, ref.weight, ref.bias)
            ref_c(x).backward(dy)

        compiled_ours()
        compiled_nn()
        fns.update({"cfbn.torch compiled": compiled_ours, "nn compiled": compiled_nn})
    return fns


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="8x16x8x8", help="NxCxHxW, contiguous")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--min-batch-ms", type=float, default=20.0)
    ap.add_argument("--compiled", action="store_true",
                    help="also both modules under torch.compile(fullgraph=True)")
    args = ap.parse_args(argv)
    shape = tuple(int(v) for v in args.shape.split("x"))
    torch.set_num_threads(args.threads)
    fns = calls(shape, args.compiled)
    names = list(fns)
    meter = CpuMeter()
    samples = interleaved([fns[n] for n in names], args.rounds, args.min_batch_ms / 1e3)
    best = {name: min(s) for name, s in zip(names, samples)}
    others = meter.others()
    print("Training forward + backward of %s float32, %d thread(s); torch %s, cfbn %s; %s"
          % (shape, args.threads, torch.__version__, cfbn.__version__, cpu_model()))
    print("minimum over %d interleaved rounds\n" % args.rounds)
    print("| call | us |")
    print("|---|---:|")
    for name in names:
        print("| %s | %.1f |" % (name, best[name] * 1e6))
    print("| glue: cfbn path - floor - raw | %.1f |"
          % ((best["cfbn path"] - best["floor"] - best["raw"]) * 1e6))
    print("| cfbn.torch / nn | %.2f |" % (best["cfbn.torch"] / best["nn"]))
    if args.compiled:
        print("| cfbn.torch compiled / nn compiled | %.2f |"
              % (best["cfbn.torch compiled"] / best["nn compiled"]))
    if others is not None and others > BUSY:
        print("\nwarning: other processes used %.1f CPUs meanwhile" % others)
    return 0


if __name__ == "__main__":
    sys.exit(main())
