"""dlbridge doctor: real probes over a subset of pairs, the judge, the JSON
schema, and the renderings of a stored report (which need no framework)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from dlbridge import _doctor, _kits, _render

# float8 cases, probed when ml_dtypes or torch is installed: NumPy has no
# float8 dtypes and cannot export an ml_dtypes float8 array; torch and
# dlbridge share them zero-copy (checked with torch 2.13, ml_dtypes 0.6).
FP8 = [(d, "contiguous") for d in _doctor.FP8_DTYPES]
FP8_REFUSED = dict.fromkeys(FP8, "refused")

# What each pair must show, per (producer, consumer, path): outcome of
# every probe, by case; cases not listed must be zero-copy.
EXPECT = {
    ("numpy", "torch", "own"): {("bfloat16", "contiguous"): "refused",
                                ("float32", "negative"): "crashed",
                                ("float32", "read-only"): "zero-copy",
                                **FP8_REFUSED},
    ("numpy", "torch", "dlb"): {("bfloat16", "contiguous"): "refused",
                                ("float32", "negative"): "refused",
                                ("float32", "read-only"): "refused",
                                **FP8_REFUSED},
    ("torch", "numpy", "own"): {("bfloat16", "contiguous"): "refused",
                                **FP8_REFUSED},
    ("torch", "numpy", "dlb"): {("bfloat16", "contiguous"): "refused",
                                **FP8_REFUSED},
    ("numpy", "dlbridge", "own"): {("bfloat16", "contiguous"): "refused",
                                   **FP8_REFUSED},
    ("torch", "dlbridge", "dlb"): {},      # float8 included: zero-copy
    ("dlbridge", "torch", "dlb"): {("float32", "negative"): "refused",
                                   ("float32", "read-only"): "refused"},
    ("dlbridge", "numpy", "own"): FP8_REFUSED,
}


# Stand-in frameworks, joined to the kits through $DLBRIDGE_DOCTOR_KITS (the
# children inherit it): a producer whose __dlpack__ aborts the process.
FAKE_KITS = """
import os
import subprocess
import sys
import time

from dlbridge._kits_base import Kit, sliced


class Aborts:
    def __dlpack__(self, **kw):
        os.abort()

    def __dlpack_device__(self):
        return (1, 0)


class Crasher(Kit):
    name = "crasher"
    consumer = False

    def make(self, np, a, dtype, layout):
        return Aborts(), sliced(a, layout)


def hang():
    # A grandchild in the same process group, its pid left for the test
    # to check that the whole group was killed.
    sleeper = subprocess.Popen([sys.executable, "-c",
                                "import time; time.sleep(600)"])
    with open(os.environ["DOCTOR_TEST_PIDS"], "a") as f:
        f.write(f"{sleeper.pid}\\n")
    time.sleep(600)


class Hanger(Kit):
    # an importer that never returns on int8
    name = "hanger"

    def own_importer(self, dtype="float32"):
        import numpy
        if dtype == "int8":
            return lambda x: hang()
        return numpy.from_dlpack


class Stuck(Kit):
    # a framework whose import never returns
    name = "stuck"

    def load(self):
        hang()


