"""Interoperability matrix: dlbridge against NumPy, PyTorch, JAX, TensorFlow
and PyArrow, in both directions, for every dtype and layout each pair shares.

Every case checks three things that can each fail on their own:

* the data pointer: element 0 of the result is element 0 of the source, as
  the *other* framework reports it (``__array_interface__``, ``data_ptr()``,
  ``unsafe_buffer_pointer()``, an independent DLPack import, ``address``);
* the layout: shape, strides (in elements) and dtype;
* the values, bit for bit: both sides are read back as unsigned integers of
  the element size and compared with a NumPy reference built from the same
  bits (exact even for float8, bfloat16 and -0.0).

Layouts are (shape, strides, offset) in elements over one 256-element base
buffer, so the same description builds the NumPy reference, a NumPy view, a
torch view and a dlbridge view.  JAX and TensorFlow arrays are always compact
row-major, so for them only compact layouts exist on their side; the
non-compact layouts are checked to be refused loudly (or, for JAX, copied
where JAX documents a copy).

What other test files already cover is not repeated here: the deleter and
capsule rules (test_export.py, test_import.py, test_producer_cases.py),
convert's copy rules (test_convert.py).  The issue-17 peers (Paddle, tvm-ffi,
onnxruntime, MLX, Warp, Open3D, Dr.Jit, array-api-strict) are at the end,
their cases in _peer_cases.py.
"""

import ctypes
import gc
import os
import subprocess
import sys
import textwrap

import pytest

import dlbridge as dlb
from dlbridge._frameworks import REGISTRY

np = pytest.importorskip("numpy", reason="the interop matrix is built on NumPy")
from numpy.lib.stride_tricks import as_strided  # noqa: E402

N = 256  # elements in every base buffer

# name -> (shape, strides, offset), in elements, over a base of N elements.
LAYOUTS = {
    "contiguous": ((3, 4), (4, 1), 0),
    "transposed": ((4, 3), (1, 4), 0),
    "offset": ((2, 3), (4, 1), 5),               # a[1:, 1:] of a 3x4
    "step": ((3, 2), (8, 3), 1),                 # non-unit strides everywhere
    "negative": ((3, 4), (-4, -1), 11),          # a[::-1, ::-1]
    "negative_T": ((4, 3), (1, -4), 8),          # mixed signs
    "broadcast": ((3, 4), (0, 1), 2),            # expand / broadcast_to
    "zero_d": ((), (), 7),
    "zero_size": ((0, 3), (3, 1), 0),
    "zero_size_inner": ((2, 0), (1, 1), 0),
    "size1_odd": ((3, 1, 4), (4, 7, 1), 0),      # odd stride on a size-1 dim
    "ndim8": ((2,) * 8, tuple(2 ** i for i in range(8)), 0),      # reversed
    "ndim8_contiguous": ((2,) * 8, tuple(2 ** (7 - i) for i in range(8)), 0),
}
NEGATIVE = {"negative", "negative_T"}
NON_NEGATIVE = [k for k in LAYOUTS if k not in NEGATIVE]
# Compact row-major shapes: what JAX, TensorFlow and pyarrow arrays can be.
COMPACT_SHAPES = {
    "contiguous": (3, 4),
    "zero_d": (),
    "zero_size": (0, 3),
    "size1": (3, 1, 4),
    "ndim8": (2,) * 8,
}

NUMPY_DTYPES = [
    "bool", "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
]
TORCH_DTYPES = NUMPY_DTYPES + [
    "bfloat16", "float8_e4m3fn", "float8_e5m2",
    "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
]
JAX_DTYPES = NUMPY_DTYPES + [
    "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
    "float8_e5m2fnuz", "float8_e4m3b11fnuz", "float8_e3m4", "float8_e4m3",
    "float8_e8m0fnu",
]
# TensorFlow's DLPack bridge knows no float8 ("DT_FLOAT8_E4M3FN is not
# supported by dlpack", TF 2.21).
TF_DTYPES = NUMPY_DTYPES + ["bfloat16"]
# pyarrow exports bit-packed booleans and complex not at all.
ARROW_DTYPES = [
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64",
]

MiB = 1 << 20


# ---- frameworks, imported once per module ------------------------------------------


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip(
        "torch", reason="PyTorch is not installed: torch rows of the matrix")


@pytest.fixture(scope="module")
def jax():
    jax = pytest.importorskip(
        "jax", reason="JAX is not installed: jax rows of the matrix")
    import jax.dlpack  # noqa: F401
    # 64-bit dtypes only exist in JAX with x64 on; put the flag back after.
    old = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", True)
    yield jax
    jax.config.update("jax_enable_x64", old)


@pytest.fixture(scope="module")
def tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    tf = pytest.importorskip(
        "tensorflow", reason="TensorFlow is not installed: tf rows of the matrix")
    import tensorflow.experimental.dlpack  # noqa: F401
    return tf


