"""Property-based tests: random valid calls match the reference, random wrong
calls raise ValueError or TypeError naming the argument, and no call crashes.

Every valid case draws a layout, a shape (zero-sized and one-element axes
included), a dtype, a memory arrangement for each input (C or Fortran order,
reversed, strided, transposed, unaligned, read-only), epsilon, the averaging
factor, training or inference, a thread count, an ``out=`` form and an ISA.
The run length comes from the Hypothesis profile (tests/hypothesis_profiles.py):
``pytest --hypothesis-profile=long tests/test_properties.py`` for a soak run.
"""

import math
import re

import ml_dtypes
import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import assume, given, note  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import cfbn  # noqa: E402
from cfbn import reference  # noqa: E402

from _checks import (  # noqa: E402
    BFLOAT16,
    finfo,
    DTYPES,
    LAYOUTS,
    Unmodified,
    check_forward,
    check_grad,
    is_half,
    per_channel_view,
    random_vectors,
    random_x,
    selected,
    vector_dtype,
)

SUPPORTED_ISAS = list(cfbn.runtime_info()["supported_isas"])

# Inputs stay small so that a few hundred examples take seconds; tails of
# every SIMD width still appear because C and the other axes are drawn freely.
MAX_ELEMS = 6000

ARRANGEMENTS = ["C", "F", "reversed", "strided", "transposed", "unaligned", "readonly"]
VECTOR_ARRANGEMENTS = ["C", "reversed", "strided", "unaligned", "readonly"]
PATTERNS = ["normal", "offset", "tiny", "constant", "integers"]


def arrange(a, how, axis=0, perm=None):
    """A copy of ``a`` with the same values, laid out in memory as ``how`` says."""
    a = np.asarray(a)
    if how == "C":
        return a.copy()
    if how == "F":
        return np.asfortranarray(a)
    if how == "readonly":
        b = a.copy()
        b.flags.writeable = False
        return b
    if how == "unaligned":
        raw = np.zeros(a.nbytes + a.itemsize + 1, np.uint8)
        b = raw[1:1 + a.nbytes].view(a.dtype).reshape(a.shape)
        b[...] = a
        return b
    if a.ndim == 0:
        return a.copy()
    axis %= a.ndim
    if how == "reversed":
        return np.flip(np.flip(a, axis).copy(), axis)
    if how == "strided":
        shape = list(a.shape)
        shape[axis] *= 2
        big = np.full(shape, 7, dtype=a.dtype)
        index = [slice(None)] * a.ndim
        index[axis] = slice(None, None, 2)
        big[tuple(index)] = a
        return big[tuple(index)]
    if how == "transposed":
        perm = list(range(a.ndim))[::-1] if perm is None else list(perm)
        inverse = np.argsort(perm)
        return np.ascontiguousarray(a.transpose(perm)).transpose(inverse)
    raise AssertionError(how)


def make_values(rng, shape, data_format, dtype, pattern):
    c = shape[reference.channel_axis(data_format, len(shape))]
    if pattern == "normal":
        return random_x(rng, shape, data_format, dtype)
    if pattern == "offset":
        # mean far above the spread: what naive E[x^2] - E[x]^2 gets wrong.
        # bfloat16 (8 bits) rounds such data to a few values of its grid
        # (64 apart at 1e4), often one: still far from zero next to their spread.
        return random_x(rng, shape, data_format, dtype,
                        loc=100.0 if np.dtype(dtype) == np.float16 else 1e4, std=1.0)
    if pattern == "tiny":
        return random_x(rng, shape, data_format, dtype, loc=0.0, std=1e-3)
    if pattern == "constant":
        level = per_channel_view(rng.uniform(-3, 3, c), data_format, len(shape))
        return np.broadcast_to(level, shape).astype(dtype)
    if pattern == "integers":
        return rng.integers(-3, 4, shape).astype(dtype)
    raise AssertionError(pattern)


@st.composite
def shapes(draw, data_format):
    rank, _ = reference.LAYOUTS[data_format]
    c = draw(st.one_of(st.integers(1, 12), st.sampled_from([0, 15, 16, 17, 31, 33, 64, 65, 257])))
    others = draw(st.lists(st.integers(0, 40), min_size=rank - 1, max_size=rank - 1))
    # shrink the largest axis until the tensor is small
    while c * math.prod(others) > MAX_ELEMS:
        i = int(np.argmax(others))
        others[i] //= 2
    if reference.LAYOUTS[data_format][1] == rank - 1:
        return tuple(others) + (c,)
    return (others[0], c) + tuple(others[1:])


