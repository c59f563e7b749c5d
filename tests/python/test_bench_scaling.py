"""dlbridge bench's scaling rows (dlbridge/_bench_scaling.py): the section's
schema, "not run" with the reason where it cannot run, the arithmetic of a
forced run.  Never asserts a time or a ratio's size: figures depend on the
machine and its load."""

import json
import os
import subprocess
import sys

import pytest

from dlbridge import _bench, _bench_scaling as bs, _doctor

TINY = bs.Settings(rounds=1, target_s=0.002)
FREE_THREADED = not bs.gil_enabled()


def _kernel():
    return _bench.find_kernel()


def _scaling_cli(*args):
    proc = subprocess.run([sys.executable, "-m", "dlbridge", "bench", "--scaling",
                           "--quick", *args], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_cli_scaling_json_is_the_section_only():
    report = json.loads(_scaling_cli("--json").stdout)
    _doctor.validate(report, _bench.SCHEMA)
    assert report["frameworks"] == [] and report["rows"] == []
    scale = report["scaling"]
    _doctor.validate(scale, bs.SCHEMA)
    calls = {(r["call"], r["kind"]) for r in scale["rows"]}
    assert calls == {(c, k) for c in bs.CALLS if c != bs.BASELINE
                     for k in bs.KINDS}
    if not FREE_THREADED:
        assert scale["note"] == "not run: GIL build"
        assert all(r["error"] == "not run: GIL build" and r["ratio"] is None
                   for r in scale["rows"])
    elif bs.threads() < 2:
        assert scale["note"] == "not run: one CPU"
    else:
        kernel = _kernel()
        for r in scale["rows"]:
            if r["call"].startswith("Function") and kernel is None:
                assert r["error"].startswith("not run:")
                continue
            assert r["error"] is None, r
            assert r["ratio"] > 0 and r["len_ratio"] > 0 and r["ns_1thread"] > 0


def test_cli_scaling_plain_text():
    out = _scaling_cli("--plain").stdout
    assert out.startswith("dlbridge bench --scaling")
    assert "scaling, " in out
    if not FREE_THREADED:
        assert "not run: GIL build" in out
    assert max(len(line) for line in out.splitlines()) <= 100


def test_no_scaling_leaves_the_rows_out():
    # --no-scaling: the section says it was not asked for (frameworks: none
    # installed would run their children; ask for one that is not needed).
    out = _bench.run(frameworks=(), mode="quick", scaling=False)
    assert out["scaling"]["note"] == "not run: not asked for"
    _doctor.validate(out, _bench.SCHEMA)


def test_forced_run_arithmetic():
    """Forced to 2 threads (on a GIL build too: the threads then take
    turns), the figures are consistent: of_len = ratio / len_ratio, the
    target judged on own rows only."""
    got = bs.measure(_kernel(), TINY, calls=("tensor.dtype", "from_dlpack"),
                     nthreads=2)
    _doctor.validate(got, bs.SCHEMA)
    assert got["threads"] == 2
    rows = {(r["call"], r["kind"]): r for r in got["rows"]}
    assert set(rows) == {(c, k) for c in ("tensor.dtype", "from_dlpack")
                         for k in bs.KINDS}
    for (call, kind), r in rows.items():
        assert r["error"] is None, r
        assert r["ratio"] > 0 and r["len_ratio"] > 0
        assert r["of_len"] == pytest.approx(r["ratio"] / r["len_ratio"])
        assert r["cpu_per_call"] > 0
        status = bs.target(r, 2)
        if kind == "shared":
            assert status is None
        elif r["len_ratio"] < 1.6:
            assert status == "busy"
        else:
            want = r["ratio"] >= 1.8 and r["of_len"] >= 0.9
            assert status == ("met" if want else "missed")
    row = dict(rows["tensor.dtype", "own"], ratio=1.9, len_ratio=2.0,
               of_len=0.95)
    assert bs.target(row, 2) == "met"
    assert bs.target(dict(row, ratio=1.7, of_len=0.85), 2) == "missed"
    assert bs.target(dict(row, len_ratio=1.5, of_len=1.27), 2) == "busy"
    assert all(len(line) <= 100 for line in bs.lines(got)[1:])


def test_function_rows_without_a_kernel_say_why():
    got = bs.measure(None, TINY, calls=("Function",), nthreads=2)
    assert {r["kind"] for r in got["rows"]} == set(bs.KINDS)
    assert all(r["error"].startswith("not run: no kernel library")
               for r in got["rows"])


def test_a_failing_statement_is_its_error(monkeypatch):
    monkeypatch.setitem(bs.ROWS, "tensor.dtype", ("t.no_such_attribute", "x"))
    got = bs.measure(None, TINY, calls=("tensor.dtype",), nthreads=2)
    assert all("AttributeError" in r["error"] for r in got["rows"])


def test_a_statement_failing_while_timed_is_raised(monkeypatch):
    """A loop that raises only once the threads are released (its untimed
    first call, 10 statements per thread, passed) is the run's exception,
    not a figure."""
    import numpy as np

    import dlbridge as dlb
    monkeypatch.setitem(bs.ROWS, "tensor.dtype",
                        ("t.dtype if c.append(0) or len(c) <= 20 else t.nope",
                         "x"))
    objects = {"t": dlb.from_dlpack(np.ones(2, np.float32)), "c": []}
    with pytest.raises(AttributeError):
        bs._run("tensor.dtype", "shared", bs.Shared(dlb, np, None, objects),
                2, 5)


@pytest.mark.skipif(FREE_THREADED, reason="a GIL build's answer")
def test_gil_build_is_not_run():
    assert bs.why_not_run() == "GIL build"
    assert bs.measure()["note"] == "not run: GIL build"


def test_threads_is_the_cpus_this_process_may_use():
    n = bs.threads()
    assert 1 <= n <= (os.cpu_count() or 1)
