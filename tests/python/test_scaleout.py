"""Engines moving 64 MiB tensors of every framework between processes:
multiprocessing (Queue and Pool), Dask distributed (LocalCluster with worker
processes) and Ray (local).  Each test counts the copies: a shared tensor
travels as a handle of well under a kilobyte and the worker's writes show in
the sender's memory (zero data copies by the engine and by dlbridge); a
pickle-5 tensor leaves as exactly one out-of-band buffer that IS the
tensor's memory and is rebuilt over the buffer the engine hands back
(dlbridge copies nothing; the engine's own transport copies are its own)."""

import gc
import importlib
import multiprocessing
import os
import pickle
import subprocess
import sys
import textwrap
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest

import dlbridge as dlb
from dlbridge import _core

sys.path.insert(0, os.path.dirname(__file__))
import _scaleout_workers as W  # noqa: E402

FRAMEWORKS = ["numpy", "dlbridge", "torch", "jax", "tensorflow", "pyarrow"]
HANDLE_MAX = 1024  # bytes a shared tensor's pickle may take


def available(framework):
    if framework in ("numpy", "dlbridge"):
        return True
    try:
        importlib.import_module(framework)
        return True
    except ImportError:
        return False


@pytest.fixture(scope="module")
def base():
    return W.base_array()


@pytest.fixture(scope="module")
def tensors(base):
    """framework -> a 64 MiB tensor of it (the frameworks installed here)."""
    return {f: W.make(f, base) for f in FRAMEWORKS if available(f)}


@pytest.fixture(autouse=True)
def worker_path(monkeypatch):
    # Worker processes (spawned) must import dlbridge and the worker module.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in sys.path if p))


def data_ptr(t):
    return dlb.from_dlpack(t).data_ptr


# ---- multiprocessing -------------------------------------------------------


def _queue_worker(q_in, q_out):
    while True:
        item = q_in.get()
        if item is None:
            return
        t, mark = item
        q_out.put(W.inspect(t, mark))
        del t, item


def test_multiprocessing_queue_shared(tensors, base):
    ctx = multiprocessing.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_queue_worker, args=(q_in, q_out))
    p.start()
    names = []
    try:
        for i, (name, x) in enumerate(tensors.items()):
            s = dlb.share(x)  # dlbridge's one copy, into shared memory
            assert s.is_shared and s.nbytes == W.NBYTES
            # What the queue's pickler writes into the pipe: the handle only.
            # (Load it back: a handle pickled and never loaded keeps the
            # segment until its creator exits -- docs/scale-out.md.)
            h = ForkingPickler.dumps(s)
            assert len(h) < HANDLE_MAX
            pickle.loads(h)
            names.append(_core._shm_info(s)[0])
            mark = 1000.0 + i
            q_in.put((s, mark))
            info = q_out.get(timeout=60)
            assert info["is_shared"] and info["size"] == W.NBYTES // 4, name
            assert info["head"] == float(base[:1000].sum()), name
            if s.readonly:  # jax, pyarrow export read-only memory
                assert info["readonly"], name
            else:
                # Written by the worker, seen here: the same pages.
                assert np.asarray(dlb.convert(s, "numpy"))[W.MARK_AT] == mark, name
            del s
        q_in.put(None)
        p.join(30)
        assert p.exitcode == 0
        gc.collect()
        # Every segment was released by both sides: none is left behind.
        assert not any(os.path.exists("/dev/shm/" + nm) for nm in names)
    finally:
        if p.is_alive():
            p.kill()


def test_multiprocessing_pool_returns_shared():
    ctx = multiprocessing.get_context("spawn")
    n = W.NBYTES // 8
    with ctx.Pool(2) as pool:
        results = pool.starmap_async(
            W.shared_full, [(n, 1.5), (n, 2.5), (n, 3.5)]).get(timeout=60)
    # The workers dropped their tensors (and exited) while the handles were
    # in flight; the in-flight count kept the segments for us.
    names = []
    for r, v in zip(results, (1.5, 2.5, 3.5)):
        assert r.is_shared and r.shape == (n,)
        a = np.asarray(dlb.convert(r, "numpy"))
        assert a[0] == v and a[-1] == v
        name, maps, in_flight = _core._shm_info(r)
        assert in_flight == 0
        names.append(name)
    del results, r, a
    gc.collect()
    # Pool.terminate may kill a worker between sending its result and
    # dropping it, leaving its mapping counted; the flock it held died with
    # it, so cleanup (run by share() at most once a second) frees the rest.
    _core._shm_cleanup()
    assert not any(os.path.exists("/dev/shm/" + nm) for nm in names)


def _pool_checksum(t):
    return W.inspect(t)


def test_multiprocessing_pool_in_band(tensors, base):
    # Without shared memory a pool pickles in band (protocol 4, no
    # buffer_callback): one copy into the pickle, as for NumPy, nothing more.
    t = dlb.from_dlpack(tensors["numpy"])
    in_band = len(ForkingPickler.dumps(t))
    assert W.NBYTES <= in_band < W.NBYTES + HANDLE_MAX
    assert in_band - len(ForkingPickler.dumps(tensors["numpy"])) < HANDLE_MAX
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        info = pool.apply_async(_pool_checksum, (t,)).get(timeout=60)
    assert info["head"] == float(base[:1000].sum())
    assert not info["readonly"]


