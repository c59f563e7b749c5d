"""Regression tests for issue 7: a Tensor -> owner -> Tensor cycle through a
buffer or __array_interface__ import must be collected (GC traversal)."""
import pytest

from _findings_util import check

# Known open defect of issue 7: each test fails on the current code and
# must start passing when its finding is fixed (strict: an unexpected pass
# fails the run, so the marker is removed together with the bug).
pytestmark_open_finding = pytest.mark.xfail(
    strict=True, reason="issue 7 finding not fixed yet")



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


pytestmark = pytestmark_open_finding
