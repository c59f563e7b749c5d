"""src/python/pycompat.h: each private CPython API dlbridge uses has a
public fallback that gives the same answers.  These tests pin the answers
down; `make test-pycompat` runs them (and the suites that reach the other
fallbacks: test_export, test_exchange, test_import, test_function) against
an extension built with -Dpycompat_public_only=true, where every fallback
is compiled in instead of the private name.

Private hook: _core._PYCOMPAT_PUBLIC_ONLY, 1 in that build.
"""
import os
import sys
import threading

import pytest

import dlbridge as dlb

core = dlb._core
NONE, TENSOR, EXCHANGE, NUMPY, DLPACK, BUFFER, AI, CAI, BUFFER_DLPACK = range(9)


def kind(obj):
    return core._exchange_handler(obj)[0]


def test_the_build_is_the_one_asked_for():
    """make test-pycompat sets DLB_EXPECT_PYCOMPAT_PUBLIC_ONLY=1: the
    fallbacks must really be what runs there.  An ordinary build uses the
    private names up to the last CPython whose headers were checked for
    them (3.15: pycompat.h's DLB_PYCOMPAT_CHECKED_BELOW), the fallbacks on
    a newer one."""
    want = os.environ.get("DLB_EXPECT_PYCOMPAT_PUBLIC_ONLY")
    if want is None:
        want = int(sys.version_info >= (3, 16))
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


# torchbits.c asks a torch tensor is_neg() / is_conj() / requires_grad by
# calling the C functions of torch._C.TensorBase's method and getset
# descriptors directly, inside torch._C.DisableTorchFunction's __enter__ /
# __exit__ (descriptors too): pycompat.h's dlb__py_c_descr_usable and
# dlb__py_c_descr_call.  torch is installed for 3.11 only, so these tests
# drive that path on every interpreter with _dlb_torchlike's stand-ins for
# the two C types (a static type of that name, METH_NOARGS / METH_VARARGS
# methods and a getter, as torch's), put into a fake torch in a child
# interpreter.  Counted there: a question asked the ordinary way (a bound
# method, without the switch) shows as asked_while_enabled.
TORCHLIKE = '''
import types
import _dlb_torchlike as tl
torch = types.ModuleType("torch")
torch._C = types.ModuleType("torch._C")
torch._C.DisableTorchFunction = tl.DisableTorchFunction
torch.is_grad_enabled = lambda: False
sys.modules["torch"], sys.modules["torch._C"] = torch, torch._C

def asked(at_least=False, **want):
    """The questions since the last call (as many as want says, or at
    least as many), each through the C descriptors with the switch off; the
    switch turned back on after each."""
    c = tl.counts()
    tl.reset()
    assert c["asked_while_enabled"] == 0, c
    assert c["enter"] == c["exit"] > 0, c
    assert c["exit_args_max"] == 0, c
    got = {k: c[k] for k in want}
    if at_least:
        assert all(got[k] >= want[k] for k in want), (got, c)
    else:
        assert got == want, (got, c)

def tensor(neg=False, conj=False, grad=False, fail=False, complex=False,
           cls=tl.TensorBase):
    t = cls(complex=complex)
    t._set(neg, conj, grad, fail)
    return t
'''


def _torchlike_check(code):
    pytest.importorskip("_dlb_torchlike", reason="_dlb_torchlike is not "
                        "importable: build it with `make build` and put "
                        "build/src/python on PYTHONPATH")
    from _findings_util import check
    check(code, pre=TORCHLIKE)


def test_torch_like_from_dlpack_asks_through_c_descriptors():
    """from_dlpack of a (stand-in) torch tensor: the lazy bits and
    requires_grad asked through the descriptors' C functions, the answers
    acted on -- on this interpreter and build (public fallbacks or not)."""
    _torchlike_check("""
    assert dlb.from_dlpack(tensor()).tolist() == [0.0, 1.0, 2.0, 3.0]
    asked(is_neg=1, is_conj=0, requires_grad=1)   # a real dtype: no conj bit
    assert not dlb.from_dlpack(tensor(complex=True)).readonly
    asked(is_neg=1, is_conj=1, requires_grad=1)
    for kw, what in (({"neg": True}, "negative"),
                     ({"conj": True, "complex": True}, "conjugate")):
        try:
            dlb.from_dlpack(tensor(**kw))
        except BufferError as e:
            assert what in str(e), e
        else:
            raise SystemExit("lazy %s bit not refused" % what)
    asked(is_neg=2, is_conj=1, requires_grad=0)
    assert dlb.from_dlpack(tensor(grad=True)).readonly   # getter's answer
    asked(requires_grad=1)
    class Tensor(tl.TensorBase):       # torch.Tensor derives from the base
        pass
    try:
        dlb.from_dlpack(tensor(neg=True, cls=Tensor))
    except BufferError as e:
        assert "negative" in str(e), e
    else:
        raise SystemExit("a subclass's bit not refused")
    asked(is_neg=1)
    try:
        dlb.from_dlpack(tensor(fail=True))
    except RuntimeError as e:
        assert "told to fail" in str(e), e
    else:
        raise SystemExit("the question's error was lost")
    asked(is_neg=1)                    # and the switch went back on
    print("OK")
    """)


def test_torch_like_function_arguments_asked_through_c_descriptors():
    """A Function call checks a (stand-in) torch argument's lazy bits the
    same way (views.c, and again in function_call.c after the call's last
    Python code), and runs with it when they are clear."""
    _torchlike_check("""
    f = dlb.load(KERNELS, "dlb_kernel_saxpy",
                 "saxpy(a: float32, x: float32[n], y: mut float32[n])")
    y = np.ones(4, dtype=np.float32)
    f(2.0, tensor(), y)
    assert y.tolist() == [1.0, 3.0, 5.0, 7.0], y
    asked(at_least=True, is_neg=1)     # again after the call's Python code
    try:
        f(2.0, tensor(neg=True), y)
    except BufferError as e:
        assert "negative" in str(e), e
    else:
        raise SystemExit("lazy negative bit not refused")
    assert y.tolist() == [1.0, 3.0, 5.0, 7.0], y
    asked(at_least=True, is_neg=1)
    print("OK")
    """)
