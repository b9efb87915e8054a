"""PostgreSQL: the hot operations as whole statements of their own (inbox/sql/), prepared
on the server, and the psycopg tricks that make them cheap for the client.

Each rule is stated once on this database: acquire, acquire_next and take_next take a lease
by take_lease.sql (Lease.take is SQLite's), claim_batch and take_next claim by
claim_batch.sql, a run's join by claim_more.sql (both write through claim_chosen.sql), a run
that ended well finishes by finish_done.sql, the fence is fence.sql. The leftovers of a lost
run, a run's error or deferral, renewals and operators' actions stay in the ORM
(backends/base.py), one form for both databases.

An event is stored in one statement (a data-modifying WITH), in this order:

1. `fresh`: the keys not already stored as of the statement's snapshot. With none (a
   sender's retry) nothing below runs: "duplicate" is right, a visible row is committed.
2. `lease`: the inbox's lease row locked before any event row is written (the lock order
   of inbox/locks.py).
3. `stored`: INSERT ... ON CONFLICT DO NOTHING: the UNIQUE constraint decides.
4. `marked`: work_at lowered on the locked row, not on the statement's snapshot, which may
   predate a finish's recount.
5. pg_notify only when the marker moved: notifying commits are serialised database-wide.

A finish recounts work_at under the same lock, so no event is left pending without a
marker. Three statements state the insert, each the fast form of its case: the try
(insert_try.sql: never waits, fewest plan nodes), one event (insert_one.sql: prepared, scalar
parameters, a stable generic plan) and a batch (insert_many.sql: arrays, planned for its
size). Why deliveries share the lock FOR SHARE, why the try goes through libpq and why every
hot statement is planned with sequential scans off (BY_INDEX): docs/explanation/design.md,
"The notes".
"""

import itertools
import json
import logging
import re
import select
import weakref
from contextlib import ExitStack, contextmanager, nullcontext
from datetime import datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, OperationalError, connection, connections, transaction
from psycopg import pq
from psycopg.adapt import AdaptersMap, Loader, Transformer

from ..exceptions import InboxBusy, UnknownInbox
from ..extensions import claim_extras
from ..models import Event, Inbox, Lease, Session
from ..rules import Claim, lease_ttl
from ..signals import lease_taken_over
from ..store import WORK_CHANNEL, Stored
from ..validation import require_now
from .base import Backend

# --- the statements --------------------------------------------------------------------------

_SQL = Path(__file__).resolve().parent.parent / "sql"
_FRAGMENTS = ("pick_lease", "take_lease", "claim_batch", "claim_chosen")


def _load(name) -> str:
    """inbox/sql/NAME.sql as sent: without its comment lines (they are for the reader), each
    {fragment} replaced by that fragment's file. Read once, at import: the same text every
    time, so psycopg finds the statement it prepared."""
    lines = (_SQL / f"{name}.sql").read_text().splitlines()
    text = "\n".join(line for line in lines if not line.lstrip().startswith("--"))
    for fragment in _FRAGMENTS:
        if f"{{{fragment}}}" in text:
            text = text.replace(f"{{{fragment}}}", _load(fragment))
    return text


ACQUIRE = _load("acquire")
ACQUIRE_NEXT = _load("acquire_next")
TAKE = _load("take")
CLAIM = _load("claim")
CLAIM_MORE = _load("claim_more")
LOCK = _load("lock")
LOCK_NOW = _load("lock_now")
FENCE = _load("fence")
FINISH_DONE = _load("finish_done")
INSERT_TRY = _load("insert_try")
INSERT_ONE = _load("insert_one")
# insert_one.sql as two prepared statements, `share` written in as a constant: with it a
# parameter, the generic plan keeps both locking branches and every delivery pays for both.
INSERT_ONE_SHARING = {
    share: INSERT_ONE.replace("%(share)s::boolean", "true" if share else "false")
    for share in (True, False)
}
INSERT_MANY = _load("insert_many")
# Sent before each hot statement, in its transaction and its round trip (_by_index): the
# plan is made with sequential scans off, so every row is found through an index whatever
# the tables' statistics say. AS_BEFORE puts the setting back inside a caller's transaction.
BY_INDEX = (
    "SELECT set_config('alwayson.enable_seqscan', current_setting('enable_seqscan'), true),"
    " set_config('enable_seqscan', 'off', true)"
)
_BY_INDEX_BOUNDED = BY_INDEX + ", set_config('lock_timeout', %(lock_timeout)s, true)"
AS_BEFORE = "SELECT set_config('enable_seqscan', current_setting('alwayson.enable_seqscan'), true)"
# A worker's lease statements are bounded (ALWAYSON_LEASE_STATEMENT_TIMEOUT), local to the
# transaction, the value it replaces kept to be put back inside a caller's.
_KEEP_TIMEOUT = (
    "set_config('alwayson.statement_timeout', current_setting('statement_timeout'), true)"
)
_SET_TIMEOUT = "set_config('statement_timeout', %(statement_timeout)s, true)"
_PUT_TIMEOUT_BACK = (
    "set_config('statement_timeout', current_setting('alwayson.statement_timeout'), true)"
)
# The bound never reaches a commit (PostgreSQL disarms statement_timeout first:
# postgres.c, finish_xact_command), so a commit waiting for a synchronous standby is never
# reported committed short of it. The run's own deadline (Run.check_lease) stops it
# spending meanwhile.
STATEMENT_TIMEOUT = f"SELECT {_KEEP_TIMEOUT}, {_SET_TIMEOUT}"
STATEMENT_TIMEOUT_AS_BEFORE = f"SELECT {_PUT_TIMEOUT_BACK}"
BY_INDEX_LEASE = f"{BY_INDEX}, {_KEEP_TIMEOUT}, {_SET_TIMEOUT}"
AS_BEFORE_LEASE = f"{AS_BEFORE}, {_PUT_TIMEOUT_BACK}"

