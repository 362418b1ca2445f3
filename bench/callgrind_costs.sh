#!/usr/bin/env bash
# Instructions per command on the host backend, counted by callgrind:
# ruda_launch (the caller's side) and ruda__execute (the worker's), with
# the bench's inline call (inline_launch: the kernel called directly) beside,
# no buffer argument and with one, and command allocation with the pool
# and with malloc (the -nopool modes). Counts, not times: they hold on any
# x86-64 machine that builds the same code.
#   bench/callgrind_costs.sh BUILD_DIR [LOG_DIR]
# One producer, 200000 launches per mode. Writes costs.log (the table and
# the callgrind_annotate lines it came from) to LOG_DIR (default: a
# temporary folder, printed).
set -euo pipefail
build="$1"
log_dir="${2:-$(mktemp -d)}"
n=200000
command -v valgrind >/dev/null || { echo "valgrind not found"; exit 1; }
mkdir -p "$log_dir"
log="$log_dir/costs.log"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
{
  echo "# bench/callgrind_costs.sh $build, $(date -u +%F), $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo '?')"
  valgrind --version
  echo "# one producer, $n launches per mode (bench_enqueue -p 1 -r 1 -n $n -c mono -q 1024)"
} >"$log"
# Instructions per call of function $2 in callgrind output $1: its most
# frequent call edge ("Ir => file:fn (Nx)"), inclusive cost over calls.
per_call() {
  callgrind_annotate --inclusive=yes "$1" 2>/dev/null |
    awk -v f=":$2 [(]" '$0 ~ f && /=>/ {
      ir = $1; gsub(",", "", ir); c = $NF; gsub("[(),x]", "", c)
      if (c + 0 > best) { best = c + 0; cost = ir + 0 }
    } END { if (best > 0) printf "%.0f (%d calls)", cost / best, best; else print "-" }' || true
}
printf '| mode | inline_launch | ruda_launch | ruda__execute | ruda__cmd_alloc | ruda__cmd_free | malloc | free |\n|:--|--:|--:|--:|--:|--:|--:|--:|\n' >"$work/table"
for mode in inline-0buf inline-1buf ruda-0buf ruda-1buf ruda-0buf-nopool; do
  out="$work/$mode.out"
  valgrind --tool=callgrind --callgrind-out-file="$out" "$build/bench/bench_enqueue" -p 1 -r 1 -n "$n" -c mono \
    -q 1024 -m "$mode" >>"$log" 2>"$work/$mode.err"
  { echo "## $mode"; callgrind_annotate --inclusive=yes "$out" 2>/dev/null |
    grep -E ':(inline_launch|ruda_launch|ruda__execute|ruda__cmd_alloc|ruda__cmd_free|malloc|free) ' || true; } >>"$log" || true
  row="| $mode"
  for f in inline_launch ruda_launch ruda__execute ruda__cmd_alloc ruda__cmd_free malloc free; do
    row="$row | $(per_call "$out" "$f")"
  done
  echo "$row |" >>"$work/table"
done
{ echo "# instructions per call (inclusive, over the function's most frequent call edge)"; cat "$work/table"; } | tee -a "$log"
echo "log: $log"
