"""The paced outbox: queue messages with a run, dispatch them at most once per gap."""

import logging
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q

from inbox import clock, tracing
from inbox.models import Inbox, RunRecord
from inbox.services import retry_delay
from inbox.validation import require_int, require_text

from .channels import SendFailed, send_notice, sender_for
from .models import Channel, Notice, OutboxMessage, notice_key, send_key_for
from .signals import messages_sent

log = logging.getLogger("alwayson.outbox")

Send = Callable[["MergedSend"], object]
NOTICE_BATCH = 100


@dataclass(frozen=True)
class Say:
    """An outbox message as a run effect: written by finish() in its fenced transaction."""

    inbox_id: int
    body: str
    urgent: bool = False
    # The run that said it (its RunRecord), for the run's history.
    generation: int | None = None
    # Run.key of the run's events, this message's place in the run and its words: its send's key.
    key: str = ""

    def __post_init__(self):
        require_int("inbox_id", self.inbox_id)
        if not isinstance(self.body, str) or not self.body.strip():
            raise ValueError(f"body must be a non-empty string, not {self.body!r}")
        require_text("body", self.body)

    def __call__(self, now):
        return OutboxMessage.objects.create(
            inbox_id=self.inbox_id,
            body=self.body,
            urgent=self.urgent,
            created=now,
            generation=self.generation,
            say_key=self.key or None,
        )


@dataclass(frozen=True)
class MergedSend:
    """One send: held messages of one inbox, in order, under the key stamped on them."""

    inbox: Inbox
    messages: list

    @property
    def body(self) -> str:
        return "\n\n".join(message.body for message in self.messages)

    @property
    def idempotency_key(self) -> str:
        """The send's key, stamped on every one of its rows before the first attempt: the
        same on every retry, so a receiver can recognise a repeat."""
        return self.messages[0].send_key


def _require_send(send):
    """Checked before anything is stamped: at most once, a send that cannot be called would
    leave rows marked sent that were never sent."""
    if send is not None and not callable(send):
        raise ValueError(f"send must be a callable taking the delivery, not {send!r}")


def dispatch(send: Send | None = None, now=None) -> int:
    """Send each inbox's held messages as one, at most once per gap per inbox; the number
    of messages sent. `send(delivery)` overrides every inbox's channel (tests, scripts)."""
    _require_send(send)
    now = clock.resolve(now)
    return sum(
        dispatch_inbox(inbox_id, send, now)
        for inbox_id in list(OutboxMessage.objects.inboxes_with_held())
    )


def dispatch_inbox(inbox, send: Send | None = None, now=None) -> int:
    """One inbox's turn: one send, if the gap allows (or one of its messages is urgent) and
    the channel is not backing off after a failure.

    A send's rows and key are stamped and committed before its first attempt, so a repeat
    after a timeout or a crash carries the key and the body the receiver may already have
    (docs/explanation/design.md, "A send's key is stamped on its rows"). At least once (the
    default): sent in a second transaction under the channel's row lock, marked sent after,
    so a crash before COMMIT sends again under the same key. At most once: marked sent and
    committed first, then sent outside any lock; a crash in between loses it.
    """
    _require_send(send)
    # Checked before the channel row is written; the clock itself is read under its lock.
    now = clock.in_statement(now)
    inbox_id = Inbox.objects.resolve(inbox).pk
    Channel.objects.get_or_create(inbox_id=inbox_id)
    with transaction.atomic():
        at = clock.resolve(now)
        channel = _locked_channel(inbox_id)
        if channel is None:
            return 0  # another dispatcher has this inbox right now
        batch = _next_send(channel, at, may_start=True)
        if not batch:
            return 0
        at_most_once = channel.mode == Channel.Mode.AT_MOST_ONCE
        if at_most_once:
            _mark_sent(channel, batch, at)
    if at_most_once:
        return _send_at_most_once(channel, batch, send, at)
    with transaction.atomic():
        at = clock.resolve(now)
        channel = _locked_channel(inbox_id)
        if channel is None:
            return 0  # another dispatcher took the channel in between: it sends this
        # Only the send committed above (or one committed before): a send started here
        # would be attempted before its rows and key were committed.
        batch = _next_send(channel, at, may_start=False)
        if not batch:
            return 0  # another dispatcher sent it in between
        failed = _deliver(channel, batch, send)
        if failed is not None:
            _record_failure(channel, batch, failed, at)
            return 0
        _mark_sent(channel, batch, at)
        messages_sent.send(sender=OutboxMessage, messages=batch, at=at)
        return len(batch)


def _locked_channel(inbox_id):
    return (
        # OF self: the joined inbox and owner rows stay unlocked, so events and outbox rows
        # for this inbox (whose foreign keys lock the inbox row) are never blocked by a slow
        # send.
        Channel.objects.select_for_update(skip_locked=True, of=("self",))
        .select_related("inbox__owner")
        .filter(pk=inbox_id)
        .first()
    )


