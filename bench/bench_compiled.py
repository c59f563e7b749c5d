"""bench_compiled.py -- a dlbridge Function as a graph compiler's op, in one
run (issue 16 item 7).

One section per compiler, each a set of functions named after it
(`jax_*`, ...) ending in `<name>_section()`; main() runs every section
defined here, and a section whose framework or peer is missing says what
was not measured.  Informational only: the exit status is 0 whatever the
figures (a benchmark never fails a build), non-zero only when the script
itself breaks.  Run by `make bench`; --quick for fewer, shorter runs.

JAX: inside one jax.jit graph, 1,000 calls each feeding the next; a route's
per-call cost is its chain's time minus the same chain of no-op ffi_calls,
over 1,000 -- for a dlbridge Function and for the same kernel through
jax-tvm-ffi (bench/_jax_tvm_peer.cc, which bench/build_peers.sh builds into
build/bench).  The rules (chains, timing, the floor) live in
dlbridge/_bench_compiled.py, which `dlbridge bench` uses too.  Trace and
compile time are one lowering and one compilation of each chain.
"""

import os
import sys

from dlbridge import _bench_compiled as bc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = os.path.join(ROOT, "build", "bench")
KERNELS = bc.kernel_library(ROOT)

MODE = "quick" if "--quick" in sys.argv else "full"

NOT_MEASURED = {}  # what -> why
TARGETS = []       # (label, ok or None, figure)


def _target(label, ok, figure):
    TARGETS.append((label, ok, figure))


# ---- JAX: a Function inside jax.jit ------------------------------------------------

def jax_tvm_peer(jax):
    """Register the jax-tvm-ffi peer; its target name, or None with the
    reason in NOT_MEASURED."""
    path = os.path.join(PEERS, bc.JAX_TVM_PEER)
    if not os.path.exists(path):
        NOT_MEASURED["jax-tvm-ffi"] = (f"{path} not built (bench/build_peers.sh "
                                       "builds it when apache-tvm-ffi and "
                                       "jax-tvm-ffi are installed)")
        return None
    try:
        return bc.jax_register_tvm(jax, path)
    except Exception as e:  # noqa: BLE001 - any failure: not measured
        NOT_MEASURED["jax-tvm-ffi"] = f"not loaded ({type(e).__name__}: {e})"
        return None


def jax_section():
    print(f"== JAX: a Function inside jax.jit ({bc.JAX_CHAIN:,} chained calls "
          f"in one graph, CPU) ==")
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as e:
        NOT_MEASURED["JAX section"] = f"jax not installed ({e})"
        return
    import dlbridge as dlb
    if not os.path.exists(KERNELS):
        NOT_MEASURED["JAX section"] = f"{KERNELS} not built (make build)"
        return
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}")
    function = dlb.load(KERNELS, bc.JAX_KERNEL_SYMBOL, bc.JAX_SIGNATURE)
    tvm = jax_tvm_peer(jax)
    chains = bc.jax_chains(jax, function, tvm)
    figures = bc.jax_measure(jax, chains, bc.jax_input(jnp),
                             *bc.JAX_ROUNDS_RUNS[MODE])
    print(f"  {'route':<20} {'chain':>10} {'per call':>12} "
          f"{'trace':>10} {'compile':>10}")
    for name, f in figures.items():
        if isinstance(f, str):
            NOT_MEASURED[name] = f
            print(f"  {name:<20} {'n/a':>10}")
            continue
        extra = ("(floor)" if f["per_call"] is None
                 else f"{f['per_call'] * 1e9:8.1f} ns")
        print(f"  {name:<20} {f['run'] * 1e6:8.1f} us {extra:>12} "
              f"{f['trace'] * 1e3:7.1f} ms {f['compile'] * 1e3:7.1f} ms")
    ours = figures[bc.JAX_FUNCTION]
    theirs = figures.get(bc.JAX_TVM)
    label = "jax.jit: per call no slower than jax-tvm-ffi"
    if not isinstance(ours, dict) or not isinstance(theirs, dict):
        _target(label, None, "not measured")
        return
    a, b = ours["per_call"], theirs["per_call"]
    _target(label, a <= b, f"{a * 1e9:.1f} vs {b * 1e9:.1f} ns = {a / b:.2f}x")
    _target("jax.jit: trace time per call (dlbridge vs jax-tvm-ffi, info)",
            None, f"{ours['trace'] / bc.JAX_CHAIN * 1e6:.0f} vs "
            f"{theirs['trace'] / bc.JAX_CHAIN * 1e6:.0f} us")


# ---- all sections -----------------------------------------------------------------------

def main():
    sections = [f for name, f in globals().items()
                if name.endswith("_section") and callable(f)]
    for section in sections:
        section()
        print()
    print("targets (issue 16 item 7):")
    for label, ok, figure in TARGETS:
        mark = "PASS" if ok else ("MISS" if ok is False else "info")
        print(f"  {mark}  {label:<62} {figure or ''}")
    if NOT_MEASURED:
        print("not measured:")
        for k, v in NOT_MEASURED.items():
            print(f"  {k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
