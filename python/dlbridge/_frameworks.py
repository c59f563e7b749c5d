"""The framework registry: the one list of frameworks dlbridge knows, and
what ``dlbridge.convert`` needs of each target.

``dlbridge.convert(obj, to, *, copy=None, device=None)`` is C
(``_core.convert``, src/python/convert.c): it asks this module once per
target (``_c_convert_target``) and keeps the answer -- the bound importer or
the framework's DLPack exchange table, and the rules below -- so a call
touches no Python here.  The rules, per target (the table in
docs/decisions.md, "convert"):

* ``to`` is a framework name (``FRAMEWORKS``), a type or an example object
  of the framework.  Types and objects are recognised by the root of
  ``type(x).__module__`` (``jaxlib`` counts as ``jax``, ``cupyx`` as
  ``cupy``).  Anything else is a ``ValueError`` listing the valid names.
  Dr.Jit picks its tensor type by dtype (``TensorXf`` for float32, ...); a
  Dr.Jit type passed as ``to`` is used exactly.
* No framework is imported until it is the target (or was already imported
  because one of its objects was passed in): importing dlbridge stays cheap.
* An object already of the target framework is returned as it is (unless
  ``copy=True`` or ``device=`` asks otherwise).
* ``copy=None`` shares memory whenever the target can hold it safely and
  otherwise copies into compact, 256-byte aligned, writable memory on the
  same device (on dlbridge's current stream); ``copy=False`` shares or raises
  ``BufferError`` saying why; ``copy=True`` always copies.  What a target
  cannot hold safely, each field of ``Framework``: read-only data in a
  framework whose tensors are writable (torch 2.13 silently returns a
  WRITABLE tensor over read-only memory; legacy-capsule importers cannot be
  told), negative strides where the importer aborts or mis-reads them,
  strided data where it takes compact data only, data less aligned than its
  kernels need.  A framework whose importer always copies (MLX on the CPU,
  Dr.Jit's scalar backend) makes the copy itself: ``copy=False`` is a
  ``BufferError`` for it.
* A dtype the target cannot hold (``bfloat16`` into NumPy), a device it has
  no backend for, or a rank it cannot have (0-d into Warp) is a
  ``BufferError`` naming the target whatever ``copy`` says: a copy would not
  help.  Any other refusal by the target's importer (one of its ``errors``)
  is re-raised as ``BufferError`` naming the target, chained to the
  framework's own exception.
"""

import functools
import importlib
import sys

from . import _core

__all__ = ["convert", "framework_of", "FRAMEWORKS", "REGISTRY"]

#: dlbridge.convert (C, src/python/convert.c).
convert = _core.convert

# How convert hands a tensor to a target (convert.c's target kinds).
TAKES_DLBRIDGE = 0   # the dlbridge.Tensor itself
TAKES_EXCHANGE = 1   # a managed tensor, through the type's DLPack exchange table
TAKES_NUMPY = 2      # an ndarray made through NumPy's C API over the memory
TAKES_OBJECT = 3     # importer(tensor), the tensor a dlbridge.Tensor
TAKES_CAPSULE = 4    # importer(capsule), a legacy "dltensor" capsule

# What convert reports as "<target> could not import ..." (BufferError).
_IMPORT_ERRORS = (BufferError, TypeError, ValueError, RuntimeError)


