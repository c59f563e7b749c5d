"""src/python/pycompat.h: each private CPython API dlbridge uses has a
public fallback that gives the same answers.  These tests pin the answers
down; `make test-pycompat` runs them (and the suites that reach the other
fallbacks: test_export, test_exchange, test_import, test_function) against
an extension built with -Dpycompat_public_only=true, where every fallback
is compiled in instead of the private name.

Private hook: _core._PYCOMPAT_PUBLIC_ONLY, 1 in that build.
"""
import os
import threading

import pytest

import dlbridge as dlb

core = dlb._core
NONE, TENSOR, EXCHANGE, NUMPY, DLPACK, BUFFER, AI, CAI, BUFFER_DLPACK = range(9)


def kind(obj):
    return core._exchange_handler(obj)[0]


def test_the_build_is_the_one_asked_for():
    """make test-pycompat sets DLB_EXPECT_PYCOMPAT_PUBLIC_ONLY=1: the
    fallbacks must really be what runs there."""
    want = os.environ.get("DLB_EXPECT_PYCOMPAT_PUBLIC_ONLY")
    if want is None:
        pytest.skip("not the pycompat build run")
    assert core._PYCOMPAT_PUBLIC_ONLY == int(want)


def _array_interface(self):
    return {"version": 3, "shape": (2,), "typestr": "<f4",
            "data": (self.buf.ctypes.data, False)}


def test_special_methods_found_through_the_mro_only():
    """The type lookup sees what a class and its bases define, in MRO
    order, and never what the metaclass defines (special-method lookup)."""
    np = pytest.importorskip("numpy")

    class Meta(type):
        __array_interface__ = property(_array_interface)

    class ViaMeta(metaclass=Meta):
        pass

    class Base:
        __array_interface__ = property(_array_interface)

    class Left:
        pass

    class Derived(Left, Base):
        def __init__(self):
            self.buf = np.arange(2, dtype=np.float32)

    assert kind(ViaMeta()) == NONE
    d = Derived()
    assert kind(d) == AI
    assert dlb.from_dlpack(d).tolist() == [0.0, 1.0]


def test_a_class_changed_after_it_was_seen_is_classified_again():
    """The type's version tag (assigned through pycompat.h on 3.11) moves
    when the class changes: the cached answer is not used again."""
    np = pytest.importorskip("numpy")

    class Late:
        def __init__(self):
            self.buf = np.arange(2, dtype=np.float32)

    obj = Late()
    assert kind(obj) == NONE
    Late.__array_interface__ = property(_array_interface)
    assert kind(obj) == AI
    del Late.__array_interface__
    assert kind(obj) == NONE


def test_optional_attributes_missing_and_raising():
    """A missing attribute is "no" without an exception; any other error
    from the lookup propagates."""
    class Missing:
        pass

    class Raising:
        @property
        def __array_interface__(self):
            raise KeyError("boom")

    with pytest.raises(TypeError, match="not tensor-like"):
        dlb.from_dlpack(Missing())
    with pytest.raises(KeyError, match="boom"):
        dlb.from_dlpack(Raising())


def test_deleter_attaches_on_a_thread_without_python():
    """A deleter run where no thread state is attached (ctypes drops it
    around a foreign call) attaches one before dropping its reference."""
    import ctypes
    import sys

    class Versioned(ctypes.Structure):
        pass

    deleter_t = ctypes.CFUNCTYPE(None, ctypes.POINTER(Versioned))
    Versioned._fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                          ("manager_ctx", ctypes.c_void_p),
                          ("deleter", deleter_t)]
    get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object,
                                    ctypes.c_char_p)(
        ("PyCapsule_GetPointer", ctypes.pythonapi))
    set_name = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object,
                                 ctypes.c_char_p)(
        ("PyCapsule_SetName", ctypes.pythonapi))
    t = dlb.zeros(4)
    base = sys.getrefcount(t)
    cap = t.__dlpack__(max_version=(1, 0))
    m = ctypes.cast(get_pointer(cap, b"dltensor_versioned"),
                    ctypes.POINTER(Versioned))
    assert set_name(cap, b"used_dltensor_versioned") == 0
    th = threading.Thread(target=lambda: m.contents.deleter(m))
    th.start()
    th.join()
    assert sys.getrefcount(t) == base


def test_torch_questions_through_descriptors():
    """torch's is_neg / is_conj / requires_grad asked through the C
    descriptors of its base type (pycompat.h calls them), with the bits
    read from the TensorImpl switched off, answer as torch does."""
    torch = pytest.importorskip("torch")
    dlb.from_dlpack(torch.zeros(1))  # the first torch tensor: torch is met
    previous = core._torch_bits_force(-1)
    try:
        neg = torch._neg_view(torch.ones(2))
        with pytest.raises(BufferError, match="negative"):
            dlb.from_dlpack(neg)
        conj = torch.ones(2, dtype=torch.complex64).conj()
        with pytest.raises(BufferError, match="conjugate"):
            dlb.from_dlpack(conj)
        grad = torch.ones(2, requires_grad=True)
        assert dlb.from_dlpack(grad).readonly
        assert not dlb.from_dlpack(torch.ones(2)).readonly
    finally:
        core._torch_bits_force(previous)
