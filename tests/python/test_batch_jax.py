"""jax.vmap of a dlbridge Function (issue 25, item 2): dlbridge's own
batching rule, never JAX's vmap_method.  A Function with `...` is called
ONCE on the whole batch (the vmapped axis becomes its leading batch dim:
the kernel launch counter of examples/kernels/batch.c proves one call per
executed vmap, and says which batch shape B the kernel got); one without
`...`, or a vmap batching a parameter without `...`, is one custom call
whose handler loops in C (`loop_rank`), one kernel call per item.  Eager,
inside jit, nested, in_axes/out_axes, unbatched arguments, several results,
`mut`, grad of vmap / vmap of grad (through the vjp kernel, compared with
JAX's own autodiff of the same formula), jvp, and jax.export with a
symbolic batch dimension.  float64 (x64 on per test)."""

import ctypes
import warnings

import numpy as np
import pytest

import dlbridge as dlb
from _batch_counter import batch_counters, Counted

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        with warnings.catch_warnings():
            # no DeprecationWarning (vmap_method) nor any other
            warnings.simplefilter("error")
            yield


T = "float64"
SIGS = dict(
    bscale=f"bscale(a: {T}[...], x: {T}[..., n]) -> (y: {T}[..., n])",
    bstats=f"bstats(x: {T}[..., n]) -> (mean: {T}[...], sq: {T}[..., n])",
    baxpy=f"baxpy(a: {T}[...], x: {T}[..., n], y: mut {T}[..., n])",
    bdot=f"bdot(x: {T}[..., n], w: {T}[n]) -> (s: {T}[...])",
    vscale=f"vscale(a: {T}, x: {T}[n]) -> (y: {T}[n])",
)


def kname(name):
    return "dlb_kernel_" + name


class Kernels:
    def __init__(self, lib):
        self.so = ctypes.CDLL(lib)
        for name, sig in SIGS.items():
            setattr(self, name, dlb.load(lib, kname(name), sig))
        # the vjp only: jax.custom_vjp; vjp and jvp: the HiJAX primitive
        self.bscale_vjp = dlb.load(lib, kname("bscale"), SIGS["bscale"],
                                   vjp=kname("bscale_vjp"))
        self.bscale_ad = dlb.load(lib, kname("bscale"), SIGS["bscale"],
                                  vjp=kname("bscale_vjp"),
                                  jvp=kname("bscale_jvp"))
        self.vscale_vjp = dlb.load(lib, kname("vscale"), SIGS["vscale"],
                                   vjp=kname("vscale_vjp"))

    def counters(self):
        return batch_counters(self.so)


@pytest.fixture(scope="module")
def k(lib):
    return Kernels(lib)


def rand(*shape, seed=0):
    return np.random.default_rng(seed + 7 * len(shape)).standard_normal(shape)




def run(k, f, *args):
    """f(*args) made ready, with the kernel calls it made."""
    with Counted(k) as c:
        out = jax.block_until_ready(f(*args))
    return out, c


def close(got, want):
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)


# ---- one call per vmap, the kernel sees B = (vmapped size, ...) -------------

def test_vmap_eager_and_in_jit_is_one_kernel_call(k):
    a, x = rand(5), rand(5, 4)
    f = jax.vmap(k.bscale)
    for g in (f, jax.jit(f)):
        y, c = run(k, g, a, x)
        close(y, a[:, None] * x)
        assert (c.calls, c.last) == (1, (5,))
    # a jitted vmap run again: one more kernel call per run, no retrace
    g = jax.jit(f)
    g(a, x)
    _, c = run(k, g, a, x)
    assert c.calls == 1


def test_vmap_lowers_to_one_custom_call_of_the_batched_types(k):
    a, x = rand(5), rand(5, 4)
    jaxpr = str(jax.make_jaxpr(jax.vmap(k.bscale, in_axes=(None, 0)))(a[0], x))
    assert jaxpr.count("ffi_call[") == 1
    assert "loop_rank" not in jaxpr and "sequential" not in jaxpr
    # the unbatched `...` a: its own (0-d) shape, broadcast by the kernel
    assert "result_avals=(ShapedArray(float64[5,4]),)" in jaxpr
    hlo = jax.jit(jax.vmap(k.bscale, in_axes=(None, 0))).lower(
        a[0], x).as_text()
    assert hlo.count("@dlbridge_function") == 1
    assert "(tensor<f64>, tensor<5x4xf64>) -> tensor<5x4xf64>" in hlo


