"""Storing events: the insert, the duplicate check, the inbox's work marker and the wake-up.

On PostgreSQL it is one statement (a data-modifying WITH), so an ingest outside a transaction
is one round trip and one commit. In the order the statement runs:

1. `fresh`: the keys not already stored as of the statement's snapshot. When there are none
   (the sender's retry of a stored delivery) nothing below runs: no lock, no write, no
   transaction id, no WAL flush; the answer is "duplicate", and it is right, because a
   visible row is a committed row.
2. `lease`: the inbox's lease row locked, before any event row is written, the lock order
   of every other writer (services.py). A finish that holds it commits first, and the lock
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

The lock is FOR UPDATE when the marker must move, and FOR SHARE when it already stands at
or before the event's time and the statement is its own transaction (insert_one_pg, an
ingest outside any transaction): deliveries to one inbox then hold the row together and
their commits flush the WAL together, where FOR UPDATE would queue each behind the last
one's flush. The rule above still holds, because FOR SHARE conflicts with every writer's
FOR UPDATE: a finish waits for the sharers to commit before it recounts, and a sharer that
waited for a finish gets the row as the finish left it. That row is checked again (work_at
at or before the event's time), and when the finish moved the marker the statement stores
nothing and runs again with FOR UPDATE: a sharer never writes the row, so no two sharers
wait to upgrade each other's lock. Inside a caller's transaction it is always FOR UPDATE: a
later FOR UPDATE of the same row there would wait on the other sharers, and they, for a key
this transaction inserted, on it.

One event outside a transaction (insert_one_pg) first tries the common case alone (TRY):
the marker stands and no writer holds the row. It is one INSERT ... SELECT whose SELECT
takes the lease row FOR SHARE SKIP LOCKED, so it never waits and sets no lock timeout, and
has the fewest plan nodes a delivery can cost the server. Any other case (no marker yet, a
finish or a worker's take holding the row, a key stored since the statement's snapshot)
comes back as "again", having written nothing, and the statement above runs: the first
delivery to an idle inbox is two statements and one commit.

One event's statements are prepared, with scalar parameters: their generic plan is one
probe of each key whatever the tables' sizes (see Event.inbox on the index it has not). The
TRY statement runs through libpq itself (_Direct). A batch's (insert_pg) is planned each
time: its plan depends on the batch's size.

SQLite has no data-modifying WITH: there it is the same INSERT ... ON CONFLICT DO NOTHING
RETURNING and a conditional UPDATE, in one IMMEDIATE transaction.
"""

import functools
import itertools
import json
import re
import weakref
from datetime import datetime
from typing import NamedTuple

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init
from psycopg import pq
from psycopg.adapt import Transformer

from .exceptions import UnknownInbox
from .models import Event, Inbox, Lease
from .validation import UNSTORABLE

# Idle workers LISTEN here; a stored event NOTIFYs with its inbox id (sent at commit).
WORK_CHANNEL = "alwayson_work"


class Stored(NamedTuple):
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


# psycopg prepares nothing while the connection's threshold is None (Django's default, for
# poolers), even when asked to: a threshold no count ever reaches lets a statement ask.
_ONLY_WHEN_ASKED = 2**62


class _PreparingCursor(psycopg.Cursor):
    # Django turns psycopg's automatic preparing off for the whole connection (for poolers);
    # these statements ask for it themselves, unless ALWAYSON_DB_PREPARE is off. The threshold
    # is lifted for their execution only: while it is set, psycopg also counts every other
    # statement the connection runs.
    def execute(self, query, params=None, *, prepare=True, binary=None):
        conn = self.connection
        if conn.prepare_threshold is not None or not settings.ALWAYSON_DB_PREPARE:
            return super().execute(query, params, prepare=prepare, binary=binary)
        conn.prepare_threshold = _ONLY_WHEN_ASKED
        try:
            return super().execute(query, params, prepare=prepare, binary=binary)
        finally:
            conn.prepare_threshold = None

    def _send_query_prepared(self, name, pgq, *, binary=None):
        # psycopg records the query only when it sends its text; Django reads it back for
        # CaptureQueriesContext and the DEBUG log, and would see None once it is prepared.
        self._query = pgq
        return super()._send_query_prepared(name, pgq, binary=binary)


def prepared_cursor():
    """A cursor binding its parameters on the server, so psycopg prepares the statement
    and PostgreSQL parses it once per connection (Django's own cursors inline parameters,
    and every statement is parsed and planned again). Wrapped by Django as its own cursors
    are: counted by CaptureQueriesContext, logged under DEBUG. On SQLite, Django's own
    cursor (the driver caches its statements already)."""
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor != "postgresql":
        return db.cursor()
    db.ensure_connection()
    return db._prepare_cursor(_PreparingCursor(db.connection))


