"""TensorFlow and dlbridge Functions under tf.GradientTape (issue 24):
a tape that watches an argument never gets a silent None (refused without
a vjp), and a tf.Variable is read through v.value() by every entry."""

import numpy as np
import pytest

import dlbridge as dlb

tf = pytest.importorskip("tensorflow")

MUL = "mul_f32(a: float32[n], b: float32[n]) -> float32[n]"


@pytest.fixture
def mul(lib):
    return dlb.load(lib, "dlb_kernel_mul_f32", MUL)


def _f32(*v):
    return tf.constant(np.array(v, np.float32))


# ---- no vjp: refused wherever a tape would see nothing ---------------------

def test_eager_tape_watching_refuses(mul):
    a, b = _f32(1, 2), _f32(3, 4)
    with tf.GradientTape() as tape:
        tape.watch(a)
        with pytest.raises(RuntimeError,
                           match="mul_f32: dlbridge Function has no backward"):
            mul(a, b)


def test_eager_tape_not_watching_runs(mul):
    a, b = _f32(1, 2), _f32(3, 4)
    with tf.GradientTape() as tape:
        y = mul(a, b)
    np.testing.assert_array_equal(y.numpy(), [3, 8])
    assert tape.gradient(y, a) is None  # a was not watched: TF's own answer


def test_eager_stop_recording_runs(mul):
    a, b = _f32(1, 2), _f32(3, 4)
    with tf.GradientTape() as tape:
        tape.watch(a)
        with tape.stop_recording():
            y = mul(a, b)
    np.testing.assert_array_equal(y.numpy(), [3, 8])


def test_eager_tape_watching_variable_refuses(mul):
    v = tf.Variable([1.0, 2.0])
    with tf.GradientTape():
        with pytest.raises(RuntimeError, match="has no backward"):
            mul(v, _f32(3, 4))


def test_tf_function_tape_outside_refuses(mul):
    a, b = _f32(1, 2), _f32(3, 4)
    g = tf.function(lambda x, y: mul(x, y))
    with tf.GradientTape() as tape:
        tape.watch(a)
        with pytest.raises(RuntimeError, match="has no backward"):
            y = g(a, b)
            tape.gradient(y, a)


def test_tf_function_tape_inside_refuses(mul):
    @tf.function
    def g(x, y):
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = tf.reduce_sum(mul(x, y))
        return tape.gradient(out, x)

    with pytest.raises(RuntimeError, match="has no backward"):
        g(_f32(1, 2), _f32(3, 4))


def test_forward_accumulator_without_jvp_refuses(mul):
    a, b = _f32(1, 2), _f32(3, 4)
    with tf.autodiff.ForwardAccumulator(a, _f32(1, 1)):
        with pytest.raises(RuntimeError, match="needs a jvp= kernel"):
            mul(a, b)


# ---- tf.Variable through every entry -----------------------------------------

def test_variable_from_dlpack_shares(mul):
    v = tf.Variable(np.arange(4, dtype=np.float32))
    t = dlb.from_dlpack(v)
    assert t.shape == (4,) and t.tolist() == [0, 1, 2, 3]
    arr = dlb.convert(v, "numpy")
    np.testing.assert_array_equal(arr, [0, 1, 2, 3])
    # no copy: the view is the buffer v.value() reads
    ptr = np.asarray(v.value()).__array_interface__["data"][0]
    assert arr.__array_interface__["data"][0] == ptr


def test_variable_value_is_current():
    v = tf.Variable([1.0, 2.0])
    v.assign([5.0, 6.0])
    np.testing.assert_array_equal(dlb.convert(v, "numpy"), [5, 6])


def test_variable_string_refused():
    v = tf.Variable(["a", "b"])
    with pytest.raises(BufferError, match="tf.Variable of dtype string"):
        dlb.from_dlpack(v)


def test_variable_function_call_eager_and_traced(mul):
    v = tf.Variable([1.0, 2.0])
    b = _f32(3, 4)
    np.testing.assert_array_equal(mul(v, b).numpy(), [3, 8])
    np.testing.assert_array_equal(mul(b, v).numpy(), [3, 8])
    g = tf.function(lambda x: mul(v, x))
    np.testing.assert_array_equal(g(b).numpy(), [3, 8])
    v.assign([2.0, 2.0])
    np.testing.assert_array_equal(g(b).numpy(), [6, 8])
    np.testing.assert_array_equal(mul(v, v).numpy(), [4, 4])


