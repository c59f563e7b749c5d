"""A `...` Function on CUDA under jax.vmap inside jax.jit and under
torch.vmap (issue 25 item 6; docs/function.md "Batch dimensions"): the
kernel of examples/kernels/batch.cu (bscale: y = a x, a: float32[...],
x: float32[..., n]) launches ONCE per executed batch -- its host-side launch
counter says so, with the batch shape it got -- on the framework's stream
(XLA's, a created stream; torch's current one, also a side stream after a
slow kernel there), and the result equals the framework's own formula
(a[..., None] * x).  vscale, the same kernel declared without `...`, is
right under each vmap with one launch per item.

Each check is a function run twice, like test_gpu_compiled_jax.py: on the
GPU (skipped without one, like every tests/gpu test) and on the host with
batch.c's CPU kernels (marked runs_without_gpu), so the code of the checks
runs on every machine.  Until the batch routes have landed (an eager call
or, for JAX, a call in a jitted graph still refuses batch dimensions with
"not implemented yet", or torch.vmap still hands the Function a
BatchedTensor), the host runs skip saying so; any other failure fails.  scripts/gpu-check runs this file with the rest of
tests/gpu.
"""

import ctypes

import numpy as np
import pytest

from gpu_helpers import SLEEP_CYCLES, kernels_lib

BSCALE = "bscale(a: float32[...], x: float32[..., n]) -> (y: float32[..., n])"
VSCALE = "vscale(a: float32, x: float32[n]) -> (y: float32[n])"
B, B2, N = 64, 3, 37
# What a call fails with while the batch routes are not in this tree.
PENDING = ("are not implemented yet", "Cannot access data pointer")


class Kernels:
    """bscale and vscale of one platform as Functions, and their launch
    counters: calls(), last() (the batch shape of the last launch) and
    stream() (the stream it went on; None for the CPU kernels, which have
    none)."""

    def __init__(self, dlb, lib, prefix, counters):
        self.bscale = dlb.load(lib, prefix + "bscale", BSCALE)
        self.vscale = dlb.load(lib, prefix + "vscale", VSCALE)
        so = ctypes.CDLL(lib)
        self._calls = ctypes.c_int64.in_dll(so, counters + "_calls")
        self._last = (ctypes.c_int64 * 17).in_dll(so, counters + "_last")
        self._stream = (ctypes.c_uint64.in_dll(so, counters + "_stream")
                        if prefix.endswith("cuda_") else None)

    def calls(self):
        return self._calls.value

    def last(self):
        return tuple(self._last[1:1 + self._last[0]])

    def stream(self):
        return None if self._stream is None else self._stream.value


def cuda_kernels(dlb, lib):
    return Kernels(dlb, lib, "dlb_kernel_cuda_", "dlb_example_cuda_batch")


def host_kernels(dlb):
    return Kernels(dlb, kernels_lib(), "dlb_kernel_", "dlb_example_batch")


def pending(exc):
    """Skip (saying why) when exc is how a call fails before the batch
    routes exist; otherwise re-raise."""
    if any(p in str(exc) for p in PENDING):
        pytest.skip("the batch routes have not landed in this tree: "
                    + str(exc).splitlines()[0][:160])
    raise exc


def host_data(seed, *shape):
    # small integers: products exact in float32, so results compare equal
    rng = np.random.default_rng(seed)
    return rng.integers(-4, 5, shape).astype(np.float32)


def once(k, fn):
    """fn() and the launches it made: (result, calls, last batch shape)."""
    before = k.calls()
    try:
        out = fn()
    except Exception as e:  # pending() re-raises all but the known two
        pending(e)
    return out, k.calls() - before, k.last()


# ---- JAX: jax.vmap inside jax.jit --------------------------------------------------

