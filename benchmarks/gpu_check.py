"""Device check for the CuPy path: run tests/test_gpu.py, then time it.

Usage, on a machine with a CUDA GPU and cupy installed (installs nothing):

    python benchmarks/gpu_check.py [--quick]

1. runs tests/test_gpu.py with pytest and stops if it fails;
2. measures the device's copy bandwidth (a device-to-device memcpy);
3. times cfbn's forward (training) and gradient on large float32 and float16
   tensors in NHWC and NCHW, and cuDNN's batch norm for the same shapes
   (cupy.cudnn where its library loads, else PyTorch CUDA if installed);
4. prints time and achieved bandwidth per op against the copy bandwidth.

Bytes counted per op are the minimum traffic: forward training reads x
twice (statistics, then normalization) and writes y; the gradient reads dy
and x twice and writes dx.
"""
import argparse
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_tests():
    cmd = [sys.executable, "-m", "pytest", os.path.join(ROOT, "tests", "test_gpu.py"), "-q",
           "-rs", "-p", "no:cacheprovider"]
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=ROOT)


def timed(cupy, fn, repeat):
    fn()
    cupy.cuda.Device().synchronize()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    best = float("inf")
    for _ in range(repeat):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        best = min(best, cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return best


def copy_bandwidth(cupy, nbytes, repeat):
    a = cupy.empty(nbytes, np.uint8)
    b = cupy.empty_like(a)
    t = timed(cupy, lambda: b.data.copy_from_device(a.data, nbytes), repeat)
    return 2 * nbytes / t          # read + write


def cudnn_ops(cupy, x, scale, offset, layout, eps):
    """(forward, backward) callables of a cuDNN batch norm, or None, and the source name."""
    try:
        from cupy import cudnn
        from cupy.cuda import cudnn as libcudnn
        libcudnn.getVersion()
    except Exception:
        cudnn = None
    if cudnn is not None:
        mode = libcudnn.CUDNN_BATCHNORM_SPATIAL_PERSISTENT
        axis = (0, 1, 2) if layout == "NHWC" else (0, 2, 3)
        fmt = libcudnn.CUDNN_TENSOR_NHWC if layout == "NHWC" else libcudnn.CUDNN_TENSOR_NCHW
        state = {}

        def fwd():
            mean = cupy.zeros_like(scale)
            var = cupy.ones_like(scale)
            state["out"] = cudnn.batch_normalization_forward_training(
                x, scale, offset, mean, var, None, None, eps, 1.0, True, mode, fmt)

        def bwd():
            _, m, iv = state["out"]
            cudnn.batch_normalization_backward(x, scale, x, m, iv, eps, True, mode, fmt)
        fwd()
        return fwd, bwd, "cupy.cudnn %d" % libcudnn.getVersion()
    try:
        import torch
        if not torch.cuda.is_available():
            return None, None, "none"
    except ImportError:
        return None, None, "none (no cuDNN library for cupy.cudnn, no PyTorch)"
    tx = torch.as_tensor(x, device="cuda")
    if layout == "NHWC":
        tx = tx.permute(0, 3, 1, 2)          # a channels-last NCHW view
    tx = tx.detach().requires_grad_(True)
    w = torch.as_tensor(scale, device="cuda").float().requires_grad_(True)
    b = torch.as_tensor(offset, device="cuda").float().requires_grad_(True)
    state = {}

    def fwd():
        state["y"] = torch.nn.functional.batch_norm(tx, None, None, w, b, True, 0.1, eps)

    def bwd():
        torch.autograd.grad(state["y"], (tx, w, b), state["g"], retain_graph=True)
    fwd()
    state["g"] = torch.ones_like(state["y"])
    return fwd, bwd, "torch %s (cuDNN %s)" % (torch.__version__, torch.backends.cudnn.version())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller tensors, fewer repeats")
    ap.add_argument("--skip-tests", action="store_true")
    args = ap.parse_args()
    import cupy
    if not cupy.is_available():
        print("cupy.is_available() is false: this machine has no usable GPU")
        return 2
    if not args.skip_tests and run_tests() != 0:
        print("tests/test_gpu.py failed; not timing")
        return 1
    sys.path.insert(0, ROOT)
    import cfbn
    repeat = 5 if args.quick else 20
    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    print("\ndevice %d: %s, CuPy %s, CUDA runtime %d" % (
        dev.id, props["name"].decode(), cupy.__version__, cupy.cuda.runtime.runtimeGetVersion()))
    copy_bw = copy_bandwidth(cupy, 1 << (28 if args.quick else 30), repeat)
    print("device copy bandwidth (read + write): %.0f GB/s" % (copy_bw / 1e9))
    shapes = {"NHWC": (64, 56, 56, 256), "NCHW": (64, 256, 56, 56)}
    if args.quick:
        shapes = {"NHWC": (16, 56, 56, 256), "NCHW": (16, 256, 56, 56)}
    eps = 1e-3
    print("\n%-6s %-8s %-10s %10s %10s %8s   %s" % ("layout", "dtype", "op", "cfbn ms", "cfbn GB/s",
                                                   "of copy", "peer ms (peer)"))
    for dtype in (np.float32, np.float16):
        for layout, shape in shapes.items():
            c = shape[-1] if layout == "NHWC" else shape[1]
            rng = cupy.random.default_rng(0)
            x = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
            scale = cupy.ones(c, np.float32 if dtype == np.float16 else dtype)
            offset = cupy.zeros_like(scale)
            res = cfbn.fused_batch_norm(x, scale, offset, epsilon=eps, data_format=layout)
            ops = {
                "forward": (lambda: cfbn.fused_batch_norm(x, scale, offset, epsilon=eps,
                                                          data_format=layout), 3 * x.nbytes),
                "grad": (lambda: cfbn.fused_batch_norm_grad(
                    x, x, scale, res.reserve_space_1, res.reserve_space_2, epsilon=eps,
                    data_format=layout), 5 * x.nbytes),
            }
            try:
                peer_fwd, peer_bwd, peer = cudnn_ops(cupy, x, scale, offset, layout, eps)
            except Exception as exc:
                peer_fwd = peer_bwd = None
                peer = "peer failed: %s" % exc
            peers = {"forward": peer_fwd, "grad": peer_bwd}
            for op, (fn, nbytes) in ops.items():
                t = timed(cupy, fn, repeat)
                bw = nbytes / t
                pt = peers[op]
                ptxt = "%.3f (%s)" % (timed(cupy, pt, repeat) * 1e3, peer) if pt else peer
                print("%-6s %-8s %-10s %10.3f %10.0f %7.0f%%   %s" % (
                    layout, np.dtype(dtype).name, op, t * 1e3, bw / 1e9, 100 * bw / copy_bw,
                    ptxt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
