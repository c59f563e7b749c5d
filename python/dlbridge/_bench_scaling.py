"""Free-threaded scaling: how much of N cores N threads calling dlbridge
get (issue 26 item 5).  The one home of the rules behind `dlbridge bench`'s
scaling rows (dlbridge/_bench.py); schema and reading: docs/bench.md.

For each row, the same statement runs in a loop on one thread, then on N
threads at once (N = the CPUs this process may run on), and

    ratio = N-thread aggregate throughput / 1-thread throughput

(N.00x is perfect; 1.00x means the threads only took turns).  Each row is
run twice: on per-thread ("own") objects, made inside each thread, and on
objects one thread made and every thread shares ("shared").  The callable
(dlb.from_dlpack, the Function, ...) is always the one object every thread
shares, as in a real program.

Beside each row: the ratio of `f(x)` with f = len on the same kind of
NumPy arrays, measured in the same round, the baseline that says what the
interpreter itself scales to on this machine under this load; "of len" is
the row's ratio over it (the target: >= 0.9 of it, and >= 1.8x with 2
threads on 2 cores, on per-thread arrays).

How a figure is taken: each thread runs its own copy of the timed loop (a
function compiled for it, so no code object is shared), all released by one
barrier; the time is from the first thread's start to the last thread's
end.  The loop count is calibrated on one thread so that a run lasts about target_s; the
N-thread run does the same count on each thread.  The garbage collector is
off while timing (a collection stops every thread).  Rounds interleave the
rows, and the best 1-thread and best N-thread run of each row are kept
(load from elsewhere only ever slows a run down).  On a build with the GIL
every row is "not run: GIL build"; on one CPU "not run: one CPU".
"""

import gc
import os
import sys
import threading
import time
from typing import NamedTuple


class Settings(NamedTuple):
    rounds: int       # interleaved rounds; the best run of each kind is kept
    target_s: float   # length of one 1-thread run


QUICK = Settings(rounds=2, target_s=0.05)
DEFAULT = Settings(rounds=3, target_s=0.2)
FULL = Settings(rounds=7, target_s=0.3)
MODES = {"quick": QUICK, "default": DEFAULT, "full": FULL}

UNROLL = 10
N = 16                 # elements of each float32 array
KINDS = ("own", "shared")
BASELINE = "len"
#: row -> (statement, what it means); the statement's names are bound per
#: thread by _objects().
ROWS = {
    "from_dlpack": ("f(x)", "dlb.from_dlpack(x), x a NumPy float32[16]"),
    "convert": ('f(x, "dlbridge")', 'dlb.convert(x, "dlbridge")'),
    "Function": ("f(a, b, c)", "noop3(a, b, c), NumPy float32[16] arguments"),
    "Function Tensor": ("f(ta, tb, tc)",
                        "noop3(ta, tb, tc), dlb.Tensor arguments"),
    "tensor.dtype": ("t.dtype", "t.dtype, t a dlb.Tensor"),
    BASELINE: ("f(x)", "len(x): the interpreter's own scaling (baseline)"),
}
CALLS = tuple(ROWS)


def threads():
    """N: the CPUs this process may run on."""
    count = getattr(os, "process_cpu_count", None)
    if count is not None:
        return count() or 1
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def gil_enabled():
    check = getattr(sys, "_is_gil_enabled", None)
    return True if check is None else check()


def why_not_run():
    """Why the scaling rows cannot run here, or None."""
    if gil_enabled():
        return "GIL build" if not hasattr(sys, "_is_gil_enabled") else (
            "the GIL is enabled" if _ft_build() else "GIL build")
    if threads() < 2:
        return "one CPU"
    return None


def _ft_build():
    import sysconfig
    return bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


def _loop(stmt, names):
    """A fresh function loop(n, *names) running stmt UNROLL times n times."""
    body = "; ".join([stmt] * UNROLL)
    src = (f"def loop(n, {', '.join(names)}):\n"
           f"    for _ in range(n):\n"
           f"        {body}\n")
    ns = {}
    exec(compile(src, f"<scaling {stmt}>", "exec"), ns)
    return ns["loop"]


class Shared(NamedTuple):
    """What every thread shares: the callables and the "shared" objects."""
    dlb: object
    np: object
    fn: object         # the no-op Function, or an error text
    objects: dict      # the "shared" kind's objects (made by one thread)


def _arrays(np, dlb):
    """The objects of one thread (or the shared ones): NumPy arrays and
    dlb.Tensors of them."""
    a, b, c, x = (np.ones(N, dtype=np.float32) for _ in range(4))
    ta, tb, tc = (dlb.from_dlpack(v) for v in (a, b, c))
    return {"a": a, "b": b, "c": c, "x": x, "ta": ta, "tb": tb, "tc": tc,
            "t": ta}


def _bindings(call, shared, objs):
    """The names the statement of call reads."""
    dlb = shared.dlb
    f = {"from_dlpack": dlb.from_dlpack, "convert": dlb.convert,
         "Function": shared.fn, "Function Tensor": shared.fn,
         BASELINE: len}.get(call)
    names = {k: objs[k] for k in _tokens(ROWS[call][0]) if k in objs}
    if f is not None:
        names["f"] = f
    return names