@pytest.fixture(scope="module")
def pa():
    return pytest.importorskip(
        "pyarrow", reason="pyarrow is not installed: arrow rows of the matrix")


# ---- reference data -------------------------------------------------------------


def np_dtype(name):
    """The NumPy dtype holding dlbridge dtype ``name`` (ml_dtypes for the
    types NumPy lacks)."""
    if name in NUMPY_DTYPES:
        return np.dtype(name)
    ml_dtypes = pytest.importorskip(
        "ml_dtypes", reason="ml_dtypes is needed for %s reference data" % name)
    return np.dtype(getattr(ml_dtypes, name))


def ref_values(name):
    """N elements of dtype ``name``, distinct where the type allows, spanning
    the whole bit range for integers, exact for floats."""
    i = np.arange(N, dtype=np.uint64)
    dt = np_dtype(name)
    if name == "bool":
        return (i % 3 == 0)
    if dt.kind in "iu":
        bits = dt.itemsize * 8
        mixed = (i * np.uint64(2654435761) + np.uint64(12345)) & np.uint64(
            (1 << bits) - 1 if bits < 64 else 0xFFFFFFFFFFFFFFFF)
        return mixed.astype(np.dtype("u%d" % dt.itemsize)).view(dt)
    k = i.astype(np.int64) - 128
    if dt.kind == "c":
        return (k * 0.375 + 1j * ((k % 7) - 3)).astype(dt)
    if name == "float8_e8m0fnu":  # powers of two only, no zero, no sign
        return (2.0 ** ((k % 32) - 16)).astype(dt)
    if name.startswith("float8") or name == "bfloat16":
        return (((k % 32) - 16) * 0.25).astype(np.float32).astype(dt)
    return (k * 0.375).astype(dt)  # float16/32/64: exact


def strided(arr, layout, writeable=True):
    """A view of 1-d ``arr`` with ``layout``.  as_strided goes through the
    array interface, which loses ml_dtypes types: stride plain integers of
    the same size and view the result back."""
    shape, strides, off = LAYOUTS[layout]
    it = arr.itemsize
    native = arr.dtype.name in NUMPY_DTYPES
    plain = arr if native else arr.view("u%d" % it)
    v = as_strided(plain[off:], shape, tuple(s * it for s in strides),
                   writeable=writeable)
    return v if native else v.view(arr.dtype)


def expected_view(ref, layout):
    return strided(ref, layout, writeable=False)


def bits(a):
    """A same-layout view of ``a`` as unsigned integers of its item size, for
    exact comparison (void and ml_dtypes items included).  16-byte items
    (complex128) are compared by value: the references hold no NaN."""
    a = np.asarray(a)
    if a.dtype.itemsize in (1, 2, 4, 8):
        return a.view(np.dtype("u%d" % a.dtype.itemsize))
    return a


def assert_values(actual, expected):
    """``actual`` (any array-like NumPy can view) holds ``expected``'s bits."""
    actual = np.asarray(actual)
    assert actual.shape == expected.shape
    assert actual.dtype.itemsize == expected.dtype.itemsize
    assert np.array_equal(bits(actual), bits(expected))


def assert_dlb_values(t, expected):
    """dlbridge's own readers (the array interface and tolist) see ``expected``."""
    assert_values(t, expected)  # through Tensor.__array_interface__
    if not t.dtype.name.startswith("float8"):  # no Python number holds them
        want = expected.astype(np.float64) if t.dtype == "bfloat16" else expected
        assert t.tolist() == want.tolist()


