"""`dlbridge bench`: per-call cost of dlbridge against each framework's own
DLPack path, measured in this process.  Results are ratios against the
reference measured in the same run; absolute times depend on the machine.

Measuring: each case is timed with timeit in rounds interleaved over all
cases (a burst of load elsewhere hits one round of many cases, not every
round of one), and the best of the per-round medians is kept.
"""

import importlib.util
import json
import statistics
import sys
import timeit

QUICK = dict(rounds=3, repeats=3, target_s=0.002)
FULL = dict(rounds=7, repeats=5, target_s=0.01)


class Case:
    def __init__(self, stmt, names):
        self.stmt, self.names, self.medians, self.number = stmt, names, [], 1

    def calibrate(self, target_s):
        t = timeit.Timer(self.stmt, globals=self.names)
        n, dt = t.autorange()
        self.number = max(1, int(n * target_s / max(dt, 1e-9)))
        self.timer = t

    def round(self, repeats):
        self.medians.append(statistics.median(
            self.timer.timeit(self.number) / self.number
            for _ in range(repeats)) * 1e9)


def measure(cases, rounds, repeats, target_s):
    """{key: Case} -> {key: ns per call, or the error text}."""
    out, live = {}, {}
    for key, case in cases.items():
        try:
            exec(case.stmt, dict(case.names))
        except Exception as e:
            out[key] = f"{type(e).__name__}: {e}".splitlines()[0][:70]
            continue
        case.calibrate(target_s)
        live[key] = case
    for _ in range(rounds):
        for case in live.values():
            case.round(repeats)
    out.update({k: min(c.medians) for k, c in live.items()})
    return out


def _sources(fw):
    """(tensor of framework fw, its own from_dlpack) or None."""
    import numpy as np
    a = np.ones((4, 4), dtype=np.float32)
    if fw == "numpy":
        return a, np.from_dlpack
    if fw == "torch":
        import torch
        return torch.from_numpy(a), torch.from_dlpack
    if fw == "jax":
        import jax.dlpack
        import jax.numpy as jnp
        return jnp.asarray(a), jax.dlpack.from_dlpack
    return None


def cases_for(fw):
    import numpy as np

    import dlbridge
    src = _sources(fw)
    if src is None:
        return {}
    x, own = src
    peer = np.ones((4, 4), dtype=np.float32) if fw != "numpy" else dlbridge.from_dlpack(x)
    names = dict(x=x, own=own, peer=peer, dlb=dlbridge, fw=fw)
    return {
        (fw, "own from_dlpack"): Case("own(peer)", names),
        (fw, "dlb.from_dlpack"): Case("dlb.from_dlpack(x)", names),
        (fw, "dlb.convert"): Case("dlb.convert(peer, fw)", names),
        (fw, "x.__dlpack__()"): Case("x.__dlpack__()", names),
    }


def run(frameworks=None, full=False):
    fws = frameworks or [f for f in ("numpy", "torch", "jax")
                         if importlib.util.find_spec(f) is not None]
    cases = {}
    for fw in fws:
        cases.update(cases_for(fw))
    res = measure(cases, **(FULL if full else QUICK))
    rows = []
    for fw in fws:
        ref = res.get((fw, "own from_dlpack"))
        for (f, what), v in res.items():
            if f != fw:
                continue
            ratio = v / ref if isinstance(v, float) and isinstance(ref, float) else None
            rows.append({"framework": fw, "call": what,
                         "ns": v if isinstance(v, float) else None,
                         "ratio_to_own": ratio,
                         "error": None if isinstance(v, float) else v})
    return {"schema_version": 1, "quick": not full, "rows": rows}


def main(args):
    fws = args.frameworks.split(",") if args.frameworks else None
    report = run(fws, args.full)
    if args.json:
        text = json.dumps(report, indent=1)
        if args.json == "-":
            print(text)
            return 0
        with open(args.json, "w") as f:
            f.write(text)
    print(f"{'framework':<10} {'call':<18} {'ns/call':>9} {'× own':>7}")
    for r in report["rows"]:
        ns = f"{r['ns']:9.0f}" if r["ns"] is not None else f"{'n/a':>9}"
        ratio = f"{r['ratio_to_own']:7.2f}" if r["ratio_to_own"] else f"{'':>7}"
        print(f"{r['framework']:<10} {r['call']:<18} {ns} {ratio}"
              + (f"  {r['error']}" if r["error"] else ""))
    print("(× own: time relative to the framework's own from_dlpack of a "
          "NumPy array, same run)")
    if args.plot:
        if importlib.util.find_spec("matplotlib") is None:
            print("--plot needs matplotlib: pip install 'dlbridge[plot]'",
                  file=sys.stderr)
            return 2
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        rows = [r for r in report["rows"] if r["ns"] is not None]
        fig, ax = plt.subplots(figsize=(8, 0.3 * len(rows) + 1))
        ax.barh([f"{r['framework']}: {r['call']}" for r in rows],
                [r["ns"] for r in rows])
        ax.set_xlabel("ns per call")
        ax.invert_yaxis()
        fig.tight_layout()
        fig.savefig(args.plot)
        print(f"plot: {args.plot}")
    return 0
