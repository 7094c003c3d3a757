"""Second-order gradient in training: y_backprop_backprop, x_backprop and
scale_backprop of cfbn.fused_batch_norm_grad_grad, beside the float64
reference and PyTorch's double backward through its batch norm (the
first-order graph built once, untimed; NHWC as channels_last)."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench_common as bc  # noqa: E402

CHECK_SHAPE = (4, 5, 5, 8)


@pytest.fixture(scope="module", autouse=True)
def torch_computes_the_same():
    """In float64, where only rounding separates them, PyTorch's double
    backward gives cfbn's three outputs: otherwise its timings would be of
    another computation."""
    torch = bc.torch_module()
    if torch is None:
        return
    for layout in bc.LAYOUTS:
        d = bc.add_upstream(bc.make_inputs(CHECK_SHAPE, layout, dtype=np.float64))
        r = bc.cfbn_call("gradgrad", d, 1)()
        p = bc.torch_call(torch, "gradgrad", bc.torch_args(torch, d))()
        for name, a, b in bc.paired_outputs("gradgrad", r, p, layout):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-12 * np.abs(b).max(),
                                       err_msg="%s %s" % (layout, name))


@pytest.mark.bench_ops("gradgrad")
def test_training_grad_grad(bench, op, shape, layout, threads, impl):
    bench(op, shape, layout, threads, impl)
