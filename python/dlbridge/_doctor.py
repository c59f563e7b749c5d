"""`dlbridge doctor`: every installed framework against every other.

Three steps, kept apart (docs/doctor.md):

probe   for each ordered pair (producer -> consumer) a child process makes
        tensors in the producer (its kit, _kits.py) and hands them to the
        consumer twice: through the consumer's own DLPack importer ("own")
        and through ``dlbridge.convert`` ("dlb").  Each probe is an outcome:
        zero-copy  data pointers equal and bytes equal
        copied     bytes equal, different memory
        refused    the importer raised (message kept)
        wrong      the bytes differ from what was produced
        crashed    the child process died (signal kept)
judge   ``judge(report)`` labels the outcomes (known upstream limitations,
        from the kits) and lists dlbridge's defects; it reads only the
        probes, so a saved ``--json`` can be judged again.
render  _render.py formats a judged report.

Children are used because some frameworks abort the interpreter on inputs
they dislike and some pairs cannot even be imported together.
"""

import importlib.util
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ._frameworks import FRAMEWORKS, REGISTRY
from ._kits import kits, version_of
from ._kits_base import FP8_DTYPES, LAYOUTS, Unavailable, source

SCHEMA_VERSION = 1
OUTCOMES = ("zero-copy", "copied", "refused", "wrong", "crashed", "hung")
# Worst first: a cell is coloured by its worst outcome.
_SEVERITY = {"zero-copy": 0, "copied": 1, "refused": 2, "wrong": 3,
             "crashed": 4, "hung": 4}
# float8 (DLPack 1.1's codes) is probed where a framework that can hold it
# is installed: ml_dtypes (NumPy's, JAX's and TensorFlow's float8 types),
# torch, paddle.
FP8_HOLDERS = ("ml_dtypes", "torch", "paddle")
DTYPES = ("bool", "int8", "int32", "int64", "uint8", "uint16", "float16",
          "float32", "float64", "complex64", "bfloat16") + (
              FP8_DTYPES if any(importlib.util.find_spec(m) is not None
                                for m in FP8_HOLDERS) else ())
# TensorFlow's kernels need 64-byte aligned data; its importer takes any
# address and the process aborts on the first op over unaligned data, so
# dlbridge.convert copies unaligned data for it (by design, not a defect).
TF_ALIGNMENT = REGISTRY["tensorflow"].alignment
UNALIGNED_FOR_TF = ("the data is not 64-byte aligned, which TensorFlow's "
                    "kernels need: dlbridge copies it (TensorFlow's own "
                    "importer shares it, then aborts on the first op)")

# The registry's frameworks that have a kit and make CPU tensors, in the
# registry's order (dlbridge last); GPU-only ones (cupy) appear as
# "<name>:cuda" where a GPU is present.
CANDIDATES = tuple(n for n, k in kits().items() if n in REGISTRY and k.cpu)

# CUDA: where a GPU is present, the kits that make CUDA tensors are probed
# again with their tensors on cuda:0, as "<name>:cuda" producers and
# consumers (pairs stay on one kind of device: a CPU producer is never
# offered to a CUDA consumer).
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
    """Names of the frameworks present, none of them imported; with a GPU
    (``cuda`` None: ask the driver), also "<name>:cuda" for the kits that
    make CUDA tensors."""
    table = kits()
    found = [n for n, k in table.items() if k.cpu and k.installed()]
    if cuda is None:
        cuda = _cuda_present()
    if cuda:
        found += [n + CUDA_SUFFIX for n, k in table.items()
                  if k.cuda and k.installed()]
    return found


def _consumers(fws):
    table = kits()
    return [f for f in fws if table[_base(f)].consumer]


def pairs_of(fws):
    """Ordered (producer, consumer) pairs, each on one kind of device."""
    return [(p, c) for p in fws for c in _consumers(fws)
            if _on_cuda(p) == _on_cuda(c)]


def cases():
    out = [(d, "contiguous") for d in DTYPES]
    out += [("float32", lay) for lay in LAYOUTS if lay != "contiguous"]
    return out


# ---------------------------------------------------------------- child side

