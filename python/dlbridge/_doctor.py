"""`dlbridge doctor`: every installed framework against every other.

Three steps, kept apart (docs/doctor.md):

probe   for each ordered pair (producer -> consumer) a child process makes
        tensors in the producer (its kit, _kits.py) and hands them to the
        consumer twice: through the consumer's own DLPack importer ("own")
        and through ``dlbridge.convert`` ("dlb").  Each probe is an outcome
        (OUTCOMES, best first).
judge   ``judge(report)`` labels every outcome -- a dlbridge gap, an
        upstream limitation (the kits' limits) or a deliberate dlbridge
        decision -- compares each convert probe with the consumer's own
        importer and sums it all up; it reads only the probes, so a saved
        ``--json`` can be judged again (``--rejudge``).
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

from ._frameworks import REGISTRY
from ._kits import kits, limits_of, version_of
from ._kits_base import FP8_DTYPES, LAYOUTS, Unavailable, source

SCHEMA_VERSION = 2
# What a probe gives, best first (issue 17's order); RANK 4 is "bad".
OUTCOMES = ("zero-copy",       # correct, the same memory
            "copied",          # correct, other memory
            "refused",         # the importer raised BufferError
            "error",           # it raised anything else
            "wrong",           # the values differ from the producer's
            "writable-alias",  # shares read-only memory, writable
            "crashed",         # the process died
            "hung")            # no answer within --timeout
RANK = {"zero-copy": 0, "copied": 1, "refused": 2, "error": 3, "wrong": 4,
        "writable-alias": 4, "crashed": 4, "hung": 4}
GOOD = ("zero-copy", "copied")
BAD = ("wrong", "writable-alias", "crashed", "hung")
NA = "n/a"                     # the producer cannot make that case
# How the judge labels an outcome ("ok": zero-copy, nothing to say).
LABELS = ("ok", "gap", "upstream", "decision", "n/a")
# float8 (DLPack 1.1's codes) is probed where a framework that can hold it
# is installed: ml_dtypes (JAX's float8 types), torch, paddle.
FP8_HOLDERS = ("ml_dtypes", "torch", "paddle")
DTYPES = ("bool", "int8", "int32", "int64", "uint8", "uint16", "float16",
          "float32", "float64", "complex64", "bfloat16") + (
              FP8_DTYPES if any(importlib.util.find_spec(m) is not None
                                for m in FP8_HOLDERS) else ())

# The registry's frameworks that have a kit and make CPU tensors, in the
# registry's order (dlbridge last); GPU-only ones (cupy) appear as
# "<name>:cuda" where a GPU is present.  installed_frameworks() adds the
# peers that have a kit but no registry entry yet (_kits_peers.py).
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

PATHS = ("own", "dlb")
# Where a child can die, announced before each step so the parent knows
# whose code it was running: loading the pair's frameworks, the producer
# making and exporting a tensor, the path's importer, dlbridge reading the
# source and the result back.
PHASES = ("load", "make", "import", "inspect")


def _emit(rec):
    print(json.dumps(rec), flush=True)


def _view(x, kit):
    """A dlbridge.Tensor over any tensor of ``kit``'s framework."""
    import dlbridge
    return dlbridge.from_dlpack(kit.exportable(x))


def _bytes(t):
    """The bytes of dlbridge.Tensor ``t`` in logical order."""
    import ctypes

    import numpy as np
    item = t.itemsize
    if t.size == 0:
        return b""
    if t.__dlpack_device__()[0] != 1:
        # device memory: its bytes through dlbridge's host copy
        return _bytes(t.copy(device="cpu"))
    lo = sum(min(0, (n - 1) * s) for n, s in zip(t.shape, t.strides))
    hi = sum(max(0, (n - 1) * s) for n, s in zip(t.shape, t.strides)) + 1
    buf = (ctypes.c_char * ((hi - lo) * item)).from_address(t.data_ptr + lo * item)
    view = np.ndarray(t.shape, dtype=f"V{item}", buffer=buf, offset=-lo * item,
                      strides=tuple(s * item for s in t.strides))
    return view.tobytes()


def _alignment(ptr):
    """The largest power of two (up to 256) dividing a data address."""
    return min(256, ptr & -ptr) if ptr else 256