# ---- with a vjp: gradients (issue 24) ---------------------------------------

SOFTMAX_VJP = ("dlb_kernel_softmax_vjp",
               "softmax_vjp(y: float64[n], dy: float64[n]) -> (dx: float64[n])")


@pytest.fixture
def k(lib):
    """The example kernels of examples/kernels/autodiff.c with their vjps."""
    class K:
        scale = dlb.load(lib, "dlb_kernel_scale",
                         "scale(a: float64, x: float64[n]) -> (y: float64[n])",
                         vjp="dlb_kernel_scale_vjp")
        softmax = dlb.load(lib, "dlb_kernel_softmax",
                           "softmax(x: float64[n]) -> (y: float64[n])",
                           vjp=SOFTMAX_VJP)
        gather = dlb.load(lib, "dlb_kernel_gather",
                          "gather(x: float64[m], idx: int64[k]) -> (y: float64[k])",
                          vjp="dlb_kernel_gather_vjp")
        sincos = dlb.load(lib, "dlb_kernel_sincos",
                          "sincos(x: float64[n]) -> (s: float64[n], c: float64[n])",
                          vjp="dlb_kernel_sincos_vjp")
        softmax_lse = dlb.load(
            lib, "dlb_kernel_softmax_lse",
            "softmax_lse(x: float64[n]) -> (y: float64[n], lse: nodiff float64)",
            vjp=("dlb_kernel_softmax_lse_vjp",
                 "softmax_lse_vjp(y: float64[n], dy: float64[n]) -> (dx: float64[n])"))
        cmul = dlb.load(lib, "dlb_kernel_cmul",
                        "cmul(z: complex128[n], w: complex128[n]) -> (p: complex128[n])",
                        vjp="dlb_kernel_cmul_vjp")
    return K


def _f64(v):
    return tf.constant(np.asarray(v, np.float64))


X = np.array([0.3, -0.2, 0.4, 0.1])
W = np.array([1.0, -2.0, 0.5, 3.0])


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def _softmax_grad(x, w):
    """d/dx sum(w * softmax(x))"""
    y = _softmax(x)
    return y * (w - np.dot(y, w))


def _loss_scale_softmax(k, a, x):
    return tf.reduce_sum(_f64(W) * k.softmax(k.scale(a, x)))


def _expected_scale_softmax(a, x):
    g = _softmax_grad(a * x, W)
    return np.dot(g, x), a * g


def test_eager_scale_softmax(k):
    a, x = _f64(0.7), _f64(X)
    with tf.GradientTape() as tape:
        tape.watch([a, x])
        loss = _loss_scale_softmax(k, a, x)
    da, dx = tape.gradient(loss, [a, x])
    ea, ex = _expected_scale_softmax(0.7, X)
    np.testing.assert_allclose(da.numpy(), ea, rtol=1e-12)
    np.testing.assert_allclose(dx.numpy(), ex, rtol=1e-12)


def test_eager_matches_tf_autodiff(k):
    """the same loss written in TF ops: the same gradient"""
    a, x = _f64(0.7), _f64(X)
    with tf.GradientTape() as tape:
        tape.watch([a, x])
        loss = tf.reduce_sum(_f64(W) * tf.nn.softmax(a * x))
    ref = tape.gradient(loss, [a, x])
    with tf.GradientTape() as tape:
        tape.watch([a, x])
        loss = _loss_scale_softmax(k, a, x)
    got = tape.gradient(loss, [a, x])
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-12)


def _loss_any_n(k, a, x):
    """sum(cos(i) * softmax(a x)_i): weights for any extent (one trace)"""
    y = k.softmax(k.scale(a, x))
    return tf.reduce_sum(tf.cos(tf.cast(tf.range(tf.size(y)), tf.float64)) * y)


def _expected_any_n(a, x):
    g = _softmax_grad(a * x, np.cos(np.arange(x.size)))
    return np.dot(g, x), a * g