def elem_strides(a):
    return tuple(s // a.itemsize for s in a.strides)


def row_major(shape):
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


def np_ptr(a):
    return a.__array_interface__["data"][0]


def dlb_base(name):
    """A dlbridge-owned (256-byte aligned) tensor of the N reference values."""
    ref = ref_values(name)
    base = dlb.empty((N,), dtype=name)
    ctypes.memmove(base.data_ptr, ref.ctypes.data, ref.nbytes)
    return base, ref


def dlb_compact(name, shape):
    """A dlbridge-owned compact tensor of the first prod(shape) values."""
    ref = ref_values(name)
    n = int(np.prod(shape, dtype=np.int64))
    t = dlb.empty(shape, dtype=name)
    if n:
        ctypes.memmove(t.data_ptr, ref.ctypes.data, n * ref.itemsize)
    return t, ref[:n].reshape(shape)


def dlb_view_numpy(name, layout):
    """A dlbridge view with ``layout`` over dlbridge-owned memory, made through
    a NumPy view (NumPy dtypes, any layout, negative strides included)."""
    base, ref = dlb_base(name)
    nb = np.from_dlpack(base)
    off = LAYOUTS[layout][2]
    t = dlb.from_dlpack(strided(nb, layout))
    assert t.data_ptr == base.data_ptr + off * nb.itemsize
    return t, expected_view(ref, layout)


# ---- NumPy <-> dlbridge ----------------------------------------------------------


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", NUMPY_DTYPES)
def test_numpy_to_dlbridge_and_back(name, layout):
    ref = ref_values(name).copy()
    a = strided(ref, layout)
    t = dlb.from_dlpack(a)
    assert t.data_ptr == np_ptr(a)
    assert t.shape == a.shape and t.dtype == name
    assert t.strides == elem_strides(a)
    assert not t.readonly
    assert_dlb_values(t, expected_view(ref_values(name), layout))
    back = np.from_dlpack(t)
    assert np_ptr(back) == np_ptr(a)
    assert back.strides == a.strides and back.dtype == a.dtype
    assert back.flags.writeable
    assert_values(back, a)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", NUMPY_DTYPES)
def test_dlbridge_to_numpy(name, layout):
    t, want = dlb_view_numpy(name, layout)
    r = np.from_dlpack(t)
    assert np_ptr(r) == t.data_ptr
    assert r.shape == t.shape and elem_strides(r) == t.strides
    assert r.dtype == np.dtype(name)
    assert_values(r, want)
    # Writes go through to the dlbridge memory (no hidden copy).
    if r.size and layout != "broadcast":
        r.flat[0] = r.flat[-1]
        assert bits(np.asarray(t)).flat[0] == bits(want).flat[-1]


# ---- torch <-> dlbridge ----------------------------------------------------------


_TORCH_INT = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}


def torch_dtype(torch, name):
    return getattr(torch, name)


def torch_bits(torch, x):
    """A NumPy array with the bits of torch tensor ``x``, same layout."""
    if x.dtype.is_complex:
        return x.resolve_conj().numpy()
    return x.view(getattr(torch, _TORCH_INT[x.element_size()])).numpy()


def torch_base(torch, name):
    ref = ref_values(name).copy()
    if name == "bool":
        x = torch.from_numpy(ref)
    elif ref.dtype.kind == "c":
        x = torch.from_numpy(ref)
    else:
        x = torch.from_numpy(ref.view("i%d" % ref.itemsize)).view(
            torch_dtype(torch, name))
    return x, ref


@pytest.mark.parametrize("via", ["exchange_api", "capsule"])
@pytest.mark.parametrize("layout", NON_NEGATIVE)
@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_torch_to_dlbridge_and_back(torch, name, layout, via):
    base, ref = torch_base(torch, name)
    shape, strides, off = LAYOUTS[layout]
    x = torch.as_strided(base, shape, strides, off)
    # The object goes through torch's C exchange table; the capsule through
    # torch's own __dlpack__ (versioned).
    src = x if via == "exchange_api" else x.__dlpack__(max_version=(1, 0))
    t = dlb.from_dlpack(src)
    assert t.data_ptr == x.data_ptr()
    assert t.shape == tuple(x.shape) and t.strides == tuple(x.stride())
    assert t.dtype == name and not t.readonly
    assert_dlb_values(t, expected_view(ref, layout))
    back = torch.from_dlpack(t)
    assert back.data_ptr() == x.data_ptr()
    assert back.dtype == x.dtype and back.stride() == x.stride()
    assert back.shape == x.shape
    assert_values(torch_bits(torch, back), expected_view(ref, layout))


def dlb_view_torch(torch, name, layout):
    """A dlbridge view with ``layout`` over dlbridge-owned memory, for any
    torch dtype (made through a torch view, so no negative strides)."""
    base, ref = dlb_base(name)
    shape, strides, off = LAYOUTS[layout]
    v = torch.as_strided(torch.from_dlpack(base), shape, strides, off)
    t = dlb.from_dlpack(v)
    if t.size:  # torch exports NULL for an empty view
        assert t.data_ptr == base.data_ptr + off * base.itemsize
    return t, expected_view(ref, layout)


@pytest.mark.parametrize("via", ["exchange_api", "capsule"])
@pytest.mark.parametrize("layout", NON_NEGATIVE)
@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_dlbridge_to_torch(torch, name, layout, via):
    t, want = dlb_view_torch(torch, name, layout)
    src = t if via == "exchange_api" else t.__dlpack__(max_version=(1, 0))
    y = torch.from_dlpack(src)
    assert y.data_ptr() == t.data_ptr
    assert y.dtype == torch_dtype(torch, name)
    assert tuple(y.shape) == t.shape and tuple(y.stride()) == t.strides
    assert_values(torch_bits(torch, y), want)
    del t  # y keeps the dlbridge memory alive (freed by refcount now)
    assert_values(torch_bits(torch, y), want)


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_torch_complex32_round_trip(torch):
    # complex32 has no NumPy/ml_dtypes twin: check it against torch itself.
    re = torch.arange(12, dtype=torch.float32)
    x = torch.complex(re, -re).reshape(3, 4).to(torch.complex32).T
    t = dlb.from_dlpack(x)
    assert t.dtype == "complex32" and t.data_ptr == x.data_ptr()
    assert t.strides == tuple(x.stride())
    assert t.tolist() == x.to(torch.complex64).tolist()
    y = torch.from_dlpack(t)
    assert y.dtype == torch.complex32 and y.data_ptr() == x.data_ptr()
    assert torch.equal(y.view(torch.int32), x.view(torch.int32))


