"""Launch cost through ctypes and cffi beside the ruda extension (host backend).

The same empty host kernel, launched from one thread with a descriptor
built once; ctypes and cffi call libruda.so's ruda_launch directly. It
justifies the C extension (docs/python.md). Usage:
    GLIBC_TUNABLES=glibc.rtld.optional_static_tls=8192 \
      python bench/python_ffi_overhead.py path/to/libruda.so path/to/_test_kernels.so

(libruda.so links jemalloc, whose initial-exec TLS needs that tunable to
be loaded by ctypes; the extension does without: docs/python.md.)
"""
import ctypes
import sys
import time

import ruda

N, REPS = 20000, 7


def best(f):
    out = []
    for _ in range(REPS):
        t = time.perf_counter_ns()
        for _ in range(N):
            f()
        out.append((time.perf_counter_ns() - t) / N)
    return sorted(out)[len(out) // 2]


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint32), ("y", ctypes.c_uint32), ("z", ctypes.c_uint32)]


class Binding(ctypes.Structure):
    _fields_ = [("slot", ctypes.c_uint32), ("gen", ctypes.c_uint32), ("offset", ctypes.c_uint64),
                ("size", ctypes.c_uint64)]


class LaunchDesc(ctypes.Structure):
    _fields_ = [("kernel", ctypes.c_char_p), ("grid", Dim3), ("block", Dim3), ("shared_mem", ctypes.c_uint32),
                ("args", ctypes.c_void_p), ("nargs", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("indirect_grid", Binding), ("reserved", ctypes.c_uint64 * 4)]


def main(libruda, kernels):
    lib = ctypes.CDLL(libruda)
    klib = ctypes.CDLL(kernels)
    cur = ctypes.c_uint64(2**64 - 1)
    dev = ctypes.c_void_p()
    assert lib.ruda_device_open(None, ctypes.byref(dev)) == 0
    lib.ruda_host_kernel_register(dev, b"empty", ctypes.cast(klib.empty, ctypes.c_void_p))
    d = LaunchDesc(kernel=b"empty", grid=Dim3(1, 1, 1), block=Dim3(1, 1, 1))
    launch = lib.ruda_launch
    launch.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(LaunchDesc)]
    launch.restype = ctypes.c_int
    pd = ctypes.byref(d)
    r = {"ctypes": best(lambda: launch(dev, cur, pd))}
    lib.ruda_device_sync(dev, None)
    try:
        import cffi
        ffi = cffi.FFI()
        ffi.cdef("int ruda_launch(void *dev, uint64_t stream, const void *l);")
        cl = ffi.dlopen(libruda)
        cdev = ffi.cast("void *", dev.value)
        cd = ffi.cast("void *", ctypes.addressof(d))
        f = cl.ruda_launch
        r["cffi (ABI mode)"] = best(lambda: f(cdev, 2**64 - 1, cd))
        lib.ruda_device_sync(dev, None)
    except ImportError:
        pass
    lib.ruda_device_close(dev, None)
    with ruda.Device(backend="host") as rd:
        rd.load_host_kernels(kernels, {"empty": ""})
        k = rd.kernel("empty")
        L = k.prepare(1, 1, ())
        r["ruda extension: Launch()"] = best(L)
        rd.sync()
        r["ruda extension: k.launch(1, 1, ())"] = best(lambda: k.launch(1, 1, ()))
    r["(a Python call of a lambda doing nothing)"] = best(lambda: None)
    for k, v in r.items():
        print(f"{k:42s} {v:7.0f} ns/launch (median of {REPS} x {N})")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
