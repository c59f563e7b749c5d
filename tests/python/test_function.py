"""dlbridge.Function and dlbridge.load(): signature parsing, argument checks,
results in the caller's framework, kernel errors, ownership and leaks.

The kernels are examples/kernels/*.c, built by meson as the shared module
libdlb_example_kernels.so; when the build tree does not have it (a build
without meson), the fixture compiles it with the C compiler instead.
"""

import ctypes
import gc
import os
import pathlib
import sys
import sysconfig

import numpy as np
import pytest

import dlbridge
from dlbridge import _core

Function = getattr(dlbridge, "Function", _core.Function)
load = getattr(dlbridge, "load", _core.load)

ROOT = pathlib.Path(__file__).resolve().parents[2]
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
FT313 = FREE_THREADED and sys.version_info[:2] == (3, 13)

SAXPY = "saxpy(a: float32, x: float32[n], y: mut float32[n])"
SAXPY_OUT = "saxpy(a: float32, x: float32[n], y: float32[n]) -> float32[n]"
ADD3 = "add3(x: float32[n], y: float32[n], z: mut float32[n])"
MATMUL = "matmul(a: float32[m, k], b: float32[k, n]) -> float32[m, n]"


@pytest.fixture(scope="module")
def cdll(lib):
    return ctypes.CDLL(lib)


def addr(cdll, name):
    return ctypes.cast(getattr(cdll, name), ctypes.c_void_p).value


def capsule(address, name=b"dlb_kernel"):
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(address, name, None)


def f32(*a):
    return np.array(a, dtype=np.float32)


# ---- signature parsing ---------------------------------------------------------

@pytest.mark.parametrize("sig,nin,nout", [
    (SAXPY, 3, 0),
    (SAXPY_OUT, 3, 1),
    (MATMUL, 2, 1),
    ("f()", 0, 0),
    ("f() -> float32", 0, 1),
    ("f() -> float32[2, 3]", 0, 1),
    ("f(a: float32[])", 1, 0),
    ("f(a: int64, b: bool, c: complex64, d: bfloat16, e: float8_e4m3fn)", 5, 0),
    ("f(x: float32[n],)", 1, 0),
    ("f(x: float32[n]) -> (float32[n], int64[])", 1, 2),
    ("f(x: float32[n]) -> ()", 1, 0),
    ("f(x: float32[n]) -> (float32[n],)", 1, 1),
    ("  f ( x : mut  float32 [ n , 3 ] )  ->  float32 [ 3 , n ]  ", 1, 1),
    ("f(mut: float32, y: mut int8)", 2, 0),       # a parameter named mut
    ("f(x: float32x4[n])", 1, 0),                 # vector dtype
    ("f(\n  x: float32[n],\n  y: float32[n]\n) -> float32[n]", 2, 1),
    ("f(x: uint8[" + ", ".join("d%d" % i for i in range(64)) + "])", 1, 0),
])
def test_signature_accepted(sig, nin, nout):
    fn = Function(1, sig)
    assert fn.nin == nin and fn.nout == nout
    assert fn.signature == sig
    assert fn.name == fn.__name__ == "f" or fn.name in ("saxpy", "matmul")
    assert repr(fn) == "<dlbridge.Function %s>" % sig


# (signature, message fragment, index of the character the caret marks)
BAD = [
    ("saxpy(a float32, x: float32[n])", "expected ':' after parameter name", 8),
    ("(x: float32)", "expected the function name", 0),
    ("", "expected the function name", 0),
    ("f x: float32)", "expected '(' after the function name", 2),
    ("f(x: flot32)", "unknown dtype 'flot32'", 5),
    ("f(x: )", "expected a dtype name", 5),
    ("f(x: float32[n,])", "expected a dimension", 15),
    ("f(x: float32[n", "expected ',' or ']'", 14),
    ("f(x: float32[2a])", "expected ',' or ']'", 14),
    ("f(x: float32[-1])", "expected a dimension", 13),
    ("f(x: float32[99999999999999999999])", "dimension too large", 13),
    ("f(x: mut mut float32)", "'mut' given twice", 9),
    ("f(x: float32, x: float32)", "duplicate parameter name 'x'", 14),
    ("f(x: float32 y: float32)", "expected ',' or ')' after a parameter", 13),
    ("f(x: float32[n]) -> float32[m]", "'m' is not bound by any input", 28),
    ("f(x: float32) -> mut float32", "results cannot be 'mut'", 17),
    ("f(x: float32) junk", "expected '->' or the end", 14),
    ("f(x: float32) -> float32 junk", "unexpected text after", 25),
    ("f(x: float32) -> (float32, int64[]", "expected ',' or ')' after a result", 34),
    ("f(x: float32) ->", "expected a dtype name", 16),
    ("f(é: float32)", "expected a parameter name", 2),
    ("f(1x: float32)", "expected a parameter name", 2),
    ("f(,)", "expected a parameter name", 2),
    ("f(x: uint8[" + ",".join("d%d" % i for i in range(65)) + "])",
     "too many dimensions", None),
    ("f(" + ", ".join("a%d: float32" % i for i in range(65)) + ")",
     "too many parameters", None),
    ("f(" + ", ".join("a%d: float32" % i for i in range(64)) + ") -> float32",
     "too many parameters", None),
]


