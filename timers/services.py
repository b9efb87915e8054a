"""Timers: add_timer and run_scheduler."""

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import ClassVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from django.db import transaction

from inbox import clock
from inbox.models import Inbox, Lease
from inbox.services import SOURCE_ID_MAX, SOURCE_MAX, require_unreserved_source
from inbox.validation import require_duration, require_int, require_key, require_mapping

from .models import RESERVED_KEY_PREFIX, TIMER_SOURCE, Timer

SCHEDULER_BATCH = 100
KEY_MAX = Timer._meta.get_field("key").max_length


@dataclass(frozen=True)
class Schedule:
    """A timer registration, checked when it is made and written when it is applied.

    As a run effect it commits with the run's finish. A one-off or `every` timer starts at
    `due` (an aware datetime) or `delay` after the moment it is applied; a `cron` timer at
    its next occurrence after `due` (or after that moment), read in `timezone`.

    Every timer is registered through a Schedule, so this is the one place that refuses
    what only alwayson writes: an "expire:" key and a fixed event key under a reserved
    source (docs/explanation/design.md, "Sources `timer` and `approval` are reserved").
    """

    may_reserve: ClassVar[bool] = False

    inbox_id: int
    key: str
    due: datetime | None = None
    delay: timedelta | None = None
    payload: dict = field(default_factory=dict)
    every: int | None = None
    event_key: tuple[str, str] | None = None
    cron: str | None = None
    timezone: str = "UTC"
    policy: str = Timer.Policy.COALESCE
    catch_up_max: int = 10
    # The run that set it (its RunRecord), for the run's history.
    generation: int | None = None

    @classmethod
    def reserved(cls, *args, **kwargs) -> "Schedule":
        """A timer of alwayson's own machinery: an approval's expiry."""
        return _ReservedSchedule(*args, **kwargs)

    def __post_init__(self):
        require_int("inbox_id", self.inbox_id)
        require_key("key", self.key, KEY_MAX)
        if self.key.startswith(RESERVED_KEY_PREFIX) and not self.may_reserve:
            raise ValueError(
                f"key {self.key!r}: keys starting {RESERVED_KEY_PREFIX!r} are reserved for"
                " approval expiry timers"
            )
        if self.due is not None and self.delay is not None:
            raise ValueError("due: give either due (a datetime) or delay, not both")
        if self.due is None and self.delay is None and not self.cron:
            raise ValueError("due: a one-off or every timer needs due (a datetime) or delay")
        if self.due is not None and (not isinstance(self.due, datetime) or self.due.tzinfo is None):
            raise ValueError(f"due must be an aware datetime, not {self.due!r}")
        if self.delay is not None:
            delay = require_duration("delay", self.delay)
            if delay < timedelta(0):
                raise ValueError(f"delay must not be negative, not {self.delay!r}")
            object.__setattr__(self, "delay", delay)
        every = self.every
        if every is not None and (
            isinstance(every, bool) or not isinstance(every, int) or every <= 0
        ):
            raise ValueError(f"every must be a positive number of seconds, not {every!r}")
        self._check_cron()
        if self.policy not in Timer.Policy.values:
            raise ValueError(f"policy must be one of {Timer.Policy.values}, not {self.policy!r}")
        cap = self.catch_up_max
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise ValueError(f"catch_up_max must be an integer of at least 1, not {cap!r}")
        if self.event_key is not None:
            if every is not None or self.cron:
                raise ValueError("event_key: a recurring timer can't use a fixed event key")
            if not isinstance(self.event_key, tuple | list) or len(self.event_key) != 2:
                raise ValueError(
                    f"event_key must be a pair (source, source_id), not {self.event_key!r}"
                )
            source, source_id = self.event_key
            require_key("event_key source", source, SOURCE_MAX)
            if not self.may_reserve or source == TIMER_SOURCE:
                require_unreserved_source("event_key source", source)
            require_key("event_key source_id", source_id, SOURCE_ID_MAX)
        object.__setattr__(
            self,
            "payload",
            require_mapping("payload", {} if self.payload is None else self.payload),
        )

    def _check_cron(self):
        try:
            zone = ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise ValueError(f"timezone: unknown time zone {self.timezone!r}") from None
        if self.cron is not None and not isinstance(self.cron, str):
            raise ValueError(f"cron must be a string like '0 9 * * *', not {self.cron!r}")
        if not self.cron:
            return
        if self.every is not None:
            raise ValueError("cron: a timer takes either every or cron, not both")
        if len(self.cron.split()) != 5:
            raise ValueError(
                f"cron: expected 5 fields (minute hour day month weekday), not {self.cron!r}"
            )
        try:
            CronSim(self.cron, datetime.now(zone))
        except CronSimError as exc:
            raise ValueError(f"cron: invalid expression {self.cron!r}: {exc}") from None

    def _first_due(self, now, existing):
        if not self.cron:
            return self.due if self.due is not None else now + self.delay
        unchanged = (
            existing is not None
            and not existing.done
            and (existing.cron, existing.timezone) == (self.cron, self.timezone)
        )
        if unchanged and self.due is None and self.delay is None:
            # A deploy re-registering the same schedule must not skip an occurrence that is
            # due but not yet fired.
            return existing.due
        start = self.due if self.due is not None else now + (self.delay or timedelta(0))
        start = clock.whole_seconds(start)
        probe = Timer(cron=self.cron, timezone=self.timezone)
        return probe.next_after(start - timedelta(seconds=1))

    def __call__(self, now) -> Timer:
        existing = Timer.objects.filter(inbox_id=self.inbox_id, key=self.key).first()
        event_source, event_id = self.event_key or ("", "")
        timer, _ = Timer.objects.update_or_create(
            inbox_id=self.inbox_id,
            key=self.key,
            defaults={
                "due": clock.whole_seconds(self._first_due(now, existing)),
                "every": self.every,
                "cron": self.cron or "",
                "timezone": self.timezone,
                "policy": self.policy,
                "catch_up_max": self.catch_up_max,
                "payload": self.payload,
                "event_source": event_source,
                "event_id": event_id,
                "done": False,
                "generation": self.generation,
            },
        )
        return timer


