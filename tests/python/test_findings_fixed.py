"""Issue 7 findings that are fixed: regression tests moved here from the
strict-xfail test_findings_*.py files when their fix landed."""
import pytest

from _findings_util import check

SAXPY = '"saxpy(a: float32, x: float32[n], y: mut float32[n])"'


@pytest.mark.parametrize("spec", ["float32\x00junk", "float32\x00"])
def test_dtype_with_nul_is_rejected(spec):
    """Finding: dlb.dtype("float32\\x00junk") is accepted (C string cut at NUL)."""
    import dlbridge as dlb
    with pytest.raises((ValueError, TypeError)):
        dlb.dtype(spec)


@pytest.mark.parametrize("spec", ["cuda:1\x00:2", "cpu\x00junk"])
def test_device_with_nul_is_rejected(spec):
    """Finding: dlb.device("cuda:1\\x00:2") is accepted (C string cut at NUL)."""
    import dlbridge as dlb
    with pytest.raises((ValueError, TypeError)):
        dlb.device(spec)


@pytest.mark.parametrize("typestr", ["<f 8", "<f+8"])
def test_loose_typestr_rejected(typestr):
    """Finding: loose typestrs such as "<f 8" are accepted."""
    check("""
    a = np.arange(4, dtype=np.float64)
    class AI: pass
    o = AI(); o.a = a
    o.__array_interface__ = {"version": 3, "typestr": %r,
        "data": (a.ctypes.data, False), "shape": (4,)}
    try:
        dlb.from_dlpack(o)
    except (ValueError, BufferError, TypeError):
        print("OK"); sys.exit(0)
    print("accepted")
    """ % typestr)


@pytest.mark.parametrize("raise_expr,check_expr", [
    ("MyError('boom')", "type(e) is MyError and e.args == ('boom',)"),
    ("SystemExit(3)", "type(e) is SystemExit and e.code == 3"),
    ("KeyError('k')", "type(e) is KeyError and e.args == ('k',)"),
])
def test_producer_exception_preserved(raise_expr, check_expr):
    """Finding: exceptions from an argument's producer are rebuilt as
    type(exc)(msg) -- custom exceptions become TypeError, SystemExit.code
    changes.  The original exception must reach the caller (or be chained as
    __cause__/__context__)."""
    check("""
    class MyError(Exception):
        def __init__(self, a, b=None):   # cannot be rebuilt from one message
            super().__init__(a) if b is None else super().__init__(a, b)
            self.marker = 1
    class Bad:
        def __dlpack__(self, **kw): raise %s
        def __dlpack_device__(self): return (1, 0)
    x = np.ones(4, dtype=np.float32)
    f = dlb.load(KERNELS, "dlb_kernel_saxpy", %s)
    try:
        f(2.0, x, Bad())
    except BaseException as exc:
        chain = [exc, exc.__cause__, exc.__context__]
        ok = any(e is not None and (%s) for e in chain)
        print(repr(exc), repr(exc.__cause__), repr(exc.__context__))
        print("OK" if ok else "LOST")
    """ % (raise_expr, SAXPY, check_expr))


def test_huge_data_address_in_array_interface():
    """Finding: __array_interface__ with data=(2**70, False) raises
    OverflowError instead of BufferError/ValueError."""
    check("""
    class AI: pass
    o = AI()
    o.__array_interface__ = {"version": 3, "typestr": "<f4",
                             "data": (2**70, False), "shape": (4,)}
    try:
        dlb.from_dlpack(o)
    except (BufferError, ValueError) as e:
        print("OK"); sys.exit(0)
    except Exception as e:
        print(type(e).__name__, e)
    """)


@pytest.mark.parametrize("where", ["shape", "strides"])
def test_huge_extent_in_array_interface(where):
    """Finding: an __array_interface__ shape/strides entry of 2**70 raises
    OverflowError instead of BufferError/ValueError."""
    check("""
    a = np.zeros(4, dtype=np.float32)
    class AI: pass
    o = AI(); o.a = a
    d = {"version": 3, "typestr": "<f4", "data": (a.ctypes.data, False),
         "shape": (4,), "strides": (4,)}
    d[%r] = (2**70,)
    o.__array_interface__ = d
    try:
        dlb.from_dlpack(o)
    except (BufferError, ValueError) as e:
        print("OK"); sys.exit(0)
    except Exception as e:
        print(type(e).__name__, e)
    """ % where)


