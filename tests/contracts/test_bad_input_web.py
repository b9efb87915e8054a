"""What a sender or a person can post: webhooks, the approval page, the inbox page and its chat
form, the admin. Each table row is one bad request and the answer it gets (a 4xx with the
reason in the body), and every row checks that no table changed.
"""

import json
import logging
import time
import uuid
from datetime import timedelta

import pytest
from django import forms
from django.contrib import messages
from django.core.validators import MaxLengthValidator
from django.test import Client

from alwayson.ops.models import Process
from approvals.models import Approval, AuditEntry
from approvals.services import request_approval
from inbox import webhooks
from inbox.models import Event, Inbox, Lease, Membership, Role, Session
from inbox.services import acquire, claim_batch, ingest
from outbox.models import Notice, OutboxMessage
from tests.support.webhooks import (
    GITHUB_SECRET,
    STANDARD_SECRET,
    STRIPE_SECRET,
    github_headers,
    hex_hmac,
)
from tests.support.wording import field_error, in_html, limit_error
from timers.models import Timer

pytestmark = pytest.mark.django_db

MODELS = (Inbox, Lease, Event, Session, Timer, Approval, AuditEntry, OutboxMessage, Notice)
MODELS += (Membership, Process)
LIMIT = 64 * 1024  # ALWAYSON_WEBHOOK_MAX_BYTES in these tests: above the deep bodies


def snapshot():
    return {model.__name__: list(model.objects.order_by("pk").values()) for model in MODELS}


# --- webhooks ---------------------------------------------------------------------------------


@pytest.fixture
def hooks(settings, inbox):
    settings.ALWAYSON_GITHUB_SECRETS = [GITHUB_SECRET]
    settings.ALWAYSON_STRIPE_SECRETS = [STRIPE_SECRET]
    settings.ALWAYSON_STANDARD_SECRETS = [STANDARD_SECRET]
    settings.ALWAYSON_WEBHOOK_INBOX_SECRETS = {}
    settings.ALWAYSON_WEBHOOK_MAX_BYTES = LIMIT
    return inbox


def event(**fields):
    """A JSON object every scheme accepts (Stripe needs its id and type)."""
    return json.dumps({"id": "evt_1", "type": "charge.succeeded", **fields}).encode()


def now():
    return int(time.time())


def deep(levels):
    return b"[" * levels + b"]" * levels


def stripe_signed(body: bytes, timestamp=None):
    """Stripe's scheme over raw bytes (its library signs text only, and these bodies need
    not be UTF-8)."""
    timestamp = now() if timestamp is None else timestamp
    v1 = hex_hmac(STRIPE_SECRET, f"{timestamp}.".encode() + body)
    return {"Stripe-Signature": f"t={timestamp},v1={v1}"}


def standard_signed(body: bytes, timestamp=None, msg_id="msg_1"):
    timestamp = now() if timestamp is None else timestamp
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": webhooks.sign_standard(body, msg_id, timestamp, [STANDARD_SECRET]),
    }


SIGN = {"github": github_headers, "stripe": stripe_signed, "standard": standard_signed}


def signed(scheme, body, **overrides):
    """Headers signing `body` correctly, then `overrides` (None removes a header)."""
    headers = {**SIGN[scheme](body), **overrides}
    return {name: value for name, value in headers.items() if value is not None}


def delivery(body, headers=None, content_type="application/json"):
    """A bad request: (body, headers or a function of the scheme, content type)."""
    return body, headers, content_type


# Rows for every scheme: a body that is not what the sender says, each correctly signed.
EVERY_SCHEME = {
    "bad-json": (event()[:-1], 400, "body is not UTF-8 JSON"),
    "not-utf8": (b'{"id": "evt_1", "type": "x", "n": "\xff\xfe"}', 400, "body is not UTF-8 JSON"),
    "latin1": ('{"id": "evt_1", "type": "é"}'.encode("latin-1"), 400, "not UTF-8 JSON"),
    "utf16": (event().decode().encode("utf-16"), 400, "body is not UTF-8 JSON"),
    "empty": (b"", 400, "body is not UTF-8 JSON"),
    "deep-arrays": (deep(10_000), 400, "nests deeper than 100"),
    "deep-objects": (b'{"a":' * 150 + b"1" + b"}" * 150, 400, "nests deeper than 100"),
    "nan": (b'{"id": "evt_1", "type": "x", "n": NaN}', 400, "is not valid JSON"),
    "huge-number": (b'{"id": "evt_1", "type": "x", "n": 1e999}', 400, "out of range"),
    "nul": (b'{"id": "evt_1", "type": "x", "n": "a\\u0000"}', 400, "NUL"),
    "surrogate": (b'{"id": "evt_1", "type": "x", "n": "\\udc00"}', 400, "unpaired surrogate"),
    "huge-digits": (b'{"id": "evt_1", "type": "x", "n": ' + b"1" * 5000 + b"}", 400, "JSON"),
}


