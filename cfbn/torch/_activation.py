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
    return _IN_PLACE[activation](z, a)


# cfbn's activation name -> its in-place torch form (z, alpha); every name
# of cfbn._args.ACTIVATIONS but None has one
_IN_PLACE = {
    "relu": lambda z, a: torch.relu_(z),
    # clamp keeps NaN, as relu6(NaN) is NaN in the reference
    "relu6": lambda z, a: z.clamp_(0.0, 6.0),
    "leaky_relu": lambda z, a: F.leaky_relu_(z, a),
    "elu": lambda z, a: F.elu_(z, a),
    "sigmoid": lambda z, a: z.sigmoid_(),
    "tanh": lambda z, a: z.tanh_(),
    "silu": lambda z, a: F.silu(z, inplace=True),
}