def _first_line(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def _probe(path, consumer, dtype, obj, ref, src_kit, announce):
    """(outcome, message, facts) of handing ``obj`` to the consumer."""
    kit = kits()[_base(consumer)]
    announce("import")
    try:
        if path == "own":
            res = kit.own_importer(dtype)(obj)
        else:
            import dlbridge
            res = dlbridge.convert(obj, _base(consumer))
    except BufferError as e:
        return "refused", _first_line(e), {}
    except Exception as e:   # any other refusal is a cell too, worse
        return "error", _first_line(e), {}
    announce("inspect")
    try:
        src = _view(obj, src_kit)
    except Exception as e:
        src, why = None, _first_line(e)
    facts = {} if src is None else {"source_alignment": _alignment(src.data_ptr)}
    try:
        t = _view(res, kit) if src is None or res is not obj else src
    except Exception as e:
        return "error", f"the result cannot be read back: {_first_line(e)}", facts
    if _bytes(t) != ref.tobytes():
        return "wrong", "values differ from the producer's", facts
    if src is None:   # values right; whether memory is shared is unknown
        return "copied", f"the source cannot be read back ({why})", facts
    shared = t.data_ptr == src.data_ptr and ref.size
    if shared and src.readonly:
        try:
            writable = kit.writable(res)
        except Exception:
            writable = True
        if writable:
            return ("writable-alias", "the result shares the producer's "
                    "read-only memory and can be written", facts)
    return ("zero-copy" if shared or ref.size == 0 else "copied"), "", facts


# Why no probe runs without NumPy (the wheel does not require it).
NO_NUMPY = ("the doctor needs NumPy for its probes (it makes each case's "
            "tensors from a NumPy array and compares the results' bytes with "
            "it), and NumPy is not installed here: pip install numpy")


def _numpy_missing():
    return importlib.util.find_spec("numpy") is None


def child(producer, consumer, first=0):
    """Run the probes of one pair from probe number ``first`` on (probe
    2i is case i's "own" path, 2i + 1 its "dlb" path).  Each step is
    announced before it runs (see PHASES), so that the parent can pin a
    crash or a hang on a probe and on whose code was running.  Without
    NumPy every probe is n/a (NO_NUMPY)."""
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is None:
        for index, (dtype, layout) in enumerate(cases()):
            for k, path in enumerate(PATHS):
                if 2 * index + k >= first:
                    _emit({"producer": producer, "consumer": consumer,
                           "dtype": dtype, "layout": layout, "path": path,
                           "outcome": NA, "message": NO_NUMPY})
        return
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
                except Unavailable as e:
                    made = e
                except Exception as e:   # the maker failed: no probe either
                    made = Unavailable(f"{producer} could not make it: "
                                       f"{_first_line(e)}")
            if isinstance(made, Unavailable):
                _emit(dict(rec, path=path, outcome=NA, message=str(made)[:300]))
                continue
            outcome, msg, facts = _probe(
                path, consumer, dtype, made[0], made[1], kit,
                lambda phase: _emit({"outcome": "phase", "phase": phase}))
            if kit.read_only(layout):
                facts["read_only"] = True
            _emit(dict(rec, path=path, outcome=outcome, message=msg, **facts))


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
    if _numpy_missing():
        print(f"dlbridge doctor: {NO_NUMPY}; every probe is n/a",
              file=sys.stderr)
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
                  "timeout_s": timeout,
                  "python": sys.version.split()[0],
                  "versions": {f: version_of(_base(f)) for f in fws},
                  "producers": fws, "consumers": _consumers(fws),
                  "cases": [{"dtype": d, "layout": l} for d, l in cases()],
                  "cells": cells})


# ------------------------------------------------------------------ judging

def _limit(cell):
    """The kits' upstream limitation that explains a cell, or None: the
    consumer's before the producer's, a pair that cannot share a process
    first."""
    consumer, producer = _base(cell["consumer"]), _base(cell["producer"])
    sides = [(limits_of(consumer), "consumer", producer),
             (limits_of(producer), "producer", consumer)]
    mine = _dlbridge_imports(cell)
    for pair_level in (True, False):
        for limits, role, partner in sides:
            for lim in limits:
                if ((lim.partner is not None) == pair_level
                        and (lim.dlbridge_too or not mine)
                        and lim.explains(cell, role, partner)):
                    return lim
    return None


