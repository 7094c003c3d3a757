"""Argument checking, input immutability, strided inputs and out= semantics."""

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import cfbn
from cfbn import reference

from _checks import (
    BFLOAT16,
    DTYPES,
    Unmodified,
    check_forward,
    check_grad,
    forward_buffers,
    grad_buffers,
    random_vectors,
    random_x,
    seed_of,
    vector_dtype,
)

SHAPE = (2, 3, 4, 5)  # NHWC, C = 5


def forward_args(dtype=np.float32, shape=SHAPE, data_format="NHWC"):
    rng = np.random.default_rng(seed_of("errors", np.dtype(dtype).name, shape))
    x = random_x(rng, shape, data_format, dtype)
    c = shape[reference.channel_axis(data_format, len(shape))]
    v = random_vectors(rng, c, dtype)
    return dict(x=x, scale=v["scale"], offset=v["offset"], mean=v["mean"],
                variance=v["variance"])


def grad_args(dtype=np.float32, shape=SHAPE, data_format="NHWC"):
    f = forward_args(dtype, shape, data_format)
    rng = np.random.default_rng(seed_of("errors-dy", np.dtype(dtype).name, shape))
    return dict(y_backprop=rng.standard_normal(shape).astype(dtype), x=f["x"],
                scale=f["scale"], reserve_space_1=f["mean"], reserve_space_2=f["variance"])


def expect_error(exc, words, fn, **kwargs):
    """Call ``fn`` expecting ``exc`` whose message names one of ``words``; inputs stay intact."""
    arrays = [a for a in kwargs.values() if isinstance(a, np.ndarray)]
    with pytest.raises(exc) as info:
        with Unmodified(*arrays):
            fn(**kwargs)
    msg = str(info.value)
    assert any(w in msg for w in words), f"message {msg!r} names none of {words}"


F32 = np.float32


def _vec(n, dtype=F32):
    return np.linspace(0.5, 1.5, n).astype(dtype)


# (id, overrides of the valid arguments, exception, words one of which the message must contain)
FORWARD_ERRORS = [
    ("format-unknown", dict(data_format="NWHC"), ValueError, ["data_format"]),
    ("format-lowercase", dict(data_format="nhwc"), ValueError, ["data_format"]),
    ("rank-3-NHWC", dict(x=np.zeros((2, 3, 5), F32)), ValueError, ["x", "data_format"]),
    ("rank-4-NC", dict(data_format="NC"), ValueError, ["x", "data_format"]),
    ("rank-4-NDHWC", dict(data_format="NDHWC"), ValueError, ["x", "data_format"]),
    ("scale-short", dict(scale=_vec(4)), ValueError, ["scale"]),
    ("offset-long", dict(offset=_vec(6)), ValueError, ["offset"]),
    ("scale-2d", dict(scale=_vec(5).reshape(1, 5)), ValueError, ["scale"]),
    ("scale-0d", dict(scale=np.ones((), F32)), ValueError, ["scale"]),
    ("mean-short", dict(mean=_vec(4), is_training=False), ValueError, ["mean"]),
    ("variance-short", dict(variance=_vec(4), exponential_avg_factor=0.5), ValueError,
     ["variance"]),
    ("infer-no-mean", dict(mean=None, is_training=False), ValueError, ["mean"]),
    ("infer-no-variance", dict(variance=None, is_training=False), ValueError, ["variance"]),
    ("avg-no-stats", dict(mean=None, variance=None, exponential_avg_factor=0.5), ValueError,
     ["mean", "variance", "exponential_avg_factor"]),
    ("epsilon-negative", dict(epsilon=-1e-3), ValueError, ["epsilon"]),
    ("epsilon-nan", dict(epsilon=float("nan")), ValueError, ["epsilon"]),
    ("epsilon-inf", dict(epsilon=float("inf")), ValueError, ["epsilon"]),
    ("epsilon-string", dict(epsilon="1e-3"), TypeError, ["epsilon"]),
    ("epsilon-bool", dict(epsilon=True), TypeError, ["epsilon"]),
    ("factor-string", dict(exponential_avg_factor="0.5"), TypeError, ["exponential_avg_factor"]),
    ("factor-nan", dict(exponential_avg_factor=float("nan")), ValueError,
     ["exponential_avg_factor"]),
    ("factor-inf", dict(exponential_avg_factor=float("inf")), ValueError,
     ["exponential_avg_factor"]),
    ("factor-negative", dict(exponential_avg_factor=-0.25), ValueError,
     ["exponential_avg_factor"]),
    ("factor-above-1", dict(exponential_avg_factor=1.5), ValueError,
     ["exponential_avg_factor"]),
    ("threads-0", dict(n_threads=0), ValueError, ["n_threads"]),
    ("threads-negative", dict(n_threads=-2), ValueError, ["n_threads"]),
    ("threads-float", dict(n_threads=1.5), TypeError, ["n_threads"]),
    ("threads-str", dict(n_threads="2"), TypeError, ["n_threads"]),
    ("x-int32", dict(x=np.ones(SHAPE, np.int32)), TypeError, ["x"]),
    ("x-int64", dict(x=np.ones(SHAPE, np.int64)), TypeError, ["x"]),
    ("x-bool", dict(x=np.ones(SHAPE, bool)), TypeError, ["x"]),
    ("x-complex", dict(x=np.ones(SHAPE, np.complex64)), TypeError, ["x"]),
    ("x-none", dict(x=None), TypeError, ["x"]),
    ("x-str", dict(x="abc"), TypeError, ["x"]),
    ("scale-object", dict(scale=object()), TypeError, ["scale"]),
    ("scale-float64", dict(scale=_vec(5, np.float64)), TypeError, ["scale"]),
    ("offset-float16", dict(offset=_vec(5, np.float16)), TypeError, ["offset"]),
    ("offset-bfloat16", dict(offset=_vec(5, BFLOAT16)), TypeError, ["offset"]),
    ("mean-float64", dict(mean=_vec(5, np.float64), is_training=False), TypeError, ["mean"]),
    ("variance-int", dict(variance=np.ones(5, np.int32), is_training=False), TypeError,
     ["variance"]),
]


