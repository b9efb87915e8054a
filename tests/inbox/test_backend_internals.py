"""The private psycopg and Django internals the PostgreSQL backend (inbox/backends/postgresql.py)
relies on: an upgrade that removes or reshapes one fails here, by name, rather than as a
statement that silently stops being prepared or logged. Their signatures are checked in
every lane (the newest versions' among them); what they do, on PostgreSQL."""

import inspect

import psycopg
import pytest
from django.db import connection
from django.db.backends.postgresql.base import DatabaseWrapper
from django.test.utils import CaptureQueriesContext

from inbox.backends import postgresql as backend


def parameters(function):
    return [(p.name, p.kind) for p in inspect.signature(function).parameters.values()]


def test_psycopg_still_sends_a_prepared_query_through_send_query_prepared():
    assert hasattr(psycopg.Cursor, "_send_query_prepared"), (
        "psycopg.Cursor._send_query_prepared is gone: _PreparingCursor's override no longer"
        " runs, and Django's query log would read None for every prepared statement"
    )
    assert parameters(psycopg.Cursor._send_query_prepared) == parameters(
        backend._PreparingCursor._send_query_prepared
    )


def test_django_still_wraps_a_driver_cursor_with_prepare_cursor():
    assert hasattr(DatabaseWrapper, "_prepare_cursor"), (
        "DatabaseWrapper._prepare_cursor is gone: prepared_cursor() wraps its psycopg cursor"
        " with it, as Django's own cursor() does"
    )
    assert [name for name, _ in parameters(DatabaseWrapper._prepare_cursor)] == [
        "self",
        "cursor",
    ]


@pytest.mark.postgres_only
@pytest.mark.django_db
def test_a_prepared_statement_is_prepared_and_logged_with_its_text(settings):
    settings.ALWAYSON_DB_PREPARE = True
    sql = "SELECT %s::int + 1 AS n /* test_backend_internals */"
    with CaptureQueriesContext(connection) as captured:
        for n in (1, 2):
            cursor = backend.prepared_cursor()
            cursor.execute(sql, [n])
            assert cursor.fetchone() == (n + 1,)
    assert [q["sql"] for q in captured] == [sql.replace("%s", "$1")] * 2
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
            ["%test_backend_internals%"],
        )
        assert cursor.fetchone() == (1,)