_INBOX_FIELDS = ["id", "owner_id", "slug", "name", "created"]
_EVENT_FIELDS = [field.attname for field in Event._meta.concrete_fields]


# Each statement's result columns, by its text: psycopg builds cursor.description anew on
# every access.
_columns = {}


def _one(cursor, sql) -> dict | None:
    """The next row of `sql`, just run on `cursor`, by column name."""
    row = cursor.fetchone()
    return None if row is None else dict(zip(_names(cursor, sql), row, strict=True))


def _all(cursor, sql) -> list[dict]:
    """The rows of `sql`, just run on `cursor`, by column name."""
    names = _names(cursor, sql)
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _names(cursor, sql) -> list[str]:
    names = _columns.get(sql)
    if names is None:
        names = _columns[sql] = [column[0] for column in cursor.description]
    return names


# --- cursors ---------------------------------------------------------------------------------

# psycopg prepares nothing while the connection's threshold is None (Django's default, for
# poolers), even when asked to: a threshold no count ever reaches lets a statement ask.
_ONLY_WHEN_ASKED = 2**62


class _PreparingCursor(psycopg.Cursor):
    # Django turns psycopg's preparing off (for poolers); these statements ask for it, and
    # lift the threshold for their own execution only, so Django's are not counted.
    def execute(self, query, params=None, *, prepare=True, binary=None):
        conn = self.connection
        if conn.prepare_threshold is not None or not settings.ALWAYSON_DB_PREPARE:
            return super().execute(query, params, prepare=prepare, binary=binary)
        conn.prepare_threshold = _ONLY_WHEN_ASKED
        try:
            return super().execute(query, params, prepare=prepare, binary=binary)
        finally:
            conn.prepare_threshold = None

    # Private psycopg (3.2): the one step a prepared execution takes that an unprepared one
    # does not. tests/inbox/test_backend_internals.py fails when an upgrade removes it.
    def _send_query_prepared(self, name, pgq, *, binary=None):
        # psycopg records the query only when it sends its text; Django reads it back for
        # CaptureQueriesContext and the DEBUG log, and would see None once it is prepared.
        self._query = pgq
        return super()._send_query_prepared(name, pgq, binary=binary)


def prepared_cursor():
    """A cursor binding its parameters on the server, so PostgreSQL parses the statement
    once per connection; wrapped as Django's own cursors are (CaptureQueriesContext, DEBUG)."""
    db = connections[DEFAULT_DB_ALIAS]
    db.ensure_connection()
    # Private Django: how its own cursor() wraps a driver cursor (thread check, the query
    # log). tests/inbox/test_backend_internals.py fails when an upgrade removes it.
    return db._prepare_cursor(_PreparingCursor(db.connection))


def _server_cursor():
    """A cursor binding its parameters on the server, prepared only if psycopg's threshold
    says so (never, under Django's default)."""
    connection.ensure_connection()
    return connection._prepare_cursor(psycopg.Cursor(connection.connection))  # as above


# Each connection's cursors for the hot statements, kept between calls.
_kept_cursors = weakref.WeakKeyDictionary()


def _by_index(db, statements, lease=False) -> list:
    """Each (sql, params) of `statements` after BY_INDEX in one pipeline (one round trip,
    one implicit transaction outside a caller's, AS_BEFORE after them inside one); with
    `lease`, bounded as lease statements. The cursors, in order. The settings go on a cursor
    unseen by Django's query log: they are how a statement is planned, not a query. Kept
    cursors unless something watches the queries (then Django's wrappers)."""
    db.ensure_connection()
    if db.queries_logged or db.execute_wrappers:
        setting = _PreparingCursor(db.connection)
        cursors = [prepared_cursor() for _ in statements]
    else:
        kept = _kept(_kept_cursors, db, lambda raw: [])
        while len(kept) <= len(statements):
            kept.append(_PreparingCursor(db.connection))
        setting, *cursors = kept[: len(statements) + 1]
    with db.wrap_database_errors, _pipeline(db.connection):
        if lease:
            setting.execute(BY_INDEX_LEASE, {"statement_timeout": _lease_timeout()})
        else:
            setting.execute(BY_INDEX)
        for cursor, (sql, params) in zip(cursors, statements, strict=True):
            cursor.execute(sql, params)
        if db.in_atomic_block:
            setting.execute(AS_BEFORE_LEASE if lease else AS_BEFORE)
    return cursors


@contextmanager
def _pipeline(raw):
    """psycopg's pipeline on `raw`, except for an error at its closing Sync.

    A commit at the Sync can fail (a lock wait past lock_timeout, a cancel); psycopg (3.3)
    then raises "cannot exit pipeline mode while busy" instead and leaves the connection
    stuck in pipeline mode. Here the Sync's result is read, pipeline mode left and the
    commit's own error raised, so a lock timeout is InboxBusy and the connection goes on."""
    pgconn = raw.pgconn
    outermost = pgconn.pipeline_status == pq.PipelineStatus.OFF
    try:
        with raw.pipeline():
            yield
    except psycopg.Error as exc:
        if not outermost or pgconn.pipeline_status == pq.PipelineStatus.OFF:
            raise
        error = exc.__context__
        if not isinstance(error, psycopg.Error):
            error = exc
        try:
            _leave_pipeline(pgconn)
        except BaseException:
            # The connection is gone (a terminated session's error came first) or in a state
            # unknown: it is not used again (as _Direct's).
            raw.close()
        raise error.with_traceback(None) from None


