"""The framework kits (see _kits_base): one per framework the doctor and
the bench know, in the registry's order.

``kits()`` is the table.  A framework's limitations (``limits_of``) are
its kit's, then what the registry already says about it
(``_registry_limits``), so no fact is written twice.
``$DLBRIDGE_DOCTOR_KITS`` names a module whose ``KITS`` (a list of Kit
instances) join the table: the tests' stand-ins for frameworks that crash
or hang, and a way to try a new peer before it has a kit here.
"""

import importlib
import os

from ._frameworks import REGISTRY
from ._kits_base import (FP8_DTYPES, STRIDED, Kit, Limit, Unavailable,
                         sliced)
from ._kits_peers import PEER_KITS

EXTRA_KITS_ENV = "DLBRIDGE_DOCTOR_KITS"
_MOVED = STRIDED + ("offset",)   # layouts that are a view into more memory


def limits_of(name):
    """The upstream limitations of framework ``name``: its kit's, then
    those its registry entry records."""
    kit = kits().get(name)
    return (kit.limits if kit else ()) + _registry_limits(name)


def _registry_limits(name):
    """The limitations the registry entry of ``name`` records."""
    fw = REGISTRY.get(name)
    if fw is None:
        return ()
    out = []
    if not fw.negative_strides:
        out.append(Limit(f"{name} tensors cannot have negative strides",
                         layouts=("negative",), copyable=True))
    if not fw.readonly:
        out.append(Limit(f"{name} tensors cannot be read-only",
                         read_only=True, copyable=True))
    if fw.layout == "row-major":
        out.append(Limit(f"{name} imports only compact row-major data",
                         layouts=STRIDED, copyable=True))
    elif fw.layout == "dense":
        out.append(Limit(f"{name} imports only compact data (in any "
                         "dimension order)",
                         layouts=tuple(l for l in STRIDED if l != "transposed"),
                         copyable=True))
    if fw.dtypes is not None:
        out.append(Limit(f"{name} has no such dtype",
                         when=lambda cell: cell["dtype"] not in fw.dtypes))
    return tuple(out)


# ------------------------------------------------------------------ kits

class NumPy(Kit):
    name = module = "numpy"
    bench = True
    own_label = "np.from_dlpack({})"

    def make(self, np, a, dtype, layout):
        if dtype == "bfloat16" or dtype in FP8_DTYPES:
            # ml_dtypes' arrays of them cannot be exported through DLPack
            raise Unavailable(f"NumPy has no {dtype} dtype")
        ref = sliced(a, layout)
        obj = ref
        if layout == "read-only":
            obj = ref.copy()
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
              "aborts the process on them", layouts=("negative",),
              copyable=True),
        Limit("torch tensors cannot be read-only: torch.from_dlpack returns a "
              "writable tensor over read-only memory", read_only=True,
              copyable=True),
    )

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
        Limit("jax.dlpack.from_dlpack copies transposed data",
              layouts=("transposed",), outcomes=("copied",)),
        Limit("jax.dlpack.from_dlpack copies data that is not 64-byte aligned",
              outcomes=("copied",),
              when=lambda cell: cell.get("source_alignment", 64) < 64),
        Limit("JAX imports only compact data (or a transposition of it)",
              layouts=STRIDED, copyable=True),
        Limit("JAX imports through the legacy capsule, which cannot say "
              "read-only", read_only=True, copyable=True),
        Limit("jax.dlpack.from_dlpack cannot place paddle's CPU tensors "
              "(\"device_from_local_hardware_id(): incompatible function "
              "arguments\")", partner="paddle", paths=("own",)),
    )

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
    short = "tf"
    bench = True
    own_label = "tf_from_dlpack({}.__dlpack__())"
    limits = (
        Limit("TensorFlow's DLPack has no float8 dtypes (import: "
              "\"Unsupported Type Codes: 10\")", dtypes=FP8_DTYPES),
        Limit("TensorFlow imports through the legacy capsule, which cannot "
              "say read-only", read_only=True, copyable=True),
        Limit("TensorFlow refuses a DLPack byte_offset (\"must be zero\"), "
              "which MLX's views set", layouts=("offset",), copyable=True),
    )

    def make(self, np, a, dtype, layout):
        import tensorflow as tf
        if layout in _MOVED or layout == "read-only":
            raise Unavailable("TensorFlow tensors are always compact and immutable")
        if dtype in FP8_DTYPES:
            raise Unavailable("TensorFlow cannot export float8 through DLPack "
                              "(\"DT_FLOAT8_E4M3FN is not supported by dlpack\")")
        with tf.device("/CPU:0"):
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
    # a producer (1-D Arrow arrays, read-only) and a consumer
    # (pyarrow.Tensor.from_dlpack, what dlbridge.convert(x, "pyarrow")
    # returns)
    name = module = "pyarrow"
    bench = True
    own_label = "pa.Tensor.from_dlpack({})"

    def read_only(self, layout):
        return True     # Arrow arrays are immutable, exported READ_ONLY

    def make(self, np, a, dtype, layout):
        import pyarrow as pa
        if a.ndim != 1 and layout != "contiguous" or layout == "read-only":
            raise Unavailable("PyArrow exports only 1-D arrays")
        if dtype == "bool":
            raise Unavailable("PyArrow's booleans are bit-packed, which "
                              "DLPack cannot describe")
        if dtype == "bfloat16" or dtype in FP8_DTYPES or dtype.startswith("complex"):
            raise Unavailable(f"PyArrow has no {dtype} arrays")
        flat = a.ravel()
        return pa.array(flat), flat

    def own_importer(self, dtype="float32"):
        import pyarrow as pa
        return pa.Tensor.from_dlpack

    def writable(self, result):
        # a Tensor over read-only memory says so (is_mutable False)
        return bool(getattr(result, "is_mutable", False))

    def op(self):
        import pyarrow.compute as pc
        return "pc.add(a, b)", "add(a, b)", {"add": pc.add}


