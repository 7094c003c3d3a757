"""Each loop family from the ISA that runs it fastest on this CPU.

On a CPU that a row of csrc/dispatch.c names (cfbn.runtime_info()'s
``cpu_row``), the default table runs each loop family on the ISA that row
gives it (``family_isas``); elsewhere every family runs on ``selected_isa``.
A call under the default gives the very bits of the same call with its
family's ISA forced, and the trace names that ISA; a forced ISA runs every
family.
"""
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import cfbn
from cfbn import _kernels

from _checks import selected

FAMILIES = ["plain", "plain_float16", "plain_bfloat16", "relu_family", "exp_family",
            "second_order"]
# odd channel counts, rows that are no multiple of any table's lanes, and
# channels-first planes with tails
SHAPES = [((3, 5, 7, 19), "NHWC"), ((2, 37, 6, 5), "NCHW"), ((64, 3), "NC"),
          ((4, 9, 9, 33), "NHWC")]


def _calls(family, shape, fmt):
    """Every result of the family's calls (forward, gradient; training and
    inference) on one tensor, as a list of arrays."""
    rng = np.random.default_rng(abs(hash((family, shape))) % 2 ** 32)
    dtype = {"plain_float16": np.float16, "plain_bfloat16": ml_dtypes.bfloat16}.get(
        family, np.float32)
    act = {"relu_family": "leaky_relu", "exp_family": "silu"}.get(family)
    x = (rng.standard_normal(shape) * 3 + 2).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    c = shape[1] if fmt == "NCHW" else shape[-1]
    vdt = np.float32
    scale = rng.uniform(0.5, 2, c).astype(vdt)
    offset = rng.standard_normal(c).astype(vdt)
    mean, var = rng.standard_normal(c).astype(vdt), rng.uniform(0.5, 2, c).astype(vdt)
    out = []
    kw = dict(epsilon=1e-3, data_format=fmt)
    if family == "second_order":
        f = cfbn.fused_batch_norm(x, scale, offset, **kw)
        g = cfbn.fused_batch_norm_grad_grad(dy, x, scale, f.reserve_space_1, f.reserve_space_2,
                                            x, scale, offset, **kw)
        return list(g)
    side = x if family == "relu_family" else None
    for training in (True, False):
        f = cfbn.fused_batch_norm(x, scale, offset, mean, var, exponential_avg_factor=0.3,
                                  is_training=training, activation=act, side_input=side, **kw)
        out += list(f)
        g = cfbn.fused_batch_norm_grad(dy, x, scale, f.reserve_space_1, f.reserve_space_2,
                                       is_training=training, activation=act,
                                       offset=offset if act else None, side_input=side, **kw)
        out += list(g)
    return out


def test_every_family_has_an_isa_the_cpu_runs():
    info = cfbn.runtime_info()
    assert sorted(info["family_isas"]) == sorted(FAMILIES)
    assert set(info["family_isas"].values()) <= set(info["supported_isas"])
    if info["cpu_row"] is None:
        assert set(info["family_isas"].values()) == {info["selected_isa"]}


@pytest.mark.parametrize("shape,fmt", SHAPES, ids=str)
@pytest.mark.parametrize("family", FAMILIES)
def test_the_default_gives_the_bits_of_its_familys_isa(family, shape, fmt):
    isa = cfbn.runtime_info()["family_isas"][family]
    got = _calls(family, shape, fmt)
    with selected(isa):
        want = _calls(family, shape, fmt)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes(), (family, isa)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_trace_names_the_familys_isa(family, capfd):
    isas = cfbn.runtime_info()["family_isas"]
    cfbn.set_verbose(True)
    try:
        _calls(family, (2, 3, 4, 5), "NHWC")
    finally:
        cfbn.set_verbose(False)
    lines = [dict(kv.split("=", 1) for kv in line.split()[1:])
             for line in capfd.readouterr().err.splitlines() if line.startswith("cfbn-trace ")]
    # (the second order's calls include a plain forward)
    assert family in {ln["family"] for ln in lines}
    for ln in lines:
        assert ln["table"] == isas[ln["family"]], ln


def test_a_forced_isa_runs_every_family(isa):
    assert set(cfbn.runtime_info()["family_isas"].values()) == {isa}
    assert not _kernels.routes_families()


def test_the_isa_fixture_gives_back_the_default():
    before = cfbn.runtime_info()["family_isas"]
    with selected("scalar"):
        pass
    assert cfbn.runtime_info()["family_isas"] == before


def test_cfbn_force_isa_turns_the_rows_off():
    code = "import cfbn; i = cfbn.runtime_info(); print(sorted(set(i['family_isas'].values())))"
    for isa in cfbn.runtime_info()["supported_isas"]:
        env = dict(os.environ, CFBN_FORCE_ISA=isa)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True).stdout.strip()
        assert out == repr([isa])