@pytest.mark.parametrize("scheme", ["github", "stripe", "standard"])
@pytest.mark.parametrize(
    "body, status, reason",
    [pytest.param(*row, id=name) for name, row in EVERY_SCHEME.items()],
)
def test_a_signed_delivery_of_a_bad_body_is_refused(client, hooks, scheme, body, status, reason):
    before = snapshot()

    response = client.post(
        f"/hooks/{scheme}/desk/",
        body,
        content_type="application/json",
        headers=signed(scheme, body),
    )

    assert response.status_code == status, response.content
    assert reason in response.json()["error"]
    assert snapshot() == before


# Rows for one scheme each: headers missing, malformed, forged, or content that is signed but
# not a delivery of that scheme. (scheme, body, headers over the signed ones, status, reason)
HEADER_ROWS = {
    "github-no-signature": ("github", {"X-Hub-Signature-256": None}, 401, "missing X-Hub"),
    "github-sig-not-hex": ("github", {"X-Hub-Signature-256": "sha256=zz"}, 401, "64 hex"),
    "github-sig-huge": ("github", {"X-Hub-Signature-256": "sha256=" + "a" * 9000}, 401, "hex"),
    "github-sig-wrong": ("github", {"X-Hub-Signature-256": "sha256=" + "0" * 64}, 401, "match"),
    "github-no-event": ("github", {"X-GitHub-Event": None}, 400, "X-GitHub-Event must be"),
    "github-no-delivery": ("github", {"X-GitHub-Delivery": None}, 400, "X-GitHub-Delivery"),
    "github-hook-id-colon": ("github", {"X-GitHub-Hook-ID": "1:2"}, 400, "X-GitHub-Hook-ID"),
    "github-delivery-space": ("github", {"X-GitHub-Delivery": "a b"}, 400, "X-GitHub-Delivery"),
    "github-delivery-huge": ("github", {"X-GitHub-Delivery": "d" * 129}, 400, "1-128"),
    "stripe-no-signature": ("stripe", {"Stripe-Signature": None}, 401, "missing Stripe-Sig"),
    "stripe-no-t": ("stripe", {"Stripe-Signature": "v1=" + "0" * 64}, 400, "exactly one t="),
    "stripe-t-text": ("stripe", {"Stripe-Signature": "t=soon,v1=00"}, 400, "integer Unix"),
    "stripe-two-t": ("stripe", {"Stripe-Signature": "t=1,t=2,v1=00"}, 400, "exactly one t="),
    "stripe-no-v1": ("stripe", lambda: {"Stripe-Signature": f"t={now()}"}, 401, "no v1"),
    "stripe-stale": (
        "stripe",
        lambda: stripe_signed(event(), timestamp=now() - 3600),
        400,
        "older than 300 seconds",
    ),
    "standard-no-id": ("standard", {"webhook-id": None}, 400, "missing webhook-id"),
    "standard-id-space": ("standard", {"webhook-id": "msg 1"}, 400, "webhook-id must be"),
    "standard-no-ts": ("standard", {"webhook-timestamp": None}, 400, "missing webhook-timestamp"),
    "standard-ts-text": ("standard", {"webhook-timestamp": "now"}, 400, "integer Unix seconds"),
    "standard-ts-future": (
        "standard",
        lambda: standard_signed(event(), timestamp=now() + 3600),
        400,
        "in the future",
    ),
    "standard-no-sig": ("standard", {"webhook-signature": None}, 401, "missing webhook-sig"),
    "standard-sig-junk": ("standard", {"webhook-signature": "v1,!!! v2,x"}, 401, "well-formed"),
}


