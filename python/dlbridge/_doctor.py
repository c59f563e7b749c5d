"""`dlbridge doctor`: every installed framework against every other.

For each ordered pair (producer -> consumer) a child process builds tensors
in the producer and hands them to the consumer twice: through the
consumer's own DLPack importer ("own") and through ``dlbridge.convert``
("dlb").  Each probe becomes a cell outcome:

zero-copy  data pointers equal and bytes equal
copied     bytes equal, different memory
refused    the importer raised (message kept)
wrong      the bytes differ from what was produced
crashed    the child process died (signal kept)

Children are used because some frameworks abort the interpreter on inputs
they dislike and some pairs cannot even be imported together.
"""

import importlib.util
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from ._frameworks import FRAMEWORKS, REGISTRY

SCHEMA_VERSION = 1
OUTCOMES = ("zero-copy", "copied", "refused", "wrong", "crashed")
# Worst first: a cell is coloured by its worst outcome.
_SEVERITY = {"zero-copy": 0, "copied": 1, "refused": 2, "wrong": 3, "crashed": 4}
# Every framework of the registry (python/dlbridge/_frameworks.py) but
# the GPU-only ones (cupy, numba's device arrays, cuda.core), whose cells
# the GPU check covers (tests/gpu); dlbridge last.
_GPU_ONLY = ("cupy", "numba", "cuda.core")
CANDIDATES = tuple([n for n in REGISTRY if n not in _GPU_ONLY + ("dlbridge",)]
                   + ["dlbridge"])
# float8 (DLPack 1.1's codes) is probed where a framework that can hold it
# is installed: ml_dtypes (NumPy's, JAX's and TensorFlow's float8 types),
# torch, paddle.
FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")
FP8_HOLDERS = ("ml_dtypes", "torch", "paddle")
DTYPES = ("bool", "int8", "int32", "int64", "uint8", "uint16", "float16",
          "float32", "float64", "complex64", "bfloat16") + (
              FP8_DTYPES if any(importlib.util.find_spec(m) is not None
                                for m in FP8_HOLDERS) else ())
LAYOUTS = ("contiguous", "transposed", "step", "negative", "0-d", "size-0",
           "offset", "read-only")
CRASH_ENV = "DLBRIDGE_DOCTOR_TEST_CRASH"   # test hook: adds an aborting producer
# TensorFlow's kernels need 64-byte aligned data; its importer takes any
# address and the process aborts on the first op over unaligned data, so
# dlbridge.convert copies unaligned data for it (by design, not a defect).
TF_ALIGNMENT = 64
UNALIGNED_FOR_TF = ("the data is not 64-byte aligned, which TensorFlow's "
                    "kernels need: dlbridge copies it (TensorFlow's own "
                    "importer shares it, then aborts on the first op)")

# Known upstream limitations, keyed by (framework, condition).  Found by
# running the doctor (versions in docs/doctor.md); a refusal matching one is
# labelled with the reason instead of being reported as unexplained.
KNOWN_LIMITATIONS = {
    ("torch", "negative"): "torch tensors cannot have negative strides; "
                           "torch.from_dlpack aborts the process on them",
    ("torch", "read-only"): "torch tensors cannot be read-only",
    ("numpy", "bfloat16"): "NumPy has no bfloat16 dtype (an ml_dtypes "
                           "bfloat16 array cannot be exported either)",
    ("numpy", "float8"): "NumPy has no float8 dtypes (np.from_dlpack refuses "
                         "them; an ml_dtypes float8 array cannot be exported "
                         "either)",
    ("tensorflow", "float8"): "TensorFlow's DLPack has no float8 dtypes "
                              "(\"DT_FLOAT8_E4M3FN is not supported by "
                              "dlpack\"), either way",
    ("tensorflow", "layout"): "TensorFlow imports only compact row-major, "
                              "64-byte aligned data",
    ("tensorflow", "read-only"): "TensorFlow imports through the legacy "
                                 "capsule, which cannot say read-only",
    ("jax", "layout"): "JAX arrays are always compact; strided inputs are "
                       "refused or copied",
    ("jax", "read-only"): "JAX imports through the legacy capsule",
    ("jax", "negative"): "JAX imports only compact data (or a transposition "
                         "of it); negative strides are refused",
    ("pyarrow", "import"): "PyArrow has no DLPack importer",
    ("pyarrow", "produce"): "PyArrow exports only 1-D primitive arrays",
    ("paddle", "layout"): "paddle.from_dlpack needs compact data",
    ("paddle", "tensorflow"): "paddle and TensorFlow crash (SIGSEGV) when "
                              "both are loaded in one process",
    ("dlbridge", "convert"): "dlbridge.convert has no target for this "
                             "framework yet (only " + ", ".join(FRAMEWORKS)
                             + ")",
}


