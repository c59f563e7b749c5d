"""Eager calls of a Function with batch dimensions `...` (issue 25, items 1
and 5): the batch parts of the `...` arguments broadcast (NumPy's rule),
the kernel gets every `...` argument padded to one batch rank (extent 1,
stride 0, no copy), the results are allocated at the broadcast batch shape
B + core, compact; parameters without `...` never get batch dims; a `mut`
`...` argument must be the whole of B.  Every answer is compared with
NumPy's, on NumPy, dlb.Tensor, torch, JAX and TensorFlow arguments, and the
kernels' launch counter (examples/kernels/batch.c) shows one kernel call
per eager call with the B it was given.  The kernels refuse (DLB_EINVAL)
any call that breaks the contract, so a wrong padding fails here."""

import ctypes
import gc

import numpy as np
import pytest

import dlbridge as dlb
from dlbridge import _core
from _batch_counter import batch_counters

try:
    import torch
except ImportError:  # pragma: no cover - depends on the environment
    torch = None

try:
    import _testcapi
except ImportError:  # pragma: no cover
    _testcapi = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")


def signatures(t):
    return dict(
        bscale="bscale(a: %s[...], x: %s[..., n]) -> (y: %s[..., n])" % (
            t, t, t),
        bstats="bstats(x: %s[..., n]) -> (mean: %s[...], sq: %s[..., n])" % (
            t, t, t),
        baxpy="baxpy(a: %s[...], x: %s[..., n], y: mut %s[..., n])" % (
            t, t, t),
        bdot="bdot(x: %s[..., n], w: %s[n]) -> (s: %s[...])" % (t, t, t))


class Kernels:
    """examples/kernels/batch.c's kernels as Functions of element type t
    (float64; float32 for JAX, whose arrays are float32 unless x64 is
    on)."""

    def __init__(self, lib, t="float64"):
        self.so = ctypes.CDLL(lib)
        for name, sig in signatures(t).items():
            setattr(self, name, dlb.load(lib, "dlb_kernel_" + name, sig))
        self.lib = lib

    def counters(self):
        return batch_counters(self.so)


@pytest.fixture(scope="module")
def k(lib):
    return Kernels(lib)


@pytest.fixture(scope="module")
def k32(lib):
    return Kernels(lib, "float32")


def f32(a):
    return np.asarray(a, np.float32)


def rand(*shape, seed=0):
    return np.random.default_rng(seed + len(shape)).standard_normal(shape)


def one_call(k, before, batch):
    """Exactly one kernel call since `before`, with broadcast shape batch."""
    assert k.counters() == (before[0] + 1, tuple(batch))


# ---- NumPy: the broadcast --------------------------------------------------------

@pytest.mark.parametrize("ashape,xshape,batch", [
    ((), (4, 3, 5), (4, 3)),
    ((3,), (4, 3, 5), (4, 3)),
    ((1,), (4, 3, 5), (4, 3)),
    ((4, 1), (3, 5), (4, 3)),
    ((2, 1, 1), (4, 3, 5), (2, 4, 3)),
    ((4, 3), (5,), (4, 3)),
    ((1, 1), (1, 5), (1, 1)),
    ((0, 1), (3, 5), (0, 3)),
])
def test_bscale_broadcasts(k, ashape, xshape, batch):
    a, x = rand(*ashape), rand(*xshape, seed=1)
    before = k.counters()
    y = k.bscale(a, x)
    assert type(y) is np.ndarray
    assert y.shape == batch + (5,) and y.flags.c_contiguous
    np.testing.assert_allclose(y, a[..., None] * x)
    one_call(k, before, batch)


def test_zero_d_batch_param_from_a_number_and_from_arrays(k):
    x = rand(4, 3, 5)
    before = k.counters()
    y = k.bscale(2.5, x)
    np.testing.assert_allclose(y, 2.5 * x)
    one_call(k, before, (4, 3))
    # a 0-d array, and a keyword argument
    np.testing.assert_allclose(k.bscale(x=x, a=np.array(-1.5)), -1.5 * x)
    # the number with batch rank 0 everywhere
    before = k.counters()
    np.testing.assert_allclose(k.bscale(3.0, x[0, 0]), 3.0 * x[0, 0])
    one_call(k, before, ())


