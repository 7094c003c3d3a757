"""Synchronized batch norm under a real MPI, against one process on the whole batch.

Run by tests/test_distributed.py, or by hand:

    OMP_NUM_THREADS=1 mpirun -n 3 python -m mpi4py tests/mpi/sync_check.py

Every rank cuts its shard (uneven, some empty) out of the same seeded batch,
runs `sync_batch_norm` and `sync_batch_norm_grad`, and sends its results to
rank 0, which compares the concatenation with `fused_batch_norm` /
`fused_batch_norm_grad` on the whole batch and with the float64 reference.
Rank 0 prints one line per failure and a closing "N passed, N failed" line;
the exit status is 1 on any failure, on every rank.
"""
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import cfbn  # noqa: E402
from cfbn.distributed import sync_batch_norm, sync_batch_norm_grad  # noqa: E402

import _checks  # noqa: E402

FORMATS = ["NHWC", "NCHW", "NC", "NCDHW"]
DTYPES = _checks.DTYPES
SPATIAL = 6


def splits(size):
    """Batch sizes per rank: uneven with an empty shard, uneven, all on one rank, all empty."""
    uneven_empty = [3, 0, 2, 1][:size] if size > 2 else [3, 0]
    uneven = [1 + 2 * r for r in range(size)]
    one = [0] * size
    one[size - 1] = 4
    return {"uneven_empty": uneven_empty, "uneven": uneven, "one_rank": one,
            "all_empty": [0] * size}


def shard(full, sizes, rank, rows_per_sample):
    start = sum(sizes[:rank]) * rows_per_sample
    return np.ascontiguousarray(full[start:start + sizes[rank] * rows_per_sample])


def within_ulps(got, want, scale, n):
    """True where got is within n units of roundoff of `scale` (the data's size) of want.

    Ulps of the data's size, not of the value: a mean near 0 next to a spread
    of 1 is only known to the spread's ulp, by any summation order.
    """
    eps = float(np.finfo(got.dtype).eps)
    got, want = got.astype(np.float64), want.astype(np.float64)
    both_nan = np.isnan(got) & np.isnan(want)
    return np.all(both_nan | (np.abs(got - want) <= n * eps * scale))


def check_case(fmt, dtype, kind, sizes, factor, results):
    """Rank 0: compare the gathered per-rank results with the single-process ones."""
    x_full, dy_full, vec = results["full"]
    ys, fwds, grads = zip(*results["ranks"])
    vdt = _checks.vector_dtype(dtype)
    y = np.concatenate(ys)
    fwd = fwds[0]
    grad = grads[0]
    # identical statistics and parameter gradients on every rank, bit for bit
    for r, (f, g) in enumerate(zip(fwds, grads)):
        for a, b in zip(f + g, fwd + grad):
            assert a.tobytes() == b.tobytes(), "rank %d disagrees with rank 0" % r
    kw = dict(epsilon=1e-3, data_format=fmt)
    mean = vec["mean"] if factor != 1.0 else None
    variance = vec["variance"] if factor != 1.0 else None
    fused = cfbn.fused_batch_norm(x_full, vec["scale"], vec["offset"], mean, variance,
                                  exponential_avg_factor=factor, **kw)
    got = cfbn.BatchNormOutput(y, *fwd)
    if x_full.size == 0:
        assert y.shape == x_full.shape and y.dtype == x_full.dtype
        assert np.all(np.isnan(fwd[2])) and np.all(np.isnan(fwd[3]))
        assert not np.any(grad[0]) and not np.any(grad[1])
        return
    _checks.check_forward(got, x_full, vec["scale"], vec["offset"], mean, variance,
                          exponential_avg_factor=factor, is_training=True, **kw)
    fused_grad = cfbn.fused_batch_norm_grad(dy_full, x_full, vec["scale"], fwd[2], fwd[3], **kw)
    dx = results["dx"]
    got_grad = cfbn.BatchNormGrad(dx, *grad)
    _checks.check_grad(got_grad, dy_full, x_full, vec["scale"], fwd[2], fwd[3],
                       is_training=True, **kw)
    if kind == "one_rank":
        # one rank holds the whole batch: every merge and sum is the identity
        for name, a, b in zip(fused._fields, got, fused):
            assert a.tobytes() == b.tobytes(), "%s differs from fused_batch_norm" % name
        for name, a, b in zip(fused_grad._fields, got_grad, fused_grad):
            assert a.tobytes() == b.tobytes(), "%s differs from fused_batch_norm_grad" % name
        return
    # the global statistics within a few ulps of the fused ones on the concatenation
    mu = fused.reserve_space_1.astype(np.float64)
    var = fused.reserve_space_2.astype(np.float64)
    sigma = np.sqrt(var)
    size = np.abs(mu) + sigma
    scales = {"reserve_space_1": size, "reserve_space_2": 2 * var + size * sigma}
    scales["batch_mean"] = scales["reserve_space_1"] + (
        0.0 if mean is None else np.abs(mean.astype(np.float64)))
    scales["batch_variance"] = scales["reserve_space_2"] + (
        0.0 if variance is None else np.abs(variance.astype(np.float64)))
    for name, scale in scales.items():
        a, b = getattr(got, name), getattr(fused, name)
        assert a.dtype == vdt
        assert within_ulps(a, b, scale, 4 if vdt == np.float32 else 64), (name, a, b)
    # y and the gradient within float32 rounding of the fused results
    bounds = _checks.forward_bounds(x_full, vec["scale"], vec["offset"], mean, variance,
                                    cfbn.reference.fused_batch_norm(
                                        x_full, vec["scale"], vec["offset"], mean, variance,
                                        exponential_avg_factor=factor, **kw),
                                    is_training=True, exponential_avg_factor=factor, **kw)
    _checks.assert_close("y vs fused", y, fused.y.astype(np.float64), 2 * bounds["y"])
    gb = _checks.grad_bounds(dy_full, x_full, vec["scale"], fwd[2], fwd[3], is_training=True,
                             **kw)
    for name in fused_grad._fields:
        _checks.assert_close(name + " vs fused", getattr(got_grad, name),
                             getattr(fused_grad, name).astype(np.float64), 2 * gb[name])


