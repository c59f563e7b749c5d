"""Issue 23, item 1: the class of an object changing (or dying) while
dlbridge classifies or reads it.

Classifying a new type runs Python code (the registry reads the class's
``__module__``, which a metaclass property can compute), and so does reading
an object (``__dlpack_device__``, properties).  That code may give the object
another class.  dlbridge holds the class it classified for as long as it uses
that class's handler, and when the class changed under a reading that then
failed, reads the object again by its new class: the answer is one of the two
classes' own results, or dlbridge's TypeError/BufferError -- never a crash
and never the stale route's ``AttributeError``.

The use-after-free reproducers run in a child interpreter (_findings_util):
without the fix the normal build dies there with SIGSEGV.
"""
import sys
import threading
import time

import pytest

from _findings_util import CAPSULE, check

np = pytest.importorskip("numpy")


# A metaclass whose __module__ switches the one object of its class (victim)
# to Plain and drops the last reference to the class being classified: with
# the collector's threshold at 1 the class is collected at the registry's
# next Python call, while the C code classifying it still has its address.
# Its memory is then filled with 0x41 bytes (a gc callback allocating blocks
# of its size), so that reading it is a crash on the normal build, not only
# under ASan.
FREEING = """
import dlbridge._frameworks  # the registry's own imports, before the threshold
SPRAY, _watch = [], []
def _spray(phase, info):
    if phase == "stop" and _watch and _watch[-1]() is None:
        _watch.clear()
        SPRAY.extend(b"\\x41" * n for n in range(700, 1200, 8) for _ in range(4))
gc.callbacks.append(_spray)
arr = np.arange(3, dtype=np.float32)
plain = np.arange(3, dtype=np.float32) * 10
class Plain:
    __module__ = "numpy.plain"
    @property
    def __array_interface__(self):
        return plain.__array_interface__
def freeing_victim():
    class Meta(type):
        @property
        def __module__(cls):
            victim.__class__ = Plain
            gc.set_threshold(1)
            return "numpy.fake"
    A = Meta("A", (), {"__dlpack__": lambda self, **kw: arr.__dlpack__(**kw),
                       "__dlpack_device__": lambda self: (1, 0)})
    global victim
    victim = A()
    alive = weakref.ref(A)
    _watch.append(alive)
    del A
    return alive
def settle(alive):
    gc.set_threshold(700, 10, 10)
    gc.collect()
    SPRAY.clear()
    _watch.clear()
    return alive() is None  # the class was freed on the way
"""


def test_convert_to_an_object_whose_class_dies_while_classified():
    """Finding (issue 23): dlb.convert(x, to=obj) classifies obj's class to
    name the target; the metaclass's __module__ frees that class meanwhile
    and the handler cache went on reading it (ASan: heap-use-after-free in
    entry_current; SIGSEGV without ASan)."""
    check(pre=FREEING, code="""
    x = dlb.tensor([1.0, 2.0], dtype="float32")
    freed = 0
    for it in range(30):
        alive = freeing_victim()
        r = dlb.convert(x, to=victim)
        freed += settle(alive)
        assert isinstance(r, np.ndarray) and r.tolist() == [1.0, 2.0], r
    assert freed, "the class was never freed: the test tests nothing"
    print("OK")
    """)


def test_share_of_an_object_whose_class_dies_while_classified():
    """Finding (issue 23): dlb.share(obj) classifies obj's class for its
    view; the class freed meanwhile was used afterwards (use-after-free)."""
    check(pre=FREEING, code="""
    freed = 0
    for it in range(30):
        alive = freeing_victim()
        r = dlb.share(victim)
        freed += settle(alive)
        assert type(victim) is Plain
        assert r.tolist() == [0.0, 10.0, 20.0], r.tolist()
    assert freed, "the class was never freed: the test tests nothing"
    print("OK")
    """)