def test_batch_rank_zero_is_an_ordinary_call(k):
    a, x = np.array(2.0), np.arange(5.0)
    before = k.counters()
    y = k.bscale(a, x)
    assert y.shape == (5,)
    np.testing.assert_array_equal(y, 2.0 * x)
    one_call(k, before, ())
    s = k.bdot(x, np.ones(5))
    assert s.shape == () and float(s) == 10.0


def test_bstats_two_results_at_the_batch_shape(k):
    x = rand(2, 3, 4)
    before = k.counters()
    mean, sq = k.bstats(x)
    assert mean.shape == (2, 3) and sq.shape == (2, 3, 4)
    assert mean.flags.c_contiguous and sq.flags.c_contiguous
    np.testing.assert_allclose(mean, x.mean(-1))
    np.testing.assert_allclose(sq, x * x)
    one_call(k, before, (2, 3))
    # from a transposed, negative-stride view
    v = rand(4, 3, 2)[::-1].transpose(2, 1, 0)
    mean, sq = k.bstats(v)
    np.testing.assert_allclose(mean, v.mean(-1))
    np.testing.assert_allclose(sq, v * v)


def test_bdot_w_is_never_batched(k):
    x, w = rand(2, 3, 5), rand(5, seed=2)
    before = k.counters()
    s = k.bdot(x, w)
    assert s.shape == (2, 3)
    np.testing.assert_allclose(s, x @ w)
    one_call(k, before, (2, 3))
    np.testing.assert_allclose(k.bdot(x, w[::-1]), x @ w[::-1])
    before = k.counters()
    with pytest.raises(ValueError, match=r"^bdot\(\) argument 'w': expected 1 "
                       r"dimension, got 2$"):
        k.bdot(x, np.ones((3, 5)))
    assert k.counters() == before


def test_strided_negative_and_transposed_inputs(k):
    # a expanded with stride 0 (a full batch axis that is a broadcast),
    # x flipped on a batch axis and its core axis, batch axes permuted
    a = np.broadcast_to(rand(1, 3), (2, 3))
    base = rand(3, 2, 6, seed=3)
    x = base[::-1, :, ::-1].transpose(1, 0, 2)
    assert a.strides[0] == 0 and x.strides[1] < 0 and x.strides[2] < 0
    before = k.counters()
    y = k.bscale(a, x)
    np.testing.assert_allclose(y, a[..., None] * x)
    one_call(k, before, (2, 3))
    # every other element, a Fortran-ordered core
    xs = rand(4, 8, 10, seed=4)[:, ::2, 1::2]
    np.testing.assert_allclose(k.bscale(rand(4, 1), xs),
                               rand(4, 1)[..., None] * xs)
    xf = np.asfortranarray(rand(3, 7, seed=5))
    np.testing.assert_allclose(k.bscale(rand(3), xf), rand(3)[:, None] * xf)


def test_many_parameters_heap_frame(lib):
    # More than 8 parameters and results: the call's arrays are on the heap,
    # the batch block beside them.
    names = ["p%d" % i for i in range(9)]
    sig = "f(%s) -> (r: float64[..., n], s: float64[n])" % ", ".join(
        "%s: float64[..., n]" % n for n in names)
    f = dlb.load(lib, "dlb_kernel_noop", sig)
    args = [np.ones((1, 3))] * 9
    args[4] = np.ones((5, 1, 3))
    args[7] = np.ones((2, 3))
    r, s = f(*args)
    assert r.shape == (5, 2, 3) and s.shape == (3,)


def test_a_result_past_the_rank_limit_is_refused(lib):
    f = dlb.load(lib, "dlb_kernel_noop",
                 "f(x: float64[..., n]) -> (y: float64[..., n, 2])")
    x = np.ones((1,) * 63 + (2,))
    with pytest.raises(ValueError, match=r"^f\(\) result 'y': 63 batch and 2 "
                       r"core dimensions; at most 64 are supported$"):
        f(x)
    g = dlb.load(lib, "dlb_kernel_noop",
                 "f(x: float64[..., n]) -> (y: float64[..., n])")
    assert g(x).shape == x.shape


