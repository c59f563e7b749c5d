"""Shared fixtures for dlbridge's Python tests.

`_dlb_testproducer` is an independent DLPack producer written in C
(tests/python/_dlb_testproducer.c, built by Meson into build/src/python,
which `make test` puts on PYTHONPATH).  It is never installed, so tests that
need it are skipped, with the reason, when it cannot be imported.  dlbridge
itself must always be importable: it is not skipped.
"""

import gc
import os
import pathlib
import shutil
import subprocess

import pytest

try:
    import _dlb_testproducer as _tp
    _TP_ERROR = None
except ImportError as exc:  # pragma: no cover - depends on the build
    _tp = None
    _TP_ERROR = exc


@pytest.fixture
def tp():
    """The test producer module, with its counters zeroed.

    After the test, no deleter may have run twice or on a consumed or
    misnamed capsule's tensor: those calls are counted apart, as strays."""
    if _tp is None:
        pytest.skip(
            "_dlb_testproducer is not importable (%s): build it with "
            "`make build` and put build/src/python on PYTHONPATH" % _TP_ERROR)
    # Once TensorFlow or torch is imported the heap holds millions of
    # objects and a full gc.collect() costs ~0.5 s.  Freezing what exists
    # before the test moves it out of the collector's reach, so the collect
    # after the test only walks objects the test itself made -- which are the
    # ones whose deleters we count.
    gc.collect(0)
    gc.freeze()
    _tp.reset_counts()
    yield _tp
    gc.collect()
    assert _tp.stray_deleter_calls() == 0, (
        "a deleter ran twice on one tensor, or on the tensor of a consumed "
        "or misnamed capsule")


@pytest.fixture
def dlb():
    import dlbridge
    return dlbridge



ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def lib(tmp_path_factory):
    """Path of the example kernels library (examples/kernels/*.c): the Meson
    build's, else one compiled here so the Function tests run without it."""
    env = os.environ.get("DLB_EXAMPLE_KERNELS")
    if env:
        return env
    for build in ("build", "build-sanitize"):
        p = ROOT / build / "libdlb_example_kernels.so"
        if p.exists():
            return str(p)
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no built libdlb_example_kernels.so and no C compiler")
    out = tmp_path_factory.mktemp("kernels") / "libdlb_example_kernels.so"
    srcs = sorted(str(p) for p in (ROOT / "examples" / "kernels").glob("*.c"))
    srcs += sorted(str(p) for p in (ROOT / "src" / "core").glob("*.c"))
    subprocess.run([cc, "-shared", "-fPIC", "-std=c11", "-O1",
                    "-I" + str(ROOT / "include"), *srcs, "-o", str(out),
                    "-lm"],
                   check=True)
    return str(out)