# Each connection's cursor for insert_one_pg, kept between calls (the connection's own
# object: a new connection gets a new one).
_one_cursors = weakref.WeakKeyDictionary()


def _fetch_one(db, sql, params):
    """The first row `sql` answers, prepared on `db` (the default connection, connected).
    Through Django's cursor wrapper while something watches the queries
    (CaptureQueriesContext, DEBUG, an execute wrapper); otherwise on a cursor kept for the
    connection, with what the wrapper would have done that matters here: the
    broken-transaction check and Django's exceptions."""
    if db.queries_logged or db.execute_wrappers:
        with prepared_cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()
    cursor = _kept(_one_cursors, db, _PreparingCursor)
    with db.wrap_database_errors:
        cursor.execute(sql, params)
        return cursor.fetchone()


def _kept(kept, db, make):
    """What `make` builds for db's connection, built once per connection (`kept` is keyed
    by psycopg's connection object: a new connection gets a new one), after the check
    Django's cursor wrapper would make: no statement in a broken transaction."""
    db.validate_no_broken_transaction()
    raw = db.connection
    value = kept.get(raw)
    if value is None:
        value = kept[raw] = make(raw)
    return value


_NAMED = re.compile(r"%\((\w+)\)s")
# Numbers the statements _Direct prepares, unique in the process (psycopg's own are _pg3_N).
_statement_numbers = itertools.count()


class _Direct:
    """One connection's statements run through libpq itself (psycopg's pq layer), for the
    statement every delivery runs (insert_one_pg's TRY): prepared once by name, then each
    call is one PQexecPrepared, its row loaded by the connection's own loaders. psycopg's
    cursor (its query conversion, dumpers, wait loop and result handling in Python) cost
    about 0.06 ms of client CPU per delivery under eight concurrent deliveries on two cores,
    a third of what the server spends on the statement; under load that CPU is what bounds
    deliveries per second (bench/ingest.py).

    The call blocks in C, without the GIL. TRY never waits on the lease row (SKIP LOCKED):
    only, briefly, on a concurrent insert of the same key or at commit on the inbox row (its
    foreign key), within the session's lock_timeout. Errors are Django's, as through its
    cursors."""

    def __init__(self, raw):
        self.raw = raw
        self.statements = {}  # sql -> (its name on the server, its parameters in order)
        self.loader = Transformer(raw)

    def _prepare(self, sql):
        names = []

        def number(match):
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        name = f"alwayson_{next(_statement_numbers)}".encode()
        text = _NAMED.sub(number, sql).replace("%%", "%")
        result = self.raw.pgconn.prepare(name, text.encode())
        if result.status != pq.ExecStatus.COMMAND_OK:
            raise psycopg.errors.error_from_result(result, encoding=self.raw.info.encoding)
        self.statements[sql] = name, names
        return name, names

    def fetch_one(self, sql, params):
        for retrying in (False, True):
            name, names = self.statements.get(sql) or self._prepare(sql)
            values = [_text(params[key]) for key in names]
            result = self.raw.pgconn.exec_prepared(name, values, result_format=pq.Format.BINARY)
            if result.status == pq.ExecStatus.TUPLES_OK:
                if not result.ntuples:
                    return None
                self.loader.set_pgresult(result)
                return self.loader.load_row(0, tuple)
            if not retrying and result.error_field(pq.DiagnosticField.SQLSTATE) == b"26000":
                # A pooler's DISCARD ALL dropped it (invalid_sql_statement_name): again.
                del self.statements[sql]
                continue
            raise psycopg.errors.error_from_result(result, encoding=self.raw.info.encoding)


def _text(value) -> bytes | None:
    """A parameter in PostgreSQL's text format (the server infers its type)."""
    if value is None:
        return None
    if type(value) is str:
        return value.encode()
    if isinstance(value, datetime):
        return value.isoformat().encode()
    return str(value).encode()


_directs = weakref.WeakKeyDictionary()


def _fetch_direct(db, sql, params):
    """_fetch_one through _Direct when it may be used: nothing watches the queries and
    statements may be prepared (ALWAYSON_DB_PREPARE)."""
    if db.queries_logged or db.execute_wrappers or not settings.ALWAYSON_DB_PREPARE:
        return _fetch_one(db, sql, params)
    direct = _kept(_directs, db, _Direct)
    with db.wrap_database_errors:
        return direct.fetch_one(sql, params)


def _server_cursor():
    """A cursor binding its parameters on the server, prepared only if psycopg's threshold
    says so (never, under Django's default)."""
    connection.ensure_connection()
    return connection._prepare_cursor(psycopg.Cursor(connection.connection))