# CUDA: where a GPU is present, these frameworks are probed again with their
# tensors on cuda:0, as "<name>:cuda" producers and consumers (pairs stay on
# one kind of device: a CPU producer is never offered to a CUDA consumer).
CUDA_CANDIDATES = ("torch", "cupy", "jax", "dlbridge")
CUDA_SUFFIX = ":cuda"


def _base(name):
    """The framework of a producer/consumer name ("torch:cuda" -> "torch")."""
    return name.split(":", 1)[0]


def _on_cuda(name):
    return name.endswith(CUDA_SUFFIX)


def _cuda_present():
    """Whether the CUDA driver reports a device (no framework imported)."""
    from . import _core
    return _core._cuda_device_count() > 0


def installed_frameworks(cuda=None):
    """Names of the candidate frameworks present, none of them imported;
    with a GPU (``cuda`` None: ask the driver), also "<name>:cuda" for the
    CUDA-capable ones."""
    found = [n for n in CANDIDATES if n == "dlbridge"
             or importlib.util.find_spec(n) is not None]
    if os.environ.get(CRASH_ENV):
        found.append("crasher")
    if cuda is None:
        cuda = _cuda_present()
    if cuda:
        found += [n + CUDA_SUFFIX for n in CUDA_CANDIDATES
                  if n == "dlbridge" or importlib.util.find_spec(n) is not None]
    return found


def pairs_of(fws):
    """Ordered (producer, consumer) pairs, each on one kind of device."""
    consumers = [f for f in fws if f != "crasher"]
    return [(p, c) for p in fws for c in consumers
            if _on_cuda(p) == _on_cuda(c)]


def cases():
    out = [(d, "contiguous") for d in DTYPES]
    out += [("float32", lay) for lay in LAYOUTS if lay != "contiguous"]
    return out


def known_reason(consumer, producer, dtype, layout, path="own"):
    consumer, producer = _base(consumer), _base(producer)
    lim = KNOWN_LIMITATIONS
    if {consumer, producer} == {"paddle", "tensorflow"}:
        return lim[("paddle", "tensorflow")]
    if path == "dlb" and consumer in ("pyarrow", "paddle", "tvm_ffi"):
        return lim[("dlbridge", "convert")]
    if layout in ("transposed", "step", "negative", "offset"):
        key = "negative" if layout == "negative" else "layout"
        for fw in (consumer,):
            if (fw, layout) in lim:
                return lim[(fw, layout)]
            if (fw, key) in lim:
                return lim[(fw, key)]
    if dtype == "bfloat16" and "numpy" in (consumer, producer):
        return lim[("numpy", "bfloat16")]
    if dtype in FP8_DTYPES:
        for fw in ("numpy", "tensorflow"):
            if fw in (consumer, producer):
                return lim[(fw, "float8")]
    if (consumer, dtype) in lim:
        return lim[(consumer, dtype)]
    if (consumer, layout) in lim:
        return lim[(consumer, layout)]
    if consumer == "pyarrow":
        return lim[("pyarrow", "import")]
    return None


# ---------------------------------------------------------------- child side

def _source(np, dtype, layout):
    """The NumPy reference for a case and its storage dtype."""
    storage = ("uint16" if dtype == "bfloat16" else
               "uint8" if dtype in FP8_DTYPES else dtype)
    if layout == "0-d":
        return np.array(7, dtype=storage)
    base = (np.arange(1, 25) % 5).astype(storage).reshape(4, 6)
    if dtype == "bool":
        base = base.astype(bool)
    if layout == "size-0":
        return base[:0]
    return base


def _layout_np(a, layout):
    return {"transposed": lambda: a.T, "step": lambda: a[:, ::2],
            "negative": lambda: a[::-1], "offset": lambda: a[1:]}.get(
                layout, lambda: a)()


