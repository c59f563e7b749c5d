"""Declaring a Function's derivatives: vjp= and jvp= on dlb.Function and
dlb.load, their binding by name, the refusals, the attributes the
frameworks' routes read, and the identity (docs/function.md, Gradients).
No framework is needed: the derivative Functions are called with NumPy."""
import numpy as np
import pytest

import dlbridge as dlb
from dlbridge import _autodiff, _core

SCALE = "scale(a: float64, x: float64[n]) -> (y: float64[n])"
SOFTMAX = "softmax(x: float64[n]) -> (y: float64[n])"
SOFTMAX_VJP = "softmax_vjp(y: float64[n], dy: float64[n]) -> (dx: float64[n])"
GATHER = "gather(x: float64[m], idx: int64[k]) -> (y: float64[k])"
SINCOS = "sincos(x: float64[n]) -> (s: float64[n], c: float64[n])"
LSE = "softmax_lse(x: float64[n]) -> (y: float64[n], lse: nodiff float64)"
BAD = "dlb_kernel_bad_vjp_shape"


def load(lib, sym, sig, **kw):
    return dlb.load(lib, "dlb_kernel_" + sym, sig, **kw)


def test_derived_vjp_and_jvp_from_symbols(lib):
    f = load(lib, "scale", SCALE, vjp="dlb_kernel_scale_vjp",
             jvp="dlb_kernel_scale_jvp")
    assert f._vjp._normalized_signature == (
        "scale_vjp(a: float64, x: float64[n], dy: float64[n]) -> "
        "(da: float64, dx: float64[n])")
    assert f._jvp._normalized_signature == (
        "scale_jvp(a: float64, x: float64[n], ta: float64, tx: float64[n]) "
        "-> (ty: float64[n])")
    assert f._vjp_args == (("input", 0), ("input", 1), ("cotangent", 0))
    assert f._vjp_results == (0, 1)
    assert f._jvp_args == (("input", 0), ("input", 1), ("tangent", 0),
                           ("tangent", 1))
    assert f._jvp_results == (0,)
    assert f._diff_inputs == (0, 1) and f._diff_results == (0,)
    assert f._result_names == ("y",)
    x = np.array([1.0, -2.0, 3.0])
    dy = np.array([0.5, 0.25, -1.0])
    da, dx = f._vjp(np.float64(2.0), x, dy)
    assert da == pytest.approx(float(np.sum(dy * x)))
    np.testing.assert_allclose(dx, 2.0 * dy)
    (ty,) = (f._jvp(np.float64(2.0), x, np.float64(0.5), dy),)
    np.testing.assert_allclose(ty, 0.5 * x + 2.0 * dy)
    # the forward itself is unchanged
    np.testing.assert_allclose(f(2.0, x), 2.0 * x)


def test_spelled_vjp_binds_by_name(lib):
    f = load(lib, "softmax", SOFTMAX,
             vjp=("dlb_kernel_softmax_vjp", SOFTMAX_VJP))
    assert f._vjp_args == (("result", 0), ("cotangent", 0))
    assert f._vjp_results == (0,)
    assert f._jvp is None and f._jvp_args is None
    assert _autodiff.saved(f) == ((), (0,))
    x = np.array([0.1, 0.2, 0.7])
    y = f(x)
    dy = np.array([1.0, 0.0, 0.0])
    dx = f._vjp(*_autodiff.vjp_arguments(f, [x], [y], [dy]))
    np.testing.assert_allclose(dx, y * (dy - np.dot(dy, y)))


