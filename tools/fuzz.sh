#!/usr/bin/env bash
# A libFuzzer campaign over the public API against its shadow model
# (tests/fuzz/fuzz_api.c), built with clang, ASan and UBSan.
#   tools/fuzz.sh [seconds]   (default 60; the corpus grows in build-fuzz/corpus)
#   FUZZ_PAR=N tools/fuzz.sh [seconds]   N jobs at once on that corpus (logs
#     build-fuzz/fuzz-*.log), then the inputs of all of them summed
# Prints libFuzzer's final stats; a violation stops it with the input saved.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
command -v clang >/dev/null || { echo "fuzz.sh: clang not found (Debian: apt-get install clang)"; exit 77; }
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DRUDA_ASAN=ON -DRUDA_FUZZ=ON -DRUDA_BUILD_BENCH=OFF \
  -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-fuzz -j"${FUZZ_JOBS:-$(nproc)}" --target fuzz_api_libfuzzer >/dev/null
mkdir -p build-fuzz/corpus
# -timeout: an input running this long is a hang (a deadlock), reported with
# the input; far above any input's time under ASan on a loaded machine.
if [ -n "${FUZZ_PAR:-}" ]; then
  rm -f build-fuzz/fuzz-*.log
  rc=0
  (cd build-fuzz && tests/fuzz_api_libfuzzer -jobs="$FUZZ_PAR" -workers="$FUZZ_PAR" -max_total_time="$secs" \
    -max_len=2048 -timeout="${FUZZ_INPUT_TIMEOUT:-120}" -print_final_stats=1 corpus) || rc=$?
  cat build-fuzz/fuzz-*.log | awk '/stat::number_of_executed_units/ {s += $2} END {print "inputs, all jobs:", s + 0}'
  grep -l "ERROR: \|SUMMARY: " build-fuzz/fuzz-*.log && rc=1
  exit $rc
fi
exec build-fuzz/tests/fuzz_api_libfuzzer -max_total_time="$secs" -max_len=2048 -timeout="${FUZZ_INPUT_TIMEOUT:-120}" \
  -print_final_stats=1 \
  build-fuzz/corpus
