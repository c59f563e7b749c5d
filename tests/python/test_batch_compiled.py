"""Batch dimensions (`...`) in the compiled calls' run time (issue 25):
dlb__function_run pads every `...` tensor to the broadcast batch rank
before the kernel (src/python/function_ops.c), the XLA handler loops in C
over the leading dims an attribute `loop_rank` names (src/ops/xla.c,
dlb__function_run_looped), and TensorFlow's node carries batched result
shapes (src/ops/tf.c).

Every call here passes explicitly batched, broadcasting shapes -- no vmap
-- inside jax.jit, tf.function and torch.compile, and is compared with
NumPy; the kernels (examples/kernels/batch.c) count their calls and record
the batch shape they were given, so each test also proves one kernel call
per executed call (and one per item under loop_rank).  The loop is driven
by a hand-built jax.ffi.ffi_call with the attributes _ops_jax.py uses, so
it is tested without the vmap rule that emits it."""
import ctypes

import numpy as np
import pytest

import dlbridge as dlb
from _batch_counter import batch_counters, Counted

F32 = np.float32
T = "float32"
BSCALE = f"bscale(a: {T}[...], x: {T}[..., n]) -> (y: {T}[..., n])"
BSTATS = f"bstats(x: {T}[..., n]) -> (mean: {T}[...], sq: {T}[..., n])"
BAXPY = f"baxpy(a: {T}[...], x: {T}[..., n], y: mut {T}[..., n])"
BDOT = f"bdot(x: {T}[..., n], w: {T}[n]) -> (s: {T}[...])"
VSCALE = f"vscale(a: {T}, x: {T}[n]) -> (y: {T}[n])"


@pytest.fixture(scope="module")
def k(lib):
    so = ctypes.CDLL(lib)

    class Kernels:
        bscale = dlb.load(lib, "dlb_kernel_bscale", BSCALE)
        bstats = dlb.load(lib, "dlb_kernel_bstats", BSTATS)
        baxpy = dlb.load(lib, "dlb_kernel_baxpy", BAXPY)
        bdot = dlb.load(lib, "dlb_kernel_bdot", BDOT)
        vscale = dlb.load(lib, "dlb_kernel_vscale", VSCALE)

        @staticmethod
        def counters():
            """(calls so far, the last call's batch shape B)."""
            return batch_counters(so)

    return Kernels


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(F32)




# ---- jax.jit: explicit broadcasting batch shapes -------------------------------

jax_cases = [
    # (name, args, NumPy's answer, the batch shape the kernel sees)
    ("bscale", lambda: (rand(4, 1), rand(1, 3, 5, seed=1)),
     lambda a, x: a[..., None] * x, (4, 3)),
    ("bscale", lambda: (rand(), rand(2, 3, 5, seed=1)),   # a 0-d `...` input
     lambda a, x: a * x, (2, 3)),
    ("bscale", lambda: (rand(3), rand(2, 1, 4, seed=1)),  # ranks 1 and 2
     lambda a, x: a[..., None] * x, (2, 3)),
    ("bdot", lambda: (rand(2, 3, 5), rand(5, seed=1)),    # w: no `...`
     lambda x, w: x @ w, (2, 3)),
]


@pytest.mark.parametrize("name,make,want,batch", jax_cases)
def test_jit_broadcasting_batch_shapes_one_call(k, name, make, want, batch):
    jax = pytest.importorskip("jax")
    fn = getattr(k, name)
    args = make()
    f = jax.jit(lambda *xs: fn(*xs))
    f(*args).block_until_ready()  # traced and compiled
    with Counted(k) as c:
        out = f(*args)
        out.block_until_ready()
    assert c.calls == 1 and c.last == batch
    assert out.shape == np.shape(want(*args))
    np.testing.assert_allclose(np.asarray(out), want(*args), rtol=1e-5)


