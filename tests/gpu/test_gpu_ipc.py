"""CUDA IPC on a real GPU (issue 10, item 4): dlb.share of a CUDA tensor,
pickled to another process, which maps the same device memory (no copy),
sees what the exporter queued before pickling (an interprocess event its
stream waits for, no host synchronisation in the exporter), and whose
writes the exporter sees.
"""

import os
import pickle
import subprocess
import sys

import numpy as np

from gpu_helpers import slow_fill

CHILD = r"""
import os, pickle, sys
import numpy as np
import torch
import dlbridge as dlb
torch.zeros(1, device="cuda:0")              # CUDA initialised before
print("READY", flush=True)                    # the pickle is even made
n = int(sys.stdin.buffer.readline())
t = pickle.loads(sys.stdin.buffer.read(n))
assert t.device == "cuda:0" and t.is_shared, t.device
x = dlb.convert(t, "torch")                 # zero-copy view of the mapping
print("VALUES", x[:4].tolist(), float(x.sum()))
x.fill_(7.0)                                 # the exporter must see this
torch.cuda.synchronize()
print("PTR", t.data_ptr == x.data_ptr())
"""


def _child(make_pickle):
    """Start the child, wait until it has CUDA up, then make the pickle
    (so work queued just before is still running when the child reads)
    and send it."""
    p = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=dict(os.environ))
    try:
        line = p.stdout.readline()
        assert line.startswith(b"READY"), line + p.stderr.read()
        data = make_pickle()
        assert len(data) < 1024            # a handle, not the data
        out, err = p.communicate(b"%d\n" % len(data) + data, timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    out = out.decode()
    assert p.returncode == 0, out + err.decode()
    return out


def test_shared_cuda_tensor_is_mapped_by_another_process(dlb, torch):
    src = torch.arange(1 << 20, dtype=torch.float32, device="cuda:0")
    s = dlb.share(src)
    assert s.is_shared and s.device == "cuda:0"
    assert s.data_ptr != src.data_ptr()
    out = _child(lambda: pickle.dumps(s, protocol=5))
    assert "VALUES [0.0, 1.0, 2.0, 3.0]" in out, out
    assert "PTR True" in out, out
    back = dlb.convert(s, "torch")
    torch.cuda.synchronize()
    assert bool((back == 7.0).all())


def test_importer_waits_for_work_queued_before_the_pickle(dlb, torch):
    """The exporter fills the shared tensor behind a ~0.1 s spin on a side
    stream and pickles at once under dlb.stream(that stream), with no host
    synchronisation: the importer's stream waits for the interprocess
    event, so it reads the filled values."""
    s = dlb.share(torch.zeros(1 << 20, device="cuda:0"))
    x = dlb.convert(s, "torch")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()

    def make():
        slow_fill(torch, x, 5.0, side)     # ~0.1 s on the GPU, returns at once
        with dlb.stream(side):
            return pickle.dumps(s, protocol=5)

    out = _child(make)
    assert "VALUES [5.0, 5.0, 5.0, 5.0] %s" % float(5 * (1 << 20)) in out, out


def test_same_process_unpickle_shares_memory(dlb, torch):
    s = dlb.share(torch.ones(16, device="cuda:0"))
    u = pickle.loads(pickle.dumps(s))
    assert u.data_ptr == s.data_ptr and u.is_shared
    assert np.asarray(u.copy(device="cpu")).tolist() == [1.0] * 16
