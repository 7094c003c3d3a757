"""Every rule once, in cfbn.torch: a bad eps, momentum, alpha, activation
code or batch count gives the same words at every entrance that takes it:
the modules (on cfbn's operators and on PyTorch's own path), the functional
form, the three torch.ops.cfbn operators (the C++ library's, or the Python
ones where CFBN_TORCH_LIBRARY=0: CI runs this file both ways) and their fake
kernels (meta inputs).  The words are test_rules.py's, the NumPy API's.

The C++ operators can raise RuntimeError only (the stable ABI's
STD_TORCH_CHECK); every other entrance raises ValueError.
"""
import math

import pytest

torch = pytest.importorskip("torch")

import cfbn.torch as ct  # noqa: E402
from cfbn.torch import ops  # noqa: E402

OPS = torch.ops.cfbn
C = 3
LIBRARY = ops.NOT_LOADED is None
# what a refused operator call raises: the C++ library's RuntimeError, or the
# Python operators' ValueError
OPERATOR_ERROR = RuntimeError if LIBRARY else ValueError

EPSILON = "expected a finite value >= 0, got "
FINITE = "expected a finite value, got "
COUNT = "expected a count >= 0, got "
ACTIVATION = "expected a code in [0, 8), got "


def _x(device="cpu"):
    return torch.randn(4, C, 3, 2, generator=torch.Generator().manual_seed(0)).to(device)


def _vectors(device):
    return dict(weight=torch.ones(C, device=device), bias=torch.zeros(C, device=device))


def _forward(device="cpu", **kw):
    v = _vectors(device)
    args = dict(input=_x(device), running_mean=torch.zeros(C, device=device),
                running_var=torch.ones(C, device=device),
                num_batches_tracked=torch.tensor(1, device=device), training=True,
                momentum=0.1, eps=1e-5, activation=0, alpha=0.0, side_input=None, **v)
    args.update(kw)
    return OPS.batch_norm(**args)


def _backward(device="cpu", **kw):
    v = _vectors(device)
    x = _x(device)
    args = dict(grad_out=torch.ones_like(x), input=x, save_mean=torch.zeros(C, device=device),
                save_var=torch.ones(C, device=device), training=True, eps=1e-5, activation=0,
                alpha=0.0, side_input=None, **v)
    args.update(kw)
    return OPS.batch_norm_backward(**args)


def _double_backward(device="cpu", **kw):
    x = _x(device)
    args = dict(grad_out=torch.ones_like(x), input=x, weight=torch.ones(C, device=device),
                save_mean=torch.zeros(C, device=device), save_var=torch.ones(C, device=device),
                grad_grad_input=torch.ones_like(x), grad_grad_weight=None, grad_grad_bias=None,
                training=True, eps=1e-5)
    args.update(kw)
    return OPS.batch_norm_double_backward(**args)


def _module(path, **kw):
    def call():
        old = ct.set_path(path)
        try:
            return ct.BatchNorm2d(C, **kw)(_x())
        finally:
            ct.set_path(old)
    return call


def _words(error, call):
    with pytest.raises(error) as info:
        call()
    return str(info.value)


# entrance -> (what it raises, a call of it with eps=e)
EPS_ENTRANCES = {
    "module": (ValueError, lambda e: _module("cfbn", eps=e)()),
    "module on torch's path": (ValueError, lambda e: _module("native", eps=e)()),
    "functional": (ValueError, lambda e: ct.batch_norm(_x(), None, None, training=True, eps=e)),
    "cfbn::batch_norm": (OPERATOR_ERROR, lambda e: _forward(eps=e)),
    "cfbn::batch_norm_backward": (OPERATOR_ERROR, lambda e: _backward(eps=e)),
    "cfbn::batch_norm_double_backward": (OPERATOR_ERROR, lambda e: _double_backward(eps=e)),
    "cfbn::batch_norm fake": (ValueError, lambda e: _forward("meta", eps=e)),
    "cfbn::batch_norm_backward fake": (ValueError, lambda e: _backward("meta", eps=e)),
    "cfbn::batch_norm_double_backward fake": (ValueError,
                                              lambda e: _double_backward("meta", eps=e)),
}
MOMENTUM_ENTRANCES = {
    "module": (ValueError, lambda m: _module("cfbn", momentum=m)()),
    "module on torch's path": (ValueError, lambda m: _module("native", momentum=m)()),
    "functional": (ValueError, lambda m: ct.batch_norm(
        _x(), torch.zeros(C), torch.ones(C), training=True, momentum=m)),
    "cfbn::batch_norm": (OPERATOR_ERROR, lambda m: _forward(momentum=m)),
    "cfbn::batch_norm fake": (ValueError, lambda m: _forward("meta", momentum=m)),
}
ALPHA_ENTRANCES = {
    "module": (ValueError, lambda a: _module("cfbn", activation="elu", alpha=a)()),
    "functional": (ValueError, lambda a: ct.batch_norm(_x(), None, None, training=True,
                                                       activation="leaky_relu", alpha=a)),
    "cfbn::batch_norm": (OPERATOR_ERROR, lambda a: _forward(activation=4, alpha=a)),
    "cfbn::batch_norm_backward": (OPERATOR_ERROR, lambda a: _backward(activation=3, alpha=a)),
    "cfbn::batch_norm fake": (ValueError, lambda a: _forward("meta", activation=4, alpha=a)),
    "cfbn::batch_norm_backward fake": (ValueError,
                                       lambda a: _backward("meta", activation=3, alpha=a)),
}
CODE_ENTRANCES = {
    "cfbn::batch_norm": (OPERATOR_ERROR, lambda n: _forward(activation=n)),
    "cfbn::batch_norm_backward": (OPERATOR_ERROR, lambda n: _backward(activation=n)),
    "cfbn::batch_norm fake": (ValueError, lambda n: _forward("meta", activation=n)),
    "cfbn::batch_norm_backward fake": (ValueError, lambda n: _backward("meta", activation=n)),
}


