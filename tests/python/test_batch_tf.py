"""tf.vectorized_map, tape.jacobian and tape.gradient of dlbridge Functions
with batch dimensions (issue 25, TensorFlow): pfor's converter for
DlbridgeCall (dlbridge._ops_tf._pfor_convert) turns the loop of a `...`
Function into ONE kernel call, counted with examples/kernels/batch.c's
counters; a Function without `...`, or a loop over a parameter without
`...`, goes to pfor's while_loop fallback, which must be correct and say
nothing (no TensorFlow warning, no Python warning); a broadcast call's
cotangents are summed back to their inputs' shapes.  Every answer is
NumPy's."""

import contextlib
import ctypes
import logging
import warnings

import numpy as np
import pytest

import dlbridge as dlb
from _batch_counter import batch_counters

tf = pytest.importorskip("tensorflow")

T = "float64"
SIGS = {
    "bscale": f"bscale(a: {T}[...], x: {T}[..., n]) -> (y: {T}[..., n])",
    "bstats": f"bstats(x: {T}[..., n]) -> (mean: {T}[...], sq: {T}[..., n])",
    "baxpy": f"baxpy(a: {T}[...], x: {T}[..., n], y: mut {T}[..., n])",
    "bdot": f"bdot(x: {T}[..., n], w: {T}[n]) -> (s: {T}[...])",
    "vscale": f"vscale(a: {T}, x: {T}[n]) -> (y: {T}[n])",
}
VJP = {"bscale": "dlb_kernel_bscale_vjp", "vscale": "dlb_kernel_vscale_vjp"}


@pytest.fixture(scope="module")
def k(lib):
    class K:
        pass
    for name, sig in SIGS.items():
        kw = {"vjp": VJP[name]} if name in VJP else {}
        setattr(K, name, dlb.load(lib, "dlb_kernel_" + name, sig, **kw))
    return K


@pytest.fixture(scope="module")
def counters(lib):
    """() -> (kernel calls so far, the last call's batch shape)."""
    so = ctypes.CDLL(lib)

    return lambda: batch_counters(so)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def quiet():
    """A context manager that fails the test when TensorFlow logs a
    warning or an error (its Python logger, where pfor's "Using a
    while_loop for converting ..." goes), or Python warns, inside it;
    quiet.debug holds the debug-level lines it saw."""
    logger = logging.getLogger("tensorflow")

    class Quiet:
        debug = []

        @contextlib.contextmanager
        def __call__(self):
            h = _Records()
            level = logger.level
            logger.addHandler(h)
            logger.setLevel(logging.DEBUG)
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    yield
            finally:
                logger.removeHandler(h)
                logger.setLevel(level)
            # Eagerly, every tf.vectorized_map / tape.jacobian wraps its
            # loop in a new tf.function, and after five TensorFlow warns
            # that they retraced: about the caller's pattern, for any op.
            loud = [r.getMessage() for r in h.records
                    if r.levelno >= logging.WARNING
                    and "triggered tf.function retracing" not in
                    r.getMessage()]
            assert not loud, loud
            assert not caught, [str(w.message) for w in caught]
            self.debug = [r.getMessage() for r in h.records]
    return Quiet()


def _t(v):
    return tf.constant(np.asarray(v, np.float64))


RNG = np.random.default_rng(25)
N = 5


def _calls(counters, run):
    """Run run(); (its result, kernel calls it made, last batch shape)."""
    before, _ = counters()
    out = run()
    after, last = counters()
    return out, after - before, last


# ---- the converter route: one kernel call for the loop --------------------

def test_bscale_both_stacked_items_with_batch_dims(k, counters, quiet):
    """items a: (), x: (3, 4): the loop axis must line up in front of the
    items' batch axis for both (a stacked is (5,), x (5, 3, 4))."""
    a, x = RNG.standard_normal(N), RNG.standard_normal((N, 3, 4))
    f = tf.function(lambda a, x: tf.vectorized_map(
        lambda ax: k.bscale(*ax), (a, x)))
    f.get_concrete_function(_t(a), _t(x))  # trace outside the count
    with quiet():
        y, calls, last = _calls(counters, lambda: f(_t(a), _t(x)))
    np.testing.assert_allclose(y.numpy(), a[:, None, None] * x, rtol=1e-13)
    assert calls == 1 and last == (N, 3)