def known_reason(cell):
    """The reason of the upstream limitation explaining ``cell``, or None."""
    lim = _limit(cell)
    return lim.reason if lim else None


def _decision(cell):
    """The deliberate dlbridge decision behind a cell's outcome, or None.
    Each is documented in docs/decisions.md."""
    consumer = REGISTRY.get(_base(cell["consumer"]))
    align = consumer.alignment if consumer else None
    if (cell["path"] == "dlb" and cell["outcome"] == "copied" and align
            and cell.get("source_alignment", align) < align):
        if consumer.name == "tensorflow":
            return (f"dlbridge.convert copies data not {align}-byte aligned "
                    "into tensorflow, whose kernels need it (its own importer "
                    "shares it; its first op then aborts the process)")
        return (f"dlbridge.convert copies data not {align}-byte aligned into "
                f"{consumer.name}, which would copy it itself (dlbridge's "
                "copy lets copy=False say so)")
    if (cell["path"] == "dlb" and cell["outcome"] == "copied" and consumer
            and cell.get("read_only") and not consumer.readonly):
        return (f"dlbridge.convert copies read-only data for {consumer.name}, "
                "whose tensors would let it be written (they are writable, "
                "or hand the memory on through a legacy capsule, which "
                "cannot say read-only)")
    if (cell["path"] == "dlb" and cell["outcome"] == "copied" and consumer
            and cell["layout"] == "negative"
            and not consumer.negative_strides):
        return (f"dlbridge.convert copies data with negative strides for "
                f"{consumer.name}, whose importer refuses or mishandles them "
                "(torch 2.13 aborts; paddle 3.3 fails with a 2**64-byte "
                "allocation, or not, depending on earlier exports; MLX and "
                "PyArrow refuse them)")
    if (cell["path"] == "own" and _base(cell["producer"]) == "dlbridge"
            and cell["outcome"] in ("refused", "error")
            and "read-only" in cell.get("message", "")
            and "legacy" in cell.get("message", "")):
        return ("dlbridge does not export read-only data as a legacy "
                "(unversioned) capsule, which cannot say read-only; "
                f"{cell['consumer']}'s importer asks for no other")
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


def _dlbridge_imports(cell):
    return cell["path"] == "dlb" or _base(cell["consumer"]) == "dlbridge"


def _judge_cell(cell, native):
    """(label, reason, worse than native) of one probe; ``native`` is the
    consumer's own importer's cell of the same probe (for a dlb cell)."""
    outcome = cell["outcome"]
    if outcome == NA:
        return NA, cell.get("message") or "the producer cannot make it", False
    if outcome == "zero-copy":
        return "ok", None, False
    lim, decision = _limit(cell), _decision(cell)
    mine = _dlbridge_imports(cell)
    worse = (cell["path"] == "dlb" and native is not None
             and native["outcome"] != NA
             and RANK[outcome] > RANK[native["outcome"]])
    theirs = (lim.reason if lim else cell.get("message")
              or f"{cell['consumer']}'s own importer {outcome} it")
    # 1. a crash or a hang: whose code was running
    if outcome in ("crashed", "hung"):
        if _dlbridge_ran(cell):
            return "gap", f"dlbridge {outcome}: {cell.get('message', '')}", worse
        return "upstream", theirs, worse
    # 2. convert lower in the order than the consumer's own importer
    if worse:
        if decision:
            return "decision", decision, True
        return ("gap", f"dlbridge.convert is worse than {cell['consumer']}'s "
                f"own importer ({native['outcome']})"
                + (f"; {lim.reason}" if lim else ""), True)
    # 3. wrong data or a writable alias of read-only memory; the same from
    #    the own path of a foreign producer is that producer's
    if outcome in BAD:
        if mine and not (native is not None and native["outcome"] == outcome
                         and _base(cell["producer"]) != "dlbridge"):
            return "gap", f"dlbridge gave {outcome}: {cell.get('message', '')}", False
        return "upstream", theirs, False
    # 4. a copy, a refusal or an error, no worse than native
    if decision:
        return "decision", decision, False
    if not mine:
        return "upstream", theirs, False
    if lim is not None and (outcome == "copied" or not lim.copyable):
        return "upstream", lim.reason, False
    if lim is not None:
        return ("gap", f"dlbridge.convert could copy: {lim.reason}", False)
    if (outcome == "copied" and native is not None
            and native["outcome"] == "copied"):
        return "upstream", f"{cell['consumer']}'s own importer copies too", False
    return "gap", f"unexplained {outcome} on a dlbridge path", False


