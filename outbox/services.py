"""The paced outbox: queue messages with a run, dispatch them at most once per gap."""

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.db.models import F

from inbox import clock
from inbox.models import Inbox
from inbox.services import retry_delay

from .channels import SendFailed, sender_for
from .models import Channel, OutboxMessage

log = logging.getLogger("alwayson.outbox")

Send = Callable[["Delivery"], object]


@dataclass(frozen=True)
class Say:
    """An outbox message as a run effect: written by finish() in its fenced transaction."""

    inbox_id: int
    body: str
    urgent: bool = False

    def __post_init__(self):
        if not isinstance(self.body, str) or not self.body.strip():
            raise ValueError(f"body must be a non-empty string, not {self.body!r}")

    def __call__(self, now):
        return OutboxMessage.objects.create(
            inbox_id=self.inbox_id, body=self.body, urgent=self.urgent, created=now
        )


@dataclass(frozen=True)
class Delivery:
    """One merged send: the held messages of one inbox, in order, under one stable key."""

    inbox: Inbox
    messages: list

    @property
    def body(self) -> str:
        return "\n\n".join(message.body for message in self.messages)

    @property
    def idempotency_key(self) -> str:
        """The same for the same rows, so a receiver can recognise a repeat after a crash."""
        ids = ",".join(str(message.pk) for message in self.messages)
        return hashlib.sha256(f"{self.inbox.pk}:{ids}".encode()).hexdigest()[:32]


def dispatch(send: Send | None = None, now=None) -> int:
    """Send each inbox's held messages as one, at most once per gap per inbox; the number
    of messages sent. `send(delivery)` overrides every inbox's channel (tests, scripts)."""
    now = clock.resolve(now)
    return sum(
        dispatch_inbox(inbox_id, send, now)
        for inbox_id in list(OutboxMessage.objects.inboxes_with_held())
    )


def dispatch_inbox(inbox, send: Send | None = None, now=None) -> int:
    """One inbox's turn: merge the held messages, in order, into one send if the gap allows
    (or one of them is urgent) and the channel is not backing off after a failure.

    At least once (the default): the send happens inside the transaction, under the
    channel's row lock, and the rows are marked sent after it. Two dispatchers can't both
    send the same rows, and a crash after send() and before COMMIT sends them again: the
    receiver dedupes on the idempotency key. Holding the lock across the send is what the
    rule requires. At most once: the rows are marked sent and committed first, then sent
    outside any lock; a crash in between loses them.
    """
    inbox_id = Inbox.objects.resolve(inbox).pk
    Channel.objects.get_or_create(inbox_id=inbox_id)
    with transaction.atomic():
        now = clock.resolve(now)
        channel = (
            # OF self: the joined inbox and owner rows stay unlocked, so events and outbox
            # rows for this inbox (whose foreign keys lock the inbox row) are never blocked
            # by a slow send.
            Channel.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("inbox__owner")
            .filter(pk=inbox_id)
            .first()
        )
        if channel is None:
            return 0  # another dispatcher has this inbox right now
        held = list(OutboxMessage.objects.filter(inbox_id=inbox_id).held().order_by("id"))
        if not held or channel.backing_off(now):
            return 0
        if channel.waits_for_gap(now) and not any(message.urgent for message in held):
            return 0
        delivery = Delivery(channel.inbox, held)
        deliver = send or sender_for(channel)
        if channel.mode == Channel.Mode.AT_MOST_ONCE:
            _mark_sent(channel, held, now)
        else:
            try:
                deliver(delivery)
            except SendFailed as exc:
                _record_failure(channel, held, str(exc), now)
                return 0
            _mark_sent(channel, held, now)
            return len(held)
    try:
        deliver(delivery)
    except SendFailed as exc:
        # At most once: the rows were given up when they were marked sent; say why.
        OutboxMessage.objects.filter(pk__in=[m.pk for m in held]).update(
            status=OutboxMessage.Status.FAILED, attempts=F("attempts") + 1, error=str(exc)
        )
        log.warning("at-most-once send failed, not retried: inbox=%s: %s", inbox_id, exc)
        return 0
    return len(held)


def _mark_sent(channel, held, now):
    OutboxMessage.objects.filter(pk__in=[m.pk for m in held]).update(
        status=OutboxMessage.Status.SENT, sent_at=now, error=""
    )
    if channel.failures or channel.retry_at or channel.last_error:
        channel.failures, channel.retry_at, channel.last_error = 0, None, ""
        channel.save(update_fields=["failures", "retry_at", "last_error"])


def _record_failure(channel, held, error, now):
    """Retry later with backoff; a message that has failed ALWAYSON_OUTBOX_MAX_ATTEMPTS times
    is parked as failed, so one broken channel neither blocks other inboxes nor retries
    forever. Each row counts its own attempts: a message that joined a failing send late
    gets its full share of tries."""
    ids = [m.pk for m in held]
    OutboxMessage.objects.filter(pk__in=ids).update(attempts=F("attempts") + 1, error=error)
    parked = OutboxMessage.objects.filter(
        pk__in=ids, attempts__gte=settings.ALWAYSON_OUTBOX_MAX_ATTEMPTS
    ).update(status=OutboxMessage.Status.FAILED)
    if parked:
        log.warning("parked %s message(s) as failed: inbox=%s: %s", parked, channel.pk, error)
    channel.last_error = error
    if parked < len(ids):
        channel.failures += 1
        channel.retry_at = now + retry_delay(channel.failures)
    else:
        # Nothing of this send is left to retry: the next message starts a fresh series.
        channel.failures, channel.retry_at = 0, None
    channel.save(update_fields=["failures", "retry_at", "last_error"])


def resend(message_ids) -> int:
    """Put messages parked as failed back to held, attempts reset; the number changed."""
    return (
        OutboxMessage.objects.failed()
        .filter(pk__in=list(message_ids))
        .update(status=OutboxMessage.Status.HELD, sent_at=None, attempts=0, error="")
    )