@st.composite
def layouts_of(draw, ndim, choices=ARRANGEMENTS):
    how = draw(st.sampled_from(choices))
    axis = draw(st.integers(0, max(ndim - 1, 0)))
    perm = draw(st.permutations(range(ndim))) if how == "transposed" else None
    return how, axis, perm


epsilons = st.one_of(
    st.just(1e-4), st.just(1e-3), st.just(0.0), st.just(1),
    st.floats(1e-7, 10.0, allow_nan=False, allow_infinity=False),
)
factors = st.one_of(st.just(1.0), st.just(0.0), st.just(1), st.floats(0.0, 1.0))
thread_counts = st.sampled_from([None, 1, 2, 3, 8])


@st.composite
def valid_cases(draw):
    data_format = draw(st.sampled_from(LAYOUTS))
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = draw(shapes(data_format))
    ndim = len(shape)
    c = shape[reference.channel_axis(data_format, ndim)]
    pattern = draw(st.sampled_from(PATTERNS))
    seed = draw(st.integers(0, 2**32 - 1))
    training = draw(st.booleans())
    factor = draw(factors) if training else 1.0
    # epsilon 0 over a constant channel is 0/0: tests/test_special_values.py
    # checks that case against its exact value, NaN.  bfloat16 rounds the
    # "offset" pattern's channels to one or two values, often one.
    constant = pattern == "constant" or (pattern == "offset" and dtype == BFLOAT16)
    epsilon = draw(epsilons.filter(lambda e: e > 0) if constant else epsilons)
    needs_stats = not training or factor != 1.0
    with_stats = needs_stats or draw(st.booleans())
    case = dict(
        data_format=data_format, dtype=dtype, shape=shape, c=c, pattern=pattern, seed=seed,
        training=training, factor=factor, with_stats=with_stats,
        epsilon=epsilon, n_threads=draw(thread_counts),
        x_layout=draw(layouts_of(ndim)), dy_layout=draw(layouts_of(ndim)),
        vector_layouts=[draw(layouts_of(1, VECTOR_ARRANGEMENTS)) for _ in range(4)],
        out=draw(st.sampled_from([None, "tuple", "list", "dict", "inplace"])),
        grad_out=draw(st.sampled_from([None, "tuple", "dict", "inplace"])),
        grad_stats=draw(st.sampled_from(["forward", "random"])),
        isa=draw(st.sampled_from(SUPPORTED_ISAS)),
    )
    note(repr({k: v for k, v in case.items()}))
    return case


def build_inputs(case):
    rng = np.random.default_rng(case["seed"])
    shape, df, dtype = case["shape"], case["data_format"], case["dtype"]
    x = arrange(make_values(rng, shape, df, dtype, case["pattern"]), *case["x_layout"])
    v = random_vectors(rng, case["c"], dtype)
    vecs = [arrange(v[k], *lay) for k, lay in zip(("scale", "offset", "mean", "variance"),
                                                 case["vector_layouts"])]
    dy = arrange(rng.standard_normal(shape).astype(dtype), *case["dy_layout"])
    return x, vecs, dy


def out_arg(form, fields, specs, skip=()):
    """An ``out=`` argument of the given form, NaN-poisoned; some entries None for dict."""
    arrays = [np.full(shape, np.nan, dtype) for shape, dtype in specs]
    if form == "tuple":
        return tuple(arrays)
    if form == "list":
        return list(arrays)
    if form == "dict":
        return {f: a for i, (f, a) in enumerate(zip(fields, arrays)) if i % 2 == 0
                and f not in skip}
    raise AssertionError(form)


def fits_half(ref, dtype):
    """Whether a float16 or bfloat16 result can hold ``ref``: a tiny variance
    with a tiny epsilon can make the exact result overflow float16 (bfloat16
    only where float32 would), which is then Inf."""
    return not np.any(np.abs(ref) > 0.9 * float(finfo(dtype).max))


def plain(a):
    return a.flags.c_contiguous and a.flags.aligned and a.flags.writeable