@pytest.mark.parametrize(
    "scheme, headers, status, reason",
    [pytest.param(*row, id=name) for name, row in HEADER_ROWS.items()],
)
def test_bad_or_missing_headers_are_refused(client, hooks, scheme, headers, status, reason):
    body = event()
    headers = headers() if callable(headers) else signed(scheme, body, **headers)
    before = snapshot()

    response = client.post(
        f"/hooks/{scheme}/desk/", body, content_type="application/json", headers=headers
    )

    assert response.status_code == status, response.content
    assert reason in response.json()["error"]
    assert snapshot() == before


# Correctly signed, well-formed JSON, but not a delivery the scheme defines.
SIGNED_BAD_CONTENT = {
    "stripe-array": ("stripe", b"[1, 2]", "a Stripe event body must be a JSON object"),
    "stripe-no-id": ("stripe", b'{"type": "x"}', "needs an 'id'"),
    "stripe-id-int": ("stripe", b'{"id": 5, "type": "x"}', "needs an 'id'"),
    "stripe-id-space": ("stripe", b'{"id": "evt 1", "type": "x"}', "needs an 'id'"),
    "stripe-id-huge": ("stripe", json.dumps({"id": "e" * 129, "type": "x"}).encode(), "1-128"),
    "stripe-no-type": ("stripe", b'{"id": "evt_1"}', "needs a 'type' string"),
    "stripe-type-empty": ("stripe", b'{"id": "evt_1", "type": ""}', "needs a 'type' string"),
}


@pytest.mark.parametrize(
    "scheme, body, reason",
    [pytest.param(*row, id=name) for name, row in SIGNED_BAD_CONTENT.items()],
)
def test_a_valid_signature_over_bad_content_is_400(client, hooks, scheme, body, reason):
    before = snapshot()

    response = client.post(
        f"/hooks/{scheme}/desk/",
        body,
        content_type="application/json",
        headers=signed(scheme, body),
    )

    assert response.status_code == 400, response.content
    assert reason in response.json()["error"]
    assert snapshot() == before


@pytest.mark.parametrize("scheme", ["github", "stripe", "standard"])
@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"],
)
def test_a_body_that_is_not_json_by_its_content_type_is_415(client, hooks, scheme, content_type):
    body = event()
    before = snapshot()

    response = client.post(
        f"/hooks/{scheme}/desk/", body, content_type=content_type, headers=signed(scheme, body)
    )

    assert response.status_code == 415, response.content
    assert "Content-Type must be application/json" in response.json()["error"]
    assert snapshot() == before


@pytest.mark.parametrize("scheme", ["github", "stripe", "standard"])
@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "application/x+json"])
def test_json_content_types_are_accepted(client, hooks, scheme, content_type):
    body = event()
    response = client.post(
        f"/hooks/{scheme}/desk/", body, content_type=content_type, headers=signed(scheme, body)
    )
    assert response.status_code == 202, response.content


@pytest.mark.parametrize("scheme", ["github", "stripe", "standard"])
def test_a_body_over_the_limit_is_413_before_the_signature(client, hooks, scheme):
    body = event(padding="x" * LIMIT)
    before = snapshot()

    for headers in (signed(scheme, body), {}):
        response = client.post(
            f"/hooks/{scheme}/desk/", body, content_type="application/json", headers=headers
        )
        assert response.status_code == 413, response.content
        assert f"larger than {LIMIT} bytes" in response.json()["error"]
    assert snapshot() == before


@pytest.mark.parametrize("scheme", ["github", "stripe", "standard"])
def test_a_body_nested_to_the_limit_is_stored(client, hooks, scheme):
    """The stored payload wraps the body one level down: still under ingest's own limit."""
    body = json.dumps({"id": "evt_1", "type": "x", "n": json.loads(deep(99))}).encode()
    response = client.post(
        f"/hooks/{scheme}/desk/",
        body,
        content_type="application/json",
        headers=signed(scheme, body),
    )
    assert response.status_code == 202, response.content


@pytest.mark.parametrize("scheme", ["github", "stripe", "standard"])
@pytest.mark.parametrize("method", ["get", "put", "delete"])
def test_other_methods_are_405(client, hooks, scheme, method):
    response = getattr(client, method)(f"/hooks/{scheme}/desk/")
    assert response.status_code == 405
    assert "webhooks are POSTed" in response.json()["error"]