def _produce(fw, np, dtype, layout):
    """(object, reference ndarray) or raise NotImplementedError."""
    a = _source(np, dtype, layout)
    bf = dtype == "bfloat16"
    # float8: the bit patterns 0..4 of the uint8 source, viewed as float8
    # (small finite numbers in both formats), so bytes compare exactly.
    f8 = dtype if dtype in FP8_DTYPES else None
    strided = layout in ("transposed", "step", "negative", "offset")
    ref = _layout_np(a, layout)
    if fw == "numpy":
        if bf or f8:
            try:
                import ml_dtypes
            except ImportError:
                raise NotImplementedError("no ml_dtypes") from None
            obj = ref.view(getattr(ml_dtypes, f8 or "bfloat16"))
        else:
            obj = ref.copy() if layout == "read-only" else ref
        if layout == "read-only":
            obj.setflags(write=False)
        return obj, ref
    if fw == "dlbridge":
        import dlbridge
        if bf:
            raise NotImplementedError("no bfloat16 source")
        if f8:
            # NumPy cannot export float8, so the bytes are put into a
            # dlbridge float8 tensor directly.
            import ctypes
            t = dlbridge.empty(ref.shape, f8)
            ctypes.memmove(t.data_ptr, ref.ctypes.data, ref.nbytes)
            return t, ref
        v = ref.copy() if layout == "read-only" else ref
        if layout == "read-only":
            v.setflags(write=False)
        return dlbridge.from_dlpack(v), ref
    if fw == "crasher":
        class Crasher:
            def __dlpack__(self, **kw):
                os.abort()

            def __dlpack_device__(self):
                return (1, 0)
        return Crasher(), ref
    if layout == "read-only":
        raise NotImplementedError("no read-only tensors")
    if fw == "torch":
        import torch
        if layout == "negative":
            raise NotImplementedError("no negative strides")
        t = torch.from_numpy(a.copy())
        if bf:
            t = t.view(torch.bfloat16)
        if f8:
            if not hasattr(torch, f8):
                raise NotImplementedError(f"torch {torch.__version__} has no {f8}")
            t = t.view(getattr(torch, f8))
        t = {"transposed": lambda: t.T, "step": lambda: t[:, ::2],
             "offset": lambda: t[1:]}.get(layout, lambda: t)()
        return t, ref
    if strided:
        raise NotImplementedError("compact tensors only")
    if fw == "jax":
        import jax.numpy as jnp
        x = jnp.asarray(a)
        return (x.view(getattr(jnp, f8 or "bfloat16")) if bf or f8 else x), ref
    if fw == "tensorflow":
        import tensorflow as tf
        if f8:   # tf.bitcast has no float8; TF's float8 types are ml_dtypes'
            import ml_dtypes
            return tf.constant(a.view(getattr(ml_dtypes, f8))), ref
        x = tf.constant(a)
        return (tf.bitcast(x, tf.bfloat16) if bf else x), ref
    if fw == "paddle":
        import paddle
        if bf or a.dtype.kind == "u" and a.dtype.itemsize > 1:
            raise NotImplementedError("dtype not held")
        if f8:
            if not hasattr(paddle, f8):
                raise NotImplementedError(f"paddle has no {f8}")
            return paddle.to_tensor(a).view(getattr(paddle, f8)), ref
        return paddle.to_tensor(a), ref
    if fw == "pyarrow":
        import pyarrow as pa
        if (a.ndim != 1 and layout != "contiguous" or bf or f8
                or dtype.startswith("complex")):
            raise NotImplementedError("1-D primitive arrays only")
        flat = a.ravel()
        return pa.array(flat), flat
    if fw == "tvm_ffi":
        import tvm_ffi
        if f8:
            raise NotImplementedError("no float8 source")
        return tvm_ffi.from_dlpack(a), ref
    raise NotImplementedError(fw)


