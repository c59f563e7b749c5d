"""Zero-copy round trips between torch, CuPy, JAX, numba-cuda, cuda.core's
StridedMemoryView and dlbridge.Tensor on a real GPU (issue 8, item 6).

For every ordered pair (source, target) of different frameworks, through
dlbridge.convert(src, target) and through dlbridge.from_dlpack(src) followed
by the target's own importer: the result is the target's type, on cuda:0,
shares the source's device memory (equal element-0 addresses), and holds
the source's values.  JAX as the importing side promises no sharing (it may
copy): there the values are asserted and the sharing is recorded
(`record_property("jax_import_shared", ...)`, shown with -rA).
"""

import numpy as np
import pytest

from gpu_helpers import FRAMEWORKS, adapter, sample

PAIRS = [(s, t) for s in FRAMEWORKS for t in FRAMEWORKS if s != t]


def _pair_id(p):
    return "%s->%s" % p


def _check_shared(record_property, src_fw, dst_fw, src, out):
    if dst_fw.zero_copy_in:
        assert dst_fw.ptr(out) == src_fw.ptr(src), "a copy was made"
    else:
        shared = dst_fw.ptr(out) == src_fw.ptr(src)
        record_property("%s_import_shared" % dst_fw.name, shared)
        print("%s import from %s: %s" % (dst_fw.name, src_fw.name,
                                         "shared" if shared else "COPIED"))


@pytest.mark.parametrize("pair", PAIRS, ids=_pair_id)
def test_convert_zero_copy(request, record_property, dlb, pair):
    src_fw, dst_fw = (adapter(request, n) for n in pair)
    want = sample()
    src = src_fw.make(want)
    out = dlb.convert(src, dst_fw.target())
    assert dst_fw.is_instance(out), type(out)
    _check_shared(record_property, src_fw, dst_fw, src, out)
    assert tuple(out.shape) == want.shape
    np.testing.assert_array_equal(dst_fw.to_numpy(out), want)
    # The result keeps the source's memory alive on its own.
    del src
    np.testing.assert_array_equal(dst_fw.to_numpy(out), want)


@pytest.mark.parametrize("pair", PAIRS, ids=_pair_id)
def test_from_dlpack_then_framework_import(request, record_property, dlb, pair):
    src_fw, dst_fw = (adapter(request, n) for n in pair)
    want = sample((3, 4, 5))
    src = src_fw.make(want)
    t = dlb.from_dlpack(src)
    assert type(t) is dlb.Tensor
    assert t.data_ptr == src_fw.ptr(src)
    assert t.device == "cuda:0" and t.__dlpack_device__() == (2, 0)
    assert t.shape == want.shape and t.dtype == "float32"
    out = dst_fw.consume(t)
    _check_shared(record_property, src_fw, dst_fw, src, out)
    np.testing.assert_array_equal(dst_fw.to_numpy(out), want)


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_convert_to_own_framework_is_identity_or_shared(request, dlb, name):
    fw = adapter(request, name)
    src = fw.make(sample())
    out = dlb.convert(src, fw.target())
    assert fw.is_instance(out) and fw.ptr(out) == fw.ptr(src)


# ---- strided views keep their layout --------------------------------------------

# Targets that can hold any strides (torch: no negative ones).
STRIDED_TARGETS = ["cupy", "numba", "cuda.core", "dlbridge", "torch"]


def _strided_torch(torch):
    base = torch.arange(24 * 40, dtype=torch.float32, device="cuda:0").reshape(24, 40)
    return base.t()[3:, 1::2]  # transposed, offset, stepped


@pytest.mark.parametrize("target", STRIDED_TARGETS)
def test_strided_torch_view_shared_with_its_strides(request, dlb, torch, target):
    dst_fw = adapter(request, target)
    view = _strided_torch(torch)
    want = view.cpu().numpy()
    out = dlb.convert(view, dst_fw.target())
    assert dst_fw.ptr(out) == view.data_ptr()
    np.testing.assert_array_equal(dst_fw.to_numpy(out), want)
    t = dlb.from_dlpack(view)
    assert t.strides == tuple(view.stride()) and t.data_ptr == view.data_ptr()


@pytest.mark.parametrize("target", ["numba", "cuda.core", "dlbridge"])
def test_negative_strides_from_cupy_shared(request, dlb, cupy, target):
    dst_fw = adapter(request, target)
    base = cupy.arange(30 * 8, dtype=cupy.float32).reshape(30, 8)
    view = base[::-3, ::-1]
    out = dlb.convert(view, dst_fw.target())
    assert dst_fw.ptr(out) == view.data.ptr
    np.testing.assert_array_equal(dst_fw.to_numpy(out), cupy.asnumpy(view))
    t = dlb.from_dlpack(view)
    assert t.strides == tuple(s // 4 for s in view.strides)


def test_negative_strides_into_torch_refused(dlb, cupy, torch):
    view = cupy.arange(10, dtype=cupy.float32)[::-1]
    with pytest.raises(BufferError, match="torch"):
        dlb.convert(view, "torch")


def test_jax_export_is_zero_copy(dlb, jax):
    # JAX's own __dlpack__ hands over its buffer: dlbridge must keep it.
    x = jax.device_put(sample(), jax.devices("gpu")[0])
    t = dlb.from_dlpack(x)
    assert t.data_ptr == x.unsafe_buffer_pointer() and t.device == "cuda:0"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8", "uint8", "int32",
                                   "int64", "float64", "complex64", "bool"])
def test_torch_cupy_dlbridge_dtypes(dlb, torch, cupy, dtype):
    """Every dtype torch and CuPy share crosses both ways without a copy
    (bfloat16: torch <-> dlbridge only, CuPy has none)."""
    tdt = getattr(torch, dtype)
    x = (torch.arange(64, device="cuda:0") % 2 == 0 if dtype == "bool"
         else torch.arange(64, device="cuda:0").to(tdt))
    t = dlb.from_dlpack(x)
    assert t.dtype == dtype and t.data_ptr == x.data_ptr()
    back = dlb.convert(t, "torch")
    assert back.dtype == tdt and back.data_ptr() == x.data_ptr()
    assert torch.equal(back, x)
    if dtype != "bfloat16":
        c = dlb.convert(x, "cupy")
        assert c.data.ptr == x.data_ptr()
        np.testing.assert_array_equal(cupy.asnumpy(c), x.cpu().numpy())
