"""dlbridge bench: JSON schema, rows per installed framework, peers, table,
--plot.  Never asserts a time: figures depend on the machine and its load;
only their presence, sign and arithmetic are checked."""

import importlib.util
import json
import os
import subprocess
import sys
import types

import pytest

from dlbridge import _bench, _doctor, _measure

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _cli(*args, env=None, timeout=180):
    return subprocess.run([sys.executable, "-m", "dlbridge", "bench", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env=env)


@pytest.fixture(scope="module")
def no_peers(tmp_path_factory):
    return str(tmp_path_factory.mktemp("no-peers"))


@pytest.fixture(scope="module")
def report(no_peers):
    """One quick run over every installed framework (a few seconds each,
    mostly their import), peers pointed at an empty directory so the run
    does not depend on whether `make bench` built them here."""
    proc = _cli("--quick", "--json", "--peers", no_peers)
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)   # --json alone: JSON only on stdout
    # exit status 1 exactly when a dlbridge call failed where the
    # framework's own way worked
    assert proc.returncode == (1 if report["defects"] else 0), proc.stderr
    return report


def test_schema(report):
    _doctor.validate(report, _bench.SCHEMA)
    assert report["mode"] == "quick"
    bad = json.loads(json.dumps(report))
    bad["rows"][0]["call"] = "teleport"
    with pytest.raises(ValueError, match="call"):
        _doctor.validate(bad, _bench.SCHEMA)
    del bad["peers"]
    with pytest.raises(ValueError, match="peers"):
        _doctor.validate(bad, _bench.SCHEMA)


def test_every_installed_framework_has_the_four_calls(report):
    installed = [f for f in _bench.FRAMEWORKS
                 if importlib.util.find_spec(f) is not None]
    assert report["frameworks"] == installed
    assert "numpy" in installed
    for fw in installed:
        own = {r["call"]: r for r in report["rows"]
               if r["framework"] == fw and r["reference"]["kind"] == "own"}
        assert set(own) == set(_bench.CALLS), (fw, report["notes"])
        # dlbridge's own side is measured for every framework, or the
        # failure is listed as a defect, or it is Function without the
        # kernel library, or convert into PyArrow (no DLPack importer)
        defects = {(d["framework"], d["call"]) for d in report["defects"]}
        for call, r in own.items():
            assert (r["dlbridge"]["ns"] is not None or (fw, call) in defects
                    or call == "Function" and report["kernel"] is None
                    or call == "convert" and fw == "pyarrow"), (fw, call, r)
        assert own["__dlpack__"]["dlbridge"]["ns"] is not None
    for fw in ("numpy", "torch", "jax", "tensorflow"):
        if fw in installed:
            assert (fw, "convert") not in {(d["framework"], d["call"])
                                           for d in report["defects"]}


def test_figures_are_positive_and_ratios_consistent(report):
    measured = 0
    for r in report["rows"]:
        ours, theirs = r["dlbridge"]["ns"], r["reference"]["ns"]
        for side in ("dlbridge", "reference"):
            # exactly one of a figure and the reason there is none
            assert (r[side]["ns"] is None) != (r[side]["error"] is None), r
        if ours is not None and theirs is not None:
            measured += 1
            assert ours > 0 and theirs > 0
            assert r["ratio"] == pytest.approx(theirs / ours)
        else:
            assert r["ratio"] is None
    assert measured >= 3


def test_numpy_rows_compare_with_numpy(report):
    rows = {r["call"]: r for r in report["rows"] if r["framework"] == "numpy"}
    assert rows["from_dlpack"]["reference"]["expr"] == "np.from_dlpack(x)"
    assert rows["convert"]["dlbridge"]["expr"] == "dlb.convert(y, 'numpy')"
    assert rows["__dlpack__"]["reference"]["ns"] is not None


@pytest.mark.skipif(importlib.util.find_spec("pyarrow") is None,
                    reason="pyarrow not installed")
def test_pyarrow_has_no_importer_row(report):
    r = next(r for r in report["rows"] if r["framework"] == "pyarrow"
             and r["call"] == "from_dlpack")
    assert r["reference"]["ns"] is None
    assert "no DLPack importer" in r["reference"]["error"]


def test_absent_peers_are_a_note(report):
    assert not any(p["present"] for p in report["peers"].values())
    kinds = {r["reference"]["kind"] for r in report["rows"]}
    assert kinds == {"own"}
    notes = "\n".join(report["notes"])
    assert "nanobind: absent" in notes and "tvm-ffi: absent" in notes


