"""One C kernel, every framework: dlbridge.load() + dlbridge.Function.

The kernels in examples/kernels/*.c are plain C functions with the dlb_kernel
ABI (include/dlbridge/dlbridge.h), built by meson into
build/libdlb_example_kernels.so.  dlbridge.load() gives a callable that takes
NumPy arrays, torch tensors or dlbridge Tensors, checks them against the
signature, allocates the results with the caller's framework and returns
them as the caller's type -- without copying any input.

Run with `make demo`, or: python examples/function_demo.py [path/to/lib.so]
"""
import os
import sys

import numpy as np

import dlbridge as dlb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    ROOT, "build", "libdlb_example_kernels.so")

saxpy = dlb.load(LIB, "dlb_kernel_saxpy",
                 "saxpy(a: float32, x: float32[n], y: mut float32[n])")
saxpy_out = dlb.load(LIB, "dlb_kernel_saxpy_out",
                     "saxpy(a: float32, x: float32[n], y: float32[n]) -> float32[n]")
matmul = dlb.load(LIB, "dlb_kernel_matmul",
                  "matmul(a: float32[m, k], b: float32[k, n]) -> float32[m, n]")
print("loaded:", saxpy, saxpy_out, matmul, sep="\n  ")


def show(label, value):
    """Print the value and the type it came back as."""
    shown = value.tolist() if isinstance(value, dlb.Tensor) else value
    print("  %-34s %-22s %s" % (label, type(value).__module__ + "." +
                                type(value).__qualname__, shown))


print("\nNumPy:")
x = np.arange(4, dtype=np.float32)
y = np.ones(4, dtype=np.float32)
saxpy(2.0, x, y)                       # in place, a Python float for a 0-d
show("saxpy(2, x, y) -> y", y)
show("saxpy_out(2, x, y)", saxpy_out(2.0, x, y))
a = np.arange(6, dtype=np.float32).reshape(2, 3)
b = np.arange(12, dtype=np.float32).reshape(4, 3)
c = matmul(a, b.T)                     # a transposed view: no copy
show("matmul(a, b.T)", c)
assert type(c) is np.ndarray and np.allclose(c, a @ b.T)

print("\ndlbridge.Tensor:")
tx = dlb.tensor([1.0, 2.0, 3.0], dtype="float32")
ty = dlb.zeros((3,))
saxpy(10.0, tx, ty)
show("saxpy(10, tx, ty) -> ty", ty)
r = saxpy_out(1.0, tx, ty)
show("saxpy_out(1, tx, ty)", r)
assert type(r) is dlb.Tensor

try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    print("\ntorch:")
    t = torch.arange(4, dtype=torch.float32)
    u = torch.ones(4)
    saxpy(3.0, t, u)
    show("saxpy(3, t, u) -> u", u)
    r = saxpy_out(1.0, t, u)
    show("saxpy_out(1, t, u)", r)
    assert type(r) is torch.Tensor
    m = matmul(torch.ones(2, 5), torch.ones(3, 5).t())
    show("matmul(ones(2,5), ones(3,5).t())", m)
    assert type(m) is torch.Tensor
else:
    print("\ntorch: not installed, skipped")

print("\nchecks happen before the kernel runs:")
for call in (lambda: saxpy(1.0, x, np.ones(3, np.float32)),
             lambda: saxpy(1.0, x.astype(np.float64), y),
             lambda: matmul(a, b)):
    try:
        call()
    except (TypeError, ValueError) as e:
        print("  %s: %s" % (type(e).__name__, e))
print("\nevery result came back as the caller's type.")
