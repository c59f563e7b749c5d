"""Gradients through a dlbridge Function in JAX (issue 24 item 3): a
Function with a vjp kernel is jax.custom_vjp around its custom call; with a
jvp kernel as well, a HiJAX primitive (python/dlbridge/_hijax.py) that also
gives jax.jvp, jacfwd and linearize.  Every gradient is compared with the
analytic one of NumPy, or with JAX's own autodiff of the same function.
The kernels are examples/kernels/autodiff.c (float64: x64 on per test)."""
import subprocess
import sys

import numpy as np
import pytest

import dlbridge as dlb

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


SCALE = "scale(a: float64, x: float64[n]) -> (y: float64[n])"
SOFTMAX = "softmax(x: float64[n]) -> (y: float64[n])"
SOFTMAX_VJP = "softmax_vjp(y: float64[n], dy: float64[n]) -> (dx: float64[n])"
SOFTMAX_JVP = "softmax_jvp(y: float64[n], tx: float64[n]) -> (ty: float64[n])"
GATHER = "gather(x: float64[m], idx: int64[k]) -> (y: float64[k])"
SINCOS = "sincos(x: float64[n]) -> (s: float64[n], c: float64[n])"
LSE = "softmax_lse(x: float64[n]) -> (y: float64[n], lse: nodiff float64)"
CMUL = "cmul(z: complex128[n], w: complex128[n]) -> (p: complex128[n])"


def k(name):
    return "dlb_kernel_" + name


@pytest.fixture(scope="module")
def scale_vjp(lib):     # a vjp only: jax.custom_vjp
    return dlb.load(lib, k("scale"), SCALE, vjp=k("scale_vjp"))


@pytest.fixture(scope="module")
def scale(lib):         # vjp and jvp: the HiJAX primitive
    return dlb.load(lib, k("scale"), SCALE, vjp=k("scale_vjp"),
                    jvp=k("scale_jvp"))


@pytest.fixture(scope="module")
def softmax(lib):
    return dlb.load(lib, k("softmax"), SOFTMAX,
                    vjp=(k("softmax_vjp"), SOFTMAX_VJP),
                    jvp=(k("softmax_jvp"), SOFTMAX_JVP))


@pytest.fixture(scope="module")
def softmax_vjp_only(lib):
    return dlb.load(lib, k("softmax"), SOFTMAX,
                    vjp=(k("softmax_vjp"), SOFTMAX_VJP))


def np_softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


X = np.array([0.3, -1.2, 2.0, 0.5])
W = np.array([1.0, -2.0, 0.5, 3.0])     # weights of the loss


def both(scale_vjp, scale):
    return pytest.param(scale_vjp, id="custom_vjp"), pytest.param(scale, id="hijax")


ROUTES = ["scale_vjp", "scale"]


@pytest.fixture(params=ROUTES)
def sc(request):
    return request.getfixturevalue(request.param)


# ---- reverse mode: grad, vjp, value_and_grad, eager and in jit ----------------

def test_grad_of_scale_equals_the_analytic_gradient(sc):
    def loss(a, x):
        return (sc(a, x) * W).sum()
    want_a, want_x = (W * X).sum(), 2.5 * W
    for g in (jax.grad(loss, argnums=(0, 1)),
              jax.jit(jax.grad(loss, argnums=(0, 1))),
              jax.grad(jax.jit(loss), argnums=(0, 1))):
        da, dx = g(2.5, X)
        np.testing.assert_allclose(da, want_a, rtol=1e-12)
        np.testing.assert_allclose(dx, want_x, rtol=1e-12)
    value, (da, dx) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(2.5, X)
    np.testing.assert_allclose(value, (2.5 * X * W).sum(), rtol=1e-12)
    np.testing.assert_allclose(da, want_a, rtol=1e-12)


def test_vjp_and_jacrev(sc):
    y, pull = jax.vjp(sc, 2.5, X)
    np.testing.assert_allclose(y, 2.5 * X, rtol=1e-12)
    da, dx = pull(W)
    np.testing.assert_allclose(da, (W * X).sum(), rtol=1e-12)
    np.testing.assert_allclose(dx, 2.5 * W, rtol=1e-12)
    jac = jax.jit(jax.jacrev(sc, argnums=1))(2.5, X)
    np.testing.assert_allclose(jac, 2.5 * np.eye(4), rtol=1e-12)


