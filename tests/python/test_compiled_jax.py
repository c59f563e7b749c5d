"""A dlbridge.Function inside JAX's compiler: jax.jit, vmap, jax.export and
the differentiation rule (python/dlbridge/_ops_jax.py), and the XLA FFI
handler that runs it (src/ops/xla.c), also driven directly through a fake
XLA built with ctypes, so its error paths and its CUDA path (XLA's stream,
the device ordinal) run on a machine without a GPU.

The kernels are examples/kernels/*.c (build/libdlb_example_kernels.so, the
`lib` fixture of conftest.py).  Every result is compared with NumPy's answer
and with the eager call."""
import ctypes as C
import gc
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import tracemalloc
import warnings

import numpy as np
import pytest

import dlbridge as dlb
from dlbridge import _core

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

MATMUL = "matmul(a: float32[m, k], b: float32[k, n]) -> float32[m, n]"
SAXPY_OUT = "saxpy(a: float32, x: float32[n], y: float32[n]) -> float32[n]"
SAXPY = "saxpy(a: float32, x: float32[n], y: mut float32[n])"


@pytest.fixture(scope="module")
def mm(lib):
    return dlb.load(lib, "dlb_kernel_matmul", MATMUL)


@pytest.fixture(scope="module")
def saxpy_out(lib):
    return dlb.load(lib, "dlb_kernel_saxpy_out", SAXPY_OUT)


@pytest.fixture(scope="module")
def saxpy(lib):
    return dlb.load(lib, "dlb_kernel_saxpy", SAXPY)


def f32(*shape, start=0.0):
    n = int(np.prod(shape)) if shape else 1
    return (np.arange(n, dtype=np.float32) * 0.5 + start).reshape(shape)


# ---- jax.jit: results equal NumPy's and the eager call's -------------------------

def test_matmul_in_jit(mm):
    a, b = f32(2, 3), f32(3, 4, start=1.0)
    traced = jax.jit(mm)(a, b)
    assert isinstance(traced, jax.Array)
    np.testing.assert_allclose(np.asarray(traced), a @ b, rtol=1e-6)
    eager = mm(jnp.asarray(a), jnp.asarray(b))
    np.testing.assert_array_equal(np.asarray(traced), np.asarray(eager))


def test_retrace_with_new_shapes(mm):
    traces = []

    @jax.jit
    def g(a, b):
        traces.append(a.shape)
        return mm(a, b) * 2

    for shape_a, shape_b in [((2, 3), (3, 4)), ((5, 1), (1, 7)),
                             ((2, 3), (3, 4)), ((0, 3), (3, 2))]:
        a, b = f32(*shape_a), f32(*shape_b, start=2.0)
        out = g(a, b)
        assert out.shape == (shape_a[0], shape_b[1])
        np.testing.assert_allclose(np.asarray(out), 2 * (a @ b), rtol=1e-6)
    assert traces == [(2, 3), (5, 1), (0, 3)]


def test_saxpy_with_a_python_number(saxpy_out):
    x, y = f32(5), f32(5, start=3.0)
    for a in (2.0, 3, True):
        traced = jax.jit(lambda x, y: saxpy_out(a, x, y))(x, y)
        np.testing.assert_allclose(np.asarray(traced),
                                   np.float32(a) * x + y, rtol=1e-6)
        eager = saxpy_out(a, jnp.asarray(x), jnp.asarray(y))
        np.testing.assert_array_equal(np.asarray(traced), np.asarray(eager))
    # the number may be a traced 0-d array instead
    traced = jax.jit(saxpy_out)(jnp.float32(-1.5), x, y)
    np.testing.assert_allclose(np.asarray(traced), -1.5 * x + y, rtol=1e-6)


def test_numpy_arrays_are_constants_in_a_trace(saxpy_out):
    x, y = f32(4), f32(4, start=1.0)
    out = jax.jit(lambda y: saxpy_out(2.0, x, y))(y)
    np.testing.assert_allclose(np.asarray(out), 2 * x + y, rtol=1e-6)


def test_keyword_arguments_in_a_trace(saxpy_out):
    x, y = f32(3), f32(3, start=1.0)
    out = jax.jit(lambda x, y: saxpy_out(y=y, a=4.0, x=x))(x, y)
    np.testing.assert_allclose(np.asarray(out), 4 * x + y, rtol=1e-6)


def test_mut_in_jit_returns_the_new_value_and_leaves_the_input(saxpy):
    x, y = f32(4), f32(4, start=1.0)
    xj, yj = jnp.asarray(x), jnp.asarray(y)
    new = jax.jit(lambda x, y: saxpy(2.0, x, y))(xj, yj)
    np.testing.assert_allclose(np.asarray(new), 2 * x + y, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(yj), y)  # never written
    # the input used again after the call: XLA keeps its old value apart
    new, old = jax.jit(lambda x, y: (saxpy(2.0, x, y), y + 0))(xj, yj)
    np.testing.assert_array_equal(np.asarray(old), y)
    np.testing.assert_allclose(np.asarray(new), 2 * x + y, rtol=1e-6)
    # the eager call on NumPy arrays writes in place: the same answer
    y_np = y.copy()
    assert saxpy(2.0, x, y_np) is None
    np.testing.assert_array_equal(np.asarray(new), y_np)


def test_mut_in_jit_equals_the_eager_jax_call(saxpy):
    x, y = f32(4), f32(4, start=1.0)
    xj, yj = jnp.asarray(x), jnp.asarray(y)
    new = jax.jit(lambda x, y: saxpy(2.0, x, y))(xj, yj)
    before = np.asarray(yj).copy()
    # eagerly the kernel writes a copy made by JAX and hands it back: the
    # caller's array is never written, as under jit
    eager = saxpy(2.0, xj, yj)
    assert isinstance(eager, jax.Array)
    np.testing.assert_array_equal(np.asarray(yj), before)
    np.testing.assert_array_equal(np.asarray(eager), np.asarray(new))


def test_declared_results_come_before_mut_values(lib):
    # the kernel writes its result and leaves y alone
    f = dlb.load(lib, "dlb_kernel_saxpy_out",
                 "saxpy(a: float32, x: float32[n], y: mut float32[n]) "
                 "-> float32[n]")
    x, y = f32(3), f32(3, start=5.0)
    out, y_new = jax.jit(lambda x, y: f(2.0, x, y))(x, y)
    np.testing.assert_allclose(np.asarray(out), 2 * x + y, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(y_new), y)


