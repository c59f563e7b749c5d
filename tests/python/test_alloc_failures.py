"""Every allocation failure of the extension is a tested path.

Two sources of failure, each swept over every position:

* the core allocator (dlb_set_allocator), through the test-only hooks of
  src/python/testing.c: ``_fail_allocations(k)`` lets k allocations succeed
  and refuses every later one.  For k = 0, 1, 2, ... an operation must either
  succeed or raise MemoryError -- never SystemError, another exception or a
  crash -- and afterwards the counting allocator's live blocks are back to
  the baseline, the test producer has no live export (every export it made
  had its deleter run, exactly once: strays are checked by the ``tp``
  fixture), and the sources' reference counts are unchanged.  The sweep
  stops at the first k where nothing was refused.
* CPython's own allocators (PyMem/PyObject), through
  ``_testcapi.set_nomemory(k, 0)``, around nothing but the one call.

Each sweep also asserts that the operation reached the core allocator at
least once, so a sweep that silently tests nothing fails instead.
"""

import gc
import pathlib
import sys

import pytest

import dlbridge as dlb
from dlbridge import _core

np = pytest.importorskip("numpy")

try:
    import torch
except ImportError:  # pragma: no cover - depends on the environment
    torch = None

try:
    import _testcapi
except ImportError:  # pragma: no cover - a Python built without it
    _testcapi = None

ROOT = pathlib.Path(__file__).resolve().parents[2]

needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")

# Big enough that no operation here gets near it; a sweep that does not end
# by then is a bug of its own (an operation that never stops allocating).
MAX_STEPS = 200


# ---- the sweeps -------------------------------------------------------------------

def _live():
    return _core._allocation_stats()["live"]


def _settle():
    gc.collect()


def _refcounts(sources):
    # One helper for the baseline and every check, so the frames around
    # getrefcount hold the same references each time.
    return [sys.getrefcount(s) for s in sources]


def _check_clean(base_live, producers, sources, refcounts, what):
    _settle()
    assert _live() == base_live, "%s: core blocks leaked" % what
    assert [p.live_exports for p in producers] == [0] * len(producers), (
        "%s: an export of the test producer was never deleted" % what)
    assert _refcounts(sources) == refcounts, (
        "%s: a source's reference count changed" % what)


def sweep(op, prepare=tuple, *, producers=(), sources=(), check=None,
          min_allocs=0):
    """Run op(*prepare()) with the core allocator failing after k = 0, 1, ...
    allocations; returns how many allocations the successful run made.

    prepare() runs outside the failure window (a fresh capsule, say); its
    result is dropped after each step, so what it made is accounted for too.
    """
    # One plain run first: handler caches, lazy imports and interned names
    # are made once per process and are not leaks.
    args = prepare()
    res = op(*args)
    if check is not None:
        check(res)
    del res, args
    _settle()
    base = _live()
    refcounts = _refcounts(sources)
    exports0 = [p.deleter_calls for p in producers]
    for k in range(MAX_STEPS):
        args = prepare()
        res = None
        outcome = None
        _core._fail_allocations(k)
        try:
            res = op(*args)
            outcome = "ok"
        except MemoryError:
            outcome = "MemoryError"
        finally:
            stats = _core._allocation_stats()
            _core._reset_allocations()
        what = "%s, allocation %d refused" % (getattr(op, "__name__", op), k)
        if outcome == "ok" and check is not None:
            check(res)
        del res, args
        _check_clean(base, producers, sources, refcounts, what)
        if outcome == "MemoryError":
            assert stats["failed"] > 0, (
                "%s: MemoryError although no allocation was refused" % what)
        if stats["failed"] == 0:
            assert outcome == "ok"
            assert k >= min_allocs, (
                "%s: the operation made only %d core allocations; the sweep "
                "covers nothing" % (what, k))
            for p, e0 in zip(producers, exports0):
                # Every step called the producer, and every export died.
                assert p.deleter_calls - e0 >= k + 1
            return k
    pytest.fail("%r still allocating after %d steps" % (op, MAX_STEPS))


