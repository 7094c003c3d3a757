"""cfbn's fused activations in torch operations: the one table of them.

For the paths that normalize with cfbn's split kernels (which take no
activation) and apply the residual add and the activation afterwards, for
the module paths that run PyTorch's own batch norm, and for the gradient
of the gradient.  The formulas are cfbn.reference.activation's; the names,
alpha defaults and checks are the one validator's (cfbn._args).
"""
from collections import namedtuple

import torch
import torch.nn.functional as F

from .. import _args


def activate_(z, activation, alpha):
    """act(z), written over z (a tensor no one else holds).

    Parameters
    ----------
    z : Tensor
        The pre-activation (normalized value plus any side input).
    activation : str or None
        One of cfbn's activations; None leaves z as it is.
    alpha : float or None
        leaky_relu's slope or elu's scale (None: the default).

    Returns
    -------
    Tensor
        z.
    """
    if activation is None:
        return z
    _, a = _args.activation(activation, alpha)
    return FORMS[activation].in_place(z, a)


def activate(z, activation, alpha):
    """act(z) as a new tensor, with PyTorch's own autograd formulas (those of
    nn.ReLU, nn.ReLU6, ...): the in-place forms differentiate through their
    result, which a negative leaky_relu or elu alpha cannot."""
    if activation is None:
        return z
    _, a = _args.activation(activation, alpha)
    return FORMS[activation].new(z, a)


def derivatives(z, activation, alpha):
    """(act'(z), act''(z) or None where it is 0 almost everywhere), with
    cfbn's derivatives at the kinks: relu'(0) = relu6'(0) = relu6'(6) = 0,
    leaky_relu'(0) = elu'(0) = alpha."""
    _, a = _args.activation(activation, alpha)
    return FORMS[activation].derivatives(z, a)


def _elu_derivatives(z, alpha):
    e = torch.where(z > 0, 0.0, alpha * torch.exp(torch.clamp(z, max=0.0)))
    return torch.where(z > 0, 1.0, e), e


def _sigmoid_derivatives(z, alpha):
    sg = torch.sigmoid(z)
    d = sg * (1 - sg)
    return d, d * (1 - 2 * sg)


def _tanh_derivatives(z, alpha):
    t = torch.tanh(z)
    d = 1 - t * t
    return d, -2 * t * d


def _silu_derivatives(z, alpha):
    # silu: z * sigmoid(z)
    sg = torch.sigmoid(z)
    # z held to the finite range: at +-Inf the products are Inf 0, where
    # both derivatives have finite limits (1 and 0, 0 and 0), as cfbn.reference
    big = torch.finfo(z.dtype).max
    w = z.clamp(-big, big)
    return sg * (1 + w * (1 - sg)), sg * (1 - sg) * (2 + w * (1 - 2 * sg))


# An activation's torch forms, each of (z, alpha): in place, as a new tensor,
# and its (act', act'').
Form = namedtuple("Form", ["in_place", "new", "derivatives"])

# cfbn's activation name -> its Form; every name of cfbn._args.ACTIVATIONS
# but None has one.  relu6 is hardtanh, nn.ReLU6's own form: NaN stays NaN,
# as relu6(NaN) is NaN in the reference, and its derivative at 0 and 6 is 0
# (clamp's is 1).
FORMS = {
    "relu": Form(lambda z, a: torch.relu_(z), lambda z, a: F.relu(z),
                 lambda z, a: ((z > 0).to(z.dtype), None)),
    "relu6": Form(lambda z, a: F.hardtanh_(z, 0.0, 6.0), lambda z, a: F.hardtanh(z, 0.0, 6.0),
                  lambda z, a: (((z > 0) & (z < 6)).to(z.dtype), None)),
    "leaky_relu": Form(lambda z, a: F.leaky_relu_(z, a), lambda z, a: F.leaky_relu(z, a),
                       lambda z, a: (torch.where(z > 0, torch.ones_like(z),
                                                 torch.full_like(z, a)), None)),
    "elu": Form(lambda z, a: F.elu_(z, a), lambda z, a: F.elu(z, a), _elu_derivatives),
    "sigmoid": Form(lambda z, a: z.sigmoid_(), lambda z, a: torch.sigmoid(z),
                    _sigmoid_derivatives),
    "tanh": Form(lambda z, a: z.tanh_(), lambda z, a: torch.tanh(z), _tanh_derivatives),
    "silu": Form(lambda z, a: F.silu(z, inplace=True), lambda z, a: F.silu(z),
                 _silu_derivatives),
}