@pytest.mark.parametrize("reduce_retracing", [False, True])
def test_tf_function_tape_outside(k, reduce_retracing):
    g = tf.function(lambda a, x: _loss_any_n(k, a, x),
                    reduce_retracing=reduce_retracing)
    for n in (4, 3, 2):
        a, x = _f64(0.7), _f64(X[:n])
        with tf.GradientTape() as tape:
            tape.watch([a, x])
            loss = g(a, x)
        da, dx = tape.gradient(loss, [a, x])
        ea, ex = _expected_any_n(0.7, X[:n])
        np.testing.assert_allclose(da.numpy(), ea, rtol=1e-12)
        np.testing.assert_allclose(dx.numpy(), ex, rtol=1e-12)


@pytest.mark.parametrize("reduce_retracing", [False, True])
def test_tf_function_tape_inside(k, reduce_retracing):
    @tf.function(reduce_retracing=reduce_retracing)
    def g(a, x):
        with tf.GradientTape() as tape:
            tape.watch([a, x])
            loss = _loss_any_n(k, a, x)
        return tape.gradient(loss, [a, x])

    for n in (4, 3, 2):
        da, dx = g(_f64(0.7), _f64(X[:n]))
        ea, ex = _expected_any_n(0.7, X[:n])
        np.testing.assert_allclose(da.numpy(), ea, rtol=1e-12)
        np.testing.assert_allclose(dx.numpy(), ex, rtol=1e-12)


@pytest.mark.parametrize("compiled", [False, True])
def test_gather_int_index_gets_none(k, compiled):
    x, idx = _f64([1.0, 2.0, 3.0, 4.0]), tf.constant([0, 3, 3], tf.int64)

    def grads(x, idx):
        with tf.GradientTape() as tape:
            tape.watch([x])
            y = k.gather(x, idx)
            loss = tf.reduce_sum(y * _f64([1.0, 2.0, 3.0]))
        return tape.gradient(loss, x)

    f = tf.function(grads) if compiled else grads
    np.testing.assert_array_equal(f(x, idx).numpy(), [1, 0, 0, 5])
    if not compiled:
        with tf.GradientTape() as tape:
            tape.watch([x])
            y = k.gather(x, idx)
        dx = tape.gradient(y, x)
        np.testing.assert_array_equal(dx.numpy(), [1, 0, 0, 2])


