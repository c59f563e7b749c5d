"""Shared writes per call, counted exactly: the objects every thread of a
program shares (dlb.Tensor's type, the float32 DType, the Function) and how
often one call writes their reference count, from a thread that owns none
of them -- what docs/bench.md's "Free-threaded scaling" table says, checked
without timing anything (so a loaded machine does not matter).

    bench/scaling_writes.py [PYTHON] [KERNELS]

runs each row under gdb with hardware watchpoints on those fields (a
free-threaded CPython keeps a shared reference count at offset 16 of every
object) and prints writes per call.  PYTHON: a free-threaded interpreter
with dlbridge and NumPy (default .venv313t/bin/python); KERNELS: the
example kernels library (default build-py313t/libdlb_example_kernels.so).
Needs gdb; the child side (`--child ROW KERNELS OUT`) is what runs under
it.  Prints "not run: <why>" when it cannot run.
"""
import ast
import os
import shutil
import subprocess
import sys
import tempfile

ROWS = ("from_dlpack", "convert", "Function", "Function Tensor",
        "tensor.dtype", "len")
CALLS = 50
GDB_SCRIPT = r'''
set pagination off
handle SIGUSR1 stop print nopass
handle SIGUSR2 stop print nopass
run
python
import os
out = os.environ["SCALING_WRITES_OUT"]
n = {}
class W(gdb.Breakpoint):
    def __init__(self, spec, name):
        super().__init__(spec, gdb.BP_WATCHPOINT, gdb.WP_WRITE, internal=True)
        self.nm = name
        n[name] = 0
    def stop(self):
        n[self.nm] += 1
        return False
ws = [W(f"*(long *){a}", name.strip())
      for a, name in (l.split(" ", 1) for l in open(out + ".addrs"))]
end
continue
python open(out, "w").write(repr(n))
'''


def child(row, kernels, out):
    import signal
    import threading

    import numpy as np

    import dlbridge as dlb
    fn = dlb.load(kernels, "dlb_kernel_noop",
                  "noop3(a: float32[n], b: float32[n], c: float32[n])")
    f32 = dlb.from_dlpack(np.ones(16, np.float32)).dtype
    watched = {"dlb.Tensor type": dlb.Tensor, "float32 DType": f32,
               "Function": fn}

    def work():
        a, b, c, x = (np.ones(16, np.float32) for _ in range(4))
        ta, tb, tc = (dlb.from_dlpack(v) for v in (a, b, c))
        f, fd, cv = fn, dlb.from_dlpack, dlb.convert
        stmt = {"from_dlpack": lambda: fd(x),
                "convert": lambda: cv(x, "dlbridge"),
                "Function": lambda: f(a, b, c),
                "Function Tensor": lambda: f(ta, tb, tc),
                "tensor.dtype": lambda: ta.dtype,
                "len": lambda: len(x)}[row]
        for _ in range(5):   # caches, memos, the thread's handler front
            stmt()
        with open(out + ".addrs", "w") as fh:
            for name, obj in watched.items():
                fh.write(f"{id(obj) + 16} {name}\n")  # ob_ref_shared
        # to this thread itself: it stops at once, before the calls
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
        for _ in range(CALLS):
            stmt()
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR2)

    t = threading.Thread(target=work)
    t.start()
    t.join()


def main(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    python = argv[0] if argv else os.path.join(root, ".venv313t/bin/python")
    kernels = argv[1] if len(argv) > 1 else os.path.join(
        root, "build-py313t/libdlb_example_kernels.so")
    for what, path in (("gdb", shutil.which("gdb")), ("python", python),
                       ("kernels", kernels)):
        if not path or not os.path.exists(path):
            print(f"not run: no {what} ({path or 'not on PATH'})")
            return 0
    ft = subprocess.run([python, "-c", "import sys; print(int(not sys._is_gil_enabled()))"],
                        capture_output=True, text=True)
    if ft.stdout.strip() != "1":
        print(f"not run: {python} is not a free-threaded CPython with the GIL off")
        return 0
    print(f"writes per call to shared reference counts, from a thread that owns "
          f"none ({CALLS} calls; {python})")
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "watch.gdb")
        with open(script, "w") as f:
            f.write(GDB_SCRIPT)
        out = os.path.join(d, "out")
        for row in ROWS:
            if os.path.exists(out):
                os.remove(out)
            subprocess.run(["gdb", "-q", "-batch", "-x", script, "--args", python,
                            os.path.abspath(__file__), "--child", row, kernels, out],
                           env=dict(os.environ, SCALING_WRITES_OUT=out),
                           capture_output=True, timeout=300)
            try:
                with open(out) as f:
                    counts = ast.literal_eval(f.read())  # what gdb wrote
            except OSError:
                print(f"  {row:<16} not run: gdb reported nothing")
                continue
            print(f"  {row:<16} " + ", ".join(
                f"{name} {v / CALLS:g}" for name, v in counts.items()))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:5])
    else:
        sys.exit(main(sys.argv[1:]))
