"""bench_scaleout.py -- bytes/s for one 64 MiB tensor crossing a process
boundary, dlbridge against NumPy through the same engines.

Paths:
  pickle-5 out-of-band  dumps(protocol=5, buffer_callback) + loads(buffers)
  pickle in-band        dumps(protocol=4) + loads: the bytes go through the
                        pickle stream
  shared memory         dlbridge: share() (the one copy) + handle pickled and
                        loaded; NumPy: multiprocessing.shared_memory, copy
                        in, attach by name, ndarray over it
  shm handle only       pickling and loading an existing shared tensor's
                        handle (NumPy: attaching a SharedMemory by name)
  mp queue              multiprocessing Queue to a spawned process and a
                        small acknowledgement back (NumPy and a plain Tensor
                        go in band; a shared Tensor goes as its handle)
  MPI Send/Recv         mpi4py between 2 ranks on loopback (mpiexec), buffer
                        protocol, numpy array vs dlbridge Tensor

Each figure is the best of several runs.  Informational: exit status 0
whatever the figures; `--quick` runs fewer repetitions.
"""

import gc
import multiprocessing
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from multiprocessing import shared_memory

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
try:
    import dlbridge as dlb
except ImportError:  # run from a source tree after `make build`
    sys.path.insert(0, os.path.join(ROOT, "build", "stage"))
    import dlbridge as dlb

QUICK = "--quick" in sys.argv
REPS = 3 if QUICK else 7
NBYTES = 64 << 20


def best(fn, reps=REPS):
    """Best wall time of reps calls of fn (after one warm-up)."""
    fn()
    times = []
    for _ in range(reps):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def pickle5(obj):
    bufs = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
    return pickle.loads(data, buffers=bufs)


def in_band(obj):
    return pickle.loads(pickle.dumps(obj, protocol=4))


def np_shm(a):
    seg = shared_memory.SharedMemory(create=True, size=a.nbytes)
    try:
        np.ndarray(a.shape, a.dtype, buffer=seg.buf)[...] = a
        other = shared_memory.SharedMemory(name=seg.name)
        view = np.ndarray(a.shape, a.dtype, buffer=other.buf)
        del view
        other.close()
    finally:
        seg.close()
        seg.unlink()


def dlb_shm(t):
    s = dlb.share(t)
    r = pickle.loads(pickle.dumps(s))
    del r, s


def _echo(q_in, q_out):
    while True:
        item = q_in.get()
        if item is None:
            return
        q_out.put(len(pickle.dumps(0)))  # a small acknowledgement
        del item


def queue_times(objs):
    ctx = multiprocessing.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_echo, args=(q_in, q_out))
    p.start()
    try:
        out = {}
        for name, obj in objs.items():
            def once(obj=obj):
                q_in.put(obj)
                q_out.get(timeout=120)
            out[name] = best(once)
        q_in.put(None)
        p.join(30)
        return out
    finally:
        if p.is_alive():
            p.kill()


MPI_RANK = r"""
import json, time, sys
import numpy as np
from mpi4py import MPI
import dlbridge as dlb
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
n = %(n)d
res = {}
for name, make in (("numpy", lambda: np.ones(n, np.uint8)),
                   ("dlbridge", lambda: dlb.from_dlpack(np.ones(n, np.uint8)))):
    buf = make()
    times = []
    for i in range(%(reps)d + 1):
        comm.Barrier()
        t0 = time.perf_counter()
        if rank == 0:
            comm.Send(buf, dest=1)
            comm.Recv(buf[:1] if name == "numpy" else np.empty(1, np.uint8), source=1)
        else:
            comm.Recv(buf, source=0)
            comm.Send(np.ones(1, np.uint8), dest=0)
        times.append(time.perf_counter() - t0)
    res[name] = min(times[1:])
if rank == 0:
    print("MPI " + json.dumps(res))
"""


def mpi_times():
    exe = shutil.which("mpiexec")
    if exe is None:
        return None, "mpiexec not found"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None, "mpi4py not installed"
    env = dict(os.environ, OMPI_MCA_btl_tcp_if_include="lo",
               OMPI_MCA_oob_tcp_if_include="lo",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(MPI_RANK % {"n": NBYTES, "reps": REPS})
    try:
        res = subprocess.run([exe, "--oversubscribe", "--allow-run-as-root", "-n", "2",
                              sys.executable, f.name], capture_output=True, text=True,
                             timeout=300, env=env)
    except subprocess.TimeoutExpired:
        return None, "mpiexec timed out"
    finally:
        os.unlink(f.name)
    for line in res.stdout.splitlines():
        if line.startswith("MPI "):
            import json
            return json.loads(line[4:]), None
    return None, (res.stderr.strip().splitlines() or ["mpiexec failed"])[-1]


def main():
    a = np.ones(NBYTES // 4, dtype=np.float32)
    t = dlb.from_dlpack(a.copy())
    rows = []  # (path, numpy seconds, dlbridge seconds)
    rows.append(("pickle-5 out-of-band", best(lambda: pickle5(a)), best(lambda: pickle5(t))))
    rows.append(("pickle in-band (protocol 4)", best(lambda: in_band(a)),
                 best(lambda: in_band(t))))
    rows.append(("shared memory (copy in + map)", best(lambda: np_shm(a)),
                 best(lambda: dlb_shm(t))))
    s = dlb.share(t)
    seg = shared_memory.SharedMemory(create=True, size=a.nbytes)

    def np_attach():
        other = shared_memory.SharedMemory(name=seg.name)
        np.ndarray(a.shape, a.dtype, buffer=other.buf)
        other.close()
    try:
        rows.append(("shm handle only (no data)", best(np_attach),
                     best(lambda: pickle.loads(pickle.dumps(s)))))
    finally:
        seg.close()
        seg.unlink()
    q = queue_times({"numpy": a, "dlbridge": t, "shared": s})
    rows.append(("mp queue, in band", q["numpy"], q["dlbridge"]))
    rows.append(("mp queue, dlbridge shared handle", q["numpy"], q["shared"]))
    mpi, why = mpi_times()
    if mpi is not None:
        rows.append(("MPI Send/Recv, 2 ranks", mpi["numpy"], mpi["dlbridge"]))

    print("64 MiB tensor, best of %d; GB/s = 2^30 bytes/s" % REPS)
    print("%-36s %12s %12s %10s" % ("path", "numpy GB/s", "dlbridge GB/s", "dlb/numpy"))
    for name, tn, td in rows:
        gn, gd = NBYTES / tn / 2**30, NBYTES / td / 2**30
        print("%-36s %12.2f %12.2f %10.2f" % (name, gn, gd, gd / gn))
    if mpi is None:
        print("MPI Send/Recv: skipped (%s)" % why)


if __name__ == "__main__":
    main()