def test_bscale_eager_vectorized_map(k, counters, quiet):
    a, x = RNG.standard_normal((N, 2)), RNG.standard_normal((N, 2, 3))
    with quiet():
        y, calls, last = _calls(counters, lambda: tf.vectorized_map(
            lambda ax: k.bscale(*ax), (_t(a), _t(x))))
    np.testing.assert_allclose(y.numpy(), a[..., None] * x, rtol=1e-13)
    assert last == (N, 2)
    assert calls == 1


@pytest.mark.parametrize("x_item", [(3, 4), (4,)])
def test_unstacked_batch_input_is_broadcast(k, counters, quiet, x_item):
    """a loop-invariant `...` input (a closure) is not tiled: the run
    broadcasts it; the kernel sees its size-1 pad.  With items x: (4,),
    a: (3,) sets the items' batch rank, and the loop axis goes in front of
    it (x becomes (N, 1, 4))."""
    a, x = RNG.standard_normal(3), RNG.standard_normal((N,) + x_item)
    ta = _t(a)
    f = tf.function(lambda x: tf.vectorized_map(lambda xi: k.bscale(ta, xi),
                                                x))
    f.get_concrete_function(_t(x))
    with quiet():
        y, calls, last = _calls(counters, lambda: f(_t(x)))
    want = a[:, None] * (x if len(x_item) == 2 else x[:, None, :])
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-13)
    assert y.shape == (N, 3, 4)
    assert calls == 1 and last == (N, 3)


def test_zero_d_batch_parameter_alone_stacked(k, counters, quiet):
    """a: float64[...] as a 0-d item, the only stacked input."""
    a, x = RNG.standard_normal(N), RNG.standard_normal(4)
    tx = _t(x)
    f = tf.function(lambda a: tf.vectorized_map(lambda ai: k.bscale(ai, tx),
                                                a))
    f.get_concrete_function(_t(a))
    with quiet():
        y, calls, last = _calls(counters, lambda: f(_t(a)))
    np.testing.assert_allclose(y.numpy(), a[:, None] * x, rtol=1e-13)
    assert calls == 1 and last == (N,)


def test_bstats_two_results(k, counters, quiet):
    x = RNG.standard_normal((N, 2, 6))
    f = tf.function(lambda x: tf.vectorized_map(k.bstats, x))
    f.get_concrete_function(_t(x))
    with quiet():
        (mean, sq), calls, last = _calls(counters, lambda: f(_t(x)))
    np.testing.assert_allclose(mean.numpy(), x.mean(-1), rtol=1e-13)
    np.testing.assert_allclose(sq.numpy(), x * x, rtol=1e-13)
    assert calls == 1 and last == (N, 2)


@pytest.mark.parametrize("y_stacked", [True, False])
def test_baxpy_mut_new_value_returned(k, counters, quiet, y_stacked):
    """baxpy's y: the new value is the node's output, the caller's tensor
    is unchanged; a loop-invariant y is tiled along the loop (a mut
    argument has the full batch shape)."""
    a, x = RNG.standard_normal(N), RNG.standard_normal((N, 4))
    y = RNG.standard_normal((N, 4) if y_stacked else (4,))
    ty = _t(y)
    if y_stacked:
        f = tf.function(lambda a, x, y: tf.vectorized_map(
            lambda t: k.baxpy(*t), (a, x, y)))
        args = (_t(a), _t(x), ty)
    else:
        f = tf.function(lambda a, x: tf.vectorized_map(
            lambda t: k.baxpy(t[0], t[1], ty), (a, x)))
        args = (_t(a), _t(x))
    f.get_concrete_function(*args)
    with quiet():
        y2, calls, last = _calls(counters, lambda: f(*args))
    np.testing.assert_allclose(y2.numpy(), y + a[:, None] * x, rtol=1e-13)
    np.testing.assert_array_equal(ty.numpy(), y)
    assert calls == 1 and last == (N,)


