"""ruda from Python: many threads driving a GPU (or the CPU) without blocking.

A thin layer over ruda's C API (ruda/ruda.h), with the same names::

    import numpy as np, ruda
    with ruda.Device(backend="host", streams=4) as dev:
        dev.load_host_kernels("libmykernels.so", {"scale": "Pf"})
        x = dev.buffer((1024,), "float32")
        dev.write(x, np.ones(1024, np.float32))
        dev.kernel("scale").launch(4, 256, (x, 2.0))
        y = dev.read(x, np.empty(1024, np.float32)).wait()

The hot calls (Kernel.launch, Launch, Device.write/read, Future.wait) are
C (ruda._ruda); this module adds the conveniences: dtypes, context
managers, asyncio, exceptions. docs/python.md documents it all.
"""

import asyncio
import atexit
import concurrent.futures
import contextlib
import ctypes
import os
import struct
import threading
import weakref

from . import _ruda
from ._errors import *  # noqa: F401,F403  the exception classes
from ._errors import Error, _from_c

__version__ = _ruda.version()
version = _ruda.version
stream_current = _ruda.stream_current
err_name = _ruda.err_name
strerror = _ruda.strerror
range_push = _ruda.range_push
range_pop = _ruda.range_pop

#: The calling thread's own stream (the default of every stream argument).
CURRENT = _ruda.CURRENT
ARG_IN = _ruda.ARG_IN
ARG_OUT = _ruda.ARG_OUT
ARG_INOUT = _ruda.ARG_INOUT
LAUNCH_DRY_RUN = _ruda.LAUNCH_DRY_RUN
MAX_ARGS = _ruda.MAX_ARGS

Buffer = _ruda.Buffer
Arg = _ruda.Arg
Future = _ruda.Future
Kernel = _ruda.Kernel
Launch = _ruda.Launch
Graph = _ruda.Graph
Staging = _ruda.Staging


def in_(buf):
    """A buffer argument the kernel only reads (RUDA_ARG_BUFFER_IN)."""
    return _ruda.Arg(buf, ARG_IN)


def out(buf):
    """A buffer argument the kernel only writes (RUDA_ARG_BUFFER_OUT)."""
    return _ruda.Arg(buf, ARG_OUT)


def inout(buf):
    """A buffer argument read and written (the default for a plain Buffer)."""
    return _ruda.Arg(buf, ARG_INOUT)


# Scalars for kernels without a signature: their bytes, little-endian.
def i32(v): return struct.pack("<i", v)
def u32(v): return struct.pack("<I", v)
def i64(v): return struct.pack("<q", v)
def u64(v): return struct.pack("<Q", v)
def f32(v): return struct.pack("<f", v)
def f64(v): return struct.pack("<d", v)


# ---- dtypes: DLPack (code, bits) ----

_DL = {"i": 0, "u": 1, "f": 2, "b": 6}
_NAMES = {"int8": (0, 8), "int16": (0, 16), "int32": (0, 32), "int64": (0, 64),
          "uint8": (1, 8), "uint16": (1, 16), "uint32": (1, 32), "uint64": (1, 64),
          "float16": (2, 16), "float32": (2, 32), "float64": (2, 64), "bfloat16": (4, 16),
          "bool": (6, 8)}
_COMM = {(2, 32): "f32", (2, 64): "f64", (0, 32): "i32", (0, 64): "i64", (2, 16): "f16",
         (4, 16): "bf16", (0, 8): "i8", (1, 8): "u8"}


def _dl_dtype(dtype):
    """(DLPack code, bits) of a dtype name, a struct-style code or a numpy dtype."""
    if hasattr(dtype, "kind") and hasattr(dtype, "itemsize"):  # numpy.dtype
        if dtype.kind not in _DL:
            raise ValueError(f"ruda buffers hold ints, floats or bools, not {dtype}")
        return _DL[dtype.kind], dtype.itemsize * 8
    if isinstance(dtype, type):  # numpy.float32 and the like
        return _dl_dtype(__import__("numpy").dtype(dtype))
    s = str(dtype).lstrip("<=|")
    if s in _NAMES:
        return _NAMES[s]
    if len(s) >= 2 and s[0] in _DL and s[1:].isdigit():
        return _DL[s[0]], int(s[1:]) * 8
    raise ValueError(f"unknown dtype {dtype!r}")


