"""cfbn's prebuilt operator library (csrc/torch_ops.cpp) in PyTorch's dispatcher.

The C++ operators against the Python bridge that serves where the library
cannot load (the same bits, strides and dtypes for every layout, dtype and
activation); what the library may link against (LibTorch's stable C shim
only); the fallback's one warning; and the operators seen by what works
through the dispatcher: tracing, export, fake tensors, the profiler.
"""
import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import cfbn  # noqa: E402
import cfbn.torch as ct  # noqa: E402
from cfbn.torch import _bridge, _checks, _library, ops  # noqa: E402

ROOT = str(Path(cfbn.__file__).resolve().parent.parent)
LIBRARY = os.path.join(os.path.dirname(_library.__file__), _library.NAME)
SET_ASIDE = os.environ.get("CFBN_TORCH_LIBRARY", "1") == "0"
needs_library = pytest.mark.skipif(SET_ASIDE, reason="CFBN_TORCH_LIBRARY=0 sets the library aside")


@needs_library
def test_the_library_is_loaded():
    # A build beside torch >= 2.10 has the library; a missing one is a build
    # that went wrong, not a reason to test the Python path alone.
    assert ops.NOT_LOADED is None, ops.NOT_LOADED
    assert os.path.exists(LIBRARY)


@needs_library
def test_the_library_uses_only_the_stable_c_shim():
    out = subprocess.run(["nm", "-D", "--undefined-only", LIBRARY], capture_output=True,
                         text=True, check=True).stdout
    symbols = [line.split()[-1] for line in out.splitlines() if line.strip()]
    torch_symbols = [s for s in symbols if "@" not in s and not s.startswith(("_ITM_", "__gmon"))]
    assert torch_symbols, "no torch symbol at all: nm read the wrong file"
    # C functions of the shim (aoti_torch_*, torch_*), never a mangled C++
    # name of ATen or c10, whose ABI changes between releases.
    assert all(s.startswith(("aoti_torch_", "torch_")) for s in torch_symbols), \
        [s for s in torch_symbols if not s.startswith(("aoti_torch_", "torch_"))]
    for line in subprocess.run(["nm", "-D", LIBRARY], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        assert "_ZN2at" not in line and "_ZN3c10" not in line, line


@needs_library
def test_the_library_needs_no_newer_glibc_or_libstdcxx_than_manylinux2014():
    # The wheels' tag covers every binary in them: the library must not
    # raise it above the C core's manylinux_2_17 (GLIBC_2.17, GLIBCXX_3.4.19,
    # CXXABI_1.3.7 at most).
    out = subprocess.run(["objdump", "-T", LIBRARY], capture_output=True, text=True,
                         check=True).stdout
    limits = {"GLIBC": (2, 17), "GLIBCXX": (3, 4, 19), "CXXABI": (1, 3, 7)}
    for name, version in set(re.findall(r"\((GLIBC|GLIBCXX|CXXABI)_([0-9.]+)\)", out)):
        assert tuple(int(v) for v in version.split(".")) <= limits[name], (name, version)
    exported = subprocess.run(["nm", "-D", "--defined-only", LIBRARY], capture_output=True,
                              text=True, check=True).stdout.split()
    assert exported[-1] == "cfbn_torch_bind" and exported.count("T") == 1, exported


@needs_library
def test_a_direct_operator_call_with_bad_arguments_raises():
    x = torch.randn(4, 3, 5)
    with pytest.raises(RuntimeError, match="expected float32"):
        ops.batch_norm(x.int(), None, None, None, None, None, True, 0.1, 1e-5, 0, 0.0, None)
    with pytest.raises(RuntimeError, match=r"weight: expected 3 values, one per channel of "
                                           r"input of shape \(4, 3, 5\), got shape \(4,\)"):
        ops.batch_norm(x, torch.ones(4), None, None, None, None, True, 0.1, 1e-5, 0, 0.0, None)
    with pytest.raises(RuntimeError, match="save_mean"):
        ops.batch_norm_backward(x, x, None, None, torch.ones(2), torch.ones(3), True, 1e-5, 0,
                                0.0, None)
    with pytest.raises(RuntimeError, match="side_input"):
        ops.batch_norm(x, None, None, None, None, None, True, 0.1, 1e-5, 0, 0.0, x[:, :2])
    # an unknown activation code would leave the output unwritten
    for code in (-1, 8, 99):
        with pytest.raises(RuntimeError, match="activation: expected a code"):
            ops.batch_norm(x, None, None, None, None, None, True, 0.1, 1e-5, code, 0.0, None)
        with pytest.raises(RuntimeError, match="activation: expected a code"):
            ops.batch_norm_backward(x, x, None, None, torch.zeros(3), torch.ones(3), True, 1e-5,
                                    code, 0.0, None)


def _inputs(shape, dtype, memory, seed):
    g = torch.Generator().manual_seed(seed)
    vd = torch.float64 if dtype is torch.float64 else torch.float32
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 3 + 5).to(dtype)
    if memory == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last if x.dim() == 4
                         else torch.channels_last_3d)
    elif memory == "transposed":
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    elif memory == "strided":
        x = torch.cat([x, x], 2)[:, :, ::2]
    c = shape[1]
    w = (torch.rand(c, generator=g) + 0.5).to(vd)
    b = torch.randn(c, generator=g).to(vd)
    rm = torch.randn(c, generator=g).to(vd)
    rv = (torch.rand(c, generator=g) + 0.5).to(vd)
    side = torch.randn(shape, generator=g).to(dtype)
    dy = torch.randn(shape, generator=g).to(dtype)
    return x, w, b, rm, rv, side, dy