def main():
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    passed = failed = 0
    for kind, sizes in splits(size).items():
        for fmt in FORMATS:
            for dtype in DTYPES:
                for factor in (1.0, 0.25):
                    if factor != 1.0 and kind != "uneven_empty":
                        continue
                    case = (kind, fmt, np.dtype(dtype).name, factor)
                    rng = np.random.default_rng(_checks.seed_of(*case))
                    total = sum(sizes)
                    channels = 17 if fmt == "NHWC" else 5
                    shape = _checks.make_shape(fmt, total, SPATIAL, channels)
                    rows = _checks.make_shape(fmt, 1, SPATIAL, channels)[0]
                    x_full = _checks.random_x(rng, shape, fmt, dtype)
                    dy_full = _checks.random_x(rng, shape, fmt, dtype, loc=0.0, std=1.0)
                    vec = _checks.random_vectors(rng, channels, dtype)
                    x = shard(x_full, sizes, rank, rows)
                    dy = shard(dy_full, sizes, rank, rows)
                    kw = dict(epsilon=1e-3, data_format=fmt, comm=comm)
                    if factor != 1.0:
                        out = sync_batch_norm(x, vec["scale"], vec["offset"], vec["mean"],
                                              vec["variance"], exponential_avg_factor=factor,
                                              **kw)
                    else:
                        out = sync_batch_norm(x, vec["scale"], vec["offset"], **kw)
                    grad = sync_batch_norm_grad(dy, x, vec["scale"], out.reserve_space_1,
                                                out.reserve_space_2, **kw)
                    gathered = comm.gather((out.y, tuple(out[1:]), tuple(grad[1:])), root=0)
                    dxs = comm.gather(grad.x_backprop, root=0)
                    if rank != 0:
                        continue
                    try:
                        check_case(fmt, dtype, kind, sizes, factor,
                                   {"full": (x_full, dy_full, vec), "ranks": gathered,
                                    "dx": np.concatenate(dxs)})
                        passed += 1
                    except Exception:
                        failed += 1
                        print("FAILED %s sizes=%s" % (case, sizes))
                        traceback.print_exc()
    failed = comm.bcast(failed, root=0)
    if rank == 0:
        print("mpi ranks=%d: %d passed, %d failed" % (size, passed, failed))
        sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
