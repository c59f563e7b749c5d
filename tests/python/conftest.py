"""Shared fixtures for dlbridge's Python tests.

`_dlb_testproducer` is an independent DLPack producer written in C
(tests/python/_dlb_testproducer.c, built by Meson into build/src/python,
which `make test` puts on PYTHONPATH).  It is never installed, so tests that
need it are skipped, with the reason, when it cannot be imported.  dlbridge
itself must always be importable: it is not skipped.
"""

import gc

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

