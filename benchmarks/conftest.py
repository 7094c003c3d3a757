"""pytest-benchmark suites: cfbn beside the NumPy reference, PyTorch and
TensorFlow, one benchmark group per op, layout, shape and thread count.

    pytest benchmarks/ --benchmark-only                 # default matrix, a few minutes at most
    pytest benchmarks/ --benchmark-only --bench-full    # or CFBN_BENCH_FULL=1

The default run covers every target shape at 1 and 2 threads with short
timing budgets and runs the (slow) reference on the small shapes only.  The
full matrix adds the bandwidth shape (64,112,112,64), runs the reference on
every shape and uses pytest-benchmark's own timing defaults.  Explicit
--benchmark-max-time / --benchmark-min-rounds always win.

Environment:
    CFBN_BENCH_FULL=1         the full matrix
    CFBN_BENCH_IMPLS=a,b      implementations to run (cfbn, cfbn-out, reference, torch, tensorflow)
    CFBN_BENCH_THREADS=1,2    thread counts
    CFBN_BENCH_TF_THREADS=n   TensorFlow's intra-op threads (fixed per process; default: the
                              largest thread count); its cells at other counts are skipped
"""
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench_common as bc  # noqa: E402

import cfbn  # noqa: E402

IMPLS = ("cfbn", "cfbn-out", "reference", "torch", "tensorflow")

#: (op, implementation) pairs with nothing to time: TensorFlow has no fused
#: second-order kernel (its gradient of FusedBatchNormGradV3 is composed of
#: other ops).
UNAVAILABLE = {("gradgrad", "tensorflow")}

#: Timing budget per benchmark in the default matrix.
DEFAULT_MAX_TIME = 0.15
DEFAULT_MIN_ROUNDS = 3
REFERENCE_MIN_ROUNDS = 2


def pytest_addoption(parser):
    group = parser.getgroup("cfbn benchmarks")
    group.addoption("--bench-full", action="store_true", default=False,
                    help="cfbn benchmarks: the full matrix (also CFBN_BENCH_FULL=1)")


def _env_list(name, default, cast=str):
    raw = os.environ.get(name, "").strip()
    if not raw:
        return list(default)
    return [cast(v.strip()) for v in raw.split(",") if v.strip()]


def full_matrix(config=None):
    if os.environ.get("CFBN_BENCH_FULL", "").strip() not in ("", "0"):
        return True
    return bool(config is not None and config.getoption("--bench-full", default=False))


def cases(ops, config=None):
    """pytest params in (shape, layout, threads, implementation) order, so
    consecutive benchmarks share their inputs."""
    full = full_matrix(config)
    impls = _env_list("CFBN_BENCH_IMPLS", IMPLS)
    unknown = set(impls) - set(IMPLS)
    if unknown:
        raise pytest.UsageError("CFBN_BENCH_IMPLS: unknown %s; expected some of %s"
                                % (sorted(unknown), ", ".join(IMPLS)))
    threads = _env_list("CFBN_BENCH_THREADS", bc.THREADS, int)
    shapes = list(bc.SHAPES) + ([bc.LARGE_SHAPE] if full else [])
    params = []
    for op in ops:
        for shape in shapes:
            elements = bc.elements(shape)
            for layout in bc.LAYOUTS:
                for t in threads:
                    for impl in impls:
                        if (impl == "reference" and not full
                                and elements > bc.REFERENCE_MAX_ELEMENTS):
                            continue
                        if (op, impl) in UNAVAILABLE:
                            continue
                        params.append(pytest.param(
                            op, shape, layout, t, impl,
                            id="%s-%s-%s-t%d-%s" % (op, layout, bc.shape_str(shape), t, impl)))
    return params


def pytest_configure(config):
    config.addinivalue_line("markers", "bench_ops(*ops): cfbn benchmark over the matrix for these ops")


def pytest_generate_tests(metafunc):
    marker = metafunc.definition.get_closest_marker("bench_ops")
    if marker is None:
        return
    metafunc.parametrize("op,shape,layout,threads,impl", cases(marker.args, metafunc.config))


def _explicit(config, flag):
    return any(a == flag or a.startswith(flag + "=") for a in config.invocation_params.args)


