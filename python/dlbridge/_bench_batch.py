"""Cost of a vmap of a Function with batch dimensions (`...`): the one home
of the rules behind `dlbridge bench`'s batch rows (dlbridge/_bench.py;
issue 25 item 7).  Schema and reading: docs/bench.md.

Every route runs the same C kernel, dlb_kernel_bscale of the example
library (examples/kernels/batch.c: y = a x, a: float32[...],
x: float32[..., n]), on ITEMS items of N elements:

* "vmap-jit" (JAX): inside ONE jax.jit graph, JAX_CHAIN chained calls of
  jax.vmap over ITEMS items (each call's result is the next one's x), as
  the compiled rows measure, so that dispatch is not what is timed.  A
  route's per-call cost is (time of its chain - time of a chain of as many
  no-op ffi_calls on the batched x) / its chain length.  Routes:
  - dlbridge: jax.vmap of the Function, whose batching rule folds the
    mapped axis into `...`: one kernel call per vmapped call;
  - "sequential": the same Function's XLA target called per item through
    jax.ffi.ffi_call(vmap_method="sequential") -- what every Function
    under jax.vmap did before issue 25 (one kernel call per item), built
    here directly so the row stays after the Function's own rule changed;
  - "jax-tvm-ffi": the same kernel as a tvm-ffi function registered with
    jax-tvm-ffi (bench/_jax_tvm_peer.cc, `bscale`), called per item through
    ffi_call(vmap_method="broadcast_all"): one call per vmapped call too,
    every operand broadcast to the batch first.
  The sequential route makes ITEMS kernel calls per vmapped call and XLA
  compiles a loop for each, so its chain is shorter (SEQUENTIAL_CHAIN).
* "vmap 1024" / "vmap 64" (torch, eager): torch.vmap of the Function over
  1,024 and 64 items against a Python loop of eager calls, one per item,
  stacked (torch.stack), which is what a user without a batching rule
  writes.

A route that cannot run says why instead of a figure.  The dlbridge side
also says "not available" when the vmap does not make ONE kernel call
(counted with the kernel's counter, dlb_example_batch_calls): a dlbridge
without the batch rules (they came with issue 25) runs such a Function per
item, which would time the sequential route twice.

Frameworks are passed in, never imported here at import time.
"""

import ctypes
import statistics
import time

from . import _measure

SYMBOL = "dlb_kernel_bscale"
SIGNATURE = "bscale(a: float32[...], x: float32[..., n]) -> (y: float32[..., n])"
COUNTER = "dlb_example_batch_calls"
N = 16
ITEMS = 64
JAX_CHAIN = 1000
SEQUENTIAL_CHAIN = 100
#: (rounds, runs) of the chained graphs per mode of the callers.
JAX_ROUNDS_RUNS = {"quick": (2, 3), "default": (3, 7), "full": (5, 11)}
TORCH_ITEMS = (1024, 64)
JAX_NOOP_TARGET = "dlbridge_bench_batch_noop"
JAX_TVM_TARGET = "dlbridge_bench_tvm_bscale"
JAX_CALL = "vmap-jit"
TORCH_CALLS = {n: f"vmap {n}" for n in TORCH_ITEMS}
CALLS = (JAX_CALL,) + tuple(TORCH_CALLS.values())
#: Route names of the JAX row, in the order they are measured.
FLOOR, FUNCTION, SEQUENTIAL, TVM = ("no-op ffi_call", "dlbridge Function",
                                    "sequential", "jax-tvm-ffi")
#: The rows' two sides as the table shows them.
DLB_EXPR = {JAX_CALL: "vmap(bscale) x1,000 in jit",
            **{c: f"torch.vmap(bscale), {n:,} items"
               for n, c in TORCH_CALLS.items()}}
REF_EXPR = {SEQUENTIAL: "ffi_call vmap_method=sequential",
            TVM: "jax-tvm-ffi broadcast_all",
            "loop": "loop of {n:,} eager calls"}
