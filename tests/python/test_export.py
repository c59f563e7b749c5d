"""Tensor.__dlpack__ / __dlpack_device__: capsule names, versions, flags,
ownership, keyword negotiation, and interop with NumPy and PyTorch."""

import ctypes
import gc
import sys
import threading

import pytest

import dlbridge as dlb

READ_ONLY = 1 << 0
IS_COPIED = 1 << 1


def _capi(name, restype, *argtypes):
    # Private prototypes: setting argtypes on ctypes.pythonapi.X would change
    # them for every other test module in the process.
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


class _api:
    PyCapsule_GetName = _capi("PyCapsule_GetName", ctypes.c_char_p,
                              ctypes.py_object)
    PyCapsule_GetPointer = _capi("PyCapsule_GetPointer", ctypes.c_void_p,
                                 ctypes.py_object, ctypes.c_char_p)
    PyCapsule_SetName = _capi("PyCapsule_SetName", ctypes.c_int,
                              ctypes.py_object, ctypes.c_char_p)

from dlpack_ctypes import DLDataType, DLDevice, DLTensor  # noqa: E402,F401


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_DELETER_V = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
_DELETER_L = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))


def capsule_name(cap):
    return _api.PyCapsule_GetName(cap).decode()


def versioned_struct(cap):
    """The capsule's managed tensor, read in place.  It holds the capsule:
    a capsule nobody took frees its tensor when it dies, and the memory is
    then another allocation's (Python's allocator reuses it at once)."""
    ptr = _api.PyCapsule_GetPointer(cap, b"dltensor_versioned")
    m = DLManagedTensorVersioned.from_address(ptr)
    m.capsule = cap
    return m


def legacy_struct(cap):
    """As versioned_struct, for a legacy capsule."""
    ptr = _api.PyCapsule_GetPointer(cap, b"dltensor")
    m = DLManagedTensor.from_address(ptr)
    m.capsule = cap
    return m


def consume_versioned(cap):
    """Act as a consumer: rename, then run the deleter once."""
    m = versioned_struct(cap)
    assert _api.PyCapsule_SetName(cap, b"used_dltensor_versioned") == 0
    _DELETER_V(m.deleter)(ctypes.pointer(m))


def consume_legacy(cap):
    m = legacy_struct(cap)
    assert _api.PyCapsule_SetName(cap, b"used_dltensor") == 0
    _DELETER_L(m.deleter)(ctypes.pointer(m))


def readonly_tensor():
    np = pytest.importorskip("numpy")
    a = np.arange(6.0).reshape(2, 3)
    a.flags.writeable = False
    t = dlb.from_dlpack(a)
    assert t.readonly
    return t


# ---- capsule names and versions ---------------------------------------------------


def test_legacy_by_default():
    t = dlb.tensor([1.0, 2.0])
    cap = t.__dlpack__()
    assert capsule_name(cap) == "dltensor"
    m = legacy_struct(cap)
    assert m.dl_tensor.data == t.data_ptr
    assert m.dl_tensor.byte_offset == 0
    assert m.dl_tensor.ndim == 1 and m.dl_tensor.shape[0] == 2
    assert m.dl_tensor.strides[0] == 1
    assert (m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits) == (2, 64)
    assert capsule_name(t.__dlpack__(max_version=(0, 8))) == "dltensor"


@pytest.mark.parametrize("mv", [(1, 0), (1, 3), (1, 99), (2, 0)])
def test_versioned(mv):
    t = dlb.tensor([[1, 2, 3], [4, 5, 6]], dtype="int32")
    cap = t.__dlpack__(max_version=mv)
    assert capsule_name(cap) == "dltensor_versioned"
    m = versioned_struct(cap)
    assert (m.major, m.minor) == (1, 3)
    assert m.flags == 0
    d = m.dl_tensor
    assert d.data == t.data_ptr and d.byte_offset == 0
    assert (d.device.device_type, d.device.device_id) == (1, 0)
    assert [d.shape[i] for i in range(2)] == [2, 3]
    assert [d.strides[i] for i in range(2)] == [3, 1]  # always filled


def test_0d_export():
    t = dlb.tensor(3.0)
    m = versioned_struct(t.__dlpack__(max_version=(1, 0)))
    assert m.dl_tensor.ndim == 0


def test_each_export_is_fresh():
    t = dlb.tensor([1, 2])
    c1 = t.__dlpack__(max_version=(1, 0))
    c2 = t.__dlpack__(max_version=(1, 0))
    p1 = _api.PyCapsule_GetPointer(c1, b"dltensor_versioned")
    p2 = _api.PyCapsule_GetPointer(c2, b"dltensor_versioned")
    assert p1 != p2


