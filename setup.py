"""Build cfbn._kernels: Cython wrapper, baseline C driver, one C file per ISA.

The target architecture comes from sysconfig.get_platform(), which honours
_PYTHON_HOST_PLATFORM in cross builds (platform.machine() names the build
machine, not the target).  Each ISA file is compiled alone with its own flags;
everything else gets baseline flags only, so the extension loads on any CPU of
its architecture and dispatch.c picks the best table at import.

The C files are compiled side by side, one compiler process per file
(CFBN_BUILD_JOBS, default the number of CPUs): the ISA files and the Cython
module take most of the time.  An -O level in CFLAGS replaces the default -O3
(the sanitizer build uses -O1).  -O3, not -O2: at -O2 bn_avx2.c compiles in
57 s instead of 78 s, with 23% less code, but its table runs 1.27-1.32x as
long (geometric mean of benchmarks/table_ab.sh's cells with NEW_CFLAGS=-O2;
fused loops in L2 up to 5x).

The C files of csrc/ do not include Python.h and are compiled with flags of
their own (plus CFLAGS and CPPFLAGS), not the Python's build flags, which differ
between Python versions: the objects are the same for every Python of an
architecture, so a compiler cache hits from the second wheel on.  Only the
Cython module takes the Python's flags.
"""
import copy
import importlib.util
import itertools
import os
import re
import shlex
import shutil
import subprocess
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.errors import CompileError, LinkError

BASE_SOURCES = ["csrc/bn_scalar.c", "csrc/bn_route.c", "csrc/bn_driver.c", "csrc/scratch.c", "csrc/dispatch.c",
                "csrc/out_cache.c", "csrc/c_api.c"]
OPT_FLAGS = [] if re.search(r"(^|\s)-O", os.environ.get("CFLAGS", "")) else ["-O3"]
COMMON_FLAGS = OPT_FLAGS + ["-std=c11", "-fno-math-errno", "-fvisibility=hidden"]
# The C files of csrc/ only: a switch on enum cfbn_dtype or cfbn_activation
# with a member missing (and no default) is an error, so that a new dtype or
# activation cannot fall through to another's code.
CORE_FLAGS = ["-Werror=switch"]


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
        return [("csrc/bn_avx2.c", ["-mavx2", "-mfma", "-mf16c"], "CFBN_HAVE_AVX2"),
                ("csrc/bn_avx512.c", ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c"],
                 "CFBN_HAVE_AVX512")]
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


def core_compiler(compiler):
    """The extension's compiler with the C core's own flags instead of the Python's."""
    if not hasattr(compiler, "compiler_so"):
        return compiler
    core = copy.copy(compiler)
    program = list(itertools.takewhile(lambda a: not a.startswith("-"), compiler.compiler_so))
    # -g1: line tables, for backtraces and profilers; full debug information
    # of the inlined vector loops doubled the ISA files' compile time (CFLAGS,
    # which come after, may ask for it: -g)
    core.compiler_so = (program + ["-fPIC", "-g1", "-Wall", "-DNDEBUG"]
                        + shlex.split(os.environ.get("CPPFLAGS", "")) + shlex.split(os.environ.get("CFLAGS", "")))
    return core


def build_jobs():
    jobs = os.environ.get("CFBN_BUILD_JOBS", "")
    if jobs:
        if not jobs.isdigit() or int(jobs) < 1:
            raise SystemExit("CFBN_BUILD_JOBS must be a positive integer, not %r" % jobs)
        return int(jobs)
    return os.cpu_count() or 1


# LibTorch's stable ABI as of torch 2.10: the operator library built against
# it loads in 2.10 and every later release.
TORCH_TARGET = (2, 10)
TORCH_TARGET_MACRO = "0x020a000000000000"
TORCH_OPS = os.path.join("cfbn", "torch", "_ops.so")


def cross_build():
    """Whether the target is another machine than the one building (setuptools
    and sysconfig take the target from _PYTHON_HOST_PLATFORM)."""
    return bool(os.environ.get("_PYTHON_HOST_PLATFORM"))


