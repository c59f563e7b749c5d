"""Run a snippet in a child interpreter so a crash or hang in dlbridge
cannot take pytest down; the child inherits PYTHONPATH and
DLB_EXAMPLE_KERNELS from os.environ."""
import os
import pathlib
import subprocess
import sys
import textwrap

PRELUDE = """
import gc, os, sys, ctypes, weakref
import numpy as np
import dlbridge as dlb
KERNELS = os.environ.get("DLB_EXAMPLE_KERNELS")
"""


ROOT = pathlib.Path(__file__).resolve().parents[2]


def child_env():
    """os.environ, plus DLB_EXAMPLE_KERNELS pointing at the Meson build's
    kernels library when the caller did not set it (as conftest's `lib`
    fixture finds it), so Function snippets fail only for real reasons, and
    this directory on PYTHONPATH (the snippets' struct mirrors come from
    dlpack_ctypes)."""
    env = dict(os.environ)
    here = str(pathlib.Path(__file__).resolve().parent)
    env["PYTHONPATH"] = os.pathsep.join(
        [p for p in (env.get("PYTHONPATH"), here) if p])
    if not env.get("DLB_EXAMPLE_KERNELS"):
        for build in ("build", "build-sanitize"):
            p = ROOT / build / "libdlb_example_kernels.so"
            if p.exists():
                env["DLB_EXAMPLE_KERNELS"] = str(p)
                break
    return env


def run(code, timeout=60, prelude=True, pre=""):
    src = (PRELUDE if prelude else "") + pre + textwrap.dedent(code)
    try:
        p = subprocess.run([sys.executable, "-c", src], capture_output=True,
                           text=True, timeout=timeout, env=child_env())
    except subprocess.TimeoutExpired:
        raise AssertionError("child hung (> %d s)" % timeout) from None
    return p


def check(code, expect="OK", timeout=60, pre=""):
    """The child must exit 0 and print `expect` as its last line; `pre`
    (unindented helper source such as CAPSULE) runs before `code`."""
    p = run(code, timeout, pre=pre)
    tail = (p.stdout.strip().splitlines() or [""])[-1]
    assert p.returncode == 0 and tail == expect, (
        "rc=%d stdout=%r stderr=%s" % (p.returncode, p.stdout[-500:], p.stderr[-1500:]))
    return p


# A DLPack 1.x capsule over ctypes memory, for the child scripts:
# capsule(device_type, shape, data_address=None, code=2, bits=32) -> capsule
CAPSULE = """
from dlpack_ctypes import DLTensor as _T
class _M(ctypes.Structure):
    pass
_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_M))
_M._fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
               ("ctx", ctypes.c_void_p), ("deleter", _DELETER),
               ("flags", ctypes.c_uint64), ("dl_tensor", _T)]
_KEEP = []
_noop_deleter = _DELETER(lambda m: None)
_new = ctypes.pythonapi.PyCapsule_New
_new.restype = ctypes.py_object
_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
def capsule(device_type=1, shape=(4,), data_address=None, code=2, bits=32,
            device_id=0, flags=0):
    storage = (ctypes.c_float * 64)(*range(64))
    shp = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    m = _M()
    _KEEP.extend([storage, shp, m])
    m.major, m.minor = 1, 3
    m.deleter = _noop_deleter
    m.flags = flags
    t = m.dl_tensor
    t.data = ctypes.addressof(storage) if data_address is None else data_address
    t.device.device_type, t.device.device_id = device_type, device_id
    t.ndim = len(shape)
    t.dtype.code, t.dtype.bits, t.dtype.lanes = code, bits, 1
    t.shape = ctypes.cast(shp, ctypes.POINTER(ctypes.c_int64))
    return _new(ctypes.addressof(m), b"dltensor_versioned", None)
"""
