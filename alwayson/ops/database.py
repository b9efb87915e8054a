"""A database a process cannot use, told apart from one it cannot reach.

An outage (the server unreachable, restarting, failing over) ends on its own: the loops wait
it out (OutageBackoff), and so does `runall`'s start-up, within a bound (through_outage). A
database that does not exist, or whose migrations were never run, stays so until a person
acts: retrying it only fills the log with tracebacks. Those stop the process with one line
saying what to do (DatabaseUnusable).
"""

import re
import shlex
import time

from django.db import (
    DEFAULT_DB_ALIAS,
    DatabaseError,
    OperationalError,
    connection,
    connections,
)
from django.db.migrations.executor import MigrationExecutor

MIGRATE = "run `python manage.py migrate`"
# PostgreSQL's words, in its default (English) messages, for a connection to a database that
# does not exist. Its code (3D000) does not reach the client when the connection itself fails.
_NO_DATABASE = re.compile(r'database "(?P<name>[^"]+)" does not exist')
# A statement naming a table or a column the schema lacks: PostgreSQL's undefined_table and
# undefined_column; SQLite has no codes, only these words.
_UNDEFINED_SQLSTATES = ("42P01", "42703")
_SQLITE_UNDEFINED = ("no such table", "no such column", "has no column named")
# What `CREATE DATABASE` takes unquoted.
_PLAIN_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")


class DatabaseUnusable(Exception):
    """The database is not one this code can use, and waiting will not change that: the
    message says what a person must do."""


def missing_database(exc: BaseException) -> str | None:
    """What to do, in one line, when `exc` is a connection refused because its database does
    not exist (naming the command that creates it); None for any other error."""
    match = _NO_DATABASE.search(str(exc)) if isinstance(exc, OperationalError) else None
    if match is None:
        return None
    name = match["name"]
    config = next(
        (
            connections[alias].settings_dict
            for alias in connections
            if connections[alias].settings_dict.get("NAME") == name
        ),
        {},
    )
    host, port, user = (str(config.get(key) or "") for key in ("HOST", "PORT", "USER"))
    createdb = ["createdb"]
    for flag, value in (("-h", host), ("-p", port), ("-U", user)):
        if value:
            createdb += [flag, value]
    where = f" on {host}{f':{port}' if port else ''}" if host else ""
    sql_name = name if _PLAIN_IDENTIFIER.fullmatch(name) else '"' + name.replace('"', '""') + '"'
    return (
        f'the database "{name}" does not exist{where}: create it with'
        f" `{shlex.join([*createdb, name])}` (or `CREATE DATABASE {sql_name};` in psql),"
        f" then {MIGRATE}"
    )


def names_missing_schema(exc: BaseException) -> bool:
    """Whether `exc` is a statement that named a table or column the database lacks."""
    if not isinstance(exc, DatabaseError):
        return False
    if getattr(exc.__cause__, "sqlstate", None) in _UNDEFINED_SQLSTATES:
        return True
    return type(exc.__cause__).__module__ == "sqlite3" and any(
        words in str(exc) for words in _SQLITE_UNDEFINED
    )


def unapplied_migrations(using=DEFAULT_DB_ALIAS) -> list[str]:
    """The migrations `migrate` would apply, in order ("inbox.0001_initial", ...)."""
    executor = MigrationExecutor(connections[using])
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return [f"{migration.app_label}.{migration.name}" for migration, _ in plan]


def _unapplied_message(unapplied) -> str:
    count = len(unapplied)
    return (
        f"the database has {count} unapplied migration{'s' if count > 1 else ''}"
        f" (from {unapplied[0]}): {MIGRATE}"
    )


def check_database(using=DEFAULT_DB_ALIAS):
    """Before a loop starts: DatabaseUnusable when the database does not exist or has
    migrations to apply. An unreachable server passes: the loop waits the outage out, and a
    schema it then finds missing stops it (unusable)."""
    try:
        connections[using].ensure_connection()
    except OperationalError as exc:
        message = missing_database(exc)
        if message is None:
            return
        raise DatabaseUnusable(message) from None
    try:
        unapplied = unapplied_migrations(using)
    except DatabaseError:
        return  # gone again between the two: an outage
    if unapplied:
        raise DatabaseUnusable(_unapplied_message(unapplied))


