"""Python code that must never crash the interpreter or hang it: views
that outlive close, racing captures, and waits from inside a Python host
kernel (issue 28, items 3, 4 and 9)."""
import os
import pathlib
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import ruda
from conftest import KERNELS, SIGNATURES


def _child(code):
    """Runs code in a fresh interpreter that imports this ruda (a crash or
    a hang there fails the test instead of the run)."""
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(ruda.__file__).parent.parent))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=60, env=env)


def test_close_refuses_while_a_staging_memoryview_lives():
    d = ruda.Device(backend="host", streams=2)
    st = d.staging(4096)
    view = memoryview(st)
    view[:4] = b"live"
    with pytest.raises(BufferError, match="exported"):
        d.close()
    assert not d.closed  # still open, still usable
    view[4:8] = b"more"  # the memory is still the block's
    assert bytes(view[:8]) == b"livemore"
    view.release()
    d.close()
    assert d.closed


def test_close_refuses_while_a_dlpack_array_lives():
    d = ruda.Device(backend="host", streams=2)
    d.load_host_kernels(KERNELS, SIGNATURES)
    x = d.buffer(1024, "float32")
    d.kernel("fill_f32").launch(4, 256, (x, 5.0, 1024))
    a = np.from_dlpack(x)
    with pytest.raises(BufferError, match="exported"):
        d.close()
    assert (a == 5.0).all()  # the array still reads its own memory
    with pytest.raises(BufferError, match="exported"):
        x.free()  # nor may the buffer go under it
    del a
    cap = x.__dlpack__()  # an unconsumed capsule counts too, until it dies
    with pytest.raises(BufferError):
        d.close()
    del cap
    d.close()
    assert d.closed


def test_views_across_close_never_crash():
    # The adversarial sequence of issue 28: views made, close tried, the
    # views used. Run in a child so a crash is a failure, not a lost run.
    code = textwrap.dedent("""
        import numpy as np, ruda
        d = ruda.Device(backend="host", streams=2)
        other = ruda.Device(backend="host", streams=2)
        st = d.staging(16384)
        v = memoryview(st)
        v[:] = b"\\x02" * 16384
        b = d.buffer(16384)
        d.write(b, bytes(16384))
        a = np.from_dlpack(b)
        try:
            d.close()
        except BufferError:
            pass
        junk, sj = [], []
        for _ in range(8):  # memory a close freed would be reused here
            j = other.buffer(16384)
            other.write(j, b"\\xee" * 16384)
            junk.append(j)
            s = other.staging(16384)
            memoryview(s)[:] = b"\\xdd" * 16384
            sj.append(s)
        other.sync()
        assert bytes(v) == b"\\x02" * 16384, "the view reads another block"
        assert (a == 0).all(), "the array reads another buffer"
        v[:] = b"\\x01" * 16384  # must land in d's block, not in freed memory
        for j in junk:
            assert bytes(other.read(j).wait()) == b"\\xee" * 16384
        for s in sj:
            assert bytes(memoryview(s)) == b"\\xdd" * 16384
        del a
        v.release()
        d.close()
        other.close()
        print("ok")
    """)
    r = _child(code)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_concurrent_begin_capture_never_overflows_the_list():
    # Each thread captures on its own stream; the list holds 64. Without a
    # check at the append, threads that passed the bound while one was in
    # the C call wrote past the list.
    d = ruda.Device(backend="host", streams=4)
    n = 96
    start = threading.Barrier(n)
    done = threading.Barrier(n)
    ok, refused, other = [], [], []

    def body():
        start.wait()
        began = False
        try:
            d.begin_capture()
            began = True
            ok.append(1)
        except RuntimeError as e:
            (refused if "at most 64" in str(e) else other).append(e)
        except Exception as e:  # noqa: BLE001 - reported below
            other.append(e)
        done.wait()  # every capture is open while the others begin theirs
        if began:
            d.abort_capture()

    ts = [threading.Thread(target=body) for _ in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not other, other[:3]
    assert len(ok) <= 64 and len(ok) + len(refused) == n
    d.close()


def test_waits_inside_a_python_host_kernel_raise_instead_of_deadlocking():
    r = _child("""
        import ruda
        d = ruda.Device(backend="host", streams=2)
        seen = []
        def k(ctx, args):
            for name, call in (("flush", lambda: d.flush(stream=1)), ("sync", lambda: d.sync(stream=1)),
                               ("device_sync", d.device_sync), ("close", d.close)):
                try:
                    call()
                    seen.append(name + ": returned")
                except RuntimeError as e:
                    seen.append(name + (": raised" if "host kernel" in str(e) else ": " + str(e)))
        d.host_kernel("waiter", k)
        d.kernel("waiter").launch(1, 1, (), stream=1)
        d.sync(stream=1)
        print(";".join(seen))
        d.close()
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "flush: raised;sync: raised;device_sync: raised;close: raised"


def test_launch_gil_keep_only_where_a_push_never_waits():
    with pytest.raises(ValueError, match="backpressure='error'"):
        ruda.Device(backend="host", launch_gil="keep")
    d = ruda.Device(backend="host", streams=2, launch_gil="keep", backpressure="error", queue_bound=4)
    d.load_host_kernels(KERNELS, SIGNATURES)
    gate = threading.Event()
    d.host_kernel("py_gate", lambda ctx, args: 0 if gate.wait(timeout=30) else ruda.ETIMEDOUT.code)
    x = d.buffer(64, "float32")
    d.kernel("py_gate").launch(1, 1, (), stream=1)  # a worker that needs the GIL: launches still return
    with pytest.raises(ruda.EQUEUEFULL):
        for _ in range(16):  # the bound is reached: an error, never a wait with the GIL held
            d.kernel("fill_f32").launch(1, 16, (x, 1.0, 16), stream=1)
    gate.set()
    d.sync(stream=1)
    d.close()


def test_launch_gil_auto_waits_for_room_without_holding_the_gil():
    # The default ("auto") keeps the GIL only while a launch finds room:
    # behind a gate that needs the GIL to open, a launch into the full queue
    # hands it over and waits, so the gate's Python code runs, every launch
    # is queued and runs once. Holding the GIL there would deadlock.
    d = ruda.Device(backend="host", streams=2, queue_bound=4)
    d.load_host_kernels(KERNELS, SIGNATURES)
    gate = threading.Event()
    d.host_kernel("py_gate", lambda ctx, args: 0 if gate.wait(timeout=30) else ruda.ETIMEDOUT.code)
    ran = []
    d.host_kernel("py_count", lambda ctx, args: ran.append(1) or 0)
    d.kernel("py_gate").launch(1, 1, (), stream=1)
    opener = threading.Timer(0.2, gate.set)
    opener.start()
    t0 = time.monotonic()
    for _ in range(16):  # past the bound: these wait for room, with the GIL handed over
        d.kernel("py_count").launch(1, 1, (), stream=1)
    d.sync(stream=1)
    assert time.monotonic() - t0 >= 0.15  # they waited for the gate
    assert len(ran) == 16
    opener.join()
    d.close()
    with pytest.raises(ValueError, match="launch_gil"):
        ruda.Device(backend="host", launch_gil="sometimes")
