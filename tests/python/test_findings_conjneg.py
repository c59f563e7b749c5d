"""Regression tests for issue 7: torch tensors with the lazy conjugate or
negative bit must not lose the bit when read through torch's exchange
table -- resolved to the right values or refused with BufferError."""
import pytest

from _findings_util import check

# Known open defect of issue 7: each test fails on the current code and
# must start passing when its finding is fixed (strict: an unexpected pass
# fails the run, so the marker is removed together with the bug).
pytestmark_open_finding = pytest.mark.xfail(
    strict=True, reason="issue 7 finding not fixed yet")


pytest.importorskip("torch")

CASES = {
    "conj": "torch.tensor([1+2j, 3-4j], dtype=torch.complex64).conj()",
    "conj_imag": "torch.tensor([1+2j, 3-4j], dtype=torch.complex64).conj().imag",
    "neg": "torch._neg_view(torch.tensor([1.0, -2.0]))",
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("route", ["from_dlpack", "convert"])
def test_lazy_bit_not_dropped_on_import(case, route):
    """Finding: x.conj(), x.conj().imag and negative-bit tensors import
    through torch's exchange table with the bit dropped (wrong values)."""
    check("""
    import torch
    x = %s
    assert x.is_conj() or x.is_neg()
    want = x.resolve_conj().resolve_neg().tolist()
    try:
        if %r == "from_dlpack":
            got = dlb.from_dlpack(x).tolist()
        else:
            got = dlb.convert(x, "numpy").tolist()
    except BufferError:
        print("OK"); sys.exit(0)
    print(got, want)
    print("OK" if got == want else "BIT DROPPED")
    """ % (CASES[case], route))


@pytest.mark.parametrize("case", ["conj_imag", "neg"])
def test_lazy_bit_not_dropped_in_function(case):
    """Finding: a conj/neg-bit torch tensor passed to a Function is read with
    the bit dropped (wrong result, no error)."""
    check("""
    import torch
    x = %s
    want = [2.0 * v for v in x.resolve_conj().resolve_neg().tolist()]
    y = np.zeros(2, dtype=np.float32)
    f = dlb.load(KERNELS, "dlb_kernel_saxpy",
                 "saxpy(a: float32, x: float32[n], y: mut float32[n])")
    try:
        f(2.0, x, y)
    except BufferError:
        print("OK"); sys.exit(0)
    print(y.tolist(), want)
    print("OK" if y.tolist() == want else "BIT DROPPED")
    """ % CASES[case])


def test_lazy_conj_not_dropped_in_function_mut():
    """Finding: a mut argument with the negative bit is written as if it had
    none (the caller then sees negated values)."""
    check("""
    import torch
    base = torch.zeros(2)
    y = torch._neg_view(base)
    f = dlb.load(KERNELS, "dlb_kernel_saxpy",
                 "saxpy(a: float32, x: float32[n], y: mut float32[n])")
    try:
        f(1.0, np.ones(2, dtype=np.float32), y)
    except BufferError:
        print("OK"); sys.exit(0)
    print(y.tolist())
    print("OK" if y.tolist() == [1.0, 1.0] else "BIT DROPPED")
    """)


pytestmark = pytestmark_open_finding
