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
    Tensor,
    __version__,
    device,
    dtype,
    empty,
    from_dlpack,
    tensor,
    zeros,
)
from ._frameworks import convert  # noqa: F401

__all__ = [
    "DType",
    "Device",
    "Tensor",
    "convert",
    "device",
    "dtype",
    "empty",
    "from_dlpack",
    "tensor",
    "zeros",
    "MAX_NDIM",
    "DLPACK_MAJOR_VERSION",
    "DLPACK_MINOR_VERSION",
    "__version__",
]