def nomemory_sweep(op, prepare=tuple, *, producers=(), sources=(),
                   check=None, max_steps=400, foreign=None):
    """Run op(*prepare()) with CPython's allocators (PyMem/PyObject, raw
    too) refusing allocation k: in one pass every allocation from the k-th
    on ("from"), in a second only the k-th ("one", so the cleanup after the
    failure runs with memory again and reaches deeper).  k = 0, 1, ... until
    the call completes untouched; returns how many calls raised MemoryError.

    Only the call itself is inside the window: arguments are made before,
    the hooks come off in the inner finally before anything else runs, and
    the collector is off so no unrelated finalizer runs inside.

    foreign(exc) -> True accepts an exception another library raises for
    its own allocation failure (torch's RuntimeError "Failed to allocate a
    Tensor object"): not ours to change, and still no leak is allowed."""
    if _testcapi is None:
        pytest.skip("_testcapi is not available")
    set_nomemory, remove = _testcapi.set_nomemory, _testcapi.remove_mem_hooks
    args = prepare()
    res = op(*args)
    if check is not None:
        check(res)
    del res, args
    _settle()
    base = _live()
    refcounts = _refcounts(sources)
    failures = 0
    for mode in ("from", "one"):
        streak = 0
        for k in range(max_steps):
            args = prepare()
            res = None
            err = None
            stop = 0 if mode == "from" else k + 1
            gc.disable()
            try:
                set_nomemory(k, stop)
                try:
                    res = op(*args)
                finally:
                    remove()
            except MemoryError:
                err = "MemoryError"
            except BaseException as exc:  # reported below, outside the window
                err = exc
            finally:
                gc.enable()
            what = "%r with Python allocation %d refused (%s)" % (op, k, mode)
            if isinstance(err, BaseException) and foreign is not None and \
                    foreign(err):
                err = "MemoryError"
            if err is not None and err != "MemoryError":
                raise AssertionError("%s raised %r" % (what, err)) from err
            if err is None and check is not None:
                check(res)
            del res, args
            _check_clean(base, producers, sources, refcounts, what)
            # Once k passes the number of allocations the call makes, every
            # run is the same successful one.  A failure the code recovers
            # from succeeds too, so wait for a few successes in a row.
            if err is None:
                streak += 1
                if streak == 5:
                    break
            else:
                streak = 0
                failures += 1
        else:
            pytest.fail("%s: still failing after %d steps" % (what, max_steps))
    assert failures > 0, "%r: no Python allocation was ever refused" % (op,)
    return failures


# ---- fixtures ---------------------------------------------------------------------

@pytest.fixture(autouse=True)
def _allocator_restored():
    # A failing assertion inside a window must not leave the next test
    # with a refusing allocator.
    yield
    _core._reset_allocations()
    if _testcapi is not None:
        _testcapi.remove_mem_hooks()


def f32(*a):
    return np.array(a, dtype=np.float32)


@pytest.fixture(scope="module")
def saxpy_out(lib):
    return dlb.load(lib, "dlb_kernel_saxpy_out",
                    "saxpy(a: float32, x: float32[n], y: float32[n]) "
                    "-> float32[n]")


@pytest.fixture(scope="module")
def matmul(lib):
    return dlb.load(lib, "dlb_kernel_matmul",
                    "matmul(a: float32[m, k], b: float32[k, n]) "
                    "-> float32[m, n]")


@pytest.fixture(scope="module")
def example():
    build = str(ROOT / "build" / "examples" / "extension")
    sys.path.insert(0, build)
    try:
        import dlb_example_ext
    except ImportError as exc:  # pragma: no cover - depends on the build
        pytest.skip("dlb_example_ext is not built (%s)" % exc)
    finally:
        sys.path.remove(build)
    return dlb_example_ext


class ArrayInterface:
    """An object that is tensor-like only through __array_interface__."""

    def __init__(self, arr):
        self.arr = arr
        self.__array_interface__ = arr.__array_interface__


# ---- the hooks themselves -----------------------------------------------------------