@pytest.mark.parametrize("scheme", ["github", "stripe", "standard"])
@pytest.mark.parametrize("slug", ["nobody", "x" * 300, "%C3%A9", "-", "desk.json"])
def test_an_unknown_inbox_is_401_unsigned_and_404_signed(client, hooks, scheme, slug):
    body = event()
    before = snapshot()
    unsigned = client.post(f"/hooks/{scheme}/{slug}/", body, content_type="application/json")
    assert unsigned.status_code == 401, unsigned.content
    assert "signature" in unsigned.json()["error"].lower()
    signed_response = client.post(
        f"/hooks/{scheme}/{slug}/",
        body,
        content_type="application/json",
        headers=signed(scheme, body),
    )
    assert signed_response.status_code == 404, signed_response.content
    assert "no inbox named" in signed_response.json()["error"]
    assert snapshot() == before


def test_a_github_form_encoded_delivery_says_to_send_json(client, hooks):
    """GitHub offers application/x-www-form-urlencoded; the answer names the setting."""
    body = b"payload=" + event()
    headers = {
        **github_headers(body),
        "X-Hub-Signature-256": "sha256=" + hex_hmac(GITHUB_SECRET, body),
    }
    response = client.post(
        "/hooks/github/desk/",
        body,
        content_type="application/x-www-form-urlencoded",
        headers=headers,
    )
    assert response.status_code == 415
    assert "application/json" in response.json()["error"]


# --- the approval page ------------------------------------------------------------------------


@pytest.fixture
def people(django_user_model, make_inbox):
    owner = django_user_model.objects.create_user("dana", password="pw-dana-123")
    viewer = django_user_model.objects.create_user("vic", password="pw-vic-123")
    stranger = django_user_model.objects.create_user("sam", password="pw-sam-123")
    desk = make_inbox("desk", owner=owner)
    other = make_inbox("other-desk", owner=stranger)
    Membership.objects.create(inbox=desk, user=viewer, role=Role.VIEWER)
    request_approval(desk, "refund-1", "refund order 1", timedelta(hours=4))
    request_approval(other, "refund-9", "refund order 9", timedelta(hours=4))
    return {"owner": owner, "viewer": viewer, "stranger": stranger}


def logged_in(user, csrf=False):
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


# (who, path, data, status, reason in the body): POSTs to the approval page
APPROVAL_ROWS = {
    "other-users-approval": ("owner", "other-desk/refund-9", {"answer": "yes"}, 404, ""),
    "other-user-on-mine": ("stranger", "desk/refund-1", {"answer": "yes"}, 404, ""),
    "unknown-id": ("owner", "desk/refund-2", {"answer": "yes"}, 404, ""),
    "forged-id": ("owner", "desk/refund-1%20OR%201=1", {"answer": "yes"}, 404, ""),
    "huge-id": ("owner", "desk/" + "r" * 5000, {"answer": "yes"}, 404, ""),
    "unknown-inbox": ("owner", "nobody/refund-1", {"answer": "yes"}, 404, ""),
    "answer-maybe": ("owner", "desk/refund-1", {"answer": "maybe"}, 400, 'answer must be "yes"'),
    "answer-expired": ("owner", "desk/refund-1", {"answer": "expired"}, 400, "answer must be"),
    "answer-missing": ("owner", "desk/refund-1", {}, 400, 'answer must be "yes" or "no"'),
    "answer-twice": ("owner", "desk/refund-1", {"answer": ["yes", "no"]}, 400, "answer must be"),
    "answer-huge": ("owner", "desk/refund-1", {"answer": "y" * 100_000}, 400, "answer must be"),
    "answer-nul": ("owner", "desk/refund-1", {"answer": "yes\x00"}, 400, "NUL"),
    "viewer": ("viewer", "desk/refund-1", {"answer": "yes"}, 403, "you are a viewer of desk"),
    "reply-to-a-permission": (
        "owner",
        "desk/refund-1",
        {"answer": "replied", "reply": "Monday"},
        400,
        "asks for a yes or a no, not a value",
    ),
    "all-at-once-maybe": ("owner", "desk/refund-1/all", {"answer": "maybe"}, 400, "answer must be"),
    "all-at-once-viewer": (
        "viewer",
        "desk/refund-1/all",
        {"answer": "no"},
        403,
        "a viewer of desk",
    ),
    "all-at-once-other-users": ("owner", "other-desk/refund-9/all", {"answer": "yes"}, 404, ""),
}