def test_a_python_number_for_the_0d_parameter(sc):
    # the number is a constant: only x is differentiated, a reaches the
    # vjp kernel as it reached the forward
    dx = jax.jit(jax.grad(lambda x: (sc(-1.5, x) * W).sum()))(X)
    np.testing.assert_allclose(dx, -1.5 * W, rtol=1e-12)


def test_softmax_vjp_reads_the_saved_result(softmax, softmax_vjp_only):
    y = np_softmax(X)
    want = y * (W - (y * W).sum())
    for f in (softmax, softmax_vjp_only):
        g = jax.jit(jax.grad(lambda x: (f(x) * W).sum()))(X)
        np.testing.assert_allclose(g, want, rtol=1e-12)
        # and equal to JAX's own softmax differentiated
        g_jax = jax.grad(lambda x: (jax.nn.softmax(x) * W).sum())(X)
        np.testing.assert_allclose(g, g_jax, rtol=1e-12)


def test_softmax_saves_only_what_its_vjp_names(softmax_vjp_only):
    # the spelled vjp reads y and dy: x is not kept for the backward
    jaxpr = jax.make_jaxpr(jax.vjp(softmax_vjp_only, X)[1])(W)
    assert len(jaxpr.consts) == 1
    np.testing.assert_allclose(jaxpr.consts[0], np_softmax(X), rtol=1e-12)
    assert softmax_vjp_only._vjp_args == (("result", 0), ("cotangent", 0))


def test_gather_int_index_gets_no_cotangent(lib):
    gather = dlb.load(lib, k("gather"), GATHER, vjp=k("gather_vjp"))
    idx = np.array([2, 0, 2, 1, 2])
    x = np.array([1.0, 2.0, 3.0])
    dx = jax.jit(jax.grad(lambda x: (gather(x, idx) * np.arange(5.)).sum()))(x)
    np.testing.assert_allclose(dx, [1.0, 3.0, 0 + 2 + 4.0], rtol=1e-12)
    with pytest.raises(TypeError, match="real- or complex-valued"):
        jax.grad(lambda x, i: gather(x, i).sum(), argnums=1)(x, idx)


@pytest.mark.parametrize("jvp", [False, True], ids=["custom_vjp", "hijax"])
def test_sincos_one_result_unused_gets_zeros(lib, jvp):
    kw = {"jvp": k("sincos_jvp")} if jvp else {}
    sincos = dlb.load(lib, k("sincos"), SINCOS, vjp=k("sincos_vjp"), **kw)
    g = jax.jit(jax.grad(lambda x: sincos(x)[1].sum()))(X)   # s unused
    np.testing.assert_allclose(g, -np.sin(X), rtol=1e-12)
    g = jax.grad(lambda x: (sincos(x)[0] * W).sum())(X)      # c unused
    np.testing.assert_allclose(g, W * np.cos(X), rtol=1e-12)
    g = jax.grad(lambda x: (sincos(x)[0] + 2 * sincos(x)[1]).sum())(X)
    np.testing.assert_allclose(g, np.cos(X) - 2 * np.sin(X), rtol=1e-12)


def test_softmax_lse_nodiff_result(lib):
    f = dlb.load(lib, k("softmax_lse"), LSE,
                 vjp=(k("softmax_lse_vjp"),
                      SOFTMAX_VJP.replace("softmax_vjp", "softmax_lse_vjp")))
    y, lse = jax.jit(f)(X)
    np.testing.assert_allclose(lse, np.log(np.exp(X).sum()), rtol=1e-12)
    g = jax.jit(jax.grad(lambda x: (f(x)[0] * W).sum()))(X)
    ys = np_softmax(X)
    np.testing.assert_allclose(g, ys * (W - (ys * W).sum()), rtol=1e-12)


