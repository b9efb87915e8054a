from collections import deque
from datetime import UTC, timedelta
from zoneinfo import ZoneInfo

from cronsim import CronSim
from django.db import models
from django.db.models import Q

from inbox import clock
from inbox.models import Inbox
from inbox.services import RESERVED_SOURCES, store_event

from .signals import timer_fired

# The source of every occurrence's event, unless a one-off fixes its event key.
TIMER_SOURCE = "timer"
# Timer keys only alwayson's own machinery writes: an approval's expiry timer is
# "expire:<request id>", and a timer registered under that key would replace it.
RESERVED_KEY_PREFIX = "expire:"


class TimerQuerySet(models.QuerySet):
    def due(self, now):
        return self.filter(done=False, due__lte=now)


class Timer(models.Model):
    """A future wake-up. It never starts a run: when due, it becomes an inbox event.

    One-off (neither `every` nor `cron`), every N seconds, or a cron expression read in an
    IANA time zone ("0 9 * * *" in Europe/Berlin is 09:00 there, summer and winter).
    """

    class Policy(models.TextChoices):
        # One event for the latest missed occurrence, with the count of the others: a daily
        # digest after an outage should arrive once, not four times.
        COALESCE = "coalesce"
        # One event per missed occurrence, oldest first, up to catch_up_max: a per-day
        # billing reconciliation needs every day it missed.
        CATCH_UP = "catch_up", "catch up"

    inbox = models.ForeignKey(Inbox, on_delete=models.CASCADE, related_name="timers")
    key = models.CharField(max_length=200)
    due = models.DateTimeField()
    every = models.PositiveIntegerField(null=True, blank=True, help_text="seconds; empty = once")
    cron = models.CharField(max_length=100, blank=True, help_text='e.g. "0 9 * * *"')
    timezone = models.CharField(max_length=64, default="UTC", help_text="IANA name, for cron")
    policy = models.CharField(max_length=10, choices=Policy.choices, default=Policy.COALESCE)
    catch_up_max = models.PositiveIntegerField(
        default=10, help_text="catch_up: most events emitted for one outage"
    )
    payload = models.JSONField(default=dict, blank=True)
    # A one-off may fire under a fixed event key instead of key@time (approval expiries do,
    # so the expiry and the user's answer compete for one key).
    event_source = models.CharField(max_length=100, blank=True)
    event_id = models.CharField(max_length=255, blank=True)
    done = models.BooleanField(default=False)
    # The lease generation of the run that last set it (its RunRecord); null when no run did.
    generation = models.PositiveBigIntegerField(null=True, blank=True)

    objects = TimerQuerySet.as_manager()

    class Meta:
        ordering = ["due", "id"]
        constraints = [
            models.UniqueConstraint(fields=["inbox", "key"], name="timer_unique_key"),
            models.CheckConstraint(
                condition=Q(every__isnull=True) | Q(every__gt=0), name="timer_every_positive"
            ),
            models.CheckConstraint(
                condition=Q(every__isnull=True) | Q(cron=""), name="timer_every_or_cron"
            ),
            models.CheckConstraint(condition=Q(catch_up_max__gte=1), name="timer_cap_positive"),
        ]
        indexes = [
            # run_scheduler: every inbox's due timers, soonest first.
            models.Index(fields=["due"], condition=Q(done=False), name="timer_due_idx"),
            # prune (alwayson/ops/retention.py): fired one-offs, oldest first.
            models.Index(fields=["due", "id"], condition=Q(done=True), name="timer_done_idx"),
        ]

    def __str__(self):
        return f"{self.inbox_id}:{self.key} @ {self.due:%Y-%m-%d %H:%M:%S}"

    @property
    def reserved(self) -> bool:
        """Written only by alwayson's machinery (an approval's expiry timer)."""
        return self.key.startswith(RESERVED_KEY_PREFIX) or self.event_source in RESERVED_SOURCES

    @property
    def recurring(self) -> bool:
        return bool(self.every or self.cron)

    def next_after(self, moment):
        """The first occurrence strictly after `moment` (recurring timers)."""
        if self.every:
            return moment + timedelta(seconds=self.every)
        local = moment.astimezone(ZoneInfo(self.timezone))
        return next(CronSim(self.cron, local)).astimezone(UTC)

    def _missed(self, now, keep):
        """(how many occurrences are due by `now`, the latest `keep` of them, oldest first)."""
        if self.every:
            count = int((now - self.due).total_seconds()) // self.every + 1
            first_kept = max(count - keep, 0)
            step = timedelta(seconds=self.every)
            return count, [self.due + k * step for k in range(first_kept, count)]
        count, latest, occurrence = 0, deque(maxlen=keep), self.due
        while occurrence <= now:
            count += 1
            latest.append(occurrence)
            occurrence = self.next_after(occurrence)
        return count, list(latest)

    def advance(self, now):
        """Move past every occurrence due by `now`.

        Returns the occurrences to turn into events, oldest first, and how many were skipped.
        """
        if not self.recurring:
            self.done = True
            return [self.due], 0
        keep = self.catch_up_max if self.policy == self.Policy.CATCH_UP else 1
        count, occurrences = self._missed(now, keep)
        self.due = self.next_after(occurrences[-1])
        return occurrences, count - len(occurrences)

    def fire(self, now) -> int:
        """Turn the due occurrences into inbox events and advance; the number stored (a
        replay of an occurrence already stored is a duplicate, not a second event)."""
        timer_fired.send(
            sender=Timer, timer=self, now=now, late_by=(now - self.due).total_seconds()
        )
        occurrences, skipped = self.advance(now)
        stored = 0
        for n, occurrence in enumerate(occurrences):
            label = clock.occurrence_label(occurrence)
            payload = dict(self.payload)
            payload.update(
                scheduled_for=label,
                late_by=int((now - occurrence).total_seconds()),
                # Counted once, on the oldest event of the pass, so a sum over events is right.
                skipped=skipped if n == 0 else 0,
            )
            stored += store_event(
                self.inbox_id,
                self.event_source or TIMER_SOURCE,
                self.event_id or f"{self.key}@{label}",
                payload,
                now,
            )
        self.save(update_fields=["due", "done"])
        return stored
