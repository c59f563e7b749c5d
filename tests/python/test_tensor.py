"""dlbridge.Tensor, DType and Device: factories, attributes, tolist, repr,
buffer protocol and the array interfaces."""

import math
import struct
import sys
import weakref

import pytest

import dlbridge as dlb


# ---- DType ------------------------------------------------------------------

ALL_NAMES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
    "uint64", "float16", "float32", "float64", "bfloat16", "complex32",
    "complex64", "complex128", "float8_e4m3fn", "float8_e5m2",
    "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "int4",
    "float4_e2m1fn", "float6_e2m3fn",
]


@pytest.mark.parametrize("name", ALL_NAMES)
def test_dtype_roundtrip_name(name):
    d = dlb.dtype(name)
    assert isinstance(d, dlb.DType)
    assert d.name == name and str(d) == name
    assert d == name and not (d != name)
    assert d == dlb.dtype(name)
    assert hash(d) == hash(name)
    assert repr(d) == f"dlbridge.dtype('{name}')"


def test_dtype_fields():
    d = dlb.dtype("float32")
    assert (d.code, d.bits, d.lanes, d.itemsize) == (2, 32, 1, 4)
    b = dlb.dtype("bfloat16")
    assert (b.code, b.bits, b.lanes, b.itemsize) == (4, 16, 1, 2)
    c = dlb.dtype("complex64")
    assert (c.code, c.bits, c.lanes, c.itemsize) == (5, 64, 1, 8)
    assert dlb.dtype("bool").code == 6
    # sub-byte: itemsize is padded to whole bytes
    assert dlb.dtype("int4").itemsize == 1
    assert dlb.dtype("float32x4").itemsize == 16
    assert dlb.dtype("float32x4").lanes == 4


def test_dtype_inequality_and_types():
    assert dlb.dtype("float32") != dlb.dtype("float64")
    assert dlb.dtype("float32") != "float64"
    assert dlb.dtype("float32") != 32
    assert dlb.dtype(dlb.dtype("int8")) == "int8"
    assert {dlb.dtype("int8"): 1}["int8"] == 1


def test_dtype_builtins():
    assert dlb.dtype(bool) == "bool"
    assert dlb.dtype(int) == "int64"
    assert dlb.dtype(float) == "float64"
    assert dlb.dtype(complex) == "complex128"


def test_dtype_errors():
    with pytest.raises(ValueError, match="float33"):
        dlb.dtype("float33")
    with pytest.raises(TypeError):
        dlb.dtype(3.5)
    with pytest.raises(TypeError):
        dlb.dtype(None)
    with pytest.raises(TypeError):
        dlb.DType()


def test_dtype_numpy():
    np = pytest.importorskip("numpy")
    for n in ["bool", "int8", "uint16", "int32", "int64", "float16",
              "float32", "float64", "complex64", "complex128"]:
        assert dlb.dtype(np.dtype(n)) == n
        assert dlb.dtype(getattr(np, n if n != "bool" else "bool_")) == n
    assert dlb.dtype(np.longlong) == "int64"
    with pytest.raises(ValueError):
        dlb.dtype(np.dtype(">f4"))
    with pytest.raises(ValueError):
        dlb.dtype(np.dtype("U3"))
    with pytest.raises(ValueError):
        dlb.dtype(np.dtype(object))


def test_dtype_torch():
    torch = pytest.importorskip("torch")
    pairs = {
        torch.float32: "float32", torch.float64: "float64",
        torch.float16: "float16", torch.bfloat16: "bfloat16",
        torch.int8: "int8", torch.int16: "int16", torch.int32: "int32",
        torch.int64: "int64", torch.uint8: "uint8", torch.bool: "bool",
        torch.complex64: "complex64", torch.complex128: "complex128",
        torch.complex32: "complex32", torch.chalf: "complex32",
    }
    for name in ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                 "float8_e5m2fnuz", "float8_e8m0fnu", "uint16", "uint32",
                 "uint64"]:
        if hasattr(torch, name):
            pairs[getattr(torch, name)] = name
    for tdt, name in pairs.items():
        assert dlb.dtype(tdt) == name, tdt
    with pytest.raises(ValueError):
        dlb.dtype(torch.quint8)


