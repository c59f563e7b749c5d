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
  compile time of each chained function: its first call (Dynamo +
          backend, caches off).
The chains, the floor and the anchors: dlbridge/_bench_compiled.py, which
`dlbridge bench`'s compiled torch row uses too.

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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK = "--quick" in sys.argv
NOOP3 = "noop3(x: float32[n], y: float32[n], z: float32[n])"
BACKENDS = ("aot_eager", "inductor")

import dlbridge as dlb  # noqa: E402
from dlbridge import _bench_compiled as bc  # noqa: E402
from dlbridge import _measure, _ops_torch  # noqa: E402

import torch  # noqa: E402


def kernels():
    path = bc.kernel_library(ROOT)
    if not os.path.exists(path):
        sys.exit(f"bench_torch_ops: {path} not built (make build)")
    return (dlb.load(path, bc.TORCH_KERNEL_SYMBOL, bc.TORCH_SIGNATURE),
            dlb.load(path, "dlb_kernel_noop", NOOP3))


def main():
    settings = _measure.QUICK if QUICK else _measure.DEFAULT
    # a compiled chain takes ~1 ms: longer runs, more rounds
    chain_settings = _measure.QUICK if QUICK else _measure.FULL
    saxpy, noop3 = kernels()
    _lib, bare, wrapped = bc.torch_anchors(torch, saxpy)
    op = _ops_torch.op(saxpy, 1)            # the Scalar overload
    x, y, z = torch.ones(8), torch.ones(8), torch.ones(8)

    eager = _measure.measure({
        "Function, 3 tensors, no result": _measure.Case(
            "f(x, y, z)", f=noop3, x=x, y=y, z=z),
        "Function": _measure.Case("f(2.0, x, y)", f=saxpy, x=x, y=y),
        "its torch operator": _measure.Case("f(2.0, x, y)", f=op, x=x, y=y),
        bc.TORCH_BARE: _measure.Case("f(2.0, x, y)", f=bare, x=x, y=y),
        bc.TORCH_WRAPPED: _measure.Case("f(2.0, x, y)", f=wrapped, x=x, y=y),
    }, settings)

    fns = {bc.TORCH_FUNCTION: saxpy, bc.TORCH_BARE: bare,
           bc.TORCH_WRAPPED: wrapped}
    cases, compile_s = {}, {}
    for backend in BACKENDS:
        c, s = bc.torch_compiled(torch, fns, backend)
        cases.update(c)
        compile_s.update(s)
    timed = _measure.measure(cases, chain_settings)
    compiled = {(backend, name): bc.torch_per_call(timed, backend, name)
                for backend in BACKENDS for name in fns}

    print(f"torch {torch.__version__}, {_measure.cpu_model()}; "
          f"saxpy_out on 8 float32, a Python number for a")
    print("\neager, ns per call")
    for name, t in eager.items():
        print(f"  {name:38s} {t:9.0f}" if _measure.num(t) else
              f"  {name:38s} {t}")
    print(f"\ncompiled (fullgraph), ns per operator call ({bc.TORCH_CHAIN} chained "
          f"calls minus none)")
    for backend in BACKENDS:
        for name in fns:
            t = compiled[(backend, name)]
            print(f"  {backend:10s} {name:28s} {t:9.0f}"
                  if _measure.num(t) else f"  {backend:10s} {name:28s} {t}")
    print(f"\ncompile time of {bc.TORCH_CHAIN} chained calls (first call, caches "
          f"off), s")
    for (backend, name), s in compile_s.items():
        if name == bc.TORCH_EMPTY or s is None:
            continue
        print(f"  {backend:10s} {name:28s} {s:9.2f}")
    print("\nratios")
    report = {}
    for backend in BACKENDS:
        ours = compiled[(backend, bc.TORCH_FUNCTION)]
        anchor = compiled[(backend, bc.TORCH_BARE)]
        wrap = compiled[(backend, bc.TORCH_WRAPPED)]
        if _measure.num(ours, anchor, wrap):
            ratio = ours / anchor
            report[backend] = ratio
            print(f"  {backend}: Function / bare define+impl = {ratio:.2f} "
                  f"(target <= {bc.TORCH_TARGET}: "
                  f"{'PASS' if ratio <= bc.TORCH_TARGET else 'MISS'}); "
                  f"custom_op wrapper / Function = {wrap / ours:.2f}")
    t, o = eager["Function"], eager["its torch operator"]
    b, w = eager[bc.TORCH_BARE], eager[bc.TORCH_WRAPPED]
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