CAPI_VIEW = """
import ctypes
from dlpack_ctypes import CAPI, DLTensor
P = ctypes.c_void_p
get = ctypes.PyDLL(None).PyCapsule_GetPointer
get.restype = P; get.argtypes = [ctypes.py_object, ctypes.c_char_p]
addr = get(dlb._core._C_API, b"dlbridge._C_API")
table = CAPI.from_address(addr)
view_get = ctypes.PYFUNCTYPE(ctypes.c_int, P, ctypes.py_object, ctypes.c_uint,
                             P)(table.view_get)
view_release = ctypes.PYFUNCTYPE(None, P, P)(table.view_release)
def view_data(obj):
    buf = ctypes.create_string_buffer(1024)
    view_get(addr, obj, 0, ctypes.addressof(buf))
    try:
        return DLTensor.from_buffer(buf).data
    finally:
        view_release(addr, ctypes.addressof(buf))
"""


def test_capi_view_of_an_object_whose_class_dies_while_classified():
    """Finding (issue 23): the C API's view_get classifies obj's class; the
    class freed meanwhile was used afterwards (use-after-free)."""
    check(pre=FREEING + CAPI_VIEW, code="""
    freed = 0
    for it in range(30):
        alive = freeing_victim()
        data = view_data(victim)
        freed += settle(alive)
        assert type(victim) is Plain
        assert data == plain.ctypes.data, (data, plain.ctypes.data)
    assert freed, "the class was never freed: the test tests nothing"
    print("OK")
    """)


def test_capi_export_like_an_object_whose_class_dies_while_classified():
    """The C API's export with like=obj classifies obj's class (the same
    pattern, swept): no use-after-free, and the result is numpy's (both
    classes name numpy)."""
    check(pre=FREEING + CAPI_VIEW + CAPSULE, code="""
    export = ctypes.PYFUNCTYPE(ctypes.c_int, P, P, ctypes.c_char_p, P,
                               ctypes.POINTER(P))(table.export_managed)
    freed = 0
    for it in range(30):
        alive = freeing_victim()
        # a managed tensor of 4 float32 (0..3) whose deleter does nothing
        mp = get(capsule(1, (4,)), b"dltensor_versioned")
        out = ctypes.py_object()
        rc = export(addr, mp, None, id(victim),
                    ctypes.cast(ctypes.byref(out), ctypes.POINTER(P)))
        freed += settle(alive)
        r = out.value
        assert rc == 0 and isinstance(r, np.ndarray), (rc, r)
        assert r.tolist() == [0.0, 1.0, 2.0, 3.0], r
    assert freed, "the class was never freed: the test tests nothing"
    print("OK")
    """)


# ---- the route chosen from the old class -----------------------------------

# Two classes an object switches between: A exports through __dlpack__ only,
# B through __array_interface__ only.  Their data differ, so the result says
# whose route was followed.
SWITCH = """
a_data = np.arange(3, dtype=np.float32)
b_data = np.arange(3, dtype=np.float32) * 10
A_RESULT, B_RESULT = a_data.tolist(), b_data.tolist()
class B:
    @property
    def __array_interface__(self):
        return b_data.__array_interface__
class A:
    def __dlpack__(self, **kw):
        return a_data.__dlpack__(**kw)
    def __dlpack_device__(self):
        return (1, 0)
def values(r):
    return np.asarray(r).tolist()
"""


def _switch_calls():
    return {
        "from_dlpack": "dlb.from_dlpack(o)",
        "convert_numpy": "dlb.convert(o, 'numpy')",
        "convert_dlbridge": "dlb.convert(o, 'dlbridge')",
        "share": "dlb.share(o)",
        "capi_view": "view_data(o) and o",
    }


@pytest.mark.parametrize("call", sorted(_switch_calls()))
def test_dlpack_device_switching_the_class_is_read_by_the_new_class(call):
    """Finding (issue 23): __dlpack_device__ (called before __dlpack__) gives
    the object a class without __dlpack__; dlbridge followed the route it
    had chosen from the old class and raised the bare AttributeError of
    obj.__dlpack__.  Now obj is read again by its new class."""
    expr = _switch_calls()[call]
    check(pre=SWITCH + CAPI_VIEW, code="""
    class Switching(A):
        def __dlpack_device__(self):
            self.__class__ = B
            return (1, 0)
    for it in range(5):
        o = Switching()
        try:
            r = %s
        except AttributeError as e:
            print("ATTRIBUTE ERROR", e); sys.exit(0)
        if %r == "capi_view":
            ok = type(o) is B
        else:
            ok = values(r) == B_RESULT
        assert ok, (type(o), r)
    print("OK")
    """ % (expr, call))


