"""`dlbridge bench`: per-call cost of dlbridge against each installed
framework's own path, and against nanobind and tvm-ffi when their peers are
built.  Schema and reading: docs/bench.md.

Each framework is measured in a child process of its own (`python -m
dlbridge._bench child FW CONFIG`): frameworks are imported only there (some
cannot share a process: paddle and TensorFlow crash together), a framework
that dies is a note instead of a dead bench, and one framework's threads do
not run beside another's measurement.  Within a child every case of that
framework is timed in the same interleaved rounds (dlbridge._measure), so a
ratio compares figures taken under the same load.  Children run one after
the other, never at once, for the same reason.

Tensors are CPU float32[16] (1-D so every framework, PyArrow included, can
make one), 64-byte aligned (JAX and TensorFlow copy or refuse less aligned
data, which would time a copy instead of the exchange).

The "compiled" rows (JAX's and torch's children) take their figures with
dlbridge/_bench_compiled.py, the rules bench/bench_compiled.py and
bench/bench_torch_ops.py use too; the gradient rows ("train", "train-jit",
"vjp no-grad") with dlbridge/_bench_grad.py; the batch rows ("vmap-jit",
"vmap 1024", "vmap 64": a vmap of a `...` Function) with
dlbridge/_bench_batch.py; the free-threaded scaling rows (1 thread against
N) with dlbridge/_bench_scaling.py, in a child of their own
(`python -m dlbridge._bench scaling CONFIG`; "not run: GIL build" without
a free-threaded interpreter).  The targets of issues 16, 17, 24 and 25 are
judged in the parent from the rows (TARGETS, targets()); they are
informational: the exit status never depends on a speed.
"""

import glob
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time

from . import _bench_batch as _bb
from . import _bench_compiled as _bc
from . import _bench_grad as _bg
from . import _bench_scaling as _bs
from . import _measure
from ._kits import kits, short_name, version_of

SCHEMA_VERSION = 5
# The kits the bench measures, in the registry's order.
FRAMEWORKS = tuple(n for n, k in kits().items() if k.bench)
# Calls every framework has a row of, against its own way ("own").
EAGER_CALLS = ("from_dlpack", "convert", "__dlpack__", "Function")
# A Function as an op of the framework's compiler: {framework: compiler}.
COMPILED = {"jax": "jax.jit", "torch": "torch.compile"}
# Training through a Function with a vjp (dlbridge/_bench_grad.py), and
# what declaring the vjp costs calls that need no gradient: the frameworks
# with each row.
GRAD_CALLS = {"train": ("torch",), "train-jit": ("torch", "jax"),
              "vjp no-grad": ("torch", "jax", "numpy")}
# A vmap of a Function with batch dimensions (dlbridge/_bench_batch.py):
# {call: framework}.
BATCH_CALLS = {_bb.JAX_CALL: "jax",
               **{c: "torch" for c in _bb.TORCH_CALLS.values()}}
CALLS = EAGER_CALLS + ("compiled",) + tuple(GRAD_CALLS) + tuple(BATCH_CALLS)
REFERENCES = ("own", "nanobind", "tvm-ffi", "no-op", "jax-tvm-ffi",
              "define+impl", "custom_op", "autograd.Function", "no vjp",
              "sequential", "loop")
PEERS = ("nanobind", "tvm-ffi", "no-op", "jax-tvm-ffi")
STATUSES = ("met", "missed", "not measured")
MODES = {"quick": _measure.QUICK, "default": _measure.DEFAULT,
         "full": _measure.FULL}
N = 16                     # elements per tensor
CONVERT_N = 256            # elements of convert's source: 1 KiB of float32
MAX_VERSION = (1, 3)       # what __dlpack__ is asked for
KERNEL_LIB = "libdlb_example_kernels.so"
KERNEL_SYMBOL = "dlb_kernel_noop"
KERNEL_SIGNATURE = "noop3(a: float32[n], b: float32[n], c: float32[n])"
PEERS_ENV = "DLBRIDGE_BENCH_PEERS"
KERNELS_ENV = "DLB_EXAMPLE_KERNELS"
MARK = "DLBRIDGE-BENCH "   # prefix of the child's result line on stdout
CHILD_TIMEOUT_S = 300

# What dlbridge does in each row (the "call" column), shown in the legend.
DLB_EXPR = {"from_dlpack": "dlb.from_dlpack(x)", "convert": "dlb.convert(y, FW)",
            "__dlpack__": "t.__dlpack__(max_version=v)",
            "Function": "noop3(a, b, c)"}
# The compiled rows' dlbridge side, per framework.
COMPILED_EXPR = {"jax": "step(x) in jax.jit",
                 "torch": "saxpy(2.0, x, y) in torch.compile"}
# torch.compile's default backend, the one users get (bench/bench_torch_ops.py
# measures aot_eager too).
TORCH_BACKEND = "inductor"
LEGEND = ("x, a, b, c: the framework's float32[16] tensors; y: a NumPy "
          "float32[256] (1 KiB; for numpy: a dlb.Tensor of one); "
          "t = dlb.from_dlpack(x); v = (1, 3); noop3: "
          "dlb.Function of a C kernel that does nothing; tf_from_dlpack: "
          "tf.experimental.dlpack.from_dlpack.  ns per call, best of "
          "interleaved rounds; ref/dlb: the reference's time over dlbridge's, "
          "same run (above 1: dlbridge is faster).  compiled: ns an op adds "
          "per call inside one compiled graph -- jax.jit: 1,000 chained "
          "calls of step: float32[n] -> float32[n] (the no-op kernel) minus "
          "1,000 no-op ffi_calls, / 1,000; torch.compile (inductor): 100 "
          "chained saxpy calls on float32[8] minus none, / 100; define+impl: "
          "a bare torch.library op of the same schema; custom_op: a "
          "torch.library.custom_op wrapping the Function.  train: one step "
          "mul(a, b).backward(g) of two float32[16] leaves, mul a Function "
          "of dlb_kernel_mul_f32 with vjp= its vjp kernel, against the same "
          "two kernels in a custom_op + register_autograd and in a "
          "torch.autograd.Function; train-jit: the same compiled (inductor), "
          "and for JAX one call of jax.jit(jax.grad(sum of mul)) against "
          "jax-tvm-ffi targets of the two kernels under jax.custom_vjp; vjp "
          "no-grad: mul called on tensors that need no gradient, against the "
          "same kernel declared without a vjp.  vmap-jit: ns per call of "
          "jax.vmap over 64 items of bscale(a: float32[...], x: float32[..., "
          "16]), 1,000 chained in one jax.jit minus as many no-op ffi_calls, "
          "against the same Function's target per item with vmap_method="
          "sequential (100 chained) and the same kernel through jax-tvm-ffi "
          "with vmap_method=broadcast_all; vmap 1024 / 64: torch.vmap of "
          "bscale over that many items against a Python loop of eager calls, "
          "stacked.")


