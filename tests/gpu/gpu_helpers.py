"""What the GPU tests need to know about each framework, in one place:
how to make a device array holding given values, where its element 0 is,
how to read it back to the host, how the framework consumes another
object (its own from_dlpack, or __cuda_array_interface__), and what to pass
as dlbridge.convert's `to` to get one.

Every framework is reached through a pytest fixture (conftest.py) that
skips when it is missing; an adapter is built from the fixture's module.
"""

import glob
import os
import pathlib

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# scripts/gpu-check sets this: no GPU is then a failure, not a skip.
REQUIRED = os.environ.get("DLB_GPU_REQUIRED") == "1"


def _probe_gpu():
    """(torch module or None, why there is no GPU or None)."""
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken CUDA build of torch
        return None, "torch is not importable (%s)" % exc
    try:
        if not torch.cuda.is_available():
            return None, "torch sees no CUDA device"
    except Exception as exc:
        return None, "torch.cuda.is_available() failed (%s)" % exc
    return torch, None


TORCH, NO_GPU = _probe_gpu()


def kernels_lib():
    """libdlb_example_kernels.so (the examples' host kernels: saxpy, matmul,
    batch.c's, dlb_kernel_record): $DLB_EXAMPLE_KERNELS (set by
    scripts/gpu-check), else build/'s, else another build-*/'s; skips when
    none is built."""
    path = os.environ.get("DLB_EXAMPLE_KERNELS")
    if path and os.path.exists(path):
        return path
    hits = [str(ROOT / "build" / "libdlb_example_kernels.so")]
    hits += sorted(glob.glob(str(ROOT / "build-*" / "libdlb_example_kernels.so")))
    hits = [h for h in hits if os.path.exists(h)]
    if not hits:
        pytest.skip("libdlb_example_kernels.so not built")
    return hits[0]

# torch.cuda._sleep(cycles) spins one thread on the GPU: at ~2 GHz this is
# ~0.1 s, far longer than any launch or driver call the tests make, so a
# consumer that is not ordered after it reads the old value.
SLEEP_CYCLES = 200_000_000


def sample(shape=(6, 35), dtype="float32"):
    """Distinct, exactly representable values."""
    n = int(np.prod(shape))
    return (np.arange(n, dtype=np.float64) * 0.5 - 7).astype(dtype).reshape(shape)


def slow_fill(torch, x, value, stream):
    """On `stream`: spin ~0.1 s, then fill x with value.  Returns at once."""
    with torch.cuda.stream(stream):
        torch.cuda._sleep(SLEEP_CYCLES)
        x.fill_(value)


