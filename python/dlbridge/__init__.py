"""dlbridge: zero-copy tensor interchange between array frameworks through DLPack.

Importing dlbridge imports no array framework: a framework is recognised by
its type's module name once one of its objects is seen, and imported only
when a conversion into it is asked for.
"""

from ._core import (  # noqa: F401  (re-exported public API)
    DLPACK_MAJOR_VERSION,
    DLPACK_MINOR_VERSION,
    MAX_NDIM,
    Device,
    DType,
    Function,
    Tensor,
    __version__,
    device,
    dtype,
    empty,
    from_dlpack,
    load,
    share,
    tensor,
    zeros,
)
from ._frameworks import convert  # noqa: F401
from ._streams import stream  # noqa: F401
from ._ops_torch import watch_dynamo as _watch_dynamo

# torch.compile sees every Function as an operator from the moment
# torch._dynamo is imported (dlbridge/_ops_torch.py); torch is not imported.
_watch_dynamo()


def get_include():
    """The directory to put on the C compiler's include path (``-I``) to build
    an extension against ``<dlbridge/python.h>`` (which also brings in
    ``<dlbridge/dlbridge.h>`` and ``<dlpack/dlpack.h>``)."""
    import os.path

    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


def jax_register(*functions):
    """Make dlbridge Functions runnable by XLA graphs in this process: a
    process that runs a graph exported elsewhere (``jax.export``) creates
    the Functions it calls (same kernel and signature) and passes them
    here first.  A Function called inside ``jax.jit`` needs no call.
    docs/compiled.md, "JAX"."""
    from ._ops_jax import register

    register(*functions)


def jax_export_checks():
    """The ``disabled_checks`` for ``jax.export.export`` of a function that
    calls dlbridge Functions (dlbridge's XLA custom-call target is not on
    JAX's list of targets with a compatibility guarantee)."""
    from ._ops_jax import export_checks

    return export_checks()


__all__ = [
    "DType",
    "Device",
    "Function",
    "Tensor",
    "convert",
    "get_include",
    "jax_export_checks",
    "jax_register",
    "device",
    "dtype",
    "empty",
    "from_dlpack",
    "load",
    "share",
    "stream",
    "tensor",
    "zeros",
    "MAX_NDIM",
    "DLPACK_MAJOR_VERSION",
    "DLPACK_MINOR_VERSION",
    "__version__",
]
