"""An asyncio inference server on ruda: concurrent coroutines, shared weights.

Each request is a coroutine: it takes a slot (an explicit stream id with
its own buffers), uploads its input, runs two dense layers that read the
weights shared by every stream (ruda.in_: kernels of many streams read
them at once), reads the output back and awaits it; the event loop keeps
serving the other requests meanwhile. Every output is checked against
numpy. It runs on the GPU when one is usable (the kernels compiled from
CUDA source), on the host backend otherwise (the C kernels of
python/tests/host_kernels.c, shipped as ruda/_test_kernels.so).

    python examples/asyncio_server.py [--requests 300] [--slots 8]
"""
import argparse
import asyncio
import pathlib
import sys
import time

import numpy as np

import ruda

NIN, NHID, NOUT = 64, 128, 16

CUDA_SOURCE = r"""
extern "C" __global__ void dense(const float *x, const float *w, const float *b, float *y,
                                 unsigned nin, unsigned nout) {
  unsigned j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= nout) return;
  float s = b[j];
  for (unsigned k = 0; k < nin; k++) s += x[k] * w[(unsigned long long)k * nout + j];
  y[j] = s > 0 ? s : 0;
}
"""


def reference(x, w1, b1, w2, b2):
    h = np.maximum(b1 + x @ w1, 0)
    return np.maximum(b2 + h @ w2, 0)


class Server:
    def __init__(self, dev, nslots):
        self.dev = dev
        if dev.backend == "cuda":
            dev.kernel_source("dense", CUDA_SOURCE)
        else:
            lib = pathlib.Path(ruda.__file__).with_name("_test_kernels.so")
            dev.load_host_kernels(lib, {"dense": "PPPPII"})
        self.dense = dev.kernel("dense", signature="PPPPII")
        rng = np.random.default_rng(7)
        self.weights = [rng.standard_normal((NIN, NHID), np.float32) / 8, rng.standard_normal(NHID, np.float32) / 8,
                        rng.standard_normal((NHID, NOUT), np.float32) / 8, rng.standard_normal(NOUT, np.float32) / 8]
        # Uploaded once; every request reads them.
        self.w1, self.b1, self.w2, self.b2 = (dev.array(w) for w in self.weights)
        self.dev.device_sync()
        self.slots = asyncio.Queue()
        for s in range(nslots):
            self.slots.put_nowait(s)

    async def infer(self, x):
        s = await self.slots.get()
        try:
            d = self.dev
            xb = d.buffer(NIN, "float32", stream=s)
            h = d.buffer(NHID, "float32", stream=s)
            y = d.buffer(NOUT, "float32", stream=s)
            d.write(xb, x, stream=s)
            self.dense.launch(1, 128, (ruda.in_(xb), ruda.in_(self.w1), ruda.in_(self.b1), ruda.out(h), NIN, NHID),
                              stream=s)
            self.dense.launch(1, 128, (ruda.in_(h), ruda.in_(self.w2), ruda.in_(self.b2), ruda.out(y), NHID, NOUT),
                              stream=s)
            out = await d.read(y, np.empty(NOUT, np.float32), stream=s)
            for b in (xb, h, y):
                b.free(stream=s)  # ordered after the request's commands
            return out
        finally:
            self.slots.put_nowait(s)


async def serve(dev, nrequests, nslots):
    server = Server(dev, nslots)
    rng = np.random.default_rng(11)
    inputs = [rng.standard_normal(NIN, np.float32) for _ in range(nrequests)]
    latencies = [0.0] * nrequests

    async def client(i):
        t = time.perf_counter()
        out = await server.infer(inputs[i])
        latencies[i] = time.perf_counter() - t
        return out

    t0 = time.perf_counter()
    outs = await asyncio.gather(*(client(i) for i in range(nrequests)))
    wall = time.perf_counter() - t0
    bad = 0
    for i, out in enumerate(outs):
        if not np.allclose(out, reference(inputs[i], *server.weights), rtol=1e-4, atol=1e-5):
            bad += 1
    lat = sorted(latencies)
    print(f"asyncio server on {dev.backend} ({dev.num_streams} workers, {nslots} slots): "
          f"{nrequests} requests in {wall * 1e3:.1f} ms, {nrequests / wall:.0f} requests/s, "
          f"latency p50 {lat[len(lat) // 2] * 1e6:.0f} us, p99 {lat[int(len(lat) * 0.99)] * 1e6:.0f} us")
    if bad:
        print(f"{bad} of {nrequests} results WRONG")
        return 1
    print(f"all {nrequests} results correct")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--slots", type=int, default=8)
    a = ap.parse_args(argv)
    with ruda.Device(streams=a.slots) as dev:
        if dev.fallback_reason:
            print(f"no GPU ({dev.fallback_reason}): host backend")
        return asyncio.run(serve(dev, a.requests, a.slots))


if __name__ == "__main__":
    sys.exit(main())
