"""dlbridge.convert: zero-copy conversion between array frameworks.

``convert(obj, to)`` imports ``obj`` with :func:`dlbridge.from_dlpack` (no
copy) and hands the resulting :class:`dlbridge.Tensor` to the target
framework's own DLPack importer, so the result shares memory with ``obj``.

Choices, written down because the DLPack spec leaves them open:

* ``to`` is a framework name (``"numpy"``, ``"torch"``, ``"cupy"``, ``"jax"``,
  ``"tensorflow"``, ``"dlbridge"``), a type (``numpy.ndarray``,
  ``torch.Tensor``, ...) or an example object whose framework to match.
  Types and objects are recognised by the root of ``type(x).__module__``
  (``jaxlib`` counts as ``jax``, ``cupyx`` as ``cupy``).  Anything else is a
  ``ValueError`` listing the valid names.
* No framework is imported until it is the target (or was already imported
  because one of its objects was passed in): importing dlbridge stays cheap.
* When ``obj`` already belongs to the target framework it is returned as it
  is -- the cheapest zero-copy conversion there is.
* Read-only data (a read-only NumPy array, ``bytes``, a producer that set
  DLPack's READ_ONLY flag) is refused with ``BufferError`` for targets whose
  tensors cannot be read-only -- PyTorch and CuPy.  ``torch.from_dlpack``
  (checked with torch 2.13) silently returns a WRITABLE tensor over
  read-only memory, which lets a later write corrupt the source or crash;
  the spec's "ignore the flag" advice is a footgun we do not pass on.  To
  convert anyway, copy first: ``convert(dlbridge.from_dlpack(x, copy=True),
  "torch")``.  NumPy keeps the flag (its arrays can be read-only).
* TensorFlow and JAX import through the legacy (unversioned) protocol,
  which cannot say read-only, so dlbridge's export refuses read-only data
  for them with a ``BufferError`` (legacy capsules are always writable).
* A dtype the target cannot hold (``bfloat16`` into NumPy, for instance) is
  a ``BufferError`` naming the target and the dtype.  Any other refusal by
  the target's importer (device, layout) is re-raised as ``BufferError``
  naming the target, chained to the framework's own exception.
* Layouts a target cannot take are refused before it is asked: negative
  strides into torch (torch.from_dlpack 2.13 aborts the process on them)
  and anything but compact row-major into TensorFlow.  JAX copies
  transposed data itself and refuses other strided layouts.
"""

import importlib
import sys

from . import _core

__all__ = ["convert", "framework_of", "FRAMEWORKS", "REGISTRY"]


class Framework:
    """One entry of the framework registry: everything dlbridge knows about
    a framework, in one place.  The C extension asks this module (never a
    list of its own) and caches the answers: which framework a type belongs
    to (``_type_framework``), how to hand it a tensor (``_c_converter``,
    ``_c_target``)."""

    __slots__ = ("name", "roots", "dist", "target", "tensor_type",
                 "readonly", "negative_strides", "compact_only", "dtypes",
                 "alignment", "devices", "immutable", "read_buffer")

    def __init__(self, name, roots=None, dist=None, target=True,
                 tensor_type=None, readonly=True, negative_strides=True,
                 compact_only=False, dtypes=None, alignment=None,
                 devices=None, immutable=False, read_buffer=False):
        self.name = name
        #: root module names whose types belong to it
        self.roots = roots or (name,)
        #: distribution name (importlib.metadata), when not ``name``
        self.dist = dist or name
        #: whether ``convert`` offers it as a target
        self.target = target
        #: "module:attr" of the type of its tensors, when they have one (the
        #: C API reaches its DLPack exchange table through it)
        self.tensor_type = tensor_type
        #: whether its tensors can be read-only
        self.readonly = readonly
        #: whether its tensors can have negative strides
        self.negative_strides = negative_strides
        #: whether its importer takes only compact row-major data
        self.compact_only = compact_only
        #: the dtypes its importer is known to accept (None: ask it)
        self.dtypes = dtypes
        #: the data alignment (bytes) its kernels need; unaligned data is
        #: copied into dlbridge's own (256-byte aligned) memory
        self.alignment = alignment
        #: DLPack device types it can hold, each mapped to the name of the
        #: framework's predicate saying whether this build has the backend
        #: (None: always); any other device is refused before the
        #: framework sees it.  None: no restriction known.
        self.devices = devices
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


