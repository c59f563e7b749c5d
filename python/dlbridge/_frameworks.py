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

__all__ = ["convert", "framework_of", "FRAMEWORKS"]

#: The names ``convert`` accepts as ``to``.
FRAMEWORKS = ("numpy", "torch", "cupy", "jax", "tensorflow", "dlbridge")

# Per-call cost matters here: convert is a few hundred ns of Python around
# importers that cost 0.2-1 us, so everything that can be worked out once is
# (the framework of a type, the target's bound importer), and each check
# reads the fewest Tensor attributes it can.
_from_dlpack = _core.from_dlpack
_Tensor = _core.Tensor
_NAMES = {name: name for name in FRAMEWORKS}

# Root module name of a type -> the framework it belongs to.
_ROOTS = {
    "numpy": "numpy",
    "torch": "torch",
    "cupy": "cupy",
    "cupyx": "cupy",
    "jax": "jax",
    "jaxlib": "jax",
    "tensorflow": "tensorflow",
    "dlbridge": "dlbridge",
}

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
_SUPPORTED_DTYPES = {"numpy": _NUMPY_DTYPES, "torch": _TORCH_DTYPES}

# Targets whose tensors cannot be read-only.
_NO_READONLY = frozenset({"torch", "cupy"})

# torch has no negative strides, and torch.from_dlpack (2.13) does not refuse
# them cleanly: it throws a C++ error that aborts the process.  Refusing here
# turns a crash into an exception.
_NO_NEGATIVE_STRIDES = frozenset({"torch"})

# DLPack device types torch can hold, by the name of the torch predicate
# that says whether this build has the backend (None: always).  Any other
# device is refused before torch sees it: torch 2.13 mis-handles them (an
# OpenCL tensor makes it run the deleter without renaming the capsule, Metal
# and MAIA ones are imported over a host address, CUDA without a CUDA build
# is an AssertionError).  Decided once per device type (_torch_holds).
_TORCH_DEVICES = {1: None, 2: "cuda", 10: "hip"}
_TORCH_HOLDS = {}

# TensorFlow's importer only takes compact row-major data ("Invalid strides
# array from DLPack" otherwise).
_COMPACT_ONLY = frozenset({"tensorflow"})

# type -> framework name or None.  type.__module__ of a C type is a new
# string built from tp_name on every read (~150 ns with the split), so it is
# read once per type.  Bounded, so a program that makes classes on the fly
# does not keep them all alive through this cache.
_TYPE_FW = {}
_TYPE_FW_MAX = 1024
_UNSEEN = object()


def _root_framework_uncached(tp):
    module = getattr(tp, "__module__", None)
    if not isinstance(module, str):
        return None
    return _ROOTS.get(module.partition(".")[0])


def _root_framework(tp):
    fw = _TYPE_FW.get(tp, _UNSEEN)
    if fw is _UNSEEN:
        fw = _root_framework_uncached(tp)
        if len(_TYPE_FW) < _TYPE_FW_MAX:
            _TYPE_FW[tp] = fw
    return fw


def framework_of(obj):
    """The framework name of ``obj``'s type, or None when not one we know."""
    return _root_framework(type(obj))


def _resolve_target(to):
    if isinstance(to, str):
        if to in FRAMEWORKS:
            return to
        raise ValueError(
            f"convert: unknown target {to!r}; valid names are "
            + ", ".join(repr(n) for n in FRAMEWORKS)
            + " (or pass a type or an object of the target framework)"
        )
    fw = _root_framework(to) if isinstance(to, type) else framework_of(to)
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
    return importlib.import_module("jax.dlpack").from_dlpack


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


_LOADERS = {
    "numpy": _load_numpy,
    "torch": _load_torch,
    "cupy": _load_cupy,
    "jax": _load_jax,
    "tensorflow": _load_tensorflow,
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


def _torch_holds(device_type):
    ok = _TORCH_HOLDS.get(device_type)
    if ok is None:
        need = _TORCH_DEVICES.get(device_type, False)
        if need is None or need is False:
            ok = need is None
        else:
            torch = _import("torch")
            ok = bool(torch.cuda.is_available()) and (
                (getattr(torch.version, "hip", None) is not None)
                == (need == "hip"))
        _TORCH_HOLDS[device_type] = ok
    return ok


def _import_checked(t, target):
    """The checks for ``target``, then its importer (bound on first use)."""
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
    if target == "torch" and not _torch_holds(t.__dlpack_device__()[0]):
        raise BufferError(
            f"convert: torch cannot hold a tensor on {t.device} (this torch "
            "build has no such device); copy it to a device torch has first"
        )
    if target in _COMPACT_ONLY and not t.is_contiguous:
        raise BufferError(
            f"convert: {target} imports only compact row-major data (strides "
            f"{t.strides} for shape {t.shape}); copy it first: "
            f"convert(dlbridge.from_dlpack(x, copy=True), {target!r})"
        )
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
            try:
                fw = _TYPE_FW[tp]
            except KeyError:
                fw = _root_framework(tp)
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
    try:
        fw = _TYPE_FW[type(obj)]
    except KeyError:
        fw = _root_framework(type(obj))
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