def element_strides(shape, strides_bytes, itemsize):
    if strides_bytes is None:  # C-contiguous
        out, s = [], 1
        for n in reversed(shape):
            out.append(s)
            s *= n
        return tuple(reversed(out))
    return tuple(s // itemsize for s in strides_bytes)


def _cupy_or_none():
    try:
        import cupy
        return cupy
    except ImportError:
        return None


class Adapter:
    """One framework.  `zero_copy_in`: whether its importer promises to share
    the memory it is given (JAX does not: it may copy, see JaxAdapter)."""

    name = None
    zero_copy_in = True

    def make(self, host):            # device array with host's values
        raise NotImplementedError

    def ptr(self, obj):              # device address of element 0
        raise NotImplementedError

    def to_numpy(self, obj):
        raise NotImplementedError

    def consume(self, obj):          # the framework's own importer
        raise NotImplementedError

    def target(self):                # dlbridge.convert's `to`
        return self.name

    def is_instance(self, obj):
        raise NotImplementedError


class TorchAdapter(Adapter):
    name = "torch"

    def __init__(self, torch):
        self.torch = torch

    def make(self, host):
        return self.torch.from_numpy(np.ascontiguousarray(host)).to("cuda:0")

    def ptr(self, obj):
        return obj.data_ptr()

    def to_numpy(self, obj):
        return obj.cpu().numpy()

    def consume(self, obj):
        return self.torch.from_dlpack(obj)

    def is_instance(self, obj):
        return isinstance(obj, self.torch.Tensor) and obj.is_cuda


class CupyAdapter(Adapter):
    name = "cupy"

    def __init__(self, cupy):
        self.cp = cupy

    def make(self, host):
        return self.cp.asarray(host)

    def ptr(self, obj):
        return obj.data.ptr

    def to_numpy(self, obj):
        return self.cp.asnumpy(obj)

    def consume(self, obj):
        return self.cp.from_dlpack(obj)

    def is_instance(self, obj):
        return isinstance(obj, self.cp.ndarray)


class JaxAdapter(Adapter):
    """jax.dlpack.from_dlpack shares aligned compact GPU memory in practice,
    but JAX documents no such promise (and copies what it cannot take), so
    its imports are checked for values and the sharing is only recorded."""

    name = "jax"
    zero_copy_in = False

    def __init__(self, jax):
        import jax.dlpack  # noqa: F401
        self.jax = jax
        self.device = jax.devices("gpu")[0]

    def make(self, host):
        return self.jax.device_put(np.ascontiguousarray(host), self.device)

    def ptr(self, obj):
        return obj.unsafe_buffer_pointer()

    def to_numpy(self, obj):
        return np.asarray(obj)

    def consume(self, obj):
        return self.jax.dlpack.from_dlpack(obj)

    def is_instance(self, obj):
        return isinstance(obj, self.jax.Array)


class NumbaAdapter(Adapter):
    """numba-cuda device arrays: produce and consume
    __cuda_array_interface__ (v3)."""

    name = "numba"

    def __init__(self, cuda):
        self.cuda = cuda
        from numba.cuda.cudadrv.devicearray import DeviceNDArray
        self.type = DeviceNDArray

    def make(self, host):
        return self.cuda.to_device(np.ascontiguousarray(host))

    def ptr(self, obj):
        return obj.__cuda_array_interface__["data"][0]

    def to_numpy(self, obj):
        if obj.is_c_contiguous() or not _cupy_or_none():
            return obj.copy_to_host()
        # numba copies a strided array's whole span; CuPy reads any strides
        # (including negative ones) through the same CAI.
        cp = _cupy_or_none()
        return cp.asnumpy(cp.asarray(obj))

    def consume(self, obj):
        return self.cuda.as_cuda_array(obj)

    def target(self):
        return self.type

    def is_instance(self, obj):
        return isinstance(obj, self.type)


class SmvAdapter(Adapter):
    """cuda.core StridedMemoryView: a consumer of DLPack and CAI; a DLPack
    producer only in releases that have StridedMemoryView.__dlpack__.  A
    view has no values of its own to read, so they are read through CuPy
    from (ptr, shape, strides); without CuPy the value checks skip."""

    name = "cuda.core"

    def __init__(self, smv_type, torch, cupy=None):
        self.type = smv_type
        self.torch = torch
        self.cp = cupy
        self._keep = []

    @property
    def produces(self):
        return hasattr(self.type, "__dlpack__")

    def make(self, host):
        if not self.produces:
            pytest.skip("this cuda.core's StridedMemoryView is not a DLPack "
                        "producer")
        owner = self.torch.from_numpy(np.ascontiguousarray(host)).to("cuda:0")
        self._keep.append(owner)
        return self.consume(owner)

    def ptr(self, obj):
        return obj.ptr

    def to_numpy(self, obj):
        if self.cp is None:
            pytest.skip("reading a StridedMemoryView's values needs CuPy")
        cp = self.cp
        dtype = np.dtype(obj.dtype)
        shape = tuple(obj.shape)
        strides = obj.strides
        estr = (element_strides(shape, None, 1) if strides is None
                else tuple(strides))
        lo = sum(min(0, (n - 1) * s) for n, s in zip(shape, estr) if n)
        hi = sum(max(0, (n - 1) * s) for n, s in zip(shape, estr) if n)
        span = (hi - lo + 1) * dtype.itemsize
        mem = cp.cuda.UnownedMemory(obj.ptr + lo * dtype.itemsize, span, obj)
        arr = cp.ndarray(shape, dtype, cp.cuda.MemoryPointer(mem, -lo * dtype.itemsize),
                         strides=tuple(s * dtype.itemsize for s in estr))
        return cp.asnumpy(arr)

    def consume(self, obj):
        # stream_ptr=-1: no ordering asked (the tests synchronise first);
        # None is refused by cuda.core as ambiguous.
        if hasattr(self.type, "from_dlpack") and hasattr(obj, "__dlpack__"):
            return self.type.from_dlpack(obj, stream_ptr=-1)
        if hasattr(self.type, "from_cuda_array_interface") and \
                hasattr(obj, "__cuda_array_interface__"):
            return self.type.from_cuda_array_interface(obj, stream_ptr=-1)
        return self.type(obj, stream_ptr=-1)

    def target(self):
        return self.type

    def is_instance(self, obj):
        return isinstance(obj, self.type)


class DlbAdapter(Adapter):
    name = "dlbridge"

    def __init__(self, dlb):
        self.dlb = dlb

    def make(self, host):
        return self.dlb.from_dlpack(np.ascontiguousarray(host),
                                    device="cuda:0", copy=True)

    def ptr(self, obj):
        return obj.data_ptr

    def to_numpy(self, obj):
        return np.asarray(obj.copy(device="cpu"))

    def consume(self, obj):
        return self.dlb.from_dlpack(obj)

    def is_instance(self, obj):
        return isinstance(obj, self.dlb.Tensor)


FRAMEWORKS = ["torch", "cupy", "jax", "numba", "cuda.core", "dlbridge"]


def adapter(request, name):
    """The adapter for `name`, its framework fixture resolved through
    `request` (skips when the framework is missing)."""
    get = request.getfixturevalue
    if name == "torch":
        return TorchAdapter(get("torch"))
    if name == "cupy":
        return CupyAdapter(get("cupy"))
    if name == "jax":
        return JaxAdapter(get("jax"))
    if name == "numba":
        return NumbaAdapter(get("numba_cuda"))
    if name == "cuda.core":
        try:
            cp = get("cupy")
        except pytest.skip.Exception:
            cp = None
        return SmvAdapter(get("smv_type"), get("torch"), cp)
    if name == "dlbridge":
        return DlbAdapter(get("dlb"))
    raise ValueError(name)


def device_bytes(cupy, ptr, nbytes):
    """nbytes at device address ptr, copied to the host with the CUDA
    runtime directly (no framework's idea of dtype or layout involved)."""
    out = np.empty(nbytes, np.uint8)
    if nbytes:
        cupy.cuda.runtime.memcpy(out.ctypes.data, ptr, nbytes,
                                 cupy.cuda.runtime.memcpyDeviceToHost)
    return out.tobytes()