@pytest.mark.parametrize("compiled", [False, True])
def test_sincos_one_result_unused(k, compiled):
    """only s is used: c's cotangent reaches the kernel as zeros"""
    x = _f64(X)

    def grads(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            s, c = k.sincos(x)
            loss = tf.reduce_sum(s)
        return tape.gradient(loss, x)

    f = tf.function(grads) if compiled else grads
    np.testing.assert_allclose(f(x).numpy(), np.cos(X), rtol=1e-12)

    def both(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            s, c = k.sincos(x)
            loss = tf.reduce_sum(s) + 2 * tf.reduce_sum(c)
        return tape.gradient(loss, x)

    f = tf.function(both) if compiled else both
    np.testing.assert_allclose(f(x).numpy(), np.cos(X) - 2 * np.sin(X),
                               rtol=1e-12)


@pytest.mark.parametrize("compiled", [False, True])
def test_softmax_lse_nodiff_result(k, compiled):
    x = _f64(X)

    def grads(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y, lse = k.softmax_lse(x)
            loss = tf.reduce_sum(_f64(W) * y) + lse  # lse: no gradient
        return tape.gradient(loss, x)

    f = tf.function(grads) if compiled else grads
    np.testing.assert_allclose(f(x).numpy(), _softmax_grad(X, W), rtol=1e-12)


@pytest.mark.parametrize("compiled", [False, True])
def test_cmul_matches_tf_autodiff(k, compiled):
    """TF's complex convention (conjugated), against TF's own z * w"""
    rng = np.random.default_rng(0)
    z0 = rng.normal(size=3) + 1j * rng.normal(size=3)
    w0 = rng.normal(size=3) + 1j * rng.normal(size=3)
    c = tf.constant(rng.normal(size=3) + 1j * rng.normal(size=3))
    z, w = tf.constant(z0), tf.constant(w0)

    def grads(mul, z, w):
        with tf.GradientTape() as tape:
            tape.watch([z, w])
            p = mul(z, w)
            loss = tf.math.real(tf.reduce_sum(c * p))
        return tape.gradient(loss, [z, w])

    mine = tf.function(lambda z, w: grads(k.cmul, z, w)) if compiled else \
        (lambda z, w: grads(k.cmul, z, w))
    ref = grads(lambda z, w: z * w, z, w)
    got = mine(z, w)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-12)
    assert not np.allclose(ref[0].numpy(), (c * w).numpy())  # conj matters


def test_variable_training_loop(k):
    """Variables read by the kernels are watched; apply_gradients trains"""
    a = tf.Variable(0.5, dtype=tf.float64)
    x = tf.Variable(X)
    target = _f64(_softmax(np.array([1.0, 0.0, 2.0, -1.0])))
    opt = tf.keras.optimizers.SGD(learning_rate=0.5) \
        if hasattr(tf, "keras") else None
    if opt is None:
        pytest.skip("no tf.keras")

    def loss_fn():
        return -tf.reduce_sum(target * tf.math.log(k.softmax(k.scale(a, x))))

    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn()
        grads = tape.gradient(loss, [a, x])
        assert all(g is not None for g in grads)
        opt.apply_gradients(zip(grads, [a, x]))
        return loss

    first = float(step())
    with tf.GradientTape() as tape:  # against TF's own ops
        ref = -tf.reduce_sum(target * tf.math.log(tf.nn.softmax(a * x)))
    with tf.GradientTape() as tape2:
        got = loss_fn()
    for r, g in zip(tape.gradient(ref, [a, x]), tape2.gradient(got, [a, x])):
        np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-10)
    compiled = tf.function(step)
    losses = [float(compiled()) for _ in range(30)]
    assert losses[-1] < first * 0.9


def test_second_order_refused(k):
    x = _f64(X)
    with tf.GradientTape() as outer:
        outer.watch(x)
        with tf.GradientTape() as inner:
            inner.watch(x)
            loss = tf.reduce_sum(_f64(W) * k.softmax(x))
        g = inner.gradient(loss, x)  # first order: fine
        np.testing.assert_allclose(g.numpy(), _softmax_grad(X, W), rtol=1e-12)
        s = tf.reduce_sum(g * g)
    with pytest.raises(RuntimeError, match="no second-order"):
        outer.gradient(s, x)


def test_second_order_refused_in_tf_function(k):
    @tf.function
    def h(x):
        with tf.GradientTape() as outer:
            outer.watch(x)
            with tf.GradientTape() as inner:
                inner.watch(x)
                loss = tf.reduce_sum(_f64(W) * k.softmax(x))
            s = tf.reduce_sum(inner.gradient(loss, x) ** 2)
        return outer.gradient(s, x)

    with pytest.raises(RuntimeError, match="no second-order"):
        h(_f64(X))


def test_forward_accumulator_with_vjp_no_jvp_refused(k):
    x = _f64(X)
    with tf.autodiff.ForwardAccumulator(x, _f64(np.ones(4))):
        with pytest.raises(RuntimeError, match="needs a jvp= kernel"):
            k.softmax(x)


def test_mismatched_spelled_vjp_refused_at_construction(lib):
    """a cotangent of another shape than its primal is refused when the
    Function is made (TF itself would accept a wrong-shaped gradient)"""
    with pytest.raises(ValueError, match="dx"):
        dlb.load(lib, "dlb_kernel_softmax",
                 "softmax(x: float64[n]) -> (y: float64[n])",
                 vjp=("dlb_kernel_bad_vjp_shape",
                      "bad(x: float64[n], dy: float64[n]) -> (dx: float64[m])"))


def test_vjp_no_tape_fast_path(k):
    """a Function with a vjp, called with no tape: the plain call"""
    y = k.softmax(_f64(X))
    np.testing.assert_allclose(y.numpy(), _softmax(X), rtol=1e-12)
    y = k.softmax(X)  # NumPy
    np.testing.assert_allclose(np.asarray(y), _softmax(X), rtol=1e-12)
