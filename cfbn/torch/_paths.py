"""Which path a module's eager call takes: cfbn's operators, or PyTorch's own
batch norm (then the add and the activation) for calls too small to gain.

A cfbn call pays for a Python autograd node on top of its kernels; PyTorch's
native batch norm has a C++ one.  Below the crossover the node costs more than
cfbn's kernels save, so the modules call ``torch.nn.functional.batch_norm``
there: the same results within float rounding (PyTorch's kernels), the same
running statistics.  The crossover is per memory format and dtype, in
elements of the input, measured by ``benchmarks/torch_crossover.py``
(forward + backward of a module, both paths interleaved, one and two threads;
the smallest size from which cfbn's path is faster at both thread counts).
Traced, compiled and transformed calls always take cfbn's operators.

`set_path` forces either path for every module ("cfbn", "native") or restores
the crossover ("auto").
"""
import torch
import torch.nn.functional as F

from .. import _args
from . import _checks
from ._activation import activate

# (channels_last, dtype) -> the input size, in elements, from which cfbn's
# path runs.  Measured on AMD EPYC (Zen 4), 2 cores, torch 2.13, by
# benchmarks/torch_crossover.py (docs/torch.md has the table): where runs
# disagreed, the largest size from which cfbn's path was faster in every run.
# float32, two runs that agreed: cfbn's path slower at 65,536 contiguous
# elements with two threads (native / cfbn 0.84, 0.89), faster from 131,072
# (1.08-1.65); channels_last slower at 131,072 (0.82-0.89), faster from
# 262,144 (1.00-1.82).  float64, two runs: 65,536 and 131,072 contiguous,
# 262,144 channels_last.  bfloat16 and float16, four runs: 262,144 to
# 1,048,576 contiguous, 262,144 to 524,288 channels_last (their ratios near
# the crossover are within noise of 1 at two threads).
CROSSOVER = {
    (False, torch.float32): 131072,
    (True, torch.float32): 262144,
    (False, torch.float64): 131072,
    (True, torch.float64): 262144,
    (False, torch.bfloat16): 1048576,
    (True, torch.bfloat16): 524288,
    (False, torch.float16): 1048576,
    (True, torch.float16): 524288,
}
# any dtype the table does not name (cfbn's kernels take no other)
DEFAULT_CROSSOVER = 262144

_PATHS = ("auto", "cfbn", "native")
_path = "auto"


def set_path(path):
    """Choose the path of every module's eager call.

    Parameters
    ----------
    path : {"auto", "cfbn", "native"}
        "auto" (the default): PyTorch's native batch norm below the measured
        crossover, cfbn's operators from it on; "cfbn": cfbn's operators
        always; "native": PyTorch's batch norm, add and activation always.

    Returns
    -------
    str
        The path chosen before.
    """
    global _path
    if path not in _PATHS:
        raise ValueError("path: expected one of %s, got %r" % (", ".join(map(repr, _PATHS)), path))
    old, _path = _path, path
    return old


def get_path():
    """The path set by `set_path` ("auto" unless changed)."""
    return _path


def native(input):
    """Whether this eager module call takes PyTorch's native path."""
    if _path == "cfbn":
        return False
    if torch.jit.is_tracing() or torch.compiler.is_compiling():
        return False
    if _path == "native":
        return True
    channels_last = input.dim() > 2 and not input.is_contiguous()
    return input.numel() < CROSSOVER.get((channels_last, input.dtype), DEFAULT_CROSSOVER)


def batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps,
               activation, alpha, side_input):
    """PyTorch's batch norm, then the side input and the activation.

    The scalar rules are cfbn's (nn would take a negative or NaN eps and
    return NaNs); the tensors' are PyTorch's own."""
    _args.epsilon(eps, "eps")
    if momentum is not None:
        _args.finite(momentum, "momentum")
    _checks.like_input(side_input, "side_input", input)
    y = F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    if side_input is not None:
        y = y + side_input
    return activate(y, activation, alpha)