class Framework:
    """One entry of the framework registry: everything dlbridge knows about
    a framework, in one place.  The C extension asks this module (never a
    list of its own) and caches the answers: which framework a type belongs
    to (``_type_framework``), how to hand it a tensor and what it can hold
    (``_c_convert_target``)."""

    __slots__ = ("name", "roots", "dist", "target", "tensor_type", "takes",
                 "readonly", "negative_strides", "layout", "dtypes",
                 "alignment", "devices", "copies", "min_ndim", "objects",
                 "immutable", "read_buffer")

    def __init__(self, name, roots=None, dist=None, target=True,
                 tensor_type=None, takes=TAKES_OBJECT, readonly=False,
                 negative_strides=True, layout="strided", dtypes=None,
                 alignment=None, devices=None, copies=False, min_ndim=0,
                 objects=False, immutable=False, read_buffer=False):
        self.name = name
        #: root module names whose types belong to it
        self.roots = roots or (name,)
        #: distribution name (importlib.metadata), when not ``name``
        self.dist = dist or name
        #: whether ``convert`` offers it as a target
        self.target = target
        #: "module:attr" of the type of its tensors, when they have one (the
        #: C side reaches its DLPack exchange table through it; for an
        #: importer called with the object, TAKES_OBJECT, only objects of
        #: this type are returned as they are)
        self.tensor_type = tensor_type
        #: how convert hands it a tensor (TAKES_*)
        self.takes = takes
        #: whether its tensors can hold read-only memory safely (they say
        #: so, or cannot be written); else read-only data is copied
        self.readonly = readonly
        #: whether its importer takes negative strides; else they are copied
        self.negative_strides = negative_strides
        #: the strides its importer takes: "strided" (any), "dense"
        #: (compact in some dimension order: a transposition of compact
        #: data) or "row-major" (compact row-major only); other layouts are
        #: copied
        self.layout = layout
        #: the dtypes its tensors can hold (None: ask its importer)
        self.dtypes = dtypes
        #: the data alignment (bytes) its kernels need; less aligned data
        #: is copied into dlbridge's own (256-byte aligned) memory
        self.alignment = alignment
        #: DLPack device types it can hold, each mapped to the name of the
        #: framework's predicate saying whether this build has the backend
        #: (None: always); any other device is refused before the
        #: framework sees it.  None: no restriction known.
        self.devices = devices
        #: its importer copies every tensor (so copy=False is refused)
        self.copies = copies
        #: the fewest dimensions its tensors have
        self.min_ndim = min_ndim
        #: its importer takes any object with __dlpack__ (and no capsule):
        #: a NumPy array it can share as it is goes to it directly, as its
        #: own importer's caller would pass it, not through a
        #: dlbridge.Tensor
        self.objects = objects
        #: whether its arrays are immutable: a Function never writes into
        #: one (a ``mut`` argument's new value is returned instead)
        self.immutable = immutable
        #: whether a Function reads its arrays through their buffer protocol
        #: before ``__dlpack__``: zero-copy and read-only, on the host, and
        #: several times cheaper; what the buffer refuses (other devices,
        #: dtypes it has no format for) goes through ``__dlpack__``
        self.read_buffer = read_buffer

    def __repr__(self):
        return f"<dlbridge framework {self.name!r}>"


# dtypes each target's tensors can hold, where its importer would not say
# so itself (checked against numpy 2.x, torch 2.13, MLX 0.32, Dr.Jit 1.5).
_NUMPY_DTYPES = frozenset(
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 "
    "float16 float32 float64 complex64 complex128".split()
)
_TORCH_DTYPES = _NUMPY_DTYPES | frozenset(
    "bfloat16 complex32 float8_e4m3fn float8_e5m2 float8_e4m3fnuz "
    "float8_e5m2fnuz float8_e8m0fnu".split()
)
# MLX: mx.from_dlpack narrows float64 to float32 without a word, so
# convert names the dtype (mx.array(t, dtype=...)); these are MLX's.
_MLX_DTYPES = frozenset(
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 "
    "float16 float32 float64 bfloat16 complex64".split()
)
# pyarrow.Tensor's value types that DLPack names.
_ARROW_DTYPES = frozenset(
    "int8 int16 int32 int64 uint8 uint16 uint32 uint64 "
    "float16 float32 float64".split()
)
# Dr.Jit's tensor types, by dtype (it converts nothing implicitly).
_DRJIT_TENSORS = {
    "bool": "TensorXb", "int8": "TensorXi8", "int32": "TensorXi",
    "int64": "TensorXi64", "uint8": "TensorXu8", "uint32": "TensorXu",
    "uint64": "TensorXu64", "float16": "TensorXf16", "float32": "TensorXf",
    "float64": "TensorXf64",
}