# ---- Device ---------------------------------------------------------------------


def test_device_basic():
    d = dlb.device("cuda:1")
    assert isinstance(d, dlb.Device)
    assert (d.type, d.id, d.name) == (2, 1, "cuda")
    assert str(d) == "cuda:1"
    assert repr(d) == "dlbridge.device('cuda:1')"
    assert d == "cuda:1" and d == (2, 1) and d == dlb.device((2, 1))
    assert d != "cuda:0" and d != (2, 0) and d != "nonsense" and d != (2,)
    assert hash(d) == hash((2, 1))


def test_device_cpu():
    c = dlb.device("cpu")
    assert str(c) == "cpu" and repr(c) == "dlbridge.device('cpu')"
    assert c == "cpu" and c == "cpu:0" and c == (1, 0)
    assert dlb.device(None) == c
    assert dlb.device((1, 0)) == c
    assert dlb.device(c) is c
    assert str(dlb.device("cuda")) == "cuda:0"


def test_device_errors():
    with pytest.raises(ValueError):
        dlb.device("tpuu:0")
    with pytest.raises(ValueError):
        dlb.device("cuda:-1")
    with pytest.raises(ValueError):
        dlb.device((0, 0))  # no device type (5, unassigned, is "device5")
    with pytest.raises(ValueError):
        dlb.device((2, -1))
    with pytest.raises(ValueError):
        dlb.device((2, 0, 1))
    with pytest.raises(TypeError):
        dlb.device(("cuda", 0))
    with pytest.raises(TypeError):
        dlb.device(1.0)
    with pytest.raises(TypeError):
        dlb.Device()


# ---- factories ---------------------------------------------------------------------


def test_empty_zeros_shapes():
    for shape, expect in [(3, (3,)), ((2, 3), (2, 3)), ([4], (4,)),
                          ((), ()), ((0, 5), (0, 5))]:
        t = dlb.zeros(shape)
        assert t.shape == expect
        assert t.dtype == "float32"
        assert t.device == "cpu"
        assert t.readonly is False
        assert t.is_contiguous is True
        assert t.size == math.prod(expect)
        assert t.nbytes == 4 * t.size
        e = dlb.empty(shape, dtype="int16")
        assert e.shape == expect and e.itemsize == 2
    z = dlb.zeros((2, 3), "float64")
    assert z.tolist() == [[0.0] * 3] * 2
    assert z.strides == (3, 1)
    assert dlb.zeros(shape=(2,), dtype=dlb.dtype("int8"), device="cpu").tolist() == [0, 0]


def test_factory_errors():
    with pytest.raises(ValueError):
        dlb.zeros((2, -1))
    with pytest.raises(ValueError):
        dlb.empty(-3)
    with pytest.raises(TypeError):
        dlb.zeros("abc")
    with pytest.raises(TypeError):
        dlb.zeros((2.5,))
    with pytest.raises(TypeError):
        dlb.zeros((2,), bogus=1)
    with pytest.raises(TypeError):
        dlb.zeros()
    with pytest.raises(ValueError):
        dlb.zeros((2,), dtype="nope")
    with pytest.raises(BufferError, match="vulkan"):
        dlb.zeros((2,), device="vulkan:0")
    with pytest.raises(BufferError):
        dlb.zeros((1,) * 65)
    with pytest.raises((ValueError, MemoryError, OverflowError)):
        dlb.empty((2**62, 2**62))


def test_subbyte_nbytes_packed():
    t = dlb.zeros((3,), dtype="int4")
    assert t.itemsize == 1
    assert t.nbytes == 2  # 12 bits, packed


def test_tensor_inference():
    assert dlb.tensor([True, False]).dtype == "bool"
    assert dlb.tensor([1, 2]).dtype == "int64"
    assert dlb.tensor([1, 2.0]).dtype == "float64"
    assert dlb.tensor([1, 2j]).dtype == "complex128"
    assert dlb.tensor([True, 2]).dtype == "int64"
    assert dlb.tensor([]).dtype == "float64"
    assert dlb.tensor([]).shape == (0,)
    assert dlb.tensor([[], []]).shape == (2, 0)
    s = dlb.tensor(3.5)
    assert s.shape == () and s.ndim == 0 and s.tolist() == 3.5
    assert dlb.tensor(((1, 2), [3, 4])).tolist() == [[1, 2], [3, 4]]