def test_jit_two_batched_results(k):
    jax = pytest.importorskip("jax")
    x = rand(2, 3, 4)
    f = jax.jit(lambda x: k.bstats(x))
    with Counted(k) as c:
        mean, sq = f(x)
        mean.block_until_ready()
    assert c.calls == 1 and c.last == (2, 3)
    assert mean.shape == (2, 3) and sq.shape == (2, 3, 4)
    np.testing.assert_allclose(np.asarray(mean), x.mean(-1), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(sq), x * x, rtol=1e-5)


def test_jit_mut_batched_returns_the_new_value(k):
    jax = pytest.importorskip("jax")
    a, x, y = rand(3, 1), rand(1, 2, 4, seed=1), rand(3, 2, 4, seed=2)
    f = jax.jit(lambda a, x, y: k.baxpy(a, x, y))
    with Counted(k) as c:
        new = f(a, x, y)
        new.block_until_ready()
    assert c.calls == 1 and c.last == (3, 2)
    np.testing.assert_allclose(np.asarray(new), y + a[..., None] * x,
                               rtol=1e-5)


def test_jit_batch_mismatch_is_the_eager_valueerror(k):
    jax = pytest.importorskip("jax")
    with pytest.raises(ValueError, match="broadcast"):
        jax.jit(lambda a, x: k.bscale(a, x))(rand(2), rand(3, 5))
    # a mut argument short of the broadcast batch shape
    with pytest.raises(ValueError, match="whole broadcast batch shape"):
        jax.jit(lambda a, x, y: k.baxpy(a, x, y))(rand(3, 1), rand(1, 2, 4),
                                                  rand(2, 4))


# ---- the XLA handler's loop (attribute loop_rank), by a hand-built call --------

def _looped(jax, fn, nloop, out_shape, *args, **extra):
    """fn's custom call with loop_rank=nloop, as _ops_jax.py would emit it
    under a vmap its signature cannot batch."""
    from dlbridge import _ops_jax
    dlb.jax_register(fn)
    call = jax.ffi.ffi_call(_ops_jax.TARGET,
                            jax.ShapeDtypeStruct(out_shape, F32))
    return call(*args, dlb_identity=fn._identity,
                loop_rank=np.int64(nloop), **extra)


def test_loop_rank_one_call_per_item(k):
    jax = pytest.importorskip("jax")
    a, x = rand(5), rand(5, 4, seed=1)
    f = jax.jit(lambda a, x: _looped(jax, k.vscale, 1, (5, 4), a, x))
    f(a, x).block_until_ready()
    with Counted(k) as c:
        y = f(a, x)
        y.block_until_ready()
    assert c.calls == 5 and c.last == ()  # each item unbatched, a 0-d
    np.testing.assert_allclose(np.asarray(y), a[:, None] * x, rtol=1e-6)


def test_loop_rank_two_dims_strided_items_and_a_shared_operand(k):
    jax = pytest.importorskip("jax")
    x = rand(2, 3, 4)
    # a without the loop dims: every item gets it whole (a number, or an
    # operand the vmap does not batch)
    f = jax.jit(lambda a, x: _looped(jax, k.vscale, 2, (2, 3, 4), a, x))
    with Counted(k) as c:
        y = f(np.float32(1.5), x)
        y.block_until_ready()
    assert c.calls == 6
    np.testing.assert_allclose(np.asarray(y), 1.5 * x, rtol=1e-6)
    # loop dims of extent 0: no item, no call
    with Counted(k) as c:
        y = jax.jit(lambda a, x: _looped(jax, k.vscale, 1, (0, 4), a, x))(
            rand(0), rand(0, 4))
        y.block_until_ready()
    assert c.calls == 0 and y.shape == (0, 4)


def test_loop_rank_over_a_batch_function(k):
    jax = pytest.importorskip("jax")
    # each of the 3 items is a batched call of its own: a (1,) and x (2, 4)
    # broadcast to B = (2,) in every item
    a, x = rand(3, 1), rand(3, 2, 4, seed=1)
    f = jax.jit(lambda a, x: _looped(jax, k.bscale, 1, (3, 2, 4), a, x))
    with Counted(k) as c:
        y = f(a, x)
        y.block_until_ready()
    assert c.calls == 3 and c.last == (2,)
    np.testing.assert_allclose(np.asarray(y), a[..., None] * x, rtol=1e-6)