#: The framework registry: the one list of frameworks in dlbridge (C and
#: Python).  Order is display order (CLI, doctor).  Facts behind each
#: entry: docs/decisions.md ("convert") and ../reference/peers.md.
REGISTRY = {fw.name: fw for fw in (
    # NumPy arrays say read-only; the ndarray is made over the memory
    # through NumPy's C API (what np.from_dlpack does, minus its capsule).
    Framework("numpy", tensor_type="numpy:ndarray", takes=TAKES_NUMPY,
              readonly=True, dtypes=_NUMPY_DTYPES),
    # torch 2.13's importer aborts the process on negative strides and
    # returns a writable tensor over read-only memory; it mis-handles
    # devices it has no backend for (an OpenCL tensor makes it run the
    # deleter without renaming the capsule, Metal and MAIA ones are
    # imported over a host address, CUDA without a CUDA build is an
    # AssertionError): only these reach it.
    Framework("torch", tensor_type="torch:Tensor", takes=TAKES_EXCHANGE,
              negative_strides=False, dtypes=_TORCH_DTYPES,
              devices={1: None, 2: "cuda", 10: "hip"}),
    Framework("cupy", roots=("cupy", "cupyx")),
    # JAX imports a legacy capsule (no read-only flag); it shares any
    # transposition of compact data, refuses other strides ("Only DLPack
    # tensors with trivial (compact) striding are supported") and copies
    # data not 64-byte aligned itself (dlbridge copies instead, so
    # copy=False can say so).  jax.Array's buffer export (jaxlib's
    # PyArray_bf_getbuffer) is read-only, waits for the array to be ready,
    # holds the buffer against deletion and donation while exported, and
    # refuses GPU arrays, bfloat16, fp8 and sub-byte types with BufferError.
    Framework("jax", roots=("jax", "jaxlib"), layout="dense",
              alignment=64, immutable=True, read_buffer=True),
    # TensorFlow's importer takes a legacy capsule and only compact
    # row-major data ("Invalid strides array from DLPack" otherwise); it
    # accepts data at any address, but its kernels check
    # Tensor::IsAligned() (64 bytes) and abort the process on the first op
    # over unaligned data; NumPy's small arrays are 16-byte aligned.
    Framework("tensorflow", dist="tensorflow-cpu", takes=TAKES_CAPSULE,
              layout="row-major", alignment=64, immutable=True),
    # PaddlePaddle 3.3's table imports strided data, but negative strides
    # make it allocate 2**64 bytes ("Fail to alloc memory").
    Framework("paddle", dist="paddlepaddle", tensor_type="paddle:Tensor",
              takes=TAKES_EXCHANGE, negative_strides=False),
    Framework("tvm_ffi", dist="apache-tvm-ffi", objects=True),
    # onnxruntime 1.32: legacy capsules, contiguous data only
    # ("IsContiguousTensor(...) was false").  The importers below take a
    # raw legacy capsule as readily as an object with __dlpack__: convert
    # hands them one, which spares them the protocol's method calls.
    Framework("onnxruntime", takes=TAKES_CAPSULE, layout="row-major"),
    # MLX 0.32 copies every import on its CPU backend and refuses negative
    # strides.  Its arrays are values in a lazy graph: writing one's buffer
    # would change expressions built from it before (q = p + 100), so a
    # Function never writes one (immutable, as JAX).
    Framework("mlx", takes=TAKES_CAPSULE, readonly=True,
              negative_strides=False, copies=True, dtypes=_MLX_DTYPES,
              immutable=True),
    # Warp 1.19: legacy capsules, zero-copy for any strides; its arrays
    # have at least one dimension.
    Framework("warp", dist="warp-lang", takes=TAKES_CAPSULE, min_ndim=1),
    # Open3D 0.20 (CPU build): legacy capsules, zero-copy for any strides.
    Framework("open3d", dist="open3d-cpu", takes=TAKES_CAPSULE),
    # Dr.Jit 1.5: exact dtype and C-contiguous layout; the LLVM backend
    # shares CPU memory, the scalar one copies (_c_convert_target says
    # which, per backend).
    # Not objects: TensorX<dtype>(ndarray) converts the dtype silently, a
    # capsule of the wrong dtype is refused.  Its arrays are traced values
    # (copy-on-write, lazily evaluated): immutable, as MLX's.
    Framework("drjit", takes=TAKES_CAPSULE, layout="row-major",
              dtypes=frozenset(_DRJIT_TENSORS), immutable=True),
    # NumPy underneath, read-only kept.
    Framework("array_api_strict", dist="array-api-strict", readonly=True,
              objects=True),
    # CUDA only: numba's device arrays (read over __cuda_array_interface__)
    # and cuda.core's StridedMemoryView (types under the "cuda" package)
    Framework("numba", readonly=True),
    Framework("cuda.core", roots=("cuda",), dist="cuda-core", readonly=True),
    # PyArrow 26: pyarrow.Tensor.from_dlpack takes any object with
    # __dlpack__ (a versioned capsule asked for: read-only kept, as a
    # Tensor that is not mutable); any strides but negative ones -- on any
    # dimension, extent 1 included ("negative strides not supported") --
    # and no bool, complex, bfloat16 or float8 ("unsupported DLPack type").
    # Its result is a pyarrow.Tensor: an Arrow array (1-D, read-only) is
    # one of its framework's objects too, yet no Tensor, so it is converted.
    Framework("pyarrow", tensor_type="pyarrow:Tensor", readonly=True,
              negative_strides=False, dtypes=_ARROW_DTYPES, objects=True),
    Framework("dlbridge", takes=TAKES_DLBRIDGE, readonly=True),
)}

