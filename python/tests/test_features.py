"""Futures under asyncio, graphs, profiling, tracing, memory reports,
DLPack, staging memory and collectives, on the host backend."""
import asyncio
import json
import threading

import numpy as np
import pytest

import ruda


def test_await_does_not_block_the_event_loop(dev):
    # The kernel waits until a coroutine on the loop sets the event: if
    # awaiting the read blocked the loop, the setter could never run.
    gate = threading.Event()

    def k(ctx, args):
        return 0 if gate.wait(timeout=30) else ruda.ETIMEDOUT.code

    dev.host_kernel("gate", k)
    b = dev.buffer(4)
    dev.write(b, b"wxyz", stream=1)

    async def main():
        dev.kernel("gate").launch(1, 1, (), stream=1)
        fut = dev.read(b, stream=1)

        async def opener():
            await asyncio.sleep(0)
            gate.set()

        got, _ = await asyncio.gather(fut, opener())
        return got

    assert bytes(asyncio.run(main())) == b"wxyz"


def test_done_never_blocks_while_another_thread_waits(dev):
    # A thread waiting holds the future until the gate opens, and the gate
    # kernel needs the GIL to return: done() must answer at once, not wait
    # for the lock with the GIL held (which would deadlock).
    import time
    gate = threading.Event()
    dev.host_kernel("gate2", lambda ctx, args: 0 if gate.wait(timeout=60) else ruda.ETIMEDOUT.code)
    b = dev.buffer(4)
    dev.write(b, b"abcd", stream=1)
    dev.kernel("gate2").launch(1, 1, (), stream=1)
    f = dev.read(b, stream=1)
    waiter = threading.Thread(target=f.wait)
    waiter.start()
    end = time.monotonic() + 0.2
    while time.monotonic() < end:  # calls land before and while the waiter holds it
        assert f.done() is False
    gate.set()
    waiter.join()
    assert f.done() is True and bytes(f.wait()) == b"abcd"


def test_await_of_a_failed_future_raises(dev):
    async def main():
        dev.kernel("fail").launch(1, 1, (-41,))
        await dev.sync_async()

    with pytest.raises(ruda.EUNHEALTHY):
        asyncio.run(main())


def test_graph_capture_replay_run(dev):
    n = 32
    x = dev.buffer(n, "uint32")
    dev.write(x, np.zeros(n, np.uint32), stream=2)
    dev.sync(2)
    k = dev.kernel("inc_u32")
    with dev.capture(2) as cap:
        k.launch(1, n, (x, n), stream=2)
        k.launch(1, n, (x, n), stream=2)
    g = cap.graph
    assert len(g) == 2
    assert list(dev.read(x, np.empty(n, np.uint32), stream=2).wait()) == [0] * n  # recorded, not run
    g.replay(2)
    g.replay(3)
    g.replay_async(2).wait()
    g.run(2)
    assert list(dev.read(x, np.empty(n, np.uint32), stream=2).wait()) == [8] * n
    g.destroy()
    with pytest.raises(ValueError):
        g.replay(2)


def test_capture_refuses_a_plain_write_and_aborts_on_exceptions(dev):
    b = dev.buffer(4)
    with pytest.raises(ruda.EGRAPHSTATE):
        with dev.capture(5):
            dev.write(b, b"abcd", stream=5)
    dev.write(b, b"abcd", stream=5)  # the capture was aborted


def test_graph_with_staged_upload_and_download(dev):
    n = 16
    x = dev.buffer(n, "uint32")
    inp, outp = dev.staging(n * 4), dev.staging(n * 4)
    k = dev.kernel("inc_u32")
    with dev.capture(1) as cap:
        dev.write_staged(x, inp, stream=1)
        k.launch(1, n, (x, n), stream=1)
        dev.read(x, outp, stream=1)
    for r in range(3):
        np.frombuffer(inp, np.uint32)[:] = r * 10
        cap.graph.run(1)
        assert list(np.frombuffer(outp, np.uint32)) == [r * 10 + 1] * n


def test_write_staged_hands_the_block_over(dev):
    x = dev.buffer(8)
    st = dev.staging(8)
    memoryview(st)[:] = b"12345678"
    dev.write_staged(x, st)
    with pytest.raises(ValueError):
        memoryview(st)
    assert bytes(dev.read(x).wait()) == b"12345678"


def test_profile_measures_the_work_between(dev):
    x = dev.buffer(1024, "float32")
    with dev.profile(1) as p:
        dev.kernel("fill_f32").launch(4, 256, (x, 1.0, 1024), stream=1)
    assert isinstance(p.ns, int) and p.ns > 0
    with pytest.raises(ruda.EPROFILETOKEN):
        dev.profile_end(12345, 1)


