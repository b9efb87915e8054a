"""The clock of a test: one instant that every operation reads, moved only by the test.

Every operation takes `now`, and the loop commands' steps and the pages pass none: they read
the database's clock. A `Clock` pins that reading (inbox/clock.py `pin`) for as long as it
runs, so the worker, the scheduler, the dispatcher, an answer's deadline check and a
webhook's timestamp check all see the test's instant, on SQLite and PostgreSQL alike.
"""

from datetime import datetime, timedelta

from inbox import clock as inbox_clock


def duration(delta=None, /, **units) -> timedelta:
    """`delta` (a timedelta or seconds) or timedelta's keywords (hours=4); never negative:
    the database's rows (leases, sends, deadlines) only make sense with time going forward."""
    if delta is not None and units:
        raise ValueError("give a timedelta or keywords such as hours=4, not both")
    if delta is None:
        delta = timedelta(**units)
    elif isinstance(delta, int | float) and not isinstance(delta, bool):
        delta = timedelta(seconds=delta)
    if not isinstance(delta, timedelta):
        raise ValueError(f"a duration is a timedelta or seconds, not {delta!r}")
    if delta < timedelta(0):
        raise ValueError(f"time only moves forward in a test, not by {delta}")
    return delta


class Clock:
    """Pinned from `start()` to `stop()`. It starts at the database's clock (whole seconds),
    so rows written before the test and the database's own `now()` are never in its future."""

    def __init__(self, start: datetime | None = None):
        self._start = start
        self.now: datetime | None = None

    def start(self) -> "Clock":
        if inbox_clock.pinned() is not None:
            raise RuntimeError("the clock is pinned already: one Clock (one harness) at a time")
        moment = self._start or inbox_clock.database_now().replace(microsecond=0)
        self._set(moment)
        return self

    def stop(self):
        """Let the clock go; `now` keeps the last instant."""
        inbox_clock.pin(None)

    def jump(self, delta=None, /, **units) -> datetime:
        """Move the clock forward and run nothing: an outage, a stopped scheduler. Use the
        harness's `advance` to let what falls due on the way happen."""
        return self.travel_to(self.now + duration(delta, **units))

    def travel_to(self, moment: datetime) -> datetime:
        if moment < self.now:
            raise ValueError(f"time only moves forward in a test: {moment} is before {self.now}")
        self._set(moment)
        return moment

    def _set(self, moment):
        inbox_clock.pin(moment)
        self.now = moment

    def __repr__(self):
        return f"<Clock {self.now}>"
