"""dlbridge.share: tensors in POSIX shared memory, Tensor.is_shared, the
handle a shared tensor pickles as, the segment's lifetime across processes,
and cleanup after a crash."""

import gc
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dlbridge as dlb
from dlbridge import _core

SHM = "/dev/shm"


def segment_exists(name):
    return os.path.exists(os.path.join(SHM, name))


def test_share_copies_once_and_is_shared():
    a = np.arange(1000, dtype=np.float32)
    s = dlb.share(a)
    assert isinstance(s, dlb.Tensor) and s.is_shared
    assert s.data_ptr != a.__array_interface__["data"][0]
    assert not s.readonly and s.is_contiguous
    np.testing.assert_array_equal(np.from_dlpack(s), a)
    assert not dlb.from_dlpack(a).is_shared
    name, maps, in_flight = _core._shm_info(s)
    assert name.startswith("dlb-%d-" % os.getpid())
    assert (maps, in_flight) == (1, 0)
    assert segment_exists(name)


def test_share_of_shared_makes_no_copy():
    s = dlb.share(np.ones(16))
    assert dlb.share(s) is s
    torch = pytest.importorskip("torch")
    x = dlb.convert(s, "torch")
    s2 = dlb.share(x)  # a framework's view of shared memory: no copy
    assert s2.is_shared and s2.data_ptr == s.data_ptr
    assert _core._shm_info(s2)[1] == 1  # still one mapping
    del torch


@pytest.mark.parametrize("make", [
    lambda: np.arange(24, dtype=np.int16).reshape(4, 6)[:, ::2],
    lambda: np.array(3.5),
    lambda: np.zeros((0, 3)),
    lambda: np.arange(6, dtype=np.complex64),
])
def test_share_any_layout(make):
    a = make()
    s = dlb.share(a)
    assert s.shape == a.shape and s.is_shared
    np.testing.assert_array_equal(np.from_dlpack(s), a)
    r = pickle.loads(pickle.dumps(s))
    np.testing.assert_array_equal(np.from_dlpack(r), a)


def test_share_keeps_read_only():
    a = np.arange(4.0)
    a.flags.writeable = False
    s = dlb.share(a)
    assert s.readonly
    assert pickle.loads(pickle.dumps(s)).readonly


def test_share_rejects_non_tensors():
    with pytest.raises(TypeError):
        dlb.share("not a tensor")
    with pytest.raises(TypeError):
        dlb.share(None)


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_handle_pickles_small_and_maps_same_pages(protocol):
    s = dlb.share(np.zeros(1 << 20, dtype=np.uint8))
    bufs = []
    data = pickle.dumps(s, protocol=protocol,
                        **({"buffer_callback": bufs.append} if protocol >= 5 else {}))
    assert len(data) < 400 and bufs == []  # a handle, not the megabyte
    assert _core._shm_info(s)[2] == 1  # one handle in flight
    r = pickle.loads(data)
    assert r.is_shared and r.data_ptr != s.data_ptr  # a second mapping
    assert _core._shm_info(s)[1:] == (2, 0)  # adopted: mapped, not in flight
    np.from_dlpack(r)[123] = 77
    assert np.from_dlpack(s)[123] == 77


def test_lifetime_last_release_unlinks():
    s = dlb.share(np.arange(10))
    name = _core._shm_info(s)[0]
    r = pickle.loads(pickle.dumps(s))
    del s
    gc.collect()
    assert segment_exists(name)  # r still maps it
    del r
    gc.collect()
    assert not segment_exists(name)


def test_handle_in_flight_keeps_segment_then_late_open_fails():
    s = dlb.share(np.arange(10))
    name = _core._shm_info(s)[0]
    h = pickle.dumps(s)
    del s
    gc.collect()
    assert segment_exists(name)  # the handle in flight keeps it
    r = pickle.loads(h)
    assert r.tolist() == list(range(10))
    del r
    gc.collect()
    assert not segment_exists(name)  # adopted, then released
    with pytest.raises(ValueError, match="gone"):
        pickle.loads(h)  # a second load after everyone let go


@pytest.mark.parametrize("args", [
    ("../etc/passwd", 0, (2, 32, 1), (1,), (1,), 0),
    ("dlb-1-1-zz", 0, (2, 32, 1), (1,), (1,), 0),
    (b"dlb-1-1-1", 0, (2, 32, 1), (1,), (1,), 0),
    ("dlb-1-1-1", 0, (2, 32, 1), (1,), (1,), 0),  # no such segment
])
def test_hostile_handles(args):
    with pytest.raises(ValueError):
        _core._rebuild_shared(*args)


