"""dlb.stream's values (python/dlbridge/_streams.py, src/python/cuda.c):
every int a CUDA stream can be given as, -1 ... 2**64 - 1 (handles are
pointers), and what -1 ("no ordering") means for imports.  The CUDA parts
run in a child with the recording fake driver, as test_cuda_fake.py."""
import pytest

import dlbridge as dlb
from dlbridge import _core

from test_cuda_fake import LIBS, run


def test_stream_values_cover_the_pointer_range():
    for value in (1, 2, 2**63, 2**64 - 1, -1):
        with dlb.stream(value):
            assert _core._current_stream() == value
        assert _core._current_stream() == 1


@pytest.mark.parametrize("value", [-2, 2**64, -(2**70), 2**200])
def test_stream_values_outside_the_range_raise_overflow_at_construction(value):
    with pytest.raises(OverflowError, match=r"-1 \.\. 2\*\*64 - 1"):
        dlb.stream(value)
    with pytest.raises(OverflowError):
        _core._swap_stream(value)
    assert _core._current_stream() == 1


def test_zero_is_ambiguous():
    with pytest.raises(ValueError, match="ambiguous"):
        dlb.stream(0)
    with pytest.raises(ValueError, match="ambiguous"):
        _core._swap_stream(0)


@pytest.mark.skipif(LIBS is None, reason="the fake CUDA driver is not built")
def test_large_handles_and_no_ordering_reach_producers():
    run("""
    src = dlb.zeros((4,), device="cuda:0")
    class Producer:
        # hands out a capsule made before the (fake-driver-unknown) handle
        # became dlbridge's current stream
        def __init__(self): self.kw, self.cap = None, src.__dlpack__()
        def __dlpack_device__(self): return (2, 0)
        def __dlpack__(self, **kw):
            self.kw = kw
            return self.cap
    for value in (2**63 + 8, 2**64 - 16, -1):
        p = Producer()
        with dlb.stream(value):
            dlb.from_dlpack(p)
        assert p.kw["stream"] == value, (value, p.kw)
    # -1: an import through __cuda_array_interface__ orders nothing
    class CAI:
        def __init__(self, d, owner):
            self.__cuda_array_interface__ = d
            self.owner = owner
    d = dict(src.__cuda_array_interface__)
    d["stream"] = new_stream()
    clear()
    with dlb.stream(-1):
        dlb.from_dlpack(CAI(d, src))
    assert not calls("cuStreamWaitEvent"), log()
    clear()
    dlb.from_dlpack(CAI(d, src))
    assert calls("cuStreamWaitEvent"), log()
    """)


def test_device_compares_unequal_to_text_with_a_nul():
    cpu = dlb.device("cpu")
    assert cpu == "cpu" and not cpu != "cpu"
    assert not cpu == "cpu\x00anything" and cpu != "cpu\x00anything"
    assert cpu != "cuda:0\x00" and dlb.device("cuda:0") != "cuda:0\x00"
    with pytest.raises(ValueError):
        dlb.device("cpu\x00anything")
    assert cpu != "\udc80"   # not UTF-8: no device has that name
