"""Batch dimensions: one C kernel written for one vector, called on batches.

bscale (examples/kernels/batch.c) is declared

    bscale(a: float32[...], x: float32[..., n]) -> (y: float32[..., n])

`...` stands for leading batch dimensions, broadcast across a and x with
NumPy's rules; the kernel gets every `...` tensor at one batch rank (a
size-1 axis is its to broadcast) and walks the batch itself.  So a batched
call, and jax.vmap / torch.vmap of the Function, are ONE kernel call -- the
kernel's own counter (dlb_example_batch_calls, read with ctypes) says how
many ran.  vscale is the same kernel declared without `...`: under a vmap
dlbridge runs it once per item.  docs/function.md, "Batch dimensions".

Run with `make demo`, or: python examples/batch_demo.py [path/to/lib.so]
"""
import ctypes
import os
import sys

import numpy as np

import dlbridge as dlb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    ROOT, "build", "libdlb_example_kernels.so")

bscale = dlb.load(LIB, "dlb_kernel_bscale",
                  "bscale(a: float32[...], x: float32[..., n]) -> (y: float32[..., n])")
vscale = dlb.load(LIB, "dlb_kernel_vscale",
                  "vscale(a: float32, x: float32[n]) -> (y: float32[n])")
calls = ctypes.c_int64.in_dll(ctypes.CDLL(LIB), "dlb_example_batch_calls")
last = (ctypes.c_int64 * 17).in_dll(ctypes.CDLL(LIB), "dlb_example_batch_last")
print("loaded:", bscale, vscale, sep="\n  ")

failed = []


def show(label, fn, want, expect=1):
    """Run fn(), print its shape, the kernel calls it made and the batch
    shape of the last one; check it against want (NumPy's answer) and the
    count against expect.  A route this dlbridge does not have is printed,
    not fatal."""
    before = calls.value
    try:
        got = fn()
    except Exception as e:  # noqa: BLE001 -- shown, not fatal
        print("  %-40s not available here: %s: %s" % (
            label, type(e).__name__, str(e).splitlines()[0][:90]))
        failed.append(label)
        return
    n = calls.value - before
    batch = tuple(last[1:1 + last[0]])
    ok = np.array_equal(np.asarray(got), want)
    print("  %-40s %-11s %d kernel call%s (batch %s)%s%s" % (
        label, tuple(got.shape), n, "" if n == 1 else "s", batch,
        "" if ok else "  WRONG RESULT",
        "" if n == expect else "  (one per batch would be %d)" % expect))
    if not ok or n != expect:
        failed.append(label)


x = np.arange(4 * 3 * 5, dtype=np.float32).reshape(4, 3, 5)
a = np.array([1, 2, 3], dtype=np.float32)          # batch (3,) against (4, 3)

print("\nNumPy, eager: batch shapes broadcast")
show("bscale(2.0, x[0, 0])  (no batch)", lambda: bscale(2.0, x[0, 0]), 2 * x[0, 0])
show("bscale(a[3], x[4, 3, 5])", lambda: bscale(a, x), a[:, None] * x)
a41 = np.arange(1, 5, dtype=np.float32)[:, None]   # batch (4, 1)
show("bscale(a[4, 1], x[4, 3, 5])", lambda: bscale(a41, x), a41[..., None] * x)

try:
    import jax
    import jax.numpy as jnp
except ImportError:
    jax = None
if jax is not None:
    print("\nJAX: jax.vmap inside jax.jit")
    ja, jx = jnp.asarray(np.tile(a, (4, 1))), jnp.asarray(x)
    f = jax.jit(jax.vmap(bscale))
    show("jit(vmap(bscale))(a[4, 3], x[4, 3, 5])", lambda: f(ja, jx),
         np.tile(a, (4, 1))[..., None] * x)
    g = jax.jit(jax.vmap(jax.vmap(bscale)))
    show("jit(vmap(vmap(bscale)))", lambda: g(ja, jx),
         np.tile(a, (4, 1))[..., None] * x)
    v = jax.jit(jax.vmap(vscale))
    show("jit(vmap(vscale))  (no `...`)", lambda: v(ja[0], jx[0]),
         a[:, None] * x[0], expect=3)
else:
    print("\nJAX: not installed, skipped")

try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    print("\ntorch: torch.vmap")
    ta, tx = torch.from_numpy(np.tile(a, (4, 1))), torch.from_numpy(x)
    show("torch.vmap(bscale)(a[4, 3], x[4, 3, 5])",
         lambda: torch.vmap(bscale)(ta, tx), np.tile(a, (4, 1))[..., None] * x)
    show("torch.vmap(bscale, in_dims=(None, 0))",
         lambda: torch.vmap(bscale, in_dims=(None, 0))(ta[0], tx),
         a[:, None] * x)
    show("torch.vmap(vscale)  (no `...`)",
         lambda: torch.vmap(vscale)(ta[0], tx[0]), a[:, None] * x[0], expect=3)
else:
    print("\ntorch: not installed, skipped")

print("\nbatch shapes that do not broadcast are refused before the kernel runs:")
try:
    bscale(np.ones(2, np.float32), x)
except (ValueError, NotImplementedError) as e:
    print("  %s: %s" % (type(e).__name__, e))

if failed:
    print("\nnot as they should be (this build lacks their batch route): "
          + "; ".join(failed))
else:
    print("\none kernel call per batch for every `...` Function above; "
          "vscale, without `...`, one per item.")
