"""Storing events: the insert, the duplicate check, the inbox's work marker and the wake-up.

On PostgreSQL it is one statement (a data-modifying WITH), so an ingest outside a transaction
is one round trip and one commit. In the order the statement runs:

1. `fresh`: the keys not already stored as of the statement's snapshot. When there are none
   (the sender's retry of a stored delivery) nothing below runs: no lock, no write, no
   transaction id, no WAL flush; the answer is "duplicate", and it is right, because a
   visible row is a committed row.
2. `lease`: the inbox's lease row FOR UPDATE, before any event row is written, the lock order
   of every other writer (services.py). A finish that holds it commits first, and FOR UPDATE
   then returns the row as that finish left it (work_at included).
3. `stored`: INSERT ... ON CONFLICT DO NOTHING: the UNIQUE constraint decides, against rows
   committed meanwhile too; no exception, no savepoint.
4. `marked`: work_at lowered to the events' time when the locked row (not the statement's
   older snapshot, which may predate a finish's recount) has no earlier work.
5. pg_notify when the marker moved (the inbox had no earlier work), sent at commit. An
   inbox whose marker already stood has been announced, or is held by a worker that looks
   for more work when its run ends; and a NOTIFY is not free: PostgreSQL serialises the
   commits of notifying transactions database-wide, which would undo group commit for
   concurrent deliveries.

A finish recounts work_at under the same lock: an ingest either committed before the finish
took the lock (the recount, a later statement, sees its event) or waits for the finish to
commit and then marks the work on the row the finish left. Either way no event is left
pending without a marker.

SQLite has no data-modifying WITH: there it is the same INSERT ... ON CONFLICT DO NOTHING
RETURNING and a conditional UPDATE, in one IMMEDIATE transaction.
"""

import json
from dataclasses import dataclass
from datetime import datetime

import psycopg
from django.db import connection

from .exceptions import UnknownInbox
from .models import Event, Inbox, Lease
from .validation import UNSTORABLE

# Idle workers LISTEN here; a stored event NOTIFYs with its inbox id (sent at commit).
WORK_CHANNEL = "alwayson_work"


@dataclass(frozen=True)
class Stored:
    """An event row the statement inserted."""

    id: int
    source: str
    source_id: str
    at: datetime


def inbox_lookup(ref) -> tuple[str, object]:
    """The column and value naming the inbox `ref` (an Inbox, an id or a slug)."""
    if isinstance(ref, Inbox):
        return "id", ref.pk
    if isinstance(ref, int) and not isinstance(ref, bool):
        return "id", ref
    # A slug PostgreSQL cannot even compare (a NUL) names no inbox, as in Inbox.objects.resolve.
    if isinstance(ref, str) and ref and not UNSTORABLE.search(ref):
        return "slug", ref
    raise UnknownInbox(ref)


def _table(model) -> str:
    return connection.ops.quote_name(model._meta.db_table)


class _PreparingCursor(psycopg.Cursor):
    # Prepared at their first run, not after psycopg's threshold: only the hot paths' few
    # statements come here. Django leaves preparing off altogether (prepare_threshold None,
    # for poolers) unless settings turn it on (ALWAYSON_DB_PREPARE); then this asks in vain
    # and the statement runs unprepared, as Django's own do.
    def execute(self, query, params=None, *, prepare=True, binary=None):
        return super().execute(query, params, prepare=prepare, binary=binary)

    def _send_query_prepared(self, name, pgq, *, binary=None):
        # psycopg records the query it ran only when it sends it unprepared; Django's
        # last_executed_query reads it (CaptureQueriesContext, the SQL log under DEBUG).
        self._query = pgq
        return super()._send_query_prepared(name, pgq, binary=binary)


def prepared_cursor():
    """A cursor binding its parameters on the server, so psycopg prepares the statement
    after a few runs and PostgreSQL plans it once per connection (Django's own cursors
    inline parameters, and every statement is planned again). Wrapped by Django as its own
    cursors are: counted by CaptureQueriesContext, logged under DEBUG. On SQLite, Django's
    own cursor (its statements are cached by the driver already)."""
    if connection.vendor != "postgresql":
        return connection.cursor()
    connection.ensure_connection()
    return connection._prepare_cursor(_PreparingCursor(connection.connection))


