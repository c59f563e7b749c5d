"""The C API for extension authors: include/dlbridge/python.h and the
dlbridge._core._C_API capsule.

Two ways in:
* examples/extension/dlb_example_ext.c, a real extension built only against
  the installed header, called with NumPy, torch and dlbridge tensors;
* the table itself, called through ctypes (PYFUNCTYPE keeps the GIL and turns
  a set exception into a Python one), to reach every entry's error paths --
  NULL arguments, unknown flags, malformed managed tensors -- that a
  well-behaved extension never takes.
"""

import ctypes
import gc
import importlib.util
import os
import sys
import types

import pytest

import dlbridge

np = pytest.importorskip("numpy")

_HERE = os.path.dirname(os.path.abspath(__file__))
_EXAMPLE_BUILD = os.path.join(_HERE, "..", "..", "build", "examples", "extension")

try:
    import dlb_example_ext as ext
except ImportError:  # not on PYTHONPATH: look in the Meson build tree
    sys.path.insert(0, os.path.abspath(_EXAMPLE_BUILD))
    try:
        import dlb_example_ext as ext
    except ImportError as exc:  # pragma: no cover - depends on the build
        ext = None
        _EXT_ERROR = exc
    finally:
        sys.path.pop(0)


@pytest.fixture
def example():
    if ext is None:
        pytest.skip("dlb_example_ext is not built (%s): run `make build`" % _EXT_ERROR)
    return ext


def _torch():
    return pytest.importorskip("torch")


# ---- ctypes mirror of python.h --------------------------------------------------

from dlpack_ctypes import (CAPI, DLBError, DLDataType,  # noqa: E402,F401
                           DLDevice, DLTensor)


