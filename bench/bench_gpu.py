"""bench_gpu.py -- dlbridge on a real GPU, as ratios taken in one run
(issue 8, item 8; run by scripts/gpu-check).

  1. from_dlpack of one CUDA tensor: dlbridge vs each framework's own
     from_dlpack (torch, CuPy, JAX), ns per call.
  2. Function with 3 CUDA tensors (a no-op kernel, so the call itself is
     measured): vs the bare METH_FASTCALL no-op, the raw exchange API
     (bench/_noop.c: 3 borrowed views + 1 stream query, the least any
     consumer of torch tensors does) and 3 calls of the framework's own
     from_dlpack; plus the example CUDA saxpy vs torch.add, launches only.
  3. convert torch -> CuPy / JAX vs cupy.from_dlpack / jax.dlpack.from_dlpack.
  4. Host <-> device copies of 64 MiB as a fraction of a copy between pinned
     host memory and the device (torch's copy_, i.e. cudaMemcpyAsync).
  5. Strided device copy (a transposed 8192 x 8192 float32) as a fraction
     of the device's contiguous copy bandwidth (torch's copy_).

Figures are informational: the exit status is 0 whatever they are (and 0,
with a note, on a machine without a GPU); non-zero only when this script
itself breaks.  A case that cannot run (a framework missing, an API the
build lacks) is printed as n/a with the reason.

Timing: calls -- dlbridge._measure (as bench/bench_calls.py and `dlbridge
bench`): timeit loops over locals, statement unrolled 10x, gc off, best of
ROUNDS medians with the cases' rounds interleaved.  Copies -- synchronise, then REPS copies each
followed by a device synchronisation, median of the per-copy times.

Options: --json PATH (also written to $OUT/bench_gpu.json when OUT is set),
--table PATH (the printed tables, for scripts/gpu-check's summary), --quick.
"""

import argparse
import gc
import glob
import json
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--json")
ap.add_argument("--table")
ap.add_argument("--quick", action="store_true")
ARGS = ap.parse_args()

from dlbridge import _measure  # noqa: E402  (imports no framework)

ROUNDS = 3 if ARGS.quick else 5
REPEATS = 3 if ARGS.quick else 5
TARGET_S = 0.005 if ARGS.quick else 0.01
COPY_REPS = 5 if ARGS.quick else 10

LINES = []
RESULTS = {"machine": {}, "from_dlpack": {}, "function": {}, "convert": {},
           "copies": {}, "strided": {}, "not_measured": {}}


def emit(line=""):
    print(line, flush=True)
    LINES.append(line)


def finish(code=0):
    if ARGS.table:
        with open(ARGS.table, "w") as f:
            f.write("\n".join(LINES) + "\n")
    paths = [p for p in (ARGS.json,) if p]
    if os.environ.get("OUT"):
        paths.append(os.path.join(os.environ["OUT"], "bench_gpu.json"))
    for p in paths:
        try:
            with open(p, "w") as f:
                json.dump(RESULTS, f, indent=1, default=str)
        except OSError as e:
            print("bench_gpu: cannot write %s: %s" % (p, e), file=sys.stderr)
    sys.exit(code)


def why(e):
    return ("%s: %s" % (type(e).__name__, e)).splitlines()[0][:90]


# ---- call timing: dlbridge._measure, shared with bench_calls.py and the CLI ----

SETTINGS = _measure.Settings(rounds=ROUNDS, repeats=REPEATS, target_s=TARGET_S)
Case = _measure.Case


def RawLoop(loop, a, b, c):
    """_noop.exchange_loop: the raw exchange-API cost timed inside C."""
    return _measure.SelfTimed(loop, a, b, c)


def measure(cases):
    """{key: Case | str (why not measured) | None} -> {key: ns | str}."""
    got = _measure.measure(cases, SETTINGS)
    return {k: "n/a" if v is None else v for k, v in got.items()}


def num(*vs):
    return all(isinstance(v, float) for v in vs)


def f_ns(v):
    return "%10.1f" % v if isinstance(v, float) else "%10s" % "n/a"


def ratio(a, b):
    """a / b formatted, n/a unless both were measured."""
    return "%8.2fx" % (a / b) if num(a, b) and b > 0 else "%9s" % "n/a"


def notes(table):
    for key, v in table.items():
        if isinstance(v, str):
            emit("  n/a %s: %s" % (" / ".join(map(str, key)) if isinstance(key, tuple)
                                   else key, v))


# ---- setup ------------------------------------------------------------------------

try:
    import torch
except Exception as e:
    emit("bench_gpu: skipped: torch is not importable (%s)" % why(e))
    RESULTS["skipped"] = "torch not importable"
    finish(0)