def insert_pg(ref, rows, now, lock_wait) -> tuple[int, list[Stored]]:
    """Store `rows` ((source, source_id, payload), keys distinct) in inbox `ref`: its id and
    the rows stored, in one statement. `now` None: the database's clock, read in the
    statement. `lock_wait` (seconds or None) bounds the wait for the lease row's lock."""
    column, value = inbox_lookup(ref)
    params = {
        "inbox": value,
        "sources": [source for source, _, _ in rows],
        "source_ids": [source_id for _, source_id, _ in rows],
        "payloads": [json.dumps(payload) for _, _, payload in rows],
        "now": now,
        "channel": WORK_CHANNEL,
    }
    # set_config(..., true) lasts until the transaction ends. `lease` joins `bound`, so the
    # timeout is in force before the row lock is requested.
    bound, bound_join = "", ""
    if lock_wait is not None:
        params["lock_timeout"] = f"{round(lock_wait * 1000)}ms"
        bound = "bound AS (SELECT set_config('lock_timeout', %(lock_timeout)s, true) AS v),"
        bound_join = ", bound"
    clock = "%(now)s::timestamptz" if now is not None else "clock_timestamp()"
    inbox, event, lease = _table(Inbox), _table(Event), _table(Lease)
    sql = f"""
        WITH target AS (
            SELECT id FROM {inbox} WHERE {column} = %(inbox)s
        ), batch AS (
            SELECT * FROM unnest(%(sources)s::text[], %(source_ids)s::text[],
                                 %(payloads)s::text[])
                WITH ORDINALITY AS b(source, source_id, payload, n)
        ), fresh AS (
            SELECT b.* FROM batch b, target t WHERE NOT EXISTS (
                SELECT 1 FROM {event} e
                WHERE e.inbox_id = t.id AND e.source = b.source AND e.source_id = b.source_id
            )
        ), {bound} lease AS (
            SELECT l.inbox_id, l.work_at FROM {lease} l, target t{bound_join}
            WHERE l.inbox_id = t.id AND EXISTS (SELECT 1 FROM fresh)
            FOR UPDATE OF l
        ), clock AS (
            SELECT {clock} AS now
        ), stored AS (
            INSERT INTO {event} (inbox_id, source, source_id, payload, status, attempts,
                                 claim_gen, error, available_at, created, updated)
            SELECT l.inbox_id, f.source, f.source_id, f.payload::jsonb, 'pending', 0,
                   NULL, '', c.now, c.now, c.now
            FROM lease l, clock c, fresh f ORDER BY f.n
            ON CONFLICT (inbox_id, source, source_id) DO NOTHING
            RETURNING id, source, source_id, available_at
        ), marked AS (
            UPDATE {lease} m SET work_at = s.first
            FROM (SELECT min(available_at) AS first FROM stored) s, lease k
            WHERE m.inbox_id = k.inbox_id AND s.first IS NOT NULL
              AND (k.work_at IS NULL OR k.work_at > s.first)
            RETURNING m.inbox_id
        )
        SELECT t.id, s.id, s.source, s.source_id, s.available_at,
               (SELECT pg_notify(%(channel)s, inbox_id::text)::text FROM marked)
        FROM target t LEFT JOIN stored s ON true
    """
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        result = cursor.fetchall()
    if not result:
        raise UnknownInbox(ref)
    stored = [Stored(pk, source, source_id, at) for _, pk, source, source_id, at, _ in result if pk]
    return result[0][0], stored


def insert_sqlite(inbox_id, rows, now) -> list[Stored]:
    """The same on SQLite, inside the caller's IMMEDIATE transaction (it holds the write
    lock, so no other writer runs between the INSERT and the UPDATE)."""
    at = connection.ops.adapt_datetimefield_value(now)
    event, lease = _table(Event), _table(Lease)
    stored = []
    # Well under SQLite's limit on parameters per statement.
    for start in range(0, len(rows), 200):
        chunk = rows[start : start + 200]
        values = ", ".join(["(%s, %s, %s, %s, 'pending', 0, NULL, '', %s, %s, %s)"] * len(chunk))
        params = []
        for source, source_id, payload in chunk:
            params += [inbox_id, source, source_id, json.dumps(payload), at, at, at]
        with connection.cursor() as cursor:
            cursor.execute(
                f"""INSERT INTO {event} (inbox_id, source, source_id, payload, status, attempts,
                        claim_gen, error, available_at, created, updated)
                    VALUES {values}
                    ON CONFLICT (inbox_id, source, source_id) DO NOTHING
                    RETURNING id, source, source_id""",
                params,
            )
            stored += [Stored(pk, source, source_id, now) for pk, source, source_id in cursor]
    if stored:
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {lease} SET work_at = %s "
                "WHERE inbox_id = %s AND (work_at IS NULL OR work_at > %s)",
                [at, inbox_id, at],
            )
    return stored


def as_event(inbox_id, row: Stored, payload) -> Event:
    """The Event a stored row is, without reading it back (for event_stored's receivers)."""
    event = Event(
        id=row.id,
        inbox_id=inbox_id,
        source=row.source,
        source_id=row.source_id,
        payload=payload,
        status=Event.Status.PENDING,
        attempts=0,
        error="",
        available_at=row.at,
        created=row.at,
        updated=row.at,
    )
    event._state.adding = False
    event._state.db = connection.alias
    return event
