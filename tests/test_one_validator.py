"""The Cython fast paths only recognize the plain call: every other call, and
every error, is the validator's (cfbn._args through cfbn._api), so a bad call
raises the same exception with the same message whichever way it enters."""
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import cfbn
from cfbn import _api, _args, _kernels

from _checks import BFLOAT16

C = 4
F32 = np.float32
# The fast path takes bfloat16 once cfbn._args has recognized it (its type
# number is not known before); test_bfloat16_fast_path_starts_once_seen
# checks the state before.
_args.dtype_kinds(BFLOAT16, "x")


def _x(dtype=F32, shape=(2, 3, 3, C)):
    return np.random.default_rng(0).standard_normal(shape).astype(dtype)


def _v(n=C, dtype=F32, fill=1.0):
    return np.full(n, fill, dtype)


FORWARD_DEFAULTS = dict(mean=None, variance=None, epsilon=1e-3, exponential_avg_factor=1.0,
                        data_format="NHWC", is_training=True, n_threads=None, out=None,
                        activation=None, alpha=None, side_input=None)


def _forward_call(**kw):
    x = _x()
    args = dict(x=x, scale=_v(), offset=_v(fill=0.0), **FORWARD_DEFAULTS)
    args.update(kw)
    return args


def _fwd_out(**fields):
    x = _x()
    out = {"y": np.empty_like(x)}
    out.update(fields)
    return out


def _strided(a):
    b = np.empty(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)[..., ::2]
    b[...] = a
    return b


BAD_FORWARD = {
    "x int32": dict(x=np.zeros((2, 3, 3, C), np.int32)),
    "x big-endian": dict(x=_x().astype(">f4")),
    "x list of str": dict(x=["a"]),
    "x None": dict(x=None),
    "x masked": dict(x=np.ma.masked_array(_x())),
    "x rank 3": dict(x=_x(shape=(2, 3, C))),
    "scale float64": dict(scale=_v(dtype=np.float64)),
    "scale length": dict(scale=_v(C + 1)),
    "offset 2-D": dict(offset=np.ones((1, C), F32)),
    "offset strided length": dict(offset=np.ones(2 * C + 2, F32)[::2]),
    "mean length": dict(mean=_v(C - 1), variance=_v(), exponential_avg_factor=0.5),
    "variance dtype": dict(mean=_v(), variance=_v(dtype=np.float16), is_training=False),
    "x int16": dict(x=np.zeros((2, 3, 3, C), np.int16)),
    "x uint16": dict(x=np.zeros((2, 3, 3, C), np.uint16)),
    "x void 2 bytes": dict(x=np.zeros((2, 3, 3, C), "V2")),
    "x float8": dict(x=_x().astype(ml_dtypes.float8_e4m3fn)),
    "x bfloat16 big-endian": dict(x=_x().astype(BFLOAT16.newbyteorder())),
    "x bfloat16 vectors bfloat16": dict(x=_x(BFLOAT16), scale=_v(dtype=BFLOAT16),
                                        offset=_v(dtype=BFLOAT16)),
    "x bfloat16 vectors float16": dict(x=_x(BFLOAT16), scale=_v(dtype=np.float16)),
    "x float16 out y bfloat16": dict(x=_x(np.float16),
                                     out={"y": np.empty((2, 3, 3, C), BFLOAT16)}),
    "x bfloat16 side_input float16": dict(x=_x(BFLOAT16), activation="relu",
                                          side_input=_x(np.float16)),
    "inference without mean": dict(is_training=False, variance=_v()),
    "factor without variance": dict(mean=_v(), exponential_avg_factor=0.3),
    "epsilon negative": dict(epsilon=-1e-3),
    "epsilon nan": dict(epsilon=float("nan")),
    "epsilon inf": dict(epsilon=float("inf")),
    "epsilon str": dict(epsilon="1e-3"),
    "epsilon bool": dict(epsilon=True),
    "epsilon huge int": dict(epsilon=10 ** 400),
    "factor above 1": dict(exponential_avg_factor=1.5),
    "factor nan": dict(exponential_avg_factor=float("nan")),
    "factor complex": dict(exponential_avg_factor=0.5j),
    "is_training None": dict(is_training=None),
    "is_training str": dict(is_training="False"),
    "is_training int": dict(is_training=1),
    "data_format lower": dict(data_format="nhwc"),
    "data_format None": dict(data_format=None),
    "data_format NCHW rank": dict(data_format="NCDHW"),
    "n_threads 0": dict(n_threads=0),
    "n_threads 2000": dict(n_threads=2000),
    "n_threads float": dict(n_threads=2.0),
    "n_threads bool": dict(n_threads=True),
    "out wrong type": dict(out=np.empty((2, 3, 3, C), F32)),
    "out wrong length": dict(out=(None, None)),
    "out unknown key": dict(out={"z": None}),
    "out y dtype": dict(out={"y": np.empty((2, 3, 3, C), np.float64)}),
    "out y shape": dict(out={"y": np.empty((2, 3, 3, C + 1), F32)}),
    "out y read-only": dict(out={"y": np.empty((2, 3, 3, C), F32)[...]}),
    "out y non-contiguous": dict(out={"y": _strided(np.empty((2, 3, 3, C), F32))}),
    "out y list": dict(out={"y": [[0.0]]}),
    "out batch_mean length": dict(out={"batch_mean": _v(C + 1)}),
    "out batch_mean dtype": dict(out={"batch_mean": _v(dtype=np.float64)}),
    "out shared between outputs": "shared",
    "out y is scale": "y_is_scale",
    "activation unknown": dict(activation="gelu"),
    "alpha without activation": dict(alpha=0.1),
    "side_input shape": dict(activation="relu", side_input=np.zeros((2, 3, 3, C + 1), F32)),
    "side_input dtype": dict(side_input=np.zeros((2, 3, 3, C), np.float64)),
    "side_input list": dict(activation="relu", side_input=[[0.0]]),
    "activation int": dict(activation=1),
    "activation unhashable": dict(activation=["relu"]),
    "alpha for relu": dict(activation="relu", alpha=0.1),
    "alpha nan": dict(activation="leaky_relu", alpha=float("nan")),
    "alpha inf": dict(activation="elu", alpha=float("inf")),
    "alpha str": dict(activation="elu", alpha="1"),
    "out y is side_input shifted": "y_overlaps_side",
}