def _produce_cuda(fw, np, dtype, layout):
    """(object on cuda:0, reference ndarray) or raise NotImplementedError."""
    a = _source(np, dtype, layout)
    ref = _layout_np(a, layout)
    strided = layout in ("transposed", "step", "negative", "offset")
    if layout == "read-only":
        raise NotImplementedError("no read-only CUDA tensors")
    if dtype in FP8_DTYPES:
        raise NotImplementedError("float8 is probed on the CPU only")
    bf = dtype == "bfloat16"
    if fw == "torch":
        import torch
        if layout == "negative":
            raise NotImplementedError("no negative strides")
        t = torch.from_numpy(a.copy()).to("cuda:0")
        if bf:
            t = t.view(torch.bfloat16)
        t = {"transposed": lambda: t.T, "step": lambda: t[:, ::2],
             "offset": lambda: t[1:]}.get(layout, lambda: t)()
        return t, ref
    if fw == "cupy":
        import cupy
        if bf:
            raise NotImplementedError("CuPy has no bfloat16")
        return _layout_np(cupy.asarray(a), layout), ref
    if fw == "jax":
        import jax
        if strided:
            raise NotImplementedError("compact arrays only")
        gpus = jax.devices("gpu")
        x = jax.device_put(a, gpus[0])
        return (x.view(jax.numpy.bfloat16) if bf else x), ref
    if fw == "dlbridge":
        import dlbridge
        if bf or strided:
            raise NotImplementedError("compact non-bfloat16 sources only")
        return dlbridge.from_dlpack(np.ascontiguousarray(ref),
                                    device="cuda:0"), ref
    raise NotImplementedError(fw)


def _own_import(consumer, obj):
    consumer = _base(consumer)
    if consumer == "cupy":
        import cupy
        return cupy.from_dlpack(obj)
    if consumer == "numpy":
        import numpy as np
        return np.from_dlpack(obj)
    if consumer == "torch":
        import torch
        return torch.from_dlpack(obj)
    if consumer == "jax":
        import jax.dlpack
        return jax.dlpack.from_dlpack(obj)
    if consumer == "tensorflow":
        import tensorflow as tf
        return tf.experimental.dlpack.from_dlpack(obj.__dlpack__())
    if consumer == "paddle":
        import paddle
        f = getattr(paddle, "from_dlpack", None) or paddle.utils.dlpack.from_dlpack
        return f(obj)
    if consumer == "tvm_ffi":
        import tvm_ffi
        return tvm_ffi.from_dlpack(obj)
    if consumer == "dlbridge":
        import dlbridge
        return dlbridge.from_dlpack(obj)
    raise BufferError(f"{consumer} has no DLPack importer")


def _dlb_import(consumer, obj):
    import dlbridge
    return dlbridge.convert(obj, _base(consumer))


def _inspect(x):
    """(data pointer, bytes in logical order) of any tensor."""
    import numpy as np
    import dlbridge
    try:
        t = dlbridge.from_dlpack(x)
    except Exception:
        if type(x).__module__.startswith("tensorflow"):
            import tensorflow as tf
            t = dlbridge.from_dlpack(tf.experimental.dlpack.to_dlpack(x))
        else:
            raise
    import ctypes
    item = t.itemsize
    if t.size == 0:
        return t.data_ptr, b""
    if t.__dlpack_device__()[0] != 1:
        # device memory: its bytes through dlbridge's host copy
        return t.data_ptr, _inspect(t.copy(device="cpu"))[1]
    lo = sum(min(0, (n - 1) * s) for n, s in zip(t.shape, t.strides))
    hi = sum(max(0, (n - 1) * s) for n, s in zip(t.shape, t.strides)) + 1
    buf = (ctypes.c_char * ((hi - lo) * item)).from_address(t.data_ptr + lo * item)
    view = np.ndarray(t.shape, dtype=f"V{item}", buffer=buf, offset=-lo * item,
                      strides=tuple(s * item for s in t.strides))
    return t.data_ptr, view.tobytes()


def _probe(path, consumer, obj, ref, src_ptr):
    importer = _own_import if path == "own" else _dlb_import
    try:
        res = importer(consumer, obj)
    except Exception as e:   # any refusal is a cell, whatever its type
        return "refused", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    if res is obj:   # handed back as it is: the same memory
        return "zero-copy", ""
    try:
        ptr, data = _inspect(res)
    except Exception as e:
        return "copied", f"result not inspectable ({type(e).__name__}); assumed copied"
    if data != ref.tobytes():
        return "wrong", "values differ from the producer's"
    if ptr == src_ptr or ref.size == 0:
        return "zero-copy", ""
    if (path == "dlb" and _base(consumer) == "tensorflow" and src_ptr
            and src_ptr % TF_ALIGNMENT):
        return "copied", UNALIGNED_FOR_TF
    return "copied", ""