def test_present_peers_are_rows(tmp_path):
    """Stand-ins for the peers bench/build_peers.sh builds (the real ones
    need nanobind and apache-tvm-ffi): each present peer becomes a Function
    row measured against dlbridge's Function in the same run."""
    (tmp_path / "_nb_peer.py").write_text("def f(a, b, c):\n    pass\n")
    (tmp_path / "_noop.py").write_text("def noop(a, b, c):\n    pass\n")
    (tmp_path / "libtvm_peer.so").write_bytes(b"")
    pkg = tmp_path / "fake" / "tvm_ffi"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "def load_module(path):\n"
        "    return {'noop3': lambda a, b, c: None}\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path / "fake")] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    proc = _cli("--quick", "--json", "--frameworks", "numpy",
                "--peers", str(tmp_path), env=env)
    assert proc.returncode == 0, proc.stderr     # numpy: no defect
    rep = json.loads(proc.stdout)
    _doctor.validate(rep, _bench.SCHEMA)
    assert all(p["present"] for p in rep["peers"].values())
    fn = {r["reference"]["kind"]: r for r in rep["rows"] if r["call"] == "Function"}
    assert set(fn) == {"own", "nanobind", "tvm-ffi", "no-op"}
    for kind in ("nanobind", "tvm-ffi", "no-op"):
        assert fn[kind]["reference"]["ns"] is not None, fn[kind]
        # the same dlbridge figure in every Function row of the run
        assert fn[kind]["dlbridge"] == fn["own"]["dlbridge"]
    assert not any("absent" in n for n in rep["notes"])


def test_plain_table_fits_100_columns(report):
    text = _bench.plain(report)
    assert max(len(line) for line in text.splitlines()) <= 100
    for r in report["rows"]:
        assert r["reference"]["expr"][:30] in text
    assert "ref/dlb" in text and "nanobind: absent" in text


def test_rich_table_fits_100_columns(report):
    rich = pytest.importorskip("rich.console")
    console = rich.Console(width=100, record=True)
    _bench.rich_table(report, console)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 100
    # no cell was wrapped or cut: every reference is on one line, whole
    for r in report["rows"]:
        assert r["reference"]["expr"] in text


def test_cli_prints_the_table(no_peers):
    proc = _cli("--quick", "--plain", "--frameworks", "numpy", "--peers", no_peers)
    assert proc.returncode == 0, proc.stderr
    assert "np.from_dlpack(x)" in proc.stdout and "ref/dlb" in proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines()) <= 100