def _inspect(x, kit):
    """(data pointer, bytes in logical order) of any tensor of ``kit``'s
    framework, read through dlbridge."""
    import ctypes

    import numpy as np

    import dlbridge
    t = dlbridge.from_dlpack(kit.exportable(x))
    item = t.itemsize
    if t.size == 0:
        return t.data_ptr, b""
    if t.__dlpack_device__()[0] != 1:
        # device memory: its bytes through dlbridge's host copy
        return t.data_ptr, _inspect(t.copy(device="cpu"), kits()["dlbridge"])[1]
    lo = sum(min(0, (n - 1) * s) for n, s in zip(t.shape, t.strides))
    hi = sum(max(0, (n - 1) * s) for n, s in zip(t.shape, t.strides)) + 1
    buf = (ctypes.c_char * ((hi - lo) * item)).from_address(t.data_ptr + lo * item)
    view = np.ndarray(t.shape, dtype=f"V{item}", buffer=buf, offset=-lo * item,
                      strides=tuple(s * item for s in t.strides))
    return t.data_ptr, view.tobytes()


PATHS = ("own", "dlb")
# Where a child can die, announced before each step so the parent knows
# whose code it was running: loading the pair's frameworks, the producer
# making and exporting a tensor, the path's importer, dlbridge reading the
# source and the result back.
PHASES = ("load", "make", "import", "inspect")


def _emit(rec):
    print(json.dumps(rec), flush=True)


def _probe(path, consumer, dtype, obj, ref, src_kit, announce):
    kit = kits()[_base(consumer)]
    announce("import")
    try:
        if path == "own":
            res = kit.own_importer(dtype)(obj)
        else:
            import dlbridge
            res = dlbridge.convert(obj, _base(consumer))
    except Exception as e:   # any refusal is a cell, whatever its type
        return "refused", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    if res is obj:   # handed back as it is: the same memory
        return "zero-copy", ""
    announce("inspect")
    try:
        src_ptr = _inspect(obj, src_kit)[0]
    except Exception:
        src_ptr = None
    try:
        ptr, data = _inspect(res, kit)
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
    """Run the probes of one pair from probe number ``first`` on (probe
    2i is case i's "own" path, 2i + 1 its "dlb" path).  Each step is
    announced before it runs (see PHASES), so that the parent can pin a
    crash or a hang on a probe and on whose code was running."""
    import numpy as np
    table = kits()
    kit, consumer_kit = table[_base(producer)], table[_base(consumer)]
    _emit({"outcome": "phase", "phase": "load"})
    kit.load()
    consumer_kit.load()
    make = kit.make_cuda if _on_cuda(producer) else kit.make
    for index, (dtype, layout) in enumerate(cases()):
        rec = {"producer": producer, "consumer": consumer, "dtype": dtype,
               "layout": layout}
        made = None
        for k, path in enumerate(PATHS):
            if 2 * index + k < first:
                continue
            _emit(dict(rec, path=path, outcome="start", probe=2 * index + k))
            if made is None:
                _emit({"outcome": "phase", "phase": "make"})
                try:
                    made = make(np, source(np, dtype, layout), dtype, layout)
                    kit.export(made[0])
                except Exception as e:   # Unavailable, or the maker failed
                    made = e
            if isinstance(made, Unavailable):
                _emit(dict(rec, path=path, outcome="skipped"))
            elif isinstance(made, Exception):
                if path == "own":
                    _emit(dict(rec, path=path, outcome="n/a",
                               message=str(made)[:200]))
                else:
                    _emit(dict(rec, path=path, outcome="skipped"))
            else:
                outcome, msg = _probe(
                    path, consumer, dtype, made[0], made[1], kit,
                    lambda phase: _emit({"outcome": "phase", "phase": phase}))
                _emit(dict(rec, path=path, outcome=outcome, message=msg))


# --------------------------------------------------------------- parent side

DEFAULT_TIMEOUT_S = 300


class _Children:
    """The children running now, so that an interrupted run can kill them
    (each runs in a session of its own, out of reach of the terminal's
    Ctrl-C) and no pair starts another."""

    def __init__(self):
        self.lock = threading.Lock()
        self.live = set()
        self.stopped = False

    def start(self, cmd, env):
        with self.lock:
            if self.stopped:
                return None
            # A session (and process group) of its own: a hung child is
            # killed with whatever it started.
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, env=env, text=True,
                                 start_new_session=True)
            self.live.add(p)
            return p

    def done(self, p):
        with self.lock:
            self.live.discard(p)

    def stop(self):
        with self.lock:
            self.stopped = True
            for p in self.live:
                _kill_group(p)