def _same_words(message, name, words, value):
    # the C++ operators prefix their name and print a double as C++ does
    assert message.startswith(name + ": " + words) or (name + ": " + words) in message, message
    if value is not None:
        assert message.rstrip().endswith(value), message


def _shown(v, cxx):
    """How a refused value ends the message: Python's repr, or C++'s stream
    of a double (inf, nan, -1)."""
    if not cxx:
        return repr(v)
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return "%g" % v


def _cxx(name, error):
    return error is RuntimeError and "fake" not in name


@pytest.mark.parametrize("value", [-1.0, -5e-324, math.inf, math.nan])
@pytest.mark.parametrize("entrance", sorted(EPS_ENTRANCES))
def test_a_bad_eps_has_one_message(entrance, value):
    error, call = EPS_ENTRANCES[entrance]
    cxx = _cxx(entrance, error)
    _same_words(_words(error, lambda: call(value)), "eps", EPSILON,
                None if cxx and value == -5e-324 else _shown(value, cxx))


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("entrance", sorted(MOMENTUM_ENTRANCES))
def test_a_bad_momentum_has_one_message(entrance, value):
    error, call = MOMENTUM_ENTRANCES[entrance]
    _same_words(_words(error, lambda: call(value)), "momentum", FINITE,
                _shown(value, _cxx(entrance, error)))


@pytest.mark.parametrize("value", [math.inf, math.nan])
@pytest.mark.parametrize("entrance", sorted(ALPHA_ENTRANCES))
def test_a_bad_alpha_has_one_message(entrance, value):
    error, call = ALPHA_ENTRANCES[entrance]
    _same_words(_words(error, lambda: call(value)), "alpha", FINITE,
                _shown(value, _cxx(entrance, error)))


@pytest.mark.parametrize("value", [-1, 8, 2 ** 40])
@pytest.mark.parametrize("entrance", sorted(CODE_ENTRANCES))
def test_an_unknown_activation_code_has_one_message(entrance, value):
    error, call = CODE_ENTRANCES[entrance]
    _same_words(_words(error, lambda: call(value)), "activation", ACTIVATION, str(value))


def test_a_negative_batch_count_has_one_message():
    """Read from the tensor's data, so checked where the data is: the
    operator (C++ or Python), reached from the module and directly."""
    m = ct.BatchNorm2d(C, momentum=None)
    m.num_batches_tracked.fill_(-2)   # -1 once this batch is counted
    for call in (lambda: m(_x()),
                 lambda: _forward(momentum=None, num_batches_tracked=torch.tensor(-1))):
        _same_words(_words(OPERATOR_ERROR, call), "num_batches_tracked", COUNT, "-1")


@pytest.mark.parametrize("value", [0.0, 5e-324, 1.0])
def test_every_operator_and_fake_kernel_takes_the_edges_of_eps(value):
    for device in ("cpu", "meta"):
        _forward(device, eps=value)
        _backward(device, eps=value)
        _double_backward(device, eps=value)


# a bad tensor argument -> (its name, a call with it on a device)
TENSOR_CASES = {
    "weight's length": ("weight", lambda d: _forward(d, weight=torch.ones(C + 1, device=d))),
    "bias' dtype": ("mixed dtype", lambda d: _forward(d, bias=torch.zeros(C, dtype=torch.float64,
                                                                          device=d))),
    "side_input's shape": ("side_input", lambda d: _forward(
        d, side_input=torch.zeros(1, C, 3, 2, device=d))),
    "side_input's dtype": ("side_input", lambda d: _forward(
        d, side_input=torch.zeros(4, C, 3, 2, dtype=torch.float64, device=d))),
    "grad_out's shape": ("grad_out", lambda d: _backward(d, grad_out=torch.ones(4, C, 3, 3,
                                                                                device=d))),
    "save_var's dtype": ("save_var", lambda d: _backward(
        d, save_var=torch.ones(C, dtype=torch.float64, device=d))),
    "save_mean's length": ("save_mean", lambda d: _backward(d, save_mean=torch.zeros(
        2 * C, device=d))),
    "grad_grad_input's shape": ("grad_grad_input", lambda d: _double_backward(
        d, grad_grad_input=torch.ones(4, C, 2, 2, device=d))),
    "grad_grad_weight's dtype": ("mixed dtype", lambda d: _double_backward(
        d, grad_grad_weight=torch.ones(C, dtype=torch.int64, device=d))),
    "running statistics missing": ("running_mean, running_var", lambda d: _forward(
        d, training=False, running_mean=None, running_var=None)),
    "running_var alone": ("running_mean, running_var", lambda d: _forward(d, running_mean=None)),
}


def _refusal(call, device):
    with pytest.raises((ValueError, TypeError, RuntimeError)) as info:
        call(device)
    return str(info.value)


@pytest.mark.parametrize("case", sorted(TENSOR_CASES))
def test_a_bad_tensor_has_one_message_from_operator_and_fake_kernel(case):
    """The operator (C++, or Python where CFBN_TORCH_LIBRARY=0) and its fake
    kernel (meta inputs) refuse a bad tensor argument in the same words,
    naming it with the user's shapes and dtypes."""
    key, call = TENSOR_CASES[case]
    words = [m[m.index(key):] for m in (_refusal(call, "cpu"), _refusal(call, "meta"))]
    assert words[0] == words[1], words
