"""cfbn.torch.SyncBatchNorm over torch.distributed (gloo) against one process.

The multi-rank tests start W processes (this file run as a script, one per
rank; see _ranks.py).  Every rank checks its shard's output, x and side
input gradients and running statistics against cfbn.torch.BatchNorm on the
concatenated batch, that the statistics are bit-identical on every rank,
and that the weight and bias gradients summed over the ranks are the whole
batch's; then that ranks which disagree all raise.  Process starts cost
seconds, so each test runs every case in one group of processes.  The
single-process tests check the split kernels' path itself: gradcheck, torch's
own batch norm plus the activation, and the module's surface.
"""
import re
import sys

import pytest

import _ranks

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

import cfbn.torch as ct  # noqa: E402
from cfbn.torch._sync_function import SyncFunction  # noqa: E402

nn = torch.nn
F = torch.nn.functional

CASES = [
    # (shape after N, memory format, dtype name, momentum, affine, activation, side input)
    ((4, 5, 3), "contiguous", "float32", 0.1, True, None, False),
    ((4, 5, 3), "channels_last", "float32", None, True, "relu", True),
    ((3,), "contiguous", "float64", 0.1, False, "silu", False),
    ((3, 7), "contiguous", "float32", 0.3, True, None, False),
    ((2, 3, 2, 2), "contiguous", "float64", None, True, "elu", True),
    ((3, 4), "contiguous", "float64", 0.1, True, "leaky_relu", True),
    # 16-bit input with float32 parameters and statistics, as under autocast
    ((3, 2, 2), "channels_last", "bfloat16", 0.1, True, None, False),
    # 6-D, which nn.SyncBatchNorm accepts; the reference sees it flattened
    ((2, 2, 1, 2, 2), "contiguous", "float32", 0.1, True, "tanh", True),
]


def _flat(t):
    return t if t is None or t.dim() <= 5 else t.flatten(2)


def _cases_worker(rank, world, sizes):
    starts = [sum(sizes[:i]) for i in range(world + 1)]
    lo, hi = starts[rank], starts[rank + 1]
    reference_kind = {1: ct.BatchNorm1d, 2: ct.BatchNorm1d, 3: ct.BatchNorm2d,
                      4: ct.BatchNorm3d, 5: ct.BatchNorm1d}
    for i, (rest, fmt, dtype_name, momentum, affine, act, side) in enumerate(CASES):
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
        sync = ct.SyncBatchNorm(channels, momentum=momentum, affine=affine, dtype=param_dtype,
                                activation=act)
        ref = reference_kind[len(rest)](channels, momentum=momentum, affine=affine,
                                        dtype=param_dtype, activation=act)
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
            s = torch.randn(full.shape, generator=gen, dtype=dtype) if side else None
            if fmt == "channels_last":
                full = full.contiguous(memory_format=torch.channels_last)
            xs = full[lo:hi].clone(memory_format=torch.preserve_format).requires_grad_()
            xf = full.clone(memory_format=torch.preserve_format).requires_grad_()
            ss = sf = None
            if side:
                ss = s[lo:hi].clone().requires_grad_()
                sf = s.clone().requires_grad_()
            y = sync(xs, ss)
            yf = ref(_flat(xf), _flat(sf)).reshape(full.shape)
            (y * g[lo:hi]).sum().backward()
            (yf * g).sum().backward()
            torch.testing.assert_close(y, yf[lo:hi], **out_tol)
            torch.testing.assert_close(xs.grad, xf.grad[lo:hi], **out_tol)
            if side:
                torch.testing.assert_close(ss.grad, sf.grad[lo:hi], **out_tol)
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
        s = torch.randn(x.shape, generator=gen, dtype=dtype) if side else None
        torch.testing.assert_close(sync(x, s), ref(_flat(x), _flat(s)).reshape(x.shape),
                                   **out_tol)
        # the state_dict is nn.BatchNorm's
        plain = torch.nn.SyncBatchNorm(channels, momentum=momentum, affine=affine,
                                       dtype=param_dtype)
        plain.load_state_dict(sync.state_dict())


def _raises(kind, pattern, f, *args):
    try:
        f(*args)
    except kind as exc:
        assert re.search(pattern, str(exc)), str(exc)
        return
    raise AssertionError("no %s matching %r" % (kind.__name__, pattern))