def _kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _run_child(children, cmd, env, timeout):
    """Run one child: (records, return code, stderr, hung).  The child is
    hung when it prints nothing for ``timeout`` seconds: its process group
    is killed."""
    p = children.start(cmd, env)
    if p is None:
        return [], 0, "", False
    lines = queue.Queue()
    err = []

    def pump_out():
        for line in p.stdout:
            lines.put(line)
        lines.put(None)

    def pump_err():
        err.append(p.stderr.read())

    pumps = [threading.Thread(target=f, daemon=True) for f in (pump_out, pump_err)]
    for t in pumps:
        t.start()
    records, hung = [], False
    try:
        while True:
            try:
                line = lines.get(timeout=timeout)
            except queue.Empty:
                hung = True
                break
            if line is None:
                break
            if line.startswith("{"):
                records.append(json.loads(line))
    finally:
        if hung:
            _kill_group(p)
        p.wait()
        for t in pumps:
            t.join()
        children.done(p)
    return records, p.returncode, "".join(err), hung


def _death(rc, err, hung, timeout):
    """(outcome, message) for a child that died or hung."""
    if hung:
        return "hung", f"no answer in {timeout:g} s: the child was killed"
    why = f"signal {-rc}" if rc < 0 else f"exit status {rc}"
    lines = [ln for ln in err.splitlines() if ln.strip()
             and not ln.startswith(("frame #", "Exception raised", "I0", "W0"))]
    detail = next((ln.strip() for ln in lines if "what()" in ln
                   or "Error" in ln), lines[-1] if lines else "")
    return "crashed", f"process died ({why}) {detail}"[:300]


def _run_pair(producer, consumer, timeout=DEFAULT_TIMEOUT_S, children=None):
    """All cells of one pair.  A child that dies or hangs on a probe is
    restarted after that probe, which becomes a "crashed" or "hung" cell."""
    children = children or _Children()
    # x64 on: without it JAX silently narrows 64-bit data to 32 bits.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", JAX_PLATFORMS="cpu",
               GLOG_minloglevel="3", JAX_ENABLE_X64="1",
               TF_ENABLE_ONEDNN_OPTS="0")
    if _on_cuda(producer):
        # JAX on its GPU backend, without taking 75% of the GPU up front
        env.pop("JAX_PLATFORMS")
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    total = 2 * len(cases())
    cells, first, barren = [], 0, 0
    while first < total:
        cmd = [sys.executable, "-m", "dlbridge._doctor", producer, consumer,
               str(first)]
        records, rc, err, hung = _run_child(children, cmd, env, timeout)
        pending = last = None
        phase = "load"
        for rec in records:
            if rec["outcome"] == "phase":
                phase = rec["phase"]
            elif rec["outcome"] == "start":
                pending, last = rec, rec["probe"]
            else:
                pending = None
                if rec["outcome"] != "skipped":
                    cells.append(rec)
        if rc == 0 and not hung:
            return cells
        if children.stopped:
            return cells
        outcome, message = _death(rc, err, hung, timeout)
        if pending is not None:
            probe = pending.pop("probe")
            cells.append(dict(pending, outcome=outcome, message=message,
                              phase=phase))
            # Two children in a row that died on their first probe: the
            # pair cannot live in one process; the rest is marked, not run.
            barren = barren + 1 if probe == first else 0
            first = probe + 1
        elif last is not None:
            # between two probes (at its exit, for one): the pair's cell
            cells.append(dict(producer=producer, consumer=consumer, dtype="-",
                              layout="-", path="own", outcome=outcome,
                              message=f"after its last probe: {message}"[:300],
                              phase="exit"))
            barren, first = 0, last + 1
        else:
            barren = 2      # before its first probe: the pair cannot start
        if barren >= 2:
            verb = "hangs" if outcome == "hung" else "kills the process"
            if phase == "load":
                message = f"loading {producer} and {consumer}: {message}"
            for index, (dtype, layout) in enumerate(cases()):
                for k, path in enumerate(PATHS):
                    if 2 * index + k >= first:
                        cells.append(dict(
                            producer=producer, consumer=consumer, dtype=dtype,
                            layout=layout, path=path, outcome=outcome,
                            message=f"not run: every probe of this pair {verb} "
                                    f"({message})"[:300], phase=phase))
            return cells
    return cells