class Stream(_ruda.Stream):
    """A stream of a device: Stream(dev) is the calling thread's own (its
    id resolved), Stream(dev, 5) the explicit id 5. Any stream argument
    takes one, an int id, or None (the calling thread's own)."""

    def flush(self):
        self.device.flush(self)

    def sync(self):
        self.device.sync(self)

    def __cuda_stream__(self):
        """(0, CUstream address): the stream protocol; cuda backend only."""
        return (0, self.device._cuda_stream(self.id))

    def __repr__(self):
        return f"<ruda.Stream {self.id:#x}>"


_open_devices = weakref.WeakSet()
_open_lock = threading.Lock()


class Device(_ruda.Device):
    """An open device (ruda_device_open). Keywords set the ruda_config
    fields; absent ones come from the RUDA_* environment variables, as in
    C: backend ("auto" | "cuda" | "host"), device (GPU ordinal), streams,
    queue_bound, backpressure ("block" | "error"), log ("off" ... "debug"),
    bounds_check, cache_dir, launch_blocking, spin_us, lanes (CUstreams
    per worker). launch_gil is the package's own: "auto" (default: a
    launch keeps the GIL while its queue has room and hands it over only to
    wait for room), "release" (hands it over around every launch) or "keep"
    (never; backpressure="error" only).

    A context manager: leaving the block closes it (close() runs what is
    queued, then raises the errors still queued)."""

    def __init__(self, **config):
        super().__init__(**config)
        self._signatures = {}
        self._libraries = []
        self._foreign = {}  # id(obj) -> (weakref to obj, its Buffer): asbuffer
        with _open_lock:
            _open_devices.add(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        if self.closed:
            return "<ruda.Device closed>"
        return f"<ruda.Device {self.backend}, {self.num_streams} streams>"

    # ---- buffers and streams ----

    def buffer(self, shape, dtype="uint8", stream=None):
        """A device buffer of shape (an int or a tuple) elements of dtype,
        allocated for stream. Freed when the object dies (or by free())."""
        code, bits = _dl_dtype(dtype)
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        n = 1
        for d in dims:
            n *= d
        return self._buffer(n * bits // 8, stream, code, bits, dims)

    def asbuffer(self, obj):
        """obj (any object with __dlpack__, or __cuda_array_interface__
        on cuda: a torch tensor, a CuPy or numpy array) as a ruda Buffer
        over the same memory, no copy; the memory is held until ruda's last
        use of it is done. The same object gives the same Buffer while it
        lives; each call orders ruda's later uses after the producer's work
        (cuda: by events on the device, never a host sync). A ruda Buffer
        is returned as it is. Another object over memory already adopted
        (an overlapping view) raises ruda.EINVAL: pass the first one.
        The Buffer is cached for the object: freed when the object dies
        (torch), by Buffer.free() (needed for a numpy array, which its own
        DLPack export keeps alive), or at close."""
        if isinstance(obj, _ruda.Buffer):
            return obj
        key = id(obj)
        hit = self._foreign.get(key)
        if hit is not None and hit[0]() is obj and not hit[1].freed:
            return self._adopt(obj, hit[1])
        buf = self._adopt(obj)
        foreign = self._foreign

        def forget(ref, key=key):
            if foreign.get(key, (None,))[0] is ref:
                del foreign[key]  # the Buffer goes: its memory is released after ruda's last use

        try:
            foreign[key] = (weakref.ref(obj, forget), buf)
        except TypeError:  # no weak references: adopted afresh at each call
            pass
        return buf

    from_dlpack = asbuffer

    def array(self, obj, stream=None):
        """A buffer holding a copy of obj (a numpy array or anything
        with the array interface), with its shape and dtype."""
        import numpy as np
        a = np.ascontiguousarray(obj)
        b = self.buffer(a.shape, a.dtype, stream)
        self.write(b, a, stream)
        return b

    def view(self, buf, offset, nbytes=None, dtype=None, shape=None):
        """A view of nbytes of buf from byte offset (a binding)."""
        code, bits = _dl_dtype(dtype) if dtype is not None else buf.dl_dtype
        return buf._view(offset, nbytes, code, bits, shape)

    def stream(self, id=None):
        """Stream(self, id): None gives the calling thread's own."""
        return Stream(self, id)

    # ---- kernels ----

    def kernel(self, name, signature=None):
        """A Kernel by name (registered by host_kernel, kernel_source,
        module_*). signature ('P' per buffer, struct codes b B ? h H i I q
        Q f d per scalar) lets launch pack Python numbers; host kernels
        registered with one keep it."""
        if signature is None:
            signature = self._signatures.get(name)
        return super().kernel(name, signature)

    def host_kernel(self, name, fn, signature=None):
        """Registers a host-backend kernel: fn is the address of a C
        ruda_host_kernel_fn, a ctypes function, or a Python callable
        fn(ctx, args) with ctx = (grid_dim, block_dim, block_idx,
        thread_idx) and args the addresses of the arguments, called once
        per thread (with the GIL, on a worker thread)."""
        if isinstance(fn, ctypes._CFuncPtr):
            fn = ctypes.cast(fn, ctypes.c_void_p).value
        super().host_kernel(name, fn, signature)
        if signature is not None:
            self._signatures[name] = signature
        else:
            self._signatures.pop(name, None)

    def load_host_kernels(self, path, kernels):
        """Registers C host kernels from a shared library: kernels maps a
        name to its signature (or None), or lists names; the symbol is the
        name itself. The library stays loaded while the device lives."""
        lib = ctypes.CDLL(os.fspath(path))
        self._libraries.append(lib)
        items = kernels.items() if isinstance(kernels, dict) else ((k, None) for k in kernels)
        for name, sig in items:
            self.host_kernel(name, ctypes.cast(getattr(lib, name), ctypes.c_void_p).value, sig)

    def module_source(self, source, names, file_name=None, options=None):
        super().module_source(source, list(names), file_name, options)
        return {n: self.kernel(n) for n in names}

    # ---- graphs, profiling, tracing ----

    @contextlib.contextmanager
    def capture(self, stream=None):
        """with dev.capture(s) as cap: ... records s's launches; cap.graph
        is the Graph afterwards (the capture is aborted on an exception)."""
        holder = _Holder()
        self.begin_capture(stream)
        try:
            yield holder
        except BaseException:
            self.abort_capture(stream)
            raise
        holder.graph = self.end_capture(stream)

    @contextlib.contextmanager
    def profile(self, stream=None):
        """with dev.profile(s) as p: ...; p.ns is the time s's work took."""
        holder = _Holder()
        token = self.profile_begin(stream)
        yield holder
        holder.ns = self.profile_end(token, stream)

    @contextlib.contextmanager
    def trace(self, path):
        """Traces every worker to a Chrome trace-event file at path."""
        self.trace_start(path)
        try:
            yield
        finally:
            self.trace_stop()

    def close(self):
        try:
            super().close()
        finally:
            if self.closed:  # not when a communicator still holds it (EBUSY)
                with _open_lock:
                    _open_devices.discard(self)
                self._libraries = []
                self._foreign.clear()  # the close released their memory


class _Holder:
    graph = None
    ns = None


class Comm(_ruda.Comm):
    """Comm(devices): a communicator joining open devices as ranks 0..n-1
    (ruda_comm_init). Collectives return at once; sync(device) waits for
    that rank's. dtype defaults to the source buffer's dtype."""

    def _dt(self, src, dtype):
        return dtype if dtype is not None else _COMM[src.dl_dtype]

    def all_reduce(self, device, src, dst=None, dtype=None, op="sum"):
        super().all_reduce(device, src, dst, self._dt(src, dtype), op)

    def reduce(self, device, src, dst=None, dtype=None, op="sum", root=0):
        super().reduce(device, src, dst, self._dt(src, dtype), op, root)

    def broadcast(self, device, src, dst=None, dtype=None, root=0):
        super().broadcast(device, src, dst, self._dt(src, dtype), "sum", root)

    def all_gather(self, device, src, dst, dtype=None):
        super().all_gather(device, src, dst, self._dt(src, dtype))

    def reduce_scatter(self, device, src, dst, dtype=None, op="sum"):
        super().reduce_scatter(device, src, dst, self._dt(src, dtype), op)

    def send(self, device, src, peer):
        super().send(device, src, None, None, None, peer)

    def recv(self, device, dst, peer):
        super().recv(device, dst, None, None, None, peer)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()
        return False


# ---- asyncio: await a Future without blocking the loop ----

_waiters = None
_waiters_lock = threading.Lock()


def _waiter_pool():
    global _waiters
    with _waiters_lock:
        if _waiters is None:
            _waiters = concurrent.futures.ThreadPoolExecutor(
                max_workers=32, thread_name_prefix="ruda-await")
        return _waiters


async def _await(fut):
    # A future already complete returns at once; otherwise a pool thread
    # waits (GIL released) and the loop is woken by call_soon_threadsafe.
    if fut.done():
        return fut.wait()
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_waiter_pool(), fut.wait)


_ruda._set_helpers(_from_c, _await)


@atexit.register
def _close_all():
    # Workers may run Python kernels: close devices while the interpreter
    # still runs.
    with _open_lock:
        devs = list(_open_devices)
    for d in devs:
        try:
            d.close()
        except (Error, BufferError):  # BufferError: views still live at exit
            pass