def _mismatch_worker(rank, world):
    assert world == 2
    other_dtype = (torch.float32, torch.float64)[rank]
    x = torch.randn(4, 3, 2)
    # A module's first synchronized forward: the prefixes are gathered alone.
    _raises(ValueError, r"num_features: .*3 on rank 0, 4 on rank 1",
            ct.SyncBatchNorm(3 + rank), torch.randn(4, 3 + rank, 2))
    _raises(TypeError, r"input dtype: .*torch.float32 on rank 0, torch.float64 on rank 1",
            ct.SyncBatchNorm(3), x.to(other_dtype))
    refused = (ValueError, r"expected at least 2D input") if rank else \
        (RuntimeError, r"rank 1 of the process group refused its input")
    _raises(*refused, ct.SyncBatchNorm(3), x if rank == 0 else x[:, 0, 0])
    # without per-channel tensors any count will do, but the same on every rank
    _raises(ValueError, r"the same number of channels .*3 on rank 0, 4 on rank 1",
            ct.SyncBatchNorm(3, affine=False, track_running_stats=False),
            torch.randn(4, 3 + rank, 2))
    # Once agreed, the checks ride in the statistics row itself.
    bn = ct.SyncBatchNorm(3)
    bn(x)
    _raises(ValueError, r"num_features=3 channels \(the length of weight and running_mean\)"
            r".*3 on rank 0, 4 on rank 1", bn, torch.randn(4, 3 + rank, 2))
    _raises(TypeError, r"input dtype: ", bn, x.to(other_dtype))
    refused = (ValueError, r"side_input: expected the input's shape") if rank else \
        (RuntimeError, r"rank 1 of the process group refused its input")
    _raises(*refused, bn, x, torch.randn(4, 3, 2 - rank))
    # and the group is still in step
    before = bn.running_mean.clone()
    bn(x).sum().backward()
    assert not torch.equal(bn.running_mean, before)


def _skipped_backward_worker(rank, world):
    """Rank 1 skips a backward: its next forward's gather meets rank 0's
    backward gather, and both raise the same error (gloo aborted before the
    rows carried their kind)."""
    assert world == 2
    bn = ct.SyncBatchNorm(3)
    x = torch.randn(4, 3, 2, requires_grad=True)
    bn(x).sum().backward()          # agreed, and in step
    y = bn(x)
    out_of_step = (RuntimeError, r"out of step: a backward on rank 0, a forward on rank 1")
    if rank == 0:
        _raises(*out_of_step, y.sum().backward)
    else:
        _raises(*out_of_step, bn, x)


def _teardown_worker(rank, world):
    """Nothing of cfbn's keeps a gather's Work, or the process group, past
    destroy_process_group: a Work destroyed after its group, at interpreter
    exit, aborts the process in gloo ("terminate called without an active
    exception").  The garbage collector is off, so a reference cycle would
    keep them too."""
    import gc
    import weakref

    from cfbn.torch import _sync_check

    gc.disable()
    works = []
    start = _sync_check.start

    def recording_start(*args):
        pending = start(*args)
        works.append(weakref.ref(pending.work))
        return pending

    _sync_check.start = recording_start
    x = torch.randn(4, 3, 2, requires_grad=True)
    # a refused input (raised in the frame that caught it), then every gather
    refused = (ValueError, r"expected at least 2D input") if rank else \
        (RuntimeError, r"rank 1 of the process group refused its input")
    _raises(*refused, ct.SyncBatchNorm(3), x if rank == 0 else x[:, 0, 0])
    bn = ct.SyncBatchNorm(3, activation="relu")
    bn(x).sum().backward()
    kept = bn(x)                    # an output and its graph held to the end
    plain = ct.SyncBatchNorm(3, affine=False, track_running_stats=False)
    kept_too = plain(x)             # the prefix gathered on every call
    assert len(works) == 3, works
    group = weakref.ref(dist.group.WORLD)
    dist.barrier()
    dist.destroy_process_group()
    alive = [w for w in works if w() is not None]
    assert not alive, "%d gathers' Work outlived the group" % len(alive)
    assert group() is None, "the destroyed group is still referenced by %s" % [
        type(r).__name__ for r in gc.get_referrers(group())]
    assert kept.grad_fn is not None and kept_too.grad_fn is not None
    gc.enable()


def _worker(rank, world, store, mode, sizes=None):
    # the single-process references on cfbn's operators, as in the tests'
    # own process (conftest.py), not PyTorch's path for small inputs
    ct.set_path("cfbn")
    _ranks.init(rank, world, store)
    if mode == "teardown":
        _teardown_worker(rank, world)
        return
    if mode == "cases":
        _cases_worker(rank, world, [int(s) for s in sizes.split(",")])
    elif mode == "skip":
        _skipped_backward_worker(rank, world)
    else:
        _mismatch_worker(rank, world)
    dist.barrier()
    dist.destroy_process_group()


ACTIVATIONS = [None, "relu", "relu6", ("leaky_relu", 0.2), ("elu", 0.7), "sigmoid", "tanh",
               "silu"]


def _split_case(activation, seed=0):
    """float64 (x, weight, bias, side input) with every value's gradient
    wanted, and the activation's (name, alpha)."""
    name, alpha = activation if isinstance(activation, tuple) else (activation, None)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(5, 3, 4, generator=gen, dtype=torch.float64) * 2 + 1
    w = torch.randn(3, generator=gen, dtype=torch.float64)
    b = torch.randn(3, generator=gen, dtype=torch.float64)
    s = torch.randn(5, 3, 4, generator=gen, dtype=torch.float64)
    # relu6's upper kink inside the data's range
    s[0] += 6.0
    return [t.requires_grad_() for t in (x, w, b, s)], name, alpha