@pytest.mark.parametrize("override,exc,words", [c[1:] for c in FORWARD_ERRORS],
                         ids=[c[0] for c in FORWARD_ERRORS])
def test_forward_rejects(override, exc, words):
    kwargs = forward_args()
    kwargs.update(override)
    expect_error(exc, words, cfbn.fused_batch_norm, **kwargs)


@pytest.mark.parametrize(
    "x_dtype,vec_dtype,name",
    [(np.float16, np.float16, "scale"), (np.float16, np.float64, "offset"),
     (np.float64, np.float32, "scale"), (np.float32, np.float16, "mean"),
     (BFLOAT16, BFLOAT16, "scale"), (BFLOAT16, np.float16, "variance"),
     (BFLOAT16, np.float64, "offset"), (np.float32, BFLOAT16, "mean")],
    ids=["f16-with-f16", "f16-with-f64", "f64-with-f32", "f32-with-f16", "bf16-with-bf16",
         "bf16-with-f16", "bf16-with-f64", "f32-with-bf16"])
def test_forward_rejects_mixed_dtypes(x_dtype, vec_dtype, name):
    kwargs = forward_args(x_dtype)
    kwargs[name] = kwargs[name].astype(vec_dtype)
    kwargs["is_training"] = False
    expect_error(TypeError, [name], cfbn.fused_batch_norm, **kwargs)


GRAD_ERRORS = [
    ("format-unknown", dict(data_format="CHWN"), ValueError, ["data_format"]),
    ("rank-3", dict(x=np.zeros((2, 3, 5), F32), y_backprop=np.zeros((2, 3, 5), F32)),
     ValueError, ["x", "data_format"]),
    ("dy-shape", dict(y_backprop=np.zeros((2, 3, 5, 5), F32)), ValueError, ["y_backprop"]),
    ("dy-rank", dict(y_backprop=np.zeros((2, 12, 5), F32)), ValueError, ["y_backprop"]),
    ("dy-float64", dict(y_backprop=np.zeros(SHAPE, np.float64)), TypeError, ["y_backprop"]),
    ("x-int", dict(x=np.ones(SHAPE, np.int32)), TypeError, ["x"]),
    ("scale-short", dict(scale=_vec(4)), ValueError, ["scale"]),
    ("reserve1-long", dict(reserve_space_1=_vec(6)), ValueError, ["reserve_space_1"]),
    ("reserve2-2d", dict(reserve_space_2=_vec(5).reshape(5, 1)), ValueError,
     ["reserve_space_2"]),
    ("reserve1-float64", dict(reserve_space_1=_vec(5, np.float64)), TypeError,
     ["reserve_space_1"]),
    ("reserve2-float16", dict(reserve_space_2=_vec(5, np.float16)), TypeError,
     ["reserve_space_2"]),
    ("reserve1-bfloat16", dict(reserve_space_1=_vec(5, BFLOAT16)), TypeError,
     ["reserve_space_1"]),
    ("scale-none", dict(scale=None), TypeError, ["scale"]),
    ("epsilon-negative", dict(epsilon=-1.0), ValueError, ["epsilon"]),
    ("epsilon-nan", dict(epsilon=float("nan")), ValueError, ["epsilon"]),
    ("epsilon-string", dict(epsilon="1e-3"), TypeError, ["epsilon"]),
    ("threads-0", dict(n_threads=0), ValueError, ["n_threads"]),
    ("threads-float", dict(n_threads=2.0), TypeError, ["n_threads"]),
]


