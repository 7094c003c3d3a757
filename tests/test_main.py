"""`python -m cfbn`: its options, that its self-check can fail, its speed
table and the warning when other processes load the CPUs."""
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import cfbn
from cfbn import __main__ as main_mod

ROOT = str(Path(cfbn.__file__).resolve().parent.parent)


def _run(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "cfbn", *args], env=env, capture_output=True,
                          text=True, timeout=300)


def test_help_names_the_options():
    r = _run("--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: python -m cfbn")
    for opt in ("--check", "--no-torch", "--plot"):
        assert opt in r.stdout


def test_an_unknown_option_is_an_error():
    r = _run("--fast")
    assert r.returncode == 2
    assert "unrecognized arguments: --fast" in r.stderr


def test_check_runs_the_self_check_without_timing():
    r = _run("--check")
    assert r.returncode == 0, r.stdout + r.stderr
    # the child selects what this process does (CFBN_FORCE_ISA is inherited)
    assert re.search(r"^  selected_isa +%s$" % cfbn.runtime_info()["selected_isa"], r.stdout, re.M)
    # ml_dtypes is installed with the tests: the self-check covers bfloat16 and says so
    assert "self-check passed" in r.stdout
    assert "float32/float64/float16/bfloat16" in r.stdout
    assert "| shape" not in r.stdout


def test_self_check_fails_on_a_wrong_gradient(monkeypatch, capsys):
    real = cfbn.fused_batch_norm_grad

    def off_by_a_little(*args, **kw):
        got = real(*args, **kw)
        return got._replace(x_backprop=got.x_backprop * (1 + 1e-3))

    monkeypatch.setattr(cfbn, "fused_batch_norm_grad", off_by_a_little)
    assert main_mod.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "self-check FAILED" in out
    assert "x_backprop" in out


def _table(monkeypatch, capsys, load, *args):
    monkeypatch.setattr(main_mod, "BENCH_SHAPES", [(2, 3, 4, 5)])
    monkeypatch.setattr(main_mod, "_time", lambda fn, **kw: (fn(), 1e-5)[1])
    monkeypatch.setattr(main_mod._cpuload, "CpuMeter",
                        lambda: types.SimpleNamespace(others=lambda: load))
    assert main_mod.main(list(args)) == 0
    return capsys.readouterr().out


def test_speed_table_rows(monkeypatch, capsys):
    out = _table(monkeypatch, capsys, 0.0, "--no-torch")
    rows = [line for line in out.splitlines() if line.startswith("| 2,3,4,5 |")]
    assert [r.split("|")[2].strip() for r in rows] == [
        "forward train", "forward infer", "gradient", "grad of grad"]
    assert "PyTorch" not in out
    assert "warning" not in out


def test_speed_table_warns_when_others_load_the_cpus(monkeypatch, capsys):
    out = _table(monkeypatch, capsys, 1.5, "--no-torch")
    assert "warning: other processes used 1.5 of this machine's CPUs" in out


def test_pytorch_column_computes_what_cfbn_computes():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    shape, eps = (3, 4, 5, 7), 1e-3
    x, scale, offset, mean, var = main_mod._inputs(rng, shape, "NHWC", np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    ops = main_mod._torch_ops(torch, x, scale, offset, mean, var, dy, eps)
    y, _, _, saved_mean, saved_var = cfbn.fused_batch_norm(x, scale, offset, epsilon=eps)
    to_nhwc = lambda t: t.permute(0, 2, 3, 1).numpy()  # noqa: E731
    np.testing.assert_allclose(to_nhwc(ops["forward train"]()), y, rtol=1e-4, atol=1e-4)
    yi = cfbn.fused_batch_norm(x, scale, offset, mean, var, epsilon=eps, is_training=False)[0]
    np.testing.assert_allclose(to_nhwc(ops["forward infer"]()), yi, rtol=1e-5, atol=1e-5)
    dx, dscale, doffset = cfbn.fused_batch_norm_grad(dy, x, scale, saved_mean, saved_var,
                                                     epsilon=eps)
    tdx, tdscale, tdoffset = ops["gradient"]()
    np.testing.assert_allclose(to_nhwc(tdx), dx, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(tdscale.numpy(), dscale, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(tdoffset.numpy(), doffset, rtol=1e-4, atol=1e-4)


def test_speed_table_sets_pytorch_beside_cfbn(monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    out = _table(monkeypatch, capsys, 0.0)
    assert "PyTorch %s (channels_last)" % torch.__version__ in out
    rows = {r.split("|")[2].strip(): r for r in out.splitlines() if r.startswith("| 2,3,4,5 |")}
    assert rows["gradient"].count(" us ") == 3
    assert rows["grad of grad"].rstrip().endswith("| - | - |")


def test_plot_draws_the_speed_table(monkeypatch, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "speed.svg"
    out = _table(monkeypatch, capsys, 0.0, "--no-torch", "--plot", str(path))
    assert "figure written to %s" % path in out
    svg = path.read_text()
    assert svg.lstrip().startswith(("<?xml", "<svg"))
    # the caption names the command, the kernels and the copy bandwidth's line
    for text in ("python -m cfbn --plot", cfbn.runtime_info()["selected_isa"], "np.copyto",
                 "over the NumPy reference", "2x3x4x5 fwd train"):
        assert text in svg


def test_plot_without_matplotlib_names_the_extra(monkeypatch, capsys, tmp_path):
    from cfbn import _plot

    def missing():
        raise ImportError(_plot.EXTRA_HINT)

    monkeypatch.setattr(_plot, "pyplot", missing)
    assert main_mod.main(["--no-torch", "--plot", str(tmp_path / "f.svg")]) == 2
    err = capsys.readouterr().err
    assert 'pip install "cfbn[plot]"' in err
    assert not (tmp_path / "f.svg").exists()


def test_plot_and_check_do_not_go_together():
    r = _run("--check", "--plot", "f.svg")
    assert r.returncode == 2
    assert "--check leaves out" in r.stderr