def _tokens(stmt):
    out, cur = [], ""
    for ch in stmt:
        if ch.isalnum() or ch == "_":
            cur += ch
        else:
            if cur:
                out.append(cur)
            cur = ""
    if cur:
        out.append(cur)
    return out


def _run(call, kind, shared, nthreads, number):
    """(seconds, CPU seconds) for nthreads threads each running call's loop
    number times: from the first thread's start to the last one's end, and
    the CPU time the threads spent in their loops, all together."""
    stmt = ROWS[call][0]
    barrier = threading.Barrier(nthreads + 1)
    starts, ends = [0.0] * nthreads, [0.0] * nthreads
    cpus, errors = [0.0] * nthreads, []

    def work(i):
        try:
            objs = (shared.objects if kind == "shared"
                    else _arrays(shared.np, shared.dlb))
            names = _bindings(call, shared, objs)
            loop = _loop(stmt, list(names))
            args = list(names.values())
            loop(1, *args)     # once untimed: it works, caches are warm
        except Exception as e:  # reported, and the barrier still released
            errors.append(e)
            barrier.wait()
            return
        barrier.wait()
        starts[i] = time.perf_counter()
        c0 = time.thread_time()
        try:
            loop(number, *args)
        except Exception as e:  # reported by the caller
            errors.append(e)
        ends[i] = time.perf_counter()
        cpus[i] = time.thread_time() - c0

    ts = [threading.Thread(target=work, args=(i,)) for i in range(nthreads)]
    for t in ts:
        t.start()
    barrier.wait()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    # From the first thread's start to the last one's end, as the threads
    # saw them (this thread may run late after the barrier on a busy
    # machine: its own clock would miss the start).
    return max(ends) - min(starts), sum(cpus)


def _calibrate(call, kind, shared, target_s):
    number = 1
    while True:
        t = _run(call, kind, shared, 1, number)[0]
        if t >= target_s / 4:
            return max(1, int(number * target_s / t))
        number *= 4


def _why(exc, limit=120):
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:limit]


def not_run(why):
    """The section when nothing could be measured."""
    return {"threads": threads(), "note": f"not run: {why}",
            "rows": [_row(c, k, error=f"not run: {why}")
                     for c in CALLS if c != BASELINE for k in KINDS]}


def measure(kernel=None, settings=DEFAULT, calls=CALLS, nthreads=None):
    """{"threads": N, "rows": [...], "note": str or None} (see SCHEMA).
    Every row of every kind says "not run: <why>" where it cannot run."""
    n = nthreads or threads()
    why = why_not_run() if nthreads is None else None
    calls = tuple(c for c in calls if c != BASELINE) + (BASELINE,)
    if why is not None:
        return not_run(why)
    import numpy as np

    import dlbridge as dlb
    fn = None
    if kernel is None:
        fn = (f"not run: no kernel library (the Function rows need "
              f"libdlb_example_kernels.so)")
    else:
        try:
            from . import _bench
            fn = dlb.load(kernel, _bench.KERNEL_SYMBOL, _bench.KERNEL_SIGNATURE)
        except Exception as e:
            fn = "not run: " + _why(e)
    shared = Shared(dlb, np, fn, _arrays(np, dlb))
    live, numbers, errors = [], {}, {}
    for c in calls:
        for k in KINDS:
            if c.startswith("Function") and isinstance(fn, str):
                errors[c, k] = fn
                continue
            try:
                numbers[c, k] = _calibrate(c, k, shared, settings.target_s)
                live.append((c, k))
            except Exception as e:
                errors[c, k] = _why(e)
    # Each row's own len(x) pair is run just before it in every round, so
    # the baseline beside a row was taken under the same load.
    # (call, kind, "row" | the row a baseline is beside) -> the best
    # [1-thread s, N-thread s, 1-thread CPU s, N-thread CPU s]
    best = {}

    def keep(key, number, which):
        c, k = key
        got = _run(c, k, shared, 1, number) + _run(c, k, shared, n, number)
        got = [got[0], got[2], got[1], got[3]]
        b = best.setdefault(key + (which,), got)
        b[:] = [min(x, y) for x, y in zip(b, got)]

    rows_live = [key for key in live if key[0] != BASELINE]
    was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(settings.rounds):
            for key in rows_live:
                base = (BASELINE, key[1])
                if base in numbers:
                    keep(base, numbers[base], key)
                keep(key, numbers[key], "row")
    finally:
        if was:
            gc.enable()
    rows = []
    for c in calls:
        if c == BASELINE:
            continue
        for k in KINDS:
            base = best.get((BASELINE, k, (c, k)))
            base = n * base[0] / base[1] if base else None
            if (c, k) in errors:
                rows.append(_row(c, k, error=errors[c, k], baseline=base))
                continue
            t1, tn, c1, cn = best[c, k, "row"]
            rows.append(_row(c, k, ns=t1 / (numbers[c, k] * UNROLL) * 1e9,
                             ratio=n * t1 / tn, baseline=base,
                             cpu=cn / (n * c1) if c1 > 0 else None))
    note = None
    if any(key[0] == BASELINE for key in errors):
        note = "len(x) baseline: " + "; ".join(
            v for key, v in errors.items() if key[0] == BASELINE)
    return {"threads": n, "note": note, "rows": rows,
            "settings": settings._asdict()}