def test_nested_vmap_is_one_call_on_both_batch_dims(k):
    a, x = rand(2, 3), rand(2, 3, 4)
    f = jax.vmap(jax.vmap(k.bscale))
    for g in (f, jax.jit(f)):
        y, c = run(k, g, a, x)
        close(y, a[..., None] * x)
        assert (c.calls, c.last) == (1, (2, 3))
    # the inner vmap over an axis that is not first, the outer over a
    # `...` batch dim the arrays already have
    x2 = rand(3, 6, 2, 4)                      # (inner, item batch, outer, n)
    g = jax.vmap(jax.vmap(k.bscale, in_axes=(None, 0)), in_axes=(0, 2))
    a2 = rand(2)
    y, c = run(k, jax.jit(g), a2, x2)
    want = a2[:, None, None, None] * np.moveaxis(x2, 2, 0)
    close(y, want)
    assert (c.calls, c.last) == (1, (2, 3, 6))


def test_in_axes_and_out_axes(k):
    a, x = rand(5), rand(4, 5)                 # x batched along axis 1
    y, c = run(k, jax.vmap(k.bscale, in_axes=(0, 1), out_axes=1), a, x)
    close(y, (a[:, None] * x.T).T)             # (n, batch)
    assert np.asarray(y).shape == (4, 5)
    assert (c.calls, c.last) == (1, (5,))
    # a unbatched, x batched along 1
    y, c = run(k, jax.jit(jax.vmap(k.bscale, in_axes=(None, 1))), 2.5, x)
    close(y, 2.5 * x.T)
    assert (c.calls, c.last) == (1, (5,))
    # a batched, x unbatched: x broadcasts in the kernel, never copied B times
    x1 = rand(4)
    y, c = run(k, jax.jit(jax.vmap(k.bscale, in_axes=(0, None))), a, x1)
    close(y, a[:, None] * x1)
    assert (c.calls, c.last) == (1, (5,))


def test_batched_operands_of_different_item_batch_ranks_line_up(k):
    # per item: a is 0-d (batch rank 0), x is (3, 4) (batch rank 1); the
    # vmapped axis must stay the leading batch dim of both (a -> (5, 1))
    a, x = rand(5), rand(5, 3, 4)
    y, c = run(k, jax.jit(jax.vmap(k.bscale)), a, x)
    close(y, a[:, None, None] * x)
    assert (c.calls, c.last) == (1, (5, 3))
    # and an unbatched a with batch dims of its own, right-aligned: (3,)
    a3 = rand(3)
    y, c = run(k, jax.vmap(k.bscale, in_axes=(None, 0)), a3, x)
    close(y, a3[None, :, None] * x)
    assert (c.calls, c.last) == (1, (5, 3))


def test_several_results(k):
    x = rand(6, 2, 4)
    (mean, sq), c = run(k, jax.jit(jax.vmap(k.bstats, in_axes=1)), x)
    close(mean, x.mean(-1).T)
    close(sq, np.moveaxis(x * x, 1, 0))
    assert (c.calls, c.last) == (1, (2, 6))
    (mean, sq), _ = run(k, jax.vmap(k.bstats, out_axes=(0, 1)), x)
    close(sq, np.moveaxis(x * x, 0, 1))


def test_mut_returns_the_new_value(k):
    a, x, y = rand(5), rand(5, 4), rand(5, 4, seed=1)
    got, c = run(k, jax.jit(jax.vmap(k.baxpy)), a, x, y)
    close(got, y + a[:, None] * x)
    assert (c.calls, c.last) == (1, (5,))
    # the mut argument unbatched: every item starts from the same y, which
    # is broadcast to the whole batch (the kernel writes all of it)
    y1 = rand(4, seed=2)
    yj = jnp.asarray(y1)
    got, c = run(k, jax.vmap(k.baxpy, in_axes=(0, 0, None)), a, x, yj)
    close(got, y1 + a[:, None] * x)
    assert (c.calls, c.last) == (1, (5,))
    close(yj, y1)                              # the caller's array unchanged