@given(case=valid_cases())
def test_valid_calls_match_reference(case):
    x, (scale, offset, mean, variance), dy = build_inputs(case)
    if not case["with_stats"]:
        mean = variance = None
    df, dtype, c = case["data_format"], case["dtype"], case["c"]
    if is_half(dtype):
        assume(fits_half(reference.fused_batch_norm(
            x, scale, offset, mean, variance, epsilon=case["epsilon"], data_format=df,
            exponential_avg_factor=case["factor"], is_training=case["training"]).y, dtype))
    vdt = vector_dtype(dtype)
    kw = dict(epsilon=case["epsilon"], exponential_avg_factor=case["factor"],
              data_format=df, is_training=case["training"], n_threads=case["n_threads"])
    specs = [(x.shape, dtype)] + [((c,), vdt)] * 4
    form = case["out"]
    x_in = x
    if form == "inplace" and not plain(x):
        form = None
    with selected(case["isa"]):
        if form == "inplace":
            x_in = x.copy()
            got = cfbn.fused_batch_norm(x_in, scale, offset, mean, variance,
                                        out={"y": x_in}, **kw)
            assert got.y is x_in
        else:
            out = None if form is None else out_arg(form, cfbn.BatchNormOutput._fields, specs)
            with Unmodified(x, scale, offset, mean, variance):
                got = cfbn.fused_batch_norm(x, scale, offset, mean, variance, out=out, **kw)
            if isinstance(out, (tuple, list)):
                assert all(g is o for g, o in zip(got, out))
        assert type(got) is cfbn.BatchNormOutput
        check_forward(got, x, scale, offset, mean, variance, epsilon=case["epsilon"],
                      data_format=df, is_training=case["training"],
                      exponential_avg_factor=case["factor"])

        if case["training"] and case["grad_stats"] == "forward":
            mu, var = got.reserve_space_1, got.reserve_space_2
        else:
            rng = np.random.default_rng(case["seed"] + 1)
            stats = random_vectors(rng, c, dtype)
            mu, var = stats["mean"], stats["variance"]
        gkw = dict(epsilon=case["epsilon"], data_format=df, is_training=case["training"],
                   n_threads=case["n_threads"])
        if is_half(dtype):
            with np.errstate(all="ignore"):
                assume(fits_half(reference.fused_batch_norm_grad(
                    dy, x, scale, mu, var, epsilon=case["epsilon"], data_format=df,
                    is_training=case["training"]).x_backprop, dtype))
        gform = case["grad_out"]
        if gform == "inplace" and not plain(dy):
            gform = None
        if gform == "inplace":
            dy_in = dy.copy()
            grad = cfbn.fused_batch_norm_grad(dy_in, x, scale, mu, var,
                                              out={"x_backprop": dy_in}, **gkw)
            assert grad.x_backprop is dy_in
        else:
            gspecs = [(x.shape, dtype), ((c,), vdt), ((c,), vdt)]
            gout = None if gform is None else out_arg(gform, cfbn.BatchNormGrad._fields, gspecs)
            with Unmodified(dy, x, scale, mu, var):
                grad = cfbn.fused_batch_norm_grad(dy, x, scale, mu, var, out=gout, **gkw)
    assert type(grad) is cfbn.BatchNormGrad
    with np.errstate(all="ignore"):
        check_grad(grad, dy, x, scale, mu, var, epsilon=case["epsilon"], data_format=df,
                   is_training=case["training"])


# ---- wrong arguments ----

# 2-byte types that are not float16 or bfloat16, a swapped bfloat16 and a
# float8 among them
BAD_X_DTYPES = ["i1", "i4", "i8", "u1", "?", "c8", "c16", "g", ">f4", ">f8", ">f2", "O", "i2",
                "u2", BFLOAT16.newbyteorder(), np.dtype(ml_dtypes.float8_e5m2)]
BAD_VECTOR_DTYPES = ["f2", "f4", "f8", "i4", "c8", ">f4", ">f8", "O", BFLOAT16]
BAD_FORMATS = [None, 0, b"NHWC", "nhwc", "NHW", "", "NCHW ", ("NHWC",), ["NHWC"], "CHWN"]
BAD_EPSILONS = [float("nan"), float("inf"), -float("inf"), -1e-3, -1, None, 1j, [], "eps",
                np.array([1e-3, 1e-3])]
