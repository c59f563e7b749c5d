"""torch.vmap of a dlbridge.Function (issue 25 item 3; python/dlbridge/
_ops_torch.py, docs/compiled.md "torch.vmap"): the batch kernels of
examples/kernels/batch.c under torch.vmap -- in_dims 0/1/None mixed,
nested, out_dims, several results, a `mut` argument written in place, a
0-d `...` parameter, a parameter without `...` batched (one call per
item) or not, a Function without `...` (one call per item), vmap of grad
and grad through vmap (the cotangent of a broadcast input summed down),
torch.compile(fullgraph=True) of a vmapped Function.  Every answer is
compared with the same torch formula under the same transform; the
kernels' launch counter proves ONE kernel call per vmapped call where the
batched arguments are all `...` parameters."""
import ctypes

import pytest

import dlbridge as dlb

torch = pytest.importorskip("torch")
import torch.func as tfunc  # noqa: E402
from _batch_counter import batch_counters  # noqa: E402

F64 = torch.float64
K = "dlb_kernel_"
BSCALE = "bscale(a: float64[...], x: float64[..., n]) -> (y: float64[..., n])"
BSTATS = ("bstats(x: float32[..., n]) -> (mean: float32[...], "
          "sq: float32[..., n])")
BAXPY = "baxpy(a: float64[...], x: float64[..., n], y: mut float64[..., n])"
BDOT = "bdot(x: float64[..., n], w: float64[n]) -> (s: float64[...])"
VSCALE = "vscale(a: float64, x: float64[n]) -> (y: float64[n])"


@pytest.fixture(scope="module")
def k(lib):
    so = ctypes.CDLL(lib)

    class K_:
        bscale = dlb.load(lib, K + "bscale", BSCALE, vjp=K + "bscale_vjp",
                          jvp=K + "bscale_jvp")
        plain = dlb.load(lib, K + "bscale", BSCALE)   # no derivative
        bstats = dlb.load(lib, K + "bstats", BSTATS)
        baxpy = dlb.load(lib, K + "baxpy", BAXPY)
        bdot = dlb.load(lib, K + "bdot", BDOT)
        vscale = dlb.load(lib, K + "vscale", VSCALE, vjp=K + "vscale_vjp")

        @staticmethod
        def counters():
            return batch_counters(so)
    return K_


def rnd(*shape, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed + 7 * len(shape) + sum(shape))
    return torch.randn(shape, generator=g, dtype=dtype)


def scale(a, x):           # the torch formula of bscale
    return a[..., None] * x


def counted(k, f, *args):
    """f(*args), and how many kernel calls it made with what batch shape."""
    before, _ = k.counters()
    out = f(*args)
    calls, last = k.counters()
    return out, calls - before, last


def close(got, want):
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


# ---- one call per vmapped call ---------------------------------------------------

@pytest.mark.parametrize("fname", ["bscale", "plain"])
@pytest.mark.parametrize("in_dims,a_shape,x_shape", [
    ((0, 0), (5,), (5, 4)),
    ((None, 0), (), (5, 4)),          # a unbatched: broadcast by the call
    ((0, None), (5,), (4,)),          # x unbatched: a 0-d `...` batched
    ((0, 1), (5,), (4, 5)),           # x's vmap dim not first
    ((0, 1), (5, 3), (3, 5, 4)),      # and its own batch dim before it
])
def test_vmap_bscale_is_one_call(k, fname, in_dims, a_shape, x_shape):
    f = getattr(k, fname)
    a, x = rnd(*a_shape), rnd(*x_shape, seed=1)
    got, calls, last = counted(k, torch.vmap(f, in_dims=in_dims), a, x)
    close(got, torch.vmap(scale, in_dims=in_dims)(a, x))
    assert calls == 1
    assert last == tuple(got.shape[:-1])


def test_vmap_item_batch_parts_of_different_ranks(k):
    # per item: a () against x (2, 3, n) -- the vmap dim of a must line up
    # with x's, not with x's own last batch axis
    a, x = rnd(5), rnd(5, 2, 3, 4, seed=1)
    got, calls, last = counted(k, torch.vmap(k.bscale), a, x)
    close(got, torch.vmap(scale)(a, x))
    assert calls == 1 and last == (5, 2, 3)
    # per item: a (3,) batched, x (2, 1, n) unbatched
    a, x = rnd(5, 3), rnd(2, 1, 4, seed=2)
    got, calls, last = counted(k, torch.vmap(k.bscale, in_dims=(0, None)),
                               a, x)
    close(got, torch.vmap(scale, in_dims=(0, None))(a, x))
    assert calls == 1 and last == (5, 2, 3)


