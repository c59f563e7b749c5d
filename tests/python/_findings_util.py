"""Run a snippet in a child interpreter so a crash or hang in dlbridge
cannot take pytest down; the child inherits PYTHONPATH and
DLB_EXAMPLE_KERNELS from os.environ."""
import os
import subprocess
import sys
import textwrap

PRELUDE = """
import gc, os, sys, ctypes, weakref
import numpy as np
import dlbridge as dlb
KERNELS = os.environ.get("DLB_EXAMPLE_KERNELS")
"""


def run(code, timeout=60, prelude=True):
    src = (PRELUDE if prelude else "") + textwrap.dedent(code)
    try:
        p = subprocess.run([sys.executable, "-c", src], capture_output=True,
                           text=True, timeout=timeout, env=dict(os.environ))
    except subprocess.TimeoutExpired:
        raise AssertionError("child hung (> %d s)" % timeout) from None
    return p


def check(code, expect="OK", timeout=60):
    """The child must exit 0 and print `expect` as its last line."""
    p = run(code, timeout)
    tail = (p.stdout.strip().splitlines() or [""])[-1]
    assert p.returncode == 0 and tail == expect, (
        "rc=%d stdout=%r stderr=%s" % (p.returncode, p.stdout[-500:], p.stderr[-1500:]))
    return p
