"""Every "could not reach the inbox in time" failure of a delivery is InboxBusy (a webhook's
503 with Retry-After; nothing stored, the sender retries), and a real error stays an error.

The first delivery to an idle inbox waits for its lease row in a statement sent through
psycopg's pipeline, outside any transaction: the implicit transaction commits at the
pipeline's Sync, and the commit can fail too. Here it waits at commit on the inbox row (its
event's foreign key check, deferred), which a second session holds: in production the wait
was for the lock every notifying commit takes, held by a commit that waited for a
synchronous standby. psycopg raised such a commit's error as "cannot exit pipeline mode
while busy" and left the connection unusable (inbox/backends/postgresql.py, _pipeline).
"""

import threading
import time
from contextlib import nullcontext

import pytest
from django.db import OperationalError, connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from alwayson.runtime.api import ingest
from inbox.exceptions import InboxBusy
from inbox.models import Event
from tests.support import postgres
from tests.support.webhooks import BODY, GITHUB_SECRET, post, signed

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

WAIT = 0.2  # seconds: ALWAYSON_INGEST_LOCK_WAIT here, short so a refusal is quick


@pytest.fixture
def short_wait(settings):
    settings.ALWAYSON_INGEST_LOCK_WAIT = WAIT
    return settings


@pytest.fixture
def inbox_row_held(inbox):
    """A second session holding the inbox's row: a delivery's commit waits for it."""
    with postgres.other_session() as other:
        other.execute("SELECT 1 FROM inbox_inbox WHERE id = %s FOR UPDATE", [inbox.pk])
        yield other
        other.rollback()


def once_blocked(sql):
    """On a thread, once this test's session waits on a lock, `sql` run on it (its backend's
    pid the parameter) from a session of its own: a cancel or a termination in mid-wait. The
    thread; join it, then check its `failed` (empty when it ran)."""
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    failed = []

    def act():
        try:
            with postgres.other_session(autocommit=True) as other:
                deadline = time.monotonic() + 20
                while not other.execute(
                    "SELECT cardinality(pg_blocking_pids(%s)) > 0", [pid]
                ).fetchone()[0]:
                    assert time.monotonic() < deadline, "the delivery never waited on a lock"
                    time.sleep(0.005)
                other.execute(sql, [pid])
        except Exception as exc:  # the test thread reports it
            failed.append(exc)

    thread = threading.Thread(target=act)
    thread.failed = failed
    thread.start()
    return thread


@pytest.mark.parametrize("watched", [False, True], ids=["kept-cursors", "queries-logged"])
def test_a_lock_wait_past_the_bound_at_a_deliverys_commit_is_busy_and_the_connection_goes_on(
    inbox, short_wait, inbox_row_held, watched
):
    watching = CaptureQueriesContext(connection) if watched else nullcontext()
    with watching, pytest.raises(InboxBusy) as busy:
        ingest(inbox, "chat", "m-1", {"text": "hi"})
    assert f"within {WAIT:g}s" in str(busy.value)
    inbox_row_held.rollback()
    assert not Event.objects.filter(inbox=inbox).exists()
    # The same connection, left out of pipeline mode: the sender's retry stores the event.
    assert ingest(inbox, "chat", "m-1", {"text": "hi"}) is True
    assert Event.objects.filter(inbox=inbox).count() == 1


def test_a_cancel_while_a_delivery_waits_at_its_commit_is_busy(inbox, inbox_row_held, settings):
    settings.ALWAYSON_INGEST_LOCK_WAIT = 30  # the cancel comes first
    canceller = once_blocked("SELECT pg_cancel_backend(%s)")
    with pytest.raises(InboxBusy) as busy:
        ingest(inbox, "chat", "m-1", {"text": "hi"})
    canceller.join()
    assert canceller.failed == []
    assert "canceling statement due to user request" in str(busy.value)
    inbox_row_held.rollback()
    assert not Event.objects.filter(inbox=inbox).exists()
    assert ingest(inbox, "chat", "m-1", {"text": "hi"}) is True


def test_a_statement_timeout_while_a_delivery_waits_for_the_lease_row_is_busy(inbox, settings):
    settings.ALWAYSON_INGEST_LOCK_WAIT = 30  # the statement's own bound comes first
    with connection.cursor() as cursor:
        cursor.execute("SET statement_timeout = '200ms'")
    try:
        with postgres.other_session() as other:
            other.execute("SELECT 1 FROM inbox_lease WHERE inbox_id = %s FOR UPDATE", [inbox.pk])
            with pytest.raises(InboxBusy) as busy:
                ingest(inbox, "chat", "m-1", {"text": "hi"})
            other.rollback()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET statement_timeout = 0")
    assert "canceling statement due to statement timeout" in str(busy.value)
    assert not Event.objects.filter(inbox=inbox).exists()
    assert ingest(inbox, "chat", "m-1", {"text": "hi"}) is True


def test_a_session_terminated_while_a_delivery_waits_at_its_commit_stays_an_error(
    inbox, inbox_row_held, settings
):
    """Not a wait that ran out: the database ended the session. The sender sees an error
    naming that, not InboxBusy and not psycopg's "cannot exit pipeline mode"."""
    settings.ALWAYSON_INGEST_LOCK_WAIT = 30
    terminator = once_blocked("SELECT pg_terminate_backend(%s)")
    with pytest.raises(OperationalError) as failed:
        ingest(inbox, "chat", "m-1", {"text": "hi"})
    terminator.join()
    assert terminator.failed == []
    assert "terminating connection due to administrator command" in str(failed.value)
    connection.close()
    inbox_row_held.rollback()
    assert not Event.objects.filter(inbox=inbox).exists()


def test_a_webhook_whose_commit_waits_past_the_bound_answers_503_with_retry_after(
    inbox, short_wait, inbox_row_held
):
    short_wait.ALWAYSON_GITHUB_SECRETS = [GITHUB_SECRET]
    headers = signed("github", BODY)
    response = post(Client(), "github", inbox.slug, BODY, headers)
    assert response.status_code == 503
    assert response["Retry-After"] == str(short_wait.ALWAYSON_IDLE_IN_TRANSACTION_TIMEOUT)
    assert "busy" in response.json()["error"]
    inbox_row_held.rollback()
    assert not Event.objects.filter(inbox=inbox).exists()
    assert post(Client(), "github", inbox.slug, BODY, headers).status_code == 202