def _leave_pipeline(pgconn):
    """Read what is left of a pipeline up to its Sync's result, then leave pipeline mode."""
    while True:
        result = _result(pgconn)
        if result is not None and result.status == pq.ExecStatus.PIPELINE_SYNC:
            break
        if result is None and not pgconn.is_busy():
            break  # nothing more queued
    pgconn.exit_pipeline_mode()


def _fetch_one(db, sql, params) -> dict | None:
    """The first row `sql` answers, by name, prepared on `db`, planned by index: inside
    bounded()'s transaction, whose settings hold, after the writes held there (_held)."""
    if db.connection in _planned_by_index:
        cursor = _after_held(db, sql, params)
        return _one(cursor, sql)
    [cursor] = _by_index(db, [(sql, params)])
    return _one(cursor, sql)


# The connections inside bounded()'s transaction, whose plan settings (BY_INDEX) hold until
# it ends: read(), write() and _fetch_one send their statements there without settings of their
# own.
_planned_by_index = weakref.WeakSet()
# Inside a locked_write, the writes whose results nobody reads (write()), held to go with the
# next statement sent through this module or with the COMMIT, in one round trip.
_held = weakref.WeakKeyDictionary()


def _after_held(db, sql, params):
    """`sql` on a prepared cursor, sent after the writes held for db's connection in one
    round trip (psycopg's pipeline): its cursor."""
    held = _held.get(db.connection)
    cursor = prepared_cursor()
    if not held:
        cursor.execute(sql, params)
        return cursor
    with db.connection.pipeline():
        _send(held)
        cursor.execute(sql, params)
    return cursor


def _send(held):
    """The held writes, each on a prepared cursor, in order; none held after."""
    statements, held[:] = held[:], []
    for statement in statements:
        with prepared_cursor() as cursor:
            cursor.execute(*statement)


def _kept(kept, db, make):
    """What `make` builds for db's connection, built once per connection (`kept` is keyed
    by psycopg's connection object: a new connection gets a new one), after the check
    Django's cursor wrapper would make: no statement in a broken transaction."""
    db.validate_no_broken_transaction()
    db.close_if_health_check_failed()
    db.ensure_connection()
    raw = db.connection
    value = kept.get(raw)
    if value is None:
        value = kept[raw] = make(raw)
    return value


_NAMED = re.compile(r"%\((\w+)\)s")
# Numbers the statements _Direct prepares, unique in the process (psycopg's own are _pg3_N).
_statement_numbers = itertools.count()


class _Statement(NamedTuple):
    name: bytes  # on the server
    params: list[str]  # the parameters' names, in the order of $1, $2, ...
    columns: list[str]  # the result's columns, learnt from its first result


class _Direct:
    """One connection's statements run through libpq itself (psycopg's pq layer), for the
    statements every delivery and every run send (insert_try.sql, take.sql, lock.sql,
    finish_done.sql): under load the client CPU psycopg's cursors spend in Python bounds
    deliveries and runs per second (docs/explanation/design.md). Each is prepared once by
    name; a call is one pipeline of PQsendQueryPrepared. The waits are on the socket,
    without the GIL. Errors are Django's."""

    def __init__(self, raw):
        self.raw = raw
        self.statements = {}  # sql -> _Statement
        # The connection's own loaders (Django's included), read in binary form: the same
        # values psycopg's cursors give in text form, parsed in C. But jsonb, which Django
        # reads as its text and decodes itself (JSONField.from_db_value), as here.
        self.adapters = AdaptersMap(raw.adapters)
        self.adapters.register_loader("jsonb", _JsonbText)
        self.connection = raw
        self.loader = Transformer(self)

    def _statement(self, sql) -> tuple[_Statement, bytes | None]:
        """`sql`'s statement on this connection, and its text to prepare first (None once
        prepared). Prepared in the pipeline that first runs it, after the setting before it:
        a lease statement's bound covers its parsing too, which waits for the locks of the
        tables it names."""
        statement = self.statements.get(sql)
        if statement is not None:
            return statement, None
        names = []

        def number(match):
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        name = f"alwayson_{next(_statement_numbers)}".encode()
        text = _NAMED.sub(number, sql).replace("%%", "%")
        return _Statement(name, names, []), text.encode()

    def fetch_one(self, sql, params) -> dict | None:
        """The first row of `sql`, after BY_INDEX in the same pipeline (its implicit
        transaction: `sql` runs outside any other)."""
        [rows] = self.fetch([(sql, params)])
        return rows[0] if rows else None

    def fetch(self, calls, lease=False) -> list[list[dict]]:
        """The rows of each (sql, params) of `calls`, by column name, sent after BY_INDEX in
        one pipeline: one round trip, one implicit transaction (committed at its Sync, or
        rolled back whole at the first error, which is raised). With `lease`, each bounded
        as a lease statement (BY_INDEX_LEASE)."""
        first = BY_INDEX_LEASE if lease else BY_INDEX
        bound = [_text(_lease_timeout())] if lease else []
        for retrying in (False, True):
            setting, text = self._statement(first)
            sent = [(first, setting, bound, text)]
            for sql, params in calls:
                statement, text = self._statement(sql)
                values = [_text(params[key]) for key in statement.params]
                sent.append((sql, statement, values, text))
            results, prepared = self._pipeline(sent)
            # Kept even when a later statement failed: a prepared statement outlives its
            # transaction.
            for sql, statement, _, _ in sent:
                if statement.name in prepared:
                    self.statements[sql] = statement
            if len(results) == len(sent) and all(
                result.status == pq.ExecStatus.TUPLES_OK for result in results
            ):
                return [
                    self._rows(statement, result)
                    for (_, statement, _, _), result in zip(sent[1:], results[1:], strict=True)
                ]
            # The first error: the setting's, a statement's or the commit's (at the Sync).
            aborted = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.PIPELINE_ABORTED)
            result = next(result for result in results if result.status not in aborted)
            if not retrying and result.error_field(pq.DiagnosticField.SQLSTATE) == b"26000":
                # A pooler's DISCARD ALL dropped them (invalid_sql_statement_name): again.
                self.statements.clear()
                continue
            raise self._error(result)

    def _error(self, result) -> psycopg.Error:
        """The error of a failed result, as psycopg's cursors raise it: OperationalError when
        the connection itself is gone (the result has no SQLSTATE then)."""
        if self.raw.pgconn.status == pq.ConnStatus.BAD:
            return psycopg.OperationalError(result.error_message.decode(errors="replace"))
        return psycopg.errors.error_from_result(result, encoding=self.raw.info.encoding)

    def _rows(self, statement, result) -> list[dict]:
        if not result.ntuples:
            return []
        if not statement.columns:
            statement.columns.extend(result.fname(n).decode() for n in range(result.nfields))
        self.loader.set_pgresult(result)
        rows = self.loader.load_rows(0, result.ntuples, tuple)
        return [dict(zip(statement.columns, row, strict=True)) for row in rows]

    def _pipeline(self, calls) -> tuple[list, set]:
        """Each (sql, statement, values, text) of `calls` in one pipeline, prepared first when
        it has a text, then one Sync. Their results (and the commit's error if it failed),
        and the names of the statements prepared. Waits with select: libpq's would hold the
        GIL."""
        pgconn = self.raw.pgconn
        pgconn.enter_pipeline_mode()
        try:
            preparing = []
            for _, statement, values, text in calls:
                if text is not None:
                    pgconn.send_prepare(statement.name, text)
                    preparing.append(statement.name)
                preparing.append(None)
                pgconn.send_query_prepared(statement.name, values, result_format=pq.Format.BINARY)
            pgconn.pipeline_sync()
            # Each command's result, each followed by None; then, if the commit at the Sync
            # failed, its error; then the Sync's own.
            results, prepared = [], set()
            while (result := _result(pgconn)) is None or (
                result.status != pq.ExecStatus.PIPELINE_SYNC
            ):
                if result is None:
                    continue
                name = preparing.pop(0) if preparing else None
                if name is not None and result.status == pq.ExecStatus.COMMAND_OK:
                    prepared.add(name)
                else:
                    results.append(result)
            pgconn.exit_pipeline_mode()
        except BaseException:
            # Half a pipeline read: the connection's state is unknown, it is not used again.
            self.raw.close()
            raise
        return results, prepared