def check_jax_vmap_one_launch(jax, k, dev):
    a, x = host_data(0, B), host_data(1, B, N)
    ja, jx = jax.device_put(a, dev), jax.device_put(x, dev)
    f = jax.jit(jax.vmap(k.bscale))
    f(ja, jx).block_until_ready()                  # compiled outside the count
    out, calls, last = once(k, lambda: f(ja, jx).block_until_ready())
    assert (calls, last) == (1, (B,))
    assert out.devices() == {dev}
    want = jax.jit(lambda a, x: a[:, None] * x)(ja, jx)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(want))
    # an unbatched a (0-d), and a vmap over axis 1 of x
    g = jax.jit(jax.vmap(k.bscale, in_axes=(None, 1), out_axes=1))
    xt = jax.device_put(np.ascontiguousarray(x.T), dev)
    g(ja[3], xt).block_until_ready()
    out, calls, last = once(k, lambda: g(ja[3], xt).block_until_ready())
    assert (calls, last) == (1, (B,))
    np.testing.assert_array_equal(np.asarray(out), a[3] * x.T)
    # nested: both mapped axes folded into `...`, still one launch
    x3 = host_data(2, B2, B, N)
    a2 = host_data(3, B2, B)
    h = jax.jit(jax.vmap(jax.vmap(k.bscale)))
    ja2, jx3 = jax.device_put(a2, dev), jax.device_put(x3, dev)
    h(ja2, jx3).block_until_ready()
    out, calls, last = once(k, lambda: h(ja2, jx3).block_until_ready())
    assert (calls, last) == (1, (B2, B))
    want = jax.jit(lambda a, x: a[..., None] * x)(ja2, jx3)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(want))
    # without `...`: right, one launch per item
    v = jax.jit(jax.vmap(k.vscale))
    v(ja, jx).block_until_ready()
    out, calls, _ = once(k, lambda: v(ja, jx).block_until_ready())
    assert calls == B
    np.testing.assert_array_equal(np.asarray(out), a[:, None] * x)


def check_jax_stream(jax, k, dev, cuda):
    a, x = host_data(4, B), host_data(5, B, N)
    f = jax.jit(jax.vmap(k.bscale))
    _, calls, _ = once(k, lambda: f(jax.device_put(a, dev),
                                    jax.device_put(x, dev)).block_until_ready())
    assert calls == 1
    if cuda:
        assert k.stream() != 0         # XLA's stream, never the legacy one
    else:
        assert k.stream() is None


def check_jax_ordered_after_slow_work(jax, k, dev, size, reps):
    """In one graph: XLA's own matmuls (m @ p rolls m's columns by one),
    then the vmapped kernel on rows of the product.  A launch anywhere but
    after that work on XLA's stream reads rows not yet written."""
    jnp = jax.numpy
    p = np.roll(np.eye(size, dtype=np.float32), 1, axis=1)
    m = (np.arange(size * size) % 89).astype(np.float32).reshape(size, size)
    a = host_data(6, B)
    n = min(size, N)

    def g(m, p, a):
        for _ in range(reps):
            m = jnp.matmul(m, p, precision="highest")
        return jax.vmap(k.bscale)(a, m[:B, :n])

    out, calls, _ = once(k, lambda: jax.jit(g)(
        jax.device_put(m, dev), jax.device_put(p, dev),
        jax.device_put(a, dev)).block_until_ready())
    assert calls == 1
    np.testing.assert_array_equal(
        np.asarray(out), a[:, None] * np.roll(m, reps, axis=1)[:B, :n])


# ---- torch: torch.vmap ---------------------------------------------------------------

def check_torch_vmap_one_launch(torch, k, device):
    a, x = host_data(7, B), host_data(8, B, N)
    ta, tx = torch.from_numpy(a).to(device), torch.from_numpy(x).to(device)
    out, calls, last = once(k, lambda: torch.vmap(k.bscale)(ta, tx))
    assert (calls, last) == (1, (B,))
    assert out.device == tx.device
    assert torch.equal(out, ta[:, None] * tx)
    # in_dims: an unbatched 0-d a, x mapped along axis 1
    txt = tx.t().contiguous()
    out, calls, last = once(
        k, lambda: torch.vmap(k.bscale, in_dims=(None, 1), out_dims=1)(ta[3], txt))
    assert (calls, last) == (1, (B,))
    assert torch.equal(out, ta[3] * txt)
    # nested
    a2 = torch.from_numpy(host_data(9, B2, B)).to(device)
    x3 = torch.from_numpy(host_data(10, B2, B, N)).to(device)
    out, calls, last = once(k, lambda: torch.vmap(torch.vmap(k.bscale))(a2, x3))
    assert (calls, last) == (1, (B2, B))
    assert torch.equal(out, a2[..., None] * x3)
    # without `...`: right, one launch per item
    out, calls, _ = once(k, lambda: torch.vmap(k.vscale)(ta, tx))
    assert calls == B
    assert torch.equal(out, ta[:, None] * tx)