class _ReservedSchedule(Schedule):
    may_reserve = True


def add_timer(
    inbox,
    key,
    due=None,
    payload=None,
    every=None,
    event_key=None,
    *,
    now=None,
    **options,
) -> Timer:
    """Register (or re-register) the timer `key` of an inbox.

    One-off or every-N-seconds timers start at `due` (whole seconds); cron timers at their
    next occurrence. Re-registering replaces the schedule; an occurrence already turned into
    an event stays one event, because the event's key is the timer key plus the scheduled
    instant. `event_key` = (source, source_id) fixes the key of a one-off's event. `options`
    are Schedule's (`cron`, `timezone`, `policy`, `catch_up_max`, `delay`).
    """
    inbox = Inbox.objects.resolve(inbox)
    schedule = Schedule(
        inbox.pk, key, due=due, payload=payload, every=every, event_key=event_key, **options
    )
    return schedule(clock.resolve(now))


def run_scheduler(now=None, batch_size=SCHEDULER_BATCH, inbox=None) -> int:
    """Turn due timers, of every inbox (or of `inbox`), into inbox events; the number of
    timers handled. The timer advances in the transaction that stores its event, under its
    inbox's lease lock, so a second pass or a second scheduler finds nothing due; the event
    key (timer key + scheduled instant) is the second line of defence.
    """
    timers = Timer.objects.all()
    if inbox is not None:
        timers = timers.filter(inbox=Inbox.objects.resolve(inbox))
    now = clock.resolve(now)
    candidates = list(
        timers.due(now).order_by("due", "id").values_list("pk", "inbox_id")[:batch_size]
    )
    # Schedulers started together would otherwise walk the same list in the same order,
    # queueing on the same lease rows; shuffled, each mostly finds timers nobody holds.
    random.shuffle(candidates)
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