# dtypes each target's DLPack importer is known to accept (checked against
# numpy 2.x and torch 2.13).  Targets not listed are asked and their refusal
# is reported.
_NUMPY_DTYPES = frozenset(
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 "
    "float16 float32 float64 complex64 complex128".split()
)
_TORCH_DTYPES = _NUMPY_DTYPES | frozenset(
    "bfloat16 complex32 float8_e4m3fn float8_e5m2 float8_e4m3fnuz "
    "float8_e5m2fnuz float8_e8m0fnu".split()
)

#: The framework registry: the one list of frameworks in dlbridge (C and
#: Python).  Order is display order (CLI, doctor).
#:  - torch tensors cannot be read-only (torch.from_dlpack 2.13 silently
#:    returns a writable tensor over read-only memory) and have no negative
#:    strides (its importer aborts the process on them);
#:  - cupy arrays cannot be read-only;
#:  - TensorFlow's importer only takes compact row-major data ("Invalid
#:    strides array from DLPack" otherwise);
#:  - paddle: Function hands results back as paddle tensors; not a convert
#:    target yet.  pyarrow and tvm_ffi are known to the doctor only.
REGISTRY = {fw.name: fw for fw in (
    Framework("numpy", tensor_type="numpy:ndarray", dtypes=_NUMPY_DTYPES),
    # torch 2.13 mis-handles devices it has no backend for (an OpenCL tensor
    # makes it run the deleter without renaming the capsule, Metal and MAIA
    # ones are imported over a host address, CUDA without a CUDA build is an
    # AssertionError): only these reach it.
    Framework("torch", tensor_type="torch:Tensor", readonly=False,
              negative_strides=False, dtypes=_TORCH_DTYPES,
              devices={1: None, 2: "cuda", 10: "hip"}),
    Framework("cupy", roots=("cupy", "cupyx"), readonly=False),
    # jax.Array's buffer export (jaxlib's PyArray_bf_getbuffer) is
    # read-only, waits for the array to be ready, holds the buffer against
    # deletion and donation while exported, and refuses GPU arrays, bfloat16,
    # fp8 and sub-byte types with BufferError.
    Framework("jax", roots=("jax", "jaxlib"), immutable=True,
              read_buffer=True),
    # TensorFlow's importer accepts data at any address, but its kernels
    # check Tensor::IsAligned() (64 bytes) and abort the process on the
    # first op over unaligned data; NumPy's small arrays are 16-byte aligned.
    Framework("tensorflow", dist="tensorflow-cpu", compact_only=True,
              alignment=64, immutable=True),
    # CUDA only: numba's device arrays (read over __cuda_array_interface__)
    # and cuda.core's StridedMemoryView (types under the "cuda" package)
    Framework("numba"),
    Framework("cuda.core", roots=("cuda",), dist="cuda-core"),
    Framework("pyarrow", target=False),
    Framework("paddle", dist="paddlepaddle", target=False),
    Framework("tvm_ffi", dist="apache-tvm-ffi", target=False),
    Framework("dlbridge"),
)}

#: The names ``convert`` accepts as ``to``.
FRAMEWORKS = tuple(fw.name for fw in REGISTRY.values() if fw.target)

# Per-call cost matters here: convert is a few hundred ns of Python around
# importers that cost 0.2-1 us, so everything that can be worked out once is
# (the framework of a type, the target's bound importer), and each check
# reads the fewest Tensor attributes it can.
_from_dlpack = _core.from_dlpack
_Tensor = _core.Tensor
_NAMES = {name: name for name in FRAMEWORKS}

# Root module name of a type -> the framework it belongs to.
_ROOTS = {root: fw.name for fw in REGISTRY.values() for root in fw.roots}

_SUPPORTED_DTYPES = {fw.name: fw.dtypes for fw in REGISTRY.values()
                     if fw.dtypes is not None}
# Targets whose tensors cannot be read-only, cannot have negative strides,
# take only compact data.
_NO_READONLY = frozenset(fw.name for fw in REGISTRY.values() if not fw.readonly)
_NO_NEGATIVE_STRIDES = frozenset(
    fw.name for fw in REGISTRY.values() if not fw.negative_strides)
_COMPACT_ONLY = frozenset(fw.name for fw in REGISTRY.values() if fw.compact_only)
_MIN_ALIGNMENT = {fw.name: fw.alignment for fw in REGISTRY.values()
                  if fw.alignment is not None}
_DEVICE_LIMITED = frozenset(
    fw.name for fw in REGISTRY.values() if fw.devices is not None)


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