def test_vmap_python_number_for_a_0d_batch_parameter(k):
    x = rnd(6, 4)
    got, calls, _ = counted(k, torch.vmap(lambda x: k.bscale(2.5, x)), x)
    close(got, 2.5 * x)
    assert calls == 1


def test_out_dims(k):
    a, x = rnd(5), rnd(5, 4, seed=1)
    got, calls, _ = counted(k, torch.vmap(k.bscale, out_dims=1), a, x)
    close(got, torch.vmap(scale, out_dims=1)(a, x))
    assert got.shape == (4, 5) and calls == 1


def test_nested_vmap_is_one_call(k):
    # outer product of 3 scales and 5 vectors: both levels in one call
    a, x = rnd(3), rnd(5, 4, seed=1)
    f = torch.vmap(torch.vmap(k.bscale, in_dims=(None, 0)), in_dims=(0, None))
    got, calls, last = counted(k, f, a, x)
    g = torch.vmap(torch.vmap(scale, in_dims=(None, 0)), in_dims=(0, None))
    close(got, g(a, x))
    assert got.shape == (3, 5, 4)
    assert calls == 1 and last == (3, 5)


def test_nested_vmap_in_dims_and_out_dims(k):
    # per inner item: a () and x (5, n); inner mapped dims 0 and 1, the
    # outer ones 1 and 0
    a, x = rnd(2, 3), rnd(3, 5, 2, 4, seed=1)
    f = torch.vmap(torch.vmap(k.bscale, in_dims=(0, 1), out_dims=1),
                   in_dims=(1, 0))
    g = torch.vmap(torch.vmap(scale, in_dims=(0, 1), out_dims=1),
                   in_dims=(1, 0))
    got, calls, _ = counted(k, f, a, x)
    close(got, g(a, x))
    assert got.shape == (3, 5, 2, 4) and calls == 1


def test_vmap_two_results(k):
    x = rnd(5, 3, 4, dtype=torch.float32)
    (mean, sq), calls, last = counted(
        k, torch.vmap(k.bstats, in_dims=1, out_dims=(0, 1)), x)
    torch.testing.assert_close(mean, x.mean(-1).movedim(1, 0))
    torch.testing.assert_close(sq, (x * x))
    assert mean.shape == (3, 5) and sq.shape == x.shape
    assert calls == 1 and last == (3, 5)


def test_vmap_mut_writes_the_batched_tensor_in_place(k):
    a, x = rnd(5), rnd(5, 4, seed=1)
    y = rnd(4, 5, seed=2)                      # batched along dim 1
    want = y + (a[:, None] * x).T
    ptr = y.data_ptr()
    # baxpy returns None: torch.vmap wants out_dims=None for that
    _, calls, last = counted(
        k, torch.vmap(k.baxpy, in_dims=(0, 0, 1), out_dims=None), a, x, y)
    close(y, want)
    assert y.data_ptr() == ptr and calls == 1 and last == (5,)


def test_vmap_mut_in_a_step_that_returns_it(k):
    def step(a, x, y):
        k.baxpy(a, x, y)
        return y * 2

    a, x, y = rnd(5, 2), rnd(5, 2, 4, seed=1), rnd(5, 2, 4, seed=2)
    want = y + a[..., None] * x
    got, calls, last = counted(k, torch.vmap(step), a, x, y)
    close(y, want)
    close(got, 2 * want)
    assert calls == 1 and last == (5, 2)


def test_vmap_mut_with_unbatched_inputs(k):
    # a and x broadcast over the batch of y
    a, x, y = rnd(), rnd(4, seed=1), rnd(6, 4, seed=2)
    want = y + a * x
    _, calls, _ = counted(
        k, torch.vmap(k.baxpy, in_dims=(None, None, 0), out_dims=None),
        a, x, y)
    close(y, want)
    assert calls == 1


