"""A dlbridge.Function inside jax.jit on CUDA (issue 16 item 6, JAX part):
the XLA FFI handler (src/ops/xla.c) runs the example CUDA kernels on XLA's
own stream, with the device XLA runs on, and the jitted results equal the
eager ones; ordering is proven by slow work on that stream before the
kernel in the same graph (a large matmul by our own tiled kernel, and a
chain of XLA's matmuls), whose output the kernel reads.

Each check is a function run twice: on the GPU (skipped without one, like
every tests/gpu test) and on the host with the CPU example kernels (marked
runs_without_gpu), so the test code itself runs on every machine.  The CPU
run of the handler's CUDA path (stream and ordinal from XLA) is in
tests/python/test_compiled_jax.py, through a fake XLA.
"""

import ctypes

import numpy as np
import pytest

from gpu_helpers import kernels_lib

SAXPY = "saxpy(a: float32, x: float32[n], y: mut float32[n])"
SAXPY_OUT = "saxpy(a: float32, x: float32[n], y: float32[n]) -> float32[n]"
MATMUL = "matmul(a: float32[m, k], b: float32[k, n]) -> float32[m, n]"
# a result, to wait for: the handler has run once it is ready
RECORD = "record(x: float32[n]) -> float32[n]"
N = 1000


class Kernels:
    """The saxpy and matmul kernels of one platform, as Functions, and the
    recording kernel with the record it writes."""

    def __init__(self, dlb, lib, prefix, record_lib):
        self.saxpy = dlb.load(lib, prefix + "saxpy", SAXPY)
        self.saxpy_out = dlb.load(lib, prefix + "saxpy_out", SAXPY_OUT)
        self.matmul = dlb.load(lib, prefix + "matmul", MATMUL)
        self.record = dlb.load(record_lib, "dlb_kernel_record", RECORD)
        self.recorded = (ctypes.c_int64 * 4).in_dll(
            ctypes.CDLL(record_lib), "dlb_example_recorded")


@pytest.fixture(scope="module")
def on_gpu(request, jax):
    dlb = request.getfixturevalue("dlb")
    cuda_lib = request.getfixturevalue("cuda_kernels_lib")
    k = Kernels(dlb, cuda_lib, "dlb_kernel_cuda_", kernels_lib())
    return jax, k, jax.devices("gpu")[0]


@pytest.fixture(scope="module")
def on_host(dlb):
    jax = pytest.importorskip("jax")
    k = Kernels(dlb, kernels_lib(), "dlb_kernel_", kernels_lib())
    return jax, k, jax.devices("cpu")[0]


def _xy():
    x = np.arange(N, dtype=np.float32) % 97
    y = np.arange(N, dtype=np.float32) % 13
    return x, y


def _ab(m=70, k=45, n=33):
    a = (np.arange(m * k) * 37 % 11 - 5).astype(np.float32).reshape(m, k)
    b = (np.arange(k * n) * 53 % 13 - 6).astype(np.float32).reshape(k, n)
    return a, b


# ---- the checks ------------------------------------------------------------------

def check_jit_equals_eager(jax, k, dev):
    x, y = _xy()
    jx, jy = jax.device_put(x, dev), jax.device_put(y, dev)
    out = jax.jit(k.saxpy_out)(2.0, jx, jy)
    assert isinstance(out, jax.Array) and out.devices() == {dev}
    eager = k.saxpy_out(2.0, jx, jy)
    np.testing.assert_array_equal(np.asarray(out), 2 * x + y)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(eager))
    a, b = _ab()
    ja, jb = jax.device_put(a, dev), jax.device_put(b, dev)
    c = jax.jit(k.matmul)(ja, jb)
    assert c.devices() == {dev}
    np.testing.assert_array_equal(np.asarray(c), a @ b)
    np.testing.assert_array_equal(np.asarray(c), np.asarray(k.matmul(ja, jb)))
    # transposed operands: XLA relayouts them before the call
    c = jax.jit(lambda a, b: k.matmul(b.T, a.T))(ja, jb)
    np.testing.assert_array_equal(np.asarray(c), b.T @ a.T)
    # mut: the new value is returned, the caller's array is not written
    new = jax.jit(lambda x, y: k.saxpy(3.0, x, y))(jx, jy)
    np.testing.assert_array_equal(np.asarray(new), 3 * x + y)
    np.testing.assert_array_equal(np.asarray(jy), y)
    # vmap: one kernel call per row
    xs, ys = np.stack([x, y, x + y]), np.stack([y, x, x - y])
    got = jax.jit(jax.vmap(lambda x, y: k.saxpy_out(2.0, x, y)))(
        jax.device_put(xs, dev), jax.device_put(ys, dev))
    np.testing.assert_array_equal(np.asarray(got), 2 * xs + ys)