def test_tensor_explicit_dtypes():
    assert dlb.tensor([1, 2], dtype="float32").tolist() == [1.0, 2.0]
    with pytest.raises(TypeError):          # no silent truncation
        dlb.tensor([1.9, -1.9], dtype="int32")
    assert dlb.tensor([0, 1], dtype="bool").tolist() == [False, True]
    with pytest.raises(OverflowError):      # 0 or 1 only, as Function
        dlb.tensor([0, 3], dtype="bool")
    assert dlb.tensor([1 + 2j], dtype="complex64").tolist() == [1 + 2j]
    assert dlb.tensor([1 + 2j], dtype="complex32").tolist() == [1 + 2j]
    assert dlb.tensor([0.5, 1.0], dtype="float16").tolist() == [0.5, 1.0]
    assert dlb.tensor([1.0, 3.0], dtype="bfloat16").tolist() == [1.0, 3.0]
    assert dlb.tensor([2**64 - 1], dtype="uint64").tolist() == [2**64 - 1]
    assert dlb.tensor([-2**63], dtype="int64").tolist() == [-2**63]


def test_tensor_range_checks():
    with pytest.raises(OverflowError):
        dlb.tensor([300], dtype="int8")
    with pytest.raises(OverflowError):
        dlb.tensor([-1], dtype="uint8")
    with pytest.raises(OverflowError):
        dlb.tensor([2**64], dtype="uint64")
    with pytest.raises(OverflowError):
        dlb.tensor([2**63])
    with pytest.raises(OverflowError):
        dlb.tensor([1e300], dtype="float32")
    with pytest.raises(OverflowError):
        dlb.tensor([1e10], dtype="float16")
    with pytest.raises(TypeError):          # floats are never truncated
        dlb.tensor([float("nan")], dtype="int32")
    with pytest.raises(TypeError):
        dlb.tensor([1.5], dtype="int32")
    with pytest.raises(TypeError):
        dlb.tensor([1j], dtype="float64")
    assert math.isnan(dlb.tensor([float("nan")], dtype="float32").tolist()[0])
    assert dlb.tensor([float("inf")], dtype="bfloat16").tolist() == [math.inf]


def test_tensor_errors():
    with pytest.raises(ValueError):
        dlb.tensor([[1, 2], [3]])
    with pytest.raises(ValueError):
        dlb.tensor([[1, 2], 3])
    with pytest.raises(ValueError):
        dlb.tensor([1, [2]])
    with pytest.raises(TypeError):
        dlb.tensor(["a"])
    with pytest.raises(TypeError):
        dlb.tensor([None])
    with pytest.raises(TypeError):
        dlb.tensor([1], dtype="float8_e4m3fn")
    with pytest.raises((BufferError, ValueError), match="cuda"):
        dlb.tensor([1], device="cuda")


def test_tensor_numpy_scalars():
    np = pytest.importorskip("numpy")
    t = dlb.tensor([np.int8(3), np.int64(4)])
    assert t.dtype == "int64" and t.tolist() == [3, 4]
    assert dlb.tensor([np.float32(1.5)]).dtype == "float64"
    assert dlb.tensor([np.True_, np.False_]).dtype == "bool"
    assert dlb.tensor([np.complex64(1 + 1j)]).tolist() == [1 + 1j]


def test_not_constructible():
    with pytest.raises(TypeError, match="from_dlpack"):
        dlb.Tensor()


# ---- attributes ----------------------------------------------------------------------


def test_attributes():
    t = dlb.tensor([[1, 2, 3], [4, 5, 6]], dtype="int16")
    assert t.shape == (2, 3)
    assert t.strides == (3, 1)
    assert t.ndim == 2
    assert t.size == 6
    assert t.itemsize == 2
    assert t.nbytes == 12
    assert isinstance(t.dtype, dlb.DType) and t.dtype == "int16"
    assert isinstance(t.device, dlb.Device) and t.device == "cpu"
    assert isinstance(t.data_ptr, int) and t.data_ptr != 0
    assert t.readonly is False
    assert t.is_contiguous is True
    assert len(t) == 2
    assert t.__dlpack_device__() == (1, 0)


