"""bench_torch_ops.py -- a dlbridge.Function as a torch operator, in one run
(issue 16 item 7, torch part; docs/compiled.md "PyTorch").

Per call, CPU, 8-element float32 tensors, saxpy_out(a, x, y) -> out with a
Python number for a (the kernel's work is nothing next to the call):

  eager   today's eager Function call; its torch operator called directly
          (torch.ops.dlbridge.<identity>.n1); the anchors: a bare
          torch.library define + impl operator of the same schema whose
          Python kernel only allocates the result, and the
          torch.library.custom_op wrapper a user writes by hand today
          (calling the Function inside, with a register_fake).
  compiled per operator call inside torch.compile(fullgraph=True): a
          function of CHAIN calls, each on the previous result, minus the
          same function with no call, divided by CHAIN -- for the Function
          called as f(...), the bare operator and the custom_op wrapper,
          with aot_eager and inductor.
  compile time of the chained function (Dynamo + backend, caches off)
          for the Function and the bare operator.

Target (issue 16): the compiled Function within 1.5x of the bare define +
impl operator.  Also shown: the eager three-tensor call (DESIGN.md's
~175-225 ns), which the operator route must not slow.

Timing: dlbridge._measure (interleaved rounds, best median; what
`dlbridge bench` uses).  Informational: exit status 0 whatever the figures.
Options: --quick, --json FILE.
"""

import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK = "--quick" in sys.argv
CHAIN = 100
SAXPY_OUT = "saxpy(a: float32, x: float32[n], y: float32[n]) -> float32[n]"
NOOP3 = "noop3(x: float32[n], y: float32[n], z: float32[n])"
TARGET = 1.5

import dlbridge as dlb  # noqa: E402
from dlbridge import _measure, _ops_torch  # noqa: E402

import torch  # noqa: E402


def kernels():
    path = os.environ.get("DLB_EXAMPLE_KERNELS") or os.path.join(
        ROOT, "build", "libdlb_example_kernels.so")
    if not os.path.exists(path):
        sys.exit(f"bench_torch_ops: {path} not built (make build)")
    return (dlb.load(path, "dlb_kernel_saxpy_out", SAXPY_OUT),
            dlb.load(path, "dlb_kernel_noop", NOOP3))


