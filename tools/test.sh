#!/usr/bin/env bash
# Builds ruda and runs its tests: under ASan+UBSan (leaks are failures),
# under TSan (a data race is a failure), then the normal build, whose ctest
# summary ends the output.
# GPU tests report "skipped" where no GPU is usable.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/deps.sh
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
cmake -S . -B build -DRUDA_WERROR=ON >/dev/null
cmake --build build -j"$jobs" >/dev/null
echo "== tests"
exec ctest --test-dir build --output-on-failure -j"$jobs"
