"""Gradient in training: x_backprop, scale_backprop and offset_backprop from
the forward pass's batch statistics."""
import pytest


@pytest.mark.bench_ops("grad")
def test_training_gradient(bench, op, shape, layout, threads, impl):
    bench(op, shape, layout, threads, impl)