def _bad_forward(case):
    spec = BAD_FORWARD[case]
    if spec == "shared":
        v = _v()
        return _forward_call(out={"batch_mean": v, "batch_variance": v})
    if spec == "y_is_scale":
        args = _forward_call()
        args["out"] = {"y": args["scale"]}
        return args
    if spec == "y_overlaps_side":
        # y and side_input share memory one element apart: only the very
        # same array may be written in place
        buf = np.zeros(2 * 3 * 3 * C + 1, F32)
        side = buf[1:].reshape(2, 3, 3, C)
        return _forward_call(activation="relu", side_input=side,
                             out={"y": buf[:-1].reshape(2, 3, 3, C)})
    args = _forward_call(**spec)
    out = args["out"]
    if case == "out y read-only":
        out["y"].flags.writeable = False
    return args


def _raised(f, *args, **kw):
    with pytest.raises((TypeError, ValueError)) as info:
        f(*args, **kw)
    return type(info.value), str(info.value)


def _public_forward(a):
    return cfbn.fused_batch_norm(a["x"], a["scale"], a["offset"], a["mean"], a["variance"],
                                 epsilon=a["epsilon"],
                                 exponential_avg_factor=a["exponential_avg_factor"],
                                 data_format=a["data_format"], is_training=a["is_training"],
                                 n_threads=a["n_threads"], out=a["out"],
                                 activation=a["activation"], alpha=a["alpha"],
                                 side_input=a["side_input"])


def _validator_forward(a):
    return _api._forward(a["x"], a["scale"], a["offset"], a["mean"], a["variance"],
                         a["epsilon"], a["exponential_avg_factor"], a["data_format"],
                         a["is_training"], a["n_threads"], a["out"], a["activation"],
                         a["alpha"], a["side_input"])


def _fast_forward(a):
    return _kernels.fast_forward(a["x"], a["scale"], a["offset"], a["mean"], a["variance"],
                                 a["epsilon"], a["exponential_avg_factor"], a["data_format"],
                                 a["is_training"], a["n_threads"], a["out"], a["activation"],
                                 a["alpha"], a["side_input"])


def _fast_grad(a):
    return _kernels.fast_backward(a["y_backprop"], a["x"], a["scale"], a["reserve_space_1"],
                                  a["reserve_space_2"], a["epsilon"], a["data_format"],
                                  a["is_training"], a["n_threads"], a["out"], a["offset"],
                                  a["activation"], a["alpha"], a["side_input"])


@pytest.mark.parametrize("case", sorted(BAD_FORWARD))
def test_forward_errors_are_the_validators(case):
    public = _raised(_public_forward, _bad_forward(case))
    assert public == _raised(_validator_forward, _bad_forward(case))
    # The fast path declines; it neither raises nor runs a call the validator refuses.
    assert _fast_forward(_bad_forward(case)) is None


