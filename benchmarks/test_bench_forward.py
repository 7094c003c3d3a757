"""Forward pass: training (batch statistics, running averages updated with
exponential_avg_factor=0.1) and inference (population statistics)."""
import pytest


@pytest.mark.bench_ops("train")
def test_training_forward(bench, op, shape, layout, threads, impl):
    bench(op, shape, layout, threads, impl)


@pytest.mark.bench_ops("infer")
def test_inference_forward(bench, op, shape, layout, threads, impl):
    bench(op, shape, layout, threads, impl)
