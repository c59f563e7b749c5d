"""Issue 23, items 5 and 6: the torch.compile polyfill is installed once
torch._dynamo is really imported, by whatever route (item 5); a Python
number for a 0-d int64/float64 parameter under jax.jit with x64 off reaches
the kernel in the parameter's dtype, exactly as eagerly (item 6)."""
import os
import subprocess
import sys
import textwrap

import pytest

from _findings_util import child_env


# ---- item 5: the Dynamo polyfill, whatever imported torch._dynamo --------------

_TORCH_PRELUDE = """
import importlib, importlib.machinery, importlib.util, os, sys, threading
import dlbridge as dlb
mm = dlb.load(os.environ["DLB_EXAMPLE_KERNELS"], "dlb_kernel_matmul",
              "matmul(a: float32[m, k], b: float32[k, n]) -> float32[m, n]")

class TorchFinder:
    # An import hook installed after dlbridge that serves torch's modules
    # itself (a profiler's or a lazy loader's finder, say): it stands ahead
    # of dlbridge's finder, which is then never asked about torch._dynamo.
    def find_spec(self, name, path, target=None):
        if name == "torch" or name.startswith("torch."):
            return importlib.machinery.PathFinder.find_spec(name, path,
                                                            target)
        return None
"""

_TORCH_CHECK = """
import torch, torch._dynamo
a, b = torch.randn(5, 7), torch.randn(7, 3)
f = lambda a, b: mm(a, b) * 2
out = torch.compile(f, fullgraph=True, backend=BACKEND)(a, b)
assert torch.equal(out, f(a, b)), (out, f(a, b))
assert not any(getattr(w, "_dlbridge_dynamo_watcher", False)
               for w in sys.meta_path), "the finder outlived the polyfill"
print("OK")
"""

_ORDERS = {
    # importlib.util.find_spec looks at torch._dynamo's spec and loads
    # nothing: the finder must not be used up by it.
    "find_spec first": """
        assert importlib.util.find_spec("torch._dynamo") is not None
        assert "torch._dynamo" not in sys.modules
        """,
    "find_spec twice, then torch imported in a thread": """
        importlib.util.find_spec("torch._dynamo")
        importlib.util.find_spec("torch._dynamo")
        t = threading.Thread(target=importlib.import_module,
                             args=("torch._dynamo",))
        t.start(); t.join()
        assert "torch._dynamo" in sys.modules
        """,
    "a finder ahead of dlbridge's serves torch": """
        sys.meta_path.insert(0, TorchFinder())
        """,
    "torch imported in a thread while a finder ahead serves torch": """
        sys.meta_path.insert(0, TorchFinder())
        t = threading.Thread(target=importlib.import_module,
                             args=("torch._dynamo",))
        t.start(); t.join()
        """,
    # a reload runs the module again in the same namespace: the polyfill
    # it installed must not be forgotten, nor installed twice (torch
    # refuses a second one).
    "importlib.reload of dlbridge's modules after the polyfill": """
        import torch._dynamo
        importlib.reload(dlb._ops_torch)
        importlib.reload(dlb)
        """,
    "importlib.reload before torch, and find_spec": """
        importlib.reload(dlb._ops_torch)
        importlib.reload(dlb)
        importlib.util.find_spec("torch._dynamo")
        """,
}


def _with_backend(order, src):
    # Dynamo decides what this is about; one order also runs inductor (the
    # default backend) end to end, the others the quicker "eager" backend.
    backend = "inductor" if order == "find_spec first" else "eager"
    return f"BACKEND = {backend!r}\n" + src


def _run_all(scripts, timeout=600):
    """Run every script in its own fresh interpreter, side by side; each
    must print OK as its last line."""
    env = child_env()
    if not env.get("DLB_EXAMPLE_KERNELS"):
        pytest.skip("build/libdlb_example_kernels.so not built")
    runs = {name: subprocess.Popen(
        [sys.executable, "-c", src], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=env)
        for name, src in scripts.items()}
    failed = {}
    for name, run in runs.items():
        try:
            out, err = run.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            run.kill()
            out, err = run.communicate()
            err += "\n(hung)"
        tail = (out.strip().splitlines() or [""])[-1]
        if run.returncode != 0 or tail != "OK":
            failed[name] = err[-1500:]
    assert not failed, "failed: %s\n%s" % (
        sorted(failed), "\n".join(f"== {k}:\n{v}" for k, v in failed.items()))


def test_dynamo_polyfill_installed_whatever_imported_torch_dynamo():
    """Each order in a fresh interpreter: dlbridge imported and a Function
    made first, then the disturbing step, then torch.compile(fullgraph=True)
    of a function calling the Function must trace it as its operator (no
    "Unsupported method call") and give the eager result."""
    pytest.importorskip("torch")
    _run_all({order: _with_backend(order, _TORCH_PRELUDE +
                                   textwrap.dedent(step) + _TORCH_CHECK)
              for order, step in _ORDERS.items()})


def test_dynamo_imported_before_dlbridge_still_works():
    pytest.importorskip("torch")
    src = ("import torch, torch._dynamo\n" + _TORCH_PRELUDE +
           "assert not any(getattr(w, '_dlbridge_dynamo_watcher', False)\n"
           "               for w in sys.meta_path)\n" + _TORCH_CHECK)
    _run_all({"torch._dynamo first": _with_backend("", src)})


def test_the_finder_stays_until_torch_dynamo_is_imported():
    """A look at torch._dynamo's spec, and imports of other modules, leave
    the finder on sys.meta_path (find_spec imports the parent package,
    torch, but not torch._dynamo)."""
    pytest.importorskip("torch")
    src = _TORCH_PRELUDE + textwrap.dedent("""
        def watchers():
            return [w for w in sys.meta_path
                    if getattr(w, "_dlbridge_dynamo_watcher", False)]
        assert len(watchers()) == 1
        spec = importlib.util.find_spec("torch._dynamo")
        import json, email.parser  # other modules: not the finder's business
        importlib.reload(dlb)
        assert "torch._dynamo" not in sys.modules and len(watchers()) == 1
        print("OK")
        """)
    _run_all({"find_spec": src}, timeout=120)
