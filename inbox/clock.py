"""The one clock every operation asks. Every operation takes `now`: tests pass it; production
omits it and the database decides.

Lease expiry, due timers and approval deadlines compare against one clock. On PostgreSQL
that is the server's, so a worker host whose clock is off by minutes cannot steal a lease
or fire a timer early. SQLite is embedded: its clock is this host's.

A test that drives code which passes no `now` pins the clock instead (`pin`, through
alwayson.testing's Clock), so time moves when the test moves it, never by sleeping. Nothing
in production pins it. One value for the whole process, not per thread: a live server's
threads read it too.

The backends (inbox/backends/) never consult the pin: every operation hands them
`in_statement(now)`, where None means the database reads its own clock.
"""

from datetime import UTC, datetime

from .backends import current
from .validation import require_now

_pinned: datetime | None = None


def resolve(now: datetime | None) -> datetime:
    """`now` as given (an aware datetime), or else the clock: a round trip on PostgreSQL,
    for an operation that needs the instant before its statements run."""
    return database_now() if now is None else require_now(now)


def in_statement(now: datetime | None) -> datetime | None:
    """`now` checked, or the pinned instant; None when neither, so the database reads its
    clock inside the operation's own statement (no round trip of its own)."""
    return _pinned if now is None else require_now(now)


def database_now() -> datetime:
    """The pinned instant, or else the database's clock."""
    return current().database_now() if _pinned is None else _pinned


def pinned() -> datetime | None:
    """The instant a test pinned, or None: the database's clock."""
    return _pinned


def pin(instant: datetime | None) -> None:
    """Hold every operation's clock at `instant` (an aware datetime); None lets it go."""
    global _pinned
    _pinned = None if instant is None else require_now(instant)


def whole_seconds(moment: datetime) -> datetime:
    """Timer instants are whole seconds, so an occurrence key built from one never drifts."""
    return moment.replace(microsecond=0)


def occurrence_label(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def day_start(moment: datetime) -> datetime:
    """Midnight UTC of `moment`'s day: where a daily budget starts counting."""
    return moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
