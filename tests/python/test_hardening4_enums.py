"""Issue 23 (hardening round 4), items 12 and 4.

Item 12: the post-1.3 enum values of DLPack's main branch (kDLTPU 19,
kDLTPUHost 20, kDLAscend 21, kDLBcomplex 18), and any device type dlbridge
has no name for held as an opaque foreign device "device<N>" instead of
refused.  Item 4: MLX and Dr.Jit arrays are immutable values, so a `mut`
argument of one is never written (its new value is returned, as for JAX).

Host accesses to a foreign tensor run in a child interpreter over an
address no process maps (4096, the second page): a read of its memory
crashes the child instead of passing by luck.
"""
import gc

import numpy as np
import pytest

import dlbridge as dlb
from _findings_util import CAPSULE, check, run

# ---- item 12: device names and numbers --------------------------------------

NEW_DEVICES = [("tpu", 19), ("tpu_host", 20), ("ascend", 21)]


@pytest.mark.parametrize("name,number", NEW_DEVICES)
def test_post_13_device_names_and_numbers(name, number):
    for spelled in (name, f"{name}:0", (number, 0)):
        d = dlb.device(spelled)
        assert (d.type, d.id, d.name) == (number, 0, name)
        assert str(d) == f"{name}:0"
        assert d == (number, 0) and d == f"{name}:0"
    d = dlb.device(f"{name}:3")
    assert (d.type, d.id) == (number, 3) and d == (number, 3)
    assert dlb.device((number, 3)) == d and hash(d) == hash((number, 3))


def test_tpu_host_parses_like_cuda():
    for text, number in (("cuda:0", 2), ("tpu_host:0", 20)):
        d = dlb.device(text)
        assert (d.type, d.id) == (number, 0)
        assert str(d) == text and dlb.device(str(d)) == d
    assert dlb.device("tpu_host:0") != dlb.device("cuda:0")


@pytest.mark.parametrize("number", [5, 6, 22, 99, 2**31 - 1])
def test_unknown_device_type_is_generic_device(number):
    d = dlb.device((number, 0))
    assert str(d) == f"device{number}:0" and d.name == f"device{number}"
    assert d == (number, 0) and d == f"device{number}:0"
    assert repr(d) == f"dlbridge.device('device{number}:0')"
    # the text parses back, with or without the id
    assert dlb.device(str(d)) == d
    assert dlb.device(f"device{number}") == d
    assert dlb.device(f"device{number}:7") == (number, 7)


def test_device99_round_trip():
    assert str(dlb.device((99, 0))) == "device99:0"
    assert dlb.device((99, 0)) == (99, 0)
    assert dlb.device("device99:0") == dlb.device((99, 0))
    assert hash(dlb.device("device99:0")) == hash((99, 0))


@pytest.mark.parametrize("bad", [(0, 0), (-1, 0), (-(2**31), 0)])
def test_device_type_below_one_is_still_refused(bad):
    with pytest.raises(ValueError, match="not a DLPack device type"):
        dlb.device(bad)


@pytest.mark.parametrize("bad", ["device0", "device0:0", "device07",
                                 "device-1", "device", "device2147483648"])
def test_malformed_generic_names_refused(bad):
    with pytest.raises(ValueError, match="unknown device"):
        dlb.device(bad)


# ---- item 12: a tensor on a foreign device ----------------------------------