def test_loop_rank_refusals_name_the_function(k):
    jax = pytest.importorskip("jax")
    errors = (jax.errors.JaxRuntimeError, RuntimeError)
    # loop extents that disagree
    with pytest.raises(errors, match=r"vscale\(\): the 1 loop dimensions"):
        jax.jit(lambda a, x: _looped(jax, k.vscale, 1, (5, 4), a, x))(
            rand(4), rand(5, 4)).block_until_ready()
    # a result without the loop dims
    with pytest.raises(errors, match=r"vscale\(\): result 0 has 1 dim"):
        jax.jit(lambda a, x: _looped(jax, k.vscale, 1, (4,), a, x))(
            rand(5), rand(5, 4)).block_until_ready()
    # not an integer
    with pytest.raises(errors, match="'loop_rank' must be an int32 or int64"):
        from dlbridge import _ops_jax
        dlb.jax_register(k.vscale)
        call = jax.ffi.ffi_call(_ops_jax.TARGET,
                                jax.ShapeDtypeStruct((5, 4), F32))
        jax.jit(lambda a, x: call(a, x, dlb_identity=k.vscale._identity,
                                  loop_rank=np.float32(1.0)))(
            rand(5), rand(5, 4)).block_until_ready()


def test_loop_rank_zero_is_a_plain_call(k):
    jax = pytest.importorskip("jax")
    x = rand(4)
    with Counted(k) as c:
        y = jax.jit(lambda a, x: _looped(jax, k.vscale, 0, (4,), a, x))(
            np.float32(2.0), x)
        y.block_until_ready()
    assert c.calls == 1
    np.testing.assert_allclose(np.asarray(y), 2 * x, rtol=1e-6)


# ---- the loop in the handler itself, through test_compiled_jax's fake XLA -----

class _Scalar(ctypes.Structure):   # XLA_FFI_Scalar
    _fields_ = [("dtype", ctypes.c_int), ("value", ctypes.c_void_p)]


@pytest.fixture
def fake_xla(lib):
    """Call XLA's handler as XLA does (test_compiled_jax.FakeXla: ctypes,
    no GIL, a stream and device ordinal for "cuda"), with a typed scalar
    attribute loop_rank (XLA element type code, value)."""
    pytest.importorskip("jax")
    import test_compiled_jax as fx

    def call(xla, platform, fn, operands, results, loop_rank):
        keep = []
        frame = fx._Frame()
        frame.struct_size = 168
        frame.api = ctypes.pointer(xla.api)
        frame.ctx = ctypes.addressof(xla.ctx)
        frame.args = xla._buffers(operands, keep)
        frame.rets = xla._buffers(results, keep)
        code, value = loop_rank
        v = (ctypes.c_int64 if code == 5 else ctypes.c_int32)(value)
        attrs = sorted([("dlb_identity", fn._identity), ("loop_rank", v)])
        n = len(attrs)
        names = (ctypes.POINTER(fx._Span) * n)()
        values = (ctypes.c_void_p * n)()
        types = (ctypes.c_int * n)()
        for i, (key, value) in enumerate(attrs):
            k = fx._Span(key.encode(), len(key))
            if isinstance(value, str):
                a = fx._Span(value.encode(), len(value.encode()))
                types[i] = 4
            else:
                a = _Scalar(code, ctypes.addressof(value))
                types[i] = 3
            keep += [k, a, value]
            names[i] = ctypes.pointer(k)
            values[i] = ctypes.addressof(a)
        frame.attrs = fx._Attrs(48, None, n, types, names, values)
        return xla.handler(platform)(ctypes.byref(frame))

    return fx, call


