"""The inbox's lock (its lease row) for writers, and the bounded wait for it.

Every write that touches an inbox's events or what a run produced locks that row first
(SELECT ... FOR UPDATE on PostgreSQL; on SQLite the IMMEDIATE transaction already holds the
database's write lock), so the rows beneath it are always locked in the same order and two
writers on one inbox can never deadlock.
"""

from contextlib import contextmanager

from . import clock
from .backends import current
from .models import Lease


def lock_inbox(inbox_id) -> Lease:
    """Take the inbox's lock (its lease row) for the rest of the current transaction.

    For writers above inbox/ that decide from rows of their own before they store an event
    (answer_approval): read after this, those rows include every write committed by the
    others, who take the same lock first.
    """
    return current().lock(inbox_id)


@contextmanager
def bounded_write(inbox_id, wait: float | None):
    """A transaction on one inbox whose wait for that inbox's lock is bounded: InboxBusy
    after `wait` seconds (None: the database's own timeouts). For deliveries and people's
    answers: a frozen worker holds the lease row longer than a webhook sender waits
    (docs/explanation/design.md, "A frozen lock holder is bounded twice")."""
    with current().bounded_write(inbox_id, wait):
        yield


@contextmanager
def locked_write(inbox, wait: float | None, now=None, then=()):
    """bounded_write on `inbox` with its lock taken first, `now` resolved once the lock is
    granted, then the reads `then` ((sql, params)): yields (the inbox's id, now, the rows of
    each read). For writers above inbox/ that decide by the clock from rows read under the
    lock (a person's answer: its request, its deadline).
    """
    with current().locked_write(inbox, wait, clock.in_statement(now), then) as locked:
        yield locked


def write_in_one(inbox, sql: str, params: dict, wait: float | None) -> dict | None:
    """On PostgreSQL, a write above inbox/ stated as one statement that takes the inbox's
    lock itself, first, its wait bounded by `params["lock_timeout"]` (lock_timeout(wait)):
    its first row, or None; InboxBusy past `wait`, rolled back. For a hot write whose round
    trips under locked_write cost more than its statements (approvals/sql/answer.sql)."""
    return current().write_in_one(inbox, sql, params, wait)


def lock_timeout(wait: float | None) -> str | None:
    """The lock_timeout setting that bounds a wait of `wait` seconds (None: unbounded), for
    a statement given to write_in_one."""
    return current().lock_timeout(wait)
