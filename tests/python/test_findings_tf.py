"""Regression test for issue 7: dlb.convert(a, "tensorflow") of data that
is not 64-byte aligned returns a TF tensor that aborts the process on its
first op.  Run in a child: today it aborts."""
import pytest

from _findings_util import check

# Known open defect of issue 7: each test fails on the current code and
# must start passing when its finding is fixed (strict: an unexpected pass
# fails the run, so the marker is removed together with the bug).
pytestmark_open_finding = pytest.mark.xfail(
    strict=True, reason="issue 7 finding not fixed yet")


pytest.importorskip("tensorflow")


@pytest.mark.parametrize("offset", [4, 32])
def test_convert_unaligned_to_tensorflow(offset):
    """Finding: TF convert of non-64-byte-aligned data must be refused with
    BufferError or copied into aligned memory; the returned tensor must work."""
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


pytestmark = pytestmark_open_finding
