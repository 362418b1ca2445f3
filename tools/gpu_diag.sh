#!/usr/bin/env bash
# Runs on the lent GPU machine: A/B of the scheduler's defaults, a build of
# an earlier commit (build-gpu-base, benches only) against build-gpu, in one
# lease. Logs under $OUT; see tools/gpu_run.sh for the full suite.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/ruda-gpu-out}"; mkdir -p "$OUT"
export RUDA_CACHE_DIR=/tmp/ruda-cache NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH="$PWD/build-gpu:$PWD/build-gpu/tests:${LD_LIBRARY_PATH:-}"
log="$OUT/diag.log"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; date -u; } >"$log" 2>&1
r() { # label cmd...
  local t0=$SECONDS; echo "==== $1: ${*:2}" >>"$log"; timeout 240 "${@:2}" >>"$log" 2>&1; echo "rc=$? $((SECONDS - t0))s" >>"$log"
  echo "$1 done $((SECONDS - t0))s"; }
# The README loop's table from build-gpu-base and build-gpu, alternated twice.
ab_serve() {
  for i in 1 2; do
    r base.serve$i build-gpu-base/bench/bench_serve -v 1,3 -n 2048
    r new.serve$i build-gpu/bench/bench_serve -v 1,3 -n 2048
  done
}
for m in ${DIAG:-serve}; do case $m in
probe)
  # Where a 1-in-flight request's time goes as threads grow: the client's
  # calls (-b), each thread kind's driver calls and their cost
  # (tools/cu_count.c), and the scheduler's knobs one at a time.
  r probe.tools sh -c 'for t in perf strace ltrace gdb valgrind; do printf "%s: %s\n" $t "$(command -v $t || echo none)"; done'
  r probe.cc cc -O2 -shared -fPIC -o /tmp/cu_count.so tools/cu_count.c -ldl -I/usr/local/cuda/include
  r probe.b build-gpu/bench/bench_serve -b -s -v 1 -t 1,4,16 -n 2048
  for t in 1 4 16; do
    r probe.count$t env RUDA_CUDA_DRIVER=/tmp/cu_count.so build-gpu/bench/bench_serve -s -v 1 -t $t -n 2048
  done
  r probe.count4-pageable env RUDA_CUDA_DRIVER=/tmp/cu_count.so build-gpu/bench/bench_serve -v 1 -t 4 -n 2048
  r probe.spin0 env RUDA_SPIN_US=0 build-gpu/bench/bench_serve -s -v 1 -t 1,4,16 -n 2048
  r probe.w4 build-gpu/bench/bench_serve -s -w 4 -v 1 -t 1,4,16 -n 2048
  r probe.w16 build-gpu/bench/bench_serve -s -w 16 -v 1 -t 1,4,16 -n 2048
  r probe.I build-gpu/bench/bench_serve -s -I -v 1 -t 1,4,16 -n 2048
  if command -v strace >/dev/null; then
    r probe.strace strace -f -c -o "$OUT/strace4.txt" build-gpu/bench/bench_serve -s -v 1 -t 4 -n 1024
  fi
  if command -v perf >/dev/null; then
    r probe.perf perf record -g -o /tmp/perf.data build-gpu/bench/bench_serve -s -v 1 -t 4 -n 4096
    perf report -i /tmp/perf.data --no-children --sort comm,dso,sym --stdio 2>/dev/null | head -150 > "$OUT/perf4.txt"
  fi ;;
waits)
  # One request in flight from many threads: two builds alternated (the
  # worker's retiring between batches), then the spin slots' count, and
  # each thread kind's driver calls per request (tools/cu_count.c).
  ab_serve
  for n in 8 16 64; do
    r new.slots$n env RUDA_SPIN_SLOTS=$n build-gpu/bench/bench_serve -v 1,3 -t 4,16,64 -n 2048
  done
  r probe.cc cc -O2 -shared -fPIC -o /tmp/cu_count.so tools/cu_count.c -ldl -I/usr/local/cuda/include
  for t in 1 4 16; do
    r new.count$t env RUDA_CUDA_DRIVER=/tmp/cu_count.so build-gpu/bench/bench_serve -v 1 -t $t -n 2048
  done ;;
