"""The cuda backend's Python paths against the repository's stand-in libcuda
(tests/gpu/gpu_mock_driver.c: device memory is host memory, streams are
host threads, kernels C functions found by name; NVRTC is real).
Skipped where the package was built without CUDA headers or NVRTC is
missing."""
import os
import pathlib

import numpy as np
import pytest

import ruda

MOCK = pathlib.Path(ruda.__file__).with_name("_test_mockcuda.so")

SRC = """
template <typename T>
__global__ void scale(T *x, T a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * a;
}
"""


@pytest.fixture
def cuda(monkeypatch, tmp_path):
    if not MOCK.exists():
        pytest.skip("built without CUDA headers: no mock driver")
    monkeypatch.setenv("RUDA_CUDA_DRIVER", str(MOCK))
    try:
        d = ruda.Device(backend="cuda", streams=2, cache_dir=str(tmp_path))
    except (ruda.ENOBACKEND, ruda.ENODRIVER) as e:  # ENODRIVER: the real driver loaded first
        pytest.skip(f"cuda backend unavailable: {e}")
    yield d
    d.close()


def compile_scale(dev):
    try:
        dev.kernel_source("scale<float>", SRC)
    except (ruda.ENONVRTC, ruda.ECOMPILE) as e:
        pytest.skip(f"no NVRTC to compile with: {e}")
    return dev.kernel("scale<float>", "Pfi")


def test_cuda_source_kernel_by_cxx_name(cuda):
    assert cuda.backend == "cuda"
    k = compile_scale(cuda)
    x = cuda.array(np.arange(100, dtype=np.float32))
    k.launch(1, 128, (x, 3.0, 100))
    assert np.array_equal(cuda.read(x, np.empty(100, np.float32)).wait(), np.arange(100, dtype=np.float32) * 3)
    with pytest.raises(ruda.EINVAL):  # the C API checks the kernel's parameters
        cuda.kernel("scale<float>").launch(1, 1, (x,))


def test_cuda_array_interface_and_dlpack_device(cuda):
    k = compile_scale(cuda)
    x = cuda.array(np.ones((4, 8), np.float32))
    k.launch(1, 32, (x, 2.0, 32))
    cai = x.__cuda_array_interface__  # orders its stream after the launch
    assert cai["version"] == 3 and cai["shape"] == (4, 8) and cai["typestr"] == "<f4"
    assert cai["data"] == (x.device_ptr(), False)
    # The consumer syncs on (or enqueues on) the stream it is given: the
    # calling thread's worker stream, which waits for the launch.
    assert cai["stream"] == cuda._cuda_stream(None)
    import ctypes
    lib = ctypes.CDLL(str(MOCK))

    def driver(name, *argtypes):
        fn = ctypes.c_void_p()
        assert lib.cuGetProcAddress_v2(name, ctypes.byref(fn), 12000, 0, None) == 0
        return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(fn.value)

    ctx = ctypes.c_void_p()
    assert driver(b"cuDevicePrimaryCtxRetain", ctypes.c_void_p, ctypes.c_int)(ctypes.byref(ctx), 0) == 0
    assert driver(b"cuCtxSetCurrent", ctypes.c_void_p)(ctx) == 0
    assert driver(b"cuStreamSynchronize", ctypes.c_void_p)(cai["stream"]) == 0
    # The mock's device memory is host memory: the pointer shows the result.
    got = np.ctypeslib.as_array((ctypes.c_float * 32).from_address(cai["data"][0]))
    assert (got == 2.0).all()
    assert x.__dlpack_device__() == (2, 0)  # kDLCUDA, ordinal 0
    cap = x.__dlpack__(stream=1, max_version=(1, 0))
    assert "dltensor_versioned" in repr(cap)


def test_cuda_stream_protocol(cuda):
    s = cuda.stream(1)
    version, handle = s.__cuda_stream__()
    assert version == 0 and handle != 0
    assert cuda.stream(3).__cuda_stream__()[1] == handle  # ids 1 and 3 share worker 1 of 2 (one lane each)


def test_staging_blocks_are_reused_after_free(cuda):
    # Blocks from page-locked chunks, in jemalloc's size classes (ruda's
    # private jemalloc stages in the extension too), reused after a free.
    base = cuda.staging_usage()
    sizes = (1, 64, 65, 5000, 1 << 20)
    blocks = [cuda.staging(n) for n in sizes]
    u = cuda.staging_usage()
    grown = u["in_use_bytes"] - base["in_use_bytes"]
    assert grown == 8 + 64 + 80 + 5120 + (1 << 20)
    assert u["pinned_bytes"] > 0 and u["fallback_count"] == base["fallback_count"]
    del blocks
    assert cuda.staging_usage()["in_use_bytes"] == base["in_use_bytes"]
    pinned = cuda.staging_usage()["pinned_bytes"]
    for _ in range(100):
        s = cuda.staging(1 << 20)
        memoryview(s)[:3] = b"abc"
        del s
    assert cuda.staging_usage()["pinned_bytes"] == pinned


def test_staged_round_trip_through_the_arena(cuda):
    n = 1 << 16
    x = cuda.buffer(n, "uint32")
    src = np.arange(n, dtype=np.uint32)
    for _ in range(5):
        cuda.write(x, src)  # through staging blocks
    out = cuda.staging(n * 4)
    cuda.read(x, out).wait()  # lands in the page-locked block directly
    assert np.array_equal(np.frombuffer(out, np.uint32), src)
    st = cuda.staging(n * 4)
    np.frombuffer(st, np.uint32)[:] = src[::-1]
    cuda.write_staged(x, st)
    assert np.array_equal(cuda.read(x, np.empty(n, np.uint32)).wait(), src[::-1])


def test_module_source_registers_every_kernel_once(cuda):
    src = SRC + """
__global__ void vectorAdd(const float *a, const float *b, float *c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}
"""
    try:
        ks = cuda.module_source(src, ["vectorAdd", "scale<float>"], file_name="ops.cu")
    except (ruda.ENONVRTC, ruda.ECOMPILE) as e:
        pytest.skip(f"no NVRTC: {e}")
    a, b = cuda.array(np.arange(8, dtype=np.float32)), cuda.array(np.ones(8, np.float32))
    c = cuda.buffer(8, "float32")
    cuda.kernel("vectorAdd", "PPPi").launch(1, 8, (ruda.in_(a), ruda.in_(b), ruda.out(c), 8))
    ks["scale<float>"].launch(1, 8, (c, ruda.f32(2.0), np.int32(8)))
    assert list(cuda.read(c, np.empty(8, np.float32)).wait()) == [2.0 * (i + 1) for i in range(8)]
    with pytest.raises(ruda.EKERNEL) as e:
        cuda.kernel_source("nope", SRC)
    assert '"nope"' in e.value.message and e.value.stream == 0  # raised at the call
