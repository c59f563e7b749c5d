"""The framework kits (see _kits_base): one per framework the doctor and
the bench know, in the registry's order.

``kits()`` is the table.  A kit's limitations start with what the registry
already says about the framework (``_registry_limits``), so no fact is
written twice.  ``DLBRIDGE_DOCTOR_KITS`` names a module whose ``KITS`` (a
list of Kit instances) join the table: the tests' stand-ins for frameworks
that crash or hang, and a way to try a new peer before it has a kit here.
"""

import importlib
import os

from ._frameworks import REGISTRY
from ._kits_base import (FP8_DTYPES, STRIDED, Kit, Limit, Unavailable,
                         sliced)

EXTRA_KITS_ENV = "DLBRIDGE_DOCTOR_KITS"
_MOVED = STRIDED + ("offset",)   # layouts that are a view into more memory


def _registry_limits(name):
    """The limitations the registry entry of ``name`` records."""
    fw = REGISTRY.get(name)
    if fw is None:
        return ()
    out = []
    if not fw.negative_strides:
        out.append(Limit(f"{name} tensors cannot have negative strides",
                         layouts=("negative",)))
    if not fw.readonly:
        out.append(Limit(f"{name} tensors cannot be read-only",
                         layouts=("read-only",)))
    if fw.compact_only:
        aligned = (f", {fw.alignment}-byte aligned" if fw.alignment else "")
        out.append(Limit(f"{name} imports only compact row-major{aligned} data",
                         layouts=_MOVED))
    if fw.dtypes is not None:
        out.append(Limit(f"{name} cannot hold this dtype (it holds "
                         + ", ".join(sorted(fw.dtypes)) + ")",
                         when=lambda cell: cell["dtype"] not in fw.dtypes))
    return tuple(out)


# ------------------------------------------------------------------ kits

class NumPy(Kit):
    name = module = "numpy"
    bench = True
    own_label = "np.from_dlpack({})"
    limits = (
        Limit("NumPy has no bfloat16 dtype (an ml_dtypes bfloat16 array "
              "cannot be exported either)", role="either", dtypes=("bfloat16",)),
        Limit("NumPy has no float8 dtypes (np.from_dlpack refuses them; an "
              "ml_dtypes float8 array cannot be exported either)",
              role="either", dtypes=FP8_DTYPES),
    )

    def make(self, np, a, dtype, layout):
        ref = sliced(a, layout)
        if dtype == "bfloat16" or dtype in FP8_DTYPES:
            try:
                import ml_dtypes
            except ImportError:
                raise Unavailable("no ml_dtypes") from None
            obj = ref.view(getattr(ml_dtypes, dtype))
        else:
            obj = ref.copy() if layout == "read-only" else ref
        if layout == "read-only":
            obj.setflags(write=False)
        return obj, ref

    def own_importer(self, dtype="float32"):
        import numpy
        return numpy.from_dlpack

    def writable(self, result):
        return bool(result.flags.writeable)

    def op(self):
        import numpy
        return "np.add(a, b, out=c)", "add(a, b, out=c)", {"add": numpy.add}


def _torch_view(t, dtype):
    import torch
    if dtype == "bfloat16":
        return t.view(torch.bfloat16)
    if dtype in FP8_DTYPES:
        if not hasattr(torch, dtype):
            raise Unavailable(f"torch {torch.__version__} has no {dtype}")
        return t.view(getattr(torch, dtype))
    return t


class Torch(Kit):
    name = module = "torch"
    bench = True
    cuda = True
    own_label = "torch.from_dlpack({})"
    limits = (
        Limit("torch tensors cannot have negative strides; torch.from_dlpack "
              "aborts the process on them", layouts=("negative",)),
    ) + _registry_limits("torch")

    def make(self, np, a, dtype, layout):
        import torch
        if layout == "negative":
            raise Unavailable("torch tensors cannot have negative strides")
        if layout == "read-only":
            raise Unavailable("torch tensors cannot be read-only")
        t = _torch_view(torch.from_numpy(a), dtype)
        return sliced(t, layout), sliced(a, layout)

    def make_cuda(self, np, a, dtype, layout):
        import torch
        if layout in ("negative", "read-only") or dtype in FP8_DTYPES:
            raise Unavailable("not on CUDA")
        t = _torch_view(torch.from_numpy(a).to("cuda:0"), dtype)
        return sliced(t, layout), sliced(a, layout)

    def own_importer(self, dtype="float32"):
        import torch
        return torch.from_dlpack

    def op(self):
        import torch
        return "torch.add(a, b, out=c)", "add(a, b, out=c)", {"add": torch.add}