@pytest.mark.parametrize("jvp", [False, True], ids=["custom_vjp", "hijax"])
def test_complex_cmul_follows_jaxs_convention(lib, jvp):
    kw = {"jvp": k("cmul_jvp")} if jvp else {}
    cmul = dlb.load(lib, k("cmul"), CMUL, vjp=k("cmul_vjp"), **kw)
    z = np.array([1 + 2j, -0.5 + 1j, 3 - 1j])
    w = np.array([0.5 - 1j, 2 + 0.25j, -1 + 1j])
    ct = np.array([1 - 1j, 0.5 + 2j, -1j])
    _, ours = jax.vjp(cmul, z, w)
    _, theirs = jax.vjp(lambda z, w: z * w, z, w)
    for a, b in zip(jax.jit(ours)(ct), theirs(ct)):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    # a real loss of complex inputs: jax.grad's own convention too
    loss = lambda f: lambda z, w: jnp.abs(f(z, w)).sum()  # noqa: E731
    for a, b in zip(jax.grad(loss(cmul), argnums=(0, 1))(z, w),
                    jax.grad(loss(lambda z, w: z * w), argnums=(0, 1))(z, w)):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    if jvp:
        got = jax.jvp(cmul, (z, w), (ct, w))
        want = jax.jvp(lambda z, w: z * w, (z, w), (ct, w))
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-12)


# ---- vmap: grad of vmap and vmap of grad -------------------------------------

def test_vmap_of_grad_and_grad_of_vmap(sc):
    xs = np.stack([X, 2 * X, -X])
    a = np.array([2.0, -1.0, 0.5])

    def loss(a, x):
        return (sc(a, x) * W).sum()
    # per-example gradients
    da, dx = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1))))(a, xs)
    np.testing.assert_allclose(da, (xs * W).sum(axis=1), rtol=1e-12)
    np.testing.assert_allclose(dx, a[:, None] * W, rtol=1e-12)
    # a unbatched: its gradient of the batched loss sums over the batch
    batched = lambda a, xs: jax.vmap(loss, in_axes=(None, 0))(a, xs).sum()  # noqa: E731
    da, dx = jax.jit(jax.grad(batched, argnums=(0, 1)))(2.0, xs)
    np.testing.assert_allclose(da, (xs * W).sum(), rtol=1e-12)
    np.testing.assert_allclose(dx, 2.0 * np.broadcast_to(W, xs.shape),
                               rtol=1e-12)
    # both batched, batch axis not in front, nested
    da, dx = jax.grad(lambda a, xs: jax.vmap(loss, in_axes=(0, 1))(a, xs).sum(),
                      argnums=(0, 1))(a, xs.T)
    np.testing.assert_allclose(da, (xs * W).sum(axis=1), rtol=1e-12)
    np.testing.assert_allclose(dx, (a[:, None] * W).T, rtol=1e-12)
    g = jax.jit(jax.grad(lambda x: jax.vmap(jax.vmap(
        lambda r: sc(3.0, r)))(x).sum()))(np.stack([xs, xs]))
    np.testing.assert_allclose(g, np.full((2, 3, 4), 3.0), rtol=1e-12)


# ---- forward mode, with a jvp kernel -------------------------------------------

def test_jvp_jacfwd_and_linearize(scale, softmax):
    t = np.array([1.0, 0.0, -1.0, 2.0])
    y, ty = jax.jvp(scale, (2.5, X), (0.5, t))
    np.testing.assert_allclose(y, 2.5 * X, rtol=1e-12)
    np.testing.assert_allclose(ty, 0.5 * X + 2.5 * t, rtol=1e-12)
    y, ty = jax.jit(lambda x, t: jax.jvp(lambda x: scale(2.5, x), (x,), (t,)))(X, t)
    np.testing.assert_allclose(ty, 2.5 * t, rtol=1e-12)
    jac = jax.jit(jax.jacfwd(softmax))(X)
    np.testing.assert_allclose(jac, jax.jacfwd(jax.nn.softmax)(X), rtol=1e-12)
    np.testing.assert_allclose(jac, jax.jacrev(softmax)(X), rtol=1e-12)
    y, f_jvp = jax.linearize(softmax, X)
    np.testing.assert_allclose(y, np_softmax(X), rtol=1e-12)
    np.testing.assert_allclose(
        f_jvp(t), jax.jvp(jax.nn.softmax, (X,), (t,))[1], rtol=1e-12)
    # vmap of jvp and jvp of vmap
    ts = np.stack([t, 2 * t])
    got = jax.vmap(lambda t: jax.jvp(softmax, (X,), (t,))[1])(ts)
    np.testing.assert_allclose(got, ts @ jac.T, rtol=1e-12)
    got = jax.jvp(jax.vmap(softmax), (np.stack([X, X]),), (ts,))[1]
    np.testing.assert_allclose(got, ts @ jac.T, rtol=1e-12)


