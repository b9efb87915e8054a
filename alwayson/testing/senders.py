"""Webhook deliveries signed as each sender signs them: GitHub, Stripe, Standard Webhooks.

The headers a sender would send with `body` (the raw bytes), for the endpoints of
inbox/views.py to verify as they verify a real delivery. Timestamps are the test's clock's,
which is also what the endpoints check them against.
"""

import base64
import hashlib
import hmac
from datetime import datetime

from inbox.webhooks import sign_standard

# Secrets the harness configures for an inbox that has none of its own (each scheme's
# format: Stripe's start with whsec_, Standard's are whsec_ and 24 to 64 bytes of base64).
TEST_SECRETS = {
    "github": "alwayson-testing-github-secret",
    "stripe": "whsec_alwayson_testing_stripe_secret",
    "standard": "whsec_" + base64.b64encode(b"alwayson-testing-standard-key").decode(),
}


def _hex_hmac(secret: str, message: bytes) -> str:
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def github_headers(body: bytes, secret: str, *, event: str, delivery: str, hook_id: str) -> dict:
    """`X-Hub-Signature-256`: sha256= and the hex HMAC-SHA256 of the body."""
    return {
        "X-Hub-Signature-256": "sha256=" + _hex_hmac(secret, body),
        "X-GitHub-Hook-ID": hook_id,
        "X-GitHub-Delivery": delivery,
        "X-GitHub-Event": event,
    }


def stripe_headers(body: bytes, secret: str, *, at: datetime) -> dict:
    """`Stripe-Signature: t=<seconds>,v1=<hex HMAC of "t.body">`."""
    timestamp = int(at.timestamp())
    signature = _hex_hmac(secret, f"{timestamp}.".encode() + body)
    return {"Stripe-Signature": f"t={timestamp},v1={signature}"}


def standard_headers(body: bytes, secret: str, *, msg_id: str, at: datetime) -> dict:
    """`webhook-id`, `webhook-timestamp` and `webhook-signature` (v1, base64 HMAC of
    "id.timestamp.body"), signed by the same code that signs the outbox's webhooks."""
    timestamp = int(at.timestamp())
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign_standard(body, msg_id, timestamp, [secret]),
    }