def test_a_parameter_without_batch_dims(k):
    x, w = rand(5, 3, 4), rand(4, seed=3)
    # w unbatched: the signature route, one call
    s, c = run(k, jax.jit(jax.vmap(k.bdot, in_axes=(0, None))), x, w)
    close(s, x @ w)
    assert (c.calls, c.last) == (1, (5, 3))
    # w batched: w has no `...`, so the loop route, one call per item
    w5 = rand(5, 4, seed=4)
    for g in (jax.vmap(k.bdot), jax.jit(jax.vmap(k.bdot))):
        s, c = run(k, g, x, w5)
        close(s, np.einsum("bij,bj->bi", x, w5))
        assert (c.calls, c.last) == (5, (3,))
    jaxpr = str(jax.make_jaxpr(jax.vmap(k.bdot))(x, w5))
    assert jaxpr.count("ffi_call[") == 1 and "('loop_rank', np.int64(1))" in jaxpr
    # nested: the inner vmap on the signature route (w unbatched), the outer
    # batching w: the loop route over calls that keep their batch dims
    x2, w2 = rand(2, 5, 3, 4), rand(2, 4, seed=5)
    g = jax.jit(jax.vmap(jax.vmap(k.bdot, in_axes=(0, None))))
    s, c = run(k, g, x2, w2)
    close(s, np.einsum("abij,aj->abi", x2, w2))
    assert (c.calls, c.last) == (2, (5, 3))
    # both vmaps batching w: two loop dims, each item a `...` call
    w3 = rand(2, 5, 4, seed=6)
    g = jax.jit(jax.vmap(jax.vmap(k.bdot)))
    s, c = run(k, g, x2, w3)
    close(s, np.einsum("abij,abj->abi", x2, w3))
    assert (c.calls, c.last) == (10, (3,))
    assert "loop_rank = 2" in g.lower(x2, w3).as_text()


def test_a_function_without_batch_dims_loops_in_c(k):
    a, x = rand(5), rand(5, 4)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        jax.block_until_ready(jax.jit(jax.vmap(k.vscale))(a, x))
    assert not [w for w in seen if issubclass(w.category, DeprecationWarning)]
    for g in (jax.vmap(k.vscale), jax.jit(jax.vmap(k.vscale))):
        y, c = run(k, g, a, x)
        close(y, a[:, None] * x)
        assert (c.calls, c.last) == (5, ())    # each item unbatched, 0-d a
    # a Python number and an unbatched array: the same for every item
    y, c = run(k, jax.vmap(lambda x: k.vscale(2.0, x)), x)
    close(y, 2.0 * x)
    assert c.calls == 5
    y, c = run(k, jax.jit(jax.vmap(k.vscale, in_axes=(0, None))), a, x[0])
    close(y, a[:, None] * x[0])
    assert c.calls == 5
    # nested: two loop dims, still one custom call
    a2, x2 = rand(2, 3), rand(2, 3, 4)
    g = jax.jit(jax.vmap(jax.vmap(k.vscale)))
    y, c = run(k, g, a2, x2)
    close(y, a2[..., None] * x2)
    assert c.calls == 6
    hlo = g.lower(a2, x2).as_text()
    assert hlo.count("@dlbridge_function") == 1 and "loop_rank = 2" in hlo


# ---- derivatives: the vjp and jvp kernels batch by the same rule ------------

def bscale_formula(a, x):
    return a[..., None] * x


def loss_of(f):
    w = jnp.asarray(rand(4, seed=9))
    return lambda a, x: (f(a, x) * w).sum()