class _JsonbText(Loader):
    """jsonb in binary form as its text: a version byte, then the text."""

    format = pq.Format.BINARY

    def load(self, data) -> str:
        return bytes(data[1:]).decode()


def _result(pgconn):
    """libpq's next result, waiting for it on the socket."""
    while pgconn.flush():
        select.select([pgconn.socket], [pgconn.socket], [])
        pgconn.consume_input()
    while pgconn.is_busy():
        select.select([pgconn.socket], [], [])
        pgconn.consume_input()
    return pgconn.get_result()


def _text(value) -> bytes | None:
    """A parameter in PostgreSQL's text format (each statement casts it to its type); a list
    is of integers (the statements' bigint arrays)."""
    if value is None:
        return None
    if type(value) is str:
        return value.encode()
    if isinstance(value, bool):
        return b"t" if value else b"f"
    if isinstance(value, datetime):
        return value.isoformat().encode()
    if isinstance(value, timedelta):
        return f"{value.days} days {value.seconds} seconds {value.microseconds} us".encode()
    if isinstance(value, list | tuple):
        return ("{" + ",".join(str(int(item)) for item in value) + "}").encode()
    return str(value).encode()


_directs = weakref.WeakKeyDictionary()


def _direct(db) -> bool:
    """Whether _Direct may be used: nothing watches the queries (they go through Django's
    cursors then) and statements may be prepared (ALWAYSON_DB_PREPARE)."""
    db.ensure_connection()
    return not (db.queries_logged or db.execute_wrappers) and settings.ALWAYSON_DB_PREPARE


def _fetch_direct(db, sql, params) -> dict | None:
    """_fetch_one through _Direct when it may be used."""
    if not _direct(db):
        return _fetch_one(db, sql, params)
    direct = _kept(_directs, db, _Direct)
    with db.wrap_database_errors:
        return direct.fetch_one(sql, params)


def _fetch_all(db, calls, lease=False) -> list[list[dict]]:
    """The rows of each (sql, params) of `calls` (outside a caller's transaction), sent after
    BY_INDEX in one pipeline: one round trip, one implicit transaction; with `lease`, bounded
    as lease statements. Through _Direct when it may be used, else on psycopg's cursors
    (_by_index)."""
    db = connections[db.alias]  # this thread's wrapper itself, not the proxy to it
    if not _direct(db):
        cursors = _by_index(db, calls, lease)
        return [_all(cursor, sql) for cursor, (sql, _) in zip(cursors, calls, strict=True)]
    direct = _kept(_directs, db, _Direct)
    with db.wrap_database_errors:
        return direct.fetch(calls, lease)


_lookup = Inbox.objects.lookup  # bound once: it runs on every delivery