@pytest.mark.parametrize("device", ["(1, 2**63)", "(2**64, 0)"])
def test_huge_dlpack_device(device):
    """Finding: a __dlpack_device__ with a huge device id/type raises
    OverflowError instead of BufferError/ValueError ((2, 2**40) is already a
    BufferError; ids/types past 2**63 are not)."""
    check("""
    a = np.zeros(4, dtype=np.float32)
    class P:
        def __dlpack__(self, **kw): return a.__dlpack__()
        def __dlpack_device__(self): return %s
    for call in (lambda: dlb.from_dlpack(P()),
                 lambda: dlb.load(KERNELS, "dlb_kernel_noop", "f(x: float32[n])")(P())):
        try:
            call()
        except (BufferError, ValueError):
            continue
        except Exception as e:
            print(type(e).__name__, e); sys.exit(0)
    print("OK")
    """ % device)




@pytest.mark.parametrize("ctor", ["tensor", "empty", "zeros"])
def test_list_shrunk_by_index_does_not_crash(ctor):
    """Finding: dlb.tensor/empty/zeros(list) -- an element's __index__ that
    shrinks the list makes tensor.c read past the old length (SIGSEGV)."""
    check("""
    lst = []
    class Evil:
        def __index__(self):
            lst.clear(); gc.collect(); return 2
        def __float__(self):
            lst.clear(); gc.collect(); return 2.0
    lst.extend([Evil() for _ in range(4)])
    try:
        dlb.%s(lst if "%s" == "tensor" else lst, dtype="int64")
    except (TypeError, ValueError, BufferError, IndexError, RuntimeError):
        pass
    print("OK")
    """ % (ctor, ctor))


def test_tensor_nested_list_shrunk_by_float():
    """Finding: dlb.tensor(nested list) -- __float__ that shrinks a row
    while filling reads freed items (SIGSEGV)."""
    check("""
    rows = []
    class Evil:
        def __float__(self):
            for r in rows: r.clear()
            rows.clear(); gc.collect(); return 1.0
    rows.extend([[Evil(), 2.0, 3.0] for _ in range(50)])
    try:
        dlb.tensor(rows, dtype="float64")
    except (TypeError, ValueError, BufferError, IndexError, RuntimeError):
        pass
    print("OK")
    """)


def test_class_named_numpy_ndarray_is_not_read_as_numpy():
    """Finding: a Python class named numpy.ndarray with the right __module__
    and size is read as a NumPy struct (raw memory from pure Python).  NumPy
    must be identified by identity, not by name."""
    check("""
    base = np.ndarray.__basicsize__
    nslots = (base - object.__basicsize__) // 8
    Fake = type("numpy.ndarray", (), {"__slots__": tuple("s%d" % i for i in range(nslots)),
                                "__module__": "numpy"})
    Fake.__qualname__ = "ndarray"
    assert Fake.__basicsize__ == base, (Fake.__basicsize__, base)
    o = Fake()
    for i in range(nslots):
        setattr(o, "s%d" % i, 12345 + i)
    try:
        t = dlb.from_dlpack(o)
    except TypeError:
        print("OK"); sys.exit(0)
    print("read as numpy", t.shape, t.dtype)
    """)


# ---- handlers: one ladder, one registry, no stale handler, no strong type cache

def test_convert_type_cache_does_not_keep_types_alive():
    """Finding: dlb.convert keeps every type it sees alive (up to 1024) with
    everything they reference; the cache must hold types weakly."""
    check("""
    a = np.arange(4, dtype=np.float32)
    def make():
        class P:
            def __dlpack__(self, **kw): return a.__dlpack__(**kw)
            def __dlpack_device__(self): return (1, 0)
        return P
    P = make()
    r = weakref.ref(P)
    dlb.convert(P(), "numpy")
    del P
    for _ in range(3): gc.collect()
    print("OK" if r() is None else "TYPE KEPT ALIVE")
    """)