def test_trace_names_the_kernels(dev, tmp_path):
    path = tmp_path / "t.json"
    x = dev.buffer(4, "uint32")
    with dev.trace(str(path)):
        dev.kernel("inc_u32").launch(1, 4, (x, 4), stream=1)
        dev.sync(1)
    events = json.loads(path.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert any(e.get("name") == "inc_u32" for e in events)


def test_memory_reports(dev):
    b = dev.buffer(4096)
    s = dev.memory_summary()
    assert s.startswith("ruda memory summary") and "host backend" in s
    u = dev.memory_usage()
    assert u["nallocs"] >= 1 and u["bytes_in_use"] >= 4096
    assert set(dev.memory_usage(ruda.CURRENT)) == set(u)
    del b


def test_dlpack_export_to_numpy_sees_queued_writes(dev):
    n = 4096
    x = dev.buffer((64, 64), "float32")
    dev.kernel("fill_f32").launch(16, 256, (x, 3.0, n), stream=2)
    a = np.from_dlpack(x)  # the export syncs: the fill has run
    assert a.shape == (64, 64) and a.dtype == np.float32 and (a == 3.0).all()
    assert x.__dlpack_device__() == (1, 0)
    assert a.__array_interface__["data"][0] == x.device_ptr()  # the same memory, no copy
    if a.flags.writeable:  # numpy 2 (numpy 1.x imports DLPack read-only)
        a[0, 0] = 9.0
        assert dev.read(x, np.empty((64, 64), np.float32)).wait()[0, 0] == 9.0


def test_dlpack_capsules_versioned_and_classic(dev):
    x = dev.buffer(8, "int32")
    v = x.__dlpack__(max_version=(1, 0))
    c = x.__dlpack__()
    assert "dltensor_versioned" in repr(v) and "dltensor" in repr(c)
    with pytest.raises(BufferError):
        x.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        x.__dlpack__(dl_device=(2, 0))
    with pytest.raises(AttributeError):
        x.__cuda_array_interface__
    del v, c  # unconsumed capsules release their reference


def test_dlpack_export_waits_for_a_slow_writer(dev):
    # The writer takes long enough that a consumer not ordered after it
    # would read the zeros (the sleep widens that window; the export's
    # sync is what makes the result right, whatever the timing).
    import ctypes
    import time

    def slow_fill(ctx, args):
        time.sleep(0.2)
        ctypes.memset(args[0], 0x11, 64)

    dev.host_kernel("slow_fill", slow_fill, "P")
    x = dev.buffer(64)
    dev.write(x, bytes(64), stream=1)
    dev.kernel("slow_fill").launch(1, 1, (x,), stream=1)
    assert bytes(np.from_dlpack(x)) == b"\x11" * 64


def test_dlpack_export_raises_queued_errors(dev):
    # The export is ordered on the calling thread's stream and raises what
    # that stream holds (other streams' errors stay theirs).
    x = dev.buffer(4, "int32")
    dev.kernel("fail").launch(1, 1, (-41,), stream=3)
    np.from_dlpack(x)
    dev.kernel("fail").launch(1, 1, (-41,))
    with pytest.raises(ruda.EUNHEALTHY):
        np.from_dlpack(x)
    with pytest.raises(ruda.EUNHEALTHY):
        dev.sync(stream=3)


def test_all_reduce_over_two_host_devices():
    devs = [ruda.Device(backend="host", streams=2) for _ in range(2)]
    try:
        bufs = [d.array(np.arange(8, dtype=np.float32) * (r + 1)) for r, d in enumerate(devs)]
        with ruda.Comm(devs) as comm:
            assert len(comm) == 2 and comm.rank(devs[1]) == 1
            for d, b in zip(devs, bufs):
                comm.all_reduce(d, b)  # in place, f32 from the buffer, sum
            for d in devs:
                comm.sync(d)
            for d, b in zip(devs, bufs):
                assert list(d.read(b, np.empty(8, np.float32)).wait()) == [3.0 * i for i in range(8)]
            with pytest.raises(ruda.EBUSY):
                devs[0].close()  # the communicator holds it
    finally:
        for d in devs:
            d.close()


def test_all_gather_and_broadcast_over_three_host_devices():
    devs = [ruda.Device(backend="host", streams=1) for _ in range(3)]
    try:
        parts = [d.array(np.full(4, r + 1, np.int32)) for r, d in enumerate(devs)]
        wholes = [d.buffer(12, "int32") for d in devs]
        with ruda.Comm(devs) as comm:
            for d, p, w in zip(devs, parts, wholes):
                comm.all_gather(d, p, w)
            for d, p in zip(devs, parts):
                comm.broadcast(d, p, root=2)
            for d in devs:
                comm.sync(d)
        for d, p, w in zip(devs, parts, wholes):
            assert list(d.read(w, np.empty(12, np.int32)).wait()) == [1] * 4 + [2] * 4 + [3] * 4
            assert list(d.read(p, np.empty(4, np.int32)).wait()) == [3] * 4
    finally:
        for d in devs:
            d.close()


def test_stream_objects(dev):
    s = dev.stream()
    assert s.id == ruda.stream_current() and s == ruda.Stream(dev)
    assert int(dev.stream(5)) == 5
    with pytest.raises(ruda.ENOBACKEND):
        s.__cuda_stream__()
    with pytest.raises(TypeError):
        dev.sync(stream="five")


def test_asyncio_server_example_checks_every_result():
    import os
    import pathlib
    import subprocess
    import sys
    ex = pathlib.Path(__file__).resolve().parents[2] / "examples" / "asyncio_server.py"
    env = dict(os.environ, RUDA_BACKEND="host")
    r = subprocess.run([sys.executable, str(ex), "--requests", "300"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all 300 results correct" in r.stdout


def test_dlpack_export_does_not_wait_for_other_streams(dev):
    # A kernel on stream 2 holds its worker until the gate opens (a timer
    # opens it after 5 s so a device-wide sync cannot hang the test): the
    # export of a buffer stream 2 never touches must return while it runs,
    # and still after the buffer's own writer.
    gate = threading.Event()
    timer = threading.Timer(5.0, gate.set)
    timer.start()
    try:
        dev.host_kernel("held", lambda ctx, args: 0 if gate.wait(timeout=30) else ruda.ETIMEDOUT.code)
        other = dev.buffer(4)
        dev.kernel("held").launch(1, 1, (), stream=2)
        x = dev.buffer(256, "float32")
        dev.kernel("fill_f32").launch(1, 256, (x, 7.0, 256), stream=1)
        a = np.from_dlpack(x)
        assert not gate.is_set(), "the export waited for the kernel on stream 2"
        assert (a == 7.0).all()
        del a, other
    finally:
        gate.set()
        timer.cancel()
