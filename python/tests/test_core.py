"""Buffers, copies, launches and errors on the host backend."""
import array
import threading

import numpy as np
import pytest

import ruda


def test_write_read_round_trip_from_any_buffer(dev):
    b = dev.buffer(16)
    dev.write(b, bytes(range(16)))
    assert bytes(dev.read(b).wait()) == bytes(range(16))
    dev.write(b, memoryview(bytearray(range(16, 32))))
    out = bytearray(16)
    assert dev.read(b, out).wait() is out
    assert out == bytes(range(16, 32))
    dev.write(b, array.array("I", [7, 8, 9, 10]))
    assert list(dev.read(b, np.empty(4, np.uint32)).wait()) == [7, 8, 9, 10]


def test_write_of_the_wrong_length_is_refused(dev):
    b = dev.buffer(16)
    with pytest.raises(ruda.EINVAL) as e:
        dev.write(b, b"short")
    assert isinstance(e.value, ValueError) and e.value.code == -1 and "ruda_write" in e.value.message
    with pytest.raises(TypeError):
        dev.write(b, "not a buffer")


def test_launch_packs_scalars_by_signature(dev):
    n = 1000
    x = dev.buffer(n, "float32")
    y = dev.array(np.arange(n, dtype=np.float32))
    dev.kernel("fill_f32").launch(4, 256, (ruda.out(x), 1.5, n))
    dev.kernel("axpy").launch((4, 1, 1), (256,), [ruda.in_(x), y, 2.0, n])
    got = dev.read(y, np.empty(n, np.float32)).wait()
    assert np.array_equal(got, np.arange(n, dtype=np.float32) + 3.0)


def test_scalars_as_bytes_without_signature(dev):
    x = dev.buffer(8, "float32")
    k = dev.kernel("fill_f32", signature=None)
    k2 = ruda.Kernel  # the type is exported
    assert isinstance(k, k2)
    dev.host_kernel("fill_raw", dev._libraries[0].fill_f32)  # untyped registration
    raw = dev.kernel("fill_raw")
    assert raw.signature is None
    raw.launch(1, 8, (x, ruda.f32(4.0), np.uint32(8)))
    with pytest.raises(TypeError, match="needs a signature"):
        raw.launch(1, 8, (x, 4.0, 8))
    assert list(dev.read(x, np.empty(8, np.float32)).wait()) == [4.0] * 8


def test_bad_launches_fail_at_the_call(dev):
    x = dev.buffer(4, "uint32")
    with pytest.raises(TypeError, match="takes 2 arguments"):
        dev.kernel("inc_u32").launch(1, 1, (x,))
    with pytest.raises(ruda.EKERNEL):
        dev.kernel("no_such_kernel").launch(1, 1, ())
    with pytest.raises(OverflowError):
        dev.kernel("fail").launch(1, 1, (2**40,))
    with pytest.raises(ruda.Error):
        dev.kernel("inc_u32").launch(0, 1, (x, 4))  # a zero grid


def test_prepared_launch_repeats(dev):
    x = dev.buffer(64, "uint32")
    dev.write(x, np.zeros(64, np.uint32))
    L = dev.kernel("inc_u32").prepare(1, 64, (x, 64))
    for _ in range(10):
        L()
    L.launch(stream=None)
    assert list(dev.read(x, np.empty(64, np.uint32)).wait()) == [11] * 64


def test_queued_errors_carry_code_stream_and_command(dev):
    s = dev.stream(7)
    dev.kernel("fail").launch(1, 1, (ruda.EOUTOFMEMORY.code,), stream=s)
    with pytest.raises(ruda.EUNHEALTHY) as e:
        s.sync()
    errs = e.value.all()
    assert [type(x) for x in errs] == [ruda.EOUTOFMEMORY]
    assert errs[0].stream == 7 and isinstance(errs[0].command, int)
    assert '"fail"' in errs[0].message
    s.sync()  # drained: healthy again


def test_future_wait_hands_back_the_streams_errors(dev):
    b = dev.buffer(4)
    dev.kernel("fail").launch(1, 1, (-41,))
    f = dev.read(b)
    with pytest.raises(ruda.EUNHEALTHY) as e:
        f.wait()
    assert [type(x) for x in e.value.all()] == [ruda.EGENERIC]
    with pytest.raises(ruda.EUNHEALTHY):  # the same result again
        f.wait()