#: Reference kinds, per call.
REFERENCES = {JAX_CALL: (SEQUENTIAL, TVM),
              **{c: ("loop",) for c in TORCH_CALLS.values()}}

_registered = set()


def ref_expr(call, kind):
    """The reference side's expression of row (call, kind)."""
    items = {c: n for n, c in TORCH_CALLS.items()}.get(call, ITEMS)
    return REF_EXPR[kind].format(n=items)


class Counter:
    """The example library's kernel-call counter (ctypes)."""

    def __init__(self, kernel):
        self._value = ctypes.c_int64.in_dll(ctypes.CDLL(kernel), COUNTER)

    def __call__(self):
        return self._value.value


def function(dlb, kernel):
    """The `...` Function of the example library at path kernel (raises
    when it cannot be loaded or declared)."""
    return dlb.load(kernel, SYMBOL, SIGNATURE)


def _not_one_call(made, vmapped, items, what):
    return (f"not available: {what} made {made / vmapped:,g} kernel calls per "
            f"vmapped call of {items:,} items, not one: this dlbridge has no "
            "batching rule for `...` Functions (issue 25) and runs one call "
            "per item")


# ---- JAX ----------------------------------------------------------------------

def _register(jax, name, capsule):
    if name not in _registered:
        jax.ffi.register_ffi_target(name, capsule, platform="cpu")
        _registered.add(name)


def jax_register_tvm(jax, peer_path):
    """Register the jax-tvm-ffi peer's `bscale` as an XLA FFI target; its
    name.  Raises when jax_tvm_ffi or the peer cannot be loaded."""
    import jax_tvm_ffi
    import tvm_ffi
    if JAX_TVM_TARGET not in _registered:
        bscale = tvm_ffi.load_module(peer_path)["bscale"]
        jax_tvm_ffi.register_ffi_target(JAX_TVM_TARGET, bscale, platform="cpu")
        _registered.add(JAX_TVM_TARGET)
    return JAX_TVM_TARGET


def _item_call(jax, target, vmap_method, **attrs):
    """step(a, x) for one item (a 0-d, x float32[N]): an ffi_call of target."""
    out = jax.ShapeDtypeStruct((N,), "float32")
    call = jax.ffi.ffi_call(target, out, vmap_method=vmap_method)
    return lambda a, x: call(a, x, **attrs)


def jax_sequential_step(jax, fn):
    """The Function's own XLA target per item, vmap_method="sequential"."""
    from . import _ops_jax
    _ops_jax.register(fn)
    return _item_call(jax, _ops_jax.TARGET, "sequential",
                      **{_ops_jax.IDENTITY_ATTR: fn._identity})


def jax_chains(jax, fn, tvm_target=None):
    """{route: (chained function of (a, x), chain length)}: the floor, the
    Function (when fn is one), the sequential route, jax-tvm-ffi (when its
    target is registered)."""
    from . import _core
    _register(jax, JAX_NOOP_TARGET, _core._xla_handler("noop"))
    batched = jax.ShapeDtypeStruct((ITEMS, N), "float32")
    noop = jax.ffi.ffi_call(JAX_NOOP_TARGET, batched)

    def floor(a, x):
        for _ in range(JAX_CHAIN):
            x = noop(x)
        return x

    def vmapped(step, n):
        def item_chain(a, x):
            for _ in range(n):
                x = step(a, x)
            return x
        return jax.vmap(item_chain)

    chains = {FLOOR: (floor, JAX_CHAIN)}
    if fn is not None:
        chains[FUNCTION] = (vmapped(fn, JAX_CHAIN), JAX_CHAIN)
        chains[SEQUENTIAL] = (vmapped(jax_sequential_step(jax, fn),
                                      SEQUENTIAL_CHAIN), SEQUENTIAL_CHAIN)
    if tvm_target is not None:
        chains[TVM] = (vmapped(_item_call(jax, tvm_target, "broadcast_all"),
                               JAX_CHAIN), JAX_CHAIN)
    return chains


