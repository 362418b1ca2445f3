#!/usr/bin/env bash
# Runs on the lent GPU machine (see /work/.library/device): every test
# binary and benchmark of a build made here with -DRUDA_STATIC_DEPS=ON and
# carried as build-gpu. Logs go to $OUT; a summary table is printed last.
#   tools/gpu_run.sh [MODE...]   modes tests|bench|all|comm|ab|serve|trace|blas|graphs, several run in
#   order into one summary (default all) (comm: the two-GPU collectives only;
#   ab: bench_gpu and bench_enqueue of build-gpu-base, a build of an earlier
#   commit, and build-gpu, alternated twice, to compare two trees in one run;
#   serve: bench_serve with pageable and page-locked request buffers and
#   with each request one graph replay, the PyTorch peer, and bench_gpu's
#   empty-launch sections beside them; blas: mlp_blas and mlp_lt (cuBLAS,
#   cuBLASLt with fused epilogues) checked on the GPU, bench_blas: cuBLAS and
#   cuBLASLt through ruda_call beside the raw loops, with pageable and
#   page-locked I/O, as graphs against raw CUDA graphs, page-locked with
#   every command handed to the worker (-s -I), and one traced T=1 run
#   ($OUT/trace_blas.json, device spans);
#   graphs: issue 30's figures in one go: bench_graph_patch on the device,
#   the README loop's default rows (1 and 4 in flight) beside the raw loop
#   and a raw graph, twice, with the automatic graphs' counters, and with
#   them off; -g and -p rows; T=64 traced with device spans alternated with
#   untraced, and trace_stalls.py; short T=64 runs for the start-up tails;
#   bench_gpu sections 2 and 5 at 8, 4 and 16 workers; python: issue 33, the wheel carried as .whl/
#   installed with no build, its pytest suite with torch and CuPy, and
#   bench/python_launch.py at 1/4/16/64 threads with the GIL released and
#   kept)
set -uo pipefail
cd "$(dirname "$0")/.."
modes=" ${*:-all} "
want() { [[ "$modes" == *" $1 "* ]]; }
B=build-gpu
OUT="${OUT:-/tmp/ruda-gpu-out}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$B/tests:$PWD/$B:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export RUDA_CACHE_DIR="/tmp/ruda-cache"
# Never use NVLink multicast on the shared host.
export NCCL_NVLS_ENABLE=0
summary="$OUT/summary.txt"
: >"$summary"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; date -u; } \
  >"$OUT/machine.txt" 2>&1

# Cases a GPU run may skip: the two-GPU ones on a machine with one GPU.
# Any other skip (a case, or a whole binary exiting 77) fails the run.
ngpus="$(nvidia-smi -L 2>/dev/null | wc -l)"
expected_skip() { # binary case
  [ "$ngpus" -lt 2 ] && [ "$1:$2" = "gpu_comm:two_gpus" ]
}
unexpected=0
failed=0

# At most 8 files come back from $OUT, so logs are grouped: tests.log, bench.log.
# Each test binary's skips (cmocka's "[  SKIPPED ] case" lines, or exit 77
# for the whole binary) are listed under its line of the summary.
run() { # name timeout cmd...
  local name="$1" t="$2"; shift 2
  local start=$SECONDS log="$OUT/tests.log" one
  case "$name" in bench*) log="$OUT/bench.log" ;; esac
  one="$(mktemp)"
  echo "==== $name: $*" >>"$log"
  timeout "$t" "$@" >"$one" 2>&1
  local rc=$?
  cat "$one" >>"$log"
  printf '%-28s rc=%-3s %4ss\n' "$name" "$rc" "$((SECONDS - start))" | tee -a "$summary"
  local bin="${name%%.*}" skips
  skips="$(sed -n 's/^\[  SKIPPED \] \([A-Za-z0-9_]*\)$/\1/p' "$one" | sort -u)"
  local whole="(all)"
  [[ "$name" == *.* ]] && whole="${name#*.}" # one case run alone
  [ "$rc" = 77 ] && skips="${skips:+$skips }$whole"
  for c in $skips; do
    if expected_skip "$bin" "$c"; then
      printf '  skipped %s:%s (expected: %s GPU)\n' "$bin" "$c" "$ngpus" | tee -a "$summary"
    else
      printf '  SKIPPED %s:%s (unexpected on a GPU run)\n' "$bin" "$c" | tee -a "$summary"
      unexpected=$((unexpected + 1))
    fi
  done
  [ "$rc" = 0 ] || [ "$rc" = 77 ] || failed=$((failed + 1))
  rm -f "$one"
}