# ---- JAX <-> dlbridge ------------------------------------------------------------


def jax_ptr(x):
    return x.unsafe_buffer_pointer()


@pytest.mark.parametrize("layout", list(COMPACT_SHAPES))
@pytest.mark.parametrize("name", JAX_DTYPES)
def test_jax_to_dlbridge_and_back(jax, name, layout):
    shape = COMPACT_SHAPES[layout]
    n = int(np.prod(shape, dtype=np.int64))
    want = ref_values(name)[:n].reshape(shape)
    x = jax.numpy.asarray(want)
    assert x.dtype == np_dtype(name)
    t = dlb.from_dlpack(x)
    if n:
        assert t.data_ptr == jax_ptr(x)
    assert t.shape == shape and t.dtype == name
    assert t.strides == row_major(shape)
    assert_dlb_values(t, want)
    back = jax.dlpack.from_dlpack(t)
    # JAX's buffers are 64-byte aligned and compact: it takes them back
    # without a copy.
    if n:
        assert jax_ptr(back) == jax_ptr(x)
    assert back.dtype == x.dtype and back.shape == x.shape
    assert_values(np.asarray(back), want)


@pytest.mark.parametrize("layout", list(COMPACT_SHAPES))
@pytest.mark.parametrize("name", JAX_DTYPES)
def test_dlbridge_to_jax(jax, name, layout):
    t, want = dlb_compact(name, COMPACT_SHAPES[layout])
    assert t.data_ptr % 256 == 0
    y = jax.dlpack.from_dlpack(t)
    # dlbridge memory is 256-byte aligned and compact: JAX must not copy.
    if t.size:
        assert jax_ptr(y) == t.data_ptr
    assert y.dtype == np_dtype(name) and y.shape == t.shape
    assert_values(np.asarray(y), want)
    del t  # y keeps the dlbridge memory alive (freed by refcount now)
    assert_values(np.asarray(y), want)


@pytest.mark.parametrize("layout", ["offset", "step", "negative", "negative_T",
                                    "broadcast"])
def test_dlbridge_non_compact_into_jax_copies(jax, layout):
    # JAX imports only compact data (or a transposition of it): convert
    # copies the rest into compact, aligned memory (gh-17); copy=False is a
    # BufferError naming jax.
    t, want = dlb_view_numpy("float32", layout)
    y = dlb.convert(t, "jax")
    assert y.shape == t.shape
    assert_values(np.asarray(y), want)
    with pytest.raises(BufferError, match="jax"):
        dlb.convert(t, "jax", copy=False)


@pytest.mark.parametrize("layout", ["transposed", "ndim8"])
def test_dlbridge_transposed_into_jax_copies(jax, layout):
    # A transposition of compact data is accepted by JAX, which makes its own
    # row-major copy: values right, the pointer legitimately differs.
    t, want = dlb_view_numpy("float64", layout)
    y = dlb.convert(t, "jax")
    assert y.shape == t.shape
    assert_values(np.asarray(y), want)


def test_dlbridge_misaligned_into_jax_copies_values_right(jax):
    # JAX's CPU client takes foreign memory only when it is 64-byte aligned
    # and copies otherwise; the values must survive either way.
    base, ref = dlb_base("float32")
    nb = np.from_dlpack(base)
    for off in (0, 1, 4, 16):
        t = dlb.from_dlpack(nb[off:off + 32])
        y = jax.dlpack.from_dlpack(t)
        assert_values(np.asarray(y), ref[off:off + 32])
        if off == 0 or off == 16:  # 0 and 64 bytes: aligned, shared
            assert jax_ptr(y) == t.data_ptr


# ---- TensorFlow <-> dlbridge -----------------------------------------------------


class _LegacyCapsule:
    """Hands a ready-made legacy capsule to numpy.from_dlpack."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, **kwargs):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)


def tf_ptr(tf, x, name):
    """Element 0 of TF tensor ``x`` as another consumer (not dlbridge) sees
    it through TF's legacy DLPack export."""
    capsule = tf.experimental.dlpack.to_dlpack(x)
    if name in NUMPY_DTYPES:
        return np_ptr(np.from_dlpack(_LegacyCapsule(capsule)))
    torch = pytest.importorskip(
        "torch", reason="reading a TF %s pointer needs torch" % name)
    return torch.utils.dlpack.from_dlpack(capsule).data_ptr()


