"""Declaring batch dimensions: `...` in a Function's signature (issue 25).

The grammar's refusals (ValueError with a caret), the records every route
reads (_batch, _dims, _inputs / _results core ranks), the normalised
spelling and identity, the derived vjp/jvp signatures carrying `...` and
the binding of spelled ones, and the shape function Function._result_specs
with its batch rule.  No kernel runs here: a declaration needs none, so
the kernels are fake addresses or the example library's symbols (their
signatures are not what these declare, which nothing here calls)."""
import pytest

import dlbridge as dlb

BSCALE = "bscale(a: float64[...], x: float64[..., n]) -> (y: float64[..., n])"
BSCALE_NOBATCH = "bscale(a: float64, x: float64[n]) -> (y: float64[n])"
BSCALE_VJP = ("bscale_vjp(a: float64[...], x: float64[..., n], "
              "dy: float64[..., n]) -> (da: float64[...], dx: float64[..., n])")
BSCALE_JVP = ("bscale_jvp(a: float64[...], x: float64[..., n], "
              "ta: float64[...], tx: float64[..., n]) -> (ty: float64[..., n])")
BAXPY = "baxpy(a: float64[...], x: float64[..., n], y: mut float64[..., n])"
BDOT = "bdot(x: float64[..., n], w: float64[n]) -> (s: float64[...])"
BSTATS = "bstats(x: float32[..., n]) -> (mean: float32[...], sq: float32[..., n])"


def fn(sig, **kw):
    return dlb.Function(1, sig, **kw)


# ---- the grammar ------------------------------------------------------------

@pytest.mark.parametrize("sig,fragment,col", [
    ("f(x: float64[n, ...])", "'...' must come first", 16),
    ("f(x: float64[..., ...])", "'...' given twice", 18),
    ("f(x: float64[..., n, ...])", "'...' given twice", 21),
    ("f(x: float64[..])", "expected '...' (three dots", 13),
    ("f(x: float64[...n])", "expected ',' or ']' after '...'", 16),
    ("f(x: float64[n]) -> float64[...]",
     "result 0 has '...' but no input does", 28),
    ("f(x: float64[n]) -> (s: float64, y: float64[..., n])",
     "result 'y' has '...' but no input does", 44),
])
def test_refused_with_caret(sig, fragment, col):
    with pytest.raises(ValueError) as e:
        fn(sig)
    msg = str(e.value)
    assert fragment in msg
    # the caret line: two spaces of indent, then the column
    assert msg.splitlines()[-1] == "  " + " " * col + "^"
    assert msg.splitlines()[-2] == "  " + sig


@pytest.mark.parametrize("sig,nin,nout", [
    (BSCALE, 2, 1), (BAXPY, 3, 0), (BDOT, 2, 1), (BSTATS, 1, 2),
    ("f(x: float64[...]) -> float64[...]", 1, 1),
    ("f(x: float64[ ... ,n ]) -> float64[n]", 1, 1),   # a result need not
])
def test_accepted(sig, nin, nout):
    f = fn(sig)
    assert len(f._inputs) == nin and len(f._results) == nout


# ---- the records ------------------------------------------------------------

def test_batch_dims_and_core_ranks():
    f = fn(BDOT)
    assert f._batch == (True, False, True)
    assert f._dims == (("...", "n"), ("n",), ("...",))
    assert [i[2] for i in f._inputs] == [1, 1]       # core ranks
    assert [r[1] for r in f._results] == [0]
    g = fn(BAXPY)
    assert g._batch == (True, True, True)
    assert g._inputs[2][3] is True                   # mut kept
    assert g._dims[0] == ("...",)
    h = fn("f(x: float32[2, k]) -> float32[k]")
    assert h._batch == (False, False)
    assert h._dims == ((2, "k"), ("k",))
    assert fn(BSTATS)._batch == (True, True, True)