def jax_inputs(np):
    """(a, x): a of +-1 (so a chain of any length stays finite and
    checkable), x float32[ITEMS, N]."""
    a = np.where(np.arange(ITEMS) % 2 == 0, 1.0, -1.0).astype(np.float32)
    x = (np.arange(ITEMS * N, dtype=np.float32) % 7 - 3).reshape(ITEMS, N)
    return a, x


def jax_measure(jax, chains, a, x, rounds, runs, counter=None):
    """{route: {trace, compile, run, per_call, chain} in seconds, or the
    text of why not}; per_call is None for the floor.  dlbridge's chains
    are checked once against a**chain * x (the jax-tvm-ffi reference is
    that project's to get right; the real peer does), and the Function's
    for one kernel call per vmapped call (counter: a Counter, or None)."""
    import numpy as np
    figures, compiled = {}, {}
    for name, (fn, n) in chains.items():
        try:
            t0 = time.perf_counter()
            lowered = jax.jit(fn).lower(a, x)
            t1 = time.perf_counter()
            run = lowered.compile()
            t2 = time.perf_counter()
            before = counter() if counter else 0
            got = np.asarray(run(a, x).block_until_ready())
            made = counter() - before if counter else None
        except Exception as e:  # reported, not fatal
            figures[name] = _measure.why(e, 160)
            continue
        if name in (FUNCTION, SEQUENTIAL) and not np.array_equal(
                got, a[:, None] ** n * x):
            figures[name] = "wrong result: the chain's output is not a**n x"
            continue
        if name == FUNCTION and made is not None and made != n:
            figures[name] = _not_one_call(made, n, ITEMS,
                                          "jax.vmap in jax.jit")
            continue
        compiled[name] = run
        figures[name] = {"trace": t1 - t0, "compile": t2 - t1, "chain": n,
                         "run": float("inf")}
    for _ in range(rounds):
        for name, run in compiled.items():
            times = []
            for _ in range(runs):
                t = time.perf_counter()
                run(a, x).block_until_ready()
                times.append(time.perf_counter() - t)
            figures[name]["run"] = min(figures[name]["run"],
                                       statistics.median(times))
    floor = figures.get(FLOOR)
    for name, f in figures.items():
        if isinstance(f, str):
            continue
        if name == FLOOR:
            f["per_call"] = None
        elif isinstance(floor, str):
            figures[name] = f"the floor ({FLOOR}) failed: {floor}"
        else:
            f["per_call"] = max(f["run"] / f["chain"] - floor["run"] / JAX_CHAIN,
                                1e-9)
    return figures


def probe_jax(jax, fn, counter, a, x):
    """Kernel calls one jitted jax.vmap of fn makes (compiled first), or
    the text of why it does not run."""
    f = jax.jit(jax.vmap(fn))
    try:
        f(a, x).block_until_ready()
        before = counter()
        f(a, x).block_until_ready()
    except Exception as e:
        return "not available: " + _measure.why(e, 150)
    return counter() - before


