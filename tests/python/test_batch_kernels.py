"""examples/kernels/batch.c called directly through ctypes with hand-made
DLTensors: the kernels every batch test (eager, jax.vmap, torch.vmap, TF)
builds on must be right on their own first -- broadcasting at size-1 batch
axes, any strides (0, negative, permuted), NULL strides, float32 and float64,
the launch counters, and a DLB_EINVAL with a message for every contract
break (so a route that pads or broadcasts wrongly fails instead of reading
out of bounds)."""

import ctypes

import numpy as np
import pytest

from dlpack_ctypes import DLBError, DLTensor
from _batch_counter import batch_counters

DLB_OK, DLB_EINVAL = 0, -1
KDLCPU, KDLFLOAT, KDLINT = 1, 2, 0

KERNELS = ("bscale", "bscale_vjp", "bscale_jvp", "bstats", "baxpy", "bdot",
           "vscale", "vscale_vjp")


@pytest.fixture(scope="module")
def so(lib):
    d = ctypes.CDLL(lib)
    for name in KERNELS:
        fn = getattr(d, "dlb_kernel_" + name)
        fn.argtypes = [ctypes.POINTER(ctypes.POINTER(DLTensor)), ctypes.c_int32,
                       ctypes.c_void_p, ctypes.POINTER(DLBError)]
        fn.restype = ctypes.c_int
    return d