@pytest.mark.parametrize(
    "who, path, data, status, reason",
    [pytest.param(*row, id=name) for name, row in APPROVAL_ROWS.items()],
)
def test_a_bad_answer_post_is_refused_and_nothing_changes(people, who, path, data, status, reason):
    client = logged_in(people[who])
    before = snapshot()

    response = client.post(f"/approvals/{path}/", data)

    assert response.status_code == status, response.content[:300]
    assert reason in response.content.decode()
    assert snapshot() == before


def test_an_answer_without_the_csrf_token_is_403(people, caplog):
    before = snapshot()
    with caplog.at_level(logging.WARNING, logger="django.security.csrf"):
        response = logged_in(people["owner"], csrf=True).post(
            "/approvals/desk/refund-1/", {"answer": "yes"}
        )
    assert response.status_code == 403
    # Refused by Django's CSRF check (its logger says so, in its own words), not a permission.
    assert [(r.name, r.status_code) for r in caplog.records] == [("django.security.csrf", 403)]
    assert snapshot() == before


def test_a_replayed_answer_form_changes_nothing_the_first_decided(people):
    client = logged_in(people["owner"])
    assert client.post("/approvals/desk/refund-1/", {"answer": "yes"}).status_code == 302
    decided = [list(Event.objects.values()), list(Approval.objects.values())]

    for replay in ({"answer": "yes"}, {"answer": "no"}):
        response = client.post("/approvals/desk/refund-1/", replay, follow=True)
        assert "already settled; the first outcome stands" in response.content.decode()

    assert [list(Event.objects.values()), list(Approval.objects.values())] == decided
    # Each replay is audited as not counted.
    assert AuditEntry.objects.count() == 3


@pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example/x", "javascript:x"])
def test_an_answer_never_redirects_off_the_site(people, target):
    response = logged_in(people["owner"]).post(
        "/approvals/desk/refund-1/", {"answer": "yes", "next": target}
    )
    assert response.status_code == 302
    assert response["Location"] == "/approvals/desk/refund-1/"


# --- the inbox page and its chat form ---------------------------------------------------------

MESSAGE_ID = "5f0f3c2e-8f0a-4c1e-9a57-1d7c4f0e2b11"

# (who, slug, form, status, reason in the body)
CHAT_ROWS = {
    "other-users-inbox": ("owner", "other-desk", {"text": "hi"}, 404, ""),
    "unknown-inbox": ("owner", "nobody", {"text": "hi"}, 404, ""),
    # Django's reasons (the form's fields), with the limits alwayson set.
    "empty-text": ("owner", "desk", {"text": ""}, 400, field_error(forms.CharField(), "required")),
    "blank-text": (
        "owner",
        "desk",
        {"text": " \n\t"},
        400,
        field_error(forms.CharField(), "required"),
    ),
    "huge-text": (
        "owner",
        "desk",
        {"text": "x" * 2001},
        400,
        limit_error(MaxLengthValidator(2000), 2001),
    ),
    "giant-text": (
        "owner",
        "desk",
        {"text": "x" * 2_000_000},
        400,
        limit_error(MaxLengthValidator(2000), 2_000_000),
    ),
    "nul-text": ("owner", "desk", {"text": "a\x00b"}, 400, "NUL"),
    "no-message-id": (
        "owner",
        "desk",
        {"message_id": ""},
        400,
        field_error(forms.UUIDField(), "required"),
    ),
    "bad-message-id": (
        "owner",
        "desk",
        {"message_id": "1"},
        400,
        field_error(forms.UUIDField(), "invalid"),
    ),
    "huge-message-id": (
        "owner",
        "desk",
        {"message_id": "a" * 10_000},
        400,
        field_error(forms.UUIDField(), "invalid"),
    ),
    "viewer": ("viewer", "desk", {"text": "hi"}, 403, "you are a viewer of this inbox"),
}


@pytest.mark.parametrize(
    "who, slug, form, status, reason",
    [pytest.param(*row, id=name) for name, row in CHAT_ROWS.items()],
)
def test_a_bad_chat_post_is_refused_and_nothing_changes(people, who, slug, form, status, reason):
    client = logged_in(people[who])
    before = snapshot()

    response = client.post(f"/inbox/{slug}/", {"message_id": MESSAGE_ID, "text": "hi", **form})

    assert response.status_code == status, response.content[:300]
    assert in_html(reason) in response.content.decode()
    assert snapshot() == before


