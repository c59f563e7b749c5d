"""`make test-outside`: other projects' own DLPack test suites, each run
once plain and once with every tensor routed through dlbridge.

  numpy  numpy/_core/tests/test_dlpack.py (in NumPy's wheel), pytest with
         the numpy_route plugin
  warp   warp.tests.interop.test_dlpack (in Warp's wheel), unittest through
         warp_route.py; skipped with a message when Warp is not installed

A suite fails the target when a test that passes plain does not pass routed
(unless it is in EXPECTED below, with the decision that explains it), when
an EXPECTED test passes routed after all (the list is kept exact), when
dlbridge refused something the consumer itself reads (a gap, _hop.py), or
when the routed run routed no tensor at all (the hop was never in the
middle).  Exit status 0 or 1; one summary line per suite.
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# Tests that pass plain and fail routed by a documented decision.
EXPECTED = {
    "numpy": {
        "TestDLPack::test_writeable":
            "legacy (unversioned) capsules import as writable "
            "(docs/decisions.md, section 6); NumPy imports its own legacy "
            "producer read-only, and dlbridge's re-export says writable",
    },
    "warp": {},
}


def env_for(routed, report):
    env = dict(os.environ, DLB_OUTSIDE_ROUTED="1" if routed else "0",
               DLB_OUTSIDE_REPORT=report)
    env["PYTHONPATH"] = os.pathsep.join(
        [HERE] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def run(cmd, env, timeout=600):
    # From a scratch directory: nothing of the checkout shadows an import.
    with tempfile.TemporaryDirectory() as cwd:
        return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True,
                              text=True, timeout=timeout)


def numpy_suite(tmp):
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           # numpy's conftest.py needs hypothesis; test_dlpack.py needs none
           # of its fixtures
           "--noconftest", "-p", "numpy_route",
           "--pyargs", "numpy._core.tests.test_dlpack"]
    out = {}
    for mode in ("plain", "routed"):
        report = os.path.join(tmp, f"numpy-{mode}.json")
        r = run(cmd, env_for(mode == "routed", report))
        if not os.path.exists(report):
            raise RuntimeError(f"numpy ({mode}) wrote no report:\n"
                               f"{r.stdout[-3000:]}{r.stderr[-3000:]}")
        with open(report) as f:
            out[mode] = json.load(f)
        out[mode]["log"] = r.stdout[-3000:] + r.stderr[-3000:]
    return out


def warp_suite(tmp):
    report = os.path.join(tmp, "warp.json")
    r = run([sys.executable, os.path.join(HERE, "warp_route.py"), report],
            env_for(False, report))
    if r.returncode != 0 or not os.path.exists(report):
        raise RuntimeError(f"warp's suite did not finish (status "
                           f"{r.returncode}):\n{r.stdout[-3000:]}"
                           f"{r.stderr[-3000:]}")
    with open(report) as f:
        out = json.load(f)
    log = r.stdout[-3000:] + r.stderr[-3000:]
    for mode in out:
        out[mode]["log"] = log
    return out


SUITES = {
    "numpy": ("numpy", "numpy/_core/tests/test_dlpack.py", numpy_suite),
    "warp": ("warp", "warp.tests.interop.test_dlpack", warp_suite),
}


def judge(name, res, expected):
    """Problems found (a list of lines) and a summary."""
    plain, routed = res["plain"]["outcomes"], res["routed"]["outcomes"]
    passed = sorted(t for t, o in plain.items() if o == "passed")
    problems = []
    for t in passed:
        if routed.get(t) != "passed" and t not in expected:
            problems.append(f"{t}: passes plain, {routed.get(t, 'missing')} "
                            "routed")
    for t, why in expected.items():
        if routed.get(t) == "passed":
            problems.append(f"{t}: listed as an expected difference ({why}) "
                            "but passes routed: remove it from EXPECTED")
    for gap in res["routed"].get("gaps", []):
        problems.append(f"gap: {gap}")
    if res["routed"]["routed"] == 0:
        problems.append("the routed run routed no tensor through dlbridge")
    if not passed:
        problems.append("no test passed plain")
    documented = [t for t in expected if plain.get(t) == "passed"
                  and routed.get(t) != "passed"]
    n_routed_ok = sum(1 for o in routed.values() if o == "passed")
    summary = (f"plain {len(passed)} passed of {len(plain)}; routed "
               f"{n_routed_ok} passed, {len(documented)} documented "
               f"difference(s){': ' + ', '.join(documented) if documented else ''}"
               f"; {res['routed']['routed']} tensors through dlbridge")
    if problems and res["routed"].get("details"):
        problems += [f"  {d}" for d in res["routed"]["details"]]
    return problems, summary


def main():
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for name, (module, label, fn) in SUITES.items():
            if importlib.util.find_spec(module) is None:
                print(f"test-outside: {label}: SKIPPED: {module} is not "
                      "installed")
                continue
            t0 = time.monotonic()
            try:
                res = fn(tmp)
            except Exception as e:
                print(f"test-outside: {label}: FAILED: {e}")
                failed = True
                continue
            problems, summary = judge(name, res, EXPECTED[name])
            dt = time.monotonic() - t0
            state = "FAILED" if problems else "ok"
            print(f"test-outside: {label}: {state}: {summary} ({dt:.1f} s)")
            for p in problems:
                print(f"  {p}")
            if problems:
                print(res["routed"]["log"])
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
