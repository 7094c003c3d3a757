#!/usr/bin/env bash
# Builds what is missing (wheels, arm64 roots), then runs tools/test_aarch64.sh
# and tools/test_old_x86.sh side by side and prints their reports one after
# the other.  Under qemu each test process keeps about one core busy, so on a
# 2-core machine the suites (by default aarch64 cp39 NEON on Debian 11,
# aarch64 cp311 scalar, the aarch64 cp313 subset, x86-64 cp39 on Nehalem;
# CFBN_AARCH64_RUNS narrows the aarch64 ones, CFBN_NEON_SHARDS splits the
# NEON run into processes, CFBN_OLD_X86_SUBSET shortens the Nehalem one)
# finish in about the time of the longest instead of their sum.
set -euo pipefail
. "$(dirname "$0")/_lib.sh"

step "wheels and arm64 sysroot"
ensure_wheels
bash "$ROOT/tools/make_arm64_sysroot.sh" "${ARM64_SUITES[@]}"

step "tools/test_aarch64.sh | tools/test_old_x86.sh, side by side"
export CFBN_WHEELS_READY=1
bash "$ROOT/tools/test_aarch64.sh" >"$EDGE/test_aarch64.out" 2>&1 &
aarch64=$!
bash "$ROOT/tools/test_old_x86.sh" >"$EDGE/test_old_x86.out" 2>&1 &
old_x86=$!
failed=()
wait "$aarch64" || failed+=(tools/test_aarch64.sh)
wait "$old_x86" || failed+=(tools/test_old_x86.sh)
for name in test_aarch64 test_old_x86; do
    printf '\n===== tools/%s.sh\n' "$name"
    cat "$EDGE/$name.out"
done

timings
[ ${#failed[@]} -eq 0 ] || die "failed: ${failed[*]}"