BAD_FACTORS = [-0.5, 1.5, float("nan"), float("inf"), -float("inf"), None, "f", 1j, 2, [0.5]]
BAD_THREADS = [0, -1, 1025, 2**31, 2**63, 2**64, -2**64, 2.0, "two", True, False, [], 1.5,
               np.float64(2)]
VECTOR_NAMES = ["scale", "offset", "mean", "variance"]
GRAD_VECTOR_NAMES = ["scale", "reserve_space_1", "reserve_space_2"]


def bad_dtype(x, dtype):
    """x cast to a dtype cfbn refuses (negative values to unsigned ones, large
    ones to a float8: the cast's warnings say nothing here)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(dtype)


def base_call(seed, data_format, dtype, c):
    rng = np.random.default_rng(seed)
    shape = {2: (5, c), 4: (2, 3, 2, c), 5: (2, 1, 3, 2, c)}[reference.LAYOUTS[data_format][0]]
    if data_format in ("NCHW", "NCDHW"):
        shape = (shape[0], c) + shape[1:-1]
    x = random_x(rng, shape, data_format, dtype)
    v = random_vectors(rng, c, dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    return x, v, dy


def wrong_vector(draw, v):
    c = v.shape[0]
    kind = draw(st.sampled_from(["longer", "shorter", "empty", "2d", "scalar", "dtype", "list",
                                 "none", "string"]))
    if kind == "longer":
        return np.resize(v, c + draw(st.integers(1, 3)))
    if kind == "shorter":
        return v[:-1] if c > 1 else np.resize(v, 2)
    if kind == "empty":
        return v[:0] if c > 0 else np.resize(v, 1)
    if kind == "2d":
        return v.reshape(c, 1) if draw(st.booleans()) else np.stack([v, v])
    if kind == "scalar":
        return v[0] if draw(st.booleans()) else np.asarray(v[0])
    if kind == "dtype":
        dt = draw(st.sampled_from([d for d in BAD_VECTOR_DTYPES if np.dtype(d) != v.dtype]))
        return v.astype(dt)
    if kind == "list":
        # a list is read as float64; wrong for float32 vectors, so use those only
        return list(map(float, v)) + [1.0]
    if kind == "none":
        return None
    return "scale"


class Overlap:
    """Stands for an out= whose first array starts one element into x's buffer."""

    def __init__(self, buf):
        self.buf = buf


def wrong_out(draw, fields, specs, x):
    kind = draw(st.sampled_from(["count", "container", "unknown", "shape", "dtype", "strided",
                                 "readonly", "entry", "overlap", "shared"]))
    arrays = [np.empty(shape, dtype) for shape, dtype in specs]
    i = draw(st.integers(0, len(fields) - 1))
    if kind == "count":
        n = draw(st.sampled_from([0, len(fields) - 1, len(fields) + 1]))
        return tuple((arrays * 2)[:n])
    if kind == "container":
        return draw(st.sampled_from([arrays[0], 5, "y", {1, 2}, iter(arrays)]))
    if kind == "unknown":
        return {fields[i]: arrays[i], "bogus": arrays[0]}
    if kind == "shape":
        shape = specs[i][0]
        bad = (shape[0] + 1,) + tuple(shape[1:]) if draw(st.booleans()) else shape + (1,)
        arrays[i] = np.empty(bad, specs[i][1])
    elif kind == "dtype":
        other = np.float64 if specs[i][1] != np.float64 else np.float32
        arrays[i] = np.empty(specs[i][0], other)
    elif kind == "strided":
        if math.prod(specs[i][0]) < 2:
            i = 0  # a one-element view counts as contiguous whatever its stride
        shape = specs[i][0]
        arrays[i] = np.empty((shape[0] * 2,) + tuple(shape[1:]), specs[i][1])[::2]
    elif kind == "readonly":
        arrays[i].flags.writeable = False
    elif kind == "entry":
        arrays[i] = draw(st.sampled_from([[0.0], 3.0, "y"]))
    elif kind == "overlap":
        # the first output one element into x's buffer: a partial overlap
        i = 0
        buf = np.empty(x.size + 1, x.dtype)
        buf[:-1] = x.ravel()
        return Overlap(buf)
    elif kind == "shared":
        j = draw(st.integers(1, len(fields) - 1))
        k = draw(st.integers(1, len(fields) - 1).filter(lambda k: k != j))
        arrays[k] = arrays[j]
    if draw(st.booleans()):
        return {f: a for f, a in zip(fields, arrays)}
    return tuple(arrays)


