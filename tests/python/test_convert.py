"""dlbridge.convert: zero-copy conversion between frameworks."""

import subprocess
import sys

import pytest

import dlbridge as dlb

np = pytest.importorskip("numpy")


def ptr(x):
    """Address of element 0 of a numpy array, torch tensor or dlb.Tensor."""
    if isinstance(x, np.ndarray):
        return x.__array_interface__["data"][0]
    if isinstance(x, dlb.Tensor):
        return x.data_ptr
    return x.data_ptr()


def test_importing_dlbridge_imports_no_framework():
    code = (
        "import sys, dlbridge, dlbridge._frameworks\n"
        "bad = [m for m in ('numpy', 'torch', 'jax', 'tensorflow', 'cupy') "
        "if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True,
                   env=None, cwd=None)


@pytest.mark.parametrize("to", ["dlbridge", "numpy"])
def test_numpy_to(to):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::-1]
    r = dlb.convert(a, to)
    if to == "numpy":
        assert r is a  # already there
    else:
        assert isinstance(r, dlb.Tensor)
        assert r.data_ptr == ptr(a)


def test_dlbridge_to_numpy_zero_copy():
    a = np.arange(12, dtype=np.int16).reshape(3, 4).T
    t = dlb.from_dlpack(a)
    r = dlb.convert(t, "numpy")
    assert isinstance(r, np.ndarray)
    assert ptr(r) == ptr(a)
    assert r.strides == a.strides
    np.testing.assert_array_equal(r, a)


def test_buffer_to_numpy():
    b = bytearray(b"\x01\x02\x03\x04")
    r = dlb.convert(b, "numpy")
    assert r.dtype == np.uint8
    r[0] = 7
    assert b[0] == 7


def test_target_as_type_and_example():
    a = np.arange(3.0)
    t = dlb.from_dlpack(a)
    assert isinstance(dlb.convert(t, np.ndarray), np.ndarray)
    assert isinstance(dlb.convert(t, np.zeros(1)), np.ndarray)
    assert dlb.convert(a, dlb.Tensor).data_ptr == ptr(a)
    assert isinstance(dlb.convert(a, t), dlb.Tensor)


@pytest.mark.parametrize("to", ["pandas", "NumPy", "", list, 3])
def test_unknown_target_valueerror(to):
    with pytest.raises(ValueError, match="numpy"):
        dlb.convert(np.arange(3.0), to)


def test_not_tensor_like_typeerror():
    with pytest.raises(TypeError):
        dlb.convert(object(), "numpy")


def test_readonly_into_numpy_stays_readonly():
    a = np.arange(4.0)
    a.flags.writeable = False
    r = dlb.convert(dlb.from_dlpack(a), "numpy")
    assert not r.flags.writeable
    assert ptr(r) == ptr(a)


def test_unsupported_dtype_bufferError_names_target_and_dtype():
    torch = pytest.importorskip("torch")
    x = torch.arange(4, dtype=torch.bfloat16)
    with pytest.raises(BufferError, match=r"numpy.*bfloat16"):
        dlb.convert(x, "numpy")


# ---- torch --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "int64", "uint8", "bool",
                                   "complex128", "float16"])
def test_numpy_to_torch_zero_copy(dtype):
    torch = pytest.importorskip("torch")
    a = np.arange(24).reshape(4, 6).astype(dtype)[1:, ::2]
    r = dlb.convert(a, "torch")
    assert isinstance(r, torch.Tensor)
    assert r.data_ptr() == ptr(a)
    assert r.stride() == tuple(s // a.itemsize for s in a.strides)
    assert r.tolist() == a.tolist()


def test_torch_to_numpy_and_back():
    torch = pytest.importorskip("torch")
    x = torch.arange(20, dtype=torch.float64).reshape(4, 5)[1:, 1:].T
    a = dlb.convert(x, "numpy")
    assert ptr(a) == x.data_ptr()
    np.testing.assert_array_equal(a, x.numpy())
    y = dlb.convert(a, torch.Tensor)
    assert y.data_ptr() == x.data_ptr()
    assert torch.equal(y, x)
    assert dlb.convert(x, "torch") is x


def test_torch_bfloat16_through_dlbridge():
    torch = pytest.importorskip("torch")
    x = torch.arange(6, dtype=torch.bfloat16)
    t = dlb.convert(x, "dlbridge")
    assert t.dtype == "bfloat16"
    y = dlb.convert(t, "torch")
    assert y.dtype == torch.bfloat16 and y.data_ptr() == x.data_ptr()


def test_readonly_into_torch_refused():
    pytest.importorskip("torch")
    a = np.arange(4.0)
    a.flags.writeable = False
    with pytest.raises(BufferError, match="read-only.*torch"):
        dlb.convert(a, "torch")
    # The documented way out: copy first.
    r = dlb.convert(dlb.from_dlpack(a, copy=True), "torch")
    assert r.tolist() == a.tolist()
    r[0] = 9.0
    assert a[0] == 0.0


def test_bytes_into_torch_refused():
    pytest.importorskip("torch")
    with pytest.raises(BufferError, match="read-only"):
        dlb.convert(b"abcd", "torch")


def test_convert_does_not_leak():
    torch = pytest.importorskip("torch")
    import gc
    a = np.arange(8.0)
    for _ in range(100):
        dlb.convert(a, "torch")
    gc.collect()
    before = sys.getrefcount(a)
    for _ in range(2000):
        dlb.convert(dlb.convert(a, "torch"), "numpy")
    gc.collect()
    assert sys.getrefcount(a) == before
    del torch


# ---- optional frameworks ------------------------------------------------------------


def test_jax():
    jax = pytest.importorskip("jax")
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    r = dlb.convert(a, "jax")
    assert isinstance(r, jax.Array)
    np.testing.assert_array_equal(np.asarray(r), a)
    back = dlb.convert(r, "numpy")
    np.testing.assert_array_equal(back, a)


def test_tensorflow():
    tf = pytest.importorskip("tensorflow")
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    r = dlb.convert(a, "tensorflow")
    assert isinstance(r, tf.Tensor)
    np.testing.assert_array_equal(r.numpy(), a)
    back = dlb.convert(r, "numpy")
    np.testing.assert_array_equal(back, a)
    ro = a.copy()
    ro.flags.writeable = False
    with pytest.raises(BufferError):
        dlb.convert(ro, "tensorflow")


def test_pyarrow_buffer():
    pa = pytest.importorskip("pyarrow")
    buf = pa.py_buffer(b"\x01\x02\x03")
    r = dlb.convert(buf, "numpy")
    assert r.tolist() == [1, 2, 3]


def test_registry_is_the_one_framework_list():
    """python/dlbridge/_frameworks.py's REGISTRY is the list: convert's
    targets, the CLI and the doctor read it, and a framework the registry
    knows but convert does not target is refused by type as by name."""
    import dlbridge._frameworks as fw
    import dlbridge._doctor as doctor
    assert fw.FRAMEWORKS == tuple(n for n, f in fw.REGISTRY.items() if f.target)
    assert set(doctor.CANDIDATES) <= set(fw.REGISTRY)
    Paddleish = type("Tensor", (), {"__module__": "paddle.base"})
    assert fw._type_framework(Paddleish) == "paddle"
    assert dlb._core._type_framework(Paddleish) == "paddle"
    with pytest.raises(ValueError):
        dlb.convert(np.ones(2), "paddle")
    with pytest.raises(ValueError):
        dlb.convert(np.ones(2), Paddleish)
    Jaxish = type("ArrayImpl", (), {"__module__": "jaxlib.xla_extension"})
    assert dlb._core._type_framework(Jaxish) == "jax"