def test_a_call_with_no_results_still_runs(lib):
    fail = dlb.load(lib, "dlb_kernel_fail", "fail(x: float32[n])")
    with pytest.raises(RuntimeError, match="fail: fail was given 1 tensors"):
        jax.jit(lambda x: fail(x))(f32(3))
        jax.effects_barrier()
    noop = dlb.load(lib, "dlb_kernel_noop", "noop(x: float32[n])")
    assert jax.jit(lambda x: noop(x))(f32(3)) is None


def test_site_with_more_headers_than_the_inline_ones_runs_again(lib):
    # 7 operands, 1 result and 2 numbers: 10 headers, more than the
    # handler keeps on its stack (8): every call of the site takes the
    # heap path, never the seen-shapes shortcut, whose headers live on
    # the stack (under ASan in make sanitize-python).
    xs = ", ".join(f"x{i}: float32[n]" for i in range(7))
    wide = dlb.load(lib, "dlb_kernel_noop",
                    f"wide(a: float32, b: float32, {xs}) -> float32[n]")
    f = jax.jit(lambda *xs: wide(2.0, 3.0, *xs))
    args = [f32(4, start=i) for i in range(7)]
    for _ in range(3):
        out = f(*args)
        jax.block_until_ready(out)
        assert out.shape == (4,) and out.dtype == np.float32


def test_kernel_error_names_the_function(lib):
    fail = dlb.load(lib, "dlb_kernel_fail", "fail(x: float32[n]) -> float32[n]")
    with pytest.raises(RuntimeError) as e:
        np.asarray(jax.jit(fail)(f32(3)))
    assert "fail: fail was given 2 tensors and refuses them all" in str(e.value)
    unsupported = dlb.load(lib, "dlb_kernel_unsupported",
                           "unsupported(x: float32[n]) -> float32[n]")
    with pytest.raises(RuntimeError, match="unsupported: the kernel failed"):
        np.asarray(jax.jit(unsupported)(f32(3)))


def test_handler_hands_compact_strides_and_the_host_device(lib):
    describe = dlb.load(lib, "dlb_kernel_describe",
                        "describe(x: float32[a, b, c]) -> int64[7]")
    x = np.zeros((2, 3, 4), np.float32)
    facts = np.asarray(jax.jit(describe)(x))
    assert facts.tolist() == [1, 0, 3, 1, 12, 4, 1]  # kDLCPU 0, strides
    facts = np.asarray(jax.jit(lambda x: describe(jnp.transpose(x, (2, 0, 1))))(x))
    assert facts.tolist() == [1, 0, 3, 1, 6, 3, 1]


def test_transposed_operands_are_relaid_out(mm):
    a, b = f32(3, 2), f32(4, 3, start=1.0)
    got = jax.jit(lambda a, b: mm(a.T, b.T))(a, b)
    np.testing.assert_allclose(np.asarray(got), a.T @ b.T, rtol=1e-6)


# ---- vmap, jax.export, differentiation ---------------------------------------------

