"""Timers: add_timer and run_scheduler."""

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction

from inbox import clock
from inbox.models import Inbox, Lease
from inbox.validation import require_key, require_mapping

from .models import Timer

SCHEDULER_BATCH = 100


@dataclass(frozen=True)
class Schedule:
    """A timer registration, checked when it is made and written when it is applied.

    As a run effect it commits with the run's finish. `due` is an aware datetime, or `delay`
    (seconds or a timedelta) counts from the moment it is applied.
    """

    inbox_id: int
    key: str
    due: datetime | None = None
    delay: timedelta | None = None
    payload: dict = field(default_factory=dict)
    every: int | None = None
    event_key: tuple[str, str] | None = None

    def __post_init__(self):
        require_key("key", self.key)
        if (self.due is None) == (self.delay is None):
            raise ValueError("due: give either due (a datetime) or delay, not both or neither")
        if self.due is not None and (not isinstance(self.due, datetime) or self.due.tzinfo is None):
            raise ValueError(f"due must be an aware datetime, not {self.due!r}")
        if self.delay is not None:
            delay = self.delay
            if not isinstance(delay, timedelta):
                if isinstance(delay, bool) or not isinstance(delay, int | float):
                    raise ValueError(f"delay must be seconds or a timedelta, not {delay!r}")
                delay = timedelta(seconds=delay)
            if delay < timedelta(0):
                raise ValueError(f"delay must not be negative, not {self.delay!r}")
            object.__setattr__(self, "delay", delay)
        every = self.every
        if every is not None and (
            isinstance(every, bool) or not isinstance(every, int) or every <= 0
        ):
            raise ValueError(f"every must be a positive number of seconds, not {every!r}")
        if self.event_key is not None:
            if every is not None:
                raise ValueError("event_key: a recurring timer can't use a fixed event key")
            source, source_id = self.event_key
            require_key("event_key source", source)
            require_key("event_key source_id", source_id)
        object.__setattr__(
            self,
            "payload",
            require_mapping("payload", {} if self.payload is None else self.payload),
        )

    def __call__(self, now) -> Timer:
        due = self.due if self.due is not None else now + self.delay
        event_source, event_id = self.event_key or ("", "")
        timer, _ = Timer.objects.update_or_create(
            inbox_id=self.inbox_id,
            key=self.key,
            defaults={
                "due": clock.whole_seconds(due),
                "every": self.every,
                "payload": self.payload,
                "event_source": event_source,
                "event_id": event_id,
                "done": False,
            },
        )
        return timer


def add_timer(inbox, key, due, payload=None, every=None, event_key=None, now=None) -> Timer:
    """Register (or re-register) the timer `key` of an inbox, due at `due` (whole seconds).

    Re-registering replaces the schedule; an occurrence already turned into an event stays
    one event, because the event's key is the timer key plus the scheduled instant.
    `event_key` = (source, source_id) fixes the key of a one-off's event.
    """
    if due is None:
        raise ValueError("due must be an aware datetime, not None")
    inbox = Inbox.objects.resolve(inbox)
    schedule = Schedule(inbox.pk, key, due=due, payload=payload, every=every, event_key=event_key)
    return schedule(clock.resolve(now))


def run_scheduler(now=None, batch_size=SCHEDULER_BATCH, inbox=None) -> int:
    """Turn due timers, of every inbox, into inbox events; the number of timers handled.

    The timer advances in the same transaction as the insert, so a second pass finds nothing
    due; the event key (timer key + scheduled instant) is the second line of defence, for a
    replay the transaction can't see. Each timer fires in a short transaction of its own that
    locks its inbox's lease row first, like every other write to an inbox; several schedulers
    can run at once, and the one that finds the timer no longer due skips it.
    `inbox` limits the pass to one inbox.
    """
    timers = Timer.objects.all()
    if inbox is not None:
        timers = timers.filter(inbox=Inbox.objects.resolve(inbox))
    now = clock.resolve(now)
    candidates = list(
        timers.due(now).order_by("due", "id").values_list("pk", "inbox_id")[:batch_size]
    )
    handled = 0
    for pk, inbox_id in candidates:
        with transaction.atomic():
            Lease.objects.select_for_update().get(inbox_id=inbox_id)
            timer = Timer.objects.due(now).select_for_update(skip_locked=True).filter(pk=pk).first()
            if timer is None:
                continue  # another scheduler fired it first
            timer.fire(now)
            handled += 1
    return handled
