"""Webhook signature verification for GitHub, Stripe and Standard Webhooks.

Pure functions over the raw body bytes and the request headers: no Django, no database, no
clock of their own (Stripe and Standard take `now`, an int of epoch seconds or an aware
datetime), so tests pin time instead of sleeping. The views in inbox/views.py call
`github_delivery`, `stripe_delivery` or `standard_delivery` and store what they return.

Every rejection is a `WebhookError` carrying the HTTP status and a reason for the sender:
400 for a malformed header or body or a stale timestamp, 401 for a missing or wrong signature.

The Standard scheme is hand-written rather than delegated to the `standardwebhooks` package:
that package reads the wall clock itself, reports a stale timestamp and a bad signature as the
same exception, raises plain ValueError/binascii.Error on a malformed signature entry and
decodes secrets leniently. What it signs is still the reference: the tests check our verifier
against its output and the spec's published vector.
"""

import base64
import binascii
import hashlib
import hmac
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from . import validation
from .validation import UNSTORABLE

SCHEMES = ("github", "stripe", "standard")

STRIPE_DEFAULT_TOLERANCE = 300
# The Standard Webhooks spec fixes the window at five minutes each way.
STANDARD_TOLERANCE = 300

# The spec's range for symmetric secrets: at least 24 bytes, at most 512 bits.
STANDARD_SECRET_MIN_BYTES = 24
STANDARD_SECRET_MAX_BYTES = 64
STANDARD_SECRET_PREFIX = "whsec_"
STRIPE_SECRET_PREFIX = "whsec_"

# Deeper bodies are refused as malformed. The stored payload wraps the body one level down,
# so this stays below what ingest accepts (validation.MAX_JSON_DEPTH).
MAX_JSON_DEPTH = 100
assert MAX_JSON_DEPTH < validation.MAX_JSON_DEPTH

# Keys become source_id; printable ASCII without spaces keeps them unambiguous in logs and
# storable on both databases. GitHub's hook id is joined with ':' so it must not contain one.
_TOKEN = re.compile(r"[\x21-\x7e]{1,128}")
_HOOK_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SECONDS = re.compile(r"[0-9]{1,15}")
_GITHUB_SIGNATURE = re.compile(r"sha256=([0-9a-fA-F]{64})")
_HEX_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")


class WebhookError(Exception):
    """A delivery refused before anything was stored; `status` is the HTTP answer."""

    status = 400

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Malformed(WebhookError):
    status = 400


class NotJson(WebhookError):
    status = 415


class Stale(WebhookError):
    status = 400


class BadSignature(WebhookError):
    status = 401


@dataclass(frozen=True)
class VerifiedDelivery:
    """A verified delivery, ready for `ingest(inbox, source, source_id, payload)`."""

    source: str
    source_id: str
    payload: dict


# --- secrets ----------------------------------------------------------------------------------


def standard_key(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret (`whsec_` + base64); ValueError if malformed.

    Strict where the reference libraries are lenient: a typo in a secret must stop start-up,
    not become a different key that silently rejects every delivery.
    """
    if not isinstance(secret, str):
        raise ValueError("a Standard Webhooks secret must be a string")
    encoded = secret.removeprefix(STANDARD_SECRET_PREFIX)
    if not _BASE64.fullmatch(encoded):
        raise ValueError("a Standard Webhooks secret must be 'whsec_' followed by base64")
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except binascii.Error:
        raise ValueError("a Standard Webhooks secret must be 'whsec_' followed by base64") from None
    if not STANDARD_SECRET_MIN_BYTES <= len(key) <= STANDARD_SECRET_MAX_BYTES:
        raise ValueError(
            f"a Standard Webhooks secret must decode to {STANDARD_SECRET_MIN_BYTES}"
            f"-{STANDARD_SECRET_MAX_BYTES} bytes, not {len(key)}"
        )
    return key


def check_secret(scheme: str, secret) -> str:
    """A secret as configured for `scheme`; ValueError naming what is wrong with it."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown webhook scheme {scheme!r}; expected one of {SCHEMES}")
    if not isinstance(secret, str) or not secret.strip():
        raise ValueError(f"a {scheme} webhook secret must be a non-empty string")
    if scheme == "stripe" and not secret.startswith(STRIPE_SECRET_PREFIX):
        # Stripe's endpoint secrets all start with whsec_; anything else is usually an API key
        # pasted into the wrong variable.
        raise ValueError("a Stripe webhook secret starts with 'whsec_'")
    if scheme == "standard":
        standard_key(secret)
    return secret