def test_dlpack_device():
    t = dlb.zeros(2)
    d = t.__dlpack_device__()
    assert d == (1, 0) and type(d) is tuple
    assert all(type(x) is int for x in d)


# ---- ownership -----------------------------------------------------------------------


def test_unconsumed_capsule_releases_tensor():
    t = dlb.zeros((4, 4))
    base = sys.getrefcount(t)
    for kw in ({}, {"max_version": (1, 0)}):
        cap = t.__dlpack__(**kw)
        assert sys.getrefcount(t) == base + 1
        del cap
        assert sys.getrefcount(t) == base


def test_consumed_capsule_deleter_runs_once():
    t = dlb.zeros(3)
    base = sys.getrefcount(t)
    cap = t.__dlpack__(max_version=(1, 0))
    consume_versioned(cap)
    assert sys.getrefcount(t) == base
    del cap  # renamed: the destructor must not run the deleter again
    assert sys.getrefcount(t) == base
    cap = t.__dlpack__()
    consume_legacy(cap)
    del cap
    assert sys.getrefcount(t) == base


def _counting_blocks():
    """Count the core allocator's live blocks from here on (test hook)."""
    from dlbridge import _core
    _core._fail_allocations(-1)
    return lambda: _core._allocation_stats()["live"]


def test_consumer_that_clears_the_destructor_leaks_nothing():
    """A consumer may rename the capsule AND clear its destructor (jaxlib
    does: PyCapsule_SetDestructor(capsule, NULL)), so the destructor never
    runs: the export block must still be freed by the deleter alone."""
    from dlbridge import _core
    set_destructor = _capi("PyCapsule_SetDestructor", ctypes.c_int,
                           ctypes.py_object, ctypes.c_void_p)
    t = dlb.zeros((3, 4))
    base = sys.getrefcount(t)
    live = _counting_blocks()
    try:
        start = live()
        for versioned in (True, False):
            for _ in range(50):
                cap = (t.__dlpack__(max_version=(1, 0)) if versioned
                       else t.__dlpack__())
                m = versioned_struct(cap) if versioned else legacy_struct(cap)
                used = (b"used_dltensor_versioned" if versioned
                        else b"used_dltensor")
                assert _api.PyCapsule_SetName(cap, used) == 0
                assert set_destructor(cap, None) == 0
                del cap                         # no destructor runs
                deleter = _DELETER_V if versioned else _DELETER_L
                deleter(m.deleter)(ctypes.pointer(m))
        assert live() == start
    finally:
        _core._reset_allocations()
    assert sys.getrefcount(t) == base


def test_jax_consuming_exports_leaks_nothing():
    jax = pytest.importorskip("jax")
    from dlbridge import _core
    t = dlb.tensor([[1.0, 2.0], [3.0, 4.0]], dtype="float32")
    jax.dlpack.from_dlpack(t).block_until_ready()     # JAX warmed up
    live = _counting_blocks()
    try:
        start = live()
        for _ in range(50):
            a = jax.dlpack.from_dlpack(t)
            assert float(a[1, 0]) == 3.0
            del a
        gc.collect()
        assert live() == start
    finally:
        _core._reset_allocations()


def test_capsule_keeps_tensor_alive():
    t = dlb.tensor([1.5, 2.5])
    cap = t.__dlpack__(max_version=(1, 0))
    ptr = t.data_ptr
    del t
    gc.collect()
    m = versioned_struct(cap)
    assert m.dl_tensor.data == ptr
    assert ctypes.c_double.from_address(ptr).value == 1.5
    del cap


def test_destructor_preserves_exception():
    """The capsule's destructor, run while an exception is being handled,
    keeps it and drops the capsule's reference to the tensor."""
    t = dlb.zeros(2)
    try:
        cap = t.__dlpack__(max_version=(1, 0))
        raise KeyError("boom")
    except KeyError as e:
        # Both counts are taken in the same block: CPython 3.14+ loads a
        # local without a new reference where it can prove that safe, so a
        # count taken before the try and one after the handler differ by one
        # even for a plain list.
        with_capsule = sys.getrefcount(t)
        del cap
        without = sys.getrefcount(t)
        assert e.args == ("boom",)
        assert sys.exc_info()[0] is KeyError
    assert with_capsule - without == 1   # the capsule's destructor released t