def test_cli_json_file_and_unknown_framework(tmp_path, no_peers):
    out = tmp_path / "b.json"
    proc = _cli("--quick", "--plain", "--frameworks", "numpy", "--peers",
                no_peers, "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "np.from_dlpack(x)" in proc.stdout        # table still printed
    _doctor.validate(json.loads(out.read_text()), _bench.SCHEMA)
    proc = _cli("--frameworks", "numpy,abacus")
    assert proc.returncode == 2 and "abacus" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_defects_are_dlbridge_failures_where_the_own_way_works(report):
    rows = {(r["framework"], r["call"]): r for r in report["rows"]
            if r["reference"]["kind"] == "own"}
    for d in report["defects"]:
        r = rows[d["framework"], d["call"]]
        assert r["dlbridge"]["error"] == d["error"]
        assert r["reference"]["ns"] is not None
    listed = {(d["framework"], d["call"]) for d in report["defects"]}
    for (fw, call), r in rows.items():
        if r["dlbridge"]["ns"] is None and r["reference"]["ns"] is not None:
            # not a defect: PyArrow has no DLPack importer to convert into;
            # Function without the kernel library
            assert (fw, call) in listed or fw == "pyarrow" or (
                call == "Function" and report["kernel"] is None), r


@pytest.mark.parametrize("args, why", [
    (["--json", "/nonexistent-dir/b.json"], "cannot write"),
    (["--plot", "/"], "is a directory"),
    (["--frameworks", ","], "no framework named"),
])
def test_usage_errors_exit_2_before_measuring(args, why):
    """gh-15: exit status 2, a message, no traceback, nothing measured."""
    proc = _cli("--quick", "--frameworks", "numpy", *args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert why in proc.stderr
    assert "Traceback" not in proc.stderr and "measuring" not in proc.stderr


def test_plot_without_matplotlib_is_a_message(tmp_path):
    """matplotlib made unimportable (whether or not it is installed): exit
    status 2, a message naming the fix, no traceback, nothing measured."""
    block = tmp_path / "block" / "matplotlib"
    block.mkdir(parents=True)
    (block / "__init__.py").write_text("raise ImportError('blocked by the test')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path / "block")] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    png = tmp_path / "p.png"
    proc = _cli("--quick", "--frameworks", "numpy", "--plot", str(png), env=env,
                timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "matplotlib" in proc.stderr and "pip install 'dlbridge[plot]'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not png.exists()
    assert "measuring" not in proc.stderr     # refused before measuring


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                    reason="matplotlib not installed (the fake-module test covers --plot)")
def test_plot_writes_a_png(tmp_path, no_peers):
    png = tmp_path / "p.png"
    proc = _cli("--quick", "--frameworks", "numpy", "--peers", no_peers,
                "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:8] == PNG_MAGIC


def _fake_matplotlib(calls):
    """A stand-in for matplotlib with the calls plot() makes, recording
    them; savefig writes a PNG signature so the file is recognisable."""
    class Axes:
        def __getattr__(self, name):
            return lambda *a, **k: calls.append((name, a, k))

    class Figure:
        def tight_layout(self):
            pass

        def savefig(self, path, **k):
            calls.append(("savefig", (path,), k))
            with open(path, "wb") as f:
                f.write(PNG_MAGIC)

    mpl = types.ModuleType("matplotlib")
    mpl.use = lambda backend: calls.append(("use", (backend,), {}))
    plt = types.ModuleType("matplotlib.pyplot")
    plt.subplots = lambda **k: (Figure(), Axes())
    plt.close = lambda fig: None
    mpl.pyplot = plt
    return mpl, plt


def test_plot_through_a_fake_matplotlib(report, tmp_path, monkeypatch):
    calls = []
    mpl, plt = _fake_matplotlib(calls)
    monkeypatch.setitem(sys.modules, "matplotlib", mpl)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", plt)
    monkeypatch.setattr(_bench, "run", lambda *a, **k: dict(report, defects=[]))
    png = tmp_path / "chart.png"
    args = types.SimpleNamespace(plot=str(png), frameworks=None, full=False,
                                 quick=True, json="-", plain=True,
                                 kernels=None, peers=None)
    assert _bench.main(args) == 0
    assert png.read_bytes()[:8] == PNG_MAGIC
    names = [c[0] for c in calls]
    assert ("use", ("Agg",), {}) in calls           # no display needed
    assert names.count("barh") == 2 and "set_xscale" in names
    bars = next(c for c in calls if c[0] == "barh")
    plotted = [r for r in report["rows"]
               if r["dlbridge"]["ns"] is not None or r["reference"]["ns"] is not None]
    assert len(bars[1][1]) == len(plotted)


def test_dead_child_is_a_note(monkeypatch):
    def died(*a, **k):
        return subprocess.CompletedProcess(a, -6, "", "Fatal Python error: Aborted\n")
    monkeypatch.setattr(_bench.subprocess, "run", died)
    rows, note = _bench.run_child("numpy", {})
    assert rows == [] and "signal 6" in note and "Aborted" in note


def test_measure_reports_errors_as_text():
    got = _measure.measure({
        "ok": _measure.Case("f(x)", f=abs, x=-1),
        "broken": _measure.Case("f(x)", f=abs, x="a"),
        "skipped": "not built",
        "none": None,
    }, _measure.Settings(rounds=1, repeats=1, target_s=0.0005))
    assert isinstance(got["ok"], float) and got["ok"] > 0
    assert got["broken"].startswith("TypeError")
    assert got["skipped"] == "not built" and got["none"] is None


def test_kernel_library_is_found_in_build_never_a_sanitizer_build(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(_bench.KERNELS_ENV, raising=False)
    for d in ("build-asan", "build-sanitize-py"):
        (tmp_path / d).mkdir()
        (tmp_path / d / _bench.KERNEL_LIB).write_bytes(b"")
    assert _bench.find_kernel() is None     # an ASan build cannot be loaded here
    (tmp_path / "build-dev").mkdir()
    (tmp_path / "build-dev" / _bench.KERNEL_LIB).write_bytes(b"")
    assert _bench.find_kernel() == str(tmp_path / "build-dev" / _bench.KERNEL_LIB)
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / _bench.KERNEL_LIB).write_bytes(b"")
    assert _bench.find_kernel() == str(tmp_path / "build" / _bench.KERNEL_LIB)
    monkeypatch.setenv(_bench.KERNELS_ENV, "elsewhere.so")
    assert _bench.find_kernel() == str(tmp_path / "elsewhere.so")
    assert _bench.find_kernel("mine.so") == str(tmp_path / "mine.so")
