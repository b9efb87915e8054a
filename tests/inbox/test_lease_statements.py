"""A worker's lease statements (a take and its claim, a renewal, a release) never hang: each is
bounded by ALWAYSON_LEASE_STATEMENT_TIMEOUT. PostgreSQL cancels one that runs longer
(statement_timeout, local to its transaction: a caller's own bound is put back after it);
SQLite stops waiting for its write lock (the busy timeout). Behind a session that holds what
they need, they fail within the bound instead of waiting as long as it holds.

The holding session is a real second one: a psycopg connection of its own (PostgreSQL), a
sqlite3 connection to the test's database file (SQLite).
"""

import sqlite3
import time
from contextlib import contextmanager

import pytest
from django.db import OperationalError, connection, transaction

from inbox.services import acquire, claim_batch, ingest, release, renew, take_next
from tests.support.postgres import on_postgres, other_session

pytestmark = pytest.mark.django_db(transaction=True)

BOUND = 0.3  # seconds: short, so that a bounded wait is quick


@pytest.fixture
def bound(settings):
    settings.ALWAYSON_LEASE_STATEMENT_TIMEOUT = BOUND


@contextmanager
def holding(inbox=None):
    """Another session holding the inbox's lease row (PostgreSQL) or, for no inbox, the
    events table; on SQLite, the database's write lock either way."""
    if on_postgres():
        with other_session() as other:
            # Let go after a while, whatever happens: a statement that is not bounded fails
            # the test instead of waiting for ever.
            other.execute("SET idle_in_transaction_session_timeout = '10s'")
            if inbox is None:
                other.execute("LOCK TABLE inbox_event IN ACCESS EXCLUSIVE MODE")
            else:
                other.execute(
                    "SELECT 1 FROM inbox_lease WHERE inbox_id = %s FOR UPDATE", [inbox.pk]
                )
            yield
            if not other.closed and not other.broken:
                other.rollback()
        return
    other = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        yield
        other.rollback()
    finally:
        other.close()


def timed(call):
    started = time.monotonic()
    try:
        return call(), time.monotonic() - started
    except Exception as exc:
        return exc, time.monotonic() - started


def assert_bounded(outcome, seconds):
    assert isinstance(outcome, OperationalError), outcome
    assert BOUND - 0.05 <= seconds < BOUND + 2, seconds


def test_a_renewal_behind_a_held_lease_fails_within_the_bound(inbox, bound):
    ingest(inbox, "chat", "m1", {})
    generation = acquire(inbox, "A")

    with holding(inbox):
        assert_bounded(*timed(lambda: renew(inbox, "A", generation)))

    assert renew(inbox, "A", generation) is True


def test_a_release_behind_a_held_lease_fails_within_the_bound(inbox, bound):
    generation = acquire(inbox, "A")

    with holding(inbox):
        assert_bounded(*timed(lambda: release(inbox, "A", generation)))

    assert release(inbox, "A", generation) is True


def test_a_claim_behind_a_held_lease_fails_within_the_bound(inbox, bound):
    ingest(inbox, "chat", "m1", {})
    generation = acquire(inbox, "A")

    with holding(inbox):
        assert_bounded(*timed(lambda: claim_batch(inbox, "A", generation)))

    assert [e.source_id for e in claim_batch(inbox, "A", generation)] == ["m1"]


@pytest.mark.parametrize("prepare", [True, False], ids=["through libpq", "psycopg's cursors"])
def test_a_take_that_cannot_read_the_events_fails_within_the_bound(inbox, bound, prepare, settings):
    settings.ALWAYSON_DB_PREPARE = prepare
    ingest(inbox, "chat", "m1", {})

    with holding():
        assert_bounded(*timed(lambda: take_next("A")))

    claim = take_next("A")
    assert [e.source_id for e in claim.events] == ["m1"]


@pytest.mark.postgres_only
def test_inside_a_callers_transaction_the_callers_own_bound_is_put_back(inbox, bound):
    ingest(inbox, "chat", "m1", {})

    def statement_timeout():
        with connection.cursor() as cursor:
            cursor.execute("SHOW statement_timeout")
            return cursor.fetchone()[0]

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL statement_timeout = '7s'")
        claim = take_next("A")
        assert statement_timeout() == "7s"
        assert renew(inbox, "A", claim.generation) is True
        assert statement_timeout() == "7s"
        assert release(inbox, "A", claim.generation) is True
        assert statement_timeout() == "7s"
        generation = acquire(inbox, "A")
        claim_batch(inbox, "A", generation)
        assert statement_timeout() == "7s"
