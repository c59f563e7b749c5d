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