def test_hooks_count_and_refuse():
    base = _live()
    _core._fail_allocations(1)
    t = dlb.empty((3,))
    with pytest.raises(MemoryError):
        dlb.empty((3,))
    stats = _core._allocation_stats()
    assert stats["attempts"] == 2 and stats["failed"] == 1
    assert stats["live"] == base + 1
    assert _core._reset_allocations() == {"attempts": 2, "live": base + 1}
    # Made under the counting allocator, freed through it after the reset.
    del t
    assert _live() == base
    # -1 counts without refusing.
    _core._fail_allocations(-1)
    t = dlb.zeros((2, 2))
    assert _core._reset_allocations()["attempts"] >= 1
    del t
    assert _live() == base
    with pytest.raises(ValueError):
        _core._fail_allocations(-2)
    with pytest.raises(TypeError):
        _core._fail_allocations("3")
    assert "TEST-ONLY" in _core._fail_allocations.__doc__


# ---- core allocator: factories, copy, export ------------------------------------------

def test_factories(tp):
    def tolist_is(expected):
        return lambda r: r.tolist() == expected or pytest.fail(r.tolist())
    sweep(lambda: dlb.empty((2, 3)))
    sweep(lambda: dlb.zeros((4,), dtype="float64"), check=tolist_is([0.0] * 4))
    data = [[1, 2], [3, 4]]
    sweep(lambda: dlb.tensor(data, dtype="int32"), sources=[data],
          check=tolist_is(data))
    sweep(lambda: dlb.tensor(2.5), check=tolist_is(2.5))


def test_tensor_copy(tp):
    t = dlb.tensor([[1.0, 2.0], [3.0, 4.0]])
    sweep(t.copy, sources=[t], check=lambda r: r.tolist() == t.tolist())
    # A strided view: the copy walks strides.
    v = dlb.from_dlpack(np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2])
    sweep(v.copy, sources=[v])


def test_dlpack_export(tp):
    t = dlb.tensor([1.0, 2.0, 3.0])
    sweep(lambda: t.__dlpack__(), sources=[t])                  # legacy
    sweep(lambda: t.__dlpack__(max_version=(1, 3)), sources=[t])
    sweep(lambda: t.__dlpack__(max_version=(1, 3), copy=True), sources=[t])
    sweep(lambda: t.__dlpack__(copy=True), sources=[t])         # legacy copy
    # And consumed by another framework: its deleter call frees our block.
    sweep(lambda: np.from_dlpack(t), sources=[t],
          check=lambda r: r.tolist() == [1.0, 2.0, 3.0])
    sweep(lambda: np.from_dlpack(t, copy=True), sources=[t])


# ---- core allocator: from_dlpack, every producer path ---------------------------------

def test_from_test_producer(tp):
    p = tp.Producer(shape=(2, 3), fill=True)
    sweep(lambda: dlb.from_dlpack(p), producers=[p], sources=[p],
          check=lambda r: r.shape == (2, 3))
    sweep(lambda: dlb.from_dlpack(p, copy=True), producers=[p], sources=[p])
    legacy = tp.Producer(shape=(4,), fill=True, legacy_only=True)
    sweep(lambda: dlb.from_dlpack(legacy), producers=[legacy],
          sources=[legacy])
    old = tp.Legacy(shape=(3,), fill=True)          # toDlpack() only
    sweep(lambda: dlb.from_dlpack(old), producers=[old.producer],
          sources=[old])


def test_from_raw_capsule(tp):
    p = tp.Producer(shape=(5,), fill=True)
    for versioned in (True, False):
        sweep(dlb.from_dlpack, lambda: (p.capsule(versioned),),
              producers=[p], sources=[p])
        sweep(lambda c: dlb.from_dlpack(c, copy=True),
              lambda: (p.capsule(versioned),), producers=[p], sources=[p])


def test_from_numpy(tp):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    sweep(lambda: dlb.from_dlpack(a), sources=[a],
          check=lambda r: r.tolist() == a.tolist())
    sweep(lambda: dlb.from_dlpack(a, copy=True), sources=[a])
    ro = np.arange(4.0)
    ro.flags.writeable = False
    sweep(lambda: dlb.from_dlpack(ro), sources=[ro])
    # Views of views: the tensor keeps the first one alive.
    t = dlb.from_dlpack(a)
    sweep(lambda: dlb.from_dlpack(t), sources=[t, a])


@needs_torch
def test_from_torch(tp):
    x = torch.arange(6.0).reshape(2, 3)
    sweep(lambda: dlb.from_dlpack(x), sources=[x],
          check=lambda r: r.tolist() == x.tolist())
    sweep(lambda: dlb.from_dlpack(x, copy=True), sources=[x])
    sweep(lambda: dlb.from_dlpack(x.t()), sources=[x])


