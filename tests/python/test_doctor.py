"""dlbridge doctor: the judge and the renderings on a stored report (no
framework needed), real probes over numpy, torch and dlbridge, hung and
crashing children, the command line."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from dlbridge import _doctor, _kits, _render

FP8 = [(d, "contiguous") for d in _doctor.FP8_DTYPES]


def _raw(producer, consumer, dtype, layout, path, outcome, message="", **facts):
    return dict(producer=producer, consumer=consumer, dtype=dtype,
                layout=layout, path=path, outcome=outcome, message=message,
                **facts)


def _pair(producer, consumer, dtype, layout, own, dlb, own_msg="", dlb_msg="",
          **facts):
    return [_raw(producer, consumer, dtype, layout, "own", own, own_msg, **facts),
            _raw(producer, consumer, dtype, layout, "dlb", dlb, dlb_msg, **facts)]


# A report as a run stores it with --json, before judging (outcomes as
# numpy 2.4.6, torch 2.13, tensorflow 2.21 and paddle 3.3 gave them, when
# paddle was no convert target yet), plus zero-copy columns for more peers,
# so the grid is as wide as a real one.  The rendering and judging tests
# read it: they need no framework.
PEERS = ["jax", "tvm_ffi", "mlx", "warp", "open3d", "drjit", "onnxruntime",
         "array_api_strict"]
STORED_CASES = [("float32", "contiguous"), ("int8", "contiguous"),
                ("bfloat16", "contiguous"), ("float32", "negative"),
                ("float32", "read-only")]
STORED = {
    "schema_version": _doctor.SCHEMA_VERSION, "seconds": 1.5, "timeout_s": 300,
    "python": "3.11.7", "versions": {"numpy": "2.4.6", "torch": "2.13.0",
                                     "dlbridge": "0.1.0"},
    "producers": ["numpy", "torch", "tensorflow", "paddle", "dlbridge"],
    "consumers": ["numpy", "torch", "tensorflow", "paddle", "dlbridge"] + PEERS,
    "cases": [{"dtype": d, "layout": lay} for d, lay in STORED_CASES],
    "cells": [
        *[cell for p in ("numpy", "torch", "dlbridge")
          for c in ("numpy", "torch", "dlbridge") + tuple(PEERS)
          for cell in _pair(p, c, "float32", "contiguous", "zero-copy", "zero-copy")],
        *_pair("numpy", "numpy", "bfloat16", "contiguous", "n/a", "n/a",
               "NumPy has no bfloat16 dtype", "NumPy has no bfloat16 dtype"),
        *_pair("torch", "numpy", "bfloat16", "contiguous", "error", "refused",
               "RuntimeError: Unsupported dtype in DLTensor.",
               "BufferError: convert: numpy cannot hold dtype bfloat16"),
        *_pair("numpy", "torch", "float32", "negative", "crashed", "refused",
               "process died (signal 6) c10::Error: Storage size calculation overflowed",
               "BufferError: convert: torch tensors cannot have negative strides",
               phase="import"),
        *_pair("numpy", "torch", "float32", "read-only", "writable-alias", "refused",
               "the result shares the producer's read-only memory and can be written",
               "BufferError: convert: the data is read-only", read_only=True),
        *_pair("numpy", "paddle", "int8", "contiguous", "zero-copy", "error", "",
               "ValueError: convert: unknown target 'paddle'"),
        *_pair("numpy", "tensorflow", "int8", "contiguous", "zero-copy", "copied",
               source_alignment=16),
        *_pair("dlbridge", "tensorflow", "float32", "read-only", "refused",
               "refused", "BufferError: cannot export a read-only tensor as a "
               "legacy (unversioned) capsule", "BufferError: cannot export a "
               "read-only tensor as a legacy (unversioned) capsule", read_only=True),
        *_pair("paddle", "tensorflow", "float32", "contiguous", "crashed",
               "crashed", "not run: every probe of this pair kills the process",
               "not run: every probe of this pair kills the process", phase="load"),
    ],
}


@pytest.fixture
def stored():
    return _doctor.judge(json.loads(json.dumps(STORED)))


def _find(report, producer, consumer, dtype, layout, path):
    return next(c for c in report["cells"] if (c["producer"], c["consumer"],
                c["dtype"], c["layout"], c["path"]) == (producer, consumer, dtype,
                                                         layout, path))


# ------------------------------------------------------------------ the judge

def test_stored_report_validates_and_judging_again_changes_nothing(stored):
    _doctor.validate(stored)
    again = _doctor.judge(json.loads(json.dumps(stored)))
    assert again == stored
    bad = dict(stored, cells=[dict(stored["cells"][0], outcome="fine")])
    with pytest.raises(ValueError, match="outcome"):
        _doctor.validate(bad)


def test_a_missing_convert_target_is_a_gap_worse_than_native(stored):
    """gh-17: "convert: unknown target 'paddle'" where paddle's own
    importer shares memory was filed as an upstream limitation with
    "dlbridge defects: 0"; it is dlbridge's gap, worse than native, and a
    defect."""
    cell = _find(stored, "numpy", "paddle", "int8", "contiguous", "dlb")
    assert cell["label"] == "gap" and cell["worse_than_native"]
    assert cell in stored["defects"]
    assert stored["summary"]["worse_than_native"] >= 1


def test_outcomes_are_ordered():
    order = [_doctor.RANK[o] for o in _doctor.OUTCOMES]
    assert order == sorted(order)
    assert {o for o in _doctor.OUTCOMES if _doctor.RANK[o] == 4} == set(_doctor.BAD)
    # a BufferError is better than any other exception
    assert _doctor.RANK["refused"] < _doctor.RANK["error"]


def test_native_writable_alias_of_read_only_memory_is_wrong(stored):
    """torch.from_dlpack of read-only data returns a writable alias: ranked
    with wrong values (upstream), so convert's clean refusal is better than
    native, yet a gap while convert could copy instead."""
    own = _find(stored, "numpy", "torch", "float32", "read-only", "own")
    assert own["outcome"] == "writable-alias" and own["label"] == "upstream"
    assert "read-only" in own["reason"]
    dlb = _find(stored, "numpy", "torch", "float32", "read-only", "dlb")
    assert dlb["better_than_native"] and not dlb["worse_than_native"]
    assert dlb["label"] == "gap" and "could copy" in dlb["reason"]


def test_a_dtype_the_consumer_lacks_is_upstream(stored):
    dlb = _find(stored, "torch", "numpy", "bfloat16", "contiguous", "dlb")
    assert dlb["label"] == "upstream" and "numpy" in dlb["reason"]
    assert dlb["better_than_native"]          # BufferError beats RuntimeError


def test_what_a_producer_cannot_make_is_na_not_refused(stored):
    cell = _find(stored, "numpy", "numpy", "bfloat16", "contiguous", "own")
    assert cell["label"] == "n/a" and "bfloat16" in cell["reason"]
    s = stored["summary"]
    assert s["own"]["n/a"] == 1 and s["dlb"]["n/a"] == 1
    assert s["own"]["refused"] + s["own"]["error"] == 2
    assert s["dlb"]["probes"] == sum(s["dlb"][o] for o in _doctor.OUTCOMES)


def test_aligned_copy_for_tensorflow_is_a_decision(stored):
    """convert copies data TensorFlow's kernels cannot use (not 64-byte
    aligned; the registry's alignment): worse than the own importer's
    zero-copy, but a deliberate decision, not a gap."""
    cell = _find(stored, "numpy", "tensorflow", "int8", "contiguous", "dlb")
    assert cell["label"] == "decision" and cell["worse_than_native"]
    assert "64-byte" in cell["reason"]
    assert stored["summary"]["worse_by_decision"] == 1
    # the same copy of aligned data would be a gap
    aligned = [dict(c, source_alignment=64) for c in STORED["cells"]
               if c["consumer"] == "tensorflow" and c["dtype"] == "int8"]
    assert {c["label"] for c in _doctor.dlbridge_defects(aligned)} == {"gap"}


def test_legacy_read_only_refusal_is_a_decision(stored):
    own = _find(stored, "dlbridge", "tensorflow", "float32", "read-only", "own")
    assert own["label"] == "decision" and "legacy" in own["reason"]


def test_pair_that_cannot_load_is_upstream(stored):
    for path in ("own", "dlb"):
        cell = _find(stored, "paddle", "tensorflow", "float32", "contiguous", path)
        assert cell["label"] == "upstream" and "paddle" in cell["reason"]


def test_crash_or_hang_while_dlbridge_runs_is_a_gap():
    """A crash or hang is dlbridge's gap when its code was running (the
    dlb path's import, dlbridge's own importer, making a dlbridge tensor,
    reading results back); the frameworks' otherwise."""
    def cell(path, phase, producer="numpy", consumer="torch", outcome="hung"):
        return _raw(producer, consumer, "int8", "contiguous", path, outcome,
                    phase=phase)
    ours = [cell("dlb", "import"), cell("own", "import", consumer="dlbridge"),
            cell("own", "make", producer="dlbridge", outcome="crashed"),
            cell("own", "inspect")]
    theirs = [cell("own", "import"), cell("dlb", "make"), cell("dlb", "load"),
              cell("own", "exit", outcome="crashed")]
    got = _doctor.dlbridge_defects(ours + theirs)
    assert [c["phase"] for c in got] == [c["phase"] for c in ours]


