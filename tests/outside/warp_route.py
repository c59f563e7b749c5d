"""Warp's own DLPack tests (warp.tests.interop.test_dlpack, in Warp's
wheel), run with unittest -- its module-level test functions are not pytest
tests -- once plain and once with dlbridge in the middle, in one process
(Warp, torch, JAX and PaddlePaddle are imported and Warp's kernels built
once).  Routed, every tensor Warp takes or gives goes through dlbridge:
  wp.from_dlpack(x, dtype)   -> Warp imports dlbridge's export of x
  wp.to_dlpack(a)            -> dlbridge's capsule of Warp's export
  wp.array.__dlpack__(stream) -> the same, after Warp's own stream checks
(_hop.py says what happens when dlbridge refuses).  Writes
{"plain": {...}, "routed": {...}} -- outcomes per test and the hop's counts
-- to the JSON file given as argv[1], for tests/outside/run.py.
"""
import json
import os
import sys
import unittest

import _hop

MODULE = "warp.tests.interop.test_dlpack"
# Elements per test array.  The suite's N (2**20) only sizes its arrays --
# the tests compare descriptions, pointers and values -- and at that size
# test_dlpack_dtypes_and_shapes alone zeroes gigabytes on the CPU (7 s a
# run); 4096 keeps every check and takes a fraction of it.
ELEMENTS = 4096


def route(wp):
    from_dlpack, to_dlpack = wp.from_dlpack, wp.to_dlpack
    dunder = wp.array.__dlpack__

    def routed_from_dlpack(source, dtype=None, hint=None):
        return _hop.into(lambda y: from_dlpack(y, dtype=dtype, hint=hint),
                         source, "wp.from_dlpack")

    def routed_to_dlpack(wp_array):
        return _hop.out_of(to_dlpack(wp_array), "wp.to_dlpack")

    def routed_dunder(self, stream=None):
        # Warp checks the stream and orders its work; dlbridge's export of
        # a CPU capsule takes no stream.
        return _hop.out_of(dunder(self, stream=stream), "wp.array.__dlpack__")
    wp.from_dlpack, wp.to_dlpack = routed_from_dlpack, routed_to_dlpack
    wp.array.__dlpack__ = routed_dunder


class Recorder(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.outcomes = {}

    def _set(self, test, outcome):
        self.outcomes[test.id().rsplit(".", 2)[-1]] = outcome

    def addSuccess(self, test):
        self._set(test, "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._set(test, "failed")

    def addError(self, test, err):
        super().addError(test, err)
        self._set(test, "failed")

    def addSkip(self, test, reason):
        self._set(test, "skipped")

    def addSubTest(self, test, subtest, err):
        if err is not None:
            super().addSubTest(test, subtest, err)
            self.outcomes[test.id().rsplit(".", 2)[-1]] = "failed"

    def addExpectedFailure(self, test, err):
        self._set(test, "xfailed")

    def addUnexpectedSuccess(self, test):
        self._set(test, "xpassed")


def run_once():
    suite = unittest.defaultTestLoader.loadTestsFromName(MODULE)
    sys.modules[MODULE].N = ELEMENTS
    result = Recorder()
    suite.run(result)
    # a subtest that failed marks its test failed even if addSuccess came
    for test, _ in result.failures + result.errors:
        if hasattr(test, "test_case"):
            result.outcomes[test.test_case.id().rsplit(".", 2)[-1]] = "failed"
    details = [f"{t}: {tb.splitlines()[-1]}" for t, tb in
               result.failures + result.errors]
    return {"outcomes": result.outcomes, "details": details}


def main(path):
    # (Warp's test helpers write to file descriptor 1 themselves: run.py
    # captures the output, rather than redirecting sys.stdout here.)
    import warp as wp
    wp.config.quiet = True
    out = {"plain": run_once()}
    route(wp)
    out["routed"] = dict(run_once(), **_hop.report())
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    main(sys.argv[1])
