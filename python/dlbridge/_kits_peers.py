"""Kits for the DLPack peers of issue 17: MLX (CPU backend), NVIDIA Warp,
Open3D (CPU build), Dr.Jit, onnxruntime and array-api-strict.

Facts about each (how it calls ``__dlpack__``, capsule kinds, dtypes):
the versions named in docs/doctor.md.  A kit whose framework is not
installed is skipped.  Each kit's name is the name ``dlbridge.convert``
takes for it (DESIGN.md); until the registry knows a peer, convert refuses
it as an unknown target, which the doctor reports as dlbridge's gap.
"""

from ._kits_base import FP8_DTYPES, STRIDED, Kit, Limit, Unavailable, sliced

_MOVED = STRIDED + ("offset",)


class MLX(Kit):
    name = "mlx"
    module = "mlx"
    bench = True
    own_label = "mx.from_dlpack({})"
    limits = (
        Limit("mx.from_dlpack narrows float64 to float32 (MLX's default "
              "float type) without a word", dtypes=("float64",),
              outcomes=("wrong",), paths=("own",)),
        Limit("MLX copies every import on its CPU backend "
              "(\"Cannot import a CPU array without a copy\")",
              outcomes=("copied",)),
        Limit("MLX has no float8 dtypes", dtypes=FP8_DTYPES),
        Limit("mx.from_dlpack refuses negative strides", layouts=("negative",),
              copyable=True),
    )

    def load(self):
        import mlx.core  # noqa: F401

    def make(self, np, a, dtype, layout):
        import mlx.core as mx
        if dtype in FP8_DTYPES:
            raise Unavailable(f"MLX has no {dtype}")
        if layout == "read-only":
            raise Unavailable("MLX arrays cannot be read-only")
        # the dtype named: mx.array narrows float64 to float32 by default
        x = mx.array(a, dtype=getattr(mx, {"bool": "bool_", "bfloat16": "uint16"}
                                      .get(dtype, dtype)))
        if dtype == "bfloat16":
            x = x.view(mx.bfloat16)
        return sliced(x, layout), sliced(a, layout)

    def own_importer(self, dtype="float32"):
        import mlx.core as mx
        return mx.from_dlpack

    def op(self):
        import mlx.core as mx
        return "mx.add(a, b)", "add(a, b)", {"add": mx.add}


class Warp(Kit):
    name = "warp"
    module = "warp"
    dist = "warp-lang"
    bench = True
    own_label = "wp.from_dlpack({})"
    limits = (
        Limit("Warp has no complex or float8 dtypes",
              dtypes=("complex64",) + FP8_DTYPES),
        Limit("Warp arrays have at least one dimension (wp.from_dlpack of a "
              "0-d tensor: IndexError)", layouts=("0-d",)),
        Limit("wp.from_dlpack ignores DLPack's byte_offset: it reads the "
              "wrong elements of a producer that sets one (MLX's views)",
              layouts=_MOVED, outcomes=("wrong",), paths=("own",)),
        Limit("wp.from_dlpack returns a writable array over read-only memory, "
              "or asks for a legacy capsule, which cannot say read-only",
              read_only=True, copyable=True),
    )

    def load(self):
        import warp
        warp.config.quiet = True     # its banner would go to stdout
        warp.init()

    def make(self, np, a, dtype, layout):
        import warp as wp
        if dtype.startswith("complex") or dtype in FP8_DTYPES:
            raise Unavailable(f"Warp has no {dtype}")
        if layout in ("0-d", "negative", "read-only"):
            raise Unavailable("Warp arrays have at least one dimension, no "
                              "negative strides and no read-only flag")
        x = wp.array(a, dtype=getattr(wp, "uint16" if dtype == "bfloat16"
                                      else dtype), device="cpu")
        if dtype == "bfloat16":
            x = x.view(wp.bfloat16)
        return sliced(x, layout, transpose=lambda v: v.transpose()), sliced(a, layout)

    def own_importer(self, dtype="float32"):
        import warp as wp
        return wp.from_dlpack


class Open3D(Kit):
    name = "open3d"
    module = "open3d"
    dist = "open3d-cpu"
    own_label = "o3c.Tensor.from_dlpack({})"
    limits = (
        Limit("Open3D's __dlpack_device__ returns (DLDeviceType.CPU, 0) with "
              "a plain Enum, which the array API allows and this importer "
              "does not take", role="producer", paths=("own",),
              when=lambda cell: "DLDeviceType" in cell.get("message", ""),
              dlbridge_too=False),
        Limit("Open3D has no float16, bfloat16, complex or float8 dtypes",
              dtypes=("float16", "bfloat16", "complex64") + FP8_DTYPES),
        Limit("Open3D's importer returns a writable tensor over read-only "
              "memory, or asks for a legacy capsule, which cannot say "
              "read-only", read_only=True, copyable=True),
    )
    bench = True

    def load(self):
        import open3d.core  # noqa: F401

    def make(self, np, a, dtype, layout):
        import open3d.core as o3c
        if dtype in ("float16", "bfloat16", "complex64") or dtype in FP8_DTYPES:
            raise Unavailable(f"Open3D has no {dtype}")
        if layout == "read-only":
            raise Unavailable("Open3D tensors cannot be read-only")
        t = o3c.Tensor(a)
        return sliced(t, layout, transpose=lambda v: v.T()), sliced(a, layout)

    def own_importer(self, dtype="float32"):
        import open3d.core as o3c
        return o3c.Tensor.from_dlpack

    def exportable(self, obj):
        # Its __dlpack_device__ says (DLDeviceType.CPU, 0) with a plain Enum;
        # its own legacy capsule is what the doctor reads results through.
        return obj.to_dlpack()

    def op(self):
        return "a + b", "a + b", {}