def test_bdot_unbatched_weight_one_call(k, counters, quiet):
    x, w = RNG.standard_normal((N, 3, 4)), RNG.standard_normal(4)
    tw = _t(w)
    f = tf.function(lambda x: tf.vectorized_map(lambda xi: k.bdot(xi, tw), x))
    f.get_concrete_function(_t(x))
    with quiet():
        s, calls, last = _calls(counters, lambda: f(_t(x)))
    np.testing.assert_allclose(s.numpy(), x @ w, rtol=1e-13)
    assert calls == 1 and last == (N, 3)


def test_unknown_loop_length_one_trace(k, counters, quiet):
    """an input signature with an unknown leading extent: the loop length
    is a run-time value; one trace serves every length, one call each."""
    f = tf.function(lambda a, x: tf.vectorized_map(
        lambda ax: k.bscale(*ax), (a, x)),
        input_signature=[tf.TensorSpec([None], tf.float64),
                         tf.TensorSpec([None, 3], tf.float64)])
    for n in (4, 2, 7):
        a, x = RNG.standard_normal(n), RNG.standard_normal((n, 3))
        with quiet():
            y, calls, last = _calls(counters, lambda: f(_t(a), _t(x)))
        np.testing.assert_allclose(y.numpy(), a[:, None] * x, rtol=1e-13)
        assert calls == 1 and last == (n,)
    assert len(f._list_all_concrete_functions()) == 1


# ---- the while_loop fallback: correct and quiet ---------------------------

def test_bdot_batched_weight_falls_back(k, counters, quiet):
    """w has no `...`: a loop over it cannot be batch dimensions."""
    x, w = RNG.standard_normal((N, 3, 4)), RNG.standard_normal((N, 4))
    f = tf.function(lambda x, w: tf.vectorized_map(lambda t: k.bdot(*t),
                                                   (x, w)))
    f.get_concrete_function(_t(x), _t(w))
    with quiet():
        s, calls, last = _calls(counters, lambda: f(_t(x), _t(w)))
    np.testing.assert_allclose(s.numpy(), np.einsum("bij,bj->bi", x, w),
                               rtol=1e-13)
    assert calls == N and last == (3,)


@pytest.mark.parametrize("compiled", [False, True])
def test_vscale_without_batch_dims_falls_back(k, counters, quiet, compiled):
    a, x = RNG.standard_normal(N), RNG.standard_normal((N, 4))

    def run(a, x):
        return tf.vectorized_map(lambda t: k.vscale(*t), (a, x))
    with quiet():  # the trace too: that is where pfor converts
        if compiled:
            run = tf.function(run)
            run.get_concrete_function(_t(a), _t(x))
        y, calls, _ = _calls(counters, lambda: run(_t(a), _t(x)))
    np.testing.assert_allclose(y.numpy(), a[:, None] * x, rtol=1e-13)
    assert calls == N
    assert any("while_loop" in m and "no batch dimensions" in m
               for m in quiet.debug), quiet.debug


def test_fallback_to_while_loop_false_names_the_reason(k):
    a, x = RNG.standard_normal(N), RNG.standard_normal((N, 4))
    with pytest.raises(ValueError, match="vscale has no batch dimensions"):
        tf.vectorized_map(lambda t: k.vscale(*t), (_t(a), _t(x)),
                          fallback_to_while_loop=False)


