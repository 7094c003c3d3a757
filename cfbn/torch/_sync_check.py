"""What SyncBatchNorm's ranks agree on before they merge statistics.

gloo's all_gather needs a tensor of one size on every rank: a rank whose
statistics row is longer (more channels) than another's is killed by
SIGABRT from a gloo thread, and the others see a reset connection.  A rank
that raises before a collective its peers have entered leaves them waiting
until the process group's timeout.  So each rank's row starts with a fixed
prefix (whether it refused its input, its channel count, its num_features,
its dtype), every rank reads the same table of prefixes, and all raise the
same error or none does.

The row's size is fixed by num_features; only the first synchronized
forward of a module in a group (or every one, for a module with no
per-channel tensors, whose channel count may change) must first gather the
prefix alone, to learn that every rank's row has that size.  Its gather is
started before the rank's statistics pass and waited for after it, so its
latency overlaps the pass.
"""
import weakref

import numpy as np
import torch
import torch.distributed as dist

# The input dtypes a prefix can name: the ones cfbn computes.
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_UNKNOWN = -1
# What a gathered row is for: a forward's (its prefix alone, or its
# statistics) or a backward's gradient sums.  A rank that skipped a backward
# meets its peers' backward gather with its next forward's: with the kind in
# every row, and a module's forward and backward rows of one size, that is a
# Python error on every rank instead of gloo's abort.
FORWARD, BACKWARD = 1, 2
PREFIX = 5

# The group each module's ranks last agreed on num_features in.  Weak keys:
# no module is kept alive, and a copy (an EMA model) starts unagreed on
# every rank alike.
_agreed = weakref.WeakKeyDictionary()


def agreed(module, group):
    """Whether `module`'s ranks have agreed on its num_features in `group`."""
    ref = _agreed.get(module)
    return ref is not None and ref() is group


def prefix(input, num_features, refused, kind=FORWARD):
    """This rank's prefix: [kind, refused, channels, num_features, dtype code].

    Parameters
    ----------
    input : Tensor or None
        This rank's input (anything when `refused`).
    num_features : int or None
        The channel count the module's per-channel tensors have (None when
        it has none and any count will do).
    refused : bool
        Whether this rank's own checks refused its input; it raises its own
        error, the others that it did.
    kind : int
        FORWARD or BACKWARD: which gather the row is for.

    Returns
    -------
    list of int
    """
    channels = dtype = _UNKNOWN
    if not refused:
        channels = input.shape[1]
        dtype = _DTYPES.index(input.dtype) if input.dtype in _DTYPES else _UNKNOWN
    return [kind, int(refused), channels, _UNKNOWN if num_features is None else num_features,
            dtype]


class Pending:
    """A gather of the prefixes alone, in flight."""

    def __init__(self, rows, work, names, module, group):
        self.rows = rows
        self.work = work
        self.names = names
        self.module = module
        self.group = group

    def wait(self):
        """The gathered prefixes, one list per rank in rank order.

        The Work is let go once waited for (a second wait returns the same
        rows): a c10d Work kept past its wait, by a traceback or an autograd
        graph, may be destroyed after its process group, at interpreter exit,
        where gloo aborts the process."""
        work, self.work = self.work, None
        if work is not None:
            work.wait()
        return torch.stack(self.rows).tolist()

    def finish(self):
        """Wait, raise as every rank does if the ranks disagree, else note
        that the module's rows now have one size on every rank."""
        check(self.wait(), self.names)
        if self.module is not None:
            # weakly: a module kept to the end must not keep its group
            _agreed[self.module] = weakref.ref(self.group)


def start(group, row_prefix, names, module):
    """Start all-gathering this rank's prefix alone over `group`.

    `names` names the module's per-channel tensors for the error message
    ("weight and running_mean"); `module` is recorded as agreed in `group`
    when the prefixes agree (None: not recorded).
    """
    header = torch.tensor(row_prefix, dtype=torch.int64)
    rows = [torch.empty_like(header) for _ in range(dist.get_world_size(group))]
    work = dist.all_gather(rows, header, group=group, async_op=True)
    return Pending(rows, work, names, module, group)


def gather(local, group):
    """The float64 rows of every rank of `group`, in rank order, as one
    (world, k) array; this rank's row alone when there is no group."""
    if group is None:
        return local[None]
    t = torch.from_numpy(local)
    rows = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(rows, t, group=group)
    return torch.stack(rows).numpy()


def stand_in(group, row_prefix, num_features):
    """Gather a statistics row of the agreed size holding only this rank's
    prefix (a refused input's, or one of the wrong channel count), so that
    the peers' gather completes and they read why; returns the table."""
    local = np.full(PREFIX + 1 + 2 * num_features, np.nan)
    local[:PREFIX] = row_prefix
    local[PREFIX] = 0
    return gather(local, group)


def _per_rank(values):
    return ", ".join("%s on rank %d" % (v, r) for r, v in enumerate(values))


def check(table, names):
    """Raise the error every rank raises for this table of prefixes, if any.

    Parameters
    ----------
    table : sequence of sequences
        One prefix per rank, in rank order (ints, or floats holding them).
    names : str
        The module's per-channel tensors, for the message.
    """
    kinds, refused, channels, expected, dtypes = (
        [int(v) for v in column] for column in zip(*(row[:PREFIX] for row in table)))
    check_kinds(kinds)
    if any(refused):
        ranks = [r for r, flag in enumerate(refused) if flag]
        raise RuntimeError("SyncBatchNorm: rank %s of the process group refused its input "
                           "(its own error says why), so every rank stops here"
                           % ", ".join(map(str, ranks)))
    if len(set(expected)) > 1:
        raise ValueError("num_features: expected the same on every rank of the process group, "
                         "got %s" % _per_rank(expected))
    if expected[0] != _UNKNOWN and any(c != expected[0] for c in channels):
        raise ValueError("input: expected num_features=%d channels (the length of %s) on every "
                         "rank of the process group, got %s"
                         % (expected[0], names, _per_rank(channels)))
    if len(set(channels)) > 1:
        raise ValueError("input: expected the same number of channels on every rank of the "
                         "process group, got %s" % _per_rank(channels))
    if len(set(dtypes)) > 1:
        raise TypeError("input dtype: expected the same on every rank of the process group, "
                        "got %s" % _per_rank(_DTYPES[d] if d != _UNKNOWN else "another dtype"
                                             for d in dtypes))


def check_kinds(kinds):
    """Raise on every rank alike where the ranks' gathers are of different
    kinds (one rank's forward met another's backward)."""
    if len(set(kinds)) > 1:
        names = {FORWARD: "a forward", BACKWARD: "a backward"}
        raise RuntimeError("SyncBatchNorm: the ranks of the process group are out of step: %s; "
                           "every rank must run the backward of each synchronized forward, "
                           "or none of them"
                           % _per_rank(names.get(k, "another call") for k in kinds))