def test_hostile_handle_layouts():
    s = dlb.share(np.zeros(4, dtype=np.float32))
    name = _core._shm_info(s)[0]
    bad = [
        (name, 0, (2, 32, 1), (5,), (1,), 0),          # past the end
        (name, 8, (2, 32, 1), (4,), (1,), 0),          # offset + size too big
        (name, -8, (2, 32, 1), (1,), (1,), 0),
        (name, 1 << 40, (2, 32, 1), (1,), (1,), 0),
        (name, 0, (2, 32, 1), (2,), (-1,), 0),         # before the data
        (name, 0, (2, 32, 1), (1 << 62, 4), (4, 1), 0),
        (name, 0, (2, 32, 1), (2,), (1, 1), 0),
        (name, 0, (2, 31, 1), (2,), (1,), 0),
    ]
    for args in bad:
        with pytest.raises(ValueError):
            _core._rebuild_shared(*args)
    assert _core._shm_info(s)[1:] == (1, 0)  # failed opens left no mapping
    with pytest.raises(TypeError):
        _core._rebuild_shared(name, 0)


def test_truncated_segment_is_refused_before_mapping():
    """A segment shrunk by some process of the same user: loading a handle
    is a ValueError naming the truncation, read from the file before any
    page is mapped, and the handle stays in flight (docs/decisions.md,
    section 13: a reader that mapped it before the shrink is not saved)."""
    s = dlb.share(np.zeros(1 << 16, dtype=np.uint8))
    name = _core._shm_info(s)[0]
    h = pickle.dumps(s)
    size = os.stat(os.path.join(SHM, name)).st_size
    with open(os.path.join(SHM, name), "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(ValueError, match="was truncated"):
        pickle.loads(h)
    assert _core._shm_info(s)[1:] == (1, 1)
    with open(os.path.join(SHM, name), "r+b") as f:
        f.truncate(size)  # grown back (zeros past the cut): loads again
    r = pickle.loads(h)
    assert r.is_shared and r.nbytes == s.nbytes


@pytest.mark.parametrize("index", [
    np.s_[::-1], np.s_[::-3], np.s_[5:1:-2],
])
def test_negative_stride_view_of_shared_tensor_round_trips(index):
    """A reversed view of a shared tensor is shared, pickles as a handle
    whose element 0 is not the lowest address, and loads (issue 15)."""
    s = dlb.share(np.arange(12.0))
    want = np.from_dlpack(s)[index]
    v = dlb.from_dlpack(want)
    assert v.is_shared and v.strides[0] < 0
    r = pickle.loads(pickle.dumps(v))
    assert r.is_shared and r.strides == v.strides and r.tolist() == want.tolist()
    # 2-D, both axes reversed
    s2 = dlb.share(np.arange(12.0).reshape(3, 4))
    w = np.from_dlpack(s2)[::-1, ::-2]
    r2 = pickle.loads(pickle.dumps(dlb.from_dlpack(w)))
    assert r2.tolist() == w.tolist()


def test_failed_load_leaves_the_handle_loadable():
    """A load that reached the segment and failed gives its handle back: the
    segment, held only by that handle, stays, and the handle loads
    afterwards (issue 15; the failed load used to consume it and unlink the
    segment)."""
    s = dlb.share(np.arange(8.0))
    name = _core._shm_info(s)[0]
    fn, args = s.__reduce_ex__(2)  # one handle in flight
    del s
    gc.collect()
    assert segment_exists(name)
    too_long = args[:3] + ((9,), (1,)) + args[5:]
    with pytest.raises(ValueError, match="needs 72 bytes"):
        fn(*too_long)
    assert segment_exists(name)
    t = fn(*args)
    assert t.tolist() == list(range(8)) and _core._shm_info(t)[1:] == (1, 0)
    del t
    gc.collect()
    assert not segment_exists(name)


def test_out_of_file_descriptors_is_an_oserror_that_says_why():
    """Each live shared tensor keeps one file descriptor open: running out of
    them in share() or while loading a handle is OSError(EMFILE) saying so,
    not a RuntimeError (issue 15)."""
    res = _run("""
        import errno, os, pickle, resource
        import numpy as np, dlbridge as dlb
        h = pickle.dumps(dlb.share(np.arange(4.0)))
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE,
                           (len(os.listdir("/proc/self/fd")) + 8, hard))
        keep = []
        try:
            for _ in range(64):
                keep.append(dlb.share(np.arange(4.0)))
        except OSError as e:
            assert type(e) is OSError and e.errno == errno.EMFILE, repr(e)
            assert "each live shared tensor holds one" in str(e), e
            assert str(e).startswith("[Errno 24] share(): "), e
        else:
            raise AssertionError("no error")
        try:
            pickle.loads(h)
        except OSError as e:
            assert e.errno == errno.EMFILE, repr(e)
        else:
            raise AssertionError("no error")
        del keep
        assert pickle.loads(h).tolist() == [0.0, 1.0, 2.0, 3.0]
        print("OK")
    """, env={**os.environ})
    assert res.returncode == 0 and "OK" in res.stdout, res.stdout + res.stderr


def test_deepcopy_does_not_alias():
    import copy
    s = dlb.share(np.arange(4.0))
    d = copy.deepcopy(s)
    assert not d.is_shared and d.tolist() == s.tolist()


def test_device_tensors_refused_with_reasons(tp):
    # The test producer describes memory on any device without touching it.
    cuda = tp.Producer(shape=(4,), dtype=(2, 32, 1), device=(2, 0))
    # CUDA tensors are shared through CUDA IPC (test_cuda_fake.py); without
    # a CUDA driver here that is refused, naming what is missing.
    import ctypes
    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("a CUDA driver is installed here")
    except OSError:
        pass
    with pytest.raises(BufferError, match="share\\(\\): .*CUDA driver"):
        dlb.share(cuda)
    other = tp.Producer(shape=(4,), dtype=(2, 32, 1), device=(4, 0))  # OpenCL
    with pytest.raises(BufferError, match="cannot be put in shared memory"):
        dlb.share(other)


def _run(code, env=None, timeout=60):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=timeout,
                          env=env)


