"""cfbn.torch.SyncBatchNorm over torch.distributed (gloo) against one process.

Each test starts W processes (this file run as a script, one per rank) that
share a file:// store.  Every rank checks its shard's output, x gradient and
running statistics against cfbn.torch.BatchNorm on the concatenated batch,
that the statistics are bit-identical on every rank, and that the weight and
bias gradients summed over the ranks are the whole batch's.  Process starts
cost seconds, so each test runs every case in one group of processes.
"""
import os
import subprocess
import sys

import pytest

CASES = [
    # (shape after N, memory format, dtype name, momentum, affine)
    ((4, 5, 3), "contiguous", "float32", 0.1, True),
    ((4, 5, 3), "channels_last", "float32", None, True),
    ((3,), "contiguous", "float64", 0.1, False),
    ((3, 7), "contiguous", "float32", 0.3, True),
    ((2, 3, 2, 2), "contiguous", "float64", None, True),
    # 16-bit input with float32 parameters and statistics, as under autocast
    ((3, 2, 2), "channels_last", "bfloat16", 0.1, True),
    # 6-D, which nn.SyncBatchNorm accepts; the reference sees it flattened
    ((2, 2, 1, 2, 2), "contiguous", "float32", 0.1, True),
]


def _worker(rank, world, store, sizes):
    import torch
    import torch.distributed as dist

    import cfbn.torch as ct

    dist.init_process_group("gloo", init_method="file://" + store, rank=rank,
                            world_size=world)
    starts = [sum(sizes[:i]) for i in range(world + 1)]
    lo, hi = starts[rank], starts[rank + 1]
    reference_kind = {1: ct.BatchNorm1d, 2: ct.BatchNorm1d, 3: ct.BatchNorm2d,
                      4: ct.BatchNorm3d, 5: ct.BatchNorm1d}
    for i, (rest, fmt, dtype_name, momentum, affine) in enumerate(CASES):
        dtype = getattr(torch, dtype_name)
        tol = dict(rtol=1e-5, atol=1e-5) if dtype is torch.float32 else {}
        # one 16-bit rounding of y or dx may land either side of a tie
        out_tol = dict(rtol=1.6e-2, atol=1e-2) if dtype is torch.bfloat16 else tol
        half = dtype is torch.bfloat16
        param_dtype = torch.float32 if half else dtype
        if half:
            tol = dict(rtol=1e-4, atol=1e-4)
        channels = rest[0]
        gen = torch.Generator().manual_seed(1234 + i)
        sync = ct.SyncBatchNorm(channels, momentum=momentum, affine=affine, dtype=param_dtype)
        ref = reference_kind[len(rest)](channels, momentum=momentum, affine=affine,
                                        dtype=param_dtype)
        if affine:
            with torch.no_grad():
                w = torch.randn(channels, generator=gen, dtype=param_dtype)
                b = torch.randn(channels, generator=gen, dtype=param_dtype)
                for m in (sync, ref):
                    m.weight.copy_(w)
                    m.bias.copy_(b)
        for step in range(2):
            full = torch.randn((starts[-1],) + rest, generator=gen, dtype=dtype) * 3 + 5
            g = torch.randn(full.shape, generator=gen, dtype=dtype)
            if fmt == "channels_last":
                full = full.contiguous(memory_format=torch.channels_last)
            xs = full[lo:hi].clone(memory_format=torch.preserve_format).requires_grad_()
            xf = full.clone(memory_format=torch.preserve_format).requires_grad_()
            y = sync(xs)
            yf = ref(xf if len(rest) < 5 else xf.flatten(2)).reshape(full.shape)
            (y * g[lo:hi]).sum().backward()
            (yf * g).sum().backward()
            torch.testing.assert_close(y, yf[lo:hi], **out_tol)
            torch.testing.assert_close(xs.grad, xf.grad[lo:hi], **out_tol)
            if fmt == "channels_last" and hi > lo:
                assert y.is_contiguous(memory_format=torch.channels_last)
            for name in ("running_mean", "running_var"):
                mine = getattr(sync, name)
                torch.testing.assert_close(mine, getattr(ref, name), **tol)
                rows = [torch.empty_like(mine) for _ in range(world)]
                dist.all_gather(rows, mine)
                assert all(torch.equal(r, rows[0]) for r in rows), name
            assert int(sync.num_batches_tracked) == step + 1
            if affine:
                for name in ("weight", "bias"):
                    mine = getattr(sync, name).grad.clone()
                    dist.all_reduce(mine)
                    torch.testing.assert_close(mine, getattr(ref, name).grad, **tol)
                    getattr(sync, name).grad = None
                    getattr(ref, name).grad = None
        sync.eval()
        ref.eval()
        x = torch.randn((max(hi - lo, 1),) + rest, generator=gen, dtype=dtype)
        torch.testing.assert_close(
            sync(x), ref(x if len(rest) < 5 else x.flatten(2)).reshape(x.shape), **out_tol)
        # the state_dict is nn.BatchNorm's
        plain = torch.nn.SyncBatchNorm(channels, momentum=momentum, affine=affine,
                                       dtype=param_dtype)
        plain.load_state_dict(sync.state_dict())
    dist.barrier()
    dist.destroy_process_group()


def _run(tmp_path, sizes):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    store = str(tmp_path / "store")
    # the ranks import the cfbn this process imported (an installed one, or
    # the source tree's in-place build)
    import cfbn
    root = os.path.dirname(os.path.dirname(os.path.abspath(cfbn.__file__)))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)
    procs = [subprocess.Popen([sys.executable, __file__, str(r), str(len(sizes)), store,
                               ",".join(map(str, sizes))], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in range(len(sizes))]
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append((p.returncode, out.decode(errors="replace")))
    assert torch is not None
    for rank, (rc, out) in enumerate(outs):
        assert rc == 0, "rank %d failed:\n%s" % (rank, out)


def test_two_ranks_uneven(tmp_path):
    _run(tmp_path, [3, 5])


def test_three_ranks_with_an_empty_shard(tmp_path):
    _run(tmp_path, [4, 0, 3])


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
            [int(s) for s in sys.argv[4].split(",")])