def installed_torch():
    """(include dir, library dir, version) of the PyTorch to build against, or
    None: $CFBN_TORCH_DIR (a torch package folder of the target's
    architecture, for wheels built by Pythons that have no torch of their own,
    and for cross builds: the library does not depend on the Python), else,
    in a native build, the one this Python can import, found without
    importing it (an import takes seconds)."""
    root = os.environ.get("CFBN_TORCH_DIR")
    if not root:
        # a cross build's own interpreter imports the build machine's torch
        spec = None if cross_build() else importlib.util.find_spec("torch")
        if spec is None or not spec.submodule_search_locations:
            return None
        root = list(spec.submodule_search_locations)[0]
    try:
        with open(os.path.join(root, "version.py")) as f:
            found = re.search(r"__version__\s*=\s*['\"](\d+)\.(\d+)", f.read())
    except OSError:
        return None
    include = os.path.join(root, "include")
    if found is None or not os.path.exists(os.path.join(include, "torch", "csrc", "stable")):
        return None
    return include, os.path.join(root, "lib"), (int(found.group(1)), int(found.group(2)))


# e_machine of the ELF header: a library of the wrong architecture in a wheel
# fails only on the user's machine, so the build checks it.
ELF_MACHINES = {62: "x86_64", 183: "aarch64"}


def elf_machine(path):
    with open(path, "rb") as f:
        head = f.read(20)
    if head[:4] != b"\x7fELF":
        return None
    return ELF_MACHINES.get(int.from_bytes(head[18:20], "little"), "other")


def torch_ops_compiler():
    """$CXX, else the target's C++ compiler of a cross build (the target
    Python's sysconfigdata names it: aarch64-linux-gnu-g++), else c++."""
    if os.environ.get("CXX"):
        return shlex.split(os.environ["CXX"])
    if cross_build() and sysconfig.get_config_var("CXX"):
        return shlex.split(sysconfig.get_config_var("CXX"))
    return ["c++"]


def build_torch_ops(target):
    """Put cfbn.torch's operator library at `target` (cfbn/torch/_ops.so);
    True when it did.

    $CFBN_TORCH_OPS_PREBUILT names one built before, which is copied: the
    library does not depend on the Python, so the wheels of an architecture
    can share one build (tools/build_wheels.sh).  Else csrc/torch_ops.cpp is
    compiled when a PyTorch of TORCH_TARGET or later is there to build
    against: installed for this Python, or $CFBN_TORCH_DIR (required for a
    cross build, with a torch of the target's architecture).

    The library uses LibTorch's stable C shim only (TORCH_TARGET_VERSION):
    no C++ class of torch crosses into it, so one binary serves every
    torch from 2.10 on.  It links libtorch_cpu by its soname, which
    `import torch` has loaded before the library is."""
    if os.environ.get("CFBN_TORCH_LIBRARY", "") == "0":
        print("cfbn: operator library for PyTorch: skipped (CFBN_TORCH_LIBRARY=0)")
        return False
    prebuilt = os.environ.get("CFBN_TORCH_OPS_PREBUILT")
    if prebuilt:
        check_torch_ops_machine(prebuilt)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(prebuilt, target)
        print("cfbn: operator library for PyTorch: %s (CFBN_TORCH_OPS_PREBUILT)" % prebuilt)
        return True
    torch = installed_torch()
    if torch is None or torch[2] < TORCH_TARGET:
        print("cfbn: operator library for PyTorch: not built (needs torch >= %d.%d installed "
              "for the build, or CFBN_TORCH_DIR: a torch package folder of the target's "
              "architecture)" % TORCH_TARGET)
        return False
    include, libdir, _ = torch
    # The old std::string ABI, no sized deallocation and one exported symbol
    # keep the library's glibc and libstdc++ needs at the C core's (see
    # csrc/torch_ops.cpp): the wheels' manylinux tag stays where it was.
    cxx = torch_ops_compiler()
    cmd = cxx + ["-O2", "-std=c++17", "-fPIC", "-shared", "-fvisibility=hidden",
                 "-D_GLIBCXX_USE_CXX11_ABI=0", "-fno-sized-deallocation",
                 "-DTORCH_TARGET_VERSION=" + TORCH_TARGET_MACRO, "-Icsrc", "-isystem", include,
                 "csrc/torch_ops.cpp", "-L" + libdir, "-ltorch_cpu",
                 "-Wl,--version-script=csrc/torch_ops.map", "-o", target]
    os.makedirs(os.path.dirname(target), exist_ok=True)
    print("cfbn: operator library for PyTorch: " + " ".join(cmd))
    subprocess.check_call(cmd)
    check_torch_ops_machine(target)
    return True