def _same(p, q, what):
    assert p.dtype == q.dtype and p.shape == q.shape, what
    if p.numel():
        assert p.stride() == q.stride(), (what, p.stride(), q.stride())
    assert torch.equal(p, q), (what, (p.double() - q.double()).abs().max())


LAYOUTS = [((6, 5), None), ((3, 4, 6), None), ((3, 4, 6), "transposed"), ((4, 3, 5, 7), None),
           ((4, 3, 5, 7), "channels_last"), ((4, 3, 5, 7), "strided"), ((2, 3, 2, 3, 4), None),
           ((2, 3, 2, 3, 4), "channels_last"), ((0, 3, 4, 4), None)]
CASES = list(itertools.product(LAYOUTS, [torch.float32, torch.float64, torch.float16,
                                         torch.bfloat16], [0, 1, 7]))


@needs_library
@pytest.mark.parametrize("layout,dtype,act", CASES)
@pytest.mark.parametrize("training", [True, False])
def test_operators_give_the_bridge_bits(layout, dtype, act, training):
    shape, memory = layout
    x, w, b, rm, rv, side, dy = _inputs(shape, dtype, memory, 3)
    _, name, alpha = _checks.scalars(1e-3, act, 0.0)
    s = side if act else None
    got = ops.batch_norm(x, w, b, rm, rv, None, training, 0.1, 1e-3, act, 0.0, s)
    want = _bridge.forward(x, w, b, rm, rv, training, 0.1, 1e-3, name, alpha, s, False)
    for p, q, what in zip(got, want, ["y", "save_mean", "save_var", "new_mean", "new_var"]):
        _same(p, q, what)
    save_mean, save_var = got[1], got[2]
    got = ops.batch_norm_backward(dy, x, w, b, save_mean, save_var, training, 1e-3, act, 0.0, s)
    want = _bridge.backward(dy, x, w, b, save_mean, save_var, training, 1e-3, name, alpha, s)
    for p, q, what in zip(got, want, ["dx", "dweight", "dbias", "dside"]):
        if q is not None:
            _same(p, q, what)
    ggx, ggw = torch.randn_like(x), torch.randn_like(w)
    got = ops.batch_norm_double_backward(dy, x, w, save_mean, save_var, ggx, ggw, None,
                                         training, 1e-3)
    want = _bridge.double_backward(dy, x, w, save_mean, save_var, ggx, ggw, None, training, 1e-3)
    for p, q, what in zip(got, want, ["ddy", "dx", "dweight"]):
        _same(p, q, what)


@needs_library
def test_large_outputs_come_from_cfbns_output_cache():
    """A large output is a buffer of cfbn's output cache (as the NumPy calls'
    outputs are), handed back when its tensor dies; a small one, or any
    with the cache's limit at 0, comes from PyTorch's allocator."""
    from cfbn import _kernels
    x = torch.randn(64, 32, 32, 32)
    _kernels.release_output_cache()
    before = _kernels.output_cache_stats()
    y = ct.batch_norm(x, None, None, training=True)
    z = ct.batch_norm(x, None, None, training=True)
    assert y.data_ptr() != z.data_ptr()
    torch.testing.assert_close(y, z, rtol=0, atol=0)
    assert not y.untyped_storage().resizable()
    del y, z
    held = _kernels.output_cache_stats()
    assert held["held_bytes"] == 2 * x.numel() * 4, (before, held)
    w = ct.batch_norm(x, None, None, training=True)
    after = _kernels.output_cache_stats()
    assert after["hits"] == held["hits"] + 1, (held, after)
    w.add_(1.0)                       # an output of its own, written in place
    small = ct.batch_norm(torch.randn(4, 3, 5, 5), None, None, training=True)
    assert small.untyped_storage().resizable()
    old = cfbn.set_output_cache_limit(0)
    try:
        v = ct.batch_norm(x, None, None, training=True)
        assert v.untyped_storage().resizable()
    finally:
        cfbn.set_output_cache_limit(old)
    _kernels.release_output_cache()
    assert _kernels.output_cache_stats()["held_bytes"] == 0