def unusable(exc: BaseException, using=DEFAULT_DB_ALIAS) -> DatabaseUnusable | None:
    """What a loop's database error means: DatabaseUnusable for a database that does not
    exist or lacks a table or column this code uses; None for an outage, to wait out."""
    message = missing_database(exc)
    if message is not None:
        return DatabaseUnusable(message)
    if not names_missing_schema(exc):
        return None
    detail = str(exc).strip().splitlines()[0]
    try:
        unapplied = unapplied_migrations(using)
    except DatabaseError:
        unapplied = None
    if unapplied:
        return DatabaseUnusable(f"{_unapplied_message(unapplied)} ({detail})")
    if unapplied is None:
        return DatabaseUnusable(f"the database lacks what this code uses ({detail}): {MIGRATE}")
    # Every migration is recorded as applied, yet a table or column is missing: migrate has
    # nothing to do, and says so. A person changed the schema, or restored an older one.
    return DatabaseUnusable(
        f"the database lacks what this code uses ({detail}), though `manage.py showmigrations`"
        " lists every migration as applied: was the schema changed by hand?"
    )


class OutageBackoff:
    """Seconds to wait before the next try while the database is unreachable: doubling from
    FIRST, capped at CAP, so a loop is back within CAP seconds of the database returning
    (a 30 s cap left loops idle long after an outage had ended). A try every CAP seconds
    per loop is one failed connection attempt, nothing the database notices."""

    FIRST = 0.5
    CAP = 2.0

    def __init__(self):
        self.reset()

    def reset(self):
        self.delay = self.FIRST

    def next(self) -> float:
        delay = self.delay
        self.delay = min(delay * 2, self.CAP)
        return delay

    def attempt(self, step, stop, log):
        """`step()`'s result; or, when the database is unreachable, OUTAGE once the next
        delay has passed (or `stop` was set): the caller goes round its loop again. Every
        loop of every process waits out an outage this way. A database it cannot use is no
        outage: DatabaseUnusable says what to do."""
        try:
            result = step()
        except DatabaseError as exc:
            connection.close()
            if (cannot_use := unusable(exc)) is not None:
                raise cannot_use from exc
            delay = self.next()
            log.warning("database unavailable; retrying in %.1fs", delay, exc_info=True)
            stop.wait(delay)
            return OUTAGE
        self.reset()
        return result


# What OutageBackoff.attempt returns for a step the database did not let run.
OUTAGE = object()

# How long a process's start-up (runall's migrate, devserver's migration check) waits out a
# database server it cannot reach (restarting, failing over, not up yet) before it fails: the
# loops started next wait any later outage out, without a bound.
START_OUTAGE = 60


def through_outage(
    work, within, say, using=DEFAULT_DB_ALIAS, clock=time.monotonic, sleep=time.sleep
):
    """`work()`'s result (a process's start-up: `runall`'s migrate), tried again while the
    database server cannot be reached, for up to `within` seconds, at OutageBackoff's delays;
    `say(line)` tells of each retry. A server restarting, failing over or too slow to accept
    (connect_timeout) is an outage, which the loops started next wait out too: a start-up
    that gave up on it was a process that died on its own. A database that does not exist is
    none: its error is raised at once, for manage.py's one line; and SQLite has no server to
    wait for (its errors are its file's)."""
    backoff = OutageBackoff()
    deadline = clock() + within
    while True:
        try:
            return work()
        except OperationalError as exc:
            connections[using].close()
            delay = backoff.next()
            if (
                connections[using].vendor == "sqlite"
                or missing_database(exc) is not None
                or clock() + delay > deadline
            ):
                raise
            detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            say(f"database unavailable ({detail}); retrying in {delay:.1f}s")
            sleep(delay)
