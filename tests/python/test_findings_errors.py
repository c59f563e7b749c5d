"""Regression tests for issue 7 findings about error types: torch
sparse/meta/quantized tensors, OverflowError for huge values."""
import pytest

from _findings_util import CAPSULE, check

# Known open defect of issue 7: each test fails on the current code and
# must start passing when its finding is fixed (strict: an unexpected pass
# fails the run, so the marker is removed together with the bug).
pytestmark_open_finding = pytest.mark.xfail(
    strict=True, reason="issue 7 finding not fixed yet")


TORCH_CASES = {
    "sparse": "torch.eye(3).to_sparse()",
    "meta": "torch.empty(4, device='meta')",
    "quantized": "torch.quantize_per_tensor(torch.ones(4), 0.1, 0, torch.quint8)",
}


@pytest.mark.parametrize("case", sorted(TORCH_CASES))
@pytest.mark.parametrize("route", ["from_dlpack", "convert", "function"])
def test_torch_unsupported_layout_is_short_buffer_error(case, route):
    """Finding: torch sparse/meta/quantized tensors raise RuntimeError with a
    1.7 KB C++ backtrace instead of a BufferError with a short message."""
    pytest.importorskip("torch")
    check("""
    import torch
    x = %s
    route = %r
    try:
        if route == "from_dlpack":
            dlb.from_dlpack(x)
        elif route == "convert":
            dlb.convert(x, "numpy")
        else:
            sig = {"sparse": "f(x: float32[m, n])", "meta": "f(x: float32[n])",
                   "quantized": "f(x: uint8[n])"}[%r]
            f = dlb.load(KERNELS, "dlb_kernel_noop", sig)
            f(x)
    except BufferError as e:
        print(len(str(e)))
        print("OK" if len(str(e)) < 400 and "frame #" not in str(e) else "LONG")
    except Exception as e:
        print(type(e).__name__, len(str(e)))
    """ % (TORCH_CASES[case], route, case))


pytestmark = pytestmark_open_finding