# ---- pickle-5 accounting, engine-independent --------------------------------


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_pickle5_adds_no_copy(framework, tensors):
    if framework not in tensors:
        pytest.skip("%s is not installed" % framework)
    t = dlb.from_dlpack(tensors[framework])  # a view, no copy
    bufs = []
    data = pickle.dumps(t, protocol=5, buffer_callback=bufs.append)
    assert len(bufs) == 1 and len(data) < HANDLE_MAX  # no data bytes in band
    raw = bufs[0].raw()
    assert raw.nbytes == W.NBYTES
    assert np.frombuffer(raw, np.uint8).__array_interface__["data"][0] == t.data_ptr
    r = pickle.loads(data, buffers=bufs)
    assert r.data_ptr == t.data_ptr and r.readonly == t.readonly


# ---- Dask distributed -------------------------------------------------------


@pytest.fixture(scope="module")
def dask_client():
    distributed = pytest.importorskip("distributed")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True,
        dashboard_address=None, worker_dashboard_address=None,
        memory_limit=0, silence_logs=40)
    client = distributed.Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


def test_dask_serialization_adds_no_copy(tensors):
    pytest.importorskip(
        "distributed", reason="Dask distributed is not installed "
        "(requirements/test.txt pins distributed==2026.8.0)")
    from distributed.protocol import deserialize, serialize
    for name, x in tensors.items():
        t = dlb.from_dlpack(x)
        header, frames = serialize(t)
        assert header["serializer"] == "pickle", name
        big = [f for f in frames if memoryview(f).nbytes >= W.NBYTES]
        small = sum(memoryview(f).nbytes for f in frames if memoryview(f).nbytes < W.NBYTES)
        assert len(big) == 1 and small < HANDLE_MAX, name
        frame_ptr = np.frombuffer(memoryview(big[0]).cast("B"), np.uint8) \
            .__array_interface__["data"][0]
        assert frame_ptr == t.data_ptr, name  # the frame IS the tensor
        r = deserialize(header, frames)
        assert r.data_ptr == frame_ptr, name  # rebuilt over the frame


@pytest.mark.filterwarnings("ignore:Sending large graph")
def test_dask_cluster_moves_every_framework(dask_client, tensors, base):
    head = float(base[:1000].sum())
    for i, (name, x) in enumerate(tensors.items()):
        # pickle-5 route: the worker gets the values.
        t = dlb.from_dlpack(x)
        info = dask_client.submit(W.inspect, t, pure=False).result(timeout=60)
        assert info["head"] == head and info["size"] == W.NBYTES // 4, name
        # shared-memory route: a handle, and the worker writes our pages.
        s = dlb.share(x)
        mark = 500.0 + i
        info = dask_client.submit(W.inspect, s, mark, pure=False).result(timeout=60)
        assert info["is_shared"] and info["head"] == head, name
        if not s.readonly:
            assert np.asarray(dlb.convert(s, "numpy"))[W.MARK_AT] == mark, name
        del s, t


# ---- Ray ----------------------------------------------------------------------

RAY_SCRIPT = r"""
import os, sys, json
import numpy as np
import ray
import dlbridge as dlb
sys.path.insert(0, %(here)r)
import _scaleout_workers as W
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
         configure_logging=False, object_store_memory=400 * W.MIB)
inspect = ray.remote(W.inspect)
base = W.base_array()
head = float(base[:1000].sum())
out = {}
for name in %(frameworks)r:
    try:
        x = W.make(name, base)
    except ImportError:
        continue
    t = dlb.from_dlpack(x)
    ref = ray.put(t)
    a, b = ray.get(ref), ray.get(ref)
    # Both gets rebuild over the same read-only object-store buffer: dlbridge
    # copies nothing; the store refuses writes.
    same = a.data_ptr == b.data_ptr and a.data_ptr != t.data_ptr
    info = ray.get(inspect.remote(ref))
    s = dlb.share(x)
    sinfo = ray.get(inspect.remote(s, 7.0))
    seen = bool(s.readonly) or float(np.asarray(dlb.convert(s, "numpy"))[W.MARK_AT]) == 7.0
    out[name] = dict(same=same, readonly=a.readonly, head=info["head"] == head,
                     shared=sinfo["is_shared"], seen=seen)
print("RESULT " + json.dumps(out))
ray.shutdown()
"""


def test_ray_local():
    try:
        import ray  # noqa: F401
    except ImportError:
        pytest.skip("ray is not installed (requirements/test.txt pins ray==2.60.0)")
    code = RAY_SCRIPT % {"here": os.path.dirname(os.path.abspath(__file__)),
                         "frameworks": FRAMEWORKS}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
               RAY_USAGE_STATS_ENABLED="0")
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True,
                             text=True, timeout=55, env=env)
    except subprocess.TimeoutExpired:
        pytest.skip("ray could not start a local cluster here within 55 s")
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
    if res.returncode != 0 and not lines:
        if "ray" in res.stderr.lower() and "Traceback" not in res.stderr[-2000:]:
            pytest.skip("ray could not start here: %s" % res.stderr[-500:])
        pytest.fail(res.stdout[-2000:] + res.stderr[-4000:])
    import json
    out = json.loads(lines[-1][len("RESULT "):])
    assert "numpy" in out and "dlbridge" in out
    for name, r in out.items():
        assert r == dict(same=True, readonly=True, head=True, shared=True, seen=True), name