def test_without_the_converter_tf_falls_back_and_warns(k, counters, quiet):
    """If TensorFlow's private pfor registry moved, no converter is
    registered: the while_loop fallback is still correct (TensorFlow then
    warns, which also shows that the quiet fixture hears its warnings)."""
    from tensorflow.python.ops.parallel_for import pfor

    from dlbridge import _core
    a, x = RNG.standard_normal(N), RNG.standard_normal((N, 4))
    tf.vectorized_map(lambda t: k.bscale(*t), (_t(a), _t(x)))  # registers
    conv = pfor._pfor_converter_registry.pop(_core._TF_OP)
    try:
        with pytest.raises(AssertionError, match="Using a while_loop"):
            with quiet():
                y, calls, _ = _calls(counters, lambda: tf.vectorized_map(
                    lambda t: k.bscale(*t), (_t(a), _t(x))))
        np.testing.assert_allclose(y.numpy(), a[:, None] * x, rtol=1e-13)
        # pfor leaves the loop body in the graph; nothing retires its
        # stateful node then, so TensorFlow also runs it on item 0
        assert calls == N + 1
    finally:
        pfor._pfor_converter_registry[_core._TF_OP] = conv


# ---- jacobian and gradients ------------------------------------------------

@pytest.mark.parametrize("compiled", [False, True])
def test_jacobian_one_vjp_call(k, counters, quiet, compiled):
    """tape.jacobian runs pfor over the gradient: the vjp node gets the
    stacked basis cotangents and is batched as one call."""
    a, x = RNG.standard_normal(2), RNG.standard_normal((2, 3))

    def jac(a, x):
        with tf.GradientTape() as tape:
            tape.watch([a, x])
            y = k.bscale(a, x)
        return tape.jacobian(y, [a, x])
    if compiled:
        jac = tf.function(jac)
        jac.get_concrete_function(_t(a), _t(x))
    with quiet():
        (ja, jx), calls, last = _calls(counters, lambda: jac(_t(a), _t(x)))
    # y[i, j] = a[i] x[i, j]
    eye_a, eye_x = np.eye(2), np.eye(3)
    want_a = np.einsum("ik,ij->ijk", eye_a, x)
    want_x = np.einsum("ik,jl,i->ijkl", eye_a, eye_x, a)
    np.testing.assert_allclose(ja.numpy(), want_a, rtol=1e-13)
    np.testing.assert_allclose(jx.numpy(), want_x, rtol=1e-13)
    # the forward, then one batched vjp over the 6 basis vectors
    assert calls == 2 and last == (6, 2)


@pytest.mark.parametrize("compiled", [False, True])
def test_gradient_of_broadcast_call_sums_down(k, compiled):
    """a: (3, 1) against x: (1, 4, 5): y is (3, 4, 5); the vjp writes da
    at (3, 4) and dx at (3, 4, 5); each is summed to its input's shape."""
    a, x = RNG.standard_normal((3, 1)), RNG.standard_normal((1, 4, 5))
    w = RNG.standard_normal((3, 4, 5))

    def grad(a, x):
        with tf.GradientTape() as tape:
            tape.watch([a, x])
            loss = tf.reduce_sum(_t(w) * k.bscale(a, x))
        return tape.gradient(loss, [a, x])
    if compiled:
        grad = tf.function(grad)
    da, dx = grad(_t(a), _t(x))
    assert da.shape == (3, 1) and dx.shape == (1, 4, 5)
    np.testing.assert_allclose(da.numpy(),
                               (w * x).sum(axis=(1, 2))[:, None], rtol=1e-12)
    np.testing.assert_allclose(dx.numpy(), (w * a[..., None]).sum(0)[None],
                               rtol=1e-12)


def test_gradient_sum_down_unknown_extents(k):
    """traced with unknown extents: the same sum on run-time shapes."""
    f = tf.function(lambda a, x: _grad(k, a, x),
                    input_signature=[tf.TensorSpec([None], tf.float64),
                                     tf.TensorSpec([None, None], tf.float64)])
    for na, nb in ((1, 3), (3, 3)):
        a, x = RNG.standard_normal(na), RNG.standard_normal((nb, 4))
        da, dx = f(_t(a), _t(x))
        y_grad_a = x.sum(-1)
        want_a = y_grad_a.sum(keepdims=True) if na == 1 else y_grad_a
        np.testing.assert_allclose(da.numpy(), want_a, rtol=1e-12)
        np.testing.assert_allclose(dx.numpy(),
                                   np.broadcast_to(a[:, None], (nb, 4)),
                                   rtol=1e-12)


