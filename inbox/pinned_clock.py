"""The instant a test holds the clock at, read wherever an operation is given no `now`.

Every operation takes `now`; omitted, the database's clock decides (inbox/clock.py). The
loop commands' steps and the pages never pass one, so a test that drives them
(alwayson.testing) pins the clock here instead, and every operation that would have read
the database's clock reads the pinned instant: timers fall due, approvals expire and the
outbox's gap passes when the test moves it, never by sleeping. Nothing in production pins
it. One value for the whole process, not per thread: a live server's threads read it too.
"""

from datetime import datetime

from .validation import require_now

_pinned: datetime | None = None


def pinned_now() -> datetime | None:
    """The pinned instant, or None: the database's clock."""
    return _pinned


def pin(instant: datetime | None) -> None:
    """Hold every operation's clock at `instant` (an aware datetime); None lets it go."""
    global _pinned
    _pinned = None if instant is None else require_now(instant)
