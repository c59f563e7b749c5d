"""A dlbridge.Function inside tf.function: the DlbridgeCall op (src/ops/tf.c)
and the route that builds it (python/dlbridge/_ops_tf.py).

Each compiled result is checked against NumPy's answer and against the
eager call; errors found while tracing are the eager call's (same type,
same message); a `mut` input is never written.  CPU only: tensorflow-cpu
has no GPU device (the GPU kernel's refusal has not run anywhere).
"""
import gc
import os
import subprocess
import sys
import weakref

import numpy as np
import pytest

import dlbridge as dlb
from dlbridge import _core

tf = pytest.importorskip("tensorflow")

MATMUL = "matmul(a: float32[m, k], b: float32[k, n]) -> float32[m, n]"
SAXPY = "saxpy(a: float32, x: float32[n], y: mut float32[n])"
SAXPY_OUT = "saxpy(a: float32, x: float32[n], y: float32[n]) -> float32[n]"
ADD3 = "add3(x: float32[n], y: float32[n], z: mut float32[n])"


@pytest.fixture(scope="module")
def k(lib):
    class Kernels:
        matmul = dlb.load(lib, "dlb_kernel_matmul", MATMUL)
        saxpy = dlb.load(lib, "dlb_kernel_saxpy", SAXPY)
        saxpy_out = dlb.load(lib, "dlb_kernel_saxpy_out", SAXPY_OUT)
        add3 = dlb.load(lib, "dlb_kernel_add3", ADD3)
    return Kernels


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def eager_mut(fn, *args):
    """What an eager call with TensorFlow tensors gives for a Function with
    one `mut` parameter (the last) and no results: the returned value, or
    the argument it wrote (the eager rule for immutable frameworks is not
    this file's; either way the value must be the compiled one)."""
    args = [tf.identity(a) if isinstance(a, tf.Tensor) else a for a in args]
    out = fn(*args)
    return (out if out is not None else args[-1]).numpy()


def graph_ops(concrete):
    return [op.type for op in concrete.graph.get_operations()]


# ---- results ------------------------------------------------------------------

def test_matmul_in_tf_function(k):
    a, b = rand(2, 3), rand(3, 5, seed=1)
    f = tf.function(lambda a, b: k.matmul(a, b))
    got = f(tf.constant(a), tf.constant(b))
    assert isinstance(got, tf.Tensor) and got.dtype == tf.float32
    np.testing.assert_allclose(got.numpy(), a @ b, rtol=1e-5)
    np.testing.assert_array_equal(
        got.numpy(), k.matmul(tf.constant(a), tf.constant(b)).numpy())
    concrete = f.get_concrete_function(tf.constant(a), tf.constant(b))
    assert "DlbridgeCall" in graph_ops(concrete)
    # the static shape comes from the signature
    assert concrete.structured_outputs.shape.as_list() == [2, 5]
    node = [op for op in concrete.graph.get_operations()
            if op.type == "DlbridgeCall"][0]
    assert node.get_attr("function") == k.matmul._identity.encode()


def test_saxpy_with_a_python_number(k):
    x, y = rand(7), rand(7, seed=1)
    f = tf.function(lambda x, y: k.saxpy_out(2, x, y))
    got = f(tf.constant(x), tf.constant(y))
    np.testing.assert_allclose(got.numpy(), 2 * x + y, rtol=1e-6)
    np.testing.assert_array_equal(
        got.numpy(), k.saxpy_out(2, tf.constant(x), tf.constant(y)).numpy())
    concrete = f.get_concrete_function(tf.constant(x), tf.constant(y))
    assert "Const" in graph_ops(concrete)  # the 2, as a float32 constant


def test_mut_returns_the_new_value_and_never_writes_the_input(k):
    x, y = rand(5), rand(5, seed=1)
    tx, ty = tf.constant(x), tf.constant(y)
    f = tf.function(lambda a, x, y: k.saxpy(a, x, y))
    got = f(3.0, tx, ty)
    np.testing.assert_allclose(got.numpy(), 3 * x + y, rtol=1e-6)
    np.testing.assert_array_equal(ty.numpy(), y)  # the caller's: unchanged
    np.testing.assert_array_equal(got.numpy(), eager_mut(k.saxpy, 3.0, tx, ty))
    yn = y.copy()
    k.saxpy(3.0, x, yn)  # NumPy's in-place mut: the same value
    np.testing.assert_array_equal(got.numpy(), yn)