def run(frameworks=None, workers=2, progress=None, timeout=DEFAULT_TIMEOUT_S):
    """Probe every pair of ``frameworks`` (default: all installed), at most
    ``workers`` children at once, a probe that takes over ``timeout``
    seconds being "hung"; return the judged report (see SCHEMA)."""
    fws = frameworks or installed_frameworks()
    cells = []
    step = progress or (lambda pair: None)
    children = _Children()

    def one(pair):
        out = _run_pair(pair[0], pair[1], timeout, children)
        step(pair)
        return out

    t0 = time.perf_counter()
    ex = ThreadPoolExecutor(max_workers=workers)
    try:
        for out in ex.map(one, pairs_of(fws)):
            cells.extend(out)
    except BaseException:    # Ctrl-C included: no child outlives the run
        children.stop()
        ex.shutdown(wait=True, cancel_futures=True)
        raise
    ex.shutdown()
    return judge({"schema_version": SCHEMA_VERSION,
                  "seconds": round(time.perf_counter() - t0, 1),
                  "python": sys.version.split()[0],
                  "versions": {f: version_of(_base(f)) for f in fws},
                  "producers": fws, "consumers": _consumers(fws),
                  "cases": [{"dtype": d, "layout": l} for d, l in cases()],
                  "cells": cells})


# ------------------------------------------------------------------ judging

def known_reason(cell):
    """The known upstream limitation explaining a cell's outcome, or None:
    the kits' limits, the consumer's before the producer's, a pair that
    cannot share a process first."""
    consumer, producer = _base(cell["consumer"]), _base(cell["producer"])
    table = kits()
    sides = [(table.get(consumer), "consumer", producer),
             (table.get(producer), "producer", consumer)]
    for pair_level in (True, False):
        for kit, role, partner in sides:
            for lim in (kit.limits if kit else ()):
                if ((lim.partner is not None) == pair_level
                        and lim.explains(cell, role, partner)):
                    return lim.reason
        if pair_level and cell["path"] == "dlb" and consumer not in FRAMEWORKS:
            return ("dlbridge.convert has no target for this framework yet "
                    "(only " + ", ".join(FRAMEWORKS) + ")")
    return None


def _dlbridge_ran(cell):
    """Whether dlbridge's code was running when the cell's child crashed or
    hung (its phase): reading results back, making or exporting a dlbridge
    tensor, or importing on the dlb path or into dlbridge.  Loading a pair
    and a child's exit are the frameworks'."""
    phase = cell.get("phase")
    if phase == "inspect":
        return True
    if phase == "make":
        return _base(cell["producer"]) == "dlbridge"
    if phase == "import":
        return cell["path"] == "dlb" or _base(cell["consumer"]) == "dlbridge"
    return False


def dlbridge_defects(cells):
    """Cells that are dlbridge's own fault: a crash or a hang while
    dlbridge's code ran, wrong data on a dlbridge path (unless the
    consumer's own path got the same: then the producer is at fault), or a
    copy on the dlb path where the consumer's own path shared memory."""
    own = {(c["producer"], c["consumer"], c["dtype"], c["layout"]): c["outcome"]
           for c in cells if c["path"] == "own"}
    bad = []
    for c in cells:
        native = own.get((c["producer"], c["consumer"], c["dtype"], c["layout"]))
        if c["outcome"] in ("crashed", "hung"):
            if _dlbridge_ran(c):
                bad.append(c)
        elif c["outcome"] == "wrong":
            if (c["path"] == "dlb" and native != "wrong"
                    or c["path"] == "own" and _base(c["consumer"]) == "dlbridge"):
                bad.append(c)
        elif (c["path"] == "dlb" and c["outcome"] == "copied"
              and native == "zero-copy" and c.get("message") != UNALIGNED_FOR_TF):
            bad.append(c)
    return bad


def judge(report):
    """Label the probes of ``report`` (a run's, or a saved ``--json``) and
    list dlbridge's defects; returns the report, judged."""
    cells = report["cells"]
    for c in cells:
        c.pop("known_limitation", None)
        if c["outcome"] in ("refused", "crashed", "hung", "copied"):
            reason = known_reason(c)
            if c["outcome"] == "refused" or c["path"] == "own":
                c["known_limitation"] = reason
    report["defects"] = dlbridge_defects(cells)
    return report


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
                "phase": {"enum": ["load", "make", "import", "inspect", "exit"]},
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
