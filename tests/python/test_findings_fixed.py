"""Issue 7 findings that are fixed: regression tests moved here from the
strict-xfail test_findings_*.py files when their fix landed."""
import sysconfig

import pytest

from _findings_util import CAPSULE, check

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
    read-only memory to torch as writable.  Neither may alias it: since
    gh-17 both copy (convert's copy=None rule), and convert(copy=False)
    refuses."""
    pytest.importorskip("torch")
    import dlbridge as dlb
    import numpy as np
    from test_capi import READ_ONLY, Counted, Table
    ro = np.arange(4, dtype=np.float32)
    ro.flags.writeable = False
    assert dlb.convert(ro, "torch").data_ptr() != ro.ctypes.data
    with pytest.raises(BufferError):
        dlb.convert(ro, "torch", copy=False)
    backing = np.arange(4, dtype=np.float32)
    c = Counted(backing, flags=READ_ONLY)
    t = Table().export(c.m, "torch")
    assert t.data_ptr() != backing.ctypes.data and t.tolist() == [0, 1, 2, 3]


# ---- one spelling for devices and dtypes in messages

def test_one_device_spelling_in_messages():
    """Finding: messages spelled the CPU "cpu" or "cpu:0" and unknown device
    types three ways ("device_type_5", "device type 5", "an unknown
    device"); every message now uses dlb_device_describe, which is also
    str(dlb.Device)."""
    tp = pytest.importorskip("_dlb_testproducer")
    import dlbridge as dlb
    assert str(dlb.device("cpu")) == "cpu"
    # A type without a name is a foreign device "device5" (issue 23 item
    # 12): held, and every message about it spells it so.
    cap = tp.Producer(shape=(2,), strides=(1,), device=(5, 0)).capsule(
        versioned=True)
    t = dlb.from_dlpack(cap)
    assert str(t.device) == "device5:0"
    with pytest.raises(BufferError, match="on device5:0"):
        t.tolist()


def test_capi_export_readonly_refusal_by_like_too():
    """The registry's rules apply whichever way the framework is named:
    like=<a torch tensor> copies read-only data as "torch" does (never an
    alias), and a writable tensor still goes through torch's exchange
    table, sharing memory."""
    torch = pytest.importorskip("torch")
    import numpy as np
    from test_capi import READ_ONLY, Counted, Table
    backing = np.arange(4, dtype=np.float32)
    c = Counted(backing, flags=READ_ONLY)
    t = Table().export(c.m, like=torch.ones(1))
    assert type(t) is torch.Tensor and t.data_ptr() != backing.ctypes.data
    w = Counted(np.arange(4, dtype=np.float32))
    t = Table().export(w.m, "torch")
    assert type(t) is torch.Tensor and t.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert t.data_ptr() == w.arr.ctypes.data
    del t
    assert c.calls == 1 and w.calls == 1  # each deleter ran exactly once


RAISE = """
import ctypes
P = ctypes.c_void_p
get = ctypes.pythonapi.PyCapsule_GetPointer
get.restype = P; get.argtypes = [ctypes.py_object, ctypes.c_char_p]
addr = get(dlb._core._C_API, b"dlbridge._C_API")
from dlpack_ctypes import CAPI, DLBError
raise_error = ctypes.PYFUNCTYPE(P, P, P)(CAPI.from_address(addr).raise_error)
"""


def test_raise_error_unterminated_message():
    """Finding: C API raise_error reads past an unterminated message.  The
    error's 256-byte message has no NUL and is followed by non-zero bytes
    up to an unmapped page: the message must be cut at its 256 bytes."""
    check(pre=RAISE, code="""
    import mmap
    page = mmap.PAGESIZE
    # Two pages; the second is made inaccessible: the error ends exactly at
    # the first page's end, so reading past it faults.
    buf = mmap.mmap(-1, 2 * page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None)
    libc.mprotect.argtypes = [P, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(base + page, page, 0) == 0
    at = base + page - ctypes.sizeof(DLBError)
    err = DLBError.from_address(at)
    err.code = -1                                 # DLB_EINVAL
    ctypes.memset(at + 4, ord("x"), 256)          # no NUL anywhere
    try:
        raise_error(addr, at)
    except Exception as e:
        msg = str(e)
        print(type(e).__name__, len(msg))
        print("OK" if 0 < msg.count("x") <= 256 and type(e) is not SystemError else "BAD")
    """)


def test_raise_error_unterminated_message_no_overread():
    """Finding: raise_error reads past the 256-byte message: bytes after
    the struct must not appear in the exception text."""
    check(pre=RAISE, code="""
    class Padded(ctypes.Structure):
        _fields_ = [("err", DLBError), ("after", ctypes.c_char * 64)]
    p = Padded()
    p.err.code = -1
    ctypes.memset(ctypes.addressof(p) + DLBError.message.offset, ord("x"), 256)
    p.after = b"LEAKED-BEYOND-THE-MESSAGE" + b"\\0"
    try:
        raise_error(addr, ctypes.addressof(p))
    except Exception as e:
        print(type(e).__name__, str(e)[-40:])
        print("OK" if "LEAKED" not in str(e) and type(e) is not SystemError else "OVERREAD")
    """)


def test_raise_error_non_utf8_message():
    """Finding: a non-UTF-8 message from C becomes UnicodeDecodeError instead
    of the exception its status code maps to (ValueError for DLB_EINVAL)."""
    check(pre=RAISE, code="""
    e0 = DLBError(); e0.code = -1; e0.message = b"plain"
    try:
        raise_error(addr, ctypes.addressof(e0))
    except Exception as e:
        want = type(e)
    err = DLBError(); err.code = -1; err.message = b"bad \\xff\\xfe bytes"
    try:
        raise_error(addr, ctypes.addressof(err))
    except Exception as e:
        print(want.__name__, type(e).__name__, e)
        print("OK" if type(e) is want and "bad" in str(e) else "WRONG TYPE")
    """)


def test_array_interface_dict_mutated_by_index():
    """Finding: __array_interface__ dict mutated by a shape item's __index__
    -> use-after-free of borrowed dict values."""
    check("""
    buf = np.arange(16, dtype=np.float32)
    class Evil:
        def __index__(self):
            d.clear(); d["junk"] = [object() for _ in range(100)]
            gc.collect(); return 4
    d = {"version": 3, "typestr": "<f4", "data": (buf.ctypes.data, False),
         "shape": (Evil(), Evil()), "strides": (Evil(), Evil())}
    class Obj:
        __array_interface__ = property(lambda self: d)
    o = Obj(); o.keep = buf
    for _ in range(3):
        d.update({"version": 3, "typestr": "<f4", "data": (buf.ctypes.data, False),
                  "shape": (Evil(), Evil()), "strides": (Evil(), Evil())})
        try:
            dlb.from_dlpack(o)
        except (TypeError, ValueError, BufferError, KeyError):
            pass
    print("OK")
    """)


def _ai(data, shape, strides=None, offset=None, typestr="<f8"):
    return ("""
    class AI:
        def __init__(self, data, shape, strides, offset, typestr):
            self.__array_interface__ = {"version": 3, "typestr": typestr,
                "data": data, "shape": shape, "strides": strides}
            if offset is not None:
                self.__array_interface__["offset"] = offset
    o = AI(%s, %r, %r, %r, %r)
    """ % (data, shape, strides, offset, typestr))


@pytest.mark.parametrize("shape,strides,offset", [
    ((1 << 27,), None, None),        # 1 GiB described over 8 bytes
    ((2,), (-8,), None),             # negative stride walks before the buffer
    ((1,), None, 8),                 # offset == len
    ((2,), None, 8),                 # offset + extent past the end
])
def test_array_interface_buffer_data_bounds_checked(shape, strides, offset):
    """Finding: __array_interface__ with a buffer as data -- shape/strides/
    offset never checked against the buffer's length (1 GiB over 8 bytes is
    accepted and copy() crashes; negative strides and offset == len read
    outside).  Must be refused (BufferError/ValueError)."""
    check(_ai("bytearray(8)", shape, strides, offset) + """
    try:
        t = dlb.from_dlpack(o)
    except (BufferError, ValueError):
        print("OK"); sys.exit(0)
    t.copy()
    print("accepted", t.shape, t.strides)
    """)


def test_array_interface_noncontiguous_buffer_data():
    """Finding: __array_interface__ with a non-contiguous buffer as data is
    read as if it were contiguous (wrong values, no error)."""
    check(_ai("memoryview(np.arange(8, dtype=np.float64))[::2]", (4,)) + """
    try:
        t = dlb.from_dlpack(o)
    except (BufferError, ValueError):
        print("OK"); sys.exit(0)
    got = np.asarray(t.copy().tolist())
    print(got)
    print("OK" if list(got) == [0.0, 2.0, 4.0, 6.0] else "WRONG")
    """)


@pytest.mark.parametrize("method", ["to_dlpack", "to_dlpack_for_read",
                                    "to_dlpack_for_write"])
def test_legacy_producer_methods_recognised(method):
    """Finding: objects with to_dlpack() (cuDF) or MXNet's
    to_dlpack_for_read()/to_dlpack_for_write() are not recognised."""
    check("""
    a = np.arange(4, dtype=np.float32)
    class P:
        def %s(self):
            return a.__dlpack__(max_version=None) if False else a.__dlpack__()
    t = dlb.from_dlpack(P())
    print("OK" if t.tolist() == [0.0, 1.0, 2.0, 3.0] else t.tolist())
    """ % method)


@pytest.mark.parametrize("methods,readonly", [
    (("to_dlpack_for_read",), True),
    (("to_dlpack_for_write",), False),
    (("to_dlpack_for_read", "to_dlpack_for_write"), False),
])
def test_mxnet_legacy_producer_read_only(methods, readonly):
    """MXNet's to_dlpack_for_read() promises only ordering after writes:
    imported read-only; to_dlpack_for_write() is preferred when both exist."""
    import numpy as np
    import dlbridge as dlb
    a = np.arange(4, dtype=np.float32)
    ns = {m: (lambda self: a.__dlpack__()) for m in methods}
    P = type("P", (), ns)
    t = dlb.from_dlpack(P())
    assert t.readonly is readonly
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("copy", [True, False])
def test_copy_keyword_retried_with_old_producer(copy):
    """Finding: from_dlpack(p, copy=True|False) with a producer whose
    __dlpack__ rejects the new keywords raises its TypeError instead of
    retrying; for copy=True dlbridge must copy itself."""
    check("""
    a = np.arange(4, dtype=np.float32)
    class Old:
        def __dlpack__(self, stream=None):
            return a.__dlpack__()
        def __dlpack_device__(self):
            return (1, 0)
    t = dlb.from_dlpack(Old(), copy=%r)
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0]
    if %r:
        a[0] = 42
        assert t.tolist()[0] == 0.0, "copy=True shares memory"
    print("OK")
    """ % (copy, copy))


def test_copy_false_refuses_copied_capsule_from_old_producer():
    """After the retry without copy=, a capsule that says IS_COPIED cannot
    satisfy copy=False: BufferError, not a silent copy."""
    check(pre=CAPSULE, code="""
    class Old:
        def __dlpack__(self, stream=None):
            return capsule(flags=2)              # DLPACK_FLAG_BITMASK_IS_COPIED
        def __dlpack_device__(self):
            return (1, 0)
    try:
        dlb.from_dlpack(Old(), copy=False)
    except BufferError as e:
        assert "IS_COPIED" in str(e), e
        print("OK"); sys.exit(0)
    print("accepted")
    """)


def test_reimport_chain_does_not_overflow_stack():
    """Finding: freeing a chain of 200k re-imports
    (t = dlb.from_dlpack(t.__dlpack__())) overflows the C stack; dlbridge
    must recognise its own exports (or use the trashcan)."""
    check("""
    import threading
    threading.stack_size(1 << 20)   # a modest 1 MiB stack, so it fails fast
    def work():
        t = dlb.zeros((4,))
        for _ in range(200000):
            t = dlb.from_dlpack(t.__dlpack__())
        del t
        gc.collect()
        print("OK")
    th = threading.Thread(target=work); th.start(); th.join()
    """, timeout=120)


def test_cycle_through_buffer_import_collected():
    """Finding: a Tensor -> owner -> Tensor cycle through a buffer import is
    never collected."""
    check("""
    class Owner(bytearray):
        pass
    o = Owner(16)
    t = dlb.from_dlpack(o)
    o.t = t                     # owner -> tensor, tensor -> owner (buffer)
    r = weakref.ref(o)
    del o, t
    for _ in range(3): gc.collect()
    print("OK" if r() is None else "LEAKED")
    """)


def test_cycle_through_array_interface_import_collected():
    """Finding: a Tensor -> owner -> Tensor cycle through an
    __array_interface__ import is never collected."""
    check("""
    class Owner:
        def __init__(self):
            self.a = np.zeros(4, dtype=np.float32)
        @property
        def __array_interface__(self):
            return self.a.__array_interface__
    o = Owner()
    t = dlb.from_dlpack(o)
    o.t = t
    r = weakref.ref(o)
    del o, t
    for _ in range(3): gc.collect()
    print("OK" if r() is None else "LEAKED")
    """)


def test_reimport_chain_through_buffers_freed_by_trashcan():
    """A chain dlbridge does not collapse (each Tensor keeps a memoryview
    alive, which keeps the previous Tensor alive) is freed without
    overflowing a 1 MiB stack (tensor.c's list of dying tensors; 3.13's
    trashcan alone overflowed it)."""
    check("""
    import threading
    threading.stack_size(1 << 20)
    def work():
        t = dlb.zeros((4,))
        for _ in range(100000):
            t = dlb.from_dlpack(memoryview(t))
        del t
        gc.collect()
        print("OK")
    th = threading.Thread(target=work); th.start(); th.join()
    """, timeout=120)


def test_deep_chain_released_before_del_returns():
    """Freeing a deep chain defers the inner links (tensor_dealloc nests at
    most two deep) but releases every one of them before the outermost
    dealloc returns: once `del t` is done, no link still exports the
    bytearray at the bottom, so it can be resized.  On a 1 MiB thread stack,
    which 3.13's trashcan alone overflows."""
    check("""
    import threading
    threading.stack_size(1 << 20)
    def work():
        base = bytearray(16)
        t = dlb.from_dlpack(base)
        for _ in range(100000):
            t = dlb.from_dlpack(memoryview(t))
        try:
            base.append(0)
        except BufferError:
            pass
        else:
            raise SystemExit("resized while the chain exports it")
        del t
        base.append(0)
        print("OK")
    th = threading.Thread(target=work); th.start(); th.join()
    """, timeout=120)


@pytest.mark.parametrize("kw", [{}, {"max_version": (1, 3)}])
def test_own_export_reimported_as_the_tensor(kw):
    """dlbridge recognises its own exported capsules: from_dlpack of one is
    the Tensor it came from (same view and flags), not a wrapper around it;
    copy=True still copies."""
    import numpy as np
    import dlbridge as dlb
    t = dlb.from_dlpack(np.arange(6, dtype=np.float32).reshape(2, 3)[:, ::2])
    assert dlb.from_dlpack(t.__dlpack__(**kw)) is t
    c = dlb.from_dlpack(t.__dlpack__(**kw), copy=True)
    assert c is not t and c.tolist() == t.tolist()
    assert c.data_ptr != t.data_ptr

    class Forward:          # a producer that hands our capsule on
        def __dlpack__(self, **k):
            return t.__dlpack__(**k)
    assert dlb.from_dlpack(Forward()) is t


def test_gc_sees_the_owner_of_an_imported_buffer():
    """tp_traverse reports the Python owner a Tensor keeps alive."""
    import gc
    import dlbridge as dlb
    b = bytearray(16)
    t = dlb.from_dlpack(b)
    assert gc.is_tracked(t)
    assert any(r is b for r in gc.get_referents(t))
    assert not gc.is_tracked(dlb.zeros((4,)))   # owns its memory: untracked
    # NumPy imports are traversed but not tracked: ndarray is no GC type, so
    # no cycle through one is collectable and tracking would only cost.
    import numpy as np
    a = np.zeros(4)
    n = dlb.from_dlpack(a)
    assert not gc.is_tracked(n)
    assert any(r is a for r in gc.get_referents(n))


@pytest.mark.parametrize("offset", [4, 32])
def test_convert_unaligned_to_tensorflow(offset):
    """Finding: TF convert of non-64-byte-aligned data must be refused with
    BufferError or copied into aligned memory; the returned tensor must work."""
    pytest.importorskip("tensorflow")
    check("""
    import tensorflow as tf
    raw = np.zeros(64 + 16 + 64, dtype=np.uint8)
    start = (-raw.ctypes.data) %% 64 + %d        # 64-aligned plus offset
    a = raw[start:start + 64].view(np.float32)
    a[:] = np.arange(16, dtype=np.float32)
    assert a.ctypes.data %% 64 == %d
    try:
        t = dlb.convert(a, "tensorflow")
    except BufferError:
        print("OK"); sys.exit(0)
    s = float(tf.reduce_sum(t * 1.0))
    print("OK" if s == 120.0 else "WRONG %%r" %% s)
    """ % (offset, offset), timeout=120)


def test_unaligned_to_tensorflow_is_copied_aligned():
    """convert(x, "tensorflow") of unaligned data copies it into aligned
    memory (the result works and no longer aliases x); aligned data is
    still shared; unaligned read-only data is copied too (gh-17), and
    copy=False refuses it."""
    pytest.importorskip("tensorflow")
    check("""
    import tensorflow as tf
    raw = np.zeros(64 + 16 + 64, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64
    for off, shared in ((4, False), (0, True)):
        a = raw[start + off:start + off + 64].view(np.float32)
        a[:] = np.arange(16, dtype=np.float32)
        t = dlb.convert(a, "tensorflow")
        a[0] = 100.0
        s = float(tf.reduce_sum(t * 1.0))
        assert s == (220.0 if shared else 120.0), (off, s)
    ro = raw[start + 4:start + 68].view(np.float32)
    ro.flags.writeable = False
    r = dlb.convert(ro, "tensorflow")
    assert float(tf.reduce_sum(r)) == float(ro.sum())
    try:
        dlb.convert(ro, "tensorflow", copy=False)
        print("shared read-only"); sys.exit(0)
    except BufferError:
        pass
    print("OK")
    """, timeout=120)


def test_convert_round_trip_does_not_grow_memory():
    """Finding: convert(convert(x, "torch"), "numpy") round trips grow memory
    (~1.3 KB each)."""
    pytest.importorskip("torch")
    check("""
    import torch
    x = np.arange(16, dtype=np.float32)
    for _ in range(2000):
        x = dlb.convert(dlb.convert(x, "torch"), "numpy")
    gc.collect()
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    r0 = rss()
    for _ in range(20000):
        x = dlb.convert(dlb.convert(x, "torch"), "numpy")
    gc.collect()
    grow = (rss() - r0) / 20000
    print("bytes per round trip", grow)
    print("OK" if grow < 200 else "GROWS")
    """, timeout=120)


@pytest.mark.skipif(
    bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
    reason="the exported-tensor cache is off in free-threaded builds: it "
    "holds borrowed Tensors another thread's dealloc could free under a "
    "reader (src/python/tensor.c, docs/python-versions.md)")
def test_exported_tensor_recognised_through_other_frameworks():
    """A framework's tensor over exactly an exported Tensor's memory imports
    as that Tensor (no chain of wrappers); a different view, dtype or
    read-only flag is a new Tensor."""
    import numpy as np
    import dlbridge as dlb
    t = dlb.from_dlpack(np.arange(8, dtype=np.float32))
    a = np.from_dlpack(t)
    assert dlb.from_dlpack(a) is t
    assert dlb.from_dlpack(a[::2]) is not t               # another view
    assert dlb.from_dlpack(a.view(np.int32)) is not t     # another dtype
    ro = a.view()
    ro.flags.writeable = False
    r = dlb.from_dlpack(ro)
    assert r is not t and r.readonly                      # flags differ
    torch = pytest.importorskip("torch")
    tt = torch.from_dlpack(t)
    assert dlb.from_dlpack(tt) is t
    assert dlb.convert(dlb.convert(t, "torch"), "dlbridge") is t


def test_own_export_through_read_only_legacy_method_stays_read_only():
    """A dlbridge capsule handed out by to_dlpack_for_read() imports
    read-only: it is not answered with the writable Tensor itself."""
    import dlbridge as dlb
    t = dlb.zeros((4,))

    class P:
        def to_dlpack_for_read(self):
            return t.__dlpack__()
    r = dlb.from_dlpack(P())
    assert r is not t and r.readonly and not t.readonly
    assert r.data_ptr == t.data_ptr


CASES = {
    "conj": "torch.tensor([1+2j, 3-4j], dtype=torch.complex64).conj()",
    "conj_imag": "torch.tensor([1+2j, 3-4j], dtype=torch.complex64).conj().imag",
    "neg": "torch._neg_view(torch.tensor([1.0, -2.0]))",
}


TORCH_CASES = {
    "sparse": "torch.eye(3).to_sparse()",
    "meta": "torch.empty(4, device='meta')",
    "quantized": "torch.quantize_per_tensor(torch.ones(4), 0.1, 0, torch.quint8)",
}

# The checks of torch's lazy bits and requires_grad, both ways: "read" from
# the TensorImpl where torchbits.c's experiment found them (the default),
# "ask" each tensor (what happens when the experiment fails), forced in the
# child before its first torch tensor.  The child's last check proves the
# way it ran.
TORCH_BITS = ["read", "ask"]


def bits_pre(bits):
    return "dlb._core._torch_bits_force(-1)\n" if bits == "ask" else ""


def bits_end(bits):
    return ("assert dlb._core._torch_bits_state() == %d, "
            "dlb._core._torch_bits_state()" % (-1 if bits == "ask" else 1))


def test_exchange_table_borrowed_entry_respects_read_only():
    """Finding: dlb.Tensor's own exchange table publishes the borrowed entry
    (dltensor_from_py_object_no_sync) although its tensors can be read-only,
    so a second consumer writes into immutable bytes.  The entry must be
    absent, or refuse a read-only tensor."""
    check("""
    from dlpack_ctypes import DLTensor, ExchangeAPI
    P = ctypes.c_void_p
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = P; get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api = ExchangeAPI.from_address(get(dlb.Tensor.__dlpack_c_exchange_api__, b"dlpack_exchange_api"))
    if not api.dltensor_from_py_object_no_sync:
        print("OK"); sys.exit(0)
    raw = bytes(16)
    t = dlb.from_dlpack(np.frombuffer(raw, dtype=np.float32))
    assert t.readonly
    fn = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(DLTensor))(
        api.dltensor_from_py_object_no_sync)
    out = DLTensor()
    try:
        rc = fn(t, ctypes.byref(out))
    except BufferError:
        print("OK"); sys.exit(0)
    if rc != 0:
        print("OK"); sys.exit(0)
    ctypes.memset(out.data, 0x41, 4)     # what a writing consumer does
    print(raw[:4])
    print("WROTE INTO BYTES")
    """)


def test_exported_capsule_survives_deleter_without_rename():
    """Finding: a consumer that runs the deleter without renaming the
    capsule (torch 2.13 on a failure path) makes the capsule's destructor
    run the deleter again -> double free.  dlbridge's capsules must survive
    it (e.g. the deleter clears the context so the destructor does nothing)."""
    check("""
    class M(ctypes.Structure):
        _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                    ("ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p; get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    for i in range(200):
        t = dlb.zeros((1000 + i,))
        cap = t.__dlpack__(max_version=(1, 0))
        del t
        p = get(cap, b"dltensor_versioned")
        m = M.from_address(p)
        ctypes.CFUNCTYPE(None, ctypes.c_void_p)(m.deleter)(p)
        del cap, m
        junk = [bytearray(8000 + i) for _ in range(50)]
    gc.collect()
    print("OK")
    """)


def test_convert_to_torch_of_unsupported_device_refused():
    """Finding: dlb.convert(t, "torch") of a tensor on a device torch cannot
    hold crashes the process (torch runs the deleter without renaming the
    capsule, then the destructor runs it again).  Refuse before hand-over."""
    pytest.importorskip("torch")
    check(pre=CAPSULE, code="""
    import torch
    # kDLOpenCL: torch 2.13 runs the deleter on this failure path without
    # renaming the capsule (kDLHexagon, say, it refuses before taking it).
    t = dlb.from_dlpack(capsule(device_type=4))
    for _ in range(3):
        try:
            dlb.convert(t, "torch")
        except BufferError:
            pass
        gc.collect()
    # Dropped here, not left to interpreter shutdown: the capsule helper's
    # ctypes deleter may be freed before t at shutdown, which crashes
    # whatever dlbridge does.  Before the fix torch's deleter call plus the
    # capsule destructor's second one freed the export twice and dropped
    # t's reference twice: the process died here.
    del t
    junk = [dlb.zeros((100 + i,)) for i in range(200)]
    gc.collect()
    print("OK", flush=True)
    """)


def test_tensor_and_function_agree_on_float_to_int32():
    """Finding (scalars): dlb.tensor(1.5, dtype="int32") truncates while a 0-d
    int32 Function parameter raises; one conversion rule must give the same
    answer in both places."""
    p = check("""
    def outcome(f):
        try:
            return ("value", f())
        except Exception as e:
            return ("error", type(e).__name__)
    t = outcome(lambda: dlb.tensor(1.5, dtype="int32").tolist())
    fn = dlb.load(KERNELS, "dlb_kernel_noop", "f(a: int32)")
    f = outcome(lambda: fn(1.5))
    print(t, f)
    print("OK" if t[0] == f[0] == "error" or (t[0] == f[0] == "value") else "DIFFER")
    """)


@pytest.mark.parametrize("case", sorted(TORCH_CASES))
@pytest.mark.parametrize("route", ["from_dlpack", "convert", "function"])
def test_torch_unsupported_layout_is_short_buffer_error(case, route):
    """Finding: torch sparse/meta/quantized tensors raise RuntimeError with a
    1.7 KB C++ backtrace instead of a BufferError with a short message."""
    pytest.importorskip("torch")
    check("""
    import torch
    x = %s
    route = %r
    try:
        if route == "from_dlpack":
            dlb.from_dlpack(x)
        elif route == "convert":
            dlb.convert(x, "numpy")
        else:
            sig = {"sparse": "f(x: float32[m, n])", "meta": "f(x: float32[n])",
                   "quantized": "f(x: uint8[n])"}[%r]
            f = dlb.load(KERNELS, "dlb_kernel_noop", sig)
            f(x)
    except BufferError as e:
        print(len(str(e)))
        print("OK" if len(str(e)) < 400 and "frame #" not in str(e) else "LONG")
    except Exception as e:
        print(type(e).__name__, len(str(e)))
    """ % (TORCH_CASES[case], route, case))


def test_result_framework_refused_before_kernel_runs():
    """Finding: a Function result the caller's framework cannot hold fails
    only after the kernel ran.  NumPy cannot hold bfloat16: the refusal must
    come before the kernel (dlb_kernel_fail) is called."""
    check("""
    x = np.ones(4, dtype=np.float32)
    f = dlb.load(KERNELS, "dlb_kernel_fail", "f(x: float32[n]) -> bfloat16[n]")
    try:
        r = f(x)
        print("returned", type(r))
    except Exception as e:
        print(type(e).__name__, str(e)[:200])
        print("KERNEL RAN" if "fail was given" in str(e) else "OK")
    """)


def test_torch_allocator_failure_is_short_buffer_error():
    """New finding (seen while writing these): an output dtype torch cannot
    hold (float32x4, int4) fails in torch's allocator as MemoryError with a
    C++ backtrace; it must be a BufferError with a short message."""
    pytest.importorskip("torch")
    check("""
    import torch
    x = torch.ones(4)
    f = dlb.load(KERNELS, "dlb_kernel_noop", "f(x: float32[n]) -> float32x4[n]")
    try:
        f(x)
    except BufferError as e:
        print("OK" if len(str(e)) < 400 else "LONG %d" % len(str(e)))
    except Exception as e:
        print(type(e).__name__, len(str(e)))
    """)


def test_later_producer_resizes_earlier_torch_argument():
    """Finding: a later argument's __dlpack__ calls resize_()/set_() on an
    earlier torch argument -> the kernel reads/writes freed memory."""
    pytest.importorskip("torch")
    check("""
    import torch
    n = 1 << 20
    x = torch.ones(n)
    ybuf = np.zeros(n, dtype=np.float32)
    keep = []
    class Later:
        def __dlpack__(self, **kw):
            x.set_(torch.full((n,), 5.0)); gc.collect()   # frees x's storage
            keep.extend(np.full(n, 7, dtype=np.float32) for _ in range(4))
            return ybuf.__dlpack__(**kw)
        def __dlpack_device__(self):
            return (1, 0)
    f = dlb.load(KERNELS, "dlb_kernel_saxpy", %s)
    try:
        f(2.0, x, Later())
    except (BufferError, ValueError, TypeError, RuntimeError):
        print("OK"); sys.exit(0)
    # Old view kept alive (2.0) or the new storage read (10.0), uniformly.
    vals = set(ybuf.tolist())
    print(sorted(vals)[:4])
    print("OK" if vals in ({2.0}, {10.0}) else "WRONG")
    """ % SAXPY)


def test_output_checked_against_prototype():
    """Finding: Function outputs -- the framework allocator's result is never
    checked against the prototype (shape, dtype, device, contiguity)."""
    pytest.importorskip("torch")
    check("""
    import torch
    from dlpack_ctypes import DLTensor, ExchangeAPI
    P = ctypes.c_void_p
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = P; get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    torch_api = ExchangeAPI.from_address(
        get(torch.Tensor.__dlpack_c_exchange_api__, b"dlpack_exchange_api"))
    ALLOC = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(DLTensor), ctypes.POINTER(P), P, P)
    real = ALLOC(torch_api.managed_tensor_allocator)
    small = (ctypes.c_int64 * 1)(1)
    @ALLOC
    def alloc(proto, out, ctx, seterr):
        t = DLTensor.from_buffer_copy(proto.contents)
        t.shape = small               # one element where n were asked for
        return real(ctypes.pointer(t), out, ctx, seterr)
    mine = ExchangeAPI.from_buffer_copy(torch_api)
    mine.managed_tensor_allocator = ctypes.cast(alloc, P).value
    mine.dltensor_from_py_object_no_sync = None  # force the managed (allocating) route
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object; new.argtypes = [P, ctypes.c_char_p, P]
    cap = new(ctypes.addressof(mine), b"dlpack_exchange_api", None)
    class Sub(torch.Tensor):
        __dlpack_c_exchange_api__ = cap
    n = 1 << 16
    x = torch.ones(n).as_subclass(Sub)
    f = dlb.load(KERNELS, "dlb_kernel_saxpy_out",
                 "saxpy(a: float32, x: float32[n], y: float32[n]) -> float32[n]")
    try:
        r = f(2.0, x, x)
    except (BufferError, ValueError, RuntimeError):
        print("OK"); sys.exit(0)
    print(tuple(r.shape))
    print("OK" if tuple(r.shape) == (n,) else "WRONG SHAPE")
    """)


def test_mut_argument_from_copying_producer():
    """Finding: a mut argument from a producer that copies by default is
    written into the copy, the caller's data is unchanged and no error is
    raised.  dlbridge must ask copy=False and honour IS_COPIED."""
    check("""
    x = np.ones(4, dtype=np.float32)
    y = np.zeros(4, dtype=np.float32)
    class Copier:
        def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
            return y.__dlpack__(max_version=max_version,
                                copy=True if copy is None else copy)
        def __dlpack_device__(self): return (1, 0)
    f = dlb.load(KERNELS, "dlb_kernel_saxpy", %s)
    try:
        f(2.0, x, Copier())
    except (BufferError, ValueError, TypeError):
        print("OK"); sys.exit(0)
    print(y)
    print("OK" if y.tolist() == [2.0] * 4 else "LOST WRITE")
    """ % SAXPY)


@pytest.mark.parametrize("bits", TORCH_BITS)
def test_mut_requires_grad_not_written_behind_autograd(bits):
    """Finding: a mut argument that requires grad is written behind
    autograd's back.  Either an error, or the write is visible and autograd
    notices (the tensor's version counter moves)."""
    pytest.importorskip("torch")
    check("""
    import torch
    x = np.ones(4, dtype=np.float32)
    y = torch.zeros(4, requires_grad=True)
    v0 = y._version
    f = dlb.load(KERNELS, "dlb_kernel_saxpy", %s)
    try:
        f(2.0, x, y)
    except (BufferError, ValueError, TypeError, RuntimeError):
        %s
        print("OK"); sys.exit(0)
    wrote = y.detach().tolist() == [2.0] * 4
    print("wrote", wrote, "version", v0, y._version)
    print("OK" if wrote and y._version > v0 else "SILENT")
    """ % (SAXPY, bits_end(bits)), pre=bits_pre(bits))


@pytest.mark.parametrize("bits", TORCH_BITS)
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("route", ["from_dlpack", "convert"])
def test_lazy_bit_not_dropped_on_import(case, route, bits):
    """Finding: x.conj(), x.conj().imag and negative-bit tensors import
    through torch's exchange table with the bit dropped (wrong values)."""
    pytest.importorskip("torch")
    check("""
    import torch
    x = %s
    assert x.is_conj() or x.is_neg()
    want = x.resolve_conj().resolve_neg().tolist()
    try:
        if %r == "from_dlpack":
            got = dlb.from_dlpack(x).tolist()
        else:
            got = dlb.convert(x, "numpy").tolist()
    except BufferError:
        %s
        print("OK"); sys.exit(0)
    print(got, want)
    print("OK" if got == want else "BIT DROPPED")
    """ % (CASES[case], route, bits_end(bits)), pre=bits_pre(bits))


@pytest.mark.parametrize("bits", TORCH_BITS)
@pytest.mark.parametrize("case", ["conj_imag", "neg"])
def test_lazy_bit_not_dropped_in_function(case, bits):
    """Finding: a conj/neg-bit torch tensor passed to a Function is read with
    the bit dropped (wrong result, no error)."""
    pytest.importorskip("torch")
    check("""
    import torch
    x = %s
    want = [2.0 * v for v in x.resolve_conj().resolve_neg().tolist()]
    y = np.zeros(2, dtype=np.float32)
    f = dlb.load(KERNELS, "dlb_kernel_saxpy",
                 "saxpy(a: float32, x: float32[n], y: mut float32[n])")
    try:
        f(2.0, x, y)
    except BufferError:
        %s
        print("OK"); sys.exit(0)
    print(y.tolist(), want)
    print("OK" if y.tolist() == want else "BIT DROPPED")
    """ % (CASES[case], bits_end(bits)), pre=bits_pre(bits))


@pytest.mark.parametrize("bits", TORCH_BITS)
def test_lazy_conj_not_dropped_in_function_mut(bits):
    """Finding: a mut argument with the negative bit is written as if it had
    none (the caller then sees negated values)."""
    pytest.importorskip("torch")
    check("""
    import torch
    base = torch.zeros(2)
    y = torch._neg_view(base)
    f = dlb.load(KERNELS, "dlb_kernel_saxpy",
                 "saxpy(a: float32, x: float32[n], y: mut float32[n])")
    try:
        f(1.0, np.ones(2, dtype=np.float32), y)
    except BufferError:
        %s
        print("OK"); sys.exit(0)
    print(y.tolist())
    print("OK" if y.tolist() == [1.0, 1.0] else "BIT DROPPED")
    """ % bits_end(bits), pre=bits_pre(bits))


def test_handler_not_used_after_class_reassigned_and_freed():
    """Finding: a later argument's producer reassigns an earlier argument's
    __class__ and collects the old class, freeing the handler Function still
    used for the output's allocation (a crash on main)."""
    pytest.importorskip("torch")
    check("""
    import torch
    f = dlb.load(KERNELS, "dlb_kernel_saxpy_out",
                 "saxpy(a: float32, x: float32[n], y: float32[n]) -> float32[n]")
    bad = 0
    for it in range(50):
        S1 = type("S1", (torch.Tensor,), {})
        S2 = type("S2", (torch.Tensor,), {})
        x = torch.ones(4).as_subclass(S1)
        y = np.ones(4, dtype=np.float32)
        junk = []
        class Later:
            def __dlpack__(self, **kw):
                global S1
                x.__class__ = S2
                S1 = None
                gc.collect()
                junk.extend(bytearray(64) for i in range(2000))
                return y.__dlpack__(**kw)
            def __dlpack_device__(self):
                return (1, 0)
        r = f(2.0, x, Later())
        bad += r.tolist() != [3.0] * 4
    print("OK" if bad == 0 else "WRONG %d" % bad)
    """)


def test_handler_of_owning_argument_not_used_after_its_type_died():
    """Issue 15: the first argument's producer reassigns its class, a later
    argument's producer collects the old class: the handler the first
    argument was read with died with it, and the results' allocation used
    it (SIGSEGV in alloc_like on main).  The first argument is read owning
    (through __dlpack__), so it is not read again: its handler is looked up
    again before use."""
    check("""
    f = dlb.load(KERNELS, "dlb_kernel_noop",
                 "g(x: float32[n], y: float32[n]) -> float32[n]")
    arr = np.ones(4, np.float32)
    def make():
        class B:
            def __dlpack__(self, **kw): return arr.__dlpack__(**kw)
            def __dlpack_device__(self): return (1, 0)
        class A:
            def __dlpack_device__(self): return (1, 0)
            def __dlpack__(self, **kw):
                self.__class__ = B
                return arr.__dlpack__(**kw)
        return A()
    class C:
        def __dlpack__(self, **kw):
            gc.collect()
            return arr.__dlpack__(**kw)
        def __dlpack_device__(self): return (1, 0)
    for _ in range(20):
        r = f(make(), C())
        assert r.shape == (4,), r.shape
    print("OK")
    """)


@pytest.mark.parametrize("bits", TORCH_BITS)
def test_lazy_bit_set_in_place_is_seen(bits):
    """The lazy bits are read where torch keeps them (an offset found once
    by experiment) or asked: a bit set in place after the first sight, on a
    plain tensor or a subclass, or by a later argument's producer, is
    seen."""
    pytest.importorskip("torch")
    check("""
    import torch
    class Sub(torch.Tensor):
        pass
    for make in (lambda: torch.ones(2), lambda: torch.ones(2).as_subclass(Sub)):
        x = make()
        dlb.from_dlpack(x)
        torch._C._set_neg(x, True)
        try:
            dlb.from_dlpack(x)
            print("NEG MISSED"); sys.exit(0)
        except BufferError:
            pass
        torch._C._set_neg(x, False)
        z = torch.ones(2, dtype=torch.complex64)
        torch._C._set_conj(z, True)
        try:
            dlb.from_dlpack(z)
            print("CONJ MISSED"); sys.exit(0)
        except BufferError:
            pass
    x = torch.ones(2)
    y = np.zeros(2, dtype=np.float32)
    class Later:
        def __dlpack__(self, **kw):
            torch._C._set_neg(x, True)
            return y.__dlpack__(**kw)
        def __dlpack_device__(self):
            return (1, 0)
    f = dlb.load(KERNELS, "dlb_kernel_saxpy",
                 "saxpy(a: float32, x: float32[n], y: mut float32[n])")
    try:
        f(1.0, x, Later())
    except BufferError:
        %s
        print("OK"); sys.exit(0)
    print(y.tolist())
    print("OK" if y.tolist() == [-1.0, -1.0] else "BIT DROPPED")
    """ % bits_end(bits), pre=bits_pre(bits))


# A torch tensor subclass changed by a later argument's producer, between
# Function's two reading passes: (what the later producer does, the
# signature, how the arguments are passed, what a missed check gives).
SUBCLASS_CHANGES = {
    # the kernel reads x without its neg bit: y = -1 where torch says 1
    "neg_input": ("torch._C._set_neg(x, True)",
                  "saxpy(a: float32, x: float32[n], y: mut float32[n])",
                  "dlb_kernel_saxpy", "f(1.0, x, later)"),
    # the kernel writes into a parameter that now requires grad
    "grad_mut_parameter": ("x.requires_grad_(True)",
                           "g(x: mut float32[n], y: float32[n])",
                           "dlb_kernel_noop", "f(x, later)"),
    # the kernel writes through a dropped neg bit
    "neg_mut_subclass": ("torch._C._set_neg(x, True)",
                         "g(x: mut float32[n], y: float32[n])",
                         "dlb_kernel_noop", "f(x, later)"),
}


@pytest.mark.parametrize("bits", TORCH_BITS)
@pytest.mark.parametrize("change", sorted(SUBCLASS_CHANGES))
def test_subclass_checked_again_after_later_producer(change, bits):
    """Issue 15: for torch.nn.Parameter and other torch.Tensor subclasses,
    a requires_grad_(True) or a lazy negative bit set by Python code that
    runs between the two reading passes of a Function call was not seen
    (the second pass skipped the checks of a type the first had checked,
    as they could run Python code; now they run none)."""
    pytest.importorskip("torch")
    act, sig, kernel, call = SUBCLASS_CHANGES[change]
    check("""
    import torch
    class Sub(torch.Tensor):
        pass
    if %(change)r == "grad_mut_parameter":
        x = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    else:
        x = torch.ones(2).as_subclass(Sub)
    ybuf = np.zeros(2, dtype=np.float32)
    class Later:
        def __dlpack__(self, **kw):
            %(act)s
            return ybuf.__dlpack__(**kw)
        def __dlpack_device__(self):
            return (1, 0)
    later = Later()
    f = dlb.load(KERNELS, %(kernel)r, %(sig)r)
    try:
        %(call)s
    except (BufferError, RuntimeError) as e:
        %(end)s
        print("OK"); sys.exit(0)
    print("NOT SEEN", ybuf.tolist())
    """ % dict(change=change, act=act, sig=sig, kernel=kernel, call=call,
               end=bits_end(bits)), pre=bits_pre(bits))


@pytest.mark.parametrize("bits", TORCH_BITS)
def test_torch_checks_run_no_subclass_code(bits):
    """What makes checking again on every pass terminate: torch's answers
    are taken with __torch_function__ switched off, so a subclass's override
    (or a TorchFunctionMode) never runs -- and cannot lie about the
    TensorImpl the exchange table reads.  A view of a subclass has autograd
    metadata, so its requires_grad is asked even when the bits are read."""
    pytest.importorskip("torch")
    check("""
    import torch
    calls = []
    class Noisy(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            calls.append(getattr(func, "__name__", str(func)))
            return super().__torch_function__(func, types, args, kwargs or {})
    base = torch.zeros(4).as_subclass(Noisy)
    y = base[::2]                     # a view: it has autograd metadata
    calls.clear()
    f = dlb.load(KERNELS, "dlb_kernel_saxpy",
                 "saxpy(a: float32, x: float32[n], y: mut float32[n])")
    x = torch.ones(2).as_subclass(Noisy)
    for _ in range(3):
        f(1.0, x, y)
    assert calls == [], calls
    assert torch.Tensor.tolist(base) == [3.0, 0.0, 3.0, 0.0], base
    class Mode(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            calls.append(func)
            return func(*args, **(kwargs or {}))
    a, b = torch.ones(2), torch.zeros(4)[::2]
    calls.clear()
    with Mode():
        f(1.0, a, b)
    assert calls == [], calls
    %s
    print("OK")
    """ % bits_end(bits), pre=bits_pre(bits))


@pytest.fixture(params=TORCH_BITS)
def torch_bits(request):
    """The torch checks read (the default) or asked, in this process."""
    torch = pytest.importorskip("torch")
    import dlbridge as dlb
    from dlbridge import _core
    dlb.from_dlpack(torch.zeros(1))    # the experiment has run
    found = _core._torch_bits_state()
    if request.param == "ask":
        _core._torch_bits_force(-1)
    elif found != 1:
        pytest.skip("torchbits.c's experiment fails with this torch")
    yield request.param
    _core._torch_bits_force(found)


def test_requires_grad_imports_read_only(lib, torch_bits):
    """Decision (docs/decisions.md): a tensor that requires grad is read
    through torch's exchange table as it is, but read-only, so nothing
    writes into it behind autograd's back; detach() to share it writable."""
    torch = pytest.importorskip("torch")
    import dlbridge as dlb
    import numpy as np
    y = torch.ones(3, requires_grad=True)
    t = dlb.from_dlpack(y)
    assert t.readonly and t.tolist() == [1.0, 1.0, 1.0]
    a = dlb.convert(y, "numpy")
    assert not a.flags.writeable
    assert not dlb.from_dlpack(y.detach()).readonly
    fn = dlb.load(lib, "dlb_kernel_saxpy",
                  "saxpy(a: float32, x: float32[n], y: mut float32[n])")
    with torch.no_grad():     # (with grad mode on: no backward, refused)
        fn(1.0, y, np.zeros(3, np.float32))  # an input: read as it is
    assert dlb._core._torch_bits_state() == (-1 if torch_bits == "ask" else 1)


def test_function_has_no_backward(lib, torch_bits):
    """Issue 16 (item 5, eager): saxpy_out(2.0, x.requires_grad_(), y)
    returned a tensor with no grad_fn, so a loss using it got a silently
    wrong x.grad.  With grad mode on and an argument that requires grad the
    call raises; under no_grad and inference mode it reads as before, and a
    write into a tensor that requires grad stays a BufferError."""
    torch = pytest.importorskip("torch")
    import dlbridge as dlb
    so = dlb.load(lib, "dlb_kernel_saxpy_out",
                  "saxpy_out(a: float32, x: float32[n], y: float32[n]) "
                  "-> float32[n]")
    s = dlb.load(lib, "dlb_kernel_saxpy",
                 "saxpy(a: float32, x: float32[n], y: mut float32[n])")
    x = torch.ones(3).requires_grad_()
    y = torch.ones(3)
    message = (r"^saxpy_out: dlbridge Function has no backward \(declare vjp= "
               r"to differentiate through it\)$")
    with pytest.raises(RuntimeError, match=message):
        so(2.0, x, y)
    with pytest.raises(RuntimeError, match=message):
        so(2.0, y, x[:])               # a view that requires grad, 2nd input
    with torch.no_grad():
        assert so(2.0, x, y).tolist() == [3.0] * 3
    with torch.inference_mode():
        assert so(2.0, x, y).tolist() == [3.0] * 3
    assert so(2.0, x.detach(), y).tolist() == [3.0] * 3
    v = torch.ones(6)[::2]             # autograd metadata, no grad
    assert so(2.0, v, y).tolist() == [3.0] * 3
    p = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(RuntimeError, match=r"^saxpy: dlbridge Function has no "
                       r"backward \(declare vjp="):
        s(1.0, y, p)
    with torch.no_grad(), pytest.raises(BufferError, match="requires grad"):
        s(1.0, y, p)
    assert p.tolist() == [0.0] * 3
    assert dlb._core._torch_bits_state() == (-1 if torch_bits == "ask" else 1)


def test_convert_reads_the_class_obj_has_after_classifying_ran_code():
    """Finding (this session): classifying a new type runs Python code (its
    metaclass's __module__ here), which gave the object another class; convert
    went on with the old class's handler -- numpy's, by the fake module -- and
    returned the object itself as "the numpy tensor".  The old class is also
    held while its handler is used: it could be collected meanwhile."""
    check("""
    arr = np.ones(3)
    bad = 0
    for it in range(30):
        class Plain:
            def __dlpack__(self, **kw): return arr.__dlpack__(**kw)
            def __dlpack_device__(self): return (1, 0)
        class Meta(type):
            @property
            def __module__(cls):
                victim.__class__ = Plain
                gc.collect()
                return "numpy.fake"
        A = Meta("A", (), {"__dlpack__": lambda self, **kw: arr.__dlpack__(**kw),
                           "__dlpack_device__": lambda self: (1, 0)})
        victim = A()
        del A
        r = dlb.convert(victim, "numpy")
        bad += not (isinstance(r, np.ndarray) and type(victim) is Plain
                    and r.__array_interface__["data"][0] == arr.ctypes.data)
    print("OK" if bad == 0 else "WRONG %d" % bad)
    """)
