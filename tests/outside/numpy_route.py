"""pytest plugin: NumPy's own DLPack tests with dlbridge in the middle.

Loaded with `-p numpy_route` (tests/outside on sys.path) into a run of
numpy/_core/tests/test_dlpack.py, which ships in NumPy's wheel.  With
DLB_OUTSIDE_ROUTED=1 every np.from_dlpack(x, device=, copy=) becomes
np.from_dlpack(dlb.from_dlpack(x, copy=copy), device=device) through
_hop.into: NumPy imports dlbridge's export of whatever dlbridge imported,
so each test checks dlbridge as a transparent intermediary against NumPy's
own expectations.  Without it the suite runs plain.  Either way each test's
outcome goes to the JSON file DLB_OUTSIDE_REPORT, with the hop's counts,
for tests/outside/run.py to compare.
"""
import json
import os

import _hop

ROUTED = os.environ.get("DLB_OUTSIDE_ROUTED") == "1"
_outcomes = {}


def pytest_configure(config):
    if not ROUTED:
        return
    import numpy as np
    original = np.from_dlpack

    def from_dlpack(x, /, *, device=None, copy=None):
        # dlbridge makes any copy asked for; NumPy must then share it.
        def consume(y):
            return original(y, device=device, copy=copy if y is x else
                            (False if copy is False else None))
        return _hop.into(consume, x, "np.from_dlpack", copy=copy)
    from_dlpack.__wrapped__ = original
    np.from_dlpack = from_dlpack


def pytest_runtest_logreport(report):
    # A test's outcome: its call phase, or the phase that failed or skipped.
    nodeid = report.nodeid.split("::", 1)[-1]
    if report.when == "call" or report.outcome != "passed":
        outcome = report.outcome
        if _outcomes.get(nodeid) in (None, "passed"):
            _outcomes[nodeid] = outcome


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("DLB_OUTSIDE_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(dict(_hop.report(), outcomes=_outcomes), f, indent=1,
                      sort_keys=True)
