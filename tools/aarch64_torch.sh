#!/usr/bin/env bash
# PyPI's PyTorch for aarch64, for the aarch64 wheels' operator library:
#   build/edge/aarch64-torch/torch-<v>-cp311-cp311-manylinux_2_28_aarch64.whl  (pip download, the wheel alone)
#   build/edge/aarch64-torch/torch/  what the build reads of it: include/, lib/libtorch_cpu.so, version.py
# Prints that torch/ folder last: CFBN_AARCH64_TORCH_DIR for tools/build_wheels.sh.
# The operator library takes only the stable-ABI headers and libtorch_cpu's
# soname and C symbols from it, the same in every torch 2.10+ wheel of any
# Python; the cp311 one is also what tools/test_aarch64_torch.sh runs.
# Idempotent (stamp file).  Environment: CFBN_TORCH_VERSION, CFBN_EDGE_DIR.
set -euo pipefail
. "$(dirname "$0")/_lib.sh"
need "$HOST_PYTHON" unzip

stamp=$AARCH64_TORCH/.cfbn-torch-$TORCH_VERSION
if [ ! -e "$stamp" ]; then
    rm -rf "$AARCH64_TORCH"
    mkdir -p "$AARCH64_TORCH"
    t0=$(date +%s)
    # shellcheck disable=SC2046
    "$HOST_PYTHON" -m pip download -q --no-deps $(arm64_pip_target 3.11) -d "$AARCH64_TORCH" "torch==$TORCH_VERSION" \
        >"$AARCH64_TORCH/pip.log" 2>&1 || { tail -20 "$AARCH64_TORCH/pip.log"; die "pip download torch==$TORCH_VERSION (aarch64) failed"; }
    t1=$(date +%s)
    whl=$(one_file "$AARCH64_TORCH/torch-$TORCH_VERSION-cp311-cp311-*aarch64.whl")
    unzip -q "$whl" 'torch/include/*' torch/lib/libtorch_cpu.so torch/version.py -d "$AARCH64_TORCH"
    echo "$(basename "$whl"): $(( $(stat -c %s "$whl") / 1048576 )) MiB downloaded in $((t1 - t0)) s;" \
        "headers, libtorch_cpu.so and version.py unpacked in $(( $(date +%s) - t1 )) s"
    touch "$stamp"
fi
echo "$AARCH64_TORCH/torch"