def test_a_chat_post_without_the_csrf_token_is_403(people):
    before = snapshot()
    response = logged_in(people["owner"], csrf=True).post(
        "/inbox/desk/", {"message_id": MESSAGE_ID, "text": "hi"}
    )
    assert response.status_code == 403
    assert snapshot() == before


def test_a_replayed_message_id_is_one_event_whatever_the_text(people):
    client = logged_in(people["owner"])
    first = client.post("/inbox/desk/", {"message_id": MESSAGE_ID, "text": "refund 1"}, follow=True)
    assert "Sent." in first.content.decode()
    stored = list(Event.objects.values())

    replay = client.post(
        "/inbox/desk/", {"message_id": MESSAGE_ID, "text": "refund 900"}, follow=True
    )

    assert "Already received." in replay.content.decode()
    assert list(Event.objects.values()) == stored


# GETs of the conversation (the page, and the htmx poll with its version)
PAGE_ROWS = {
    "other-users-inbox": ("owner", "/inbox/other-desk/", {}, 404, ""),
    "stranger-on-mine": ("stranger", "/inbox/desk/", {}, 404, ""),
    "poll-other-users": ("owner", "/inbox/other-desk/?v=x", {"HX-Request": "true"}, 404, ""),
    "nul-in-query": ("owner", "/inbox/desk/?v=%00", {"HX-Request": "true"}, 400, "NUL"),
    "nul-in-slug": ("owner", "/inbox/de%00sk/", {}, 404, "NUL"),
    "method": ("owner", "/inbox/desk/", {"_method": "put"}, 405, ""),
    "run-of-other-users": ("owner", "/runs/other-desk/1/", {}, 404, ""),
    "run-nul-in-slug": ("owner", "/runs/de%00sk/1/", {}, 404, "NUL"),
    "runs-nul-in-filter": ("owner", "/runs/?inbox=de%00sk", {}, 400, "NUL"),
    "runs-unknown-inbox": (
        "owner",
        "/runs/?inbox=other-desk",
        {},
        400,
        field_error(forms.ModelChoiceField(Inbox.objects.none()), "invalid_choice"),
    ),
    "runs-forged-page": ("owner", "/runs/?before=9999-99-99~1", {}, 400, "Not a page"),
}


@pytest.mark.parametrize(
    "who, path, headers, status, reason",
    [pytest.param(*row, id=name) for name, row in PAGE_ROWS.items()],
)
def test_a_bad_page_request_is_refused(people, who, path, headers, status, reason):
    client = logged_in(people[who])
    before = snapshot()
    if headers.pop("_method", None):
        response = client.put(path)
    else:
        response = client.get(path, headers=headers)
    assert response.status_code == status, response.content[:300]
    assert in_html(reason) in response.content.decode()
    assert snapshot() == before


@pytest.mark.parametrize("version", ["", "x" * 10_000, "é", "1' OR '1'='1", "v=1&v=2"])
def test_a_poll_with_any_version_answers_the_conversation(people, version):
    response = logged_in(people["owner"]).get(
        "/inbox/desk/", {"v": version}, headers={"HX-Request": "true"}
    )
    assert response.status_code == 200
    assert "refund order 1" in response.content.decode()


# --- the admin --------------------------------------------------------------------------------


@pytest.fixture
def admin_client(django_user_model):
    user = django_user_model.objects.create_superuser("root", "root@example.com", "pw-root-123")
    return logged_in(user)


@pytest.fixture
def rows(inbox, t0):
    """An event in each status, a held and a failed outbox message."""
    for key in ("pending", "running", "done", "dead"):
        ingest(inbox, "chat", key, {"text": key}, now=t0)
    gen = acquire(inbox, "A", now=t0)
    claim_batch(inbox, "A", gen, now=t0)
    Event.objects.filter(source_id="pending").update(status=Event.Status.PENDING)
    Event.objects.filter(source_id="done").update(status=Event.Status.DONE)
    Event.objects.filter(source_id="dead").update(status=Event.Status.DEAD)
    Event.objects.filter(source_id="running").update(status=Event.Status.RUNNING)
    OutboxMessage.objects.create(inbox=inbox, body="held", created=t0)
    return {e.source_id: e.pk for e in Event.objects.all()}