def test_vjp_as_a_function_and_as_a_kernel_pair(lib):
    vjp = load(lib, "softmax_vjp", SOFTMAX_VJP)
    fwd = load(lib, "softmax", SOFTMAX)
    f = dlb.Function(fwd.address, SOFTMAX, vjp=vjp)
    assert f._vjp is vjp
    g = dlb.Function(fwd.address, SOFTMAX, vjp=(vjp.address, SOFTMAX_VJP))
    assert g._vjp is not vjp and g._vjp.address == vjp.address
    assert g._vjp_args == f._vjp_args
    with pytest.raises(TypeError, match="needs dlbridge.load"):
        dlb.Function(fwd.address, SOFTMAX, vjp="dlb_kernel_softmax_vjp")
    with pytest.raises(TypeError, match="vjp= must be a Function"):
        dlb.Function(fwd.address, SOFTMAX, vjp=3)
    with pytest.raises(TypeError, match="signature must be a str"):
        dlb.Function(fwd.address, SOFTMAX, vjp=(vjp.address, 3))
    with pytest.raises(TypeError, match="unexpected keyword argument 'vjps'"):
        load(lib, "softmax", SOFTMAX, vjps="dlb_kernel_softmax_vjp")
    with pytest.raises(ValueError, match="not found"):
        load(lib, "softmax", SOFTMAX, vjp="dlb_kernel_no_such_vjp")


def test_integer_and_nodiff_inputs_get_no_cotangent(lib):
    g = load(lib, "gather", GATHER, vjp="dlb_kernel_gather_vjp")
    assert g._diff_inputs == (0,)
    assert g._vjp._normalized_signature == (
        "gather_vjp(x: float64[m], idx: int64[k], dy: float64[k]) -> "
        "(dx: float64[m])")
    x = np.array([1.0, 2.0, 3.0])
    idx = np.array([2, 0, 2], dtype=np.int64)
    dx = g._vjp(x, idx, np.array([1.0, 10.0, 100.0]))
    np.testing.assert_allclose(dx, [10.0, 0.0, 101.0])
    with pytest.raises(ValueError, match="'idx' is int64: it has no cotangent"):
        load(lib, "gather", GATHER, vjp=(
            "dlb_kernel_gather_vjp",
            "gather_vjp(x: float64[m], idx: int64[k], dy: float64[k]) -> "
            "(dx: float64[m], didx: int64[k])"))
    nd = dlb.load(lib, "dlb_kernel_scale",
                  "scale(a: nodiff float64, x: float64[n]) -> (y: float64[n])")
    assert nd._diff_inputs == (1,)


def test_nodiff_result(lib):
    f = load(lib, "softmax_lse", LSE, vjp=(
        "dlb_kernel_softmax_lse_vjp",
        "softmax_lse_vjp(y: float64[n], dy: float64[n]) -> (dx: float64[n])"))
    assert f._diff_results == (0,)
    assert f._result_names == ("y", "lse")
    assert "lse: nodiff float64" in f._normalized_signature
    # a derived vjp takes no cotangent of the nodiff result
    d = load(lib, "softmax_lse", LSE, vjp="dlb_kernel_softmax_lse_vjp")
    assert [k for k, _ in d._vjp_args].count("cotangent") == 1
    with pytest.raises(ValueError, match="lse"):
        load(lib, "softmax_lse", LSE, vjp=(
            "dlb_kernel_softmax_lse_vjp",
            "softmax_lse_vjp(y: float64[n], dy: float64[n], dlse: float64) -> "
            "(dx: float64[n])"))


def test_unnamed_results_are_out(lib):
    f = dlb.load(lib, "dlb_kernel_sincos",
                 "sincos(x: float64[n]) -> (float64[n], float64[n])",
                 vjp="dlb_kernel_sincos_vjp")
    assert f._result_names == ("out0", "out1")
    assert f._vjp._normalized_signature == (
        "sincos_vjp(x: float64[n], dout0: float64[n], dout1: float64[n]) -> "
        "(dx: float64[n])")
    one = dlb.load(lib, "dlb_kernel_scale",
                   "scale(a: float64, x: float64[n]) -> float64[n]",
                   vjp="dlb_kernel_scale_vjp")
    assert "dout: float64[n]" in one._vjp._normalized_signature
    with pytest.raises(ValueError, match="dout"):
        dlb.load(lib, "dlb_kernel_scale",
                 "scale(dout: float64, x: float64[n]) -> float64[n]",
                 vjp="dlb_kernel_scale_vjp")


