"""What real DLPack libraries outside the team exposed in dlbridge's
readers (issue 17), checked against their current wheels.

Open3D, onnxruntime and PaddlePaddle each run in a fresh interpreter that
loads dlbridge and that one peer only: PaddlePaddle aborts in a process
that loaded TensorFlow, and TensorFlow, torch, JAX, Open3D and Dr.Jit
loaded together abort at exit (upstream; not dlbridge).  TensorFlow, which
the rest of the suite loads anyway, is checked here in-process.  A peer
that is not installed skips its test.  The stand-in producers for the same
defects are in test_producer_cases.py and test_exchange.py.
"""
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

import dlbridge as dlb


def run_with(module, code, env=None):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, **(env or {})))
    assert r.returncode == 0 and "PEER-OK" in r.stdout, r.stdout + r.stderr[-3000:]


def test_open3d_plain_enum_device():
    # Open3D 0.20: __dlpack_device__() is (DLDeviceType.CPU, 0) with a plain
    # enum.Enum; dlb.from_dlpack raised TypeError on it.
    run_with("open3d", """
        import enum
        import numpy as np, dlbridge as dlb, open3d.core as o3c
        x = o3c.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
        kind, dev_id = x.__dlpack_device__()
        assert isinstance(kind, enum.Enum) and not isinstance(kind, int), kind
        address = dlb.from_dlpack(x.to_dlpack()).data_ptr  # a raw capsule
        t = dlb.from_dlpack(x)
        assert t.device == "cpu" and t.data_ptr == address
        assert t.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
        assert dlb.device(x.__dlpack_device__()) == "cpu"
        # and back: Open3D takes dlbridge's export
        y = o3c.Tensor.from_dlpack(t.__dlpack__())
        assert dlb.from_dlpack(y.to_dlpack()).data_ptr == address
        print("PEER-OK")
    """)


def test_onnxruntime_int2_uint2():
    # onnxruntime 1.32 exports int2 / uint2 as (0, 2) / (1, 2) in legacy
    # capsules: packed, four to a byte.  They were refused.
    run_with("onnxruntime", """
        import ctypes
        import numpy as np, dlbridge as dlb, onnxruntime as ort
        INT2, UINT2, INT4 = 26, 25, 22   # onnx.TensorProto
        for code, name, bits in ((INT2, "int2", 2), (UINT2, "uint2", 2),
                                 (INT4, "int4", 4)):
            v = ort.OrtValue.ortvalue_from_shape_and_type([3, 5], code)
            t = dlb.from_dlpack(v)
            assert t.dtype == name and t.dtype.bits == bits, t.dtype
            assert t.shape == (3, 5) and t.data_ptr == v.data_ptr()
            assert t.nbytes == (15 * bits + 7) // 8     # packed
            pattern = bytes(range(0xA0, 0xA0 + t.nbytes))
            ctypes.memmove(t.data_ptr, pattern, t.nbytes)
            c = t.copy()                                 # packed copy
            assert ctypes.string_at(c.data_ptr, c.nbytes) == pattern
            # back into onnxruntime: the same memory, the same type
            b = ort.OrtValue.from_dlpack(t)
            assert b.data_type() == "tensor(%s)" % name, b.data_type()
            assert b.shape() == [3, 5] and b.data_ptr() == v.data_ptr()
        print("PEER-OK")
    """)


PADDLE = """
    import paddle, dlbridge as dlb
    x = paddle.to_tensor([1.0, 2.0, 3.0], place=paddle.CPUPlace())
    kind, dev_id = x.__dlpack_device__()
    assert dev_id is None, x.__dlpack_device__()   # PaddlePaddle 3.3's quirk

    class Wrapped:
        def __init__(self, x):
            self.x = x
        def __dlpack__(self, **kw):
            return self.x.__dlpack__(**kw)
        def __dlpack_device__(self):
            return self.x.__dlpack_device__()

    for obj in (Wrapped(x), x):
        t = dlb.from_dlpack(obj)
        assert t.device == "cpu" and t.tolist() == [1.0, 2.0, 3.0]
        assert t.data_ptr == x.data_ptr()
    print("PEER-OK")
"""


@pytest.mark.parametrize("skip_exchange", [False, True])
def test_paddle_cpu_device_id_none(skip_exchange):
    # PaddlePaddle 3.3's __dlpack_device__() is (kDLCPU, None): read through
    # __dlpack__ (a wrapper, or the exchange table switched off) dlbridge
    # raised a bare TypeError on the None.
    env = {"DLBRIDGE_SKIP_EXCHANGE_API": "1"} if skip_exchange else {}
    run_with("paddle", PADDLE, env)


def test_tensorflow_copy_true_through_dunder():
    # TensorFlow 2.21's __dlpack__ refuses copy=True with RuntimeError: asked
    # again without it, dlbridge copies.  (A bare tf.Tensor takes TF's own
    # export, which has no keywords; a wrapper keeps __dlpack__ in the way.)
    tf = pytest.importorskip("tensorflow")
    x = tf.constant([1.0, 2.0, 3.0])
    with pytest.raises(RuntimeError, match="copy=True"):
        x.__dlpack__(copy=True)

    class Wrapped:
        def __init__(self):
            self.calls = []

        def __dlpack__(self, **kw):
            self.calls.append(sorted(kw))
            return x.__dlpack__(**kw)

        def __dlpack_device__(self):
            return x.__dlpack_device__()
    w = Wrapped()
    shared = dlb.from_dlpack(x)
    t = dlb.from_dlpack(w, copy=True)
    assert t.tolist() == [1.0, 2.0, 3.0] and t.data_ptr != shared.data_ptr
    assert w.calls == [["copy", "max_version"], ["max_version"]]
    assert dlb.from_dlpack(x, copy=True).data_ptr != shared.data_ptr