def check_inbox_secrets(value) -> dict[str, dict[str, list[str]]]:
    """Per-inbox secrets, `{slug: {scheme: [secret, ...]}}`; ValueError if malformed."""
    if not isinstance(value, dict):
        raise ValueError("must be a JSON object mapping inbox slugs to {scheme: [secrets]}")
    checked = {}
    for slug, schemes in value.items():
        if not isinstance(slug, str) or not slug:
            raise ValueError(f"inbox slug {slug!r} must be a non-empty string")
        if not isinstance(schemes, dict) or not schemes:
            raise ValueError(f"inbox {slug!r} must map schemes to lists of secrets")
        checked[slug] = {}
        for scheme, secrets in schemes.items():
            if scheme not in SCHEMES:
                raise ValueError(f"inbox {slug!r}: unknown scheme {scheme!r}; one of {SCHEMES}")
            if isinstance(secrets, str):
                secrets = [secrets]
            if not isinstance(secrets, list) or not secrets:
                raise ValueError(f"inbox {slug!r}: {scheme} needs a non-empty list of secrets")
            try:
                checked[slug][scheme] = [check_secret(scheme, s) for s in secrets]
            except ValueError as exc:
                raise ValueError(f"inbox {slug!r}: {exc}") from None
    return checked


def secrets_for(
    slug: str,
    scheme: str,
    scheme_secrets: Iterable[str],
    inbox_secrets: Mapping[str, Mapping[str, list[str] | str]],
) -> list[str]:
    """The secrets that may sign `scheme` deliveries to inbox `slug`.

    An inbox's own secrets replace the scheme's rather than adding to them: per-inbox secrets
    exist so that one sender's secret cannot post into another owner's inbox.
    """
    own = inbox_secrets.get(slug, {}).get(scheme)
    if own is None:
        return list(scheme_secrets)
    # The setting as configured: one secret may stand alone, as check_inbox_secrets allows.
    return [own] if isinstance(own, str) else list(own)


# --- verification -----------------------------------------------------------------------------


def _epoch(now) -> int:
    if isinstance(now, datetime):
        if now.tzinfo is None or now.utcoffset() is None:
            raise ValueError(f"now must be an aware datetime, not {now!r}")
        return int(now.timestamp())
    if isinstance(now, int) and not isinstance(now, bool):
        return now
    raise TypeError(f"now must be epoch seconds (int) or an aware datetime, not {now!r}")


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def _seconds(value: str, what: str) -> int:
    if not _SECONDS.fullmatch(value):
        raise Malformed(f"{what} must be integer Unix seconds")
    return int(value)


def _require_secrets(secrets) -> list:
    secrets = list(secrets)
    if not secrets:
        # A configuration problem, not the sender's: refuse without verifying anything.
        raise BadSignature("no webhook secret is configured for this inbox")
    return secrets


def verify_github(body: bytes, signature: str | None, secrets: Iterable[str]) -> None:
    """Check `X-Hub-Signature-256` (`sha256=` + hex HMAC-SHA256 of the raw body)."""
    secrets = _require_secrets(secrets)
    if not signature:
        raise BadSignature("missing X-Hub-Signature-256 header")
    match = _GITHUB_SIGNATURE.fullmatch(signature)
    if not match:
        raise BadSignature("X-Hub-Signature-256 must be 'sha256=' followed by 64 hex digits")
    given = bytes.fromhex(match.group(1))
    # Every secret is tried (rotation); compare_digest keeps each comparison constant-time.
    if not any(hmac.compare_digest(_hmac(s.encode(), body), given) for s in secrets):
        raise BadSignature("X-Hub-Signature-256 does not match the body")


