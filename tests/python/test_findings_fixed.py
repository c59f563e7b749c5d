"""Issue 7 findings that are fixed: regression tests moved here from the
strict-xfail test_findings_*.py files when their fix landed."""
import pytest

from _findings_util import CAPSULE, check

SAXPY = '"saxpy(a: float32, x: float32[n], y: mut float32[n])"'

# Lazy conjugate / negative bits (test_lazy_*).
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


def test_exchange_table_borrowed_entry_respects_read_only():
    """Finding: dlb.Tensor's own exchange table publishes the borrowed entry
    (dltensor_from_py_object_no_sync) although its tensors can be read-only,
    so a second consumer writes into immutable bytes.  The entry must be
    absent, or refuse a read-only tensor."""
    check("""
    P = ctypes.c_void_p
    class API(ctypes.Structure):
        _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("prev", P),
                    ("alloc", P), ("from_py", P), ("to_py", P), ("dltensor", P), ("stream", P)]
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = P; get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api = API.from_address(get(dlb.Tensor.__dlpack_c_exchange_api__, b"dlpack_exchange_api"))
    if not api.dltensor:
        print("OK"); sys.exit(0)
    raw = bytes(16)
    t = dlb.from_dlpack(np.frombuffer(raw, dtype=np.float32))
    assert t.readonly
    class DLTensor(ctypes.Structure):
        _fields_ = [("data", P), ("dev", ctypes.c_int64), ("ndim", ctypes.c_int32),
                    ("dtype", ctypes.c_uint32), ("shape", P), ("strides", P),
                    ("byte_offset", ctypes.c_uint64)]
    fn = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(DLTensor))(api.dltensor)
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
    P = ctypes.c_void_p
    class DLDevice(ctypes.Structure):
        _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]
    class DLDataType(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]
    class DLTensor(ctypes.Structure):
        _fields_ = [("data", P), ("device", DLDevice), ("ndim", ctypes.c_int32),
                    ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                    ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]
    class API(ctypes.Structure):
        _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("prev", P),
                    ("alloc", P), ("from_py", P), ("to_py", P), ("dltensor", P), ("stream", P)]
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = P; get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    torch_api = API.from_address(get(torch.Tensor.__dlpack_c_exchange_api__, b"dlpack_exchange_api"))
    ALLOC = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(DLTensor), ctypes.POINTER(P), P, P)
    real = ALLOC(torch_api.alloc)
    small = (ctypes.c_int64 * 1)(1)
    @ALLOC
    def alloc(proto, out, ctx, seterr):
        t = DLTensor.from_buffer_copy(proto.contents)
        t.shape = small               # one element where n were asked for
        return real(ctypes.pointer(t), out, ctx, seterr)
    mine = API.from_buffer_copy(torch_api)
    mine.alloc = ctypes.cast(alloc, P).value
    mine.dltensor = None               # force the managed (allocating) route
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


def test_mut_requires_grad_not_written_behind_autograd():
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
        print("OK"); sys.exit(0)
    wrote = y.detach().tolist() == [2.0] * 4
    print("wrote", wrote, "version", v0, y._version)
    print("OK" if wrote and y._version > v0 else "SILENT")
    """ % SAXPY)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("route", ["from_dlpack", "convert"])
def test_lazy_bit_not_dropped_on_import(case, route):
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
        print("OK"); sys.exit(0)
    print(got, want)
    print("OK" if got == want else "BIT DROPPED")
    """ % (CASES[case], route))


@pytest.mark.parametrize("case", ["conj_imag", "neg"])
def test_lazy_bit_not_dropped_in_function(case):
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
        print("OK"); sys.exit(0)
    print(y.tolist(), want)
    print("OK" if y.tolist() == want else "BIT DROPPED")
    """ % CASES[case])


def test_lazy_conj_not_dropped_in_function_mut():
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
        print("OK"); sys.exit(0)
    print(y.tolist())
    print("OK" if y.tolist() == [1.0, 1.0] else "BIT DROPPED")
    """)


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


def test_lazy_bit_set_in_place_is_seen():
    """The lazy bits are read where torch keeps them (an offset found once
    by experiment): a bit set in place after the first sight, on a plain
    tensor or a subclass, or by a later argument's producer, is seen."""
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
        print("OK"); sys.exit(0)
    print(y.tolist())
    print("OK" if y.tolist() == [-1.0, -1.0] else "BIT DROPPED")
    """)


def test_requires_grad_imports_read_only(lib):
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
    fn(1.0, y, np.zeros(3, np.float32))      # an input: read as it is
