"""The paced outbox: queue messages with a run, dispatch them at most once per gap."""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction

from inbox import clock
from inbox.models import Inbox

from .models import OutboxMessage

Send = Callable[[Inbox, str], object]


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


def dispatch(send: Send, now=None) -> int:
    """Send each inbox's held messages as one, at most once per ALWAYSON_OUTBOX_GAP per inbox.

    Returns the number of messages sent.
    """
    now = clock.resolve(now)
    return sum(
        dispatch_inbox(inbox_id, send, now)
        for inbox_id in list(OutboxMessage.objects.inboxes_with_held())
    )


def dispatch_inbox(inbox, send: Send, now=None) -> int:
    """One inbox's turn: merge the held messages, in order, into one send if the gap allows
    (or one of them is urgent).

    The send happens inside the transaction, under the inbox's row lock, and the rows are
    marked sent after it: two dispatchers can't both send the same rows, and a crash after
    send() and before COMMIT sends them again (at-least-once; the receiver dedupes, or a
    repeat must be harmless). Holding the lock across the send is what the rule requires.
    """
    inbox_id = inbox.pk if isinstance(inbox, Inbox) else inbox
    with transaction.atomic():
        now = clock.resolve(now)
        # NO KEY UPDATE: new events and outbox rows for this inbox (which take KEY SHARE
        # locks on it through their foreign key) are not blocked while a send is under way.
        locked = (
            Inbox.objects.select_for_update(skip_locked=True, no_key=True)
            .filter(pk=inbox_id)
            .first()
        )
        if locked is None:
            return 0  # another dispatcher has this inbox right now
        messages = OutboxMessage.objects.filter(inbox=locked)
        held = list(messages.held().order_by("id"))
        if not held:
            return 0
        last = messages.last_sent_at()
        gap = timedelta(seconds=settings.ALWAYSON_OUTBOX_GAP)
        if last is not None and now - last < gap and not any(m.urgent for m in held):
            return 0
        send(locked, "\n\n".join(message.body for message in held))
        OutboxMessage.objects.filter(pk__in=[m.pk for m in held]).update(sent_at=now)
        return len(held)
