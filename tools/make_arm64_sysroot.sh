#!/usr/bin/env bash
# Builds Debian arm64 roots for the aarch64 cross builds and for running the
# aarch64 CPython under qemu-user, without binfmt_misc, chroot or dpkg multiarch:
#   build/edge/arm64-root-bullseye  Debian 11 minbase: python3.9, libpython3.9-dev, libgomp1
#                                   (its libgomp, glibc 2.31, is what the aarch64 wheels vendor)
#   build/edge/arm64-root-bookworm  Debian 12: python3.11;  build/edge/arm64-root-trixie  Debian 13: python3.13
#   numpy (numpy_for in _lib.sh) and TEST_PACKAGES (pytest, hypothesis, ml_dtypes)
#   from PyPI's aarch64 wheels, in each root's /usr/local/lib/python3.X/dist-packages
# Usage: make_arm64_sysroot.sh [SUITE...]   (default: every suite in ARM64_SUITES)
# Idempotent: a finished root or site folder is kept (stamp files); a
# half-built one is redone.
# Needs root (debootstrap), debootstrap and qemu-user.
# Environment: DEBIAN_MIRROR (default http://deb.debian.org/debian), CFBN_EDGE_DIR.
set -euo pipefail
. "$(dirname "$0")/_lib.sh"
need debootstrap dpkg-deb qemu-aarch64 "$HOST_PYTHON"

MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

build_root() {
    local suite=$1 root=$2 ver=$3 deb
    step "debootstrap arm64 minbase $suite (download and unpack)"
    rm -rf "$root"
    debootstrap --arch=arm64 --foreign --variant=minbase \
        --include="python3,libpython$ver-dev,libgomp1" \
        "$suite" "$root" "$MIRROR" >"$EDGE/debootstrap-$suite.log" 2>&1 \
        || { tail -20 "$EDGE/debootstrap-$suite.log"; die "debootstrap failed (log: $EDGE/debootstrap-$suite.log)"; }
    # --foreign unpacks only the 'required' set; the second stage would run
    # arm64 maintainer scripts.  Unpacking every downloaded package is enough
    # for the CPython, its headers and libgomp.
    for deb in "$root"/var/cache/apt/archives/*.deb; do
        dpkg-deb --fsys-tarfile "$deb" | tar -C "$root" --keep-directory-symlink -xf -
    done
    rm -f "$root"/var/cache/apt/archives/*.deb
    [ -x "$root/usr/bin/python$ver" ] || die "no $root/usr/bin/python$ver after unpacking"
    [ -e "$root/usr/lib/aarch64-linux-gnu/libgomp.so.1" ] || die "libgomp1 missing from $root"
    no_dev_shm "$root"
    touch "$root/.cfbn-sysroot"
}

build_site() {
    local suite=$1 root=$2 ver=$3 site=$4 stamp=$5 np
    np=$(numpy_for "$ver")
    step "$suite: numpy $np, ${TEST_PACKAGES[*]}: PyPI aarch64 wheels for CPython $ver into $site"
    rm -rf "$site"
    mkdir -p "$site"
    # shellcheck disable=SC2046
    # The CPython of the same version runs pip, so that Requires-Python is
    # checked against the target version even where the index omits it.
    "$(host_python "$ver")" -m pip install -q --target "$site" $(arm64_pip_target "$ver") \
        "numpy==$np" "${TEST_PACKAGES[@]}"

    step "$suite: the aarch64 CPython $ver imports numpy under qemu, with no PYTHONPATH"
    env -u PYTHONPATH -u PYTHONHOME qemu-aarch64 -L "$root" "$root/usr/bin/python$ver" -c \
        'import platform, sys, numpy, pytest, hypothesis, ml_dtypes; print(platform.machine(), sys.version.split()[0], "numpy", numpy.__version__, "pytest", pytest.__version__, "hypothesis", hypothesis.__version__, "ml_dtypes", ml_dtypes.__version__)'
    touch "$stamp"
}

# The root's empty dev/shm hides the host's /dev/shm from the emulated
# process (qemu -L looks in the root first).  Debian 11's glibc checks with
# statfs that /dev/shm is a tmpfs, and otherwise takes the first tmpfs in
# /proc/mounts, which may be read-only: multiprocessing's locks then fail
# with EROFS.  Without it the host's tmpfs /dev/shm is used.
no_dev_shm() {
    [ ! -d "$1/dev/shm" ] || rmdir "$1/dev/shm"
}

mkdir -p "$EDGE"
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=("${ARM64_SUITES[@]}")
for suite in "${suites[@]}"; do
    ver=$(suite_python "$suite")
    root=$(arm64_root "$suite")
    site=$(arm64_site "$suite")
    site_stamp=$site/.cfbn-site-numpy-$(numpy_for "$ver")-$(IFS=-; echo "${TEST_PACKAGES[*]}")
    [ ! -e "$root/.cfbn-sysroot" ] || no_dev_shm "$root"
    if [ -e "$root/.cfbn-sysroot" ] && [ -e "$site_stamp" ]; then
        echo "arm64 root $suite already built: $root"
        continue
    fi
    [ -e "$root/.cfbn-sysroot" ] || build_root "$suite" "$root" "$ver"
    [ -e "$site_stamp" ] || build_site "$suite" "$root" "$ver" "$site" "$site_stamp"
    du -sh "$root"
done
timings
