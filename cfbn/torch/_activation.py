"""cfbn's fused activations as in-place torch operations.

For the paths that normalize with cfbn's split kernels (which take no
activation) and apply the residual add and the activation afterwards.  The
formulas are cfbn.reference.activation's; alpha defaults and checks are the
one validator's (cfbn._args).
"""
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
    return _FORMS[activation][0](z, a)


def activate(z, activation, alpha):
    """act(z) as a new tensor, with PyTorch's own autograd formulas (those of
    nn.ReLU, nn.ReLU6, ...): the in-place forms differentiate through their
    result, which a negative leaky_relu or elu alpha cannot."""
    if activation is None:
        return z
    _, a = _args.activation(activation, alpha)
    return _FORMS[activation][1](z, a)


# cfbn's activation name -> its torch forms (z, alpha), in place and not;
# every name of cfbn._args.ACTIVATIONS but None has them
_FORMS = {
    "relu": (lambda z, a: torch.relu_(z), lambda z, a: F.relu(z)),
    # hardtanh, nn.ReLU6's own form: NaN stays NaN, as relu6(NaN) is NaN in
    # the reference, and its derivative at 0 and 6 is 0 (clamp's is 1)
    "relu6": (lambda z, a: F.hardtanh_(z, 0.0, 6.0), lambda z, a: F.hardtanh(z, 0.0, 6.0)),
    "leaky_relu": (lambda z, a: F.leaky_relu_(z, a), lambda z, a: F.leaky_relu(z, a)),
    "elu": (lambda z, a: F.elu_(z, a), lambda z, a: F.elu(z, a)),
    "sigmoid": (lambda z, a: z.sigmoid_(), lambda z, a: torch.sigmoid(z)),
    "tanh": (lambda z, a: z.tanh_(), lambda z, a: torch.tanh(z)),
    "silu": (lambda z, a: F.silu(z, inplace=True), lambda z, a: F.silu(z)),
}
