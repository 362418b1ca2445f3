#!/usr/bin/env bash
# Builds ruda and runs its tests in stages: under ASan+UBSan (leaks are
# failures), under TSan (a data race is a failure), a short libFuzzer run
# of the API against its shadow model (clang), a build with no CUDA headers
# at all (host backend only, static dependencies), the normal build with
# its ctest run, its ABI against the series' release (abidiff), then the
# Python package's pytest run (tools/python.sh).
# GPU tests report "skipped" where no GPU is usable.
#
# A failing stage does not stop the run: every stage runs, and the run ends
# with a summary of each (passed, failed and skipped counts, time) and fails
# if one failed. Build output goes to a log per build tree under
# $RUDA_TEST_LOGS (default build-logs/), whose path is printed; a failing
# build shows its last lines. Each ctest stage lists its skipped tests'
# reasons, counted.
#
# RUDA_TEST_STAGES="normal python" runs only the stages named.
#
# Adding a stage is one line: `stage NAME [VAR=value...] command args...`
# (a shell function or a program; exit 0 passes, 77 skips the stage, any
# other code fails it). Inside, `suite DIR cmake-args... -- ctest-args...`
# configures and builds DIR, then runs its ctest.
set -uo pipefail
cd "$(dirname "$0")/.."
jobs="$(nproc)"
logs="${RUDA_TEST_LOGS:-build-logs}"
mkdir -p "$logs"
logs="$(cd "$logs" && pwd)"

# ---- building and testing one tree ----

# build DIR cmake-args...: configures and builds DIR, output in
# $logs/DIR.build.log; on failure prints its last 40 lines.
build() {
  local dir="$1" log="$logs/$1.build.log"
  shift
  echo "building $dir (log: $log)"
  if ! { cmake -S . -B "$dir" -DRUDA_WERROR=ON "$@" && cmake --build "$dir" -j"$jobs"; } >"$log" 2>&1; then
    echo "---- the last lines of $log:"
    tail -n 40 "$log"
    echo "the build of $dir failed (log: $log)"
    return 1
  fi
}