# ---- mismatches -----------------------------------------------------------------------

def test_batch_mismatch_names_both_shapes(k):
    before = k.counters()
    with pytest.raises(ValueError, match=r"^bscale\(\): batch dimensions of x "
                       r"\(4, 3\) and a \(2,\) do not broadcast$"):
        k.bscale(np.ones(2), np.ones((4, 3, 5)))
    with pytest.raises(ValueError, match=r"^bscale\(\): batch dimensions of x "
                       r"\(2, 5\) and a \(3, 1\) do not broadcast$"):
        k.bscale(np.ones((3, 1)), np.ones((2, 5, 4)))
    with pytest.raises(ValueError, match=r"^bscale\(\) argument 'x': expected "
                       r"at least 1 dimension"):
        k.bscale(np.ones(2), np.array(1.0))
    assert k.counters() == before


def test_core_mismatch_counts_core_axes_from_the_end(k, lib):
    # the extents named are the core ones, whatever the batch dims
    with pytest.raises(ValueError, match=r"^bdot\(\) argument 'w': dimension n "
                       r"is 4 here but 5 from argument 'x'$"):
        k.bdot(np.ones((7, 3, 5)), np.ones(4))
    f = dlb.load(lib, "dlb_kernel_noop", "f(x: float64[..., 4, m], "
                 "y: float64[..., m])")
    with pytest.raises(ValueError, match=r"^f\(\) argument 'x': dimension -2 "
                       r"is 5 but the signature says 4$"):
        f(np.ones((3, 2, 5, 6)), np.ones(6))
    with pytest.raises(ValueError, match=r"^f\(\) argument 'y': dimension m is "
                       r"7 here but 6 from argument 'x'$"):
        f(np.ones((3, 2, 4, 6)), np.ones((9, 7)))


def test_mut_must_be_the_whole_batch(k):
    a, x, y = np.ones((2, 1)), np.ones((3, 5)), np.ones((3, 5))
    before = k.counters()
    with pytest.raises(ValueError, match=r"^baxpy\(\): batch dimensions of mut "
                       r"argument 'y' \(3,\) must be the whole broadcast batch "
                       r"shape, but a \(2, 1\) broadcasts beyond them"):
        k.baxpy(a, x, y)
    with pytest.raises(ValueError, match=r"batch dimensions of mut argument "
                       r"'y' \(1, 5\) must be the whole"):
        k.baxpy(1.0, np.ones((4, 5, 2)), np.ones((1, 5, 2)))
    assert k.counters() == before
    np.testing.assert_array_equal(y, 1.0)
    # y may lack leading 1s: (3, 5) is the whole of B = (1, 3)
    y = rand(3, 5)
    want = y + 2.0 * x
    k.baxpy(np.full((1, 1), 2.0), x, y)
    np.testing.assert_allclose(y, want)


# ---- mut in place, and new values of immutable frameworks --------------------------

def test_baxpy_in_place_numpy_and_dlb_tensor(k):
    a, x = rand(3, 1), rand(2, 4, seed=1)
    y = rand(3, 2, 4, seed=2)
    want = y + a[..., None] * x
    before = k.counters()
    assert k.baxpy(a, x, y) is None
    np.testing.assert_allclose(y, want)
    one_call(k, before, (3, 2))
    # dlb.Tensor arguments: y's memory is the NumPy array's
    y2 = rand(3, 2, 4, seed=3)
    want = y2 + a[..., None] * x
    assert k.baxpy(dlb.from_dlpack(a), dlb.from_dlpack(x),
                   dlb.from_dlpack(y2)) is None
    np.testing.assert_allclose(y2, want)
    # a number for a
    y3 = rand(3, 2, 4, seed=4)
    want = y3 + 0.5 * x
    k.baxpy(0.5, x, y3)
    np.testing.assert_allclose(y3, want)


