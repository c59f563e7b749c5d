"""The thread hammer: dlbridge driven by 8 threads at once, every result
checked.  Runs on the free-threaded CPython with the GIL off (`make
test-ft`) and, with the extension built with -fsanitize=thread, against
CPython's ThreadSanitizer build (`make test-tsan`, scripts/thread-hammer),
where any data race in dlbridge is a report and fails the run.

What the threads share, and do to it at the same time: NumPy arrays,
dlb.Tensors, JAX arrays, one Function, producer objects whose class other
threads keep changing, capsules made on one thread and consumed (or
dropped: their deleters run) on another, capsules several threads try to
consume at once, types made and dropped, shared-memory tensors pickled and
rebuilt, and gc.collect() in the middle of it all.

The iteration count is fixed (DLB_HAMMER_ITERATIONS, default 200), sized so
the ThreadSanitizer run ends well within 5 minutes; the library of example
kernels comes from DLB_EXAMPLE_KERNELS or the build tree, as in
tests/python.
"""
import gc
import os
import pathlib
import pickle
import queue
import random
import sys
import threading

import pytest

import dlbridge as dlb

np = pytest.importorskip("numpy")

THREADS = 8
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
          "uint32", "uint64", "float16", "float32", "float64", "complex64",
          "complex128")
ITERATIONS = int(os.environ.get("DLB_HAMMER_ITERATIONS", "200"))
N = 16
ADD3 = "add3(x: float32[n], y: float32[n], z: mut float32[n])"
ROOT = pathlib.Path(__file__).resolve().parents[2]
FREE_THREADED = hasattr(sys, "_is_gil_enabled")


def _kernels():
    env = os.environ.get("DLB_EXAMPLE_KERNELS")
    if env:
        return env
    for build in ("build-tsan", "build-py313t", "build"):
        p = ROOT / build / "libdlb_example_kernels.so"
        if p.exists():
            return str(p)
    pytest.skip("no libdlb_example_kernels.so (set DLB_EXAMPLE_KERNELS)")


@pytest.fixture(scope="module")
def add3():
    return dlb.load(_kernels(), "dlb_kernel_add3", ADD3)


@pytest.fixture(autouse=True)
def gil_stays_off():
    """On a free-threaded build the hammer means nothing with the GIL on:
    nothing dlbridge (or a peer it imports) does may turn it back on."""
    if FREE_THREADED:
        assert not sys._is_gil_enabled(), "the GIL was on before the test"
    yield
    if FREE_THREADED:
        assert not sys._is_gil_enabled(), "the GIL came back on"


def warm_up():
    """NumPy's first __array_interface__ and __dlpack__, once, on this
    thread.  CPython 3.13.5 immortalises a newly interned string after
    publishing it in its interned dict: when two threads make NumPy's first
    __array_interface__ dict at once (its keys interned by
    PyDict_SetItemString), ThreadSanitizer reports a race inside CPython's
    own intern_common, not in dlbridge."""
    a = np.zeros(1, np.float32)
    a.__array_interface__
    a.__dlpack__(max_version=(1, 0))  # dropped unconsumed
    a.__dlpack_device__()


def hammer(body):
    """Run body(tid) on THREADS threads released together; the first
    exception any of them raised is raised here."""
    warm_up()
    start = threading.Barrier(THREADS)
    errors = []

    def run(tid):
        try:
            start.wait()
            body(tid)
        except BaseException as e:  # re-raised below, with its traceback
            errors.append(e)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


# ---- producers whose class other threads change ---------------------------------

A_DATA = np.arange(N, dtype=np.float32)
B_DATA = np.arange(N, dtype=np.float32) * -2


class ViaA:
    """__array_interface__ of A_DATA; instances are switched to ViaB and
    back by other threads (a layout-compatible class)."""

    @property
    def __array_interface__(self):
        return A_DATA.__array_interface__


class ViaB:
    @property
    def __array_interface__(self):
        return B_DATA.__array_interface__


class ViaDLPack:
    """__dlpack__ only: an owning export per read."""

    def __init__(self, arr):
        self.arr = arr

    def __dlpack__(self, **kwargs):
        return self.arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def address(arr):
    """arr's data address, without arr.ctypes: CPython 3.13t's ctypes is not
    thread-safe (ThreadSanitizer reports races inside _ctypes itself)."""
    return arr.__array_interface__["data"][0]


def one_of(values, *choices):
    return any(values == list(c) for c in choices)


def test_gil_is_off_after_import():
    if not FREE_THREADED:
        pytest.skip("not a free-threaded build")
    assert not sys._is_gil_enabled()