def _row(call, kind, ns=None, ratio=None, baseline=None, cpu=None,
         error=None):
    return {"call": call, "kind": kind, "expr": ROWS[call][1],
            "ns_1thread": ns, "ratio": ratio, "len_ratio": baseline,
            "cpu_per_call": cpu,
            "of_len": (ratio / baseline if ratio is not None and baseline
                       else None),
            "error": error}


#: The target (issue 26 item 5), judged on the per-thread rows: the ratio
#: at least TARGET_OF_N of N (1.8x with 2 threads) and at least TARGET_OF_LEN
#: of len(x)'s ratio beside it.
TARGET_OF_N = 0.9
TARGET_OF_LEN = 0.9
#: Below this fraction of N, len(x)'s own ratio says the machine had no N
#: cores to give (other load): the row cannot judge the target ("busy").
BUSY_OF_N = 0.8


def target(row, n):
    """"met", "missed", "busy" (len(x) itself did not scale: the machine is
    loaded) or None (a shared row, or no figure)."""
    if row["kind"] != "own" or row["ratio"] is None or row["of_len"] is None:
        return None
    if row["len_ratio"] < BUSY_OF_N * n:
        return "busy"
    ok = row["ratio"] >= TARGET_OF_N * n and row["of_len"] >= TARGET_OF_LEN
    return "met" if ok else "missed"


def lines(result):
    """The scaling table as text lines (at most 100 columns)."""
    n = result["threads"]
    st = result.get("settings")
    how = (f"best of {st['rounds']} rounds of ~{st['target_s']:g} s runs; "
           if st else "")
    out = [f"scaling, {n} threads against 1 ({how}ratio: {n}-thread throughput / "
           f"1-thread, {n}.00x is perfect; len: len(x)'s ratio measured just "
           f"before; of len: ratio / len; cpu: CPU time per call on {n} "
           f"threads / on 1, 1.00 is no contention; target on own objects: "
           f">= {TARGET_OF_N * n:.2f}x and >= {TARGET_OF_LEN} of len; busy: len "
           f"below {BUSY_OF_N * n:.2f}x, the machine had no {n} cores to give)"]
    if result.get("note"):
        out.append("  " + result["note"])
    if not result["rows"] or all(r["ratio"] is None for r in result["rows"]):
        if result["rows"] and not result.get("note"):
            out.append("  " + result["rows"][0]["error"])
        return out
    fmt = "  {:<16} {:<7} {:>8} {:>7} {:>7} {:>6} {:>5}  {}"
    out.append(fmt.format("call", "objects", "ns 1-thr", "ratio", "len",
                          "of len", "cpu", "target").rstrip())
    for r in result["rows"]:
        if r["error"]:
            out.append(f"  {r['call']:<16} {r['kind']:<7} {r['error']}"[:100])
            continue
        out.append(fmt.format(
            r["call"], r["kind"], f"{r['ns_1thread']:.0f}", f"{r['ratio']:.2f}x",
            f"{r['len_ratio']:.2f}x" if r["len_ratio"] else "",
            f"{r['of_len']:.2f}" if r["of_len"] else "",
            f"{r['cpu_per_call']:.2f}" if r["cpu_per_call"] else "",
            target(r, n) or "").rstrip())
    return out


_NUM = {"type": ["number", "null"]}
_ROW = {"type": "object",
        "required": ["call", "kind", "expr", "ns_1thread", "ratio",
                     "len_ratio", "of_len", "cpu_per_call", "error"],
        "properties": {"call": {"enum": [c for c in CALLS if c != BASELINE]},
                       "kind": {"enum": list(KINDS)},
                       "expr": {"type": "string"},
                       "ns_1thread": _NUM, "ratio": _NUM, "len_ratio": _NUM,
                       "of_len": _NUM, "cpu_per_call": _NUM,
                       "error": {"type": ["string", "null"]}}}
SCHEMA = {"type": "object", "required": ["threads", "note", "rows"],
          "properties": {"threads": {"type": "integer"},
                         "settings": {"type": "object",
                                      "required": ["rounds", "target_s"]},
                         "note": {"type": ["string", "null"]},
                         "rows": {"type": "array", "items": _ROW}}}


def main(argv=None):
    """python -m dlbridge._bench_scaling [quick|default|full] [KERNEL]"""
    argv = sys.argv[1:] if argv is None else argv
    mode = argv[0] if argv else "default"
    kernel = argv[1] if len(argv) > 1 else os.environ.get("DLB_EXAMPLE_KERNELS")
    print("\n".join(lines(measure(kernel, MODES[mode]))))


if __name__ == "__main__":
    main()
