"""Issue 23, items 5 and 6: the torch.compile polyfill is installed once
torch._dynamo is really imported, by whatever route (item 5); a Python
number for a 0-d int64/float64 parameter under jax.jit with x64 off reaches
the kernel in the parameter's dtype, exactly as eagerly (item 6)."""
import os
import subprocess
import sys
import textwrap

import pytest

from _findings_util import child_env


# ---- item 5: the Dynamo polyfill, whatever imported torch._dynamo --------------

_TORCH_PRELUDE = """
import importlib, importlib.machinery, importlib.util, os, sys, threading
import dlbridge as dlb
mm = dlb.load(os.environ["DLB_EXAMPLE_KERNELS"], "dlb_kernel_matmul",
              "matmul(a: float32[m, k], b: float32[k, n]) -> float32[m, n]")

class TorchFinder:
    # An import hook installed after dlbridge that serves torch's modules
    # itself (a profiler's or a lazy loader's finder, say): it stands ahead
    # of dlbridge's finder, which is then never asked about torch._dynamo.
    def find_spec(self, name, path, target=None):
        if name == "torch" or name.startswith("torch."):
            return importlib.machinery.PathFinder.find_spec(name, path,
                                                            target)
        return None
"""

_TORCH_CHECK = """
import torch, torch._dynamo
a, b = torch.randn(5, 7), torch.randn(7, 3)
f = lambda a, b: mm(a, b) * 2
out = torch.compile(f, fullgraph=True, backend=BACKEND)(a, b)
assert torch.equal(out, f(a, b)), (out, f(a, b))
assert not any(getattr(w, "_dlbridge_dynamo_watcher", False)
               for w in sys.meta_path), "the finder outlived the polyfill"
print("OK")
"""

_ORDERS = {
    # importlib.util.find_spec looks at torch._dynamo's spec and loads
    # nothing: the finder must not be used up by it.
    "find_spec first": """
        assert importlib.util.find_spec("torch._dynamo") is not None
        assert "torch._dynamo" not in sys.modules
        """,
    "find_spec twice, then torch imported in a thread": """
        importlib.util.find_spec("torch._dynamo")
        importlib.util.find_spec("torch._dynamo")
        t = threading.Thread(target=importlib.import_module,
                             args=("torch._dynamo",))
        t.start(); t.join()
        assert "torch._dynamo" in sys.modules
        """,
    "a finder ahead of dlbridge's serves torch": """
        sys.meta_path.insert(0, TorchFinder())
        """,
    "torch imported in a thread while a finder ahead serves torch": """
        sys.meta_path.insert(0, TorchFinder())
        t = threading.Thread(target=importlib.import_module,
                             args=("torch._dynamo",))
        t.start(); t.join()
        """,
    # a reload runs the module again in the same namespace: the polyfill
    # it installed must not be forgotten, nor installed twice (torch
    # refuses a second one).
    "importlib.reload of dlbridge's modules after the polyfill": """
        import torch._dynamo
        importlib.reload(dlb._ops_torch)
        importlib.reload(dlb)
        """,
    "importlib.reload before torch, and find_spec": """
        importlib.reload(dlb._ops_torch)
        importlib.reload(dlb)
        importlib.util.find_spec("torch._dynamo")
        """,
}


def _with_backend(order, src):
    # Dynamo decides what this is about; one order also runs inductor (the
    # default backend) end to end, the others the quicker "eager" backend.
    backend = "inductor" if order == "find_spec first" else "eager"
    return f"BACKEND = {backend!r}\n" + src


def _run_all(scripts, timeout=600):
    """Run every script in its own fresh interpreter, side by side; each
    must print OK as its last line."""
    env = child_env()
    if not env.get("DLB_EXAMPLE_KERNELS"):
        pytest.skip("build/libdlb_example_kernels.so not built")
    runs = {name: subprocess.Popen(
        [sys.executable, "-c", src], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=env)
        for name, src in scripts.items()}
    failed = {}
    for name, run in runs.items():
        try:
            out, err = run.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            run.kill()
            out, err = run.communicate()
            err += "\n(hung)"
        tail = (out.strip().splitlines() or [""])[-1]
        if run.returncode != 0 or tail != "OK":
            failed[name] = err[-1500:]
    assert not failed, "failed: %s\n%s" % (
        sorted(failed), "\n".join(f"== {k}:\n{v}" for k, v in failed.items()))


def test_dynamo_polyfill_installed_whatever_imported_torch_dynamo():
    """Each order in a fresh interpreter: dlbridge imported and a Function
    made first, then the disturbing step, then torch.compile(fullgraph=True)
    of a function calling the Function must trace it as its operator (no
    "Unsupported method call") and give the eager result."""
    pytest.importorskip("torch")
    _run_all({order: _with_backend(order, _TORCH_PRELUDE +
                                   textwrap.dedent(step) + _TORCH_CHECK)
              for order, step in _ORDERS.items()})