def test_mut_after_the_declared_results_and_intermediates_kept(k):
    x, y, z = rand(4), rand(4, seed=1), rand(4, seed=2)

    @tf.function
    def f(x, y, z):
        z1 = z * 1  # an intermediate, read again below: must not be written
        z2 = k.add3(x, y, z1)
        w = k.add3(x, y, z * 1)  # an intermediate nobody else reads
        return z1, z2, w

    z1, z2, w = f(tf.constant(x), tf.constant(y), tf.constant(z))
    np.testing.assert_array_equal(z1.numpy(), z)
    np.testing.assert_allclose(z2.numpy(), x + y, rtol=1e-6)  # z = x + y
    np.testing.assert_array_equal(z2.numpy(), w.numpy())
    # one input twice, once as the `mut` one
    g = tf.function(lambda x: k.add3(x, x, x))
    np.testing.assert_allclose(g(tf.constant(x)).numpy(), 2 * x, rtol=1e-6)


def test_retrace_with_new_shapes(k):
    f = tf.function(lambda a, b: k.matmul(a, b))
    for m, kk, n in [(2, 3, 5), (4, 1, 2), (1, 6, 1), (2, 3, 5)]:
        a, b = rand(m, kk), rand(kk, n, seed=1)
        got = f(tf.constant(a), tf.constant(b))
        assert got.shape == (m, n)
        np.testing.assert_allclose(got.numpy(), a @ b, rtol=1e-5, atol=1e-6)
    assert f.experimental_get_tracing_count() == 3


def test_zero_size_and_variables(k):
    f = tf.function(lambda a, b: k.matmul(a, b))
    got = f(tf.zeros([0, 3]), tf.zeros([3, 4]))
    assert got.shape == (0, 4)
    x = rand(3)
    v = tf.Variable(x)

    @tf.function
    def g(y):
        return k.add3(y, y, v)  # a captured variable, read, never written

    np.testing.assert_allclose(g(tf.constant(x)).numpy(), 2 * x, rtol=1e-6)
    np.testing.assert_array_equal(v.numpy(), x)


def test_every_call_runs_even_unused(lib):
    # A kernel may have effects TensorFlow cannot see (a Function with no
    # results exists only for them): the op is stateful, so tf.function
    # neither prunes, merges nor folds a call.
    from tensorflow.python.framework import op_def_registry
    assert op_def_registry.get(_core._TF_OP).is_stateful
    void = dlb.load(lib, "dlb_kernel_fail", "fail_void(x: float32[n])")
    f = tf.function(lambda x: void(x))
    with pytest.raises(tf.errors.InvalidArgumentError, match="fail_void: "):
        f(tf.ones([2]))
    unused = dlb.load(lib, "dlb_kernel_fail",
                      "fail_unused(x: float32[n]) -> float32[n]")

    @tf.function
    def g(x):
        unused(x)  # the result is never read
        return x + 1

    with pytest.raises(tf.errors.InvalidArgumentError, match="fail_unused: "):
        g(tf.ones([2]))


# ---- errors -------------------------------------------------------------------

def _raised(call):
    with pytest.raises(Exception) as info:
        call()
    return info.value


@pytest.mark.parametrize("case", [
    "dtype", "extent", "rank", "number_overflow", "number_float_into_int",
    "number_into_tensor", "number_into_mut"])
def test_trace_errors_are_the_eager_errors(lib, k, case):
    f32 = lambda *s: tf.ones(s, tf.float32)  # noqa: E731
    # (the number after the tensor: the eager call reads arguments in order
    # and hands the call over at the first graph tensor)
    noop8 = dlb.load(lib, "dlb_kernel_noop", "noop8(x: float32[n], a: int8)")
    fn, args = {
        "dtype": (k.matmul, (tf.ones([2, 3], tf.float64), f32(3, 1))),
        "extent": (k.matmul, (f32(2, 3), f32(4, 1))),
        "rank": (k.matmul, (f32(2, 3, 1), f32(3, 1))),
        "number_overflow": (noop8, (f32(3), 1000)),
        "number_float_into_int": (noop8, (f32(3), 2.5)),
        "number_into_tensor": (k.add3, (f32(3), 2.0, f32(3))),
        "number_into_mut": (k.add3, (f32(3), f32(3), 2.0)),
    }[case]
    eager = _raised(lambda: fn(*args))
    # autograph rewrites the messages of exceptions raised while tracing;
    # without it the exception passes as raised
    traced = _raised(lambda: tf.function(lambda *a: fn(*a),
                                         autograph=False)(*args))
    assert type(traced) is type(eager)
    assert str(traced) == str(eager)
    with_autograph = _raised(lambda: tf.function(lambda *a: fn(*a))(*args))
    assert str(eager) in str(with_autograph)


