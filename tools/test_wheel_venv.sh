#!/usr/bin/env bash
# Installs each repaired x86-64 wheel (CPython 3.9-3.13) into an empty venv of
# the host's CPython of its version (pip brings numpy, its one dependency, and
# nothing else) and runs `python -m cfbn` from a folder outside the
# repository: nothing may depend on the build tree, and OpenMP must come from
# the libgomp vendored in the wheel (Debian 11's).
set -euo pipefail
. "$(dirname "$0")/_lib.sh"
need "$HOST_PYTHON"

step "wheels"
ensure_wheels
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
unset PYTHONPATH CFBN_FORCE_ISA

for ver in "${PY_VERSIONS[@]}"; do
VENV=$EDGE/venv-wheel-$ver
WHL=$(wheel_for "$ver" x86_64)

step "cp$ver: empty venv, pip install $(basename "$WHL")"
rm -rf "$VENV"
"$(host_python "$ver")" -m venv "$VENV"
"$VENV/bin/pip" install -q "$WHL"
"$VENV/bin/pip" list --format=freeze --exclude pip --exclude setuptools | tr '\n' ' '; echo
extra=$("$VENV/bin/pip" list --format=freeze --exclude pip --exclude setuptools | grep -v -E '^(cfbn|numpy)==' || true)
[ -z "$extra" ] || die "the venv holds more than cfbn and numpy: $extra"

cd "$WORK"
step "cp$ver: python -m cfbn from $WORK"
"$VENV/bin/python" -m cfbn >"$EDGE/selfcheck-x86_64-$ver.txt" 2>&1 || { cat "$EDGE/selfcheck-x86_64-$ver.txt"; die "python -m cfbn failed: cp$ver"; }
tail -3 "$EDGE/selfcheck-x86_64-$ver.txt"

step "cp$ver: the installed package and its vendored libgomp are what is loaded"
"$VENV/bin/python" - "$VENV" "$ROOT" <<'PY'
import sys
import cfbn
venv, root = sys.argv[1], sys.argv[2]
assert cfbn.__file__.startswith(venv + "/"), cfbn.__file__
with open("/proc/self/maps") as f:
    libs = sorted({line.split()[-1] for line in f if ".so" in line})
gomp = [lib for lib in libs if "libgomp" in lib]
assert gomp and all("/cfbn.libs/" in lib for lib in gomp), gomp
assert not [lib for lib in libs if lib.startswith(root + "/") and not lib.startswith(venv + "/")], libs
print("cfbn:", cfbn.__file__)
print("libgomp:", *gomp)
PY

cd "$ROOT"
done

timings
