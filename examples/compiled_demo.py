"""The same dlbridge.Function inside each framework's compiler: jax.jit,
torch.compile and tf.function (docs/compiled.md).

Nothing here is written for a compiler: the shapes, dtypes, fake kernels
and aliasing each one needs come from the signature.  Every compiled answer
is checked against NumPy and against the eager call of the same Function.

Run with `make demo`, or: python examples/compiled_demo.py [path/to/lib.so]
"""
import os
import sys
import time

import numpy as np

import dlbridge as dlb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    ROOT, "build", "libdlb_example_kernels.so")

matmul = dlb.load(LIB, "dlb_kernel_matmul",
                  "matmul(a: float32[m, k], b: float32[k, n]) -> float32[m, n]")
saxpy = dlb.load(LIB, "dlb_kernel_saxpy",
                 "saxpy(a: float32, x: float32[n], y: mut float32[n])")
print("one kernel, three compilers: %s (compiled as %s)"
      % (matmul.signature, matmul._identity))

a = np.arange(6, dtype=np.float32).reshape(2, 3)
b = np.arange(12, dtype=np.float32).reshape(3, 4)
x = np.arange(4, dtype=np.float32)
y = np.ones(4, dtype=np.float32)
want_mm, want_saxpy = a @ b, 2 * x + y


def report(framework, compiled_mm, eager_mm, new_y, y_after, seconds):
    assert np.allclose(compiled_mm, want_mm) and np.allclose(eager_mm, want_mm)
    assert np.allclose(new_y, want_saxpy)
    print("  %-34s matmul == NumPy == eager; saxpy's mut y -> %s, %s "
          "(first call, tracing included: %.2f s)"
          % (framework, np.asarray(new_y).tolist(), y_after, seconds))


def try_jax():
    import jax
    import jax.numpy as jnp

    @jax.jit
    def step(a, b, x, y):
        # an immutable framework: saxpy's new y comes back as a result
        return matmul(a, b), saxpy(2.0, x, y)

    aj, bj, xj, yj = map(jnp.asarray, (a, b, x, y))
    t0 = time.perf_counter()
    mm, new_y = step(aj, bj, xj, yj)
    jax.block_until_ready(mm)
    report("jax.jit (an XLA FFI custom call)", np.asarray(mm),
           np.asarray(matmul(aj, bj)), new_y,
           "the caller's y unchanged" if np.allclose(yj, y) else "y WRITTEN",
           time.perf_counter() - t0)
    batched = jax.vmap(matmul, in_axes=(0, None))(jnp.stack([aj, aj + 1]), bj)
    assert np.allclose(batched[1], (a + 1) @ b)


def try_torch():
    import torch

    def step(a, b, x, y):
        saxpy(2.0, x, y)              # torch tensors are written in place
        return matmul(a, b)

    ta, tb, tx, ty = map(torch.from_numpy, (a, b, x, y.copy()))
    compiled = torch.compile(step, fullgraph=True, backend="inductor")
    t0 = time.perf_counter()
    mm = compiled(ta, tb, tx, ty)
    seconds = time.perf_counter() - t0
    breaks = torch._dynamo.explain(step)(ta, tb, tx, ty.clone()).graph_break_count
    report("torch.compile (a torch operator)", mm.numpy(),
           matmul(ta, tb).numpy(), ty.numpy(),
           "written in place, %d graph breaks" % breaks, seconds)


def try_tensorflow():
    import tensorflow as tf

    @tf.function
    def step(a, b, x, y):
        return matmul(a, b), saxpy(2.0, x, y)

    ta, tb, tx, ty = map(tf.constant, (a, b, x, y))
    t0 = time.perf_counter()
    mm, new_y = step(ta, tb, tx, ty)
    report("tf.function (the DlbridgeCall op)", mm.numpy(),
           matmul(ta, tb).numpy(), new_y.numpy(),
           "the caller's y unchanged" if np.allclose(ty, y) else "y WRITTEN",
           time.perf_counter() - t0)


for name, run in (("jax", try_jax), ("torch", try_torch),
                  ("tensorflow", try_tensorflow)):
    try:
        __import__(name)
    except ImportError:
        print("  %-34s not installed, skipped" % name)
        continue
    run()
print("the same Function object, eager and compiled, in every framework.")
