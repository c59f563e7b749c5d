"""A C extension built on dlbridge's C API (examples/extension/dlb_example_ext.c)
takes NumPy, torch and dlbridge tensors through one code path
(include/dlbridge/python.h: borrow a view, allocate like the input, export in
the caller's framework)."""

import numpy as np
import torch

import dlbridge as dlb
import dlb_example_ext as ext


def main():
    x_np = np.arange(4, dtype=np.float32)
    x_torch = torch.arange(4, dtype=torch.float64)
    x_dlb = dlb.tensor([1.0, 2.0, 3.0, 4.0], dtype="float32")
    for x in (x_np, x_torch, x_dlb, x_np[::-1]):
        r = ext.scale_add(x, x, 0.5)                 # 0.5 * x + x
        kind = f"{type(r).__module__}.{type(r).__name__}"
        values = r.tolist()
        print(f"  scale_add on {type(x).__module__:<9} -> {kind:<16} {values}")
        assert type(r) is type(x)
    print(f"  sum(torch tensor) = {ext.sum(x_torch)}, sum(numpy array) = {ext.sum(x_np)}")
    ro = np.arange(3.0)
    ro.flags.writeable = False
    try:
        ext.fill_(ro, 1.0)
    except BufferError as e:
        print(f"  fill_ on a read-only array: BufferError: {e}")


if __name__ == "__main__":
    main()