def test_vmap_of_a_function_without_batch_dims_is_one_looped_call(
        mm, saxpy_out, saxpy):
    # no '...' in these signatures: vmap is dlbridge's rule, never JAX's
    # vmap_method (deprecated): one custom call whose handler loops in C
    a, b = f32(3, 2, 3), f32(3, 3, 4, start=1.0)
    x, y = f32(3, 5), f32(3, 5, start=2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got_mm = jax.jit(jax.vmap(mm))(a, b)
        got_sx = jax.vmap(lambda x, y: saxpy_out(2.0, x, y))(x, y)
        got_mut = jax.jit(jax.vmap(lambda x, y: saxpy(2.0, x, y)))(x, y)
        got_in_axes = jax.vmap(saxpy_out, in_axes=(None, 0, None))(
            jnp.float32(3.0), x, y[0])
    for i in range(3):
        np.testing.assert_array_equal(
            np.asarray(got_mm[i]),
            np.asarray(mm(jnp.asarray(a[i]), jnp.asarray(b[i]))))
        eager = np.asarray(saxpy_out(2.0, jnp.asarray(x[i]), jnp.asarray(y[i])))
        np.testing.assert_array_equal(np.asarray(got_sx[i]), eager)
        np.testing.assert_array_equal(np.asarray(got_mut[i]), eager)
        np.testing.assert_allclose(np.asarray(got_in_axes[i]),
                                   3 * x[i] + y[0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(got_mm), a @ b, rtol=1e-6)
    jaxpr = str(jax.make_jaxpr(jax.vmap(mm))(a, b))
    assert "sequential" not in jaxpr
    assert jaxpr.count("ffi_call[") == 1
    assert "('loop_rank', np.int64(1))" in jaxpr
    assert "result_avals=(ShapedArray(float32[3,2,4]),)" in jaxpr
    # nested: two loop dims, still one custom call in the compiled graph
    a2, b2 = f32(2, 3, 2, 3), f32(2, 3, 3, 4, start=1.0)
    nested = jax.jit(jax.vmap(jax.vmap(mm)))
    hlo = nested.lower(a2, b2).as_text()
    assert hlo.count("@dlbridge_function") == 1
    assert "loop_rank = 2" in hlo
    np.testing.assert_allclose(np.asarray(nested(a2, b2)), a2 @ b2, rtol=1e-6)


def test_grad_vjp_and_jvp_raise_a_type_error_naming_the_function(saxpy_out):
    x, y = f32(3), f32(3, start=1.0)
    loss = lambda x: saxpy_out(2.0, x, y).sum()  # noqa: E731
    message = "saxpy: a dlbridge Function has no derivative"
    with pytest.raises(TypeError, match=message):
        jax.grad(loss)(x)
    with pytest.raises(TypeError, match=message):
        jax.jit(jax.grad(loss))(x)
    with pytest.raises(TypeError, match=message):   # the jaxpr made first
        jax.grad(jax.jit(loss))(x)
    with pytest.raises(TypeError, match=message):
        jax.vjp(lambda x: saxpy_out(2.0, x, y), x)
    with pytest.raises(TypeError, match=message):
        jax.jvp(lambda x: saxpy_out(2.0, x, y), (x,), (x,))
    with pytest.raises(TypeError, match=message):
        jax.linearize(lambda x: saxpy_out(2.0, x, y), x)
    with pytest.raises(TypeError, match=message):
        jax.grad(lambda x: jax.vmap(lambda r: saxpy_out(2.0, r, r))(x).sum())(
            np.stack([x, y]))
    # differentiating something the Function's arguments do not depend on
    w = np.float32(3.0)
    g = jax.jit(jax.grad(lambda w, x: w * saxpy_out(2.0, x, y).sum()))(w, x)
    np.testing.assert_allclose(g, (2 * x + y).sum(), rtol=1e-6)
    g = jax.jit(jax.grad(
        lambda x: saxpy_out(2.0, jax.lax.stop_gradient(x), y).sum()
        + x.sum()))(x)
    np.testing.assert_array_equal(np.asarray(g), np.ones(3, np.float32))


def test_export_needs_dlbridges_disabled_checks(mm):
    from jax import export
    a, b = f32(2, 3), f32(3, 4)
    with pytest.raises(ValueError, match="dlbridge_function"):
        export.export(jax.jit(mm))(a, b)
    checks = dlb.jax_export_checks()
    assert checks == [export.DisabledSafetyCheck.custom_call(
        "dlbridge_function")]
    exported = export.export(jax.jit(mm), disabled_checks=checks)(a, b)
    np.testing.assert_allclose(np.asarray(exported.call(a, b)), a @ b,
                               rtol=1e-6)


def test_export_with_symbolic_dimensions(mm, saxpy):
    # jax.export's shape polymorphism: a result extent named like a
    # symbolic argument dimension is that dimension; XLA resolves it when
    # the exported graph runs, and the kernel checks the extents then
    from jax import export
    m, n, j = export.symbolic_shape("m, n, j")
    exported = export.export(
        jax.jit(lambda a, b, x, y: (mm(a, b), saxpy(2.0, x, y))),
        disabled_checks=dlb.jax_export_checks())(
            jax.ShapeDtypeStruct((m, 3), np.float32),
            jax.ShapeDtypeStruct((3, 4), np.float32),
            jax.ShapeDtypeStruct((n,), np.float32),
            jax.ShapeDtypeStruct((n,), np.float32))
    assert [a.shape for a in exported.out_avals] == [(m, 4), (n,)]
    for k in (2, 5):
        a, b, x = f32(k, 3), f32(3, 4, start=1.0), f32(k + 1)
        c, y = exported.call(a, b, x, x)
        np.testing.assert_allclose(np.asarray(c), a @ b, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(y), 3 * x, rtol=1e-6)
    # two symbols the signature names alike: checked when the graph runs
    exported = export.export(jax.jit(mm), disabled_checks=dlb.jax_export_checks())(
        jax.ShapeDtypeStruct((2, m), np.float32),
        jax.ShapeDtypeStruct((j, 4), np.float32))
    np.testing.assert_allclose(np.asarray(exported.call(f32(2, 3), f32(3, 4))),
                               f32(2, 3) @ f32(3, 4), rtol=1e-6)
    with pytest.raises(RuntimeError, match="matmul\\(\\): argument 1 is a float32 "
                       "tensor of 2 dimensions with another extent"):
        np.asarray(exported.call(f32(2, 3), f32(5, 4)))


LOADER = """
import sys
import numpy as np
import jax
from jax import export
import dlbridge as dlb
lib, path = sys.argv[1], sys.argv[2]
exported = export.deserialize(bytearray(open(path, "rb").read()))
a = np.arange(6, dtype=np.float32).reshape(2, 3)
b = np.arange(12, dtype=np.float32).reshape(3, 4) + 1
args = (a, b, np.float32(2.0), a[0], a[1])
for stage in ("no target", "unregistered"):
    try:
        exported.call(*args)
        print(stage + ": ran")
    except Exception as e:
        print(stage + ":", type(e).__name__, str(e).replace("\\n", " "))
    dlb.jax_register()   # the target alone
mm = dlb.load(lib, "dlb_kernel_matmul", sys.argv[3])
saxpy = dlb.load(lib, "dlb_kernel_saxpy", sys.argv[4])
dlb.jax_register(mm, saxpy)
c, y = exported.call(*args)
print("result:", np.asarray(c).tolist(), np.asarray(y).tolist())
"""


def test_export_runs_in_another_process(lib, mm, saxpy, tmp_path):
    from jax import export

    def g(a, b, s, x, y):
        return mm(a, b), saxpy(s, x, y)

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(12, dtype=np.float32).reshape(3, 4) + 1
    args = (a, b, np.float32(2.0), a[0], a[1])
    exported = export.export(jax.jit(g), disabled_checks=dlb.jax_export_checks())(
        *args)
    path = tmp_path / "g.jax"
    path.write_bytes(exported.serialize())
    run = subprocess.run(
        [sys.executable, "-c", LOADER, lib, str(path), MATMUL, SAXPY],
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = dict(line.split(": ", 1) for line in run.stdout.splitlines())
    # before the process registered anything, XLA knows no such target;
    # then, before it created and registered the Functions, a clear error
    assert "dlbridge_function" in lines["no target"]
    assert mm._identity in lines["unregistered"]
    assert "dlbridge.jax_register" in lines["unregistered"]
    c_here, y_here = jax.jit(g)(*args)
    assert lines["result"] == "%s %s" % (np.asarray(c_here).tolist(),
                                          np.asarray(y_here).tolist())
    assert np.asarray(c_here).tolist() == (a @ b).tolist()
    np.testing.assert_allclose(np.asarray(y_here), 2 * a[0] + a[1])


# ---- errors: the eager call's, at trace time ------------------------------------------

def _raised(f, *args):
    try:
        f(*args)
    except Exception as e:  # noqa: BLE001 - compared below
        return e
    raise AssertionError("no exception")


@pytest.mark.parametrize("case", [
    "dtype", "rank", "extent", "float into int", "overflow", "fp8 number",
    "number for a tensor", "not a tensor", "mut number", "arity"])
def test_trace_time_errors_are_the_eager_calls(lib, case):
    f = dlb.load(lib, "dlb_kernel_noop",
                 "f(k: int8, a: float32, x: float32[n], y: float32[n]) "
                 "-> float32[n]")
    g = dlb.load(lib, "dlb_kernel_noop", "g(a: float8_e4m3fn, y: mut int8)")
    h = dlb.load(lib, "dlb_kernel_noop", "h(a: float32, y: mut int8)")
    x = np.zeros(3, np.float32)
    args = {
        "dtype": (f, 1, 2.0, x, np.zeros(3, np.int32)),
        "rank": (f, 1, 2.0, x, np.zeros((3, 1), np.float32)),
        "extent": (f, 1, 2.0, x, np.zeros(4, np.float32)),
        "float into int": (f, 1.5, 2.0, x, x),
        "overflow": (f, 300, 2.0, x, x),
        "fp8 number": (g, 1.0, np.zeros((), np.int8)),
        "number for a tensor": (f, 1, 2.0, x, 3.0),
        "not a tensor": (f, 1, 2.0, x, "y"),
        "mut number": (h, np.zeros((), "float32"), 3),
        "arity": (f, 1, 2.0, x),
    }[case]
    fn, rest = args[0], args[1:]
    eager = _raised(fn, *[jnp.asarray(a) if isinstance(a, np.ndarray) else a
                          for a in rest])
    # one argument traced: the rest are what the eager call got
    traced_at = next(i for i, a in enumerate(rest) if isinstance(a, np.ndarray))

    def traced(t):
        call = list(rest)
        call[traced_at] = t
        return fn(*call)

    in_trace = _raised(jax.jit(traced), rest[traced_at])
    assert type(in_trace) is type(eager), (in_trace, eager)
    if case == "not a tensor":
        # the same first sentence; the eager call goes on to list what it
        # tried, which a traced call does not try
        first = str(eager).split(":")[:2]
        assert str(in_trace).split(":")[:2] == first, (in_trace, eager)
    else:
        assert str(in_trace) == str(eager)


def test_mixing_frameworks_is_a_clear_error(saxpy_out):
    torch = pytest.importorskip("torch")
    x = f32(3)
    for other in (torch.zeros(3), dlb.tensor([0.0, 0.0, 0.0])):
        with pytest.raises(TypeError, match="one call cannot mix frameworks"):
            jax.jit(lambda x: saxpy_out(2.0, x, other))(x)


def test_another_kernel_under_a_used_identity_is_a_value_error(lib):
    sig = "jax_reg_case(x: float32[n]) -> float32[n]"
    first = dlb.load(lib, "dlb_kernel_copy", sig)
    same = dlb.load(lib, "dlb_kernel_copy", sig)
    other = dlb.load(lib, "dlb_kernel_noop", sig)
    x = f32(3, start=1.0)
    np.testing.assert_array_equal(np.asarray(jax.jit(first)(x)), x)
    np.testing.assert_array_equal(np.asarray(jax.jit(same)(x)), x)
    assert _core._ops_find(first._identity) is first
    with pytest.raises(ValueError, match="another kernel"):
        jax.jit(other)(x)


def test_sub_byte_dtypes_are_refused_at_trace_time(lib):
    f = dlb.load(lib, "dlb_kernel_noop", "f(x: float32[n]) -> int4[n]")
    with pytest.raises(TypeError, match="int4 parameter or result cannot"):
        jax.jit(f)(f32(2))


def test_register_takes_only_functions():
    with pytest.raises(TypeError):
        dlb.jax_register(object())


# ---- nothing leaks per call or per trace ------------------------------------------

def _traced_growth(run, warm, count):
    """Bytes still allocated after count runs (after warm ones)."""
    for _ in range(warm):
        run()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(count):
            run()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_no_leak_per_call(saxpy):
    g = jax.jit(lambda x, y: saxpy(2.0, x, y))
    x, y = jnp.asarray(f32(8)), jnp.asarray(f32(8))
    g(x, y).block_until_ready()
    gc.collect()      # garbage of earlier traces may hold the Function
    refs = sys.getrefcount(saxpy)
    grew = _traced_growth(lambda: g(x, y).block_until_ready(), 200, 3000)
    assert grew < 64 * 1024, grew
    assert sys.getrefcount(saxpy) == refs


def test_no_leak_per_trace(saxpy_out, monkeypatch):
    # Each new shape is a new traced op (_ops_jax._op, a bounded cache, made
    # small here so that a few traces pass its bound) and new entries in
    # JAX's own caches (bounded, but large: abstract evaluation keeps ~1 KB
    # per new result shape).  So: nothing may hold the Function once the
    # traces are gone, and a trace may keep no more than a bare ffi_call
    # with the same results keeps.
    import functools
    from dlbridge import _ops_jax
    monkeypatch.setattr(_ops_jax, "_op",
                        functools.lru_cache(8)(_ops_jax._op.__wrapped__))
    sizes = iter(range(1, 10**6))
    bare = jax.ffi.ffi_call  # a target is only named: nothing runs

    def trace(f):
        n = next(sizes)
        jax.make_jaxpr(f)(jax.ShapeDtypeStruct((n,), np.float32))

    def ours():
        trace(lambda x: saxpy_out(2.0, x, x))

    def theirs():
        trace(lambda x: bare(
            "dlbridge_function", jax.ShapeDtypeStruct(x.shape, x.dtype),
            vmap_method="sequential")(np.float32(2.0), x, x,
                                      dlb_identity=saxpy_out._identity))

    for _ in range(20):
        ours()
    gc.collect()
    refs = sys.getrefcount(saxpy_out)
    grew_ours = _traced_growth(ours, 0, 60)
    assert sys.getrefcount(saxpy_out) == refs
    assert _ops_jax._op.cache_info().currsize == 8
    grew_theirs = _traced_growth(theirs, 10, 60)
    assert grew_ours < 1.2 * grew_theirs + 32 * 1024, (grew_ours, grew_theirs)


# ---- the handler through a fake XLA (ctypes): every path, CUDA's too ----------------

class _Span(C.Structure):
    _fields_ = [("ptr", C.c_char_p), ("len", C.c_size_t)]


class _Buffer(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p),
                ("dtype", C.c_int), ("data", C.c_void_p),
                ("rank", C.c_int64), ("dims", C.POINTER(C.c_int64))]


class _List(C.Structure):  # XLA_FFI_Args and XLA_FFI_Rets
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p),
                ("size", C.c_int64), ("types", C.POINTER(C.c_int)),
                ("items", C.POINTER(C.c_void_p))]


