"""Every CUDA kernel source cfbn generates compiles to PTX with NVRTC, no GPU needed.

CuPy builds an ElementwiseKernel's CUDA source only when it is first called,
which needs a device.  Here the source comes from CuPy's internal code
generator (cupy._core._kernel._get_elementwise_kernel_code), fed the argument
descriptions that cfbn._gpu's calls produce: every array 1-D and C-contiguous,
every scalar a C scalar, with 32-bit and with 64-bit indexing.  That
generator is private; the tests skip, saying why, where cupy, libnvrtc or
the generator's expected shape is missing.  The CuPy version these internals
were checked against is PINNED_CUPY; CI installs exactly that one.
"""
import importlib.util
import os
import re

import numpy as np
import pytest

from cfbn import _gpu

PINNED_CUPY = "14.2.0"
ARCHS = ["compute_80", "compute_90"]

cupy = pytest.importorskip("cupy", reason="cupy is not installed (pip install cfbn[gpu])")


def _internals():
    try:
        from cupy._core import _carray, _kernel, _scalar, core
        from cupy.cuda import nvrtc
        gen = _kernel._get_elementwise_kernel_code
        arginfo = _kernel._ArgInfo
        return {
            "gen": gen, "ArgInfo": arginfo, "CScalar": _scalar.CScalar,
            "Indexer": _carray.Indexer, "headers": list(core._cupy_header_list),
            "assemble": core.assemble_cupy_compiler_options, "nvrtc": nvrtc,
        }
    except (ImportError, AttributeError) as exc:
        pytest.skip("CuPy %s internals moved (checked against %s): %s"
                    % (cupy.__version__, PINNED_CUPY, exc), allow_module_level=True)


INTERNALS = _internals()
try:
    INTERNALS["nvrtc"].getVersion()
except Exception as exc:  # the binding raises its own library-lookup errors
    pytest.skip("libnvrtc is not available (pip install nvidia-cuda-nvrtc-cu12): %s" % exc,
                allow_module_level=True)


def _extra_includes():
    # cuda_fp16.h, which CuPy's float16 type needs, from the nvidia-cuda-runtime
    # wheel when CuPy found no CUDA toolkit of its own.
    try:
        import nvidia.cuda_runtime
        return ["-I" + os.path.join(list(nvidia.cuda_runtime.__path__)[0], "include")]
    except ImportError:
        return []


EXTRA_INCLUDES = _extra_includes()


def generated_source(name, idx32):
    """The CUDA source CuPy would compile for cfbn._gpu's call of kernel `name`."""
    it = INTERNALS
    k = _gpu.kernel(name)
    infos = []
    for p in k.params:
        if p.name == "_ind":
            continue
        if p.name in _gpu.SCALAR_PARAMS:
            assert not p.raw, name
            infos.append(it["ArgInfo"](3, it["CScalar"], np.dtype(p.dtype), 0, True, True))
        else:
            infos.append(it["ArgInfo"](1, cupy.ndarray, np.dtype(p.dtype), 1, True, idx32))
    infos.append(it["ArgInfo"](2, it["Indexer"], None, 1, True, idx32))
    in_dtypes = tuple(np.dtype(p.dtype) for p in k.in_params)
    try:
        type_map = k._decide_params_type(in_dtypes, ())[2]
        src = it["gen"](tuple(infos), type_map, k.params, k.operation, k.name, k.preamble)
    except (AttributeError, TypeError) as exc:
        pytest.skip("CuPy %s code generator changed (checked against %s): %s"
                    % (cupy.__version__, PINNED_CUPY, exc))
    headers = "".join("#include <%s>\n" % h for h in it["headers"])
    return headers + src


