#!/usr/bin/env python3
"""serve_torch.py - bench/bench_serve.c's inference-server loop in PyTorch.

    python3 bench/peers/serve_torch.py [-t 1,4,16,64] [-n requests] [-d depth] [--per-thread-weights] [-q]

T Python client threads, each with a torch.cuda.Stream of its own. One
request: copy a 64 KiB input (128 x 128 float32, page-locked) to the GPU
(non_blocking), y = x @ W, bias + ReLU, softmax over each row, copy the
first 128 floats (512 B) into a page-locked output tensor (non_blocking)
and stream.synchronize(). With -d 4, four requests in flight per thread:
one event per request, wait the oldest. Weights (W 128 x 128, b 128) are
shared by all threads unless --per-thread-weights.

Prints requests/s and p50/p99/p99.9 latency (us) per T; the first
request of each thread and every 64th are checked against a CPU
reference (float64, tolerance 1e-3 relative). Exits 0 with a note when
torch or CUDA is missing; 1 on a mismatch.
"""
import argparse
import datetime
import sys
import threading
import time

ROWS = COLS = 128
NIN = 16
WARMUP = 8
CHECK_EVERY = 64


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-t", default="1,4,16,64", help="client thread counts")
    ap.add_argument("-n", type=int, default=0, help="timed requests per thread (default 2000, quick 200)")
    ap.add_argument("-d", type=int, default=1, choices=(1, 4), help="requests in flight per thread")
    ap.add_argument("--per-thread-weights", action="store_true")
    ap.add_argument("-q", action="store_true", help="quick")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("serve_torch: skipped: torch is not installed")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 matmul, as the C kernel
    if not torch.cuda.is_available():
        print("serve_torch: skipped: no CUDA device")
        return 0

    threads_list = [int(t) for t in args.t.split(",") if t]
    n = args.n or (200 if args.q else 2000)
    dev = torch.device("cuda", 0)
    gen = torch.Generator().manual_seed(42)
    inputs = torch.rand(NIN, ROWS, COLS, generator=gen) * 2 - 1
    W = (torch.rand(COLS, COLS, generator=gen) * 2 - 1) * 0.25
    b = (torch.rand(COLS, generator=gen) * 2 - 1) * 0.5
    ref = torch.softmax(torch.relu(inputs[:, 0, :].double() @ W.double() + b.double()), dim=1)
    pinned_inputs = [inputs[i].contiguous().pin_memory() for i in range(NIN)]
    shared_w, shared_b = W.to(dev), b.to(dev)
    torch.cuda.synchronize()
    mismatches = [0]
    checks = [0]
    lock = threading.Lock()

    print(f"serve_torch: machine {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M:%S %Z}, {n} timed requests per thread, "
          f"{args.d} in flight, weights {'per thread' if args.per_thread_weights else 'shared'}")

    def check(tid, req, out):
        r = ref[(tid * 7 + req) % NIN]
        got = out.double()
        ok = bool(((got - r).abs() <= 1e-3 * r.abs() + 1e-12).all())
        with lock:
            checks[0] += 1
            if not ok:
                mismatches[0] += 1
                if mismatches[0] <= 10:
                    print(f"serve_torch: MISMATCH thread {tid} request {req}", file=sys.stderr)

    errors = []

    def client(tid, depth, barrier, lat, done):
        try:
            serve(tid, depth, barrier, lat, done)
        except BaseException as e:  # never leave the others at the barrier
            errors.append(f"thread {tid}: {e!r}")
            barrier.abort()

    def serve(tid, depth, barrier, lat, done):
        torch.cuda.set_device(dev)
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            if args.per_thread_weights:
                w, bb = W.to(dev, non_blocking=False), b.to(dev, non_blocking=False)
            else:
                w, bb = shared_w, shared_b
            outs = [torch.empty(COLS, dtype=torch.float32).pin_memory() for _ in range(depth)]
            events = [torch.cuda.Event() for _ in range(depth)]
            start = [0] * depth
            stream.synchronize()
            for phase in (0, 1):
                first, count = (WARMUP, n) if phase else (0, WARMUP)
                if phase:
                    barrier.wait()
                for i in range(count + depth):
                    if i >= depth:
                        o = first + i - depth
                        s = o % depth
                        if depth == 1:
                            stream.synchronize()
                        else:
                            events[s].synchronize()
                        t = time.perf_counter_ns()
                        if phase:
                            lat[o - WARMUP] = t - start[s]
                        if o == 0 or (phase and (o - WARMUP) % CHECK_EVERY == 0):
                            check(tid, o, outs[s])
                    if i < count:
                        r = first + i
                        s = r % depth
                        start[s] = time.perf_counter_ns()
                        x = pinned_inputs[(tid * 7 + r) % NIN].to(dev, non_blocking=True)
                        y = torch.softmax(torch.relu(x @ w + bb), dim=1)
                        outs[s].copy_(y[0], non_blocking=True)
                        if depth > 1:
                            events[s].record(stream)
            done[tid] = time.perf_counter_ns()

    def pct(v, p):
        return v[int(p * (len(v) - 1))] / 1e3

    print(f"   {'T':>3} | {'req/s':>10} {'p50':>9} {'p99':>9} {'p99.9':>9}   (latency in us)")
    for T in threads_list:
        barrier = threading.Barrier(T + 1)
        lats = [[0] * n for _ in range(T)]
        done = [0] * T
        th = [threading.Thread(target=client, args=(i, args.d, barrier, lats[i], done)) for i in range(T)]
        for t in th:
            t.start()
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            pass
        t0 = time.perf_counter_ns()
        for t in th:
            t.join()
        if errors:
            print("serve_torch: " + "; ".join(errors[:3]), file=sys.stderr)
            return 1
        wall = (max(done) - t0) / 1e9
        allv = sorted(v for l in lats for v in l)
        print(f"   {T:>3} | {T * n / wall:>10.0f} {pct(allv, 0.5):>9.1f} {pct(allv, 0.99):>9.1f} "
              f"{pct(allv, 0.999):>9.1f}", flush=True)
    print(f"checked {checks[0]} results against the CPU reference (tolerance 1e-3 relative): "
          f"{mismatches[0]} mismatches")
    return 1 if mismatches[0] else 0


if __name__ == "__main__":
    sys.exit(main())