def _inbox_id(ref, value) -> int:
    """An id for a statement's bigint parameter: one out of its range names no inbox, as
    the ORM's lookups answer for it (the statement would fail on the cast)."""
    if not -(2**63) <= value < 2**63:
        raise UnknownInbox(ref)
    return value


def _lock_timeout(wait) -> str | None:
    return None if wait is None else f"{round(wait * 1000)}ms"


def _lease_timeout() -> str:
    return f"{max(1, round(settings.ALWAYSON_LEASE_STATEMENT_TIMEOUT * 1000))}ms"


# Django's connection parameters that are psycopg's Python objects, not libpq's.
_NOT_LIBPQ = ("context", "cursor_factory", "prepare_threshold")


def session_params(alias=DEFAULT_DB_ALIAS) -> dict:
    """The libpq parameters of Django's connection `alias`, for a session a process opens
    beside Django's (a LISTEN): the same server, credentials and TLS, and the same liveness
    (connect_timeout, keepalives, tcp_user_timeout: alwayson/settings/database.py), so that
    a session whose peer stopped answering fails instead of waiting for ever."""
    params = connections[alias].get_connection_params()
    return {k: v for k, v in params.items() if k not in _NOT_LIBPQ and v not in (None, "")}


# --- the backend -----------------------------------------------------------------------------


