"""The kernel table chosen at import is the one the environment expects.

Set CFBN_EXPECT_ISA (scalar, avx2 or neon) to the table this machine must
select: an emulated aarch64 CPU must end up on NEON, an x86-64 CPU without
AVX2 on scalar, and CFBN_FORCE_ISA must win over detection.  Skipped when
CFBN_EXPECT_ISA is unset, since the right answer depends on the CPU.
"""

import os

import pytest

import cfbn
from cfbn import _kernels

EXPECTED = os.environ.get("CFBN_EXPECT_ISA", "")
# The ISA fixture of conftest.py switches tables while other tests run; what
# import chose is read here, at collection, before any of them.
SELECTED_AT_IMPORT = cfbn.runtime_info()["selected_isa"]

pytestmark = pytest.mark.skipif(not EXPECTED, reason="CFBN_EXPECT_ISA is not set")


def test_import_selected_the_expected_table():
    assert SELECTED_AT_IMPORT == EXPECTED, cfbn.runtime_info()


def test_expected_table_is_compiled_and_supported():
    info = cfbn.runtime_info()
    assert EXPECTED in info["compiled_isas"], info
    assert EXPECTED in info["supported_isas"], info


def test_expected_table_is_active_outside_the_isa_fixture():
    assert _kernels.selected_isa() == EXPECTED
    assert cfbn.runtime_info()["selected_isa"] == EXPECTED