@pytest.mark.parametrize("override,exc,words", [c[1:] for c in GRAD_ERRORS],
                         ids=[c[0] for c in GRAD_ERRORS])
def test_grad_rejects(override, exc, words):
    kwargs = grad_args()
    kwargs.update(override)
    expect_error(exc, words, cfbn.fused_batch_norm_grad, **kwargs)


@pytest.mark.parametrize("dtype", [np.float16, BFLOAT16], ids=lambda d: np.dtype(d).name)
def test_half_gradient_takes_float32_vectors(dtype):
    kwargs = grad_args(dtype)
    assert kwargs["scale"].dtype == np.float32
    res = cfbn.fused_batch_norm_grad(**kwargs)
    assert res.x_backprop.dtype == dtype
    assert res.scale_backprop.dtype == np.float32 and res.offset_backprop.dtype == np.float32


def _other_two_byte_and_small_dtypes():
    """Dtypes cfbn must refuse although some look like a half type: 2-byte
    integers, a structured 2-byte void, a bfloat16 in the other byte order,
    and ml_dtypes' other types (float8s and int4s are 1 byte)."""
    names = ["float8_e4m3fn", "float8_e5m2", "float8_e4m3b11fnuz", "int4", "uint4",
             "float8_e8m0fnu", "float4_e2m1fn"]
    return ([np.dtype(np.int16), np.dtype(np.uint16), np.dtype("V2"),
             np.dtype([("a", "u1"), ("b", "u1")]), BFLOAT16.newbyteorder()]
            + [np.dtype(getattr(ml_dtypes, n)) for n in names if hasattr(ml_dtypes, n)])


REFUSED = _other_two_byte_and_small_dtypes()


@pytest.mark.parametrize("dtype", REFUSED, ids=lambda d: "%s-%s" % (d.name, d.byteorder))
def test_other_small_dtypes_are_type_errors(dtype):
    a = forward_args(np.float32)
    x = np.zeros(SHAPE, dtype)
    with pytest.raises(TypeError, match=r"^x: expected float32, float64, float16 or bfloat16"):
        cfbn.fused_batch_norm(x, a["scale"], a["offset"])
    with pytest.raises(TypeError, match=r"^x: expected float32, float64, float16 or bfloat16"):
        cfbn.fused_batch_norm_grad(x, x, a["scale"], a["mean"], a["variance"])
    with pytest.raises(TypeError, match=r"^x: "):
        cfbn.batch_norm_statistics(x)
    with pytest.raises(TypeError, match=r"^dtype: "):
        cfbn.BatchNorm(5, dtype=dtype)