def check_stream_and_device(jax, k, dev, cuda):
    x, _ = _xy()
    calls = k.recorded[3]
    jax.jit(k.record)(jax.device_put(x, dev)).block_until_ready()
    assert k.recorded[3] == calls + 1
    stream, device_type, device_id = k.recorded[0], k.recorded[1], k.recorded[2]
    if cuda:
        # XLA's stream (a created stream, never the legacy NULL one) and
        # the GPU XLA runs the graph on
        assert stream != 0
        assert (device_type, device_id) == (2, dev.id)
    else:
        assert (stream, device_type, device_id) == (0, 1, 0)


def check_ordered_after_slow_work(jax, k, dev, size, reps):
    """In one graph: slow work on XLA's stream whose output the kernel
    reads.  A kernel launched anywhere but after that work on its stream
    reads a buffer not yet written."""
    jnp = jax.numpy
    x, y = _xy()
    # (1) our own tiled matmul on a large product, then saxpy on a row of it
    a, b = _ab(size, size, N)
    r = size // 3

    def g(a, b, y):
        c = k.matmul(a, b)
        return k.saxpy_out(2.0, c[r], y)

    out = jax.jit(g)(jax.device_put(a, dev), jax.device_put(b, dev),
                     jax.device_put(y, dev))
    np.testing.assert_array_equal(
        np.asarray(out),
        2 * (a[r].astype(np.float64) @ b.astype(np.float64)) + y)
    # (2) XLA's own matmuls (x @ p rolls x's columns by one)
    p = np.roll(np.eye(size, dtype=np.float32), 1, axis=1)
    m = (np.arange(size * size) % 89).astype(np.float32).reshape(size, size)
    n = min(size, N)

    def h(m, p, y):
        for _ in range(reps):
            m = jnp.matmul(m, p, precision="highest")
        return k.saxpy_out(2.0, m[r, :n], y)

    out = jax.jit(h)(jax.device_put(m, dev), jax.device_put(p, dev),
                     jax.device_put(y[:n], dev))
    np.testing.assert_array_equal(np.asarray(out),
                                  2 * np.roll(m, reps, axis=1)[r, :n] + y[:n])


# ---- on the GPU ----------------------------------------------------------------------

def test_jit_equals_eager_on_cuda(on_gpu):
    check_jit_equals_eager(*on_gpu)


def test_jit_passes_xlas_stream_and_device(on_gpu):
    check_stream_and_device(*on_gpu, cuda=True)


def test_jit_kernel_ordered_after_slow_work_on_xlas_stream(on_gpu):
    check_ordered_after_slow_work(*on_gpu, size=4096, reps=8)


# ---- the same checks on the host (this file's code on every machine) ----------------

@pytest.mark.runs_without_gpu
def test_jit_equals_eager_on_host(on_host):
    check_jit_equals_eager(*on_host)


@pytest.mark.runs_without_gpu
def test_jit_passes_no_stream_on_host(on_host):
    check_stream_and_device(*on_host, cuda=False)


@pytest.mark.runs_without_gpu
def test_jit_kernel_ordered_after_work_on_host(on_host):
    check_ordered_after_slow_work(*on_host, size=64, reps=3)