# ---- refusals -----------------------------------------------------------------

def test_without_a_vjp_a_type_error_naming_the_function(lib):
    plain = dlb.load(lib, k("scale"), SCALE)
    with pytest.raises(TypeError, match="scale: a dlbridge Function has no "
                       "derivative"):
        jax.grad(lambda x: plain(2.0, x).sum())(X)
    # a jvp alone gives forward mode, and refuses reverse mode by name
    fwd_only = dlb.load(lib, k("scale"), SCALE, jvp=k("scale_jvp"))
    _, ty = jax.jvp(lambda x: fwd_only(2.0, x), (X,), (W,))
    np.testing.assert_allclose(ty, 2.0 * W, rtol=1e-12)
    with pytest.raises(TypeError, match="scale: a dlbridge Function has no "
                       "derivative"):
        jax.grad(lambda x: fwd_only(2.0, x).sum())(X)


def test_without_a_jvp_forward_mode_is_a_type_error(scale_vjp):
    with pytest.raises(TypeError, match="scale: a dlbridge Function has no "
                       "derivative for forward mode"):
        jax.jvp(lambda x: scale_vjp(2.0, x), (X,), (W,))
    with pytest.raises(TypeError, match="forward-mode"):
        jax.jit(jax.jacfwd(lambda x: scale_vjp(2.0, x)))(X)


@pytest.mark.parametrize("route", ROUTES)
def test_second_order_is_a_clear_error(request, route):
    f = request.getfixturevalue(route)
    msg = "scale: its vjp has no derivative"
    with pytest.raises(TypeError, match=msg):
        jax.grad(lambda x: jax.grad(lambda x: (f(2.0, x) ** 2).sum())(x).sum())(X)
    # jax.hessian is forward over reverse: without a jvp, forward mode's
    # refusal; with one, the jvp of the vjp Function's
    with pytest.raises(TypeError, match=msg if route == "scale" else
                       "scale: forward-mode AD needs a jvp= kernel"):
        jax.jit(jax.hessian(lambda a: f(a, X).sum()))(2.0)


# ---- jax.export: the vjp module differentiated in another process -------------

LOADER = """
import sys
import numpy as np
import jax
jax.config.update("jax_enable_x64", True)
from jax import export
import dlbridge as dlb
lib, path, sig = sys.argv[1], sys.argv[2], sys.argv[3]
exported = export.deserialize(bytearray(open(path, "rb").read()))
f = dlb.load(lib, "dlb_kernel_scale", sig, vjp="dlb_kernel_scale_vjp")
x = np.array([0.3, -1.2, 2.0, 0.5])
dlb.jax_register()       # the target alone
try:
    jax.grad(lambda a, x: exported.call(a, x).sum(), argnums=(0, 1))(2.5, x)
    print("unregistered: ran")
except Exception as e:
    print("unregistered:", type(e).__name__, str(e).replace("\\n", " ")[:300])
dlb.jax_register(f)      # the forward and, with it, its vjp
da, dx = jax.grad(lambda a, x: exported.call(a, x).sum(), argnums=(0, 1))(2.5, x)
print("grad:", float(da), np.asarray(dx).tolist())
"""


def test_export_with_its_vjp_differentiated_in_another_process(
        lib, scale_vjp, tmp_path):
    from jax import export
    exported = export.export(jax.jit(scale_vjp),
                             disabled_checks=dlb.jax_export_checks())(2.5, X)
    path = tmp_path / "scale.jax"
    path.write_bytes(exported.serialize(vjp_order=1))
    run = subprocess.run([sys.executable, "-c", LOADER, lib, str(path), SCALE],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = dict(line.split(": ", 1) for line in run.stdout.splitlines())
    # the forward alone was not enough: the vjp module names scale_vjp
    assert "ran" not in lines["unregistered"]
    assert "dlbridge.jax_register" in lines["unregistered"]
    assert lines["grad"] == "%r %r" % (float(X.sum()), [2.5] * 4)
