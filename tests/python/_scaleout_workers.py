"""Functions the scale-out tests run inside worker processes (multiprocessing,
Dask, Ray).  A module of its own so every engine can import it by name."""

import numpy as np

import dlbridge as dlb

MIB = 1 << 20
NBYTES = 64 * MIB
MARK_AT = 12345


def base_array():
    """64 MiB of float32 with a known pattern."""
    return (np.arange(NBYTES // 4, dtype=np.float32) % 251.0)


def make(framework, base):
    """A 64 MiB tensor of framework holding base's values."""
    if framework == "numpy":
        return base.copy()
    if framework == "dlbridge":
        return dlb.from_dlpack(base.copy())
    if framework == "torch":
        import torch
        return torch.from_numpy(base.copy())
    if framework == "jax":
        import jax.numpy as jnp
        return jnp.asarray(base)
    if framework == "tensorflow":
        import tensorflow as tf
        return tf.constant(base)
    if framework == "pyarrow":
        import pyarrow as pa
        return pa.array(base)
    raise ValueError(framework)


def inspect(t, mark=None):
    """Run in a worker on what arrived: where it lives and what it holds.
    Writes mark at MARK_AT when the tensor is writable, so the sender can
    see whether the worker's memory is its own."""
    a = np.asarray(dlb.convert(t, "numpy"))
    info = {
        "type": type(t).__name__,
        "is_shared": bool(getattr(t, "is_shared", False)),
        "readonly": not a.flags.writeable,
        "size": int(a.size),
        "head": float(a[:1000].sum()),
        "ptr": int(a.__array_interface__["data"][0]),
    }
    if mark is not None and a.flags.writeable:
        a[MARK_AT] = mark
    return info


def shared_full(n, value):
    """Made in a pool worker: a shared tensor the worker drops once it is
    returned (its handle is in flight while the parent reads it)."""
    return dlb.share(np.full(n, value, dtype=np.float64))