def pytest_collection_modifyitems(config, items):
    full = full_matrix(config)
    here = Path(__file__).resolve().parent
    for item in items:
        if here not in Path(str(item.fspath)).resolve().parents:
            continue
        callspec = getattr(item, "callspec", None)
        if callspec is None or "impl" not in callspec.params:
            continue
        kwargs = {"warmup": False}
        if not full and not _explicit(config, "--benchmark-max-time"):
            kwargs["max_time"] = DEFAULT_MAX_TIME
        if not _explicit(config, "--benchmark-min-rounds"):
            if callspec.params["impl"] == "reference":
                kwargs["min_rounds"] = REFERENCE_MIN_ROUNDS
            elif not full:
                kwargs["min_rounds"] = DEFAULT_MIN_ROUNDS
        item.add_marker(pytest.mark.benchmark(**kwargs))


_INPUTS = bc.InputCache()
_TF = {}


def _tensorflow(threads):
    if "module" not in _TF:
        import tensorflow as tf
        want = int(os.environ.get("CFBN_BENCH_TF_THREADS", "0") or 0)
        if want <= 0:
            want = max(_env_list("CFBN_BENCH_THREADS", bc.THREADS, int))
        try:
            tf.config.threading.set_intra_op_parallelism_threads(want)
        except RuntimeError:  # the runtime was initialized before
            pass
        _TF["module"] = tf
        _TF["threads"] = tf.config.threading.get_intra_op_parallelism_threads() or want
    tf = _TF["module"]
    if _TF["threads"] != threads:
        pytest.skip("tensorflow: intra-op threads are fixed per process at %d "
                    "(CFBN_BENCH_TF_THREADS)" % _TF["threads"])
    return tf


def _warm(fn, seconds=0.02, min_calls=2):
    start = time.perf_counter()
    calls = 0
    while calls < min_calls or time.perf_counter() - start < seconds:
        fn()
        calls += 1


class Runner:
    """Builds and times one benchmark: the `bench` fixture."""

    def __init__(self, benchmark):
        self.benchmark = benchmark

    def __call__(self, op, shape, layout, threads, impl):
        benchmark = self.benchmark
        benchmark.group = "%s %s %s threads=%d" % (bc.LABELS[op], layout, bc.shape_str(shape),
                                                    threads)
        info = cfbn.runtime_info()
        extra = benchmark.extra_info
        extra.update(impl=impl, op=op, layout=layout, shape=list(shape), dtype="float32",
                     threads=threads, isa=info["selected_isa"])

        if impl == "torch":
            torch = bc.torch_module()
            if torch is None:
                pytest.skip("torch is not installed")
        elif impl == "tensorflow":
            if not bc.have_module("tensorflow"):
                pytest.skip("tensorflow is not installed")
            tf = _tensorflow(threads)

        d = _INPUTS.get(shape, layout)
        if op == "gradgrad":
            bc.add_upstream(d)
        nbytes = d["x"].nbytes
        extra["bytes"] = bc.minimal_bytes(op, nbytes)

        if impl == "cfbn":
            fn = bc.cfbn_call(op, d, threads)
        elif impl == "cfbn-out":
            fn = bc.cfbn_call(op, d, threads, out=bc.cfbn_out(op, d))
        elif impl == "reference":
            extra["threads"] = 1
            extra["isa"] = "numpy float64"
            fn = bc.reference_call(op, d)
        elif impl == "torch":
            extra["isa"] = "torch " + torch.__version__
            fn = bc.torch_call(torch, op, bc.torch_args(torch, d))
        else:
            extra["isa"] = "tensorflow " + tf.__version__
            fn = bc.tensorflow_call(tf, op, d)

        previous = None
        if impl == "torch":
            previous = torch.get_num_threads()
            torch.set_num_threads(threads)
        try:
            if benchmark.enabled:
                _warm(fn)
            benchmark(fn)
        finally:
            if previous is not None:
                torch.set_num_threads(previous)

        stats = getattr(benchmark, "stats", None)
        if stats is not None and getattr(stats, "stats", None) is not None and stats.stats.data:
            s = stats.stats
            extra["gbps"] = round(bc.gbps(op, nbytes, s.median), 3)
            extra["gbps_mean"] = round(bc.gbps(op, nbytes, s.mean), 3)


@pytest.fixture
def bench(benchmark):
    return Runner(benchmark)