class _Attrs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p),
                ("size", C.c_int64), ("types", C.POINTER(C.c_int)),
                ("names", C.POINTER(C.POINTER(_Span))),
                ("attrs", C.POINTER(C.c_void_p))]


class _Version(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p),
                ("major", C.c_int), ("minor", C.c_int)]


class _Api(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p),
                ("version", _Version), ("internal", C.c_void_p),
                ("slots", C.c_void_p * 20)]


class _Frame(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p),
                ("api", C.POINTER(_Api)), ("ctx", C.c_void_p),
                ("stage", C.c_int), ("args", _List), ("rets", _List),
                ("attrs", _Attrs), ("future", C.c_void_p)]


class _ErrorArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p),
                ("message", C.c_char_p), ("errc", C.c_int)]


class _StreamArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p),
                ("ctx", C.c_void_p), ("stream", C.c_void_p)]


class _OrdinalArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p),
                ("ctx", C.c_void_p), ("ordinal", C.c_int32)]


class _Metadata(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("version", _Version),
                ("traits", C.c_uint32), ("state_type_id", C.c_int64)]


class _MetadataExt(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("type", C.c_int),
                ("next", C.c_void_p), ("metadata", C.POINTER(_Metadata))]


_XLA_CODES = {np.dtype(np.bool_): 1, np.dtype(np.int8): 2,
              np.dtype(np.int64): 5, np.dtype(np.float32): 11,
              np.dtype(np.float64): 12}
