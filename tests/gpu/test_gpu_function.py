"""dlbridge.Function with the example CUDA kernels on a real GPU (issue 8,
item 5): examples/kernels/saxpy.cu and matmul.cu, built by Meson into
libdlb_example_cuda_kernels.so (scripts/gpu-check passes its path in
DLB_EXAMPLE_CUDA_KERNELS), loaded with dlbridge.load and called from torch,
CuPy, JAX and dlbridge tensors: outputs come back as the caller's type on
the caller's device, with the right values; wrong devices are refused
before the kernel runs; a call captured in a torch CUDA graph replays.
"""

import numpy as np
import pytest

SAXPY = "saxpy(a: float32, x: float32[n], y: mut float32[n])"
SAXPY_OUT = "saxpy(a: float32, x: float32[n], y: float32[n]) -> float32[n]"
MATMUL = "matmul(a: float32[m, k], b: float32[k, n]) -> float32[m, n]"

# Small integers: every product and sum below is exact in float32, so the
# kernels' results are compared for equality.
N = 1000


@pytest.fixture(scope="module")
def k(request, cuda_kernels_lib):
    dlb = request.getfixturevalue("dlb")

    class K:
        saxpy = dlb.load(cuda_kernels_lib, "dlb_kernel_cuda_saxpy", SAXPY)
        saxpy_out = dlb.load(cuda_kernels_lib, "dlb_kernel_cuda_saxpy_out", SAXPY_OUT)
        matmul = dlb.load(cuda_kernels_lib, "dlb_kernel_cuda_matmul", MATMUL)
    return K


def _xy():
    x = np.arange(N, dtype=np.float32) % 97
    y = np.arange(N, dtype=np.float32) % 13
    return x, y


def _ab():
    a = (np.arange(70 * 45) * 37 % 11 - 5).astype(np.float32).reshape(70, 45)
    b = (np.arange(45 * 33) * 53 % 13 - 6).astype(np.float32).reshape(45, 33)
    return a, b


# ---- each framework: outputs as the caller's type -----------------------------

def test_torch(k, torch):
    x, y = _xy()
    tx, ty = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
    out = k.saxpy_out(2.0, tx, ty)
    assert type(out) is torch.Tensor and out.device == torch.device("cuda:0")
    np.testing.assert_array_equal(out.cpu().numpy(), 2 * x + y)
    np.testing.assert_array_equal(ty.cpu().numpy(), y)      # not written
    assert k.saxpy(3.0, tx, ty) is None                     # in place
    np.testing.assert_array_equal(ty.cpu().numpy(), 3 * x + y)
    a, b = _ab()
    ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    c = k.matmul(ta, tb)
    assert type(c) is torch.Tensor and c.is_cuda and tuple(c.shape) == (70, 33)
    np.testing.assert_array_equal(c.cpu().numpy(), a @ b)
    # a transposed operand, no copy needed by the kernel
    tbt = torch.from_numpy(np.ascontiguousarray(b.T)).cuda().t()
    np.testing.assert_array_equal(k.matmul(ta, tbt).cpu().numpy(), a @ b)


def test_torch_device_scalar(k, torch):
    x, y = _xy()
    a = torch.tensor(4.0, device="cuda:0")  # 0-d on the device: read in-kernel
    out = k.saxpy_out(a, torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda())
    np.testing.assert_array_equal(out.cpu().numpy(), 4 * x + y)


def test_cupy(k, cupy):
    x, y = _xy()
    cx, cy = cupy.asarray(x), cupy.asarray(y)
    out = k.saxpy_out(2.0, cx, cy)
    assert type(out) is cupy.ndarray and out.device.id == 0
    np.testing.assert_array_equal(cupy.asnumpy(out), 2 * x + y)
    k.saxpy(2.0, cx, cy[::-1])                              # negative stride
    np.testing.assert_array_equal(cupy.asnumpy(cy), 2 * x[::-1] + y)
    a, b = _ab()
    c = k.matmul(cupy.asarray(a), cupy.asarray(b))
    assert type(c) is cupy.ndarray
    np.testing.assert_array_equal(cupy.asnumpy(c), a @ b)


def test_cupy_on_its_non_default_stream(k, cupy, torch):
    """The kernel runs on CuPy's current stream: after a slow write on that
    stream, the kernel sees the written x."""
    cs = cupy.cuda.Stream(non_blocking=True)
    cx = cupy.zeros(N, dtype=cupy.float32)
    cy = cupy.ones(N, dtype=cupy.float32)
    cupy.cuda.runtime.deviceSynchronize()
    with cs:
        with torch.cuda.stream(torch.cuda.ExternalStream(cs.ptr)):
            torch.cuda._sleep(200_000_000)
        cx.fill(2.0)
        out = k.saxpy_out(3.0, cx, cy)
        host = cupy.asnumpy(out)
    assert (host == 7.0).all()


