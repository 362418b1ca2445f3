#!/usr/bin/env bash
# Builds the Python package (python/) into a virtual environment and runs
# its pytest suite on the host backend (and the cuda backend against the
# mock driver, where the C build finds CUDA headers: a toolkit or the
# wheels in .deps/cuda); the output ends with pytest's summary.
# The package is built by pip (scikit-build-core) where scikit-build-core
# is installed or pip can fetch it; otherwise (offline: Debian 12 has no
# scikit-build-core package) by CMake alone, the extension left in
# python/ruda/ and imported with PYTHONPATH=python: nothing is skipped.
# Without python3 -m venv, pip, pytest or numpy (and no way to fetch them),
# says what to install and exits 0 (RUDA_PYTHON_SKIP_STATUS, when set: that
# code): the stage is skipped, not failed. A build or test failure fails.
# RUDA_PYTHON=0 skips it.
#   tools/python.sh            build, install, test
#   tools/python.sh --example  also run examples/asyncio_server.py
set -uo pipefail
cd "$(dirname "$0")/.."
skip() { echo "== python: skipped: $*"; exit "${RUDA_PYTHON_SKIP_STATUS:-0}"; }
[ "${RUDA_PYTHON:-1}" != 0 ] || skip "RUDA_PYTHON=0"
py="${PYTHON:-python3}"
command -v "$py" >/dev/null 2>&1 || skip "no $py (Debian: apt-get install python3-dev python3-venv)"
venv=build-py/venv
if [ ! -x "$venv/bin/python" ]; then
  # System site-packages: Debian's python3-numpy and python3-pytest serve.
  "$py" -m venv --system-site-packages "$venv" >/dev/null 2>&1 || {
    rm -rf "$venv"; skip "$py -m venv failed (Debian: apt-get install python3-venv)"; }
fi
vpy="$venv/bin/python"
"$vpy" -m pip --version >/dev/null 2>&1 || skip "no pip in the virtual environment (Debian: apt-get install python3-pip)"
need() { # module, pip name, Debian package
  "$vpy" -c "import $1" 2>/dev/null || "$vpy" -m pip install -q "$2" >/dev/null 2>&1 ||
    skip "$1 is not installed and pip could not fetch $2 (offline? Debian: apt-get install $3)"
}
[ "${1:-}" = --example ] || need pytest pytest python3-pytest
need numpy numpy python3-numpy
# The extension stages through ruda's private jemalloc (python/CMakeLists.txt).
if [ -z "${RUDA_JEMALLOC_SOURCE:-}" ] && [ ! -f .deps/jemalloc/lib/libjemalloc_pic.a ]; then
  tools/jemalloc.sh fetch || skip "ruda's private jemalloc could not be built (its sources did not download: offline?)"
fi
log="$PWD/build-py/build.log"
if "$vpy" -c "import scikit_build_core" 2>/dev/null ||
   "$vpy" -m pip install -q "scikit-build-core>=0.8" >/dev/null 2>&1; then
  echo "== python: building the package (pip install --no-build-isolation ./python; log: $log)"
  if ! "$vpy" -m pip install -q --no-build-isolation --force-reinstall --no-deps ./python >"$log" 2>&1; then
    tail -n 30 "$log"; echo "python: the package did not build (log: $log)"; exit 1
  fi
  pypath=""
else
  # Offline: the same CMake project, built without pip.
  echo "== python: scikit-build-core is not installed and pip could not fetch it (offline);"
  echo "   building with CMake alone (cmake -S python -B build-py/cmake; log: $log), PYTHONPATH=python"
  "$vpy" -m pip uninstall -q -y ruda >/dev/null 2>&1
  if ! { cmake -S python -B build-py/cmake -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$(cd "$venv/bin" && pwd)/python" &&
         cmake --build build-py/cmake -j"$(nproc)"; } >"$log" 2>&1; then
    tail -n 30 "$log"; echo "python: the package did not build (log: $log)"; exit 1
  fi
  pypath="$PWD/python"
fi
if [ "${1:-}" = --example ]; then
  PYTHONPATH="$pypath" RUDA_BACKEND="${RUDA_BACKEND:-auto}" "$vpy" examples/asyncio_server.py || exit 1
  exit 0
fi
echo "== python tests (pytest, host backend; the cuda backend on the mock driver)"
# From the repository root: the installed package is imported, not python/ruda
# (unless built without pip, above). -rs lists each skip's reason. A hang
# (a deadlock under the GIL) fails the stage instead of stalling CI.
out="$PWD/build-py/pytest.log"
PYTHONPATH="$pypath" timeout 1800 "$vpy" -m pytest -p no:cacheprovider -q -rs python/tests 2>&1 | tee "$out"
rc="${PIPESTATUS[0]}"
# One line for tools/test.sh's summary, from pytest's last line.
last="$(tail -n 1 "$out")"
n() { echo "$last" | grep -oE "[0-9]+ $1" | grep -oE '^[0-9]+' || echo 0; }
echo "counts: $(n passed) passed, $(($(n failed) + $(n error))) failed, $(n skipped) skipped"
exit "$rc"