def child(producer, consumer, first=0):
    """Run the probes of one pair from probe number ``first`` on."""
    import numpy as np
    for index, (dtype, layout) in enumerate(cases()):
        if 2 * index + 1 < first:
            continue
        rec = {"producer": producer, "consumer": consumer, "dtype": dtype,
               "layout": layout}
        try:
            if _on_cuda(producer):
                obj, ref = _produce_cuda(_base(producer), np, dtype, layout)
            else:
                obj, ref = _produce(producer, np, dtype, layout)
        except NotImplementedError:
            continue
        except Exception as e:
            print(json.dumps(dict(rec, path="own", outcome="n/a", message=str(e)[:200])), flush=True)
            continue
        try:
            src_ptr = _inspect(obj)[0] if producer != "crasher" else 0
        except Exception:
            src_ptr = None
        for k, path in enumerate(("own", "dlb")):
            if 2 * index + k < first:
                continue
            # announce first, so a crash can be pinned on this probe
            print(json.dumps(dict(rec, path=path, outcome="start",
                                 probe=2 * index + k)), flush=True)
            outcome, msg = _probe(path, consumer, obj, ref, src_ptr)
            print(json.dumps(dict(rec, path=path, outcome=outcome, message=msg)), flush=True)


# --------------------------------------------------------------- parent side

def _run_pair(producer, consumer):
    """All cells of one pair; a child that dies is restarted after the
    probe that killed it, which becomes a "crashed" cell."""
    # x64 on: without it JAX silently narrows 64-bit data to 32 bits.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", JAX_PLATFORMS="cpu",
               GLOG_minloglevel="3", JAX_ENABLE_X64="1",
               TF_ENABLE_ONEDNN_OPTS="0")
    if _on_cuda(producer):
        # JAX on its GPU backend, without taking 75% of the GPU up front
        env.pop("JAX_PLATFORMS")
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    cells, first, barren = [], 0, 0
    while True:
        cmd = [sys.executable, "-m", "dlbridge._doctor", producer, consumer,
               str(first)]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env, text=True)
        out, err = p.communicate()
        pending, before = None, len(cells)
        for line in out.splitlines():
            if not line.startswith("{"):
                continue
            rec = json.loads(line)
            if rec["outcome"] == "start":
                pending = rec
            else:
                pending = None
                cells.append(rec)
        if p.returncode == 0:
            return cells
        rc = p.returncode
        why = f"signal {-rc}" if rc < 0 else f"exit status {rc}"
        lines = [ln for ln in err.splitlines() if ln.strip()
                 and not ln.startswith(("frame #", "Exception raised", "I0", "W0"))]
        detail = next((ln.strip() for ln in lines if "what()" in ln
                       or "Error" in ln), lines[-1] if lines else "")
        if pending is None:
            cells.append({"producer": producer, "consumer": consumer,
                          "dtype": "-", "layout": "-", "path": "own",
                          "outcome": "crashed",
                          "message": f"process died ({why}) {detail}"[:300]})
            return cells
        probe = pending.pop("probe")
        pending.update(outcome="crashed",
                       message=f"process died ({why}) {detail}"[:300])
        cells.append(pending)
        first = probe + 1
        # Two children in a row that died on their first probe: the pair
        # cannot live in one process; the rest is marked, not retried.
        barren = barren + 1 if len(cells) == before + 1 else 0
        if barren >= 2:
            done = {(c["dtype"], c["layout"], c["path"]) for c in cells}
            for index, (dtype, layout) in enumerate(cases()):
                for k, path in enumerate(("own", "dlb")):
                    if 2 * index + k >= first and (dtype, layout, path) not in done:
                        cells.append(dict(
                            producer=producer, consumer=consumer, dtype=dtype,
                            layout=layout, path=path, outcome="crashed",
                            message=f"not run: every probe of this pair kills the process ({why})"))
            return cells


def run(frameworks=None, workers=2, progress=None):
    fws = frameworks or installed_frameworks()
    consumers = [f for f in fws if f != "crasher"]
    pairs = pairs_of(fws)
    cells = []
    step = progress or (lambda pair: None)

    def one(pair):
        out = _run_pair(pair[0], pair[1])
        step(pair)
        return out

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as ex:
        for out in ex.map(one, pairs):
            cells.extend(out)
    for c in cells:
        if c["outcome"] in ("refused", "crashed", "copied") :
            r = known_reason(c["consumer"], c["producer"], c["dtype"],
                             c["layout"], c["path"])
            if c["outcome"] == "refused" or c["path"] == "own":
                c["known_limitation"] = r
    return _report(fws, consumers, cells, time.perf_counter() - t0)