@pytest.mark.parametrize("via", ["legacy_capsule", "object"])
@pytest.mark.parametrize("layout", list(COMPACT_SHAPES))
@pytest.mark.parametrize("name", TF_DTYPES)
def test_tensorflow_to_dlbridge_and_back(tf, name, layout, via):
    shape = COMPACT_SHAPES[layout]
    n = int(np.prod(shape, dtype=np.int64))
    want = ref_values(name)[:n].reshape(shape)
    x = tf.constant(want)
    assert x.dtype.name == name
    src = tf.experimental.dlpack.to_dlpack(x) if via == "legacy_capsule" else x
    t = dlb.from_dlpack(src)
    assert t.shape == shape and t.dtype == name
    assert t.strides == row_major(shape)
    if n:
        assert t.data_ptr == tf_ptr(tf, x, name)
    assert_dlb_values(t, want)
    back = tf.experimental.dlpack.from_dlpack(t.__dlpack__())
    if n:
        assert tf_ptr(tf, back, name) == t.data_ptr
    assert back.dtype == x.dtype and tuple(back.shape) == shape
    assert_values(back.numpy(), want)


@pytest.mark.parametrize("layout", list(COMPACT_SHAPES))
@pytest.mark.parametrize("name", TF_DTYPES)
def test_dlbridge_to_tensorflow(tf, name, layout):
    t, want = dlb_compact(name, COMPACT_SHAPES[layout])
    y = tf.experimental.dlpack.from_dlpack(t.__dlpack__())
    if t.size:
        assert tf_ptr(tf, y, name) == t.data_ptr
    assert y.dtype.name == name and tuple(y.shape) == t.shape
    assert_values(y.numpy(), want)
    ptr = t.data_ptr
    del t  # y keeps the dlbridge memory alive (freed by refcount now)
    assert_values(y.numpy(), want)
    if want.size:
        assert tf_ptr(tf, y, name) == ptr


def test_dlbridge_offset_slice_into_tensorflow_shares(tf):
    # A compact slice that does not start the allocation: the byte offset is
    # folded into the exported pointer and TF takes it as is.
    base, ref = dlb_base("float32")
    t = dlb.from_dlpack(np.from_dlpack(base)[3:3 + 12].reshape(3, 4))
    y = tf.experimental.dlpack.from_dlpack(t.__dlpack__())
    assert tf_ptr(tf, y, "float32") == base.data_ptr + 12
    assert_values(y.numpy(), ref[3:15].reshape(3, 4))


@pytest.mark.parametrize("layout", ["transposed", "offset", "step",
                                    "negative", "broadcast"])
def test_dlbridge_non_compact_into_tensorflow_copies(tf, layout):
    # TF imports only compact row-major data: convert copies the rest
    # (gh-17); copy=False is a BufferError naming tensorflow.
    t, want = dlb_view_numpy("float32", layout)
    y = dlb.convert(t, "tensorflow")
    assert tuple(y.shape) == t.shape
    assert_values(y.numpy(), want)
    with pytest.raises(BufferError, match="tensorflow"):
        dlb.convert(t, "tensorflow", copy=False)


def test_dlbridge_size1_odd_stride_into_jax_and_tensorflow(jax, tf):
    # An odd stride on a size-1 dim does not break compactness: both take
    # the memory as it is, without a copy.
    t, want = dlb_view_numpy("float32", "size1_odd")
    assert t.strides == (4, 7, 1) and t.data_ptr % 64 == 0
    y = jax.dlpack.from_dlpack(t)
    assert jax_ptr(y) == t.data_ptr
    assert_values(np.asarray(y), want)
    z = tf.experimental.dlpack.from_dlpack(t.__dlpack__())
    assert tf_ptr(tf, z, "float32") == t.data_ptr
    assert_values(z.numpy(), want)


# ---- PyArrow <-> dlbridge ---------------------------------------------------------


def arrow_type(pa, name):
    return pa.from_numpy_dtype(np.dtype(name))


@pytest.mark.parametrize("layout", ["contiguous", "offset", "zero_size"])
@pytest.mark.parametrize("name", ARROW_DTYPES)
def test_arrow_array_to_dlbridge(pa, name, layout):
    ref = ref_values(name)
    arr = pa.array(ref, type=arrow_type(pa, name))
    if layout == "offset":
        arr = arr.slice(5, 17)
    elif layout == "zero_size":
        arr = arr.slice(3, 0)
    t = dlb.from_dlpack(arr)
    assert t.shape == (len(arr),) and t.dtype == name and t.strides == (1,)
    if len(arr):
        assert t.data_ptr == (arr.buffers()[1].address
                              + arr.offset * ref.itemsize)
    want = ref[arr.offset:arr.offset + len(arr)]
    assert_dlb_values(t, want)
    # pyarrow has no from_dlpack; its buffer protocol importer sees the same
    # memory.
    if len(arr):
        assert pa.py_buffer(t).address == t.data_ptr


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "offset",
                                    "step", "broadcast", "zero_d",
                                    "size1_odd", "ndim8"])