# Dr.Jit's tensor types, by dtype: the result type of an import is chosen
# by the caller (Dr.Jit converts nothing implicitly).
_DRJIT_TENSORS = {"bool": "TensorXb", "int8": "TensorXi8", "int32": "TensorXi",
                  "int64": "TensorXi64", "uint8": "TensorXu8",
                  "float16": "TensorXf16", "float32": "TensorXf",
                  "float64": "TensorXf64"}


class DrJit(Kit):
    name = "drjit"
    module = "drjit"
    bench = True
    limits = (
        Limit("Dr.Jit copies imports it cannot share", outcomes=("copied",)),
        Limit("Dr.Jit has no tensor type of this dtype (it has "
              + ", ".join(sorted(_DRJIT_TENSORS)) + ")",
              when=lambda cell: cell["dtype"] not in _DRJIT_TENSORS),
        Limit("Dr.Jit imports only C-contiguous data", layouts=STRIDED,
              copyable=True),
        Limit("Dr.Jit's tensors share read-only memory, writable",
              read_only=True, copyable=True),
        Limit("TensorFlow and Dr.Jit's LLVM backend in one process abort at "
              "exit (\"free(): invalid pointer\"), without dlbridge too",
              role="either", partner="tensorflow", outcomes=("crashed",)),
    )

    own_label = "drjit TensorX<dtype>({})"

    def _backend_name(self):
        # drjit.llvm when it loads (it needs libLLVM), else drjit.scalar
        try:
            import drjit.llvm  # noqa: F401
            return "drjit.llvm"
        except ImportError:
            return "drjit.scalar"

    def _backend(self):
        import importlib
        return importlib.import_module(self._backend_name())

    def load(self):
        self._backend()

    def make(self, np, a, dtype, layout):
        if dtype not in _DRJIT_TENSORS:
            raise Unavailable(f"Dr.Jit has no {dtype} tensor")
        if layout in _MOVED or layout == "read-only":
            raise Unavailable("Dr.Jit tensors are compact and writable")
        return getattr(self._backend(), _DRJIT_TENSORS[dtype])(a), a

    def own_importer(self, dtype="float32"):
        tensor = _DRJIT_TENSORS.get(dtype)
        if tensor is None:
            raise TypeError(f"Dr.Jit has no {dtype} tensor type")
        return getattr(self._backend(), tensor)

    def op(self):
        return "a + b", "a + b", {}


# onnxruntime's element types (ONNX TensorProto codes) for the dtypes NumPy
# cannot hold.
_ONNX_TYPES = {"bfloat16": 16, "float8_e4m3fn": 17, "float8_e5m2": 19}


class ONNXRuntime(Kit):
    name = module = "onnxruntime"
    short = "ort"
    bench = True
    own_label = "ort.OrtValue.from_dlpack({})"
    limits = (
        Limit("onnxruntime's DLPack has no complex dtypes",
              dtypes=("complex64",)),
        Limit("OrtValue.from_dlpack imports only contiguous data "
              "(\"IsContiguousTensor(...) was false\")", layouts=STRIDED,
              copyable=True),
        Limit("OrtValue.from_dlpack returns a writable value over read-only "
              "memory, or asks for a legacy capsule, which cannot say "
              "read-only", read_only=True, copyable=True),
    )

    def make(self, np, a, dtype, layout):
        import onnxruntime as ort
        if dtype.startswith("complex"):
            raise Unavailable("onnxruntime cannot export complex through DLPack")
        if layout in STRIDED or layout == "read-only":
            raise Unavailable("OrtValues are compact and writable")
        ref = sliced(a, layout)
        if dtype in _ONNX_TYPES:
            return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                np.ascontiguousarray(ref), _ONNX_TYPES[dtype]), ref
        return ort.OrtValue.ortvalue_from_numpy(ref), ref

    def own_importer(self, dtype="float32"):
        import onnxruntime as ort
        return ort.OrtValue.from_dlpack


class ArrayAPIStrict(Kit):
    name = module = "array_api_strict"
    short = "xp-strict"
    dist = "array-api-strict"
    bench = True
    own_label = "xp.from_dlpack({})"
    limits = (
        Limit("array-api-strict has no float16, bfloat16 or float8 (\"The "
              "array_api_strict namespace does not support the dtype\")",
              dtypes=("float16", "bfloat16") + FP8_DTYPES),
    )

    def make(self, np, a, dtype, layout):
        import array_api_strict as xp
        if dtype in ("float16", "bfloat16") or dtype in FP8_DTYPES:
            raise Unavailable(f"array-api-strict has no {dtype}")
        if layout == "read-only":
            ro = a.copy()
            ro.setflags(write=False)
            return xp.asarray(ro), a
        return sliced(xp.asarray(a), layout), sliced(a, layout)

    def own_importer(self, dtype="float32"):
        import array_api_strict as xp
        return xp.from_dlpack

    def writable(self, result):
        import numpy
        return bool(numpy.from_dlpack(result).flags.writeable)

    def op(self):
        import array_api_strict as xp
        return "xp.add(a, b)", "add(a, b)", {"add": xp.add}


PEER_KITS = (MLX(), Warp(), Open3D(), DrJit(), ONNXRuntime(), ArrayAPIStrict())