@pytest.mark.parametrize("sig,fragment,col", BAD)
def test_signature_rejected_with_caret(sig, fragment, col):
    with pytest.raises(ValueError) as ei:
        Function(1, sig)
    lines = str(ei.value).split("\n")
    assert fragment in lines[0]
    assert lines[1] == "  " + sig
    assert lines[2].strip() == "^"
    if col is not None:
        assert lines[2].index("^") - 2 == col


def test_caret_counts_code_points_and_hides_newlines():
    sig = "f(é: float32,\n  é)"
    with pytest.raises(ValueError) as ei:
        Function(1, "f(x: float32,\n y float32)")
    lines = str(ei.value).split("\n")
    assert lines[1] == "  f(x: float32,  y float32)"
    assert lines[2].index("^") - 2 == len("f(x: float32,\n y ")
    with pytest.raises(ValueError) as ei:
        Function(1, sig)
    assert str(ei.value).split("\n")[2].index("^") - 2 == 2


def test_signature_type():
    with pytest.raises(TypeError):
        Function(1, b"f()")
    with pytest.raises(TypeError):
        Function(1)


# ---- kernels: addresses, capsules, load() ---------------------------------------

def test_kernel_argument_errors(cdll):
    with pytest.raises(TypeError, match="int address or a PyCapsule"):
        Function("0x1234", "f()")
    with pytest.raises(TypeError):
        Function(True, "f()")
    with pytest.raises(ValueError, match="must not be 0"):
        Function(0, "f()")
    with pytest.raises((OverflowError, ValueError)):
        Function(-1 << 80, "f()")
    cap = capsule(addr(cdll, "dlb_kernel_noop"), b"not_a_kernel")
    with pytest.raises(TypeError, match="'not_a_kernel'"):
        Function(cap, "f()")
    cap = capsule(addr(cdll, "dlb_kernel_noop"), None)
    with pytest.raises(TypeError, match="unnamed"):
        Function(cap, "f()")


def test_capsule_and_address_kernels(cdll):
    a = addr(cdll, "dlb_kernel_saxpy")
    cap = capsule(a)
    before = sys.getrefcount(cap)
    fn = Function(cap, SAXPY)
    assert sys.getrefcount(cap) == before + 1   # the Function keeps it
    assert fn.address == a
    y = f32(1, 1)
    fn(2.0, f32(1, 2), y)
    np.testing.assert_array_equal(y, [3, 5])
    immortal = _immortal(fn)   # 3.13t, once a thread has run: kept for ever
    del fn
    if FREE_THREADED:
        gc.collect()
    assert sys.getrefcount(cap) == before + immortal
    fn = Function(a, SAXPY)
    fn(1, f32(1, 1), y)
    np.testing.assert_array_equal(y, [4, 6])


def test_load_errors(lib, tmp_path):
    with pytest.raises(OSError, match="cannot load"):
        load(str(tmp_path / "missing.so"), "dlb_kernel_noop", "f()")
    bad = tmp_path / "bad.so"
    bad.write_bytes(b"not an ELF file")
    with pytest.raises(OSError):
        load(bad, "dlb_kernel_noop", "f()")
    with pytest.raises(ValueError, match="dlb_kernel_nope"):
        load(lib, "dlb_kernel_nope", "f()")
    with pytest.raises(ValueError, match="expected ':'"):
        load(lib, "dlb_kernel_noop", "f(x float32)")
    with pytest.raises(TypeError):
        load(lib, b"dlb_kernel_noop", "f()")
    with pytest.raises(TypeError):
        load(lib, "dlb_kernel_noop")
    with pytest.raises(TypeError):
        load(lib, "dlb_kernel_noop", "f()", x=1)
    with pytest.raises(TypeError):
        load(1.5, "dlb_kernel_noop", "f()")


def test_load_pathlike_and_attributes(lib):
    fn = load(pathlib.Path(lib), "dlb_kernel_saxpy", SAXPY)
    assert isinstance(fn, Function)
    assert fn.name == fn.__name__ == "saxpy"
    assert fn.signature == SAXPY
    assert "saxpy(a: float32" in repr(fn)
    with pytest.raises(AttributeError):
        fn.signature = "x"


def test_library_outlives_other_functions(lib):
    # Two Functions from one path: dropping one must not unload the code the
    # other calls.
    f1 = load(lib, "dlb_kernel_saxpy", SAXPY)
    f2 = load(lib, "dlb_kernel_saxpy", SAXPY)
    del f1
    gc.collect()
    y = f32(0)
    f2(1, f32(5), y)
    assert y[0] == 5


# ---- calls: values and result types ----------------------------------------------

@pytest.fixture(scope="module")
def k(lib):
    class K:
        saxpy = load(lib, "dlb_kernel_saxpy", SAXPY)
        saxpy_out = load(lib, "dlb_kernel_saxpy_out", SAXPY_OUT)
        add3 = load(lib, "dlb_kernel_add3", ADD3)
        matmul = load(lib, "dlb_kernel_matmul", MATMUL)
    return K


def test_saxpy_numpy_in_place(k):
    x = np.arange(5, dtype=np.float32)
    y = np.ones(5, dtype=np.float32)
    assert k.saxpy(2.0, x, y) is None
    np.testing.assert_array_equal(y, 2 * np.arange(5) + 1)