def test_handler_loop_items_on_cuda_get_xlas_stream_and_views(lib, fake_xla):
    fx, call = fake_xla
    describe = dlb.load(lib, "dlb_kernel_describe",
                        "describe(x: float32[a, b]) -> int64[6]")
    probe = dlb.load(lib, "dlb_kernel_stream_probe",
                     "stream_probe(x: float32[n]) -> int64[1]")
    dlb.jax_register(describe, probe)
    xla = fx.FakeXla(stream=0xABCDEF0, ordinal=3)
    # each of the 2 x 3 items: a (5, 2) view on device kDLCUDA 3, its
    # strides the whole tensor's last two
    facts = np.zeros((2, 3, 6), np.int64)
    x = rand(2, 3, 5, 2)
    assert call(xla, "cuda", describe, [x], [facts], (5, 2)) is None
    assert (facts == [2, 3, 2, 1, 2, 1]).all(), facts
    # every item gets XLA's stream; int32 attributes are read too
    out = np.zeros((4, 1), np.int64)
    assert call(xla, "cuda", probe, [rand(4, 7)], [out], (4, 1)) is None
    assert (out == 0xABCDEF0).all() and xla.errors == []


def test_handler_loop_item_offsets_and_an_unknown_attr_type(lib, k, fake_xla):
    fx, call = fake_xla
    dlb.jax_register(k.vscale)
    xla = fx.FakeXla()
    a, x = rand(3), rand(3, 4, seed=1)
    y = np.full((3, 4), np.nan, F32)
    with Counted(k) as c:
        assert call(xla, "cpu", k.vscale, [a, x], [y], (5, 1)) is None
    assert c.calls == 3
    np.testing.assert_allclose(y, a[:, None] * x, rtol=1e-6)
    # a negative or too large loop rank: refused before any kernel call
    for rank in (-1, 65):
        with Counted(k) as c:
            assert call(xla, "cpu", k.vscale, [a, x], [y], (5, rank))
        assert c.calls == 0
    assert xla.errors[-1][1].startswith("vscale: attribute 'loop_rank' must "
                                        "be an int32 or int64 scalar")
    # more loop dims than the tensors have
    assert call(xla, "cpu", k.vscale, [a, x], [y], (5, 2))
    assert xla.errors[-1][1] == (
        "vscale(): argument 0 has 1 dimension; in a loop over 2 leading "
        "dimensions it needs 2 (the loop's, then its parameter's 0)")


def test_run_of_many_tensors_takes_one_block_and_frees_it(lib):
    """More than 8 tensors: the padded headers (and the loop's views) live
    in one block of the core allocator, freed on every path; refused with
    the Function's name when it cannot be had."""
    jax = pytest.importorskip("jax")
    from dlbridge import _core
    sig = ("many(" + ", ".join(f"x{i}: float32[...]" for i in range(8))
           + ") -> (y: float32[...])")
    many = dlb.load(lib, "dlb_kernel_noop", sig)
    # batch ranks 0..3: every input but the last is padded to B's rank 3
    args = [rand(*[2] * (i % 4)) for i in range(7)] + [rand(2, 2, 2)]
    # looped: a loop dim of 2 in front of each (every `...` tensor has it)
    looped = [np.stack([a, a]) for a in args]
    runs = {
        "padded": (jax.jit(lambda *xs: many(*xs)), args, (2, 2, 2)),
        "looped": (jax.jit(lambda *xs: _looped(jax, many, 1, (2, 2, 2, 2),
                                               *xs)), looped, (2, 2, 2, 2)),
    }
    for name, (f, args, shape) in runs.items():
        assert f(*args).shape == shape
        refused = 0
        for step in range(6):
            _core._fail_allocations(step)
            try:
                f(*args).block_until_ready()
            except Exception as e:   # JaxRuntimeError's bases vary
                assert "RESOURCE_EXHAUSTED" in str(e), (name, step, e)
                assert "out of memory" in str(e), (name, step, e)
                refused += 1
            finally:
                stats = _core._allocation_stats()
                _core._reset_allocations()
            assert stats["live"] == 0, (name, step)
            if stats["failed"] == 0:
                break
        # XLA's handler's block, then ours: padded, the padding's; looped,
        # the loop's, then each of the 2 items' padding
        assert refused == (2 if name == "padded" else 4), name


# ---- tf.function -------------------------------------------------------------