@pytest.mark.parametrize("make", [
    lambda: b"abcdefgh",
    lambda: bytearray(b"abcdefgh"),
    lambda: memoryview(np.arange(8, dtype=np.int16)),
])
def test_from_buffer(tp, make):
    src = make()
    sweep(lambda: dlb.from_dlpack(src), sources=[src])
    sweep(lambda: dlb.from_dlpack(src, copy=True), sources=[src])


def test_from_array_interface(tp):
    a = np.arange(4, dtype=np.int64)
    obj = ArrayInterface(a)
    sweep(lambda: dlb.from_dlpack(obj), sources=[obj, a],
          check=lambda r: r.tolist() == [0, 1, 2, 3])
    sweep(lambda: dlb.from_dlpack(obj, copy=True), sources=[obj, a])


@needs_torch
def test_convert_numpy_to_torch(tp):
    a = np.arange(5, dtype=np.float32)
    sweep(lambda: dlb.convert(a, "torch"), sources=[a],
          check=lambda r: r.tolist() == a.tolist())
    x = torch.arange(3.0)
    sweep(lambda: dlb.convert(x, "numpy"), sources=[x])


# ---- core allocator: Function calls, the C API example extension ----------------------

def test_function_numpy_and_dlbridge(tp, saxpy_out, matmul):
    x, y = f32(1, 2, 3), f32(1, 1, 1)
    sweep(lambda: saxpy_out(2.0, x, y), sources=[x, y],
          check=lambda r: r.tolist() == [3, 5, 7])
    tx, ty = dlb.from_dlpack(x), dlb.from_dlpack(y)
    sweep(lambda: saxpy_out(2.0, tx, ty), sources=[tx, ty, x, y],
          check=lambda r: r.tolist() == [3, 5, 7])
    a = np.ones((2, 3), np.float32)
    b = np.ones((3, 2), np.float32)
    sweep(lambda: matmul(a, b), sources=[a, b])
    # A Producer argument goes through __dlpack__: an export per call.
    p = tp.Producer(shape=(3,), fill=True)
    sweep(lambda: saxpy_out(1.0, x, p), producers=[p], sources=[p, x])


@needs_torch
def test_function_torch(tp, saxpy_out):
    x, y = torch.tensor([1.0, 2, 3]), torch.ones(3)
    sweep(lambda: saxpy_out(2.0, x, y), sources=[x, y],
          check=lambda r: r.tolist() == [3, 5, 7], min_allocs=0)
    # mixed: a torch result from a numpy second argument
    n = f32(1, 1, 1)
    sweep(lambda: saxpy_out(2.0, x, n), sources=[x, n], min_allocs=0)


@pytest.mark.parametrize("kind", ["numpy", "dlbridge", "torch"])
def test_capi_example_extension(tp, example, kind):
    if kind == "torch" and torch is None:
        pytest.skip("torch not installed")
    base = np.arange(4, dtype=np.float32)
    x = {"numpy": lambda: base, "dlbridge": lambda: dlb.from_dlpack(base),
         "torch": lambda: torch.arange(4.0)}[kind]()
    y = np.ones(4, np.float32) if kind != "torch" else torch.ones(4)
    sweep(lambda: example.scale_add(x, y, 2.0), sources=[x, y],
          check=lambda r: list(dlb.from_dlpack(r).tolist()) == [1, 3, 5, 7],
          min_allocs=0)
    for fw in ("numpy", "dlbridge", None) + (("torch",) if torch else ()):
        sweep(lambda: example.convert(x, fw), sources=[x])
    p = tp.Producer(shape=(4,), dtype=(2, 32, 1), fill=True)
    sweep(lambda: example.convert(p, "numpy"), producers=[p], sources=[p])


# ---- error paths that are not allocation failures ---------------------------------

def no_leak_on_error(op, exc, *, producers=(), sources=()):
    """op() raises exc after the core allocated: every block comes back."""
    with pytest.raises(exc):
        op()
    _settle()
    base = _live()
    refcounts = _refcounts(sources)
    _core._fail_allocations(-1)
    try:
        with pytest.raises(exc):
            op()
    finally:
        stats = _core._reset_allocations()
    _check_clean(base, producers, sources, refcounts, repr(op))
    return stats["attempts"]