def test_jax(k, jax):
    x, y = _xy()
    dev = jax.devices("gpu")[0]
    jx, jy = jax.device_put(x, dev), jax.device_put(y, dev)
    out = k.saxpy_out(2.0, jx, jy)
    assert isinstance(out, jax.Array)
    assert out.devices() == {dev}
    np.testing.assert_array_equal(np.asarray(out), 2 * x + y)
    a, b = _ab()
    c = k.matmul(jax.device_put(a, dev), jax.device_put(b, dev))
    assert isinstance(c, jax.Array)
    np.testing.assert_array_equal(np.asarray(c), a @ b)


def test_dlbridge_tensors(k, dlb, torch):
    x, y = _xy()
    dx = dlb.from_dlpack(x, device="cuda:0", copy=True)
    dy = dlb.from_dlpack(y, device="cuda:0", copy=True)
    out = k.saxpy_out(2.0, dx, dy)
    assert type(out) is dlb.Tensor and out.device == "cuda:0"
    np.testing.assert_array_equal(np.asarray(out.copy(device="cpu")), 2 * x + y)


def test_numba_device_arrays(k, numba_cuda):
    # numba arrays reach the kernel through __cuda_array_interface__ (the
    # output's type is Function's choice for a framework without an
    # allocator dlbridge knows: only the values are checked).
    x, y = _xy()
    nx, ny = numba_cuda.to_device(x), numba_cuda.to_device(y)
    k.saxpy(2.0, nx, ny)
    numba_cuda.synchronize()
    np.testing.assert_array_equal(ny.copy_to_host(), 2 * x + y)


# ---- devices checked before the kernel runs ---------------------------------------

def test_cpu_and_cuda_mixed_refused_before_the_kernel(k, torch):
    x, y = _xy()
    tx_cpu = torch.from_numpy(x)
    ty = torch.from_numpy(y).cuda()
    with pytest.raises((ValueError, BufferError, TypeError), match="(?i)device|cuda|cpu"):
        k.saxpy(2.0, tx_cpu, ty)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(ty.cpu().numpy(), y)   # not written
    with pytest.raises((ValueError, BufferError, TypeError), match="(?i)device|cuda|cpu"):
        k.saxpy_out(2.0, ty, torch.from_numpy(y))


def test_two_gpus_refused_before_the_kernel(k, torch, gpu_count):
    if gpu_count < 2:
        pytest.skip("needs two GPUs")
    x, y = _xy()
    tx = torch.from_numpy(x).to("cuda:1")
    ty = torch.from_numpy(y).to("cuda:0")
    with pytest.raises((ValueError, BufferError), match="cuda:1|cuda:0|device"):
        k.saxpy(2.0, tx, ty)
    torch.cuda.synchronize(0)
    np.testing.assert_array_equal(ty.cpu().numpy(), y)


def test_second_gpu_output_on_that_gpu(k, torch, gpu_count):
    if gpu_count < 2:
        pytest.skip("needs two GPUs")
    x, y = _xy()
    out = k.saxpy_out(2.0, torch.from_numpy(x).to("cuda:1"),
                      torch.from_numpy(y).to("cuda:1"))
    assert out.device == torch.device("cuda:1")
    np.testing.assert_array_equal(out.cpu().numpy(), 2 * x + y)


# ---- torch CUDA graph capture -------------------------------------------------------

def test_graph_capture_and_replay(k, torch):
    """Function calls inside torch.cuda.graph: the in-place saxpy, saxpy
    with an output allocated during capture (torch's graph pool, on the
    capture stream) and the matmul; then two replays with new inputs."""
    x = torch.zeros(N, device="cuda:0")
    y = torch.zeros(N, device="cuda:0")
    acc = torch.zeros(N, device="cuda:0")
    a = torch.zeros(70, 45, device="cuda:0")
    b = torch.zeros(45, 33, device="cuda:0")
    # Warm up on a side stream, as torch asks before capturing (first use of
    # the kernels' module and of dlbridge's CUDA state happens here).
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        k.saxpy_out(1.0, x, y)
        k.matmul(a, b)
        k.saxpy(0.0, x, acc)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = k.saxpy_out(2.0, x, y)
        k.saxpy(1.0, out, acc)          # acc += out, in place
        c = k.matmul(a, b)

    for round_ in range(2):
        xs, ys = _xy()
        xs = xs + round_
        an, bn = _ab()
        an = an + round_
        x.copy_(torch.from_numpy(xs))
        y.copy_(torch.from_numpy(ys))
        acc.zero_()
        a.copy_(torch.from_numpy(an))
        b.copy_(torch.from_numpy(bn))
        g.replay()
        torch.cuda.synchronize()
        np.testing.assert_array_equal(out.cpu().numpy(), 2 * xs + ys)
        np.testing.assert_array_equal(acc.cpu().numpy(), 2 * xs + ys)
        np.testing.assert_array_equal(c.cpu().numpy(), an @ bn)


def test_torch_lazy_bits_read_on_the_fast_path(k, dlb, torch):
    """The conj/neg check on torch CUDA arguments reads torch's TensorImpl
    (torchbits.c) rather than asking each tensor (~50 ns a question); this
    fails when that experiment does not work with this torch build."""
    x = torch.ones(8, device="cuda:0")
    y = torch.zeros(8, device="cuda:0")
    k.saxpy(1.0, x, y)
    assert dlb._core._torch_bits_state() == 1