@pytest.mark.parametrize("route", ["bscale_vjp", "bscale_ad"])
def test_vmap_of_grad_and_grad_of_vmap(k, route):
    f = getattr(k, route)
    a, x = rand(5), rand(5, 4)
    mine, ref = loss_of(f), loss_of(bscale_formula)
    # per-example gradients: one vjp kernel call for the whole batch
    g = jax.jit(jax.vmap(jax.grad(mine, argnums=(0, 1))))
    (da, dx), c = run(k, g, a, x)
    rda, rdx = jax.vmap(jax.grad(ref, argnums=(0, 1)))(a, x)
    close(da, rda)
    close(dx, rdx)
    # the vjp kernel, once for the whole batch (the forward's value is not
    # used, so XLA drops its call)
    assert c.calls == 1
    # grad of a vmap; a unbatched: its cotangent summed over the batch
    for in_axes in ((0, 0), (None, 0)):
        aa = a if in_axes[0] == 0 else a[0]
        h = lambda fn: lambda a, x: jax.vmap(fn, in_axes=in_axes)(a, x).sum()  # noqa: E731
        (da, dx), c = run(k, jax.jit(jax.grad(h(mine), argnums=(0, 1))), aa, x)
        rda, rdx = jax.grad(h(ref), argnums=(0, 1))(aa, x)
        close(da, rda)
        close(dx, rdx)
        assert np.asarray(da).shape == np.shape(aa)
        assert c.calls == 1
    # nested vmap of grad in jit
    a2, x2 = rand(2, 3), rand(2, 3, 4)
    g = jax.jit(jax.vmap(jax.vmap(jax.grad(mine, argnums=(0, 1)))))
    (da, dx), c = run(k, g, a2, x2)
    rda, rdx = jax.vmap(jax.vmap(jax.grad(ref, argnums=(0, 1))))(a2, x2)
    close(da, rda)
    close(dx, rdx)
    assert c.calls == 1


@pytest.mark.parametrize("route", ["bscale_vjp", "bscale_ad"])
def test_cotangent_of_a_broadcast_argument_is_summed_down(k, route):
    # within one call: a (3,) broadcast against x (5, 3, 4); under vmap over
    # x only, a's cotangent is the kernel's da (5, 3) summed to (3,)
    f = getattr(k, route)
    a, x = rand(3), rand(5, 3, 4)
    mine = loss_of(lambda a, x: jax.vmap(f, in_axes=(None, 0))(a, x))
    ref = loss_of(lambda a, x: jax.vmap(bscale_formula,
                                        in_axes=(None, 0))(a, x))
    (da, dx), c = run(k, jax.jit(jax.grad(mine, argnums=(0, 1))), a, x)
    rda, rdx = jax.grad(ref, argnums=(0, 1))(a, x)
    close(da, rda)
    close(dx, rdx)
    assert c.calls == 1


def test_jvp_and_vmap_of_jvp_through_the_jvp_kernel(k):
    a, x, ta, tx = rand(5), rand(5, 4), rand(5, seed=1), rand(5, 4, seed=2)
    y, ty = jax.jvp(k.bscale_ad, (a, x), (ta, tx))
    ry, rty = jax.jvp(bscale_formula, (a, x), (ta, tx))
    close(y, ry)
    close(ty, rty)
    g = jax.jit(jax.vmap(lambda a, x, ta, tx: jax.jvp(
        k.bscale_ad, (a, x), (ta, tx))))
    (y, ty), c = run(k, g, a[:, None], x[:, None], ta[:, None], tx[:, None])
    close(ty, rty[:, None])
    assert c.calls == 2                        # the forward and the jvp
    # jacfwd over a batch: vmap of jvp over the tangents
    jac = jax.jit(jax.jacfwd(lambda x: k.bscale_ad(a, x)))(x)
    close(jac, jax.jacfwd(lambda x: bscale_formula(a, x))(x))


def test_grad_through_the_loop_route(k):
    # vscale has no `...`: its forward and vjp both loop in C
    a, x = rand(5), rand(5, 4)
    mine = loss_of(k.vscale_vjp)
    ref = loss_of(lambda a, x: a * x)
    (da, dx), c = run(k, jax.jit(jax.vmap(jax.grad(mine, argnums=(0, 1)))),
                      a, x)
    rda, rdx = jax.vmap(jax.grad(ref, argnums=(0, 1)))(a, x)
    close(da, rda)
    close(dx, rdx)
    assert c.calls == 5                        # the vjp kernel per item
    h = lambda fn: lambda a, x: jax.vmap(fn, in_axes=(None, 0))(a, x).sum()  # noqa: E731
    da, c = run(k, jax.grad(h(mine)), a[0], x)
    close(da, jax.grad(h(ref))(a[0], x))


