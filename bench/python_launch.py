"""Launch cost and throughput from Python: ruda beside CuPy and PyTorch.

Three measurements, each in this one process and on the same backend:

  launch   the calling thread's cost of one launch of an empty kernel on
           its own stream, p50/p90/p99 of per-call times over --n launches
           (a prepared ruda.Launch, Kernel.launch, CuPy RawKernel, PyTorch)
  threads  launches/s with 1, 4, 16, 64 Python threads, each on its own
           stream: "submitted" counts until every thread returned from its
           last launch, "completed" until the device also ran them
  serve    a request loop: write 4 KiB, 3 kernels, read 4 KiB and wait,
           requests/s and p50 latency from one thread (ruda vs PyTorch)

CuPy and PyTorch run only where importable and a GPU is usable. On the
host backend the kernels are C functions (ruda/_test_kernels.so); say so
when quoting the figures. Usage:

    python bench/python_launch.py [--n 100000] [--threads 1,4,16,64] [--json out.json]
                                  [--launch-gil auto|release|keep]

--launch-gil opens ruda's device with that launch_gil: "auto" (the
package's default: the GIL kept while the queue has room), "release" (the
GIL handed over around every launch), "keep" (never; backpressure="error"
and a large queue bound, so a push never waits): whether the GIL handoff
around a ~200 ns push is what 16 and 64 threads lose their rate to.
"""
import argparse
import json
import pathlib
import statistics
import sys
import threading
import time

import numpy as np

import ruda

CUDA_SOURCE = r"""
extern "C" __global__ void empty() {}
extern "C" __global__ void bench_axpy(const float *x, float *y, float a, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}
"""
pc = time.perf_counter_ns


def percentiles(ts):
    ts = sorted(ts)
    return {p: ts[min(len(ts) - 1, int(len(ts) * p / 100))] for p in (50, 90, 99)}


def timer_overhead(n=100000):
    ts = []
    for _ in range(n):
        t = pc()
        ts.append(pc() - t)
    return percentiles(ts)[50]


def per_call(fn, n, sync):
    ts = [0] * n
    for i in range(n):
        t = pc()
        fn()
        ts[i] = pc() - t
    sync()
    return percentiles(ts)


def threads_rate(make_launcher, nthreads, per_thread, sync):
    barrier = threading.Barrier(nthreads + 1)
    done = []

    def work():
        f = make_launcher()  # the thread's own stream and launch object
        barrier.wait()
        for _ in range(per_thread):
            f()
        done.append(pc())

    ts = [threading.Thread(target=work) for _ in range(nthreads)]
    for t in ts:
        t.start()
    barrier.wait()
    t0 = pc()
    for t in ts:
        t.join()
    submitted = max(done) - t0
    sync()
    completed = pc() - t0
    total = nthreads * per_thread
    return {"submitted_per_s": total / submitted * 1e9, "completed_per_s": total / completed * 1e9}