def test_everything_at_once(add3):
    jnp = None
    if os.environ.get("DLB_HAMMER_JAX", "1") != "0":
        try:
            import jax.numpy as jnp
        except ImportError:
            pass
    ones = np.ones(N, np.float32)
    shared_t = dlb.from_dlpack(A_DATA)
    swapped = [ViaA() for _ in range(4)]
    a_plus_1 = (A_DATA + 1).tolist()
    b_plus_1 = (B_DATA + 1).tolist()
    # capsules one thread makes for the next one to consume or drop
    inbox = [queue.SimpleQueue() for _ in range(THREADS)]
    if jnp is not None:
        xj = jnp.arange(N, dtype=jnp.float32)

    def body(tid):
        rng = random.Random(tid)
        own = np.arange(N, dtype=np.float32) + tid
        own_list = own.tolist()
        for i in range(ITERATIONS):
            # from_dlpack of shared NumPy arrays and dlb.Tensors: views
            t = dlb.from_dlpack(A_DATA)
            assert t.data_ptr == address(A_DATA) and t.shape == (N,)
            assert dlb.from_dlpack(shared_t) is shared_t
            # convert both ways, without copies
            back = dlb.convert(t, "numpy")
            assert address(back) == address(A_DATA) and back[3] == 3
            assert dlb.convert(A_DATA, "dlbridge").data_ptr == address(A_DATA)
            # targets named by a type, and a copy: convert's target memo
            # keeps changing hands between the threads
            assert address(dlb.convert(t, np.ndarray)) == address(A_DATA)
            c = dlb.convert(A_DATA, "numpy", copy=True)
            assert address(c) != address(A_DATA) and c.tolist() == A_DATA.tolist()
            # DType objects, shared through the module's dtype cache
            dt = DTYPES[(i + tid) % len(DTYPES)]
            assert str(dlb.from_dlpack(np.zeros(1, dt)).dtype) == dt
            # one Function, called by every thread: NumPy, dlb.Tensor
            z = np.zeros(N, np.float32)
            add3(A_DATA, ones, z)
            assert z.tolist() == a_plus_1
            zt = dlb.zeros(N)
            add3(shared_t, dlb.from_dlpack(ones), zt)
            assert zt.tolist() == a_plus_1
            # ... and JAX (immutable: the new value of z is returned)
            if jnp is not None:
                r = add3(xj, xj, jnp.zeros(N, jnp.float32))
                assert np.asarray(r).tolist() == (A_DATA * 2).tolist()
            # producers whose class the even threads keep changing
            obj = swapped[rng.randrange(len(swapped))]
            if tid % 2 == 0:
                obj.__class__ = ViaB if type(obj) is ViaA else ViaA
            got = dlb.from_dlpack(obj).tolist()
            assert one_of(got, A_DATA, B_DATA), got
            z = np.zeros(N, np.float32)
            add3(obj, ones, z)
            assert one_of(z.tolist(), a_plus_1, b_plus_1)
            # a type made, used through every path, and dropped
            T = type("Fresh%d_%d" % (tid, i), (ViaDLPack,), {})
            fresh = T(own)
            assert dlb.from_dlpack(fresh).tolist() == own.tolist()
            z = np.zeros(N, np.float32)
            add3(fresh, ones, z)
            assert z.tolist() == (own + 1).tolist()
            del T, fresh
            # capsules: made here, consumed or dropped by the next thread
            inbox[(tid + 1) % THREADS].put(
                (own_list, dlb.from_dlpack(own).__dlpack__(max_version=(1, 0))))
            while True:
                try:
                    expected, cap = inbox[tid].get_nowait()
                except queue.Empty:
                    break
                if rng.random() < 0.5:
                    assert dlb.from_dlpack(cap).tolist() == expected
                del cap  # the deleter runs here, on another thread than made it
            # shared memory and pickling
            s = dlb.share(dlb.from_dlpack(own))
            assert s.is_shared
            u = pickle.loads(pickle.dumps(s, protocol=5))
            assert u.tolist() == own.tolist()
            p = pickle.loads(pickle.dumps(dlb.from_dlpack(own), protocol=5))
            assert p.tolist() == own.tolist()
            del s, u, p
            if i % 8 == tid % 8:
                gc.collect()

    hammer(body)
    # what is left in the inboxes is dropped on this thread
    for q in inbox:
        while not q.empty():
            q.get_nowait()


