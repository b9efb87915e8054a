from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models, transaction
from django.db.models import Case, Sum, Value, When
from django.db.models.functions import Coalesce


class Refund(models.Model):
    """The example payments system's ledger: one row per refund, keyed by the caller's
    idempotency key, so a run retried after a takeover cannot refund twice."""

    idempotency_key = models.CharField(max_length=100, unique=True)
    order = models.CharField(max_length=50)
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return f"refund of order {self.order}"


class EgressCall(models.Model):
    """One outbound call an agent asked the egress gateway for: made, refused or failed.

    The audit and the admin's counts; never the credential, the query string or a body.
    """

    class Outcome(models.TextChoices):
        SENT = "sent"
        REFUSED = "refused"
        FAILED = "failed"

    inbox = models.ForeignKey(
        "inbox.Inbox", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    service = models.CharField(max_length=50)
    method = models.CharField(max_length=10)
    path = models.CharField(max_length=300)
    outcome = models.CharField(max_length=10, choices=Outcome.choices)
    status = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True)
    at = models.DateTimeField()

    class Meta:
        ordering = ["-id"]
        indexes = [
            # The admin's per-service counts of the last day, for one inbox or all.
            models.Index(fields=["inbox", "service", "at"], name="egress_inbox_service_idx"),
            models.Index(fields=["at"], name="egress_at_idx"),
        ]

    def __str__(self):
        return f"{self.service} {self.method} {self.path}: {self.outcome}"


class PasswordResetRequestQuerySet(models.QuerySet):
    def allow(self, email, now, limit, window) -> bool:
        """Record a password reset asked for `email`, unless `limit` were asked within
        `window` before `now`; whether its email may go out.

        Counted per address, whether or not it belongs to anybody, so the answer tells
        nothing about who has an account. Two requests at the same instant may both pass the
        count: the bound is the limit plus the concurrent requests, which is what it is for
        (a victim's mailbox), not an exact quota. Rows past the window are dropped here.
        """
        email = email.strip().lower()
        since = now - window
        with transaction.atomic():
            self.filter(created__lt=since).delete()
            if self.filter(email=email, created__gte=since).count() >= limit:
                return False
            self.create(email=email, created=now)
        return True


class PasswordResetRequest(models.Model):
    """A password reset email asked for: the throttle on /accounts/password_reset/ counts
    these per address (alwayson/views.py)."""

    email = models.CharField(max_length=254)
    created = models.DateTimeField()

    objects = PasswordResetRequestQuerySet.as_manager()

    class Meta:
        # The throttle's count: one address's requests within the cool-off.
        indexes = [models.Index(fields=["email", "created"], name="reset_email_created")]

    def __str__(self):
        return f"password reset for {self.email}"


class AgentConfig(models.Model):
    """Which agent an inbox runs, and that agent's configuration (for the Claude agent: model,
    system prompt, tool set, permission policy, budget). An inbox without one runs
    ALWAYSON_AGENT with the ALWAYSON_CLAUDE_* defaults. Edited in the admin; `clean()` refuses
    an agent that cannot be loaded, an unknown tool and a malformed policy."""

    inbox = models.OneToOneField(
        "inbox.Inbox", on_delete=models.CASCADE, primary_key=True, related_name="agent_config"
    )
    agent = models.CharField(
        max_length=200,
        blank=True,
        help_text="Dotted path of the agent callable, e.g. alwayson.claude.agent or "
        "alwayson.refund_desk.agent. Blank: ALWAYSON_AGENT.",
    )
    model = models.CharField(
        max_length=100, blank=True, help_text="Claude model. Blank: ALWAYSON_CLAUDE_MODEL."
    )
    system_prompt = models.TextField(
        blank=True, help_text="Blank: the built-in prompt (alwayson/claude/agent.py)."
    )
    tools = models.JSONField(
        null=True,
        blank=True,
        help_text='Application tools offered, a JSON list such as ["refund"]; [] for none. '
        "Blank: every tool of the ALWAYSON_CLAUDE_TOOLS modules. send_message and schedule "
        "are always offered.",
    )
    policy = models.JSONField(
        default=dict,
        blank=True,
        help_text='Per-tool permission policy, e.g. {"refund": [{"when": {"amount": {"lt": 50}}, '
        '"then": "allow"}, {"then": "ask"}], "delete_account": "deny"}. Tools not named '
        "follow ALWAYSON_CLAUDE_POLICY, then: built-ins allow, application tools ask.",
    )
    daily_token_budget = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Tokens per UTC day (input, output, cache reads and writes). "
        "Blank: ALWAYSON_CLAUDE_DAILY_TOKEN_BUDGET.",
    )
    approval_window = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(60)],
        help_text="Seconds a person has to answer a tool call that asks. "
        "Blank: ALWAYSON_CLAUDE_APPROVAL_WINDOW.",
    )
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "agent configuration"

    def __str__(self):
        return f"agent of {self.inbox}"

    def clean(self):
        from .claude.policy import check_policy
        from .claude.tools import check_tool_names, offered_tools
        from .runtime import load_agent

        errors = {}
        if self.agent:
            try:
                load_agent(self.agent, field="agent")
            except ValueError as exc:
                errors["agent"] = str(exc)
        try:
            check_tool_names(self.tools)
        except ValueError as exc:
            errors["tools"] = str(exc)
        if "tools" not in errors:
            try:
                offered = offered_tools(self.tools)
                check_policy(self.policy, {n: t.input_schema for n, t in offered.items()})
            except ValueError as exc:
                errors["policy"] = str(exc)
        if errors:
            raise ValidationError(errors)