if not torch.cuda.is_available():
    emit("bench_gpu: skipped: torch sees no CUDA device")
    RESULTS["skipped"] = "no GPU"
    finish(0)

import numpy as np  # noqa: E402

import dlbridge as dlb  # noqa: E402

DEV = "cuda:0"


def optional(name, check=None):
    try:
        mod = __import__(name, fromlist=["_"])
        if check is not None:
            check(mod)
        return mod
    except Exception as e:
        RESULTS["not_measured"][name] = why(e)
        return None


def _jax_gpu(jax):
    import jax.dlpack  # noqa: F401
    if not jax.devices("gpu"):
        raise RuntimeError("JAX has no GPU device")


cupy = optional("cupy")
jax = optional("jax", _jax_gpu)

sys.path.insert(0, os.environ.get("DLB_BENCH_PEERS", os.path.join(ROOT, "build", "bench")))
try:
    import _noop
except ImportError as e:
    _noop = None
    RESULTS["not_measured"]["raw exchange API"] = (
        "bench/_noop.c not built (%s); scripts/gpu-check builds it" % e)


def find_lib(env, name):
    p = os.environ.get(env)
    if p and os.path.exists(p):
        return p
    hits = sorted(glob.glob(os.path.join(ROOT, "build*", name)))
    return hits[0] if hits else None


def load_function(env, libname, symbol, sig):
    lib = find_lib(env, libname)
    if lib is None:
        return "%s not built" % libname
    try:
        return dlb.load(lib, symbol, sig)
    except Exception as e:
        return why(e)


noop3 = load_function("DLB_EXAMPLE_KERNELS", "libdlb_example_kernels.so", "dlb_kernel_noop",
                      "noop3(a: float32[n], b: float32[n], c: float32[n])")
saxpy_out = load_function("DLB_EXAMPLE_CUDA_KERNELS", "libdlb_example_cuda_kernels.so",
                          "dlb_kernel_cuda_saxpy_out",
                          "saxpy(a: float32, x: float32[n], y: float32[n]) -> float32[n]")

props = torch.cuda.get_device_properties(0)
versions = {"torch": torch.__version__, "numpy": np.__version__,
            "dlbridge": dlb.__version__,
            "cupy": getattr(cupy, "__version__", "n/a"),
            "jax": getattr(jax, "__version__", "n/a")}
RESULTS["machine"] = {"gpu": props.name, "sms": props.multi_processor_count,
                      "cpus": os.cpu_count(), "python": platform.python_version(),
                      **versions}
emit("GPU benchmarks: %s (%d SMs), %d CPUs, Python %s" % (
    props.name, props.multi_processor_count, os.cpu_count(), platform.python_version()))
emit("  " + ", ".join("%s %s" % kv for kv in versions.items()))


def rule(title):
    emit()
    emit("== %s %s" % (title, "=" * max(0, 72 - len(title))))


# Per framework: three float32[1] CUDA tensors and its own from_dlpack.
def three(make):
    try:
        return [make() for _ in range(3)], None
    except Exception as e:
        return None, why(e)


SRC = {}
OWN = {}
SRC["torch"], _ = three(lambda: torch.zeros(1, device=DEV))
OWN["torch"] = torch.from_dlpack
if cupy is not None:
    SRC["cupy"], _ = three(lambda: cupy.zeros(1, dtype=cupy.float32))
    OWN["cupy"] = cupy.from_dlpack
if jax is not None:
    _gpu = jax.devices("gpu")[0]
    SRC["jax"], _ = three(lambda: jax.device_put(np.zeros(1, np.float32), _gpu))
    OWN["jax"] = jax.dlpack.from_dlpack
SRC["dlbridge"], err = three(lambda: dlb.zeros((1,), device=DEV))
if SRC["dlbridge"] is None:
    RESULTS["not_measured"]["dlbridge CUDA tensors"] = err
    del SRC["dlbridge"]
OWN["dlbridge"] = None
torch.cuda.synchronize()

# ---- 1. from_dlpack -------------------------------------------------------------------
rule("from_dlpack, one CUDA float32[1] tensor: ns per call")
cases = {}
for fw, (a, _, _) in SRC.items():
    cases[fw, "dlb"] = Case("f(a)", f=dlb.from_dlpack, a=a)
    cases[fw, "own"] = Case("f(a)", f=OWN[fw], a=a) if OWN[fw] else "n/a"
    cases[fw, "torch"] = Case("f(a)", f=torch.from_dlpack, a=a)
got = measure(cases)
emit("%-10s%12s%12s%10s%14s%10s" % ("source", "dlb", "own", "own/dlb",
                                    "torch.from_dl", "torch/dlb"))
