"""Where a merged send goes: email to the inbox owner, a JSON POST to a webhook, or a chat
message in Slack or Telegram (their senders are registered by alwayson/egress/).

A channel raises SendFailed for a failure the dispatcher should retry (a refused SMTP
connection, a non-2xx answer, a timeout); anything else is a bug and propagates.
"""

import json
import re
import smtplib
import time

from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.utils.html import escape, linebreaks, urlize

from inbox.extensions import Extension
from inbox.webhooks import sign_standard


class SendFailed(Exception):
    pass


SUBJECT_MAX = 80  # characters of the message in an email's subject, after "[slug] "
LINK = re.compile(r"(?:https?://|www\.)\S+", re.IGNORECASE)
# Left dangling at a subject's end once what followed was cut: "within 4 hours:" + a link.
DANGLING = " \t:;,-\u2013\u2014(<["


def subject_line(text, limit=SUBJECT_MAX) -> str:
    """A subject from the first line of `text`: ended before any link (a link cut short is
    a broken link; the whole one is in the body) and, if still too long, at a word with "…"."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    link = LINK.search(line)
    if link:
        line = line[: link.start()].rstrip(DANGLING)
    if len(line) > limit:
        room = line[: limit - 1]
        head, space, _ = room.rpartition(" ")
        line = (head if space and head else room).rstrip(DANGLING) + "…"
    return line or "A message from your agent"


def send_email(delivery, channel):
    address = channel.email or delivery.inbox.owner.email
    if not address:
        raise SendFailed("no address: set the channel's email or the inbox owner's")
    email(
        address,
        f"[{delivery.inbox.slug}] {subject_line(delivery.body)}",
        delivery.body,
        delivery.idempotency_key,
    )


def send_notice(notice) -> str:
    """A notice to its recipient's address as it is now; the address it went to."""
    address = notice.recipient.email
    if not address:
        raise SendFailed(f"no address: user {notice.recipient.get_username()} has no email")
    email(address, notice.subject, notice.body, notice.key)
    return address


def email(address, subject, body, key):
    message = EmailMultiAlternatives(
        subject=subject,
        body=body,
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[address],
        # A stable Message-ID: a repeat after a crash is recognisable as the same message.
        headers={"Message-ID": f"<{key}@alwayson>"},
    )
    # The plain text stays the message; the HTML part only turns its links into links.
    message.attach_alternative(linebreaks(urlize(escape(body))), "text/html")
    try:
        message.send(fail_silently=False)
    except (smtplib.SMTPException, OSError) as exc:
        raise SendFailed(f"email to {address}: {exc}") from exc


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
    # Imported here, not with the module: httpx is a tenth of every manage.py command's
    # start-up, and only the dispatcher sends.
    import httpx

    try:
        # Redirects are not followed: a 3xx answer to a POST would be followed with a
        # bodiless GET and called a delivery; a receiver that moved is a failed send until
        # the channel's URL is fixed. The answer's body is not read: only its status counts.
        with (
            httpx.Client(timeout=settings.ALWAYSON_OUTBOX_WEBHOOK_TIMEOUT) as client,
            client.stream("POST", channel.url, content=body, headers=headers) as response,
        ):
            status = response.status_code
    except httpx.TimeoutException as exc:
        # In our words: the exception's own ("timed out") are the HTTP library's to change.
        waited = settings.ALWAYSON_OUTBOX_WEBHOOK_TIMEOUT
        raise SendFailed(f"webhook {channel.url}: no answer within {waited:g} s") from exc
    except httpx.HTTPError as exc:
        # A refused connection, or an answer that is not HTTP.
        raise SendFailed(f"webhook {channel.url}: {exc!r}") from exc
    if not 200 <= status < 300:
        raise SendFailed(f"webhook {channel.url}: HTTP {status}")


# Senders by channel kind: `send(delivery, channel)` delivers a merged send to a channel of
# that kind, raising SendFailed for a failure the dispatcher should retry. The chat APIs'
# senders need bot tokens, which only the egress gateway adds: its app adds them
# (alwayson/egress/apps.py), so this module never imports anything above the machinery.
senders = Extension("the outbox's senders by channel kind", email=send_email, webhook=send_webhook)


def sender_for(channel):
    try:
        send = senders[channel.kind]
    except KeyError:
        raise SendFailed(f"no sender for {channel.kind} channels is installed") from None
    return lambda delivery: send(delivery, channel)