def check_torch_ops_machine(path):
    machine, arch = elf_machine(path), target_arch()
    if arch != "other" and machine != arch:
        raise SystemExit("cfbn: operator library %s: %s, but the target is %s"
                         % (path, "an ELF file for " + machine if machine else "not an ELF file", arch))


class BuildExt(build_ext):
    """Each ISA file with its own flags and macro; every file in its own process."""

    def build_extensions(self):
        omp = openmp_flags(self.compiler)
        isa = {src: (flags, macro) for src, flags, macro in isa_sources()}
        compile_python = self.compiler.compile
        compile_core = core_compiler(self.compiler).compile

        def compile_one(src, extra_postargs, **kw):
            if src in isa:
                # the ISA's flags; no OpenMP in the vector loops (the driver owns the threads)
                return compile_core([src], extra_postargs=COMMON_FLAGS + CORE_FLAGS + isa[src][0], **kw)
            if src.startswith("csrc/"):
                return compile_core([src], extra_postargs=extra_postargs + CORE_FLAGS, **kw)
            return compile_python([src], extra_postargs=extra_postargs, **kw)

        def compile_parallel(sources, extra_postargs=None, **kw):
            # the ISA files first: they take longest
            order = sorted(sources, key=lambda s: s not in isa)
            with ThreadPoolExecutor(max_workers=build_jobs()) as pool:
                done = dict(zip(order, pool.map(lambda s: compile_one(s, extra_postargs, **kw), order)))
            return [obj for src in sources for obj in done[src]]

        self.compiler.compile = compile_parallel
        for ext in self.extensions:
            ext.extra_compile_args = COMMON_FLAGS + (omp[0] if omp else [])
            ext.extra_link_args = omp[1] if omp else []
            for src, (flags, macro) in isa.items():
                ext.define_macros.append((macro, "1"))  # dispatch.c: which tables exist
                ext.sources.append(src)
        print("cfbn: target %s, OpenMP %s, ISA files %s, %d build jobs"
              % (target_arch(), "on" if omp else "off", list(isa) or "none", build_jobs()))
        super().build_extensions()
        self.torch_ops_built = build_torch_ops(os.path.join(self.build_lib, TORCH_OPS))

    # The operator library is no Python extension, but travels as one: into
    # the wheel, and back into the source tree for in-place and editable builds.
    def copy_extensions_to_source(self):
        super().copy_extensions_to_source()
        if getattr(self, "torch_ops_built", False):
            self.copy_file(os.path.join(self.build_lib, TORCH_OPS), TORCH_OPS)

    def _get_output_mapping(self):
        yield from super()._get_output_mapping()
        if self.inplace and getattr(self, "torch_ops_built", False):
            yield os.path.join(self.build_lib, TORCH_OPS), TORCH_OPS

    def get_outputs(self):
        outputs = super().get_outputs()
        if not self.inplace and getattr(self, "torch_ops_built", False):
            outputs.append(os.path.join(self.build_lib, TORCH_OPS))
        return outputs


class BuildPy(build_py):
    """Ship csrc/bn_math.h inside the package (the CuPy kernels include it)."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "cfbn")
        # an editable build runs this with no package copied into build_lib
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