def _is_traced(tp):
    """Whether ``tp`` is a graph compiler's placeholder for a tensor.  Asked
    by the C handler cache once per type of the jax, torch and tensorflow
    frameworks; a Function called with one hands the call to the compiler
    (dlbridge._compiled)."""
    for base in getattr(tp, "__mro__", ()):
        key = (getattr(base, "__module__", None),
               getattr(base, "__qualname__", None))
        if key in _TRACED_BASES:
            return True
    return False


# The framework of a type is cached by the C handler cache (weakly: an entry
# dies with its type), read back through _core._type_framework.  type.
# __module__ of a C type is a new string built from tp_name on every read
# (~150 ns with the split), so it is worth a cache; a dict here would keep
# every type it saw alive.
_type_fw = _core._type_framework


def _root_framework(tp):
    """The convert target type ``tp`` belongs to, or None."""
    fw = _type_fw(tp)
    return fw if fw in _NAMES else None


def framework_of(obj):
    """The framework name of ``obj``'s type, or None when not one we know."""
    fw = _type_fw(type(obj))
    return fw if fw in REGISTRY else None


def _resolve_target(to):
    if isinstance(to, str):
        if to in FRAMEWORKS:
            return to
        raise ValueError(
            f"convert: unknown target {to!r}; valid names are "
            + ", ".join(repr(n) for n in FRAMEWORKS)
            + " (or pass a type or an object of the target framework)"
        )
    fw = _root_framework(to if isinstance(to, type) else type(to))
    if fw is None:
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


# Each loader imports its framework once and returns the function that turns
# a dlbridge.Tensor into one of its tensors; convert keeps that function in
# _BOUND, so later calls touch no import machinery at all.

def _load_numpy():
    global _numpy_from_dlpack
    # np.from_dlpack is C; it wants the object with __dlpack__ (no capsules).
    _numpy_from_dlpack = _import("numpy").from_dlpack
    return _numpy_from_dlpack


def _load_torch():
    torch = _import("torch")
    slow = torch.from_dlpack
    fast = getattr(getattr(torch, "_C", None), "_from_dlpack", None)
    if fast is None:
        return slow

    def to_torch(t):
        # What torch.from_dlpack(t) does for a producer off CUDA/ROCm (no
        # stream to pass), minus its Python-level kwargs handling, which is
        # half its cost: __dlpack__(max_version=(1, 0)), then the C
        # importer.  On CUDA/ROCm (2, 10) it picks the consumer stream, so
        # those go through torch.from_dlpack itself; so does any producer
        # that refuses max_version (torch then retries without it).
        if t.__dlpack_device__()[0] in (2, 10):
            return slow(t)
        try:
            capsule = t.__dlpack__(max_version=(1, 0))
        except TypeError:
            return slow(t)
        return fast(capsule)

    return to_torch


def _load_cupy():
    return _import("cupy").from_dlpack


def _load_jax():
    _import("jax")
    from_dlpack = importlib.import_module("jax.dlpack").from_dlpack
    # jax.dlpack.from_dlpack spends ~40 us in Python (backend, device and
    # stream lookups, a canonicalising asarray) around jaxlib's importer,
    # which takes ~2 us: for host memory it is called directly.  It is
    # private, so only with the signature known for this jaxlib (extension
    # version 467: capsule, device, stream, copy, DLPack device type); any
    # other jaxlib, device or dtype takes the public route.
    try:
        from jax._src import dtypes as jax_dtypes
        from jax._src import xla_bridge
        from jax._src.lib import _jax, jaxlib_extension_version
        to_buffer = _jax.dlpack_managed_tensor_to_buffer
    except (ImportError, AttributeError):
        return from_dlpack
    if jaxlib_extension_version != 467:
        return from_dlpack
    canonical = jax_dtypes.canonicalize_dtype
    devices = {}

    def to_jax(t):
        kind, index = t.__dlpack_device__()
        if kind != 1:   # kDLCPU only: other devices have streams to order
            return from_dlpack(t)
        device = devices.get(index)
        if device is None:
            device = devices[index] = xla_bridge.get_backend(
                "cpu").device_from_local_hardware_id(index)
        # What from_dlpack asks for on the host: a legacy capsule (no
        # max_version), no stream, no copy.
        arr = to_buffer(t.__dlpack__(), device, None, None, kind)
        if arr.dtype != canonical(arr.dtype):   # 64-bit types without x64
            return importlib.import_module("jax.numpy").asarray(
                arr, dtype=canonical(arr.dtype))
        return arr

    return to_jax


