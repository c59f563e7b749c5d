"""dlbridge's Python layer on CUDA, tested without a GPU (issue 8, item 7).

Each test runs a script in a child interpreter whose DLB_CUDA_DRIVER names
the recording fake driver (tests/cuda/fake_driver.c) and DLB_CUDA_NVRTC the
fake NVRTC: the driver is loaded once per process, so every configuration
(missing driver, failing cuInit, no device) gets a fresh process.  "Device
memory" is host memory the fake keeps in a table, so copies are checked
bit for bit, and the fake's call log is checked for the exact sequences:
the event record on the producer's stream and the wait on the consumer's,
no synchronisation while a stream captures, the caller's context put back,
every allocation freed exactly once.

The same behaviour on a real GPU: tests/gpu (scripts/gpu-check).
"""

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

try:
    import _dlb_testproducer as _tp
except ImportError:  # pragma: no cover - depends on the build
    _tp = None


def _fake_libs():
    """The fake driver and NVRTC built next to the test producer (the same
    Meson build directory: build/, build-sanitize-py/, ...)."""
    if _tp is None:
        return None
    build = pathlib.Path(_tp.__file__).resolve().parents[2]
    drv = build / "tests" / "cuda" / "libdlb_fake_cuda.so"
    nvrtc = build / "tests" / "cuda" / "libdlb_fake_nvrtc.so"
    if drv.exists() and nvrtc.exists():
        return str(drv), str(nvrtc)
    return None


LIBS = _fake_libs()
pytestmark = pytest.mark.skipif(
    LIBS is None, reason="the fake CUDA driver is not built (Meson tests=true)")

PRELUDE = """
import ctypes, os, sys
import numpy as np
import dlbridge as dlb
fake = ctypes.CDLL(os.environ["DLB_FAKE_LIB"])
fake.dlb_fake_cuda_log_text.restype = ctypes.c_char_p
fake.dlb_fake_cuda_stream_new.restype = ctypes.c_void_p
fake.dlb_fake_cuda_current_context.restype = ctypes.c_char_p
fake.dlb_fake_cuda_managed_alloc.restype = ctypes.c_void_p
for _f in ("stream_free", "begin_capture", "end_capture", "managed_free"):
    getattr(fake, "dlb_fake_cuda_" + _f).argtypes = [ctypes.c_void_p]
fake.dlb_fake_cuda_set_fail.argtypes = [ctypes.c_char_p, ctypes.c_int]

def log():
    return fake.dlb_fake_cuda_log_text().decode()

def clear():
    fake.dlb_fake_cuda_log_clear()

def calls(name):
    return [l for l in log().splitlines() if l.startswith(name + " ")]

def new_stream(device=0):
    return fake.dlb_fake_cuda_stream_new(device)

def host(t):
    return np.asarray(t.copy(device="cpu"))
"""


