"""Pickling dlbridge.Tensor: protocol 5 out of band (zero-copy when the
receiver keeps the buffers), protocols 0-4 in band, every dtype and layout,
read-only kept, read-only buffers never exposed as writable, and a rebuild
that rejects hostile input with clean exceptions."""

import copy
import ctypes
import pickle

import numpy as np
import pytest

import dlbridge as dlb
from dlbridge import _core


def dumps5(t):
    """Pickle with protocol 5, collecting the out-of-band buffers."""
    bufs = []
    data = pickle.dumps(t, protocol=5, buffer_callback=bufs.append)
    return data, bufs


def buffer_address(pb):
    """Address of the first byte of a PickleBuffer's memory."""
    mv = pb.raw()
    return np.frombuffer(mv, dtype=np.uint8).__array_interface__["data"][0]


def test_protocol5_out_of_band_zero_copy():
    a = np.arange(1 << 16, dtype=np.float32).reshape(256, 256)
    t = dlb.from_dlpack(a)
    data, bufs = dumps5(t)
    assert len(bufs) == 1
    assert len(data) < 512  # no element bytes in band
    assert bufs[0].raw().nbytes == t.nbytes
    assert buffer_address(bufs[0]) == t.data_ptr
    r = pickle.loads(data, buffers=bufs)
    assert isinstance(r, dlb.Tensor)
    assert r.data_ptr == t.data_ptr  # the receiver's tensor IS the buffer
    assert r.shape == t.shape and r.dtype == "float32" and not r.readonly
    np.testing.assert_array_equal(np.from_dlpack(r), a)
    # Writes go through to the same memory.
    np.from_dlpack(r)[0, 0] = -1
    assert a[0, 0] == -1


@pytest.mark.parametrize("protocol", [0, 2, 4])
def test_in_band_protocols(protocol):
    a = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    t = dlb.from_dlpack(a)
    r = pickle.loads(pickle.dumps(t, protocol=protocol))
    assert r.data_ptr != t.data_ptr
    assert not r.readonly  # writable: the data was copied out of the bytes
    np.testing.assert_array_equal(np.from_dlpack(r), a)
    np.from_dlpack(r)[0, 0, 0] = 99  # really writable
    assert a[0, 0, 0] == 0


def test_protocol5_without_callback_is_in_band():
    a = np.arange(10, dtype=np.float64)
    t = dlb.from_dlpack(a)
    data = pickle.dumps(t, protocol=5)
    assert len(data) > a.nbytes
    r = pickle.loads(data)
    assert not r.readonly and r.data_ptr != t.data_ptr
    np.testing.assert_array_equal(np.from_dlpack(r), a)


def _tensors_of_every_dtype():
    torch = pytest.importorskip("torch")
    out = {
        "bool": dlb.from_dlpack(np.array([True, False, True])),
        "int8": dlb.from_dlpack(np.arange(-4, 4, dtype=np.int8)),
        "uint64": dlb.from_dlpack(np.arange(5, dtype=np.uint64) << 40),
        "float16": dlb.from_dlpack(np.linspace(0, 1, 7, dtype=np.float16)),
        "complex64": dlb.from_dlpack(np.arange(4) * (1 + 2j)).copy(),
        "complex128": dlb.from_dlpack(np.arange(3, dtype=np.complex128) * 1j),
        "bfloat16": dlb.from_dlpack(torch.arange(9, dtype=torch.bfloat16)),
        "float8_e4m3fn": dlb.from_dlpack(
            torch.arange(6, dtype=torch.float32).to(torch.float8_e4m3fn)),
    }
    return out