# ------------------------------------------------------------ child side

def _aligned_ones(np, n):
    """A float32 NumPy array of n ones whose data is 64-byte aligned."""
    raw = np.empty(n * 4 + 64, dtype=np.uint8)
    skip = -raw.ctypes.data % 64
    a = raw[skip:skip + n * 4].view(np.float32)
    a[:] = 1
    return a


def _peer_functions(cfg):
    """({reference kind: callable or error text} of the Function peers,
    nanobind's one-tensor function or error text, or None) for the peers
    the parent found present (absent ones are a note of the parent's)."""
    out, one = {}, None
    peers = cfg.get("peers", {})
    d = cfg.get("peers_dir")
    if d and d not in sys.path:
        sys.path.insert(0, d)
    if peers.get("nanobind", {}).get("present"):
        try:
            import _nb_peer
            out["nanobind"] = _nb_peer.f
            one = getattr(_nb_peer, "f1", None) or (
                "the nanobind peer has no f1 (built before it had one: run "
                "bench/build_peers.sh again)")
        except Exception as e:
            out["nanobind"] = one = _measure.why(e)
    if peers.get("tvm-ffi", {}).get("present"):
        try:
            import tvm_ffi
            out["tvm-ffi"] = tvm_ffi.load_module(peers["tvm-ffi"]["path"])["noop3"]
        except Exception as e:
            out["tvm-ffi"] = _measure.why(e)
    if peers.get("no-op", {}).get("present"):
        try:
            import _noop
            out["no-op"] = _noop.noop
        except Exception as e:
            out["no-op"] = _measure.why(e)
    return out, one


PEER_EXPR = {"nanobind": "nanobind f(a, b, c)", "tvm-ffi": "tvm-ffi noop3(a, b, c)",
             "no-op": "C no-op f(a, b, c) (floor)"}
NANOBIND_ONE_EXPR = "nanobind f1(x)"
COMPILED_REF_EXPR = {"jax-tvm-ffi": "jax-tvm-ffi step(x) in jax.jit",
                     "define+impl": "bare define+impl op",
                     "custom_op": "custom_op wrapper of Function"}


def child(fw, cfg):
    """Measure framework fw; returns the rows (as in the report)."""
    import numpy as np

    import dlbridge as dlb
    settings = _measure.Settings(**cfg["settings"])
    kit = kits()[fw]

    def make(a):
        return kit.make(np, a, "float32", "contiguous")[0]
    x, a, b, c = (make(_aligned_ones(np, N)) for _ in range(4))
    y = _aligned_ones(np, CONVERT_N)
    y = dlb.from_dlpack(y) if fw == "numpy" else y
    # dlbridge's own tensor for the __dlpack__ row (read through the kit's
    # export: Open3D's tensors, for one, dlbridge cannot read directly yet)
    t = dlb.from_dlpack(kit.exportable(x))
    if kit.own_label is None:
        own_label, own = "(no importer)", kit.no_importer
    else:
        own_label, own = kit.own_label, kit.own_importer()

    cases = {}   # (call, who) -> Case or reason
    labels = {}  # (call, reference kind) -> expression of the reference

    def add(call, who, label, case):
        cases[call, who] = case
        if who != "dlb":
            labels[call, who] = label

    add("from_dlpack", "dlb", None, _measure.Case("f(x)", f=dlb.from_dlpack, x=x))
    add("from_dlpack", "own", own_label.format("x"),
        own if isinstance(own, str) else _measure.Case("f(x)", f=own, x=x))
    add("convert", "dlb", None,
        _measure.Case("f(y, fw)", f=dlb.convert, y=y, fw=fw))
    ref_label, ref = kit.convert_reference()
    add("convert", "own", ref_label,
        ref if isinstance(ref, str) else _measure.Case("f(y)", f=ref, y=y))
    # As a DLPack 1.x consumer asks (and the only way read-only data, such
    # as PyArrow's, can be exported).
    add("__dlpack__", "dlb", None,
        _measure.Case("t.__dlpack__(max_version=v)", t=t, v=MAX_VERSION))
    add("__dlpack__", "own", "x.__dlpack__(max_version=v)",
        _measure.Case("x.__dlpack__(max_version=v)", x=x, v=MAX_VERSION))
    kernel = cfg.get("kernel")
    if kernel:
        try:
            fn = dlb.load(kernel, KERNEL_SYMBOL, KERNEL_SIGNATURE)
            fcase = _measure.Case("f(a, b, c)", f=fn, a=a, b=b, c=c)
        except Exception as e:
            fcase = _measure.why(e)
    else:
        fcase = _no_kernel_text()
    add("Function", "dlb", None, fcase)
    op = kit.op()
    if op is None:
        add("Function", "own", "(no operation)",
            f"{fw} has no three-tensor operation in its kit")
    else:
        op_label, op_stmt, op_names = op
        add("Function", "own", op_label,
            _measure.Case(op_stmt, a=a, b=b, c=c, **op_names))
    peer_functions, nanobind_one = _peer_functions(cfg)
    for kind, f in peer_functions.items():
        add("Function", kind, PEER_EXPR[kind],
            f if isinstance(f, str) else _measure.Case("f(a, b, c)", f=f, a=a, b=b, c=c))
    if nanobind_one is not None:
        add("from_dlpack", "nanobind", NANOBIND_ONE_EXPR,
            nanobind_one if isinstance(nanobind_one, str)
            else _measure.Case("f(x)", f=nanobind_one, x=x))

    got = _measure.measure(cases, settings)
    rows = []
    for (call, who), label in labels.items():
        ours, theirs = got[call, "dlb"], got[call, who]
        rows.append({
            "framework": fw, "call": call,
            "dlbridge": _side(DLB_EXPR[call].replace("FW", repr(fw)), ours),
            "reference": dict(kind=who, **_side(label, theirs)),
            "ratio": theirs / ours if _measure.num(ours, theirs) else None})
    # Sorted by call, as the table groups them (the nanobind from_dlpack
    # row was added after the Function rows).
    rows.sort(key=lambda r: EAGER_CALLS.index(r["call"]))
    if fw in COMPILED:
        rows += _compiled_rows(fw, cfg, settings)
    if any(fw in fws for fws in GRAD_CALLS.values()):
        rows += _grad_rows(fw, cfg, settings, make)
    if fw in BATCH_CALLS.values():
        rows += _batch_rows(fw, cfg, settings)
    return rows


