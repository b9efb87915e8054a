"""PostgreSQL sessions seen from the test: which database, and who waits on whose lock."""

import time

import psycopg
from django.db import connection


def on_postgres():
    return connection.vendor == "postgresql"


def other_session(**options):
    """A psycopg connection of its own to the test database: a second session beside the
    test's, to hold a lock or LISTEN while the code under test runs."""
    params = connection.get_connection_params()
    keys = ("dbname", "user", "password", "host", "port")
    return psycopg.connect(**{k: params[k] for k in keys if params.get(k)}, **options)


def wait_until_blocked(pids, timeout, what="backends"):
    """Wait until every PostgreSQL backend in `pids` waits on a lock another session holds:
    the way to know a race is really queued, not merely likely."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while True:
            cursor.execute(
                "SELECT count(*) FROM unnest(%s::int[]) AS p"
                " WHERE cardinality(pg_blocking_pids(p)) > 0",
                [list(pids)],
            )
            if cursor.fetchone()[0] == len(pids):
                return
            assert time.monotonic() < deadline, f"{what} {pids} never blocked on a lock"
            time.sleep(0.005)
