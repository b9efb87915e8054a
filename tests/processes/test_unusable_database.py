"""A database a process cannot use stops it with one line saying what to do, and exit 1.

On a database that was never migrated, the loop commands (with or without --once) exit at
start-up naming `migrate`, and so does `status`. On a PostgreSQL database that does not
exist, `migrate`, `runall` (what `make run` runs), `status` and the loops exit saying how to
create it. A server that does not answer is an outage, still waited out:
test_production_settings.py runs the loops against a closed port, and test_worker.py's
outage tests count the retries.

Each case is a `manage.py` process of its own, as a person starts it.
"""

import re

import pytest
from django.db import connection

from alwayson.ops.database import missing_database
from tests.support.env import environment, manage
from tests.support.postgres import other_session
from tests.support.processes import database_url, free_port

LOOPS = [("runworker", "--once"), ("runscheduler", "--once"), ("rundispatcher",)]
UNAPPLIED = re.compile(
    r"CommandError: the database has \d+ unapplied migrations \(from \w+\.0001_initial\):"
    r" run `python manage.py migrate`"
)


@pytest.fixture
def unmigrated_url(db, tmp_path):
    """An empty database of this run's kind: a new SQLite file, or a PostgreSQL database
    made for the test beside the test database, and dropped after it."""
    if connection.vendor != "postgresql":
        yield f"sqlite:///{tmp_path / 'never-migrated.sqlite3'}"
        return
    name = f"{connection.settings_dict['NAME']}_unmigrated"
    with other_session(autocommit=True) as session:
        session.execute(f'DROP DATABASE IF EXISTS "{name}"')
        session.execute(f'CREATE DATABASE "{name}"')
    try:
        yield database_url(name)
    finally:
        with other_session(autocommit=True) as session:
            session.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.parametrize("command", [*LOOPS, ("status",)], ids=" ".join)
def test_a_loop_command_on_a_database_never_migrated_exits_saying_to_migrate(
    unmigrated_url, command
):
    done = manage(*command, env=environment(DATABASE_URL=unmigrated_url))

    assert done.returncode == 1, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert UNAPPLIED.fullmatch(line), line
    assert done.stdout == ""


@pytest.mark.postgres_only  # a server to ask for a database it does not have
@pytest.mark.parametrize(
    "command",
    [("migrate",), ("runall",), ("status",), *LOOPS],
    ids=" ".join,
)
def test_a_postgres_database_that_does_not_exist_is_one_line_saying_how_to_create_it(db, command):
    name = f"{connection.settings_dict['NAME']}_missing"
    config = connection.settings_dict
    host, port, user = config["HOST"] or "127.0.0.1", config["PORT"] or 5432, config["USER"]
    if command[0] == "runall":
        # Were it to start anything after all, not on a port another test serves.
        command = (*command, "--addr", f"127.0.0.1:{free_port()}")

    done = manage(*command, env=environment(DATABASE_URL=database_url(name)))

    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == (
        f'CommandError: the database "{name}" does not exist on {host}:{port}: create it with'
        f" `createdb -h {host} -p {port} -U {user or 'postgres'} {name}` (or"
        f" `CREATE DATABASE {name};` in psql), then run `python manage.py migrate`"
    )


@pytest.mark.postgres_only
def test_traceback_shows_where_the_missing_database_was_met(db):
    name = f"{connection.settings_dict['NAME']}_missing"

    done = manage("migrate", "--traceback", env=environment(DATABASE_URL=database_url(name)))

    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert f'database "{name}" does not exist' in done.stderr.strip().splitlines()[-1]


def test_a_database_name_sql_must_quote_is_quoted_in_the_create_statement():
    from django.db import OperationalError

    refused = OperationalError(
        'connection failed: connection to server at "10.0.0.5", port 5432 failed:'
        ' FATAL:  database "Desk-2" does not exist'
    )

    # Not a database of the settings: nothing to say where, and no flags to guess.
    assert missing_database(refused) == (
        'the database "Desk-2" does not exist: create it with `createdb Desk-2` (or'
        ' `CREATE DATABASE "Desk-2";` in psql), then run `python manage.py migrate`'
    )


def test_a_connection_refused_is_not_a_missing_database():
    from django.db import OperationalError

    refused = OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 5499 failed:'
        " Connection refused\n\tIs the server running on that host and accepting TCP/IP"
        " connections?"
    )

    assert missing_database(refused) is None