def _next_send(channel, now, may_start) -> list:
    """The rows of the inbox's next send, in order, if it may go now; [] if not. A send
    already stamped comes first, exactly as stamped; otherwise, if `may_start`, every held
    message makes a new one, stamped here (the caller commits that before sending).
    """
    held = list(OutboxMessage.objects.filter(inbox_id=channel.pk).held().order_by("id"))
    if not held or channel.backing_off(now):
        return []
    stamped = next((message.send_key for message in held if message.send_key), "")
    if stamped:
        batch = [message for message in held if message.send_key == stamped]
    elif may_start:
        batch = held
    else:
        return []
    if channel.waits_for_gap(now) and not any(message.urgent for message in batch):
        return []
    if stamped:
        return batch
    key = send_key_for(channel.pk, batch)
    OutboxMessage.objects.filter(pk__in=[message.pk for message in batch]).update(send_key=key)
    # Read back what was stamped: an admin edit that committed after the read above is in
    # the rows now, and from here on nobody may change them.
    stamped_rows = OutboxMessage.objects.filter(inbox_id=channel.pk, send_key=key).held()
    return list(stamped_rows.order_by("id"))


def _deliver(channel, batch, send) -> str | None:
    """The send itself, in a PRODUCER span when tracing is on; None when it went, else why
    it failed (SendFailed's message). Any other exception propagates (the span records it)."""
    with _send_span(channel, batch) as current:
        try:
            (send or sender_for(channel))(MergedSend(channel.inbox, batch))
        except SendFailed as exc:
            if current is not None:
                current.set_attribute("alwayson.outcome", "failed")
                current.set_attribute("error.type", type(exc).__qualname__)
                current.set_status(tracing.trace.Status(tracing.trace.StatusCode.ERROR, str(exc)))
            return str(exc)
        if current is not None:
            current.set_attribute("alwayson.outcome", "sent")
        return None


@contextmanager
def _send_span(channel, batch):
    """A send's span (OpenTelemetry's messaging conventions: `send {destination}`, PRODUCER),
    linked to the runs that said its messages: the run span's context their RunRecord keeps.
    A send is its own trace, made later by another process, so the runs are links, not its
    parent. The records are read in one query, and only with tracing on."""
    if not tracing.enabled():
        yield None
        return
    generations = {m.generation for m in batch if m.generation is not None}
    links = []
    if generations:
        links = list(
            RunRecord.objects.filter(inbox_id=channel.pk, generation__in=generations)
            .exclude(trace="")
            .order_by("generation", "id")
            .values_list("trace", flat=True)
        )
    with tracing.span(
        f"send {channel.kind}",
        kind=tracing.trace.SpanKind.PRODUCER,
        links=list(dict.fromkeys(links)),
        messaging__system="alwayson",
        messaging__operation__name="send",
        messaging__operation__type="send",
        messaging__destination__name=channel.kind,
        messaging__batch__message_count=len(batch),
        messaging__message__id=batch[0].send_key or None,
        alwayson__inbox=channel.inbox.slug,
        alwayson__outbox__mode=channel.mode,
    ) as current:
        yield current


def _send_at_most_once(channel, batch, send, sent_at) -> int:
    failed = _deliver(channel, batch, send)
    if failed is not None:
        # The rows were given up when they were marked sent; say why.
        OutboxMessage.objects.filter(pk__in=[m.pk for m in batch]).update(
            status=OutboxMessage.Status.FAILED, attempts=F("attempts") + 1, error=failed
        )
        log_parked(channel, batch, max(m.attempts for m in batch) + 1, failed, "at most once")
        return 0
    messages_sent.send(sender=OutboxMessage, messages=batch, at=sent_at)
    return len(batch)


def _mark_sent(channel, batch, now):
    OutboxMessage.objects.filter(pk__in=[m.pk for m in batch]).update(
        status=OutboxMessage.Status.SENT, sent_at=now, error=""
    )
    if channel.failures or channel.retry_at or channel.last_error:
        channel.failures, channel.retry_at, channel.last_error = 0, None, ""
        channel.save(update_fields=["failures", "retry_at", "last_error"])


def _record_failure(channel, batch, error, now):
    """Retry later with backoff; a send that has failed ALWAYSON_OUTBOX_MAX_ATTEMPTS times
    is parked as failed, so one broken channel neither blocks other inboxes nor retries
    forever. A send is parked whole: its rows are attempted together and share one fate,
    so a resend never has to split it."""
    ids = [m.pk for m in batch]
    parked = max(m.attempts for m in batch) + 1 >= settings.ALWAYSON_OUTBOX_MAX_ATTEMPTS
    OutboxMessage.objects.filter(pk__in=ids).update(
        attempts=F("attempts") + 1,
        error=error,
        **({"status": OutboxMessage.Status.FAILED} if parked else {}),
    )
    channel.last_error = error
    if parked:
        log_parked(channel, batch, max(m.attempts for m in batch) + 1, error, "out of attempts")
        # Nothing of this send is left to retry: the next send starts a fresh series.
        channel.failures, channel.retry_at = 0, None
    else:
        channel.failures += 1
        channel.retry_at = now + retry_delay(channel.failures)
    channel.save(update_fields=["failures", "retry_at", "last_error"])