_HANDLER = C.CFUNCTYPE(C.c_void_p, C.POINTER(_Frame))
# A prototype of our own: setting argtypes on ctypes.pythonapi's shared
# function object would change it for every other test.
_capsule_pointer = C.PYFUNCTYPE(C.c_void_p, C.py_object, C.c_char_p)(
    ("PyCapsule_GetPointer", C.pythonapi))
_ERROR_CREATE = C.CFUNCTYPE(C.c_void_p, C.POINTER(_ErrorArgs))
_STREAM_GET = C.CFUNCTYPE(C.c_void_p, C.POINTER(_StreamArgs))
_ORDINAL_GET = C.CFUNCTYPE(C.c_void_p, C.POINTER(_OrdinalArgs))
_INVALID_ARGUMENT, _NOT_FOUND, _FAILED_PRECONDITION, _UNIMPLEMENTED = 3, 5, 9, 12


class FakeXla:
    """XLA's side of a handler call: a function table whose Error_Create
    records (code, message) and returns a token, a stream and a device
    ordinal for the CUDA handler, and call frames over NumPy arrays.  The
    handler is called through ctypes, so without the GIL, as XLA calls it."""

    def __init__(self, stream=0, ordinal=0, stream_error=False,
                 api_size=None):
        self.errors = []
        self.seen = []
        self.ctx = C.c_int(7)

        def error_create(p):
            self.errors.append((p.contents.errc, p.contents.message.decode()))
            return 0x1000 + len(self.errors)

        def stream_get(p):
            self.seen.append(("stream", p.contents.struct_size,
                              p.contents.ctx == C.addressof(self.ctx)))
            if stream_error:
                return 0x2000
            p.contents.stream = stream
            return None

        def ordinal_get(p):
            self.seen.append(("ordinal", p.contents.struct_size,
                              p.contents.ctx == C.addressof(self.ctx)))
            p.contents.ordinal = ordinal
            return None

        self._callbacks = (_ERROR_CREATE(error_create), _STREAM_GET(stream_get),
                           _ORDINAL_GET(ordinal_get))
        self.api = _Api()
        self.api.struct_size = api_size or 48 + 18 * 8
        self.api.version.major, self.api.version.minor = 0, 3
        for slot, cb in zip((0, 4, 17), self._callbacks):
            self.api.slots[slot] = C.cast(cb, C.c_void_p).value

    def handler(self, platform):
        capsule = _core._xla_handler(platform)
        return _HANDLER(_capsule_pointer(capsule, None))

    def _buffers(self, arrays, keep):
        n = len(arrays)
        types = (C.c_int * max(n, 1))(*([1] * n))
        items = (C.c_void_p * max(n, 1))()
        for i, a in enumerate(arrays):
            if isinstance(a, _Buffer):
                b = a
            else:
                dims = (C.c_int64 * max(a.ndim, 1))(*a.shape)
                b = _Buffer(48, None, _XLA_CODES[a.dtype], a.ctypes.data,
                            a.ndim, dims)
                keep.append(dims)
            keep.append(b)
            items[i] = C.addressof(b)
        keep += [types, items]
        return _List(40, None, n, types, items)

    def call(self, platform, operands, results, identity="",
             frame_size=168, attrs=None, operand_types=None):
        """Run the handler on operands and results (NumPy arrays, or
        _Buffer for a malformed one); the error token or None."""
        keep = []
        frame = _Frame()
        frame.struct_size = frame_size
        frame.api = C.pointer(self.api)
        frame.ctx = C.addressof(self.ctx)
        frame.args = self._buffers(operands, keep)
        for i, kind in enumerate(operand_types or ()):
            frame.args.types[i] = kind
        frame.rets = self._buffers(results, keep)
        if attrs is None:
            attrs = [("dlb_identity", identity)] if identity else []
        n = len(attrs)
        names = (C.POINTER(_Span) * max(n, 1))()
        values = (C.c_void_p * max(n, 1))()
        types = (C.c_int * max(n, 1))()
        for i, (key, value) in enumerate(sorted(attrs)):
            k = _Span(key.encode(), len(key))
            if isinstance(value, str):
                v = _Span(value.encode(), len(value.encode()))
                types[i] = 4
            else:
                v = C.c_float(value)
                types[i] = 3
            keep += [k, v]
            names[i] = C.pointer(k)
            values[i] = C.addressof(v)
        frame.attrs = _Attrs(48, None, n, types, names, values)
        return self.handler(platform)(C.byref(frame))


@pytest.fixture
def registered(lib):
    def make(symbol, signature):
        fn = dlb.load(lib, symbol, signature)
        dlb.jax_register(fn)
        return fn
    return make


