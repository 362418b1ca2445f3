#!/usr/bin/env bash
# What RUDA_TRACE costs on the host backend: bench_enqueue (one and two
# producers, launches without buffers) untraced and traced, alternated
# twice in one session so drift shows as the spread between rounds.
#   bench/trace_cost.sh BUILD_DIR [LOG_DIR]
# Writes trace_cost.log (every run's table) to LOG_DIR (default: a
# temporary folder, printed); the traces themselves are deleted.
set -euo pipefail
build="$1"
log_dir="${2:-$(mktemp -d)}"
mkdir -p "$log_dir"
log="$log_dir/trace_cost.log"
trace="$(mktemp /tmp/ruda-trace-cost-XXXXXX.json)"
trap 'rm -f "$trace"' EXIT
{
  echo "# bench/trace_cost.sh $build, $(date -u '+%F %T'), $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "# $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "# bench_enqueue -p 1,2 -m ruda-0buf -t 0.5 -r 3, off and traced, alternated twice"
} >"$log"
for round in 1 2; do
  for how in off traced; do
    echo "## round $round, $how" >>"$log"
    if [ "$how" = traced ]; then
      RUDA_TRACE="$trace" "$build/bench/bench_enqueue" -p 1,2 -m ruda-0buf -t 0.5 -r 3 >>"$log" 2>&1
      echo "# trace file: $(stat -c %s "$trace") bytes" >>"$log"
    else
      "$build/bench/bench_enqueue" -p 1,2 -m ruda-0buf -t 0.5 -r 3 >>"$log" 2>&1
    fi
  done
done
cat "$log"
echo "log: $log"