def tensor(a, compact_null=False):
    """A DLTensor viewing the NumPy array a (its strides in elements; NULL
    strides when compact_null and a is C-contiguous).  The ctypes arrays it
    points at are kept on the struct."""
    t = DLTensor()
    t.data = a.ctypes.data
    t.device.device_type, t.device.device_id = KDLCPU, 0
    t.ndim = a.ndim
    kind = {"f": KDLFLOAT, "i": KDLINT}[a.dtype.kind]
    t.dtype.code, t.dtype.bits, t.dtype.lanes = kind, a.dtype.itemsize * 8, 1
    shape = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
    strides = (ctypes.c_int64 * max(a.ndim, 1))(
        *(s // a.dtype.itemsize for s in a.strides))
    t.shape = shape
    t.strides = None if compact_null and a.flags.c_contiguous else strides
    t.byte_offset = 0
    t._keep = (a, shape, strides)
    return t


def call(so, name, *arrays, compact_null=False):
    ts = [tensor(a, compact_null) for a in arrays]
    argv = (ctypes.POINTER(DLTensor) * len(ts))(*(ctypes.pointer(t) for t in ts))
    err = DLBError()
    rc = getattr(so, "dlb_kernel_" + name)(argv, len(ts), None,
                                           ctypes.byref(err))
    return rc, err.message.decode()


counters = batch_counters


def out(shape, dtype):
    # NaN-filled: a result element the kernel forgets to write shows up.
    return np.full(shape, np.nan, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bscale_broadcasts_size1_axes_and_counts_one_call(so, dtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 1)).astype(dtype)
    x = rng.standard_normal((1, 3, 5)).astype(dtype)
    y = out((4, 3, 5), dtype)
    before, _ = counters(so)
    rc, msg = call(so, "bscale", a, x, y)
    assert rc == DLB_OK, msg
    np.testing.assert_allclose(y, a[..., None] * x, rtol=1e-6)
    calls, last = counters(so)
    assert calls == before + 1
    assert last == (4, 3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bscale_honours_zero_negative_and_permuted_strides(so, dtype):
    rng = np.random.default_rng(1)
    # a expanded with stride 0 at full extent (torch's expand), x flipped
    # along both a batch axis and the core axis, then permuted batch axes.
    a = np.broadcast_to(rng.standard_normal((1, 3)).astype(dtype), (2, 3))
    base = rng.standard_normal((3, 2, 6)).astype(dtype)
    x = base[::-1, :, ::-1].transpose(1, 0, 2)
    assert a.strides[0] == 0 and x.strides[2] < 0 and x.strides[1] < 0
    y = out((2, 3, 6), dtype)
    rc, msg = call(so, "bscale", a, x, y)
    assert rc == DLB_OK, msg
    np.testing.assert_allclose(y, a[..., None] * x, rtol=1e-6)


def test_null_strides_are_compact(so):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((2, 3))
    x = rng.standard_normal((2, 3, 4))
    y = out((2, 3, 4), np.float64)
    rc, msg = call(so, "bscale", a, x, y, compact_null=True)
    assert rc == DLB_OK, msg
    np.testing.assert_allclose(y, a[..., None] * x)


def test_batch_rank_zero_and_extent_zero(so):
    a, x = np.array(2.0), np.arange(3.0)
    y = out((3,), np.float64)
    rc, msg = call(so, "bscale", a, x, y)
    assert rc == DLB_OK, msg
    np.testing.assert_array_equal(y, 2.0 * x)
    assert counters(so)[1] == ()
    before, _ = counters(so)
    rc, msg = call(so, "bscale", np.ones((0, 1)), np.ones((1, 2, 3)),
                   out((0, 2, 3), np.float64))
    assert rc == DLB_OK, msg
    assert counters(so) == (before + 1, (0, 2))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bscale_vjp_da_at_the_full_batch_shape(so, dtype):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((1, 3)).astype(dtype)
    x = rng.standard_normal((2, 1, 4)).astype(dtype)
    dy = rng.standard_normal((2, 3, 4)).astype(dtype)
    da, dx = out((2, 3), dtype), out((2, 3, 4), dtype)
    rc, msg = call(so, "bscale_vjp", a, x, dy, da, dx)
    assert rc == DLB_OK, msg
    np.testing.assert_allclose(da, (x * dy).sum(-1), rtol=1e-5)
    np.testing.assert_allclose(dx, a[..., None] * dy, rtol=1e-6)


def test_bscale_jvp(so):
    rng = np.random.default_rng(4)
    a, ta = rng.standard_normal((3,)), rng.standard_normal((1,))
    x, tx = rng.standard_normal((1, 5)), rng.standard_normal((3, 5))
    ty = out((3, 5), np.float64)
    rc, msg = call(so, "bscale_jvp", a, x, ta, tx, ty)
    assert rc == DLB_OK, msg
    np.testing.assert_allclose(ty, ta[:, None] * x + a[:, None] * tx)


def test_bstats_two_results(so):
    x = np.random.default_rng(5).standard_normal((2, 3, 4)).astype(np.float32)
    mean, sq = out((2, 3), np.float32), out((2, 3, 4), np.float32)
    rc, msg = call(so, "bstats", x, mean, sq)
    assert rc == DLB_OK, msg
    np.testing.assert_allclose(mean, x.mean(-1), rtol=1e-5)
    np.testing.assert_allclose(sq, x * x, rtol=1e-6)
    assert counters(so)[1] == (2, 3)


def test_baxpy_updates_the_mut_argument_in_place(so):
    rng = np.random.default_rng(6)
    a, x = rng.standard_normal((3, 1)), rng.standard_normal((1, 2, 4))
    y = rng.standard_normal((3, 2, 4))
    want = y + a[..., None] * x
    rc, msg = call(so, "baxpy", a, x, y)
    assert rc == DLB_OK, msg
    np.testing.assert_allclose(y, want)
    assert counters(so)[1] == (3, 2)


def test_bdot_unbatched_weight_with_negative_stride(so):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 5))
    w = rng.standard_normal(5)[::-1]
    s = out((2, 3), np.float64)
    rc, msg = call(so, "bdot", x, w, s)
    assert rc == DLB_OK, msg
    np.testing.assert_allclose(s, x @ w)


def test_vscale_and_its_vjp_count_rank_zero(so):
    rng = np.random.default_rng(8)
    a, x, dy = np.array(1.5, np.float32), *rng.standard_normal((2, 4)).astype(
        np.float32)
    y = out((4,), np.float32)
    before, _ = counters(so)
    rc, msg = call(so, "vscale", a, x, y)
    assert rc == DLB_OK, msg
    np.testing.assert_allclose(y, 1.5 * x, rtol=1e-6)
    da, dx = out((), np.float32), out((4,), np.float32)
    rc, msg = call(so, "vscale_vjp", a, x, dy, da, dx)
    assert rc == DLB_OK, msg
    np.testing.assert_allclose(da, (x * dy).sum(), rtol=1e-5)
    np.testing.assert_allclose(dx, 1.5 * dy, rtol=1e-6)
    assert counters(so) == (before + 2, ())


F64 = np.float64


@pytest.mark.parametrize("name,arrays,needle", [
    ("bscale", [np.ones(()), np.ones(3)], "takes 3 arguments, got 2"),
    ("bscale", [np.ones(()), np.ones(3, np.float32), np.ones(3)],
     "must be float32 or float64 like a"),
    ("bscale", [np.ones((), np.int64), np.ones(3, np.int64),
                np.ones(3, np.int64)], "must be float32 or float64"),
    ("bscale", [np.ones(2), np.ones((1, 2, 3)), np.ones((1, 2, 3))],
     "batch ranks differ: a has 1, x has 2"),
    ("bscale", [np.ones((2,)), np.ones((3, 4)), np.ones((3, 4))],
     "batch axis 0: a has 2, x has 3"),
    ("bscale", [np.ones((3,)), np.ones((3, 4)), np.ones((1, 4))],
     "batch axis 0: y has 1, the broadcast extent is 3"),
    ("baxpy", [np.ones((3,)), np.ones((3, 4)), np.ones((1, 4))],
     "y has 1, the broadcast extent is 3"),
    ("bscale", [np.ones(()), np.ones(3), np.ones(4)],
     "core dimension n: x has 3, y has 4"),
    ("bdot", [np.ones((2, 3)), np.ones((2, 3)), np.ones(2)],
     "w has no batch dimensions, so 1 dimension(s), got 2"),
    ("vscale", [np.ones(2), np.ones((2, 3)), np.ones((2, 3))],
     "a has no batch dimensions, so 0 dimension(s), got 1"),
    ("bstats", [np.ones(()), np.ones(()), np.ones(())],
     "x needs at least 1 dimension(s), got 0"),
])
def test_contract_breaks_are_einval_with_a_message(so, name, arrays, needle):
    before = counters(so)
    rc, msg = call(so, name, *arrays)
    assert rc == DLB_EINVAL
    assert needle in msg
    assert counters(so) == before
