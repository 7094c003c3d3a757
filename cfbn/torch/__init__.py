"""cfbn for PyTorch: operators, a functional form and nn.BatchNorm drop-ins.

``pip install cfbn[torch]``.  ``import cfbn`` never imports torch; importing
this package does, and loads the prebuilt operators ``torch.ops.cfbn.batch_norm``,
``batch_norm_backward`` and ``batch_norm_double_backward`` (cfbn.torch.ops),
which every call below goes through.

- `BatchNorm1d`, `BatchNorm2d`, `BatchNorm3d`: subclasses of their torch.nn
  namesakes computed by cfbn, plus ``activation=`` and ``side_input``.
- `batch_norm`: ``torch.nn.functional.batch_norm``'s signature, plus the
  same two.
- `SyncBatchNorm`: batch norm synchronized over torch.distributed (gloo,
  CPU), statistics merged exactly and identically on every rank; DDP takes it.
- `convert`: replaces a model's ``nn.BatchNorm*`` and ``nn.SyncBatchNorm``
  with these, in place (optionally fusing the activation after them);
  `register_block` declares a block class it fuses, `residual` is the
  fused residual add such a block calls.
- `set_path`, `get_path`: whether the modules' small eager calls take
  PyTorch's native batch norm (the default below a measured size) or
  cfbn's operators.

CPU tensors of float32, float64, float16 and bfloat16, contiguous or
channels-last, with no copies; differentiable twice; ``torch.jit.trace``,
``torch.export`` and ``torch.compile`` (fullgraph) record the operators.
"""
try:
    import torch  # noqa: F401
except ImportError as exc:
    raise ImportError("cfbn.torch needs PyTorch: pip install cfbn[torch]") from exc

from . import ops
from .functional import batch_norm
from .modules import BatchNorm1d, BatchNorm2d, BatchNorm3d
from .sync import SyncBatchNorm
from .convert import convert
from .blocks import register_block, residual
from ._paths import get_path, set_path

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "batch_norm",
           "convert", "get_path", "ops", "register_block", "residual", "set_path"]