def test_len_0d():
    with pytest.raises(TypeError):
        len(dlb.tensor(1))


def test_weakref():
    t = dlb.zeros(3)
    r = weakref.ref(t)
    assert r() is t
    del t
    assert r() is None


def test_strided_views_from_numpy():
    np = pytest.importorskip("numpy")
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    v = a[::2, ::-3]
    t = dlb.from_dlpack(v)
    assert t.shape == v.shape
    assert t.strides == tuple(s // 4 for s in v.strides)
    assert t.is_contiguous is False
    assert t.tolist() == v.tolist()
    assert t.data_ptr == v.ctypes.data
    c = t.copy()
    assert c.is_contiguous and c.tolist() == v.tolist()
    assert c.data_ptr != t.data_ptr
    # size-1 dims do not break contiguity
    assert dlb.from_dlpack(a[1:2, :]).is_contiguous


# ---- tolist / repr -------------------------------------------------------------------------


@pytest.mark.parametrize("name,values", [
    ("bool", [True, False]),
    ("int8", [-128, 127]), ("uint8", [0, 255]),
    ("int16", [-32768, 32767]), ("uint16", [0, 65535]),
    ("int32", [-2**31, 2**31 - 1]), ("uint32", [0, 2**32 - 1]),
    ("int64", [-2**63, 2**63 - 1]), ("uint64", [0, 2**64 - 1]),
    ("float16", [0.5, -65504.0]), ("float32", [0.25, -1.5]),
    ("float64", [1e300, -0.1]), ("bfloat16", [1.5, -256.0]),
    ("complex32", [1 + 2j, -0.5j]), ("complex64", [1.5 + 2j, -3j]),
    ("complex128", [1e300 + 1j, 0j]),
])
def test_tolist_every_dtype(name, values):
    t = dlb.tensor(values, dtype=name)
    out = t.tolist()
    assert out == values
    assert type(out[0]) is type(values[0])
    assert dlb.tensor(values[0], dtype=name).tolist() == values[0]
    assert dlb.tensor([values, values], dtype=name).tolist() == [values, values]


def test_tolist_unsupported():
    for name in ["float8_e4m3fn", "int4", "float32x4"]:
        with pytest.raises((BufferError, TypeError)):
            dlb.zeros((2,), dtype=name).tolist()


def test_tolist_empty():
    assert dlb.zeros((2, 0)).tolist() == [[], []]
    assert dlb.zeros((0, 2)).tolist() == []


def test_repr():
    t = dlb.tensor([[1.0, 2.0], [3.0, 4.0]], dtype="float32")
    r = repr(t)
    assert r.startswith("dlbridge.Tensor([[1.0, 2.0], [3.0, 4.0]]")
    assert "shape=(2, 2)" in r and "dtype=float32" in r and "device=cpu" in r
    big = repr(dlb.zeros((100, 100)))
    assert "..." in big and "shape=(100, 100)" in big and len(big) < 200
    assert "float8_e4m3fn" in repr(dlb.zeros(3, dtype="float8_e4m3fn"))


def test_repr_readonly():
    np = pytest.importorskip("numpy")
    a = np.arange(3.0)
    a.flags.writeable = False
    t = dlb.from_dlpack(a)
    assert t.readonly is True
    assert "readonly=True" in repr(t)


# ---- copy ------------------------------------------------------------------------------------


def test_copy():
    t = dlb.tensor([[1, 2], [3, 4]], dtype="int32")
    c = t.copy()
    assert c.tolist() == t.tolist() and c.dtype == t.dtype
    assert c.data_ptr != t.data_ptr
    c2 = t.copy(device="cpu")
    assert c2.tolist() == t.tolist()
    with pytest.raises((BufferError, ValueError), match="cuda"):
        t.copy(device="cuda:0")
    with pytest.raises(TypeError):
        t.copy("cpu")
    assert dlb.tensor(5).copy().tolist() == 5


def test_copy_of_readonly_is_writable():
    np = pytest.importorskip("numpy")
    a = np.arange(3.0)
    a.flags.writeable = False
    c = dlb.from_dlpack(a).copy()
    assert c.readonly is False
    memoryview(c)[0] = 5.0  # writable buffer
    assert c.tolist()[0] == 5.0


# ---- buffer protocol ------------------------------------------------------------------------


@pytest.mark.parametrize("name,fmt", [
    ("bool", "?"), ("int8", "b"), ("uint8", "B"), ("int16", "h"),
    ("uint16", "H"), ("int32", "i"), ("uint32", "I"), ("int64", "q"),
    ("uint64", "Q"), ("float16", "e"), ("float32", "f"), ("float64", "d"),
    ("complex64", "Zf"), ("complex128", "Zd"),
])
def test_buffer_formats(name, fmt):
    t = dlb.zeros((2, 3), dtype=name)
    m = memoryview(t)
    assert m.format == fmt
    assert m.shape == (2, 3)
    assert m.itemsize == t.itemsize
    assert m.strides == (3 * t.itemsize, t.itemsize)
    assert m.readonly is False
    assert m.nbytes == t.nbytes
    if fmt not in ("Zf", "Zd"):
        assert struct.calcsize(fmt) == t.itemsize


def test_buffer_write_through():
    t = dlb.zeros((3,), dtype="float64")
    m = memoryview(t)
    m[1] = 2.5
    assert t.tolist() == [0.0, 2.5, 0.0]
    m.release()


def test_buffer_refuses_unknown_format():
    for name in ["bfloat16", "float8_e4m3fn", "complex32", "int4"]:
        with pytest.raises(BufferError):
            memoryview(dlb.zeros(2, dtype=name))


def test_buffer_readonly():
    np = pytest.importorskip("numpy")
    a = np.arange(4.0)
    a.flags.writeable = False
    t = dlb.from_dlpack(a)
    m = memoryview(t)
    assert m.readonly
    with pytest.raises(TypeError):
        m[0] = 1.0
    # a writable request (PyBUF_WRITABLE) is refused with BufferError
    with pytest.raises(BufferError, match="read-only"):
        _get_buffer(t, PyBUF_WRITABLE)
    _get_buffer(t, 0)  # a read-only request is fine
    # the same request on a writable tensor succeeds
    _get_buffer(dlb.zeros(2), PyBUF_WRITABLE)


PyBUF_WRITABLE = 0x0001
PyBUF_FORMAT = 0x0004


def _get_buffer(obj, flags):
    """PyObject_GetBuffer with exactly these flags, released at once."""
    import ctypes
    buf = ctypes.create_string_buffer(256)  # >= sizeof(Py_buffer)
    # Private prototypes (never set argtypes on ctypes.pythonapi.X: that is
    # shared with every other test module).
    get = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_void_p,
                            ctypes.c_int)(("PyObject_GetBuffer",
                                           ctypes.pythonapi))
    release = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)(("PyBuffer_Release",
                                                        ctypes.pythonapi))
    get(obj, ctypes.addressof(buf), flags)  # raises the set exception
    # Py_buffer starts with void *buf, PyObject *obj, Py_ssize_t len
    length = ctypes.c_ssize_t.from_buffer(buf, 16).value
    itemsize = ctypes.c_ssize_t.from_buffer(buf, 24).value
    release(ctypes.addressof(buf))
    return length, itemsize


