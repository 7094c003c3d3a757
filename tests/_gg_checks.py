"""PyTorch's double backward as an independent answer for the second-order
gradient tests (error bounds: _checks.grad_grad_bounds)."""

import numpy as np
import pytest

from cfbn import reference


GG_FIELDS = ("y_backprop_backprop", "x_backprop", "scale_backprop")


def torch_grad_grad(args, data_format, is_training, epsilon):
    """The derivatives by autograd through ``aten.native_batch_norm``, in float64.

    ``args`` = (dy, x, scale, mean, variance, ggx, ggscale, ggoffset), NumPy
    arrays in ``data_format``, an upstream gradient None where not given."""
    torch = pytest.importorskip("torch")
    dy, x, scale, mean, variance, ggx, ggs, ggo = args
    axis = reference.channel_axis(data_format, x.ndim)

    def tensor(a, grad=False):
        a = np.asarray(a, np.float64)
        a = np.ascontiguousarray(np.moveaxis(a, axis, 1) if a.ndim > 1 else a)
        return torch.tensor(a, dtype=torch.float64, requires_grad=grad)

    dy_t, x_t, scale_t = tensor(dy, True), tensor(x, True), tensor(scale, True)
    offset_t = torch.zeros_like(scale_t, requires_grad=True)
    stats = (None, None) if is_training else (tensor(mean), tensor(variance))
    y = torch.ops.aten.native_batch_norm(x_t, scale_t, offset_t, *stats, is_training, 0.0,
                                         epsilon)[0]
    first = torch.autograd.grad(y, (x_t, scale_t, offset_t), dy_t, create_graph=True)
    loss = sum((tensor(w) * d).sum() for w, d in zip((ggx, ggs, ggo), first) if w is not None)
    wrt = (dy_t, x_t, scale_t)
    second = torch.autograd.grad(loss, wrt, allow_unused=True, materialize_grads=True)
    return [np.moveaxis(s.detach().numpy(), 1, axis) if s.ndim > 1 else s.detach().numpy()
            for s in second]
