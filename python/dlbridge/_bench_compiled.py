"""Per-call cost of a dlbridge Function as a compiler's op: the one home of
the rules behind `dlbridge bench`'s compiled rows (dlbridge/_bench.py),
bench/bench_compiled.py (JAX) and bench/bench_torch_ops.py (torch), issue
16 item 7.

JAX, inside one jax.jit graph: JAX_CHAIN calls, each feeding the next.  A
route's per-call cost is (time of its chain - time of the same chain of
no-op ffi_calls) / JAX_CHAIN, so XLA's own cost of a custom call cancels
and what remains is what the route adds around the kernel: for a dlbridge
Function the handler of src/ops/xla.c, for jax-tvm-ffi its handler and
tvm-ffi's call (bench/_jax_tvm_peer.cc, built by bench/build_peers.sh into
build/bench).  Each chain's time is the best of `rounds` medians of `runs`
executions, the rounds of all chains interleaved; its compile time is one
lowering plus one compilation.

torch, inside torch.compile(fullgraph=True): a function of TORCH_CHAIN
calls, each on the previous result, minus the same function with no call
(`y + 0`), divided by TORCH_CHAIN, timed by dlbridge._measure.  The
anchors: a bare torch.library define + impl operator of the same schema
whose Python kernel only allocates the result, and the
torch.library.custom_op wrapper a user writes by hand today.  Compile time
is the first call of each compiled function (Dynamo + backend, inductor's
FX graph cache off), the empty function compiled first so one-time warm-up
is charged to neither side.

Frameworks are passed in, never imported here at import time.
"""

import os
import statistics
import time

from . import _measure

# ---- shared -----------------------------------------------------------------

#: A difference of two chains below this is noise (the floor's own spread
#: across rounds is larger): every per-call figure is at least 1 ns, so a
#: ratio of two of them is defined.
MIN_PER_CALL_S = 1e-9


def per_call(chain_s, floor_s, n):
    """(chain - floor) / n seconds, at least MIN_PER_CALL_S."""
    return max((chain_s - floor_s) / n, MIN_PER_CALL_S)


# ---- JAX: a Function inside jax.jit ---------------------------------------------

JAX_CHAIN = 1000
#: (rounds, runs) of the chained graphs per mode of the callers.
JAX_ROUNDS_RUNS = {"quick": (3, 5), "default": (5, 10), "full": (7, 15)}
JAX_NOOP_TARGET = "dlbridge_bench_noop"
JAX_TVM_TARGET = "dlbridge_bench_tvm_step"
JAX_TVM_PEER = "libjax_tvm_peer.so"
JAX_KERNEL_SYMBOL = "dlb_kernel_noop"
JAX_SIGNATURE = "step(x: float32[n]) -> float32[n]"
#: Route names, in the order they are measured.
JAX_FLOOR, JAX_FUNCTION, JAX_TVM = "no-op ffi_call", "dlbridge Function", "jax-tvm-ffi"


def jax_register_tvm(jax, peer_path):
    """Register the jax-tvm-ffi peer's `step` (the no-op kernel through
    tvm-ffi) as an XLA FFI target; its target name.  Raises when
    jax_tvm_ffi or the peer cannot be loaded."""
    import jax_tvm_ffi
    import tvm_ffi
    step = tvm_ffi.load_module(peer_path)["step"]
    jax_tvm_ffi.register_ffi_target(JAX_TVM_TARGET, step, platform="cpu")
    return JAX_TVM_TARGET


def jax_chain(step, n=JAX_CHAIN):
    def chain(x):
        for _ in range(n):
            x = step(x)
        return x
    return chain


def jax_chains(jax, function, tvm_target=None):
    """{route: chained function} for the floor, the Function and, when its
    target is registered, jax-tvm-ffi."""
    from . import _core
    jax.ffi.register_ffi_target(JAX_NOOP_TARGET, _core._xla_handler("noop"),
                                platform="cpu")
    out = jax.ShapeDtypeStruct((16,), "float32")

    def ffi_step(target):
        return lambda x: jax.ffi.ffi_call(target, out)(x)
    chains = {JAX_FLOOR: jax_chain(ffi_step(JAX_NOOP_TARGET)),
              JAX_FUNCTION: jax_chain(function)}
    if tvm_target is not None:
        chains[JAX_TVM] = jax_chain(ffi_step(tvm_target))
    return chains


def jax_input(jnp):
    """The chain's argument (its shape is the one jax_chains declares)."""
    return jnp.zeros(16, jnp.float32)


