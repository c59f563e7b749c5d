"""The launch counter of examples/kernels/batch.c, one reader for every
batch test: each kernel there that passes its contract checks adds one to
``dlb_example_batch_calls`` and stores ``[R, B0, ..., B(R-1)]`` (its batch
rank and broadcast batch shape) in ``dlb_example_batch_last``."""

import ctypes

MAX_BATCH = 16


def batch_counters(so):
    """(kernel calls so far, the last call's batch shape B) of the loaded
    library ``so`` (a ctypes.CDLL)."""
    calls = ctypes.c_int64.in_dll(so, "dlb_example_batch_calls").value
    last = (ctypes.c_int64 * (1 + MAX_BATCH)).in_dll(
        so, "dlb_example_batch_last")
    return calls, tuple(last[1:1 + last[0]])


class Counted:
    """``with Counted(k) as c: ...``; then ``c.calls`` is how many kernel
    calls the block made and ``c.last`` the batch shape of the last one.
    ``k`` is anything with ``counters()`` returning batch_counters' pair."""

    def __init__(self, k):
        self.k = k

    def __enter__(self):
        self.before, _ = self.k.counters()
        return self

    def __exit__(self, *exc):
        after, self.last = self.k.counters()
        self.calls = after - self.before
