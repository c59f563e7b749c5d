"""Issue 23 (hardening round 4), the Function items: identity collisions
(item 2), `mut` arguments overlapping another argument (item 3), and
inspect.signature of a Function (item 11).  Each test failed before its
fix."""
import inspect
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import dlbridge as dlb
from dlbridge import _core

# ---- item 2: identities ------------------------------------------------------


def _old_identity_hash(text):
    """The identity hash before issue 23: FNV-1a 64 folded to 32 bits."""
    h = 0xcbf29ce484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return (h ^ (h >> 32)) & 0xFFFFFFFF


# Found by a birthday search over the input's name (about a second in
# Python): two signatures of one name whose old identities were equal.
# The eager calls return shapes (2,) and (5,).
COLLIDING = ("f(x58303: float32[n]) -> float32[2]",
             "f(x9145: float32[n]) -> float32[5]")


def _colliding_pair(lib):
    a = dlb.load(lib, "dlb_kernel_noop", COLLIDING[0])
    b = dlb.load(lib, "dlb_kernel_noop", COLLIDING[1])
    # the test data: the old hash really collided
    assert (_old_identity_hash(a._normalized_signature)
            == _old_identity_hash(b._normalized_signature))
    return a, b


def test_identity_has_64_bits_and_is_stable_across_processes(lib):
    f = dlb.load(lib, "dlb_kernel_noop", COLLIDING[1])
    assert re.fullmatch(r"f_[0-9a-f]{16}", f._identity), f._identity
    # Pinned: an exported graph names this string in every process and
    # version to come (FNV-1a 64 of the normalised signature).
    assert f._identity == "f_db1ce9405d6422ee"
    code = ("import dlbridge as dlb; print(dlb.load(%r, 'dlb_kernel_noop', "
            "%r)._identity)" % (lib, COLLIDING[1]))
    for seed in ("0", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        other = subprocess.run([sys.executable, "-c", code], env=env,
                               capture_output=True, text=True,
                               check=True).stdout.strip()
        assert other == f._identity


def test_colliding_signatures_have_distinct_identities(lib):
    a, b = _colliding_pair(lib)
    assert a._identity != b._identity
    assert _core._ops_register(a) is a
    assert _core._ops_register(b) is b


def test_colliding_signatures_under_torch_compile(lib):
    torch = pytest.importorskip("torch")
    a, b = _colliding_pair(lib)
    x = torch.zeros(3)
    assert tuple(a(x).shape) == (2,) and tuple(b(x).shape) == (5,)
    ca = torch.compile(lambda t: a(t), backend="eager", fullgraph=True)
    cb = torch.compile(lambda t: b(t), backend="eager", fullgraph=True)
    assert tuple(ca(x).shape) == (2,)
    assert tuple(cb(x).shape) == (5,)


def test_colliding_signatures_under_jax_jit(lib):
    jax = pytest.importorskip("jax")
    a, b = _colliding_pair(lib)
    x = jax.numpy.zeros(3, jax.numpy.float32)
    assert jax.jit(a)(x).shape == (2,)
    assert jax.jit(b)(x).shape == (5,)


def test_colliding_signatures_under_tf_function(lib):
    tf = pytest.importorskip("tensorflow")
    a, b = _colliding_pair(lib)
    x = tf.zeros([3], tf.float32)
    assert tuple(tf.function(lambda t: a(t))(x).shape) == (2,)
    assert tuple(tf.function(lambda t: b(t))(x).shape) == (5,)


def _forced_pair(lib, tag):
    """Two Functions of different signatures, one kernel, given one
    identity (the collision a 64-bit hash no longer lets a test find)."""
    identity = "h23_forced_%s_0123456789abcdef" % tag
    a = dlb.load(lib, "dlb_kernel_noop", "h23_forced(x: float32[n]) -> float32[2]")
    b = dlb.load(lib, "dlb_kernel_noop", "h23_forced(x: float32[n]) -> float32[5]")
    _core._function_force_identity(a, identity)
    _core._function_force_identity(b, identity)
    assert a._identity == b._identity == identity
    return a, b


def test_registry_refuses_another_signature_under_an_identity(lib):
    a, b = _forced_pair(lib, "core")
    assert _core._ops_register(a) is a
    with pytest.raises(ValueError, match="another signature"):
        _core._ops_register(b)
    # the same signature, another object, same kernel: still served
    again = dlb.load(lib, "dlb_kernel_noop",
                     "h23_forced(x: float32[n]) -> float32[2]")
    _core._function_force_identity(again, a._identity)
    assert _core._ops_register(again) is a
    with pytest.raises(ValueError):
        _core._function_force_identity(a, "late")


def _raised(exc, kind, text):
    """exc, or an exception it was raised from or during, is a `kind`
    whose message has text."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, kind) and text in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def test_torch_registry_refuses_another_signature(lib):
    torch = pytest.importorskip("torch")
    from dlbridge import _ops_torch
    a, b = _forced_pair(lib, "torch")
    x = torch.zeros(3)
    ca = torch.compile(lambda t: a(t), backend="eager", fullgraph=True)
    assert tuple(ca(x).shape) == (2,)
    with pytest.raises(ValueError, match="another signature"):
        _ops_torch.op(b)
    cb = torch.compile(lambda t: b(t), backend="eager", fullgraph=True)
    with pytest.raises(Exception) as info:
        cb(x)
    assert _raised(info.value, ValueError, "another signature"), info.value


def test_jax_registry_refuses_another_signature(lib):
    jax = pytest.importorskip("jax")
    a, b = _forced_pair(lib, "jax")
    x = jax.numpy.zeros(3, jax.numpy.float32)
    assert jax.jit(a)(x).shape == (2,)
    with pytest.raises(ValueError, match="another signature"):
        jax.jit(b)(x)
    with pytest.raises(ValueError, match="another signature"):
        dlb.jax_register(b)


def test_tf_registry_refuses_another_signature(lib):
    tf = pytest.importorskip("tensorflow")
    a, b = _forced_pair(lib, "tf")
    x = tf.zeros([3], tf.float32)
    assert tuple(tf.function(lambda t: a(t))(x).shape) == (2,)
    with pytest.raises(ValueError, match="another signature"):
        tf.function(lambda t: b(t))(x)


# ---- item 3: `mut` arguments overlapping another argument --------------------

SAXPY = "saxpy(a: float32, x: float32[n], y: mut float32[n])"
OVERLAP = "argument 'y' is 'mut' and its memory overlaps argument 'x'"


@pytest.fixture
def saxpy(lib):
    return dlb.load(lib, "dlb_kernel_saxpy", SAXPY)


def test_partial_overlap_is_refused_numpy(saxpy):
    base = np.arange(6, dtype=np.float32)
    with pytest.raises(BufferError, match=OVERLAP):
        saxpy(1.0, base[0:4], base[1:5])
    np.testing.assert_array_equal(base, np.arange(6))  # the kernel never ran
    t = dlb.tensor([0.0, 1.0, 2.0, 3.0, 4.0, 5.0], dtype="float32")
    arr = np.asarray(t)
    with pytest.raises(BufferError, match=OVERLAP):
        saxpy(1.0, arr[1:5], arr[0:4])
    # a reversed view over bytes the other reads
    with pytest.raises(BufferError, match=OVERLAP):
        saxpy(1.0, base[3::-1], base[0:4])


def test_interleaved_views_are_refused(saxpy):
    """Decided (docs/function.md): the rule is the byte ranges', so views
    that interleave without sharing an element are refused too."""
    base = np.arange(8, dtype=np.float32)
    with pytest.raises(BufferError, match=OVERLAP):
        saxpy(1.0, base[0::2], base[1::2])


def test_same_view_twice_and_disjoint_views_are_allowed(saxpy):
    y = np.arange(4, dtype=np.float32)
    saxpy(1.0, y, y)                              # y += y
    np.testing.assert_array_equal(y, 2 * np.arange(4))
    base = np.arange(8, dtype=np.float32)
    saxpy(2.0, base[0:4], base[4:8])              # touching, disjoint
    np.testing.assert_array_equal(base[4:], [4, 7, 10, 13])


def test_partial_overlap_is_refused_torch_eager(saxpy):
    torch = pytest.importorskip("torch")
    base = torch.arange(6, dtype=torch.float32)
    with pytest.raises(BufferError, match=OVERLAP):
        saxpy(1.0, base[0:4], base[1:5])
    assert base.tolist() == list(range(6))


def _overlapping_call(saxpy):
    def f(base):
        saxpy(1.0, base[0:4], base[1:5])
        return base
    return f


def test_partial_overlap_is_refused_by_every_torch_backend(saxpy):
    """The fake kernel sees the views' shared storage where Dynamo first
    runs the call, before aot_eager's functionalisation copies y: every
    backend raises, naming the eager BufferError (as torch reports any
    error of a fake kernel, test_compiled_torch.py)."""
    torch = pytest.importorskip("torch")
    f = _overlapping_call(saxpy)
    eager = None
    try:
        f(torch.arange(6, dtype=torch.float32))
    except BufferError as exc:
        eager = exc
    assert eager is not None and OVERLAP in str(eager)
    seen = []
    for backend in ("eager", "aot_eager", "inductor"):
        torch._dynamo.reset()
        base = torch.arange(6, dtype=torch.float32)
        with pytest.raises(Exception) as info:
            torch.compile(f, backend=backend)(base)
        assert str(eager) in str(info.value), (backend, info.value)
        assert base.tolist() == list(range(6)), backend
        seen.append(type(info.value))
    assert len(set(seen)) == 1, seen
    # graph inputs that are views of one tensor: fakified sharing a storage
    torch._dynamo.reset()
    base = torch.arange(6, dtype=torch.float32)
    with pytest.raises(Exception) as info:
        torch.compile(lambda x, y: saxpy(1.0, x, y),
                      backend="aot_eager")(base[0:4], base[1:5])
    assert str(eager) in str(info.value)
    assert base.tolist() == list(range(6))


def test_fake_kernel_raises_the_eager_buffer_error(saxpy):
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode
    base = torch.arange(6, dtype=torch.float32)
    with pytest.raises(BufferError) as eager:
        saxpy(1.0, base[0:4], base[1:5])
    with FakeTensorMode():
        fbase = torch.empty(6)
        with pytest.raises(BufferError) as traced:
            saxpy(1.0, fbase[0:4], fbase[1:5])
        saxpy(1.0, fbase[0:4], fbase[0:4])          # the same view: fine
        saxpy(1.0, fbase[0:3], fbase[3:6])          # disjoint: fine
        saxpy(1.0, torch.empty(4), torch.empty(4))  # two storages: fine
    assert str(traced.value) == str(eager.value)


def test_same_view_twice_compiled(saxpy):
    torch = pytest.importorskip("torch")
    for backend in ("eager", "aot_eager"):
        torch._dynamo.reset()
        y = torch.arange(4, dtype=torch.float32)
        torch.compile(lambda t: saxpy(1.0, t, t), backend=backend)(y)
        assert y.tolist() == [0.0, 2.0, 4.0, 6.0], backend


# ---- item 11: inspect.signature of a Function -------------------------------

SAXPY_OUT = "saxpy(a: float32, x: float32[n], y: float32[n]) -> float32[n]"


def test_inspect_signature_names_the_inputs(lib):
    f = dlb.load(lib, "dlb_kernel_saxpy_out", SAXPY_OUT)
    sig = inspect.signature(f)
    assert list(sig.parameters) == ["a", "x", "y"]
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
               for p in sig.parameters.values())
    x = np.arange(3, dtype=np.float32)
    bound = sig.bind(2.0, x, y=x)
    np.testing.assert_array_equal(f(*bound.args, **bound.kwargs), 3 * x)
    # a name Python cannot take as a parameter: positional-only
    k = dlb.load(lib, "dlb_kernel_noop", "k(lambda: float32[n], x: float32[n])")
    assert [p.kind for p in inspect.signature(k).parameters.values()] == \
        [inspect.Parameter.POSITIONAL_ONLY] * 2


def test_tf_function_of_the_function_object(lib):
    tf = pytest.importorskip("tensorflow")
    f = dlb.load(lib, "dlb_kernel_saxpy_out", SAXPY_OUT)
    x = tf.constant([1.0, 2.0, 3.0])
    y = tf.constant([1.0, 1.0, 1.0])
    got = tf.function(f)(2.0, x, y)
    np.testing.assert_array_equal(got.numpy(), f(2.0, x, y).numpy())
    np.testing.assert_array_equal(got.numpy(), [3.0, 5.0, 7.0])
