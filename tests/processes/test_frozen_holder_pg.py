"""A worker frozen inside a transaction must not stall ingest for long (PostgreSQL).

The frozen worker is a real second session: a psycopg connection of its own that takes the
inbox's lease row lock and then does nothing, as a SIGSTOPped worker would. Deliveries and
answers wait for that lock at most ALWAYSON_INGEST_LOCK_WAIT and are refused as busy
(nothing stored; a webhook answers 503 with Retry-After), and the database ends the frozen
session after ALWAYSON_IDLE_IN_TRANSACTION_TIMEOUT, so the lock comes free on its own.
"""

import time
import uuid
from contextlib import contextmanager
from datetime import timedelta

import psycopg
import pytest
from django.db import connection, transaction
from django.test import Client

from alwayson.runtime.api import answer_approval, ingest, request_approval
from inbox.exceptions import InboxBusy
from inbox.models import Event
from tests.support.webhooks import BODY, GITHUB_SECRET, post, signed

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

WAIT = 0.3  # seconds: the bound these tests set, short so a refusal is quick


@pytest.fixture
def short_wait(settings):
    settings.ALWAYSON_INGEST_LOCK_WAIT = WAIT
    return settings


def session_params(**overrides):
    """What Django's own connections use (application_name, the idle timeout), for a
    session the test controls by hand."""
    params = connection.get_connection_params()
    keys = ("dbname", "user", "password", "host", "port", "options")
    conninfo = {key: params[key] for key in keys if params.get(key) not in (None, "")}
    conninfo.update(overrides)
    return conninfo


@contextmanager
def frozen_holder(inbox, **overrides):
    """A session that locks the inbox's lease row inside a transaction, then freezes."""
    with psycopg.connect(**session_params(**overrides)) as conn:
        conn.execute("SELECT 1 FROM inbox_lease WHERE inbox_id = %s FOR UPDATE", [inbox.pk])
        yield conn
        if not conn.closed and not conn.broken:
            conn.rollback()


def timed(call):
    started = time.monotonic()
    try:
        return call(), time.monotonic() - started
    except Exception as exc:
        return exc, time.monotonic() - started


def test_ingest_behind_a_frozen_holder_is_refused_as_busy_within_the_wait(inbox, short_wait):
    with frozen_holder(inbox):
        outcome, seconds = timed(lambda: ingest(inbox, "chat", "m-1", {"text": "hi"}))
    assert isinstance(outcome, InboxBusy)
    assert WAIT <= seconds < WAIT + 2
    assert not Event.objects.filter(inbox=inbox).exists()
    # The sender's retry, once the lock is free, stores the event once.
    assert ingest(inbox, "chat", "m-1", {"text": "hi"}) is True
    assert Event.objects.filter(inbox=inbox).count() == 1


def test_busy_inside_a_callers_transaction_leaves_that_transaction_usable(
    inbox, short_wait, make_inbox
):
    other = make_inbox()
    with frozen_holder(inbox), transaction.atomic():
        outcome, _ = timed(lambda: ingest(inbox, "chat", "m-1", {"text": "hi"}))
        assert isinstance(outcome, InboxBusy)
        # The caller goes on in its transaction: its next write commits with it.
        assert ingest(other, "chat", "m-1", {"text": "hi"}) is True
    assert list(Event.objects.values_list("inbox", flat=True)) == [other.pk]


def test_a_retry_of_a_stored_delivery_is_a_duplicate_even_behind_a_frozen_holder(inbox, short_wait):
    """A duplicate writes nothing and takes no lock: the sender's retry is acknowledged."""
    assert ingest(inbox, "chat", "m-1", {"text": "hi"}) is True
    with frozen_holder(inbox):
        # Had it waited for the lock, it would be InboxBusy: the holder never lets go.
        outcome, _ = timed(lambda: ingest(inbox, "chat", "m-1", {"text": "hi"}))
    assert outcome is False