@pytest.mark.parametrize("name", ARROW_DTYPES)
def test_arrow_tensor_to_dlbridge(pa, name, layout):
    ref = ref_values(name).copy()
    a = strided(ref, layout)
    pt = pa.Tensor.from_numpy(a)
    t = dlb.from_dlpack(pt)
    assert t.data_ptr == np_ptr(a)  # pa.Tensor.from_numpy shares a's memory
    assert t.shape == a.shape and t.strides == elem_strides(a)
    assert t.dtype == name
    assert_dlb_values(t, expected_view(ref_values(name), layout))


@pytest.mark.parametrize("name", ARROW_DTYPES)
def test_dlbridge_to_arrow(pa, name):
    t, want = dlb_compact(name, (N,))
    buf = pa.py_buffer(t)
    assert buf.address == t.data_ptr and buf.size == t.nbytes
    assert buf.is_mutable
    arr = pa.Array.from_buffers(arrow_type(pa, name), N, [None, buf])
    assert arr.buffers()[1].address == t.data_ptr
    del t  # the buffer keeps the dlbridge tensor alive
    assert_values(arr.to_numpy(zero_copy_only=True), want)
    fb = pa.foreign_buffer(buf.address, buf.size, base=buf)
    assert fb.address == buf.address


@pytest.mark.parametrize("layout", ["transposed", "offset", "step",
                                    "size1_odd", "ndim8"])
def test_dlbridge_strided_to_arrow_tensor(pa, layout):
    t, want = dlb_view_numpy("int32", layout)
    pt = pa.Tensor.from_numpy(np.from_dlpack(t))
    assert tuple(pt.strides) == tuple(s * 4 for s in t.strides)
    assert dlb.from_dlpack(pt).data_ptr == t.data_ptr
    assert_values(pt.to_numpy(), want)


def test_dlbridge_readonly_to_arrow_immutable(pa):
    a = ref_values("float64").copy()
    a.flags.writeable = False
    t = dlb.from_dlpack(a)
    assert t.readonly
    buf = pa.py_buffer(t)
    assert buf.address == np_ptr(a)
    assert not buf.is_mutable


# ---- dlb.convert between every pair --------------------------------------------------


FRAMEWORKS = ["numpy", "torch", "jax", "tensorflow"]
PAIRS = [(s, d) for s in FRAMEWORKS for d in FRAMEWORKS if s != d]
CONVERT_DTYPES = ["bool", "int8", "uint64", "int64", "float16", "float32",
                  "float64", "complex64", "complex128", "bfloat16"]
# NumPy has no bfloat16 (its refusal is tested in test_convert.py).
CONVERT_CASES = [
    pytest.param(s, d, name, id="%s-%s-%s" % (s, d, name))
    for s, d in PAIRS for name in CONVERT_DTYPES
    if not ("numpy" in (s, d) and name not in NUMPY_DTYPES)
]


_FIXTURE = {"numpy": "numpy_module", "torch": "torch", "jax": "jax",
            "tensorflow": "tf"}


def _fw(request, name):
    return request.getfixturevalue(_FIXTURE[name])


@pytest.fixture(scope="module")
def numpy_module():
    return np


def make_in(fw, mod, name, want):
    """``want`` as a tensor of framework ``fw`` in memory that framework
    allocated itself (64-byte aligned at least)."""
    if fw == "numpy":
        t = dlb.empty(want.shape, dtype=name)
        a = np.from_dlpack(t)
        a[...] = want
        return a
    if fw == "torch":
        x = mod.empty(want.shape, dtype=getattr(mod, name))
        src, _ = torch_base(mod, name)
        x.copy_(src[:want.size].reshape(want.shape))
        return x
    if fw == "jax":
        return mod.numpy.asarray(want)
    return mod.constant(want)


def ptr_of(fw, mod, x, name):
    if fw == "numpy":
        return np_ptr(x)
    if fw == "torch":
        return x.data_ptr()
    if fw == "jax":
        return jax_ptr(x)
    return tf_ptr(mod, x, name)


def values_of(fw, mod, x):
    if fw == "numpy":
        return x
    if fw == "torch":
        return torch_bits(mod, x)
    if fw == "jax":
        return np.asarray(x)
    return x.numpy()


def type_of(fw, mod):
    return {"numpy": np.ndarray, "torch": getattr(mod, "Tensor", None),
            "jax": getattr(mod, "Array", None)}.get(fw)