for fw in SRC:
    d, o, t = got[fw, "dlb"], got[fw, "own"], got[fw, "torch"]
    RESULTS["from_dlpack"][fw] = {"dlb_ns": d, "own_ns": o, "torch_ns": t}
    emit("%-10s%s  %s%s    %s%s" % (fw, f_ns(d), f_ns(o), ratio(o, d), f_ns(t), ratio(t, d)))
notes({k: v for k, v in got.items() if k[1] != "own" or OWN[k[0]]})
emit("own = the source framework's from_dlpack (torch.from_dlpack, "
     "cupy.from_dlpack, jax.dlpack.from_dlpack)")

# ---- 2. Function ----------------------------------------------------------------------
rule("Function with 3 CUDA float32[1] tensors (no-op kernel): ns per call")
cases = {}
for fw, (a, b, c) in SRC.items():
    abc = dict(a=a, b=b, c=c)
    cases[fw, "no-op"] = Case("f(a, b, c)", f=_noop.noop, **abc) if _noop else "no _noop"
    cases[fw, "raw-xchg"] = (Case("f(a, b, c)", f=_noop.exchange3, **abc)
                             if _noop and hasattr(type(a), "__dlpack_c_exchange_api__")
                             else "no exchange table" if _noop else "no _noop")
    cases[fw, "Function"] = (Case("f(a, b, c)", f=noop3, **abc)
                             if not isinstance(noop3, str) else noop3)
    cases[fw, "own x3"] = (Case("g(a); g(b); g(c)", g=OWN[fw], **abc) if OWN[fw]
                           else "n/a")
if _noop is not None and "torch" in SRC:
    cases["torch", "raw loop"] = RawLoop(_noop.exchange_loop, *SRC["torch"])
got = measure(cases)
cols = ["no-op", "raw-xchg", "Function", "own x3"]
emit("%-10s" % "args" + "".join("%11s" % c for c in cols) + "%12s%12s" % ("own3/Fn", "Fn-noop"))
for fw in SRC:
    r = {c: got[fw, c] for c in cols}
    over = r["Function"] - r["no-op"] if num(r["Function"], r["no-op"]) else None
    RESULTS["function"][fw] = dict(r, overhead_ns=over)
    emit("%-10s" % fw + "".join(f_ns(r[c]) + " " for c in cols)
         + ratio(r["own x3"], r["Function"]) + "   " + f_ns(over))
raw = got.get(("torch", "raw loop"))
t = RESULTS["function"].get("torch", {})
if num(raw, t.get("Function"), t.get("no-op")):
    over = t["Function"] - t["no-op"]
    RESULTS["function"]["torch_vs_raw"] = over / raw
    emit("torch: Function overhead over the no-op %.1f ns vs the raw exchange-API "
         "cost %.1f ns (C loop) = %.2fx (target <= 1.3x)" % (over, raw, over / raw))
notes({k: v for k, v in got.items() if v not in ("n/a",)})
emit("raw-xchg = a no-op that reads the 3 tensors through the exchange table + 1 "
     "stream query;\nown x3 = the framework's own from_dlpack on each argument")

# The example CUDA kernel, launches only (the queue drains behind them).
cases = {}
if "torch" in SRC:
    xs = [torch.ones(1, device=DEV) for _ in range(2)]
    cases["saxpy Function"] = (Case("f(2.0, x, y)", f=saxpy_out, x=xs[0], y=xs[1])
                               if not isinstance(saxpy_out, str) else saxpy_out)
    cases["torch.add"] = Case("f(y, x, alpha=2.0)", f=torch.add, x=xs[0], y=xs[1])
    got = measure(cases)
    torch.cuda.synchronize()
    RESULTS["function"]["saxpy_launch"] = got
    emit("torch float32[1] saxpy through Function: %s ns; torch.add(y, x, alpha=2): %s ns"
         " (%s)" % (f_ns(got["saxpy Function"]).strip(), f_ns(got["torch.add"]).strip(),
                    ratio(got["torch.add"], got["saxpy Function"]).strip() + " torch/Function"))
    notes(got)

# ---- 3. convert -----------------------------------------------------------------------
rule("convert torch -> CuPy / JAX: ns per call")
cases = {}
a = SRC["torch"][0]
for name, mod in (("cupy", cupy), ("jax", jax)):
    if mod is None:
        cases[name, "dlb"] = cases[name, "theirs"] = "%s not available" % name
        continue
    own = mod.from_dlpack if name == "cupy" else mod.dlpack.from_dlpack
    cases[name, "dlb"] = Case("f(a, to)", f=dlb.convert, a=a, to=name)
    cases[name, "theirs"] = Case("f(a)", f=own, a=a)
