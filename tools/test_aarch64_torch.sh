#!/usr/bin/env bash
# cfbn.torch's operator library in the cp311 aarch64 wheel, run under
# qemu-user: PyPI's aarch64 torch (tools/aarch64_torch.sh), its pure-Python
# dependencies and the wheel, installed with pip --target --platform into
# build/edge/aarch64-torch-site, run by Debian 12's python3.11
# (tools/make_arm64_sysroot.sh bookworm; numpy and pytest from its site).
# The wheels come from tools/build_wheels.sh with CFBN_AARCH64_TORCH_DIR set.
#   tools/check_torch_ops.py  the library's operators (torch.ops.cfbn.*), then
#       the Python operators (CFBN_TORCH_LIBRARY=0): the same bits, and both
#       against cfbn.reference, forward, backward and double backward
#   CFBN_AARCH64_TORCH_PYTEST=1: tests/test_torch_library.py's tests of the
#       library too (symbols and versions, argument checks, the operators
#       against the Python bridge in every layout and dtype, thread counts)
#
# Two things the emulation needs that a device does not:
# - PyPI's aarch64 torch is a CUDA build whose libraries name NVIDIA's
#   (libcudart, libcudnn, ...; nvidia-* wheels of gigabytes, some of the
#   pinned releases not on the index CI reaches).  tools/cuda_stand_ins.py
#   puts stand-ins on torch's RPATH (site/nvidia/cu13/lib) that only load:
#   torch sees no GPU, as on a board without one.  torch's own libraries,
#   CPU kernels and Python are the wheel's, unchanged.
# - qemu 7.2 passes the host's /proc/cpuinfo through, and PyTorch's cpuinfo
#   library dereferences a null pointer on an x86 one at `import torch`: the
#   root gets a /proc/cpuinfo of its own (qemu -L looks there first; every
#   other /proc path stays the host's) describing Cortex-A72 cores, the
#   -cpu model here.
# Environment: CFBN_AARCH64_TORCH_PYTEST, CFBN_EDGE_DIR.
set -euo pipefail
. "$(dirname "$0")/_lib.sh"
need qemu-aarch64 aarch64-linux-gnu-gcc aarch64-linux-gnu-readelf unzip

CPU=cortex-a72
ROOTFS=$(arm64_root bookworm)
SITE=$EDGE/aarch64-torch-site
RUNDIR=$EDGE/aarch64-torch-tests   # copy of tests/, no cfbn/ beside it

step "wheel (tools/build_wheels.sh), torch and the Debian 12 arm64 root"
bash "$ROOT/tools/make_arm64_sysroot.sh" bookworm
bash "$ROOT/tools/aarch64_torch.sh" >/dev/null
TORCH_WHEEL=$(one_file "$AARCH64_TORCH/torch-$TORCH_VERSION-cp311-cp311-*aarch64.whl")
WHEEL=$(wheel_for 3.11 aarch64)
# The listing is read whole before grep looks at it: unzip writes it a piece
# at a time, and `unzip | grep -q` under pipefail fails whenever grep's early
# exit meets unzip's next write (SIGPIPE).
listing=$(unzip -Z1 "$WHEEL")
grep -qx 'cfbn/torch/_ops\.so' <<<"$listing" || die "$(basename "$WHEEL") has no cfbn/torch/_ops.so"

step "pip install --target (aarch64, cp311): torch $TORCH_VERSION without its CUDA dependencies, its pure-Python ones, the cfbn wheel"
rm -rf "$SITE"
# shellcheck disable=SC2046
"$HOST_PYTHON" -m pip install -q --no-deps --target "$SITE" $(arm64_pip_target 3.11) "$TORCH_WHEEL" "$WHEEL"
# torch's Requires-Dist less the NVIDIA libraries, triton and cuda-bindings
# shellcheck disable=SC2046
"$HOST_PYTHON" -m pip install -q --target "$SITE" $(arm64_pip_target 3.11) \
    filelock "typing-extensions>=4.10.0" "sympy>=1.13.3" "networkx>=2.5.1" jinja2 "fsspec>=0.8.5"
du -sh "$SITE"

step "stand-ins for the NVIDIA libraries; an aarch64 /proc/cpuinfo in the root"
"$HOST_PYTHON" "$ROOT/tools/cuda_stand_ins.py" "$SITE/torch" "$ROOTFS" "$SITE/nvidia/cu13/lib"
# debootstrap leaves proc as a link to the host's /proc
[ ! -L "$ROOTFS/proc" ] || rm "$ROOTFS/proc"
mkdir -p "$ROOTFS/proc"
cpus=$(( $(cut -d- -f2 /sys/devices/system/cpu/possible) + 1 ))
for ((i = 0; i < cpus; i++)); do
    printf 'processor\t: %d\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 cpuid\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd08\nCPU revision\t: 3\n\n' "$i"
done >"$ROOTFS/proc/cpuinfo"
echo "$cpus Cortex-A72 entries in $ROOTFS/proc/cpuinfo"

py() {
    env -u PYTHONHOME PYTHONPATH="$SITE" qemu-aarch64 -cpu "$CPU" -L "$ROOTFS" "$ROOTFS/usr/bin/python3.11" "$@"
}
copy_tests "$RUNDIR"
cp "$ROOT/tools/check_torch_ops.py" "$RUNDIR/"
cd "$RUNDIR"

step "under qemu-aarch64 -cpu $CPU: the library's results, then the Python operators' (CFBN_TORCH_LIBRARY=0) against them and cfbn.reference"
# oneDNN's one line on the missing MIDR_EL1 sysfs entry (qemu has none) is left out
py check_torch_ops.py save "$RUNDIR/library.pt" 2>&1 | grep -v 'MIDR_EL1'
CFBN_TORCH_LIBRARY=0 py -W ignore::RuntimeWarning check_torch_ops.py compare "$RUNDIR/library.pt" 2>&1 | grep -v 'MIDR_EL1'

if [ -n "${CFBN_AARCH64_TORCH_PYTEST:-}" ]; then
    step "under qemu-aarch64 -cpu $CPU: tests/test_torch_library.py's tests of the library"
    run_suite aarch64-torch py -m pytest tests/test_torch_library.py -q -p no:cacheprovider \
        -k "the_library or bad_arguments or bridge_bits or thread_count_is_used"
fi
timings
