"""A dlbridge.Function as a torch operator on a real GPU (issue 16 item 6,
docs/compiled.md "PyTorch"): the example CUDA kernels called as f(...)
inside torch.compile(fullgraph=True) on CUDA tensors give the eager and
NumPy results; the operator launches on torch's current stream (a slow
kernel queued before it on the same non-default stream is waited for);
mode="reduce-overhead" captures the calls into a CUDA graph (no cudagraph
skip) and its replays are right, also after a slow kernel on the stream.
Skipped, like every test here, without a GPU.
"""

import numpy as np
import pytest

from gpu_helpers import SLEEP_CYCLES

SAXPY = "saxpy(a: float32, x: float32[n], y: mut float32[n])"
SAXPY_OUT = "saxpy(a: float32, x: float32[n], y: float32[n]) -> float32[n]"
MATMUL = "matmul(a: float32[m, k], b: float32[k, n]) -> float32[m, n]"
N = 1000


@pytest.fixture(scope="module")
def k(request, cuda_kernels_lib):
    dlb = request.getfixturevalue("dlb")

    class K:
        saxpy = dlb.load(cuda_kernels_lib, "dlb_kernel_cuda_saxpy", SAXPY)
        saxpy_out = dlb.load(cuda_kernels_lib, "dlb_kernel_cuda_saxpy_out",
                             SAXPY_OUT)
        matmul = dlb.load(cuda_kernels_lib, "dlb_kernel_cuda_matmul", MATMUL)
    return K


def host(seed):
    # small integers: exact in float32, so results compare for equality
    rng = np.random.default_rng(seed)
    a = rng.integers(-4, 5, (70, 45)).astype(np.float32)
    b = rng.integers(-4, 5, (45, 33)).astype(np.float32)
    x = rng.integers(-4, 5, N).astype(np.float32)
    y = rng.integers(-4, 5, N).astype(np.float32)
    return a, b, x, y


def on_gpu(torch, *arrays):
    return [torch.from_numpy(a.copy()).cuda() for a in arrays]


def test_compiled_on_cuda_equals_numpy_and_eager(k, torch):
    def f(a, b, x, y):
        c = k.matmul(a, b)
        z = k.saxpy_out(2.0, x, y)
        k.saxpy(3.0, x, y)
        return c, z
    explained = torch._dynamo.explain(f)(*on_gpu(torch, *host(0)))
    assert explained.graph_break_count == 0
    g = torch.compile(f, backend="inductor", fullgraph=True)
    for seed in (1, 2):
        a, b, x, y = host(seed)
        ta, tb, tx, ty = on_gpu(torch, a, b, x, y)
        c, z = g(ta, tb, tx, ty)
        assert c.is_cuda and z.is_cuda
        np.testing.assert_array_equal(c.cpu().numpy(), a @ b)
        np.testing.assert_array_equal(z.cpu().numpy(), 2 * x + y)
        np.testing.assert_array_equal(ty.cpu().numpy(), 3 * x + y)
        ea, eb, ex, ey = on_gpu(torch, a, b, x, y)
        ec, ez = f(ea, eb, ex, ey)
        assert torch.equal(c, ec) and torch.equal(z, ez) and torch.equal(ty, ey)


def test_compiled_launches_on_torchs_current_stream(k, torch):
    """On a non-default stream: a slow kernel, then a write to x, then the
    compiled call -- which must see the written x."""
    g = torch.compile(lambda x, y: k.saxpy_out(3.0, x, y), backend="inductor",
                      fullgraph=True)
    x = torch.zeros(N, device="cuda")
    y = torch.ones(N, device="cuda")
    g(x, y)                               # compiled before the timed part
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(SLEEP_CYCLES)
        x.fill_(2.0)
        out = g(x, y)
    s.synchronize()
    assert (out.cpu() == 7.0).all()


def test_reduce_overhead_captures_and_replays(k, torch):
    from torch._dynamo.utils import counters

    def f(a, b, x, y):
        return k.matmul(a, b), k.saxpy_out(2.0, x, y)
    counters.clear()
    g = torch.compile(f, mode="reduce-overhead", fullgraph=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        # warm-up, record, then replays with new values each time
        for seed in range(5):
            a, b, x, y = host(seed)
            c, z = g(*on_gpu(torch, a, b, x, y))
            # a replay's outputs are overwritten by the next one: copy now
            np.testing.assert_array_equal(c.cpu().numpy(), a @ b)
            np.testing.assert_array_equal(z.cpu().numpy(), 2 * x + y)
        # a replay after a slow kernel and a write on the same stream
        a, b, x, y = host(7)
        ta, tb, tx, ty = on_gpu(torch, a, b, x, y)
        torch.cuda._sleep(SLEEP_CYCLES)
        tx.fill_(5.0)
        c, z = g(ta, tb, tx, ty)
        z = z.clone()
    s.synchronize()
    np.testing.assert_array_equal(z.cpu().numpy(), 10.0 + y)
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(
        counters["inductor"])
    from torch._inductor import cudagraph_trees
    manager = cudagraph_trees.get_manager(torch.cuda.current_device(),
                                          create_if_none_exists=False)
    assert manager is not None and manager.roots, "no CUDA graph recorded"


def test_reduce_overhead_mut_on_a_static_input(k, torch):
    """A `mut` parameter written in place inside a captured graph: the
    buffer is static (as a module's buffer or parameter is), which CUDA
    graph trees accept for in-place writes."""
    from torch._dynamo.utils import counters

    def f(x, acc):
        k.saxpy(2.0, x, acc)          # acc += 2 x, in place
        return acc
    counters.clear()
    acc = torch.zeros(N, device="cuda")
    torch._dynamo.mark_static_address(acc)
    g = torch.compile(f, mode="reduce-overhead", fullgraph=True)
    total = np.zeros(N, np.float32)
    for seed in range(5):
        _, _, x, _ = host(seed)
        g(torch.from_numpy(x).cuda(), acc)
        total += 2 * x
        np.testing.assert_array_equal(acc.cpu().numpy(), total)
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(
        counters["inductor"])