KITS = [Crasher(), Hanger(), Stuck()]
"""


@pytest.fixture(scope="module")
def fake_kits(tmp_path_factory):
    """$DLBRIDGE_DOCTOR_KITS and PYTHONPATH set to a module of stand-in
    kits for as long as the module's tests run; yields the file where the
    hanging ones write the pids of the processes they start."""
    where = tmp_path_factory.mktemp("kits")
    (where / "doctor_fake_kits.py").write_text(FAKE_KITS)
    pids = where / "pids"
    saved = {k: os.environ.get(k) for k in
             ("PYTHONPATH", _kits.EXTRA_KITS_ENV, "DOCTOR_TEST_PIDS")}
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(where)] + [p for p in [saved["PYTHONPATH"]] if p])
    os.environ[_kits.EXTRA_KITS_ENV] = "doctor_fake_kits"
    os.environ["DOCTOR_TEST_PIDS"] = str(pids)
    sys.path.insert(0, str(where))
    yield pids
    sys.path.remove(str(where))
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def report(fake_kits):
    pytest.importorskip("torch")
    return _doctor.run(["numpy", "torch", "dlbridge", "crasher"], workers=2)


def _raw(producer, consumer, dtype, layout, path, outcome, message=""):
    return dict(producer=producer, consumer=consumer, dtype=dtype,
                layout=layout, path=path, outcome=outcome, message=message)


# A report as a run stores it with --json, before judging: numpy, torch and
# dlbridge (outcomes as torch 2.13 and NumPy 2.4 gave them) and a producer
# that aborts.  The rendering tests use it, so they need no framework.
STORED_CASES = [("float32", "contiguous"), ("bfloat16", "contiguous"),
                ("float32", "negative"), ("float32", "read-only")]
STORED = {
    "schema_version": _doctor.SCHEMA_VERSION, "seconds": 1.5,
    "python": "3.11.7", "versions": {"numpy": "2.4.6", "torch": "2.13.0",
                                     "dlbridge": "0.1.0", "crasher": "?"},
    "producers": ["numpy", "torch", "dlbridge", "crasher"],
    "consumers": ["numpy", "torch", "dlbridge"],
    "cases": [{"dtype": d, "layout": lay} for d, lay in STORED_CASES],
    "cells": [
        *[_raw(p, c, "float32", "contiguous", path, "zero-copy")
          for p in ("numpy", "torch", "dlbridge") for c in ("numpy", "torch", "dlbridge")
          for path in ("own", "dlb")],
        _raw("torch", "numpy", "bfloat16", "contiguous", "own", "refused",
             "BufferError: Unsupported dtype in DLTensor"),
        _raw("torch", "numpy", "bfloat16", "contiguous", "dlb", "refused",
             "BufferError: convert: numpy cannot hold dtype bfloat16"),
        _raw("torch", "torch", "bfloat16", "contiguous", "own", "zero-copy"),
        _raw("torch", "torch", "bfloat16", "contiguous", "dlb", "zero-copy"),
        _raw("numpy", "torch", "float32", "negative", "own", "crashed",
             "process died (signal 6) c10::Error: Storage size calculation overflowed"),
        _raw("numpy", "torch", "float32", "negative", "dlb", "refused",
             "BufferError: convert: torch tensors cannot have negative strides"),
        _raw("numpy", "numpy", "float32", "negative", "own", "zero-copy"),
        _raw("numpy", "numpy", "float32", "negative", "dlb", "zero-copy"),
        _raw("numpy", "torch", "float32", "read-only", "own", "zero-copy"),
        _raw("numpy", "torch", "float32", "read-only", "dlb", "refused",
             "BufferError: convert: the data is read-only"),
        _raw("crasher", "numpy", "float32", "contiguous", "own", "crashed",
             "process died (signal 6) Fatal Python error: Aborted"),
        _raw("crasher", "numpy", "float32", "contiguous", "dlb", "crashed",
             "process died (signal 6) Fatal Python error: Aborted"),
    ],
}


@pytest.fixture
def stored():
    return _doctor.judge(json.loads(json.dumps(STORED)))


def _cells(report, p, c, path):
    return {(x["dtype"], x["layout"]): x for x in report["cells"]
            if x["producer"] == p and x["consumer"] == c and x["path"] == path}


@pytest.mark.parametrize("pair", sorted(EXPECT))
def test_cells_match_expectations(report, pair):
    cells = _cells(report, *pair)
    assert cells, pair
    for case, cell in cells.items():
        assert cell["outcome"] == EXPECT[pair].get(case, "zero-copy"), (case, cell)


def test_torch_negative_strides_crash_is_a_labelled_cell(report):
    cell = _cells(report, "numpy", "torch", "own")[("float32", "negative")]
    assert "signal" in cell["message"]
    assert "negative strides" in cell["known_limitation"]
    # the child was restarted: the probes after the crash still ran
    assert _cells(report, "numpy", "torch", "own")[("float32", "0-d")]["outcome"] == "zero-copy"


def test_crashing_producer_is_reported_not_fatal(report):
    crashed = [c for c in report["cells"] if c["producer"] == "crasher"]
    assert crashed and all(c["outcome"] == "crashed" for c in crashed)
    assert any("signal 6" in c["message"] for c in crashed)


def test_float8_is_probed_where_present(report):
    if "float8_e4m3fn" not in _doctor.DTYPES:
        pytest.skip("neither ml_dtypes nor torch installed")
    torch_dlb = _cells(report, "torch", "dlbridge", "own")
    dlb_torch = _cells(report, "dlbridge", "torch", "own")
    for case in FP8:
        assert torch_dlb[case]["outcome"] == "zero-copy"
        assert dlb_torch[case]["outcome"] == "zero-copy"
        cell = _cells(report, "torch", "numpy", "own")[case]
        assert "float8" in cell["known_limitation"]


def test_no_dlbridge_defects(report):
    assert report["defects"] == []


def test_json_schema(report):
    _doctor.validate(json.loads(json.dumps(report)))
    assert report["schema_version"] == _doctor.SCHEMA_VERSION
    bad = dict(report, cells=[dict(report["cells"][0], outcome="fine")])
    with pytest.raises(ValueError, match="outcome"):
        _doctor.validate(bad)


def test_plain_grid_of_a_run(report):
    text = _render.plain(report)
    assert max(len(line) for line in text.splitlines()) <= 100
    n = 16 + len(FP8) * ("float8_e4m3fn" in _doctor.DTYPES)
    assert f"✓ {n}/{n}" in text    # torch -> torch, all zero-copy
    assert "☠" in text


def test_stored_report_is_judged_again(stored):
    _doctor.validate(stored)
    crash = next(c for c in stored["cells"] if c["outcome"] == "crashed"
                 and c["producer"] == "numpy")
    assert "negative strides" in crash["known_limitation"]
    assert stored["defects"] == []


def test_plain_grid_fits_100_columns(stored):
    text = _render.plain(stored)
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "✓ 2/2" in text      # torch -> torch: float32 and bfloat16
    assert "☠" in text


def test_rich_grid(stored):
    rich = pytest.importorskip("rich.console")
    console = rich.Console(width=100, record=True)
    _render.rich_grid(stored, console)
    assert "producer" in console.export_text()


def test_cli_json_and_plain_text(tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "dlbridge", "doctor", "--frameworks", "numpy",
         "--plain", "--json", str(out)], capture_output=True, text=True,
        timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "numpy" in proc.stdout and "✓" in proc.stdout
    _doctor.validate(json.loads(out.read_text()))


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (killed, not yet reaped by its parent) is gone too
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_hung_probe_is_a_cell_and_the_pair_goes_on(fake_kits):
    """gh-15: a probe that never returns is killed after --timeout (its
    child's whole process group), becomes a "hung" cell, and the pair goes
    on in a new child; a hang in a framework's own importer is upstream."""
    fake_kits.write_text("")
    cells = _doctor._run_pair("numpy", "hanger", timeout=1)
    got = {(c["dtype"], c["layout"], c["path"]): c for c in cells}
    hung = got["int8", "contiguous", "own"]
    assert hung["outcome"] == "hung" and hung["phase"] == "import"
    assert "1 s" in hung["message"]
    # the pair went on: the int8 dlb probe and every case after it ran
    assert got["int8", "contiguous", "dlb"]["outcome"] != "hung"
    assert got["float32", "contiguous", "own"]["outcome"] == "zero-copy"
    assert got["float32", "read-only", "own"]["outcome"] == "zero-copy"
    assert len(cells) == 2 * len(_doctor.cases())
    assert not _doctor.dlbridge_defects(cells)
    pids = [int(p) for p in fake_kits.read_text().split()]
    assert pids and not any(_alive(p) for p in pids)


def test_framework_whose_import_hangs(fake_kits):
    """A framework that hangs while loading: one child, killed after the
    timeout, and every probe of the pair reported hung, not retried."""
    fake_kits.write_text("")
    cells = _doctor._run_pair("numpy", "stuck", timeout=1)
    assert len(cells) == 2 * len(_doctor.cases())
    assert {c["outcome"] for c in cells} == {"hung"}
    assert {c["phase"] for c in cells} == {"load"}
    assert "loading numpy and stuck" in cells[0]["message"]
    assert len(fake_kits.read_text().split()) == 1     # no second child
    assert not _doctor.dlbridge_defects(cells)


def test_crash_or_hang_while_dlbridge_runs_is_a_defect():
    """A crash or hang is dlbridge's defect when its code was running
    (the dlb path's import, dlbridge's own importer, making a dlbridge
    tensor, reading results back); the frameworks' otherwise."""
    def cell(path, phase, producer="numpy", consumer="torch", outcome="hung"):
        return dict(producer=producer, consumer=consumer, dtype="int8",
                    layout="contiguous", path=path, outcome=outcome,
                    message="", phase=phase)
    ours = [cell("dlb", "import"), cell("own", "import", consumer="dlbridge"),
            cell("own", "make", producer="dlbridge", outcome="crashed"),
            cell("own", "inspect")]
    theirs = [cell("own", "import"), cell("dlb", "make"), cell("dlb", "load"),
              cell("own", "exit", outcome="crashed")]
    assert _doctor.dlbridge_defects(ours + theirs) == ours


def _doctor_cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "dlbridge", "doctor", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args, why", [
    (["-j", "0"], "must be above 0"),
    (["-j", "two"], "not a number"),
    (["--timeout", "0"], "must be above 0"),
    (["--timeout", "inf"], "finite"),
    (["--frameworks", "nosuchfw"], "unknown framework(s) nosuchfw"),
    (["--frameworks", ","], "no framework named"),
    (["--json", "/nonexistent-dir/r.json"], "cannot write"),
    (["--html", "/"], "is a directory"),
])
def test_usage_errors_exit_2_before_probing(args, why):
    """gh-15: every usage error is exit status 2 with a message, no
    traceback, found before any probing (no progress line)."""
    proc = _doctor_cli("--plain", "--frameworks", "numpy", *args, timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert why in proc.stderr
    assert "Traceback" not in proc.stderr and "→" not in proc.stderr


def test_exit_status_1_for_a_defect(monkeypatch, stored, capsys):
    from dlbridge import __main__ as cli
    monkeypatch.setattr(_doctor, "run", lambda *a, **k: stored)
    assert cli.main(["doctor", "--plain", "--frameworks", "numpy"]) == 0
    bad = dict(stored, defects=[stored["cells"][0]])
    monkeypatch.setattr(_doctor, "run", lambda *a, **k: bad)
    assert cli.main(["doctor", "--plain", "--frameworks", "numpy"]) == 1
    assert "DLBRIDGE DEFECT" in capsys.readouterr().err


def test_html_report_in_chromium(stored, tmp_path):
    page = tmp_path / "doctor.html"
    page.write_text(_render.html_page(stored), encoding="utf-8")
    text = page.read_text()
    assert "http://" not in text and "https://" not in text  # no network
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium not installed (scripts/bootstrap installs it)")
    flags = ["--headless", "--no-sandbox", "--disable-gpu"]
    # The browser is not ours to sanitize: under `make sanitize-python` the
    # ASan runtime is preloaded into this interpreter, and chromium started
    # with it preloaded hangs.
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")}
    dom = subprocess.run([browser, *flags, "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=60,
                         env=env).stdout
    assert 'id="grid-own"' in dom and 'id="grid-dlb"' in dom
    assert "negative strides" in dom          # a tooltip (title) filled by script
    assert 'class="cell"' in dom
    shot = tmp_path / "grid.png"
    subprocess.run([browser, *flags, f"--screenshot={shot}",
                    "--window-size=1000,900", page.as_uri()],
                   capture_output=True, timeout=60, env=env)
    assert shot.exists() and shot.stat().st_size > 1000


def test_cuda_variants_pair_only_with_cuda(fake_kits):
    """With a GPU, frameworks are probed again on cuda:0 as "<name>:cuda";
    a pair never mixes a CPU producer with a CUDA consumer (or the reverse).
    (The CUDA cells themselves are checked on a GPU machine.)"""
    fws = _doctor.installed_frameworks(cuda=True)
    assert "dlbridge:cuda" in fws and "dlbridge" in fws
    assert not any(f.endswith(":cuda") for f in _doctor.installed_frameworks(cuda=False))
    pairs = _doctor.pairs_of(["numpy", "dlbridge", "torch:cuda", "dlbridge:cuda", "crasher"])
    assert ("torch:cuda", "dlbridge:cuda") in pairs and ("numpy", "dlbridge") in pairs
    assert ("crasher", "numpy") in pairs and ("numpy", "crasher") not in pairs
    assert all(p.endswith(":cuda") == c.endswith(":cuda") for p, c in pairs)
    cell = dict(producer="dlbridge", consumer="torch", dtype="float32",
                layout="negative", path="own", outcome="refused")
    on_gpu = dict(cell, producer="dlbridge:cuda", consumer="torch:cuda")
    assert _doctor.known_reason(on_gpu) == _doctor.known_reason(cell)


def test_unaligned_copy_for_tensorflow_is_not_a_defect():
    """dlbridge.convert copies data that is not 64-byte aligned for
    TensorFlow (whose kernels abort on it): labelled, not a dlbridge defect;
    any other copy where the consumer's own path shares memory is one."""
    cells = [
        dict(producer="numpy", consumer="tensorflow", dtype="int8",
             layout="contiguous", path="own", outcome="zero-copy", message=""),
        dict(producer="numpy", consumer="tensorflow", dtype="int8",
             layout="contiguous", path="dlb", outcome="copied",
             message=_doctor.UNALIGNED_FOR_TF),
        dict(producer="numpy", consumer="torch", dtype="int8",
             layout="contiguous", path="own", outcome="zero-copy", message=""),
        dict(producer="numpy", consumer="torch", dtype="int8",
             layout="contiguous", path="dlb", outcome="copied", message=""),
    ]
    bad = _doctor.dlbridge_defects(cells)
    assert [(c["consumer"], c["path"]) for c in bad] == [("torch", "dlb")]
