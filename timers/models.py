from datetime import timedelta

from django.db import models
from django.db.models import Q

from inbox import clock
from inbox.models import Inbox
from inbox.services import store_event


class TimerQuerySet(models.QuerySet):
    def due(self, now):
        return self.filter(done=False, due__lte=now)


class Timer(models.Model):
    """A future wake-up. It never starts a run: when due, it becomes an inbox event."""

    inbox = models.ForeignKey(Inbox, on_delete=models.CASCADE, related_name="timers")
    key = models.CharField(max_length=200)
    due = models.DateTimeField()
    every = models.PositiveIntegerField(null=True, blank=True, help_text="seconds; empty = once")
    payload = models.JSONField(default=dict, blank=True)
    # A one-off may fire under a fixed event key instead of key@time (approval expiries do,
    # so the expiry and the user's answer compete for one key).
    event_source = models.CharField(max_length=100, blank=True)
    event_id = models.CharField(max_length=255, blank=True)
    done = models.BooleanField(default=False)

    objects = TimerQuerySet.as_manager()

    class Meta:
        ordering = ["due", "id"]
        constraints = [
            models.UniqueConstraint(fields=["inbox", "key"], name="timer_unique_key"),
            models.CheckConstraint(
                condition=Q(every__isnull=True) | Q(every__gt=0), name="timer_every_positive"
            ),
        ]
        indexes = [
            # run_scheduler: every inbox's due timers, soonest first.
            models.Index(fields=["due"], condition=Q(done=False), name="timer_due_idx"),
        ]

    def __str__(self):
        return f"{self.inbox_id}:{self.key} @ {self.due:%Y-%m-%d %H:%M:%S}"

    def advance(self, now):
        """Move past every occurrence due by `now`; return (the latest of them, how many skipped).

        Missed occurrences coalesce: one event for the latest, with the count of the others.
        """
        occurrence = self.due
        skipped = 0
        if self.every:
            skipped = int((now - occurrence).total_seconds()) // self.every
            occurrence += timedelta(seconds=skipped * self.every)
            self.due = occurrence + timedelta(seconds=self.every)
        else:
            self.done = True
        return occurrence, skipped

    def fire(self, now) -> bool:
        """Turn the due occurrence into an inbox event and advance; False if it was a replay."""
        occurrence, skipped = self.advance(now)
        payload = dict(self.payload)
        payload.update(
            scheduled_for=clock.occurrence_label(occurrence),
            late_by=int((now - occurrence).total_seconds()),
            skipped=skipped,
        )
        stored = store_event(
            self.inbox_id,
            self.event_source or "timer",
            self.event_id or f"{self.key}@{clock.occurrence_label(occurrence)}",
            payload,
            now,
        )
        self.save(update_fields=["due", "done"])
        return stored