def test_buffer_raw_bytes_without_format():
    # No PyBUF_FORMAT: a consumer that wants raw bytes gets bfloat16 data
    # with its true itemsize.
    t = dlb.tensor([1.0, 2.0, 3.0], dtype="bfloat16")
    assert _get_buffer(t, 0) == (6, 2)
    with pytest.raises(BufferError):
        _get_buffer(t, PyBUF_FORMAT)
    with pytest.raises(BufferError):
        _get_buffer(dlb.zeros(4, dtype="int4"), 0)


def test_buffer_strided_and_negative():
    np = pytest.importorskip("numpy")
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    v = a[::-1, ::2]
    t = dlb.from_dlpack(v)
    m = memoryview(t)
    assert m.strides == v.strides
    assert m.tolist() == v.tolist()
    back = np.asarray(m)
    assert np.array_equal(back, v)
    assert back.ctypes.data == v.ctypes.data
    # a contiguous-only request is refused for a non-contiguous tensor
    with pytest.raises(BufferError):
        _get_buffer(t, 0)  # PyBUF_SIMPLE: one flat run of bytes
    assert bytes(t) == v.tobytes()  # CPython copies through the strides


def test_buffer_0d_and_empty():
    m = memoryview(dlb.tensor(7, dtype="int32"))
    assert m.shape == () and m.tolist() == 7
    e = memoryview(dlb.zeros((0, 3), dtype="float32"))
    assert e.shape == (0, 3) and e.nbytes == 0