def run(body, env=None, expect_rc=0):
    """Run PRELUDE + body in a child with the fake driver; return stdout."""
    e = dict(os.environ)
    e["DLB_CUDA_DRIVER"], e["DLB_CUDA_NVRTC"] = LIBS
    e["DLB_FAKE_LIB"] = LIBS[0]
    e.pop("DLB_FAKE_CUDA_FAIL", None)
    e.pop("DLB_FAKE_CUDA_DEVICES", None)
    e.update(env or {})
    src = PRELUDE + textwrap.dedent(body) + "\nprint('CHILD-OK')\n"
    p = subprocess.run([sys.executable, "-c", src], env=e, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == expect_rc, p.stdout + p.stderr
    if expect_rc == 0:
        assert "CHILD-OK" in p.stdout, p.stdout + p.stderr
    return p.stdout


# ---- allocation and copies ------------------------------------------------------------

def test_empty_zeros_tensor_on_cuda_and_freed_once():
    run("""
    for dev in ("cuda", "cuda:0", "cuda:1"):
        z = dlb.zeros((5, 7), dtype="float64", device=dev)
        e = dlb.empty((3,), dtype="int8", device=dev)
        want = "cuda:1" if dev == "cuda:1" else "cuda:0"
        assert z.device == want and e.device == want, (z.device, e.device)
        assert z.__dlpack_device__() == (2, int(want[-1]))
        assert z.data_ptr % 256 == 0 and z.is_contiguous and not z.readonly
        assert (host(z) == 0).all()
        assert "cuda:" in repr(z)
    t = dlb.tensor([[1, 2, 3], [4, 5, 6]], dtype="int32", device="cuda:1")
    assert t.device == "cuda:1" and t.tolist() == [[1, 2, 3], [4, 5, 6]]
    # stream-ordered allocation on dlbridge's current (legacy) stream,
    # memset on the same stream
    clear()
    z = dlb.zeros((4,), device="cuda:0")
    a = calls("cuMemAllocAsync")
    m = calls("cuMemsetD8Async")
    assert len(a) == 1 and "stream=legacy" in a[0], log()
    assert len(m) == 1 and "stream=legacy" in m[0], log()
    del z, e, t
    import gc; gc.collect()
    assert fake.dlb_fake_cuda_live_allocations() == 0
    assert fake.dlb_fake_cuda_violations() == 0
    """)


def test_copies_between_host_and_device_are_bit_exact():
    run("""
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, 37 * 24 * 8, dtype=np.uint8).view(np.float64).reshape(37, 24)
    layouts = [base, base.T, base[::-2, ::-1], base[3:, 5:],
               base.reshape(37, 4, 6).transpose(2, 0, 1)]
    for h in layouts:
        want = np.ascontiguousarray(h).tobytes()
        d = dlb.from_dlpack(h, device="cuda:0")              # copy=None
        assert d.device == "cuda:0" and d.is_contiguous
        assert host(d).tobytes() == want
        d2 = dlb.from_dlpack(h, device="cuda:0", copy=True)
        assert host(d2).tobytes() == want
        d3 = dlb.from_dlpack(h).copy(device="cuda:1")
        assert d3.device == "cuda:1" and host(d3).tobytes() == want
        # device -> device in a strided layout (the copy kernel)
        dv = dlb.from_dlpack(d.__dlpack__(max_version=(1, 3)))
        assert dv.data_ptr == d.data_ptr
        c = d.copy()
        assert c.device == "cuda:0" and c.data_ptr != d.data_ptr
        assert host(c).tobytes() == want
        # __dlpack__(dl_device=CPU, copy=True): a host capsule, IS_COPIED
        hc = dlb.from_dlpack(d.__dlpack__(dl_device=(1, 0), copy=True,
                                          max_version=(1, 3)))
        assert hc.device == "cpu" and np.asarray(hc).tobytes() == want
        # NumPy asks for a host copy through dl_device
        assert np.from_dlpack(d, device="cpu").tobytes() == want
    # a strided device view read back: the kernel gathers it
    full = dlb.from_dlpack(base, device="cuda:0")
    from_dev = dlb.from_dlpack(full, device="cpu", copy=True)
    assert np.asarray(from_dev).tobytes() == base.tobytes()
    # copy=False cannot move data
    for bad in (lambda: dlb.from_dlpack(base, device="cuda:0", copy=False),
                lambda: dlb.from_dlpack(full, device="cpu", copy=False),
                lambda: full.__dlpack__(dl_device=(1, 0), copy=False)):
        try:
            bad()
        except BufferError:
            pass
        else:
            raise AssertionError("copy=False moved data")
    # D2H waits for the stream on the host (the one host wait) -- and only
    # then; device copies do not
    clear()
    full.copy()
    assert not calls("cuStreamSynchronize"), log()
    full.copy(device="cpu")
    assert len(calls("cuStreamSynchronize")) == 1, log()
    del full, from_dev, d, d2, d3, dv, c, hc
    import gc; gc.collect()
    assert fake.dlb_fake_cuda_live_allocations() == 0
    """)


def test_cuda_tensor_refuses_host_access_but_tolist_copies():
    run("""
    t = dlb.tensor([1.5, 2.5], device="cuda:0")
    for f in (lambda: memoryview(t), lambda: t.__array_interface__):
        try:
            f()
        except (BufferError, AttributeError):
            pass
        else:
            raise AssertionError("host access to device memory")
    assert t.tolist() == [1.5, 2.5]
    assert t.__cuda_array_interface__["data"] == (t.data_ptr, False)
    """)


# ---- streams -----------------------------------------------------------------------------

def test_export_orders_dlbridge_stream_before_consumer_stream():
    run("""
    t = dlb.zeros((8,), device="cuda:0")
    s, c = new_stream(), new_stream()
    with dlb.stream(s):
        clear()
        cap = t.__dlpack__(stream=c, max_version=(1, 3))
        lines = log().splitlines()
        rec = [l for l in lines if l.startswith("cuEventRecord")]
        wait = [l for l in lines if l.startswith("cuStreamWaitEvent")]
        assert len(rec) == 1 and "stream=s%d" % 1 in rec[0], lines
        assert len(wait) == 1 and "stream=s2" in wait[0], lines
        assert rec[0].split()[1] == wait[0].split()[2], lines  # same event
        assert not calls("cuStreamSynchronize") and not calls("cuCtxSynchronize")
        # the same stream: nothing to order, no driver call at all
        clear()
        t.__dlpack__(stream=s, max_version=(1, 3))
        assert not calls("cuEventRecord"), log()
        # -1: the consumer orders the work itself
        clear()
        t.__dlpack__(stream=-1, max_version=(1, 3))
        assert not calls("cuEventRecord"), log()
        # None: the legacy stream
        clear()
        t.__dlpack__(max_version=(1, 3))
        assert "stream=legacy" in calls("cuStreamWaitEvent")[0], log()
        try:
            t.__dlpack__(stream=0)
        except ValueError:
            pass
        else:
            raise AssertionError("stream=0 accepted on CUDA")
        # CAI v3 names the current stream
        assert t.__cuda_array_interface__["stream"] == s
    assert t.__cuda_array_interface__["stream"] == 1
    u = dlb.from_dlpack(cap)
    assert u.data_ptr == t.data_ptr
    """)


def test_dlb_stream_values_nesting_and_restore():
    run("""
    class TorchLike:
        def __init__(self, h): self.cuda_stream = h
    class CupyLike:
        def __init__(self, h): self.ptr = h
    class Protocol:
        def __init__(self, h): self.h = h
        def __cuda_stream__(self): return (0, self.h)
    assert dlb._core._current_stream() == 1
    with dlb.stream(TorchLike(0x1000)):
        assert dlb._core._current_stream() == 0x1000
        with dlb.stream(CupyLike(0x2000)):
            assert dlb._core._current_stream() == 0x2000
            with dlb.stream(Protocol(0x3000)):
                assert dlb._core._current_stream() == 0x3000
            with dlb.stream(2):
                assert dlb._core._current_stream() == 2
        assert dlb._core._current_stream() == 0x1000
        with dlb.stream(TorchLike(0)):   # a framework's default stream
            assert dlb._core._current_stream() == 1
    try:
        with dlb.stream(0x4000):
            raise KeyError("x")
    except KeyError:
        pass
    assert dlb._core._current_stream() == 1
    for bad, exc in ((0, ValueError), (-2, OverflowError), (object(), TypeError),
                     (True, TypeError)):
        try:
            dlb.stream(bad)
        except exc:
            pass
        else:
            raise AssertionError(bad)
    # per thread
    import threading
    seen = []
    with dlb.stream(0x5000):
        th = threading.Thread(target=lambda: seen.append(dlb._core._current_stream()))
        th.start(); th.join()
    assert seen == [1]
    """)


def test_consumer_passes_its_stream_to_producers():
    run("""
    src = dlb.zeros((4,), device="cuda:0")
    class Producer:
        def __init__(self): self.kw = None
        def __dlpack_device__(self): return (2, 0)
        def __dlpack__(self, **kw):
            self.kw = kw
            return src.__dlpack__(**kw)
    p = Producer()
    s = new_stream()
    with dlb.stream(s):
        t = dlb.from_dlpack(p)
    assert p.kw["stream"] == s and t.data_ptr == src.data_ptr, p.kw
    dlb.from_dlpack(p)
    assert p.kw["stream"] == 1, p.kw
    # moving CUDA data is dlbridge's job: the producer is asked for a view
    h = dlb.from_dlpack(p, device="cpu", copy=True)
    assert "dl_device" not in p.kw and "copy" not in p.kw, p.kw
    assert h.device == "cpu" and np.asarray(h).tolist() == [0.0] * 4
    """)


def test_copies_run_on_the_current_stream():
    run("""
    h = np.arange(24.0).reshape(4, 6)
    s = new_stream()
    with dlb.stream(s):
        clear()
        d = dlb.from_dlpack(h.T, device="cuda:0")
        d.copy()
    lines = [l for l in log().splitlines()
             if l.startswith(("cuMemcpy", "cuLaunchKernel", "cuMemAllocAsync"))]
    assert lines and all("stream=s1" in l for l in lines), lines
    """)


def test_convert_copies_on_the_device_and_moves_with_device():
    """dlb.convert on CUDA data (gh-17): what a target cannot share (here
    read-only, negative-stride data into a stand-in for CuPy, whose arrays
    cannot be read-only) is copied on the same device, on dlbridge's
    current stream, into compact writable memory; copy=False refuses;
    device= moves between the CPU and CUDA."""
    run("""
    from dlbridge import _frameworks as fw
    fw._LOADERS["cupy"] = lambda: (lambda t: t)   # cupy.from_dlpack's place
    d = dlb.from_dlpack(np.arange(8, dtype=np.float32), device="cuda:0")
    class ReadOnlyReversed:    # another framework's view, through CAI
        __cuda_array_interface__ = {
            "shape": (8,), "typestr": "<f4", "version": 3, "stream": None,
            "data": (d.data_ptr + 7 * 4, True), "strides": (-4,)}
    v = dlb.from_dlpack(ReadOnlyReversed())
    assert v.readonly and v.strides == (-1,)
    s = new_stream()
    with dlb.stream(s):
        clear()
        r = dlb.convert(ReadOnlyReversed(), "cupy")
    lines = [l for l in log().splitlines()
             if l.startswith(("cuMemcpy", "cuLaunchKernel", "cuMemAllocAsync"))]
    assert lines and all("stream=s1" in l for l in lines), lines
    assert not calls("cuStreamSynchronize"), log()
    assert isinstance(r, dlb.Tensor) and r.device == "cuda:0"
    assert not r.readonly and r.is_contiguous and r.data_ptr != v.data_ptr
    assert r.tolist() == list(range(7, -1, -1)), r.tolist()
    try:
        dlb.convert(ReadOnlyReversed(), "cupy", copy=False)
    except BufferError as e:
        assert "read-only" in str(e), e
    else:
        raise AssertionError("copy=False copied")
    h = np.arange(6.0).reshape(2, 3)
    c = dlb.convert(h, "dlbridge", device="cuda:0")
    assert c.device == "cuda:0" and host(c).tolist() == h.tolist()
    n = dlb.convert(c, "numpy", device="cpu")
    assert isinstance(n, np.ndarray) and n.tolist() == h.tolist()
    for bad in (lambda: dlb.convert(c, "numpy", device="cpu", copy=False),
                lambda: dlb.convert(h, "dlbridge", device="cuda:0", copy=False),
                lambda: dlb.convert(c, "numpy")):
        try:
            bad()
        except BufferError:
            pass
        else:
            raise AssertionError("no BufferError")
    del r, v, c, n, d
    import gc; gc.collect()
    assert fake.dlb_fake_cuda_live_allocations() == 0
    """)


# ---- __cuda_array_interface__ import --------------------------------------------------------

def test_cai_import_device_from_pointer_and_stream_ordering():
    run("""
    class CAI:
        def __init__(self, d, owner):
            self.__cuda_array_interface__ = d
            self.owner = owner
    t = dlb.tensor([[1, 2], [3, 4]], dtype="int64", device="cuda:1")
    d = dict(t.__cuda_array_interface__)
    d.pop("stream")
    u = dlb.from_dlpack(CAI(d, t))
    assert u.device == "cuda:1" and u.data_ptr == t.data_ptr, u.device
    assert u.tolist() == [[1, 2], [3, 4]]
    # the interface's stream is ordered before dlbridge's current one
    p, c = new_stream(1), new_stream(1)
    d["stream"] = p
    clear()
    with dlb.stream(c):
        dlb.from_dlpack(CAI(d, t))
    rec, wait = calls("cuEventRecord"), calls("cuStreamWaitEvent")
    assert len(rec) == 1 and "stream=s1" in rec[0], log()
    assert len(wait) == 1 and "stream=s2" in wait[0], log()
    assert not calls("cuStreamSynchronize")
    # no stream (None / absent): no ordering asked
    d["stream"] = None
    clear()
    dlb.from_dlpack(CAI(d, t))
    assert not calls("cuEventRecord")
    d["stream"] = 0
    try:
        dlb.from_dlpack(CAI(d, t))
    except BufferError:
        pass
    else:
        raise AssertionError("CAI stream 0 accepted")
    # host memory claimed as CUDA memory
    a = np.arange(4.0)
    bad = {"shape": (4,), "typestr": "<f8", "data": (a.ctypes.data, False),
           "version": 3, "strides": None}
    try:
        dlb.from_dlpack(CAI(bad, a))
    except BufferError as e:
        assert "not CUDA memory" in str(e), e
    else:
        raise AssertionError("host pointer accepted as CUDA memory")
    # managed memory is recognised as such
    m = fake.dlb_fake_cuda_managed_alloc(0, 64)
    md = {"shape": (8,), "typestr": "<f8", "data": (m, False), "version": 3}
    v = dlb.from_dlpack(CAI(md, None))
    assert v.__dlpack_device__()[0] == 13, v.__dlpack_device__()
    del v
    fake.dlb_fake_cuda_managed_free(m)
    """)


# ---- graph capture ----------------------------------------------------------------------------

def test_no_host_synchronisation_or_legacy_stream_under_capture():
    run("""
    s, c = new_stream(), new_stream()
    src = dlb.from_dlpack(np.arange(12.0).reshape(3, 4), device="cuda:0")
    fake.dlb_fake_cuda_begin_capture(s)
    with dlb.stream(s):
        z = dlb.zeros((16,), device="cuda:0")          # stream-ordered alloc
        k = src.copy()                                   # device copy on s
        kt = dlb.from_dlpack(src.__dlpack__(stream=s, max_version=(1, 3))).copy()
        cap = z.__dlpack__(stream=c, max_version=(1, 3))  # s -> c: allowed
        for bad in (lambda: src.copy(device="cpu"),      # a host wait
                    lambda: z.__dlpack__(max_version=(1, 3))):  # legacy stream
            try:
                bad()
            except BufferError as e:
                assert "captur" in str(e), e
            else:
                raise AssertionError("allowed during capture")
    fake.dlb_fake_cuda_end_capture(s)
    assert fake.dlb_fake_cuda_violations() == 0, log()
    assert "VIOLATION" not in log(), log()
    """)


# ---- contexts --------------------------------------------------------------------------------

def test_callers_context_restored():
    run("""
    fake.dlb_fake_cuda_set_foreign_context(1)
    t = dlb.zeros((4,), device="cuda:1")
    t2 = t.copy(device="cpu")
    u = dlb.from_dlpack(np.ones(3), device="cuda:0")
    assert fake.dlb_fake_cuda_current_context() == b"foreign"
    del t, u
    assert fake.dlb_fake_cuda_current_context() == b"foreign"
    fake.dlb_fake_cuda_set_foreign_context(0)
    dlb.zeros((1,), device="cuda:0")
    assert fake.dlb_fake_cuda_current_context() == b"none"
    """)


# ---- the exchange table on CUDA, Function ----------------------------------------------------

def test_exchange_table_allocates_on_cuda_and_reports_the_stream():
    run("""
    core = dlb._core
    t = core._exchange_alloc_like(dlb.zeros(1), (2, 3), "float32", "cuda:1")
    assert isinstance(t, dlb.Tensor) and t.device == "cuda:1" and t.shape == (2, 3)
    """)


def test_function_on_cuda_tensors(lib):
    run("""
    lib = os.environ["DLB_EXAMPLE_KERNELS"]
    # A probe kernel writes the stream it was given into its output with a
    # host store (fake "device memory" is host memory).
    probe = dlb.load(lib, "dlb_kernel_stream_probe",
                     "probe(x: float32[n]) -> int64[1]")
    saxpy = dlb.load(lib, "dlb_kernel_saxpy",
                     "saxpy(a: float32, x: float32[n], y: mut float32[n])")
    x = dlb.tensor([1.0, 2.0, 3.0], dtype="float32", device="cuda:0")
    y = dlb.tensor([10.0, 20.0, 30.0], dtype="float32", device="cuda:0")
    s = new_stream()
    with dlb.stream(s):
        clear()
        out = probe(x)
    assert type(out) is dlb.Tensor and out.device == "cuda:0"
    assert out.tolist() == [s], (out.tolist(), s)   # the kernel ran on s
    allocs = calls("cuMemAllocAsync")
    assert len(allocs) == 1 and "stream=s1" in allocs[0], log()
    assert probe(x).tolist() == [0]                   # legacy stream: NULL
    try:
        saxpy(2.0, x, np.ones(3, np.float32))
    except ValueError as e:
        assert "cuda:0" in str(e) and "cpu" in str(e), e
    else:
        raise AssertionError("cpu and cuda arguments mixed")
    z = dlb.tensor([1.0, 2.0, 3.0], dtype="float32", device="cuda:1")
    try:
        saxpy(2.0, x, z)
    except ValueError as e:
        assert "cuda:1" in str(e), e
    else:
        raise AssertionError("two devices mixed")
    """, env={"DLB_EXAMPLE_KERNELS": lib})


# ---- driver errors become clean exceptions ------------------------------------------------------

def test_driver_missing():
    run("""
    try:
        dlb.zeros((2,), device="cuda:0")
    except RuntimeError as e:
        assert "CUDA driver not found" in str(e) and "/nonexistent/libcuda.so" in str(e), e
    else:
        raise AssertionError("no error")
    try:
        dlb.from_dlpack(np.ones(2), device="cuda:0")
    except BufferError as e:
        assert "CUDA driver not found" in str(e), e
    else:
        raise AssertionError("no error")
    # CPU work is untouched
    assert dlb.zeros((2,)).tolist() == [0.0, 0.0]
    """, env={"DLB_CUDA_DRIVER": "/nonexistent/libcuda.so"})


@pytest.mark.parametrize("env, exc, text", [
    ({"DLB_FAKE_CUDA_FAIL": "cuInit:999"}, RuntimeError, "cuInit"),
    ({"DLB_FAKE_CUDA_DEVICES": "0"}, ValueError, "0 CUDA devices"),
    ({"DLB_FAKE_CUDA_FAIL": "cuMemAllocAsync:2"}, MemoryError, "OUT_OF_MEMORY"),
    ({"DLB_FAKE_CUDA_FAIL": "cuMemsetD8Async:1"}, RuntimeError, "cuMemsetD8Async"),
], ids=["cuInit", "no-device", "out-of-memory", "memset"])
def test_driver_errors_are_clean_exceptions(env, exc, text):
    run("""
    exc, text = %s, %r
    try:
        dlb.zeros((1024,), device="cuda:0")
    except exc as e:
        assert text in str(e), e
    else:
        raise AssertionError("no error")
    assert fake.dlb_fake_cuda_live_allocations() == 0
    """ % (exc.__name__, text), env=env)


def test_copy_errors_free_what_was_allocated():
    run("""
    d = dlb.from_dlpack(np.arange(12.0).reshape(3, 4), device="cuda:0")
    fake.dlb_fake_cuda_set_fail(b"cuMemcpyAsync", 1)
    fake.dlb_fake_cuda_set_fail(b"cuMemcpy2DAsync", 1)
    for f in (lambda: d.copy(), lambda: d.copy(device="cpu"),
              lambda: dlb.from_dlpack(np.ones(3), device="cuda:0")):
        try:
            f()
        except BufferError as e:
            assert "cuMemcpy" in str(e), e
        else:
            raise AssertionError("no error")
    fake.dlb_fake_cuda_set_fail(b"cuMemcpyAsync", 0)
    fake.dlb_fake_cuda_set_fail(b"cuMemcpy2DAsync", 0)
    del d
    import gc; gc.collect()
    assert fake.dlb_fake_cuda_live_allocations() == 0, fake.dlb_fake_cuda_live_allocations()
    """)


# ---- pickling -----------------------------------------------------------------------------------

def test_cuda_tensors_pickle_through_the_host_and_come_back_on_their_device():
    run("""
    import pickle
    t = dlb.from_dlpack(np.arange(12.0).reshape(3, 4).T, device="cuda:1")
    small = dlb.from_dlpack(np.arange(3, dtype=np.int16), device="cuda:0")
    for proto in (2, 4, 5):
        bufs = []
        data = pickle.dumps(t, protocol=proto,
                            buffer_callback=bufs.append if proto == 5 else None)
        u = pickle.loads(data, buffers=bufs)
        assert u.device == "cuda:1" and u.shape == (4, 3), (u.device, u.shape)
        assert u.data_ptr != t.data_ptr
        assert host(u).tolist() == host(t).tolist()
    u = pickle.loads(pickle.dumps(small, protocol=5))
    assert u.device == "cuda:0" and u.tolist() == [0, 1, 2]
    """)


# ---- CUDA IPC: dlb.share of CUDA tensors ----------------------------------------------------------

def test_share_cuda_tensor_maps_the_same_device_memory_in_another_process():
    run('''
    import gc, pickle, subprocess
    x = dlb.from_dlpack(np.arange(12.0).reshape(3, 4).T, device="cuda:1")
    s = dlb.share(x)
    assert s.is_shared and not x.is_shared
    assert s.device == "cuda:1" and s.data_ptr != x.data_ptr
    assert host(s).tolist() == host(x).tolist()
    assert dlb.share(s).data_ptr == s.data_ptr          # already shared
    st = new_stream(1)
    clear()
    with dlb.stream(st):
        data = pickle.dumps(s, protocol=5)
    assert len(data) < 1024, len(data)
    rec = calls("cuEventRecord")
    assert len(rec) == 1 and "stream=s1" in rec[0], log()
    assert calls("cuIpcGetMemHandle") and calls("cuIpcGetEventHandle"), log()
    # this process: the same memory, no IPC open
    u = pickle.loads(data)
    assert u.data_ptr == s.data_ptr and u.is_shared and not calls("cuIpcOpenMemHandle")
    # another process maps it, waits for the event, reads, writes
    child = """
import ctypes, os, pickle, sys
import numpy as np, dlbridge as dlb
fake = ctypes.CDLL(os.environ["DLB_FAKE_LIB"])
fake.dlb_fake_cuda_log_text.restype = ctypes.c_char_p
t = pickle.loads(sys.stdin.buffer.read())
assert t.device == "cuda:1" and t.is_shared, t.device
print(t.tolist())
# fake device memory is host memory: write through it directly
ctypes.memmove(t.data_ptr, np.array([100.0]).ctypes.data, 8)
log = fake.dlb_fake_cuda_log_text().decode()
assert "cuIpcOpenMemHandle" in log and "cuIpcOpenEventHandle" in log, log
assert "cuStreamWaitEvent stream=legacy" in log, log
del t
import gc; gc.collect()
log = fake.dlb_fake_cuda_log_text().decode()
assert "cuIpcCloseMemHandle" in log, log
assert fake.dlb_fake_cuda_live_allocations() == 0
print("CHILD-DONE")
"""
    p = subprocess.run([sys.executable, "-c", child], input=data,
                       capture_output=True)
    out = p.stdout.decode()
    assert p.returncode == 0 and "CHILD-DONE" in out, out + p.stderr.decode()
    assert "[[0.0, 4.0, 8.0]" in out, out
    assert host(s)[0, 0] == 100.0                        # the child's write
    # hostile handles
    fn, args = s.__reduce_ex__(5)
    for bad in ((b"short",) + args[1:],
                (args[0], -8) + args[2:],
                (args[0], 1 << 40) + args[2:],
                args[:3] + ((1 << 20, 4),) + args[4:]):
        try:
            fn(*bad)
        except ValueError:
            pass
        else:
            raise AssertionError(bad)
    # the last reference frees the IPC memory
    clear()
    del s, u
    gc.collect()
    assert len(calls("cuMemFree")) == 1, log()
    assert "VIOLATION" not in log()
    del x
    gc.collect()
    assert fake.dlb_fake_cuda_live_allocations() == 0
    # a handle of memory no longer shared, in its own process
    try:
        pickle.loads(data)
    except ValueError as e:
        assert "no longer shared" in str(e), e
    else:
        raise AssertionError("stale handle accepted")
    ''')


# dlb_cuda_ipc_handle: memory[64], event[64], uuid[16], base, size, pid
HANDLE_SIZE_AT = 64 + 64 + 16 + 8


def test_cuda_handle_claiming_more_than_its_allocation_is_refused():
    """A pickled CUDA IPC handle whose size field says 16 MiB over a 64-byte
    allocation: the driver's extent is asked (cuMemGetAddressRange) and the
    handle refused, in another process and in the exporter's own (issue 15).
    Before, the importer mapped a 16 MiB tensor over 64 bytes."""
    run('''
    import pickle, struct, subprocess
    s = dlb.share(dlb.from_dlpack(np.arange(16, dtype=np.float32), device="cuda:0"))
    fn, args = s.__reduce_ex__(5)
    h = bytearray(args[0])
    struct.pack_into("<Q", h, %d, 16 << 20)
    hostile = (bytes(h), 0, args[2], ((16 << 20) // 4,), (1,), args[5])
    child = "\\n".join([
        "import os, pickle, sys",
        "import numpy as np, dlbridge as dlb",
        "fn, args = pickle.loads(sys.stdin.buffer.read())",
        "try:",
        "    t = fn(*args)",
        "    print('ACCEPTED', float(np.asarray(t.copy(device='cpu'))[-1]))",
        "except ValueError as e:",
        "    print('REFUSED', e)",
        "good = pickle.loads(bytes.fromhex(os.environ['GOOD']))",  # still loads
        "print('GOOD', good.tolist()[:3])"])
    data = pickle.dumps((fn, hostile))
    env = dict(os.environ, GOOD=pickle.dumps(s).hex())
    p = subprocess.run([sys.executable, "-c", child], input=data,
                       capture_output=True, env=env)
    out = p.stdout.decode()
    assert p.returncode == 0, (p.returncode, out, p.stderr.decode())
    assert "REFUSED" in out and "claims 16777216 bytes" in out, out
    assert "allocation it names has 64" in out, out
    assert "GOOD [0.0, 1.0, 2.0]" in out, out
    try:
        fn(*hostile)            # the exporter's own handle
    except ValueError as e:
        assert "claims 16777216 bytes" in str(e), e
    else:
        raise AssertionError("own hostile handle accepted")
    ''' % HANDLE_SIZE_AT)


def test_negative_stride_view_of_shared_cuda_tensor_round_trips():
    """A reversed view of a shared CUDA tensor pickles as a handle whose
    element 0 is the allocation's last element, and loads in the exporter
    and in another process; a load that fails on its layout opens nothing
    and leaves the handle loadable (issue 15)."""
    run('''
    import gc, pickle, subprocess
    s = dlb.share(dlb.from_dlpack(np.arange(8, dtype=np.float32), device="cuda:0"))
    class Reversed:          # another framework's reversed view, through CAI
        __cuda_array_interface__ = {
            "shape": (8,), "typestr": "<f4", "version": 3, "stream": None,
            "data": (s.data_ptr + 7 * 4, False), "strides": (-4,)}
    v = dlb.from_dlpack(Reversed())
    assert v.is_shared and v.strides == (-1,), v.strides
    data = pickle.dumps(v)
    u = pickle.loads(data)                         # the exporter itself
    assert u.data_ptr == v.data_ptr and u.strides == (-1,)
    assert u.tolist() == list(range(7, -1, -1)), u.tolist()
    fn, args = v.__reduce_ex__(5)
    too_long = args[:3] + ((9,), (-1,)) + args[5:]
    clear()
    child = "\\n".join([
        "import ctypes, os, pickle, sys",
        "import dlbridge as dlb",
        "fake = ctypes.CDLL(os.environ['DLB_FAKE_LIB'])",
        "fake.dlb_fake_cuda_log_text.restype = ctypes.c_char_p",
        "fn, bad, data = pickle.loads(sys.stdin.buffer.read())",
        "try:",
        "    fn(*bad)",
        "except ValueError as e:",
        "    print('REFUSED', e)",
        "log = fake.dlb_fake_cuda_log_text().decode()",
        "print('OPENED-FOR-BAD', 'cuIpcOpenMemHandle' in log)",
        "t = pickle.loads(data)",
        "print('LOADED', t.strides, t.tolist())"])
    p = subprocess.run([sys.executable, "-c", child],
                       input=pickle.dumps((fn, too_long, data)), capture_output=True)
    out = p.stdout.decode()
    assert p.returncode == 0, out + p.stderr.decode()
    assert "REFUSED" in out and "OPENED-FOR-BAD False" in out, out
    assert "LOADED (-1,) [7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.0]" in out, out
    ''')


def test_share_cuda_without_ipc_entry_points():
    run('''
    fake.dlb_fake_cuda_hide.argtypes = [ctypes.c_char_p]
    fake.dlb_fake_cuda_hide(b"cuIpcGetMemHandle")   # before the driver loads
    x = dlb.zeros((4,), device="cuda:0")             # everything else works
    assert x.tolist() == [0.0] * 4
    try:
        dlb.share(x)
    except BufferError as e:
        assert "no IPC entry points" in str(e), e
    else:
        raise AssertionError("shared without IPC")
    assert fake.dlb_fake_cuda_live_allocations() == 1   # x only: nothing leaked
    ''')


# ---- CuPy arrays: read through __cuda_array_interface__ ---------------------------------------------

def test_cupy_arrays_are_read_through_cai_with_dlpack_for_what_cai_cannot_say():
    run('''
    class FakeCupy:
        """What dlbridge sees of a CuPy ndarray: both protocols."""
        def __init__(self, t, cai, dlpack_ok=True):
            self.t, self.cai, self.dlpack_ok = t, cai, dlpack_ok
        @property
        def __cuda_array_interface__(self):
            return self.cai
        def __dlpack__(self, **kw):
            if not self.dlpack_ok:   # CuPy 14's garbled negative strides
                raise AssertionError("__dlpack__ must not be asked")
            return self.t.__dlpack__(**kw)
        def __dlpack_device__(self):
            return self.t.__dlpack_device__()
    FakeCupy.__module__ = "cupy._core.core"   # the registry's "cupy"
    # negative strides: the interface's byte strides are used, __dlpack__ is not
    t = dlb.from_dlpack(np.arange(8, dtype=np.float32), device="cuda:0")
    rev = {"shape": (8,), "typestr": "<f4", "version": 3, "stream": None,
           "data": (t.data_ptr + 7 * 4, False), "strides": (-4,)}
    v = dlb.from_dlpack(FakeCupy(t, rev, dlpack_ok=False))
    assert v.strides == (-1,) and v.device == "cuda:0", v.strides
    assert host(v).tolist() == list(range(7, -1, -1))
    # bfloat16: "<V2" in the interface names no dtype; __dlpack__ does
    b = dlb.zeros((3,), dtype="bfloat16", device="cuda:0")
    bf = {"shape": (3,), "typestr": "<V2", "version": 3, "stream": None,
          "data": (b.data_ptr, False), "strides": None}
    w = dlb.from_dlpack(FakeCupy(b, bf))
    assert w.dtype == "bfloat16" and w.data_ptr == b.data_ptr
    ''')
