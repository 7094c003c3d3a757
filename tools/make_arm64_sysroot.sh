#!/usr/bin/env bash
# Builds an arm64 Debian sysroot for cross builds and for running the aarch64
# CPython under qemu-user, without binfmt_misc, chroot or dpkg multiarch:
#   build/edge/arm64-root   bookworm minbase: python3.11, libpython3.11-dev, libgomp1
#   build/edge/arm64-xcfg   the target's sysconfigdata with include paths into the sysroot
#   numpy (pinned, see _lib.sh) and TEST_PACKAGES (pytest, hypothesis, ml_dtypes)
#   from PyPI's aarch64 wheels, in the sysroot's /usr/local/lib/python3.11/dist-packages
# Idempotent: a finished sysroot or site folder is kept (stamp files); a
# half-built one is redone.
# Needs root (debootstrap), debootstrap and qemu-user.
# Environment: DEBIAN_MIRROR (default http://deb.debian.org/debian), CFBN_EDGE_DIR.
set -euo pipefail
. "$(dirname "$0")/_lib.sh"
need debootstrap dpkg-deb qemu-aarch64 "$HOST_PYTHON"

MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
ROOT_STAMP=$ARM64_ROOT/.cfbn-sysroot
SITE_STAMP=$ARM64_SITE/.cfbn-site-numpy-$NUMPY_VERSION-$(IFS=-; echo "${TEST_PACKAGES[*]}")
SYSCONFIGDATA=_sysconfigdata__linux_aarch64-linux-gnu

build_root() {
    step "debootstrap arm64 minbase (download and unpack)"
    rm -rf "$ARM64_ROOT" "$ARM64_XCFG"
    debootstrap --arch=arm64 --foreign --variant=minbase \
        --include=python3,libpython3.11-dev,libgomp1 \
        bookworm "$ARM64_ROOT" "$MIRROR" >"$EDGE/debootstrap.log" 2>&1 \
        || { tail -20 "$EDGE/debootstrap.log"; die "debootstrap failed (log: $EDGE/debootstrap.log)"; }
    # --foreign unpacks only the 'required' set; the second stage would run
    # arm64 maintainer scripts.  Unpacking every downloaded package is enough
    # for python3.11, its headers and libgomp.
    local deb
    for deb in "$ARM64_ROOT"/var/cache/apt/archives/*.deb; do
        dpkg-deb --fsys-tarfile "$deb" | tar -C "$ARM64_ROOT" --keep-directory-symlink -xf -
    done
    rm -f "$ARM64_ROOT"/var/cache/apt/archives/*.deb
    [ -x "$ARM64_PYTHON" ] || die "no $ARM64_PYTHON after unpacking"
    [ -e "$ARM64_ROOT/usr/lib/aarch64-linux-gnu/libgomp.so.1" ] || die "libgomp1 missing from the sysroot"

    step "the target's sysconfigdata for the cross build"
    mkdir -p "$ARM64_XCFG"
    # Include paths point into the sysroot; CC and LDSHARED are already
    # aarch64-linux-gnu-gcc in Debian's build.
    sed -e "s#'/usr/include#'$ARM64_ROOT/usr/include#g" -e "s# -I/usr/include# -I$ARM64_ROOT/usr/include#g" \
        "$ARM64_ROOT/usr/lib/python3.11/$SYSCONFIGDATA.py" >"$ARM64_XCFG/$SYSCONFIGDATA.py"
    touch "$ROOT_STAMP"
}

build_site() {
    step "numpy $NUMPY_VERSION, ${TEST_PACKAGES[*]}: PyPI aarch64 wheels into $ARM64_SITE"
    rm -rf "$ARM64_SITE"
    mkdir -p "$ARM64_SITE"
    "$HOST_PYTHON" -m pip install -q --target "$ARM64_SITE" \
        "${ARM64_PIP_TARGET[@]}" "numpy==$NUMPY_VERSION" "${TEST_PACKAGES[@]}"

    step "check: the aarch64 CPython imports numpy under qemu, with no PYTHONPATH"
    env -u PYTHONPATH qemu-aarch64 -L "$ARM64_ROOT" "$ARM64_PYTHON" -c \
        'import platform, sys, numpy, pytest, hypothesis, ml_dtypes; print(platform.machine(), sys.version.split()[0], "numpy", numpy.__version__, "pytest", pytest.__version__, "hypothesis", hypothesis.__version__, "ml_dtypes", ml_dtypes.__version__)'
    touch "$SITE_STAMP"
}

if [ -e "$ROOT_STAMP" ] && [ -e "$SITE_STAMP" ]; then
    echo "arm64 sysroot already built: $ARM64_ROOT"
    exit 0
fi
mkdir -p "$EDGE"
[ -e "$ROOT_STAMP" ] || build_root
[ -e "$SITE_STAMP" ] || build_site
du -sh "$ARM64_ROOT"
timings
