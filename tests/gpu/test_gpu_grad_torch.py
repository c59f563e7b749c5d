"""Backward through a CUDA dlbridge.Function in torch (issue 24 items 2 and
6; docs/compiled.md "Gradients"): the kernels of examples/kernels/autodiff.cu
with their vjp kernels give NumPy's gradients eagerly and under
torch.compile, and the vjp runs on torch's current stream of the backward.
The softmax pair spins for milliseconds first (SLOW_CYCLES), so a gradient
is right only when the forward launched on the stream of the forward and the
vjp on the stream of the backward: a launch anywhere else reads memory not
yet written.  A reduce-overhead capture replays a training step.  Skipped,
like every test here, without a GPU."""

import numpy as np
import pytest

MUL = "mul(a: float32[n], b: float32[n]) -> (y: float32[n])"
SOFTMAX = "softmax(x: float32[n]) -> (y: float32[n])"
SOFTMAX_VJP = "softmax_vjp(y: float32[n], dy: float32[n]) -> (dx: float32[n])"
N = 1000


@pytest.fixture(scope="module")
def k(request, cuda_kernels_lib):
    dlb = request.getfixturevalue("dlb")
    c = "dlb_kernel_cuda_"

    class K:
        mul = dlb.load(cuda_kernels_lib, c + "mul_f32", MUL,
                       vjp=c + "mul_f32_vjp")
        softmax = dlb.load(cuda_kernels_lib, c + "softmax_f32_slow", SOFTMAX,
                           vjp=(c + "softmax_f32_vjp_slow", SOFTMAX_VJP))
    return K


def np_softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def host(seed):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=N).astype(np.float32),
            rng.normal(size=N).astype(np.float32),
            rng.normal(size=N).astype(np.float32))


def expected(a, b, w):
    # loss = sum(softmax(a b) * w)
    y = np_softmax((a * b).astype(np.float64))
    dz = y * (w - (y * w).sum())
    return dz * b, dz * a


def leaves(torch, a, b):
    return (torch.tensor(a, device="cuda", requires_grad=True),
            torch.tensor(b, device="cuda", requires_grad=True))


def loss_of(k, w):
    def loss(a, b):
        return (k.softmax(k.mul(a, b)) * w).sum()
    return loss


def check(torch, ta, tb, a, b, w):
    da, db = expected(a, b, w)
    np.testing.assert_allclose(ta.grad.cpu().numpy(), da, rtol=2e-4, atol=1e-6)
    np.testing.assert_allclose(tb.grad.cpu().numpy(), db, rtol=2e-4, atol=1e-6)


def test_eager_backward_on_cuda(k, torch):
    a, b, w = host(0)
    ta, tb = leaves(torch, a, b)
    loss_of(k, torch.tensor(w, device="cuda"))(ta, tb).backward()
    check(torch, ta, tb, a, b, w)


def test_vjp_runs_on_the_current_stream_of_the_backward(k, torch):
    """On a non-default stream, with a sleep queued before each step: a
    kernel launched on another stream would run before the sleep ended and
    read the inputs (or the saved y) unwritten."""
    a, b, w = host(1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        tw = torch.tensor(w, device="cuda")
        torch.cuda._sleep(200_000_000)
        # written on `side` after the sleep: read early, it is stale
        ta = torch.tensor(a).to("cuda", non_blocking=True).requires_grad_()
        tb = torch.tensor(b).to("cuda", non_blocking=True).requires_grad_()
        loss = loss_of(k, tw)(ta, tb)
        torch.cuda._sleep(200_000_000)
        loss.backward()
    side.synchronize()
    check(torch, ta, tb, a, b, w)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_backward_on_cuda(k, torch, backend):
    from torch._dynamo.utils import counters
    counters.clear()
    a, b, w = host(2)
    g = torch.compile(loss_of(k, torch.tensor(w, device="cuda")),
                      backend=backend, fullgraph=True)
    for seed in (2, 3):
        a, b, _ = host(seed)
        ta, tb = leaves(torch, a, b)
        g(ta, tb).backward()
        check(torch, ta, tb, a, b, w)
    assert not counters["graph_break"]


def test_reduce_overhead_training_step_replays(k, torch):
    """A training step captured by CUDA graph trees (forward and backward
    graphs); its replays give the gradients of their inputs, also after a
    slow kernel queued on the stream."""
    from torch._dynamo.utils import counters
    counters.clear()
    _, _, w = host(4)
    tw = torch.tensor(w, device="cuda")
    g = torch.compile(loss_of(k, tw), mode="reduce-overhead", fullgraph=True)
    for seed in (4, 5, 6, 7):
        a, b, _ = host(seed)
        ta, tb = leaves(torch, a, b)
        torch.cuda._sleep(50_000_000)
        g(ta, tb).backward()
        torch.cuda.synchronize()
        check(torch, ta, tb, a, b, w)
    assert not counters["inductor"].get("cudagraph_skips")