def test_saxpy_strided_and_reversed(k):
    base = np.arange(20, dtype=np.float32)
    x = base[::4]                 # stride 4
    y = np.ones(10, dtype=np.float32)[::-2]   # negative stride
    ref = 3 * x + y
    k.saxpy(3, x, y)
    np.testing.assert_array_equal(y, ref)


def test_keywords(k):
    y = f32(1, 1)
    k.saxpy(x=f32(1, 2), a=1.0, y=y)
    np.testing.assert_array_equal(y, [2, 3])
    k.saxpy(1.0, f32(1, 2), y=y)
    np.testing.assert_array_equal(y, [3, 5])
    with pytest.raises(TypeError, match="unexpected keyword"):
        k.saxpy(1.0, f32(1, 2), z=y)
    with pytest.raises(TypeError, match="multiple values"):
        k.saxpy(1.0, f32(1, 2), a=1.0)
    with pytest.raises(TypeError, match="missing argument 'y'"):
        k.saxpy(1.0, x=f32(1, 2))
    with pytest.raises(TypeError, match="takes 3 arguments"):
        k.saxpy(1.0, f32(1), f32(1), y=f32(1))


def test_result_types_numpy_dlbridge_torch(k):
    x, y = f32(1, 2, 3), f32(1, 1, 1)
    out = k.saxpy_out(2.0, x, y)
    assert type(out) is np.ndarray
    np.testing.assert_array_equal(out, [3, 5, 7])
    np.testing.assert_array_equal(y, [1, 1, 1])   # not written

    tx, ty = dlbridge.from_dlpack(x), dlbridge.from_dlpack(y)
    out = k.saxpy_out(2.0, tx, ty)
    assert type(out) is dlbridge.Tensor
    assert out.tolist() == [3, 5, 7]
    assert out.shape == (3,) and out.dtype == "float32" and not out.readonly

    torch = pytest.importorskip("torch")
    out = k.saxpy_out(2.0, torch.tensor([1.0, 2, 3]), torch.ones(3))
    assert type(out) is torch.Tensor
    assert out.tolist() == [3, 5, 7]


def test_result_framework_follows_first_tensor_argument(k):
    torch = pytest.importorskip("torch")
    # a is a Python number: x is the first tensor argument
    out = k.saxpy_out(1.0, torch.ones(2), f32(1, 1))
    assert type(out) is torch.Tensor
    out = k.saxpy_out(1.0, f32(1, 1), torch.ones(2))
    assert type(out) is np.ndarray


def test_no_tensor_argument_gives_dlbridge_tensor(lib):
    fn = load(lib, "dlb_kernel_copy", "copy(a: float64) -> float64")
    out = fn(2.5)
    assert type(out) is dlbridge.Tensor
    assert out.shape == () and out.tolist() == 2.5


def test_torch_in_place(k):
    torch = pytest.importorskip("torch")
    x, y, z = torch.ones(4), torch.arange(4.0), torch.zeros(4)
    k.add3(x, y, z)
    assert z.tolist() == [1, 2, 3, 4]
    k.saxpy(torch.tensor(2.0), x, z)   # 0-d tensor for a 0-d parameter
    assert z.tolist() == [3, 4, 5, 6]


def test_dlbridge_in_place(k):
    x = dlbridge.tensor([1.0, 2.0], dtype="float32")
    z = dlbridge.zeros((2,))
    k.add3(x, x, z)
    assert z.tolist() == [2, 4]


@pytest.mark.parametrize("case", ["plain", "a_T", "b_T", "both_T", "sliced",
                                  "negative", "offset"])
def test_matmul_layouts(k, case):
    rng = np.random.default_rng(0)
    A = rng.standard_normal((6, 8), dtype=np.float32)
    B = rng.standard_normal((8, 5), dtype=np.float32)
    if case == "plain":
        a, b = A[:4, :3], B[:3, :]
        a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    elif case == "a_T":
        a, b = np.ascontiguousarray(A.T).T, B
    elif case == "b_T":
        a, b = A, np.ascontiguousarray(B.T).T
    elif case == "both_T":
        a, b = B.T, A.T     # (5, 8) @ (8, 6)
    elif case == "sliced":
        a, b = A[::2, 1::2], B[:8:2, ::2]
    elif case == "negative":
        a, b = A[::-1, ::-1], B[::-1, :]
    else:
        a, b = A[1:, 2:], B[2:, 1:]
    out = k.matmul(a, b)
    assert type(out) is np.ndarray
    assert out.shape == (a.shape[0], b.shape[1])
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


def test_matmul_torch_and_dlbridge(k):
    torch = pytest.importorskip("torch")
    a = torch.randn(7, 3)
    b = torch.randn(4, 3).t()
    out = k.matmul(a, b)
    assert type(out) is torch.Tensor
    torch.testing.assert_close(out, a @ b)
    da = dlbridge.from_dlpack(a.numpy().T)
    db = dlbridge.from_dlpack(np.ones((7, 2), np.float32))
    out = k.matmul(da, db)
    assert type(out) is dlbridge.Tensor
    # float32 sums against a float64 reference: sums near 0 need an
    # absolute tolerance too (randn inputs made this fail now and then)
    np.testing.assert_allclose(np.asarray(out), a.numpy().T @ np.ones((7, 2)),
                               rtol=1e-5, atol=1e-5)


