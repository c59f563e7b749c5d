"""The fast path: dlb.Tensor's DLPack C exchange table (producer), the
per-type handler cache and borrowed views (consumer), from_dlpack through
them.  Entries are called from C by the test producer (consume_exchange),
and a counting table proves which entries dlbridge calls and how often.

Private hooks of dlbridge._core used here (testing.c):
  _exchange_handler(obj) -> (kind, framework, table address or None)
  _exchange_view(obj, options, kind) -> dict; kind 0 = the handler's own
  _exchange_view_loop(obj, options, kind, n)
  _exchange_alloc_like(obj, shape, dtype, device)
  _exchange_to_framework(like, tensor)
  _exchange_current_stream(obj, device)
  _exchange_cache_size() -> (entries, capacity)
"""
import ctypes
import importlib.util
import gc
import os
import subprocess
import sys
import tracemalloc
import weakref

import pytest

import dlbridge as dlb

np = pytest.importorskip("numpy")
core = dlb._core

NONE, TENSOR, EXCHANGE, NUMPY, DLPACK, BUFFER, AI, CAI, BUFFER_DLPACK, TF_EAGER = \
    range(10)
WRITABLE = 1


def skip_unless_dead_classes_are_freed():
    """Skip a test that checks dlbridge lets dead classes go when this
    interpreter keeps them whoever held them: on free-threaded 3.13, once
    JAX (0.10.2) has made an array, gc.collect() frees no dead class at all,
    even with dlbridge never imported (seen in test-ft's full run)."""
    class Probe:
        pass
    r = weakref.ref(Probe)
    del Probe
    gc.collect()
    if r() is not None:
        pytest.skip("this interpreter does not free a dead class at "
                    "gc.collect() here (free-threaded 3.13 after JAX ran)")


# ---- reading the capsule with private ctypes prototypes ----------------------
# Never assign ctypes.pythonapi.X.argtypes: that would change them for every
# other user in the process.

_capsule_get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(
    ("PyCapsule_GetName", ctypes.pythonapi))
_capsule_get_pointer = ctypes.PYFUNCTYPE(
    ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
        ("PyCapsule_GetPointer", ctypes.pythonapi))


from dlpack_ctypes import (DLDataType, DLDevice, DLTensor,  # noqa: E402,F401
                           ExchangeAPI, Header, Version)


class Managed(ctypes.Structure):
    pass


DELETER = ctypes.PYFUNCTYPE(None, ctypes.POINTER(Managed))
Managed._fields_ = [("version", Version), ("manager_ctx", ctypes.c_void_p),
                    ("deleter", DELETER), ("flags", ctypes.c_uint64),
                    ("dl_tensor", DLTensor)]


def table_of(tp_obj):
    cap = type(tp_obj).__dlpack_c_exchange_api__ if not isinstance(tp_obj, type) \
        else tp_obj.__dlpack_c_exchange_api__
    assert _capsule_get_name(cap) == b"dlpack_exchange_api"
    addr = _capsule_get_pointer(cap, b"dlpack_exchange_api")
    return addr, ExchangeAPI.from_address(addr)


# ---- the producer --------------------------------------------------------------

def test_capsule_on_tensor_type():
    assert "__dlpack_c_exchange_api__" in dlb.Tensor.__dict__
    cap = dlb.Tensor.__dlpack_c_exchange_api__
    assert type(cap).__name__ == "PyCapsule"
    assert dlb.zeros(3).__dlpack_c_exchange_api__ is cap  # one per type
    addr, api = table_of(dlb.Tensor)
    assert (api.header.version.major, api.header.version.minor) == (1, 3)
    assert api.header.prev_api is None
    for name, _ in ExchangeAPI._fields_[1:]:
        assert getattr(api, name), name
    # the consumer side agrees on the address
    assert core._exchange_handler(dlb.zeros(1))[2] == addr


def test_tensor_type_stays_immutable():
    with pytest.raises(TypeError):
        dlb.Tensor.__dlpack_c_exchange_api__ = None


def test_entries_called_from_c(tp):
    src = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::-2]
    t = dlb.from_dlpack(src)
    r = tp.consume_exchange(t)
    assert r["version"] == (1, 3) and r["entries"] == 5 and r["prev_api_null"]
    d = r["dltensor"]
    assert d["shape"] == t.shape and d["strides"] == t.strides
    assert d["dtype"] == (2, 32, 1) and d["device"] == (1, 0)
    assert d["data"] + d["byte_offset"] == t.data_ptr
    m = r["managed"]
    assert m["version"] == (1, 3) and m["flags"] == 0
    assert m["shape"] == t.shape and m["data"] == t.data_ptr
    back = r["roundtrip"]
    assert isinstance(back, dlb.Tensor) and back.data_ptr == t.data_ptr
    assert back.tolist() == t.tolist()
    assert r["stream"] is None
    assert r["alloc_shape"] == (2, 3)
    alloc = r["allocated"]
    assert isinstance(alloc, dlb.Tensor) and alloc.shape == (2, 3)
    assert alloc.dtype == "float32" and not alloc.readonly
    calls, kind, msg = r["cuda_alloc_error"][1:]
    # a device dlbridge never allocates on (Vulkan) is refused through SetError
    assert calls == 1 and kind == "BufferError" and "vulkan" in msg
    assert r["cuda_alloc_error"][0] == -1
    assert r["exception_left"] is False