def test_normalised_spelling_keeps_the_ellipsis():
    f = fn(" bscale ( a : float64 [ ... ] , x : float64[...,n] ) -> "
           "( y : float64[ ..., n ] ) ")
    assert f._normalized_signature == BSCALE
    assert fn(BAXPY)._normalized_signature == BAXPY + " -> ()"
    assert fn(BDOT)._normalized_signature == BDOT


def test_identity_differs_with_and_without_the_ellipsis():
    a, b = fn(BSCALE), fn(BSCALE)
    plain = fn(BSCALE_NOBATCH)
    assert a._identity == b._identity
    assert a._identity != plain._identity
    # `...` on one parameter only is yet another Function
    half = fn("bscale(a: float64, x: float64[..., n]) -> (y: float64[..., n])")
    assert len({a._identity, plain._identity, half._identity}) == 3


# ---- derivatives ------------------------------------------------------------

def test_derived_signatures_carry_the_ellipsis(lib):
    f = dlb.load(lib, "dlb_kernel_scale", BSCALE, vjp="dlb_kernel_scale_vjp",
                 jvp="dlb_kernel_scale_jvp")
    assert f._vjp._normalized_signature == BSCALE_VJP
    assert f._jvp._normalized_signature == BSCALE_JVP
    assert f._vjp._batch == (True, True, True, True, True)
    assert f._vjp_args == (("input", 0), ("input", 1), ("cotangent", 0))
    assert f._vjp_results == (0, 1)
    g = dlb.load(lib, "dlb_kernel_scale", BDOT, vjp="dlb_kernel_scale_vjp")
    assert g._vjp._normalized_signature == (
        "bdot_vjp(x: float64[..., n], w: float64[n], ds: float64[...]) -> "
        "(dx: float64[..., n], dw: float64[n])")
    assert g._vjp._batch == (True, False, True, True, False)
    # the identity covers the derivatives, `...` included
    plain = dlb.load(lib, "dlb_kernel_scale", BSCALE_NOBATCH,
                     vjp="dlb_kernel_scale_vjp")
    assert f._identity != plain._identity


def test_spelled_derivatives_bind_by_the_ellipsis():
    f = fn(BSCALE, vjp=(2, BSCALE_VJP), jvp=(3, BSCALE_JVP))
    assert f._vjp._normalized_signature == BSCALE_VJP
    # a subset of the inputs, `...` as the primal's
    g = fn(BSCALE, vjp=(2, "v(x: float64[..., n], dy: float64[..., n]) -> "
                           "(da: float64[...], dx: float64[..., n])"))
    assert g._vjp_args == (("input", 1), ("cotangent", 0))
    # the flag is checked like the dims, both ways
    with pytest.raises(ValueError, match=r"dy: float64\[n\] does not match "
                       r"the primal y: float64\[\.\.\., n\]"):
        fn(BSCALE, vjp=(2, "v(a: float64[...], x: float64[..., n], "
                           "dy: float64[n]) -> (da: float64[...], "
                           "dx: float64[..., n])"))
    with pytest.raises(ValueError, match=r"da: float64 does not match the "
                       r"primal a: float64\[\.\.\.\]"):
        fn(BSCALE, vjp=(2, "v(a: float64[...], x: float64[..., n], "
                           "dy: float64[..., n]) -> (da: float64, "
                           "dx: float64[..., n])"))
    with pytest.raises(ValueError, match=r"tx: float64\[\.\.\., n\] does not "
                       r"match the primal x: float64\[n\]"):
        fn(BSCALE_NOBATCH, jvp=(3, "t(a: float64, x: float64[n], "
                                   "ta: float64, tx: float64[..., n]) -> "
                                   "(ty: float64[n])"))


# ---- the shape function -----------------------------------------------------

def spec(shape, dtype="float64"):
    return (shape, dtype)


