"""cfbn.distributed: synchronized batch norm.

In-process tests run everywhere with stand-in communicators (one rank, or
several ranks as threads); the real test launches tests/mpi/sync_check.py
under ``mpirun -n 2`` and ``-n 3`` and is skipped, with the reason, where
mpirun or mpi4py is missing (set CFBN_REQUIRE_MPI=1 to make that a failure).
"""
import importlib.util
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import cfbn
from cfbn.distributed import sync_batch_norm, sync_batch_norm_grad

from _checks import (DTYPES, check_forward, check_grad, make_shape, random_vectors, random_x,
                     seed_of)

HERE = Path(__file__).resolve().parent
EPS = 1e-3


class _Exchange:
    def __init__(self, size):
        self.size = size
        self.slots = [None] * size
        self.barrier = threading.Barrier(size, timeout=60)


class _ThreadComm:
    """The two collectives cfbn uses, between threads standing in for ranks."""

    def __init__(self, rank, exchange):
        self.rank, self.exchange = rank, exchange

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.exchange.size

    def _all(self, send):
        ex = self.exchange
        ex.slots[self.rank] = np.array(send, copy=True)
        ex.barrier.wait()
        rows = list(ex.slots)
        ex.barrier.wait()
        return rows

    def Allgather(self, send, recv):
        recv[...] = np.stack(self._all(send))

    def Allreduce(self, send, recv):
        rows = self._all(send)
        total = rows[0].copy()
        for r in rows[1:]:
            total += r
        recv[...] = total


def _run_ranks(sizes, fmt, dtype, factor=1.0):
    rng = np.random.default_rng(seed_of("dist", tuple(sizes), fmt, np.dtype(dtype).name))
    c = 5
    x_full = random_x(rng, make_shape(fmt, sum(sizes), 6, c), fmt, dtype)
    dy_full = random_x(rng, x_full.shape, fmt, dtype, loc=0.0, std=1.0)
    v = random_vectors(rng, c, dtype)
    rows = make_shape(fmt, 1, 6, c)[0]
    bounds = np.cumsum([0] + list(sizes)) * rows
    exchange = _Exchange(len(sizes))
    running = (v["mean"], v["variance"]) if factor != 1.0 else (None, None)

    def rank(r):
        comm = _ThreadComm(r, exchange)
        x = x_full[bounds[r]:bounds[r + 1]]
        dy = dy_full[bounds[r]:bounds[r + 1]]
        out = sync_batch_norm(x, v["scale"], v["offset"], *running, epsilon=EPS,
                              exponential_avg_factor=factor, data_format=fmt, comm=comm)
        grad = sync_batch_norm_grad(dy, x, v["scale"], out.reserve_space_1, out.reserve_space_2,
                                    epsilon=EPS, data_format=fmt, comm=comm)
        return out, grad

    with ThreadPoolExecutor(len(sizes)) as pool:
        results = list(pool.map(rank, range(len(sizes))))
    return x_full, dy_full, v, running, results


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW", "NC", "NDHWC"])
def test_one_rank_equals_fused_bit_for_bit(isa, fmt, dtype):
    x, dy, v, _, [(out, grad)] = _run_ranks([4], fmt, dtype)
    fused = cfbn.fused_batch_norm(x, v["scale"], v["offset"], epsilon=EPS, data_format=fmt)
    fgrad = cfbn.fused_batch_norm_grad(dy, x, v["scale"], fused.reserve_space_1,
                                       fused.reserve_space_2, epsilon=EPS, data_format=fmt)
    for name, a, b in zip(fused._fields + fgrad._fields, out + grad, fused + fgrad):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), name


@pytest.mark.parametrize("factor", [1.0, 0.25])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("sizes", [[3, 0, 2], [1, 2, 4, 0], [0, 0, 5]])
def test_thread_ranks_equal_whole_batch(sizes, fmt, dtype, factor):
    x, dy, v, running, results = _run_ranks(sizes, fmt, dtype, factor)
    outs, grads = zip(*results)
    for out, grad in results:  # every rank holds the same global results, bit for bit
        for a, b in zip(out[1:] + grad[1:], outs[0][1:] + grads[0][1:]):
            assert a.tobytes() == b.tobytes()
    got = cfbn.BatchNormOutput(np.concatenate([o.y for o in outs]), *outs[0][1:])
    check_forward(got, x, v["scale"], v["offset"], *running, epsilon=EPS, data_format=fmt,
                  is_training=True, exponential_avg_factor=factor)
    got_grad = cfbn.BatchNormGrad(np.concatenate([g.x_backprop for g in grads]), *grads[0][1:])
    check_grad(got_grad, dy, x, v["scale"], got.reserve_space_1, got.reserve_space_2,
               epsilon=EPS, data_format=fmt, is_training=True)


def test_all_ranks_empty():
    x, dy, v, _, results = _run_ranks([0, 0], "NHWC", np.float32)
    for out, grad in results:
        assert out.y.shape == (0,) + x.shape[1:]
        assert np.isnan(out.reserve_space_1).all() and np.isnan(out.batch_variance).all()
        assert not grad.scale_backprop.any() and not grad.offset_backprop.any()


class _NoCollective:
    def Get_size(self):
        raise AssertionError("validation must come before any collective")

    Allgather = Allreduce = Get_size