got = measure(cases)
emit("%-16s%12s%12s%10s   theirs is" % ("", "dlb.convert", "theirs", "th/dlb"))
for name, their in (("cupy", "cupy.from_dlpack"), ("jax", "jax.dlpack.from_dlpack")):
    d, th = got[name, "dlb"], got[name, "theirs"]
    RESULTS["convert"]["torch->" + name] = {"dlb_ns": d, "theirs_ns": th}
    emit("%-16s%s  %s%s   %s" % ("torch -> " + name, f_ns(d), f_ns(th), ratio(th, d), their))
notes(got)
gc.collect()
torch.cuda.synchronize()


# ---- 4. host <-> device copies ------------------------------------------------------------
def time_copy(fn):
    """Median seconds of fn() followed by a device synchronisation."""
    fn()
    torch.cuda.synchronize()
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(COPY_REPS):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def timed(fn):
    try:
        return time_copy(fn)
    except Exception as e:
        return why(e)


rule("host <-> device copies, 64 MiB float32: ms per copy")
NBYTES = 64 << 20
n = NBYTES // 4
pinned = torch.arange(n, dtype=torch.float32).pin_memory()
pageable = np.arange(n, dtype=np.float32)
dev = torch.empty(n, dtype=torch.float32, device=DEV)
dev.copy_(pinned)
torch.cuda.synchronize()
cp = {
    "H2D ref (pinned copy_)": timed(lambda: dev.copy_(pinned, non_blocking=True)),
    "H2D dlb from pinned": timed(lambda: dlb.from_dlpack(pinned).copy(device=DEV)),
    "H2D dlb from pageable": timed(lambda: dlb.from_dlpack(pageable).copy(device=DEV)),
    "H2D dlb from_dlpack(copy)": timed(
        lambda: dlb.from_dlpack(pageable, device=DEV, copy=True)),
    "D2H ref (pinned copy_)": timed(lambda: pinned.copy_(dev, non_blocking=True)),
    "D2H dlb to new host": timed(lambda: dlb.from_dlpack(dev).copy(device="cpu")),
    "D2H torch .cpu() (peer)": timed(lambda: dev.cpu()),
}
emit("%-28s%10s%10s%12s" % ("case", "ms", "GB/s", "of pinned"))
for key, v in cp.items():
    ref = cp["H2D ref (pinned copy_)" if key.startswith("H2D") else "D2H ref (pinned copy_)"]
    frac = ref / v if num(ref, v) else None
    RESULTS["copies"][key] = {"s": v, "fraction_of_pinned": frac}
    if isinstance(v, float):
        emit("%-28s%10.2f%10.1f%12s" % (key, v * 1e3, NBYTES / v / 1e9,
                                        "%.2f" % frac if frac else "n/a"))
    else:
        emit("%-28s%10s   %s" % (key, "n/a", v))
emit("of pinned = the reference's time / this time (1.00: as fast as a pinned "
     "cudaMemcpyAsync);\nthe dlb cases include allocating the destination")
del pinned, pageable, dev
gc.collect()
torch.cuda.synchronize()

# ---- 5. strided device copy ------------------------------------------------------------------
side = 4096 if ARGS.quick else 8192
rule("device copies, %d x %d float32 (%d MiB): ms per copy" % (side, side, side * side * 4 >> 20))
x = torch.rand(side, side, device=DEV)
y = torch.empty_like(x)
xt = x.t()
nb = x.numel() * 4
try:
    dx, dxt = dlb.from_dlpack(x), dlb.from_dlpack(xt)
except Exception as e:
    dx = dxt = None
    RESULTS["not_measured"]["strided"] = why(e)
st = {
    "contiguous ref (copy_)": timed(lambda: y.copy_(x)),
    "contiguous dlb .copy()": timed(lambda: dx.copy()) if dx is not None else "n/a",
    "transposed dlb .copy()": timed(lambda: dxt.copy()) if dxt is not None else "n/a",
    "transposed torch .contiguous()": timed(lambda: xt.contiguous()),
}
emit("%-32s%10s%12s%14s" % ("case", "ms", "GB/s r+w", "of contiguous"))
ref = st["contiguous ref (copy_)"]
for key, v in st.items():
    frac = ref / v if num(ref, v) else None
    RESULTS["strided"][key] = {"s": v, "fraction_of_contiguous": frac}
    if isinstance(v, float):
        emit("%-32s%10.2f%12.1f%14s" % (key, v * 1e3, 2 * nb / v / 1e9,
                                        "%.2f" % frac if frac else "n/a"))
    else:
        emit("%-32s%10s   %s" % (key, "n/a", v))
emit("GB/s r+w counts bytes read and written; of contiguous = the contiguous "
     "copy_'s time / this time")

if RESULTS["not_measured"]:
    emit()
    emit("not measured:")
    for k, v in RESULTS["not_measured"].items():
        emit("  %s: %s" % (k, v))
finish(0)