def jax_rows(jax, dlb, kernel, peer, mode, side, row):
    """The "vmap-jit" rows of JAX (peer: the report's jax-tvm-ffi entry;
    side and row: _bench's builders)."""
    import numpy as np
    ours = tvm = None
    fn = counter = None
    if not kernel:
        ours = "no kernel library (set DLB_EXAMPLE_KERNELS or pass --kernels)"
    else:
        try:
            fn, counter = function(dlb, kernel), Counter(kernel)
        except Exception as e:
            ours = _measure.why(e, 160)
    target = None
    if peer.get("present"):
        try:
            target = jax_register_tvm(jax, peer["path"])
        except Exception as e:
            tvm = _measure.why(e, 160)
    else:
        tvm = peer.get("note", "jax-tvm-ffi: absent")
    seq = ours
    a, x = jax_inputs(np)
    if fn is not None:
        # one vmapped call first: without the batching rule the chain would
        # be 64,000 kernel calls (and a long compile) to learn that
        made = probe_jax(jax, fn, counter, a, x)
        if made != 1:
            ours = made if isinstance(made, str) else _not_one_call(
                made, 1, ITEMS, "jax.vmap in jax.jit")
    if fn is not None or target is not None:
        chains = jax_chains(jax, fn, target)
        if isinstance(ours, str):
            chains.pop(FUNCTION, None)
        figures = jax_measure(jax, chains, a, x, *JAX_ROUNDS_RUNS[mode],
                              counter=counter)
        if fn is not None:
            ours = figures.get(FUNCTION, ours)
            seq = figures[SEQUENTIAL]
        if target is not None:
            tvm = figures[TVM]

    def one(expr, f):
        if isinstance(f, dict):
            return side(expr, f["per_call"] * 1e9, f["trace"] + f["compile"])
        return side(expr, f)
    mine = one(DLB_EXPR[JAX_CALL], ours)
    return [row("jax", JAX_CALL, mine, SEQUENTIAL,
                one(ref_expr(JAX_CALL, SEQUENTIAL), seq)),
            row("jax", JAX_CALL, mine, TVM, one(ref_expr(JAX_CALL, TVM), tvm))]


# ---- torch ----------------------------------------------------------------------

def torch_loop(torch, fn):
    """What a user writes without a batching rule: one eager call per
    item, stacked."""
    def loop(a, x):
        return torch.stack([fn(a[i], x[i]) for i in range(x.shape[0])])
    return loop


def torch_cases(torch, fn, counter):
    """{(call, who): Case or why}, who "dlb" or "loop"."""
    out = {}
    for n, call in TORCH_CALLS.items():
        a = torch.where(torch.arange(n) % 2 == 0, 1.0, -1.0).float()
        x = (torch.arange(n * N) % 7 - 3).float().reshape(n, N)
        want = a[:, None] * x
        loop = torch_loop(torch, fn)
        try:
            ok = torch.equal(loop(a, x), want)
            out[call, "loop"] = (_measure.CopyCase("f(a, x)", f=loop, a=a, x=x) if ok else
                                 "wrong result: the loop's output is not a x")
        except Exception as e:
            out[call, "loop"] = _measure.why(e, 160)
        v = torch.vmap(fn)
        try:
            before = counter()
            got = v(a, x)
            made = counter() - before
        except Exception as e:
            out[call, "dlb"] = "not available: " + _measure.why(e, 150)
            continue
        if not torch.equal(got, want):
            out[call, "dlb"] = "wrong result: torch.vmap's output is not a x"
        elif made != 1:
            out[call, "dlb"] = _not_one_call(made, 1, n, "torch.vmap")
        else:
            out[call, "dlb"] = _measure.CopyCase("f(a, x)", f=v, a=a, x=x)
    return out


def torch_rows(torch, dlb, kernel, settings, side, row):
    """The "vmap 1024" and "vmap 64" rows of torch."""
    if not kernel:
        why = "no kernel library (set DLB_EXAMPLE_KERNELS or pass --kernels)"
        got = {(c, w): why for c in TORCH_CALLS.values() for w in ("dlb", "loop")}
    else:
        try:
            got = _measure.measure(torch_cases(torch, function(dlb, kernel),
                                               Counter(kernel)), settings)
        except Exception as e:
            why = _measure.why(e, 160)
            got = {(c, w): why for c in TORCH_CALLS.values()
                   for w in ("dlb", "loop")}
    return [row("torch", call, side(DLB_EXPR[call], got[call, "dlb"]), "loop",
                side(ref_expr(call, "loop"), got[call, "loop"]))
            for call in TORCH_CALLS.values()]
