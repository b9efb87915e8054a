from datetime import timedelta

from django.conf import settings
from django.db import models
from django.db.models import Case, Value, When


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
    """One run of a loop process (runworker, runscheduler, rundispatcher): its heartbeat
    (alwayson/ops/health.py). A row with no `stopped` whose beat is older than
    HEALTH_LIVE_BEATS intervals is *lost*: killed, hung or cut off from the database. A
    restarted process gets a new row. Times are the database's clock.
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
        # The table it had in the project's first app: moved here without a copy.
        db_table = "alwayson_process"
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


class DeadAlert(models.Model):
    """One inbox's alerts about its dead events (alwayson/ops/alerts.py): when the last one was
    queued, and what went dead since that its operators have not been told yet. Written only
    under the inbox's lease lock, so an alert is queued exactly when its events' parking (or
    the dispatcher's flush) commits.
    """

    inbox = models.OneToOneField(
        "inbox.Inbox", on_delete=models.CASCADE, primary_key=True, related_name="dead_alert"
    )
    last_alert_at = models.DateTimeField(null=True, blank=True)
    alerts = models.PositiveIntegerField(default=0, help_text="alerts queued so far")
    # Since the last alert: how many went dead, the first few keys, the last error's last line.
    unreported = models.PositiveIntegerField(default=0)
    keys = models.JSONField(default=list, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        # The table it had in the project's first app: moved here without a copy.
        db_table = "alwayson_deadalert"
        indexes = [
            # flush_dead_alerts (the dispatcher): inboxes with unreported dead events whose
            # interval has passed.
            models.Index(
                fields=["last_alert_at"],
                condition=models.Q(unreported__gt=0),
                name="dead_alert_due_idx",
            ),
        ]

    def __str__(self):
        return f"{self.inbox_id}: {self.unreported} unreported"

    def due(self, now) -> bool:
        interval = timedelta(seconds=settings.ALWAYSON_DEAD_ALERT_INTERVAL)
        return self.last_alert_at is None or now - self.last_alert_at >= interval


class MetricTotal(models.Model):
    """One running total of a Prometheus counter or histogram, shared by every process
    (alwayson/ops/metrics/), so the totals of every host add up and survive restarts. A
    counter is one row (bucket ""); a histogram a row per bucket (its upper bound, not
    cumulative) and one for its sum ("sum"). Never written inside a run's transaction.
    """

    name = models.CharField(max_length=100)
    # The series' labels as canonical JSON (sorted keys), e.g. {"outcome": "done"}.
    labels = models.CharField(max_length=500, default="{}")
    bucket = models.CharField(max_length=30, blank=True)
    value = models.FloatField(default=0)

    class Meta:
        # The table it had in the project's first app: moved here without a copy.
        db_table = "alwayson_metrictotal"
        constraints = [
            # The upsert's conflict target; /metrics reads the whole (small) table.
            models.UniqueConstraint(fields=["name", "labels", "bucket"], name="metric_total_key"),
        ]

    def __str__(self):
        return f"{self.name}{self.labels}{self.bucket and ' ' + self.bucket}: {self.value}"
