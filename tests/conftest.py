import os
import sys
from pathlib import Path

import pytest

# The shared checking helpers live next to this file; put the directory on the
# path explicitly so they import the same way under every pytest import mode.
sys.path.insert(0, str(Path(__file__).resolve().parent))

import cfbn  # noqa: E402
import hypothesis_profiles  # noqa: E402,F401
from _checks import selected  # noqa: E402

SUPPORTED_ISAS = list(cfbn.runtime_info()["supported_isas"])


@pytest.fixture(autouse=True)
def _cfbn_torch_path(request):
    """cfbn.torch's modules on cfbn's operators in every test: small inputs
    would otherwise take PyTorch's own batch norm (cfbn.torch.set_path), and
    the tests comparing the modules with nn would compare nn with itself.  A
    test marked torch_path chooses the path itself."""
    ct = sys.modules.get("cfbn.torch")
    if ct is None or request.node.get_closest_marker("torch_path"):
        yield
        return
    old = ct.set_path("cfbn")
    try:
        yield
    finally:
        ct.set_path(old)


@pytest.fixture(params=SUPPORTED_ISAS)
def isa(request):
    """Run the test once per kernel table this CPU can execute."""
    with selected(request.param):
        yield request.param


def pytest_collection_modifyitems(config, items):
    """CFBN_TEST_SHARD=I/N keeps every N-th collected test from the I-th
    (0-based): N processes with I = 0..N-1 run the whole suite between them.
    For emulated CPUs, where one Python process keeps one core busy and a
    machine has more."""
    shard = os.environ.get("CFBN_TEST_SHARD")
    if not shard:
        return
    try:
        index, count = (int(v) for v in shard.split("/"))
        if not 0 <= index < count:
            raise ValueError
    except ValueError:
        raise pytest.UsageError("CFBN_TEST_SHARD: expected I/N with 0 <= I < N, got %r" % shard)
    keep = [item for k, item in enumerate(items) if k % count == index]
    config.hook.pytest_deselected(items=[item for k, item in enumerate(items)
                                         if k % count != index])
    items[:] = keep