# What a program's module globals hold when it ends normally (issue 15): a
# shared Tensor, another framework's view of one (the docs' own example
# keeps both), the view alone.  Each process's segments must be gone from
# /dev/shm once it has exited.
EXIT_GLOBALS = {
    "tensor": "s = dlb.share(np.arange(1000.0))",
    "numpy-view": "s = dlb.share(np.arange(1000.0)); v = dlb.convert(s, 'numpy')",
    "numpy-view-only": "v = dlb.convert(dlb.share(np.arange(1000.0)), 'numpy')",
    "torch-view": "import torch; s = dlb.share(np.arange(1000.0)); "
                  "v = dlb.convert(s, 'torch')",
    "torch-view-only": "import torch; "
                       "v = dlb.convert(dlb.share(np.arange(1000.0)), 'torch')",
}


@pytest.mark.parametrize("case", sorted(EXIT_GLOBALS))
def test_normal_exit_releases_segments_of_live_globals(case):
    if "torch" in case:
        pytest.importorskip("torch")
    res = _run("""
        import os, numpy as np, dlbridge as dlb
        %s
        prefix = "dlb-%%d-" %% os.getpid()
        print(" ".join(n for n in os.listdir("/dev/shm") if n.startswith(prefix)))
    """ % EXIT_GLOBALS[case], env={**os.environ})
    assert res.returncode == 0, res.stderr
    names = res.stdout.split()
    assert len(names) == 1, res.stdout  # the child made one, alive at exit
    assert not segment_exists(names[0])


# A long-lived creator and multiprocessing pools whose workers load shared
# tensors, keep them, and end with os._exit() -- forkserver and fork pool
# workers never release what they hold (issue 15).  Each step checks which
# of the creator's segments are left while it runs; the test then checks
# that none is left once it has exited.
POOL_CREATOR = """
import gc, multiprocessing as mp, os, sys
import numpy as np, dlbridge as dlb
from dlbridge import _core

KEEP = []

def keep(t):  # a worker keeps what it loaded until it ends, with os._exit
    KEEP.append(t)
    return float(np.from_dlpack(t).sum())

def mine():
    prefix = "dlb-%d-" % os.getpid()
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))

def name(t):
    return _core._shm_info(t)[0]

if __name__ == "__main__":
    ctx = mp.get_context(sys.argv[1])
    # 1. Workers load and keep the tensor (initializer and tasks); the pool
    #    ends; the creator's release then finds nobody left: gone at once.
    s = dlb.share(np.arange(1000.0))
    pool = ctx.Pool(2, initializer=keep, initargs=(s,))
    assert pool.map(keep, [s] * 4) == [499500.0] * 4
    pool.close()
    pool.join()
    del pool, s  # the pool keeps its initargs
    gc.collect()
    assert mine() == [], ("released after the workers ended", mine())
    # 2. Released while the workers still hold it: kept; once they are gone,
    #    the creator's cleanup (share() runs it at most once a second)
    #    removes it.
    t = dlb.share(np.arange(10.0))
    t_name = name(t)
    pool = ctx.Pool(2)
    assert pool.map(keep, [t] * 4) == [45.0] * 4
    del t
    gc.collect()
    assert mine() == [t_name], ("held by live workers", mine())
    pool.close()
    pool.join()
    _core._shm_cleanup()
    assert mine() == [], ("cleanup after the workers ended", mine())
    # 3. The same, with the workers gone only after the creator's last
    #    share(): its exit removes it.  And a shared tensor alive at exit.
    u = dlb.share(np.arange(20.0))
    pool = ctx.Pool(1)
    assert pool.map(keep, [u]) == [190.0]
    names = [name(u)]
    del u
    gc.collect()
    pool.close()
    pool.join()
    alive = dlb.share(np.arange(5.0))
    names.append(name(alive))
    print(" ".join(names))
"""