class PostgreSQL(Backend):
    vendor = "postgresql"

    def database_now(self):
        with connection.cursor() as cursor:
            # clock_timestamp(), not now(): now() is frozen at the start of the transaction.
            cursor.execute("SELECT clock_timestamp()")
            return cursor.fetchone()[0]

    def cursor(self):
        return prepared_cursor()

    def notify_work(self, inbox_id):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [WORK_CHANNEL, str(inbox_id)])

    @contextmanager
    def bounded(self, wait):
        """Also planned by index throughout (BY_INDEX): a bounded write is a person waiting
        on a few rows found by their keys. Both settings are local to the transaction (put
        back at the end inside a caller's), so the next one on the connection is as usual."""
        inside = connection.in_atomic_block
        with transaction.atomic():
            # psycopg's own cursor: its errors made Django's, which the loops' backoff waits out.
            with connection.wrap_database_errors, _PreparingCursor(connection.connection) as cursor:
                if wait is None:
                    cursor.execute(BY_INDEX)
                else:
                    cursor.execute(_BY_INDEX_BOUNDED, {"lock_timeout": _lock_timeout(wait)})
            raw = connection.connection
            marked = raw not in _planned_by_index
            _planned_by_index.add(raw)
            try:
                yield
            finally:
                if marked:
                    _planned_by_index.discard(raw)
            if inside:
                with (
                    connection.wrap_database_errors,
                    _PreparingCursor(connection.connection) as cursor,
                ):
                    cursor.execute(AS_BEFORE)

    def out_of_time(self, exc, wait):
        """A lock wait past lock_timeout (lock_not_available), or a statement stopped by
        statement_timeout or a cancel (query_canceled), before its commit or in the commit's
        own work before it is written (a lock a notifying commit waits for): the transaction
        (or the savepoint) is rolled back, nothing of it stays. Not a commit already written
        and waiting for a synchronous standby: statement_timeout does not reach that wait
        (PostgreSQL disarms it first), and a cancel of it is no error at all, only a WARNING
        the commit succeeds with (watch_commits)."""
        cause = exc.__cause__
        sqlstate = getattr(cause, "sqlstate", None)
        if sqlstate == "55P03":
            return f"its lock was not free within {wait:g}s"
        if sqlstate == "57014":
            return f"its statement was stopped before it was done ({cause.diag.message_primary})"
        return None

    @contextmanager
    def lease_statements(self):
        """Each statement of the transaction bounded by statement_timeout, not its commit
        (STATEMENT_TIMEOUT); inside a caller's transaction, the caller's bound is put back
        after them. The setting goes on a cursor
        of psycopg's own, as bounded()'s do: it is how a statement runs, not a query."""
        inside = connection.in_atomic_block
        with transaction.atomic():
            with connection.wrap_database_errors, _PreparingCursor(connection.connection) as cursor:
                cursor.execute(STATEMENT_TIMEOUT, {"statement_timeout": _lease_timeout()})
            yield
            if inside:
                with (
                    connection.wrap_database_errors,
                    _PreparingCursor(connection.connection) as cursor,
                ):
                    cursor.execute(STATEMENT_TIMEOUT_AS_BEFORE)

    @contextmanager
    def locked_write(self, ref, wait, now, then=()):
        """bounded's transaction in three round trips through psycopg's pipeline: BEGIN,
        the settings, lock_now.sql and the reads `then`; the caller's statements, the writes
        held (write()) going with the next read; the writes still held, with the COMMIT.
        Each statement runs after the one before, so `then` sees what was committed before
        the lock was granted."""
        column, value = _lookup(ref)
        params = {
            "inbox_id": _inbox_id(ref, value) if column == "id" else None,
            "slug": value if column == "slug" else None,
            "now": None if now is None else require_now(now),
        }
        connection.ensure_connection()
        raw = connection.connection
        inside = connection.in_atomic_block
        with ExitStack() as written:
            with raw.pipeline():
                written.enter_context(self.bounded_write(value, wait))
                cursors = [prepared_cursor() for _ in range(1 + len(then))]
                for cursor, statement in zip(cursors, [(LOCK_NOW, params), *then], strict=True):
                    cursor.execute(*statement)
                row = _one(cursors[0], LOCK_NOW)
                if row is None:
                    raise UnknownInbox(ref)
                read = [cursor.fetchall() for cursor in cursors[1:]]
            held = _held[raw] = []
            try:
                yield row["inbox_id"], row["now"], read
                with raw.pipeline() as pipeline:
                    _send(held)
                    if inside:
                        # A savepoint's release reports nothing: the held writes' errors are
                        # read before it, so it rolls back instead.
                        with connection.wrap_database_errors:
                            pipeline.sync()
                    written.close()  # the COMMIT (its errors are the held writes'), or the release
            finally:
                _held.pop(raw, None)

    def write_in_one(self, ref, sql, params, wait):
        """`sql`, a whole write that takes the inbox's lock itself, first (a database function
        of an app above this one: approvals' answer.sql), as its own transaction, planned by
        index (BY_INDEX before it, in its round trip): its first row, by column name. Inside
        a caller's transaction a savepoint, so a lock wait past `wait` (the statement sets
        its own lock_timeout) does not abort the caller's. InboxBusy then, rolled back."""
        db = connections[DEFAULT_DB_ALIAS]
        try:
            if db.in_atomic_block:
                with transaction.atomic():
                    return _fetch_one(db, sql, params)
            return _fetch_direct(db, sql, params)
        except OperationalError as exc:
            reason = None if wait is None else self.out_of_time(exc, wait)
            if reason:
                raise InboxBusy(ref, wait, reason) from exc
            raise

    @staticmethod
    def lock_timeout(wait) -> str | None:
        """`wait` (seconds, None: unbounded) as a statement that sets lock_timeout takes it."""
        return _lock_timeout(wait)

    def read(self, statement):
        """Prepared and planned by index: inside bounded()'s transaction its settings hold;
        elsewhere after BY_INDEX, in one round trip."""
        if connection.connection in _planned_by_index:
            return _after_held(connection, *statement).fetchall()
        [cursor] = _by_index(connection, [statement])
        return cursor.fetchall()

    def write(self, statement):
        """As read(), its result not read: inside a locked_write held, and sent with the next
        statement read through this module or with the COMMIT. For a write nothing in the
        transaction reads back (an ORM statement would not see it)."""
        held = _held.get(connection.connection)
        if held is not None:
            held.append(statement)
        elif connection.connection in _planned_by_index:
            with prepared_cursor() as cursor:
                cursor.execute(*statement)
        else:
            _by_index(connection, [statement])

    # --- storing events ----------------------------------------------------------------------

    def store(self, ref, rows, now, lock_wait, text=None, trace=""):
        db = connections[DEFAULT_DB_ALIAS]
        column, value = _lookup(ref)
        params = {
            "inbox_id": _inbox_id(ref, value) if column == "id" else None,
            "slug": value if column == "slug" else None,
            "now": now,
            "lock_timeout": _lock_timeout(lock_wait),
            "channel": WORK_CHANNEL,
        }
        # Inside a caller's transaction a lock timeout must not abort it: a savepoint there.
        bounded = lock_wait is not None and db.in_atomic_block
        try:
            # With a trace to keep (tracing on) the insert and its EventTrace rows commit
            # together: a transaction of two statements instead of one, so the single
            # statement's fast paths (insert_try.sql, FOR SHARE) are for tracing off.
            with transaction.atomic() if bounded or trace else nullcontext():
                if len(rows) == 1:
                    inbox_id, stored = _insert_one(db, ref, params, *rows[0], text)
                else:
                    inbox_id, stored = _insert_many(ref, params, rows)
                self.store_traces(stored, trace)
                return inbox_id, stored
        except OperationalError as exc:
            reason = None if lock_wait is None else self.out_of_time(exc, lock_wait)
            if reason:
                raise InboxBusy(ref, lock_wait, reason) from exc
            raise

    # --- leases ------------------------------------------------------------------------------

    def acquire(self, ref, holder, now):
        inbox_id = _inbox_id(ref, Inbox.objects.pk_of(ref))
        with self.lease_statements():
            [cursor] = _by_index(
                connection, [(ACQUIRE, _lease_params(holder, now, inbox=inbox_id))]
            )
            row = _one(cursor, ACQUIRE)
            if row is None:
                raise UnknownInbox(ref)
            if row["generation"] is None:
                return None
            _taken(row)
            return row["generation"]

    def acquire_next(self, holder, now):
        with self.lease_statements():
            [cursor] = _by_index(connection, [(ACQUIRE_NEXT, _lease_params(holder, now))])
            row = _one(cursor, ACQUIRE_NEXT)
            if row is None:
                return None
            _taken(row)
            return row["inbox_id"], row["generation"]

    def fence(self, ref, inbox_id, holder, generation, now, release):
        params = {
            "now": now,
            "inbox": inbox_id,
            "release": release,
            "holder": holder,
            "generation": generation,
        }
        [cursor] = _by_index(connection, [(FENCE, params)])
        row = _one(cursor, FENCE)
        if row is not None:
            return row["now"]
        return self.refused(ref, inbox_id)

    # --- claims ------------------------------------------------------------------------------

    def claim(self, inbox, generation, now):
        rows = _claim_rows(inbox.pk, generation, now)
        return _claimed(inbox, generation, rows).events if rows else []

    def claim_fresh(self, inbox, generation, sources, now):
        params = {"inbox": inbox.pk, "now": now, "generation": generation, "sources": sources}
        [cursor] = _by_index(connection, [(CLAIM_MORE, params)])
        return _events(inbox, _all(cursor, CLAIM_MORE))

    def take_next(self, holder, now):
        """One statement and one commit in the common case (take.sql): the lease under SKIP
        LOCKED, the batch and the session state. When the inbox has leftovers to settle
        first (rows an older generation left running, events out of attempts) the statement
        only takes the lease, and the settling and the claim follow in a transaction under
        the lease row's lock (_claim_locked)."""
        take = _take(holder, now)
        if connection.in_atomic_block:
            [cursor] = _by_index(connection, [(take.sql, take.params)], lease=True)
            return take.claim(self, _all(cursor, take.sql))
        [rows] = _fetch_all(connection, [(take.sql, take.params)], lease=True)
        return take.claim(self, rows)

    def _claim_locked(self, inbox, holder, generation, now) -> Claim:
        """The claim after take_next's lease when leftovers need settling first: in one
        transaction under the lease row's lock, fenced as a finish is."""
        with self.lease_statements():
            if self.fence(inbox, inbox.pk, holder, generation, now, release=False) is None:
                return Claim(inbox, generation, [], None)
            self.settle_leftovers(inbox.pk, generation, now)
            rows = _claim_rows(inbox.pk, generation, now)
            if not rows:
                self.fence(inbox, inbox.pk, holder, generation, now, release=True)
                self.recount_work(inbox.pk)
                return Claim(inbox, generation, [], None)
        return _claimed(inbox, generation, rows)

    # --- finishing a run ---------------------------------------------------------------------

    def finish_done(self, ref, run, effects, release):
        return _finish_done(ref, run, effects, release)[0]

    def finish_and_take(self, ref, run, effects):
        """The take is a statement of the finish's own transaction, after the finish (one
        commit and, without effects, one round trip for both): the take then sees the
        finish's recount and may pick the same inbox again. The finish's lease row is locked
        first and waited for; the take's is taken under SKIP LOCKED and never waited for, so
        holding both cannot deadlock."""
        take = _take(run["holder"], run["now"])
        finished, rows = _finish_done(ref, run, effects, True, take)
        return finished, take.claim(self, rows)