# Every token counts toward the usage and the budget: input, output, cache reads and writes.
TOTAL_TOKENS = (
    models.F("input_tokens")
    + models.F("output_tokens")
    + models.F("cache_read_tokens")
    + models.F("cache_write_tokens")
)


class ModelCallQuerySet(models.QuerySet):
    def tokens(self) -> dict:
        """Summed usage: input, output, cache_read, cache_write and total."""
        sums = self.aggregate(
            input=Coalesce(Sum("input_tokens"), 0),
            output=Coalesce(Sum("output_tokens"), 0),
            cache_read=Coalesce(Sum("cache_read_tokens"), 0),
            cache_write=Coalesce(Sum("cache_write_tokens"), 0),
        )
        return {**sums, "total": sum(sums.values())}


class ModelCall(models.Model):
    """One answer of the Messages API, kept under the request it answered.

    Written the moment the answer arrives, outside the run's transaction: the fence does not
    roll it back, so a run retried after a crash finds it and does not pay again, and the
    day's usage counts every token that was paid for, even by a run whose finish was refused.
    """

    inbox = models.ForeignKey("inbox.Inbox", on_delete=models.CASCADE, related_name="model_calls")
    # sha256 of the request (model, system, tools, messages, max_tokens) as canonical JSON.
    request_key = models.CharField(max_length=64)
    # The lease generation of the run that paid for it: one run, one generation.
    generation = models.PositiveBigIntegerField()
    model = models.CharField(max_length=100)
    stop_reason = models.CharField(max_length=50, blank=True)
    response = models.JSONField()
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    cache_read_tokens = models.PositiveIntegerField(default=0)
    cache_write_tokens = models.PositiveIntegerField(default=0)
    created = models.DateTimeField()

    objects = ModelCallQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        constraints = [
            # The Claude agent's cache lookup, before every model call.
            models.UniqueConstraint(
                fields=["inbox", "request_key"], name="modelcall_unique_request"
            ),
        ]
        indexes = [
            # The budget check before every model call (one inbox's usage since midnight),
            # and the dashboard's usage per inbox.
            models.Index(fields=["inbox", "created"], name="modelcall_inbox_created_idx"),
        ]

    def __str__(self):
        return f"{self.model} for {self.inbox_id} gen {self.generation}"

    @property
    def total_tokens(self) -> int:
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_read_tokens
            + self.cache_write_tokens
        )


class ToolResult(models.Model):
    """The result of one application tool call, kept under the call's idempotency key.

    Written the moment the tool returns, outside the run's transaction, like ModelCall: a
    run retried after a crash gives the model the result the tool gave the first time instead
    of running it again, so its next request is the same one and is answered from the cache.
    A crash between the tool's side effect and this row runs the tool again, with the same
    idempotency key.
    """

    inbox = models.ForeignKey("inbox.Inbox", on_delete=models.CASCADE, related_name="tool_results")
    idempotency_key = models.CharField(max_length=200)
    tool = models.CharField(max_length=64)
    arguments = models.JSONField(default=dict)
    result = models.JSONField()  # the tool_result block given to the model
    approved = models.BooleanField(default=False)
    generation = models.PositiveBigIntegerField()
    created = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        constraints = [
            # The Claude agent's lookup before running a tool.
            models.UniqueConstraint(
                fields=["inbox", "idempotency_key"], name="toolresult_unique_key"
            ),
        ]

    def __str__(self):
        return f"{self.tool} ({self.idempotency_key})"


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


class DeadAlert(models.Model):
    """One inbox's alerts about its dead events (alwayson/alerts.py): when the last one was
    queued, and what went dead since that its owner has not been told yet.

    Written in the transaction that parks events as dead, under the inbox's lease lock, and
    by the dispatcher's flush under the same lock: an alert is queued exactly when its events'
    parking (or the flush) commits.
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
    """One running total of a Prometheus counter or histogram, shared by every process.

    Loop processes count in memory and add their counts here every heartbeat, with an
    upsert that adds (alwayson/metrics.py), so the totals of every process on every host add
    up and survive restarts; /metrics reads this table at scrape. A counter is one row
    (bucket ""); a histogram is a row per bucket (its upper bound, not cumulative) and one
    for its sum ("sum"). Never written inside a run's transaction.
    """

    name = models.CharField(max_length=100)
    # The series' labels as canonical JSON (sorted keys), e.g. {"outcome": "done"}.
    labels = models.CharField(max_length=500, default="{}")
    bucket = models.CharField(max_length=30, blank=True)
    value = models.FloatField(default=0)

    class Meta:
        constraints = [
            # The upsert's conflict target; /metrics reads the whole (small) table.
            models.UniqueConstraint(fields=["name", "labels", "bucket"], name="metric_total_key"),
        ]

    def __str__(self):
        return f"{self.name}{self.labels}{self.bucket and ' ' + self.bucket}: {self.value}"