def test_raw_capsule_and_to_dlpack_are_tensor_like_for_function():
    """Finding (one ladder): a raw capsule or a toDlpack()-only object
    imports with from_dlpack but is 'not tensor-like' as a Function
    argument."""
    check("""
    x = np.ones(4, dtype=np.float32)
    f = dlb.load(KERNELS, "dlb_kernel_saxpy",
                 "saxpy(a: float32, x: float32[n], y: mut float32[n])")
    y = np.zeros(4, dtype=np.float32)
    dlb.from_dlpack(x.__dlpack__())
    f(2.0, x.__dlpack__(), y)
    assert y.tolist() == [2.0] * 4
    class Legacy:
        def toDlpack(self): return x.__dlpack__()
    dlb.from_dlpack(Legacy())
    f(2.0, Legacy(), y)
    assert y.tolist() == [4.0] * 4
    print("OK")
    """)


def test_protocol_change_after_first_sight_is_seen():
    """Finding (stale handler): a class whose protocol changes after
    Function first saw it is still classified the old way."""
    check("""
    x = np.ones(4, dtype=np.float32)
    y = np.zeros(4, dtype=np.float32)
    class C:
        pass
    f = dlb.load(KERNELS, "dlb_kernel_saxpy",
                 "saxpy(a: float32, x: float32[n], y: mut float32[n])")
    try:
        f(2.0, C(), y)
    except TypeError:
        pass
    C.__dlpack__ = lambda self, **kw: x.__dlpack__(**kw)
    C.__dlpack_device__ = lambda self: (1, 0)
    assert dlb.from_dlpack(C()).tolist() == [1.0] * 4
    f(2.0, C(), y)
    print("OK" if y.tolist() == [2.0] * 4 else "WRONG")
    """)


def test_capi_export_readonly_refusal_does_not_depend_on_list():
    """Finding (one framework registry): the C API's read-only refusal
    depends on which framework list a name is in.  dlb.convert refuses
    read-only data for torch (its tensors cannot be read-only); the C API's
    dlb_py_export(m, "torch") takes the C exchange-table path and hands the
    read-only memory to torch as writable.  Both must refuse."""
    pytest.importorskip("torch")
    import dlbridge as dlb
    import numpy as np
    from test_capi import READ_ONLY, Counted, Table
    ro = np.arange(4, dtype=np.float32)
    ro.flags.writeable = False
    with pytest.raises(BufferError):
        dlb.convert(ro, "torch")
    backing = np.arange(4, dtype=np.float32)
    c = Counted(backing, flags=READ_ONLY)
    with pytest.raises(BufferError):
        Table().export(c.m, "torch")


# ---- one spelling for devices and dtypes in messages

def test_one_device_spelling_in_messages():
    """Finding: messages spelled the CPU "cpu" or "cpu:0" and unknown device
    types three ways ("device_type_5", "device type 5", "an unknown
    device"); every message now uses dlb_device_describe, which is also
    str(dlb.Device)."""
    tp = pytest.importorskip("_dlb_testproducer")
    import dlbridge as dlb
    assert str(dlb.device("cpu")) == "cpu"
    cap = tp.Producer(shape=(2,), strides=(1,), device=(5, 0)).capsule(
        versioned=True)
    with pytest.raises(BufferError, match="device_type_5:0: not a known"):
        dlb.from_dlpack(cap)


def test_capi_export_readonly_refusal_by_like_too():
    """The registry's refusal applies whichever way the framework is named:
    like=<a torch tensor> refuses read-only data as "torch" does, and a
    writable tensor still goes through torch's exchange table, sharing
    memory."""
    torch = pytest.importorskip("torch")
    import numpy as np
    from test_capi import READ_ONLY, Counted, Table
    backing = np.arange(4, dtype=np.float32)
    c = Counted(backing, flags=READ_ONLY)
    with pytest.raises(BufferError, match="read-only"):
        Table().export(c.m, like=torch.ones(1))
    w = Counted(np.arange(4, dtype=np.float32))
    t = Table().export(w.m, "torch")
    assert type(t) is torch.Tensor and t.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert t.data_ptr() == w.arr.ctypes.data
    del t
    assert c.calls == 1 and w.calls == 1  # each deleter ran exactly once
