"""Regression tests for issue 7: dlbridge in a sub-interpreter.  Dropping a
tensor imported from a buffer or a dlbridge capsule there deadlocks today
(PyGILState_Ensure in deleters).  Either dlbridge works there, or its import
is refused cleanly (ImportError inside the sub-interpreter) -- never a hang
or a crash."""
import sys

import pytest

from _findings_util import check



pytestmark = [pytest.mark.skipif(sys.version_info < (3, 11),
                                 reason="needs _xxsubinterpreters")]

BODIES = {
    "buffer": """
t = dlb.from_dlpack(bytearray(16))
del t
""",
    "capsule": """
t = dlb.zeros((4,))
u = dlb.from_dlpack(t.__dlpack__())
del t, u
""",
}


@pytest.mark.parametrize("case", sorted(BODIES))
def test_subinterpreter_drop_does_not_hang(case):
    """Finding: in a sub-interpreter, dropping a tensor imported from a
    buffer or from a dlbridge capsule deadlocks."""
    check("""
    try:
        import _interpreters as interpreters
    except ImportError:
        import _xxsubinterpreters as interpreters
    body = %r
    script = (
        "import gc\\n"
        "try:\\n"
        "    import dlbridge as dlb\\n"
        "except ImportError:\\n"
        "    refused = True\\n"
        "else:\\n"
        "    refused = False\\n"
        + "".join("    " + line + "\\n" for line in body.strip().splitlines())
        + "    gc.collect()\\n")
    iid = interpreters.create()
    interpreters.run_string(iid, script)
    interpreters.destroy(iid)
    print("OK")
    """ % BODIES[case], timeout=15)


def test_subinterpreter_function_output_type():
    """Finding: a Function output made in a sub-interpreter is the main
    interpreter's Tensor type (process-global state in the exchange table).
    Either refused at import, or the output's type is that interpreter's."""
    check("""
    try:
        import _interpreters as interpreters
    except ImportError:
        import _xxsubinterpreters as interpreters
    dlb.zeros((1,))              # main interpreter's module first
    r, w = os.pipe()
    script = (
        "import os\\n"
        "try:\\n"
        "    import dlbridge as dlb\\n"
        "except ImportError:\\n"
        "    os.write(%d, b'refused')\\n"
        "else:\\n"
        "    f = dlb.load(%r, 'dlb_kernel_saxpy_out',\\n"
        "        'saxpy(a: float32, x: float32[n], y: float32[n]) -> float32[n]')\\n"
        "    x = dlb.zeros((4,))\\n"
        "    out = f(1.0, x, x)\\n"
        "    os.write(%d, b'same' if type(out) is dlb.Tensor else b'other')\\n"
        "    del out, x\\n") % (w, KERNELS, w)
    iid = interpreters.create()
    interpreters.run_string(iid, script)
    interpreters.destroy(iid)
    got = os.read(r, 100).decode()
    print(got)
    print("OK" if got in ("refused", "same") else "WRONG TYPE")
    """, timeout=30)
