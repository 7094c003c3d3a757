"""Build cfbn._kernels: Cython wrapper, baseline C driver, one C file per ISA.

The target architecture comes from sysconfig.get_platform(), which honours
_PYTHON_HOST_PLATFORM in cross builds (platform.machine() names the build
machine, not the target).  Each ISA file is compiled alone with its own flags;
everything else gets baseline flags only, so the extension loads on any CPU of
its architecture and dispatch.c picks the best table at import.
"""
import os
import shutil
import sysconfig
import tempfile

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.errors import CompileError, LinkError

BASE_SOURCES = ["csrc/bn_scalar.c", "csrc/bn_route.c", "csrc/bn_driver.c", "csrc/dispatch.c", "csrc/out_cache.c"]
COMMON_FLAGS = ["-O3", "-std=c11", "-fno-math-errno", "-fvisibility=hidden"]


def target_arch():
    plat = sysconfig.get_platform().lower()
    if "x86_64" in plat or "amd64" in plat:
        return "x86_64"
    if "aarch64" in plat or "arm64" in plat:
        return "aarch64"
    return "other"


def isa_sources():
    """(source, extra flags, macro) for each ISA file of the target."""
    arch = target_arch()
    if arch == "x86_64":
        return [("csrc/bn_avx2.c", ["-mavx2", "-mfma", "-mf16c"], "CFBN_HAVE_AVX2")]
    if arch == "aarch64":
        # Advanced SIMD is part of the AArch64 baseline: no extra flags.
        return [("csrc/bn_neon.c", [], "CFBN_HAVE_NEON")]
    return []


def openmp_flags(compiler):
    """Compile and link a tiny OpenMP program; return the flags that work."""
    if os.environ.get("CFBN_NO_OPENMP", "") not in ("", "0"):
        return None
    candidates = [(["-fopenmp"], ["-fopenmp"]), (["-Xpreprocessor", "-fopenmp"], ["-lomp"])]
    tmp = tempfile.mkdtemp(prefix="cfbn-omp-")
    try:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write("#include <omp.h>\nint main(void){int n=0;\n#pragma omp parallel reduction(+:n)\nn+=1;\n"
                    "return n > 0 ? 0 : 1;}\n")
        for cflags, ldflags in candidates:
            try:
                objs = compiler.compile([src], output_dir=tmp, extra_postargs=cflags)
                compiler.link_executable(objs, "probe", output_dir=tmp, extra_postargs=ldflags)
                return cflags, ldflags
            except (CompileError, LinkError):
                continue
        return None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class BuildExt(build_ext):
    def build_extensions(self):
        omp = openmp_flags(self.compiler)
        for ext in self.extensions:
            ext.extra_compile_args = COMMON_FLAGS + (omp[0] if omp else [])
            ext.extra_link_args = omp[1] if omp else []
            objects = []
            for src, flags, macro in isa_sources():
                ext.define_macros.append((macro, "1"))
                objects += self.compiler.compile(
                    [src], output_dir=self.build_temp, include_dirs=["csrc"],
                    macros=[(macro, "1")], extra_postargs=COMMON_FLAGS + flags)
            ext.extra_objects = objects + list(ext.extra_objects or [])
        print("cfbn: target %s, OpenMP %s, ISA files %s"
              % (target_arch(), "on" if omp else "off", [s for s, _, _ in isa_sources()] or "none"))
        super().build_extensions()


class BuildPy(build_py):
    """Ship csrc/bn_math.h inside the package: the CuPy kernels include it."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "cfbn")
        os.makedirs(target, exist_ok=True)
        self.copy_file(os.path.join("csrc", "bn_math.h"), os.path.join(target, "bn_math.h"))


extensions = [
    Extension(
        "cfbn._kernels",
        sources=["cfbn/_kernels.pyx"] + BASE_SOURCES,
        include_dirs=["csrc", numpy.get_include()],
        # 1.22: the memory-handler API; the same floor with NumPy 2.0 (the
        # newest for Python 3.9, default target 1.19) and later NumPy.
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION"),
                       ("NPY_TARGET_VERSION", "NPY_1_22_API_VERSION")],
    )
]

setup(
    ext_modules=cythonize(extensions, language_level=3,
                          compiler_directives={"boundscheck": False, "wraparound": False}),
    cmdclass={"build_ext": BuildExt, "build_py": BuildPy},
)
