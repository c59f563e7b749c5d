"""dlbridge demo: tensors from NumPy and PyTorch go through dlbridge and back
without a copy, and the printed data pointers prove it."""

import numpy as np
import torch

import dlbridge as dlb


def show(label, ptr, obj):
    print(f"  {label:<34} data_ptr=0x{ptr:x}  {type(obj).__module__}.{type(obj).__name__}")


def main():
    print(f"dlbridge {dlb.__version__}, numpy {np.__version__}, torch {torch.__version__}\n")

    # NumPy -> dlbridge -> NumPy, with a layout most consumers get wrong:
    # a reversed, strided view with a non-zero offset into its buffer.
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    a = base[1:, ::-2]
    print("NumPy array a = base[1:, ::-2], shape", a.shape, "strides (bytes)", a.strides)
    t = dlb.from_dlpack(a)
    back = np.from_dlpack(t)
    show("a", a.ctypes.data, a)
    show("dlb.from_dlpack(a)", t.data_ptr, t)
    show("np.from_dlpack(that)", back.ctypes.data, back)
    print(f"  dlbridge sees shape {t.shape}, strides {t.strides} (elements), {t.dtype}")
    assert a.ctypes.data == t.data_ptr == back.ctypes.data
    assert np.array_equal(back, a)
    back[0, 0] = -1.0                     # one memory: the write shows in a
    print("  wrote -1 through the round trip; a[0, 0] is now", a[0, 0], "\n")

    # torch -> dlbridge -> torch, a transposed view.
    x = torch.arange(12, dtype=torch.float64).reshape(3, 4).t()
    print("torch tensor x = arange(12).reshape(3, 4).t(), strides", x.stride())
    tx = dlb.from_dlpack(x)
    y = torch.from_dlpack(tx)
    show("x", x.data_ptr(), x)
    show("dlb.from_dlpack(x)", tx.data_ptr, tx)
    show("torch.from_dlpack(that)", y.data_ptr(), y)
    assert x.data_ptr() == tx.data_ptr == y.data_ptr() and torch.equal(x, y)

    # straight across frameworks, still no copy
    z = dlb.convert(x, "numpy")
    show("dlb.convert(x, 'numpy')", z.ctypes.data, z)
    assert z.ctypes.data == x.data_ptr()

    # read-only memory stays read-only across the bridge
    ro = np.arange(4.0)
    ro.flags.writeable = False
    tro = dlb.from_dlpack(ro)
    print(f"\nread-only NumPy array -> Tensor.readonly = {tro.readonly}; "
          f"back in NumPy, writeable = {np.from_dlpack(tro).flags.writeable}")
    print("\nall pointers matched: zero copies.")


if __name__ == "__main__":
    main()