def test_unknown_extents_are_the_inputs_answer_at_run_time(k):
    # One trace for every m (and k checked at run time): the result's
    # extent comes from the signature and the inputs of each run.
    f = tf.function(lambda a, b: k.matmul(a, b), input_signature=[
        tf.TensorSpec([None, None]), tf.TensorSpec([None, 2])])
    for m in (2, 5, 0):
        a = np.arange(m * 3, dtype=np.float32).reshape(m, 3)
        b = np.ones((3, 2), np.float32)
        out = f(tf.constant(a), tf.constant(b))
        assert out.shape == (m, 2)
        np.testing.assert_allclose(out.numpy(), a @ b)
    assert f.experimental_get_tracing_count() == 1
    with pytest.raises(tf.errors.InvalidArgumentError, match="matmul"):
        f(tf.ones([2, 3]), tf.ones([4, 2]))
    g = tf.function(lambda a: k.matmul(a, a), input_signature=[
        tf.TensorSpec(None)])
    with pytest.raises(TypeError, match="rank of every tensor"):
        g(tf.ones([2, 2]))


def test_mixing_frameworks_is_a_clear_error(k):
    # (tf.function turns NumPy arguments into tensors; a closure does not)
    b = np.ones([3, 1], np.float32)
    f = tf.function(lambda a: k.matmul(a, b), autograph=False)
    with pytest.raises(TypeError, match=r"matmul\(\) argument 'b': "
                                        r"numpy.ndarray cannot be mixed"):
        f(tf.ones([2, 3]))
    g = tf.function(lambda a: k.matmul(a, dlb.from_dlpack(b)), autograph=False)
    with pytest.raises(TypeError, match="dlbridge.Tensor cannot be mixed"):
        g(tf.ones([2, 3]))


def test_kernel_failure_names_the_function(lib):
    fail = dlb.load(lib, "dlb_kernel_fail", "fail(x: float32[n]) -> float32[n]")
    f = tf.function(lambda x: fail(x))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="fail: fail was given 2 tensors"):
        f(tf.ones([3]))
    unsupported = dlb.load(lib, "dlb_kernel_unsupported",
                           "unsupported(x: float32[n]) -> float32[n]")
    g = tf.function(lambda x: unsupported(x))
    with pytest.raises(tf.errors.UnimplementedError,
                       match="unsupported: the kernel failed"):
        g(tf.ones([3]))


def test_jit_compile_is_a_clear_error(k):
    f = tf.function(lambda a, b: k.matmul(a, b), jit_compile=True,
                    autograph=False)
    with pytest.raises(TypeError, match="cannot be compiled by XLA"):
        f(tf.ones([2, 3]), tf.ones([3, 1]))