# ---- jax.export with a symbolic batch dimension -----------------------------

def test_export_with_a_symbolic_batch_dimension(k):
    from jax import export
    b, = export.symbolic_shape("b")
    f = jax.jit(jax.vmap(k.bscale_vjp, in_axes=(None, 0)))
    exp = export.export(f, disabled_checks=dlb.jax_export_checks())(
        jax.ShapeDtypeStruct((), np.float64),
        jax.ShapeDtypeStruct((b, 4), np.float64))
    assert str(exp.out_avals[0].shape) == "(b, 4)"
    blob = exp.serialize(vjp_order=1)
    back = export.deserialize(blob)
    for n in (3, 7):
        x = rand(n, 4)
        y, c = run(k, back.call, 1.5, x)
        close(y, 1.5 * x)
        assert (c.calls, c.last) == (1, (n,))
    # its gradient survives too (the vjp kernel, batched the same way)
    x = rand(3, 4)
    da = jax.grad(lambda a: back.call(a, x).sum())(1.5)
    close(da, x.sum())
    # the loop route with a symbolic loop extent
    exp = export.export(jax.jit(jax.vmap(k.vscale)),
                        disabled_checks=dlb.jax_export_checks())(
        jax.ShapeDtypeStruct((b,), np.float64),
        jax.ShapeDtypeStruct((b, 4), np.float64))
    back = export.deserialize(exp.serialize())
    a, x = rand(6), rand(6, 4)
    y, c = run(k, back.call, a, x)
    close(y, a[:, None] * x)
    assert c.calls == 6


# ---- a 64-bit number as an attribute (x64 off) next to a `mut` operand ------

class _AddScalar:
    """A ctypes kernel add(a: float64, y: mut float32[n]): y += a, recording
    each call's y shape (one per item under the loop route).  Each
    instance is another kernel: give each test its own ``name`` (one
    process registers one kernel per name and signature)."""

    def __init__(self, name="add"):
        import ctypes as C
        from dlpack_ctypes import DLBError, DLTensor
        kernel_t = C.CFUNCTYPE(C.c_int, C.POINTER(C.POINTER(DLTensor)),
                               C.c_int32, C.c_void_p, C.POINTER(DLBError))
        self.shapes = []

        def add(args, nargs, stream, err):
            a, y = args[0].contents, args[1].contents
            value = C.cast(a.data + a.byte_offset, C.POINTER(C.c_double))[0]
            shape = tuple(y.shape[d] for d in range(y.ndim))
            self.shapes.append(shape)
            p = C.cast(y.data + y.byte_offset, C.POINTER(C.c_float))
            for j in range(int(np.prod(shape))):
                p[j] += value
            return 0

        self._kernel = kernel_t(add)
        self.fn = dlb.Function(C.cast(self._kernel, C.c_void_p).value,
                               f"{name}(a: float64, y: mut float32[n])")


def test_a_64bit_number_attribute_beside_a_mut_operand_under_vmap():
    add = _AddScalar()
    y = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    want = (y.astype(np.float64) + 0.1).astype(np.float32)  # the kernel's sum
    with jax.enable_x64(False):
        f = jax.jit(lambda y: add.fn(0.1, y))
        # the number is attribute dlb_arg0, so the mut y is operand 0
        assert "dlb_arg0 = 1.000000e-01 : f64" in f.lower(y[0]).as_text()
        np.testing.assert_array_equal(np.asarray(f(y[0])), want[0])
        add.shapes.clear()
        g = jax.jit(jax.vmap(lambda y: add.fn(0.1, y)))
        hlo = g.lower(y).as_text()
        assert "loop_rank = 1" in hlo and "dlb_arg0" in hlo
        np.testing.assert_array_equal(np.asarray(g(y)), want)
        assert add.shapes == [(3,), (3,)]   # each item unbatched
