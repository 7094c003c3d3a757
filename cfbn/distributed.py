"""Synchronized batch normalization over MPI (data-parallel training).

Each process (replica) holds a shard of the batch; `sync_batch_norm`
normalizes every shard with the statistics of the whole batch, and
`sync_batch_norm_grad` returns the whole batch's scale and offset gradients
and this shard's x gradient.  One collective per call, over an mpi4py
communicator.  mpi4py is optional: ``pip install cfbn[mpi]`` (plus an MPI
library, e.g. ``pip install mpich``, where the machine has none).

Every process of the communicator must make the same calls with the same
channel count, dtype, data_format and epsilon, as with any MPI collective.
Shards may hold different batch sizes, including zero.
"""
import numpy as np

from . import _kernels
from . import _args
from ._args import BatchNormGrad, BatchNormOutput
from ._split import _merge

_F64 = np.dtype(np.float64)


def _world():
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ImportError(
            "cfbn.distributed needs mpi4py for comm=None (MPI.COMM_WORLD): "
            "pip install cfbn[mpi] (and an MPI library, e.g. pip install mpich, where the "
            "machine has none)") from exc
    return MPI.COMM_WORLD


def _communicator(comm):
    return _world() if comm is None else comm


def _host_tensor(x, name):
    if type(x) is not np.ndarray and type(x).__module__.startswith("cupy"):
        raise TypeError("%s: sync_batch_norm takes NumPy arrays (host memory), got a CuPy array"
                        % name)
    return _args.tensor(x, name)


def sync_batch_norm(x, scale, offset, mean=None, variance=None, *, epsilon=1e-4,
                    exponential_avg_factor=1.0, data_format="NHWC", comm=None, n_threads=None):
    """Training-mode batch normalization of this process's shard with the global batch's statistics.

    A collective call: every process of `comm` must call it.

    Parameters
    ----------
    x : ndarray
        This process's shard of the batch (float32, float64, float16 or
        bfloat16), laid out as `data_format`; the batch is the concatenation
        of the shards in rank order.  A shard may be empty.
    scale, offset : ndarray
        Per-channel gamma and beta (float32 for float16 and bfloat16 x, else
        x's dtype), the same on every process.
    mean, variance : ndarray, optional
        Running statistics; required when `exponential_avg_factor` is not 1.
    epsilon : float
        Added to the variance before the square root.
    exponential_avg_factor : float
        Weight f of this batch in the running statistics (0 <= f <= 1).
    data_format : {"NHWC", "NCHW", "NDHWC", "NCDHW", "NC"}
        Position of the channel axis.
    comm : mpi4py.MPI.Comm, optional
        The communicator of the replicas; None means ``MPI.COMM_WORLD``.
    n_threads : int, optional
        OpenMP threads for this process's kernels; None uses OpenMP's default.

    Returns
    -------
    BatchNormOutput
        As `cfbn.fused_batch_norm` on the whole batch: y (this shard's),
        batch_mean and batch_variance (running statistics updated with the
        global mean and the variance Bessel-corrected by the global count),
        reserve_space_1 and reserve_space_2 (global mean and biased
        variance, identical bit for bit on every process).

    Notes
    -----
    One ``Allgather`` of ``2C + 1`` float64 values per process.  The
    statistics equal those of `fused_batch_norm` on the concatenated batch
    within a few float64 ulps (the order of summation differs), and exactly
    when a single process holds every element.
    """
    x, dt, vdt = _host_tensor(x, "x")
    layout, outer, channels, inner = _args.layout(data_format, x)
    scale = _args.vector(scale, "scale", channels, vdt)
    offset = _args.vector(offset, "offset", channels, vdt)
    eps = _args.epsilon(epsilon)
    factor = _args.factor(exponential_avg_factor)
    _args.check_stats_given(True, factor, mean, variance)
    if factor != 1.0:
        mean = _args.vector(mean, "mean", channels, vdt)
        variance = _args.vector(variance, "variance", channels, vdt)
    nt = _args.threads(n_threads)
    comm = _communicator(comm)

    local = np.empty(2 * channels + 1, _F64)
    local[0] = outer * inner
    _kernels.statistics(dt, layout, outer, channels, inner, nt, x,
                        local[1:channels + 1], local[channels + 1:])
    # Allgather rather than an Allreduce of sums: (count, mean, m2) is merged
    # without cancellation (shifted sums would need one shift agreed by all
    # ranks first), and merging the gathered rows in rank order gives the
    # same bits on every rank and in every run, which MPI's reduction order
    # does not promise.  The message is 2C + 1 doubles per rank.
    rows = np.empty((comm.Get_size(), 2 * channels + 1), _F64)
    comm.Allgather(local, rows)
    n, mu, m2 = 0, None, None
    for row in rows:
        k = int(row[0])
        if mu is None:
            n, mu, m2 = k, row[1:channels + 1].copy(), row[channels + 1:].copy()
        else:
            n, mu, m2 = _merge(n, mu, m2, k, row[1:channels + 1], row[channels + 1:])

    # The fused kernel's own per-channel step (variance, Bessel correction,
    # running averages), so that both give the same bits from the same moments.
    var, bm, bv = (np.empty(channels, _F64) for _ in range(3))
    running = factor != 1.0
    _kernels.train_statistics(n, mu, m2, factor,
                              mean.astype(_F64) if running else None,
                              variance.astype(_F64) if running else None, var, bm, bv)
    y = _kernels.empty_output(x.shape, x.dtype)
    _kernels.apply(dt, layout, outer, channels, inner, nt, x, scale, offset, mu, var, eps, y)
    return BatchNormOutput(y, bm.astype(vdt), bv.astype(vdt), mu.astype(vdt), var.astype(vdt))