def _grad(k, a, x):
    with tf.GradientTape() as tape:
        tape.watch([a, x])
        loss = tf.reduce_sum(k.bscale(a, x))
    return tape.gradient(loss, [a, x])


def test_per_example_gradients(k, counters, quiet):
    """vectorized_map over a GradientTape: per item, the forward and its
    vjp, each batched over the loop as one call."""
    a, x = RNG.standard_normal(N), RNG.standard_normal((N, 4))

    def per_item(t):
        ai, xi = t
        with tf.GradientTape() as tape:
            tape.watch(ai)
            loss = tf.reduce_sum(k.bscale(ai, xi) ** 2)
        return tape.gradient(loss, ai)
    f = tf.function(lambda a, x: tf.vectorized_map(per_item, (a, x)))
    f.get_concrete_function(_t(a), _t(x))
    with quiet():
        g, calls, last = _calls(counters, lambda: f(_t(a), _t(x)))
    np.testing.assert_allclose(g.numpy(), 2 * a * (x * x).sum(-1),
                               rtol=1e-12)
    assert calls == 2 and last == (N,)


def test_nested_vectorized_map_one_call(k, counters, quiet):
    """a vectorized_map inside a vectorized_map: the inner loop's batched
    node is stacked again by the outer one -- still one call."""
    a, x = RNG.standard_normal((3, N)), RNG.standard_normal((3, N, 4))

    def inner(t):
        return tf.vectorized_map(lambda s: k.bscale(*s), t)
    f = tf.function(lambda a, x: tf.vectorized_map(inner, (a, x)))
    f.get_concrete_function(_t(a), _t(x))
    with quiet():
        y, calls, last = _calls(counters, lambda: f(_t(a), _t(x)))
    np.testing.assert_allclose(y.numpy(), a[..., None] * x, rtol=1e-13)
    assert calls == 1 and last == (3, N)


@pytest.mark.parametrize("compiled", [False, True])
def test_jacobian_of_broadcast_call_sums_in_the_loop(k, counters, quiet,
                                                     compiled):
    """a: () against x: (2, 3): per basis vector the vjp writes da at (2,)
    and the gradient sums it to (); under pfor the sum is batched too."""
    a, x = RNG.standard_normal(()), RNG.standard_normal((2, 3))

    def jac(a, x):
        with tf.GradientTape() as tape:
            tape.watch(a)
            y = k.bscale(a, x)
        return tape.jacobian(y, a)
    if compiled:
        jac = tf.function(jac)
        jac.get_concrete_function(_t(a), _t(x))
    with quiet():
        ja, calls, last = _calls(counters, lambda: jac(_t(a), _t(x)))
    np.testing.assert_allclose(ja.numpy(), x, rtol=1e-13)
    assert calls == 2 and last == (6, 2)


def test_jacobian_without_pfor(k):
    """experimental_use_pfor=False: TensorFlow's while_loop over the
    gradient, per basis vector; the same answer."""
    a, x = RNG.standard_normal(2), RNG.standard_normal((2, 3))
    ta, tx = _t(a), _t(x)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(tx)
        y = k.bscale(ta, tx)
    jx = tape.jacobian(y, tx, experimental_use_pfor=False)
    want = np.einsum("ik,jl,i->ijkl", np.eye(2), np.eye(3), a)
    np.testing.assert_allclose(jx.numpy(), want, rtol=1e-13)


def test_captured_variable(k, counters, quiet):
    """a tf.Variable captured by the loop body is a loop-invariant input."""
    v = tf.Variable(RNG.standard_normal(3))
    x = RNG.standard_normal((N, 3, 2))
    f = tf.function(lambda x: tf.vectorized_map(lambda xi: k.bscale(v, xi),
                                                x))
    f.get_concrete_function(_t(x))
    with quiet():
        y, calls, last = _calls(counters, lambda: f(_t(x)))
    np.testing.assert_allclose(y.numpy(), v.numpy()[:, None] * x, rtol=1e-13)
    assert calls == 1 and last == (N, 3)