def check_torch_stream(torch, k, device, cuda):
    a, x = host_data(11, B), host_data(12, B, N)
    ta, tx = torch.from_numpy(a).to(device), torch.from_numpy(x).to(device)
    if not cuda:
        _, calls, _ = once(k, lambda: torch.vmap(k.bscale)(ta, tx))
        assert calls == 1 and k.stream() is None
        return
    _, calls, _ = once(k, lambda: torch.vmap(k.bscale)(ta, tx))
    assert calls == 1
    assert k.stream() == torch.cuda.current_stream().cuda_stream
    # a side stream: a slow kernel, then a write to x, then the vmapped call,
    # which must launch after both, on that stream
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(SLEEP_CYCLES)
        tx.fill_(3.0)
        out, calls, _ = once(k, lambda: torch.vmap(k.bscale)(ta, tx))
    assert calls == 1 and k.stream() == s.cuda_stream
    s.synchronize()
    np.testing.assert_array_equal(out.cpu().numpy(), 3.0 * a[:, None]
                                  * np.ones((1, N), np.float32))


# ---- on the GPU -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def gpu_kernels(dlb, cuda_kernels_lib):
    return cuda_kernels(dlb, cuda_kernels_lib)


def test_jax_vmap_in_jit_one_launch_on_cuda(jax, gpu_kernels):
    check_jax_vmap_one_launch(jax, gpu_kernels, jax.devices("gpu")[0])


def test_jax_vmap_launches_on_xlas_stream(jax, gpu_kernels):
    check_jax_stream(jax, gpu_kernels, jax.devices("gpu")[0], cuda=True)


def test_jax_vmap_ordered_after_slow_work_on_xlas_stream(jax, gpu_kernels):
    check_jax_ordered_after_slow_work(jax, gpu_kernels, jax.devices("gpu")[0],
                                      size=4096, reps=8)


def test_torch_vmap_one_launch_on_cuda(torch, gpu_kernels):
    check_torch_vmap_one_launch(torch, gpu_kernels, "cuda")


def test_torch_vmap_launches_on_torchs_current_stream(torch, gpu_kernels):
    check_torch_stream(torch, gpu_kernels, "cuda", cuda=True)


# ---- the same checks on the host (this file's code on every machine) ---------------

@pytest.fixture(scope="module")
def cpu_kernels(dlb):
    k = host_kernels(dlb)
    # an eager batched call first: before the batch routes it refuses
    try:
        k.bscale(np.ones(2, np.float32), np.ones((2, 3), np.float32))
    except NotImplementedError as e:
        pending(e)
    return k


@pytest.fixture(scope="module")
def host_jax(cpu_kernels):
    jax = pytest.importorskip("jax")
    # a batched call in a graph first: before the compiled batch route it
    # is refused (and jax.vmap, which comes after it, cannot be there)
    try:
        jax.jit(cpu_kernels.bscale)(np.ones(2, np.float32),
                                    np.ones((2, 3), np.float32)).block_until_ready()
    except Exception as e:
        pending(e)
    return jax


@pytest.fixture(scope="module")
def host_torch():
    return pytest.importorskip("torch")


@pytest.mark.runs_without_gpu
def test_jax_vmap_in_jit_one_launch_on_host(host_jax, cpu_kernels):
    check_jax_vmap_one_launch(host_jax, cpu_kernels, host_jax.devices("cpu")[0])


@pytest.mark.runs_without_gpu
def test_jax_vmap_no_stream_on_host(host_jax, cpu_kernels):
    check_jax_stream(host_jax, cpu_kernels, host_jax.devices("cpu")[0], cuda=False)


@pytest.mark.runs_without_gpu
def test_jax_vmap_ordered_after_work_on_host(host_jax, cpu_kernels):
    check_jax_ordered_after_slow_work(host_jax, cpu_kernels,
                                      host_jax.devices("cpu")[0], size=96, reps=3)


@pytest.mark.runs_without_gpu
def test_torch_vmap_one_launch_on_host(host_torch, cpu_kernels):
    check_torch_vmap_one_launch(host_torch, cpu_kernels, "cpu")


@pytest.mark.runs_without_gpu
def test_torch_vmap_no_stream_on_host(host_torch, cpu_kernels):
    check_torch_stream(host_torch, cpu_kernels, "cpu", cuda=False)
