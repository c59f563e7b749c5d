"""Gradients through a dlbridge.Function in torch (issue 24 item 2;
python/dlbridge/_ops_torch.py, docs/compiled.md "Gradients"): the example
kernels of examples/kernels/autodiff.c with their vjp (and jvp) kernels give
torch's own gradients -- eagerly (backward, autograd.grad, gradcheck in
float64), compiled (aot_eager and inductor, static and dynamic shapes, no
graph break), in torch.func (grad, jacrev, vmap(grad), jvp, jacfwd) and
forward AD -- and every derivative that was not declared is a
RuntimeError, never a None or a zero.  Expected values are analytic
(NumPy) or torch's own autograd of the same function."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dlbridge as dlb
from dlbridge import _ops_torch

torch = pytest.importorskip("torch")
import torch.autograd.forward_ad as fwAD  # noqa: E402
import torch.func as tfunc  # noqa: E402

F64 = torch.float64
K = "dlb_kernel_"
SCALE = "scale(a: float64, x: float64[n]) -> (y: float64[n])"
SOFTMAX = "softmax(x: float64[n]) -> (y: float64[n])"
SOFTMAX_VJP = "softmax_vjp(y: float64[n], dy: float64[n]) -> (dx: float64[n])"
SOFTMAX_JVP = "softmax_jvp(y: float64[n], tx: float64[n]) -> (ty: float64[n])"
GATHER = "gather(x: float64[m], idx: int64[k]) -> (y: float64[k])"
SINCOS = "sincos(x: float64[n]) -> (s: float64[n], c: float64[n])"
LSE = "softmax_lse(x: float64[n]) -> (y: float64[n], lse: nodiff float64)"
CMUL = "cmul(z: complex128[n], w: complex128[n]) -> (p: complex128[n])"


@pytest.fixture(scope="module")
def k(lib):
    class K_:
        scale = dlb.load(lib, K + "scale", SCALE, vjp=K + "scale_vjp",
                         jvp=K + "scale_jvp")
        softmax = dlb.load(lib, K + "softmax", SOFTMAX,
                           vjp=(K + "softmax_vjp", SOFTMAX_VJP),
                           jvp=(K + "softmax_jvp", SOFTMAX_JVP))
        gather = dlb.load(lib, K + "gather", GATHER, vjp=K + "gather_vjp")
        sincos = dlb.load(lib, K + "sincos", SINCOS, vjp=K + "sincos_vjp",
                          jvp=K + "sincos_jvp")
        lse = dlb.load(lib, K + "softmax_lse", LSE, vjp=(
            K + "softmax_lse_vjp", SOFTMAX_VJP.replace("softmax_vjp", "v")))
        cmul = dlb.load(lib, K + "cmul", CMUL, vjp=K + "cmul_vjp",
                        jvp=K + "cmul_jvp")
        plain = dlb.load(lib, K + "scale", SCALE)   # no derivative
    return K_


def t(values, grad=False, dtype=F64):
    return torch.tensor(values, dtype=dtype, requires_grad=grad)


def np_softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


X = [0.5, -1.0, 2.0, 0.25]


# ---- eager ---------------------------------------------------------------------

def test_backward_equals_the_analytic_gradient(k):
    a, x = t(1.5, True), t(X, True)
    y = k.scale(a, x)
    assert y.grad_fn is not None
    (y * y).sum().backward()
    xs = np.array(X)
    assert a.grad.item() == pytest.approx(float(2 * 1.5 * (xs ** 2).sum()))
    np.testing.assert_allclose(x.grad.numpy(), 2 * 1.5 ** 2 * xs)


def test_autograd_grad_softmax_spelled_vjp(k):
    x = t(X, True)
    w = t([1.0, -2.0, 0.5, 3.0])
    g, = torch.autograd.grad((k.softmax(x) * w).sum(), x)
    y = np_softmax(np.array(X))
    np.testing.assert_allclose(g.numpy(), y * (w.numpy() - (y * w.numpy()).sum()))


def test_python_number_for_a_0d_parameter_gets_no_gradient(k):
    x = t(X, True)
    k.scale(3.0, x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3.0] * 4)
    # torch's view of it: the number's slot has no gradient
    out = torch.autograd.grad(k.scale(3.0, x).sum(), x)
    assert out[0].tolist() == [3.0] * 4


def test_gradcheck_scale_softmax_gather(k):
    a, x = t(0.7, True), t(X, True)
    assert torch.autograd.gradcheck(k.scale, (a, x), check_forward_ad=True)
    assert torch.autograd.gradcheck(k.softmax, (x,), check_forward_ad=True)
    idx = torch.tensor([3, 0, 3, 1, 2])   # int64: no gradient
    assert torch.autograd.gradcheck(lambda x: k.gather(x, idx), (x,))
    x.grad = None
    k.gather(x, idx).sum().backward()
    assert x.grad.tolist() == [1.0, 1.0, 1.0, 2.0]


def test_unused_result_gets_a_zero_cotangent(k):
    x = t(X, True)
    s, c = k.sincos(x)
    s.sum().backward()     # c unused: its cotangent arrives as zeros
    np.testing.assert_allclose(x.grad.numpy(), np.cos(X))
    x.grad = None
    s, c = k.sincos(x)
    c.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), -np.sin(X))
    assert torch.autograd.gradcheck(lambda x: k.sincos(x), (t(X, True),),
                                    check_forward_ad=True)


def test_nodiff_result_has_no_gradient(k):
    x = t(X, True)
    y, lse = k.lse(x)
    assert y.requires_grad and not lse.requires_grad
    xs = np.array(X)
    assert lse.item() == pytest.approx(float(np.log(np.exp(xs).sum())))
    assert torch.autograd.gradcheck(lambda x: k.lse(x)[0], (t(X, True),))


def test_complex_gradient_equals_torchs_own(k):
    rng = np.random.default_rng(0)
    zs = rng.normal(size=4) + 1j * rng.normal(size=4)
    ws = rng.normal(size=4) + 1j * rng.normal(size=4)
    z, w = (torch.tensor(v, requires_grad=True) for v in (zs, ws))
    z0, w0 = (torch.tensor(v, requires_grad=True) for v in (zs, ws))
    seed = torch.tensor(rng.normal(size=4) + 1j * rng.normal(size=4))
    # a real loss through the complex product, as training uses
    loss = (k.cmul(z, w) * seed).real.sum() + k.cmul(z, w).abs().sum()
    ref = (z0 * w0 * seed).real.sum() + (z0 * w0).abs().sum()
    loss.backward()
    ref.backward()
    np.testing.assert_allclose(z.grad.numpy(), z0.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(w.grad.numpy(), w0.grad.numpy(), rtol=1e-12)
    assert torch.autograd.gradcheck(
        k.cmul, (torch.tensor(zs, requires_grad=True),
                 torch.tensor(ws, requires_grad=True)),
        check_forward_ad=True)


def test_no_grad_call_takes_the_plain_path(k):
    a, x = t(2.0, True), t(X, True)
    with torch.no_grad():
        y = k.scale(a, x)
    assert y.grad_fn is None and not y.requires_grad
    y = k.scale(t(2.0), t(X))   # nothing requires grad
    assert y.grad_fn is None


# ---- refusals ------------------------------------------------------------------

def test_without_vjp_backward_is_refused(k):
    x = t(X, True)
    with pytest.raises(RuntimeError, match="scale: dlbridge Function has no "
                                           "backward"):
        k.plain(t(2.0), x)
    with pytest.raises(RuntimeError, match="has no backward"):
        tfunc.grad(lambda x: k.plain(2.0, x).sum())(t(X))


def test_without_jvp_forward_ad_is_refused(k):
    idx = torch.tensor([0, 2])
    with fwAD.dual_level():
        d = fwAD.make_dual(t(X), torch.ones(4, dtype=F64))
        with pytest.raises(RuntimeError, match="gather: forward-mode AD needs "
                                               "a jvp= kernel"):
            k.gather(d, idx)
        with pytest.raises(RuntimeError, match="scale: forward-mode AD"):
            k.plain(2.0, d)
        # a dual level with no tangent on the arguments: the plain call
        assert k.plain(2.0, t(X)).tolist() == [2 * v for v in X]
    with pytest.raises(RuntimeError, match="forward-mode AD needs a jvp="):
        tfunc.jvp(lambda x: k.gather(x, idx), (t(X),),
                  (torch.ones(4, dtype=F64),))
    with pytest.raises(RuntimeError, match="forward-mode AD needs a jvp="):
        tfunc.jacfwd(lambda x: k.plain(2.0, x))(t(X))


def test_second_derivative_is_refused(k):
    x = t(X, True)
    g, = torch.autograd.grad(k.softmax(x)[0], x, create_graph=True)
    with pytest.raises(RuntimeError, match="softmax: its vjp has no "
                                           "derivative"):
        torch.autograd.grad(g.sum(), x)
    with pytest.raises(RuntimeError, match="its vjp has no derivative"):
        tfunc.hessian(lambda x: k.softmax(x)[0])(t(X))
    with pytest.raises(RuntimeError, match="its jvp has no derivative"):
        tfunc.jacfwd(tfunc.jacfwd(lambda x: k.softmax(x)[0]))(t(X))


def test_spelled_vjp_with_mismatched_cotangent_is_refused(lib):
    bad = K + "bad_vjp_shape"
    sig = "f(x: float64[n]) -> (y: float64[n])"
    with pytest.raises(ValueError, match="dy: float64.3. does not match"):
        dlb.load(lib, bad, sig,
                 vjp=(bad, "v(x: float64[n], dy: float64[3]) -> (dx: float64[n])"))
    with pytest.raises(ValueError, match="dx: float64.3. does not match"):
        dlb.load(lib, bad, sig,
                 vjp=(bad, "v(x: float64[n], dy: float64[n]) -> (dx: float64[3])"))
    # well spelled (its kernel: dx = dy), under softmax's forward: the vjp
    # the declaration names is the one that runs
    f = dlb.load(lib, K + "softmax", SOFTMAX, vjp=(
        bad, "v(x: float64[n], dy: float64[n]) -> (dx: float64[n])"))
    x = t(X, True)
    g, = torch.autograd.grad(f(x), x, torch.arange(4, dtype=F64))
    assert g.tolist() == [0.0, 1.0, 2.0, 3.0]


# ---- torch.func and forward AD ---------------------------------------------------

def test_func_grad_jacrev_vmap_grad(k):
    a, x = t(1.5), t(X)
    da, dx = tfunc.grad(lambda a, x: (k.scale(a, x) ** 2).sum(),
                        argnums=(0, 1))(a, x)
    xs = np.array(X)
    assert da.item() == pytest.approx(float(2 * 1.5 * (xs ** 2).sum()))
    np.testing.assert_allclose(dx.numpy(), 2 * 1.5 ** 2 * xs)
    jac = tfunc.jacrev(k.softmax)(x)
    y = np_softmax(xs)
    np.testing.assert_allclose(jac.numpy(), np.diag(y) - np.outer(y, y),
                               atol=1e-14)
    xb = torch.tensor(np.random.default_rng(1).normal(size=(3, 4)))
    per = tfunc.vmap(tfunc.grad(lambda a, x: (k.scale(a, x) ** 2).sum()),
                     in_dims=(None, 0))(a, xb)
    np.testing.assert_allclose(per.numpy(),
                               2 * 1.5 * (xb.numpy() ** 2).sum(axis=1))


def test_func_jvp_jacfwd_and_dual_tensors(k):
    a, x = t(1.5), t(X)
    y, ty = tfunc.jvp(k.scale, (a, x), (t(2.0), torch.ones(4, dtype=F64)))
    np.testing.assert_allclose(ty.numpy(), 2.0 * np.array(X) + 1.5)
    jac = tfunc.jacfwd(k.softmax)(x)
    ys = np_softmax(np.array(X))
    np.testing.assert_allclose(jac.numpy(), np.diag(ys) - np.outer(ys, ys),
                               atol=1e-14)
    with fwAD.dual_level():
        d = fwAD.make_dual(x, torch.ones(4, dtype=F64))
        s, c = k.sincos(d)
        np.testing.assert_allclose(fwAD.unpack_dual(s).tangent.numpy(),
                                   np.cos(X))
        np.testing.assert_allclose(fwAD.unpack_dual(c).tangent.numpy(),
                                   -np.sin(X))


def test_vmap_of_a_function_loops(k):
    xb = torch.tensor(np.random.default_rng(2).normal(size=(3, 4)))
    for f in (k.scale, k.plain):
        out = tfunc.vmap(f, in_dims=(None, 0))(t(2.0), xb)
        np.testing.assert_allclose(out.numpy(), 2.0 * xb.numpy())


# ---- compiled ------------------------------------------------------------------

def program(k):
    def f(a, x, idx):
        y = k.softmax(k.scale(a, x))
        return (k.gather(y, idx) ** 2).sum()
    return f


def leaves(n):
    a = t(1.5, True)
    x = torch.linspace(-1, 1, n, dtype=F64).requires_grad_()
    return a, x, torch.tensor([0, n - 1, 2])


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_forward_and_backward(k, backend, dynamic):
    from torch._dynamo.utils import counters
    counters.clear()
    f = program(k)
    g = torch.compile(f, backend=backend, fullgraph=True, dynamic=dynamic)
    sizes = (5, 7, 9) if dynamic else (5, 5)
    for n in sizes:
        a, x, idx = leaves(n)
        loss = g(a, x, idx)
        loss.backward()
        a0, x0, _ = leaves(n)
        ref = f(a0, x0, idx)
        ref.backward()
        assert loss.item() == pytest.approx(ref.item(), rel=1e-12)
        np.testing.assert_allclose(a.grad.numpy(), a0.grad.numpy(), rtol=1e-12)
        np.testing.assert_allclose(x.grad.numpy(), x0.grad.numpy(), rtol=1e-12)
    # one graph for every size (a backend's count would also count
    # Dynamo's restart of an analysis, which compiles the same frame)
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"]


def test_backward_graph_holds_the_vjp_operator(k):
    from torch._dynamo.testing import AotEagerAndRecordGraphs
    backend = AotEagerAndRecordGraphs()
    g = torch.compile(lambda a, x: k.scale(a, x).sum(), backend=backend,
                      fullgraph=True)
    a, x = t(2.0, True), t(X, True)
    g(a, x).backward()
    assert a.grad.item() == pytest.approx(sum(X))
    vjp_op = _ops_torch.derivative_op(k.scale, "vjp")
    fw = [n.target for gm in backend.fw_graphs for n in gm.graph.nodes]
    bw = [n.target for gm in backend.bw_graphs for n in gm.graph.nodes]
    assert _ops_torch.op(k.scale) in fw
    assert vjp_op in bw


def test_compiled_backward_from_a_warm_inductor_cache(lib, tmp_path):
    """The second process gets its forward and backward graphs from
    inductor's cache, with nothing traced that would define the vjp
    operator the backward graph calls: the forward's operator defines its
    derivatives with it (a 0-d parameter given a Python number, so the
    vjp's own number overload too; and under torch.vmap)."""
    script = textwrap.dedent(f"""
        import torch, dlbridge as dlb
        from torch._dynamo.utils import counters
        scale = dlb.load({lib!r}, "dlb_kernel_scale", {SCALE!r},
                         vjp="dlb_kernel_scale_vjp")
        x = torch.arange(4.0, dtype=torch.float64, requires_grad=True)
        g = torch.compile(lambda x: (scale(3.0, x) ** 2).sum(),
                          backend="inductor", fullgraph=True)
        g(x).backward()
        assert torch.equal(x.grad, 18 * x.detach()), x.grad
        x.grad = None
        v = torch.compile(lambda x: (torch.vmap(scale, in_dims=(None, 0))(
            3.0, x.reshape(2, 2)) ** 2).sum(), backend="inductor",
            fullgraph=True)
        v(x).backward()
        assert torch.equal(x.grad, 18 * x.detach()), x.grad
        print(counters["inductor"]["fxgraph_cache_hit"])
        """)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"))
    hits = []
    for _ in range(2):
        run = subprocess.run([sys.executable, "-c", script], env=env,
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        hits.append(int(run.stdout.split()[-1]))
    assert hits[0] == 0 and hits[1] > 0   # the second run was served warm


# ---- opcheck -------------------------------------------------------------------

def r(*shape, grad=True):
    return torch.randn(shape, dtype=F64, requires_grad=grad)


ALL_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor",
             "test_aot_dispatch_static", "test_aot_dispatch_dynamic")


def test_opcheck_forward_operators_with_samples_that_require_grad(k):
    for o, args in [
            (_ops_torch.op(k.scale), (r(), r(4))),
            (_ops_torch.op(k.scale, 1), (2.0, r(4))),
            (_ops_torch.op(k.softmax), (r(4),)),
            (_ops_torch.op(k.gather), (r(4), torch.tensor([1, 3, 3]))),
            (_ops_torch.op(k.sincos), (r(4),)),
            (_ops_torch.op(k.cmul), (torch.randn(3, dtype=torch.complex128,
                                                 requires_grad=True),
                                     torch.randn(3, dtype=torch.complex128)))]:
        torch.library.opcheck(o, args, test_utils=ALL_UTILS)


def test_opcheck_vjp_and_jvp_operators(k):
    samples = [(_ops_torch.derivative_op(k.scale, "vjp"), (r(), r(4), r(4))),
               (_ops_torch.derivative_op(k.softmax, "vjp"), (r(4), r(4))),
               (_ops_torch.derivative_op(k.gather, "vjp"),
                (r(4), torch.tensor([0, 0, 2]), r(3))),
               (_ops_torch.derivative_op(k.scale, "jvp"),
                (r(), r(4), r(), r(4)))]
    for o, args in samples:
        # requiring grad: registered autograd (which refuses a second
        # derivative), schema and fake kernel
        torch.library.opcheck(o, args, test_utils=(
            "test_schema", "test_autograd_registration", "test_faketensor"))
        # AOT dispatch differentiates the operator: that is the second
        # derivative it refuses, so those utils run on samples without grad
        plain = tuple(a.detach() if isinstance(a, torch.Tensor) else a
                      for a in args)
        torch.library.opcheck(o, plain, test_utils=ALL_UTILS[2:])
    with pytest.raises(Exception, match="its vjp has no derivative"):
        torch.library.opcheck(samples[0][0], samples[0][1],
                              test_utils=("test_aot_dispatch_static",))


def test_compiled_call_needing_no_gradient_skips_the_autograd_kernel(k):
    """Where nothing at a call site needs a gradient (no_grad, or no tensor
    requiring grad) the graph holds the `nograd` overload, whose Autograd
    key falls through: a declared vjp costs the inference graph nothing."""
    from torch._dynamo.testing import EagerAndRecordGraphs
    f = lambda a, x: k.scale(a, x)  # noqa: E731
    targets = {}
    for grad in (False, True):
        backend = EagerAndRecordGraphs()
        g = torch.compile(f, backend=backend, fullgraph=True)
        out = g(t(2.0, grad), t(X))
        assert out.requires_grad is grad
        targets[grad] = {n.target for gm in backend.graphs
                         for n in gm.graph.nodes}
    with torch.no_grad():
        backend = EagerAndRecordGraphs()
        torch.compile(f, backend=backend, fullgraph=True)(t(2.0, True), t(X))
    nograd = _ops_torch.op(k.scale, grad=False)
    assert nograd in targets[False] and _ops_torch.op(k.scale) in targets[True]
    assert nograd in {n.target for n in backend.graphs[0].graph.nodes}
    assert nograd._overloadname == "nograd"
