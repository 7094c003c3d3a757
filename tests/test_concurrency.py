"""cfbn called from several Python threads at once.

- Threads calling forward and gradient concurrently, on shared read-only and
  on private inputs, with OpenMP on, get bit for bit the results of the same
  calls made one at a time.  CFBN_STRESS_SECONDS sets how long (default 1.5 s,
  split between the ISAs).
- The GIL is released while a kernel runs: a pure-Python thread makes
  progress in the middle of one long call, and the same probe sees no
  progress during a call known to hold the GIL.
- Calls from a concurrent.futures pool, and calls made while another call
  runs an OpenMP team, neither deadlock (each scenario runs in a child
  process with a timeout) nor start more threads than the callers' teams.
"""

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import cfbn

from _checks import BFLOAT16, make_shape, random_vectors, random_x, seed_of

STRESS_SECONDS = float(os.environ.get("CFBN_STRESS_SECONDS", "1.5"))
N_PY_THREADS = 4
SUPPORTED_ISAS = cfbn.runtime_info()["supported_isas"]

# (data_format, batch, spatial, channels, dtype): small ones run on one
# thread, large ones (> 32768 elements) split across an OpenMP team
WORK = [
    ("NHWC", 4, 49, 19, np.float32),
    ("NCHW", 2, 81, 7, np.float64),
    ("NC", 37, 1, 33, np.float16),
    ("NHWC", 8, 1024, 17, np.float32),
    ("NCHW", 4, 4096, 5, np.float32),
    ("NDHWC", 2, 2048, 24, np.float16),
    ("NCDHW", 2, 1331, 9, np.float64),
    ("NHWC", 3, 25, 11, BFLOAT16),
    ("NCHW", 4, 3000, 6, BFLOAT16),
    ("NC", 5003, 1, 13, np.float32),
]


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def make_work():
    items = []
    for data_format, batch, spatial, c, dtype in WORK:
        shape = make_shape(data_format, batch, spatial, c)
        rng = np.random.default_rng(seed_of("concurrency", data_format, shape))
        x = random_x(rng, shape, data_format, dtype, loc=2.0)
        dy = rng.standard_normal(shape).astype(dtype)
        v = random_vectors(rng, c, dtype)
        for a in [x, dy, *v.values()]:
            a.flags.writeable = False
        items.append(dict(data_format=data_format, x=x, dy=dy, **v))
    return items


def run(item, kind, n_threads):
    """One call of the given kind; returns its outputs as a tuple of arrays."""
    df = item["data_format"]
    if kind == "train":
        return tuple(cfbn.fused_batch_norm(
            item["x"], item["scale"], item["offset"], item["mean"], item["variance"],
            exponential_avg_factor=0.3, data_format=df, n_threads=n_threads))
    if kind == "infer":
        return tuple(cfbn.fused_batch_norm(
            item["x"], item["scale"], item["offset"], item["mean"], item["variance"],
            data_format=df, is_training=False, n_threads=n_threads))
    return tuple(cfbn.fused_batch_norm_grad(
        item["dy"], item["x"], item["scale"], item["mean"], item["variance"],
        data_format=df, is_training=kind == "grad", n_threads=n_threads))


KINDS = ["train", "infer", "grad", "grad_infer"]


def private_copy(item):
    return {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in item.items()}


def test_concurrent_calls_match_serial(isa, record_property):
    work = make_work()
    expected = {(i, kind): run(item, kind, 1) for i, item in enumerate(work) for kind in KINDS}
    seconds = STRESS_SECONDS / len(SUPPORTED_ISAS)
    errors, calls = [], [0] * N_PY_THREADS
    start = threading.Barrier(N_PY_THREADS)

    def worker(t):
        rng = np.random.default_rng(t)
        mine = [private_copy(item) for item in work]
        try:
            start.wait()
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                i = int(rng.integers(len(work)))
                kind = KINDS[int(rng.integers(len(KINDS)))]
                item = work[i] if rng.integers(2) else mine[i]
                n_threads = [None, 1, 2, 3][int(rng.integers(4))]
                got = run(item, kind, n_threads)
                for name, a, b in zip(("out0", "out1", "out2", "out3", "out4"), got,
                                      expected[i, kind]):
                    if not same_bits(a, b):
                        errors.append(f"thread {t}: {item['data_format']} {a.dtype} {kind} "
                                      f"n_threads={n_threads}: {name} differs from the serial call")
                        return
                calls[t] += 1
        except Exception as exc:  # reported below, with the thread it came from
            errors.append(f"thread {t}: {exc!r}")

    threads = [threading.Thread(target=worker, args=(t,), daemon=True)
               for t in range(N_PY_THREADS)]
    t0 = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=seconds + 120)
    held = time.monotonic() - t0
    assert not any(th.is_alive() for th in threads), "a thread did not finish: deadlock?"
    assert not errors, errors[:5]
    assert all(n > 0 for n in calls), calls
    # work items stayed untouched
    for item in work:
        assert not item["x"].flags.writeable
    record_property("threads_x_seconds", f"{N_PY_THREADS} x {held:.1f}")
    record_property("calls", sum(calls))
    print(f"{isa}: {N_PY_THREADS} threads x {held:.1f} s, {sum(calls)} calls")


# ---- the GIL ----

def progress_in_middle(fn):
    """Run fn() while a pure-Python thread counts; return how many of the
    counter's progress marks fall in the middle third of the call, and the
    call's duration."""
    marks = []
    stop = threading.Event()

    def count():
        n = 0
        while not stop.is_set():
            n += 1
            if n % 64 == 0:
                marks.append(time.perf_counter())

    th = threading.Thread(target=count, daemon=True)
    th.start()
    while len(marks) < 8:
        time.sleep(0.001)
    t0 = time.perf_counter()
    fn()
    t1 = time.perf_counter()
    stop.set()
    th.join(timeout=30)
    lo, hi = t0 + (t1 - t0) / 3, t1 - (t1 - t0) / 3
    return sum(lo <= m <= hi for m in marks), t1 - t0