def test_vmap_mut_not_batched_is_refused(k):
    a, x, y = rnd(5), rnd(5, 4, seed=1), rnd(4, seed=2)
    before = y.clone()
    with pytest.raises(RuntimeError, match="mut argument 'y' in place, but "
                       "'y' is not batched while 'a' is"):
        torch.vmap(k.baxpy, in_dims=(0, 0, None), out_dims=None)(a, x, y)
    close(y, before)


def test_vmap_bdot_w_unbatched_is_one_call(k):
    x, w = rnd(5, 3, 4), rnd(4, seed=1)
    got, calls, last = counted(k, torch.vmap(k.bdot, in_dims=(0, None)), x, w)
    close(got, x @ w)
    assert calls == 1 and last == (5, 3)


# ---- one call per item: a batched parameter without `...` ------------------------

def test_vmap_bdot_w_batched_loops(k):
    x, w = rnd(5, 3, 4), rnd(5, 4, seed=1)
    got, calls, last = counted(k, torch.vmap(k.bdot), x, w)
    close(got, torch.einsum("bin,bn->bi", x, w))
    assert calls == 5 and last == (3,)


def test_vmap_function_without_batch_dims_loops(k):
    a, x = rnd(5), rnd(5, 4, seed=1)
    got, calls, last = counted(k, torch.vmap(k.vscale), a, x)
    close(got, scale(a, x))
    assert calls == 5 and last == ()
    # nested, and an unbatched x
    a = rnd(2, 3)
    f = torch.vmap(torch.vmap(k.vscale, in_dims=(0, None)),
                   in_dims=(0, None))
    got, calls, _ = counted(k, f, a, x[0])
    close(got, a[..., None] * x[0])
    assert calls == 6


@pytest.mark.parametrize("fname", ["vscale", "bscale", "bdot"])
def test_vmap_over_zero_items(k, fname):
    # No item to call the kernel on: the loop route (vscale; bdot with w
    # batched) takes the results' shapes from the signature, the `...`
    # route hands the kernel an empty batch.
    x = rnd(0, 4)
    second = rnd(0, 4, seed=1) if fname == "bdot" else rnd(0)
    f = getattr(k, fname)
    got = torch.vmap(f)(x, second) if fname == "bdot" else \
        torch.vmap(f)(second, x)
    assert got.shape == ((0,) if fname == "bdot" else (0, 4))
    assert got.dtype == F64


# ---- gradients ---------------------------------------------------------------

def loss(f):
    return lambda a, x: (f(a, x) ** 2).sum()


def test_vmap_of_grad(k):
    # per-sample gradients: a () and x (3, n) per item, a broadcast over x's
    # batch axis inside each call -- its cotangent summed down by dlbridge
    a, x = rnd(5), rnd(5, 3, 4, seed=1)
    got, calls, _ = counted(
        k, tfunc.vmap(tfunc.grad(loss(k.bscale), argnums=(0, 1))), a, x)
    want = tfunc.vmap(tfunc.grad(loss(scale), argnums=(0, 1)))(a, x)
    close(got[0], want[0])
    close(got[1], want[1])
    assert got[0].shape == (5,)
    assert calls == 2        # the forward and the vjp, one call each


def test_vmap_of_jvp_and_jacfwd(k):
    a, x = rnd(5), rnd(5, 3, 4, seed=1)
    ta, tx = rnd(5, seed=2), rnd(5, 3, 4, seed=3)

    def tangent(f):
        return lambda a, x, ta, tx: tfunc.jvp(f, (a, x), (ta, tx))

    (y, ty), calls, _ = counted(k, tfunc.vmap(tangent(k.bscale)),
                                a, x, ta, tx)
    want_y, want_ty = tfunc.vmap(tangent(scale))(a, x, ta, tx)
    close(y, want_y)
    close(ty, want_ty)
    assert calls == 2        # the forward and the jvp, one call each
    got = tfunc.vmap(tfunc.jacfwd(k.bscale))(a, x[:, 0])
    close(got, tfunc.vmap(tfunc.jacfwd(scale))(a, x[:, 0]))


def test_vmap_of_grad_vscale_loops(k):
    a, x = rnd(5), rnd(5, 4, seed=1)
    got = tfunc.vmap(tfunc.grad(loss(k.vscale), argnums=(0, 1)))(a, x)
    want = tfunc.vmap(tfunc.grad(loss(scale), argnums=(0, 1)))(a, x)
    close(got[0], want[0])
    close(got[1], want[1])