def _summary(cells):
    """The headline numbers: per path, the outcomes of the probes a
    producer could make; convert against the consumer's own importer; the
    labels."""
    def tally(path):
        # a probe each (a child's death after its last probe is no probe)
        mine = [c for c in cells if c["path"] == path and c["dtype"] != "-"]
        out = {o: sum(c["outcome"] == o for c in mine) for o in OUTCOMES}
        out["n/a"] = sum(c["outcome"] == NA for c in mine)
        out["probes"] = len(mine) - out["n/a"]
        return out
    dlb = [c for c in cells if c["path"] == "dlb"]
    return {
        "own": tally("own"), "dlb": tally("dlb"),
        "worse_than_native": sum(c["worse_than_native"] and c["label"] == "gap"
                                 for c in dlb),
        "worse_by_decision": sum(c["worse_than_native"] and c["label"] == "decision"
                                 for c in dlb),
        "better_than_native": sum(c.get("better_than_native", False) for c in dlb),
        **{label: sum(c["label"] == label for c in cells) for label in LABELS},
    }


def judge(report):
    """Label every probe of ``report`` (a run's, or a saved ``--json``),
    sum them up and list dlbridge's defects (its gaps); returns the report,
    judged.  Only the probes' own fields are read."""
    cells = report["cells"]
    own = {(c["producer"], c["consumer"], c["dtype"], c["layout"]): c
           for c in cells if c["path"] == "own"}
    for c in cells:
        for k in ("label", "reason", "worse_than_native", "better_than_native"):
            c.pop(k, None)
        native = (own.get((c["producer"], c["consumer"], c["dtype"], c["layout"]))
                  if c["path"] == "dlb" else None)
        c["label"], c["reason"], c["worse_than_native"] = _judge_cell(c, native)
        if (native is not None and NA not in (c["outcome"], native["outcome"])
                and RANK[c["outcome"]] < RANK[native["outcome"]]):
            c["better_than_native"] = True
    report["summary"] = _summary(cells)
    report["defects"] = [c for c in cells if c["label"] == "gap"]
    return report


def dlbridge_defects(cells):
    """The cells that are dlbridge's gaps (``judge``'s defects)."""
    return judge({"cells": [dict(c) for c in cells]})["defects"]


# JSON-Schema-like description of the --json output (docs/doctor.md;
# checked by the tests with validate).
_COUNTS = {"type": "object", "required": list(OUTCOMES) + ["n/a", "probes"]}
SCHEMA = {
    "type": "object",
    "required": ["schema_version", "versions", "producers", "consumers",
                 "cases", "cells", "summary", "defects"],
    "properties": {
        "schema_version": {"enum": [SCHEMA_VERSION]},
        "seconds": {"type": "number"},
        "timeout_s": {"type": "number"},
        "python": {"type": "string"},
        "versions": {"type": "object"},
        "producers": {"type": "array", "items": {"type": "string"}},
        "consumers": {"type": "array", "items": {"type": "string"}},
        "cases": {"type": "array", "items": {
            "type": "object", "required": ["dtype", "layout"]}},
        "cells": {"type": "array", "items": {
            "type": "object",
            "required": ["producer", "consumer", "dtype", "layout", "path",
                         "outcome", "label", "reason", "worse_than_native"],
            "properties": {
                "path": {"enum": list(PATHS)},
                "outcome": {"enum": list(OUTCOMES) + [NA]},
                "message": {"type": "string"},
                "phase": {"enum": list(PHASES) + ["exit"]},
                "source_alignment": {"type": "integer"},
                "read_only": {"enum": [True]},
                "label": {"enum": list(LABELS)},
                "reason": {"type": ["string", "null"]},
                "worse_than_native": {"enum": [True, False]},
                "better_than_native": {"enum": [True]}}}},
        "summary": {"type": "object",
                    "required": ["own", "dlb", "worse_than_native",
                                 "worse_by_decision", "better_than_native"]
                    + list(LABELS),
                    "properties": {"own": _COUNTS, "dlb": _COUNTS}},
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
