#!/usr/bin/env bash
# Builds ruda and runs its tests: under ASan+UBSan (leaks are failures),
# under TSan (a data race is a failure), a short libFuzzer run of the API
# against its shadow model (clang), a build with no CUDA headers at all
# (host backend only, static dependencies), then the normal build: its ABI
# against the last release (abidiff), its ctest summary, then the Python
# package's pytest run (tools/python.sh).
# GPU tests report "skipped" where no GPU is usable.
set -euo pipefail
cd "$(dirname "$0")/.."
# Without a toolkit, the CUDA headers and NVRTC come from NVIDIA's wheels
# (tools/deps.sh), so the cuda backend builds and runs its mock-driver tests;
# where PyPI cannot be reached the run goes on with the host backend alone.
# RUDA_CUDA_WHEELS=0: no download.
RUDA_CUDA_WHEELS="${RUDA_CUDA_WHEELS:-try}" tools/deps.sh
jobs="$(nproc)"
cmake -S . -B build-asan -DRUDA_WERROR=ON -DRUDA_ASAN=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-asan -j"$jobs" >/dev/null
echo "== tests under AddressSanitizer + UndefinedBehaviorSanitizer"
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure -j"$jobs" -E "^stress_" || {
  echo "sanitizer run failed"; exit 1; }
cmake -S . -B build-tsan -DRUDA_WERROR=ON -DRUDA_TSAN=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-tsan -j"$jobs" >/dev/null
echo "== tests under ThreadSanitizer"
TSAN_OPTIONS="halt_on_error=1" ctest --test-dir build-tsan --output-on-failure -j"$jobs" || {
  echo "thread sanitizer run failed"; exit 1; }
echo "== fuzzing the API for 30 s (tools/fuzz.sh)"
log="${TMPDIR:-/tmp}/ruda-fuzz.log"
set +e
tools/fuzz.sh 30 >"$log" 2>&1
frc=$?
set -e
tail -n 6 "$log"
if [ "$frc" -ne 0 ] && [ "$frc" -ne 77 ]; then echo "fuzzing found a violation (log: $log)"; exit 1; fi
echo "== host backend only: no CUDA headers, static dependencies"
# RUDA_CUDA_ROOT points nowhere, so neither a toolkit nor the wheels can be
# picked up; the dependency files then prove no toolkit header was read.
cmake -S . -B build-nocuda -DRUDA_WERROR=ON -DRUDA_WITH_CUDA=OFF -DRUDA_CUDA_ROOT=/nonexistent \
  -DRUDA_STATIC_DEPS=ON >/dev/null
cmake --build build-nocuda -j"$jobs" >/dev/null
if find build-nocuda -name '*.o.d' -exec cat {} + | tr ' ' '\n' | grep -E '(cuda|nvrtc|nccl|nvToolsExt)[^/]*\.h$' |
   grep -v '/include/ruda/'; then
  echo "the build without CUDA read a CUDA header (above)"; exit 1
fi
ctest --test-dir build-nocuda --output-on-failure -j"$jobs" >"${TMPDIR:-/tmp}/ruda-nocuda.log" 2>&1 || {
  cat "${TMPDIR:-/tmp}/ruda-nocuda.log"; echo "the build without CUDA failed its tests"; exit 1; }
grep -E "tests passed|tests failed" "${TMPDIR:-/tmp}/ruda-nocuda.log"
build-nocuda/examples/ruda_demo | grep "built without CUDA support" || {
  echo "the demo of the build without CUDA did not say the cuda backend is not built"; exit 1; }
cmake -S . -B build -DRUDA_WERROR=ON >/dev/null
cmake --build build -j"$jobs" >/dev/null
echo "== ABI against the last release (abidiff, tests/abi)"
# The built library against the series' baseline, then the check itself on
# planted changes (a struct that grows must fail it). Without abigail-tools
# both say so and the run goes on.
set +e
sh tests/abi/abidiff.sh build/libruda.so
arc=$?
set -e
if [ "$arc" -eq 77 ]; then
  echo "abidiff stage skipped"
elif [ "$arc" -ne 0 ]; then
  echo "the library breaks the ABI of its series (above)"; exit 1
else
  RUDA_ABI_JOBS="$jobs" sh tests/abi/abidiff_detects.sh || { echo "the ABI check missed a planted change (above)"; exit 1; }
fi
echo "== tests"
set +e
ctest --test-dir build --output-on-failure -j"$jobs"
crc=$?
# The Python package (python/): built and tested last, so the output ends
# with ctest's summary, then pytest's (a missing python3/pip is a skip).
tools/python.sh
prc=$?
[ "$crc" -eq 0 ] && [ "$prc" -eq 0 ]