@st.composite
def forward_mistakes(draw):
    data_format = draw(st.sampled_from(LAYOUTS))
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    c = draw(st.integers(1, 9))
    x, v, _ = base_call(draw(st.integers(0, 2**32 - 1)), data_format, dtype, c)
    args = dict(x=x, scale=v["scale"], offset=v["offset"], mean=v["mean"],
                variance=v["variance"])
    kw = dict(epsilon=1e-3, exponential_avg_factor=draw(st.sampled_from([1.0, 0.5])),
              data_format=data_format, is_training=draw(st.booleans()),
              n_threads=draw(thread_counts))
    what = draw(st.sampled_from(["x_dtype", "x_rank", "x_object", "vector", "data_format",
                                 "epsilon", "factor", "stats_missing", "n_threads", "out"]))
    words = []
    if what == "x_dtype":
        args["x"] = bad_dtype(x, draw(st.sampled_from(BAD_X_DTYPES)))
        words = ["x"]
    elif what == "x_rank":
        args["x"] = x[..., None] if draw(st.booleans()) else x.reshape(x.shape[:-2] + (-1,))
        words = ["x", "data_format"]
    elif what == "x_object":
        args["x"] = draw(st.sampled_from([None, "x", {}, object(), [[1, 2], [3]]]))
        words = ["x"]
    elif what == "vector":
        name = draw(st.sampled_from(VECTOR_NAMES))
        args[name] = wrong_vector(draw, args[name])
        if args[name] is None:
            if name in ("scale", "offset"):
                words = [name]
            else:
                kw["is_training"] = False
                words = ["mean", "variance"]
        elif isinstance(args[name], list) and dtype == np.float64:
            args[name] = args[name][:-1] + [1.0, 2.0]
            words = [name]
        else:
            if (name in ("mean", "variance") and np.shape(args[name]) == (0,)
                    and kw["is_training"] and kw["exponential_avg_factor"] == 1.0):
                # there a zero-length statistic means None, as TensorFlow's callers pass it
                kw["is_training"] = False
            words = [name]
    elif what == "data_format":
        kw["data_format"] = draw(st.sampled_from(
            BAD_FORMATS + [f for f in LAYOUTS
                           if reference.LAYOUTS[f][0] != reference.LAYOUTS[data_format][0]]))
        words = ["data_format"]
    elif what == "epsilon":
        kw["epsilon"] = draw(st.sampled_from(BAD_EPSILONS))
        words = ["epsilon"]
    elif what == "factor":
        kw["exponential_avg_factor"] = draw(st.sampled_from(BAD_FACTORS))
        words = ["exponential_avg_factor"]
    elif what == "stats_missing":
        missing = draw(st.sampled_from(["mean", "variance"]))
        args[missing] = None
        if draw(st.booleans()):
            kw["is_training"] = False
        else:
            kw["is_training"], kw["exponential_avg_factor"] = True, 0.5
        words = [missing]
    elif what == "n_threads":
        kw["n_threads"] = draw(st.sampled_from(BAD_THREADS))
        words = ["n_threads"]
    else:
        vdt = vector_dtype(dtype)
        specs = [(x.shape, dtype)] + [((c,), vdt)] * 4
        kw["out"] = wrong_out(draw, cfbn.BatchNormOutput._fields, specs, x)
        if isinstance(kw["out"], Overlap):
            buf = kw["out"].buf
            args["x"] = buf[:-1].reshape(x.shape)
            kw["out"] = {"y": buf[1:].reshape(x.shape)}
        words = ["out"]
    return what, args, kw, words


