#!/usr/bin/env bash
# Runs the synchronized batch-norm tests under a real MPI: tests/test_distributed.py
# (whose MPI cases launch tests/mpi/sync_check.py with mpirun -n 2 and -n 3), with
# a missing mpirun or mpi4py an error instead of a skip.  Installs nothing: the
# active Python needs cfbn, pytest, mpi4py and an MPI whose mpirun is next to the
# Python or on PATH, e.g.  pip install mpi4py mpich  (or Debian's openmpi-bin).
# Environment: PYTHON (default: python), PYTEST_ARGS.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
start=$(date +%s)

"$PYTHON" -c 'import mpi4py, cfbn' || {
    echo "run_mpi_tests.sh: this Python lacks mpi4py or cfbn (pip install mpi4py mpich)" >&2
    exit 1
}
launcher=$(dirname "$("$PYTHON" -c 'import sys; print(sys.executable)')")/mpirun
[ -x "$launcher" ] || launcher=$(command -v mpirun || command -v mpiexec || true)
[ -n "$launcher" ] || { echo "run_mpi_tests.sh: no mpirun found" >&2; exit 1; }
echo "MPI: $("$PYTHON" -c 'from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0].strip())') via $launcher"

# shellcheck disable=SC2086
CFBN_REQUIRE_MPI=1 "$PYTHON" -m pytest tests/test_distributed.py -q -p no:cacheprovider \
    ${PYTEST_ARGS:-}
echo "MPI tests took $(( $(date +%s) - start ))s"