def sync_batch_norm_grad(y_backprop, x, scale, reserve_space_1, reserve_space_2, *,
                         epsilon=1e-4, data_format="NHWC", comm=None, n_threads=None):
    """Training-mode gradient of `sync_batch_norm` for this process's shard.

    A collective call: every process of `comm` must call it.

    Parameters
    ----------
    y_backprop : ndarray
        Gradient of the loss with respect to this shard's y.
    x : ndarray
        This shard's forward input.
    scale : ndarray
        Per-channel gamma.
    reserve_space_1, reserve_space_2 : ndarray
        The reserve spaces `sync_batch_norm` returned (global mean and
        biased variance, the same on every process).
    epsilon, data_format, comm, n_threads
        As for `sync_batch_norm`; use the forward pass's values.

    Returns
    -------
    BatchNormGrad
        ``(x_backprop, scale_backprop, offset_backprop)``: this shard's
        x_backprop with the whole batch's count and sums, and the whole
        batch's scale and offset gradients (the same on every process).

    Notes
    -----
    One ``Allreduce`` (sum) of ``2C + 1`` float64 values per process: the two
    per-channel sums and this shard's count, so the global count needs no
    extra message and the reserve spaces keep TensorFlow's layout.
    """
    x, dt, vdt = _host_tensor(x, "x")
    dy = _args.as_array(y_backprop, "y_backprop")
    _args.check_dy(dy, x)
    dy = _args.contiguous(dy)
    layout, outer, channels, inner = _args.layout(data_format, x)
    scale = _args.vector(scale, "scale", channels, vdt)
    mu = _args.vector(reserve_space_1, "reserve_space_1", channels, vdt).astype(_F64)
    var = _args.vector(reserve_space_2, "reserve_space_2", channels, vdt).astype(_F64)
    eps = _args.epsilon(epsilon)
    nt = _args.threads(n_threads)
    comm = _communicator(comm)

    local = np.empty(2 * channels + 1, _F64)
    _kernels.grad_statistics(dt, layout, outer, channels, inner, nt, dy, x, mu, var, eps,
                             local[:channels], local[channels:2 * channels])
    local[2 * channels] = outer * inner
    total = np.empty_like(local)
    comm.Allreduce(local, total)  # mpi4py's default op is MPI.SUM
    sum_dy = np.ascontiguousarray(total[:channels])
    sum_dy_xhat = np.ascontiguousarray(total[channels:2 * channels])
    n = float(total[2 * channels])
    dx = _kernels.empty_output(x.shape, x.dtype)
    if x.size:
        _kernels.grad_apply(dt, layout, outer, channels, inner, nt, dy, x, scale, mu, var, eps,
                            sum_dy, sum_dy_xhat, n, dx)
    return BatchNormGrad(dx, sum_dy_xhat.astype(vdt), sum_dy.astype(vdt))
