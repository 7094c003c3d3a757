"""Kernel table selection: runtime_info, select_isa and CFBN_FORCE_ISA."""

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

import cfbn
from cfbn import _kernels

KNOWN_ISAS = {"scalar", "avx2", "neon", "avx512"}
MACHINE = platform.machine().lower()
X86 = MACHINE in ("x86_64", "amd64")
ARM64 = MACHINE in ("aarch64", "arm64")


def run_python(code, **env_updates):
    """Run ``code`` in a fresh interpreter that imports this same cfbn."""
    env = dict(os.environ)
    env.pop("CFBN_FORCE_ISA", None)
    env.update(env_updates)
    package_parent = str(Path(cfbn.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_parent, env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)


def test_runtime_info_keys_and_types():
    info = cfbn.runtime_info()
    assert set(info) >= {"version", "compiled_isas", "supported_isas", "selected_isa",
                         "openmp", "max_threads"}
    assert isinstance(info["version"], str) and info["version"] == cfbn.__version__
    assert isinstance(info["compiled_isas"], list)
    assert isinstance(info["supported_isas"], list)
    assert all(isinstance(s, str) for s in info["compiled_isas"] + info["supported_isas"])
    assert isinstance(info["selected_isa"], str)
    assert isinstance(info["openmp"], bool)
    assert isinstance(info["max_threads"], int) and not isinstance(info["max_threads"], bool)
    assert info["max_threads"] >= 1
    if not info["openmp"]:
        assert info["max_threads"] == 1


def test_isa_lists_are_consistent():
    info = cfbn.runtime_info()
    assert set(info["compiled_isas"]) <= KNOWN_ISAS
    assert set(info["supported_isas"]) <= set(info["compiled_isas"])
    assert "scalar" in info["supported_isas"]
    assert info["selected_isa"] in info["supported_isas"]
    assert _kernels.selected_isa() == info["selected_isa"]
    if X86:
        assert "neon" not in info["supported_isas"]
    if ARM64:
        assert "avx2" not in info["supported_isas"]
        assert "avx512" not in info["supported_isas"]
    if "avx512" in info["supported_isas"]:
        assert "avx2" in info["supported_isas"]


def test_version_is_a_string():
    assert isinstance(cfbn.__version__, str) and cfbn.__version__


def test_select_isa_switches_and_reports(isa):
    assert _kernels.selected_isa() == isa
    assert cfbn.runtime_info()["selected_isa"] == isa


@pytest.mark.parametrize("name", ["bogus", "", "AVX2 ", "sse9"])
def test_select_unknown_isa_fails_and_keeps_the_table(name):
    before = _kernels.selected_isa()
    with pytest.raises(ValueError):
        _kernels.select_isa(name)
    assert _kernels.selected_isa() == before


def test_select_unsupported_isa_fails():
    unsupported = sorted(KNOWN_ISAS - set(cfbn.runtime_info()["supported_isas"]))
    if not unsupported:
        pytest.skip("this CPU supports every ISA cfbn knows")
    before = _kernels.selected_isa()
    for name in unsupported:
        with pytest.raises(ValueError):
            _kernels.select_isa(name)
        assert _kernels.selected_isa() == before


PRINT_SELECTED = "import cfbn; print(cfbn.runtime_info()['selected_isa'])"


@pytest.mark.parametrize("name", sorted(cfbn.runtime_info()["supported_isas"]))
def test_forced_isa_is_selected(name):
    proc = run_python(PRINT_SELECTED, CFBN_FORCE_ISA=name)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == name


def test_default_selection_is_the_best_supported():
    proc = run_python(PRINT_SELECTED)
    assert proc.returncode == 0, proc.stderr
    supported = cfbn.runtime_info()["supported_isas"]
    chosen = proc.stdout.strip()
    assert chosen in supported
    # AVX-512 only where CFBN_FORCE_ISA asks for it: no CPU has been
    # measured faster with it yet (csrc/README.md)
    best = [s for s in ("avx2", "neon") if s in supported]
    if best:
        assert chosen == best[0]


def assert_import_fails(value):
    proc = run_python("import cfbn", CFBN_FORCE_ISA=value)
    assert proc.returncode != 0, f"import succeeded with CFBN_FORCE_ISA={value!r}"
    assert "CFBN_FORCE_ISA" in proc.stderr, proc.stderr
    assert value in proc.stderr, proc.stderr
    assert "Segmentation fault" not in proc.stderr


def test_forcing_an_unknown_isa_is_an_error():
    assert_import_fails("bogus")


@pytest.mark.skipif(not X86, reason="needs an x86-64 CPU")
def test_forcing_neon_on_x86_is_an_error():
    assert_import_fails("neon")


@pytest.mark.skipif(not ARM64, reason="needs an aarch64 CPU")
def test_forcing_avx2_on_arm_is_an_error():
    assert_import_fails("avx2")


@pytest.mark.skipif("avx512" in cfbn.runtime_info()["supported_isas"],
                    reason="this CPU runs AVX-512")
def test_forcing_avx512_where_it_does_not_run_is_an_error():
    assert_import_fails("avx512")


def test_forcing_an_unsupported_compiled_isa_is_an_error():
    info = cfbn.runtime_info()
    missing = sorted(set(info["compiled_isas"]) - set(info["supported_isas"]))
    if not missing:
        pytest.skip("every compiled ISA runs on this CPU")
    assert_import_fails(missing[0])
