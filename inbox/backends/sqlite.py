"""SQLite: the portable forms (backends/base.py), with this host's clock, the busy timeout as
the bound of a wait for the database's write lock, and the insert.

SQLite is embedded: its clock is this host's, and an IMMEDIATE transaction takes the whole
database's write lock at BEGIN, so the inbox's lock is that one and no other writer runs
between a transaction's statements.
"""

import json
from contextlib import contextmanager

from django.db import connection, transaction

from ..models import Inbox
from ..store import Stored
from .base import Backend

# One row of INSERT_EVENTS's VALUES: the event as every new one starts.
_EVENT_ROW = "(%s, %s, %s, %s, 'pending', 0, NULL, '', %s, %s, %s)"

# The events of a chunk, each new key stored, a key already there skipped: the UNIQUE
# constraint decides. {rows}: _EVENT_ROW once per event of the chunk.
INSERT_EVENTS = """
INSERT INTO inbox_event (inbox_id, source, source_id, payload, status, attempts,
                         claim_gen, error, available_at, created, updated)
VALUES {rows}
ON CONFLICT (inbox_id, source, source_id) DO NOTHING
RETURNING id, source, source_id
"""

# The inbox's marker lowered to the new events' time when it has no earlier work.
MARK_WORK = """
UPDATE inbox_lease SET work_at = %s
WHERE inbox_id = %s AND (work_at IS NULL OR work_at > %s)
"""

# Well under SQLite's limit on parameters per statement (7 per event).
_CHUNK = 200


class SQLite(Backend):
    vendor = "sqlite"

    @contextmanager
    def bounded(self, wait):
        # The IMMEDIATE transaction takes the write lock at BEGIN: the wait is the busy
        # timeout's, set around the transaction (a nested block waits as its outer one did).
        bounded = wait is not None and not connection.in_atomic_block
        if bounded:
            restore = _busy_timeout(wait)
        try:
            with transaction.atomic():
                yield
        finally:
            if bounded:
                _busy_timeout(restore)

    def out_of_time(self, exc, wait):
        # SQLITE_BUSY after the busy timeout.
        if "database is locked" in str(exc):
            return f"its lock was not free within {wait:g}s"
        return None

    def store(self, ref, rows, now, lock_wait, text=None, trace=""):
        # Looked up even for an id: SQLite checks the foreign key only at commit, too late
        # for UnknownInbox.
        inbox_id = Inbox.objects.resolve(ref).pk
        now = self.at(now)
        with self.bounded_write(inbox_id, lock_wait):
            stored = _insert(inbox_id, rows, now)
            self.store_traces(stored, trace)
            return inbox_id, stored


def _insert(inbox_id, rows, now) -> list[Stored]:
    """Inside the IMMEDIATE transaction: it holds the write lock, so no other writer runs
    between the INSERT and the UPDATE."""
    at = connection.ops.adapt_datetimefield_value(now)
    stored = []
    for start in range(0, len(rows), _CHUNK):
        chunk = rows[start : start + _CHUNK]
        params = []
        for source, source_id, payload in chunk:
            params += [inbox_id, source, source_id, json.dumps(payload), at, at, at]
        with connection.cursor() as cursor:
            cursor.execute(INSERT_EVENTS.format(rows=", ".join([_EVENT_ROW] * len(chunk))), params)
            stored += [Stored(pk, source, source_id, now) for pk, source, source_id in cursor]
    if stored:
        with connection.cursor() as cursor:
            cursor.execute(MARK_WORK, [at, inbox_id, at])
    return stored


def _busy_timeout(seconds: float) -> float:
    """Set the connection's busy timeout; the previous one, in seconds."""
    connection.ensure_connection()
    raw = connection.connection
    previous = raw.execute("PRAGMA busy_timeout").fetchone()[0] / 1000
    raw.execute(f"PRAGMA busy_timeout = {round(seconds * 1000)}")
    return previous