def _side(expr, value, compile_s=None):
    ok = isinstance(value, float)
    out = {"expr": expr, "ns": value if ok else None,
           "error": None if ok else (value or "not measured")}
    if compile_s is not None:
        out["compile_s"] = compile_s
    return out


def _row(fw, call, ours, kind, theirs):
    """A row from two sides made by _side."""
    return {"framework": fw, "call": call, "dlbridge": ours,
            "reference": dict(kind=kind, **theirs),
            "ratio": (theirs["ns"] / ours["ns"]
                      if ours["ns"] is not None and theirs["ns"] is not None
                      else None)}


def _no_kernel_text():
    return ("no no-op kernel library: set DLB_EXAMPLE_KERNELS or pass "
            f"--kernels (meson builds build/{KERNEL_LIB})")


def _compiled_function(cfg, symbol, signature):
    """(the dlbridge Function of the kernel library's `symbol`, None), or
    (None, why there is none) for a compiled row."""
    import dlbridge as dlb
    kernel = cfg.get("kernel")
    if not kernel:
        return None, _no_kernel_text()
    try:
        return dlb.load(kernel, symbol, signature), None
    except Exception as e:
        return None, _measure.why(e, 160)


def _compiled_rows(fw, cfg, settings):
    """The "compiled" rows of jax or torch (dlbridge/_bench_compiled.py)."""
    try:
        if fw == "jax":
            return _jax_compiled_rows(cfg)
        return _torch_compiled_rows(cfg, settings)
    except Exception as e:  # the compiler could not be set up at all
        err = _measure.why(e, 160)
        refs = ("jax-tvm-ffi",) if fw == "jax" else ("define+impl", "custom_op")
        return [_row(fw, "compiled", _side(COMPILED_EXPR[fw], err), kind,
                     _side(COMPILED_REF_EXPR[kind], err)) for kind in refs]


def _jax_compiled_rows(cfg):
    import jax
    import jax.numpy as jnp

    peer = cfg.get("peers", {}).get("jax-tvm-ffi", {})
    target = theirs = None
    if peer.get("present"):
        try:
            target = _bc.jax_register_tvm(jax, peer["path"])
        except Exception as e:
            theirs = _measure.why(e, 160)
    else:
        theirs = peer.get("note", "jax-tvm-ffi: absent")
    function, ours = _compiled_function(cfg, _bc.JAX_KERNEL_SYMBOL,
                                        _bc.JAX_SIGNATURE)
    if function is not None or target is not None:
        chains = _bc.jax_chains(jax, function, target)
        if function is None:
            del chains[_bc.JAX_FUNCTION]
        figures = _bc.jax_measure(jax, chains, _bc.jax_input(jnp),
                                  *_bc.JAX_ROUNDS_RUNS[cfg["mode"]])
        if function is not None:
            ours = figures[_bc.JAX_FUNCTION]
        if target is not None:
            theirs = figures[_bc.JAX_TVM]

    def side(expr, f):
        if isinstance(f, dict):
            return _side(expr, f["per_call"] * 1e9, f["trace"] + f["compile"])
        return _side(expr, f)
    return [_row("jax", "compiled", side(COMPILED_EXPR["jax"], ours),
                 "jax-tvm-ffi", side(COMPILED_REF_EXPR["jax-tvm-ffi"], theirs))]


def _torch_compiled_rows(cfg, settings):
    import torch

    function, missing = _compiled_function(cfg, _bc.TORCH_KERNEL_SYMBOL,
                                           _bc.TORCH_SIGNATURE)
    _lib, bare, wrapped = _bc.torch_anchors(torch, function)
    fns = {_bc.TORCH_BARE: bare}
    if function is not None:
        fns[_bc.TORCH_FUNCTION] = function
        fns[_bc.TORCH_WRAPPED] = wrapped
    cases, seconds = _bc.torch_compiled(torch, fns, TORCH_BACKEND)
    timed = _measure.measure(cases, settings)

    def side(expr, name):
        if name not in fns:
            return _side(expr, missing)
        return _side(expr, _bc.torch_per_call(timed, TORCH_BACKEND, name),
                     seconds[TORCH_BACKEND, name])
    ours = side(COMPILED_EXPR["torch"], _bc.TORCH_FUNCTION)
    return [_row("torch", "compiled", ours, kind, side(COMPILED_REF_EXPR[kind], name))
            for kind, name in (("define+impl", _bc.TORCH_BARE),
                               ("custom_op", _bc.TORCH_WRAPPED))]