def _grad_call(**kw):
    x = _x()
    fwd = cfbn.fused_batch_norm(x, _v(), _v(fill=0.0), epsilon=1e-3)
    args = dict(y_backprop=_x() * 0.5, x=x, scale=_v(), reserve_space_1=fwd[3],
                reserve_space_2=fwd[4], epsilon=1e-3, data_format="NHWC", is_training=True,
                n_threads=None, out=None, offset=None, activation=None, alpha=None,
                side_input=None)
    args.update(kw)
    return args


BAD_GRAD = {
    "dy dtype": dict(y_backprop=_x(np.float64)),
    "dy shape": dict(y_backprop=_x(shape=(2, 3, 4, C))),
    "dy None": dict(y_backprop=None),
    "x float16 vectors float16": dict(x=_x(np.float16), y_backprop=_x(np.float16),
                                      scale=_v(dtype=np.float16)),
    "x uint8": dict(x=np.zeros((2, 3, 3, C), np.uint8)),
    "x bfloat16 vectors bfloat16": dict(x=_x(BFLOAT16), y_backprop=_x(BFLOAT16),
                                        scale=_v(dtype=BFLOAT16)),
    "x bfloat16 dy float16": dict(x=_x(BFLOAT16), y_backprop=_x(np.float16)),
    "x float16 dy bfloat16": dict(x=_x(np.float16), y_backprop=_x(BFLOAT16)),
    "x int16 dy int16": dict(x=np.zeros((2, 3, 3, C), np.int16),
                             y_backprop=np.zeros((2, 3, 3, C), np.int16)),
    "scale length": dict(scale=_v(C + 2)),
    "reserve_space_1 dtype": dict(reserve_space_1=_v(dtype=np.float64)),
    "reserve_space_2 length": dict(reserve_space_2=_v(1)),
    "epsilon negative": dict(epsilon=-1.0),
    "epsilon None": dict(epsilon=None),
    "is_training 0": dict(is_training=0),
    "data_format unknown": dict(data_format="NWHC"),
    "data_format rank": dict(data_format="NC"),
    "n_threads negative": dict(n_threads=-1),
    "out tuple length": dict(out=(None,)),
    "out dx shape": dict(out={"x_backprop": np.empty((2, 3, 3, C + 1), F32)}),
    "out dx int": dict(out={"x_backprop": np.empty((2, 3, 3, C), np.int32)}),
    "out scale_backprop length": dict(out={"scale_backprop": _v(C + 1)}),
    "out side_input_backprop without side": dict(out={"side_input_backprop": None}),
    "out dx is scale": "dx_is_scale",
    "activation without offset": dict(activation="relu"),
    "alpha for relu": dict(activation="relu", offset=_v(), alpha=0.2),
    "alpha nan": dict(activation="leaky_relu", offset=_v(), alpha=float("nan")),
    "activation unknown": dict(activation="swish", offset=_v()),
    "offset length": dict(activation="relu", offset=_v(C + 1)),
    "side_input shape": dict(side_input=np.zeros((2, 3, 3, C + 1), F32)),
    "side_input dtype": dict(activation="relu", offset=_v(), side_input=np.zeros((2, 3, 3, C),
                                                                               np.float16)),
    "out side_input_backprop is dy": "sg_is_dy_shifted",
}


def _bad_grad(case):
    spec = BAD_GRAD[case]
    if spec == "dx_is_scale":
        args = _grad_call()
        args["out"] = {"x_backprop": args["scale"]}
        return args
    if spec == "sg_is_dy_shifted":
        buf = np.zeros(2 * 3 * 3 * C + 1, F32)
        buf[1:] = _x().ravel()
        return _grad_call(y_backprop=buf[1:].reshape(2, 3, 3, C), side_input=_x(),
                          out={"side_input_backprop": buf[:-1].reshape(2, 3, 3, C)})
    return _grad_call(**spec)


def _public_grad(a):
    return cfbn.fused_batch_norm_grad(a["y_backprop"], a["x"], a["scale"], a["reserve_space_1"],
                                      a["reserve_space_2"], epsilon=a["epsilon"],
                                      data_format=a["data_format"], is_training=a["is_training"],
                                      n_threads=a["n_threads"], out=a["out"], offset=a["offset"],
                                      activation=a["activation"], alpha=a["alpha"],
                                      side_input=a["side_input"])


def _validator_grad(a):
    return _api._backward(a["y_backprop"], a["x"], a["scale"], a["reserve_space_1"],
                          a["reserve_space_2"], a["epsilon"], a["data_format"],
                          a["is_training"], a["n_threads"], a["out"], a["offset"],
                          a["activation"], a["alpha"], a["side_input"])