def _load_tensorflow():
    tf = _import("tensorflow")
    tf_from_dlpack = importlib.import_module(
        "tensorflow.experimental.dlpack").from_dlpack
    op_error = tf.errors.OpError

    def to_tensorflow(t):
        # TensorFlow only reads legacy capsules: __dlpack__() without
        # max_version makes one (and refuses read-only data, see above).
        capsule = t.__dlpack__()
        try:
            return tf_from_dlpack(capsule)
        except op_error as exc:
            # TF's errors derive from Exception alone; report them as the
            # BufferError convert promises.
            raise BufferError(str(exc).strip()) from exc

    return to_tensorflow


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
                f"tensor is on {t.device}; copy it first: convert("
                "dlbridge.from_dlpack(x, device='cuda:0'), 'numba')")
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


_LOADERS = {
    "numpy": _load_numpy,
    "torch": _load_torch,
    "cupy": _load_cupy,
    "jax": _load_jax,
    "tensorflow": _load_tensorflow,
    "paddle": _load_paddle,
    "numba": _load_numba,
    "cuda.core": _load_cuda_core,
}
_BOUND = {}
# numpy's importer once bound: convert's fast path for the commonest target.
_numpy_from_dlpack = None

_IMPORT_ERRORS = (BufferError, TypeError, ValueError, RuntimeError)
_NUMPY = "numpy"  # the interned constant convert's fast path compares with


def _numpy_dtype_refused(t, exc):
    """After np.from_dlpack(t) raised ``exc``: True when t's dtype is one
    NumPy cannot hold (the caller raises that error, outside its except
    block so it has no context, as the check before the import has none);
    raises convert's BufferError for an importer error; False when ``exc``
    is to pass through as it is."""
    dtype = t.dtype.name
    if dtype not in _NUMPY_DTYPES:
        return True
    if isinstance(exc, _IMPORT_ERRORS):
        raise BufferError(
            f"convert: numpy could not import the {dtype} tensor "
            f"(shape {t.shape}, device {t.device}): {exc}"
        ) from exc
    return False


def _dtype_error(target, dtype, supported):
    return BufferError(
        f"convert: {target} cannot hold dtype {dtype}; supported dtypes "
        f"are {', '.join(sorted(supported))}"
    )


def _has_negative_stride(t):
    # A compact non-empty tensor has only positive strides on extents > 1;
    # only other layouts need the strides looked at.
    if t.is_contiguous and t.size:
        return False
    return any(st < 0 for st, n in zip(t.strides, t.shape) if n > 1)


def _check(t, target):
    """Raise BufferError when ``target``'s tensors cannot hold ``t`` (dtype,
    read-only data, negative strides, layout): the registry's rules, for
    convert and for the C API (through ``_c_target``) alike."""
    supported = _SUPPORTED_DTYPES.get(target)
    if supported is not None:
        dtype = t.dtype.name
        if dtype not in supported:
            raise _dtype_error(target, dtype, supported)
    if t.readonly and target in _NO_READONLY:
        raise BufferError(
            f"convert: the data is read-only and {target} tensors cannot be "
            f"read-only ({target}'s from_dlpack would make it silently "
            "writable); copy it first: "
            f"convert(dlbridge.from_dlpack(x, copy=True), {target!r})"
        )
    if target in _NO_NEGATIVE_STRIDES and _has_negative_stride(t):
        raise BufferError(
            f"convert: {target} tensors cannot have negative strides "
            f"(strides {t.strides}); copy it first: "
            f"convert(dlbridge.from_dlpack(x, copy=True), {target!r})"
        )
    if (target in _DEVICE_LIMITED
            and not _holds(target, t.__dlpack_device__()[0])):
        raise BufferError(
            f"convert: {target} cannot hold a tensor on {t.device} (this "
            f"{target} build has no such device); copy it to a device "
            f"{target} has first"
        )
    if target in _COMPACT_ONLY and not t.is_contiguous:
        raise BufferError(
            f"convert: {target} imports only compact row-major data (strides "
            f"{t.strides} for shape {t.shape}); copy it first: "
            f"convert(dlbridge.from_dlpack(x, copy=True), {target!r})"
        )


_HOLDS = {}


def _holds(target, device_type):
    """Whether framework ``target`` can hold a tensor on DLPack device type
    ``device_type`` (decided once per pair)."""
    key = (target, device_type)
    ok = _HOLDS.get(key)
    if ok is None:
        devices = REGISTRY[target].devices
        if devices is None:
            ok = True
        elif device_type not in devices:
            ok = False
        elif devices[device_type] is None:
            ok = True
        else:   # torch: a CUDA or a ROCm (hip) build, with a device
            torch = _import("torch")
            ok = bool(torch.cuda.is_available()) and (
                (getattr(torch.version, "hip", None) is not None)
                == (devices[device_type] == "hip"))
        _HOLDS[key] = ok
    return ok