def test_function_multiple_outputs(tp, lib):
    # A failure at the second or third output must free the ones before.
    noop = dlb.load(lib, "dlb_kernel_noop",
                    "f(x: float32[n]) -> (float32[n], float64[n, 2], int64[])")
    x = f32(1, 2, 3)
    assert sweep(lambda: noop(x), sources=[x]) >= 3
    tx = dlb.from_dlpack(x)
    assert sweep(lambda: noop(tx), sources=[tx, x]) >= 3
    made = dlb.load(lib, "dlb_kernel_noop",
                    "f() -> (float32[2], float64[3, 2], int64[])")
    assert sweep(made, min_allocs=3) >= 3
    if torch is not None:
        t = torch.ones(3)
        sweep(lambda: noop(t), sources=[t])


def test_failing_kernel_frees_its_outputs(tp, lib):
    fail = dlb.load(lib, "dlb_kernel_fail",
                    "f(x: float32[n]) -> (float32[n], float32[n])")
    x = f32(1, 2)
    assert no_leak_on_error(lambda: fail(x), ValueError, sources=[x]) >= 2
    tx = dlb.from_dlpack(x)
    no_leak_on_error(lambda: fail(tx), ValueError, sources=[tx, x])
    p = tp.Producer(shape=(2,), fill=True)
    no_leak_on_error(lambda: fail(p), ValueError, producers=[p], sources=[p])


def test_export_refusals_free_what_they_made(tp):
    # A read-only tensor cannot go out as a legacy capsule; a copy can be
    # refused; neither may leave anything behind.
    ro = np.arange(3.0)
    ro.flags.writeable = False
    t = dlb.from_dlpack(ro)
    no_leak_on_error(lambda: t.__dlpack__(), BufferError, sources=[t, ro])
    no_leak_on_error(lambda: t.__dlpack__(copy=False, dl_device=(2, 0)),
                     (BufferError, ValueError), sources=[t, ro])


# ---- CPython allocators ------------------------------------------------------------

def test_nomemory_from_numpy(tp):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    nomemory_sweep(dlb.from_dlpack, lambda: (a,), sources=[a])
    nomemory_sweep(lambda x: dlb.from_dlpack(x, copy=True), lambda: (a,),
                   sources=[a])


def test_nomemory_from_test_producer(tp):
    p = tp.Producer(shape=(3,), fill=True)
    nomemory_sweep(dlb.from_dlpack, lambda: (p,), producers=[p], sources=[p])
    legacy = tp.Producer(shape=(3,), fill=True, legacy_only=True)
    nomemory_sweep(dlb.from_dlpack, lambda: (legacy,), producers=[legacy],
                   sources=[legacy])
    for versioned in (True, False):
        nomemory_sweep(dlb.from_dlpack, lambda: (p.capsule(versioned),),
                       producers=[p], sources=[p])
    nomemory_sweep(lambda x: dlb.from_dlpack(x, copy=True), lambda: (p,),
                   producers=[p], sources=[p])


def test_nomemory_other_importers(tp):
    b = bytearray(b"abcd")
    nomemory_sweep(dlb.from_dlpack, lambda: (b,), sources=[b])
    obj = ArrayInterface(np.arange(3))
    nomemory_sweep(dlb.from_dlpack, lambda: (obj,), sources=[obj])


def test_nomemory_dlpack_and_copy(tp):
    t = dlb.tensor([1.0, 2.0])
    nomemory_sweep(t.__dlpack__, sources=[t])
    dl = t.__dlpack__
    mv = (1, 3)
    nomemory_sweep(lambda: dl(max_version=mv), sources=[t])
    nomemory_sweep(lambda: dl(max_version=mv, copy=True), sources=[t])
    nomemory_sweep(t.copy, sources=[t])
    shape = (2, 2)
    nomemory_sweep(dlb.zeros, lambda: (shape,))