def test_deleter_from_other_thread():
    t = dlb.zeros(8)
    base = sys.getrefcount(t)
    cap = t.__dlpack__(max_version=(1, 0))
    m = versioned_struct(cap)
    assert _api.PyCapsule_SetName(cap, b"used_dltensor_versioned") == 0
    deleter = _DELETER_V(m.deleter)
    # ctypes releases the GIL around the call: the deleter must take it.
    th = threading.Thread(target=lambda: deleter(ctypes.pointer(m)))
    th.start()
    th.join()
    assert sys.getrefcount(t) == base


# ---- read-only and copy ---------------------------------------------------------------


def test_readonly_flag_versioned():
    t = readonly_tensor()
    m = versioned_struct(t.__dlpack__(max_version=(1, 0)))
    assert m.flags & READ_ONLY
    assert not (m.flags & IS_COPIED)


def test_readonly_legacy_refused_without_leak():
    t = readonly_tensor()
    base = sys.getrefcount(t)
    with pytest.raises(BufferError, match="read-only"):
        t.__dlpack__()
    with pytest.raises(BufferError):
        t.__dlpack__(max_version=(0, 8))
    assert sys.getrefcount(t) == base


def test_readonly_legacy_with_copy():
    t = readonly_tensor()
    cap = t.__dlpack__(copy=True)
    assert capsule_name(cap) == "dltensor"
    m = legacy_struct(cap)
    assert m.dl_tensor.data != t.data_ptr


def test_copy_true():
    t = dlb.tensor([[1, 2], [3, 4]], dtype="int16")
    base = sys.getrefcount(t)
    cap = t.__dlpack__(max_version=(1, 0), copy=True)
    m = versioned_struct(cap)
    assert m.flags & IS_COPIED
    assert not (m.flags & READ_ONLY)
    assert m.dl_tensor.data != t.data_ptr
    assert sys.getrefcount(t) == base  # a copy holds no reference
    vals = (ctypes.c_int16 * 4).from_address(m.dl_tensor.data)
    assert list(vals) == [1, 2, 3, 4]
    del cap


def test_copy_true_strided_is_contiguous():
    np = pytest.importorskip("numpy")
    a = np.arange(20, dtype=np.float32).reshape(4, 5)[::-2, 1::2]
    t = dlb.from_dlpack(a)
    b = np.from_dlpack(dlb.from_dlpack(
        _Wrap(t.__dlpack__(max_version=(1, 0), copy=True))))
    assert np.array_equal(b, a)
    assert b.flags.c_contiguous


def test_copy_false_and_none_share():
    t = dlb.zeros(3)
    for c in (False, None):
        m = versioned_struct(t.__dlpack__(max_version=(1, 0), copy=c))
        assert m.dl_tensor.data == t.data_ptr
        assert not (m.flags & IS_COPIED)


def test_copy_readonly_copy_is_writable():
    t = readonly_tensor()
    m = versioned_struct(t.__dlpack__(max_version=(1, 0), copy=True))
    assert m.flags == IS_COPIED


# ---- keyword errors ---------------------------------------------------------------------


def test_stream_rules_cpu():
    t = dlb.zeros(2)
    assert t.__dlpack__(stream=None) is not None
    assert t.__dlpack__(stream=-1) is not None  # documented: no-op on CPU
    for bad in (0, 1, 2, 12345):
        with pytest.raises(ValueError):
            t.__dlpack__(stream=bad)
    for bad in ("1", 1.0, object()):
        with pytest.raises(TypeError):
            t.__dlpack__(stream=bad)


def test_dl_device():
    t = dlb.zeros(2)
    assert capsule_name(t.__dlpack__(dl_device=(1, 0))) == "dltensor"
    cap = t.__dlpack__(max_version=(1, 0), dl_device=(1, 0), copy=False)
    assert versioned_struct(cap).dl_tensor.data == t.data_ptr
    with pytest.raises(BufferError, match="cuda"):
        t.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError):
        t.__dlpack__(dl_device=(2, 0), copy=True)
    with pytest.raises(BufferError):
        t.__dlpack__(dl_device=(99, 0))
    with pytest.raises(TypeError):
        t.__dlpack__(dl_device="cpu")
    with pytest.raises(TypeError):
        t.__dlpack__(dl_device=(1,))


def test_bad_arguments():
    t = dlb.zeros(2)
    with pytest.raises(TypeError):
        t.__dlpack__(None)
    with pytest.raises(TypeError):
        t.__dlpack__(bogus=1)
    with pytest.raises(TypeError):
        t.__dlpack__(max_version=1)
    with pytest.raises(TypeError):
        t.__dlpack__(max_version=(1,))
    with pytest.raises(TypeError):
        t.__dlpack__(max_version=(1, 0, 0))
    with pytest.raises(TypeError):
        t.__dlpack__(max_version=("1", "0"))
    with pytest.raises(TypeError):
        t.__dlpack__(copy=1)
    with pytest.raises(TypeError):
        t.__dlpack__(copy="yes")


