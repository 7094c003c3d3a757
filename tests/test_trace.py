"""The route trace: CFBN_VERBOSE=1 and cfbn.set_verbose print one line per
kernel call on stderr, fields a script can parse, and change no result."""
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import cfbn

FIELDS = ["op", "dtype", "layout", "outer", "channels", "inner", "act", "side", "table",
          "family", "strategy", "threads", "us", "rc"]


def parse(text):
    """The trace lines of `text`, each as a dict of its fields, in order."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("cfbn-trace "):
            continue
        fields = dict(kv.split("=", 1) for kv in line.split()[1:])
        assert list(fields) == FIELDS, line
        lines.append(fields)
    return lines


def calls():
    """A few calls and the fields each line must have, in call order."""
    rng = np.random.default_rng(0)
    nhwc = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    nchw = rng.standard_normal((2, 5, 3, 4)).astype(np.float32)
    v = np.ones(5, np.float32)
    f = cfbn.fused_batch_norm(nhwc, v, v, activation="relu", side_input=nhwc, n_threads=1)
    cfbn.fused_batch_norm_grad(nchw, nchw, v, v, v, data_format="NCHW", is_training=False,
                               activation="silu", offset=v)
    cfbn.fused_batch_norm_grad_grad(nhwc, nhwc, v, f.reserve_space_1, f.reserve_space_2, nhwc)
    bf = nhwc.astype(ml_dtypes.bfloat16)
    cfbn.fused_batch_norm(bf, v, v)
    return [
        dict(op="forward_training", dtype="float32", layout="channels_last", outer="24",
             channels="5", inner="1", act="relu", side="1", family="relu_family",
             strategy="rows", threads="1"),
        dict(op="backward_inference", dtype="float32", layout="channels_first", outer="2",
             channels="5", inner="12", act="silu", side="0", family="exp_family"),
        dict(op="backward_backward", act="none", family="second_order"),
        dict(op="forward_training", dtype="bfloat16", act="none", family="plain_bfloat16"),
    ]


def check(lines, expected):
    assert len(lines) == len(expected), lines
    for got, want in zip(lines, expected):
        for key, value in want.items():
            assert got[key] == value, (key, got, want)
        assert got["table"] == cfbn.runtime_info()["family_isas"][got["family"]]
        assert got["rc"] == "0"
        assert int(got["threads"]) >= 1 and float(got["us"]) >= 0.0
        assert got["strategy"] in ("rows", "planes", "pieces", "channels", "per_channel")


def test_set_verbose_traces_each_call_and_nothing_when_off(capfd):
    assert cfbn.set_verbose(True) is False
    try:
        assert cfbn.runtime_info()["verbose"] is True
        expected = calls()
    finally:
        assert cfbn.set_verbose(False) is True
    check(parse(capfd.readouterr().err), expected)
    calls()
    assert parse(capfd.readouterr().err) == []
    assert cfbn.runtime_info()["verbose"] is False


def test_the_environment_variable_turns_it_on_at_import():
    code = "import sys; sys.path.insert(0, %r); import test_trace; test_trace.calls()" \
        % os.path.dirname(__file__)
    env = dict(os.environ, CFBN_VERBOSE="1")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    lines = parse(run.stderr)
    assert [line["op"] for line in lines] == [c["op"] for c in calls()]


def test_an_unknown_value_is_an_error_naming_the_variable():
    env = dict(os.environ, CFBN_VERBOSE="yes")
    run = subprocess.run([sys.executable, "-c", "import cfbn"], env=env, capture_output=True,
                         text=True)
    assert run.returncode != 0
    assert "CFBN_VERBOSE='yes': expected 1 (trace every call) or 0" in run.stderr


def test_tracing_changes_no_bit(capfd):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 7, 7, 24)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    v = np.linspace(0.5, 1.5, 24, dtype=np.float32)

    def run():
        f = cfbn.fused_batch_norm(x, v, v, activation="elu")
        g = cfbn.fused_batch_norm_grad(dy, x, v, f.reserve_space_1, f.reserve_space_2,
                                       activation="elu", offset=v)
        return [np.asarray(a).tobytes() for a in tuple(f) + tuple(g) if a is not None]

    plain = run()
    cfbn.set_verbose(True)
    try:
        traced = run()
    finally:
        cfbn.set_verbose(False)
    assert traced == plain
    assert len(parse(capfd.readouterr().err)) == 2


def test_the_torch_operators_are_traced_too(capfd):
    torch = pytest.importorskip("torch")
    import cfbn.torch  # noqa: F401
    x = torch.randn(4, 3, 5, 5)
    cfbn.set_verbose(True)
    try:
        torch.ops.cfbn.batch_norm(x, None, None, None, None, None, True, None, 1e-5, 0, 0.0, None)
    finally:
        cfbn.set_verbose(False)
    lines = parse(capfd.readouterr().err)
    assert [(line["op"], line["layout"], line["channels"]) for line in lines] == \
        [("forward_training", "channels_first", "3")]