class CuPy(Kit):
    name = module = "cupy"
    cpu, cuda = False, True
    own_label = "cupy.from_dlpack({})"
    limits = _registry_limits("cupy")

    def make_cuda(self, np, a, dtype, layout):
        import cupy
        if dtype == "bfloat16" or dtype in FP8_DTYPES or layout == "read-only":
            raise Unavailable("CuPy has no such array")
        return sliced(cupy.asarray(a), layout), sliced(a, layout)

    def own_importer(self, dtype="float32"):
        import cupy
        return cupy.from_dlpack


class JAX(Kit):
    name = module = "jax"
    bench = True
    cuda = True
    own_label = "jax.dlpack.from_dlpack({})"
    limits = (
        Limit("JAX imports only compact data (or a transposition of it); "
              "negative strides are refused", layouts=("negative",)),
        Limit("JAX arrays are always compact; strided inputs are refused or "
              "copied", layouts=_MOVED),
        Limit("JAX imports through the legacy capsule", layouts=("read-only",)),
    ) + _registry_limits("jax")

    def _put(self, np, a, dtype, layout, device):
        import jax
        import jax.numpy as jnp
        if layout in _MOVED or layout == "read-only":
            raise Unavailable("JAX arrays are always compact and immutable")
        if dtype in FP8_DTYPES and device != "cpu":
            raise Unavailable("float8 is probed on the CPU only")
        x = jax.device_put(a, jax.devices(device)[0])
        if dtype == "bfloat16" or dtype in FP8_DTYPES:
            x = x.view(getattr(jnp, dtype))
        return x, a

    def make(self, np, a, dtype, layout):
        return self._put(np, a, dtype, layout, "cpu")

    def make_cuda(self, np, a, dtype, layout):
        return self._put(np, a, dtype, layout, "gpu")

    def own_importer(self, dtype="float32"):
        import jax.dlpack
        return jax.dlpack.from_dlpack

    def writable(self, result):
        return False    # JAX arrays are immutable

    def op(self):
        import jax.numpy as jnp
        return "jnp.add(a, b)", "add(a, b)", {"add": jnp.add}


class TensorFlow(Kit):
    name = module = "tensorflow"
    bench = True
    own_label = "tf_from_dlpack({}.__dlpack__())"
    limits = (
        Limit("TensorFlow's DLPack has no float8 dtypes (\"DT_FLOAT8_E4M3FN "
              "is not supported by dlpack\"), either way", role="either",
              dtypes=FP8_DTYPES),
        Limit("TensorFlow imports through the legacy capsule, which cannot "
              "say read-only", layouts=("read-only",)),
    ) + _registry_limits("tensorflow")

    def make(self, np, a, dtype, layout):
        import tensorflow as tf
        if layout in _MOVED or layout == "read-only":
            raise Unavailable("TensorFlow tensors are always compact and immutable")
        with tf.device("/CPU:0"):
            if dtype in FP8_DTYPES:   # tf.bitcast has no float8: ml_dtypes'
                import ml_dtypes
                return tf.constant(a.view(getattr(ml_dtypes, dtype))), a
            x = tf.constant(a)
            return (tf.bitcast(x, tf.bfloat16) if dtype == "bfloat16" else x), a

    def own_importer(self, dtype="float32"):
        # TF's importer takes a capsule, not an object with __dlpack__.
        import tensorflow as tf
        tf_from_dlpack = tf.experimental.dlpack.from_dlpack
        return lambda obj: tf_from_dlpack(obj.__dlpack__())

    def writable(self, result):
        return False    # TensorFlow tensors are immutable

    def exportable(self, obj):
        import tensorflow as tf
        return tf.experimental.dlpack.to_dlpack(obj)

    def export(self, obj):
        try:
            self.exportable(obj)
        except Exception:
            pass

    def op(self):
        import tensorflow as tf
        return "tf.add(a, b)", "add(a, b)", {"add": tf.add}


class PyArrow(Kit):
    name = module = "pyarrow"
    bench = True
    no_importer = "PyArrow has no DLPack importer"
    convert_label = "pa.array(y)"
    limits = (Limit("PyArrow has no DLPack importer"),)

    def make(self, np, a, dtype, layout):
        import pyarrow as pa
        if (a.ndim != 1 and layout != "contiguous" or dtype == "bfloat16"
                or dtype in FP8_DTYPES or dtype.startswith("complex")):
            raise Unavailable("PyArrow exports only 1-D primitive arrays")
        flat = a.ravel()
        return pa.array(flat), flat

    def op(self):
        import pyarrow.compute as pc
        return "pc.add(a, b)", "add(a, b)", {"add": pc.add}

    def convert_reference(self):
        # No DLPack importer: convert is compared with PyArrow's own
        # (zero-copy) NumPy import.
        import pyarrow as pa
        return self.convert_label, pa.array


