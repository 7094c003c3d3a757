"""Loads cfbn's prebuilt operator library (csrc/torch_ops.cpp) into PyTorch.

The library is compiled when cfbn is built with PyTorch installed (every
x86-64 and aarch64 wheel carries it, or ``pip install --no-build-isolation .``
beside torch), against LibTorch's stable ABI for torch 2.10 and later:
nothing is compiled on the user's machine.  Loading it registers
``torch.ops.cfbn.batch_norm``, ``batch_norm_backward`` and
``batch_norm_double_backward`` with their C++ kernels; cfbn._kernels then
hands it the table of its C driver (the capsule ``cfbn._kernels.c_api``), so
the operators run the kernels, and the ISA, that ``import cfbn`` selected.

Where it cannot load (a build without PyTorch, torch older than 2.10, or
``CFBN_TORCH_LIBRARY=0``), `load` returns a reason and cfbn.torch defines
the same operators in Python over NumPy views (cfbn.torch._bridge): the
same results, slower per call.

``CFBN_TORCH_POOL`` chooses the threads the operators' kernels run on:
``torch`` (the default), PyTorch's intra-op pool, or ``openmp``, cfbn's own
OpenMP threads (as the NumPy calls use).  Either gives the same bits.
"""
import ctypes
import os

import torch

NAME = "_ops.so"
_HERE = os.path.dirname(os.path.abspath(__file__))
# The stable ABI's floor: the library is built with TORCH_TARGET_VERSION 2.10.
MIN_TORCH = (2, 10)
# The threads of the operators' parallel loops by default (CFBN_TORCH_POOL).
POOL = "torch"


def _torch_version():
    parts = torch.__version__.split("+")[0].split(".")
    return tuple(int("".join(ch for ch in p if ch.isdigit()) or 0) for p in parts[:2])


def _c_api_address():
    from .. import _kernels

    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return get(_kernels.c_api, b"cfbn._kernels.c_api")


def load():
    """Load and bind the library: None on success, else why it was not used."""
    if os.environ.get("CFBN_TORCH_LIBRARY", "1") == "0":
        return "CFBN_TORCH_LIBRARY=0"
    path = os.path.join(_HERE, NAME)
    if not os.path.exists(path):
        return "cfbn was built without PyTorch, so it has no operator library (%s)" % NAME
    if _torch_version() < MIN_TORCH:
        return ("the operator library needs torch %d.%d or later, this is torch %s"
                % (MIN_TORCH + (torch.__version__,)))
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        return "the operator library did not load (%s)" % exc
    pool = os.environ.get("CFBN_TORCH_POOL", POOL)
    if pool not in ("torch", "openmp"):
        raise ValueError("CFBN_TORCH_POOL: expected 'torch' or 'openmp', got %r" % pool)
    needed = lib.cfbn_torch_bind(ctypes.c_void_p(_c_api_address()), int(pool == "torch"))
    if needed != 0:
        return ("the operator library needs cfbn's C API version %d, which this build of "
                "cfbn._kernels does not export (a mixed installation?)" % needed)
    return None