def verify_stripe(
    body: bytes,
    header: str | None,
    secrets: Iterable[str],
    now,
    tolerance: int = STRIPE_DEFAULT_TOLERANCE,
) -> int:
    """Check `Stripe-Signature: t=...,v1=...` over `t.body`; the signed timestamp.

    Any matching v1 passes (Stripe sends one per active secret while rolling), other schemes
    (v0) are ignored, and a timestamp older than `tolerance` seconds is refused. Like Stripe's
    own libraries, a timestamp ahead of `now` is accepted: only a replay is old.
    """
    if isinstance(tolerance, bool) or not isinstance(tolerance, int) or tolerance <= 0:
        raise ValueError(f"the Stripe tolerance must be a positive number of seconds: {tolerance}")
    secrets = _require_secrets(secrets)
    if not header:
        raise BadSignature("missing Stripe-Signature header")
    timestamps, candidates = [], []
    for item in header.split(","):
        key, sep, value = item.strip().partition("=")
        if key == "t":
            timestamps.append(value)
        elif key == "v1" and sep:
            candidates.append(value)
    if len(timestamps) != 1:
        raise Malformed("Stripe-Signature must carry exactly one t=<timestamp>")
    sent = timestamps[0]
    timestamp = _seconds(sent, "Stripe-Signature t")
    if not candidates:
        raise BadSignature("Stripe-Signature has no v1 signature")
    if timestamp < _epoch(now) - tolerance:
        raise Stale(f"Stripe-Signature timestamp is older than {tolerance} seconds")
    # The timestamp exactly as sent: the signature covers the header's text, not our reading.
    signed = sent.encode() + b"." + body
    given = [bytes.fromhex(c) for c in candidates if _HEX_SHA256.fullmatch(c)]
    expected = [_hmac(s.encode(), signed) for s in secrets]
    if not any(hmac.compare_digest(e, g) for e in expected for g in given):
        raise BadSignature("no v1 signature in Stripe-Signature matches the body")
    return timestamp


