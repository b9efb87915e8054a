"""Timers: add_timer and run_scheduler."""

from datetime import datetime

from django.db import transaction

from inbox import clock
from inbox.models import Inbox
from inbox.validation import require_key, require_mapping

from .models import Timer

SCHEDULER_BATCH = 100


def add_timer(inbox, key, due, payload=None, every=None, event_key=None) -> Timer:
    """Register (or re-register) the timer `key` of an inbox, due at `due` (whole seconds).

    Re-registering replaces the schedule; an occurrence already turned into an event stays
    one event, because the event's key is the timer key plus the scheduled instant.
    `event_key` = (source, source_id) fixes the key of a one-off's event.
    """
    require_key("key", key)
    if not isinstance(due, datetime) or due.tzinfo is None:
        raise ValueError(f"due must be an aware datetime, not {due!r}")
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every <= 0):
        raise ValueError(f"every must be a positive number of seconds, not {every!r}")
    event_source, event_id = "", ""
    if event_key is not None:
        if every is not None:
            raise ValueError("event_key: a recurring timer can't use a fixed event key")
        event_source, event_id = event_key
        require_key("event_key source", event_source)
        require_key("event_key source_id", event_id)
    payload = require_mapping("payload", {} if payload is None else payload)
    inbox = Inbox.objects.resolve(inbox)
    timer, _ = Timer.objects.update_or_create(
        inbox=inbox,
        key=key,
        defaults={
            "due": clock.whole_seconds(due),
            "every": every,
            "payload": payload,
            "event_source": event_source,
            "event_id": event_id,
            "done": False,
        },
    )
    return timer


def run_scheduler(now=None, batch_size=SCHEDULER_BATCH, inbox=None) -> int:
    """Turn due timers, of every inbox, into inbox events; the number of timers handled.

    The timer advances in the same transaction as the insert, so a second pass finds nothing
    due; the event key (timer key + scheduled instant) is the second line of defence, for a
    replay the transaction can't see. Several schedulers share the work: SKIP LOCKED hands
    each due timer to one of them. `inbox` limits the pass to one inbox.
    """
    timers = Timer.objects.all()
    if inbox is not None:
        timers = timers.filter(inbox=Inbox.objects.resolve(inbox))
    with transaction.atomic():
        now = clock.resolve(now)
        due = list(
            timers.due(now).select_for_update(skip_locked=True).order_by("due", "id")[:batch_size]
        )
        for timer in due:
            timer.fire(now)
        return len(due)