# The instantiate stage's state, through a fake XLA that keeps states per
# call site (ctx).  In a subprocess: the state type is registered once per
# process with the first XLA that instantiates a call (in this process
# that is jaxlib's, which a fake cannot stand in for).
_STATE_SCRIPT = r"""
import ctypes as C, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import test_compiled_jax as cj
import dlbridge as dlb
from dlbridge import _core

class Span(C.Structure):
    _fields_ = [("ptr", C.c_char_p), ("len", C.c_size_t)]
class TypeInfo(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p),
                ("deleter", C.CFUNCTYPE(None, C.c_void_p))]
class TypeArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p),
                ("name", Span), ("type_id", C.POINTER(C.c_int64)),
                ("type_info", C.POINTER(TypeInfo))]
class StateArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p),
                ("ctx", C.c_void_p), ("stage", C.c_int),
                ("type_id", C.POINTER(C.c_int64)), ("state", C.c_void_p)]

class StatefulXla(cj.FakeXla):
    def __init__(self):
        super().__init__()
        self.states, self.types, self.destroyed = {}, [], 0
        self.sites = []
        def type_register(p):
            a = p.contents
            self.types.append((a.name.ptr[:a.name.len], a.struct_size))
            self.deleter = a.type_info.contents.deleter
            a.type_id[0] = 42
        def state_set(p):
            a = p.contents
            assert (a.struct_size, a.stage, a.type_id[0]) == (48, 0, 42)
            assert a.ctx not in self.states
            self.states[a.ctx] = a.state
        def state_get(p):
            a = p.contents
            if a.ctx not in self.states:
                return 0x3000
            a.state = self.states[a.ctx]
        def error_destroy(p):
            self.destroyed += 1
        self._more = [C.CFUNCTYPE(None, C.c_void_p)(
                          lambda p: error_destroy(None)),
                      C.CFUNCTYPE(C.c_void_p, C.POINTER(TypeArgs))(type_register),
                      C.CFUNCTYPE(C.c_void_p, C.POINTER(StateArgs))(state_set),
                      C.CFUNCTYPE(C.c_void_p, C.POINTER(StateArgs))(state_get)]
        for slot, cb in zip((2, 5, 7, 8), self._more):
            self.api.slots[slot] = C.cast(cb, C.c_void_p).value
        stages = _core._xla_handlers("cpu")
        self.instantiate = cj._HANDLER(cj._capsule_pointer(stages["instantiate"], None))

    def site(self, ctx, identity):
        # instantiate a call site: a frame with its attributes only
        self.ctx = C.c_int(ctx)            # later calls run this site
        self.sites.append(self.ctx)        # each site's ctx address unique
        frame = cj._Frame()
        frame.struct_size = 168
        frame.api = C.pointer(self.api)
        frame.ctx = C.addressof(self.ctx)
        keep = []
        frame.args = self._buffers([], keep)
        frame.rets = self._buffers([], keep)
        k = cj._Span(b"dlb_identity", 12)
        v = cj._Span(identity.encode(), len(identity))
        names = (C.POINTER(cj._Span) * 1)(C.pointer(k))
        values = (C.c_void_p * 1)(C.addressof(v))
        types = (C.c_int * 1)(4)
        frame.attrs = cj._Attrs(48, None, 1, types, names, values)
        assert self.instantiate(C.byref(frame)) is None
        return self.states[C.addressof(self.ctx)]

lib = sys.argv[2]
mm = dlb.load(lib, "dlb_kernel_matmul", cj.MATMUL)
_core._ops_register(mm)
xla = StatefulXla()
a, b = cj.f32(2, 3), cj.f32(3, 4, start=1.0)
live = _core._allocation_stats()["live"]
_core._fail_allocations(-1)                 # count, refuse nothing
one = xla.site(1, mm._identity)
ctx_one = xla.ctx
assert xla.types == [(b"dlbridge.xla_call_state.host", 48)], xla.types
# its calls read no attribute: one without any runs the site's Function
c = np.zeros((2, 4), np.float32)
xla.errors.clear()
assert xla.call("cpu", [a, b], [c]) is None, xla.errors
np.testing.assert_allclose(c, a @ b, rtol=1e-6)
# the checks that call passed are skipped for later calls of the same
# dtypes and shapes (kept in the state, two sets of them), never for
# others: every call gives what the same call decoded per call gives
plain = cj.FakeXla()
def same_as_decoded(operands, results):
    mine = [r.copy() for r in results]
    xla.errors.clear()
    plain.errors.clear()
    got = xla.call("cpu", operands, mine)
    want = plain.call("cpu", operands, results, mm._identity)
    assert (got is None) == (want is None), (xla.errors, plain.errors)
    assert xla.errors == plain.errors, (xla.errors, plain.errors)
    for m, r in zip(mine, results):
        np.testing.assert_array_equal(m, r)
    return got is None
f64 = lambda *shape: np.zeros(shape, np.float64)
z32 = lambda *shape: np.zeros(shape, np.float32)
assert same_as_decoded([cj.f32(2, 3, start=5.0), b], [z32(2, 4)])
assert same_as_decoded([cj.f32(3, 2), cj.f32(2, 5)], [z32(3, 5)])
assert same_as_decoded([cj.f32(1, 1), cj.f32(1, 1)], [z32(1, 1)])
assert not same_as_decoded([a, b], [z32(2, 5)])        # a result extent
assert not same_as_decoded([a, b], [f64(2, 4)])        # a result dtype
assert not same_as_decoded([a, b, b], [z32(2, 4)])     # an operand count
assert not same_as_decoded([a, cj.f32(4, 4)], [z32(2, 4)])
assert same_as_decoded([a, b], [z32(2, 4)])            # seen: still right
# a `mut` input: a seen call XLA did not alias still gets it copied
sx = dlb.load(lib, "dlb_kernel_saxpy", cj.SAXPY)
_core._ops_register(sx)
five = xla.site(5, sx._identity)
two_ = np.array(np.float32(2.0).reshape(()))
x, y = cj.f32(4), cj.f32(4, start=1.0)
assert xla.call("cpu", [two_, x, y], [y]) is None, xla.errors  # aliased
y_before, y_new = y.copy(), np.full(4, np.nan, np.float32)
assert xla.call("cpu", [two_, x, y], [y_new]) is None, xla.errors
np.testing.assert_array_equal(y, y_before)
np.testing.assert_allclose(y_new, 2 * x + y_before, rtol=1e-6)
assert xla.call("cpu", [two_, x, y], [z32(5)]) is not None
assert xla.errors[-1] == (cj._INVALID_ARGUMENT, "saxpy: the result XLA "
                          "aliased with mut argument 2 is not shaped like it")
xla.deleter(five)
xla.ctx = ctx_one
# another site of the same Function shares the block; the type is
# registered once
two = xla.site(2, mm._identity)
assert two == one and len(xla.types) == 1
# a site whose Function is not registered yet: decoded per call, so it
# runs once the Function is registered (and fails as before until then)
late = dlb.load(lib, "dlb_kernel_matmul",
                "late(a: float32[m, k], b: float32[k, n]) -> float32[m, n]")
three = xla.site(3, late._identity)
assert three != one
xla.errors.clear()
assert xla.call("cpu", [a, b], [c], late._identity) is not None
assert xla.errors[-1][0] == cj._NOT_FOUND, xla.errors
_core._ops_register(late)
c[:] = 0
assert xla.call("cpu", [a, b], [c], late._identity) is None, xla.errors
np.testing.assert_allclose(c, a @ b, rtol=1e-6)
# a refused block: that site decodes per call too
_core._fail_allocations(0)
four = xla.site(4, mm._identity)
_core._fail_allocations(-1)
assert four == three                        # the shared "decode" state
c[:] = 0
assert xla.call("cpu", [a, b], [c], mm._identity) is None, xla.errors
np.testing.assert_allclose(c, a @ b, rtol=1e-6)
# XLA deletes each site's state once: the shared block goes with the last
for state in (one, two, three, four):
    xla.deleter(state)
stats = _core._reset_allocations()
assert stats["live"] == live, (stats, live)
# a call site XLA never instantiated: decoded per call, XLA's error freed
xla.ctx = C.c_int(9)
c[:] = 0
assert xla.call("cpu", [a, b], [c], mm._identity) is None, xla.errors
np.testing.assert_allclose(c, a @ b, rtol=1e-6)
assert xla.destroyed == 1
print("ok")
"""