@pytest.mark.parametrize("case", sorted(BAD_GRAD))
def test_grad_errors_are_the_validators(case):
    public = _raised(_public_grad, _bad_grad(case))
    assert public == _raised(_validator_grad, _bad_grad(case))
    assert _fast_grad(_bad_grad(case)) is None


GOOD_FORWARD = {
    "train": {},
    "train with running stats": dict(mean=_v(fill=0.5), variance=_v(fill=2.0),
                                     exponential_avg_factor=0.25),
    "inference": dict(mean=_v(fill=0.5), variance=_v(fill=2.0), is_training=False),
    "NCHW float64": dict(x=_x(np.float64, (2, C, 3, 3)), scale=_v(dtype=np.float64),
                         offset=_v(dtype=np.float64, fill=0.0), data_format="NCHW"),
    "float16": dict(x=_x(np.float16)),
    "out y": dict(out={"y": np.empty((2, 3, 3, C), F32)}),
    "n_threads 1": dict(n_threads=1),
    "relu": dict(activation="relu"),
    "leaky_relu alpha": dict(activation="leaky_relu", alpha=0.3),
    "elu default alpha": dict(activation="elu", is_training=False, mean=_v(fill=0.5),
                              variance=_v(fill=2.0)),
    "add relu": dict(activation="relu", side_input=_x() * 0.25),
    "add only, y is side_input": "y_is_side",
    "silu float16 NCHW": dict(x=_x(np.float16, (2, C, 3, 3)), activation="silu",
                              side_input=_x(np.float16, (2, C, 3, 3)), data_format="NCHW"),
    "bfloat16": dict(x=_x(BFLOAT16)),
    "bfloat16 out y": dict(x=_x(BFLOAT16), out={"y": np.empty((2, 3, 3, C), BFLOAT16)}),
    "bfloat16 inference": dict(x=_x(BFLOAT16), mean=_v(fill=0.5), variance=_v(fill=2.0),
                               is_training=False),
    "silu bfloat16 NCHW": dict(x=_x(BFLOAT16, (2, C, 3, 3)), activation="silu",
                               side_input=_x(BFLOAT16, (2, C, 3, 3)), data_format="NCHW"),
}


def _good_forward(case):
    spec = GOOD_FORWARD[case]
    if spec == "y_is_side":
        side = _x() * 0.5
        return _forward_call(side_input=side, out={"y": side})
    return _forward_call(**spec)


@pytest.mark.parametrize("case", sorted(GOOD_FORWARD))
def test_fast_path_result_is_the_validators(case):
    a = _good_forward(case)
    fast = _fast_forward(a)
    assert fast is not None, "the plain call should take the fast path"
    a = _good_forward(case)
    slow = _validator_forward(a)
    assert type(fast) is type(slow)
    for f, s in zip(fast, slow):
        np.testing.assert_array_equal(f, s)
        assert f.dtype == s.dtype and f.shape == s.shape
    dy = _x(a["x"].dtype, a["x"].shape)
    g = _grad_call(y_backprop=dy, x=a["x"], scale=a["scale"], reserve_space_1=slow[3],
                   reserve_space_2=slow[4], data_format=a["data_format"],
                   is_training=a["is_training"], activation=a["activation"], alpha=a["alpha"],
                   offset=a["offset"] if a["activation"] else None,
                   side_input=None if a["side_input"] is None else a["side_input"].copy())
    gfast = _fast_grad(g)
    assert gfast is not None
    assert type(gfast) is type(_validator_grad(g))
    for f, s in zip(gfast, _validator_grad(g)):
        np.testing.assert_array_equal(f, s)


def test_bfloat16_fast_path_starts_once_seen():
    """In a fresh process the fast path declines bfloat16 (it does not know
    the type number yet) until a call through the validator has accepted
    it; from then on the plain bfloat16 call is a fast one."""
    code = ("import ml_dtypes, numpy as np\n"
            "from cfbn import _kernels, fused_batch_norm\n"
            "x = np.ones((2, 3), ml_dtypes.bfloat16); v = np.ones(3, np.float32)\n"
            "args = (x, v, v, None, None, 1e-3, 1.0, 'NC', True, None)\n"
            "before = _kernels.fast_forward(*args)\n"
            "fused_batch_norm(x, v, v, data_format='NC')\n"
            "after = _kernels.fast_forward(*args)\n"
            "print(before is None, after is not None and after.y.dtype == x.dtype)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"], out.stdout + out.stderr


