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

# TensorFlow's importer only takes compact row-major data ("Invalid strides
# array from DLPack" otherwise).
_COMPACT_ONLY = frozenset({"tensorflow"})


def _root_framework(tp):
    module = getattr(tp, "__module__", None)
    if not isinstance(module, str):
        return None
    return _ROOTS.get(module.partition(".")[0])


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


def _to_numpy(t):
    return _import("numpy").from_dlpack(t)


def _to_torch(t):
    return _import("torch").from_dlpack(t)


def _to_cupy(t):
    return _import("cupy").from_dlpack(t)


def _to_jax(t):
    _import("jax")
    dlpack = importlib.import_module("jax.dlpack")
    return dlpack.from_dlpack(t)


def _to_tensorflow(t):
    tf = _import("tensorflow")
    tfdlpack = importlib.import_module("tensorflow.experimental.dlpack")
    # TensorFlow only reads legacy capsules: __dlpack__() without
    # max_version makes one (and refuses read-only data, see above).
    capsule = t.__dlpack__()
    try:
        return tfdlpack.from_dlpack(capsule)
    except tf.errors.OpError as exc:
        # TF's errors derive from Exception alone; report them as the
        # BufferError convert promises.
        raise BufferError(str(exc).strip()) from exc


_IMPORTERS = {
    "numpy": _to_numpy,
    "torch": _to_torch,
    "cupy": _to_cupy,
    "jax": _to_jax,
    "tensorflow": _to_tensorflow,
}


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
    target = _resolve_target(to)
    # Already the target's tensor (numpy scalars, which have no __dlpack__,
    # are not arrays and go through the import).
    if (
        target != "dlbridge"
        and framework_of(obj) == target
        and (hasattr(obj, "__dlpack__") or target == "tensorflow")
    ):
        return obj
    t = _core.from_dlpack(obj)
    if target == "dlbridge":
        return t

    dtype = t.dtype.name
    supported = _SUPPORTED_DTYPES.get(target)
    if supported is not None and dtype not in supported:
        raise BufferError(
            f"convert: {target} cannot hold dtype {dtype}; supported dtypes "
            f"are {', '.join(sorted(supported))}"
        )
    if t.readonly and target in _NO_READONLY:
        raise BufferError(
            f"convert: the data is read-only and {target} tensors cannot be "
            f"read-only ({target}'s from_dlpack would make it silently "
            "writable); copy it first: "
            f"convert(dlbridge.from_dlpack(x, copy=True), {target!r})"
        )
    if target in _NO_NEGATIVE_STRIDES and any(
        st < 0 for st, n in zip(t.strides, t.shape) if n > 1
    ):
        raise BufferError(
            f"convert: {target} tensors cannot have negative strides "
            f"(strides {t.strides}); copy it first: "
            f"convert(dlbridge.from_dlpack(x, copy=True), {target!r})"
        )
    if target in _COMPACT_ONLY and not t.is_contiguous:
        raise BufferError(
            f"convert: {target} imports only compact row-major data (strides "
            f"{t.strides} for shape {t.shape}); copy it first: "
            f"convert(dlbridge.from_dlpack(x, copy=True), {target!r})"
        )
    try:
        return _IMPORTERS[target](t)
    except (BufferError, TypeError, ValueError, RuntimeError) as exc:
        raise BufferError(
            f"convert: {target} could not import the {dtype} tensor "
            f"(shape {t.shape}, device {t.device}): {exc}"
        ) from exc