class DLManagedTensorVersioned(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [
    ("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
    ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER),
    ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]

VIEW_SIZE = 1024
READ_ONLY = 1

_P = ctypes.c_void_p
_PY = ctypes.py_object
_F = ctypes.PYFUNCTYPE
VIEW_GET = _F(ctypes.c_int, _P, _PY, ctypes.c_uint, _P)
VIEW_RELEASE = _F(None, _P, _P)
IMPORT = _F(ctypes.c_int, _P, _PY, ctypes.POINTER(_P))
EXPORT = _F(ctypes.c_int, _P, _P, ctypes.c_char_p, _P, ctypes.POINTER(_P))
ALLOC_LIKE = _F(ctypes.c_int, _P, _PY, ctypes.c_int32,
                ctypes.POINTER(ctypes.c_int64), DLDataType, ctypes.POINTER(_P))
CURRENT_STREAM = _F(ctypes.c_int, _P, _PY, ctypes.POINTER(_P))
RAISE = _F(_P, _P, _P)


# A private handle on the interpreter's symbols: ctypes.pythonapi caches one
# function object per name, so setting argtypes there would clash with other
# test files doing the same.
_pyapi = ctypes.PyDLL(None)
_GetPointer = _pyapi.PyCapsule_GetPointer
_GetPointer.restype = ctypes.c_void_p
_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_CapsuleNew = _pyapi.PyCapsule_New
_CapsuleNew.restype = ctypes.py_object
_CapsuleNew.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_DecRef = _pyapi.Py_DecRef
_DecRef.argtypes = [ctypes.py_object]
_DecRef.restype = None


def _steal(address):
    """The object a C function returned as a new reference at address."""
    obj = ctypes.cast(ctypes.c_void_p(address), ctypes.py_object).value
    _DecRef(obj)  # the cast took its own reference
    return obj


class Table:
    """The table of the running dlbridge._core, callable from Python."""

    def __init__(self):
        capsule = dlbridge._core._C_API
        self.capsule = capsule
        self.address = _GetPointer(capsule, b"dlbridge._C_API")
        self.s = CAPI.from_address(self.address)
        self.view_get = VIEW_GET(self.s.view_get)
        self.view_release = VIEW_RELEASE(self.s.view_release)
        self.import_managed = IMPORT(self.s.import_managed)
        self.export_managed = EXPORT(self.s.export_managed)
        self.alloc_like = ALLOC_LIKE(self.s.alloc_like)
        self.current_stream = CURRENT_STREAM(self.s.current_stream)
        self.raise_error = RAISE(self.s.raise_error)

    def export(self, m, framework=None, like=None):
        out = _P()
        fw = framework.encode() if framework is not None else None
        self.export_managed(self.address, ctypes.addressof(m) if m is not None else None,
                            fw, id(like) if like is not None else None,
                            ctypes.byref(out))
        return _steal(out.value)


@pytest.fixture
def capi():
    return Table()


class Counted:
    """A ctypes-built managed tensor over a NumPy array whose deleter counts
    its calls.  The array and the struct stay alive as long as this object."""

    def __init__(self, arr, major=1, flags=0):
        self.arr = arr
        self.calls = 0
        self.shape = (ctypes.c_int64 * max(arr.ndim, 1))(*arr.shape)
        self.strides = (ctypes.c_int64 * max(arr.ndim, 1))(
            *[s // arr.itemsize for s in arr.strides])
        self.m = DLManagedTensorVersioned()
        self.m.major, self.m.minor = major, 3
        self.deleter = DELETER(self._delete)
        self.m.deleter = self.deleter
        self.m.flags = flags
        t = self.m.dl_tensor
        t.data = arr.ctypes.data
        t.device = DLDevice(1, 0)
        t.ndim = arr.ndim
        t.dtype = DLDataType(2, arr.itemsize * 8, 1)  # float
        t.shape = self.shape
        t.strides = self.strides
        t.byte_offset = 0

    def _delete(self, _m):
        self.calls += 1


# ---- the capsule and the version check -------------------------------------------

def test_capsule_is_published(capi):
    assert type(dlbridge._core._C_API).__name__ == "PyCapsule"
    assert capi.s.abi_version >> 16 == 1
    assert capi.s.size >= ctypes.sizeof(CAPI)
    assert 0 < capi.s.view_size <= VIEW_SIZE
    assert capi.s.reserved_ == 0


def test_get_include_has_headers():
    inc = dlbridge.get_include()
    for rel in ("dlbridge/python.h", "dlbridge/dlbridge.h", "dlpack/dlpack.h"):
        assert os.path.isfile(os.path.join(inc, rel)), rel


def _reexec_example(fake_core):
    """Execute a fresh instance of the example module (multi-phase init runs
    its exec slot, hence dlb_import_capi, again) with sys.modules
    ['dlbridge._core'] replaced by fake_core."""
    spec = importlib.util.find_spec("dlb_example_ext") if ext is None else ext.__spec__
    saved = sys.modules["dlbridge._core"]
    sys.modules["dlbridge._core"] = fake_core
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.modules["dlbridge._core"] = saved


def _fake_table(abi_version, size=None, view_size=256):
    real = Table().s
    fake = CAPI()
    ctypes.pointer(fake)[0] = real
    fake.abi_version = abi_version
    fake.size = ctypes.sizeof(CAPI) if size is None else size
    fake.view_size = view_size
    return fake


def _fake_core(table, name=b"dlbridge._C_API"):
    core = types.ModuleType("dlbridge._core")
    core._C_API = _CapsuleNew(ctypes.addressof(table), name, None)
    return core


def test_abi_major_mismatch_is_import_error(example):
    table = _fake_table(2 << 16)
    with pytest.raises(ImportError, match=r"version 2\.0 is not compatible.*1\.\d"):
        _reexec_example(_fake_core(table))
    # the example's own pointer was left alone: it still works
    assert example.sum(np.ones(3)) == 3.0


def test_abi_newer_minor_is_accepted(example):
    table = _fake_table((1 << 16) | 7, size=ctypes.sizeof(CAPI) + 64)
    # Accepted: the module executes.  (Its functions would call through the
    # fake table, whose entries expect dlbridge's own table: not called.)
    module = _reexec_example(_fake_core(table))
    assert callable(module.sum)
    # The example keeps one process-wide table pointer: point it back at
    # dlbridge's table before anything calls through it.
    _reexec_example(sys.modules["dlbridge._core"])
    assert example.sum(np.ones(4)) == 4.0


@pytest.mark.parametrize("size,view_size", [(16, 256), (None, VIEW_SIZE + 8)])
def test_malformed_table_is_import_error(example, size, view_size):
    table = _fake_table(1 << 16, size=size, view_size=view_size)
    with pytest.raises(ImportError, match="malformed"):
        _reexec_example(_fake_core(table))


def test_wrong_capsule_name_is_import_error(example):
    table = _fake_table(1 << 16)
    with pytest.raises(ImportError, match="not a capsule"):
        _reexec_example(_fake_core(table, name=b"something.else"))


def test_missing_capsule_is_import_error(example):
    with pytest.raises(ImportError, match="not a capsule"):
        _reexec_example(types.ModuleType("dlbridge._core"))


# ---- the example extension: every framework ----------------------------------------

def test_scale_add_numpy(example):
    x = np.arange(12, dtype=np.float64).reshape(3, 4)
    y = np.full((3, 4), 0.5)
    r = example.scale_add(x, y, 2.0)
    assert type(r) is np.ndarray and r.dtype == np.float64
    np.testing.assert_array_equal(r, 2.0 * x + y)


def test_scale_add_strided_layouts(example):
    base = np.arange(60, dtype=np.float32).reshape(6, 10)
    x = base[::-2, 1::3]             # negative and non-compact strides
    y = np.arange(9, dtype=np.float32).reshape(3, 3).T  # transposed
    np.testing.assert_array_equal(example.scale_add(x, y, -1.0), -x + y)
    z = np.float32(3) * np.ones((), np.float32)
    assert example.scale_add(np.array(2.0), np.array(1.0), 3.0) == 7.0
    assert example.sum(z) == 3.0
    assert example.sum(np.ones((0, 5))) == 0.0


def test_scale_add_torch(example):
    torch = _torch()
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()
    y = torch.ones(3, 2)
    r = example.scale_add(x, y, 3.0)
    assert type(r) is torch.Tensor and r.dtype == torch.float32
    assert torch.equal(r, 3 * x + y)


def test_scale_add_dlbridge(example):
    x = dlbridge.tensor([[1.0, 2.0], [3.0, 4.0]], dtype="float32")
    r = example.scale_add(x, x, 0.5)
    assert type(r) is dlbridge.Tensor
    assert r.dtype == "float32" and r.tolist() == [[1.5, 3.0], [4.5, 6.0]]


def test_mixed_frameworks_follow_first_argument(example):
    torch = _torch()
    x = np.ones(3, np.float32)
    t = torch.ones(3)
    assert type(example.scale_add(x, t, 1.0)) is np.ndarray
    assert type(example.scale_add(t, x, 1.0)) is torch.Tensor


def test_fill_in_place_every_framework(example):
    torch = _torch()
    a = np.zeros((3, 4))
    example.fill_(a[:, ::2], 5.0)
    assert a.tolist() == [[5.0, 0.0, 5.0, 0.0]] * 3
    t = torch.zeros(4)
    example.fill_(t[1:3], 2.0)
    assert t.tolist() == [0.0, 2.0, 2.0, 0.0]
    d = dlbridge.zeros((2,), dtype="float64")
    example.fill_(d, 1.5)
    assert d.tolist() == [1.5, 1.5]


@pytest.mark.parametrize("framework,tp", [("numpy", "ndarray"), ("torch", "Tensor"),
                                          ("dlbridge", "Tensor"), (None, "Tensor")])
def test_convert_through_import_and_export(example, framework, tp):
    if framework == "torch":
        _torch()
    x = np.arange(4, dtype=np.float32)
    r = example.convert(x, framework)
    assert type(r).__name__ == tp
    assert np.asarray(dlbridge.from_dlpack(r)).tolist() == [0.0, 1.0, 2.0, 3.0]
    # zero copy: writing through x shows in r
    x[0] = 9.0
    assert dlbridge.from_dlpack(r).tolist()[0] == 9.0


def test_stream_on_cpu_is_none(example):
    assert example.stream(np.ones(2)) is None
    assert example.stream(dlbridge.zeros((2,))) is None


# ---- the example extension: errors --------------------------------------------------

@pytest.mark.parametrize("bad", [object(), "text", 3, None])
def test_not_tensor_like_is_type_error(example, bad):
    x = np.ones(3)
    with pytest.raises(TypeError):
        example.sum(bad)
    with pytest.raises(TypeError):
        example.scale_add(bad, x, 1.0)
    with pytest.raises(TypeError):
        example.scale_add(x, bad, 1.0)
    with pytest.raises(TypeError):
        example.fill_(bad, 1.0)
    with pytest.raises(TypeError):
        example.convert(bad, "numpy")
    with pytest.raises(TypeError):
        example.stream(bad)


def test_readonly_where_writable_needed_is_buffer_error(example):
    a = np.ones(3)
    a.flags.writeable = False
    with pytest.raises(BufferError):
        example.fill_(a, 0.0)
    assert a.tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(BufferError):
        example.fill_(dlbridge.from_dlpack(a), 0.0)
    with pytest.raises(BufferError):
        example.fill_(b"\0" * 8, 0.0)
    assert example.sum(a) == 3.0  # reading is fine


def test_unsupported_dtype_is_buffer_error_through_raise(example):
    with pytest.raises(BufferError, match="float32 or float64 CPU tensor"):
        example.sum(np.arange(3))
    with pytest.raises(BufferError, match="x must be"):
        example.fill_(np.zeros(2, np.int32), 1.0)


def test_shape_mismatch_is_value_error(example):
    with pytest.raises(ValueError):
        example.scale_add(np.ones(3), np.ones(4), 1.0)
    with pytest.raises(ValueError):
        example.scale_add(np.ones(3), np.ones(3, np.float32), 1.0)
    with pytest.raises(TypeError):
        example.scale_add(np.ones(3), np.ones(3), "x")


def test_unknown_framework_is_value_error(example):
    with pytest.raises(ValueError):
        example.convert(np.ones(2), "nosuchframework")


# ---- every table entry's error paths (through ctypes) ---------------------------------

def _view_buffer():
    return ctypes.create_string_buffer(VIEW_SIZE)


def test_view_get_reads_fields_and_flags(capi):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)[::-1, 1:]
    a.flags.writeable = False
    v = _view_buffer()
    capi.view_get(capi.address, a, 0, v)
    try:
        t = DLTensor.from_buffer(v)
        assert t.ndim == 2 and t.shape[0] == 3 and t.shape[1] == 3
        assert (t.strides[0], t.strides[1]) == (-4, 1)
        assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (2, 32, 1)
        assert t.data + t.byte_offset == a.ctypes.data
        flags = ctypes.c_uint64.from_buffer(v, ctypes.sizeof(DLTensor)).value
        assert flags & READ_ONLY
    finally:
        capi.view_release(capi.address, v)


def test_view_get_errors(capi):
    a = np.ones(2)
    with pytest.raises(ValueError, match="NULL"):
        capi.view_get(capi.address, a, 0, None)
    with pytest.raises(ValueError, match="unknown flags"):
        capi.view_get(capi.address, a, 2, _view_buffer())
    with pytest.raises(TypeError):
        capi.view_get(capi.address, object(), 0, _view_buffer())
    a.flags.writeable = False
    with pytest.raises(BufferError):
        capi.view_get(capi.address, a, 1, _view_buffer())
    capi.view_release(capi.address, None)  # tolerated, does nothing


def test_import_managed(capi):
    a = np.arange(3, dtype=np.float64)
    a.flags.writeable = False
    out = _P()
    capi.import_managed(capi.address, a, ctypes.byref(out))
    m = DLManagedTensorVersioned.from_address(out.value)
    assert m.major == 1 and m.flags & READ_ONLY
    assert m.dl_tensor.data + m.dl_tensor.byte_offset == a.ctypes.data
    before = sys.getrefcount(a)
    m.deleter(ctypes.pointer(m))  # ours to delete, exactly once
    gc.collect()
    assert sys.getrefcount(a) <= before


def test_import_managed_errors(capi):
    with pytest.raises(TypeError):
        capi.import_managed(capi.address, object(), ctypes.byref(_P()))
    with pytest.raises(ValueError, match="NULL"):
        capi.import_managed(capi.address, np.ones(1), None)


@pytest.mark.parametrize("framework", [None, "dlbridge", "numpy", "torch"])
def test_export_runs_deleter_once_when_result_dies(capi, framework):
    if framework == "torch":
        _torch()
    c = Counted(np.arange(6, dtype=np.float64).reshape(2, 3))
    r = capi.export(c.m, framework)
    assert c.calls == 0
    assert dlbridge.from_dlpack(r).tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    del r
    gc.collect()
    assert c.calls == 1


def test_export_like(capi):
    torch = _torch()
    c = Counted(np.ones(2))
    r = capi.export(c.m, like=torch.zeros(1))
    assert type(r) is torch.Tensor and r.tolist() == [1.0, 1.0]
    del r
    gc.collect()
    assert c.calls == 1


@pytest.mark.parametrize("case,exc", [
    ("both", ValueError),
    ("like_not_tensor", TypeError),
    ("bad_major", BufferError),
    ("bad_ndim", BufferError),
    ("unknown_framework", ValueError),
])
def test_export_errors_steal_m(capi, case, exc):
    c = Counted(np.ones(3), major=2 if case == "bad_major" else 1)
    kw = {}
    if case == "both":
        kw = dict(framework="numpy", like=np.ones(1))
    elif case == "like_not_tensor":
        kw = dict(like=object())
    elif case == "bad_ndim":
        c.m.dl_tensor.ndim = -1
    elif case == "unknown_framework":
        kw = dict(framework="nosuchframework")
    with pytest.raises(exc):
        capi.export(c.m, **kw)
    gc.collect()
    assert c.calls == 1


def test_export_null_m(capi):
    out = _P()
    with pytest.raises(ValueError, match="NULL"):
        capi.export_managed(capi.address, None, None, None, ctypes.byref(out))


def _alloc(capi, like, shape, dtype=DLDataType(2, 32, 1), ndim=None):
    out = _P()
    n = len(shape) if ndim is None else ndim
    arr = (ctypes.c_int64 * max(len(shape), 1))(*shape) if shape is not None else None
    capi.alloc_like(capi.address, like, n, arr, dtype, ctypes.byref(out))
    return DLManagedTensorVersioned.from_address(out.value)


def test_alloc_like(capi):
    m = _alloc(capi, np.ones(1), (2, 0, 3))
    t = m.dl_tensor
    assert t.ndim == 3 and [t.shape[i] for i in range(3)] == [2, 0, 3]
    assert (t.device.device_type, t.dtype.bits) == (1, 32)
    m.deleter(ctypes.pointer(m))
    m = _alloc(capi, dlbridge.zeros((1,)), ())
    assert m.dl_tensor.ndim == 0
    m.deleter(ctypes.pointer(m))


@pytest.mark.parametrize("shape,ndim,dtype,exc", [
    ((2, -1), None, DLDataType(2, 32, 1), ValueError),
    ((2,), -1, DLDataType(2, 32, 1), ValueError),
    ((1,) * 65, None, DLDataType(2, 32, 1), ValueError),
    (None, 2, DLDataType(2, 32, 1), ValueError),
    ((2,), None, DLDataType(99, 32, 1), ValueError),
    ((2,), None, DLDataType(2, 32, 0), ValueError),
])
def test_alloc_like_errors(capi, shape, ndim, dtype, exc):
    with pytest.raises(exc):
        _alloc(capi, np.ones(1), shape, dtype, ndim)


def test_alloc_like_not_tensor(capi):
    with pytest.raises(TypeError):
        _alloc(capi, object(), (2,))


def test_current_stream(capi):
    s = _P(12345)
    capi.current_stream(capi.address, np.ones(1), ctypes.byref(s))
    assert s.value is None
    with pytest.raises(TypeError):
        capi.current_stream(capi.address, object(), ctypes.byref(s))
    with pytest.raises(ValueError, match="NULL"):
        capi.current_stream(capi.address, np.ones(1), None)


@pytest.mark.parametrize("code,exc", [(-1, ValueError), (-2, MemoryError),
                                      (-3, ValueError), (-4, BufferError),
                                      (-5, BufferError), (-6, RuntimeError),
                                      (-7, BufferError), (0, RuntimeError)])
def test_raise_error(capi, code, exc):
    err = DLBError(code, b"the message")
    with pytest.raises(exc, match="the message" if code else "DLB_OK"):
        capi.raise_error(capi.address, ctypes.addressof(err))


def test_raise_error_null(capi):
    with pytest.raises(ValueError, match="NULL"):
        capi.raise_error(capi.address, None)


# ---- ownership over many calls ----------------------------------------------------------

N = 100_000


def test_refcounts_stable_over_many_calls(example):
    x = np.arange(8, dtype=np.float32)
    y = np.ones(8, np.float32)
    d = dlbridge.zeros((8,))
    bad = object()
    refs = [sys.getrefcount(o) for o in (x, y, d, bad)]
    for _ in range(N):
        example.scale_add(x, y, 2.0)
        example.sum(d)
        example.fill_(d, 1.0)
        example.convert(x, "numpy")
        try:
            example.fill_(bad, 0.0)
        except TypeError:
            pass
    gc.collect()
    assert [sys.getrefcount(o) for o in (x, y, d, bad)] == refs


def test_producer_deleters_run_once_over_many_calls(example, tp):
    p = tp.Producer(shape=(4,), dtype=(2, 32, 1), fill=True)
    for _ in range(N):
        example.sum(p)
        example.convert(p, None)
    gc.collect()
    assert p.live_exports == 0
    assert p.deleter_calls >= 2 * N


def test_export_deleters_exactly_once_over_many_calls(capi):
    arr = np.ones(4)
    counted = Counted(arr)
    for i in range(N // 10):
        counted.m.deleter = counted.deleter  # the struct is reused each time
        r = capi.export(counted.m, "numpy" if i % 2 else None)
        del r
    gc.collect()
    assert counted.calls == N // 10