#: The names ``convert`` accepts as ``to``.
FRAMEWORKS = tuple(fw.name for fw in REGISTRY.values() if fw.target)

# Root module name of a type -> the framework it belongs to.
_ROOTS = {root: fw.name for fw in REGISTRY.values() for root in fw.roots}


def _type_framework(tp):
    """The framework name of type ``tp``: the registry's name for the root
    of its ``__module__`` (``jaxlib`` counts as ``jax``), else that root
    itself ("builtins" when it has none).  Asked by the C handler cache once
    per type, which caches the answer for the type's life (weakly)."""
    module = getattr(tp, "__module__", None)
    if not isinstance(module, str):
        return "builtins"
    root = module.partition(".")[0]
    return _ROOTS.get(root, root)


# Graph compilers' placeholders for tensors, as (module, qualname) of a base
# class: a type with one of these on its MRO stands for a tensor that has no
# memory yet (a JAX tracer under jit/vmap/grad, a torch fake or functional
# tensor under torch.compile / FakeTensorMode, a TensorFlow symbolic tensor
# inside tf.function).  Matched by name so that nothing is imported.
_TRACED_BASES = frozenset({
    ("jax._src.core", "Tracer"),
    ("torch._subclasses.fake_tensor", "FakeTensor"),
    ("torch._subclasses.functional_tensor", "FunctionalTensor"),
    ("tensorflow.python.framework.ops", "SymbolicTensor"),
})

# Types whose value a Function call reads through its framework's route as
# well (dlbridge._compiled), never in C: a tf.Variable is read with
# v.value() -- eagerly a ReadVariableOp, which every recording tape sees,
# inside tf.function a graph tensor -- by dlbridge._ops_tf.
_ROUTED_BASES = frozenset({
    ("tensorflow.python.ops.variables", "Variable"),
})


def _is_traced(tp):
    """Whether ``tp`` is a graph compiler's placeholder for a tensor, or a
    type read through the compiler's route (a tf.Variable).  Asked by the C
    handler cache once per type of the jax, torch and tensorflow frameworks;
    a Function called with one hands the call to the compiler's route
    (dlbridge._compiled)."""
    for base in getattr(tp, "__mro__", ()):
        key = (getattr(base, "__module__", None),
               getattr(base, "__qualname__", None))
        if key in _TRACED_BASES or key in _ROUTED_BASES:
            return True
    return False


# The framework of a type is cached by the C handler cache (weakly: an entry
# dies with its type), read back through _core._type_framework.
_type_fw = _core._type_framework


def framework_of(obj):
    """The framework name of ``obj``'s type, or None when not one we know."""
    fw = _type_fw(type(obj))
    return fw if fw in REGISTRY else None


def _resolve_target(to):
    """The target name ``to`` stands for (a name, a type or an example
    object), or ValueError listing the valid names.  Asked by convert.c
    when its cache has no answer."""
    if isinstance(to, str):
        if to in FRAMEWORKS:
            return to
        raise ValueError(
            f"convert: unknown target {to!r}; valid names are "
            + ", ".join(repr(n) for n in FRAMEWORKS)
            + " (or pass a type or an object of the target framework)"
        )
    tp = to if isinstance(to, type) else type(to)
    fw = _type_fw(tp)
    if fw not in FRAMEWORKS:
        what = (
            f"type {to.__module__}.{to.__qualname__}"
            if isinstance(to, type)
            else f"an object of type {type(to).__module__}."
            f"{type(to).__qualname__}"
        )
        raise ValueError(
            f"convert: cannot tell which framework {what} belongs to; valid "
            "targets are " + ", ".join(repr(n) for n in FRAMEWORKS)
        )
    return fw