def test_matmul_zero_size(k):
    out = k.matmul(np.zeros((0, 3), np.float32), np.zeros((3, 2), np.float32))
    assert out.shape == (0, 2)


def test_multiple_results(lib):
    fn = load(lib, "dlb_kernel_noop",
              "f(x: float32[n, m]) -> (float32[m, n], int64[], uint8[3, n])")
    r = fn(np.zeros((2, 5), np.float32))
    assert type(r) is tuple and len(r) == 3
    assert [type(t) for t in r] == [np.ndarray] * 3
    assert r[0].shape == (5, 2) and r[0].dtype == np.float32
    assert r[1].shape == () and r[1].dtype == np.int64
    assert r[2].shape == (3, 2) and r[2].dtype == np.uint8
    assert all(t.flags.writeable for t in r)


# ---- Python numbers for 0-d parameters ---------------------------------------------

@pytest.mark.parametrize("dtype,value,expect", [
    ("float32", 1.5, 1.5), ("float32", 3, 3.0), ("float32", True, 1.0),
    ("float64", 1e300, 1e300), ("float16", 0.5, 0.5), ("bfloat16", 1.5, 1.5),
    ("int8", -128, -128), ("int8", 127, 127), ("uint8", 255, 255),
    ("int16", -3, -3), ("uint16", 65535, 65535), ("int32", -2**31, -2**31),
    ("uint32", 2**32 - 1, 2**32 - 1), ("int64", -2**63, -2**63),
    ("uint64", 2**64 - 1, 2**64 - 1), ("bool", True, True), ("bool", 0, False),
    ("complex64", 1 + 2j, 1 + 2j), ("complex128", 2.5, 2.5 + 0j),
    ("complex128", -1j, -1j), ("float64", np.float64(0.25), 0.25),
])
def test_python_numbers(lib, dtype, value, expect):
    fn = load(lib, "dlb_kernel_copy", "copy(a: %s) -> %s" % (dtype, dtype))
    out = fn(value)
    assert out.dtype == dtype
    assert out.tolist() == expect


@pytest.mark.parametrize("dtype,value,exc", [
    ("int8", 128, OverflowError), ("int8", -129, OverflowError),
    ("uint8", -1, OverflowError), ("uint8", 256, OverflowError),
    ("uint64", 2**64, OverflowError), ("int64", 2**63, OverflowError),
    ("int32", 2**40, OverflowError), ("bool", 2, OverflowError),
    ("float32", 1e300, OverflowError), ("float16", 1e10, OverflowError),
    ("bfloat16", 1e300, OverflowError), ("float64", 10**400, OverflowError),
    ("int32", 1.5, TypeError), ("bool", 1.0, TypeError),
    ("float32", 1j, TypeError), ("int64", 1j, TypeError),
    ("float8_e4m3fn", 1.0, TypeError), ("float32x4", 1.0, TypeError),
])
def test_python_number_errors(lib, dtype, value, exc):
    fn = load(lib, "dlb_kernel_noop", "f(a: %s)" % dtype)
    with pytest.raises(exc, match="argument 'a'"):
        fn(value)


def test_python_numbers_special_floats(lib):
    fn = load(lib, "dlb_kernel_copy", "copy(a: float32) -> float32")
    assert fn(float("inf")).tolist() == float("inf")
    assert np.isnan(fn(float("nan")).tolist())
    fn = load(lib, "dlb_kernel_copy", "copy(a: bfloat16) -> bfloat16")
    assert np.isnan(fn(float("nan")).tolist())


def test_python_number_into_mut_or_nonscalar(lib, k):
    fn = load(lib, "dlb_kernel_noop", "f(a: mut float32)")
    with pytest.raises(TypeError, match="'mut'"):
        fn(1.0)
    fn(np.zeros((), np.float32))
    with pytest.raises(TypeError, match="argument 'x'"):
        k.saxpy(1.0, 2.0, f32(1))


# ---- argument errors -------------------------------------------------------------------

def test_wrong_count(k):
    with pytest.raises(TypeError, match=r"saxpy\(\) takes 3 arguments \(2 given\)"):
        k.saxpy(1.0, f32(1))
    with pytest.raises(TypeError, match=r"\(4 given\)"):
        k.saxpy(1.0, f32(1), f32(1), f32(1))
    with pytest.raises(TypeError, match=r"takes 4 arguments \(0 given\)"):
        Function(1, "g(a: int8, b: int8, c: int8, d: int8)")()


def test_wrong_dtype(k):
    with pytest.raises(TypeError, match="argument 'x': expected dtype float32, got float64"):
        k.saxpy(1.0, np.zeros(3), f32(0, 0, 0))
    with pytest.raises(TypeError, match="argument 'a': expected dtype float32, got int64"):
        k.saxpy(np.array(1), f32(0), f32(0))


