"""Foreign tensors as ruda buffers (Device.asbuffer / from_dlpack) and ruda
buffers as foreign tensors, both ways with no copy. numpy on the host
backend runs everywhere; the torch and CuPy cases need a GPU and those
packages and are skipped elsewhere (the H200 runs them:
`RUDA_BACKEND=cuda python -m pytest python/tests/test_interop.py`)."""
import gc

import numpy as np
import pytest

import ruda
from conftest import KERNELS, SIGNATURES


def test_numpy_array_is_a_buffer_without_a_copy(dev):
    a = np.zeros(1024, np.float32)
    b = dev.asbuffer(a)
    assert b.device_ptr() == a.ctypes.data and b.nbytes == a.nbytes
    assert b.shape == (1024,) and b.dl_dtype == (2, 32)
    assert dev.asbuffer(a) is b and dev.from_dlpack(a) is b  # one import per object
    dev.kernel("fill_f32").launch(4, 256, (a, 3.0, 1024))  # the array itself, as an argument
    dev.sync()
    assert (a == 3.0).all()
    x = np.full(1024, 2.0, np.float32)
    step = dev.kernel("axpy").prepare(4, 256, (x, a, 0.5, 1024))  # a Launch over foreign memory
    step()
    step()
    dev.sync()
    assert (a == 5.0).all()
    assert bytes(dev.read(b).wait()) == a.tobytes()


def test_adopted_memory_is_held_until_the_last_use(dev):
    import threading
    import weakref
    gate = threading.Event()
    dev.host_kernel("gate_i", lambda ctx, args: 0 if gate.wait(timeout=30) else ruda.ETIMEDOUT.code)
    a = np.zeros(256, np.float32)
    alive = weakref.ref(a)
    b = dev.asbuffer(a)
    dev.kernel("gate_i").launch(1, 1, (), stream=1)
    dev.kernel("fill_f32").launch(1, 256, (b, 4.0, 256), stream=1)  # queued behind the gate
    b.free()  # the handle dies now, the memory stays until the fill ran
    del a, b
    gc.collect()
    assert alive() is not None, "the array went while a queued kernel still writes it"
    assert (alive() == 0.0).all()
    gate.set()
    dev.sync(stream=1)
    gc.collect()
    assert alive() is None, "ruda kept the array after its last use"


def test_refusals_are_clear(dev):
    a = np.zeros(64, np.float32)
    dev.asbuffer(a)
    with pytest.raises(ruda.EINVAL, match="overlaps the import"):
        dev.asbuffer(a[8:16])  # another object over adopted memory
    with pytest.raises(ValueError, match="C-contiguous"):
        dev.asbuffer(np.zeros((8, 8), np.float32)[:, ::2])
    with pytest.raises(TypeError, match="__dlpack__"):
        dev.asbuffer(object())
    with pytest.raises(ValueError, match="empty"):
        dev.asbuffer(np.zeros(0, np.float32))


def test_round_trip_both_ways(dev):
    # ruda -> numpy -> ruda: the same memory all along.
    x = dev.buffer(16, "int32")
    dev.write(x, np.arange(16, dtype=np.int32))
    a = np.from_dlpack(x)
    assert list(a) == list(range(16)) and a.ctypes.data == x.device_ptr()
    del a
    y = np.arange(16, dtype=np.int32) * 10
    b = dev.asbuffer(y)
    dev.copy(x, b)
    assert list(dev.read(x, np.empty(16, np.int32)).wait()) == list(range(0, 160, 10))


# ---- torch and CuPy on a GPU ----

SRC = """
extern "C" __global__ void scale(float *x, float a, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}
"""


@pytest.fixture
def gpu():
    try:
        d = ruda.Device(backend="cuda")
    except (ruda.ENOBACKEND, ruda.ENODRIVER) as e:
        pytest.skip(f"no cuda device: {e}")
    try:
        d.kernel_source("scale", SRC)
    except (ruda.ENONVRTC, ruda.ECOMPILE) as e:
        d.close()
        pytest.skip(f"no NVRTC: {e}")
    yield d
    d.close()


def test_torch_tensor_is_a_kernel_argument(gpu):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    t = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    t.add_(1.0)  # queued on torch's stream: ruda must follow it without a host sync
    k = gpu.kernel("scale", "PfI")
    k.launch(4096, 256, (t, 2.0, 1 << 20))
    back = torch.from_dlpack(gpu.asbuffer(t))  # and torch follows ruda, by an event
    expect = (torch.arange(1 << 20, dtype=torch.float32, device="cuda") + 1.0) * 2.0
    assert torch.equal(back, expect)
    assert back.data_ptr() == t.data_ptr()  # no copy either way
    step = k.prepare(4096, 256, (t, 0.5, 1 << 20))
    t.mul_(4.0)  # torch writes again: the Launch orders after it
    step()
    assert torch.equal(torch.from_dlpack(gpu.asbuffer(t)), expect * 2.0)


def test_cupy_array_is_a_kernel_argument(gpu):
    cp = pytest.importorskip("cupy")
    a = cp.arange(1 << 20, dtype=cp.float32)
    a += 1
    gpu.kernel("scale", "PfI").launch(4096, 256, (a, 3.0, 1 << 20))
    got = cp.from_dlpack(gpu.asbuffer(a))
    assert bool((got == (cp.arange(1 << 20, dtype=cp.float32) + 1) * 3).all())
    x = gpu.buffer(1 << 10, "float32")
    gpu.kernel("scale", "PfI").launch(4, 256, (gpu.asbuffer(cp.ones(1 << 10, cp.float32)), 1.0, 1 << 10))
    c = cp.asarray(x)  # __cuda_array_interface__: ruda -> CuPy, ordered on the given stream
    assert c.data.ptr == x.device_ptr()


def test_torch_export_does_not_wait_for_a_long_kernel_elsewhere(gpu):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    import time
    spin = r"""
    extern "C" __global__ void spin(long long ns) {
      long long t0 = clock64();
      while (clock64() - t0 < ns * 2) {}
    }"""
    gpu.kernel_source("spin", spin)
    x = gpu.buffer(1 << 20, "float32")
    gpu.write(x, np.ones(1 << 20, np.float32), stream=1)
    gpu.kernel("spin", "q").launch(1, 1, (100_000_000,), stream=2)  # ~100 ms on another stream
    t0 = time.perf_counter()
    t = torch.from_dlpack(x)
    took = time.perf_counter() - t0
    assert took < 0.05, f"the export took {took * 1e3:.1f} ms: it waited for stream 2"
    assert bool((t == 1.0).all())
    gpu.sync(stream=2)