def nvrtc_ptx(src, name, arch):
    nvrtc = INTERNALS["nvrtc"]
    # The options CuPy itself compiles with: its headers, CCCL, the CUDA include
    # directory it found (cuda_fp16.h for float16), C++17.
    opts = list(INTERNALS["assemble"](("-arch=%s" % arch,))) + EXTRA_INCLUDES
    prog = nvrtc.createProgram(src, name + ".cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError:
            log = nvrtc.getProgramLog(prog)
            pytest.fail("NVRTC failed on %s for %s:\n%s" % (name, arch, log))
        log = nvrtc.getProgramLog(prog)
        ptx = nvrtc.getPTX(prog)
        return (ptx.decode() if isinstance(ptx, bytes) else ptx), log
    finally:
        nvrtc.destroyProgram(prog)


def test_every_kernel_is_named_and_listed():
    names = sorted(_gpu.KERNEL_SPECS)
    assert all(re.fullmatch(r"cfbn_[a-z0-9_]+", n) for n in names)
    # 4 plain passes, 4 fused ones (apply_act, gstats_act, gapply_act, gapply_side)
    # and 2 second-order ones (ggstats, ggapply) x 4 dtypes x 2 layouts; 4 forward
    # finalizers; 4 kernels by vector dtype (infer_finalize, grad_finalize,
    # grad_prep, gg_finalize) x 2
    assert len(names) == 10 * 4 * 2 + 4 + 4 * 2


def test_second_order_kernels_for_every_dtype_and_layout():
    """cfbn._gpu.grad_grad's kernels, so that test_kernel_compiles covers each."""
    for sfx in ("f32", "f64", "f16", "bf16"):
        for layout in ("last", "first"):
            for kind in ("ggstats", "ggapply", "gstats", "gapply", "apply"):
                assert "cfbn_%s_%s_%s" % (kind, sfx, layout) in _gpu.KERNEL_SPECS
    for vsfx in ("f32", "f64"):
        for kind in ("gg_finalize", "grad_finalize", "infer_finalize"):
            assert "cfbn_%s_%s" % (kind, vsfx) in _gpu.KERNEL_SPECS
    # the five sums are the outputs of the stats pass, in cfbn_grad_grad_params' order
    assert _gpu.KERNEL_SPECS["cfbn_ggstats_f32_last"][1] == (
        "float64 s1, float64 s2, float64 s3, float64 s4, float64 s5")
    assert "cfbn_grad_grad_params(" in _gpu.KERNEL_SPECS["cfbn_gg_finalize_f32"][2]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("idx32", [True, False], ids=["idx32", "idx64"])
@pytest.mark.parametrize("name", sorted(_gpu.KERNEL_SPECS))
def test_kernel_compiles(name, idx32, arch):
    if "_bf16" in name and importlib.util.find_spec("ml_dtypes") is None:
        # CuPy's bfloat16 is ml_dtypes' (pip install cfbn[gpu-test] brings it)
        pytest.skip("ml_dtypes is not installed: CuPy has no bfloat16 without it")
    src = generated_source(name, idx32)
    assert _gpu.preamble() in src
    ptx, log = nvrtc_ptx(src, name, arch)
    assert ".entry %s(" % name in ptx or ".entry %s" % name in ptx, "entry missing from PTX"
    assert ".target sm_%s" % arch.split("_")[1] in ptx
    assert "warning" not in log.lower(), log


@pytest.mark.parametrize("arch", ARCHS)
def test_header_compiles_alone_under_nvrtc(arch):
    src = ('#include "cfbn_bn_math.h"\n'
           'extern "C" __global__ void cfbn_probe(const float *x, float *y, double *s) {\n'
           '  double a = 0.0, b = 0.0, m, v, gs[5] = {0.0, 0.0, 0.0, 0.0, 0.0}, sbp, k[7];\n'
           '  cfbn_stats_add((double)x[0], 1.0, &a, &b);\n'
           '  cfbn_moments(1.0, a, b, 1, &m, &v);\n'
           '  y[0] = cfbn_normalize_f(x[0], cfbn_mean_hi_f(m), cfbn_mean_lo_f(m), 1.f, 0.f);\n'
           '  s[0] = cfbn_grad_dx_d(1.0, 2.0, m, 0.0, v, 1.0, 0.0);\n'
           '  s[1] = (double)cfbn_channel_first(threadIdx.x, 3, 5);\n'
           '  cfbn_ggstats_add_f(x[0], x[1], x[2], 0.f, 0.f, gs);\n'
           '  cfbn_ggstats_add_d(s[0], s[1], 2.0, m, 0.0, gs);\n'
           '  cfbn_grad_grad_params((int)threadIdx.x & 1, 7, 1.5, 0.5, 0.25, 0.125, gs, &sbp, k);\n'
           '  y[9] = cfbn_gg_dx_f(x[0], x[1], x[2], 0.f, 0.f, (float)k[3], (float)k[4], (float)k[5],\n'
           '                      (float)k[6]);\n'
           '  s[10] = sbp + cfbn_gg_dx_d(s[0], s[1], 2.0, m, 0.0, k[3], k[4], k[5], k[6]);\n'
           '  for (int k = CFBN_ACT_NONE; k <= CFBN_ACT_SILU; k++) {\n'
           '    y[1 + k] = cfbn_fused_y_f(k, 0.2f, x[1], 1, x[2], 0.f, 0.f, 1.f, 0.f)\n'
           '               + cfbn_fused_g_f(k, 0.2f, x[3], x[1], 1, x[2], 0.f, 0.f, 1.f, 0.f);\n'
           '    s[2 + k] = cfbn_fused_y_d(k, 1.3, s[0], 0, 0.0, 0.0, 0.0, 1.0, 0.0)\n'
           '               + cfbn_fused_g_d(k, 1.3, 1.0, s[0], 0, 0.0, 0.0, 0.0, 1.0, 0.0);\n'
           '  }\n'
           '}\n')
    nvrtc = INTERNALS["nvrtc"]
    prog = nvrtc.createProgram(src, "probe.cu", [_gpu.preamble().encode()],
                               [b"cfbn_bn_math.h"])
    try:
        try:
            nvrtc.compileProgram(prog, ["-arch=%s" % arch, "-std=c++17"])
        except nvrtc.NVRTCError:
            pytest.fail(nvrtc.getProgramLog(prog))
        ptx = nvrtc.getPTX(prog)
        assert ".entry cfbn_probe" in (ptx.decode() if isinstance(ptx, bytes) else ptx)
    finally:
        nvrtc.destroyProgram(prog)