def test_a_capsule_is_consumed_once(add3):
    """Threads race to import the same capsules: each is imported exactly
    once; every other attempt is refused with BufferError."""
    rounds = max(1, ITERATIONS // 4)
    per_round = 32
    caps = [[dlb.from_dlpack(np.full(4, k, np.float32)).__dlpack__(
        max_version=(1, 0)) for k in range(per_round)] for _ in range(rounds)]
    wins = [[0] * per_round for _ in range(rounds)]
    lock = threading.Lock()
    barrier = threading.Barrier(THREADS)

    def body(tid):
        rng = random.Random(tid)
        for r in range(rounds):
            barrier.wait()
            order = list(range(per_round))
            rng.shuffle(order)
            for k in order:
                try:
                    t = dlb.from_dlpack(caps[r][k])
                except BufferError as e:
                    assert "already consumed" in str(e), e
                    continue
                assert t.tolist() == [float(k)] * 4
                with lock:
                    wins[r][k] += 1

    hammer(body)
    assert wins == [[1] * per_round for _ in range(rounds)]


def test_handlers_while_types_come_and_go(add3):
    """One Function reads arguments of types that other threads make and
    drop all the while: each call gets its own type's handler."""
    ones = np.ones(N, np.float32)

    def body(tid):
        data = np.arange(N, dtype=np.float32) * (tid + 1)
        for i in range(ITERATIONS * 4):
            if i % 2:
                T = type("Churn", (ViaDLPack,), {})
                x = T(data)
            else:
                T = type("Churn", (), {"__array_interface__":
                                       property(lambda self: data.__array_interface__)})
                x = T()
            z = np.zeros(N, np.float32)
            add3(x, ones, z)
            assert z.tolist() == (data + 1).tolist()
            assert dlb.from_dlpack(x).tolist() == data.tolist()
            del x, T
            if i % 32 == tid:
                gc.collect()

    hammer(body)


def test_dtype_cache_fills_and_collides_at_once(add3):
    """The module's DType cache without the GIL: each slot is filled once by
    whichever thread gets there first and read with no lock after (a
    collision, or a lost race, gets a DType of its own).  Threads ask for
    ~300 dtypes (codes x bits x lanes: more than its 64 slots), most of
    them new to this process, in a different order each; every answer is
    the DType asked for."""
    specs = [f"{kind}{bits}" + (f"x{lanes}" if lanes > 1 else "")
             for kind in ("int", "uint", "float")
             for bits in (8, 16, 32, 64)
             for lanes in range(1, 26)
             if not (kind == "float" and bits == 8)]

    copy = dlb.load(_kernels(), "dlb_kernel_copy",
                    "copy(x: float32[n]) -> (y: float32[n])")

    def body(tid):
        order = list(specs)
        random.Random(tid).shuffle(order)
        for _ in range(max(1, ITERATIONS // 100)):
            for spec in order:
                d = dlb.dtype(spec)
                assert str(d) == spec and d == spec, (d, spec)
                assert d.lanes == (int(spec.split("x")[1]) if "x" in spec else 1)
        # t.dtype of per-thread tensors, and Functions given dlb.Tensors
        # (their class, and the results' handler type, are not held per
        # call: function_call.c, type_outlives_call)
        own = [dlb.from_dlpack(np.full(N, tid, np.float32)) for _ in range(3)]
        for _ in range(ITERATIONS):
            assert own[0].dtype == "float32" and own[0].dtype is own[1].dtype
            add3(own[0], own[1], own[2])
            y = copy(own[0])
            assert type(y) is dlb.Tensor and y.tolist() == [float(tid)] * N
        assert own[2].tolist() == [2.0 * tid] * N

    hammer(body)


@pytest.mark.skipif(not FREE_THREADED, reason="free-threaded builds only")
def test_objects_every_thread_uses_are_not_reference_counted():
    """What every thread's t.dtype returns, and (on 3.13, which counts a
    heap type's references in the type) the types whose instances every
    thread makes, are immortal: reading or making them writes no shared
    reference count (docs/bench.md, "Free-threaded scaling")."""
    immortal = 2 ** 31   # sys.getrefcount of an immortal object: 2**32 - 1
    t = dlb.from_dlpack(np.zeros(2, np.float32))
    for name in ("float32", "float64", "int64", "int32", "uint8", "bool",
                 "float16", "bfloat16", "complex64", "complex128"):
        assert sys.getrefcount(dlb.dtype(name)) > immortal, name
    assert sys.getrefcount(t.dtype) > immortal
    if sys.version_info[:2] == (3, 13):
        for tp in (dlb.Tensor, type(t.dtype), type(t.device)):
            assert sys.getrefcount(tp) > immortal, tp