# ctest_in DIR ctest-args...: runs DIR's tests (--output-on-failure), then
# prints "counts: P passed, F failed, S skipped" and the skips' reasons.
ctest_in() {
  local dir="$1" out
  shift
  out="$logs/$dir.ctest.log"
  ctest --test-dir "$dir" --output-on-failure -j"$jobs" "$@" 2>&1 | tee "$out"
  local rc="${PIPESTATUS[0]}"
  local total failed skipped
  total=$(sed -n 's/.* tests failed out of \([0-9]*\).*/\1/p' "$out" | tail -n 1)
  failed=$(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of.*/\1/p' "$out" | tail -n 1)
  # ctest's list of tests that did not run: "  12 - name (Skipped)".
  awk '/^The following tests did not run:/ {on = 1; next}
       on && /\(Skipped\)$/ {print $3; next}
       on && !/^[[:space:]]+[0-9]+ - / {on = 0}' "$out" >"$out.skipped"
  skipped=$(wc -l <"$out.skipped")
  total="${total:-0}" failed="${failed:-0}"
  echo "counts: $((total - failed - skipped)) passed, $failed failed, $skipped skipped"
  if [ "$skipped" -gt 0 ]; then
    local last="$dir/Testing/Temporary/LastTest.log"
    echo "skipped, by reason (each case's output: $last):"
    # A case's reason: its "skipped: why" line (tests/common.h), else its
    # output's last line (the GPU tests' "no CUDA driver ..."), less the
    # binary's name in front.
    awk 'NR == FNR { skip[$1] = 1; next }
      /^[0-9]+\/[0-9]+ Test: / { name = $3; bin = name; sub(/\..*/, "", bin); said = ""; last = ""; next }
      !(name in skip) { next }
      /^<end of output>$/ { r = said != "" ? said : last; if (index(r, bin ": ") == 1) r = substr(r, length(bin) + 3)
                            why[name] = r; name = ""; next }
      /^skipped: / && said == "" { said = substr($0, 10) }
      /^\[  SKIPPED \]/ && said == "" { said = "cmocka skip" }
      NF { last = $0 }
      END { for (n in skip) { r = why[n]; if (r == "") r = "(no reason printed)"; c[r]++ }
            for (r in c) printf "  %4d  %s\n", c[r], r }' "$out.skipped" "$last" | sort -rn
  fi
  return "$rc"
}

# suite DIR cmake-args... [-- ctest-args...]: build, then ctest_in.
suite() {
  local dir="$1" cm=() ct=()
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do cm+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  ct=("$@")
  build "$dir" "${cm[@]}" || return 1
  ctest_in "$dir" "${ct[@]}"
}

# ---- stages ----

names=() results=() counts=() times=()
# stage NAME [VAR=value...] command args...: runs the command (in a
# subshell, with the variables set), its output shown and kept in
# $logs/NAME.log; records its result, its counts (the "counts:" lines it
# printed, summed) and its time.
stage() {
  local name="$1" t0=$SECONDS rc
  shift
  if [ -n "${RUDA_TEST_STAGES:-}" ] && [[ " $RUDA_TEST_STAGES " != *" $name "* ]]; then
    names+=("$name") results+=("skipped: not in RUDA_TEST_STAGES") counts+=("") times+=(0)
    return
  fi
  echo
  echo "== stage $name"
  ( while [ $# -gt 0 ] && [[ "$1" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; do export "${1?}"; shift; done
    "$@" ) 2>&1 | tee "$logs/$name.log"
  rc="${PIPESTATUS[0]}"
  local result=passed
  [ "$rc" -eq 77 ] && result="skipped: $(grep -v '^counts:' "$logs/$name.log" | tail -n 1)"
  [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ] && result="FAILED (exit $rc)"
  names+=("$name")
  results+=("$result")
  counts+=("$(awk '/^counts: / {p += $2; f += $4; s += $6; n++}
                  END {if (n) printf "%d passed, %d failed, %d skipped", p, f, s}' "$logs/$name.log")")
  times+=("$((SECONDS - t0))")
}

asan() {
  ASAN_OPTIONS=detect_leaks=1 suite build-asan -DRUDA_ASAN=ON -DCMAKE_BUILD_TYPE=Debug -- -E "^stress_"
}
tsan() {
  TSAN_OPTIONS="halt_on_error=1" suite build-tsan -DRUDA_TSAN=ON -DCMAKE_BUILD_TYPE=Debug
}
fuzz() {
  local log="$logs/fuzz.run.log" rc
  echo "fuzzing the API for 30 s (tools/fuzz.sh; log: $log)"
  tools/fuzz.sh 30 >"$log" 2>&1
  rc=$?
  tail -n 6 "$log"
  [ "$rc" -eq 77 ] && { echo "clang is missing (Debian: apt-get install clang)"; return 77; }
  [ "$rc" -eq 0 ] || echo "fuzzing found a violation (log: $log)"
  return "$rc"
}
nocuda() {
  # RUDA_CUDA_ROOT points nowhere, so neither a toolkit nor the wheels can
  # be picked up; the dependency files then prove no toolkit header was read.
  build build-nocuda -DRUDA_WITH_CUDA=OFF -DRUDA_CUDA_ROOT=/nonexistent -DRUDA_STATIC_DEPS=ON || return 1
  if find build-nocuda -name '*.o.d' -exec cat {} + | tr ' ' '\n' |
     grep -E '(cuda|nvrtc|nccl|nvToolsExt)[^/]*\.h$' | grep -v '/include/ruda/'; then
    echo "the build without CUDA read a CUDA header (above)"; return 1
  fi
  local rc=0
  ctest_in build-nocuda || rc=1
  build-nocuda/examples/ruda_demo | grep "built without CUDA support" || {
    echo "the demo of the build without CUDA did not say the cuda backend is not built"; rc=1; }
  return "$rc"
}
normal() { suite build; }
# The built library against the series' baseline, then the check itself on
# planted changes (a struct that grows must fail it). Without abigail-tools
# both say so (skipped).
abi() {
  sh tests/abi/abidiff.sh build/libruda.so
  local arc=$?
  [ "$arc" -eq 77 ] && return 77
  [ "$arc" -ne 0 ] && { echo "the library breaks the ABI of its series (above)"; return 1; }
  RUDA_ABI_JOBS="$jobs" sh tests/abi/abidiff_detects.sh || { echo "the ABI check missed a planted change (above)"; return 1; }
}
python_tests() { RUDA_PYTHON_SKIP_STATUS=77 tools/python.sh; }

# Without a toolkit, the CUDA headers and NVRTC come from NVIDIA's wheels
# (tools/deps.sh), so the cuda backend builds and runs its mock-driver tests;
# where PyPI cannot be reached the run goes on with the host backend alone.
# RUDA_CUDA_WHEELS=0: no download.
RUDA_CUDA_WHEELS="${RUDA_CUDA_WHEELS:-try}" tools/deps.sh || { echo "tools/deps.sh failed"; exit 1; }
echo "logs of this run: $logs"

stage asan asan
stage tsan tsan
stage fuzz fuzz
stage nocuda nocuda
stage normal normal
stage abi abi
stage python python_tests

echo
echo "== summary (logs: $logs)"
failed=0
for i in "${!names[@]}"; do
  printf '%-10s %-34s %6ss  %s\n' "${names[$i]}" "${counts[$i]:--}" "${times[$i]}" "${results[$i]}"
  case "${results[$i]}" in FAILED*) failed=$((failed + 1)) ;; esac
done
if [ "$failed" -gt 0 ]; then
  echo "$failed stage(s) failed"
  exit 1
fi
echo "every stage passed (or was skipped, as said)"