@pytest.mark.parametrize("oob", [True, False])
def test_every_dtype(oob):
    for name, t in _tensors_of_every_dtype().items():
        if oob:
            data, bufs = dumps5(t)
            assert len(bufs) == 1, name
            r = pickle.loads(data, buffers=bufs)
            assert r.data_ptr == t.data_ptr, name
        else:
            r = pickle.loads(pickle.dumps(t, protocol=4))
        assert r.dtype == t.dtype, name
        assert r.shape == t.shape, name
        raw = lambda x: bytes(np.from_dlpack(dlb.from_dlpack(x)).view(np.uint8)) \
            if x.dtype.name in ("bool", "int8", "uint64", "float16", "complex64",
                                "complex128") else None
        if raw(t) is not None:
            assert raw(r) == raw(t), name
    torch = pytest.importorskip("torch")
    bf = _tensors_of_every_dtype()["bfloat16"]
    data, bufs = dumps5(bf)
    assert torch.equal(torch.from_dlpack(pickle.loads(data, buffers=bufs)),
                       torch.arange(9, dtype=torch.bfloat16))


def test_subbyte_dtype():
    t = dlb.zeros((10,), dtype="int4")
    data, bufs = dumps5(t)
    assert bufs[0].raw().nbytes == t.nbytes == 5
    r = pickle.loads(data, buffers=bufs)
    assert r.dtype == "int4" and r.shape == (10,)
    r2 = pickle.loads(pickle.dumps(t, protocol=2))
    assert r2.dtype == "int4" and r2.nbytes == 5


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2)])
def test_zero_d_and_empty(shape):
    a = np.full(shape, 7, dtype=np.int64)
    t = dlb.from_dlpack(a)
    for r in (pickle.loads(*[pickle.dumps(t, protocol=4)]),
              pickle.loads(dumps5(t)[0], buffers=dumps5(t)[1])):
        assert r.shape == shape
        np.testing.assert_array_equal(np.from_dlpack(r), a)


def test_fortran_order_sent_without_copy():
    a = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    t = dlb.from_dlpack(a)
    data, bufs = dumps5(t)
    assert buffer_address(bufs[0]) == t.data_ptr
    r = pickle.loads(data, buffers=bufs)
    assert r.strides == t.strides and r.data_ptr == t.data_ptr
    np.testing.assert_array_equal(np.from_dlpack(r), a)


@pytest.mark.parametrize("make", [
    lambda a: a[:, ::2],        # gaps
    lambda a: a[::-1],          # negative strides
    lambda a: np.broadcast_to(a[:1], (4, 6)),  # zero strides
])
def test_other_layouts_copied_once_to_row_major(make):
    a = np.arange(24, dtype=np.float64).reshape(4, 6)
    v = make(a)
    t = dlb.from_dlpack(v)
    data, bufs = dumps5(t)
    assert len(bufs) == 1
    assert bufs[0].raw().nbytes == v.size * 8  # only the elements travel
    r = pickle.loads(data, buffers=bufs)
    assert r.is_contiguous
    np.testing.assert_array_equal(np.from_dlpack(r), v)


def test_read_only_kept():
    a = np.arange(6, dtype=np.float32)
    a.flags.writeable = False
    t = dlb.from_dlpack(a)
    assert t.readonly
    data, bufs = dumps5(t)
    assert bufs[0].raw().readonly
    r = pickle.loads(data, buffers=bufs)
    assert r.readonly and r.data_ptr == t.data_ptr
    for protocol in (2, 4, 5):
        assert pickle.loads(pickle.dumps(t, protocol=protocol)).readonly


def test_read_only_buffer_gives_read_only_tensor():
    # Ray's object store hands the buffers back read-only.
    a = np.arange(8, dtype=np.int16)
    t = dlb.from_dlpack(a)
    data, bufs = dumps5(t)
    ro = [memoryview(bytes(b.raw())) for b in bufs]
    r = pickle.loads(data, buffers=ro)
    assert r.readonly  # never exposed as writable
    assert memoryview(r).readonly
    assert not np.from_dlpack(r).flags.writeable
    with pytest.raises(TypeError, match="not writable"):
        (ctypes.c_char * 16).from_buffer(r)
    np.testing.assert_array_equal(np.from_dlpack(r), a)