def _split(x, w, b, s, name, alpha, eps=1e-5):
    return SyncFunction.apply(x, w, b, s, None, None, 0.0, eps, name, alpha, None, None)


@pytest.mark.parametrize("activation", ACTIVATIONS, ids=str)
def test_split_path_gradcheck(activation):
    """The gradients of the multi-rank path's autograd function (one rank)."""
    inputs, name, alpha = _split_case(activation)
    assert torch.autograd.gradcheck(lambda *a: _split(*a, name, alpha), inputs)


@pytest.mark.parametrize("activation", ACTIVATIONS, ids=str)
def test_split_path_is_torch_batch_norm_then_the_activation(activation):

    (x, w, b, s), name, alpha = _split_case(activation, seed=1)
    y = _split(x, w, b, s, name, alpha)
    z = F.batch_norm(x, None, None, w, b, True, 0.0, 1e-5) + s
    yt = {None: lambda v: v, "relu": F.relu, "relu6": F.relu6, "sigmoid": torch.sigmoid,
          "tanh": torch.tanh, "silu": F.silu, "leaky_relu": lambda v: F.leaky_relu(v, alpha),
          "elu": lambda v: F.elu(v, alpha)}[name](z)
    torch.testing.assert_close(y, yt, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, w, b, s), g)
    want = torch.autograd.grad(yt, (x, w, b, s), g)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)


def test_momentum_outside_the_unit_interval_is_nn_batch_norms():
    for momentum in (1.5, -0.5):
        mine = ct.SyncBatchNorm(3, momentum=momentum, dtype=torch.float64)
        theirs = torch.nn.BatchNorm1d(3, momentum=momentum, dtype=torch.float64)
        for seed in range(2):
            x = torch.randn(6, 3, 2, generator=torch.Generator().manual_seed(seed),
                            dtype=torch.float64)
            torch.testing.assert_close(mine(x), theirs(x))
            torch.testing.assert_close(mine.running_mean, theirs.running_mean)
            torch.testing.assert_close(mine.running_var, theirs.running_var)
        assert int(mine.num_batches_tracked) == 2


def test_channel_mismatch_names_num_features():
    with pytest.raises(ValueError, match=r"num_features=5 channels \(the length of weight and "
                                         r"running_mean\), got input of shape \[4, 3, 2\]"):
        ct.SyncBatchNorm(5)(torch.randn(4, 3, 2))
    with pytest.raises(ValueError, match=r"the length of running_mean\)"):
        ct.SyncBatchNorm(5, affine=False).eval()(torch.randn(4, 3, 2))


def test_module_surface():
    bn = ct.SyncBatchNorm(4, 1e-3, 0.2, True, True, None, None, torch.float64,
                          activation="leaky_relu", alpha=0.3)
    assert isinstance(bn, nn.modules.batchnorm._BatchNorm)
    # DistributedDataParallel refuses a CPU model holding an nn.SyncBatchNorm
    assert not isinstance(bn, nn.SyncBatchNorm)
    assert (bn.eps, bn.momentum, bn.process_group, bn.weight.dtype) == (1e-3, 0.2, None,
                                                                       torch.float64)
    assert "activation='leaky_relu', alpha=0.3" in repr(bn)
    with pytest.raises(ValueError, match="activation"):
        ct.SyncBatchNorm(4, activation="gelu")
    with pytest.raises(ValueError, match="alpha"):
        ct.SyncBatchNorm(4, activation="relu", alpha=0.1)
    with pytest.raises(ValueError, match="expected at least 2D input"):
        bn(torch.randn(4, dtype=torch.float64))
    plain = nn.SyncBatchNorm(4, dtype=torch.float64)
    plain.load_state_dict(bn.state_dict())
    bn.load_state_dict(plain.state_dict())
    group = object()
    model = ct.SyncBatchNorm.convert_sync_batchnorm(
        nn.Sequential(nn.BatchNorm2d(4), nn.Sequential(nn.BatchNorm1d(2))), group)
    assert [type(m) for m in (model[0], model[1][0])] == [ct.SyncBatchNorm] * 2
    assert model[1][0].process_group is group


def test_two_ranks_uneven(tmp_path):
    _ranks.run(__file__, tmp_path, 2, "cases", "3,5")


def test_three_ranks_with_an_empty_shard(tmp_path):
    _ranks.run(__file__, tmp_path, 3, "cases", "4,0,3")


def test_ranks_that_disagree_all_raise(tmp_path):
    _ranks.run(__file__, tmp_path, 2, "mismatch")


def test_a_skipped_backward_raises_on_every_rank(tmp_path):
    _ranks.run(__file__, tmp_path, 2, "skip")


def test_no_gather_or_group_outlives_destroy_process_group(tmp_path):
    _ranks.run(__file__, tmp_path, 2, "teardown")


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:])