def test_wrong_ndim(k):
    with pytest.raises(ValueError, match="argument 'y': expected 1 dimension, got 2"):
        k.saxpy(1.0, f32(1), np.zeros((1, 1), np.float32))
    with pytest.raises(ValueError, match="argument 'a': expected 2 dimensions, got 1"):
        k.matmul(f32(1), np.zeros((1, 1), np.float32))
    with pytest.raises(ValueError, match="argument 'a': expected 0 dimensions, got 1"):
        k.saxpy(f32(1), f32(1), f32(1))


def test_symbol_mismatch(k):
    with pytest.raises(ValueError, match="argument 'y': dimension n is 4 here but 3 from argument 'x'"):
        k.saxpy(1.0, f32(1, 2, 3), f32(1, 2, 3, 4))
    with pytest.raises(ValueError, match="argument 'b': dimension k is 4 here but 3 from argument 'a'"):
        k.matmul(np.zeros((2, 3), np.float32), np.zeros((4, 2), np.float32))


def test_literal_mismatch(lib):
    fn = load(lib, "dlb_kernel_noop", "f(x: float32[n, 3], y: float32[3, n])")
    fn(np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match="argument 'y': dimension 0 is 2 but the signature says 3"):
        fn(np.zeros((2, 3), np.float32), np.zeros((2, 2), np.float32))


def test_not_tensor_like(k):
    with pytest.raises(TypeError, match="saxpy\\(\\) argument 'x'"):
        k.saxpy(1.0, object(), f32(1))
    with pytest.raises(TypeError, match="argument 'a'"):
        k.saxpy("1.0", f32(1), f32(1))
    with pytest.raises(TypeError, match="argument 'y'"):
        k.saxpy(1.0, f32(1), None)


def test_readonly_into_mut(k):
    y = f32(1, 2)
    y.flags.writeable = False
    with pytest.raises(BufferError, match="argument 'y'"):
        k.saxpy(1.0, f32(1, 1), y)
    np.testing.assert_array_equal(y, [1, 2])
    # read-only inputs are fine
    k.saxpy(1.0, y, f32(0, 0))
    t = dlbridge.from_dlpack(y)
    assert t.readonly
    with pytest.raises(BufferError):
        k.add3(t, t, t)
    k.saxpy_out(1.0, t, t)


def test_device_mismatch(k, tp):
    # A producer that says its memory is on CUDA: the device check must stop
    # the call before anything reads it.
    p = tp.Producer(shape=(2,), strides=(1,), dtype=(2, 32, 1), device=(2, 0))
    try:
        k.add3(f32(1, 2), p, f32(0, 0))
    except (BufferError, TypeError) as e:
        # importing a CUDA tensor needs a CUDA runtime this machine may lack
        pytest.skip("cannot view a CUDA producer here: %s" % e)
    except ValueError as e:
        assert "argument 'y' is on cuda:0 but argument 'x' is on cpu" in str(e)
    else:
        pytest.fail("device mismatch not detected")
    gc.collect()
    assert tp.stray_deleter_calls() == 0


def test_views_released_once(k, tp):
    p = tp.Producer(shape=(3,), strides=(1,), dtype=(2, 32, 1), fill=True)
    y = f32(0, 0, 0)
    for _ in range(50):
        k.saxpy(1.0, p, y)
    with pytest.raises(ValueError):
        k.saxpy(1.0, p, f32(0))
    gc.collect()
    assert p.live_exports == 0
    assert tp.stray_deleter_calls() == 0


# ---- kernel errors -------------------------------------------------------------------

def test_kernel_error_message(lib):
    fn = load(lib, "dlb_kernel_fail", "mine(x: float32[n]) -> float32[n]")
    with pytest.raises(ValueError, match="^mine: fail was given 2 tensors and refuses them all$"):
        fn(f32(1, 2))
    fn = load(lib, "dlb_kernel_unsupported", "other(x: float32[n])")
    with pytest.raises(BufferError, match="other: the kernel failed with DLB_EUNSUPPORTED"):
        fn(f32(1, 2))


def test_kernel_positive_status(lib):
    fn = load(lib, "dlb_kernel_bad_status", "bad(x: float32[n]) -> float32[n]")
    with pytest.raises(RuntimeError, match="bad: the kernel returned 7"):
        fn(f32(1))


def test_kernel_error_frees_results(lib):
    # 4 MiB of results per failing call: if their deleters did not run, RSS
    # would grow by ~1.6 GiB over 400 calls; running twice would crash.
    fn = load(lib, "dlb_kernel_fail",
              "f(x: float32[n]) -> (float32[n, 1024], float32[n, 1024])")
    x = np.zeros(512, np.float32)
    for _ in range(20):
        with pytest.raises(ValueError):
            fn(x)
    before = _rss()
    for _ in range(400):
        with pytest.raises(ValueError):
            fn(x)
    assert _rss() - before < 200 << 20


def test_kernel_error_frees_results_torch(lib):
    torch = pytest.importorskip("torch")
    fn = load(lib, "dlb_kernel_fail", "f(x: float32[n]) -> float32[n, 1024]")
    x = torch.zeros(1024)
    before = _rss()
    for _ in range(400):
        with pytest.raises(ValueError):
            fn(x)
    assert _rss() - before < 200 << 20


# ---- leaks -------------------------------------------------------------------------------

