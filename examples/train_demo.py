"""Train through C kernels in torch, JAX and TensorFlow: one declaration
each of a forward kernel and its vjp, gradients in every framework.

Two kernels of examples/kernels/autodiff.c, each with its vjp kernel:
    scale(a: float64, x: float64[n]) -> (y: float64[n])       y = a x
    softmax(x: float64[n]) -> (y: float64[n])
scale's vjp signature is derived by dlbridge from the forward's
(scale_vjp(a, x, dy) -> (da, dx)); softmax's is spelled, because its vjp
reads the saved result instead of the input: softmax_vjp(y, dy) -> (dx).

The model: a temperature `a` (a 0-d parameter) and logits `x`, fitted so
that softmax(a x) matches a target distribution p under the cross-entropy
-sum(p log softmax(a x)).  Each framework runs a few steps of gradient
descent with its own autodiff; before training, its gradient is checked
against central finite differences of the same loss evaluated through the
kernels on NumPy arrays.

Run with `make demo`, or: python examples/train_demo.py [path/to/lib.so]
"""
import importlib.util
import os
import sys

import numpy as np

import dlbridge as dlb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    ROOT, "build", "libdlb_example_kernels.so")

scale = dlb.load(LIB, "dlb_kernel_scale",
                 "scale(a: float64, x: float64[n]) -> (y: float64[n])",
                 vjp="dlb_kernel_scale_vjp")
softmax = dlb.load(LIB, "dlb_kernel_softmax",
                   "softmax(x: float64[n]) -> (y: float64[n])",
                   vjp=("dlb_kernel_softmax_vjp",
                        "softmax_vjp(y: float64[n], dy: float64[n]) -> (dx: float64[n])"))
print("declared:", scale, softmax, sep="\n  ")

TARGET = np.array([0.05, 0.1, 0.6, 0.2, 0.05])
A0, X0 = 0.5, np.array([0.3, -0.2, 0.4, 0.1, 0.0])
STEPS, RATE = 60, 0.5


def numpy_loss(a, x):
    y = np.asarray(softmax(scale(a, x)))
    return float(-(TARGET * np.log(y)).sum())


def finite_differences(a, x, h=1e-6):
    """Central differences of numpy_loss in a and in each x[i]."""
    da = (numpy_loss(a + h, x) - numpy_loss(a - h, x)) / (2 * h)
    dx = np.empty_like(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e[i] = h
        dx[i] = (numpy_loss(a, x + e) - numpy_loss(a, x - e)) / (2 * h)
    return da, dx


FD = finite_differences(A0, X0)


def report(name, grads, losses):
    da, dx = (np.asarray(g, dtype=np.float64) for g in grads)
    err = max(abs(float(da) - FD[0]), float(np.abs(dx - FD[1]).max()))
    assert err < 1e-6, f"{name}: gradient differs from finite differences by {err:.2e}"
    assert losses[-1] < losses[0], f"{name}: the loss did not decrease"
    print(f"  {name:<11} |grad - finite differences| = {err:.1e};  loss "
          f"{losses[0]:.4f} -> {losses[-1]:.4f} in {STEPS} steps")


def torch_training():
    import torch
    p = torch.tensor(TARGET, dtype=torch.float64)

    def loss_of(a, x):
        return -(p * softmax(scale(a, x)).log()).sum()

    # Eagerly, then compiled: one graph for the forward and one for the
    # backward, both calling the kernels' operators.
    for name, fn in (("torch", loss_of),
                     ("torch.compile", torch.compile(loss_of, fullgraph=True))):
        a = torch.tensor(A0, dtype=torch.float64, requires_grad=True)
        x = torch.tensor(X0, dtype=torch.float64, requires_grad=True)
        grads = torch.autograd.grad(fn(a, x), (a, x))
        opt = torch.optim.SGD([a, x], lr=RATE)
        losses = []
        for _ in range(STEPS):
            opt.zero_grad()
            loss = fn(a, x)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        report(name, grads, losses)


def jax_training():
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    p = jnp.asarray(TARGET)

    def loss_of(a, x):
        return -(p * jnp.log(softmax(scale(a, x)))).sum()
    value_and_grad = jax.jit(jax.value_and_grad(loss_of, argnums=(0, 1)))
    a, x = jnp.float64(A0), jnp.asarray(X0)
    grads = value_and_grad(a, x)[1]
    losses = []
    for _ in range(STEPS):
        loss, (da, dx) = value_and_grad(a, x)
        a, x = a - RATE * da, x - RATE * dx
        losses.append(float(loss))
    report("jax.jit", grads, losses)


def tf_training():
    import tensorflow as tf
    p = tf.constant(TARGET)
    a = tf.Variable(A0, dtype=tf.float64)
    x = tf.Variable(X0)

    def loss_of():
        return -tf.reduce_sum(p * tf.math.log(softmax(scale(a, x))))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_of()
        da, dx = tape.gradient(loss, [a, x])
        a.assign_sub(RATE * da)
        x.assign_sub(RATE * dx)
        return loss
    with tf.GradientTape() as tape:   # eagerly, the Variables read by the kernels
        loss = loss_of()
    grads = tape.gradient(loss, [a, x])
    losses = [float(step()) for _ in range(STEPS)]
    report("tf.function", grads, losses)


print(f"\ntraining softmax(a x) towards p = {TARGET.tolist()}:")
for module, train in (("torch", torch_training), ("jax", jax_training),
                      ("tensorflow", tf_training)):
    if importlib.util.find_spec(module) is None:
        print(f"  {module:<11} not installed")
        continue
    train()