def _gg_call(**kw):
    x = _x()
    fwd = cfbn.fused_batch_norm(x, _v(), _v(fill=0.0), epsilon=1e-3)
    args = dict(y_backprop=_x() * 0.5, x=x, scale=_v(), reserve_space_1=fwd[3],
                reserve_space_2=fwd[4], grad_x_backprop=_x() * 0.25, grad_scale_backprop=_v(),
                grad_offset_backprop=_v(fill=0.5), epsilon=1e-3, data_format="NHWC",
                is_training=True, n_threads=None, out=None)
    args.update(kw)
    return args


_GG_ORDER = ("y_backprop", "x", "scale", "reserve_space_1", "reserve_space_2", "grad_x_backprop",
             "grad_scale_backprop", "grad_offset_backprop", "epsilon", "data_format",
             "is_training", "n_threads", "out")

BAD_GRAD_GRAD = {
    "dy dtype": dict(y_backprop=_x(np.float64)),
    "ggx dtype": dict(grad_x_backprop=_x(np.float64)),
    "ggx shape": dict(grad_x_backprop=_x(shape=(2, 3, 4, C))),
    "ggx bfloat16 for float32": dict(grad_x_backprop=_x(BFLOAT16)),
    "ggx list of str": dict(grad_x_backprop=["a"]),
    "grad_scale_backprop length": dict(grad_scale_backprop=_v(C + 1)),
    "grad_offset_backprop dtype": dict(grad_offset_backprop=_v(dtype=np.float64)),
    "reserve_space_2 length": dict(reserve_space_2=_v(1)),
    "epsilon negative": dict(epsilon=-1.0),
    "is_training 1": dict(is_training=1),
    "data_format rank": dict(data_format="NC"),
    "n_threads 0": dict(n_threads=0),
    "out tuple length": dict(out=(None,)),
    "out dx dtype": dict(out={"x_backprop": np.empty((2, 3, 3, C), np.float64)}),
    "out scale_backprop length": dict(out={"scale_backprop": _v(C + 1)}),
    "out unknown key": dict(out={"offset_backprop": None}),
}


def _public_gg(a):
    return cfbn.fused_batch_norm_grad_grad(*(a[k] for k in _GG_ORDER[:8]), epsilon=a["epsilon"],
                                           data_format=a["data_format"],
                                           is_training=a["is_training"],
                                           n_threads=a["n_threads"], out=a["out"])


def _validator_gg(a):
    return _api._grad_grad(*(a[k] for k in _GG_ORDER))


def _fast_gg(a):
    return _kernels.fast_grad_grad(*(a[k] for k in _GG_ORDER))


@pytest.mark.parametrize("case", sorted(BAD_GRAD_GRAD))
def test_grad_grad_errors_are_the_validators(case):
    public = _raised(_public_gg, _gg_call(**BAD_GRAD_GRAD[case]))
    assert public == _raised(_validator_gg, _gg_call(**BAD_GRAD_GRAD[case]))
    assert _fast_gg(_gg_call(**BAD_GRAD_GRAD[case])) is None


GOOD_GRAD_GRAD = {
    "train": {},
    "inference": dict(is_training=False),
    "no ggx": dict(grad_x_backprop=None),
    "ggx only": dict(grad_scale_backprop=None, grad_offset_backprop=None),
    "float16": dict(x=_x(np.float16), y_backprop=_x(np.float16),
                    grad_x_backprop=_x(np.float16)),
    "bfloat16 NCHW": dict(x=_x(BFLOAT16, (2, C, 3, 3)), y_backprop=_x(BFLOAT16, (2, C, 3, 3)),
                          grad_x_backprop=_x(BFLOAT16, (2, C, 3, 3)), data_format="NCHW"),
    "float64 NC": dict(x=_x(np.float64, (5, C)), y_backprop=_x(np.float64, (5, C)),
                       grad_x_backprop=_x(np.float64, (5, C)), scale=_v(dtype=np.float64),
                       reserve_space_1=_v(dtype=np.float64, fill=0.1),
                       reserve_space_2=_v(dtype=np.float64), grad_scale_backprop=None,
                       grad_offset_backprop=_v(dtype=np.float64), data_format="NC"),
    "n_threads 2": dict(n_threads=2),
}


@pytest.mark.parametrize("case", sorted(GOOD_GRAD_GRAD))
def test_grad_grad_fast_path_result_is_the_validators(case):
    fast = _fast_gg(_gg_call(**GOOD_GRAD_GRAD[case]))
    assert fast is not None, "the plain call should take the fast path"
    slow = _validator_gg(_gg_call(**GOOD_GRAD_GRAD[case]))
    assert type(fast) is type(slow)
    for f, s in zip(fast, slow):
        assert f.dtype == s.dtype
        assert f.tobytes() == s.tobytes()