def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("framework", ["numpy", "dlbridge", "torch"])
def test_no_leak_over_many_calls(k, framework):
    if framework == "torch":
        torch = pytest.importorskip("torch")
        mk = lambda: torch.ones(8)                          # noqa: E731
    elif framework == "numpy":
        mk = lambda: np.ones(8, np.float32)                 # noqa: E731
    else:
        mk = lambda: dlbridge.zeros((8,))                   # noqa: E731
    x, y, z = mk(), mk(), mk()
    refs = [sys.getrefcount(o) for o in (x, y, z)]
    for _ in range(1000):
        k.add3(x, y, z)
        k.saxpy_out(2.0, x, y)
    before = _rss()
    import tracemalloc
    tracemalloc.start()
    snap = tracemalloc.take_snapshot()
    for _ in range(100_000):
        k.add3(x, y, z)
    for _ in range(20_000):
        k.saxpy_out(2.0, x, y)
    grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(snap, "filename"))
    tracemalloc.stop()
    assert grown < 64 << 10
    assert _rss() - before < 16 << 20
    assert [sys.getrefcount(o) for o in (x, y, z)] == refs


def test_no_leak_on_error_paths(k):
    x = f32(1, 2, 3)
    refs = sys.getrefcount(x)
    for _ in range(2000):
        with pytest.raises(ValueError):
            k.saxpy(1.0, x, f32(1))
        with pytest.raises(TypeError):
            k.saxpy(1.0, x, object())
        with pytest.raises(OverflowError):
            k.saxpy(1e300, x, x)
    assert sys.getrefcount(x) == refs


def _immortal(obj):
    """Whether obj's reference count is never written (CPython 3.12+)."""
    if hasattr(sys, "_is_immortal"):  # 3.14+
        return sys._is_immortal(obj)
    return sys.getrefcount(obj) >= 2**32 - 1  # 3.13t's immortal local count


def _freed(ref):
    """Whether the object behind weakref ref is gone once nothing holds it:
    at its last reference on a GIL build; on a free-threaded one a Function
    has deferred reference counting (as CPython's own functions do there),
    so the collector frees it."""
    if FREE_THREADED:
        gc.collect()
    return ref() is None


def test_function_is_collected(lib):
    import weakref
    fn = load(lib, "dlb_kernel_noop", "f()")
    # 3.13t makes a Function immortal once a second thread has run in the
    # process (test_function_refcounting_per_build says when)
    immortal = _immortal(fn)
    assert not immortal or FT313
    r = weakref.ref(fn)
    assert fn() is None
    del fn
    assert _freed(r) != immortal


# What each build does with a Function's reference count (issue 26 item 5:
# threads calling one Function must not all write it), in a fresh process
# so that no thread has run before: GIL builds count as ever and free it
# at once; free-threaded ones give it deferred reference counting, the
# collector freeing it; and 3.13t, like its own module-level functions,
# makes every Function immortal once a second thread starts -- those made
# before (the sweep) and after (at once).
_REFCOUNTING = """
import gc, sys, threading, weakref
import dlbridge
lib = sys.argv[1]
def immortal(o):
    if hasattr(sys, "_is_immortal"):
        return sys._is_immortal(o)
    return sys.getrefcount(o) >= 2**32 - 1
kept = dlbridge.load(lib, "dlb_kernel_noop", "f()")
dropped = dlbridge.load(lib, "dlb_kernel_noop", "f()")
r = weakref.ref(dropped)
del dropped
at_del = r() is None
gc.collect()
at_gc = r() is None
before = immortal(kept)
calls = []
t = threading.Thread(target=lambda: calls.append(kept()))
t.start(); t.join()
made_after = dlbridge.load(lib, "dlb_kernel_noop", "f()")
print(at_del, at_gc, before, immortal(kept), immortal(made_after), calls == [None])
"""


def test_function_refcounting_per_build(lib):
    import subprocess
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", _REFCOUNTING, lib], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = out.stdout.split()
    if not FREE_THREADED:
        want = ["True", "True", "False", "False", "False", "True"]
    elif FT313:
        want = ["False", "True", "False", "True", "True", "True"]
    else:  # 3.14t+: deferred, never made immortal
        want = ["False", "True", "False", "False", "False", "True"]
    assert got == want


@pytest.mark.parametrize("n", [7, 8, 9, 64])
def test_large_signatures_use_heap_scratch(lib, n):
    """Up to 8 parameters and results the call's arrays are on the stack,
    beyond that in one heap block: both give the same checks and errors."""
    sig = "f(" + ", ".join("a%d: float32[k]" % i for i in range(n - 1)) + ") -> float32[k]"
    fn = load(lib, "dlb_kernel_noop", sig)
    xs = [np.ones(3, np.float32) for _ in range(n - 1)]
    out = fn(*xs)
    assert out.shape == (3,)
    xs[-1] = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="a%d" % (n - 2)):
        fn(*xs)
    with pytest.raises(TypeError, match="takes %d arguments" % (n - 1)):
        fn(*xs[:-1])
    kw = {"a%d" % i: np.ones(3, np.float32) for i in range(n - 1)}
    assert fn(**kw).shape == (3,)


