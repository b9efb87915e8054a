"""Every operation takes `now`. Tests pass it; production omits it and the database decides.

Lease expiry, due timers and approval deadlines compare against one clock. On PostgreSQL
that is the server's, so a worker host whose clock is off by minutes cannot steal a lease
or fire a timer early. SQLite is embedded: its clock is this host's.
"""

from datetime import UTC, datetime

from .backends import current
from .pinned_clock import pinned_now
from .validation import require_now


def database_now() -> datetime:
    """The database's clock, or the instant a test pinned (inbox/pinned_clock.py)."""
    pinned = pinned_now()
    return current().database_now() if pinned is None else pinned


def resolve(now: datetime | None) -> datetime:
    """`now` as given (an aware datetime), or the database's clock when it is None."""
    return database_now() if now is None else require_now(now)


def whole_seconds(moment: datetime) -> datetime:
    """Timer instants are whole seconds, so an occurrence key built from one never drifts."""
    return moment.replace(microsecond=0)


def occurrence_label(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def day_start(moment: datetime) -> datetime:
    """Midnight UTC of `moment`'s day: where a daily budget starts counting."""
    return moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