def test_nomemory_function(tp, saxpy_out):
    x, y = f32(1, 2, 3), f32(1, 1, 1)
    nomemory_sweep(saxpy_out, lambda: (2.0, x, y), sources=[x, y])
    tx = dlb.from_dlpack(x)
    nomemory_sweep(saxpy_out, lambda: (2.0, tx, y), sources=[tx, y])
    p = tp.Producer(shape=(3,), fill=True)
    nomemory_sweep(saxpy_out, lambda: (2.0, x, p), producers=[p],
                   sources=[x, p])


def test_nomemory_example_extension(tp, example):
    x, y = f32(1, 2, 3), f32(1, 1, 1)
    nomemory_sweep(example.scale_add, lambda: (x, y, 2.0), sources=[x, y])
    nomemory_sweep(example.convert, lambda: (x, None), sources=[x])


def _torch_oom(exc):
    # torch turns a failed Python allocation in THPVariable_Wrap into
    # RuntimeError (c10::OutOfMemoryError), not MemoryError.
    return isinstance(exc, RuntimeError) and \
        "Failed to allocate a Tensor object" in str(exc)


@needs_torch
def test_nomemory_torch(tp, saxpy_out):
    x = torch.arange(4.0)
    nomemory_sweep(dlb.from_dlpack, lambda: (x,), sources=[x])
    y = torch.ones(4)
    nomemory_sweep(saxpy_out, lambda: (2.0, x, y), sources=[x, y],
                   foreign=_torch_oom)
    # Not swept here: dlb.convert(..., "torch").  With every allocation
    # from the 9th on refused, torch.from_dlpack itself (torch's code, after
    # dlbridge has returned the Tensor) never returns; and convert reports
    # torch's RuntimeError for a failed allocation as BufferError, by
    # design.  convert is swept with the core allocator above.


class _DlpackWrapper:
    def __init__(self, p):
        self.p = p

    def __dlpack__(self, **kw):
        return self.p.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.p.__dlpack_device__()


def test_nomemory_first_sight_of_a_type(tp):
    # A type seen for the first time is classified inside the window: a
    # failure there must not be cached, nor turn into "not tensor-like".
    a = np.arange(3.0)
    p = tp.Producer(shape=(2,), fill=True)

    def fresh(base, *args):
        return lambda: (type("Fresh", (base,), {})(*args),)
    nomemory_sweep(dlb.from_dlpack, fresh(ArrayInterface, a), sources=[a])
    nomemory_sweep(dlb.from_dlpack, fresh(_DlpackWrapper, p), producers=[p],
                   sources=[p])
    nomemory_sweep(dlb.from_dlpack, fresh(bytearray, b"abcd"))
    sweep(dlb.from_dlpack, fresh(ArrayInterface, a), sources=[a])


def test_function_mut_copies_of_immutable_arrays(tp, lib):
    # A `mut` JAX argument is copied into memory dlbridge allocates for JAX:
    # a failure at any allocation (the output, the copy, the exports JAX
    # takes) frees what was made, and the caller's array is never written.
    # (jaxlib clears the destructor of every capsule it consumes: an export
    # is freed by its deleter alone, export.c.)
    jnp = pytest.importorskip("jax.numpy")
    f = dlb.load(lib, "dlb_kernel_noop",
                 "f(x: float32[n], y: mut float32[n]) -> float32[n]")
    x, y = jnp.ones(3, jnp.float32), jnp.zeros(3, jnp.float32)
    n = sweep(lambda: f(x, y), sources=[x, y],
              check=lambda r: len(r) == 2)
    assert n >= 3    # the output, the copy, an export at least
    assert np.asarray(y).tolist() == [0.0] * 3


@needs_torch
def test_nomemory_function_mut_torch(tp, lib):
    # After the kernel, the version counters of the `mut` torch arguments
    # move (a tuple of them handed to torch): a failure there raises.
    # torch's _increment_version reports a failed iter() of the tuple as
    # RuntimeError "increment_version expect a Iterable[Tensor] as input".
    s = dlb.load(lib, "dlb_kernel_saxpy",
                 "saxpy(a: float32, x: float32[n], y: mut float32[n])")
    x, y = torch.ones(4), torch.zeros(4)

    def foreign(exc):
        return _torch_oom(exc) or (isinstance(exc, RuntimeError) and
                                   "expect a Iterable[Tensor]" in str(exc))
    assert nomemory_sweep(s, lambda: (2.0, x, y), sources=[x, y],
                          foreign=foreign) > 0
