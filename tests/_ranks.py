"""Running a test file's worker as the ranks of a gloo process group.

The test starts one process per rank (the file run as a script: argv is
rank, world size, store path, then the test's own arguments); the ranks
meet through a file:// store in the test's tmp_path, which needs no free
port.  A rank that fails or hangs never hangs the test: the group has a
short timeout, and the test kills every rank left once one has failed or
the time is up.
"""
import datetime
import os
import subprocess
import sys
import time

import pytest

# Long enough for a loaded machine's slowest collective, short enough that
# a rank waiting on a dead peer gives up well within the test's time.
GROUP_TIMEOUT_S = 30


def init(rank, world, store):
    """Join the gloo group of `world` ranks meeting at `store`."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank,
                            world_size=world,
                            timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))


def _environment():
    # the ranks import the cfbn this process imported (an installed one, or
    # the source tree's in-place build)
    import cfbn
    root = os.path.dirname(os.path.dirname(os.path.abspath(cfbn.__file__)))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)


def run(script, tmp_path, world, *args, timeout=120):
    """Run `script` as `world` ranks; fail with every rank's output unless all exit 0."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    assert torch is not None
    store = str(tmp_path / "store")
    logs = [open(tmp_path / ("rank%d.log" % r), "w+b") for r in range(world)]
    env = _environment()
    procs = [subprocess.Popen([sys.executable, script, str(r), str(world), store]
                              + [str(a) for a in args], env=env, stdout=logs[r],
                              stderr=subprocess.STDOUT)
             for r in range(world)]
    deadline = time.monotonic() + timeout
    failed_at = None
    try:
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            if failed_at is None and any(p.poll() not in (None, 0) for p in procs):
                failed_at = now
            # the others get a moment to report their side, then are killed
            if now > deadline or (failed_at is not None and now > failed_at + 10):
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    outs = []
    for log in logs:
        log.seek(0)
        outs.append(log.read().decode(errors="replace"))
        log.close()
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, "rank %d failed (exit %s):\n%s" % (r, p.returncode, out)