def _bound(lock_wait, params) -> tuple[str, str]:
    """The CTE setting the lock timeout, and the join that puts it before the row lock:
    set_config(..., true) lasts until the transaction ends."""
    if lock_wait is None:
        return "", ""
    params["lock_timeout"] = f"{round(lock_wait * 1000)}ms"
    return "bound AS (SELECT set_config('lock_timeout', %(lock_timeout)s, true) AS v),", ", bound"


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
    # `lease` joins `bound`, so the timeout is in force before the row lock is requested.
    bound, bound_join = _bound(lock_wait, params)
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
    # Not prepared: a generic plan, made once for a batch of unknown size, would keep
    # whatever join the table's size favoured then (a hash of the whole table, on a new one).
    with _server_cursor() as cursor:
        cursor.execute(sql, params)
        result = cursor.fetchall()
    if not result:
        raise UnknownInbox(ref)
    stored = [Stored(pk, source, source_id, at) for _, pk, source, source_id, at, _ in result if pk]
    return result[0][0], stored


_ONE_SQL = {}

# insert_one_pg's ways of locking the lease row, in the order a statement of its own tries
# them (inside a caller's transaction only the last): take the shared lock without waiting;
# wait for it; lock the row alone.
TRY, SHARE, EXCLUSIVE = "try", "share", "exclusive"


def _one_sql(column, given_now, bounded, mode) -> str:
    """insert_one_pg's statement, built once per variant (the same text each time, so psycopg
    finds its prepared statement)."""
    key = (column, given_now, bounded, mode)
    if key not in _ONE_SQL:
        _ONE_SQL[key] = (
            _try_sql(column, given_now)
            if mode == TRY
            else _locking_sql(column, given_now, bounded, shared=mode == SHARE)
        )
    return _ONE_SQL[key]


def _try_sql(column, given_now) -> str:
    # The common case, alone: the marker stands and no writer holds the row. SKIP LOCKED
    # never waits, so no lock timeout to set. One INSERT ... SELECT, the fewest plan nodes
    # (each costs the server on every delivery); a second branch, run only when nothing was
    # stored, says why: a duplicate (again false), or anything else (again true). No row at
    # all: no such inbox. The clock is the statement's: it is its own transaction.
    clock = "%(now)s::timestamptz" if given_now else "statement_timestamp()"
    inbox, event, lease = _table(Inbox), _table(Event), _table(Lease)
    if column == "id":
        rows = f"{lease} l WHERE l.inbox_id = %(inbox)s"
    else:
        rows = f"{lease} l JOIN {inbox} i ON i.id = l.inbox_id WHERE i.{column} = %(inbox)s"
    stored_already = f"""EXISTS (
                SELECT 1 FROM {event} e WHERE e.inbox_id = l.inbox_id
                AND e.source = %(source)s AND e.source_id = %(source_id)s)"""
    return f"""
        WITH stored AS (
            INSERT INTO {event} (inbox_id, source, source_id, payload, status, attempts,
                                 claim_gen, error, available_at, created, updated)
            SELECT l.inbox_id, %(source)s::varchar, %(source_id)s::varchar,
                   %(payload)s::jsonb, 'pending', 0, NULL, '', {clock}, {clock}, {clock}
            FROM {rows} AND l.work_at <= {clock} AND NOT {stored_already}
            FOR SHARE OF l SKIP LOCKED
            ON CONFLICT (inbox_id, source, source_id) DO NOTHING
            RETURNING inbox_id, id, available_at
        )
        SELECT inbox_id, id, available_at, NULL, false FROM stored
        UNION ALL
        SELECT l.inbox_id, NULL, NULL, NULL, NOT {stored_already}
        FROM {rows} AND NOT EXISTS (SELECT 1 FROM stored)
    """


