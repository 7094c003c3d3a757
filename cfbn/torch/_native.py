"""The C++ operator (_native.cpp): built on first use, then loaded from a cache.

cfbn's wheels cannot carry code compiled against PyTorch (each PyTorch
release has its own C++ ABI), so the operator is compiled against the
installed PyTorch by ``torch.utils.cpp_extension`` the first time an eager
``cfbn.torch`` call needs it (about 30 s on two cores; it says so on stderr), and
loaded from the cache every time after.  It needs a C++ compiler and ninja
(``pip install cfbn[torch]`` installs ninja).

- The cache: ``$CFBN_TORCH_BUILD_DIR``, else ``$XDG_CACHE_HOME/cfbn`` or
  ``~/.cache/cfbn``; one folder per source, PyTorch and Python version.
- ``CFBN_TORCH_NATIVE=0`` never builds or loads it: every call goes through
  the Python bridge (cfbn.torch._bridge), which computes the same bits at
  about 40 microseconds more per forward and backward.
- A build that fails warns once (RuntimeWarning, with the reason) and
  leaves the Python bridge in use.
"""
import hashlib
import os
import sys
import sysconfig
import warnings

import torch

NAME = "cfbn_torch_native"
_HERE = os.path.dirname(os.path.abspath(__file__))
_module = None
_tried = False


def _header_dir():
    """Where c_api.h is: beside this file when installed, else csrc/."""
    if os.path.exists(os.path.join(_HERE, "c_api.h")):
        return _HERE
    return os.path.join(os.path.dirname(os.path.dirname(_HERE)), "csrc")


def _build_dir(sources):
    h = hashlib.sha256()
    for path in sources:
        with open(path, "rb") as f:
            h.update(f.read())
    h.update(torch.__version__.encode())
    h.update(sysconfig.get_config_var("SOABI").encode() if sysconfig.get_config_var("SOABI")
             else sys.version.encode())
    root = os.environ.get("CFBN_TORCH_BUILD_DIR")
    if not root:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                                 ".cache")
        root = os.path.join(cache, "cfbn")
    return os.path.join(root, "torch-native-" + h.hexdigest()[:16])


def _build():
    from torch.utils import cpp_extension

    include = _header_dir()
    source = os.path.join(_HERE, "_native.cpp")
    build = _build_dir([source, os.path.join(include, "c_api.h")])
    os.makedirs(build, exist_ok=True)
    if not os.path.exists(os.path.join(build, NAME + ".so")):
        print("cfbn.torch: compiling the C++ operator into %s (once; about 30 s on two cores)" % build,
              file=sys.stderr, flush=True)
    import cfbn._kernels  # noqa: F401  (the capsule the operator imports)
    return cpp_extension.load(NAME, [source], extra_include_paths=[include],
                              extra_cflags=["-O2"], build_directory=build, verbose=False)


def get():
    """The built module, or None (disabled, or the build failed)."""
    global _module, _tried
    if _tried:
        return _module
    _tried = True
    if os.environ.get("CFBN_TORCH_NATIVE", "1") == "0":
        return None
    try:
        _module = _build()
    except Exception as exc:  # a compiler, ninja or header missing: the bridge still works
        # a failed compile's message is the whole build log: name its first
        # diagnostic (or the shell's complaint), else its last line
        lines = str(exc).strip().splitlines() or [""]
        reason = next((line.strip() for line in lines
                       if "error:" in line or "not found" in line), lines[-1])
        warnings.warn("cfbn.torch: the C++ operator could not be built (%s: %s); the Python "
                      "bridge computes every call, at about 40 us more per forward and "
                      "backward.  CFBN_TORCH_NATIVE=0 skips the build."
                      % (type(exc).__name__, reason), RuntimeWarning, stacklevel=3)
    return _module