@pytest.mark.parametrize("src,dst,name", CONVERT_CASES)
def test_convert_pairs(request, src, dst, name):
    smod, dmod = _fw(request, src), _fw(request, dst)
    want = ref_values(name)[:12].reshape(3, 4)
    x = make_in(src, smod, name, want)
    r = dlb.convert(x, dst)
    if dst == "tensorflow":
        assert isinstance(r, dmod.Tensor)
    else:
        assert isinstance(r, type_of(dst, dmod))
    assert ptr_of(dst, dmod, r, name) == ptr_of(src, smod, x, name)
    assert tuple(r.shape) == (3, 4)
    assert_values(values_of(dst, dmod, r), want)
    # and back again, still the same memory -- unless the result is
    # read-only (JAX 0.12 exports its arrays READ_ONLY, so NumPy's view is)
    # and src's tensors cannot hold read-only memory: convert copies then
    back = dlb.convert(r, src)
    read_only = dst == "numpy" and not r.flags.writeable
    if not (read_only and not REGISTRY[src].readonly):
        assert ptr_of(src, smod, back, name) == ptr_of(src, smod, x, name)
    assert_values(values_of(src, smod, back), want)


@pytest.mark.parametrize("src", FRAMEWORKS)
def test_convert_to_dlbridge_same_pointer(request, src):
    mod = _fw(request, src)
    want = ref_values("float32")[:12].reshape(3, 4)
    x = make_in(src, mod, "float32", want)
    t = dlb.convert(x, "dlbridge")
    assert isinstance(t, dlb.Tensor)
    assert t.data_ptr == ptr_of(src, mod, x, "float32")
    assert_dlb_values(t, want)


def test_strided_numpy_torch_convert_keeps_layout(torch):
    # numpy <-> torch share every non-negative layout: strides must survive.
    for layout in NON_NEGATIVE:
        t, want = dlb_view_numpy("int16", layout)
        a = np.from_dlpack(t)
        x = dlb.convert(a, "torch")
        b = dlb.convert(x, "numpy")
        assert x.stride() == elem_strides(a)
        if a.size:
            assert x.data_ptr() == np_ptr(a) and np_ptr(b) == np_ptr(a)
            assert b.strides == a.strides
        # else: torch exports NULL data for an empty tensor and NumPy makes
        # a fresh empty array (strides 0) of it -- numpy.from_dlpack(x) on
        # the torch tensor directly does the same.
        assert_values(b, want)


def _jax_asks_for_versioned_capsules(jax):
    asked = {}

    class Recorder:
        a = np.zeros(1, np.float32)

        def __dlpack__(self, **kw):
            asked.update(kw)
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    jax.dlpack.from_dlpack(Recorder())
    return asked.get("max_version") is not None


def test_readonly_numpy_into_jax_copies(jax):
    a = ref_values("float32")[:12].copy()
    a.flags.writeable = False
    # JAX imports a legacy capsule (0.10) or copies a READ_ONLY one itself
    # (0.12): either way the result never aliases a's memory.
    r = dlb.convert(a, "jax")
    assert_values(np.asarray(r), a)
    assert r.unsafe_buffer_pointer() != np_ptr(a)
    with pytest.raises(BufferError, match="read-only"):
        dlb.convert(a, "jax", copy=False)


def test_readonly_numpy_round_trip_keeps_flag():
    a = ref_values("int32").reshape(16, 16)[::2, 1::3].copy()[:, ::-1]
    a.flags.writeable = False
    t = dlb.from_dlpack(a)
    assert t.readonly and t.data_ptr == np_ptr(a)
    r = np.from_dlpack(t)
    assert not r.flags.writeable and np_ptr(r) == np_ptr(a)
    assert r.strides == a.strides
    with pytest.raises(BufferError):
        t.__dlpack__()  # legacy capsule: cannot say read-only
    assert_values(r, a)