@pytest.mark.parametrize("spelled, needle", [
    ("b(x: float64[n], g: float64[n]) -> (dx: float64[n])", "'g'"),
    ("b(x: float64[n], dy: float64[n]) -> (dz: float64[n])", "dz"),
    ("b(x: float64[n], dy: float32[n]) -> (dx: float64[n])", "dy"),
    ("b(x: float64[n], dy: float64[3]) -> (dx: float64[n])", "dy"),
    ("b(x: float64[n], dy: float64[n]) -> (dx: float64[n, n])", "dx"),
    ("b(x: float64[n], dy: mut float64[n]) -> (dx: float64[n])", "mut"),
    ("b(x: float64[n], dy: float64[n]) -> ()", "x"),
    ("b(x: float64[n]) -> (dx: float64[n])", "dy"),
])
def test_spelled_vjp_refusals_name_the_parameter(lib, spelled, needle):
    sig = "f(x: float64[n]) -> (y: float64[n])"
    with pytest.raises(ValueError, match=needle):
        dlb.load(lib, BAD, sig, vjp=(BAD, spelled))


def test_mut_primal_cannot_have_a_vjp(lib):
    with pytest.raises(ValueError, match="mut"):
        dlb.load(lib, "dlb_kernel_scale",
                 "scale(a: float64, x: mut float64[n])",
                 vjp="dlb_kernel_scale_vjp")


def test_spelled_jvp_refusals(lib):
    with pytest.raises(ValueError, match=r"result\(s\) c "):
        load(lib, "sincos", SINCOS, jvp=(
            "dlb_kernel_sincos_jvp",
            "sincos_jvp(x: float64[n], tx: float64[n]) -> (ts: float64[n])"))
    with pytest.raises(ValueError, match="tx"):
        load(lib, "sincos", SINCOS, jvp=(
            "dlb_kernel_sincos_jvp",
            "sincos_jvp(x: float64[n]) -> (ts: float64[n], tc: float64[n])"))


def test_identity_covers_the_derivatives(lib):
    plain = load(lib, "softmax", SOFTMAX)
    a = load(lib, "softmax", SOFTMAX,
             vjp=("dlb_kernel_softmax_vjp", SOFTMAX_VJP))
    b = load(lib, "softmax", SOFTMAX,
             vjp=("dlb_kernel_softmax_vjp", SOFTMAX_VJP))
    c = load(lib, "softmax", SOFTMAX, vjp="dlb_kernel_softmax_vjp")
    assert a._identity == b._identity
    assert len({plain._identity, a._identity, c._identity}) == 3
    assert "; vjp softmax_vjp(" in a._normalized_signature


def test_registry_compares_the_derivatives_kernels(lib):
    # one forward, one vjp signature, two vjp kernels: one identity, and
    # the registry refuses the second (never one serving the other's calls)
    sig = "dup_grad_check(x: float64[n]) -> (y: float64[n])"
    spelled = "v(x: float64[n], dy: float64[n]) -> (dx: float64[n])"
    a = dlb.load(lib, BAD, sig, vjp=(BAD, spelled))
    b = dlb.load(lib, BAD, sig, vjp=("dlb_kernel_softmax_vjp", spelled))
    assert a._identity == b._identity
    assert _core._ops_register(a) is a
    with pytest.raises(ValueError, match="another kernel"):
        _core._ops_register(b)
    same = dlb.load(lib, BAD, sig, vjp=(BAD, spelled))
    assert _core._ops_register(same) is a


def test_messages_of_the_routes():
    f = dlb.Function(1, SOFTMAX)
    assert "softmax: dlbridge Function has no backward" in str(
        _autodiff.no_backward(f))
    assert "jvp=" in str(_autodiff.no_forward_ad(f))
    assert "second-order" in str(_autodiff.no_second_order(f))
    assert _autodiff.saved(f) == ((), ())