def long_call_inputs(min_seconds=0.1):
    """Inputs for which one single-threaded forward call takes min_seconds
    (far longer than the interpreter's 5 ms switch interval)."""
    rng = np.random.default_rng(1)
    s = np.ones(16, np.float32)
    n = 1 << 22
    while True:
        x = rng.random((n // 16, 16), dtype=np.float32)
        t0 = time.perf_counter()
        cfbn.fused_batch_norm(x, s, s, data_format="NC", n_threads=1)
        if time.perf_counter() - t0 >= min_seconds or n >= 1 << 26:
            return x, s
        n *= 2


@pytest.mark.skipif(not getattr(sys, "_is_gil_enabled", lambda: True)(),
                    reason="no GIL in this interpreter")
def test_gil_released_during_kernels():
    # the probe must see a held GIL: sorting a list of floats never lets go of it
    values = list(np.random.default_rng(0).random(200_000))
    held, seconds = progress_in_middle(lambda: sorted(values))
    assert held == 0, f"probe saw {held} marks during a {seconds:.3f} s call that holds the GIL"

    x, s = long_call_inputs()
    fwd = cfbn.fused_batch_norm(x, s, s, data_format="NC", n_threads=1)
    calls = {
        "forward": lambda: cfbn.fused_batch_norm(x, s, s, data_format="NC", n_threads=1),
        "gradient": lambda: cfbn.fused_batch_norm_grad(x, x, s, fwd.reserve_space_1,
                                                       fwd.reserve_space_2, data_format="NC",
                                                       n_threads=1),
    }
    for name, fn in calls.items():
        # a busy machine may deschedule the counter for a while: a few tries
        results = []
        for _ in range(3):
            marks, seconds = progress_in_middle(fn)
            results.append((marks, round(seconds, 3)))
            if marks > 0:
                break
        assert marks > 0, f"{name}: no Python progress during the kernel (marks, s): {results}"


# ---- nested use, in a child process so that a deadlock is a timeout ----

def run_child(script, timeout=120):
    src = textwrap.dedent(script)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.abspath(__file__))] + env.get("PYTHONPATH", "").split(os.pathsep))
    try:
        proc = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"no answer within {timeout} s (deadlock?); output so far:\n"
                    f"{exc.stdout}\n{exc.stderr}")
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


CHILD_COMMON = """
import os, threading, time
import numpy as np
import cfbn
from test_concurrency import KINDS, make_work, run, same_bits

def os_threads():
    return len(os.listdir("/proc/self/task"))

class Peak:
    # samples this process's thread count while a block runs
    def __enter__(self):
        self.peak, self.stop = os_threads(), threading.Event()
        self.th = threading.Thread(target=self.watch, daemon=True)
        self.th.start()
        return self
    def watch(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, os_threads())
            time.sleep(0.002)
    def __exit__(self, *exc):
        self.stop.set()
        self.th.join()

work = make_work()
expected = {(i, k): run(item, k, 1) for i, item in enumerate(work) for k in KINDS}
team = cfbn.runtime_info()["max_threads"]
base = os_threads()
"""


def test_pool_calls_do_not_deadlock_or_oversubscribe():
    out = run_child(CHILD_COMMON + """
from concurrent.futures import ThreadPoolExecutor
WORKERS = 4

def task(j):
    i, kind = j % len(work), KINDS[j % len(KINDS)]
    got = run(work[i], kind, None if j % 3 else 2)
    return all(same_bits(a, b) for a, b in zip(got, expected[i, kind]))

def outer(j):
    # a pool task that waits on another pool's cfbn call
    return inner.submit(task, j).result(timeout=60) and task(j + 1)

with Peak() as peak:
    with ThreadPoolExecutor(WORKERS) as pool, ThreadPoolExecutor(WORKERS) as inner:
        futures = [pool.submit(outer, j) for j in range(96)]
        ok = [f.result(timeout=60) for f in futures]
assert all(ok), ok.count(False)
# each calling thread owns at most one OpenMP team of max(team, 2) threads
limit = base + 1 + 2 * WORKERS * max(team, 2) + 4
assert peak.peak <= limit, (peak.peak, limit)
print("peak threads", peak.peak, "limit", limit)
""")
    print(out)


def test_calls_beside_a_running_openmp_team():
    out = run_child(CHILD_COMMON + """
big = work[4]                     # split across an OpenMP team with n_threads=2
want = run(big, "train", 1)
stop = threading.Event()
errors = []

def long_running():
    while not stop.is_set():
        if not all(same_bits(a, b) for a, b in zip(run(big, "train", 2), want)):
            errors.append("team call differs")

def callers(t):
    for j in range(300):
        i, kind = (j + t) % len(work), KINDS[j % len(KINDS)]
        got = run(work[i], kind, 2)
        if not all(same_bits(a, b) for a, b in zip(got, expected[i, kind])):
            errors.append((t, i, kind))

with Peak() as peak:
    lr = threading.Thread(target=long_running)
    lr.start()
    cs = [threading.Thread(target=callers, args=(t,)) for t in range(3)]
    for th in cs:
        th.start()
    for th in cs:
        th.join(timeout=90)
    stop.set()
    lr.join(timeout=90)
assert not lr.is_alive() and not any(th.is_alive() for th in cs), "stuck"
assert not errors, errors[:5]
limit = base + 1 + 4 * 2 + 4
assert peak.peak <= limit, (peak.peak, limit)
print("peak threads", peak.peak, "limit", limit)
""")
    print(out)