@pytest.mark.parametrize("call", ["capi_view", "share"])
def test_class_switched_while_classified_is_read_by_the_new_class(call):
    """Finding (issue 23): the metaclass's __module__ (read while the
    registry classifies a new class) gives the object a class with only
    __array_interface__; the view (dlb.share, the C API) followed the route
    chosen from the old class (__dlpack__) after the class changed:
    AttributeError.  The old class stays alive here (no free): only the
    route is stale.  (from_dlpack and convert read the class again after
    classifying since fb8e227.)"""
    expr = _switch_calls()[call]
    check(pre=SWITCH + CAPI_VIEW, code="""
    keep = []
    for it in range(10):
        class Meta(type):
            @property
            def __module__(cls):
                o.__class__ = B
                return "mymodule"
        C = Meta("C", (A,), {})
        keep.append(C)
        o = C()
        try:
            r = %s
        except AttributeError as e:
            print("ATTRIBUTE ERROR", e); sys.exit(0)
        if %r == "capi_view":
            ok = type(o) is B
        else:
            ok = values(r) == B_RESULT
        assert ok, (type(o), r)
    print("OK")
    """ % (expr, call))


def test_interface_property_switching_the_class_is_read_by_the_new_class():
    """The other direction: B's __array_interface__ property gives the object
    class A and finds nothing (AttributeError, which means "no interface"):
    the object, tensor-like by its new class, is read by A's __dlpack__
    rather than refused as not tensor-like."""
    check(pre=SWITCH, code="""
    class Vanishing(B):
        @property
        def __array_interface__(self):
            self.__class__ = A
            raise AttributeError("__array_interface__")
    for f in (dlb.from_dlpack, lambda o: dlb.convert(o, "numpy")):
        o = Vanishing()
        r = f(o)
        assert type(o) is A and values(r) == A_RESULT, (type(o), r)
    print("OK")
    """)


def test_class_that_keeps_changing_is_dlbridges_type_error():
    """A class switch on every reading: after a few readings dlbridge gives
    up with its own TypeError, never the stale route's AttributeError."""
    check(pre=SWITCH + CAPI_VIEW, code="""
    class Flip(A):
        def __dlpack_device__(self):
            self.__class__ = Flop
            return (1, 0)
    class Flop(B):
        @property
        def __array_interface__(self):
            self.__class__ = Flip
            raise AttributeError("__array_interface__")
    calls = [dlb.from_dlpack, lambda o: dlb.convert(o, "numpy"), dlb.share,
             view_data]
    for f in calls:
        try:
            f(Flip())
        except TypeError as e:
            assert "changed its class" in str(e), e
        else:
            raise AssertionError("read an object that never kept a class")
    print("OK")
    """)


def test_threads_switching_the_class_never_give_attribute_error():
    """Finding (issue 23): another thread switching obj.__class__ between A
    (__dlpack__) and B (__array_interface__) made from_dlpack and convert
    now and then raise AttributeError: no attribute '__dlpack__' (about 100
    times a second here before the fix).  A bounded run; the tests above are
    the deterministic ones.  Any answer must be A's or B's."""
    import dlbridge as dlb
    a_data = np.arange(3, dtype=np.float32)
    b_data = a_data * 10

    class B:
        @property
        def __array_interface__(self):
            return b_data.__array_interface__

    class A:
        def __dlpack__(self, **kw):
            return a_data.__dlpack__(**kw)

        def __dlpack_device__(self):
            return (1, 0)

    o = A()
    stop = threading.Event()

    def flipper():
        # one switch per turn with the GIL (sleep(0) hands it over), so the
        # main thread resumes as often with B as with A
        while not stop.is_set():
            o.__class__ = B if type(o) is A else A
            time.sleep(0)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    t = threading.Thread(target=flipper)
    t.start()
    bad = []
    try:
        deadline = time.monotonic() + 2.0
        calls = [dlb.from_dlpack, lambda x: dlb.convert(x, "numpy")]
        while time.monotonic() < deadline and not bad:
            for f in calls:
                try:
                    r = np.asarray(f(o)).tolist()
                except AttributeError as e:
                    bad.append(repr(e))
                except (TypeError, BufferError):
                    pass
                else:
                    if r not in (a_data.tolist(), b_data.tolist()):
                        bad.append(r)
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
    assert not bad, bad