def sign_standard(body: bytes, msg_id: str, timestamp: int, secrets: Iterable[str]) -> str:
    """The `webhook-signature` value for a send: one `v1,<base64>` per secret, so a receiver
    holding either the old or the new secret during a rotation verifies it."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return " ".join(
        "v1," + base64.b64encode(_hmac(standard_key(s), signed)).decode()
        for s in _require_secrets(secrets)
    )


def verify_standard(
    body: bytes,
    msg_id: str | None,
    timestamp: str | None,
    signature: str | None,
    secrets: Iterable[str],
    now,
    tolerance: int = STANDARD_TOLERANCE,
) -> int:
    """Check `webhook-signature` (space-separated `v1,<base64>`) over `id.timestamp.body`.

    Entries of other versions (v1a, asymmetric) and entries that do not parse are skipped, so
    one malformed entry cannot hide a valid one. Returns the signed timestamp.
    """
    secrets = _require_secrets(secrets)
    if not signature:
        raise BadSignature("missing webhook-signature header")
    if not msg_id:
        raise Malformed("missing webhook-id header")
    if not _TOKEN.fullmatch(msg_id):
        raise Malformed("webhook-id must be 1-128 printable ASCII characters without spaces")
    if not timestamp:
        raise Malformed("missing webhook-timestamp header")
    sent = _seconds(timestamp, "webhook-timestamp")
    now = _epoch(now)
    if sent < now - tolerance:
        raise Stale(f"webhook-timestamp is older than {tolerance} seconds")
    if sent > now + tolerance:
        raise Stale(f"webhook-timestamp is more than {tolerance} seconds in the future")
    given = []
    for entry in signature.split():
        version, _, encoded = entry.partition(",")
        if version != "v1" or not _BASE64.fullmatch(encoded):
            continue
        try:
            given.append(base64.b64decode(encoded, validate=True))
        except binascii.Error:
            continue
    if not given:
        raise BadSignature("webhook-signature has no well-formed v1 signature")
    signed = f"{msg_id}.{timestamp}.".encode() + body
    expected = [_hmac(standard_key(s), signed) for s in secrets]
    if not any(hmac.compare_digest(e, g) for e in expected for g in given):
        raise BadSignature("no v1 signature in webhook-signature matches")
    return sent


# --- bodies and keys --------------------------------------------------------------------------


def _reject_constant(name):
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text):
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


def parse_json(body: bytes) -> Any:
    """The body as JSON, refused (Malformed) unless both databases can store it as it is."""
    try:
        value = json.loads(
            body.decode("utf-8"), parse_constant=_reject_constant, parse_float=_finite_float
        )
    except RecursionError:
        raise Malformed(f"body nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise Malformed(f"body is not UTF-8 JSON: {exc}") from None
    # Iterative, so a deep body is measured without spending the stack it would overflow.
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if UNSTORABLE.search(item):
                raise Malformed("body contains a NUL character or an unpaired surrogate")
        elif isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise Malformed(f"body nests deeper than {MAX_JSON_DEPTH} levels")
            children = item if isinstance(item, list) else [*item.keys(), *item.values()]
            stack.extend((child, depth + 1) for child in children)
    return value


def _headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


def require_json_content_type(headers: Mapping[str, str]) -> None:
    """Refuse (415) a body its sender declares as something other than JSON.

    Every scheme sends application/json; GitHub can be set to form-encode its payload, and
    that body would otherwise be refused as "not JSON" without saying which setting to
    change. No Content-Type at all is let through to the JSON parser.
    """
    declared = _headers(headers).get("content-type", "")
    media = declared.split(";", 1)[0].strip().lower()
    if media and media != "application/json" and not media.endswith("+json"):
        raise NotJson(
            f"Content-Type must be application/json, not {media[:100]!r} (for GitHub, set"
            " the webhook's content type to application/json)"
        )


def github_delivery(
    headers: Mapping[str, str], body: bytes, secrets: Iterable[str]
) -> VerifiedDelivery:
    """Verify a GitHub delivery; key it by (X-GitHub-Hook-ID, X-GitHub-Delivery).

    The delivery id alone is shared by every hook subscribed to the event, so two hooks
    pointing at one inbox would collapse into one event; a manual redelivery keeps both ids
    and is a duplicate. GitHub signs the body only: these headers are not authenticated.
    """
    headers = _headers(headers)
    verify_github(body, headers.get("x-hub-signature-256"), secrets)
    hook_id = headers.get("x-github-hook-id", "")
    delivery_id = headers.get("x-github-delivery", "")
    event = headers.get("x-github-event", "")
    if not _HOOK_ID.fullmatch(hook_id):
        raise Malformed("X-GitHub-Hook-ID must be 1-64 letters, digits, '_' or '-'")
    if not _TOKEN.fullmatch(delivery_id):
        raise Malformed("X-GitHub-Delivery must be 1-128 printable ASCII characters")
    if not _TOKEN.fullmatch(event):
        raise Malformed("X-GitHub-Event must be 1-128 printable ASCII characters")
    body = parse_json(body)
    return VerifiedDelivery("github", f"{hook_id}:{delivery_id}", {"type": event, "body": body})


def stripe_delivery(
    headers: Mapping[str, str],
    body: bytes,
    secrets: Iterable[str],
    now,
    tolerance: int = STRIPE_DEFAULT_TOLERANCE,
) -> VerifiedDelivery:
    """Verify a Stripe delivery; key it by the event's `id`, typed by its `type`."""
    headers = _headers(headers)
    verify_stripe(body, headers.get("stripe-signature"), secrets, now, tolerance)
    event = parse_json(body)
    if not isinstance(event, dict):
        raise Malformed("a Stripe event body must be a JSON object")
    event_id, event_type = event.get("id"), event.get("type")
    if not isinstance(event_id, str) or not _TOKEN.fullmatch(event_id):
        raise Malformed("a Stripe event needs an 'id' of 1-128 printable ASCII characters")
    if not isinstance(event_type, str) or not event_type:
        raise Malformed("a Stripe event needs a 'type' string")
    return VerifiedDelivery("stripe", event_id, {"type": event_type, "body": event})


def standard_delivery(
    headers: Mapping[str, str],
    body: bytes,
    secrets: Iterable[str],
    now,
    tolerance: int = STANDARD_TOLERANCE,
) -> VerifiedDelivery:
    """Verify a Standard Webhooks delivery; key it by `webhook-id`, typed by the body's `type`."""
    headers = _headers(headers)
    msg_id = headers.get("webhook-id")
    verify_standard(
        body,
        msg_id,
        headers.get("webhook-timestamp"),
        headers.get("webhook-signature"),
        secrets,
        now,
        tolerance,
    )
    payload = parse_json(body)
    event_type = payload.get("type") if isinstance(payload, dict) else None
    if not isinstance(event_type, str):
        event_type = None
    return VerifiedDelivery("standard", msg_id, {"type": event_type, "body": payload})