# (changelist, action, rows selected by status): none of them is in the state it acts on
WRONG_STATUS_ACTIONS = {
    "requeue-pending": ("inbox/event", "requeue", ["pending", "running", "done"], "0 event(s)"),
    "mark-dead-dead": ("inbox/event", "mark_dead", ["dead", "running", "done"], "0 event(s)"),
    "resend-held": ("outbox/outboxmessage", "resend", ["held"], "0 "),
}


@pytest.mark.parametrize(
    "changelist, action, selected, words",
    [pytest.param(*row, id=name) for name, row in WRONG_STATUS_ACTIONS.items()],
)
def test_an_action_on_rows_in_the_wrong_status_reports_0_and_changes_nothing(
    admin_client, rows, changelist, action, selected, words
):
    if changelist == "outbox/outboxmessage":
        ids = list(OutboxMessage.objects.values_list("pk", flat=True))
    else:
        ids = [rows[key] for key in selected]
    before = snapshot()

    response = admin_client.post(
        f"/admin/{changelist}/", {"action": action, "_selected_action": ids}, follow=True
    )

    assert response.status_code == 200
    assert words in response.content.decode()
    assert snapshot() == before


ACTIONS = {
    "event-requeue": ("inbox/event", "requeue"),
    "message-resend": ("outbox/outboxmessage", "resend"),
    "notice-resend": ("outbox/notice", "resend"),
    "audit-export": ("approvals/auditentry", "export_selected"),
    "user-delete": ("auth/user", "delete_selected"),
}


NOT_IDS = ["x", "1.5", "99999999999999999999999", "", "1; DROP TABLE x", "0x10"]


@pytest.mark.parametrize(
    "changelist, action, selected",
    [pytest.param(*ACTIONS["event-requeue"], bad, id=f"event-requeue-{bad[:8]}") for bad in NOT_IDS]
    + [pytest.param(*row, "x", id=name) for name, row in ACTIONS.items()]
    + [
        pytest.param(*row, "99999999999999999999999", id=f"{name}-big")
        for name, row in ACTIONS.items()
    ],
)
def test_an_action_on_a_selection_that_is_not_ids_is_400(
    admin_client, rows, changelist, action, selected
):
    before = snapshot()
    response = admin_client.post(
        f"/admin/{changelist}/", {"action": action, "_selected_action": ["1", selected]}
    )
    assert response.status_code == 400, response.content[:300]
    assert "is not an id of" in response.content.decode()
    assert snapshot() == before


@pytest.mark.parametrize("selected", [["-1"], ["0"], ["987654321"], ["9223372036854775807"]])
def test_an_action_on_unknown_ids_reports_0_and_changes_nothing(admin_client, rows, selected):
    before = snapshot()
    response = admin_client.post(
        "/admin/inbox/event/", {"action": "requeue", "_selected_action": selected}, follow=True
    )
    assert response.status_code == 200
    assert "0 event(s) requeued" in response.content.decode()
    assert snapshot() == before


def test_mark_dead_with_an_overlong_reason_says_so_and_changes_nothing(admin_client, rows):
    before = snapshot()
    response = admin_client.post(
        "/admin/inbox/event/",
        {"action": "mark_dead", "_selected_action": [rows["pending"]], "reason": "r" * 300},
        follow=True,
    )
    assert response.status_code == 200
    assert "reason is longer than 255 characters" in response.content.decode()
    assert snapshot() == before


# (changelist, query, status): a filter the list cannot apply is 400 with the reason; one it
# can (a value matching nothing, a page or order past the end) is the list.
FILTERS = [
    ("inbox/event", "id__in=x", 400),
    ("inbox/event", "id__in=1,x", 400),
    ("inbox/event", "id=abc", 400),
    ("inbox/event", "created__gte=yesterday", 400),
    ("inbox/event", "nonexistent_field=1", 400),
    ("outbox/outboxmessage", "id__in=x", 400),
    ("timers/timer", "id__in=x", 400),
    ("auth/user", "id__in=x", 400),
    ("inbox/event", "id__gt=99999999999999999999999", 200),
    ("inbox/event", "inbox__id__exact=x", 200),
    ("inbox/event", "status__exact=nonsense", 200),
    ("inbox/event", "o=999", 200),
    ("inbox/event", "p=-1", 200),
    ("approvals/approval", "id=99999999999999999999999", 200),
]


