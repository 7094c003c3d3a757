"""Child processes after multi-threaded calls: os.fork, multiprocessing Pools
with the fork, spawn and forkserver start methods.

GNU libgomp's thread pool does not survive fork(): a forked child's first
parallel region would wait forever for threads that are not there.  cfbn runs
a forked child's calls on one thread instead, with bit-identical results.
Each scenario runs in its own interpreter under a timeout, so a hang fails
the test instead of stopping the suite.
"""
import os
import subprocess
import sys
import textwrap

import pytest

import cfbn

TIMEOUT = 300      # generous: the emulated (qemu) runs start interpreters slowly

COMMON = """
import os, sys
import numpy as np
import cfbn

def data():
    rng = np.random.default_rng(7)
    # well past the size below which calls stay on one thread
    x = rng.standard_normal((16, 24, 24, 12), dtype=np.float32)
    dy = rng.standard_normal(x.shape, dtype=np.float32)
    s = rng.uniform(0.5, 2.0, 12).astype(np.float32)
    o = rng.standard_normal(12).astype(np.float32)
    return x, dy, s, o

def compute(n_threads=None):
    x, dy, s, o = data()
    f = cfbn.fused_batch_norm(x, s, o, n_threads=n_threads)
    g = cfbn.fused_batch_norm_grad(dy, x, s, f.reserve_space_1, f.reserve_space_2,
                                   n_threads=n_threads)
    xt = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    h = cfbn.fused_batch_norm(xt, s, o, data_format="NCHW", n_threads=n_threads)
    parts = list(f) + list(g) + [h.y]
    return b"".join(p.tobytes() for p in parts)

def child(n_threads):
    info = cfbn.runtime_info()
    return compute(n_threads), info["forked_child"], info["max_threads"]

def forked(body):
    # body() runs in a child made by os.fork(); its return value is the exit code
    pid = os.fork()
    if pid == 0:
        code = 5
        try:
            code = body()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)
"""


def run(tmp_path, body):
    # A file, not -c: spawn and forkserver children import the main module
    # to find the functions they are sent.
    script = tmp_path / "scenario.py"
    script.write_text(COMMON + textwrap.dedent(body))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=TIMEOUT, env=dict(os.environ, OMP_NUM_THREADS="2"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")


@needs_fork
def test_os_fork_after_threaded_calls(tmp_path):
    out = run(tmp_path, """
        want = compute(2)

        def check():
            for nt in (None, 2, 1):
                got, forked_child, threads = child(nt)
                if got != want:
                    return 3
                if not forked_child or threads != 1:
                    return 4
            return 0

        print("child", forked(check))
        print("parent", cfbn.runtime_info()["forked_child"], compute(2) == want)
        """)
    assert "child 0" in out
    assert "parent False True" in out


@needs_fork
def test_fork_in_a_fork_child(tmp_path):
    out = run(tmp_path, """
        want = compute(2)
        print("child", forked(lambda: forked(lambda: 0 if child(None)[0] == want else 3)))
        """)
    assert "child 0" in out


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_pool_after_threaded_calls(tmp_path, method):
    import multiprocessing as mp
    if method not in mp.get_all_start_methods():
        pytest.skip("start method %s is not available here" % method)
    out = run(tmp_path, """
        import multiprocessing as mp

        if __name__ == "__main__":
            want = compute(2)
            with mp.get_context(%r).Pool(2) as pool:
                results = pool.map(child, [None, 2, None, 1])
            print("same", all(r[0] == want for r in results))
            print("forked", sorted(set(r[1] for r in results)))
        """ % method)
    assert "same True" in out
    # fork children inherit the parent's import; spawn children import cfbn
    # themselves (forkserver children are forked from a server that may have)
    if method == "fork":
        assert "forked [True]" in out
    elif method == "spawn":
        assert "forked [False]" in out


def test_parent_is_not_a_forked_child():
    assert cfbn.runtime_info()["forked_child"] is False