def test_streams_order_through_buffers(dev):
    n = 256
    x = dev.buffer(n, "uint32")
    dev.write(x, np.zeros(n, np.uint32), stream=1)
    k = dev.kernel("inc_u32")
    for s in range(2, 12):
        k.launch(1, n, (x, n), stream=s)  # each waits for the last write on another stream
    assert list(dev.read(x, np.empty(n, np.uint32), stream=3).wait()) == [10] * n
    ids = dev.stream_ids()
    assert {1, 2, 3, 11} <= set(ids)


def test_threads_launch_on_their_own_streams(dev):
    n, per = 128, 200
    bufs = [dev.buffer(n, "uint32") for _ in range(8)]
    for b in bufs:
        dev.write(b, np.zeros(n, np.uint32))
    dev.device_sync()
    k = dev.kernel("inc_u32")
    errors = []

    def work(b):
        try:
            L = k.prepare(1, n, (b, n))
            for _ in range(per):
                L()
            dev.sync()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(b,)) for b in bufs]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    for b in bufs:
        assert list(dev.read(b, np.empty(n, np.uint32)).wait()) == [per] * n


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_python_callable_kernel_runs_on_a_worker(dev):
    import ctypes
    seen = []

    def k(ctx, args):
        grid, block, bidx, tidx = ctx
        i = bidx[0] * block[0] + tidx[0]
        (ctypes.c_float * 8).from_address(args[0])[i] = i * 2.0
        seen.append(threading.current_thread() is not threading.main_thread())

    dev.host_kernel("py_fill", k, "P")
    x = dev.buffer(8, "float32")
    dev.kernel("py_fill").launch(2, 4, (x,))
    assert list(dev.read(x, np.empty(8, np.float32)).wait()) == [i * 2.0 for i in range(8)]
    assert seen == [True] * 8

    def bad(ctx, args):
        raise RuntimeError("boom")

    dev.host_kernel("py_bad", bad)
    dev.kernel("py_bad").launch(1, 1, ())
    with pytest.raises(ruda.EUNHEALTHY):
        dev.sync()


def test_views_are_bindings(dev):
    b = dev.buffer(16, "uint32")
    dev.write(b, np.zeros(16, np.uint32))
    v = dev.view(b, 8 * 4, 8 * 4)
    assert v.nbytes == 32 and v.offset == 32
    dev.kernel("inc_u32").launch(1, 8, (v, 8))
    assert list(dev.read(b, np.empty(16, np.uint32)).wait()) == [0] * 8 + [1] * 8
    with pytest.raises(ValueError):
        dev.view(b, 60, 8)
    with pytest.raises(ValueError):
        v.free()


def test_free_and_stale_handles(dev):
    b = dev.buffer(8)
    b.free()
    assert b.freed
    with pytest.raises(ruda.EFREE):
        b.free()
    with pytest.raises(ruda.ENOTFOUND):
        dev.write(b, bytes(8))


def test_closed_device_refuses_calls_and_finishes_futures():
    d = ruda.Device(backend="host", streams=2)
    b = d.buffer(4)
    d.write(b, b"abcd")
    f = d.read(b)
    d.close()
    assert d.closed
    assert bytes(f.wait()) == b"abcd"  # waited by close, result kept
    with pytest.raises(ruda.ECLOSED):
        d.buffer(4)
    d.close()  # twice is harmless
    del b  # freeing after close is a no-op


def test_config_keywords_win_over_the_environment(monkeypatch):
    monkeypatch.setenv("RUDA_STREAMS", "3")
    with ruda.Device(backend="host") as d:
        assert d.num_streams == 3 and d.backend == "host"
        assert d.num_lanes == 6  # two device streams a worker by default, one used before a library
    with ruda.Device(backend="host", streams=5) as d:
        assert d.num_streams == 5
    with ruda.Device(backend="host", streams=2, lanes=8) as d:
        assert d.num_lanes == 16
    with pytest.raises(ruda.EINVAL):
        ruda.Device(backend="host", lanes=33)
    with pytest.raises(ruda.EINVAL):
        ruda.Device(backend="host", streams=0)
    with pytest.raises(ValueError):
        ruda.Device(backend="tpu")


def test_device_sync_collects_every_streams_errors(dev):
    for s in (1, 2):
        dev.kernel("fail").launch(1, 1, (-41,), stream=s)
    with pytest.raises(ruda.EUNHEALTHY) as e:
        dev.device_sync()
    assert sorted(x.stream for x in e.value.all()) == [1, 2]


def test_close_raises_the_errors_still_queued():
    d = ruda.Device(backend="host", streams=2)
    d.load_host_kernels(__import__("conftest").KERNELS, {"fail": "i"})
    d.kernel("fail").launch(1, 1, (-41,), stream=4)
    with pytest.raises(ruda.EUNHEALTHY):
        d.close()
    assert d.closed