def test_rebuild_from_bytes_and_memoryview_formats():
    a = np.arange(4, dtype=np.float64)
    r = _core._rebuild_tensor(memoryview(a), (2, 64, 1), (4,), None, 0, False)
    assert r.data_ptr == a.__array_interface__["data"][0]
    np.testing.assert_array_equal(np.from_dlpack(r), a)
    r = _core._rebuild_tensor(a.tobytes(), (2, 64, 1), (2, 2), None, 0, False)
    assert r.readonly and r.tolist() == [[0.0, 1.0], [2.0, 3.0]]


def test_misaligned_buffer_is_copied():
    raw = bytearray(8 * 4 + 1)
    mv = memoryview(raw)[1:]
    r = _core._rebuild_tensor(mv, (2, 64, 1), (4,), None, 0, False)
    assert r.data_ptr % 8 == 0
    assert r.tolist() == [0.0] * 4


@pytest.mark.parametrize("args, exc", [
    ((b"\0" * 8, (2, 32, 1), (3,), None, 0, False), ValueError),  # too short
    ((b"\0" * 8, (2, 32, 1), (1 << 62, 1 << 62), None, 0, False), ValueError),
    ((b"\0" * 8, (2, 32, 1), (-1,), None, 0, False), ValueError),
    ((b"\0" * 8, (2, 32, 1), (2,), (1 << 62,), 0, False), ValueError),
    ((b"\0" * 8, (2, 32, 1), (2,), (-1,), 0, False), ValueError),
    ((b"\0" * 8, (2, 32, 1), (2,), (1, 1), 0, False), ValueError),
    ((b"\0" * 8, (2, 33, 1), (1,), None, 0, False), ValueError),  # bad dtype
    ((b"\0" * 8, (99, 32, 1), (1,), None, 0, False), ValueError),
    ((b"\0" * 8, (2, 32), (1,), None, 0, False), ValueError),
    ((b"\0" * 8, "float32", (1,), None, 0, False), ValueError),
    ((b"\0" * 8, (2, 32, 1), (1,) * 65, None, 0, False), ValueError),
    ((b"\0" * 8, (2, 32, 1), [2], None, 0, False), ValueError),
    ((b"\0" * 8, (2, 32, 1), (2,), None, 0, False, 1), TypeError),
    ((12345, (2, 32, 1), (1,), None, 0, False), TypeError),  # not a buffer
    ((np.arange(8)[::2], (2, 32, 1), (1,), None, 0, False), ValueError),
    ((b"\0" * 8, (2, 32, 1), (10 ** 30,), None, 0, False), ValueError),
])
def test_hostile_rebuild_raises_cleanly(args, exc):
    with pytest.raises(exc):
        _core._rebuild_tensor(*args)


def test_hostile_pickle_stream():
    t = dlb.from_dlpack(np.arange(4, dtype=np.float32))
    data, bufs = dumps5(t)
    with pytest.raises(ValueError):
        pickle.loads(data, buffers=[memoryview(b"\0" * 3)])


def test_deepcopy_and_copy():
    a = np.arange(5, dtype=np.float32)
    t = dlb.from_dlpack(a)
    d = copy.deepcopy(t)
    assert d.data_ptr != t.data_ptr and d.tolist() == t.tolist()


def test_framework_tensors_through_pickle5():
    torch = pytest.importorskip("torch")
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    t = dlb.from_dlpack(x)
    data, bufs = dumps5(t)
    r = pickle.loads(data, buffers=bufs)
    y = dlb.convert(r, "torch")
    assert y.data_ptr() == x.data_ptr()
    assert torch.equal(y, x)


def test_device_tensor_pickles_through_host_copy(tp):
    # A CUDA tensor travels through a host copy (test_cuda_fake.py); with no
    # CUDA driver here the copy cannot be made, and pickling says why
    # instead of sending garbage.
    t = dlb.from_dlpack(tp.Producer(shape=(4,), dtype=(2, 32, 1), device=(2, 0)))
    assert t.device == "cuda:0"
    for protocol in (2, 5):
        with pytest.raises(BufferError):
            pickle.dumps(t, protocol=protocol)