def test_import_does_not_import_ml_dtypes():
    """cfbn knows bfloat16 without ml_dtypes: importing cfbn (and running a
    float32 call) must not pull it in."""
    code = ("import sys, numpy as np, cfbn\n"
            "x = np.ones((2, 3), np.float32); v = np.ones(3, np.float32)\n"
            "cfbn.fused_batch_norm(x, v, v, data_format='NC')\n"
            "print('ml_dtypes' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


# ---------------------------------------------------------------- strided inputs

def strided_views(rng, dtype):
    """(description, x view in NHWC with C = 5) for several memory layouts."""
    big = random_x(rng, (2, 6, 4, 10), "NHWC", dtype)
    nchw = random_x(rng, (2, 5, 3, 4), "NCHW", dtype)
    return [
        ("every-other-row", big[:, ::2, :, :5]),
        ("every-other-channel", big[:, :3, :, ::2]),
        ("reversed", big[::-1, 3:, ::-1, 5:]),
        ("fortran", np.asfortranarray(big[:, :3, :, :5])),
        ("transposed", nchw.transpose(0, 2, 3, 1)),
    ]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("which", range(5), ids=["every-other-row", "every-other-channel",
                                                  "reversed", "fortran", "transposed"])
def test_non_contiguous_inputs(isa, which, dtype):
    rng = np.random.default_rng(seed_of("strided", which, np.dtype(dtype).name))
    _, x = strided_views(rng, dtype)[which]
    assert x.shape == (2, 3, 4, 5) and not x.flags.c_contiguous
    vdt = vector_dtype(dtype)
    vectors = rng.uniform(0.5, 1.5, (4, 10)).astype(vdt)
    scale, offset = vectors[0, ::2], vectors[1, 9::-2]
    mean, variance = vectors[2, 1::2], vectors[3, :5]
    dy = random_x(rng, (2, 3, 4, 10), "NHWC", dtype)[::-1, :, :, ::2]
    with Unmodified(x, scale, offset, mean, variance, dy):
        fwd = cfbn.fused_batch_norm(x, scale, offset, mean, variance,
                                    exponential_avg_factor=0.25)
        inf = cfbn.fused_batch_norm(x, scale, offset, mean, variance, is_training=False)
        grad = cfbn.fused_batch_norm_grad(dy, x, scale, fwd.reserve_space_1,
                                          fwd.reserve_space_2)
        igrad = cfbn.fused_batch_norm_grad(dy, x, scale, mean, variance, is_training=False)
    check_forward(fwd, x, scale, offset, mean, variance, epsilon=1e-4, data_format="NHWC",
                  is_training=True, exponential_avg_factor=0.25)
    check_forward(inf, x, scale, offset, mean, variance, epsilon=1e-4, data_format="NHWC",
                  is_training=False)
    check_grad(grad, dy, x, scale, fwd.reserve_space_1, fwd.reserve_space_2, epsilon=1e-4,
               data_format="NHWC", is_training=True)
    check_grad(igrad, dy, x, scale, mean, variance, epsilon=1e-4, data_format="NHWC",
               is_training=False)


# ---------------------------------------------------------------- out=

def test_out_sequence_returns_the_given_arrays():
    a = forward_args()
    y, rs1 = np.full(SHAPE, np.nan, F32), np.full(5, np.nan, F32)
    for out in ([y, None, None, rs1, None], (y, None, None, rs1, None)):
        res = cfbn.fused_batch_norm(a["x"], a["scale"], a["offset"], out=out)
        assert res.y is y and res.reserve_space_1 is rs1
        for name in ("batch_mean", "batch_variance", "reserve_space_2"):
            got = getattr(res, name)
            assert isinstance(got, np.ndarray) and got.shape == (5,) and got.dtype == F32
            assert not any(got is b for b in (y, rs1))
        check_forward(res, a["x"], a["scale"], a["offset"], None, None, epsilon=1e-4,
                      data_format="NHWC", is_training=True)


def test_out_dict_returns_the_given_arrays():
    a = forward_args()
    bv = np.full(5, np.nan, F32)
    res = cfbn.fused_batch_norm(**a, is_training=False, out={"batch_variance": bv})
    assert res.batch_variance is bv
    assert np.array_equal(bv, a["variance"])
    y = np.full(SHAPE, np.nan, F32)
    res = cfbn.fused_batch_norm(**a, is_training=False, out={"y": y})
    assert res.y is y
    check_forward(res, **a, epsilon=1e-4, data_format="NHWC", is_training=False)
    g = grad_args()
    dx, db = np.full(SHAPE, np.nan, F32), np.full(5, np.nan, F32)
    res = cfbn.fused_batch_norm_grad(**g, out={"x_backprop": dx, "offset_backprop": db})
    assert res.x_backprop is dx and res.offset_backprop is db
    check_grad(res, g["y_backprop"], g["x"], g["scale"], g["reserve_space_1"],
               g["reserve_space_2"], epsilon=1e-4, data_format="NHWC", is_training=True)
    res = cfbn.fused_batch_norm_grad(**g, out=grad_buffers(SHAPE, 5, F32))
    check_grad(res, g["y_backprop"], g["x"], g["scale"], g["reserve_space_1"],
               g["reserve_space_2"], epsilon=1e-4, data_format="NHWC", is_training=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
@pytest.mark.parametrize("data_format,shape", [("NHWC", (3, 5, 7, 9)), ("NCHW", (3, 9, 5, 7)),
                                               ("NC", (33, 9))])
def test_forward_in_place(isa, data_format, shape, is_training, dtype):
    a = forward_args(dtype, shape, data_format)
    x0 = a["x"].copy()
    res = cfbn.fused_batch_norm(**a, data_format=data_format, is_training=is_training,
                                out={"y": a["x"]})
    assert res.y is a["x"]
    check_forward(res, x0, a["scale"], a["offset"], a["mean"], a["variance"], epsilon=1e-4,
                  data_format=data_format, is_training=is_training)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_running_statistics_updated_in_place(isa, dtype):
    a = forward_args(dtype)
    m0, v0 = a["mean"].copy(), a["variance"].copy()
    res = cfbn.fused_batch_norm(**a, exponential_avg_factor=0.25,
                                out={"batch_mean": a["mean"], "batch_variance": a["variance"]})
    assert res.batch_mean is a["mean"] and res.batch_variance is a["variance"]
    check_forward(res, a["x"], a["scale"], a["offset"], m0, v0, epsilon=1e-4,
                  data_format="NHWC", is_training=True, exponential_avg_factor=0.25)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("is_training", [True, False], ids=["train", "infer"])
@pytest.mark.parametrize("target", ["y_backprop", "x"])
@pytest.mark.parametrize("data_format,shape", [("NHWC", (3, 5, 7, 9)), ("NCHW", (3, 9, 5, 7))])
def test_grad_in_place(isa, data_format, shape, target, is_training, dtype):
    g = grad_args(dtype, shape, data_format)
    before = {k: v.copy() for k, v in g.items()}
    res = cfbn.fused_batch_norm_grad(**g, data_format=data_format, is_training=is_training,
                                     out={"x_backprop": g[target]})
    assert res.x_backprop is g[target]
    check_grad(res, before["y_backprop"], before["x"], before["scale"],
               before["reserve_space_1"], before["reserve_space_2"], epsilon=1e-4,
               data_format=data_format, is_training=is_training)


def test_partial_overlap_is_rejected():
    a = forward_args()
    size = int(np.prod(SHAPE))
    storage = np.zeros(2 * size, F32)
    x = storage[:size].reshape(SHAPE)
    x[...] = a["x"]
    shifted = storage[size // 2: size // 2 + size].reshape(SHAPE)
    kwargs = dict(a, x=x, out={"y": shifted})
    expect_error(ValueError, ["y", "out"], cfbn.fused_batch_norm, **kwargs)
    one_over = storage[1: size + 1].reshape(SHAPE)
    kwargs["out"] = [one_over, None, None, None, None]
    expect_error(ValueError, ["y", "out"], cfbn.fused_batch_norm, **kwargs)

    vec = np.linspace(0.5, 1.5, 10).astype(F32)
    kwargs = dict(a, scale=vec[:5], out={"batch_mean": vec[1:6]})
    expect_error(ValueError, ["batch_mean", "out"], cfbn.fused_batch_norm, **kwargs)
    kwargs = dict(a, mean=vec[:5], exponential_avg_factor=0.5,
                  out={"batch_variance": vec[3:8]})
    expect_error(ValueError, ["batch_variance", "out"], cfbn.fused_batch_norm, **kwargs)

    g = grad_args()
    storage = np.zeros(2 * size, F32)
    dy = storage[size // 4: size // 4 + size].reshape(SHAPE)
    dy[...] = g["y_backprop"]
    kwargs = dict(g, y_backprop=dy, out={"x_backprop": storage[:size].reshape(SHAPE)})
    expect_error(ValueError, ["x_backprop", "out"], cfbn.fused_batch_norm_grad, **kwargs)
    kwargs = dict(g, reserve_space_1=vec[:5], out={"scale_backprop": vec[2:7]})
    expect_error(ValueError, ["scale_backprop", "out"], cfbn.fused_batch_norm_grad, **kwargs)


def _bad_outs():
    y = np.zeros(SHAPE, F32)
    wide = np.zeros((2, 3, 4, 10), F32)
    readonly = np.zeros(SHAPE, F32)
    readonly.flags.writeable = False
    return [
        ("y-float64", {"y": y.astype(np.float64)}, TypeError, ["y", "out"]),
        ("y-float16", {"y": y.astype(np.float16)}, TypeError, ["y", "out"]),
        ("y-bfloat16", {"y": y.astype(BFLOAT16)}, TypeError, ["y", "out"]),
        ("mean-float64", {"batch_mean": np.zeros(5)}, TypeError, ["batch_mean", "out"]),
        ("y-list", {"y": y.tolist()}, TypeError, ["y", "out"]),
        ("y-shape", {"y": np.zeros((2, 3, 5, 4), F32)}, ValueError, ["y", "out"]),
        ("y-flat", {"y": np.zeros(y.size, F32)}, ValueError, ["y", "out"]),
        ("variance-shape", {"batch_variance": np.zeros(6, F32)}, ValueError,
         ["batch_variance", "out"]),
        ("y-strided", {"y": wide[..., ::2]}, ValueError, ["y", "out"]),
        ("y-fortran", {"y": np.asfortranarray(y)}, ValueError, ["y", "out"]),
        ("y-readonly", {"y": readonly}, ValueError, ["y", "out"]),
        ("rs2-valid", {"reserve_space_2": np.zeros(5, F32)}, None, None),
        ("sequence-short", [y, None, None, None], (ValueError, TypeError), ["out"]),
        ("sequence-long", [None] * 6, (ValueError, TypeError), ["out"]),
        ("unknown-name", {"z": y}, (ValueError, TypeError, KeyError), ["out", "z"]),
    ]


BAD_OUTS = _bad_outs()


@pytest.mark.parametrize("out,exc,words", [c[1:] for c in BAD_OUTS], ids=[c[0] for c in BAD_OUTS])
def test_bad_out_is_rejected(out, exc, words):
    a = forward_args()
    if exc is None:
        # a valid per-channel buffer for contrast: accepted and filled
        res = cfbn.fused_batch_norm(**a, out=out)
        assert res.reserve_space_2 is out["reserve_space_2"]
        return
    expect_error(exc, words, cfbn.fused_batch_norm, **a, out=out)


def test_bad_grad_out_is_rejected():
    g = grad_args()
    readonly = np.zeros(5, F32)
    readonly.flags.writeable = False
    expect_error(TypeError, ["x_backprop", "out"], cfbn.fused_batch_norm_grad, **g,
                 out={"x_backprop": np.zeros(SHAPE, np.float64)})
    expect_error(ValueError, ["scale_backprop", "out"], cfbn.fused_batch_norm_grad, **g,
                 out={"scale_backprop": readonly})
    expect_error(ValueError, ["offset_backprop", "out"], cfbn.fused_batch_norm_grad, **g,
                 out=[None, None, np.zeros(4, F32)])
    expect_error((ValueError, TypeError), ["out"], cfbn.fused_batch_norm_grad, **g,
                 out=[None] * 5)


@pytest.mark.parametrize("dtype", [np.float16, BFLOAT16], ids=lambda d: np.dtype(d).name)
def test_half_outputs_have_float32_vectors(dtype):
    a = forward_args(dtype)
    out = forward_buffers(SHAPE, 5, dtype)
    res = cfbn.fused_batch_norm(**a, out=out)
    assert res.y.dtype == dtype and all(v.dtype == np.float32 for v in res[1:])
    expect_error(TypeError, ["batch_mean", "out"], cfbn.fused_batch_norm, **a,
                 out={"batch_mean": np.zeros(5, dtype)})
    other = np.float16 if dtype == BFLOAT16 else BFLOAT16
    expect_error(TypeError, ["y", "out"], cfbn.fused_batch_norm, **a,
                 out={"y": np.zeros(SHAPE, other)})


# ---- outputs that are the memory of an input they may not replace ----

def test_output_vector_aliasing_the_tensor_through_a_reshape_is_rejected(isa):
    """x of shape (1, C) and x.reshape(C) are the same bytes: writing a
    statistic there before x is read would corrupt y and dx."""
    rng = np.random.default_rng(seed_of("alias-reshape"))
    x = rng.standard_normal((1, 5)).astype(F32)
    s, o = _vec(5), _vec(5)
    for field in ("batch_mean", "batch_variance", "reserve_space_1", "reserve_space_2"):
        expect_error(ValueError, [field], cfbn.fused_batch_norm, x=x, scale=s, offset=o,
                     data_format="NC", out={field: x.reshape(5)})
    f = cfbn.fused_batch_norm(x, s, o, data_format="NC")
    dy = rng.standard_normal((1, 5)).astype(F32)
    for field, target in (("scale_backprop", dy), ("offset_backprop", x)):
        expect_error(ValueError, [field], cfbn.fused_batch_norm_grad, y_backprop=dy, x=x,
                     scale=s, reserve_space_1=f.reserve_space_1,
                     reserve_space_2=f.reserve_space_2, data_format="NC",
                     out={field: target.reshape(5)})
    # a vector output in the memory of another per-channel input
    expect_error(ValueError, ["batch_mean", "scale"], cfbn.fused_batch_norm, x=x, scale=s,
                 offset=o, data_format="NC", out={"batch_mean": s})
    mean = _vec(5)
    expect_error(ValueError, ["reserve_space_1", "mean"], cfbn.fused_batch_norm, x=x, scale=s,
                 offset=o, mean=mean, variance=_vec(5), exponential_avg_factor=0.5,
                 data_format="NC", out={"reserve_space_1": mean})


def test_tensor_output_aliasing_a_vector_is_rejected(isa):
    x = np.random.default_rng(1).standard_normal((1, 5)).astype(F32)
    s, o = _vec(5), _vec(5)
    expect_error(ValueError, ["y", "scale"], cfbn.fused_batch_norm, x=x, scale=s, offset=o,
                 data_format="NC", out={"y": s.reshape(1, 5)})
    st = cfbn.batch_norm_statistics(x, data_format="NC")
    mean = st.mean.copy()
    x64 = x.astype(np.float64)
    expect_error(ValueError, ["out", "mean"], cfbn.batch_norm_apply, x=x64, mean=mean,
                 variance=st.variance(), scale=mean * 0 + 1, offset=mean * 0,
                 data_format="NC", out=mean.reshape(1, 5))


def test_documented_in_place_updates_stay_allowed_through_views(isa):
    """The same memory under another array object is still an in-place call
    where the kernels read before they write."""
    a = forward_args()
    m0, v0 = a["mean"].copy(), a["variance"].copy()
    res = cfbn.fused_batch_norm(**a, exponential_avg_factor=0.25,
                                out={"batch_mean": a["mean"][:], "batch_variance": a["variance"][:]})
    check_forward(res, a["x"], a["scale"], a["offset"], m0, v0, epsilon=1e-4,
                  data_format="NHWC", is_training=True, exponential_avg_factor=0.25)


# ---- numbers and flags ----

HUGE = [10 ** 400, -(2 ** 1100)]


@pytest.mark.parametrize("value", HUGE, ids=["1e400", "-2^1100"])
@pytest.mark.parametrize("name", ["epsilon", "exponential_avg_factor", "alpha"])
def test_numbers_beyond_the_float_range(name, value):
    kw = dict(forward_args())
    if name == "alpha":
        kw["activation"] = "leaky_relu"
    kw[name] = value
    expect_error(ValueError, [name], cfbn.fused_batch_norm, **kw)


@pytest.mark.parametrize("value", HUGE, ids=["1e400", "-2^1100"])
def test_count_beyond_the_float_range(value):
    x = forward_args()["x"]
    dy = np.ones_like(x)
    st = cfbn.batch_norm_statistics(x)
    gs = cfbn.batch_norm_grad_statistics(dy, x, st.mean, st.variance())
    with pytest.raises(ValueError, match="count"):
        cfbn.batch_norm_grad_apply(dy, x, _vec(5), st.mean, st.variance(), gs.sum_dy,
                                   gs.sum_dy_xhat, abs(value))
    with pytest.raises(ValueError, match="count"):
        cfbn.merge_statistics(st, cfbn.BatchNormStatistics(abs(value), st.mean, st.m2))


@pytest.mark.parametrize("alpha", ["0.1", True, np.bool_(True), 0.1j, None, [0.1]],
                         ids=["str", "bool", "np.bool", "complex", "None-ok", "list"])
def test_alpha_is_a_real_number(alpha):
    kw = dict(forward_args(), activation="leaky_relu", alpha=alpha)
    if alpha is None:
        cfbn.fused_batch_norm(**kw)
        return
    expect_error(TypeError, ["alpha"], cfbn.fused_batch_norm, **kw)


def test_alpha_accepts_numpy_reals():
    kw = dict(forward_args(), activation="leaky_relu")
    want = cfbn.fused_batch_norm(**kw, alpha=0.25).y
    for a in (np.float32(0.25), np.float64(0.25), np.int64(0) + 0.25):
        np.testing.assert_array_equal(cfbn.fused_batch_norm(**kw, alpha=a).y, want)


@pytest.mark.parametrize("flag", [None, "False", "", 0, 1, 1.0, [True]],
                         ids=["None", "str-False", "empty", "0", "1", "1.0", "list"])
def test_is_training_is_a_bool(flag):
    a = forward_args()
    expect_error(TypeError, ["is_training"], cfbn.fused_batch_norm, **a, is_training=flag)
    g = grad_args()
    expect_error(TypeError, ["is_training"], cfbn.fused_batch_norm_grad, **g, is_training=flag)
    kw = dict(a, activation="relu")
    expect_error(TypeError, ["is_training"], cfbn.fused_batch_norm, **kw, is_training=flag)


def test_is_training_accepts_numpy_bools():
    a = forward_args()
    for flag in (True, False):
        want = cfbn.fused_batch_norm(**a, is_training=flag)
        got = cfbn.fused_batch_norm(**a, is_training=np.bool_(flag))
        for w, g in zip(want, got):
            np.testing.assert_array_equal(w, g)
        gw = cfbn.fused_batch_norm_grad(**grad_args(), is_training=flag)
        gg = cfbn.fused_batch_norm_grad(**grad_args(), is_training=np.bool_(flag))
        for w, g in zip(gw, gg):
            np.testing.assert_array_equal(w, g)


# ---- masked arrays ----

@pytest.mark.parametrize("name", ["x", "scale", "offset", "mean", "variance"])
def test_masked_arrays_are_refused(name):
    a = forward_args()
    a[name] = np.ma.masked_array(a[name], mask=np.zeros(a[name].shape, bool))
    expect_error(TypeError, [name], cfbn.fused_batch_norm, **a, exponential_avg_factor=0.5)


@pytest.mark.parametrize("name", ["y_backprop", "x", "scale", "reserve_space_1"])
def test_masked_arrays_are_refused_by_the_gradient(name):
    g = grad_args()
    g[name] = np.ma.masked_array(g[name], mask=np.zeros(g[name].shape, bool))
    expect_error(TypeError, [name], cfbn.fused_batch_norm_grad, **g)


def test_masked_arrays_are_refused_by_the_split_functions():
    x = np.ma.masked_array(forward_args()["x"])
    with pytest.raises(TypeError, match="x"):
        cfbn.batch_norm_statistics(x)


# ---- fold_batch_norm ----

def test_fold_validates_like_the_kernels():
    w = np.ones((5, 3), F32)
    vecs = [_vec(5) for _ in range(4)]
    with pytest.raises(TypeError, match="out_axis"):
        cfbn.fold_batch_norm(w, None, *vecs, 1e-3, out_axis=0.9)
    with pytest.raises(TypeError, match="out_axis"):
        cfbn.fold_batch_norm(w, None, *vecs, 1e-3, out_axis=True)
    with pytest.raises(TypeError, match="epsilon"):
        cfbn.fold_batch_norm(w, None, *vecs, "1e-3")
    with pytest.raises(ValueError, match="epsilon"):
        cfbn.fold_batch_norm(w, None, *vecs, -1e-3)
    with pytest.raises(TypeError, match="weight"):
        cfbn.fold_batch_norm(w + 1j, None, *vecs, 1e-3)
    with pytest.raises(TypeError, match="weight"):
        cfbn.fold_batch_norm(np.ma.masked_array(w), None, *vecs, 1e-3)
    with pytest.raises(TypeError, match="scale"):
        cfbn.fold_batch_norm(w, None, vecs[0] + 1j, *vecs[1:], 1e-3)


# ---- the thread cap ----

def test_omp_num_threads_above_the_cap():
    """The default thread count obeys n_threads' documented cap of 1024."""
    import os
    import subprocess
    import sys
    code = ("import cfbn, numpy as np; i = cfbn.runtime_info(); "
            "x = np.ones((64, 64, 4, 4), np.float32); s = np.ones(4, np.float32); "
            "cfbn.fused_batch_norm(x, s, s); print(i['max_threads'] if i['openmp'] else 1024)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS="5000"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-1] == "1024"


@pytest.mark.parametrize("call", ["forward", "grad", "grad_grad", "statistics"])
def test_a_list_for_x_names_x(call):
    """A list would become float64 by NumPy's guess, and the error would blame
    the float32 scale; x names itself instead."""
    x = np.random.default_rng(0).standard_normal((2, 2, 2, 3)).astype(np.float32)
    v = np.ones(3, np.float32)
    calls = {
        "forward": lambda a: cfbn.fused_batch_norm(a, v, v),
        "grad": lambda a: cfbn.fused_batch_norm_grad(x, a, v, v, v),
        "grad_grad": lambda a: cfbn.fused_batch_norm_grad_grad(x, a, v, v, v, x),
        "statistics": lambda a: cfbn.batch_norm_statistics(a),
    }
    with pytest.raises(TypeError, match=r"^x: expected an array \(numpy.ndarray\), got list"):
        calls[call](x.tolist())