cache)
  # The staging block cache and the lazy retire against build-gpu-base,
  # alternated, then page-locked, graphs, and where a request's client time
  # goes.
  ab_serve
  r new.serve-s build-gpu/bench/bench_serve -s -v 1,3 -n 2048
  r new.serve-g build-gpu/bench/bench_serve -g -v 1,3 -n 2048
  r new.b build-gpu/bench/bench_serve -b -v 1 -t 1,4 -n 2048 ;;
tracing)
  # What RUDA_TRACE costs at load (4 in flight, T=64), host spans only and
  # with device spans, alternated with untraced runs; each trace read by
  # tools/trace_stalls.py; one traced T=64 file comes back.
  for i in 1 2; do
    r untraced$i build-gpu/bench/bench_serve -v 3 -t 64 -n 1024
    r trace_host$i env RUDA_TRACE=/tmp/trace_host.json build-gpu/bench/bench_serve -v 3 -t 64 -n 1024
    r trace_dev$i env RUDA_TRACE=/tmp/trace_dev.json RUDA_TRACE_DEVICE=1 build-gpu/bench/bench_serve -v 3 -t 64 -n 1024
  done
  r trace_dev.stalls python3 tools/trace_stalls.py /tmp/trace_dev.json
  r trace_dev16 env RUDA_TRACE=/tmp/trace_dev16.json RUDA_TRACE_DEVICE=1 build-gpu/bench/bench_serve -v 1,3 -t 16 -n 1024
  r untraced16 build-gpu/bench/bench_serve -v 1,3 -t 16 -n 1024
  xz -T8 -6 -c /tmp/trace_dev.json > "$OUT/trace_dev64.json.xz" ;;
tails)
  # The README loop's table twice, the tails of long runs at T=16 and 64
  # (with the staging arena's first chunk large enough that it never grows:
  # is growth what stalls?), graphs, and tracing at load with its stalls.
  for i in 1 2; do r serve$i build-gpu/bench/bench_serve -v 1,3 -n 2048; done
  r serve-g build-gpu/bench/bench_serve -g -v 1,3 -n 2048
  r long build-gpu/bench/bench_serve -v 1,3 -t 16,64 -n 8192
  r long-chunk256 env RUDA_STAGING_CHUNK=256M build-gpu/bench/bench_serve -v 1,3 -t 16,64 -n 8192
  for i in 1 2; do
    r untraced$i build-gpu/bench/bench_serve -v 3 -t 64 -n 2048
    r trace_dev$i env RUDA_TRACE=/tmp/trace_dev.json RUDA_TRACE_DEVICE=1 build-gpu/bench/bench_serve -v 3 -t 64 -n 2048
  done
  r trace_dev.stalls python3 tools/trace_stalls.py /tmp/trace_dev.json
  xz -T8 -6 -c /tmp/trace_dev.json > "$OUT/trace_dev64.json.xz" ;;
growth)
  # Which call a slow T=16 run waits in, and what staging held, with the
  # default chunk and with one large enough never to grow.
  for i in 1 2; do
    r b16-$i build-gpu/bench/bench_serve -b -v 1,3 -t 16,64 -n 8192
    r b16-chunk256-$i env RUDA_STAGING_CHUNK=256M build-gpu/bench/bench_serve -b -v 1,3 -t 16,64 -n 8192
  done ;;