@needs_library
def test_a_steady_training_loop_faults_in_no_output_pages():
    """Outputs from PyTorch's allocator were fresh pages on most steps (glibc
    unmaps or trims large freed blocks): about 1,200 minor faults a step of
    this shape, a third of its time.  From the cache they fault once."""
    import resource
    m = ct.BatchNorm2d(64)
    x = torch.randn(8, 64, 56, 56).requires_grad_()
    dy = torch.randn_like(x)
    for _ in range(3):
        x.grad = None
        m(x).backward(dy)
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    steps = 10
    for _ in range(steps):
        x.grad = None
        m(x).backward(dy)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start) / steps
    pages = x.numel() * 4 // 4096     # one output's pages: 1,568
    assert faults < pages / 10, "%.0f minor faults a step" % faults


def test_the_python_operators_serve_with_one_warning():
    code = ("import warnings, torch\n"
            "warnings.simplefilter('always')\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    import cfbn.torch as ct\n"
            "    from cfbn.torch import ops\n"
            "    x = torch.randn(4, 3, 5, 5, dtype=torch.float64, requires_grad=True)\n"
            "    y = ct.batch_norm(x, None, None, training=True)\n"
            "    y.sum().backward()\n"
            "    ct.batch_norm(x, None, None, training=True)\n"
            "ref = torch.nn.functional.batch_norm(x.detach(), None, None, training=True)\n"
            "print(ops.NOT_LOADED)\n"
            "print(sum('CFBN_TORCH_LIBRARY=0' in str(m.message) for m in w))\n"
            "print(float((y - ref).abs().max()))\n")
    env = dict(os.environ, CFBN_TORCH_LIBRARY="0")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    reason, warnings, err = out.stdout.split("\n")[:3]
    assert reason == "CFBN_TORCH_LIBRARY=0" and warnings == "1"
    assert float(err) < 1e-12


def test_a_third_derivative_is_a_clear_error():
    x = torch.randn(4, 3, 5, 5, dtype=torch.float64, requires_grad=True)
    y = ct.batch_norm(x, None, None, training=True)
    (g,) = torch.autograd.grad((y ** 3).sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad((g ** 2).sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="third derivative"):
        torch.autograd.grad(gg.sum(), x)


def test_forward_ad_is_a_clear_error_never_a_dropped_tangent():
    import torch.autograd.forward_ad as fwAD
    x = torch.randn(4, 3, 5, 5, dtype=torch.float64)
    rm, rv = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, torch.randn_like(x))
        with pytest.raises(NotImplementedError, match="forward-mode AD"):
            ct.batch_norm(dual, rm, rv, training=False)
    bn = ct.BatchNorm2d(3, affine=False).double().eval()
    with pytest.raises(NotImplementedError, match="forward-mode AD"):
        torch.func.jvp(bn, (x,), (torch.randn_like(x),))


def test_vmap_gives_the_per_sample_result_or_an_error():
    x = torch.randn(3, 4, 2, 5, 5, dtype=torch.float64)
    rm, rv = torch.zeros(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64) * 2

    def f(t):
        return ct.batch_norm(t, rm, rv, training=False)

    try:
        got = torch.func.vmap(f)(x)
    except (NotImplementedError, RuntimeError) as exc:
        assert "Recursion" not in type(exc).__name__
        assert "cfbn" in str(exc)
        return
    want = torch.stack([torch.nn.functional.batch_norm(t, rm, rv) for t in x])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_negative_and_conjugate_views_are_read_as_their_values():
    x = torch.randn(4, 3, 5, 5, dtype=torch.float64)
    neg = torch._neg_view(x)
    assert neg.is_neg()
    got = ct.batch_norm(neg, None, None, training=True)
    want = torch.nn.functional.batch_norm(-x, None, None, training=True)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), ct.BatchNorm2d(4, activation="relu"),
                               torch.nn.Conv2d(4, 2, 1), ct.BatchNorm2d(2)).double()