def test_entries_keep_read_only(tp):
    src = np.arange(4.0)
    src.flags.writeable = False
    t = dlb.from_dlpack(src)
    assert t.readonly
    r = tp.consume_exchange(t)
    assert r["managed"]["flags"] & tp.FLAG_READ_ONLY
    assert r["roundtrip"].readonly


def test_entries_reject_foreign_objects(tp):
    class Fake:
        __dlpack_c_exchange_api__ = dlb.Tensor.__dlpack_c_exchange_api__
    r = tp.consume_exchange(Fake())
    assert r["dltensor_error"].startswith("TypeError")
    assert r["managed_error"].startswith("TypeError")
    assert "dlbridge.Tensor" in r["managed_error"]


def test_to_py_steals_on_failure():
    """dlb's managed_tensor_to_py_object_no_sync runs the deleter when it
    fails (known-bugs 3.8), here for a major it does not speak."""
    addr, api = table_of(dlb.Tensor)
    to_py = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.POINTER(Managed),
                              ctypes.POINTER(ctypes.c_void_p))(
        api.managed_tensor_to_py_object_no_sync)
    calls = []
    deleter = DELETER(lambda m: calls.append(1))
    m = Managed()
    m.version = Version(2, 0)
    m.deleter = deleter
    out = ctypes.c_void_p()
    with pytest.raises(BufferError):
        to_py(ctypes.byref(m), ctypes.byref(out))
    assert calls == [1]
    # and success consumes it into a Tensor whose death runs it once
    buf = (ctypes.c_float * 3)(1, 2, 3)
    shape = (ctypes.c_int64 * 1)(3)
    strides = (ctypes.c_int64 * 1)(1)
    m2 = Managed()
    m2.version = Version(1, 3)
    m2.deleter = deleter
    m2.dl_tensor = DLTensor(ctypes.cast(buf, ctypes.c_void_p), DLDevice(1, 0), 1,
                            DLDataType(2, 32, 1), shape, strides, 0)
    assert to_py(ctypes.byref(m2), ctypes.byref(out)) == 0
    # out holds a new reference: take it over
    obj = ctypes.cast(out, ctypes.py_object).value
    _decref = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)(("Py_DecRef", ctypes.pythonapi))
    _decref(out)
    assert obj.tolist() == [1.0, 2.0, 3.0]
    del obj
    gc.collect()
    assert calls == [1, 1]


# ---- classification and the cache ----------------------------------------------


def test_handler_follows_class_changes():
    """A class changed after it was first seen is classified again (the
    cache checks CPython's type version tag): gained, lost and inherited
    protocols, and a class that changes without changing its answer."""
    a = np.arange(3.0)

    class C:
        pass
    assert core._exchange_handler(C())[0] == NONE
    C.__dlpack__ = lambda self, **kw: a.__dlpack__(**kw)
    assert core._exchange_handler(C())[0] == DLPACK
    assert dlb.from_dlpack(C()).tolist() == [0.0, 1.0, 2.0]
    del C.__dlpack__
    assert core._exchange_handler(C())[0] == NONE
    with pytest.raises(TypeError, match="not tensor-like"):
        dlb.from_dlpack(C())

    class Base:
        pass

    class Derived(Base):
        pass
    assert core._exchange_handler(Derived())[0] == NONE
    Base.__array_interface__ = property(lambda self: a.__array_interface__)
    assert core._exchange_handler(Derived())[0] == AI

    class Counting:
        calls = 0

        def __dlpack__(self, **kw):
            type(self).calls += 1  # modifies the class on every call
            return a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return (1, 0)
    for _ in range(100):
        assert dlb.from_dlpack(Counting()).shape == (3,)
    assert Counting.calls == 100
    r = weakref.ref(Counting)
    del Counting
    skip_unless_dead_classes_are_freed()
    gc.collect()
    assert r() is None, "a reclassified type must still be freed"


def test_classification_builtin_kinds():
    assert core._exchange_handler(dlb.zeros(1))[:2] == (TENSOR, "dlbridge")
    assert core._exchange_handler(np.zeros(1))[:2] == (NUMPY, "numpy")
    assert core._exchange_handler(bytearray(4))[:2] == (BUFFER, "builtins")
    assert core._exchange_handler(3)[0] == NONE

    class Sub(np.ndarray):
        pass
    assert core._exchange_handler(np.zeros(2).view(Sub))[0] == DLPACK

    class AIface:
        def __init__(self, a):
            self.a = a
            self.__array_interface__ = a.__array_interface__
    # an instance attribute is not on the type: not tensor-like by type
    assert core._exchange_handler(AIface(np.zeros(2)))[0] == NONE

    class AIprop:
        def __init__(self, a):
            self.a = a

        @property
        def __array_interface__(self):
            return self.a.__array_interface__
    o = AIprop(np.arange(3.0))
    assert core._exchange_handler(o)[0] == AI
    v = core._exchange_view(o, 0, 0)
    assert v["owned"] and v["shape"] == (3,)