fuzz)
  # A libFuzzer campaign on this machine's CPUs (issue 28): the target
  # built elsewhere with clang (tools/fuzz.sh's flags and
  # -DRUDA_STATIC_DEPS=ON into build-fuzz-gpu) and carried; one job per CPU
  # on one shared corpus, FUZZ_SECS each. Prints the summed inputs.
  F=build-fuzz-gpu/tests/fuzz_api_libfuzzer; n=$(nproc); d=/tmp/fuzz; rm -rf $d; mkdir -p $d/corpus
  [ -d fuzz-seed ] && cp fuzz-seed/* $d/corpus/ 2>/dev/null
  (cd $d && timeout $(( ${FUZZ_SECS:-540} + 40 )) "$OLDPWD/$F" -jobs=$n -workers=$n -max_total_time=${FUZZ_SECS:-540} \
    -max_len=2048 -timeout=120 -print_final_stats=1 corpus >launcher.log 2>&1; echo "launcher rc=$?" >>launcher.log)
  { cat $d/launcher.log | tail -5
    grep -h "stat::number_of_executed_units" $d/fuzz-*.log | awk '{s+=$2} END {print "inputs, all jobs:", s}'
    grep -h "DONE\|ERROR\|SUMMARY\|deadly\|crash-\|timeout-" $d/fuzz-*.log | head -40; } >"$OUT/fuzz-summary.txt" 2>&1
  tar -C $d -cJf "$OUT/fuzz-logs.tar.xz" launcher.log $(cd $d && ls fuzz-*.log) corpus $(cd $d && ls crash-* timeout-* oom-* 2>/dev/null)
  cat "$OUT/fuzz-summary.txt" ;;
recheck)
  # After the shape-cache fix: the slow-mode processes again, 8 workers
  # against 16 alternated (README loop, library calls, launches).
  for i in 1 2 3; do r recheck.b$i build-gpu/bench/bench_serve -b -v 1,3 -t 16,64 -n 8192; done
  for i in 1 2; do
    r recheck.serve$i build-gpu/bench/bench_serve -v 1,3 -n 2048
    r recheck.serve-w16.$i build-gpu/bench/bench_serve -w 16 -v 1,3 -n 2048
  done
  r recheck.blas build-gpu/bench/bench_blas -n 1000
  r recheck.blas-w16 build-gpu/bench/bench_blas -w 16 -n 1000
  r recheck.blas-s build-gpu/bench/bench_blas -s -n 1000
  r recheck.blas-s-w16 build-gpu/bench/bench_blas -s -w 16 -n 1000
  r recheck.gpu build-gpu/bench/bench_gpu -q -s 2,5 -w 8,16 "$OUT/recheck_gpu.csv" ;;
workers)
  # Library calls and the README loop at the default 8 workers and at 16
  # (a CUstream per client at T=16), the raw loops receiving each request.
  r workers.blas build-gpu/bench/bench_blas -n 1000
  r workers.blas-w16 build-gpu/bench/bench_blas -w 16 -n 1000
  r workers.blas-s build-gpu/bench/bench_blas -s -n 1000
  r workers.blas-s-w16 build-gpu/bench/bench_blas -s -w 16 -n 1000
  r workers.blas-P build-gpu/bench/bench_blas -P -n 1000
  r workers.serve build-gpu/bench/bench_serve -v 1,3 -n 2048
  r workers.serve-w16 build-gpu/bench/bench_serve -w 16 -v 1,3 -n 2048 ;;
slow)
  # The slow mode of T=16 with 1 in flight: the finish spread and the
  # automatic-graph counters of several long processes, then the driver
  # calls (cuGraphInstantiate among them) of one.
  for i in 1 2 3; do r slow.b$i build-gpu/bench/bench_serve -b -v 1,3 -t 16,64 -n 8192; done
  r slow.cc cc -O2 -shared -fPIC -o /tmp/cu_count.so tools/cu_count.c -ldl -I/usr/local/cuda/include
  r slow.count env RUDA_CUDA_DRIVER=/tmp/cu_count.so build-gpu/bench/bench_serve -v 1 -t 16 -n 8192 ;;
launch)
  # The C library's own launch rate beside Python's, in one lease.
  site="$(mktemp -d)/site"
  r launch.install python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/ruda-*.whl
  r launch.c build-gpu/bench/bench_gpu -s 2 -w 8 "$OUT/launch_c.csv"
  r launch.py env PYTHONPATH="$site" PYTHONUNBUFFERED=1 python3 bench/python_launch.py --threads 1,4,16,64 \
    --json "$OUT/launch_py.json"
  r launch.c2 build-gpu/bench/bench_gpu -s 2 -w 8 "$OUT/launch_c2.csv" ;;
serve)
  r base.serve build-gpu-base/bench/bench_serve -v 1,3 -n 2048
  r new.serve build-gpu/bench/bench_serve -v 1,3 -n 2048
  r new.serve-I build-gpu/bench/bench_serve -I -v 1,3 -n 2048
  r new.serve-noauto env RUDA_AUTO_GRAPHS=0 build-gpu/bench/bench_serve -v 1,3 -n 2048
  r base.serve-g build-gpu-base/bench/bench_serve -g -v 1,3 -n 2048
  r new.serve-g build-gpu/bench/bench_serve -g -v 1,3 -n 2048
  r new.serve-s build-gpu/bench/bench_serve -s -v 1,3 -n 2048
  r new.serve.b build-gpu/bench/bench_serve -b -v 1 -t 1,4,16 -n 2048 ;;
gpu)
  r base.gpu build-gpu-base/bench/bench_gpu -q -s 2,5 "$OUT/base_gpu.csv"
  r new.gpu build-gpu/bench/bench_gpu -q -s 2,5 "$OUT/new_gpu.csv" ;;
blas)
  r base.blas build-gpu-base/bench/bench_blas -n 1000
  r new.blas build-gpu/bench/bench_blas -n 1000
  r new.blas.s build-gpu/bench/bench_blas -s -n 1000 ;;
trace)
  r new.untraced build-gpu/bench/bench_serve -v 3 -t 64 -n 512
  r new.trace_host env RUDA_TRACE=/tmp/trace_host.json build-gpu/bench/bench_serve -v 3 -t 64 -n 512
  r new.trace_host.stalls python3 tools/trace_stalls.py /tmp/trace_host.json
  r new.trace env RUDA_TRACE=/tmp/trace_dev.json RUDA_TRACE_DEVICE=1 build-gpu/bench/bench_serve -v 3 -t 64 -n 512
  r new.trace.stalls python3 tools/trace_stalls.py /tmp/trace_dev.json
  xz -T4 -3 -c /tmp/trace_host.json > "$OUT/trace_host.json.xz"
  r base.untraced build-gpu-base/bench/bench_serve -v 3 -t 64 -n 512 ;;
patch)
  # Patched replays beside the driver's floor (a raw graph's setters and
  # cuGraphExecUpdate), k = 3 and 16, twice.
  for i in 1 2; do
    r patch$i env RUDA_BACKEND=cuda build-gpu/bench/bench_graph_patch -n 2000
    r patch$i.k16 env RUDA_BACKEND=cuda build-gpu/bench/bench_graph_patch -n 1000 -k 16
  done ;;
conn)
  # Why more workers lose the README loop at T=16: the device's hardware
  # queues (CUDA_DEVICE_MAX_CONNECTIONS, 8 by default), in place, or the
  # automatic graphs.
  for w in 8 16; do
    r conn.w$w.c32 env CUDA_DEVICE_MAX_CONNECTIONS=32 build-gpu/bench/bench_serve -v 1 -t 16 -w $w -n 4096
    r conn.w$w build-gpu/bench/bench_serve -v 1 -t 16 -w $w -n 4096
    r conn.w$w.I build-gpu/bench/bench_serve -I -v 1 -t 16 -w $w -n 4096
    r conn.w$w.noauto env RUDA_AUTO_GRAPHS=0 build-gpu/bench/bench_serve -v 1 -t 16 -w $w -n 4096
  done
  r conn.blas.w8.c32 env CUDA_DEVICE_MAX_CONNECTIONS=32 build-gpu/bench/bench_blas -s -t 16 -w 8 -n 1000
  r conn.blas.w16.c32 env CUDA_DEVICE_MAX_CONNECTIONS=32 build-gpu/bench/bench_blas -s -t 16 -w 16 -n 1000 ;;
pg)
  # Pageable I/O beside the raw loop on the same pageable memory; how
  # evenly threads are served with 8 and 16 workers at T=16.
  r pg.blas build-gpu/bench/bench_blas -t 1,4,16 -n 1000
  r pg.blas.w16 build-gpu/bench/bench_blas -t 1,4,16 -w 16 -n 1000
  r pg.fair.w8 build-gpu/bench/bench_serve -b -v 1 -t 4,16 -w 8 -n 4096
  r pg.fair.w16 build-gpu/bench/bench_serve -b -v 1 -t 4,16 -w 16 -n 4096 ;;
held)
  # Requests issued in place held for their wait point (one graph each):
  # the README loop's rows twice, counters, 16 workers; bench_blas; the
  # sustained launch sections.
  r held.serve1 build-gpu/bench/bench_serve -v 1,3 -n 2048
  r held.serve2 build-gpu/bench/bench_serve -v 1,3 -n 2048
  r held.b build-gpu/bench/bench_serve -b -v 1 -t 1,4,16 -n 2048
  r held.serve.w16 build-gpu/bench/bench_serve -v 1,3 -t 4,16,64 -w 16 -n 2048
  r held.blas.s build-gpu/bench/bench_blas -s -n 1000
  r held.blas build-gpu/bench/bench_blas -n 1000
  r held.blas.w16 build-gpu/bench/bench_blas -s -t 16 -w 16 -n 1000
  r held.gpu build-gpu/bench/bench_gpu -q -s 2,5 "$OUT/held_gpu.csv" ;;
held2)
  # 8 and 16 workers alternated, twice: the README loop, bench_blas -s,
  # sustained launches.
  for i in 1 2; do
    for w in 8 16; do
      r held2.serve.w$w.$i build-gpu/bench/bench_serve -v 1,3 -w $w -n 2048
      r held2.blas.w$w.$i build-gpu/bench/bench_blas -s -w $w -n 1000
    done
  done
  r held2.gpu.w8 build-gpu/bench/bench_gpu -q -s 2,5 -w 8,16 "$OUT/held2_gpu.csv" ;;
ab2)
  # Held runs A/B: build-gpu-base (before) and build-gpu alternated twice,
  # README loop and bench_blas -s at the default workers; then the patch
  # floor with the captured-graph setters.
  for i in 1 2; do
    r base.serve$i build-gpu-base/bench/bench_serve -v 1,3 -n 2048
    r new.serve$i build-gpu/bench/bench_serve -v 1,3 -n 2048
  done
  r base.blas build-gpu-base/bench/bench_blas -s -n 1000
  r new.blas build-gpu/bench/bench_blas -s -n 1000
  r base.gpu build-gpu-base/bench/bench_gpu -q -s 2,5 "$OUT/base_gpu.csv"
  r new.gpu build-gpu/bench/bench_gpu -q -s 2,5 "$OUT/new_gpu.csv"
  r patch env RUDA_BACKEND=cuda build-gpu/bench/bench_graph_patch -n 2000
  r patch.k16 env RUDA_BACKEND=cuda build-gpu/bench/bench_graph_patch -n 1000 -k 16 ;;
ab3)
  # Held runs only beside peers: build-gpu-base and build-gpu alternated
  # twice, the README loop at 1, 4, 16 and 64 threads; counters.
  for i in 1 2; do
    r base.serve$i build-gpu-base/bench/bench_serve -v 1,3 -n 2048
    r new.serve$i build-gpu/bench/bench_serve -v 1,3 -n 2048
  done
  r new.b build-gpu/bench/bench_serve -b -v 1 -t 1,4,16 -n 2048 ;;
ab4)
  # Writes in held runs: build-gpu-base (before holding) and build-gpu
  # alternated twice, the README loop; counters; the graph tests.
  for i in 1 2; do
    r base.serve$i build-gpu-base/bench/bench_serve -v 1,3 -n 2048
    r new.serve$i build-gpu/bench/bench_serve -v 1,3 -n 2048
  done
  r new.b build-gpu/bench/bench_serve -b -v 1 -t 1,4,16 -n 2048
  r new.blas build-gpu/bench/bench_blas -n 1000
  r gpu_graph build-gpu/tests/gpu_graph ;;
abg)
  # Graph replays (-g, -p) before and after held runs, alternated twice.
  for i in 1 2; do
    r base.g$i build-gpu-base/bench/bench_serve -g -v 1 -n 2048
    r new.g$i build-gpu/bench/bench_serve -g -v 1 -n 2048
    r base.p$i build-gpu-base/bench/bench_serve -p -v 1 -n 2048
    r new.p$i build-gpu/bench/bench_serve -p -v 1 -n 2048
  done ;;
startup)
  # Start-up tails at T=64, 4 in flight (512 requests a thread), three
  # times, beside the base build; a traced run read by trace_stalls.py;
  # the README rows once.
  for i in 1 2 3; do
    r base.t64.$i build-gpu-base/bench/bench_serve -v 3 -t 64 -n 512
    r new.t64.$i build-gpu/bench/bench_serve -v 3 -t 64 -n 512
  done
  r new.trace env RUDA_TRACE=/tmp/trace_su.json RUDA_TRACE_DEVICE=1 build-gpu/bench/bench_serve -v 3 -t 64 -n 512
  r new.trace.stalls python3 tools/trace_stalls.py /tmp/trace_su.json
  r new.serve build-gpu/bench/bench_serve -v 1,3 -n 2048 ;;
t64)
  # 4 in flight at T=64 (no request in place): base and new alternated
  # three times, 2048 requests a thread.
  for i in 1 2 3; do
    r base.t64.$i build-gpu-base/bench/bench_serve -v 3 -t 16,64 -n 2048
    r new.t64.$i build-gpu/bench/bench_serve -v 3 -t 16,64 -n 2048
  done ;;
tails-ab)
  # Tails with 1 and 4 in flight at T=16 and 64, base and new alternated
  # twice, 2048 requests a thread.
  for i in 1 2; do
    r base.tails.$i build-gpu-base/bench/bench_serve -v 1,3 -t 16,64 -n 2048
    r new.tails.$i build-gpu/bench/bench_serve -v 1,3 -t 16,64 -n 2048
  done ;;
lanes)
  # A CUstream per stream id (RUDA_LANES=8) against one per worker (the
  # default), the same build, alternated twice: the README loop,
  # bench_blas page-locked and pageable, sustained launches.
  for i in 1 2; do
    r one.serve$i env RUDA_LANES=1 build-gpu/bench/bench_serve -v 1,3 -n 2048
    r lanes.serve$i env RUDA_LANES=8 build-gpu/bench/bench_serve -v 1,3 -n 2048
    r one.blas$i env RUDA_LANES=1 build-gpu/bench/bench_blas -s -n 1000
    r lanes.blas$i env RUDA_LANES=8 build-gpu/bench/bench_blas -s -n 1000
  done
  r lanes.blas.pg env RUDA_LANES=8 build-gpu/bench/bench_blas -n 1000
  r one.gpu env RUDA_LANES=1 build-gpu/bench/bench_gpu -q -s 2,5 "$OUT/one_gpu.csv"
  r lanes.gpu env RUDA_LANES=8 build-gpu/bench/bench_gpu -q -s 2,5 "$OUT/lanes_gpu.csv" ;;
lanes2)
  # Where lanes' 4-in-flight tails come from: lanes 8, 2 and 1 at T=16
  # and 64, without automatic graphs, a traced run read by trace_stalls.py;
  # sustained launches with 2 lanes.
  r l8.v3 env RUDA_LANES=8 build-gpu/bench/bench_serve -v 3 -t 16,64 -n 2048
  r l1.v3 env RUDA_LANES=1 build-gpu/bench/bench_serve -v 3 -t 16,64 -n 2048
  r l2.v13 env RUDA_LANES=2 build-gpu/bench/bench_serve -v 1,3 -t 16,64 -n 2048
  r l8.v3.noauto env RUDA_LANES=8 RUDA_AUTO_GRAPHS=0 build-gpu/bench/bench_serve -v 3 -t 16,64 -n 2048
  r l8.v3.c32 env RUDA_LANES=8 CUDA_DEVICE_MAX_CONNECTIONS=32 build-gpu/bench/bench_serve -v 3 -t 16,64 -n 2048
  r l8.v3.stats env RUDA_LANES=8 RUDA_WORKER_STATS=1 build-gpu/bench/bench_serve -v 3 -t 16 -n 2048
  r l8.trace env RUDA_LANES=8 RUDA_TRACE=/tmp/trace_l8.json RUDA_TRACE_DEVICE=1 build-gpu/bench/bench_serve -v 3 -t 16 -n 2048
  r l8.trace.stalls python3 tools/trace_stalls.py /tmp/trace_l8.json
  r l2.gpu env RUDA_LANES=2 build-gpu/bench/bench_gpu -q -s 2 "$OUT/l2_gpu.csv" ;;
lanes3)
  # lanes2 in short: counters of 8 lanes and 1 at T=16, 4 in flight; 8
  # lanes without automatic graphs; a traced run read by trace_stalls.py.
  r l8.b env RUDA_LANES=8 build-gpu/bench/bench_serve -b -v 3 -t 16 -n 2048
  r l1.b env RUDA_LANES=1 build-gpu/bench/bench_serve -b -v 3 -t 16 -n 2048
  r l8.noauto env RUDA_LANES=8 RUDA_AUTO_GRAPHS=0 build-gpu/bench/bench_serve -v 3 -t 16 -n 2048
  r l8.trace env RUDA_LANES=8 RUDA_TRACE=/tmp/trace_l8.json RUDA_TRACE_DEVICE=1 build-gpu/bench/bench_serve -v 3 -t 16 -n 1024
  r l8.trace.stalls python3 tools/trace_stalls.py /tmp/trace_l8.json ;;
stall)
  # When 4-in-flight requests are slow (-b's per-tenth counts and the five
  # slowest): 1 lane and 8, without automatic graphs, graph replays, a
  # long run at T=16, and 8 lanes with more hardware queues.
  r s1.b build-gpu/bench/bench_serve -b -v 3 -t 16,64 -n 2048
  r s8.b env RUDA_LANES=8 build-gpu/bench/bench_serve -b -v 3 -t 16,64 -n 2048
  r s8.noauto env RUDA_LANES=8 RUDA_AUTO_GRAPHS=0 build-gpu/bench/bench_serve -b -v 3 -t 16,64 -n 2048
  r s8.c32 env RUDA_LANES=8 CUDA_DEVICE_MAX_CONNECTIONS=32 build-gpu/bench/bench_serve -b -v 3 -t 16 -n 2048
  r s1.g env build-gpu/bench/bench_serve -b -g -v 3 -t 16,64 -n 2048
  r s8.long env RUDA_LANES=8 build-gpu/bench/bench_serve -b -v 3 -t 16 -n 16384
  r s1.long build-gpu/bench/bench_serve -b -v 3 -t 16 -n 16384 ;;
stall2)
  # Whether a stalled worker was blocked in a driver call, asleep or
  # preempted (RUDA_WORKER_STATS' longest command, longest sleep, CPU time
  # of slow commands, context switches); the same tails without clients
  # issuing in place, without spinning, and with a worker per client.
  r t.stats env RUDA_WORKER_STATS=1 build-gpu/bench/bench_serve -b -v 3 -t 16,64 -n 2048
  r t.I build-gpu/bench/bench_serve -b -I -v 3 -t 16,64 -n 2048
  r t.spin0 env RUDA_SPIN_US=0 build-gpu/bench/bench_serve -b -v 3 -t 16,64 -n 2048
  r t.w16 build-gpu/bench/bench_serve -b -w 16 -v 3 -t 16 -n 2048 ;;
stall3)
  # Which call a worker's slow read blocks in: each driver call's longest
  # (tools/cu_count.c), pageable and page-locked I/O (-s: the read lands
  # in the caller's staging block, no block taken on the worker).
  r probe.cc cc -O2 -shared -fPIC -o /tmp/cu_count.so tools/cu_count.c -ldl -I/usr/local/cuda/include
  r c.count env RUDA_CUDA_DRIVER=/tmp/cu_count.so RUDA_WORKER_STATS=1 build-gpu/bench/bench_serve -b -v 3 -t 16 -n 2048
  r c.count-s env RUDA_CUDA_DRIVER=/tmp/cu_count.so RUDA_WORKER_STATS=1 build-gpu/bench/bench_serve -s -b -v 3 -t 16 -n 2048
  r c.s build-gpu/bench/bench_serve -s -b -v 3 -t 16,64 -n 2048 ;;
stall4)
  # The tails once events are made off the workers: driver calls by
  # thread (no cuEventCreate on ruda-w), 1 and 8 lanes, graph replays, a
  # long run.
  r probe.cc cc -O2 -shared -fPIC -o /tmp/cu_count.so tools/cu_count.c -ldl -I/usr/local/cuda/include
  r e.count env RUDA_CUDA_DRIVER=/tmp/cu_count.so RUDA_WORKER_STATS=1 build-gpu/bench/bench_serve -b -v 3 -t 16 -n 2048
  r e1.b build-gpu/bench/bench_serve -b -v 1,3 -t 16,64 -n 2048
  r e8.b env RUDA_LANES=8 build-gpu/bench/bench_serve -b -v 1,3 -t 16,64 -n 2048
  r e1.g build-gpu/bench/bench_serve -b -g -v 1,3 -t 16,64 -n 2048
  r e1.long build-gpu/bench/bench_serve -b -v 3 -t 16,64 -n 8192 ;;
lanes4)
  # The default lane count once events are made off the workers: 1, 2, 4
  # and 8 lanes on the README loop, bench_blas page-locked and pageable,
  # sustained launches; then what tracing with device spans costs at T=64,
  # 4 in flight.
  for l in 1 2 4 8; do
    r l$l.serve env RUDA_LANES=$l build-gpu/bench/bench_serve -v 1,3 -n 2048
    r l$l.blas-s env RUDA_LANES=$l build-gpu/bench/bench_blas -s -n 1000
    r l$l.blas env RUDA_LANES=$l build-gpu/bench/bench_blas -n 1000
    r l$l.gpu env RUDA_LANES=$l build-gpu/bench/bench_gpu -q -s 2,5 "$OUT/l${l}_gpu.csv"
  done
  r untraced build-gpu/bench/bench_serve -v 3 -t 64 -n 1024
  r trace_dev env RUDA_TRACE=/tmp/trace_dev.json RUDA_TRACE_DEVICE=1 build-gpu/bench/bench_serve -v 3 -t 64 -n 1024
  r trace_dev.stalls python3 tools/trace_stalls.py /tmp/trace_dev.json
  r untraced2 build-gpu/bench/bench_serve -v 3 -t 64 -n 1024 ;;
libauto)
  # Two lanes a worker once a library is registered (the default): bench_blas
  # against RUDA_LANES=1, alternated; the README loop and launches (no library:
  # one lane used, the second made) against RUDA_LANES=1; graphs; and a trace
  # of the README loop at T=4, 1 in flight.
  for i in 1 2; do
    r l1.blas-s$i env RUDA_LANES=1 build-gpu/bench/bench_blas -s -n 1000
    r auto.blas-s$i build-gpu/bench/bench_blas -s -n 1000
    r l1.blas$i env RUDA_LANES=1 build-gpu/bench/bench_blas -n 1000
    r auto.blas$i build-gpu/bench/bench_blas -n 1000
    r auto.blas-g$i build-gpu/bench/bench_blas -g -n 1000
  done
  r auto.blas-sI build-gpu/bench/bench_blas -s -I -n 1000
  for i in 1 2; do
    r l1.serve$i env RUDA_LANES=1 build-gpu/bench/bench_serve -v 1,3 -n 2048
    r auto.serve$i build-gpu/bench/bench_serve -v 1,3 -n 2048
    r auto.serve-g$i build-gpu/bench/bench_serve -g -v 1,3 -n 2048
    r l1.gpu$i env RUDA_LANES=1 build-gpu/bench/bench_gpu -q -R 3 -s 2,5 "$OUT/l1_gpu$i.csv"
    r auto.gpu$i build-gpu/bench/bench_gpu -q -R 3 -s 2,5 "$OUT/auto_gpu$i.csv"
  done
  r trace4 env RUDA_TRACE=/tmp/trace4.json RUDA_TRACE_DEVICE=1 build-gpu/bench/bench_serve -v 1 -t 4 -n 2048
  r trace4.stalls python3 tools/trace_stalls.py /tmp/trace4.json
  cp /tmp/trace4.json "$OUT/" 2>/dev/null; xz -9 "$OUT/trace4.json" 2>/dev/null ;;
graphs_ab)
  # Automatic replays' node updates (held patches, a template per stream,
  # staging blocks by lane) against build-gpu-base/bench/bench_serve built
  # at dbc8ecd (statically linked: carry that one file beside
  # build-gpu-pack and copy it into the unpacked tree), alternated twice.
  for i in 1 2; do
    r base.serve$i build-gpu-base/bench/bench_serve -v 1,3 -n 2048
    r new.serve$i build-gpu/bench/bench_serve -v 1,3 -n 2048
    r base.serve-g$i build-gpu-base/bench/bench_serve -g -v 1,3 -n 2048
    r new.serve-g$i build-gpu/bench/bench_serve -g -v 1,3 -n 2048
  done ;;
final)
  # The defaults' final table: call-by-call, page-locked, graph, patched rows.
  r final.serve build-gpu/bench/bench_serve -v 1,3 -n 2048
  r final.serve-s build-gpu/bench/bench_serve -s -v 1,3 -n 2048
  r final.serve-g build-gpu/bench/bench_serve -g -v 1,3 -n 2048
  r final.serve-p build-gpu/bench/bench_serve -p -v 1,3 -n 2048
  r final.patch env RUDA_BACKEND=cuda build-gpu/bench/bench_graph_patch -n 2000
  r final.patch-k16 env RUDA_BACKEND=cuda build-gpu/bench/bench_graph_patch -n 1000 -k 16
  r final.gpu build-gpu/bench/bench_gpu -q -s 2,5 "$OUT/final_gpu.csv"
  r final.untraced build-gpu/bench/bench_serve -v 3 -t 64 -n 512
  r final.trace_host env RUDA_TRACE=/tmp/trace_host.json build-gpu/bench/bench_serve -v 3 -t 64 -n 512
  r final.trace_host.stalls python3 tools/trace_stalls.py /tmp/trace_host.json
  r final.trace env RUDA_TRACE=/tmp/trace_dev.json RUDA_TRACE_DEVICE=1 build-gpu/bench/bench_serve -v 3 -t 64 -n 512
  r final.trace.stalls python3 tools/trace_stalls.py /tmp/trace_dev.json ;;
esac; done
echo "== diag log"; grep -E "^====|^ +[0-9]+ \||rc=" "$log" | head -200