def jax_measure(jax, chains, x, rounds, runs):
    """{route: {trace, compile, run, per_call} in seconds, or the error
    text of a route that did not compile or run}; per_call is None for the
    floor.  A route that fails leaves the others measured."""
    figures, compiled = {}, {}
    for name, fn in chains.items():
        try:
            t0 = time.perf_counter()
            lowered = jax.jit(fn).lower(x)
            t1 = time.perf_counter()
            run = lowered.compile()
            t2 = time.perf_counter()
            run(x).block_until_ready()
        except Exception as e:  # reported, not fatal
            figures[name] = _measure.why(e, 160)
            continue
        compiled[name] = run
        figures[name] = {"trace": t1 - t0, "compile": t2 - t1,
                         "run": float("inf")}
    for _ in range(rounds):
        for name, run in compiled.items():
            times = []
            for _ in range(runs):
                t = time.perf_counter()
                run(x).block_until_ready()
                times.append(time.perf_counter() - t)
            figures[name]["run"] = min(figures[name]["run"],
                                       statistics.median(times))
    floor = figures[JAX_FLOOR]
    for name, f in figures.items():
        if name == JAX_FLOOR or isinstance(f, str):
            if not isinstance(f, str):
                f["per_call"] = None
        elif isinstance(floor, str):
            figures[name] = f"the floor ({JAX_FLOOR}) failed: {floor}"
        else:
            f["per_call"] = per_call(f["run"], floor["run"], JAX_CHAIN)
    return figures


# ---- torch: a Function inside torch.compile ---------------------------------------

TORCH_CHAIN = 100
TORCH_KERNEL_SYMBOL = "dlb_kernel_saxpy_out"
TORCH_SIGNATURE = "saxpy(a: float32, x: float32[n], y: float32[n]) -> float32[n]"
TORCH_FUNCTION = "Function"
TORCH_BARE = "bare define + impl operator"
TORCH_WRAPPED = "custom_op wrapper"
TORCH_EMPTY = "empty"
#: Compiled Function / bare define + impl operator, at most (issue 16).
TORCH_TARGET = 1.5


def torch_anchors(torch, fn, namespace="dlb_bench"):
    """(library, bare define + impl operator, custom_op wrapper of fn);
    keep the library alive while the operators are used."""
    lib = torch.library.Library(namespace, "FRAGMENT")
    lib.define("bare(Scalar a, Tensor x, Tensor y) -> Tensor")

    def bare(a, x, y):
        return torch.empty_like(y)
    lib.impl("bare", bare, "CPU")
    torch.library.register_fake(f"{namespace}::bare", lambda a, x, y:
                                torch.empty_like(y), lib=lib)

    @torch.library.custom_op(f"{namespace}::wrapped", mutates_args=())
    def wrapped(a: float, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return fn(a, x, y)

    @wrapped.register_fake
    def _(a, x, y):
        return torch.empty_like(y)
    return lib, getattr(torch.ops, namespace).bare.default, wrapped


def torch_chained(call, n=TORCH_CHAIN):
    def f(x, y):
        for _ in range(n):
            y = call(2.0, x, y)
        return y
    return f


def torch_compiled(torch, fns, backend):
    """({(backend, name): _measure.Case or error text}, {(backend, name):
    compile seconds or None}) for each of fns ({name: op(a, x, y)})
    chained and compiled with backend, and TORCH_EMPTY, the floor.  Each
    function is compiled here, by its first call."""
    import torch._inductor.config as inductor_config
    inductor_config.fx_graph_cache = False
    x, y = torch.ones(8), torch.ones(8)
    todo = {TORCH_EMPTY: lambda x, y: y + 0}
    todo.update((name, torch_chained(call)) for name, call in fns.items())
    cases, seconds = {}, {}
    for name, fn in todo.items():
        g = torch.compile(fn, backend=backend, fullgraph=True)
        start = time.perf_counter()
        try:
            g(x, y)
        except Exception as e:  # not compiled: reported, not fatal
            cases[backend, name] = _measure.why(e, 160)
            seconds[backend, name] = None
            continue
        seconds[backend, name] = time.perf_counter() - start
        cases[backend, name] = _measure.Case("g(x, y)", g=g, x=x, y=y)
    return cases, seconds


def torch_per_call(timed, backend, name):
    """ns per operator call of a chain measured by torch_compiled's cases
    (the floor subtracted), or the error text."""
    t, base = timed[backend, name], timed[backend, TORCH_EMPTY]
    if not _measure.num(t, base):
        return t if not _measure.num(t) else base
    return per_call(t * 1e-9, base * 1e-9, TORCH_CHAIN) * 1e9


def kernel_library(root):
    """The example kernels the benchmarks load: $DLB_EXAMPLE_KERNELS, else
    ROOT/build's."""
    return os.environ.get("DLB_EXAMPLE_KERNELS") or os.path.join(
        root, "build", "libdlb_example_kernels.so")