# --- storing events --------------------------------------------------------------------------


def _insert_one(db, ref, params, source, source_id, payload, text) -> tuple[int, list[Stored]]:
    """One event, with scalar parameters: its statements are prepared, and their plan (one
    probe of each key) is the same whatever the tables' sizes. Outside a transaction the
    try first, then an inbox whose marker already stands is locked FOR SHARE, waiting;
    when the marker does not stand, or a finish moved it meanwhile, FOR UPDATE."""
    params["source"], params["source_id"] = source, source_id
    params["payload"] = json.dumps(payload) if text is None else text
    db.ensure_connection()
    # Only a statement that is its own transaction may share the lock: inside a caller's, a
    # later FOR UPDATE of the same row would wait on the other sharers, who may wait on it.
    alone = db.autocommit and not db.in_atomic_block
    row = None
    if alone:
        row = _fetch_direct(db, INSERT_TRY, params)
        if row is None:
            raise UnknownInbox(ref)
    for share in (True, False) if alone else (False,):
        if row is not None and not row["again"]:
            break
        row = _fetch_one(db, INSERT_ONE_SHARING[share], params)
        if row is None:
            raise UnknownInbox(ref)
    stored = [Stored(row["id"], source, source_id, row["available_at"])] if row["id"] else []
    return row["inbox_id"], stored


def _insert_many(ref, params, rows) -> tuple[int, list[Stored]]:
    params["sources"] = [source for source, _, _ in rows]
    params["source_ids"] = [source_id for _, source_id, _ in rows]
    params["payloads"] = [json.dumps(payload) for _, _, payload in rows]
    # Not prepared: see insert_many.sql.
    with _server_cursor() as cursor:
        cursor.execute(INSERT_MANY, params)
        result = _all(cursor, INSERT_MANY)
    if not result:
        raise UnknownInbox(ref)
    stored = [
        Stored(row["id"], row["source"], row["source_id"], row["available_at"])
        for row in result
        if row["id"]
    ]
    return result[0]["inbox_id"], stored


# --- leases and claims -----------------------------------------------------------------------


def _lease_params(holder, now, **more) -> dict:
    return {"holder": holder, "now": now, "ttl": lease_ttl(), **more}


def _taken(row):
    """After take_lease.sql: a takeover of a lease that lapsed (not one released or never
    held) is announced, as Lease.take announces it."""
    if row["free"] and row["old_until"] is not None:
        lapsed = Lease(
            inbox_id=row["inbox_id"],
            holder=row["old_holder"],
            generation=row["generation"] - 1,
            until=row["old_until"],
        )
        lease_taken_over.send(sender=Lease, lease=lapsed, now=row["now"])


class _Take(NamedTuple):
    """take_next's statement for one holder, and what its rows make (after they commit)."""

    holder: str
    sql: str
    params: dict
    extras: list[str]

    def claim(self, backend, rows) -> Claim | None:
        if not rows:
            return None
        first = rows[0]
        inbox = Inbox.from_db(
            connection.alias, _INBOX_FIELDS, [first[f"inbox.{name}"] for name in _INBOX_FIELDS]
        )
        generation, now = first["generation"], first["now"]
        _taken({**first, "inbox_id": inbox.pk, "free": True})
        if first["leftovers"]:
            return backend._claim_locked(inbox, self.holder, generation, now)
        if first["id"] is None:
            # Nothing claimable after all (a retry waiting for its backoff, or events this
            # statement's snapshot predates): give the lease back with the work recounted,
            # in statements that see what committed before the lock.
            with backend.lease_statements():
                if backend.fence(inbox, inbox.pk, self.holder, generation, now, True) is not None:
                    backend.recount_work(inbox.pk)
            return Claim(inbox, generation, [], None)
        extras = {name: first[f"extra.{name}"] for name in self.extras}
        return _claimed(inbox, generation, rows, extras)


_take_texts = {}