def test_counting_table_fast_path(tp):
    tp.counting_reset()
    c = tp.CountingTable(5)
    kind, fw, addr = core._exchange_handler(c)
    assert kind == EXCHANGE and fw == "_dlb_testproducer"
    assert addr == tp.exchange_address("counting")
    t = dlb.from_dlpack(c)
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    n = tp.counting_counts()
    assert n["from_py"] == 1 and n["dunder"] == 0 and n["dltensor"] == 0
    del t
    gc.collect()
    assert tp.counting_counts()["deleter"] == 1
    core._exchange_view_loop(c, 0, 0, 10)
    n = tp.counting_counts()
    assert n["dltensor"] == 10 and n["from_py"] == 1
    # CPU: the stream is not asked for; another device: it is
    assert core._exchange_current_stream(c, "cpu") is None
    assert tp.counting_counts()["stream"] == 0
    assert core._exchange_current_stream(c, "cuda:0") == 0x1234
    assert tp.counting_counts()["stream"] == 1
    out = core._exchange_alloc_like(c, (2, 3), "float32", "cpu")
    assert type(out) is tp.CountingTable and out.info["shape"] == (2, 3)
    n = tp.counting_counts()
    assert n["alloc"] == 1 and n["to_py"] == 1
    del out
    assert tp.counting_counts()["deleter"] == 2


def test_managed_only_table_view_owns_and_releases(tp):
    class M(tp.CountingTable):
        __dlpack_c_exchange_api__ = tp.exchange_capsule("managed_only")
    tp.counting_reset()
    c = M(3, readonly=True)
    assert core._exchange_handler(c)[2] == tp.exchange_address("managed_only")
    v = core._exchange_view(c, 0, 0)
    assert v["owned"] and v["flags"] == 1 and v["shape"] == (3,)
    with pytest.raises(BufferError, match="read-only"):
        core._exchange_view(c, WRITABLE, 0)
    n = tp.counting_counts()
    assert n["from_py"] == 2 and n["deleter"] == 2 and n["dltensor"] == 0
    rc = sys.getrefcount(c)
    core._exchange_view_loop(c, 0, 0, 1000)
    n = tp.counting_counts()
    assert n["from_py"] == n["deleter"] == 1002
    assert sys.getrefcount(c) == rc


def test_prev_api_walk(tp):
    class Two(tp.CountingTable):
        __dlpack_c_exchange_api__ = tp.exchange_capsule("major2_prev1")
    assert core._exchange_handler(Two())[:3:2] == (
        EXCHANGE, tp.exchange_address("counting"))

    class TwoOnly(tp.CountingTable):
        __dlpack_c_exchange_api__ = tp.exchange_capsule("major2_only")
    tp.counting_reset()
    o = TwoOnly(4)
    assert core._exchange_handler(o)[0] == DLPACK
    assert dlb.from_dlpack(o).tolist() == [0.0, 1.0, 2.0, 3.0]
    n = tp.counting_counts()
    assert n["dunder"] == 1 and n["from_py"] == 0


def test_legacy_int_attribute(tp):
    class Legacy(tp.CountingTable):
        __dlpack_c_exchange_api__ = None
        __c_dlpack_exchange_api__ = tp.exchange_address("counting")
    assert core._exchange_handler(Legacy())[:3:2] == (
        EXCHANGE, tp.exchange_address("counting"))

    class LegacyCap(tp.CountingTable):
        __dlpack_c_exchange_api__ = None
        __c_dlpack_exchange_api__ = tp.exchange_capsule("managed_only")
    assert core._exchange_handler(LegacyCap())[2] == tp.exchange_address(
        "managed_only")


@pytest.mark.parametrize("bad", ["wrong_name", "not a capsule", 12])
def test_invalid_attribute_falls_back(tp, bad):
    val = tp.exchange_capsule("wrong_name") if bad == "wrong_name" else bad

    class Bad(tp.CountingTable):
        __dlpack_c_exchange_api__ = val
    tp.counting_reset()
    o = Bad(2)
    assert core._exchange_handler(o)[0] == DLPACK
    assert dlb.from_dlpack(o).tolist() == [0.0, 1.0]
    assert tp.counting_counts()["dunder"] == 1


def test_parameter_inherits_torch_table():
    torch = pytest.importorskip("torch")
    t = torch.zeros(2)
    p = torch.nn.Parameter(torch.zeros(2))
    ht, hp = core._exchange_handler(t), core._exchange_handler(p)
    assert ht[0] == hp[0] == EXCHANGE and ht[2] == hp[2] and hp[1] == "torch"