def test_torch_lazy_bits_read_on_the_fast_path(k):
    """Function checks every torch argument for torch's lazy conj/neg bits;
    asking the tensor costs ~50 ns a question, so the bits are read from
    torch's TensorImpl at offsets found by an experiment (torchbits.c).
    This fails when that experiment stops working with an installed torch
    (the check is then still right, only slow)."""
    torch = pytest.importorskip("torch")
    a = torch.ones(4)
    k.saxpy(1.0, a, torch.zeros(4))
    assert dlbridge._core._torch_bits_state() == 1


def test_torch_bits_force_hook():
    """The private hook the tests use to run torch's checks both ways: -1
    asks every tensor; 1 only where the experiment found the bits."""
    torch = pytest.importorskip("torch")
    from dlbridge import _core
    dlbridge.from_dlpack(torch.zeros(1))
    found = _core._torch_bits_state()
    try:
        assert _core._torch_bits_force(-1) == found
        assert _core._torch_bits_state() == -1
        with pytest.raises(BufferError, match="negative"):
            dlbridge.from_dlpack(torch._neg_view(torch.ones(2)))
        with pytest.raises(ValueError):
            _core._torch_bits_force(2)
    finally:
        _core._torch_bits_force(found)
    assert _core._torch_bits_state() == found


# ---- torch autograd: in-place writes are counted -------------------------------

def test_mut_write_moves_torch_version_counter(k):
    """Issue 15: a `mut` write into a tensor autograd saved went unseen:
    backward() silently used the new values (a wrong w.grad), where torch's
    own in-place write makes backward raise.  The version counter of every
    `mut` torch argument now moves; inputs that are only read keep theirs."""
    torch = pytest.importorskip("torch")
    w = torch.ones(3, requires_grad=True)
    x = torch.tensor([1.0, 2.0, 3.0])
    y = x * w                          # saves x for w's gradient
    v0 = x._version
    k.saxpy(1.0, torch.ones(3), x)     # x += 1, behind autograd's back
    assert x._version > v0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    # read, not written: no version change, backward works
    w.grad = None
    x = torch.tensor([1.0, 2.0, 3.0])
    y = x * w
    k.saxpy(1.0, x, torch.zeros(3))
    assert x._version == 0
    y.sum().backward()
    assert w.grad.tolist() == [1.0, 2.0, 3.0]


def test_mut_write_moves_view_base_and_failed_kernel_counts(lib, k):
    """A view shares its base's counter; a kernel that failed may have
    written first, so its `mut` arguments count as written too; an
    inference tensor has no counter and is written as before."""
    torch = pytest.importorskip("torch")
    base = torch.zeros(8)
    k.saxpy(1.0, torch.ones(4), base[::2])
    assert base._version == 1
    assert base.tolist() == [1, 0, 1, 0, 1, 0, 1, 0]
    fail = load(lib, "dlb_kernel_fail", SAXPY)
    y = torch.zeros(2)
    with pytest.raises(ValueError, match="fail was given"):
        fail(1.0, torch.ones(2), y)
    assert y._version == 1
    with torch.inference_mode():
        inf = torch.zeros(2)
    k.saxpy(2.0, torch.ones(2), inf)
    assert inf.tolist() == [2.0, 2.0]


# ---- mut on frameworks whose arrays are immutable --------------------------------

def _immutable(name):
    if name == "jax":
        jnp = pytest.importorskip("jax.numpy")
        return lambda a: jnp.asarray(np.asarray(a, np.float32)), np.asarray
    tf = pytest.importorskip("tensorflow")
    return (lambda a: tf.constant(np.asarray(a, np.float32)),
            lambda t: t.numpy())


@pytest.mark.parametrize("framework", ["jax", "tensorflow"])
def test_mut_on_immutable_framework_returns_new_value(k, lib, framework):
    """Issue 16 (item 5, eager): an eager `mut` call wrote into a JAX (or
    TensorFlow) array, whose arrays are immutable.  The caller's array is
    never written: the kernel writes a copy its framework allocated, whose
    value comes back after the declared results."""
    make, host = _immutable(framework)
    x, y = make([0, 1, 2, 3]), make([1, 1, 1, 1])
    r = k.saxpy(2.0, x, y)                       # no declared result
    assert type(r) is type(y)
    np.testing.assert_array_equal(host(r), [1, 3, 5, 7])
    np.testing.assert_array_equal(host(y), [1, 1, 1, 1])   # not written
    z = make([0, 0, 0, 0])
    r = k.add3(x, y, z)
    np.testing.assert_array_equal(host(r), [1, 2, 3, 4])
    np.testing.assert_array_equal(host(z), [0, 0, 0, 0])
    # declared results first, then the new values, in parameter order
    both = load(lib, "dlb_kernel_noop",
                "g(x: float32[n], y: mut float32[n], z: mut float32[n]) "
                "-> float32[n]")
    out, new_y, new_z = both(x, y, z)
    assert type(out) is type(new_y) is type(new_z) is type(y)
    np.testing.assert_array_equal(host(new_y), [1, 1, 1, 1])
    np.testing.assert_array_equal(host(new_z), [0, 0, 0, 0])
    # a NumPy first argument: results in NumPy, the new value in its own
    # framework; a NumPy `mut` argument is still written in place
    out, new_y = both(np.zeros(4, np.float32), y, np.zeros(4, np.float32))
    assert type(out) is np.ndarray and type(new_y) is type(y)
    yn = np.ones(4, np.float32)
    assert k.saxpy(2.0, x, yn) is None
    np.testing.assert_array_equal(yn, [1, 3, 5, 7])


