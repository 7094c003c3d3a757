"""Models for the convert tests: torchvision and timm, skipped where
missing, and batch norms drawn away from their initial values.

torchvision's compiled operators (``torchvision::nms`` and the others) load
only against the torch build they were compiled for; where they do not, its
import stops registering a fake kernel for an operator that does not exist.
The model code these tests use needs none of them, so the two schemas that
import registers kernels for are declared here and the import retried.
"""
import pytest

torch = pytest.importorskip("torch")

_SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
            "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_kept = []


def torchvision():
    """torchvision, imported (the test is skipped without it)."""
    try:
        import torchvision as tv
    except ImportError:
        pytest.skip("torchvision is not installed")
    except RuntimeError:
        lib = torch.library.Library("torchvision", "DEF")
        for schema in _SCHEMAS:
            lib.define(schema)
        _kept.append(lib)  # the schemas live as long as the library object
        import torchvision as tv
    return tv


def timm():
    """timm, imported (the test is skipped without it or torchvision)."""
    torchvision()  # timm imports it
    return pytest.importorskip("timm")


def randomized(model):
    """`model` with its batch norms' parameters and running statistics drawn
    away from their initial 1 and 0, so that each one's arithmetic counts."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
    return model
