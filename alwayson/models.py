from datetime import timedelta

from django.conf import settings
from django.db import models
from django.db.models import Case, Value, When


class Refund(models.Model):
    """The example payments system's ledger: one row per refund, keyed by the caller's
    idempotency key, so a run retried after a takeover cannot refund twice."""

    idempotency_key = models.CharField(max_length=100, unique=True)
    order = models.CharField(max_length=50)
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return f"refund of order {self.order}"


class ProcessQuerySet(models.QuerySet):
    def running(self):
        """Not stopped cleanly: beating, or lost."""
        return self.filter(stopped__isnull=True)

    def live(self, now):
        return self.running().filter(last_beat__gte=now - live_window())

    def lost(self, now):
        """Never said goodbye and stopped beating: killed, crashed, hung, or cut off."""
        return self.running().filter(last_beat__lt=now - live_window())

    def with_state(self, now):
        """Each row annotated with `state`: live, lost or stopped, as of `now`."""
        return self.annotate(
            state=Case(
                When(stopped__isnull=False, then=Value(Process.State.STOPPED)),
                When(last_beat__gte=now - live_window(), then=Value(Process.State.LIVE)),
                default=Value(Process.State.LOST),
            )
        )

    def prune(self, now) -> int:
        """Delete rows whose last beat is older than PROCESS_RETENTION, stopped or lost."""
        deleted, _ = self.filter(last_beat__lt=now - PROCESS_RETENTION).delete()
        return deleted


class Process(models.Model):
    """One run of a loop process (runworker, runscheduler, rundispatcher): its heartbeat.

    The process writes its row when it starts and `last_beat` every
    ALWAYSON_HEARTBEAT_INTERVAL seconds, from a thread of its own and outside any work
    transaction (alwayson/health.py, ProcessBeat). A clean exit sets `stopped`. A row with
    no `stopped` whose beat is older than HEALTH_LIVE_BEATS intervals is *lost*: the process
    was killed, hung or cut off from the database. Rows are deleted a day after their last
    beat, by the next process that starts. Times are the database's clock.

    Read by /healthz, `manage.py status` and the admin; a restarted process gets a new row,
    so `runs` counts the work of this run of the process only.
    """

    class Kind(models.TextChoices):
        WORKER = "worker"
        SCHEDULER = "scheduler"
        DISPATCHER = "dispatcher"

    class State(models.TextChoices):
        LIVE = "live"
        LOST = "lost"
        STOPPED = "stopped"

    kind = models.CharField(max_length=20, choices=Kind.choices)
    # --worker-id (default host:pid): a worker's lease holder name, PostgreSQL's application_name.
    worker_id = models.CharField(max_length=200)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    started = models.DateTimeField()
    last_beat = models.DateTimeField()
    stopped = models.DateTimeField(null=True, blank=True)
    # Units of work done: agent runs for a worker; passes that fired timers or sent messages
    # for the scheduler and the dispatcher.
    runs = models.PositiveBigIntegerField(default=0)
    # The installed alwayson package's version.
    version = models.CharField(max_length=50, blank=True)

    objects = ProcessQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "processes"
        indexes = [
            # /healthz and `status`: live rows (beat since); pruning: stale rows (beat before).
            models.Index(fields=["last_beat"], name="process_beat_idx"),
        ]

    def __str__(self):
        return f"{self.kind} {self.worker_id}"


# A process is live while its last beat is within this many heartbeat intervals: one slow or
# missed beat (a busy database, a pause for garbage collection) does not make it lost.
HEALTH_LIVE_BEATS = 3
# Rows whose last beat is older than this are pruned, stopped and lost alike.
PROCESS_RETENTION = timedelta(days=1)


def live_window() -> timedelta:
    return timedelta(seconds=settings.ALWAYSON_HEARTBEAT_INTERVAL * HEALTH_LIVE_BEATS)