def _import(name):
    # Already imported (an object of it was seen, or the user imported it):
    # no import machinery at all.
    module = sys.modules.get(name)
    if module is not None:
        return module
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ImportError(
            f"convert: the target framework {name!r} is not installed"
        ) from exc


# ---- the importers ----------------------------------------------------------
# Each loader imports its framework and returns what convert.c hands a tensor
# to: the importer (a callable; for TAKES_EXCHANGE and TAKES_NUMPY the way in
# when the fast path does not apply), and optionally a dict of fields that
# override the registry's for this process.

def _load_numpy():
    np = _import("numpy")
    # NumPy's C API table, for convert.c's ndarray maker; np.from_dlpack
    # takes what it cannot make (devices other than the CPU).
    core = getattr(np, "_core", None) or np.core
    api = getattr(getattr(core, "_multiarray_umath", None), "_ARRAY_API", None)
    return np.from_dlpack, {"numpy_api": api}


def _load_torch():
    torch = _import("torch")
    slow = torch.from_dlpack
    fast = getattr(getattr(torch, "_C", None), "_from_dlpack", None)
    if fast is None:
        return slow

    def to_torch(t):
        # Only without torch's exchange table (DLBRIDGE_SKIP_EXCHANGE_API):
        # what torch.from_dlpack(t) does for a producer off CUDA/ROCm, minus
        # its Python-level keyword handling; on CUDA/ROCm (2, 10) it picks
        # the consumer stream, so those go through torch.from_dlpack.
        if t.__dlpack_device__()[0] in (2, 10):
            return slow(t)
        return fast(t.__dlpack__(max_version=(1, 0)))

    return to_torch


def _load_cupy():
    return _import("cupy").from_dlpack


def _load_jax():
    _import("jax")
    from_dlpack = importlib.import_module("jax.dlpack").from_dlpack
    try:
        # What jax.dlpack.from_dlpack does on the CPU, without its steps
        # that cost most and change nothing there: the backend and device
        # lookups (kept per device id here), the stream query (which raises
        # and catches an "UNIMPLEMENTED" error on every CPU call) and a
        # jnp.asarray that only canonicalises the dtype (done when it
        # changes one: float64 without jax_enable_x64).  About half of
        # from_dlpack's 20 us.  Any other device, or a JAX whose internals
        # differ, takes from_dlpack itself.
        from jax._src import dtypes, xla_bridge
        from jax._src.lib import _jax, jaxlib_extension_version
        import jax.numpy as jnp
        to_buffer = _jax.dlpack_managed_tensor_to_buffer
        canonical = dtypes.canonicalize_dtype
        # private: only the signature known for this jaxlib (extension
        # version 467: capsule, device, stream, copy, DLPack device type)
        if jaxlib_extension_version != 467:
            raise ImportError("a jaxlib whose importer is not known here")
    except (ImportError, AttributeError):
        return from_dlpack
    devices = {}

    def to_jax(t):
        kind, index = t.__dlpack_device__()
        if kind != 1:
            return from_dlpack(t)
        device = devices.get(index)
        if device is None:
            device = devices[index] = xla_bridge.get_backend(
                "cpu").device_from_local_hardware_id(index)
        arr = to_buffer(t.__dlpack__(), device, None, None, 1)
        want = canonical(arr.dtype)
        return arr if want == arr.dtype else jnp.asarray(arr, dtype=want)

    return to_jax


def _load_tensorflow():
    tf = _import("tensorflow")
    errors = {"errors": _IMPORT_ERRORS + (tf.errors.OpError,)}
    # TensorFlow's importer takes a legacy capsule; its errors derive from
    # Exception alone, so they are named for convert to report.
    public = importlib.import_module("tensorflow.experimental.dlpack").from_dlpack
    try:
        # What tf.experimental.dlpack.from_dlpack does (make sure the eager
        # context is initialised, hand the capsule and the context's handle
        # to TFE_FromDlpackCapsule), reading the handle straight from the
        # context whenever it has one: a third of its cost.
        from tensorflow.python import pywrap_tfe
        from tensorflow.python.eager import context
        from_capsule = pywrap_tfe.TFE_FromDlpackCapsule
        context.context()._context_handle  # noqa: B018 (exists?)
    except (ImportError, AttributeError):
        return public, errors

    def to_tensorflow(capsule):
        c = context._context
        handle = c._context_handle if c is not None else None
        if handle is None:
            c = context.context()
            c.ensure_initialized()
            handle = c._handle
        return from_capsule(capsule, handle)

    return to_tensorflow, errors


