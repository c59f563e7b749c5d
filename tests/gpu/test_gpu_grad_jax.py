"""jax.jit(jax.grad(...)) through a CUDA dlbridge.Function (issue 24 item 6;
docs/compiled.md "Gradients"): the forward and the vjp of
examples/kernels/autodiff.cu run as XLA custom calls on XLA's stream.  The
softmax pair spins for milliseconds first, so the gradient is right only when
each kernel ran on the stream XLA ordered it on: the mul before the softmax,
the softmax's vjp after XLA's own ops that make its cotangent.  Skipped,
like every test here, without a GPU."""

import numpy as np

MUL = "mul(a: float32[n], b: float32[n]) -> (y: float32[n])"
SOFTMAX = "softmax(x: float32[n]) -> (y: float32[n])"
SOFTMAX_VJP = "softmax_vjp(y: float32[n], dy: float32[n]) -> (dx: float32[n])"
N = 1000


def test_jit_grad_on_cuda_in_xla_stream_order(dlb, jax, cuda_kernels_lib):
    c = "dlb_kernel_cuda_"
    mul = dlb.load(cuda_kernels_lib, c + "mul_f32", MUL, vjp=c + "mul_f32_vjp")
    softmax = dlb.load(cuda_kernels_lib, c + "softmax_f32_slow", SOFTMAX,
                       vjp=(c + "softmax_f32_vjp_slow", SOFTMAX_VJP))
    rng = np.random.default_rng(0)
    a, b, w = (rng.normal(size=N).astype(np.float32) for _ in range(3))
    gpu = jax.devices("gpu")[0]
    ja, jb, jw = (jax.device_put(v, gpu) for v in (a, b, w))

    def loss(a, b):
        # XLA's own ops on both sides of each kernel: 2 * w is made before
        # the softmax's vjp reads its cotangent
        return (softmax(mul(a, b)) * (2.0 * jw)).sum()

    da, db = jax.jit(jax.grad(loss, argnums=(0, 1)))(ja, jb)
    y = np.exp(a * b - (a * b).max())
    y /= y.sum()
    dz = y * (2 * w - (y * 2 * w).sum())
    np.testing.assert_allclose(np.asarray(da), dz * b, rtol=2e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(db), dz * a, rtol=2e-4, atol=1e-6)
    assert list(da.devices())[0] == gpu