@pytest.mark.parametrize("in_dims", [(0, 0), (None, 0), (0, None)])
def test_grad_through_vmap(k, in_dims):
    a0 = rnd(5) if in_dims[0] == 0 else rnd()
    x0 = rnd(5, 4, seed=1) if in_dims[1] == 0 else rnd(4, seed=1)
    grads = []
    for f in (k.bscale, scale):
        a = a0.clone().requires_grad_()
        x = x0.clone().requires_grad_()
        (torch.vmap(f, in_dims=in_dims)(a, x) ** 2).sum().backward()
        grads.append((a.grad, x.grad))
    close(grads[0][0], grads[1][0])
    close(grads[0][1], grads[1][1])


def test_eager_backward_sums_a_broadcast_cotangent_down(k):
    # no vmap: a (3, 1) against x (3, 2, n) -- da written at (3, 2)
    grads = []
    for f in (k.bscale, scale):
        a = rnd(3, 1).requires_grad_()
        x = rnd(3, 2, 4, seed=1).requires_grad_()
        (f(a, x) ** 2).sum().backward()
        grads.append((a.grad, x.grad))
    assert grads[0][0].shape == (3, 1)
    close(grads[0][0], grads[1][0])
    close(grads[0][1], grads[1][1])
    # what the backward itself returns (torch would also sum a broadcastable
    # gradient down silently): already at a's shape
    a = rnd(3, 1).requires_grad_()
    x = rnd(3, 2, 4, seed=1)
    y = k.bscale(a, x)
    raw = y.grad_fn.apply(torch.ones_like(y))
    da = [g for g in raw if g is not None]
    assert len(da) == 1 and da[0].shape == (3, 1)
    close(da[0], x.sum(-1, keepdim=True).sum(1))


# ---- torch.compile -------------------------------------------------------------

@pytest.mark.parametrize("fname,backend", [
    ("plain", "aot_eager"), ("plain", "inductor"),
    ("bscale", "aot_eager"),    # its nograd overload: no gradient needed
])
def test_compiled_vmap_is_one_call(k, fname, backend):
    torch._dynamo.reset()
    a, x = rnd(5), rnd(5, 3, 4, seed=1)
    f = torch.compile(torch.vmap(getattr(k, fname), in_dims=(0, 0)),
                      fullgraph=True, backend=backend)
    got = f(a, x)
    close(got, torch.vmap(scale)(a, x))
    got, calls, last = counted(k, f, a, x)
    close(got, torch.vmap(scale)(a, x))
    assert calls == 1 and last == (5, 3)


def test_compiled_vmap_with_backward(k):
    torch._dynamo.reset()
    grads = []
    for f in (k.bscale, scale):
        a = rnd(5).requires_grad_()
        x = rnd(5, 3, 4, seed=1).requires_grad_()
        g = torch.compile(lambda a, x: (torch.vmap(f)(a, x) ** 2).sum(),
                          fullgraph=True, backend="aot_eager")
        g(a, x).backward()
        grads.append((a.grad, x.grad))
    close(grads[0][0], grads[1][0])
    close(grads[0][1], grads[1][1])


# ---- how a transform's tensor is recognised --------------------------------------

@pytest.mark.parametrize("state", [1, -1])
def test_wrapped_tensors_with_bits_read_or_asked(k, state):
    # read: a functorch wrapper's key bit (found by torchbits.c's
    # experiment) routes it before any DLPack read; asked: its failed read
    # does.  Both give the operator the call.
    from dlbridge import _core
    a, x = rnd(5), rnd(5, 3, 4, seed=1)
    k.plain(a[0], x[0])   # torch met, the experiment run
    found = _core._torch_bits_state()
    if found != 1:
        pytest.skip("the experiment did not find torch's bits here")
    previous = _core._torch_bits_force(state)
    try:
        got, calls, _ = counted(k, torch.vmap(k.plain), a, x)
        close(got, torch.vmap(scale)(a, x))
        assert calls == 1
        g = tfunc.vmap(tfunc.grad(loss(k.bscale), argnums=(0, 1)))(a, x)
        close(g[1], tfunc.vmap(tfunc.grad(loss(scale), argnums=(0, 1)))(a, x)[1])
    finally:
        _core._torch_bits_force(previous)
