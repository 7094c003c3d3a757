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


@pytest.fixture(params=SUPPORTED_ISAS)
def isa(request):
    """Run the test once per kernel table this CPU can execute."""
    with selected(request.param):
        yield request.param