class Paddle(Kit):
    name, module = "paddle", "paddle"
    bench = True
    own_label = "paddle.from_dlpack({})"
    limits = (
        Limit("loading TensorFlow, then paddle, in one process crashes "
              "(SIGSEGV)", role="either", partner="tensorflow",
              outcomes=("crashed",)),
        Limit("paddle.from_dlpack ignores DLPack's byte_offset: it reads the "
              "wrong elements of a producer that sets one (MLX's views)",
              layouts=_MOVED, outcomes=("wrong",), paths=("own",)),
        Limit("paddle.from_dlpack needs compact data", layouts=STRIDED,
              copyable=True),
        Limit("paddle.from_dlpack returns a writable tensor over read-only "
              "memory", read_only=True, copyable=True),
    )

    def make(self, np, a, dtype, layout):
        import paddle
        if layout in _MOVED or layout == "read-only":
            raise Unavailable("paddle tensors made here are compact and writable")
        if dtype == "bfloat16":
            raise Unavailable("paddle cannot export bfloat16 through DLPack")
        if a.dtype.kind == "u" and a.dtype.itemsize > 1:
            raise Unavailable(f"paddle has no {dtype}")
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
    short = "tvm-ffi"
    own_label = "tvm_ffi.from_dlpack({})"
    limits = (
        Limit("tvm_ffi.from_dlpack returns a writable tensor over read-only "
              "memory, or asks for a legacy capsule, which cannot say "
              "read-only", read_only=True, copyable=True),
    )

    def make(self, np, a, dtype, layout):
        import tvm_ffi
        if layout in _MOVED or layout == "read-only":
            raise Unavailable("tvm-ffi tensors are made here from compact "
                              "NumPy arrays")
        if dtype == "bfloat16" or dtype in FP8_DTYPES:
            raise Unavailable(f"NumPy has no {dtype} to make a tvm-ffi tensor from")
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
        if dtype == "bfloat16" or dtype in FP8_DTYPES:
            # NumPy cannot export these: the bytes go into a dlbridge
            # tensor of that dtype directly.
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
            raise Unavailable("dlbridge CUDA tensors are made here from "
                              "compact NumPy arrays")
        return dlbridge.from_dlpack(np.ascontiguousarray(ref),
                                    device="cuda:0"), ref

    def own_importer(self, dtype="float32"):
        import dlbridge
        return dlbridge.from_dlpack

    def writable(self, result):
        return not result.readonly


_KITS = (NumPy(), Torch(), CuPy(), JAX(), TensorFlow(), PyArrow(), Paddle(),
         TVMFFI(), Dlbridge()) + PEER_KITS


def kits():
    """{name: Kit}: the frameworks that have a kit, the registry's in its
    order (dlbridge among them), then peers the registry does not know yet
    (_kits_peers.py), then the kits of ``$DLBRIDGE_DOCTOR_KITS``'s module."""
    order = list(REGISTRY)

    def place(kit):
        return (kit.name == "dlbridge",
                order.index(kit.name) if kit.name in order else len(order))
    table = {k.name: k for k in sorted(_KITS, key=place)}
    extra = os.environ.get(EXTRA_KITS_ENV)
    if extra:
        for k in importlib.import_module(extra).KITS:
            table[k.name] = k
    return table


def short_name(name):
    """The name of framework ``name`` (or "name:cuda") for narrow columns."""
    base, _, device = name.partition(":")
    kit = kits().get(base)
    return ((kit.short if kit and kit.short else base)
            + (":" + device if device else ""))


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