def log_parked(channel, batch, attempts, error, why):
    """A send parked as failed is a message nobody will get unless an operator resends it."""
    fields = {
        "inbox_id": channel.pk,
        "channel": channel.kind,
        "message_ids": [m.pk for m in batch],
        # Not "key": Sentry and the error pages mask fields named like a credential.
        "send": batch[0].send_key,
        "attempts": attempts,
        "last_error": error,
    }
    log.error(
        "outbox send parked as failed (%s): inbox=%s channel=%s messages=%s send=%s"
        " attempts=%s last error: %s",
        why,
        *fields.values(),
        extra=fields,
    )


def resend(message_ids) -> list[int]:
    """Put parked sends back to held, attempts reset; the ids of the messages put back.

    A resend is the same send again: the same rows under the same key, so a receiver that
    got it before (its answer lost) recognises it. Resending one message of a parked send
    therefore puts back the whole send.
    """
    ids = list(message_ids)
    failed = OutboxMessage.objects.failed()
    with transaction.atomic():
        chosen = list(
            failed.filter(pk__in=ids).exclude(send_key="").values_list("inbox_id", "send_key")
        )
        same_send = Q(
            inbox_id__in={inbox for inbox, _ in chosen}, send_key__in={key for _, key in chosen}
        )
        # Locked until commit: a second resend of the same rows waits, then finds them held.
        put_back = list(
            failed.filter(Q(pk__in=ids) | same_send)
            .select_for_update()
            .values_list("pk", flat=True)
        )
        failed.filter(pk__in=put_back).update(
            status=OutboxMessage.Status.HELD, sent_at=None, attempts=0, error=""
        )
        return put_back


# --- notices: one email to one person, once per topic ----------------------------------------


def queue_notice(inbox_id, recipient, topic, subject, body, now) -> bool:
    """Hold a notice for `recipient`; False if this (inbox, topic, recipient) was made
    before. Called inside the transaction that made what it is about, so it commits (or
    rolls back) with it."""
    _, created = Notice.objects.get_or_create(
        inbox_id=inbox_id,
        topic=topic,
        recipient=recipient,
        defaults={
            "key": notice_key(inbox_id, topic, recipient.pk),
            "subject": subject[:200],
            "body": body,
            "created": now,
            "due_at": now,
        },
    )
    return created


def dispatch_notices(send=None, now=None) -> int:
    """Send the notices that are due, each as its own email; the number sent. At least once:
    each under its row's lock (SKIP LOCKED) and marked sent after, so a crash in between
    sends it again under the same Message-ID. A failure is retried with the outbox's backoff
    and parked after ALWAYSON_OUTBOX_MAX_ATTEMPTS. `send(notice)` overrides the email.
    """
    _require_send(send)
    now = clock.resolve(now)
    due = Notice.objects.due(now).order_by("due_at", "id").values_list("pk", flat=True)
    return sum(_send_notice(pk, send, now) for pk in list(due[:NOTICE_BATCH]))


def _send_notice(pk, send, now) -> int:
    with transaction.atomic():
        notice = (
            Notice.objects.due(now)
            .select_for_update(skip_locked=True, of=("self",))
            .select_related("recipient", "inbox")
            .filter(pk=pk)
            .first()
        )
        if notice is None:
            return 0  # sent meanwhile, or another dispatcher is sending it
        try:
            sent_to = (send or send_notice)(notice)
        except SendFailed as exc:
            notice.attempts += 1
            notice.error = str(exc)
            if notice.attempts >= settings.ALWAYSON_OUTBOX_MAX_ATTEMPTS:
                notice.status = Notice.Status.FAILED
                log.error(
                    "notice parked as failed: notice=%s message-id=%s attempts=%s last error: %s",
                    notice.pk,
                    notice.key,
                    notice.attempts,
                    exc,
                    extra={
                        "inbox_id": notice.inbox_id,
                        "notice_id": notice.pk,
                        "message_id": notice.key,
                        "attempts": notice.attempts,
                        "last_error": str(exc),
                    },
                )
            else:
                notice.due_at = now + retry_delay(notice.attempts)
            notice.save(update_fields=["attempts", "error", "status", "due_at"])
            return 0
        notice.status, notice.sent_at, notice.error = Notice.Status.SENT, now, ""
        notice.sent_to = sent_to or ""
        notice.save(update_fields=["status", "sent_at", "error", "sent_to"])
        return 1


def resend_notices(notice_ids, now=None) -> list[int]:
    """Put parked notices back, attempts reset, due now; the ids put back. Each goes again
    under its own Message-ID."""
    failed = Notice.objects.failed()
    with transaction.atomic():
        put_back = list(
            failed.filter(pk__in=list(notice_ids)).select_for_update().values_list("pk", flat=True)
        )
        failed.filter(pk__in=put_back).update(
            status=Notice.Status.HELD, attempts=0, error="", due_at=clock.resolve(now)
        )
        return put_back