def _grad_rows(fw, cfg, settings, make):
    """The gradient rows of fw (GRAD_CALLS; dlbridge/_bench_grad.py)."""
    import dlbridge as dlb
    kernel = cfg.get("kernel")
    wanted = [call for call, fws in GRAD_CALLS.items() if fw in fws]
    if not kernel:
        got = {(call, who): _no_kernel_text() for call in wanted
               for who in _bg.references(fw, call)}
    else:
        try:
            got = _bg.cases(fw, dlb, kernel, make, TORCH_BACKEND,
                            cfg.get("peers", {}).get("jax-tvm-ffi", {}))
        except Exception as e:  # the framework's autodiff could not be set up
            why = _measure.why(e, 160)
            got = {(call, who): why for call in wanted
                   for who in _bg.references(fw, call)}
    rows = _bg.rows(fw, _measure.measure(got, settings), _side, _row)
    return sorted(rows, key=lambda r: CALLS.index(r["call"]))


def _batch_rows(fw, cfg, settings):
    """The batch rows of fw (BATCH_CALLS; dlbridge/_bench_batch.py)."""
    import dlbridge as dlb
    kernel = cfg.get("kernel")
    try:
        if fw == "jax":
            import jax
            return _bb.jax_rows(jax, dlb, kernel,
                                cfg.get("peers", {}).get("jax-tvm-ffi", {}),
                                cfg["mode"], _side, _row)
        import torch
        return _bb.torch_rows(torch, dlb, kernel, settings, _side, _row)
    except Exception as e:  # the framework's vmap could not be set up at all
        why = _measure.why(e, 160)
        return [_row(fw, call, _side(_bb.DLB_EXPR[call], why), kind,
                     _side(_bb.ref_expr(call, kind), why))
                for call, owner in BATCH_CALLS.items() if owner == fw
                for kind in _bb.REFERENCES[call]]


def _child_main(argv):
    # Interned, as the literal a user writes is: convert's fast path for
    # "numpy" compares the target by identity, and a name from argv is a
    # different object of the same value (convert is then ~2x slower).
    fw, cfg = sys.intern(argv[0]), json.loads(argv[1])
    try:
        out = {"rows": child(fw, cfg)}
    except Exception as e:  # the framework could not be set up at all
        out = {"error": _measure.why(e, 200)}
    sys.stdout.flush()
    print(MARK + json.dumps(out), flush=True)


def _scaling_main(argv):
    cfg = json.loads(argv[0])
    try:
        out = _bs.measure(cfg.get("kernel"), _bs.MODES[cfg["mode"]])
    except Exception as e:  # the scaling rows could not be set up at all
        out = _bs.not_run(_measure.why(e, 200))
    sys.stdout.flush()
    print(MARK + json.dumps(out), flush=True)


# ------------------------------------------------------------ parent side

def installed_frameworks():
    """The frameworks present, none of them imported."""
    table = kits()
    return [f for f in FRAMEWORKS if table[f].installed()]


def find_kernel(explicit=None):
    """Path of the no-op kernel library, or None: --kernels, then
    $DLB_EXAMPLE_KERNELS, then build/ and the other build*/ directories here."""
    for p in (explicit, os.environ.get(KERNELS_ENV)):
        if p:
            return os.path.abspath(p)
    # build/ (make's) first; never a sanitizer build's, which cannot be
    # loaded into an interpreter without the sanitizer runtime.
    dirs = ["build"] + sorted(d for d in glob.glob("build?*")
                              if "san" not in d and "asan" not in d)
    hits = [os.path.join(d, KERNEL_LIB) for d in dirs
            if os.path.exists(os.path.join(d, KERNEL_LIB))]
    return os.path.abspath(hits[0]) if hits else None


def find_peers(peers_dir=None):
    """(directory, {kind: {"present", "path", "note"}}) for the peers that
    bench/build_peers.sh builds (nanobind, tvm-ffi, the C no-op floor,
    jax-tvm-ffi);
    looked for in --peers, $DLBRIDGE_BENCH_PEERS, then build/bench here.
    Nothing is imported: a peer is present when its file is there (and, for
    tvm-ffi, the tvm_ffi package is installed; for jax-tvm-ffi, jax_tvm_ffi
    too)."""
    d = peers_dir or os.environ.get(PEERS_ENV) or (
        "build/bench" if os.path.isdir("build/bench") else None)
    d = os.path.abspath(d) if d else None
    where = d or "build/bench"
    how = (f"bench/build_peers.sh builds it into build/bench; point "
           f"--peers or ${PEERS_ENV} at that directory")

    def module(name):
        # An extension module (what build_peers.sh makes) or any other
        # module of that name that a plain import would find there.
        if not d:
            return None
        hits = sorted(glob.glob(os.path.join(d, name + ".*so")))
        hits += [p for p in (os.path.join(d, name + ".py"),) if os.path.exists(p)]
        return hits[0] if hits else None

    peers = {}
    nb = module("_nb_peer")
    peers["nanobind"] = (
        {"present": True, "path": nb, "note": "nanobind peer " + nb} if nb else
        {"present": False, "path": None,
         "note": f"nanobind: absent (no _nb_peer module in {where}; {how})"})
    tvm_lib = os.path.join(d, "libtvm_peer.so") if d else None
    if importlib.util.find_spec("tvm_ffi") is None:
        peers["tvm-ffi"] = {"present": False, "path": None,
                            "note": "tvm-ffi: absent (apache-tvm-ffi is not installed)"}
    elif not (tvm_lib and os.path.exists(tvm_lib)):
        peers["tvm-ffi"] = {"present": False, "path": None,
                            "note": f"tvm-ffi: absent (no libtvm_peer.so in {where}; {how})"}
    else:
        peers["tvm-ffi"] = {"present": True, "path": tvm_lib,
                            "note": "tvm-ffi peer " + tvm_lib}
    noop = module("_noop")
    peers["no-op"] = (
        {"present": True, "path": noop, "note": "C no-op floor " + noop} if noop
        else {"present": False, "path": None,
              "note": f"C no-op floor: absent (no _noop module in {where})"})
    jax_lib = os.path.join(d, _bc.JAX_TVM_PEER) if d else None
    missing = [m for m in ("jax_tvm_ffi", "tvm_ffi")
               if importlib.util.find_spec(m) is None]
    if missing:
        peers["jax-tvm-ffi"] = {
            "present": False, "path": None,
            "note": f"jax-tvm-ffi: absent ({' and '.join(missing)} not installed)"}
    elif not (jax_lib and os.path.exists(jax_lib)):
        peers["jax-tvm-ffi"] = {
            "present": False, "path": None,
            "note": f"jax-tvm-ffi: absent (no {_bc.JAX_TVM_PEER} in {where}; {how})"}
    else:
        peers["jax-tvm-ffi"] = {"present": True, "path": jax_lib,
                                "note": "jax-tvm-ffi peer " + jax_lib}
    return d, peers