@pytest.mark.parametrize("sa,sx,batch", [
    ((4, 1), (1, 3, 5), (4, 3)),
    ((3,), (2, 3, 5), (2, 3)),     # unequal batch ranks: a padded
    ((), (2, 1, 5), (2, 1)),       # a 0-d `...` input
])
def test_tf_function_broadcasting_batch_shapes(k, sa, sx, batch):
    tf = pytest.importorskip("tensorflow")
    a, x = rand(*sa), rand(*sx, seed=1)
    f = tf.function(lambda a, x: k.bscale(a, x))
    f(a, x)
    with Counted(k) as c:
        y = f(a, x)
    assert c.calls == 1 and c.last == batch
    assert tuple(y.shape) == batch + (5,)
    np.testing.assert_allclose(y.numpy(), np.expand_dims(a, -1) * x,
                               rtol=1e-5)


def test_tf_function_results_mut_and_unbatched_weight(k):
    tf = pytest.importorskip("tensorflow")
    x = rand(2, 3, 4)
    with Counted(k) as c:
        mean, sq = tf.function(lambda x: k.bstats(x))(x)
    assert c.calls == 1 and c.last == (2, 3)
    np.testing.assert_allclose(mean.numpy(), x.mean(-1), rtol=1e-5)
    np.testing.assert_allclose(sq.numpy(), x * x, rtol=1e-5)
    a, xx, y = rand(3, 1), rand(1, 2, 4, seed=1), rand(3, 2, 4, seed=2)
    yt = tf.constant(y)
    new = tf.function(lambda a, x, y: k.baxpy(a, x, y))(a, xx, yt)
    np.testing.assert_allclose(new.numpy(), y + a[..., None] * xx, rtol=1e-5)
    np.testing.assert_array_equal(yt.numpy(), y)  # TF's tensor not written
    w = rand(4, seed=3)
    s = tf.function(lambda x, w: k.bdot(x, w))(x, w)
    np.testing.assert_allclose(s.numpy(), x @ w, rtol=1e-5)


def test_tf_function_batch_extents_unknown_when_traced(k):
    tf = pytest.importorskip("tensorflow")
    # traced once with None batch extents: the node's result shape is
    # (None, None, 5); each run takes B from its inputs (src/ops/tf.c)
    f = tf.function(lambda a, x: k.bscale(a, x), input_signature=[
        tf.TensorSpec([None, None], tf.float32),
        tf.TensorSpec([None, None, 5], tf.float32)])
    for shapes, batch in ((((4, 1), (1, 3, 5)), (4, 3)),
                          (((2, 3), (2, 3, 5)), (2, 3)),
                          (((1, 1), (6, 1, 5)), (6, 1))):
        a, x = rand(*shapes[0]), rand(*shapes[1], seed=1)
        with Counted(k) as c:
            y = f(a, x)
        assert c.calls == 1 and c.last == batch
        np.testing.assert_allclose(y.numpy(), a[..., None] * x, rtol=1e-5)
    assert len(f._list_all_concrete_functions()) == 1
    # a run whose batch parts do not broadcast: the op's error, no call
    with Counted(k) as c:
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"bscale\(\): batch dimensions"):
            f(rand(2, 3), rand(4, 3, 5))
    assert c.calls == 0


# ---- torch.compile ------------------------------------------------------------

def test_torch_compile_broadcasting_batch_shapes(k):
    torch = pytest.importorskip("torch")
    a, x = torch.from_numpy(rand(4, 1)), torch.from_numpy(rand(1, 3, 5, seed=1))
    try:
        k.bscale(a, x)
    except NotImplementedError:
        # torch.compile's real kernel is the eager C path (_ops_torch.py),
        # whose batched call is branch batch-eager's
        pytest.skip("this build's eager call has no batch dimensions yet")
    f = torch.compile(lambda a, x: k.bscale(a, x), fullgraph=True)
    f(a, x)
    with Counted(k) as c:
        y = f(a, x)
    assert c.calls == 1 and c.last == (4, 3)
    np.testing.assert_allclose(y.numpy(), a.numpy()[..., None] * x.numpy(),
                               rtol=1e-5)
