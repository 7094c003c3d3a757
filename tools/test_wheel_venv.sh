#!/usr/bin/env bash
# Installs the repaired x86-64 wheel into an empty venv (pip brings numpy, its
# one dependency, and nothing else) and runs `python -m cfbn` from a folder
# outside the repository: nothing may depend on the build tree, and OpenMP
# must come from the libgomp vendored in the wheel.
set -euo pipefail
. "$(dirname "$0")/_lib.sh"
need "$HOST_PYTHON"

VENV=$EDGE/venv-wheel

step "wheel"
ensure_wheels
WHL=$(one_file "$ROOT/wheelhouse/cfbn-*manylinux*_x86_64.whl")
echo "$WHL"

step "empty venv, pip install the wheel"
rm -rf "$VENV"
"$HOST_PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q "$WHL"
"$VENV/bin/pip" list --format=freeze --exclude pip --exclude setuptools
extra=$("$VENV/bin/pip" list --format=freeze --exclude pip --exclude setuptools | grep -v -E '^(cfbn|numpy)==' || true)
[ -z "$extra" ] || die "the venv holds more than cfbn and numpy: $extra"

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
unset PYTHONPATH CFBN_FORCE_ISA

step "python -m cfbn from $WORK"
"$VENV/bin/python" -m cfbn

step "the installed package and its vendored libgomp are what is loaded"
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

timings
