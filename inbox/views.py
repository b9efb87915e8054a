"""Webhook endpoints: verify, store once, acknowledge. No agent work happens in the request.

The signature checks live in inbox/webhooks.py; these views read the body within the size
limit, find the inbox and its secrets, and turn the outcome into a status and a JSON reason.
A duplicate delivery is acknowledged like a new one, so the sender stops retrying it.
"""

import logging

from django.conf import settings
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

from . import tracing, webhooks
from .clock import database_now
from .exceptions import InboxBusy, UnknownInbox
from .services import ingest

logger = logging.getLogger("alwayson.webhooks")

_CHUNK = 64 * 1024


def _error(status, reason, **extra):
    return JsonResponse({"error": reason}, status=status, **extra)


def _read_body(request, limit):
    """The raw body, or None past `limit` bytes.

    Read from the stream rather than `request.body`, whose own cap
    (DATA_UPLOAD_MAX_MEMORY_SIZE) would answer 400 where the sender needs 413, and which
    would buffer the whole oversize body before anyone looked at its size.
    """
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        return None
    chunks, size = [], 0
    while chunk := request.read(min(_CHUNK, limit + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return None
    return b"".join(chunks)


def _receive(request, slug, scheme, verify):
    """The delivery's answer, inside a SERVER span that continues the sender's traceparent."""
    match = getattr(request, "resolver_match", None)
    route = "/" + match.route if match and match.route else request.path
    with tracing.span(
        f"{request.method} {route}",
        kind=tracing.trace.SpanKind.SERVER,
        parent=request.headers.get("traceparent", ""),
        http__request__method=request.method,
        http__route=route,
        alwayson__inbox=slug,
        alwayson__webhook__scheme=scheme,
    ) as current:
        response = _answer(request, slug, scheme, verify)
        if current is not None:
            current.set_attribute("http.response.status_code", response.status_code)
        return response


def _answer(request, slug, scheme, verify):
    if request.method != "POST":
        response = _error(405, f"{request.method} is not allowed; webhooks are POSTed")
        response["Allow"] = "POST"
        return response
    limit = settings.ALWAYSON_WEBHOOK_MAX_BYTES
    try:
        body = _read_body(request, limit)
    except OSError:
        return _error(400, "the request body could not be read")
    if body is None:
        return _error(413, f"the body is larger than {limit} bytes")
    # Verified before the inbox is looked up: an unsigned request gets the same answer whether
    # or not the inbox exists. Secrets are configured per slug, so no lookup is needed first.
    secrets = webhooks.secrets_for(
        slug,
        scheme,
        getattr(settings, f"ALWAYSON_{scheme.upper()}_SECRETS"),
        settings.ALWAYSON_WEBHOOK_INBOX_SECRETS,
    )
    try:
        webhooks.require_json_content_type(request.headers)
        delivery = verify(request.headers, body, secrets)
    except webhooks.WebhookError as exc:
        logger.info("%s webhook for %s refused (%s): %s", scheme, slug, exc.status, exc.reason)
        return _error(exc.status, exc.reason)
    try:
        stored = ingest(slug, delivery.source, delivery.source_id, delivery.payload)
    except UnknownInbox:
        return _error(404, f"no inbox named {slug!r}")
    except InboxBusy:
        return busy_response()
    except ValueError as exc:
        return _error(400, str(exc))
    if stored:
        return JsonResponse({"stored": True, "duplicate": False}, status=202)
    return JsonResponse({"stored": False, "duplicate": True}, status=200)


def busy_response():
    """503: the inbox's lock stayed taken (a frozen worker's transaction); nothing was stored.
    Retry-After is the longest the database lets a frozen transaction hold it."""
    response = _error(503, "the inbox is busy; nothing was stored, retry later")
    response["Retry-After"] = str(settings.ALWAYSON_IDLE_IN_TRANSACTION_TIMEOUT)
    return response


@csrf_exempt
def github(request, slug):
    return _receive(request, slug, "github", webhooks.github_delivery)


@csrf_exempt
def stripe(request, slug):
    def verify(headers, body, secrets):
        return webhooks.stripe_delivery(
            headers, body, secrets, database_now(), settings.ALWAYSON_STRIPE_TOLERANCE
        )

    return _receive(request, slug, "stripe", verify)


@csrf_exempt
def standard(request, slug):
    def verify(headers, body, secrets):
        return webhooks.standard_delivery(headers, body, secrets, database_now())

    return _receive(request, slug, "standard", verify)