def _versions(fws):
    """Installed version of each framework, from its distribution's
    metadata (nothing imported): the registry's distribution name, the
    framework's own name, then whatever distribution provides its top-level
    module (cupy-cuda13x, tensorflow for tensorflow-cpu, ...)."""
    from importlib import metadata
    names = {n: fw.dist for n, fw in REGISTRY.items() if fw.dist != n}
    provides = None
    out = {}
    for f in fws:
        base = _base(f)
        candidates = [names.get(base), base]
        for i, dist in enumerate(candidates):
            if not dist:
                continue
            try:
                out[f] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                if i == len(candidates) - 1:
                    if provides is None:
                        provides = metadata.packages_distributions()
                    for other in provides.get(base.split(".")[0], ()):
                        try:
                            out[f] = metadata.version(other)
                            break
                        except metadata.PackageNotFoundError:
                            continue
        out.setdefault(f, "?")
    return out


def dlbridge_defects(cells):
    """Cells that are dlbridge's own fault: wrong data, crashes, or a copy
    on the dlbridge path where the consumer's own path shared memory."""
    own = {(c["producer"], c["consumer"], c["dtype"], c["layout"]): c["outcome"]
           for c in cells if c["path"] == "own"}
    bad = []
    for c in cells:
        if c["path"] != "dlb" or c["producer"] == "crasher":
            continue
        key = (c["producer"], c["consumer"], c["dtype"], c["layout"])
        if c["outcome"] in ("wrong", "crashed"):
            bad.append(c)
        elif (c["outcome"] == "copied" and own.get(key) == "zero-copy"
              and c.get("message") != UNALIGNED_FOR_TF):
            bad.append(c)
    return bad


def _report(fws, consumers, cells, seconds):
    return {"schema_version": SCHEMA_VERSION, "seconds": round(seconds, 1),
            "python": sys.version.split()[0], "versions": _versions(fws),
            "producers": fws, "consumers": consumers,
            "cases": [{"dtype": d, "layout": l} for d, l in cases()],
            "cells": cells, "defects": dlbridge_defects(cells)}


# JSON-Schema-like description of the --json output (checked by the tests).
SCHEMA = {
    "type": "object",
    "required": ["schema_version", "versions", "producers", "consumers", "cells", "defects"],
    "properties": {
        "schema_version": {"type": "integer"},
        "seconds": {"type": "number"},
        "versions": {"type": "object"},
        "producers": {"type": "array", "items": {"type": "string"}},
        "consumers": {"type": "array", "items": {"type": "string"}},
        "cells": {"type": "array", "items": {
            "type": "object",
            "required": ["producer", "consumer", "dtype", "layout", "path", "outcome"],
            "properties": {
                "path": {"enum": ["own", "dlb"]},
                "outcome": {"enum": list(OUTCOMES) + ["n/a"]},
                "message": {"type": "string"},
                "known_limitation": {"type": ["string", "null"]}}}},
        "defects": {"type": "array"},
    },
}


def validate(doc, schema=SCHEMA, where="$"):
    """Minimal JSON-Schema subset validator: type, required, enum, items."""
    types = {"object": dict, "array": list, "string": str, "integer": int,
             "number": (int, float), "null": type(None)}
    t = schema.get("type")
    if t:
        allowed = t if isinstance(t, list) else [t]
        if not any(isinstance(doc, types[a]) for a in allowed):
            raise ValueError(f"{where}: expected {t}, got {type(doc).__name__}")
    if "enum" in schema and doc not in schema["enum"]:
        raise ValueError(f"{where}: {doc!r} not in {schema['enum']}")
    for k in schema.get("required", ()):
        if k not in doc:
            raise ValueError(f"{where}: missing {k}")
    for k, sub in schema.get("properties", {}).items():
        if isinstance(doc, dict) and k in doc:
            validate(doc[k], sub, f"{where}.{k}")
    if "items" in schema and isinstance(doc, list):
        for i, d in enumerate(doc):
            validate(d, schema["items"], f"{where}[{i}]")


if __name__ == "__main__":
    child(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0)