def test_keyword_names_not_interned():
    t = dlb.zeros(2)
    key = "".join(["max_", "version"])  # a fresh, non-interned string
    cap = t.__dlpack__(**{key: (1, 0)})
    assert capsule_name(cap) == "dltensor_versioned"


# ---- interop --------------------------------------------------------------------------------


class _Wrap:
    """A producer that hands out a ready-made capsule."""

    def __init__(self, cap):
        self.cap = cap

    def __dlpack__(self, **kwargs):
        return self.cap

    def __dlpack_device__(self):
        return (1, 0)


def test_numpy_from_dlpack_shares_memory():
    np = pytest.importorskip("numpy")
    t = dlb.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype="float32")
    base = sys.getrefcount(t)
    a = np.from_dlpack(t)
    assert a.ctypes.data == t.data_ptr
    assert a.tolist() == t.tolist()
    assert a.flags.writeable
    a[1, 2] = 60.0
    assert t.tolist()[1][2] == 60.0
    del a
    gc.collect()
    assert sys.getrefcount(t) == base


def test_numpy_readonly_import():
    np = pytest.importorskip("numpy")
    t = readonly_tensor()
    a = np.from_dlpack(t)
    assert not a.flags.writeable
    assert a.ctypes.data == t.data_ptr


def test_numpy_strided_negative():
    np = pytest.importorskip("numpy")
    src = np.arange(30, dtype=np.int64).reshape(5, 6)
    v = src[::-2, 1::3]
    t = dlb.from_dlpack(v)
    a = np.from_dlpack(t)
    assert np.array_equal(a, v)
    assert a.ctypes.data == v.ctypes.data
    assert a.strides == v.strides


def test_numpy_0d_and_empty():
    np = pytest.importorskip("numpy")
    a = np.from_dlpack(dlb.tensor(2.5))
    assert a.shape == () and a[()] == 2.5
    e = np.from_dlpack(dlb.zeros((0, 3)))
    assert e.shape == (0, 3)


def test_numpy_copy_keyword():
    np = pytest.importorskip("numpy")
    t = dlb.tensor([1.0, 2.0])
    a = np.from_dlpack(t, copy=True)
    assert a.ctypes.data != t.data_ptr
    assert a.tolist() == [1.0, 2.0]
    b = np.from_dlpack(t, copy=False)
    assert b.ctypes.data == t.data_ptr


@pytest.mark.parametrize("name", ["bool", "int8", "uint8", "int16", "int32",
                                  "int64", "float16", "float32", "float64",
                                  "complex64", "complex128"])
def test_numpy_dtypes(name):
    np = pytest.importorskip("numpy")
    t = dlb.tensor([1, 0, 1], dtype=name)
    a = np.from_dlpack(t)
    assert a.dtype == np.dtype(name)
    assert a.tolist() == t.tolist()


def test_torch_from_dlpack():
    torch = pytest.importorskip("torch")
    t = dlb.tensor([[1.0, 2.0], [3.0, 4.0]], dtype="float32")
    base = sys.getrefcount(t)
    x = torch.from_dlpack(t)
    assert x.data_ptr() == t.data_ptr
    assert x.tolist() == t.tolist()
    x[0, 0] = 10.0
    assert t.tolist()[0][0] == 10.0
    del x
    gc.collect()
    assert sys.getrefcount(t) == base


@pytest.mark.parametrize("name", ["bool", "int8", "uint8", "int16", "int32",
                                  "int64", "float16", "bfloat16", "float32",
                                  "float64", "complex64", "complex128"])
def test_torch_dtypes(name):
    torch = pytest.importorskip("torch")
    t = dlb.tensor([1, 0, 1], dtype=name)
    x = torch.from_dlpack(t)
    assert dlb.dtype(x.dtype) == name
    assert x.tolist() == t.tolist()


def test_torch_strided():
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    v = np.arange(24, dtype=np.float64).reshape(4, 6)[::2, 1::2]
    t = dlb.from_dlpack(v)
    x = torch.from_dlpack(t)
    assert x.stride() == t.strides
    assert x.tolist() == v.tolist()


def test_roundtrip_through_dlbridge():
    t = dlb.tensor([1, 2, 3], dtype="int8")
    u = dlb.from_dlpack(t)
    assert u.data_ptr == t.data_ptr
    assert u.tolist() == [1, 2, 3]
