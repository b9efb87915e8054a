"""Ingest's wake-up on PostgreSQL: a NOTIFY when the inbox's work marker moves, none while
it stands (a notifying commit is serialised database-wide, so each one costs every writer)."""

from datetime import timedelta

import psycopg
import pytest
from django.db import connection

from alwayson.api import acquire, claim_batch, finish, ingest, ingest_many
from inbox.models import Lease
from inbox.services import WORK_CHANNEL, release

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
    assert finish(inbox, "w", generation, [e.pk for e in batch], now=t0 + timedelta(seconds=3))
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