def test_dynamo_imported_before_dlbridge_still_works():
    pytest.importorskip("torch")
    src = ("import torch, torch._dynamo\n" + _TORCH_PRELUDE +
           "assert not any(getattr(w, '_dlbridge_dynamo_watcher', False)\n"
           "               for w in sys.meta_path)\n" + _TORCH_CHECK)
    _run_all({"torch._dynamo first": _with_backend("", src)})


def test_the_finder_stays_until_torch_dynamo_is_imported():
    """A look at torch._dynamo's spec, and imports of other modules, leave
    the finder on sys.meta_path (find_spec imports the parent package,
    torch, but not torch._dynamo)."""
    pytest.importorskip("torch")
    src = _TORCH_PRELUDE + textwrap.dedent("""
        def watchers():
            return [w for w in sys.meta_path
                    if getattr(w, "_dlbridge_dynamo_watcher", False)]
        assert len(watchers()) == 1
        spec = importlib.util.find_spec("torch._dynamo")
        import json, email.parser  # other modules: not the finder's business
        importlib.reload(dlb)
        assert "torch._dynamo" not in sys.modules and len(watchers()) == 1
        print("OK")
        """)
    _run_all({"find_spec": src}, timeout=120)


# ---- item 6: 64-bit numbers under jax.jit without jax_enable_x64 ---------------

def _jax_x64_off():
    jax = pytest.importorskip("jax")
    if jax.config.jax_enable_x64:
        pytest.skip("jax_enable_x64 is on in this process")
    return jax


