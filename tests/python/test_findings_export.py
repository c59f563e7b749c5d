"""Regression tests for issue 7 findings owned by what dlb.Tensor gives
consumers: its capsules and its C exchange table."""
import pytest

from _findings_util import CAPSULE, check

# Known open defect of issue 7: each test fails on the current code and
# must start passing when its finding is fixed (strict: an unexpected pass
# fails the run, so the marker is removed together with the bug).
pytestmark_open_finding = pytest.mark.xfail(
    strict=True, reason="issue 7 finding not fixed yet")



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
    t = dlb.from_dlpack(capsule(device_type=16))      # kDLHexagon
    for _ in range(3):
        try:
            dlb.convert(t, "torch")
        except BufferError:
            pass
        gc.collect()
    # t is left to interpreter shutdown: today the process dies there.
    print("OK", flush=True)
    """)


pytestmark = pytestmark_open_finding
