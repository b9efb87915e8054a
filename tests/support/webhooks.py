"""Signed webhook deliveries as GitHub, Stripe and Standard Webhooks senders make them, and a
POST to the inbox's endpoints."""

import hashlib
import hmac
import json
import time
from datetime import UTC, datetime

import stripe
from standardwebhooks.webhooks import Webhook as StandardWebhook

GITHUB_SECRET = "It's a Secret to Everybody"
STRIPE_SECRET = "whsec_alwayson_test_0123456789abcdef"
# The Standard Webhooks spec's published vector (libraries/*/tests in the spec's repository).
STANDARD_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def hex_hmac(secret: str, message: bytes) -> str:
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def standard_sign(secret, msg_id, timestamp, body: bytes) -> str:
    """Sign with the `standardwebhooks` package, the scheme's reference implementation."""
    moment = datetime.fromtimestamp(int(timestamp), UTC)
    return StandardWebhook(secret).sign(msg_id, moment, body.decode("utf-8"))


def post(client, scheme, slug, body: bytes, headers, trailing_slash=True):
    path = f"/hooks/{scheme}/{slug}/" if trailing_slash else f"/hooks/{scheme}/{slug}"
    headers = {name: value for name, value in headers.items() if value is not None}
    return client.post(path, data=body, content_type="application/json", headers=headers)


def github_headers(body, secret=GITHUB_SECRET, hook_id="4242", delivery="d-1", event="push"):
    return {
        "X-Hub-Signature-256": "sha256=" + hex_hmac(secret, body),
        "X-GitHub-Hook-ID": hook_id,
        "X-GitHub-Delivery": delivery,
        "X-GitHub-Event": event,
    }


def stripe_event(event_id="evt_1", event_type="charge.succeeded", **extra):
    return json.dumps({"id": event_id, "type": event_type, "object": "event", **extra}).encode()


def stripe_headers(body, secret=STRIPE_SECRET, timestamp=None):
    timestamp = int(time.time()) if timestamp is None else timestamp
    header = stripe.WebhookSignature.generate_signature_header(
        body.decode("utf-8"), secret, timestamp=timestamp
    )
    return {"Stripe-Signature": header}


def standard_headers(body, secret=STANDARD_SECRET, msg_id="msg_1", timestamp=None):
    timestamp = int(time.time()) if timestamp is None else timestamp
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": standard_sign(secret, msg_id, timestamp, body),
    }


def signed(scheme, body, **kwargs):
    return {"github": github_headers, "stripe": stripe_headers, "standard": standard_headers}[
        scheme
    ](body, **kwargs)


SCHEMES = ["github", "stripe", "standard"]


BODY = stripe_event()  # a JSON object every scheme accepts