@pytest.mark.parametrize("training", [True, False])
def test_jit_trace_records_the_operator(training):
    m = _model().train(training)
    example, other = torch.randn(2, 3, 8, 8).double(), torch.randn(2, 3, 8, 8).double()
    ref = _model().train(training)
    traced = torch.jit.trace(m, example, check_trace=False)
    assert "cfbn::batch_norm" in str(traced.inlined_graph)
    torch.testing.assert_close(traced(other), ref(example) * 0 + ref(other), rtol=0, atol=0)
    # the running statistics advance in the traced module as in the eager one
    if training:
        torch.testing.assert_close(m[1].running_mean, ref[1].running_mean, rtol=0, atol=1e-15)


def test_export_and_fake_tensors_see_the_operator():
    m = _model().eval()
    x = torch.randn(2, 3, 8, 8).double()
    ep = torch.export.export(m, (x,))
    assert "cfbn.batch_norm" in str(ep.graph)
    torch.testing.assert_close(ep.module()(x), m(x), rtol=0, atol=0)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        xf = torch.empty(2, 3, 8, 8, dtype=torch.float64).contiguous(
            memory_format=torch.channels_last)
        yf = ct.batch_norm(xf, None, None, training=True, activation="silu")
    assert yf.shape == x.shape and yf.is_contiguous(memory_format=torch.channels_last)


@needs_library
def test_torch_thread_count_is_used_and_changes_no_bit():
    x = torch.randn(16, 24, 20, 20, dtype=torch.float32, requires_grad=True)
    dy = torch.randn_like(x)
    before = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            x.grad = None
            y = ct.batch_norm(x, None, None, training=True, activation="silu")
            y.backward(dy)
            results.append((y.detach().clone(), x.grad.clone()))
    finally:
        torch.set_num_threads(before)
    for y, g in results[1:]:
        assert torch.equal(y, results[0][0]) and torch.equal(g, results[0][1])


def test_a_first_call_compiles_nothing_and_writes_no_cache(tmp_path):
    # A compile on first use left a lock file behind when killed, and every
    # later process waited on it: nothing may be compiled or cached now.
    code = ("import sys, torch, cfbn.torch as ct\n"
            "x = torch.randn(4, 3, 5, 5, requires_grad=True)\n"
            "ct.BatchNorm2d(3, activation='relu')(x).sum().backward()\n"
            "print('torch.utils.cpp_extension' in sys.modules)\n")
    env = dict(os.environ, HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"),
               TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    assert list(tmp_path.iterdir()) == []


def test_release_output_cache_frees_what_training_steps_left():
    # The cache keeps freed outputs for the next step's of the same size, up
    # to its limit (cfbn.output_cache_info); release_output_cache gives them
    # back, as for the NumPy calls.  The (32, 64, 64, 64) outputs are 32 MiB.
    from cfbn import _kernels
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 3), ct.BatchNorm2d(64, activation="relu"))
    x = torch.randn(32, 3, 66, 66)
    for _ in range(3):
        model(x).sum().backward()
    info = cfbn.output_cache_info()
    assert info["held_bytes"] <= info["limit"]
    _kernels.release_output_cache()
    assert _kernels.output_cache_stats()["held_bytes"] == 0


@needs_library
def test_torch_pool_and_openmp_threads_give_the_same_bits(tmp_path):
    code = ("import sys, torch, cfbn.torch as ct\n"
            "torch.set_num_threads(2)\n"
            "g = torch.Generator().manual_seed(5)\n"
            "out = []\n"
            "for shape, mf in [((32, 48, 24, 24), None), ((32, 48, 24, 24), torch.channels_last),\n"
            "                  ((4096, 96), None)]:\n"
            "    x = torch.randn(shape, generator=g).requires_grad_()\n"
            "    if mf is not None:\n"
            "        x = x.detach().contiguous(memory_format=mf).requires_grad_()\n"
            "    bn = ct.BatchNorm1d(shape[1]) if len(shape) == 2 else "
            "ct.BatchNorm2d(shape[1], activation='silu')\n"
            "    y = bn(x)\n"
            "    y.backward(torch.randn(shape, generator=g))\n"
            "    out += [y.detach(), x.grad, bn.weight.grad, bn.running_var]\n"
            "torch.save(out, sys.argv[1])\n")
    results = {}
    for pool in ("torch", "openmp"):
        path = tmp_path / (pool + ".pt")
        env = dict(os.environ, CFBN_TORCH_POOL=pool)
        out = subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        results[pool] = torch.load(path)
    for a, b in zip(results["torch"], results["openmp"]):
        assert torch.equal(a, b)
