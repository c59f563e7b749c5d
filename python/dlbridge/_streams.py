"""dlbridge.stream: the CUDA stream dlbridge works on, and the streams of
the frameworks it talks to.

dlbridge's current stream is per thread (kept in C, src/python/cuda.c).
Outside any ``with dlbridge.stream(...)`` block it is the legacy default
stream (value 1).  It is the stream that

* dlbridge's own work runs on: allocations (``empty``/``zeros`` on CUDA),
  copies (``Tensor.copy``, ``from_dlpack(..., device=, copy=)``);
* ``from_dlpack`` names to a producer (``__dlpack__(stream=...)``), or orders
  a producer's stream before (exchange tables, ``__cuda_array_interface__``),
  so that reading the result on it sees the producer's writes;
* a ``dlbridge.Tensor``'s pending work is taken to be on when a consumer
  asks for it (``__dlpack__(stream=...)`` orders it before the consumer's
  stream; ``__cuda_array_interface__["stream"]`` names it).

Nothing here imports a framework: a stream object is read through the
attributes its framework gives it.
"""

from . import _core

__all__ = ["stream", "stream_value", "framework_stream"]

# Stream handles are pointers: an int up to this is one.
_MAX_HANDLE = 2**64 - 1


def stream_value(s):
    """The DLPack stream value of ``s``: 1 for the legacy default stream,
    2 for the per-thread default stream, else the CUstream handle.

    ``s`` may be an int (-1 for no ordering: producers are asked not to
    order their work before dlbridge's; 1, 2 or a handle up to 2**64 - 1;
    anything else is an OverflowError), None (the legacy stream), an
    object with ``__cuda_stream__()`` (the CUDA stream protocol: cuda.core,
    recent CuPy and numba), a torch stream (``.cuda_stream``), a CuPy stream
    (``.ptr``) or a numba stream (``.handle``).  A handle of 0 (a
    framework's name for its default stream) means the legacy stream.
    """
    if s is None:
        return 1
    if isinstance(s, bool):
        raise TypeError("dlbridge.stream: a bool is not a stream")
    if isinstance(s, int):
        if not -1 <= s <= _MAX_HANDLE:
            raise OverflowError(
                f"dlbridge.stream: {s} is outside -1 .. 2**64 - 1 (a CUDA "
                "stream handle is a pointer; -1 asks for no ordering)")
        if s == 0:
            raise ValueError(
                "dlbridge.stream: 0 is not a CUDA stream value (1 is the "
                "legacy default stream, 2 the per-thread default stream, "
                "-1 no ordering, anything larger a stream handle; 0 is "
                "ambiguous)")
        return s
    proto = getattr(type(s), "__cuda_stream__", None)
    if proto is not None:
        pair = proto(s)
        if (not isinstance(pair, tuple) or len(pair) != 2
                or not isinstance(pair[1], int)):
            raise TypeError(
                f"dlbridge.stream: {type(s).__name__}.__cuda_stream__() "
                f"returned {pair!r}, not a (version, handle) tuple")
        return pair[1] or 1
    for attr in ("cuda_stream", "ptr"):
        handle = getattr(s, attr, None)
        if isinstance(handle, int) and not isinstance(handle, bool):
            return handle or 1
    handle = getattr(s, "handle", None)
    value = getattr(handle, "value", handle)  # numba: a ctypes c_void_p
    if isinstance(value, int) and not isinstance(value, bool):
        return value or 1
    if handle is not None and value is None:
        return 1  # numba's default stream: a null handle
    raise TypeError(
        f"dlbridge.stream: cannot tell which CUDA stream a "
        f"{type(s).__module__}.{type(s).__qualname__} is (expected an int "
        "handle, None, or a stream object with __cuda_stream__, "
        ".cuda_stream, .ptr or .handle)")


class stream:
    """``with dlbridge.stream(s):`` makes ``s`` this thread's current stream
    for dlbridge until the block ends (exceptions included); blocks nest.

    ``s``: see :func:`stream_value`.  The stream must belong to the device
    of the tensors used inside the block.
    """

    __slots__ = ("value", "_saved")

    def __init__(self, s):
        self.value = stream_value(s)
        self._saved = []

    def __enter__(self):
        self._saved.append(_core._swap_stream(self.value))
        return self

    def __exit__(self, *exc):
        _core._swap_stream(self._saved.pop())
        return False

    def __repr__(self):
        return f"dlbridge.stream({self.value:#x})"


def _torch_stream(device_id):
    import sys
    torch = sys.modules["torch"]
    return torch.cuda.current_stream(device_id).cuda_stream or 1


def _cupy_stream(device_id):
    import sys
    cupy = sys.modules["cupy"]
    with cupy.cuda.Device(device_id):
        return cupy.cuda.get_current_stream().ptr or 1


_FRAMEWORK_STREAMS = {"torch": _torch_stream, "cupy": _cupy_stream}


def framework_stream(framework, device_id):
    """The stream value ``framework`` (a name, as dlbridge's handlers give
    it) currently works on for CUDA device ``device_id``: torch's and CuPy's
    current streams; dlbridge's own current stream for every other
    framework (JAX, numba, ... have no notion of a current stream that work
    from outside could join).  Called from C for types that publish no
    DLPack exchange table with current_work_stream."""
    get = _FRAMEWORK_STREAMS.get(framework)
    if get is not None:
        try:
            return get(device_id)
        except (KeyError, ImportError, AttributeError):
            pass  # not imported or no CUDA: fall back to ours
    return _core._current_stream()