def test_result_specs_broadcast_the_batch():
    f = fn(BSCALE)
    (y,), aliases = f._result_specs([spec((4, 1)), spec((3, 5))])
    assert y[0] == (4, 3, 5) and aliases == ()
    (y,), _ = f._result_specs([spec(()), spec((5,))])
    assert y[0] == (5,)
    (y,), _ = f._result_specs([2.0, spec((2, 5))])     # a number: 0-d
    assert y[0] == (2, 5)
    (s,), _ = fn(BDOT)._result_specs([spec((2, 3, 4)), spec((4,))])
    assert s[0] == (2, 3)
    (m, q), _ = fn(BSTATS)._result_specs([spec((6, 7), "float32")])
    assert m[0] == (6,) and q[0] == (6, 7)
    # a result without `...` keeps its core shape
    (r,), _ = fn("f(x: float64[..., n]) -> float64[n]")._result_specs(
        [spec((9, 2))])
    assert r[0] == (2,)


def test_result_specs_unknown_extents():
    # None: not known until the graph runs; matches anything, and a known
    # extent other than 1 wins
    f = fn(BSCALE)
    (y,), _ = f._result_specs([spec((None, 1)), spec((3, None))])
    assert y[0] == (None, 3, None)
    (y,), _ = f._result_specs([spec((None,)), spec((4, 2))])
    assert y[0] == (4, 2)
    (y,), _ = f._result_specs([spec((1,)), spec((None, 2))])
    assert y[0] == (None, 2)
    with pytest.raises(ValueError, match="do not broadcast"):
        f._result_specs([spec((None, 2)), spec((3, None))])


def test_result_specs_refuse_a_batch_mismatch():
    f = fn(BSCALE)
    with pytest.raises(ValueError, match=r"^bscale\(\): batch dimensions of "
                       r"x \(4, 3\) and a \(2,\) do not broadcast$"):
        f._result_specs([spec((2,)), spec((4, 3, 5))])
    with pytest.raises(ValueError, match="argument 'x': expected at least 1 "
                       "dimension"):
        f._result_specs([spec((2,)), spec(())])
    # a non-`...` parameter must have exactly its core rank
    with pytest.raises(ValueError, match="argument 'w': expected 1 dimension, "
                       "got 2"):
        fn(BDOT)._result_specs([spec((2, 4)), spec((2, 4))])
    # core dims are the last ones
    with pytest.raises(ValueError, match="argument 'w': dimension n is 5 here "
                       "but 4 from argument 'x'"):
        fn(BDOT)._result_specs([spec((2, 4)), spec((5,))])
    with pytest.raises(ValueError, match=r"argument 'x': dimension -1 is 5 but "
                       r"the signature says 4"):
        fn("f(x: float64[..., 4])")._result_specs([spec((3, 5))])


def test_result_specs_mut_must_be_the_whole_batch():
    f = fn(BAXPY)
    (), aliases = f._result_specs([spec((2, 1)), spec((3, 5)),
                                   spec((2, 3, 5))])
    assert aliases == (2,)
    with pytest.raises(ValueError, match=r"batch dimensions of mut argument "
                       r"'y' \(3,\) must be the whole broadcast batch shape, "
                       r"but a \(2, 1\) broadcasts beyond them"):
        f._result_specs([spec((2, 1)), spec((3, 5)), spec((3, 5))])


def test_a_call_with_batch_dims_reaches_the_kernel(lib):
    # Eager calls with batch dims run (tests/python/test_batch_eager.py
    # checks what the kernel gets); here only that the kernel is reached,
    # with every `...` argument and result.
    import numpy as np
    f = dlb.load(lib, "dlb_kernel_fail",
                 "bs(a: float64[...], x: float64[..., n]) -> "
                 "(y: float64[..., n])")
    a, x = np.ones(3), np.ones((3, 4))
    with pytest.raises(ValueError, match="fail was given 3 tensors"):
        f(a, x)
    with pytest.raises(ValueError, match="fail was given 3 tensors"):
        f(2.0, x)
    # batch rank 0 everywhere is an ordinary call: the kernel runs
    with pytest.raises(ValueError, match="fail was given 3 tensors"):
        f(2.0, np.ones(4))