def _child_env():
    # Quiet frameworks, CPU only (the bench times CPU tensors; TensorFlow
    # and JAX would otherwise place them on a GPU when one is present).
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", GLOG_minloglevel="3",
                JAX_PLATFORMS="cpu", TF_ENABLE_ONEDNN_OPTS="0",
                PYTHONWARNINGS="ignore")


def run_child(fw, cfg):
    """(rows, note or None) for one framework, measured in a child."""
    cmd = [sys.executable, "-m", "dlbridge._bench", "child", fw, json.dumps(cfg)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True,
                           env=_child_env(), timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return [], f"{fw}: not measured: took over {CHILD_TIMEOUT_S} s"
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(MARK):
            out = json.loads(line[len(MARK):])
            if "error" in out:
                return [], f"{fw}: not measured: {out['error']}"
            return out["rows"], None
    rc = p.returncode
    why = f"signal {-rc}" if rc < 0 else f"exit status {rc}"
    tail = [ln.strip() for ln in p.stderr.splitlines() if ln.strip()]
    return [], f"{fw}: not measured: its process died ({why}) {tail[-1] if tail else ''}"[:300]


def run_scaling(cfg):
    """The scaling section, measured in a child of its own (threads of no
    framework beside it)."""
    cmd = [sys.executable, "-m", "dlbridge._bench", "scaling", json.dumps(cfg)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True,
                           env=_child_env(), timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return _bs.not_run(f"took over {CHILD_TIMEOUT_S} s")
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    rc = p.returncode
    tail = [ln.strip() for ln in p.stderr.splitlines() if ln.strip()]
    return _bs.not_run(f"its process died "
                       f"({f'signal {-rc}' if rc < 0 else f'exit status {rc}'}) "
                       f"{tail[-1] if tail else ''}"[:200])


def _machine():
    return {"cpu": _measure.cpu_model(), "cpus": os.cpu_count() or 0,
            "python": platform.python_version(), "platform": platform.platform()}


def run(frameworks=None, mode="default", kernel=None, peers_dir=None,
        progress=None, scaling=True):
    """The whole report (see SCHEMA); progress(fw) is called before each
    framework is measured (and with "scaling" before the scaling rows).
    frameworks=() measures none (the scaling rows only); scaling=False
    leaves the scaling rows out (a note says so)."""
    import dlbridge

    t0 = time.perf_counter()
    fws = list(installed_frameworks() if frameworks is None else frameworks)
    d, peers = find_peers(peers_dir)
    settings = MODES[mode]
    cfg = {"mode": mode, "settings": settings._asdict(),
           "kernel": find_kernel(kernel), "peers_dir": d, "peers": peers}
    rows, notes = [], []
    for fw in fws:
        if progress:
            progress(fw)
        got, note = run_child(fw, cfg)
        rows += got
        if note:
            notes.append(note)
    if scaling:
        if progress:
            progress("scaling")
        scale = run_scaling(cfg)
    else:
        scale = _bs.not_run("not asked for")
    notes += [p["note"] for p in peers.values() if not p["present"]]
    if cfg["kernel"] is None:
        notes.append(f"Function: not measured: no {KERNEL_LIB} (set "
                     f"{KERNELS_ENV} or pass --kernels; meson builds it in build/)")
    report = {"schema_version": SCHEMA_VERSION, "mode": mode,
              "settings": dict(settings._asdict(), unroll=_measure.Case.unroll),
              "seconds": round(time.perf_counter() - t0, 1),
              "machine": _machine(), "dlbridge": dlbridge.__version__,
              "versions": {f: version_of(f) for f in fws}, "frameworks": fws,
              "kernel": cfg["kernel"], "peers": peers, "rows": rows,
              "scaling": scale, "notes": notes}
    report["defects"] = defects(report)
    report["targets"] = targets(report)
    return report


def defects(report):
    """dlbridge's side failing where the framework's own way works (an
    "own" row), or where the reference op works inside the same compiler
    (a "compiled" row): each {framework, call, error}, once per framework
    and call.  Not a defect: convert into a framework with no DLPack
    importer (PyArrow), a Function without the kernel library."""
    table = kits()
    out, seen = [], set()
    for r in report["rows"]:
        fw, call = r["framework"], r["call"]
        if (r["reference"]["kind"] != "own" and call != "compiled"
                and call not in GRAD_CALLS):
            continue
        if r["dlbridge"]["ns"] is not None or r["reference"]["ns"] is None:
            continue
        if call == "convert" and table[fw].own_label is None:
            continue
        if (call in ("Function", "compiled") or call in GRAD_CALLS) and \
                report["kernel"] is None:
            continue
        if (fw, call) not in seen:
            seen.add((fw, call))
            out.append({"framework": fw, "call": call,
                        "error": r["dlbridge"]["error"]})
    return out


# The speed targets of issue 17 item 5 and issue 16 item 7, each
# (framework, call, reference kind, need, label): met when the row's ratio
# (reference ns / dlbridge ns) is at least need.  Informational: the exit
# status never depends on them.
TARGETS = (
    *((fw, "convert", "own", 1.0,
       f"convert into {fw} no slower than its own importer")
      for fw in ("numpy", "jax", "tensorflow")),
    *((fw, "convert", "own", 2.0,
       f"convert into {fw} at least 2x faster than its own importer")
      for fw in ("torch", "paddle")),
    *((fw, "convert", "own", 1 / 1.1,
       f"convert into {fw} within 1.1x of its own importer")
      for fw in ("warp", "open3d", "onnxruntime", "drjit", "mlx")),
    ("tensorflow", "from_dlpack", "nanobind", 1.0,
     "from_dlpack of a TF tensor no slower than nanobind"),
    ("tensorflow", "Function", "nanobind", 1.0,
     "Function of TF tensors no slower than nanobind"),
    ("jax", "compiled", "jax-tvm-ffi", 1.0,
     "Function inside jax.jit no slower than jax-tvm-ffi"),
    ("torch", "compiled", "define+impl", 1 / _bc.TORCH_TARGET,
     f"Function in torch.compile within {_bc.TORCH_TARGET:g}x of a bare "
     "define+impl op"),
    # issue 24 item 7
    ("torch", "train", "custom_op", 1.15,
     "torch training step at least 1.15x faster than custom_op + "
     "register_autograd"),
    ("torch", "train", "autograd.Function", 1 / 1.1,
     "torch training step within 1.1x of a bare torch.autograd.Function"),
    ("torch", "train-jit", "custom_op", 1.0,
     "torch.compile training step no slower than custom_op + register_autograd"),
    ("jax", "train-jit", "jax-tvm-ffi", 1.0,
     "jax.jit(jax.grad) no slower than jax-tvm-ffi + custom_vjp"),
    *((fw, "vjp no-grad", "no vjp", 1 / 1.1,
       f"{fw}: a Function with a vjp, called without grad, within 1.1x of "
       "one without") for fw in GRAD_CALLS["vjp no-grad"]),
    # issue 25 item 7
    ("jax", _bb.JAX_CALL, "sequential", 5.0,
     "jax.vmap of a `...` Function in jax.jit at least 5x faster than "
     "vmap_method='sequential'"),
    ("jax", _bb.JAX_CALL, "jax-tvm-ffi", 1.0,
     "jax.vmap of a `...` Function in jax.jit no slower than jax-tvm-ffi "
     "with vmap_method='broadcast_all'"),
    ("torch", _bb.TORCH_CALLS[1024], "loop", 3.0,
     "torch.vmap of a `...` Function over 1,024 items at least 3x faster "
     "than a Python loop of eager calls"),
)


def targets(report):
    """Each target of TARGETS judged from the report's rows: {framework,
    call, reference, need, label, ratio, status, why}; status is "met",
    "missed" or "not measured" (why says why)."""
    rows = {(r["framework"], r["call"], r["reference"]["kind"]): r
            for r in report["rows"]}
    table = kits()
    out = []
    for fw, call, kind, need, label in TARGETS:
        r = rows.get((fw, call, kind))
        ratio, why = (r["ratio"] if r else None), None
        if ratio is None:
            why = _not_measured_why(report, table, fw, kind, r)
        out.append({"framework": fw, "call": call, "reference": kind,
                    "need": need, "label": label, "ratio": ratio,
                    "status": ("not measured" if ratio is None else
                               "met" if ratio >= need else "missed"),
                    "why": why})
    return out


def _not_measured_why(report, table, fw, kind, row):
    if fw not in report["frameworks"]:
        return ("not installed" if fw not in table or not table[fw].installed()
                else "not in this run's --frameworks")
    if row is None:
        died = [n for n in report["notes"] if n.startswith(f"{fw}: not measured")]
        if died:
            return died[0]
        peer = report["peers"].get(kind)
        return peer["note"] if peer and not peer["present"] else "no such row"
    for side in ("dlbridge", "reference"):
        if row[side]["error"]:
            return f"{row[side]['expr']}: {row[side]['error']}"
    return "not measured"


_SIDE = {"type": "object", "required": ["expr", "ns", "error"],
         "properties": {"expr": {"type": "string"},
                        "ns": {"type": ["number", "null"]},
                        "error": {"type": ["string", "null"]},
                        # compiled rows: seconds to compile the chain
                        "compile_s": {"type": ["number", "null"]}}}

# JSON-Schema-like description of the --json output (docs/bench.md; checked
# by the tests with dlbridge._doctor.validate).
SCHEMA = {
    "type": "object",
    "required": ["schema_version", "mode", "settings", "machine", "dlbridge",
                 "versions", "frameworks", "kernel", "peers", "rows", "notes",
                 "defects", "targets", "scaling"],
    "properties": {
        "schema_version": {"enum": [SCHEMA_VERSION]},
        "mode": {"enum": list(MODES)},
        "settings": {"type": "object",
                     "required": ["rounds", "repeats", "target_s", "unroll"],
                     "properties": {"rounds": {"type": "integer"},
                                    "repeats": {"type": "integer"},
                                    "target_s": {"type": "number"},
                                    "unroll": {"type": "integer"}}},
        "seconds": {"type": "number"},
        "machine": {"type": "object", "required": ["cpu", "cpus", "python"],
                    "properties": {"cpu": {"type": "string"},
                                   "cpus": {"type": "integer"},
                                   "python": {"type": "string"}}},
        "dlbridge": {"type": "string"},
        "versions": {"type": "object"},
        "frameworks": {"type": "array", "items": {"enum": list(FRAMEWORKS)}},
        "kernel": {"type": ["string", "null"]},
        "peers": {"type": "object", "required": list(PEERS),
                  "properties": {k: {"type": "object",
                                     "required": ["present", "path", "note"],
                                     "properties": {
                                         "present": {"enum": [True, False]},
                                         "path": {"type": ["string", "null"]},
                                         "note": {"type": "string"}}}
                                 for k in PEERS}},
        "rows": {"type": "array", "items": {
            "type": "object",
            "required": ["framework", "call", "dlbridge", "reference", "ratio"],
            "properties": {
                "framework": {"enum": list(FRAMEWORKS)},
                "call": {"enum": list(CALLS)},
                "dlbridge": _SIDE,
                "reference": dict(_SIDE, required=["kind"] + _SIDE["required"],
                                  properties=dict(_SIDE["properties"],
                                                  kind={"enum": list(REFERENCES)})),
                "ratio": {"type": ["number", "null"]}}}},
        "scaling": _bs.SCHEMA,
        "notes": {"type": "array", "items": {"type": "string"}},
        "defects": {"type": "array", "items": {
            "type": "object", "required": ["framework", "call", "error"],
            "properties": {"framework": {"enum": list(FRAMEWORKS)},
                           "call": {"enum": list(CALLS)},
                           "error": {"type": "string"}}}},
        "targets": {"type": "array", "items": {
            "type": "object",
            "required": ["framework", "call", "reference", "need", "label",
                         "ratio", "status", "why"],
            "properties": {"framework": {"enum": list(FRAMEWORKS)},
                           "call": {"enum": list(CALLS)},
                           "reference": {"enum": list(REFERENCES)},
                           "need": {"type": "number"},
                           "label": {"type": "string"},
                           "ratio": {"type": ["number", "null"]},
                           "status": {"enum": list(STATUSES)},
                           "why": {"type": ["string", "null"]}}}},
    },
}


# ------------------------------------------------------------ rendering

COLUMNS = (("framework", 10), ("call", 11), ("dlbridge", 9), ("reference", 30),
           ("ns", 9), ("ref/dlb", 8))


def _ns(v):
    return "n/a" if v is None else f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def _ratio(v):
    # against the no-op floor a ratio is far below 1: keep its digits
    return "" if v is None else f"{v:.2f}x" if v >= 0.1 else f"{v:.3f}x"


def table_rows(report):
    """[(framework, call, dlb ns, reference, ref ns, ratio)] as text, the
    framework and call named once per group, and the errors as notes."""
    out, errors, last = [], [], (None, None)
    for r in report["rows"]:
        fw, call = r["framework"], r["call"]
        key = (fw, call)
        first_fw = fw != last[0]
        shown = fw if len(fw) <= COLUMNS[0][1] else short_name(fw)
        out.append((shown if first_fw else "",
                    call if key != last else "",
                    _ns(r["dlbridge"]["ns"]) if key != last else "",
                    r["reference"]["expr"], _ns(r["reference"]["ns"]),
                    _ratio(r["ratio"])))
        for side in ("dlbridge", "reference"):
            e = r[side]["error"]
            if e and (side == "reference" or key != last):
                msg = f"{fw} {call} {r[side]['expr']}: {e}"
                if msg not in errors:
                    errors.append(msg)
        last = key
    return out, errors


def _header(report):
    s = report["settings"]
    return (f"dlbridge bench ({report['mode']}: best of {s['rounds']} rounds of "
            f"{s['repeats']} x ~{s['target_s'] * 1e3:g} ms), "
            f"{report['machine']['cpus']} CPUs, Python {report['machine']['python']}, "
            f"dlbridge {report['dlbridge']}")


def _wrap(text, width, indent="  "):
    import textwrap
    return textwrap.fill(text, width=width, subsequent_indent=indent)


def plain(report, width=100):
    if not report["frameworks"]:   # --scaling: that section only
        return "\n".join(_scaling_only(report, width))
    lines = [_wrap(_header(report), width)]
    rows, errors = table_rows(report)
    fmt = "  ".join(("{:<%d}" if i in (0, 1, 3) else "{:>%d}") % w
                    for i, (_, w) in enumerate(COLUMNS))
    lines.append(fmt.format(*(name for name, _ in COLUMNS)).rstrip())
    for r in rows:
        lines.append(fmt.format(*(v[:w] for v, (_, w) in zip(r, COLUMNS))).rstrip())
    lines.append("")
    lines += _scaling_lines(report, width)
    lines.append("")
    lines.append(TARGETS_TITLE)
    lines += [_wrap(f"  {status:<12} {text}", width, " " * 15)
              for status, text in target_lines(report)]
    lines.append("")
    lines += [_wrap(t, width) for t in _tail(report, errors)]
    return "\n".join(lines)


def _scaling_lines(report, width=100):
    out = _bs.lines(report["scaling"])
    return [_wrap(out[0], width)] + [ln[:width] for ln in out[1:]]


def _scaling_only(report, width=100):
    m = report["machine"]
    head = (f"dlbridge bench --scaling, {m['cpus']} CPUs, Python "
            f"{m['python']}, dlbridge {report['dlbridge']}")
    return [_wrap(head, width)] + _scaling_lines(report, width)


TARGETS_TITLE = ("targets (issues 16, 17, 24 and 25; informational: the exit "
                 "status does not depend on speed)")


def target_lines(report):
    """[(status, text)] for the targets section, in TARGETS' order."""
    out = []
    for t in report.get("targets", ()):
        if t["status"] == "not measured":
            text = f"{t['label']}: {t['why']}"
        else:
            text = (f"{t['label']}: {t['ratio']:.2f}x "
                    f"(needs >= {t['need']:.2f}x)")
        out.append((t["status"], text))
    return out


def _compile_times(report):
    """One line per compiled row group (the "compiled" rows, the vmap-jit
    rows): seconds to compile each chain."""
    out, seen = [], set()
    for r in report["rows"]:
        if r["call"] not in ("compiled", _bb.JAX_CALL):
            continue
        key = (r["framework"], r["call"])
        parts = []
        if key not in seen:
            seen.add(key)
            parts.append(("dlbridge", r["dlbridge"].get("compile_s")))
        parts.append((r["reference"]["kind"], r["reference"].get("compile_s")))
        parts = [f"{who} {v:.2f} s" for who, v in parts if v is not None]
        if parts:
            out.append((key, parts))
    merged = {}
    for key, parts in out:
        merged.setdefault(key, []).extend(parts)
    return [f"compile time of the {'vmap ' if call != 'compiled' else ''}"
            f"chain, {COMPILED[fw]}: " + ", ".join(p)
            for (fw, call), p in merged.items()]


def _tail(report, errors):
    out = [LEGEND]
    out += _compile_times(report)
    out += [f"not measured: {e}" for e in errors]
    out += report["notes"]
    if report.get("defects"):
        out.append("dlbridge defects (exit status 1): " + ", ".join(
            f"{d['framework']} {d['call']}" for d in report["defects"]))
    return out


def rich_table(report, console):
    from rich.table import Table
    if not report["frameworks"]:   # --scaling: that section only
        for line in _scaling_only(report):
            console.print(line, highlight=False, markup=False)
        return
    console.print(f"[bold]{_header(report)}[/]")
    t = Table(padding=(0, 1), show_edge=False)
    for i, (name, _) in enumerate(COLUMNS):
        t.add_column(name, justify="left" if i in (0, 1, 3) else "right",
                     no_wrap=True, style="bold" if i == 0 else None)
    rows, errors = table_rows(report)
    for r in rows:
        ratio = r[5]
        style = "" if not ratio else "green" if float(ratio[:-1]) >= 1 else "yellow"
        t.add_row(*r[:5], f"[{style}]{ratio}[/]" if style else ratio)
    console.print(t)
    for line in _scaling_lines(report):
        console.print(line, highlight=False, markup=False)
    console.print(f"[bold]{TARGETS_TITLE}[/]")
    colour = {"met": "green", "missed": "yellow", "not measured": "dim"}
    for status, text in target_lines(report):
        console.print(f"  [{colour[status]}]{status:<12}[/] {text}",
                      highlight=False)
    for line in _tail(report, errors):
        console.print(f"[dim]{line}[/]", highlight=False)


# ------------------------------------------------------------ plot

class PlotUnavailable(Exception):
    pass


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")   # no display needed
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise PlotUnavailable(
            f"--plot needs matplotlib, which is not installed ({e}); "
            "install it with: pip install 'dlbridge[plot]'") from None
    return plt


def plot(report, path, plt=None):
    """A PNG bar chart: per framework and call, dlbridge's ns per call next
    to each reference's, log scale (the figures span 50 ns to 50 us)."""
    plt = plt or _pyplot()
    labels, ours, theirs = [], [], []
    for r in report["rows"]:
        if r["dlbridge"]["ns"] is None and r["reference"]["ns"] is None:
            continue
        labels.append(f"{r['framework']} {r['call']} vs {r['reference']['expr']}")
        # NaN: no bar (0 has no place on a log axis)
        ours.append(r["dlbridge"]["ns"] or float("nan"))
        theirs.append(r["reference"]["ns"] or float("nan"))
    n = len(labels)
    fig, ax = plt.subplots(figsize=(10, 0.32 * n + 1.5))
    pos = list(range(n))
    ax.barh([p - 0.2 for p in pos], ours, height=0.4, label="dlbridge")
    ax.barh([p + 0.2 for p in pos], theirs, height=0.4, label="reference")
    ax.set_yticks(pos)
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("ns per call (log scale; shorter is faster)")
    ax.set_title(_header(report), fontsize=8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return path


# ------------------------------------------------------------ command line

def _console(plain_text):
    if plain_text or importlib.util.find_spec("rich") is None:
        return None
    from rich.console import Console
    return Console(width=100)


def main(args):
    plt = None
    if args.plot:
        # Before measuring: no one should wait a minute to learn this.
        try:
            plt = _pyplot()
        except PlotUnavailable as e:
            print(f"dlbridge bench: {e}", file=sys.stderr)
            return 2
    fws = args.frameworks or None    # checked by the command line
    scaling = not getattr(args, "no_scaling", False)
    if getattr(args, "scaling", False):
        fws = ()                     # the scaling rows only
    mode = "full" if args.full else "quick" if args.quick else "default"
    to_stdout = args.json == "-"
    console = None if to_stdout else _console(args.plain)

    def progress(fw):
        if not to_stdout:
            print(f"measuring {fw} …", file=sys.stderr, flush=True)
    if console is not None:
        with console.status("measuring") as status:
            report = run(fws, mode, args.kernels, args.peers,
                         progress=lambda fw: status.update(f"measuring {fw} …"),
                         scaling=scaling)
    else:
        report = run(fws, mode, args.kernels, args.peers, progress=progress,
                     scaling=scaling)
    if args.json:
        text = json.dumps(report, indent=1)
        if to_stdout:
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    if not to_stdout:
        if console is not None:
            rich_table(report, console)
        else:
            print(plain(report))
    if args.plot:
        plot(report, args.plot, plt)
        print(f"plot: {args.plot}", file=sys.stderr if to_stdout else sys.stdout)
    for d in report["defects"]:
        print(f"DLBRIDGE DEFECT: {d['framework']} {d['call']}: {d['error']}",
              file=sys.stderr)
    return 1 if report["defects"] else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        _child_main(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "scaling":
        _scaling_main(sys.argv[2:])
    else:
        sys.exit("usage: python -m dlbridge bench (this module's own entry "
                 "point is for its child processes)")