@pytest.mark.parametrize("method", ["forkserver", "fork"])
def test_pool_workers_ending_with_os_exit_leave_no_segment(method, tmp_path):
    script = tmp_path / "creator.py"
    script.write_text(POOL_CREATOR)
    res = subprocess.run([sys.executable, str(script), method],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ})
    assert res.returncode == 0, res.stdout + res.stderr
    names = res.stdout.split()
    assert len(names) == 2, res.stdout
    assert not any(segment_exists(n) for n in names), names


def test_other_process_writes_are_visible():
    s = dlb.share(np.zeros(8, dtype=np.int64))
    h = pickle.dumps(s).hex()
    res = _run("""
        import pickle, numpy as np, dlbridge
        t = pickle.loads(bytes.fromhex(%r))
        np.from_dlpack(t)[:] = np.arange(8) * 3
    """ % h, env={**os.environ})
    assert res.returncode == 0, res.stderr
    assert np.from_dlpack(s).tolist() == [i * 3 for i in range(8)]
    assert _core._shm_info(s)[1:] == (1, 0)  # the child's mapping is gone


def test_crashed_creator_is_cleaned_up():
    res = _run("""
        import os, pickle, numpy as np, dlbridge as dlb
        from dlbridge import _core
        s = dlb.share(np.arange(5))
        unmapped = dlb.share(np.arange(6))
        h = pickle.dumps(unmapped)   # in flight, never opened
        print(_core._shm_info(s)[0], _core._shm_info(unmapped)[0], flush=True)
        os._exit(3)                  # crash: nothing released
    """, env={**os.environ})
    assert res.returncode == 3, res.stderr
    names = res.stdout.split()
    assert all(segment_exists(n) for n in names)
    held = pickle.loads(pickle.dumps(None))  # noqa: F841
    removed = _core._shm_cleanup()
    assert removed >= 2
    assert not any(segment_exists(n) for n in names)


def _our_segments():
    prefix = "dlb-%d-" % os.getpid()
    return sorted(n for n in os.listdir(SHM) if n.startswith(prefix))


def _alloc_sweep(op):
    """op() with the core allocator refusing the k-th allocation, k = 0, 1,
    ...: it succeeds or raises MemoryError, and leaves no core block and no
    segment behind."""
    op()
    gc.collect()
    base, segments = _core._allocation_stats()["live"], _our_segments()
    for k in range(100):
        _core._fail_allocations(k)
        try:
            res = op()
            outcome = "ok"
        except MemoryError:
            res, outcome = None, "MemoryError"
        finally:
            stats = _core._allocation_stats()
            _core._reset_allocations()
        del res
        gc.collect()
        assert _core._allocation_stats()["live"] == base, (op, k)
        assert _our_segments() == segments, (op, k)
        if stats["failed"] == 0:
            assert outcome == "ok" and k > 0
            return k
    pytest.fail("still allocating after 100 steps")


def test_allocation_failures_share_and_pickle():
    a = np.arange(100, dtype=np.float32)
    s = dlb.share(a)
    h = pickle.dumps(s)
    plain = dlb.from_dlpack(a)

    def share():
        return dlb.share(a)

    pending = []  # pickles whose load failed: still in flight, loadable

    def handle_round_trip():
        data = pickle.dumps(s)
        pending.append(data)
        r = pickle.loads(data)
        pending.remove(data)
        assert r.tolist() == s.tolist()
        return r

    def pickle5_round_trip():
        bufs = []
        d = pickle.dumps(plain, protocol=5, buffer_callback=bufs.append)
        return pickle.loads(d, buffers=bufs)

    def in_band_round_trip():
        return pickle.loads(pickle.dumps(plain, protocol=4))

    for op in (share, handle_round_trip, pickle5_round_trip, in_band_round_trip):
        _alloc_sweep(op)
    # The first pickle's handle is still in flight, and so is each whose
    # load failed for want of memory: load them, and all is freed.
    assert pending
    name = _core._shm_info(s)[0]
    assert _core._shm_info(s)[2] == 1 + len(pending)
    loaded = [pickle.loads(d) for d in [h] + pending]
    assert all(r.tolist() == s.tolist() for r in loaded)
    del loaded, s
    gc.collect()
    assert not segment_exists(name)