def test_baxpy_overlap_is_judged_on_the_padded_views(k):
    # y as x and y: the same view once padded, allowed (read before write)
    y = np.arange(6.0).reshape(2, 3)
    want = 3 * y
    k.baxpy(2.0, y, y)
    np.testing.assert_allclose(y, want)
    # x a row of y, broadcast over y's batch: partial overlap, refused
    before = k.counters()
    with pytest.raises(BufferError, match="'y' is 'mut' and its memory "
                       "overlaps argument 'x'"):
        k.baxpy(2.0, y[0], y)
    assert k.counters() == before
    np.testing.assert_allclose(y, want)


@needs_torch
def test_baxpy_in_place_torch(k):
    a, x = torch.randn(3, 1, dtype=torch.float64), torch.randn(
        2, 4, dtype=torch.float64)
    y = torch.randn(3, 2, 4, dtype=torch.float64)
    want = y.numpy() + a.numpy()[..., None] * x.numpy()
    v0 = y._version
    before = k.counters()
    assert k.baxpy(a, x, y) is None
    np.testing.assert_allclose(y.numpy(), want)
    assert y._version > v0
    one_call(k, before, (3, 2))


def _jax():
    return pytest.importorskip("jax.numpy")


def _tf():
    return pytest.importorskip("tensorflow")


@pytest.mark.parametrize("framework", ["jax", "tensorflow"])
def test_baxpy_new_value_for_immutable_frameworks(k32, framework):
    k = k32
    if framework == "jax":
        jnp = _jax()
        make, host = jnp.asarray, np.asarray
    else:
        tf = _tf()
        make, host = tf.constant, lambda t: t.numpy()
    a, x, y = f32(rand(3, 1)), f32(rand(2, 4, seed=1)), f32(rand(3, 2, 4,
                                                               seed=2))
    ja, jx, jy = make(a), make(x), make(y)
    before = k.counters()
    r = k.baxpy(ja, jx, jy)
    assert type(r) is type(jy)
    assert tuple(r.shape) == (3, 2, 4)
    np.testing.assert_allclose(host(r), y + a[..., None] * x, rtol=1e-5)
    np.testing.assert_array_equal(host(jy), y)      # never written
    one_call(k, before, (3, 2))
    # a number for a, y's batch without its leading 1
    r = k.baxpy(2.0, make(x[None]), make(y[:1]))
    np.testing.assert_allclose(host(r), y[:1] + 2.0 * x, rtol=1e-5)
    with pytest.raises(ValueError, match="batch dimensions of mut argument "
                       "'y' \\(1, 2\\) must be the whole"):
        k.baxpy(ja, jx, make(y[:1]))


# ---- other frameworks -----------------------------------------------------------------

def test_dlb_tensor_arguments(k):
    a, x = rand(3), rand(4, 3, 5, seed=1)
    before = k.counters()
    y = k.bscale(dlb.from_dlpack(a), dlb.from_dlpack(x))
    assert isinstance(y, dlb.Tensor) and tuple(y.shape) == (4, 3, 5)
    np.testing.assert_allclose(np.from_dlpack(y), a[:, None] * x)
    one_call(k, before, (4, 3))
    mean, sq = k.bstats(dlb.from_dlpack(x))
    np.testing.assert_allclose(np.from_dlpack(mean), x.mean(-1))


@needs_torch
def test_torch_arguments(k):
    a = torch.randn(3, dtype=torch.float64)
    x = torch.randn(4, 3, 5, dtype=torch.float64)
    before = k.counters()
    y = k.bscale(a, x)
    assert isinstance(y, torch.Tensor) and tuple(y.shape) == (4, 3, 5)
    assert y.is_contiguous()
    np.testing.assert_allclose(y.numpy(), a.numpy()[:, None] * x.numpy())
    one_call(k, before, (4, 3))
    # torch's own broadcast views: expand (stride 0), a transpose, a number
    ae = torch.randn(1, 3, dtype=torch.float64).expand(4, 3)
    xt = torch.randn(3, 4, 5, dtype=torch.float64).transpose(0, 1)
    np.testing.assert_allclose(k.bscale(ae, xt).numpy(),
                               ae.numpy()[..., None] * xt.numpy())
    np.testing.assert_allclose(k.bscale(2.0, xt).numpy(), 2.0 * xt.numpy())
    s = k.bdot(x, torch.ones(5, dtype=torch.float64))
    np.testing.assert_allclose(s.numpy(), x.numpy().sum(-1))
    # a tensor that requires grad, read under no_grad
    xg = x.clone().requires_grad_()
    with torch.no_grad():
        mean, sq = k.bstats(xg)
    assert isinstance(mean, torch.Tensor)
    np.testing.assert_allclose(mean.numpy(), x.numpy().mean(-1))
    np.testing.assert_allclose(sq.numpy(), x.numpy() ** 2)


