"""Ingest's wake-up on PostgreSQL: a NOTIFY when the inbox's work marker moves, none while
it stands (a notifying commit is serialised database-wide, so each one costs every writer)."""

from datetime import timedelta

import psycopg
import pytest
from django.db import connection

from alwayson.runtime.api import acquire, claim_batch, finish, ingest, ingest_many
from inbox.backends.postgresql import BY_INDEX
from inbox.exceptions import InboxBusy
from inbox.models import Event, Lease
from inbox.services import WORK_CHANNEL, Held, release
from tests.support import postgres

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def listener():
    params = connection.get_connection_params()
    keys = ("dbname", "user", "password", "host", "port")
    with psycopg.connect(
        autocommit=True, **{key: params[key] for key in keys if params.get(key)}
    ) as conn:
        conn.execute(f"LISTEN {WORK_CHANNEL}")

        def received():
            return [n.payload for n in conn.notifies(timeout=0.5)]

        yield received


def test_a_notify_goes_out_when_the_marker_moves_and_not_while_it_stands(inbox, t0, listener):
    assert ingest(inbox, "chat", "m1", now=t0)
    assert listener() == [str(inbox.pk)]
    # The marker stands at t0: the inbox was announced, nothing more to say.
    assert ingest(inbox, "chat", "m2", now=t0 + timedelta(seconds=1))
    assert ingest_many(inbox, [("chat", "m3"), ("chat", "m4")], now=t0 + timedelta(seconds=2))
    assert ingest(inbox, "chat", "m1", now=t0) is False
    assert listener() == []
    # Drained: the finish clears the marker, so the next delivery announces the inbox again.
    generation = acquire(inbox, "w", now=t0 + timedelta(seconds=3))
    batch = claim_batch(inbox, "w", generation, now=t0 + timedelta(seconds=3))
    assert finish(
        Held(inbox, "w", generation, [e.pk for e in batch]), now=t0 + timedelta(seconds=3)
    )
    assert release(inbox, "w", generation)
    assert Lease.objects.get(inbox=inbox).work_at is None
    assert listener() == []
    assert ingest(inbox, "chat", "m5", now=t0 + timedelta(seconds=4))
    assert listener() == [str(inbox.pk)]


def test_an_earlier_event_moves_the_marker_and_notifies(inbox, t0, listener):
    assert ingest(inbox, "chat", "late", now=t0 + timedelta(seconds=10))
    assert listener() == [str(inbox.pk)]
    assert ingest(inbox, "chat", "early", now=t0)
    assert Lease.objects.get(inbox=inbox).work_at == t0
    assert listener() == [str(inbox.pk)]


# --- the delivery's own statement, run through libpq ----------------------------------------


def prepared_by_alwayson():
    """What _Direct prepared, but for the plan setting it sends before each statement."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE name LIKE 'alwayson_%'")
        prepared = [row[0] for row in cursor.fetchall()]
    assert prepared.count(BY_INDEX) == 1, prepared
    return [statement for statement in prepared if statement != BY_INDEX]


@pytest.fixture
def other_session():
    with postgres.other_session() as conn:
        yield conn


def test_deliveries_while_the_marker_stands_share_one_statement_prepared_once(inbox, t0):
    connection.close()  # a session of its own
    for n in range(4):
        assert ingest(inbox, "chat", f"m{n}", now=t0 + timedelta(seconds=n))
    assert ingest(inbox, "chat", "m0", now=t0) is False
    [statement] = prepared_by_alwayson()
    assert "FOR SHARE OF l SKIP LOCKED" in statement
    assert Event.objects.filter(inbox=inbox).count() == 4
    assert Lease.objects.get(inbox=inbox).work_at == t0


def test_a_statement_a_pooler_deallocated_is_prepared_again(inbox, t0):
    assert ingest(inbox, "chat", "m1", now=t0)
    assert ingest(inbox, "chat", "m2", now=t0)
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")  # what a transaction pooler's DISCARD ALL does
    assert ingest(inbox, "chat", "m3", now=t0)
    assert ingest(inbox, "chat", "m3", now=t0) is False
    assert len(prepared_by_alwayson()) == 1
    assert Event.objects.filter(inbox=inbox).count() == 3


def test_a_lock_wait_in_the_delivery_statement_is_inbox_busy_and_stores_nothing(
    inbox, t0, other_session
):
    assert ingest(inbox, "chat", "m1", now=t0)  # the marker stands: the next is the try alone
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '200ms'")
    try:
        # Its event's foreign key check waits on the inbox row at commit, past the timeout.
        other_session.execute("SELECT 1 FROM inbox_inbox WHERE id = %s FOR UPDATE", [inbox.pk])
        with pytest.raises(InboxBusy):
            ingest(inbox, "chat", "m2", now=t0)
        other_session.rollback()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 0")
    assert not Event.objects.filter(inbox=inbox, source_id="m2").exists()
    assert ingest(inbox, "chat", "m2", now=t0)  # the connection is still good
