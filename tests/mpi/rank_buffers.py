"""Run under mpiexec (tests/python/test_scaleout_mpi.py): dlbridge tensors,
and through dlbridge.convert any framework's tensors, as mpi4py buffers --
point-to-point between ring neighbours and Allreduce, results checked on
every rank; then a shared tensor through the lowercase (pickle) methods and
a plain one through mpi4py.util.pkl5.  Exits non-zero (with a message) on the first wrong value."""

import sys

import numpy as np
from mpi4py import MPI

import dlbridge as dlb

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
N = 1000


def fail(msg):
    sys.stderr.write("rank %d: %s\n" % (rank, msg))
    sys.stderr.flush()
    comm.Abort(1)


def check(got, want, what):
    got = np.asarray(dlb.convert(got, "numpy"))
    if not np.array_equal(got, want):
        fail("%s: got %r..., want %r..." % (what, got.ravel()[:4], want.ravel()[:4]))


def makers():
    """(name, make(values) -> send buffer, empty(shape, dtype) -> receive buffer)."""
    out = [
        ("numpy", lambda v: v.copy(), lambda v: np.empty_like(v)),
        ("dlbridge", lambda v: dlb.from_dlpack(v.copy()),
         lambda v: dlb.empty(v.shape, dtype=v.dtype)),
        ("dlbridge-shared", lambda v: dlb.share(v),
         lambda v: dlb.share(np.empty_like(v))),
    ]
    try:
        import torch
        out.append(("torch", lambda v: torch.from_numpy(v.copy()),
                    lambda v: torch.empty(v.shape, dtype=getattr(torch, str(v.dtype)))))
        # torch tensors reach MPI as dlbridge Tensors through convert.
        out.append(("torch-via-convert",
                    lambda v: dlb.convert(torch.from_numpy(v.copy()), "dlbridge"),
                    lambda v: dlb.convert(torch.empty(v.shape, dtype=getattr(torch, str(v.dtype))),
                                          "dlbridge")))
    except ImportError:
        pass
    return out


for dtype in (np.float32, np.float64, np.int32):
    base = (np.arange(N) % 97).astype(dtype)
    for name, make, empty in makers():
        what = "%s %s" % (name, np.dtype(dtype).name)
        # point-to-point around a ring
        send = make(base + rank)
        recv = empty(base)
        dst, src = (rank + 1) % size, (rank - 1) % size
        comm.Sendrecv(send, dest=dst, recvbuf=recv, source=src)
        check(recv, base + src, what + " Sendrecv")
        # blocking Send/Recv pairs: even ranks send first
        recv2 = empty(base)
        if rank % 2 == 0:
            comm.Send(send, dest=dst)
            comm.Recv(recv2, source=src)
        else:
            comm.Recv(recv2, source=src)
            comm.Send(send, dest=dst)
        check(recv2, base + src, what + " Send/Recv")
        # Allreduce: sum over ranks
        out = empty(base)
        comm.Allreduce(send, out, op=MPI.SUM)
        check(out, base * size + sum(range(size)), what + " Allreduce")

# A read-only tensor can be sent but not received into.
ro = np.arange(4, dtype=np.float64)
ro.flags.writeable = False
t = dlb.from_dlpack(ro)
try:
    comm.Allreduce(MPI.IN_PLACE if False else t, t)
except (BufferError, TypeError, ValueError):
    pass
else:
    fail("a read-only tensor was accepted as a receive buffer")

# Lowercase (pickle) methods: a shared tensor goes as its handle, and rank 1
# writes into rank 0's pages (same node); mpi4py.util.pkl5 sends a plain
# tensor's data out of band.
if rank == 0:
    s = dlb.share(np.zeros(N, dtype=np.float64))
    comm.send(s, dest=1)
    comm.recv(source=1)  # rank 1 has written
    if np.asarray(dlb.convert(s, "numpy"))[7] != 42.0:
        fail("rank 1's write through the shared handle is not visible")
elif rank == 1:
    t = comm.recv(source=0)
    if not t.is_shared:
        fail("a shared tensor arrived as a copy")
    np.asarray(dlb.convert(t, "numpy"))[7] = 42.0
    comm.send("done", dest=0)
    del t

from mpi4py.util import pkl5  # noqa: E402

pcomm = pkl5.Intracomm(comm)
if rank == 0:
    pcomm.send(dlb.from_dlpack(np.arange(N, dtype=np.int64)), dest=1)
elif rank == 1:
    t = pcomm.recv(source=0)
    check(t, np.arange(N, dtype=np.int64), "pkl5 send/recv")

comm.Barrier()
if rank == 0:
    print("ok %d ranks" % size)
