"""Regression tests for issue 7 findings owned by the type -> handler cache
and classification (one ladder for from_dlpack, Function and the C API)."""
import pytest

from _findings_util import check

# Known open defect of issue 7: each test fails on the current code and
# must start passing when its finding is fixed (strict: an unexpected pass
# fails the run, so the marker is removed together with the bug).
pytestmark_open_finding = pytest.mark.xfail(
    strict=True, reason="issue 7 finding not fixed yet")



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


pytestmark = pytestmark_open_finding