def test_gradient_through_the_op_raises(k):
    f = tf.function(lambda a, b: k.matmul(a, b))
    x = tf.ones([2, 3])
    with tf.GradientTape() as tape:
        tape.watch(x)
        with pytest.raises(RuntimeError,
                           match="matmul: dlbridge Function has no backward"):
            f(x, tf.ones([3, 1]))

    @tf.function
    def inner(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.reduce_sum(k.matmul(x, tf.ones([3, 1])))
        return tape.gradient(y, x)

    with pytest.raises(RuntimeError, match="matmul: dlbridge Function has "
                                           "no backward"):
        inner(x)


def test_another_kernel_under_a_traced_identity(lib):
    sig = "tf_reg_case(x: float32[n]) -> float32[n]"
    first = dlb.load(lib, "dlb_kernel_copy", sig)
    tf.function(lambda x: first(x))(tf.ones([2]))
    assert _core._ops_find(first._identity) is first
    again = dlb.load(lib, "dlb_kernel_copy", sig)  # same kernel: served
    np.testing.assert_array_equal(
        tf.function(lambda x: again(x))(tf.ones([2])).numpy(), [1, 1])
    other = dlb.load(lib, "dlb_kernel_noop", sig)
    with pytest.raises(ValueError, match="another kernel"):
        tf.function(lambda x: other(x), autograph=False)(tf.ones([2]))


@pytest.mark.parametrize("case", [
    "unknown", "types", "nshapes", "negative", "huge", "extent", "rank"])
def test_a_node_that_disagrees_with_its_function(k, case):
    # What only a hand-made (or corrupted, or foreign) graph can say: the
    # kernel refuses it with a clear error, never runs on it.
    from tensorflow.python.framework import op_def_library
    mm = k.matmul
    tf.function(lambda a, b: mm(a, b))(tf.ones([2, 3]), tf.ones([3, 1]))
    a, b = tf.ones([2, 3]), tf.ones([3, 1])
    args, attrs, error, match = {
        "unknown": ([a, b], dict(function="nobody_00000000"),
                    tf.errors.FailedPreconditionError,
                    "nobody_00000000: no dlbridge Function"),
        "types": ([a, b], dict(Tout=[tf.float64]),
                  tf.errors.InvalidArgumentError, "not those of the"),
        "nshapes": ([a, b], dict(result_shapes=[2]),
                    tf.errors.InvalidArgumentError, "not those of the"),
        "negative": ([a, b], dict(result_shapes=[-2, 1]),
                     tf.errors.InvalidArgumentError, "an extent is out of"),
        "huge": ([a, b], dict(result_shapes=[1 << 40, 1 << 40]),
                 tf.errors.InvalidArgumentError, "is out of range"),
        "extent": ([a, b], dict(result_shapes=[3, 1]),
                   tf.errors.InvalidArgumentError,
                   r"matmul\(\): result 0 .* with another extent"),
        "rank": ([tf.ones([3]), b], {}, tf.errors.InvalidArgumentError,
                 r"argument 0 of matmul\(\) has 1 dimensions at run time"),
    }[case]
    attrs = dict(dict(Tout=[tf.float32], function=mm._identity,
                      result_shapes=[2, 1]), **attrs)

    @tf.function(autograph=False)
    def node(*args):
        return op_def_library._apply_op_helper(
            _core._TF_OP, args=list(args), **attrs)[3]

    with pytest.raises(error, match=match):
        node(*args)


_REGISTRATION = """
import sys
from dlbridge import _core
assert "tensorflow" not in sys.modules
try:
    _core._tf_register(False)
except RuntimeError as e:
    assert "import tensorflow first" in str(e), e
else:
    raise AssertionError("registered without TensorFlow")
import tensorflow
try:  # TensorFlow aborts on a second registration of a name: refused
    _core._tf_register(True)
except RuntimeError as e:
    assert "that this dlbridge did not register" in str(e), e
else:
    raise AssertionError("registered over a foreign op")
_core._tf_register(False)
_core._tf_register(True)  # ours now: nothing to do
_core._tf_register(False)
print("ok")
"""


def test_registration_once_and_never_over_a_foreign_op():
    out = subprocess.run([sys.executable, "-c", _REGISTRATION],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"


def test_dtypes_tensorflow_holds():
    assert _core._TF_OP == "DlbridgeCall"
    for name in ("bool", "int8", "uint64", "float16", "bfloat16",
                 "complex128", "float8_e4m3fn", "float8_e5m2fnuz"):
        assert _core._tf_dtype(name) == tf.as_dtype(name).as_datatype_enum
    for name in ("int4", "float4_e2m1fn", "float6_e2m3fn"):
        assert _core._tf_dtype(name) is None  # TF's layout is not DLPack's


# ---- lifetime -----------------------------------------------------------------

def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_nothing_leaks_per_call_or_per_trace(k):
    @tf.function
    def chain(x, y):
        for _ in range(50):
            x = k.saxpy_out(0.5, x, y)
            y = k.saxpy(0.5, x, y)
        return x, y

    x, y = tf.ones([16]), tf.ones([16])
    # Warm up long enough for what stays bounded to reach its bound (TF's
    # caches; under ASan its 4 MiB quarantine of freed blocks), then a leak
    # is what still grows: one TF_Tensor wrapper left per kernel run would
    # be ~9 MB over the 100,000 runs measured.
    for _ in range(1000):
        chain(x, y)
    before = _rss()
    for _ in range(1000):  # 100,000 kernel runs
        chain(x, y)
    assert _rss() - before < 4 << 20

    def trace():
        f = tf.function(lambda a, b: k.matmul(a, b))
        concrete = f.get_concrete_function(tf.ones([2, 3]), tf.ones([3, 1]))
        concrete(tf.ones([2, 3]), tf.ones([3, 1]))
        return weakref.ref(concrete.graph)

    graphs = [trace() for _ in range(3)]
    gc.collect()
    assert [g() for g in graphs] == [None, None, None]
