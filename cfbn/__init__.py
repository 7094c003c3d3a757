"""cfbn: fused batch normalization, forward and gradient, for NumPy arrays.

C kernels (scalar, AVX2+FMA, NEON) chosen once at import by CPU detection,
parallelized with OpenMP; TensorFlow's FusedBatchNormV3 semantics.
"""
from ._version import __version__
from ._api import (BatchNormGrad, BatchNormGradGrad, BatchNormGradSide, BatchNormOutput,
                   fused_batch_norm, fused_batch_norm_grad, fused_batch_norm_grad_grad,
                   output_cache_info, release_output_cache, runtime_info,
                   set_output_cache_limit, set_verbose)
from .fold import fold_batch_norm
from .layer import BatchNorm
from ._split import (BatchNormGradStatistics, BatchNormStatistics, batch_norm_apply,
                     batch_norm_grad_apply, batch_norm_grad_statistics, batch_norm_statistics,
                     merge_statistics, merge_statistics_many)

__all__ = ["BatchNormGrad", "BatchNormGradGrad", "BatchNormGradSide", "BatchNormOutput",
           "fused_batch_norm", "fused_batch_norm_grad", "fused_batch_norm_grad_grad", "reference", "runtime_info", "__version__",
           "BatchNorm", "fold_batch_norm",
           "BatchNormGradStatistics", "BatchNormStatistics", "batch_norm_apply",
           "batch_norm_grad_apply", "batch_norm_grad_statistics", "batch_norm_statistics",
           "merge_statistics", "merge_statistics_many",
           "output_cache_info", "release_output_cache", "set_output_cache_limit", "set_verbose"]


def __getattr__(name):
    # The NumPy float64 specification is for tests and comparisons; no
    # production module needs it, so it is imported on first use.
    if name == "reference":
        # import_module, not `from . import`: that would look the name up
        # here first and come back to this function.
        import importlib
        return importlib.import_module(".reference", __name__)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def __dir__():
    return sorted(set(globals()) | {"reference"})