def test_negative_strides_into_torch_copied_not_abort():
    # torch.from_dlpack 2.13 aborts the process on negative strides:
    # convert copies them (copy=False refuses), torch never sees them.
    pytest.importorskip("torch")
    code = textwrap.dedent("""
        import numpy as np, dlbridge as dlb, torch
        a = np.arange(12.0).reshape(3, 4)[::-1]
        assert dlb.convert(a, "torch").tolist() == a.tolist()
        try:
            dlb.convert(a, "torch", copy=False)
        except BufferError as e:
            assert "torch" in str(e), e
            print("REFUSED")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "REFUSED" in proc.stdout


# ---- no growth over many round trips --------------------------------------------


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def assert_no_growth(step, n, *sources):
    """Run ``step`` n times after a warm-up: the sources' refcounts must not
    move, nor the number of Python allocator blocks, nor RSS beyond 8 MiB."""
    for _ in range(max(n // 20, 200)):
        step()
    # With TensorFlow loaded a full collection walks millions of objects
    # (~0.5 s); freeze what exists so the collections below only walk what
    # the loop made (as conftest.py does).
    gc.freeze()
    gc.collect()
    refs = [sys.getrefcount(s) for s in sources]
    blocks = sys.getallocatedblocks()
    rss = _rss()
    for _ in range(n):
        step()
    gc.collect()
    assert [sys.getrefcount(s) for s in sources] == refs
    assert sys.getallocatedblocks() - blocks < 1000
    assert _rss() - rss < 8 * MiB


def test_no_growth_numpy_round_trips():
    a = ref_values("float64").reshape(16, 16)[::2, 1::3]  # 512 B of data
    t, _ = dlb_view_numpy("float64", "transposed")

    def step():
        r = np.from_dlpack(dlb.from_dlpack(a))
        assert r.ctypes.data == a.ctypes.data
        dlb.from_dlpack(np.from_dlpack(t))
    assert_no_growth(step, 100_000, a, t)


def test_no_growth_torch_round_trips(torch):
    x = torch.arange(64, dtype=torch.float64).reshape(8, 8).T
    t, _ = dlb_view_torch(torch, "bfloat16", "transposed")
    p = x.data_ptr()

    def step():
        assert torch.from_dlpack(dlb.from_dlpack(x)).data_ptr() == p
        dlb.from_dlpack(torch.from_dlpack(t))
    assert_no_growth(step, 100_000, x, t)


def test_no_growth_jax_round_trips(jax):
    x = jax.numpy.arange(64, dtype="float64").reshape(8, 8)
    t, _ = dlb_compact("float32", (8, 8))
    p = jax_ptr(x)

    def step():
        assert jax_ptr(jax.dlpack.from_dlpack(dlb.from_dlpack(x))) == p
        dlb.from_dlpack(jax.dlpack.from_dlpack(t))
    assert_no_growth(step, 5_000, x, t)


def test_no_growth_tensorflow_round_trips(tf):
    x = tf.reshape(tf.range(64, dtype=tf.float64), (8, 8))
    t, _ = dlb_compact("int32", (8, 8))
    tfd = tf.experimental.dlpack

    def step():
        tfd.from_dlpack(dlb.from_dlpack(tfd.to_dlpack(x)).__dlpack__())
        dlb.from_dlpack(tfd.from_dlpack(t.__dlpack__()))
    assert_no_growth(step, 5_000, x, t)


def test_no_growth_arrow_round_trips(pa):
    arr = pa.array(ref_values("int64"))
    t, _ = dlb_compact("uint8", (64,))

    def step():
        pa.py_buffer(dlb.from_dlpack(arr))
        dlb.from_dlpack(pa.py_buffer(t))
    assert_no_growth(step, 20_000, arr, t)


# ---- the DLPack peers of issue 17, both ways --------------------------------------
#
# The cases are in _peer_cases.py, run by one child pytest: PaddlePaddle
# crashes when imported into a process that loaded TensorFlow (which this
# module's earlier cases do), and Dr.Jit's LLVM backend and TensorFlow abort
# together at exit.  One parent test per peer reports that peer's cases, so a
# pass that cannot load one excludes it by name (make sanitize-python: -k
# "not paddle"); the child runs only the peers whose parent tests were
# selected (DLB_PEERS).

PEER_GROUPS = ["paddle", "tvm_ffi", "onnxruntime", "mlx", "warp", "open3d",
               "drjit", "array_api_strict", "each_other"]


@pytest.fixture(scope="module")
def peer_results(request, tmp_path_factory):
    """{case id: (outcome, message)} of one child run over the selected
    peers, and the child's output tail."""
    import xml.etree.ElementTree as ET
    groups = sorted({item.callspec.params["group"] for item in request.session.items
                     if getattr(item, "originalname", "") == "test_peer_cases"})
    peers = [g for g in groups if g != "each_other"]
    here = os.path.dirname(os.path.abspath(__file__))
    xml = tmp_path_factory.mktemp("peers") / "peers.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "--capture=sys", f"--junitxml={xml}", "-k", " or ".join(groups),
         os.path.join(here, "_peer_cases.py")],
        capture_output=True, text=True, timeout=900, cwd=here,
        env=dict(os.environ, DLB_PEERS=",".join(peers)))
    tail = (proc.stdout + proc.stderr)[-4000:]
    results = {}
    if xml.exists():
        for case in ET.parse(xml).getroot().iter("testcase"):
            outcome, message = "passed", ""
            for child in case:
                if child.tag in ("failure", "error", "skipped"):
                    outcome = child.tag
                    message = (child.get("message") or "") + "\n" + (child.text or "")
            results[case.get("name")] = (outcome, message)
    return proc.returncode, results, tail


@pytest.mark.parametrize("group", PEER_GROUPS)
def test_peer_cases(group, peer_results):
    rc, results, tail = peer_results
    assert rc in (0, 1, 5), f"the peers' child pytest died (status {rc}):\n{tail}"
    mine = {k: v for k, v in results.items() if group in k}
    if not mine:
        pytest.skip(f"no case of {group} ran")
    bad = {k: m[-1500:] for k, (o, m) in mine.items() if o in ("failure", "error")}
    assert not bad, "\n\n".join(f"{k}: {m}" for k, m in bad.items())
    if all(o == "skipped" for o, _ in mine.values()):
        pytest.skip(next(iter(mine.values()))[1].strip().splitlines()[0])