class Paddle(Kit):
    name, module = "paddle", "paddle"
    bench = True
    own_label = "paddle.from_dlpack({})"
    limits = (
        Limit("paddle and TensorFlow crash (SIGSEGV) when both are loaded "
              "in one process", role="either", partner="tensorflow"),
        Limit("paddle.from_dlpack needs compact data", layouts=_MOVED),
    ) + _registry_limits("paddle")

    def make(self, np, a, dtype, layout):
        import paddle
        if layout in _MOVED or layout == "read-only":
            raise Unavailable("compact tensors only")
        if dtype == "bfloat16" or a.dtype.kind == "u" and a.dtype.itemsize > 1:
            raise Unavailable("dtype not held")
        t = paddle.to_tensor(a, place=paddle.CPUPlace())
        if dtype in FP8_DTYPES:
            if not hasattr(paddle, dtype):
                raise Unavailable(f"paddle has no {dtype}")
            t = t.view(getattr(paddle, dtype))
        return t, a

    def own_importer(self, dtype="float32"):
        import paddle
        f = getattr(paddle, "from_dlpack", None)
        return f if f is not None else importlib.import_module(
            "paddle.utils.dlpack").from_dlpack

    def op(self):
        import paddle
        return "paddle.add(a, b)", "add(a, b)", {"add": paddle.add}


class TVMFFI(Kit):
    name = module = "tvm_ffi"
    own_label = "tvm_ffi.from_dlpack({})"

    def make(self, np, a, dtype, layout):
        import tvm_ffi
        if (layout in _MOVED or layout == "read-only" or dtype == "bfloat16"
                or dtype in FP8_DTYPES):
            raise Unavailable("made from a compact NumPy array only")
        return tvm_ffi.from_dlpack(a), a

    def own_importer(self, dtype="float32"):
        import tvm_ffi
        return tvm_ffi.from_dlpack


class Dlbridge(Kit):
    name = "dlbridge"
    cuda = True
    own_label = "dlbridge.from_dlpack({})"

    def make(self, np, a, dtype, layout):
        import dlbridge
        ref = sliced(a, layout)
        if dtype == "bfloat16":
            raise Unavailable("no bfloat16 source")
        if dtype in FP8_DTYPES:
            # NumPy cannot export float8: the bytes go into a dlbridge
            # float8 tensor directly.
            import ctypes
            t = dlbridge.empty(ref.shape, dtype)
            ctypes.memmove(t.data_ptr, ref.ctypes.data, ref.nbytes)
            return t, ref
        v = ref.copy() if layout == "read-only" else ref
        if layout == "read-only":
            v.setflags(write=False)
        return dlbridge.from_dlpack(v), ref

    def make_cuda(self, np, a, dtype, layout):
        import dlbridge
        ref = sliced(a, layout)
        if (dtype == "bfloat16" or dtype in FP8_DTYPES or layout in STRIDED
                or layout in ("offset", "read-only")):
            raise Unavailable("compact non-bfloat16 sources only")
        return dlbridge.from_dlpack(np.ascontiguousarray(ref),
                                    device="cuda:0"), ref

    def own_importer(self, dtype="float32"):
        import dlbridge
        return dlbridge.from_dlpack

    def writable(self, result):
        return not result.readonly


_KITS = (NumPy(), Torch(), CuPy(), JAX(), TensorFlow(), PyArrow(), Paddle(),
         TVMFFI(), Dlbridge())


def kits():
    """{name: Kit}: the registry's frameworks that have a kit, in its
    order, then the kits of ``$DLBRIDGE_DOCTOR_KITS``'s module."""
    order = list(REGISTRY)
    table = {k.name: k for k in sorted(
        _KITS, key=lambda k: order.index(k.name) if k.name in order else len(order))}
    extra = os.environ.get(EXTRA_KITS_ENV)
    if extra:
        for k in importlib.import_module(extra).KITS:
            table[k.name] = k
    return table


def version_of(name):
    """The installed version of framework ``name`` from its distribution's
    metadata (nothing imported): the kit's or the registry's distribution
    name, the name itself, then whatever distribution provides its
    top-level module (tensorflow-cpu for tensorflow, ...); "?" if none."""
    from importlib import metadata
    kit = kits().get(name)
    fw = REGISTRY.get(name)
    for dist in (kit and kit.dist, fw and fw.dist, name):
        if dist:
            try:
                return metadata.version(dist)
            except metadata.PackageNotFoundError:
                pass
    top = ((kit and kit.module) or name).split(".")[0]
    for dist in metadata.packages_distributions().get(top, ()):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "?"