@pytest.mark.parametrize("device_type", [20, 99])
def test_foreign_tensor_held_as_opaque_view(device_type):
    """A raw capsule on tpu_host / device 99 is held; shape, dtype and
    device read; every host access a BufferError; re-exports keep the
    device.  data is an unmapped address: any read crashes the child."""
    check(f"""
    cap = capsule({device_type}, shape=(2, 3), data_address=4096)
    t = dlb.from_dlpack(cap)
    assert t.shape == (2, 3) and t.strides == (3, 1)
    assert t.dtype == "float32" and t.itemsize == 4 and t.nbytes == 24
    assert t.device == ({device_type}, 0), t.device
    assert t.__dlpack_device__() == ({device_type}, 0)
    assert t.data_ptr == 4096
    def refused(f, kinds=(BufferError,)):
        try:
            f()
        except kinds as e:
            return str(e)
        raise AssertionError("host access allowed: %r" % (f,))
    refused(t.tolist)
    refused(lambda: memoryview(t))
    refused(lambda: bytes(t))
    refused(lambda: t.__array_interface__)
    refused(lambda: np.asarray(t))
    refused(lambda: t.copy(device="cpu"))
    refused(lambda: t.copy())
    refused(lambda: dlb.from_dlpack(t, device="cpu"))
    refused(lambda: t.__dlpack__(dl_device=(1, 0), max_version=(1, 3)))
    # NumPy's own consumer refuses the device after reading the capsule's
    # header (RuntimeError "Unsupported device in DLTensor." in NumPy 2.x);
    # it never reaches the memory either.
    refused(lambda: np.from_dlpack(t), (BufferError, RuntimeError))
    # convert refuses it for NumPy as a BufferError, reading nothing
    refused(lambda: dlb.convert(t, "numpy"))
    # re-exported (versioned and legacy) it stays on its device
    for kw in ({{"max_version": (1, 3)}}, {{}}):
        back = dlb.from_dlpack(t.__dlpack__(**kw))
        assert back.device == ({device_type}, 0) and back.data_ptr == 4096
        assert back.shape == (2, 3)
        del back
    same = dlb.from_dlpack(t, device=({device_type}, 0))
    assert same.device == t.device
    del t, same, cap
    gc.collect()
    print("OK")
    """, pre=CAPSULE)


@pytest.mark.parametrize("device_type", [20, 99])
def test_foreign_device_from_producer_object(device_type):
    """from_dlpack asks __dlpack_device__ first: a foreign type there is no
    longer refused before the producer is asked for its capsule."""
    check(f"""
    class Producer:
        def __dlpack_device__(self):
            return ({device_type}, 1)
        def __dlpack__(self, **kw):
            return capsule({device_type}, shape=(4,), data_address=4096,
                           device_id=1)
    t = dlb.from_dlpack(Producer())
    assert t.device == ({device_type}, 1) and t.shape == (4,)
    try:
        t.tolist()
    except BufferError:
        pass
    else:
        raise AssertionError("tolist read a foreign device")
    del t
    gc.collect()
    print("OK")
    """, pre=CAPSULE)


def test_foreign_tensor_routed_to_a_framework_that_holds_it():
    """tvm-ffi's Tensor carries any device: convert hands the tensor over
    and the device and address come back unchanged."""
    pytest.importorskip("tvm_ffi")
    check("""
    t = dlb.from_dlpack(capsule(99, shape=(4,), data_address=4096))
    r = dlb.convert(t, "tvm_ffi")
    assert r.__dlpack_device__() == (99, 0)
    back = dlb.from_dlpack(r)
    assert back.device == (99, 0) and back.data_ptr == 4096
    try:
        dlb.convert(t, "torch")
    except (BufferError, ImportError):
        pass
    else:
        raise AssertionError("torch was handed a device it has no backend for")
    del t, r, back
    gc.collect()
    print("OK")
    """, pre=CAPSULE)


# ---- item 12: dtype codes -----------------------------------------------------

def test_bcomplex32_dtype():
    d = dlb.dtype("bcomplex32")
    assert (d.code, d.bits, d.lanes, d.itemsize) == (18, 32, 1, 4)
    assert d.name == "bcomplex32" and d == "bcomplex32"
    v = dlb.dtype("bcomplex32x2")
    assert (v.code, v.bits, v.lanes, v.itemsize) == (18, 32, 2, 8)
    with pytest.raises(ValueError):
        dlb.dtype("bcomplex64")


def test_bcomplex32_tensor_on_cpu_held():
    check("""
    t = dlb.from_dlpack(capsule(1, shape=(3,), code=18, bits=32))
    assert t.dtype == "bcomplex32" and t.dtype.name == "bcomplex32"
    assert (t.dtype.code, t.dtype.bits) == (18, 32)
    assert t.itemsize == 4 and t.nbytes == 12 and t.device == "cpu"
    z = dlb.zeros((2,), dtype="bcomplex32")
    assert z.nbytes == 8 and z.dtype == "bcomplex32"
    # kept across a round trip through DLPack
    assert dlb.from_dlpack(z.__dlpack__(max_version=(1, 3))).dtype == "bcomplex32"
    # no framework here holds it: convert says so instead of guessing
    try:
        dlb.convert(z, "numpy")
    except BufferError as e:
        assert "bcomplex32" in str(e)
    else:
        raise AssertionError("numpy was given bcomplex32")
    del t, z
    gc.collect()
    print("OK")
    """, pre=CAPSULE)