def test_jax_arrays_eager(k32):
    k = k32
    jnp = _jax()
    a, x = f32(rand(4, 1)), f32(rand(3, 5, seed=1))
    before = k.counters()
    y = k.bscale(jnp.asarray(a), jnp.asarray(x))
    assert type(y) is type(jnp.asarray(a)) and y.shape == (4, 3, 5)
    np.testing.assert_allclose(np.asarray(y), a[..., None] * x, rtol=1e-6)
    one_call(k, before, (4, 3))
    mean, sq = k.bstats(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(mean), x.mean(-1), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(sq), x * x, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(k.bscale(1.5, jnp.asarray(x))),
                               1.5 * x, rtol=1e-6)
    # a transposed JAX array (its DLPack export is compact: JAX's layout)
    xt = jnp.asarray(f32(rand(5, 3, seed=2))).T
    np.testing.assert_allclose(np.asarray(k.bscale(jnp.asarray(a), xt)),
                               a[..., None] * np.asarray(xt), rtol=1e-6)


def test_tf_eager_tensors(k):
    tf = _tf()
    a, x = rand(4, 1), rand(3, 5, seed=1)
    before = k.counters()
    y = k.bscale(tf.constant(a), tf.constant(x))
    assert tuple(y.shape) == (4, 3, 5)
    np.testing.assert_allclose(y.numpy(), a[..., None] * x)
    one_call(k, before, (4, 3))
    s = k.bdot(tf.constant(rand(2, 3, 5)), tf.constant(np.ones(5)))
    np.testing.assert_allclose(s.numpy(), rand(2, 3, 5).sum(-1))


def test_mixed_frameworks_results_follow_the_first_tensor(k32):
    jnp = _jax()
    a, x = f32(rand(3)), f32(rand(2, 3, 4))
    y = k32.bscale(a, jnp.asarray(x))
    assert type(y) is np.ndarray
    np.testing.assert_allclose(y, a[:, None] * x, rtol=1e-6)


# ---- allocation failures -----------------------------------------------------------

@pytest.fixture
def _restore_allocator():
    yield
    _core._reset_allocations()
    if _testcapi is not None:
        _testcapi.remove_mem_hooks()


def _live():
    return _core._allocation_stats()["live"]


def test_core_allocation_failures_free_everything(k, k32, tp,
                                                  _restore_allocator):
    # The results are the core allocator's (NumPy and dlb.Tensor first
    # arguments): refuse each in turn -- MemoryError or success, nothing
    # left allocated, a producer's export deleted once.
    a, x = rand(3, 1), rand(2, 4)
    p = tp.Producer(shape=(2, 4), dtype=(2, 64, 1), fill=True)
    cases = [
        (lambda: k.bstats(x), False),
        (lambda: k.bscale(a, x), False),
        (lambda: k.bscale(dlb.from_dlpack(a), x), False),
        (lambda: k.bscale(a, p), True),
        (lambda: k.bstats(p), True),
    ]
    try:
        import jax.numpy as jnp
    except ImportError:  # pragma: no cover - depends on the environment
        jnp = None
    if jnp is not None:
        # a `mut` JAX argument: its copy (the core allocator's) is padded,
        # written and returned, or freed
        ja, jx = jnp.asarray(f32(a)), jnp.asarray(f32(x))
        jy = jnp.zeros((3, 2, 4), jnp.float32)
        cases.append((lambda: k32.baxpy(ja, jx, jy), False))
    for op, exports in cases:
        op()
        gc.collect()
        base = _live()
        d0 = p.deleter_calls
        for step in range(50):
            _core._fail_allocations(step)
            try:
                op()
                ok = True
            except MemoryError:
                ok = False
            finally:
                stats = _core._allocation_stats()
                _core._reset_allocations()
            gc.collect()
            assert _live() == base, "step %d leaked" % step
            assert p.live_exports == 0
            if stats["failed"] == 0:
                assert ok and step > 0
                break
        else:
            pytest.fail("still allocating after 50 steps")
        if exports:
            # every step exported p once, and each export died once
            assert p.deleter_calls - d0 == step + 1