# kDLCUDA and kDLCUDAManaged: the memory numba and cuda.core take on a GPU.
_CUDA_TYPES = (2, 13)


def _load_numba():
    cuda = importlib.import_module("numba.cuda")

    def to_numba(t):
        # numba's device arrays are CUDA memory, read through
        # __cuda_array_interface__ (whose stream numba synchronises on).
        if t.__dlpack_device__()[0] not in _CUDA_TYPES:
            raise BufferError(
                f"convert: numba device arrays hold CUDA memory, and this "
                f"tensor is on {t.device}; pass device='cuda:0'")
        return cuda.as_cuda_array(t)

    return to_numba


def _load_cuda_core():
    smv = None
    for name in ("cuda.core", "cuda.core.utils", "cuda.core.experimental.utils"):
        try:
            smv = getattr(importlib.import_module(name), "StridedMemoryView")
            break
        except (ImportError, AttributeError):
            continue
    if smv is None:
        raise ImportError("convert: cuda.core has no StridedMemoryView")
    from_dlpack = getattr(smv, "from_dlpack", None)

    def to_cuda_core(t):
        # The consumer stream: dlbridge's current one on a GPU (the view's
        # users work on it), -1 (no stream) on the host.
        on_gpu = t.__dlpack_device__()[0] in _CUDA_TYPES
        stream = _core._current_stream() if on_gpu else -1
        if from_dlpack is not None:
            return from_dlpack(t, stream_ptr=stream)
        return smv(t, stream_ptr=stream)

    return to_cuda_core


def _load_paddle():
    paddle = _import("paddle")
    f = getattr(paddle, "from_dlpack", None)
    return f if f is not None else importlib.import_module(
        "paddle.utils.dlpack").from_dlpack


def _load_tvm_ffi():
    return _import("tvm_ffi").from_dlpack


def _load_onnxruntime():
    return _import("onnxruntime").OrtValue.from_dlpack


def _load_mlx():
    mx = importlib.import_module("mlx.core")
    # mx.from_dlpack narrows float64 to float32 (MLX's default float type)
    # without a word; mx.array(x, dtype=mx.float64) keeps it.
    return mx.from_dlpack, {"by_dtype": {
        "float64": functools.partial(mx.array, dtype=mx.float64)}}


def _load_warp():
    wp = _import("warp")
    # wp.from_dlpack needs an initialised runtime; init() is idempotent (and
    # prints Warp's banner unless warp.config.quiet is set).
    wp.init()
    return wp.from_dlpack


def _load_open3d():
    # Tensor.from_dlpack takes a legacy capsule; the result is on the
    # source's device.
    return importlib.import_module("open3d.core").Tensor.from_dlpack


def _drjit_backend():
    """drjit.llvm when it loads (it needs libLLVM), else drjit.scalar."""
    _import("drjit")
    try:
        return importlib.import_module("drjit.llvm")
    except ImportError:
        return importlib.import_module("drjit.scalar")


def _no_drjit_tensor(x):
    # Unreachable: convert refuses the dtypes without a TensorX type first.
    raise BufferError("convert: drjit has no tensor type of this dtype")


def _load_drjit():
    backend = _drjit_backend()
    # The result type is chosen by dtype (Dr.Jit converts nothing implicitly).
    return _no_drjit_tensor, {
        "by_dtype": {dt: getattr(backend, name)
                     for dt, name in _DRJIT_TENSORS.items()},
        "copies": backend.__name__ == "drjit.scalar"}


def _load_pyarrow():
    return _import("pyarrow").Tensor.from_dlpack


def _load_array_api_strict():
    return _import("array_api_strict").from_dlpack