@pytest.mark.parametrize("code", [19, 99])
def test_unknown_dtype_code_is_buffer_error_naming_it(code):
    check(f"""
    try:
        dlb.from_dlpack(capsule(1, shape=(4,), code={code}, bits=32))
    except BufferError as e:
        msg = str(e)
        assert "unknown type code {code}" in msg, msg
        assert "known codes are 0-18" in msg, msg
    else:
        raise AssertionError("dtype code {code} accepted")
    print("OK")
    """, pre=CAPSULE)


# ---- item 4: MLX and Dr.Jit arrays are immutable values ---------------------

SAXPY = "saxpy(a: float32, x: float32[n], y: mut float32[n])"
BOTH = ("g(x: float32[n], y: mut float32[n], z: mut float32[n]) "
        "-> float32[n]")


def test_registry_immutable_frameworks():
    """The per-framework decision of docs/decisions.md, section 21: these
    frameworks' arrays are values that must not be written."""
    from dlbridge._frameworks import REGISTRY
    assert {n for n, fw in REGISTRY.items() if fw.immutable} == {
        "jax", "tensorflow", "mlx", "drjit"}


# Each framework's half runs in a child interpreter: Dr.Jit beside
# TensorFlow in one process dies at exit ("free(): invalid pointer", with
# no dlbridge involved), so no test imports Dr.Jit in pytest's process.
LAZY = {
    "mlx": """
import mlx.core as mx
def make(values):
    return mx.array(np.asarray(values, np.float32))
def lazy(p):
    # built before the call, evaluated after it
    return [p + 100, p.astype(p.dtype), p * 1]
host = np.asarray
""",
    "drjit": """
try:
    from drjit.llvm import TensorXf
    TensorXf(np.zeros(1, np.float32)).numpy()
except Exception as e:  # no LLVM backend in this install
    print("SKIP", e); sys.exit(0)
def make(values):
    return TensorXf(np.asarray(values, np.float32))
def lazy(p):
    return [p + 100, TensorXf(p), p * 1]
def host(t):
    return np.asarray(t.numpy())
""",
}


@pytest.mark.parametrize("framework", ["mlx", "drjit"])
def test_mut_on_lazy_immutable_framework_returns_new_value(lib, framework):
    """Issue 23 item 4: a `mut` MLX / Dr.Jit argument was written in its
    framework's own buffer, changing the array and every lazy expression
    built from it before the call.  Now, as for JAX, the caller's array is
    never written and the new value comes back after the declared
    results."""
    import importlib.util
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed")
    p = run(f"""
    lib = {lib!r}
    eq = np.testing.assert_array_equal
    saxpy = dlb.load(lib, "dlb_kernel_saxpy", {SAXPY!r})
    x, p = make([0, 1, 2, 3]), make([1, 1, 1, 1])
    before = lazy(p)
    r = saxpy(2.0, x, p)
    assert type(r) is type(p), type(r)
    eq(host(r), [1, 3, 5, 7])
    eq(host(p), [1, 1, 1, 1])
    q, b, m = before
    eq(host(q), [101, 101, 101, 101])
    eq(host(b), [1, 1, 1, 1])
    eq(host(m), [1, 1, 1, 1])
    # declared results first, then the new values in parameter order
    both = dlb.load(lib, "dlb_kernel_noop", {BOTH!r})
    y, z = make([1, 1, 1, 1]), make([0, 0, 0, 0])
    out = both(x, y, z)
    assert isinstance(out, tuple) and len(out) == 3
    assert all(type(o) is type(y) for o in out)
    eq(host(out[1]), [1, 1, 1, 1])
    eq(host(out[2]), [0, 0, 0, 0])
    # a NumPy `mut` argument beside them is still written in place
    yn = np.ones(4, np.float32)
    assert saxpy(2.0, x, yn) is None
    eq(yn, [1, 3, 5, 7])
    del x, p, before, r, q, b, m, y, z, out
    gc.collect()
    print("OK")
    """, pre=LAZY[framework])
    tail = (p.stdout.strip().splitlines() or [""])[-1]
    if p.returncode == 0 and tail.startswith("SKIP"):
        pytest.skip(f"Dr.Jit: {tail}")
    assert p.returncode == 0 and tail == "OK", (
        "rc=%d stdout=%r stderr=%s" % (p.returncode, p.stdout[-500:],
                                       p.stderr[-1500:]))
