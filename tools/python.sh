#!/usr/bin/env bash
# Builds the Python package (python/) into a virtual environment and runs
# its pytest suite on the host backend; the last line is pytest's summary.
# Without python3 -m venv, pip, pytest or numpy (and no way to fetch them),
# says so and exits 0: the stage is skipped, not failed. A build or test
# failure fails. RUDA_PYTHON=0 skips it.
#   tools/python.sh            build, install, test
#   tools/python.sh --example  also run examples/asyncio_server.py
set -uo pipefail
cd "$(dirname "$0")/.."
skip() { echo "== python: skipped: $*"; exit 0; }
[ "${RUDA_PYTHON:-1}" != 0 ] || skip "RUDA_PYTHON=0"
py="${PYTHON:-python3}"
command -v "$py" >/dev/null 2>&1 || skip "no $py"
venv=build-py/venv
if [ ! -x "$venv/bin/python" ]; then
  # System site-packages: Debian's python3-numpy and python3-pytest serve.
  "$py" -m venv --system-site-packages "$venv" >/dev/null 2>&1 || { rm -rf "$venv"; skip "$py -m venv failed (Debian: python3-venv)"; }
fi
vpy="$venv/bin/python"
"$vpy" -m pip --version >/dev/null 2>&1 || skip "no pip in the virtual environment"
need() { # module, pip name
  "$vpy" -c "import $1" 2>/dev/null || "$vpy" -m pip install -q "$2" >/dev/null 2>&1 ||
    skip "$1 is not installed and pip could not fetch $2 (offline?)"
}
[ "${1:-}" = --example ] || need pytest pytest
need numpy numpy
need scikit_build_core "scikit-build-core>=0.8"
echo "== python: building the package (pip install --no-build-isolation ./python)"
log="${TMPDIR:-/tmp}/ruda-pip.log"
if ! "$vpy" -m pip install -q --no-build-isolation --force-reinstall --no-deps ./python >"$log" 2>&1; then
  tail -n 30 "$log"; echo "python: the package did not build (log: $log)"; exit 1
fi
if [ "${1:-}" = --example ]; then
  RUDA_BACKEND="${RUDA_BACKEND:-auto}" "$vpy" examples/asyncio_server.py || exit 1
  exit 0
fi
echo "== python tests (pytest, host backend)"
# From the repository root: the installed package is imported, not python/ruda.
# A hang (a deadlock under the GIL) fails the stage instead of stalling CI.
exec timeout 900 "$vpy" -m pytest -p no:cacheprovider -q python/tests
