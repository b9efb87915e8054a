"""Where a merged send goes: email to the inbox owner, or a JSON POST to a webhook.

A channel raises SendFailed for a failure the dispatcher should retry (a refused SMTP
connection, a non-2xx answer, a timeout); anything else is a bug and propagates.
"""

import http.client
import json
import smtplib
import time
import urllib.error
import urllib.request

from django.conf import settings
from django.core.mail import EmailMessage

from inbox.webhooks import sign_standard


class SendFailed(Exception):
    pass


def send_email(delivery, channel):
    address = channel.email or delivery.inbox.owner.email
    if not address:
        raise SendFailed("no address: set the channel's email or the inbox owner's")
    first_line = delivery.body.splitlines()[0] if delivery.body else ""
    message = EmailMessage(
        subject=f"[{delivery.inbox.slug}] {first_line[:80]}",
        body=delivery.body,
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[address],
        # A stable Message-ID: a repeat after a crash is recognisable as the same message.
        headers={"Message-ID": f"<{delivery.idempotency_key}@alwayson>"},
    )
    try:
        message.send(fail_silently=False)
    except (smtplib.SMTPException, OSError) as exc:
        raise SendFailed(f"email to {address}: {exc}") from exc


class RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """urllib would follow a 3xx answer to a POST with a bodiless GET and call the result a
    delivery; a receiver that moved is a failed send until the channel's URL is fixed."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise urllib.error.HTTPError(req.full_url, code, f"redirect to {newurl}", headers, fp)


_opener = urllib.request.build_opener(RefuseRedirects)


def signature_headers(delivery, body: bytes) -> dict:
    """Standard Webhooks headers when the inbox has signing secrets: `webhook-id` is the
    send's idempotency key (a repeat carries the same one), the timestamp is this attempt's,
    so a receiver's replay window applies to each attempt."""
    secrets = settings.ALWAYSON_OUTBOX_SIGNING_SECRETS.get(delivery.inbox.slug)
    if not secrets:
        return {}
    timestamp = int(time.time())
    return {
        "webhook-id": delivery.idempotency_key,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign_standard(body, delivery.idempotency_key, timestamp, secrets),
    }


def send_webhook(delivery, channel):
    body = json.dumps(
        {
            "inbox": delivery.inbox.slug,
            "idempotency_key": delivery.idempotency_key,
            "text": delivery.body,
            "messages": [
                {"id": m.pk, "body": m.body, "urgent": m.urgent, "created": m.created.isoformat()}
                for m in delivery.messages
            ],
        }
    ).encode()
    headers = {
        "Content-Type": "application/json",
        "Idempotency-Key": delivery.idempotency_key,
        "User-Agent": "alwayson-dispatcher",
    }
    headers.update(signature_headers(delivery, body))
    request = urllib.request.Request(channel.url, data=body, method="POST", headers=headers)
    timeout = settings.ALWAYSON_OUTBOX_WEBHOOK_TIMEOUT
    try:
        with _opener.open(request, timeout=timeout) as response:
            response.read(1024)
    except urllib.error.HTTPError as exc:
        raise SendFailed(f"webhook {channel.url}: HTTP {exc.code}") from exc
    except (urllib.error.URLError, http.client.HTTPException, TimeoutError, OSError) as exc:
        # HTTPException: the receiver answered with something that is not HTTP.
        raise SendFailed(f"webhook {channel.url}: {exc!r}") from exc


SENDERS = {"email": send_email, "webhook": send_webhook}


def sender_for(channel):
    return lambda delivery: SENDERS[channel.kind](delivery, channel)