@st.composite
def grad_mistakes(draw):
    data_format = draw(st.sampled_from(LAYOUTS))
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    c = draw(st.integers(1, 9))
    x, v, dy = base_call(draw(st.integers(0, 2**32 - 1)), data_format, dtype, c)
    args = dict(y_backprop=dy, x=x, scale=v["scale"], reserve_space_1=v["mean"],
                reserve_space_2=v["variance"])
    kw = dict(epsilon=1e-3, data_format=data_format, is_training=draw(st.booleans()),
              n_threads=draw(thread_counts))
    what = draw(st.sampled_from(["dy_dtype", "dy_shape", "x_dtype", "vector", "data_format",
                                 "epsilon", "n_threads", "out"]))
    if what == "dy_dtype":
        args["y_backprop"] = dy.astype(draw(st.sampled_from(
            [d for d in ["f2", "f4", "f8", "i4", ">f4", BFLOAT16] if np.dtype(d) != dtype])))
        words = ["y_backprop"]
    elif what == "dy_shape":
        args["y_backprop"] = draw(st.sampled_from([dy[:1], dy[..., None], dy.ravel(), dy[1:]]))
        if args["y_backprop"].shape == dy.shape:
            args["y_backprop"] = dy[..., None]
        words = ["y_backprop"]
    elif what == "x_dtype":
        args["x"] = bad_dtype(x, draw(st.sampled_from(BAD_X_DTYPES)))
        words = ["x", "y_backprop"]
    elif what == "vector":
        name = draw(st.sampled_from(GRAD_VECTOR_NAMES))
        args[name] = wrong_vector(draw, args[name])
        if isinstance(args[name], list) and dtype == np.float64:
            args[name] = args[name][:-1] + [1.0, 2.0]
        words = [name]
    elif what == "data_format":
        kw["data_format"] = draw(st.sampled_from(
            BAD_FORMATS + [f for f in LAYOUTS
                           if reference.LAYOUTS[f][0] != reference.LAYOUTS[data_format][0]]))
        words = ["data_format"]
    elif what == "epsilon":
        kw["epsilon"] = draw(st.sampled_from(BAD_EPSILONS))
        words = ["epsilon"]
    elif what == "n_threads":
        kw["n_threads"] = draw(st.sampled_from(BAD_THREADS))
        words = ["n_threads"]
    else:
        vdt = vector_dtype(dtype)
        specs = [(x.shape, dtype), ((c,), vdt), ((c,), vdt)]
        kw["out"] = wrong_out(draw, cfbn.BatchNormGrad._fields, specs, x)
        if isinstance(kw["out"], Overlap):
            buf = kw["out"].buf
            args["x"] = buf[:-1].reshape(x.shape)
            kw["out"] = {"x_backprop": buf[1:].reshape(x.shape)}
        words = ["out"]
    return what, args, kw, words


def expect_rejected(fn, args, kw, words):
    arrays = [a for a in list(args.values()) if isinstance(a, np.ndarray)]
    shown = {k: (a.dtype, a.shape) if isinstance(a, np.ndarray) else a for k, a in args.items()}
    note(f"args: {shown}")
    note(f"kw: {kw}")
    with Unmodified(*arrays):
        with pytest.raises((ValueError, TypeError)) as info:
            fn(**args, **kw)
    msg = str(info.value)
    assert any(re.search(r"\b%s\b" % re.escape(w), msg) for w in words), (
        f"message {msg!r} names none of {words}")


@given(mistake=forward_mistakes(), isa=st.sampled_from(SUPPORTED_ISAS))
def test_wrong_forward_arguments_raise(mistake, isa):
    what, args, kw, words = mistake
    with selected(isa):
        expect_rejected(cfbn.fused_batch_norm, args, kw, words)


@given(mistake=grad_mistakes(), isa=st.sampled_from(SUPPORTED_ISAS))
def test_wrong_grad_arguments_raise(mistake, isa):
    what, args, kw, words = mistake
    with selected(isa):
        expect_rejected(cfbn.fused_batch_norm_grad, args, kw, words)


@pytest.mark.parametrize("n_threads", [2**63, 2**64, -2**63 - 1, 10**30])
@pytest.mark.parametrize("fn", ["forward", "grad"])
def test_out_of_range_thread_counts_raise(fn, n_threads):
    """Thread counts beyond a C long are refused like any other bad count."""
    x, v, dy = base_call(1, "NHWC", np.dtype(np.float32), 3)
    with pytest.raises(ValueError, match="n_threads"):
        if fn == "forward":
            cfbn.fused_batch_norm(x, v["scale"], v["offset"], n_threads=n_threads)
        else:
            cfbn.fused_batch_norm_grad(dy, x, v["scale"], v["mean"], v["variance"],
                                       n_threads=n_threads)