def test_mut_on_immutable_framework_kernel_failure(lib):
    """A failing kernel leaves the caller's JAX array as it was, and the
    copy is freed."""
    jnp = pytest.importorskip("jax.numpy")
    fail = load(lib, "dlb_kernel_fail", SAXPY)
    y = jnp.ones(4, jnp.float32)
    for _ in range(3):
        with pytest.raises(ValueError, match="fail was given"):
            fail(1.0, jnp.ones(4, jnp.float32), y)
    np.testing.assert_array_equal(np.asarray(y), [1, 1, 1, 1])


def test_mut_on_immutable_framework_no_leak(k):
    """Each call's copy becomes its result or is freed: no growth over many
    calls, the arguments' reference counts unchanged."""
    jnp = pytest.importorskip("jax.numpy")
    x, y, z = (jnp.ones(256, jnp.float32) for _ in range(3))
    refs = [sys.getrefcount(o) for o in (x, y, z)]
    # Counted in dlbridge's own allocations (the copy and its export are
    # made by the core allocator): jaxlib 0.10.2's importer itself keeps
    # ~90 bytes per array it imports, from NumPy as from anyone, so RSS
    # would measure JAX.
    for _ in range(10):
        k.add3(x, y, z)
    gc.collect()
    _core._fail_allocations(-1)
    try:
        for _ in range(1000):
            k.add3(x, y, z)
        gc.collect()
        stats = _core._allocation_stats()
    finally:
        _core._reset_allocations()
    assert stats["attempts"] >= 1000 and stats["live"] == 0, stats
    assert [sys.getrefcount(o) for o in (x, y, z)] == refs


# ---- JAX arrays through their buffer protocol ------------------------------------

def test_jax_read_through_buffer_then_dlpack(lib):
    """Issue 16 (item 9): a JAX array is read through its buffer protocol
    (zero-copy, read-only, several times cheaper than __dlpack__); what the
    buffer refuses -- bfloat16, fp8, sub-byte types; arrays off the host --
    is read through __dlpack__, with the same values."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    BUFFER_DLPACK = 8
    assert _core._exchange_handler(jnp.ones(1))[:2] == (BUFFER_DLPACK, "jax")
    for dtype in ("float32", "float16", "complex64", "int8", "bool",
                  "bfloat16", "float8_e4m3fn"):
        copy = load(lib, "dlb_kernel_copy",
                    "copy(x: %s[n, m]) -> %s[n, m]" % (dtype, dtype))
        x = jnp.arange(6).reshape(2, 3).astype(dtype)
        y = copy(x)
        assert type(y) is type(x) and y.dtype == x.dtype
        assert (y == x).all(), (dtype, y, x)
        # read zero-copy, through the buffer where it can: the array's own
        # memory (the address its __dlpack__ gives), read-only
        v = _core._exchange_view(x, 0, 0)
        assert v["buffer"] == (dtype not in ("bfloat16", "float8_e4m3fn"))
        assert v["data"] == dlbridge.from_dlpack(x).data_ptr
        if v["buffer"]:   # the buffer export is read-only (READ_ONLY);
            assert v["flags"] & 1   # __dlpack__'s says what JAX says


def test_jax_buffer_kept_alive_for_the_call(k):
    """The buffer export holds the array's memory for the call: a later
    argument's producer that deletes the array and allocates over its
    memory does not change what the kernel reads."""
    jnp = pytest.importorskip("jax.numpy")
    x = jnp.arange(1 << 16, dtype=jnp.float32)
    yb = np.zeros(1 << 16, np.float32)
    junk = []

    class Later:
        def __dlpack__(self, **kw):
            x.delete()
            junk.extend(jnp.full(1 << 16, 7.0) for _ in range(8))
            return yb.__dlpack__(**kw)

        def __dlpack_device__(self):
            return (1, 0)

    k.saxpy(1.0, x, Later())
    np.testing.assert_array_equal(yb, np.arange(1 << 16, dtype=np.float32))


def test_jax_results_equal_the_public_import(lib):
    """Results go to JAX through jaxlib's importer, called directly on the
    host (jax.dlpack.from_dlpack spends ~40 us of Python around it): each
    is what jax.dlpack.from_dlpack gives -- type, dtype (64-bit ones
    canonicalised as JAX does), shape, values."""
    jax = pytest.importorskip("jax")
    for dtype in ("float32", "float64", "bfloat16", "bool", "complex64",
                  "int64", "uint8"):
        for x in (dlbridge.tensor([[0, 1, 1], [1, 0, 1]], dtype=dtype),
                  dlbridge.zeros((0, 3), dtype=dtype),
                  dlbridge.tensor(1, dtype=dtype)):
            want = jax.dlpack.from_dlpack(dlbridge.from_dlpack(x))
            got = dlbridge.convert(x, "jax")
            assert type(got) is type(want)
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    copy = load(lib, "dlb_kernel_copy", "copy(x: float32[n]) -> float32[n]")
    y = copy(jax.numpy.arange(3.0, dtype="float32"))
    assert isinstance(y, jax.Array) and y.tolist() == [0.0, 1.0, 2.0]