def test_instantiate_stage_decodes_each_call_site_once(lib):
    here = pathlib.Path(__file__).resolve().parent
    out = subprocess.run([sys.executable, "-c", _STATE_SCRIPT, str(here), lib],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), \
        out.stdout + out.stderr
    with pytest.raises(ValueError, match="platform"):
        _core._xla_handlers("noop")


def test_handler_answers_the_metadata_query():
    xla = FakeXla()
    for platform in ("cpu", "cuda", "noop"):
        meta = _Metadata(C.sizeof(_Metadata), _Version(24, None, 9, 9), 5, 0)
        ext = _MetadataExt(24, 1, None, C.pointer(meta))
        frame = _Frame()
        frame.struct_size = 168
        frame.ext = C.addressof(ext)
        assert xla.handler(platform)(C.byref(frame)) is None
        assert (meta.version.major, meta.version.minor, meta.traits) == (0, 1, 0)
    assert xla.errors == []
    # the benchmarks' floor does nothing at all, even with no identity
    assert xla.call("noop", [f32(2)], [np.zeros(2, np.float32)]) is None
    assert xla.errors == []
    with pytest.raises(ValueError, match="platform"):
        _core._xla_handler("rocm")
    with pytest.raises(TypeError):
        _core._xla_handler(1)


def test_handler_runs_a_function_on_the_host(registered):
    mm = registered("dlb_kernel_matmul", MATMUL)
    xla = FakeXla()
    a, b, c = f32(2, 3), f32(3, 4, start=1.0), np.zeros((2, 4), np.float32)
    assert xla.call("cpu", [a, b], [c], mm._identity) is None
    np.testing.assert_allclose(c, a @ b, rtol=1e-6)
    assert xla.errors == []


def test_handler_cuda_path_gets_xlas_stream_and_ordinal(registered):
    probe = registered("dlb_kernel_stream_probe",
                       "stream_probe(x: float32[n]) -> int64[1]")
    describe = registered("dlb_kernel_describe",
                          "describe(x: float32[a, b]) -> int64[6]")
    xla = FakeXla(stream=0xABCDEF0, ordinal=3)
    out = np.zeros(1, np.int64)
    assert xla.call("cuda", [f32(4)], [out], probe._identity) is None
    assert out[0] == 0xABCDEF0
    facts = np.zeros(6, np.int64)
    assert xla.call("cuda", [f32(5, 2)], [facts], describe._identity) is None
    assert facts.tolist() == [2, 3, 2, 1, 2, 1]   # kDLCUDA, ordinal 3
    assert xla.seen == [("ordinal", 28, True), ("stream", 32, True)] * 2
    # the host handler passes no stream and device 0, and asks XLA nothing
    assert xla.call("cpu", [f32(4)], [out], probe._identity) is None
    assert out[0] == 0
    assert xla.call("cpu", [f32(5, 2)], [facts], describe._identity) is None
    assert facts.tolist() == [1, 0, 2, 1, 2, 1]
    assert len(xla.seen) == 4 and xla.errors == []


def test_handler_passes_xlas_own_stream_error_on(registered):
    probe = registered("dlb_kernel_stream_probe",
                       "stream_probe(x: float32[n]) -> int64[1]")
    xla = FakeXla(stream_error=True)
    assert xla.call("cuda", [f32(4)], [np.zeros(1, np.int64)],
                    probe._identity) == 0x2000


def test_handler_on_an_xla_without_device_ordinal(registered):
    probe = registered("dlb_kernel_stream_probe",
                       "stream_probe(x: float32[n]) -> int64[1]")
    xla = FakeXla(api_size=48 + 17 * 8)
    assert xla.call("cuda", [f32(4)], [np.zeros(1, np.int64)], probe._identity)
    assert xla.errors == [(_FAILED_PRECONDITION, "stream_probe: this XLA "
                           "cannot tell which GPU the call runs on (no "
                           "DeviceOrdinal_Get)")]


def test_handler_copies_a_mut_input_xla_did_not_alias(registered):
    saxpy = registered("dlb_kernel_saxpy", SAXPY)
    xla = FakeXla()
    a, x, y = np.float32(2.0).reshape(()), f32(4), f32(4, start=1.0)
    y_before = y.copy()
    y_new = np.full(4, np.nan, np.float32)
    assert xla.call("cpu", [np.array(a), x, y], [y_new], saxpy._identity) is None
    np.testing.assert_array_equal(y, y_before)
    np.testing.assert_allclose(y_new, 2 * x + y_before, rtol=1e-6)
    # aliased, as XLA does it: one buffer, updated in place
    assert xla.call("cpu", [np.array(a), x, y], [y], saxpy._identity) is None
    np.testing.assert_allclose(y, 2 * x + y_before, rtol=1e-6)
    # an aliased result of another shape is refused, not written
    assert xla.call("cpu", [np.array(a), x, y], [np.zeros(5, np.float32)],
                    saxpy._identity)
    assert xla.errors[-1] == (_INVALID_ARGUMENT, "saxpy: the result XLA "
                              "aliased with mut argument 2 is not shaped "
                              "like it")


def test_handler_with_many_tensors_and_extents(registered):
    # more tensors and extents than the handler keeps on its stack
    names = ", ".join("x%d: float32[a, b, c, d, e, f, g, h]" % i
                      for i in range(9))
    f = registered("dlb_kernel_noop", "many(%s) -> float32[a]" % names)
    xs = [np.zeros((1,) * 8, np.float32) for _ in range(9)]
    xla = FakeXla()
    assert xla.call("cpu", xs, [np.zeros(1, np.float32)], f._identity) is None
    # that block refused by the core's allocator: a clear error, no leak
    live = _core._allocation_stats()["live"]
    _core._fail_allocations(0)
    try:
        token = xla.call("cpu", xs, [np.zeros(1, np.float32)], f._identity)
    finally:
        stats = _core._reset_allocations()
    assert token is not None and stats["live"] == live
    assert xla.errors == [(8, "dlbridge: out of memory for a call of 10 "
                              "tensors")]