if want tests || want all; then
  # A module built ahead of time, for gpu_kernels' cubin_image_runs: the
  # build's (made where nvcc was found at configure), else one made here.
  if [ -f "$B/tests/precompiled.cubin" ]; then
    export RUDA_TEST_CUBIN="$PWD/$B/tests/precompiled.cubin"
  elif command -v nvcc >/dev/null && nvcc -cubin -arch=sm_90 tests/gpu/precompiled.cu -o /tmp/ruda-precompiled.cubin \
      >>"$OUT/tests.log" 2>&1; then
    export RUDA_TEST_CUBIN=/tmp/ruda-precompiled.cubin
  fi
  run demo 60 "$B/examples/ruda_demo"
  run inference_server 60 "$B/examples/inference_server"
  run training_loop 60 "$B/examples/training_loop"
  run mlp_blas 60 "$B/examples/mlp_blas"
  run mlp_lt 60 "$B/examples/mlp_lt"
  for t in "$B"/tests/gpu_* "$B"/tests/unit_* "$B"/tests/integration_*; do
    [ -x "$t" ] && [ -f "$t" ] || continue
    case "$(basename "$t")" in
      # These test the no-driver paths: point the loader at nothing (as ctest does).
      gpu_fallback|gpu_staging_arena) run "$(basename "$t")" 240 env RUDA_CUDA_DRIVER=/nonexistent/libcuda.so.1 "$t" ;;
      # Its cases hold events pending through the mock driver's hooks.
      gpu_detach) run gpu_detach_mock 60 env RUDA_CUDA_DRIVER="$PWD/$B/tests/libruda_mockcuda.so" "$t" ;;
      # Its cases count the events each thread made (mock driver's hook).
      gpu_events) run gpu_events_mock 60 env RUDA_CUDA_DRIVER="$PWD/$B/tests/libruda_mockcuda.so" "$t" ;;
      # It dlopens the library it is given.
      integration_dlopen) run integration_dlopen 60 "$t" "$PWD/$B/libruda.so" ;;
      # A real fault poisons the process's context: one case per process.
      gpu_fault_blocking)
        for c in $(sed -n 's/^ *cmocka_unit_test(\([a-z0-9_]*\)),$/\1/p' tests/gpu/gpu_fault_blocking.c); do
          run "gpu_fault_blocking.$c" 60 "$t" "$c"
        done ;;
      # Every case but the one that needs NVRTC absent, which runs alone below.
      gpu_kernels)
        for c in $(sed -n 's/^ *cmocka_unit_test(\([a-z0-9_]*\)),$/\1/p' tests/gpu/gpu_kernels.c); do
          [ "$c" = nvrtc_missing_is_clear ] && continue
          run "gpu_kernels.$c" 240 "$t" "$c"
        done
        run gpu_kernels.nvrtc_missing_is_clear 60 env RUDA_NVRTC=/nonexistent/libnvrtc.so "$t" nvrtc_missing_is_clear ;;
      # Runs with the NVTX tool below.
      integration_nvtx) ;;
      *) run "$(basename "$t")" 240 "$t" ;;
    esac
  done
  run stress_fifo 120 "$B/tests/stress_fifo" -p 8 -s 8 -w 8 -n 1000000
  # NVTX without Nsight Systems: the tests' injection library counts the
  # ranges (integration_nvtx checks them; the examples print a summary).
  inj="$PWD/$B/tests/libruda_nvtx_inject.so"
  if [ -f "$inj" ]; then
    run integration_nvtx_tool 60 env NVTX_INJECTION64_PATH="$inj" "$B/tests/integration_nvtx"
    run nvtx_inference_server 60 env NVTX_INJECTION64_PATH="$inj" NVTX_INJECT_REPORT=1 "$B/examples/inference_server"
  fi