def _locking_sql(column, given_now, bounded, shared) -> str:
    bound, bound_join = _bound(1 if bounded else None, {})
    clock = "%(now)s::timestamptz" if given_now else "clock_timestamp()"
    stands = "l.work_at <= c.now" if shared else "false"
    inbox, event, lease = _table(Inbox), _table(Event), _table(Lease)
    return f"""
        WITH target AS (
            SELECT id FROM {inbox} WHERE {column} = %(inbox)s
        ), fresh AS (
            SELECT t.id FROM target t WHERE (
                SELECT 1 FROM {event} e
                WHERE e.inbox_id = t.id AND e.source = %(source)s AND e.source_id = %(source_id)s
            ) IS NULL
        ), clock AS (
            SELECT {clock} AS now
        ), {bound} seen AS (
            SELECT l.inbox_id, {stands} AS stands FROM {lease} l, fresh f, clock c
            WHERE l.inbox_id = f.id
        ), shared AS (
            SELECT l.inbox_id, l.work_at FROM {lease} l, seen s, clock c{bound_join}
            WHERE l.inbox_id = s.inbox_id AND s.stands AND l.work_at <= c.now
            FOR SHARE OF l
        ), exclusive AS (
            SELECT l.inbox_id, l.work_at FROM {lease} l, seen s{bound_join}
            WHERE l.inbox_id = s.inbox_id AND s.stands IS NOT TRUE
            FOR UPDATE OF l
        ), lease AS (
            SELECT inbox_id FROM shared UNION ALL SELECT inbox_id FROM exclusive
        ), stored AS (
            INSERT INTO {event} (inbox_id, source, source_id, payload, status, attempts,
                                 claim_gen, error, available_at, created, updated)
            SELECT l.inbox_id, %(source)s, %(source_id)s, %(payload)s::jsonb, 'pending', 0,
                   NULL, '', c.now, c.now, c.now
            FROM lease l, clock c
            ON CONFLICT (inbox_id, source, source_id) DO NOTHING
            RETURNING id, available_at
        ), marked AS (
            UPDATE {lease} m SET work_at = s.available_at
            FROM stored s, exclusive k
            WHERE m.inbox_id = k.inbox_id AND (k.work_at IS NULL OR k.work_at > s.available_at)
            RETURNING m.inbox_id
        )
        SELECT t.id, s.id, s.available_at,
               (SELECT pg_notify(%(channel)s, inbox_id::text)::text FROM marked),
               EXISTS (SELECT 1 FROM seen) AND NOT EXISTS (SELECT 1 FROM lease)
        FROM target t LEFT JOIN stored s ON true
    """


def insert_one_pg(
    db, ref, source, source_id, payload, now, lock_wait, text=None
) -> tuple[int, Stored | None]:
    """insert_pg for one event, with scalar parameters: its statement is prepared, and its
    plan (one probe of each key) is the same whatever the tables' sizes. Outside a
    transaction, an inbox whose marker already stands is locked FOR SHARE, first without
    waiting, then waiting (see the module's docstring); when the marker does not stand, or a
    finish moved it meanwhile, it runs again locking FOR UPDATE."""
    column, value = inbox_lookup(ref)
    params = {
        "inbox": value,
        "source": source,
        "source_id": source_id,
        "payload": json.dumps(payload) if text is None else text,
        "now": now,
        "channel": WORK_CHANNEL,
    }
    if lock_wait is not None:
        params["lock_timeout"] = f"{round(lock_wait * 1000)}ms"
    # Only a statement that is its own transaction may share the lock: inside a caller's, a
    # later FOR UPDATE of the same row would wait on the other sharers, who may wait on it.
    db.ensure_connection()
    alone = db.autocommit and not db.in_atomic_block
    for mode in (TRY, SHARE, EXCLUSIVE) if alone else (EXCLUSIVE,):
        sql = _one_sql(column, now is not None, lock_wait is not None, mode)
        fetch = _fetch_direct if mode == TRY else _fetch_one
        result = fetch(db, sql, params)
        if result is None:
            raise UnknownInbox(ref)
        inbox_id, pk, at, _, again = result
        if not again:
            break
    return inbox_id, Stored(pk, source, source_id, at) if pk else None


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


@functools.cache
def _event_attnames():
    return {field.attname for field in Event._meta.concrete_fields}


def as_event(inbox_id, row: Stored, payload) -> Event:
    """The Event a stored row is, without reading it back (for event_stored's receivers)."""
    values = {
        "id": row.id,
        "inbox_id": inbox_id,
        "source": row.source,
        "source_id": row.source_id,
        "payload": payload,
        "status": Event.Status.PENDING,
        "attempts": 0,
        "claim_gen": None,
        "error": "",
        "available_at": row.at,
        "created": row.at,
        "updated": row.at,
    }
    # Listeners to the init signals are looked for only when some signal has any at all:
    # has_listeners takes a lock, and this runs for every stored event.
    if (
        (pre_init.receivers and pre_init.has_listeners(Event))
        or (post_init.receivers and post_init.has_listeners(Event))
        or values.keys() != _event_attnames()
    ):
        event = Event(**values)
    else:
        # As unpickling makes one: the same instance, without Model.__init__'s pass over
        # every field and its two signals, which nobody listens to here (checked above).
        event = Event.__new__(Event)
        event.__dict__.update(values)
        event._state = ModelState()
    event._state.adding = False
    event._state.db = DEFAULT_DB_ALIAS
    return event