def _import_checked(t, target):
    """The checks for ``target``, then its importer (bound on first use)."""
    _check(t, target)
    align = _MIN_ALIGNMENT.get(target)
    if align is not None and t.data_ptr % align:
        if t.readonly:
            # A copy would be writable: refuse as for aligned read-only data
            # (which the target's legacy importer cannot take).
            raise BufferError(
                f"convert: the data is read-only and not aligned to {align} "
                f"bytes as {target} needs; copy it first: "
                f"convert(dlbridge.from_dlpack(x, copy=True), {target!r})"
            )
        t = _from_dlpack(t, copy=True)
    try:
        importer = _BOUND.get(target)
        if importer is None:
            importer = _BOUND[target] = _LOADERS[target]()
        return importer(t)
    except _IMPORT_ERRORS as exc:
        raise BufferError(
            f"convert: {target} could not import the {t.dtype.name} tensor "
            f"(shape {t.shape}, device {t.device}): {exc}"
        ) from exc


def convert(obj, to):
    """Convert ``obj`` into framework ``to`` without copying.

    ``to`` is one of ``"numpy"``, ``"torch"``, ``"cupy"``, ``"jax"``,
    ``"tensorflow"``, ``"dlbridge"``, a type of one of those frameworks, or
    an object whose framework to match.  The result shares memory with
    ``obj``.  Raises ``ValueError`` for an unknown target, ``TypeError`` when
    ``obj`` is not tensor-like, and ``BufferError`` when the target cannot
    hold the data (dtype, device, read-only data for targets without
    read-only tensors).
    """
    if to is _NUMPY and _numpy_from_dlpack is not None:
        # The commonest call, convert(x, "numpy") once NumPy is bound, in
        # the fewest steps: a literal "numpy" is the interned string, so
        # identity suffices (anything else takes the general path below).
        tp = type(obj)
        if tp is _Tensor:
            t = obj  # what from_dlpack(obj) returns for a Tensor
        else:
            fw = _type_fw(tp)
            if fw == _NUMPY and hasattr(obj, "__dlpack__"):
                return obj
            t = _from_dlpack(obj)
        # NumPy refuses exactly the dtypes outside _NUMPY_DTYPES (its
        # importer takes bool, int/uint 8-64, float 16-64, complex 64/128,
        # one lane) and nothing else is checked for it, so the dtype (~130
        # ns to read) is only looked at once NumPy has refused: the outcome
        # is the one checking first gives.
        try:
            return _numpy_from_dlpack(t)
        except Exception as exc:
            if not _numpy_dtype_refused(t, exc):
                raise
        raise _dtype_error("numpy", t.dtype.name, _NUMPY_DTYPES)
    # Subscripts and `in` rather than dict.get: no method call, and this
    # function's own cost is what is being kept small.
    if type(to) is str and to in _NAMES:
        target = to
    else:
        target = _resolve_target(to)
    # Already the target's tensor (numpy scalars, which have no __dlpack__,
    # are not arrays and go through the import).
    fw = _type_fw(type(obj))
    if (
        fw == target
        and target != "dlbridge"
        and (hasattr(obj, "__dlpack__") or target == "tensorflow")
    ):
        return obj
    t = _from_dlpack(obj)
    if target == "dlbridge":
        return t
    return _import_checked(t, target)


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
    turning a dlbridge.Tensor into one of its tensors, checked as convert
    checks; None for a framework the registry does not know (results stay
    dlbridge.Tensor).  Imports nothing until the callable is called."""
    if name not in _LOADERS:
        return None

    def to_framework(t):
        return _import_checked(t, name)

    return to_framework


def _c_target(name):
    """For the C API's exports (by framework name or ``like=``):
    ``(tensor_type, check, convert)``, or None for a name that is not a
    convert target (the C side then raises ``_resolve_target``'s ValueError
    for an explicit name).  tensor_type is the type of the framework's
    tensors when it has one (its DLPack exchange table, if any, is the C
    fast path), else None; check(t) raises the BufferError convert would
    (read-only data into torch, ...); convert(t) is the checked import."""
    if name not in _NAMES:
        return None
    target = name
    fw = REGISTRY[target]
    tensor_type = None
    if fw.tensor_type is not None:
        module, _, attr = fw.tensor_type.partition(":")
        tensor_type = getattr(_import(module), attr)

    def check(t):
        _check(t, target)

    def to_target(t):
        return t if target == "dlbridge" else _import_checked(t, target)

    return tensor_type, check, to_target