fi
if want bench || want all; then
  run bench_gpu 420 "$B/bench/bench_gpu" "$OUT/bench_gpu.csv"
  run bench_memory 120 "$B/bench/bench_memory"
  run bench_enqueue 120 "$B/bench/bench_enqueue"
  run bench_blas 400 "$B/bench/bench_blas"
fi
if want python; then
  # The wheel is built here (after tools/deps.sh, which builds ruda's
  # private jemalloc): python3.12 -m pip wheel --no-build-isolation
  # --no-deps -w dist ./python -C cmake.define.RUDA_STATIC_DEPS=ON,
  # auditwheel repair into .whl/, carried with the tree.
  # Installed beside the machine's own packages (its pytest, numpy, torch
  # and CuPy live with its python3, which a venv did not see there).
  site="$(mktemp -d)/site"
  run python_install 300 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
    .whl/ruda-*.whl
  # From the repository root the installed package is imported, not python/ruda.
  # A process loads one CUDA driver: the real one for the interop cases
  # first, then the whole suite, whose mock-driver cases load the mock
  # first (its interop cases then skip, saying so).
  run python_interop 300 env PYTHONPATH="$site" python3 -m pytest -q -rs -p no:cacheprovider python/tests/test_interop.py
  run python_tests 600 env PYTHONPATH="$site" python3 -m pytest -q -rs -p no:cacheprovider python/tests
  run bench_python_launch 600 env PYTHONPATH="$site" PYTHONUNBUFFERED=1 python3 bench/python_launch.py --threads 1,4,16,64 \
    --json "$OUT/python_launch.json"
  run bench_python_launch_keep 600 env PYTHONPATH="$site" PYTHONUNBUFFERED=1 python3 bench/python_launch.py \
    --threads 1,4,16,64 --launch-gil keep --json "$OUT/python_launch_keep.json"
fi
if want blas; then
  run mlp_blas 60 "$B/examples/mlp_blas"
  run mlp_lt 60 "$B/examples/mlp_lt"
  run bench_blas 400 "$B/bench/bench_blas"
  run bench_blas_staged 400 "$B/bench/bench_blas" -s
  run bench_blas_graphs 400 "$B/bench/bench_blas" -g
  run bench_blas_no_in_place 400 "$B/bench/bench_blas" -s -I
  # Where a one-thread request's time goes: worker and device spans.
  run bench_blas_trace 200 env RUDA_TRACE="$OUT/trace_blas.json" RUDA_TRACE_DEVICE=1 "$B/bench/bench_blas" \
    -s -t 1 -n 300
fi
if want serve; then
  run bench_serve 400 "$B/bench/bench_serve" -n 2048
  run bench_serve_staged 400 "$B/bench/bench_serve" -s -n 2048
  run bench_serve_graphs 400 "$B/bench/bench_serve" -g -n 2048
  run bench_serve_torch_shared 200 env PYTHONUNBUFFERED=1 python3 bench/peers/serve_torch.py -q
  run bench_serve_torch_depth4 200 env PYTHONUNBUFFERED=1 python3 bench/peers/serve_torch.py -q -d 4 --per-thread-weights
  run bench_gpu_launch 300 "$B/bench/bench_gpu" -q -s 1,2 "$OUT/bench_gpu_launch.csv"
