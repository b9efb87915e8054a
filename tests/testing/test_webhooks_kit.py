"""The kit's webhook deliveries: signed as GitHub, Stripe and Standard Webhooks sign, and
verified by the product's own endpoints; checked against the senders' reference libraries."""

import hashlib
import hmac
import json

import pytest
import stripe
from standardwebhooks.webhooks import Webhook as StandardWebhook

from alwayson.testing import Harness
from alwayson.testing.senders import (
    TEST_SECRETS,
    github_headers,
    standard_headers,
    stripe_headers,
)

DESK = "tests.support.kit_agents.desk"
BODY = {"id": "evt_1", "type": "charge.succeeded", "object": "event"}


@pytest.mark.parametrize(
    "scheme, source, key",
    [("github", "github", "1:d-1"), ("stripe", "stripe", "evt_1"), ("standard", "standard", "d-1")],
)
def test_each_sender_s_delivery_is_verified_and_stored_once(harness, scheme, source, key):
    desk = harness.inbox("desk", agent=DESK)

    first = desk.webhook(scheme, BODY, event="charge", delivery_id="d-1")
    again = desk.webhook(scheme, BODY, event="charge", delivery_id="d-1")
    harness.run_until_idle()

    assert (first.status_code, first.json()) == (202, {"stored": True, "duplicate": False})
    assert (again.status_code, again.json()) == (200, {"stored": False, "duplicate": True})
    [event] = desk.events()
    assert (event.source, event.source_id) == (source, key)
    assert event.payload["body"] == BODY
    assert desk.said() == [f"{source} {key}: {event.payload['type']}"]


def test_a_delivery_signed_with_another_secret_is_refused_with_the_endpoint_s_reason(harness):
    desk = harness.inbox("desk", agent=DESK)

    with pytest.raises(AssertionError, match=r"refused \(401\): X-Hub-Signature-256 does not"):
        desk.webhook("github", BODY, secret="not-the-secret")
    refused = desk.webhook("stripe", BODY, secret="whsec_not_the_secret", check=False)

    assert refused.status_code == 401
    assert "no v1 signature" in refused.json()["error"]
    assert desk.events() == []


def test_the_secret_configured_for_the_sender_signs(harness, settings):
    settings.ALWAYSON_GITHUB_SECRETS = ["the-configured-secret"]
    desk = harness.inbox("desk", agent=DESK)

    assert desk.webhook("github", BODY).status_code == 202
    refused = desk.webhook("github", BODY, secret=TEST_SECRETS["github"], check=False)
    assert refused.status_code == 401
    # Nothing was added for an inbox whose scheme has secrets.
    assert "desk" not in settings.ALWAYSON_WEBHOOK_INBOX_SECRETS


def test_an_unknown_scheme_is_refused(harness):
    desk = harness.inbox("desk", agent=DESK)
    with pytest.raises(ValueError, match="scheme must be one of"):
        desk.webhook("gitlab", BODY)


@pytest.mark.django_db
def test_the_secrets_a_harness_configured_are_gone_when_it_stops(settings):
    table = settings.ALWAYSON_WEBHOOK_INBOX_SECRETS
    before = json.dumps(table, sort_keys=True)
    with Harness(agent=DESK) as harness:
        desk = harness.inbox("desk")
        desk.webhook("standard", BODY)
        assert table["desk"] == {"standard": [TEST_SECRETS["standard"]]}
    assert json.dumps(table, sort_keys=True) == before


# --- the signatures, against the senders' own libraries -------------------------------------------


def test_github_headers_carry_the_hmac_github_sends(harness):
    body = json.dumps(BODY).encode()
    headers = github_headers(body, "s3cret", event="push", delivery="d-9", hook_id="7")
    expected = hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert headers == {
        "X-Hub-Signature-256": f"sha256={expected}",
        "X-GitHub-Hook-ID": "7",
        "X-GitHub-Delivery": "d-9",
        "X-GitHub-Event": "push",
    }


def test_stripe_headers_verify_with_stripe_s_library(harness):
    body = json.dumps(BODY).encode()
    secret = TEST_SECRETS["stripe"]
    header = stripe_headers(body, secret, at=harness.now)["Stripe-Signature"]

    assert stripe.WebhookSignature.verify_header(body.decode(), header, secret, tolerance=None)
    assert header.startswith(f"t={int(harness.now.timestamp())},v1=")


def test_standard_headers_verify_with_the_reference_implementation(harness):
    body = json.dumps(BODY).encode()
    secret = TEST_SECRETS["standard"]
    headers = standard_headers(body, secret, msg_id="msg_1", at=harness.now)

    assert StandardWebhook(secret).verify(body.decode(), headers) == BODY