def test_handler_tells_many_functions_apart(registered):
    # more Functions than the handler's per-thread memo has slots, called
    # in turn: each result extent fits only its own Function's signature,
    # so a call given another Function fails its check
    fns = [registered("dlb_kernel_noop",
                      "memo_case_%d(x: float32[n]) -> float32[%d]" % (i, i + 1))
           for i in range(20)]
    xla = FakeXla()
    for i in list(range(20)) * 2 + list(range(19, -1, -1)):
        assert xla.call("cpu", [f32(3)], [np.zeros(i + 1, np.float32)],
                        fns[i]._identity) is None, xla.errors
    assert xla.errors == []
    # a name the registry does not know is not remembered either
    assert xla.call("cpu", [f32(3)], [np.zeros(1, np.float32)],
                    "memo_case_99_00000000") is not None
    assert xla.errors[-1][0] == _NOT_FOUND


@pytest.mark.parametrize("case, code, message", [
    ("no identity", _INVALID_ARGUMENT, "dlbridge: a custom call to dlbridge's "
     "XLA target without the 'dlb_identity' attribute"),
    ("another attribute type", _INVALID_ARGUMENT, "without the 'dlb_identity'"),
    ("unknown identity", _NOT_FOUND, "dlbridge: the graph calls the dlbridge "
     "Function 'nosuch_00000000', which this process has not registered"),
    ("long identity", _NOT_FOUND, "'" + "x" * 200 + "', which"),
    ("operand count", _INVALID_ARGUMENT, "matmul: XLA passed 1 operands and 1 "
     "results; the signature has 2 parameters (0 of them mut) and 1 results"),
    ("small frame", _FAILED_PRECONDITION, "dlbridge: XLA's call frame has 160 "
     "bytes; dlbridge reads 168"),
    ("small buffer", _FAILED_PRECONDITION, "matmul: XLA passed operand 1 in a "
     "buffer struct of 40 bytes; dlbridge reads 48"),
    ("int4", _UNIMPLEMENTED, "matmul: operand 0 has XLA element type 21, which "
     "a dlbridge kernel cannot be given"),
    ("rank", _UNIMPLEMENTED, "matmul: result 0 has 65 dimensions; at most 64"),
    ("not a buffer", _INVALID_ARGUMENT, "matmul: operand 1 is not a buffer"),
    ("dtype", _INVALID_ARGUMENT, "matmul(): argument 1 is a float64 tensor of "
     "2 dimensions; the signature says float32 with 2"),
    ("extent", _INVALID_ARGUMENT, "matmul(): result 0 is a float32 tensor of 2 "
     "dimensions with another extent; the signature says float32 with 2"),
])
def test_handler_errors(registered, case, code, message):
    mm = registered("dlb_kernel_matmul", MATMUL)
    xla = FakeXla()
    a, b, c = f32(2, 3), f32(3, 4), np.zeros((2, 4), np.float32)
    kw = {"identity": mm._identity}
    operands, results = [a, b], [c]
    dims = (C.c_int64 * 65)(*([1] * 65))
    if case == "no identity":
        kw = {}
    elif case == "another attribute type":
        kw = {"attrs": [("dlb_identity", 1.0)]}
    elif case == "unknown identity":
        kw = {"identity": "nosuch_00000000"}
    elif case == "long identity":
        kw = {"identity": "x" * 300}
    elif case == "operand count":
        operands = [a]
    elif case == "small frame":
        kw["frame_size"] = 160
    elif case == "small buffer":
        operands = [a, _Buffer(40, None, 11, b.ctypes.data, 2,
                               (C.c_int64 * 2)(3, 4))]
    elif case == "int4":
        operands = [_Buffer(48, None, 21, a.ctypes.data, 2,
                            (C.c_int64 * 2)(2, 3)), b]
    elif case == "rank":
        results = [_Buffer(48, None, 11, c.ctypes.data, 65, dims)]
    elif case == "not a buffer":
        kw["operand_types"] = [1, 2]
    elif case == "dtype":
        operands = [a, b.astype(np.float64)]
    elif case == "extent":
        results = [np.zeros((2, 5), np.float32)]
    token = xla.call("cpu", operands, results, **kw)
    assert token == 0x1000 + len(xla.errors) and len(xla.errors) == 1
    assert xla.errors[0][0] == code
    assert message in xla.errors[0][1], xla.errors[0][1]


# ---- our transcription of the C ABI against the installed jaxlib's header ------------

def test_transcription_matches_jaxlibs_header(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    include = pathlib.Path(jax.ffi.include_dir())
    if not (include / "xla" / "ffi" / "api" / "c_api.h").exists():
        pytest.skip("this jaxlib ships no xla/ffi/api/c_api.h")
    layout = _core._xla_ffi_layout()
    lines = "\n".join('  printf("%%lld\\n", (long long)(%s));' % expr
                      for expr in layout)
    src = tmp_path / "layout.c"
    src.write_text(textwrap.dedent("""\
        #include <stddef.h>
        #include <stdio.h>
        #include "xla/ffi/api/c_api.h"
        int main(void) {
        %s
          return 0;
        }
        """) % lines)
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", "-I", str(include), str(src), "-o",
                    str(exe)], check=True)
    values = subprocess.run([str(exe)], check=True, capture_output=True,
                            text=True).stdout.split()
    theirs = dict(zip(layout, map(int, values)))
    assert theirs == layout


def test_a_site_with_a_number_attribute_runs_alike_every_call():
    # the first call checks and keeps its shapes, the later ones skip the
    # checks: each still gets the site's number and its own data
    from test_batch_jax import _AddScalar
    add = _AddScalar("add_every_call")
    with jax.enable_x64(False):
        f = jax.jit(lambda y: add.fn(0.1, y) * 2)
        y = np.arange(3, dtype=np.float32)
        assert "dlb_arg0 = 1.000000e-01 : f64" in f.lower(y).as_text()
        for i in range(4):
            y = np.arange(3, dtype=np.float32) + i
            want = (y.astype(np.float64) + 0.1).astype(np.float32) * 2
            np.testing.assert_array_equal(np.asarray(f(y)), want)
    assert add.shapes == [(3,)] * 4