def _take(holder, now) -> _Take:
    names = sorted(claim_extras)
    key = tuple((name, claim_extras[name]) for name in names)
    sql = _take_texts.get(key)
    if sql is None:
        extras = "".join(f',\n    ({claim_extras[name]}) AS "extra.{name}"' for name in names)
        sql = _take_texts[key] = TAKE.replace("{extras}", extras)
    params = {
        "now": now,
        "holder": holder,
        "ttl": lease_ttl(),
        "max_attempts": settings.ALWAYSON_MAX_ATTEMPTS,
    }
    return _Take(holder, sql, params, names)


def _claim_rows(inbox_id, generation, now) -> list[dict]:
    params = {"inbox": inbox_id, "now": now, "generation": generation}
    [cursor] = _by_index(connection, [(CLAIM, params)])
    return _all(cursor, CLAIM)


def _claimed(inbox, generation, rows, extras=None) -> Claim:
    """A Claim from claimed rows: the event's columns, then the session's state."""
    state = Session._meta.get_field("state").from_db_value(rows[0]["state"], None, connection)
    return Claim(inbox, generation, _events(inbox, rows), state, extras or {})


def _events(inbox, rows) -> list[Event]:
    """The events of claimed rows (claim_chosen.sql's columns), oldest first."""
    payload = Event._meta.get_field("payload")
    events = []
    for row in rows:
        values = [row[name] for name in _EVENT_FIELDS]
        values[_EVENT_FIELDS.index("payload")] = payload.from_db_value(
            row["payload"], None, connection
        )
        event = Event.from_db(connection.alias, _EVENT_FIELDS, values)
        event.inbox = inbox
        events.append(event)
    events.sort(key=lambda event: event.pk)  # oldest first; RETURNING has no order
    return events


# --- finishing a run that ended well ---------------------------------------------------------


# --- commits a synchronous standby may not have ---------------------------------------------

log = logging.getLogger("alwayson.durability")

# PostgreSQL's WARNING (sqlstate 01000) when a commit written here stopped waiting for the
# synchronous standbys: a cancel (pg_cancel_backend, a client's cancel request) or the
# session's end. The commit stands here and the client is told it succeeded, but a failover
# to a standby may lose it. In the server's messages as lc_messages words them (English).
UNREPLICATED = "wait for synchronous replication"
# Each watched connection's last such warning, until the code that committed reads it.
_unreplicated = weakref.WeakKeyDictionary()
_watched = weakref.WeakSet()


class Unreplicated(OperationalError):
    """A commit this server made, whose wait for the synchronous standby was cancelled: it
    stands here, and a failover may lose it. Its outcome is unknown to the caller, as a
    connection lost at the commit would leave it."""


def watch_commits(raw):
    """On psycopg connection `raw`: a commit whose wait for the synchronous standby was cut
    short is logged as an ERROR (the only sign of it: PostgreSQL reports the commit a
    success) and kept for the code that committed (_finish_done raises Unreplicated)."""
    if raw in _watched:
        return
    _watched.add(raw)
    owner = weakref.ref(raw)  # the connection keeps its handlers: no cycle through them

    def heard(diag):
        message = diag.message_primary or ""
        if diag.sqlstate != "01000" or UNREPLICATED not in message:
            return
        conn = owner()
        if conn is not None:
            _unreplicated[conn] = message
        log.error(
            "a commit may not be on the synchronous standby, a failover may lose it: %s (%s)",
            message,
            diag.message_detail,
        )

    raw.add_notice_handler(heard)


def _finish_done(ref, run, effects, release, take=None) -> tuple[bool, list[dict]]:
    """_finish_in_one, Unreplicated when its commit was cut short of the synchronous
    standby: the worker treats it as a database failure (the run's outcome unknown), not as
    a finish that a failover keeps. Inside a caller's transaction the caller's commit is
    what counts."""
    connection.ensure_connection()
    raw = connection.connection
    committing = not connection.in_atomic_block
    if committing:
        _unreplicated.pop(raw, None)
    done = _finish_in_one(ref, run, effects, release, take)
    if committing and (message := _unreplicated.pop(raw, None)) is not None:
        raise Unreplicated(
            f"the finish of inbox {ref} committed on this server, but {message}: a failover"
            " to the standby may lose it"
        )
    return done


def _finish_in_one(ref, run, effects, release, take=None) -> tuple[bool, list[dict]]:
    """lock.sql, then finish_done.sql (fence, events done, recount, release: all or
    nothing), then the effects, in one transaction. Without effects it is one pipeline
    committed at its Sync: the finish still runs after the lock is granted, so its snapshot
    holds every event committed before, and it writes nothing when refused, so committing
    blind is safe. Whether the finish was accepted, and the rows of `take`."""
    params = {**run, "count": len(run["ids"]), "release": release}
    if effects or connection.in_atomic_block or not psycopg.Pipeline.is_supported():
        with transaction.atomic():
            locked, finished = _by_index(connection, [(LOCK, params), (FINISH_DONE, params)])
            if locked.fetchone() is None:
                raise UnknownInbox(ref)
            finished = _one(finished, FINISH_DONE)
            if not finished["ok"]:
                return False, []
            for effect in effects:
                effect(finished["now"])
            if take is None:
                return True, []
            [cursor] = _by_index(connection, [(take.sql, take.params)])
            return True, _all(cursor, take.sql)
    calls = [(LOCK, params), (FINISH_DONE, params)]
    if take is not None:
        calls.append((take.sql, take.params))
    locked, finished, *taken = _fetch_all(connection, calls)
    if not locked:
        raise UnknownInbox(ref)
    # The take committed whether or not the finish was accepted: its claim stands either way.
    return finished[0]["ok"], taken[0] if taken else []