_LOADERS = {
    "numpy": _load_numpy,
    "torch": _load_torch,
    "cupy": _load_cupy,
    "jax": _load_jax,
    "tensorflow": _load_tensorflow,
    "paddle": _load_paddle,
    "tvm_ffi": _load_tvm_ffi,
    "onnxruntime": _load_onnxruntime,
    "mlx": _load_mlx,
    "warp": _load_warp,
    "open3d": _load_open3d,
    "drjit": _load_drjit,
    "array_api_strict": _load_array_api_strict,
    "pyarrow": _load_pyarrow,
    "numba": _load_numba,
    "cuda.core": _load_cuda_core,
}


# Frameworks whose result type a type passed as ``to`` picks exactly
# (``drjit.llvm.TensorXf``): convert.c binds such a type as a target of
# its own, the type itself its importer.
_BY_TYPE = frozenset({"drjit"})


def _holds(fw, device_type, predicate):
    """Whether framework ``fw``'s build has the backend ``predicate`` names
    (the registry's ``devices``); torch: CUDA or ROCm (hip), with a
    device."""
    torch = _import(fw)
    return bool(torch.cuda.is_available()) and (
        (getattr(torch.version, "hip", None) is not None)
        == (predicate == "hip"))


def _dtype_triple(name):
    d = _core.dtype(name)
    return (d.code, d.bits, d.lanes)


# Framework.layout as convert.c numbers it (LAYOUT_*).
_LAYOUTS = {"strided": 0, "row-major": 1, "dense": 2}


def _c_convert_target(name, tp=None):
    """What convert.c needs of target ``name`` (a FRAMEWORKS name), as a
    tuple read by its parser (convert.c, bind_target): (takes, importer,
    errors, tensor_type, numpy_api, readonly, negative_strides,
    layout (0 strided, 1 row-major, 2 dense), copies, by_type, objects, min_ndim, alignment, dtypes,
    dtype_names, devices, by_dtype: ((code, bits, lanes), importer) pairs
    tried before ``importer``).  Imports the framework.  ``tp``: a type passed as ``to`` of a
    framework that picks its result type by type (Dr.Jit), used as the
    importer; None otherwise.  The answer is cached per name (per type for
    ``tp``)."""
    fw = REGISTRY[name]
    importer, extra = None, {}
    tensor_type = None
    if name != "dlbridge":
        loaded = _LOADERS[name]()
        importer, extra = loaded if isinstance(loaded, tuple) else (loaded, {})
    if fw.tensor_type is not None:
        module, _, attr = fw.tensor_type.partition(":")
        tensor_type = getattr(_import(module), attr)
    copies = extra.get("copies", fw.copies)
    if tp is not None:
        importer = tp
        copies = tp.__module__.startswith("drjit.scalar")
    devices = None
    if fw.devices is not None:
        devices = tuple(d for d, pred in fw.devices.items()
                        if pred is None or _holds(name, d, pred))
    dtypes = names = None
    if fw.dtypes is not None:
        names = ", ".join(sorted(fw.dtypes))
        dtypes = tuple(_dtype_triple(n) for n in sorted(fw.dtypes))
    by_dtype = None
    if extra.get("by_dtype") and tp is None:
        by_dtype = tuple((_dtype_triple(n), f)
                         for n, f in sorted(extra["by_dtype"].items()))
    return (fw.takes, importer, extra.get("errors", _IMPORT_ERRORS),
            tensor_type, extra.get("numpy_api"), fw.readonly,
            fw.negative_strides, _LAYOUTS[fw.layout], copies,
            name in _BY_TYPE, fw.objects, fw.min_ndim, fw.alignment or 0,
            dtypes, names, devices, by_dtype)


# ---- what the C extension asks (answers cached on the C side) ----------------

def _c_traits(name):
    """``(immutable, read_buffer)`` of framework ``name`` (asked by the C
    handler cache once per type): whether a Function copies its ``mut``
    arguments and returns their new values, and whether it reads its arrays
    through their buffer protocol first."""
    fw = REGISTRY.get(name)
    if fw is None:
        return False, False
    return fw.immutable, fw.read_buffer


def _c_converter(name):
    """For results handed back to framework ``name`` (Function outputs, the
    C API's ``like=``) when its type publishes no exchange table: a callable
    turning a dlbridge.Tensor into one of its tensors (convert's rules);
    None for a framework that is no convert target (results stay
    dlbridge.Tensor).  Imports nothing until the callable is called."""
    if name not in FRAMEWORKS:
        return None

    def to_framework(t):
        return convert(t, name)

    return to_framework
