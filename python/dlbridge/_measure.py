"""Per-call timing: the one implementation behind `dlbridge bench` and the
scripts in bench/ (bench_calls.py imports it from the installed package).

How a figure is taken, and why:

* A statement is compiled by ``timeit`` into a loop over *local* variables
  (bound in the loop's setup from a dict), unrolled ``unroll`` times so the
  loop's own cost is small next to calls of 50 ns.  Every figure carries the
  same loop overhead, so a difference ("overhead over the no-op") cancels it
  and a ratio is conservative.
* The loop count is calibrated once so one timed run lasts about
  ``target_s``; a median over ``repeats`` runs is one round.
* The rounds of all cases measured together are interleaved (round 1 of
  every case, then round 2 ...): a burst of load from elsewhere on the
  machine then hits one round of many cases instead of every round of one,
  and the figures a ratio compares were taken under the same conditions.
  The best round is kept (load only ever adds time).
* The garbage collector is off while timing (``timeit`` turns it off for
  its own runs; self-timed C loops are covered by ``measure``).

Nothing here imports a framework; nothing asserts a time.
"""

import gc
import statistics
import timeit
from typing import NamedTuple


class Settings(NamedTuple):
    rounds: int      # interleaved rounds; the best median is kept
    repeats: int     # timed runs per round; their median is the round's
    target_s: float  # length of one timed run


#: `dlbridge bench --quick`: enough to see orders of magnitude, in seconds.
QUICK = Settings(rounds=2, repeats=3, target_s=0.002)
#: `dlbridge bench`: steady within a few percent on an idle machine.
DEFAULT = Settings(rounds=3, repeats=5, target_s=0.01)
#: `dlbridge bench --full`.
FULL = Settings(rounds=7, repeats=5, target_s=0.02)


def why(exc, limit=90):
    """One line naming an exception, for a figure that was not measured."""
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:limit]


def num(*values):
    """True when every value is a measured figure (not an error text)."""
    return all(isinstance(v, float) for v in values)


class Case:
    """One statement to time, ``names`` bound as locals of the timed loop.

    ``ns()`` is nanoseconds per execution of ``stmt``.  Subclasses set
    ``unroll = 1`` for statements that take milliseconds (a copy), where
    the loop's cost is nothing and unrolling only lengthens a run."""

    unroll = 10

    def __init__(self, stmt, **names):
        setup = "; ".join(f"{k} = __ns[{k!r}]" for k in names) or "pass"
        self.stmt, self.names = stmt, names
        self.timer = timeit.Timer("; ".join([stmt] * self.unroll), setup,
                                  globals={"__ns": names})
        self.number = 0
        self.medians = []

    def check(self):
        """Run the statement once, untimed: it must work at all (raises)."""
        exec(self.stmt, {}, dict(self.names))

    def calibrate(self, target_s):
        """Grow the loop count until one run takes about ``target_s``."""
        number = 1
        while True:
            t = self.timer.timeit(number)
            if t >= target_s / 4:
                break
            number *= 4
        self.number = max(1, int(number * target_s / t))

    def round(self, repeats):
        runs = self.timer.repeat(repeats, self.number)
        self.medians.append(statistics.median(runs))

    def ns(self):
        return min(self.medians) / (self.number * self.unroll) * 1e9


class CopyCase(Case):
    """A statement of milliseconds (a large copy): no unrolling."""

    unroll = 1


class SelfTimed(Case):
    """A C loop that times itself: ``loop(*args, n)`` runs the measured
    work n times and returns nanoseconds per iteration, so the cost is seen
    without any Python call overhead (bench/_noop.c's exchange_loop)."""

    def __init__(self, loop, *args):
        names = {f"a{i}": a for i, a in enumerate(args)}
        call = ", ".join(list(names) + ["1"])
        super().__init__(f"loop({call})", loop=loop, **names)
        self.args = args

    def calibrate(self, target_s):
        t = self.names["loop"](*self.args, 1000)
        self.number = max(1000, int(target_s * 1e9 / max(t, 1.0)))

    def round(self, repeats):
        loop = self.names["loop"]
        self.medians.append(statistics.median(
            loop(*self.args, self.number) for _ in range(repeats)))

    def ns(self):
        return min(self.medians)


def measure(cases, settings=DEFAULT):
    """{key: Case | str | None} -> {key: ns per call | str | None}.

    A str value is a reason the case was not measured and is passed
    through, as is None; a case whose statement raises gets its error text
    instead of a figure.  The rounds of all live cases are interleaved."""
    out, live = {}, {}
    for key, case in cases.items():
        if case is None or isinstance(case, str):
            out[key] = case
            continue
        try:
            case.check()
            case.calibrate(settings.target_s)
        except Exception as e:  # a figure we cannot take is reported, not fatal
            out[key] = why(e, 160)
            continue
        live[key] = case
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(settings.rounds):
            for case in live.values():
                case.round(settings.repeats)
    finally:
        if was_enabled:
            gc.enable()
    for key, case in live.items():
        out[key] = case.ns()
    return out


def cpu_model():
    """The CPU's model name (/proc/cpuinfo), else the platform's guess."""
    import platform
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"