@pytest.mark.skipif(_testcapi is None, reason="_testcapi is not available")
def test_python_allocation_failures(k, tp, _restore_allocator):
    # CPython's allocators refusing the k-th allocation: the batch block
    # (PyMem) among them.  MemoryError or success, nothing leaked.
    a, x = rand(3, 1), rand(2, 4)
    y = rand(3, 2, 4)
    p = tp.Producer(shape=(2, 4), dtype=(2, 64, 1), fill=True)
    set_nomemory, remove = _testcapi.set_nomemory, _testcapi.remove_mem_hooks
    for op in (lambda: k.bscale(a, x), lambda: k.bscale(2.0, p),
               lambda: k.baxpy(a, x, y)):
        op()
        gc.collect()
        base = _live()
        failures = 0
        for step in range(200):
            gc.disable()
            try:
                set_nomemory(step, step + 1)
                try:
                    op()
                finally:
                    remove()
            except MemoryError:
                failures += 1
            else:
                if step > 20:
                    break
            finally:
                gc.enable()
            gc.collect()
            assert _live() == base
            assert p.live_exports == 0
        assert failures > 0


# ---- CUDA tensors (the recording fake driver: no GPU needed) -----------------------

def test_cuda_tensors_fake_driver(lib):
    # Results at the broadcast batch shape on the arguments' device, the
    # kernel on the current stream; a Python number for the 0-d `...`
    # parameter stays a host scalar.  (examples/kernels/batch.c runs on the
    # CPU only; a real GPU's batched launch is scripts/gpu-check's.)
    fake = pytest.importorskip("test_cuda_fake")
    if fake.LIBS is None:
        pytest.skip("the fake CUDA driver is not built (Meson tests=true)")
    fake.run("""
    lib = os.environ["DLB_EXAMPLE_KERNELS"]
    rec = (ctypes.c_int64 * 4).in_dll(ctypes.CDLL(lib), "dlb_example_recorded")
    f = dlb.load(lib, "dlb_kernel_record",
                 "f(a: float32[...], x: float32[..., n]) -> "
                 "(y: float32[..., n], s: float32[...])")
    x = dlb.zeros((4, 3, 5), dtype="float32", device="cuda:0")
    a = dlb.zeros((3,), dtype="float32", device="cuda:0")
    s = new_stream()
    n0 = rec[3]
    with dlb.stream(s):
        clear()
        y, t = f(a, x)
    assert rec[3] == n0 + 1 and rec[0] == s and rec[1] == 2, list(rec)
    assert y.device == "cuda:0" and y.shape == (4, 3, 5), (y.device, y.shape)
    assert t.shape == (4, 3)
    allocs = calls("cuMemAllocAsync")
    assert len(allocs) == 2 and all("stream=s1" in c for c in allocs), log()
    y, t = f(2.0, dlb.zeros((1, 3, 5), dtype="float32", device="cuda:0"))
    assert y.shape == (1, 3, 5) and t.shape == (1, 3)
    try:
        f(dlb.zeros((2,), dtype="float32", device="cuda:0"), x)
    except ValueError as e:
        assert "x (4, 3) and a (2,) do not broadcast" in str(e), e
    else:
        raise AssertionError("a batch mismatch on cuda was accepted")
    """, env={"DLB_EXAMPLE_KERNELS": lib})