def test_dlbridge_gap_exits_1_and_a_saved_report_is_judged_again(tmp_path):
    """--rejudge reads a saved --json (no probing): exit status 1 for its
    gaps, the headline printed."""
    saved = tmp_path / "r.json"
    saved.write_text(json.dumps(STORED))
    proc = _doctor_cli("--plain", "--rejudge", str(saved), timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "convert worse than the own importer: 1 (target 0)" in proc.stdout
    assert "DLBRIDGE GAP: numpy → paddle [dlb] int8/contiguous" in proc.stderr
    clean = dict(STORED, cells=[c for c in STORED["cells"]
                                if c["consumer"] != "paddle" and c["layout"] == "contiguous"
                                and c["consumer"] != "tensorflow"])
    saved.write_text(json.dumps(clean))
    proc = _doctor_cli("--plain", "--rejudge", str(saved), timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    saved.write_text(json.dumps(dict(STORED, schema_version=1)))
    proc = _doctor_cli("--plain", "--rejudge", str(saved), timeout=60)
    assert proc.returncode == 2 and "schema_version" in proc.stderr


# ------------------------------------------------------------------ rendering

def test_headline(stored):
    text = "\n".join(_render.headline(stored))
    s = stored["summary"]
    assert f"{s['dlb']['probes']} producer → consumer probes" in text
    assert "convert worse than the own importer: 1 (target 0)" in text
    assert "worse by deliberate decision: 1" in text
    assert f"{s['gap']} dlbridge gaps (exit status 1)" in text


def test_cell_colour_is_the_share_of_good_outcomes():
    def st(good, n, bad=0, gaps=0):
        return {"good": good, "n": n, "na": 0, "zero_copy": good, "bad": bad,
                "gaps": gaps}
    # not the worst probe: one refusal among 16 stays nearly green
    assert _render.colour(_render.share(st(15, 16))) != _render.colour(0.0)
    assert _render.colour(1.0) == "#2e9e44"
    # grey to green: the red channel falls with the share
    shades = [_render.colour(f / 10) for f in range(11)]
    reds = [int(c[1:3], 16) for c in shades]
    assert reds == sorted(reds, reverse=True) and len(set(shades)) == 11
    assert _render.cell_text(st(15, 16)) == "15/16"
    assert _render.cell_text(st(15, 16, gaps=1)) == "15/16*"
    assert _render.cell_text(st(15, 16, bad=1, gaps=1)) == "15/16!"


def test_plain_grid_fits_100_columns(stored):
    text = _render.plain(stored)
    assert max(len(line) for line in text.splitlines()) <= 100
    # 13 consumers: the grids are split into blocks of columns
    assert text.count("producer ↓") == 4
    assert "1/3!" in text          # numpy -> torch, own: crash, writable alias
    assert "1/3*" in text          # numpy -> torch, dlb: convert's gaps
    assert "dlbridge " in text     # names whole


def test_failure_list_by_label(stored):
    text = _render.failure_text(stored)
    assert text.index("dlbridge gaps") < text.index("deliberate dlbridge decisions")
    assert text.index("deliberate dlbridge decisions") < text.index("upstream limitations")
    assert "unknown target 'paddle'" in text


def test_rich_grid(stored):
    rich = pytest.importorskip("rich.console")
    console = rich.Console(width=100, record=True)
    _render.rich_grid(stored, console)
    out = console.export_text()
    assert "producer" in out and "convert worse than the own importer" in out


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
    assert 'class="cell"' in dom and 'class="cell gap"' in dom
    # every message of the cells is in a tooltip (title filled by script)
    import html as html_lib
    titles = html_lib.unescape(dom)
    for c in stored["cells"]:
        if c["outcome"] != "zero-copy" and c["message"]:
            assert c["message"] in titles, c
    shot = tmp_path / "grid.png"
    subprocess.run([browser, *flags, f"--screenshot={shot}",
                    "--window-size=1000,900", page.as_uri()],
                   capture_output=True, timeout=60, env=env)
    assert shot.exists() and shot.stat().st_size > 1000


# ------------------------------------------------------------------ real probes

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


def _cells(report, p, c, path):
    return {(x["dtype"], x["layout"]): x for x in report["cells"]
            if x["producer"] == p and x["consumer"] == c and x["path"] == path}


# What each pair must show, per (producer, consumer, path): outcome of every
# probe, by case; cases not listed must be zero-copy (torch 2.13, numpy 2.4).
NO_NUMPY_DTYPE = {("bfloat16", "contiguous"): "n/a",
                  **dict.fromkeys(FP8, "n/a")}
NO_TORCH_LAYOUT = {("float32", "negative"): "n/a", ("float32", "read-only"): "n/a"}
EXPECT = {
    ("numpy", "torch", "own"): {("float32", "negative"): "crashed",
                                ("float32", "read-only"): "writable-alias",
                                **NO_NUMPY_DTYPE},
    # convert copies what torch cannot hold safely (gh-17)
    ("numpy", "torch", "dlb"): {("float32", "negative"): "copied",
                                ("float32", "read-only"): "copied",
                                **NO_NUMPY_DTYPE},
    ("torch", "numpy", "own"): {("bfloat16", "contiguous"): "error",
                                **dict.fromkeys(FP8, "error"), **NO_TORCH_LAYOUT},
    ("torch", "numpy", "dlb"): {("bfloat16", "contiguous"): "refused",
                                **dict.fromkeys(FP8, "refused"), **NO_TORCH_LAYOUT},
    ("numpy", "dlbridge", "own"): NO_NUMPY_DTYPE,
    ("torch", "dlbridge", "dlb"): NO_TORCH_LAYOUT,   # float8 included: zero-copy
    ("dlbridge", "torch", "dlb"): {("float32", "negative"): "copied",
                                   ("float32", "read-only"): "copied"},
    ("dlbridge", "numpy", "own"): {("bfloat16", "contiguous"): "error",
                                   **dict.fromkeys(FP8, "error")},
}


@pytest.mark.parametrize("pair", sorted(EXPECT))
def test_cells_match_expectations(report, pair):
    cells = _cells(report, *pair)
    assert cells, pair
    for case, cell in cells.items():
        if case[0] in _doctor.FP8_DTYPES and case not in EXPECT[pair]:
            continue
        assert cell["outcome"] == EXPECT[pair].get(case, "zero-copy"), (case, cell)


def test_torch_negative_strides_crash_is_a_labelled_cell(report):
    cell = _cells(report, "numpy", "torch", "own")[("float32", "negative")]
    assert "signal" in cell["message"] and cell["phase"] == "import"
    assert cell["label"] == "upstream" and "negative strides" in cell["reason"]
    # the child was restarted: the probes after the crash still ran
    assert _cells(report, "numpy", "torch", "own")[("float32", "0-d")]["outcome"] == "zero-copy"


def test_crashing_producer_is_reported_not_fatal(report):
    crashed = [c for c in report["cells"] if c["producer"] == "crasher"]
    assert crashed and all(c["outcome"] == "crashed" for c in crashed)
    assert any("signal 6" in c["message"] for c in crashed)
    # it died making and exporting its tensor: its own fault
    assert {c["label"] for c in crashed} == {"upstream"}


def test_float8_is_probed_where_present(report):
    if "float8_e4m3fn" not in _doctor.DTYPES:
        pytest.skip("neither ml_dtypes nor torch installed")
    for case in FP8:
        assert _cells(report, "torch", "dlbridge", "own")[case]["outcome"] == "zero-copy"
        assert _cells(report, "dlbridge", "torch", "own")[case]["outcome"] == "zero-copy"
        assert _cells(report, "torch", "numpy", "dlb")[case]["label"] == "upstream"


def test_judged_run(report):
    """convert between numpy and torch has no gap since it copies what
    torch cannot hold safely (gh-17; the crasher stand-in's cells aside);
    nothing is worse than the own importer."""
    _doctor.validate(json.loads(json.dumps(report)))
    gaps = {(c["producer"], c["consumer"], c["layout"], c["path"])
            for c in report["defects"]
            if "crasher" not in (c["producer"], c["consumer"])}
    assert gaps == set()
    assert report["summary"]["worse_than_native"] == 0
    text = _render.plain(report)
    assert max(len(line) for line in text.splitlines()) <= 100
    n = 16 + len(FP8) * ("float8_e4m3fn" in _doctor.DTYPES)
    assert f"{n}/{n}" in text    # torch -> torch, all correct


def test_cli_json_and_plain_text(tmp_path):
    out = tmp_path / "r.json"
    proc = _doctor_cli("--frameworks", "numpy", "--plain", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "numpy" in proc.stdout and "dlbridge.convert" in proc.stdout
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
    assert got["float32", "offset", "own"]["outcome"] == "zero-copy"
    assert got["float32", "read-only", "dlb"]["outcome"] != "hung"   # the last
    assert len(cells) == 2 * len(_doctor.cases())
    _doctor.judge({"cells": cells})
    assert hung["label"] == "upstream"      # the framework's own importer
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
    cell = _raw("dlbridge", "torch", "float32", "negative", "own", "refused")
    on_gpu = dict(cell, producer="dlbridge:cuda", consumer="torch:cuda")
    assert _doctor.known_reason(on_gpu) == _doctor.known_reason(cell)


def test_rows_and_columns_come_from_the_kits(fake_kits):
    """Every installed framework with a kit is a producer; those with a
    DLPack importer are consumers too (PyArrow as well); a kit
    module named by $DLBRIDGE_DOCTOR_KITS adds frameworks without any other
    change."""
    table = _kits.kits()
    fws = _doctor.installed_frameworks(cuda=False)
    assert {c for c in _doctor.CANDIDATES
            if c in table and table[c].installed()} <= set(fws)
    assert {"crasher", "hanger", "stuck"} <= set(fws)
    assert all(table[f].installed() for f in fws)
    consumers = _doctor._consumers(fws)
    assert "crasher" not in consumers and "hanger" in consumers
    # pyarrow.Tensor.from_dlpack makes PyArrow a column wherever it is installed
    assert ("pyarrow" in consumers) == ("pyarrow" in fws)
    # the registry's order, dlbridge after every framework and peer with a
    # kit here, then the extra kits
    assert fws.index("dlbridge") == len(fws) - 4


def _copy_cell(consumer, layout, **extra):
    return dict(producer="numpy", consumer=consumer, dtype="float32",
                layout=layout, path="dlb", outcome="copied", message="",
                source_alignment=64, **extra)


def test_read_only_copy_for_a_writable_target_is_a_decision():
    """gh-17: TensorFlow's own importer shares PyArrow's read-only memory and
    its __dlpack__ hands it on writable; convert's copy is a documented
    decision, not a gap -- for a target whose registry entry says it cannot
    hold read-only data, and only for read-only sources."""
    cell = _copy_cell("tensorflow", "contiguous", read_only=True)
    assert "read-only" in _doctor._decision(cell)
    assert _doctor._decision(_copy_cell("tensorflow", "contiguous")) is None
    # NumPy holds read-only data: a copy there has no such excuse
    assert _doctor._decision(_copy_cell("numpy", "contiguous",
                                        read_only=True)) is None


def test_negative_stride_copy_for_paddle_is_a_decision():
    assert "negative strides" in _doctor._decision(_copy_cell("paddle", "negative"))
    assert "negative strides" in _doctor._decision(_copy_cell("torch", "negative"))
    # tvm-ffi takes negative strides: a copy there would have no excuse
    assert _doctor._decision(_copy_cell("tvm_ffi", "negative")) is None
