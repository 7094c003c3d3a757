"""Time of a synchronized batch-norm training step against a local one.

Run under MPI, one OpenMP thread per rank on a small machine:

    OMP_NUM_THREADS=1 mpirun -n 2 python benchmarks/sync_step.py [--repeats 50]

(Open MPI as root also needs --allow-run-as-root, and --oversubscribe for more
ranks than cores.)  Every rank holds an equal shard of the global batch.  A
step is forward + gradient: `fused_batch_norm` + `fused_batch_norm_grad` on
the shard alone ("local", what unsynchronized data parallelism computes)
against `sync_batch_norm` + `sync_batch_norm_grad` (statistics of the whole
batch: one Allgather and one Allreduce of 2C + 1 doubles).  Rank 0 prints the
median over the repeats of the slowest rank's time, since a collective step
ends with the slowest rank.
"""
import argparse
import os
import time

import numpy as np
from mpi4py import MPI

import cfbn
from cfbn.distributed import sync_batch_norm, sync_batch_norm_grad

# (global batch, H, W, C) in NHWC: a ResNet-50 stage-1 shape, a late stage, a small MLP-like one
SHAPES = [(32, 56, 56, 64), (64, 7, 7, 2048), (256, 1, 1, 512)]


def _time(comm, fn, repeats):
    fn()  # warm up (pages, thread pool)
    times = []
    for _ in range(repeats):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        times.append(comm.allreduce(dt, op=MPI.MAX))
    return float(np.median(times))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    dtype = np.dtype(args.dtype)
    if rank == 0:
        print("ranks %d, OMP_NUM_THREADS=%s, %s, ISA %s, median of %d"
              % (size, os.environ.get("OMP_NUM_THREADS", "unset"), dtype,
                 cfbn.runtime_info()["selected_isa"], args.repeats))
        print("%-22s %-18s %12s %12s %9s" % ("global NHWC", "shard", "local ms", "sync ms",
                                             "overhead"))
    for n, h, w, c in SHAPES:
        rng = np.random.default_rng(rank)
        local_n = n // size
        x = rng.standard_normal((local_n, h, w, c)).astype(dtype)
        dy = rng.standard_normal(x.shape).astype(dtype)
        scale = np.ones(c, dtype)
        offset = np.zeros(c, dtype)

        def local_step():
            out = cfbn.fused_batch_norm(x, scale, offset)
            cfbn.fused_batch_norm_grad(dy, x, scale, out.reserve_space_1, out.reserve_space_2)

        def sync_step():
            out = sync_batch_norm(x, scale, offset, comm=comm)
            sync_batch_norm_grad(dy, x, scale, out.reserve_space_1, out.reserve_space_2,
                                 comm=comm)

        t_local = _time(comm, local_step, args.repeats)
        t_sync = _time(comm, sync_step, args.repeats)
        if rank == 0:
            print("%-22s %-18s %12.3f %12.3f %8.1f%%"
                  % ((n, h, w, c), x.shape, 1e3 * t_local, 1e3 * t_sync,
                     100.0 * (t_sync / t_local - 1.0)))


if __name__ == "__main__":
    main()