def test_buffer_exports_keep_tensor_alive():
    t = dlb.tensor([1, 2, 3], dtype="int8")
    base = sys.getrefcount(t)
    m = memoryview(t)
    assert sys.getrefcount(t) == base + 1
    m.release()
    assert sys.getrefcount(t) == base


# ---- __array_interface__ -------------------------------------------------------------------------


def test_array_interface_numpy_shares_memory():
    np = pytest.importorskip("numpy")
    t = dlb.tensor([[1.0, 2.0], [3.0, 4.0]], dtype="float32")
    ai = t.__array_interface__
    assert ai["version"] == 3
    assert ai["shape"] == (2, 2)
    assert ai["typestr"] == ("<f4" if sys.byteorder == "little" else ">f4")
    assert ai["strides"] is None
    assert ai["data"] == (t.data_ptr, False)
    a = np.asarray(t)
    assert a.ctypes.data == t.data_ptr
    assert a.tolist() == t.tolist()
    a[0, 0] = 9.0
    assert t.tolist()[0][0] == 9.0


def test_array_interface_typestrs():
    pytest.importorskip("numpy")
    o = "<" if sys.byteorder == "little" else ">"
    expect = {"bool": "|b1", "int8": "|i1", "uint8": "|u1", "int16": o + "i2",
              "uint64": o + "u8", "float16": o + "f2", "float64": o + "f8",
              "complex64": o + "c8", "complex128": o + "c16",
              "bfloat16": "|V2", "float8_e5m2": "|V1", "complex32": "|V4"}
    for name, ts in expect.items():
        assert dlb.zeros(2, dtype=name).__array_interface__["typestr"] == ts


def test_array_interface_strided_readonly():
    np = pytest.importorskip("numpy")
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    a.flags.writeable = False
    v = a[:, ::-2]
    t = dlb.from_dlpack(v)
    ai = t.__array_interface__
    assert ai["strides"] == v.strides
    assert ai["data"] == (v.ctypes.data, True)
    b = np.asarray(t)
    assert np.array_equal(b, v)
    assert b.ctypes.data == v.ctypes.data
    assert not b.flags.writeable


def test_array_interface_bfloat16_void():
    np = pytest.importorskip("numpy")
    t = dlb.tensor([1.0, 2.0], dtype="bfloat16")
    a = np.asarray(t)
    assert a.dtype == np.dtype("V2") and a.shape == (2,)
    assert a.view(np.uint16).tolist() == [0x3F80, 0x4000]


def test_cuda_array_interface_absent_on_cpu():
    t = dlb.zeros(3)
    assert not hasattr(t, "__cuda_array_interface__")
    assert hasattr(t, "__array_interface__")


def test_dtype_cache_returns_the_right_dtype_under_collisions():
    # DType objects are cached in a small direct-mapped table; whatever
    # collides, each lookup must give the dtype asked for.
    names = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
             "uint32", "uint64", "float16", "float32", "float64", "bfloat16",
             "complex32", "complex64", "complex128", "float8_e4m3fn",
             "float8_e5m2", "float6_e2m3fn", "float4_e2m1fn", "int4"]
    names += [n + "x%d" % lanes for n in ("float32", "int8", "float16")
              for lanes in (2, 3, 4, 8, 16)]
    for _ in range(3):
        for n in names:
            d = dlb.dtype(n)
            assert d.name == n and d == n
            t = dlb.zeros((1,), dtype=n) if "x" not in n and n not in (
                "int4", "float6_e2m3fn", "float4_e2m1fn") else None
            if t is not None:
                assert t.dtype == n and t.dtype is t.dtype