def test_webhook_behind_a_frozen_holder_answers_503_with_retry_after(inbox, short_wait):
    short_wait.ALWAYSON_GITHUB_SECRETS = [GITHUB_SECRET]
    headers = signed("github", BODY)
    with frozen_holder(inbox):
        response = post(Client(), "github", inbox.slug, BODY, headers)
    assert response.status_code == 503
    assert response["Retry-After"] == str(short_wait.ALWAYSON_IDLE_IN_TRANSACTION_TIMEOUT)
    assert "busy" in response.json()["error"]
    assert not Event.objects.filter(inbox=inbox).exists()
    assert post(Client(), "github", inbox.slug, BODY, headers).status_code == 202


def test_chat_message_behind_a_frozen_holder_keeps_its_form_and_id(inbox, short_wait):
    client = Client()
    client.force_login(inbox.owner)
    message_id = str(uuid.uuid4())
    form = {"message_id": message_id, "text": "refund order 881"}
    with frozen_holder(inbox):
        response = client.post(f"/inbox/{inbox.slug}/", form)
    assert response.status_code == 503
    assert "busy" in response.content.decode()
    assert message_id in response.content.decode()  # sending again is the same message
    assert not Event.objects.filter(inbox=inbox).exists()
    assert client.post(f"/inbox/{inbox.slug}/", form).status_code == 302
    assert Event.objects.filter(inbox=inbox, source="chat", source_id=message_id).count() == 1


def test_answer_behind_a_frozen_holder_is_refused_as_busy_and_records_nothing(inbox, short_wait):
    request_approval(inbox, "refund-881", "refund order 881", timedelta(hours=1))
    client = Client()
    client.force_login(inbox.owner)
    with frozen_holder(inbox):
        outcome, seconds = timed(lambda: answer_approval(inbox, "refund-881", "yes"))
        response = client.post(f"/approvals/{inbox.slug}/refund-881/", {"answer": "yes"})
    assert isinstance(outcome, InboxBusy)
    assert seconds < WAIT + 2
    assert response.status_code == 503
    assert not Event.objects.filter(inbox=inbox, source="approval").exists()
    assert answer_approval(inbox, "refund-881", "yes").stands == "yes"


def test_an_answer_busy_inside_a_callers_transaction_leaves_that_transaction_usable(
    inbox, short_wait, make_inbox
):
    """The answer's lock is waited for in a pipeline of statements (locked_write): its
    timeout still rolls back only the answer's savepoint."""
    other = make_inbox()
    request_approval(inbox, "refund-881", "refund order 881", timedelta(hours=1))
    request_approval(other, "refund-882", "refund order 882", timedelta(hours=1))
    with frozen_holder(inbox), transaction.atomic():
        outcome, _ = timed(lambda: answer_approval(inbox, "refund-881", "yes"))
        assert isinstance(outcome, InboxBusy)
        assert answer_approval(other, "refund-882", "yes").stands == "yes"
    answered = Event.objects.filter(source="approval").values_list("source_id", flat=True)
    assert list(answered) == ["refund-882"]


def test_django_sessions_carry_the_idle_in_transaction_timeout(settings):
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('idle_in_transaction_session_timeout')")
        shown = cursor.fetchone()[0]
    assert shown == f"{settings.ALWAYSON_IDLE_IN_TRANSACTION_TIMEOUT}s"


def test_database_ends_a_frozen_session_and_ingest_then_stores(inbox, settings):
    """The mechanism the default relies on, with a 1 s timeout so the test is quick: the
    server ends the idle session, its lock comes free, a waiting delivery is stored."""
    settings.ALWAYSON_INGEST_LOCK_WAIT = 10
    with frozen_holder(inbox, options="-c idle_in_transaction_session_timeout=1s") as frozen:
        stored, seconds = timed(lambda: ingest(inbox, "chat", "m-2", {"text": "hi"}))
        assert stored is True
        assert 0.5 < seconds < 8
        with pytest.raises(psycopg.Error) as ended:
            frozen.execute("SELECT 1")  # its session is gone; it must start again
        # By its code, not the server's words: idle_in_transaction_session_timeout.
        assert ended.value.sqlstate == "25P03"
