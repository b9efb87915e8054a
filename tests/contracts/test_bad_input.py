"""Bad input is refused with an error that names the problem, and nothing is stored."""

import math
import re
from datetime import datetime, timedelta

import pytest

from alwayson.runtime.api import (
    acquire,
    add_timer,
    answer_approval,
    claim_batch,
    claim_more,
    dispatch,
    finish,
    ingest,
    request_approval,
    run_scheduler,
)
from inbox.exceptions import UnknownInbox
from inbox.models import Event
from inbox.services import Held
from outbox.models import OutboxMessage
from tests.support.tables import snapshot

HOUR = timedelta(hours=1)


@pytest.fixture
def unchanged(inbox):
    """Yields after taking a snapshot; fails the test if any table changed meanwhile."""
    before = snapshot()
    yield
    assert snapshot() == before


UNKNOWN_INBOX_CALLS = {
    "ingest": lambda ref, t0: ingest(ref, "chat", "m1", {}, now=t0),
    "acquire": lambda ref, t0: acquire(ref, "A", now=t0),
    "add_timer": lambda ref, t0: add_timer(ref, "digest", t0, {}, every=60),
    "request_approval": lambda ref, t0: request_approval(ref, "r1", "refund", HOUR, now=t0),
}


@pytest.mark.django_db
@pytest.mark.parametrize("call", UNKNOWN_INBOX_CALLS.values(), ids=UNKNOWN_INBOX_CALLS.keys())
@pytest.mark.parametrize("by", ["slug", "id"])
def test_unknown_inbox_is_refused(inbox, t0, call, by):
    ref = "no-such-inbox" if by == "slug" else inbox.pk + 1000
    before = snapshot()

    with pytest.raises(UnknownInbox, match=re.escape(f"unknown inbox: {ref!r}")):
        call(ref, t0)

    assert snapshot() == before


@pytest.mark.django_db
@pytest.mark.parametrize("every", [0, -60, 1.5, "3600", True])
def test_every_must_be_a_positive_int(inbox, t0, unchanged, every):
    with pytest.raises(ValueError, match="every must be a positive number of seconds"):
        add_timer(inbox, "digest", t0, {}, every=every)


@pytest.mark.django_db
def test_recurring_timer_cannot_have_a_fixed_event_key(inbox, t0, unchanged):
    with pytest.raises(ValueError, match="event_key"):
        add_timer(inbox, "digest", t0, {}, every=60, event_key=("approval", "r1"))


NOT_JSON = {
    "set": {"tags": {"a", "b"}},
    "datetime": {"at": datetime(2026, 3, 1)},
    "nan": {"score": math.nan},
}


@pytest.mark.django_db
@pytest.mark.parametrize("payload", NOT_JSON.values(), ids=NOT_JSON.keys())
def test_ingest_refuses_a_payload_that_is_not_json(inbox, t0, unchanged, payload):
    with pytest.raises(ValueError, match="payload is not JSON-serialisable"):
        ingest(inbox, "chat", "m1", payload, now=t0)


@pytest.mark.django_db
@pytest.mark.parametrize("payload", NOT_JSON.values(), ids=NOT_JSON.keys())
def test_add_timer_refuses_a_payload_that_is_not_json(inbox, t0, unchanged, payload):
    with pytest.raises(ValueError, match="payload is not JSON-serialisable"):
        add_timer(inbox, "digest", t0, payload, every=60)


@pytest.mark.django_db
@pytest.mark.parametrize("blank", ["", "   ", None])
@pytest.mark.parametrize("field", ["source", "source_id"])
def test_ingest_needs_a_source_and_a_source_id(inbox, t0, unchanged, field, blank):
    key = {"source": "chat", "source_id": "m1", field: blank}

    with pytest.raises(ValueError, match=f"^{field} must be a non-empty string"):
        ingest(inbox, key["source"], key["source_id"], {}, now=t0)


NAIVE = datetime(2026, 3, 1, 12, 0)
NAIVE_NOW_CALLS = {
    "ingest": lambda inbox: ingest(inbox, "chat", "m1", {}, now=NAIVE),
    "acquire": lambda inbox: acquire(inbox, "A", now=NAIVE),
    "claim_batch": lambda inbox: claim_batch(inbox, "A", 1, now=NAIVE),
    "claim_more": lambda inbox: claim_more(inbox, "A", 1, ["chat"], now=NAIVE),
    "finish": lambda inbox: finish(Held(inbox, "A", 1, []), now=NAIVE),
    "run_scheduler": lambda inbox: run_scheduler(now=NAIVE),
    "request_approval": lambda inbox: request_approval(inbox, "r1", "refund", HOUR, now=NAIVE),
    "answer_approval": lambda inbox: answer_approval(inbox, "r1", "yes", now=NAIVE),
    "dispatch": lambda inbox: dispatch(lambda delivery: None, now=NAIVE),
}


@pytest.mark.django_db
@pytest.mark.parametrize("call", NAIVE_NOW_CALLS.values(), ids=NAIVE_NOW_CALLS.keys())
def test_naive_now_is_refused(inbox, t0, call):
    # Something for each call to act on, were the clock accepted.
    ingest(inbox, "chat", "waiting", {}, now=t0)
    add_timer(inbox, "digest", t0, {}, every=60)
    OutboxMessage.objects.create(inbox=inbox, body="held", created=t0)
    before = snapshot()

    with pytest.raises(ValueError, match="now must be an aware datetime"):
        call(inbox)

    assert snapshot() == before


@pytest.mark.django_db
def test_timer_due_must_be_aware(inbox, unchanged):
    with pytest.raises(ValueError, match="due must be an aware datetime"):
        add_timer(inbox, "digest", NAIVE, {}, every=60)


@pytest.mark.django_db
@pytest.mark.parametrize("expires_in", [0, -3600, timedelta(0), timedelta(minutes=-5)])
def test_approval_must_expire_in_the_future(inbox, t0, unchanged, expires_in):
    with pytest.raises(ValueError, match="expires_in must be a positive number of seconds"):
        request_approval(inbox, "r1", "refund", expires_in, now=t0)


@pytest.mark.django_db
@pytest.mark.parametrize("source", ["approval", "timer"])
def test_reserved_sources_cannot_be_ingested(inbox, t0, unchanged, source):
    with pytest.raises(ValueError, match=f"source '{source}' is reserved"):
        ingest(inbox, source, "refund-1", {"answer": "yes"}, now=t0)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "payload, problem",
    [
        ({"text": "a\x00b"}, "NUL"),
        ({"k\x00": 1}, "NUL"),
        ({"k": ["\ud800"]}, "lone surrogate"),
        ({"\udfff": 1}, "lone surrogate"),
        ({"text": "caf\u00e9 \ud800", "n": 1}, "lone surrogate"),
        ({"a": [{"b": "\\u0000 and a real one \x00"}]}, "NUL"),
    ],
)
def test_payload_that_postgres_cannot_store_is_refused_on_every_database(
    inbox, t0, unchanged, payload, problem
):
    with pytest.raises(ValueError, match=f"payload contains a {problem}"):
        ingest(inbox, "chat", "m1", payload, now=t0)


@pytest.mark.django_db
def test_text_that_only_spells_an_escaped_nul_is_stored_as_written(inbox, t0):
    # In the payload's JSON a NUL is written \u0000; text that spells it is no NUL.
    payload = {"note": "\\u0000 is how JSON writes a NUL", "\\u0000": ["\\\\u0000"]}
    assert ingest(inbox, "chat", "m1", payload, now=t0)
    assert Event.objects.get(source_id="m1").payload == payload
