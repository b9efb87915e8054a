"""What processes count as it happens: runs, takeovers, timer fires, sends, approvals settled."""

from django.db import transaction

from approvals.models import ANSWERS, APPROVAL_SOURCE
from inbox.models import RunRecord
from inbox.signals import lease_taken_over, reserved_event_stored
from outbox.signals import messages_sent
from timers.signals import timer_fired

from .series import Counter, Histogram

RUN_OUTCOMES = tuple(RunRecord.Outcome.values)

SECONDS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

RUN_DURATION = Histogram(
    "alwayson_run_duration_seconds",
    "Agent runs (a claim that found events) from claim to finish, by outcome.",
    SECONDS_BUCKETS,
    ("outcome",),
    RUN_OUTCOMES,
)
RUN_EVENTS = Counter(
    "alwayson_run_events",
    "Events handled by agent runs, by the run's outcome.",
    ("outcome",),
    RUN_OUTCOMES,
)
LEASE_TAKEOVERS = Counter(
    "alwayson_lease_takeovers",
    "Acquires that took over a lease its holder had let lapse (a stalled or dead worker).",
)
FINISHES_REFUSED = Counter(
    "alwayson_finishes_refused",
    "Run finishes refused by the fence: the lease had moved on, nothing was committed.",
)
SEND_LATENCY = Histogram(
    "alwayson_outbox_send_latency_seconds",
    "Outbox messages sent, from queued (the run's finish) to sent; the gap is part of it.",
    (1, 5, 15, 60, 300, 900, 1800, 3600, 7200, 21600, 86400),
)
TIMER_LAG = Histogram(
    "alwayson_timer_lag_seconds",
    "Timers fired, from their due time to the scheduler's firing.",
    (0.5, 1, 2, 5, 10, 30, 60, 300, 3600),
)
APPROVALS_SETTLED = Counter(
    "alwayson_approvals_settled",
    "Approvals settled, by the answer that stands (expired: nobody answered in time).",
    ("answer",),
    ("yes", "no", "expired"),
)
PERSISTED = (
    RUN_DURATION,
    RUN_EVENTS,
    LEASE_TAKEOVERS,
    FINISHES_REFUSED,
    SEND_LATENCY,
    TIMER_LAG,
    APPROVALS_SETTLED,
)


def record_run(result):
    """Count one worker step (alwayson/runtime/worker.py); a claim that found nothing is no run.
    A run fenced off mid-run is counted as lost: no finish of it was refused."""
    if not result.ran:
        return
    outcome = RunRecord.Outcome.LOST if result.fenced else result.recorded
    RUN_DURATION.observe(result.seconds, outcome=outcome.value)
    RUN_EVENTS.inc(result.events, outcome=outcome.value)
    if outcome == RunRecord.Outcome.REFUSED:
        FINISHES_REFUSED.inc()


# Signals from the apps below alwayson, each counted when its transaction commits.


def _count_takeover(sender, lease, now, **kwargs):
    transaction.on_commit(LEASE_TAKEOVERS.inc)


def _count_timer_fire(sender, timer, now, late_by, **kwargs):
    transaction.on_commit(lambda: TIMER_LAG.observe(max(late_by, 0.0)))


def _count_sent(sender, messages, at, **kwargs):
    latencies = [max((at - message.created).total_seconds(), 0.0) for message in messages]
    transaction.on_commit(lambda: SEND_LATENCY.observe_many(latencies))


def _count_settled(sender, event, now, **kwargs):
    if event.source != APPROVAL_SOURCE or not isinstance(event.payload, dict):
        return
    answer = event.payload.get("answer")
    if answer in ANSWERS:
        transaction.on_commit(lambda: APPROVALS_SETTLED.inc(answer=answer))


def connect_signals():
    lease_taken_over.connect(_count_takeover, dispatch_uid="alwayson.metrics.takeover")
    timer_fired.connect(_count_timer_fire, dispatch_uid="alwayson.metrics.timer")
    messages_sent.connect(_count_sent, dispatch_uid="alwayson.metrics.sent")
    reserved_event_stored.connect(_count_settled, dispatch_uid="alwayson.metrics.settled")