@pytest.mark.parametrize("changelist, query, status", FILTERS)
def test_a_bad_changelist_filter_is_400_with_the_reason(
    admin_client, rows, changelist, query, status
):
    before = snapshot()
    response = admin_client.get(f"/admin/{changelist}/?{query}")
    assert response.status_code == status, response.content[:300]
    if status == 400:
        assert f"this list cannot be filtered by {query!r}" in response.content.decode()
    assert snapshot() == before


@pytest.mark.parametrize("pk", ["x", "-1", "99999999999999999999999", "1.5"])
@pytest.mark.parametrize("changelist", ["inbox/event", "timers/timer", "approvals/approval"])
def test_a_bad_id_in_a_change_url_is_not_a_500(admin_client, rows, changelist, pk):
    response = admin_client.get(f"/admin/{changelist}/{pk}/change/", follow=True)
    # The admin's index, with the warning (in Django's words) that there is no such row.
    assert (response.status_code, response.redirect_chain) == (200, [("/admin/", 302)])
    assert [message.level for message in response.context["messages"]] == [messages.WARNING]


# The timer form: (fields over a valid one, the error it shows)
TIMER_FORM_ROWS = {
    "cron-fields": ({"cron": "every day", "every": ""}, "cron: expected 5 fields"),
    "cron-range": ({"cron": "61 * * * *", "every": ""}, "cron: invalid expression"),
    "cron-and-every": ({"cron": "0 9 * * *"}, "either every or cron"),
    "every-zero": ({"every": "0"}, "every must be a positive"),
    "every-negative": ({"every": "-60"}, "every"),
    "every-text": ({"every": "hourly"}, field_error(forms.IntegerField(), "invalid")),
    "zone": ({"timezone": "Mars/Olympus"}, "timezone: unknown time zone"),
    "policy": (
        {"policy": "sometimes"},
        field_error(forms.ChoiceField(), "invalid_choice", value="sometimes"),
    ),
    "catch-up-zero": ({"catch_up_max": "0"}, "catch_up_max must be"),
    "payload-json": ({"payload": "{"}, field_error(forms.JSONField(), "invalid")),
    "payload-list": ({"payload": "[1, 2]"}, "payload must be a JSON object"),
    "payload-nan": ({"payload": '{"a": NaN}'}, "payload"),
    "key-reserved": ({"key": "expire:refund-1"}, "reserved for approval expiry timers"),
    "key-huge": ({"key": "k" * 201}, limit_error(MaxLengthValidator(200), 201)),
    "no-due": ({"due": "", "every": ""}, "needs due"),
    "due-text": ({"due": "tomorrow"}, field_error(forms.DateTimeField(), "invalid")),
}


@pytest.mark.parametrize(
    "fields, error", [pytest.param(*row, id=name) for name, row in TIMER_FORM_ROWS.items()]
)
def test_the_timer_form_refuses_a_bad_schedule(admin_client, inbox, fields, error):
    form = {
        "inbox": inbox.pk,
        "key": "digest",
        "due": "2026-12-01 09:00:00",
        "every": "3600",
        "cron": "",
        "timezone": "UTC",
        "policy": "coalesce",
        "catch_up_max": "10",
        "payload": "{}",
        **fields,
    }
    before = snapshot()

    response = admin_client.post("/admin/timers/timer/add/", form)

    assert response.status_code == 200, response.status_code  # the form again, not a redirect
    assert in_html(error) in response.content.decode()
    assert snapshot() == before


def test_the_timer_form_accepts_the_valid_schedule(admin_client, inbox):
    form = {
        "inbox": inbox.pk,
        "key": "digest",
        "due": "2026-12-01 09:00:00",
        "every": "3600",
        "timezone": "UTC",
        "policy": "coalesce",
        "catch_up_max": "10",
        "payload": "{}",
    }
    response = admin_client.post("/admin/timers/timer/add/", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Timer.objects.filter(key="digest").count() == 1


@pytest.fixture
def client():
    return Client(enforce_csrf_checks=True)


def test_session_of_an_unknown_user_is_a_login_redirect():
    client = Client()
    client.cookies["sessionid"] = uuid.uuid4().hex
    response = client.get("/inbox/desk/")
    assert response.status_code == 302
    assert "/accounts/login/" in response["Location"]