def anchors(fn):
    """The bare define + impl operator and the custom_op wrapper."""
    lib = torch.library.Library("dlb_bench", "FRAGMENT")
    lib.define("bare(Scalar a, Tensor x, Tensor y) -> Tensor")

    def bare(a, x, y):
        return torch.empty_like(y)
    lib.impl("bare", bare, "CPU")
    torch.library.register_fake("dlb_bench::bare", lambda a, x, y:
                                torch.empty_like(y), lib=lib)

    @torch.library.custom_op("dlb_bench::wrapped", mutates_args=())
    def wrapped(a: float, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return fn(a, x, y)

    @wrapped.register_fake
    def _(a, x, y):
        return torch.empty_like(y)
    return lib, torch.ops.dlb_bench.bare.default, wrapped


def chained(call):
    def f(x, y):
        for _ in range(CHAIN):
            y = call(2.0, x, y)
        return y
    return f


def compiled_cases(fns, backend):
    cases = {}
    x, y = torch.ones(8), torch.ones(8)
    for name, call in fns.items():
        g = torch.compile(chained(call), backend=backend, fullgraph=True)
        cases[(backend, name)] = _measure.Case("g(x, y)", g=g, x=x, y=y)
    empty = torch.compile(lambda x, y: y + 0, backend=backend, fullgraph=True)
    cases[(backend, "empty")] = _measure.Case("g(x, y)", g=empty, x=x, y=y)
    return cases


def compile_seconds(call, backend):
    torch._dynamo.reset()
    x, y = torch.ones(8), torch.ones(8)
    start = time.perf_counter()
    torch.compile(chained(call), backend=backend, fullgraph=True)(x, y)
    return time.perf_counter() - start


def main():
    settings = _measure.QUICK if QUICK else _measure.DEFAULT
    # a compiled chain takes ~1 ms: longer runs, more rounds
    chain_settings = _measure.QUICK if QUICK else _measure.FULL
    saxpy, noop3 = kernels()
    _lib, bare, wrapped = anchors(saxpy)
    op = _ops_torch.op(saxpy, 1)            # the Scalar overload
    x, y, z = torch.ones(8), torch.ones(8), torch.ones(8)

    eager = _measure.measure({
        "Function, 3 tensors, no result": _measure.Case(
            "f(x, y, z)", f=noop3, x=x, y=y, z=z),
        "Function": _measure.Case("f(2.0, x, y)", f=saxpy, x=x, y=y),
        "its torch operator": _measure.Case("f(2.0, x, y)", f=op, x=x, y=y),
        "bare define + impl operator": _measure.Case(
            "f(2.0, x, y)", f=bare, x=x, y=y),
        "custom_op wrapper": _measure.Case(
            "f(2.0, x, y)", f=wrapped, x=x, y=y),
    }, settings)

    import torch._inductor.config as inductor_config
    inductor_config.fx_graph_cache = False
    fns = {"Function": saxpy, "bare define + impl operator": bare,
           "custom_op wrapper": wrapped}
    cases = {}
    for backend in ("aot_eager", "inductor"):
        cases.update(compiled_cases(fns, backend))
    timed = _measure.measure(cases, chain_settings)

    compiled = {}
    for backend in ("aot_eager", "inductor"):
        base = timed[(backend, "empty")]
        for name in fns:
            t = timed[(backend, name)]
            compiled[(backend, name)] = ((t - base) / CHAIN
                                         if _measure.num(t, base) else t)
    compile_s = {(backend, name): compile_seconds(fns[name], backend)
                 for backend in ("aot_eager", "inductor")
                 for name in ("Function", "bare define + impl operator")}

    print(f"torch {torch.__version__}, {_measure.cpu_model()}; "
          f"saxpy_out on 8 float32, a Python number for a")
    print("\neager, ns per call")
    for name, t in eager.items():
        print(f"  {name:38s} {t:9.0f}" if _measure.num(t) else
              f"  {name:38s} {t}")
    print(f"\ncompiled (fullgraph), ns per operator call ({CHAIN} chained "
          f"calls minus none)")
    for backend in ("aot_eager", "inductor"):
        for name in fns:
            t = compiled[(backend, name)]
            print(f"  {backend:10s} {name:28s} {t:9.0f}"
                  if _measure.num(t) else f"  {backend:10s} {name:28s} {t}")
    print(f"\ncompile time of {CHAIN} chained calls (caches off), s")
    for (backend, name), s in compile_s.items():
        print(f"  {backend:10s} {name:28s} {s:9.2f}")
    print("\nratios")
    report = {}
    for backend in ("aot_eager", "inductor"):
        ours = compiled[(backend, "Function")]
        anchor = compiled[(backend, "bare define + impl operator")]
        wrap = compiled[(backend, "custom_op wrapper")]
        if _measure.num(ours, anchor, wrap):
            ratio = ours / anchor
            report[backend] = ratio
            print(f"  {backend}: Function / bare define+impl = {ratio:.2f} "
                  f"(target <= {TARGET}: "
                  f"{'PASS' if ratio <= TARGET else 'MISS'}); "
                  f"custom_op wrapper / Function = {wrap / ours:.2f}")
    t, o = eager["Function"], eager["its torch operator"]
    b, w = eager["bare define + impl operator"], eager["custom_op wrapper"]
    if _measure.num(t, o, b, w):
        print(f"  eager: operator / bare define+impl = {o / b:.2f}; "
              f"custom_op wrapper / operator = {w / o:.2f}; "
              f"operator / Function = {o / t:.1f}")
    if "--json" in sys.argv:
        path = sys.argv[sys.argv.index("--json") + 1]
        with open(path, "w") as f:
            json.dump({"eager_ns": eager,
                       "compiled_ns": {f"{b} {n}": v
                                       for (b, n), v in compiled.items()},
                       "compile_s": {f"{b} {n}": v
                                     for (b, n), v in compile_s.items()},
                       "ratio_vs_bare": report}, f, indent=1)


if __name__ == "__main__":
    main()