fi
if want graphs; then
  # Issue 30's done-when in one go, each figure beside its baseline in the
  # same process. Patched replays beside a new capture + instantiate.
  run bench_graph_patch 120 env RUDA_BACKEND=cuda "$B/bench/bench_graph_patch" -n 2000
  run bench_graph_patch_k16 120 env RUDA_BACKEND=cuda "$B/bench/bench_graph_patch" -n 1000 -k 16
  # The README loop, default configuration, 1 and 4 in flight, beside the
  # raw loop and a raw graph per request (rates, p50, p99.9), twice; the
  # -b run prints the automatic graphs' counters (templates, replaced).
  run bench_serve_calls 300 "$B/bench/bench_serve" -v 1,3 -n 2048
  run bench_serve_calls_2 300 "$B/bench/bench_serve" -v 1,3 -n 2048
  run bench_serve_counters 300 "$B/bench/bench_serve" -b -v 1,3 -t 16,64 -n 8192
  # What the default automatic graphs give: the same rows with them off.
  run bench_serve_auto_off 300 env RUDA_AUTO_GRAPHS=0 "$B/bench/bench_serve" -v 1,3 -n 2048
  # Graph replays (a graph per slot) and one graph moved by patches.
  run bench_serve_graphs 300 "$B/bench/bench_serve" -g -v 1,3 -n 2048
  run bench_serve_patched 300 "$B/bench/bench_serve" -p -v 1,3 -n 2048
  # Tracing with device spans at T=64, 4 in flight, alternated with the
  # untraced run; the traced run's blocked driver calls.
  for round in 1 2; do
    run "bench_serve_untraced_t64_$round" 200 "$B/bench/bench_serve" -v 3 -t 64 -n 512
    run "bench_serve_traced_t64_$round" 200 env RUDA_TRACE="/tmp/ruda-trace-t64.json" RUDA_TRACE_DEVICE=1 \
      "$B/bench/bench_serve" -v 3 -t 64 -n 512
  done
  run trace_stalls_t64 60 python3 tools/trace_stalls.py /tmp/ruda-trace-t64.json
  # Start-up tails: short runs (512 requests a thread) at T=64, 4 in
  # flight, where templates are built while requests arrive.
  run bench_serve_startup_t64_1 200 "$B/bench/bench_serve" -v 3 -t 64 -n 512
  run bench_serve_startup_t64_2 200 "$B/bench/bench_serve" -v 3 -t 64 -n 512
  # Sustained launches, empty and with one buffer argument (sections 2 and
  # 5), at the default 8 workers and at 4 and 16.
  run bench_gpu_workers 500 "$B/bench/bench_gpu" -s 2,5 -w 8,4,16 "$OUT/bench_gpu_workers.csv"
fi
if want trace; then
  # RUDA_TRACE with device spans: the test, a serving trace to draw, and
  # what tracing costs (bench_serve alternated with and without it).
  run gpu_trace 60 "$B/tests/gpu_trace"
  run bench_trace_serve 120 env RUDA_TRACE="$OUT/trace_serve.json" RUDA_TRACE_DEVICE=1 "$B/bench/bench_serve" \
    -q -t 4 -n 64 -v 1
  for round in 1 2; do
    run "bench_serve_untraced_$round" 200 "$B/bench/bench_serve" -v 1 -t 1,4,16 -n 1024
    run "bench_serve_traced_$round" 200 env RUDA_TRACE="/tmp/ruda-trace-$round.json" "$B/bench/bench_serve" -v 1 \
      -t 1,4,16 -n 1024
    run "bench_serve_traced_device_$round" 200 env RUDA_TRACE="/tmp/ruda-trace-$round.json" RUDA_TRACE_DEVICE=1 \
      "$B/bench/bench_serve" -v 1 -t 1,4,16 -n 1024
  done
fi
if want ab; then
  for round in 1 2; do
    for b in build-gpu-base "$B"; do
      tag="$(basename "$b")"
      run "bench_gpu_${tag}_$round" 300 "$b/bench/bench_gpu" -s 1,2,5 "$OUT/bench_gpu_${tag}_$round.csv"
      run "bench_enqueue_${tag}_$round" 200 "$b/bench/bench_enqueue" -t 0.5 -r 3
      [ -x "$b/bench/bench_serve" ] && run "bench_serve_${tag}_$round" 200 "$b/bench/bench_serve" -v 1 -n 1024
    done
  done
fi
if want comm || { want all && [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; }; then
  run gpu_comm 120 "$B/tests/gpu_comm"
  run bench_comm 300 "$B/bench/bench_comm"
fi
echo "unexpected skips: $unexpected, failing runs: $failed" | tee -a "$summary"
echo "== summary"; cat "$summary"
[ "$unexpected" = 0 ] && [ "$failed" = 0 ]
