"""The dlbridge hop both outside suites put between a producer and a
consumer, and its bookkeeping (tests/outside/run.py reads the counts).

into(consume, x): consume(dlb.from_dlpack(x)) -- the consumer imports
dlbridge's export of whatever dlbridge imported.  When dlbridge refuses x,
the consumer is asked for x itself: if it refuses too, the test sees the
consumer's own error (the suites check their consumers' messages, which
dlbridge does not imitate); if it reads x, dlbridge has a gap, which is
recorded and raised as dlbridge's error, so the test fails.

out_of(capsule): a producer's capsule through dlbridge and out again as
dlbridge's capsule; a refusal there is always a gap.
"""
import dlbridge as dlb

routed = 0
gaps = []


def into(consume, x, where, **dlb_kwargs):
    global routed
    try:
        t = dlb.from_dlpack(x, **dlb_kwargs)
    except Exception as refusal:
        try:
            consume(x)
        except Exception:
            raise  # both refuse: the consumer's error is the one tested
        gaps.append(f"{where}: dlbridge refused what the consumer reads: "
                    f"{type(refusal).__name__}: {refusal}")
        raise refusal
    routed += 1
    return consume(t)


def out_of(capsule, where, **export_kwargs):
    global routed
    try:
        t = dlb.from_dlpack(capsule)
        routed += 1
        return t.__dlpack__(**export_kwargs)
    except Exception as e:
        gaps.append(f"{where}: {type(e).__name__}: {e}")
        raise


def report():
    return {"routed": routed, "gaps": list(gaps)}