def test_cache_drops_dead_types_and_stays_flat(tp):
    skip_unless_dead_classes_are_freed()
    cap = tp.exchange_capsule("counting")

    def churn(n, use):
        for i in range(n):
            T = type("T%d" % i, (tp.CountingTable,),
                     {"__dlpack_c_exchange_api__": cap})
            t = T(1)
            P = type("P%d" % i, (), {"__dlpack__": lambda self: None})
            p = P()
            if use:
                assert core._exchange_handler(t)[0] == EXCHANGE
                assert core._exchange_handler(p)[0] == DLPACK
            del T, P, t, p
            if i % 100 == 99:
                # Bound the types alive at once the same way in both runs:
                # Python's own per-base subclass dicts grow with that peak
                # and never shrink, which is not ours to measure.
                gc.collect()
        gc.collect()

    def growth(use):
        churn(50, use)
        tracemalloc.start()
        snap1 = tracemalloc.take_snapshot()
        churn(1000, use)
        snap2 = tracemalloc.take_snapshot()
        tracemalloc.stop()
        # Blocks of 64 KiB and more are CPython's dict tables being
        # compacted (object.__subclasses__ is one dict for every type made):
        # a leak of ours would be many small blocks (an entry, a weakref).
        return sum(s.size_diff for s in snap2.compare_to(snap1, "traceback")
                   if s.count == 0 or s.size // s.count < 64 * 1024)

    churn(50, True)
    before = core._exchange_cache_size()[0]
    capsule_refs = sys.getrefcount(cap)
    # Python itself keeps some memory per type made (caches, free lists):
    # compare with the same loop that never shows the types to dlbridge.
    without = growth(False)
    with_dlb = growth(True)
    entries, capacity = core._exchange_cache_size()
    assert entries == before
    # the slot array grew while the dead types awaited collection, and
    # shrank back when they went
    assert capacity <= max(16, 8 * entries)
    assert sys.getrefcount(cap) == capsule_refs
    assert with_dlb - without < 16 * 1024, (with_dlb, without)
    # the cache holds no strong reference: a type dies with its last user
    T = type("Gone", (tp.CountingTable,), {"__dlpack_c_exchange_api__": cap})
    core._exchange_handler(T(1))
    w = weakref.ref(T)
    del T
    gc.collect()
    assert w() is None


def test_no_stale_handler_after_type_death(tp):
    cap = tp.exchange_capsule("counting")
    for i in range(300):
        if i % 2:
            T = type("X", (tp.CountingTable,), {"__dlpack_c_exchange_api__": cap})
            want = EXCHANGE
        else:
            T = type("X", (), {"__dlpack__": lambda self: None})
            want = DLPACK
        assert core._exchange_handler(T.__new__(T))[0] == want
        del T
        gc.collect()


ADD3 = "add3(x: float32[n], y: float32[n], z: mut float32[n])"


@pytest.mark.parametrize("case, message", [
    ("negative_extent", r"shape\[0\] is -4"),
    ("null_data", "data is NULL"),
    ("span_overflow", "overflow|exceeds"),
    ("unknown_device", "device"),
    ("negative_device_id", "device_id -1"),
    ("huge_offset", "byte_offset"),
    ("null_shape", "shape is NULL"),
])
def test_borrowed_exchange_views_are_validated(tp, lib, case, message):
    """A table's borrowed entry describing its tensor wrongly is refused
    before anything reads the description: by Function (which reads torch
    tensors this way, validating in its checking pass) and by the borrowed
    views of the C API (dlb_py_view_get), and the kernel never runs."""
    add3 = dlb.load(lib, "dlb_kernel_add3", ADD3)
    x = tp.CountingTable(4)
    y, z = np.ones(4, np.float32), np.zeros(4, np.float32)
    add3(x, y, z)
    assert z.tolist() == [1, 2, 3, 4]
    z[:] = 0
    tp.counting_reset()
    tp.counting_corrupt(case)
    try:
        with pytest.raises(BufferError, match=message) as e:
            add3(x, y, z)
        assert "argument 'x'" in str(e.value)
        assert z.tolist() == [0, 0, 0, 0], "the kernel ran"
        with pytest.raises(BufferError, match=message):
            add3(y, x, z)
        with pytest.raises(BufferError, match=message):
            core._exchange_view(x, 0, 0)
        n = tp.counting_counts()
        assert n["dltensor"] >= 3 and n["from_py"] == 0 and n["dunder"] == 0
    finally:
        tp.counting_corrupt(None)
    add3(x, y, z)
    assert z.tolist() == [1, 2, 3, 4]


def test_function_handler_memo_follows_class_changes(tp, lib):
    """Function remembers each parameter's last handler; a class changed
    between calls (its version tag moves) is looked up again."""
    add3 = dlb.load(lib, "dlb_kernel_add3", ADD3)
    a = np.arange(4, dtype=np.float32)
    y, z = np.ones(4, np.float32), np.zeros(4, np.float32)

    class C:
        pass
    with pytest.raises(TypeError, match="not tensor-like"):
        add3(C(), y, z)
    C.__array_interface__ = property(lambda self: a.__array_interface__)
    add3(C(), y, z)
    assert z.tolist() == [1, 2, 3, 4]
    del C.__array_interface__
    with pytest.raises(TypeError, match="not tensor-like"):
        add3(C(), y, z)
    C.__dlpack_c_exchange_api__ = tp.exchange_capsule("counting")
    with pytest.raises(BufferError, match="not a CountingTable"):
        add3(C(), y, z)      # the table is asked now, and refuses C


def test_function_handler_memo_after_type_death(tp, lib):
    """A type that dies takes its handler with it; a new type, perhaps at
    the same address, must get its own (a remembered handler of the dead
    one would read the object the wrong way, or freed memory)."""
    add3 = dlb.load(lib, "dlb_kernel_add3", ADD3)
    cap = tp.exchange_capsule("counting")
    a = np.arange(4, dtype=np.float32)
    y = np.ones(4, np.float32)
    for i in range(200):
        if i % 2:
            T = type("X", (tp.CountingTable,), {"__dlpack_c_exchange_api__": cap})
            x = T(4)
        else:
            T = type("X", (), {"__array_interface__":
                               property(lambda self: a.__array_interface__)})
            x = T()
        z = np.zeros(4, np.float32)
        add3(x, y, z)
        assert z.tolist() == [1, 2, 3, 4]
        del x, T
        gc.collect()


def test_skip_env_var():
    code = ("import dlbridge, _dlb_testproducer as tp;"
            "print(dlbridge._core._exchange_handler(tp.CountingTable())[0])")
    env = dict(os.environ, DLBRIDGE_SKIP_EXCHANGE_API="1")
    pytest.importorskip("_dlb_testproducer")
    out = subprocess.run([sys.executable, "-c", code], env=env,
                         capture_output=True, text=True, check=True)
    assert int(out.stdout) == DLPACK


# ---- allocation, streams, conversion back -------------------------------------

def test_allocator_errors_through_seterror(tp):
    with pytest.raises(BufferError, match="not on vulkan"):
        core._exchange_alloc_like(dlb.zeros(1), (2,), "float32", "vulkan")
    c = tp.CountingTable()
    for kind, exc in [("MemoryError", MemoryError), ("ValueError", ValueError),
                      ("BufferError", BufferError),
                      ("NoSuchError", RuntimeError), ("len", RuntimeError)]:
        tp.counting_reset()
        tp.counting_fail(kind, False)
        with pytest.raises(exc, match="told to fail") as ei:
            core._exchange_alloc_like(c, (2,), "float32", "cpu")
        if exc is RuntimeError:
            assert kind in str(ei.value)
        assert tp.counting_counts()["alloc"] == 1
    tp.counting_reset()


def test_alloc_like_dlbridge_and_numpy():
    t = core._exchange_alloc_like(dlb.zeros(1), (2, 3), "int16", "cpu")
    assert isinstance(t, dlb.Tensor) and t.shape == (2, 3) and t.dtype == "int16"
    a = core._exchange_alloc_like(np.zeros(1), (4,), "float64", "cpu")
    assert type(a) is np.ndarray and a.shape == (4,) and a.dtype == np.float64
    a[:] = 1  # writable
    with pytest.raises(BufferError, match="vulkan"):
        core._exchange_alloc_like(np.zeros(1), (4,), "float64", "vulkan")
    b = core._exchange_alloc_like(bytearray(1), (2,), "uint8", "cpu")
    assert isinstance(b, dlb.Tensor)  # no framework to convert to


def test_to_framework_steals_on_failure(tp):
    t = dlb.zeros(3)
    c = tp.CountingTable()
    rc = sys.getrefcount(t)
    tp.counting_reset()
    tp.counting_fail(None, True)
    with pytest.raises(RuntimeError, match="told to fail"):
        core._exchange_to_framework(c, t)
    tp.counting_reset()
    # the export held a reference to t; the failed import deleted it once
    assert sys.getrefcount(t) == rc
    ok = core._exchange_to_framework(c, t)
    assert type(ok) is tp.CountingTable and ok.info["imported"]
    assert sys.getrefcount(t) == rc + 1
    del ok
    assert sys.getrefcount(t) == rc


# ---- torch 2.13's real table, both ways -------------------------------------------

def test_torch_both_directions(tp):
    torch = pytest.importorskip("torch")
    if not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        pytest.skip("this torch publishes no exchange table")
    tt = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()
    kind, fw, addr = core._exchange_handler(tt)
    assert kind == EXCHANGE and fw == "torch"
    assert addr == table_of(torch.Tensor)[0]
    v = core._exchange_view(tt, 0, 0)
    assert v["shape"] == (3, 2) and v["strides"] == (1, 3) and not v["owned"]
    assert v["data"] == tt.data_ptr()
    t = dlb.from_dlpack(tt)
    assert t.data_ptr == tt.data_ptr() and t.tolist() == tt.tolist()
    tt[0, 0] = 42.0
    assert t.tolist()[0][0] == 42.0
    # copy= and device= are honoured on the exchange path too
    c = dlb.from_dlpack(tt, copy=True)
    assert c.data_ptr != tt.data_ptr() and c.tolist() == tt.tolist()
    with pytest.raises(BufferError):
        dlb.from_dlpack(tt, device="cuda:0")
    # torch consumes dlb through dlb's table or __dlpack__
    d = dlb.tensor([[1.0, 2.0], [3.0, 4.0]])
    back = torch.from_dlpack(d)
    assert back.data_ptr() == d.data_ptr and back.tolist() == d.tolist()
    # a third-party consumer of torch's table
    r = tp.consume_exchange(tt)
    assert r["entries"] == 5 and r["dltensor"]["shape"] == (3, 2)
    assert isinstance(r["roundtrip"], torch.Tensor)
    # dlb allocates and converts in torch
    out = core._exchange_alloc_like(tt, (2, 2), "float32", "cpu")
    assert type(out) is torch.Tensor and tuple(out.shape) == (2, 2)
    x = core._exchange_to_framework(tt, d)
    assert type(x) is torch.Tensor and x.data_ptr() == d.data_ptr
    assert core._exchange_current_stream(tt, "cpu") is None


PADDLE_CHECK = """
import ctypes
import dlbridge as dlb, paddle, _dlb_testproducer as tp
core = dlb._core
_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
def table_address(tp_type):
    return _get_pointer(tp_type.__dlpack_c_exchange_api__, b"dlpack_exchange_api")
EXCHANGE = %d
pt = paddle.arange(6, dtype="float32").reshape([2, 3])
kind, fw, addr = core._exchange_handler(pt)
assert kind == EXCHANGE and fw == "paddle", (kind, fw, addr)
assert addr == %s, addr
v = core._exchange_view(pt, 0, 0)
assert v["shape"] == (2, 3) and v["data"] == pt.data_ptr(), v
t = dlb.from_dlpack(pt)
assert t.data_ptr == pt.data_ptr() and t.tolist() == pt.tolist()
d = dlb.tensor([[1.0, 2.0], [3.0, 4.0]], dtype="float32")
back = paddle.from_dlpack(d)
assert back.data_ptr() == d.data_ptr and back.tolist() == d.tolist()
r = tp.consume_exchange(pt)
assert r["entries"] >= 4 and r["dltensor"]["shape"] == (2, 3), r
out = core._exchange_alloc_like(pt, (2, 2), "float32", "cpu")
assert isinstance(out, paddle.Tensor) and tuple(out.shape) == (2, 2)
x = core._exchange_to_framework(pt, d)
assert isinstance(x, paddle.Tensor) and x.data_ptr() == d.data_ptr
print("PADDLE-OK")
"""


def test_paddle_both_directions(tp):
    # PaddlePaddle 3.3 publishes the table too: the same consumer code must
    # work against a second, independent producer.  It runs in a fresh
    # interpreter because paddle segfaults when imported into a process that
    # already loaded TensorFlow (with or without dlbridge), which the rest of
    # this suite does.
    if importlib.util.find_spec("paddle") is None:
        pytest.skip("paddle is not installed")
    # paddle's table address is read in the child: it must be the one on
    # paddle.Tensor, which the child checks against its own lookup.
    code = PADDLE_CHECK % (EXCHANGE, "table_address(paddle.Tensor)")
    r = subprocess.run([sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "PADDLE-OK" in r.stdout, r.stdout + r.stderr


# ---- views -------------------------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: np.arange(24, dtype=np.float32).reshape(2, 3, 4),
    lambda: np.arange(24, dtype=np.int64).reshape(4, 6)[::-1, ::2],
    lambda: np.array(3.5),
    lambda: np.zeros((0, 3), np.int8),
    lambda: np.array([True, False]),
    lambda: np.arange(4, dtype=np.complex64),
    lambda: np.arange(4, dtype=np.float16),
    lambda: np.arange(6, dtype=np.uint16).reshape(2, 3).T,
])
def test_numpy_direct_matches_buffer(make):
    a = make()
    direct = core._exchange_view(a, 0, 0)
    viabuf = core._exchange_view(a, 0, BUFFER)
    assert direct["kind"] == NUMPY and not direct["owned"] and not direct["buffer"]
    assert viabuf["buffer"]
    for k in ("shape", "dtype", "data", "flags", "device"):
        assert direct[k] == viabuf[k], k
    assert direct["shape"] == a.shape
    if a.size:  # strides of an array with no elements mean nothing
        assert direct["strides"] == viabuf["strides"]
        assert direct["strides"] == tuple(s // a.itemsize for s in a.strides)


def test_numpy_direct_errors():
    a = np.arange(4.0)
    a.flags.writeable = False
    assert core._exchange_view(a, 0, 0)["flags"] == 1
    with pytest.raises(BufferError, match="read-only"):
        core._exchange_view(a, WRITABLE, 0)
    with pytest.raises(BufferError, match="byte order"):
        core._exchange_view(np.arange(3, dtype=">f4"), 0, 0)
    for dt in (object, "U3", "S3", "V4", "datetime64[s]", [("a", "i4")]):
        with pytest.raises(BufferError):
            core._exchange_view(np.zeros(2, dtype=dt), 0, 0)
    odd = np.lib.stride_tricks.as_strided(
        np.zeros(32, np.uint8).view(np.float32), shape=(3,), strides=(6,))
    with pytest.raises(BufferError, match="multiple of the itemsize"):
        core._exchange_view(odd, 0, 0)
    with pytest.raises(TypeError, match="not tensor-like"):
        core._exchange_view(object(), 0, 0)


# ---- byte strides on dimensions of extent 0 or 1 ---------------------------------
# One rule for every reader of byte strides (dlb__elem_strides): a stride
# that is no multiple of the itemsize is refused only where it could lead to
# another element.  NumPy's own test_dlpack.py::test_size1dims_arrays.


def _odd_size1():
    return [
        np.ndarray((10, 5, 1), "f8", strides=(8, 80, 4),
                   buffer=np.arange(50.0)),
        np.lib.stride_tricks.as_strided(np.arange(4.0), (4, 1), (8, 3)),
        np.lib.stride_tricks.as_strided(np.arange(4.0), (1, 4), (5, 8)),
        np.lib.stride_tricks.as_strided(np.arange(4.0), (0, 4), (3, 8)),
        # not contiguous: NumPy's buffer export keeps the 3 as it is
        np.lib.stride_tricks.as_strided(np.arange(8.0), (2, 1, 2), (32, 3, 8)),
    ]


class ArrayInterface:
    """An __array_interface__ owner with exactly the strides it is given."""

    def __init__(self, a):
        self.a = a
        self.__array_interface__ = dict(a.__array_interface__,
                                        strides=a.strides)


@pytest.mark.parametrize("i", range(5))
def test_odd_strides_on_size1_dims_imported(i):
    a = _odd_size1()[i]
    expect = tuple(0 if n <= 1 and s % a.itemsize else s // a.itemsize
                   for n, s in zip(a.shape, a.strides))
    objs = [a, ArrayInterface(a)]
    if memoryview(a).strides == a.strides:
        objs.append(memoryview(a))  # the owning buffer reader
        v = core._exchange_view(memoryview(a), 0, 0)  # the buffer view
        assert v["kind"] == BUFFER and v["strides"] == expect
    for obj in objs:
        t = dlb.from_dlpack(obj)
        assert t.shape == a.shape and t.strides == expect
        assert t.data_ptr == a.ctypes.data
        # exports of the import describe the same values
        np.testing.assert_array_equal(np.from_dlpack(t), a)
        np.testing.assert_array_equal(np.asarray(t), a)
        np.testing.assert_array_equal(np.asarray(t.copy()), a)
        if a.size:
            np.testing.assert_array_equal(np.asarray(memoryview(t)), a)
    # the borrowed view (Function's reader) and the forced buffer reader
    v = core._exchange_view(a, 0, 0)
    assert v["kind"] == NUMPY and v["strides"] == expect
    assert core._exchange_view(a, 0, BUFFER)["shape"] == a.shape


def test_odd_strides_on_size1_dims_through_function(lib):
    a = _odd_size1()[0]
    copy = dlb.load(lib, "dlb_kernel_copy",
                    "copy(x: float64[a, b, c]) -> float64[a, b, c]")
    np.testing.assert_array_equal(copy(a), a)
    torch = pytest.importorskip("torch")
    np.testing.assert_array_equal(torch.from_dlpack(dlb.from_dlpack(a)), a)


def test_odd_stride_on_a_longer_dim_still_refused():
    a = np.lib.stride_tricks.as_strided(np.arange(4.0), (4, 2), (8, 3))
    for obj, what in ((a, "numpy array stride 3 of dimension 1"),
                      (ArrayInterface(a), "__array_interface__ stride 3 of "
                                          "dimension 1")):
        with pytest.raises(BufferError, match=what):
            dlb.from_dlpack(obj)
    with pytest.raises(BufferError, match="not a multiple of the itemsize 8"):
        core._exchange_view(a, 0, 0)


def test_buffer_views():
    v = core._exchange_view(bytearray(b"abcd"), 0, 0)
    assert v["shape"] == (4,) and v["strides"] == (1,) and v["flags"] == 0
    v = core._exchange_view(b"abcd", 0, 0)
    assert v["flags"] == 1
    with pytest.raises(BufferError):
        core._exchange_view(b"abcd", WRITABLE, 0)
    m = memoryview(bytearray(24)).cast("d", (3,))
    assert core._exchange_view(m, WRITABLE, 0)["dtype"] == (2, 64, 1)


def test_tensor_view_zero_copy():
    t = dlb.from_dlpack(np.arange(6.0).reshape(2, 3)[:, 1:])
    v = core._exchange_view(t, 0, 0)
    assert v["kind"] == TENSOR and not v["owned"]
    assert v["shape"] == t.shape and v["strides"] == t.strides
    assert v["data"] + v["byte_offset"] == t.data_ptr


def test_no_leak_over_many_views(tp):
    torch = pytest.importorskip("torch")
    objs = [dlb.zeros((2, 3)), np.zeros((2, 3)), bytearray(8), torch.zeros(3),
            tp.CountingTable(3)]
    for o in objs:
        core._exchange_view_loop(o, 0, 0, 1000)
    core._exchange_view_loop(objs[1], 0, BUFFER, 1000)
    gc.collect()
    rcs = [sys.getrefcount(o) for o in objs]
    tracemalloc.start()
    s1 = tracemalloc.take_snapshot()
    for o in objs:
        core._exchange_view_loop(o, 0, 0, 100000)
    core._exchange_view_loop(objs[1], 0, BUFFER, 100000)
    core._exchange_view_loop(objs[3], 0, DLPACK, 2000)
    s2 = tracemalloc.take_snapshot()
    tracemalloc.stop()
    assert [sys.getrefcount(o) for o in objs] == rcs
    grown = sum(s.size_diff for s in s2.compare_to(s1, "filename"))
    assert grown < 32 * 1024, grown


# ---- from_dlpack through the handler ----------------------------------------------

def test_from_dlpack_numpy_keeps_array_alive():
    a = np.arange(10.0)[::2]
    rc = sys.getrefcount(a)
    t = dlb.from_dlpack(a)
    assert sys.getrefcount(a) == rc + 1
    assert t.strides == (2,) and t.data_ptr == a.ctypes.data
    w = a.ctypes.data
    del a
    gc.collect()
    assert t.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0] and t.data_ptr == w
    ro = np.arange(3)
    ro.flags.writeable = False
    assert dlb.from_dlpack(ro).readonly
    c = dlb.from_dlpack(ro, copy=True)
    assert not c.readonly and c.tolist() == [0, 1, 2]
    b = np.arange(3.0)
    rc = sys.getrefcount(b)
    for _ in range(1000):
        dlb.from_dlpack(b)
    assert sys.getrefcount(b) == rc


def test_from_dlpack_exchange_errors(tp):
    class Two(tp.CountingTable):
        __dlpack_c_exchange_api__ = tp.exchange_capsule("counting")
    tp.counting_reset()
    o = Two(2)
    with pytest.raises(BufferError):
        dlb.from_dlpack(o, device="cuda:0")
    gc.collect()
    n = tp.counting_counts()
    assert n["from_py"] == n["deleter"] == 1  # the failed import freed it once


def test_to_framework_jax_and_tensorflow():
    jnp = pytest.importorskip("jax.numpy")
    x = jnp.arange(4.0)
    # the buffer protocol, then __dlpack__ (the registry's read_buffer)
    assert core._exchange_handler(x)[:2] == (BUFFER_DLPACK, "jax")
    y = core._exchange_alloc_like(x, (2, 3), "float32", "cpu")
    assert type(y) is type(x) and y.shape == (2, 3)
    tf = pytest.importorskip("tensorflow")
    t = tf.constant([1.0, 2.0])
    assert core._exchange_handler(t)[1] == "tensorflow"
    z = core._exchange_to_framework(t, dlb.tensor([1.0, 2.0, 3.0],
                                                  dtype="float32"))
    assert isinstance(z, tf.Tensor) and z.numpy().tolist() == [1.0, 2.0, 3.0]


# ---- TensorFlow's eager tensors: TF's own capsule export -----------------------

def test_tensorflow_eager_fast_path(lib):
    tf = pytest.importorskip("tensorflow")
    x = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
    kind, fw, _ = core._exchange_handler(x)
    assert (kind, fw) == (TF_EAGER, "tensorflow")
    # zero-copy: the very memory TF's own export names
    shared = dlb.from_dlpack(tf.experimental.dlpack.to_dlpack(x))
    t = dlb.from_dlpack(x)
    assert t.data_ptr == shared.data_ptr and t.tolist() == x.numpy().tolist()
    assert not t.readonly  # a legacy capsule (docs/decisions.md)
    v = core._exchange_view(x, 0, 0)
    assert v["kind"] == TF_EAGER and v["owned"] and v["data"] == t.data_ptr
    # copy=True and device= are carried out here (TF refuses copy=True)
    c = dlb.from_dlpack(x, copy=True)
    assert c.data_ptr != t.data_ptr and c.tolist() == t.tolist()
    assert dlb.from_dlpack(x, device="cpu", copy=False).data_ptr == t.data_ptr
    # Function arguments take the same path
    copy = dlb.load(lib, "dlb_kernel_copy",
                    "copy(x: float32[m, n]) -> float32[m, n]")
    out = copy(x)
    assert isinstance(out, tf.Tensor) and out.numpy().tolist() == t.tolist()
    # what TF cannot export is TF's own error, as through __dlpack__ ...
    with pytest.raises(Exception, match="not supported by dlpack"):
        dlb.from_dlpack(tf.cast(tf.constant([1, 2]), tf.as_dtype("int4")))
    # ... except strings, which TF 2.21 aborts the process on
    with pytest.raises(BufferError, match="dtype string has no DLPack form"):
        dlb.from_dlpack(tf.constant(["a"]))
    with pytest.raises(BufferError, match="dtype string"):
        copy(tf.constant([["a"]]))


def test_tensorflow_patched_dlpack_is_honoured(monkeypatch):
    # The fast path stands only while __dlpack__ is TF's own: a replaced
    # method is called (the class's version tag moved, so it is classified
    # again), and the fast path comes back with the original.
    tf = pytest.importorskip("tensorflow")
    x = tf.constant([1.0, 2.0])
    cls = type(x)
    assert core._exchange_handler(x)[0] == TF_EAGER
    calls = []
    original = cls.__dlpack__

    def patched(self, **kw):
        calls.append(kw)
        return original(self, **kw)
    monkeypatch.setattr(cls, "__dlpack__", patched)
    assert core._exchange_handler(x)[0] == DLPACK
    assert dlb.from_dlpack(x).tolist() == [1.0, 2.0] and len(calls) == 1
    monkeypatch.undo()
    assert core._exchange_handler(x)[0] == TF_EAGER


def test_tensorflow_named_type_without_tf_export_is_plain_dlpack():
    # A type TensorFlow's module names but whose __dlpack__ is its own.
    a = np.arange(3.0)
    Fake = type("EagerTensor", (), {
        "__module__": "tensorflow.python.framework.ops",
        "__dlpack__": lambda self, **kw: a.__dlpack__(**kw),
        "__dlpack_device__": lambda self: (1, 0)})
    assert core._exchange_handler(Fake())[:2] == (DLPACK, "tensorflow")
    assert dlb.from_dlpack(Fake()).tolist() == [0.0, 1.0, 2.0]