class _Take:
    """take(a: T, x: float32[n]) -> T: a kernel (ctypes) that copies the
    bytes of its 0-d input into its result and records how the input
    arrived (dtype code, bits, ndim, device type)."""

    def __init__(self):
        import ctypes as C
        from dlpack_ctypes import DLTensor
        kernel_t = C.CFUNCTYPE(C.c_int, C.POINTER(C.POINTER(DLTensor)),
                               C.c_int32, C.c_void_p, C.c_void_p)
        self.seen = []

        def take(args, nargs, stream, err):
            a, out = args[0].contents, args[nargs - 1].contents
            self.seen.append((a.dtype.code, a.dtype.bits, a.ndim,
                              a.device.device_type))
            C.memmove(out.data + out.byte_offset, a.data + a.byte_offset,
                      a.dtype.bits // 8)
            return 0

        self._kernel = kernel_t(take)        # kept alive with the Function
        self.address = C.cast(self._kernel, C.c_void_p).value

    def function(self, dtype):
        import dlbridge as dlb
        return dlb.Function(self.address,
                            f"take_{dtype}(a: {dtype}, x: float32[n]) -> {dtype}")


@pytest.fixture(scope="module")
def take():
    return _Take()


_DL_CODES = {"int64": (0, 64), "uint64": (1, 64), "float64": (2, 64)}

_VALUES = [
    ("int64", 2**40 + 1), ("int64", -(2**62) - 3), ("int64", 2**63 - 1),
    ("uint64", 2**64 - 1), ("uint64", 2**40 + 1),
    ("float64", 1e300), ("float64", 0.1), ("float64", -0.0),
    ("float64", 5e-324), ("float64", 1 / 3),
    ("int64", "np.int64(2**40 + 1)"), ("float64", "np.float64(0.1)"),
    ("float64", "np.array(1e300)"),
]


@pytest.mark.parametrize("dtype,value", _VALUES,
                         ids=[f"{d}-{v}" for d, v in _VALUES])
def test_jit_number_for_64bit_0d_parameter_matches_eager_bit_exactly(
        take, dtype, value):
    """Without jax_enable_x64 a Python number (or NumPy 0-d constant) for a
    0-d int64/uint64/float64 parameter reaches the kernel in that dtype,
    on the host, with the eager call's exact bits (it used to become an
    int32/float32 operand and fail when the graph ran)."""
    import numpy as np
    jax = _jax_x64_off()
    if isinstance(value, str):
        value = eval(value)
    f = take.function(dtype)
    x = np.ones(3, np.float32)
    eager = np.asarray(f(value, x))
    take.seen.clear()
    got = np.asarray(jax.jit(lambda x: f(value, x))(jax.numpy.asarray(x)))
    assert got.dtype == np.dtype(dtype) and got.tobytes() == eager.tobytes(), \
        (got, eager)
    assert take.seen == [_DL_CODES[dtype] + (0, 1)]   # 0-d, kDLCPU


def test_jit_traced_int32_for_int64_parameter_is_a_trace_time_error(take):
    """A traced JAX array cannot be int64 without jax_enable_x64: a
    TypeError when the call is traced, naming the parameter and the flag,
    not an INVALID_ARGUMENT when the graph runs."""
    import numpy as np
    jax = _jax_x64_off()
    f = take.function("int64")
    x = jax.numpy.ones(3, jax.numpy.float32)
    with pytest.raises(TypeError) as e:
        jax.jit(lambda a, x: f(a, x))(np.int32(3), x)
    message = str(e.value)
    assert "argument 'a'" in message and "jax_enable_x64" in message
    assert "int64" in message and "int32" in message


def test_jit_numpy_64bit_array_constant_is_a_trace_time_error(take):
    """A NumPy int64 array constant for an int64[k] parameter would be
    narrowed by JAX too: refused at trace time, saying why."""
    import numpy as np
    import dlbridge as dlb
    jax = _jax_x64_off()
    f = dlb.Function(take.address, "takes(a: int64[k], x: float32[n]) -> int64")
    with pytest.raises(TypeError, match=r"argument 'a'.*jax_enable_x64"):
        jax.jit(lambda x: f(np.arange(2), x))(jax.numpy.ones(3))


def test_jit_number_for_complex128_parameter_is_a_trace_time_error(take):
    import numpy as np
    import dlbridge as dlb
    jax = _jax_x64_off()
    f = dlb.Function(take.address, "takec(a: complex128, x: float32[n])")
    with pytest.raises(TypeError, match=r"argument 'a'.*jax_enable_x64"):
        jax.jit(lambda x: f(1j, x))(np.ones(3, np.float32))


def test_jax_export_of_a_64bit_number_round_trips(take):
    """The number is a typed attribute of the custom call (dlb_arg<i>), so
    an exported graph carries it exactly and runs after deserialize."""
    import numpy as np
    pytest.importorskip("jax")
    from jax import export
    import dlbridge as dlb
    jax = _jax_x64_off()
    fi, ff = take.function("int64"), take.function("float64")
    g = jax.jit(lambda x: (fi(2**40 + 1, x), ff(0.1, x)))
    x = jax.numpy.ones(3, jax.numpy.float32)
    exported = export.export(g, disabled_checks=dlb.jax_export_checks())(x)
    assert "dlb_arg0 = 1099511627777 : i64" in exported.mlir_module()
    again = export.deserialize(exported.serialize())
    got = again.call(x)
    assert np.asarray(got[0]).tobytes() == np.int64(2**40 + 1).tobytes()
    assert np.asarray(got[1]).tobytes() == np.float64(0.1).tobytes()


def test_handler_refuses_a_scalar_attribute_for_a_tensor_parameter(take):
    """A hand-made custom call whose dlb_arg<i> names a parameter that is
    not a 0-d input, or gives another dtype: the handler's error, named."""
    import numpy as np
    from dlbridge import _ops_jax
    jax = _jax_x64_off()
    f = take.function("int64")
    np.asarray(jax.jit(lambda x: f(2**40, x))(np.ones(3, np.float32)))
    out = jax.ShapeDtypeStruct((), np.int64)
    x = np.ones(3, np.float32)
    call = jax.ffi.ffi_call(_ops_jax.TARGET, out)
    with pytest.raises(Exception, match="dlb_arg1' does not name a 0-d"):
        np.asarray(jax.jit(lambda x: call(
            x, x, dlb_identity=f._identity, dlb_arg1=np.int64(3)))(x))
    with pytest.raises(Exception, match="argument 0 is a float64 tensor"):
        np.asarray(jax.jit(lambda x: call(
            x, dlb_identity=f._identity, dlb_arg0=np.float64(3)))(x))


def test_cuda_handler_gives_the_number_as_a_host_tensor(take):
    """On CUDA too the number arrives as the eager call gives it: a 0-d
    tensor on the host (the operands are on the GPU).  XLA's side is the
    recording fake of test_compiled_jax (no GPU needed)."""
    import ctypes as C
    import numpy as np
    import dlbridge as dlb
    _jax_x64_off()
    cj = pytest.importorskip("test_compiled_jax")

    class Scalar(C.Structure):              # XLA_FFI_Scalar
        _fields_ = [("dtype", C.c_int), ("value", C.c_void_p)]

    f = take.function("int64")
    dlb.jax_register(f)
    xla = cj.FakeXla(stream=0x1234, ordinal=0)
    keep = []
    value = C.c_int64(2**40 + 1)
    scalar = Scalar(5, C.addressof(value))  # S64
    x, out = np.ones(3, np.float32), np.zeros((), np.int64)
    frame = cj._Frame()
    frame.struct_size = 168
    frame.api = C.pointer(xla.api)
    frame.ctx = C.addressof(xla.ctx)
    frame.args = xla._buffers([x], keep)
    frame.rets = xla._buffers([out], keep)
    spans = [cj._Span(b"dlb_arg0", 8), cj._Span(b"dlb_identity", 12)]
    ident = f._identity.encode()
    identity = cj._Span(ident, len(ident))
    names = (C.POINTER(cj._Span) * 2)(*[C.pointer(s) for s in spans])
    values = (C.c_void_p * 2)(C.addressof(scalar), C.addressof(identity))
    types = (C.c_int * 2)(3, 4)
    frame.attrs = cj._Attrs(48, None, 2, types, names, values)
    take.seen.clear()
    assert xla.handler("cuda")(C.byref(frame)) is None, xla.errors
    assert out[()] == 2**40 + 1
    assert take.seen == [(0, 64, 0, 1)]     # int64, 0-d, kDLCPU