@pytest.mark.parametrize("call, exc, match", [
    (lambda c: sync_batch_norm(np.ones((2, 3), np.float32), np.ones(3), np.ones(3),
                               data_format="NC", comm=c), TypeError, "scale"),
    (lambda c: sync_batch_norm(np.ones((2, 3)), np.ones(3), np.ones(3), comm=c), ValueError,
     "x: data_format"),
    (lambda c: sync_batch_norm(np.ones((2, 3)), np.ones(3), np.ones(3), data_format="NC",
                               exponential_avg_factor=0.5, comm=c), ValueError, "mean"),
    (lambda c: sync_batch_norm_grad(np.ones((2, 4)), np.ones((2, 3)), np.ones(3), np.ones(3),
                                    np.ones(3), data_format="NC", comm=c), ValueError,
     "y_backprop"),
    (lambda c: sync_batch_norm_grad(np.ones((2, 3)), np.ones((2, 3)), np.ones(3), np.ones(2),
                                    np.ones(3), data_format="NC", comm=c), ValueError,
     "reserve_space_1"),
])
def test_errors_before_any_collective(call, exc, match):
    with pytest.raises(exc, match=match):
        call(_NoCollective())


def test_cfbn_imports_without_mpi4py_and_says_how_to_install():
    code = (
        "import sys; sys.modules['mpi4py'] = None\n"
        "import numpy as np, cfbn, cfbn.distributed as d\n"
        "try:\n"
        "    d.sync_batch_norm(np.ones((2, 3)), np.ones(3), np.zeros(3), data_format='NC')\n"
        "except ImportError as e:\n"
        "    print('IMPORT-ERROR', e)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(cfbn.__file__).resolve().parents[1]))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert "IMPORT-ERROR" in res.stdout and "pip install cfbn[mpi]" in res.stdout


def _mpirun():
    """mpirun next to this Python (a venv's MPI wheel) first, then on PATH."""
    for name in ("mpirun", "mpiexec"):
        p = Path(sys.executable).parent / name
        if p.exists():
            return str(p)
    for d in os.environ.get("PATH", "").split(os.pathsep):
        for name in ("mpirun", "mpiexec"):
            p = Path(d) / name
            if d and p.exists():
                return str(p)
    return None


def _skip_or_fail(reason):
    if os.environ.get("CFBN_REQUIRE_MPI") == "1":
        pytest.fail(reason + " (CFBN_REQUIRE_MPI=1)")
    pytest.skip(reason)


def mpi_command(n, script, *args):
    """(argv, env) launching `script` on n local ranks, one OpenMP thread each."""
    launcher = _mpirun()
    if launcher is None:
        _skip_or_fail("no mpirun/mpiexec found (pip install mpich, or apt-get install openmpi-bin)")
    if importlib.util.find_spec("mpi4py") is None:
        _skip_or_fail("mpi4py is not installed (pip install cfbn[mpi])")
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(
                   [str(Path(cfbn.__file__).resolve().parents[1]),
                    os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    argv = [launcher, "-n", str(n)]
    version = subprocess.run([launcher, "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    if "Open MPI" in version or "OpenRTE" in version:
        # Open MPI refuses root and more ranks than cores unless told
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        argv.append("--oversubscribe")
    return argv + [sys.executable, "-m", "mpi4py", str(script)] + list(args), env


@pytest.mark.parametrize("ranks", [2, 3])
def test_mpirun_sync_matches_single_process(ranks):
    argv, env = mpi_command(ranks, HERE / "mpi" / "sync_check.py")
    res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    output = res.stdout + res.stderr
    print(output)
    assert res.returncode == 0, output
    assert "mpi ranks=%d:" % ranks in output and " 0 failed" in output, output


def _numpy_train_statistics(n, mu, m2, factor, mean, variance):
    # sync_batch_norm's per-channel step as it was written in NumPy before it
    # called the C code: the bits the C function must reproduce.
    with np.errstate(invalid="ignore", divide="ignore"):
        var = m2 / float(n)
    unbiased = var * (float(n) / (float(n) - 1.0)) if n > 1 else var
    if factor != 1.0:
        bm = (1.0 - factor) * mean.astype(np.float64) + factor * mu
        bv = (1.0 - factor) * variance.astype(np.float64) + factor * unbiased
    else:
        bm, bv = mu, unbiased
    return var, bm, bv


@pytest.mark.parametrize("factor", [1.0, 0.3, 0.0, 0.999])
@pytest.mark.parametrize("count", [0, 1, 2, 3, 17, 4096, 3 ** 20])
def test_train_statistics_matches_the_numpy_formula(count, factor):
    from cfbn import _kernels
    rng = np.random.default_rng([count, int(factor * 1000)])
    c = 33
    mu = rng.standard_normal(c) * 10.0
    m2 = np.abs(rng.standard_normal(c)) * count if count else np.full(c, np.nan)
    mean = rng.standard_normal(c).astype(np.float32)
    variance = np.abs(rng.standard_normal(c)).astype(np.float32)
    want = _numpy_train_statistics(count, mu, m2, factor, mean, variance)
    got = [np.full(c, -1.0) for _ in range(3)]
    running = factor != 1.0
    _kernels.train_statistics(count, mu, m2, factor,
                              mean.astype(np.float64) if running else None,
                              variance.astype(np.float64) if running else None, *got)
    for w, g in zip(want, got):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        ok = ~np.isnan(w)
        assert np.array_equal(g[ok].view(np.uint64), w[ok].view(np.uint64))


def test_train_statistics_refuses_mismatched_vectors():
    from cfbn import _kernels
    v = np.zeros(3)
    with pytest.raises(ValueError, match="one length"):
        _kernels.train_statistics(4, v, np.zeros(2), 1.0, None, None, v, v.copy(), v.copy())
    with pytest.raises(ValueError, match="one length"):
        _kernels.train_statistics(4, v, v, 0.5, None, None, v.copy(), v.copy(), v.copy())
    _kernels.train_statistics(4, np.zeros(0), np.zeros(0), 1.0, None, None,
                              np.zeros(0), np.zeros(0), np.zeros(0))
