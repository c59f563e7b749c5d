"""dlbridge bench: runs, table and JSON shape (never asserts a time)."""

import importlib.util
import json
import subprocess
import sys


def _bench(*args):
    return subprocess.run([sys.executable, "-m", "dlbridge", "bench",
                           "--frameworks", "numpy", *args],
                          capture_output=True, text=True, timeout=120)


def test_bench_json():
    proc = _bench("--json", "-")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    calls = {r["call"] for r in report["rows"]}
    assert {"own from_dlpack", "dlb.from_dlpack", "dlb.convert",
            "x.__dlpack__()"} <= calls
    assert all(r["ns"] is not None and r["ns"] > 0 for r in report["rows"])


def test_bench_plot_without_matplotlib_says_so(tmp_path):
    proc = _bench("--plot", str(tmp_path / "p.png"))
    if importlib.util.find_spec("matplotlib") is None:
        assert proc.returncode != 0 and "matplotlib" in proc.stderr
    else:
        assert proc.returncode == 0 and (tmp_path / "p.png").exists()