SCRIPT = r"""
import sys
import numpy as np, tensorflow as tf
import dlbridge as dlb
lib = sys.argv[1]
T = "float64"
vscale = dlb.load(lib, "dlb_kernel_vscale", f"vscale(a: {T}, x: {T}[n]) -> (y: {T}[n])")
bscale = dlb.load(lib, "dlb_kernel_bscale",
                  f"bscale(a: {T}[...], x: {T}[..., n]) -> (y: {T}[..., n])",
                  vjp="dlb_kernel_bscale_vjp")
a, x = tf.constant(np.arange(5.0)), tf.constant(np.ones((5, 3)))
tf.constant(0.0) + 1.0  # TensorFlow's start-up lines before the marker
print("START", file=sys.stderr, flush=True)
ys = [tf.vectorized_map(lambda t: vscale(*t), (a, x)),
      tf.function(lambda a, x: tf.vectorized_map(lambda t: vscale(*t),
                                                 (a, x)))(a, x),
      tf.vectorized_map(lambda t: bscale(*t), (a, x))]
with tf.GradientTape() as tape:
    tape.watch(x)
    y = bscale(a, x)
ys.append(tape.jacobian(y, x))
for y in ys:
    y.numpy()
print("END", file=sys.stderr, flush=True)
"""


def test_no_tensorflow_log_lines(lib, tmp_path):
    """TensorFlow's C++ logging (stderr, which Python's logging does not
    see): nothing between the markers, fallback and converter routes."""
    import os
    import subprocess
    import sys
    script = tmp_path / "quiet.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0")
    r = subprocess.run([sys.executable, str(script), lib], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    between = r.stderr.split("START\n", 1)[1].split("END", 1)[0]
    assert between.strip() == "", between


@pytest.mark.parametrize("compiled", [False, True])
def test_jacobian_without_batch_dims_falls_back(k, counters, quiet,
                                                compiled):
    """vscale has no `...`: its vjp node goes to the while_loop, one call
    per basis vector, quietly."""
    a, x = RNG.standard_normal(()), RNG.standard_normal(4)

    def jac(a, x):
        with tf.GradientTape() as tape:
            tape.watch([a, x])
            y = k.vscale(a, x)
        return tape.jacobian(y, [a, x])
    with quiet():
        if compiled:
            jac = tf.function(jac)
            jac.get_concrete_function(_t(a), _t(x))
        (ja, jx), calls, _ = _calls(counters, lambda: jac(_t(a), _t(x)))
    np.testing.assert_allclose(ja.numpy(), x, rtol=1e-13)
    np.testing.assert_allclose(jx.numpy(), a * np.eye(4), rtol=1e-13)
    assert calls == 1 + 4


@pytest.mark.parametrize("compiled", [False, True])
def test_gradient_through_vectorized_map(k, compiled):
    """tape.gradient of a loss over vectorized_map's output: the converted
    node's own gradient (its vjp at the loop's batch shape), loop-invariant
    a summed over the loop."""
    a, x = RNG.standard_normal(()), RNG.standard_normal((N, 4))
    w = RNG.standard_normal((N, 4))

    def grad(a, x):
        with tf.GradientTape() as tape:
            tape.watch([a, x])
            y = tf.vectorized_map(lambda xi: k.bscale(a, xi), x)
            loss = tf.reduce_sum(_t(w) * y)
        return tape.gradient(loss, [a, x])
    if compiled:
        grad = tf.function(grad)
    da, dx = grad(_t(a), _t(x))
    assert da.shape == () and dx.shape == (N, 4)
    np.testing.assert_allclose(da.numpy(), (w * x).sum(), rtol=1e-12)
    np.testing.assert_allclose(dx.numpy(), a * w, rtol=1e-12)