class RudaSide:
    name = "ruda"

    def __init__(self, launch_gil="auto"):
        if launch_gil == "keep":
            self.dev = ruda.Device(launch_gil="keep", backpressure="error", queue_bound=1 << 22)
        else:
            self.dev = ruda.Device(launch_gil=launch_gil)
        if self.dev.backend == "cuda":
            self.dev.module_source(CUDA_SOURCE, ["empty", "bench_axpy"])
        else:
            lib = pathlib.Path(ruda.__file__).with_name("_test_kernels.so")
            self.dev.load_host_kernels(lib, {"empty": "", "axpy": "PPfI"})
        self.empty = self.dev.kernel("empty")
        self.axpy = self.dev.kernel("bench_axpy" if self.dev.backend == "cuda" else "axpy", "PPfI")
        self.backend = self.dev.backend

    def launchers(self):
        L = self.empty.prepare(1, 1, ())
        k = self.empty
        return {"ruda Launch()": L, "ruda Kernel.launch": lambda: k.launch(1, 1, ())}

    def thread_launcher(self):
        return self.empty.prepare(1, 1, ())  # launched on the calling thread's stream

    def sync(self):
        self.dev.device_sync()

    def serve(self, n):
        d, m = self.dev, 1024
        x, y = d.buffer(m, "float32"), d.buffer(m, "float32")
        src = np.ones(m, np.float32)
        dst = d.staging(m * 4)  # a page-locked destination: the read lands in it
        steps = [self.axpy.prepare((m + 255) // 256, 256, (ruda.in_(x), y, 0.5, m)) for _ in range(3)]
        ts = []
        for _ in range(n):
            t = pc()
            d.write(x, src)
            for s in steps:
                s()
            d.read(y, dst).wait()
            ts.append(pc() - t)
        return ts


class CupySide:
    name = "cupy"

    def __init__(self):
        import cupy
        self.cp = cupy
        mod = cupy.RawModule(code=CUDA_SOURCE)
        self.k = mod.get_function("empty")

    def launchers(self):
        s = self.cp.cuda.Stream(non_blocking=True)
        s.use()  # the calling thread's current stream from here on
        k = self.k
        return {"cupy RawKernel": lambda: k((1,), (1,), ())}

    def thread_launcher(self):
        s = self.cp.cuda.Stream(non_blocking=True)
        s.use()  # this thread's current stream
        k = self.k
        return lambda: k((1,), (1,), ())

    def sync(self):
        self.cp.cuda.Device().synchronize()


class TorchSide:
    name = "torch"

    def __init__(self):
        import torch
        self.torch = torch
        self.t = torch.zeros(1, device="cuda")

    def launchers(self):
        s = self.torch.cuda.Stream()
        self.torch.cuda.set_stream(s)
        t = self.t
        return {"torch x.add_(1) (own stream)": lambda: t.add_(1)}

    def thread_launcher(self):
        s = self.torch.cuda.Stream()
        self.torch.cuda.set_stream(s)
        t = self.torch.zeros(1, device="cuda")
        return lambda: t.add_(1)

    def sync(self):
        self.torch.cuda.synchronize()

    def serve(self, n):
        torch, m = self.torch, 1024
        src = torch.ones(m, pin_memory=True)
        out = torch.empty(m, pin_memory=True)
        x, y = torch.empty(m, device="cuda"), torch.zeros(m, device="cuda")
        ts = []
        for _ in range(n):
            t = pc()
            x.copy_(src, non_blocking=True)
            for _ in range(3):
                y.add_(x, alpha=0.5)
            out.copy_(y, non_blocking=True)
            torch.cuda.current_stream().synchronize()
            ts.append(pc() - t)
        return ts


def peers(backend):
    out = []
    if backend != "cuda":
        return out
    for cls in (CupySide, TorchSide):
        try:
            out.append(cls())
        except Exception as e:  # not installed, or no GPU for it
            print(f"({cls.name} skipped: {type(e).__name__}: {e})")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100000, help="launches per per-call measurement")
    ap.add_argument("--threads", default="1,4,16,64")
    ap.add_argument("--per-thread", type=int, default=20000)
    ap.add_argument("--serve", type=int, default=5000, help="requests of the serving loop")
    ap.add_argument("--json")
    ap.add_argument("--launch-gil", choices=["auto", "release", "keep"], default="auto")
    a = ap.parse_args(argv)
    r = RudaSide(a.launch_gil)
    sides = [r] + peers(r.backend)
    res = {"backend": r.backend, "python": sys.version.split()[0], "timer_p50_ns": timer_overhead(),
           "launch_gil": a.launch_gil,
           "launch": {}, "threads": {}, "serve": {}}
    print(f"backend {r.backend}; Python {res['python']}; a perf_counter_ns pair costs "
          f"{res['timer_p50_ns']} ns (included below)")
    print("\n== launch: ns per call from one thread (empty kernel, own stream)")
    for side in sides:
        for name, f in side.launchers().items():
            for _ in range(1000):
                f()
            side.sync()
            p = per_call(f, a.n, side.sync)
            res["launch"][name] = p
            print(f"  {name:34s} p50 {p[50]:6d}  p90 {p[90]:6d}  p99 {p[99]:7d}")
    print("\n== threads: launches/s, each thread on its own stream")
    for side in sides:
        for t in [int(x) for x in a.threads.split(",")]:
            per = max(1000, a.per_thread // max(1, t // 4))
            q = threads_rate(side.thread_launcher, t, per, side.sync)
            res["threads"][f"{side.name} T={t}"] = q
            print(f"  {side.name:6s} T={t:3d}  submitted {q['submitted_per_s']:11,.0f}/s  "
                  f"completed {q['completed_per_s']:11,.0f}/s")
    print("\n== serve: write 4 KiB, 3 kernels, read 4 KiB and wait, one thread")
    for side in sides:
        if not hasattr(side, "serve"):
            continue
        ts = side.serve(a.serve)
        p = percentiles(ts)
        rate = len(ts) / (sum(ts) / 1e9)
        res["serve"][side.name] = {"p50_ns": p[50], "p99_ns": p[99], "requests_per_s": rate}
        print(f"  {side.name:6s} p50 {p[50] / 1e3:7.1f} us  p99 {p[99] / 1e3:7.1f} us  {rate:9,.0f} requests/s")
    r.dev.close()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
