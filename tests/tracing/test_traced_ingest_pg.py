"""A traced delivery on PostgreSQL: its event and its trace context commit together, in one
transaction, and a lock wait past ALWAYSON_INGEST_LOCK_WAIT stores neither."""

import pytest

from alwayson.runtime.api import ingest
from inbox import tracing
from inbox.exceptions import InboxBusy
from inbox.models import Event, EventTrace
from tests.support import postgres

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def other_session():
    with postgres.other_session() as conn:
        yield conn


def test_a_traced_delivery_past_its_lock_wait_is_busy_and_stores_no_event_nor_trace(
    receiver, inbox, t0, other_session, settings
):
    settings.ALWAYSON_INGEST_LOCK_WAIT = 0.2
    other_session.execute("SELECT 1 FROM inbox_lease WHERE inbox_id = %s FOR UPDATE", [inbox.pk])
    with tracing.span("POST /hooks"), pytest.raises(InboxBusy):
        ingest(inbox, "chat", "m1", now=t0)
    other_session.rollback()
    assert not Event.objects.exists() and not EventTrace.objects.exists()

    with tracing.span("POST /hooks"):
        traceparent = tracing.traceparent()
        assert ingest(inbox, "chat", "m1", now=t0)
    # Committed, both: seen from another session.
    row = other_session.execute(
        "SELECT t.traceparent FROM inbox_eventtrace t JOIN inbox_event e ON e.id = t.event_id"
        " WHERE e.inbox_id = %s AND e.source_id = 'm1'",
        [inbox.pk],
    ).fetchone()
    assert row == (traceparent,)
