"""`manage.py prune`: every table is pruned after its retention and not before, nothing a
live run needs goes, and a pruned event's key still refuses a duplicate for as long as
ALWAYSON_RETAIN_EVENT_KEYS says."""

from datetime import timedelta
from io import StringIO

import pytest
from axes.models import AccessAttempt, AccessLog
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.contrib.sessions.models import Session as LoginSession
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from alwayson.claude.models import ModelCall, ToolResult
from alwayson.egress.models import EgressCall
from alwayson.ops.models import Process
from alwayson.ops.retention import prune, would_prune
from alwayson.runtime.api import (
    acquire,
    add_timer,
    answer_approval,
    claim_batch,
    finish,
    ingest,
    request_approval,
    run_scheduler,
)
from alwayson.web.models import PasswordResetRequest
from approvals.models import Approval, AuditEntry
from inbox.models import Event, EventTrace, RunRecord, Session
from inbox.services import Held
from outbox.models import Notice, OutboxMessage
from tests.support.env import environment, manage
from timers.models import Timer

pytestmark = pytest.mark.django_db

DAY = timedelta(days=1)
SECOND = timedelta(seconds=1)


def run_done(inbox, now, holder="w"):
    """Claim and finish every due event of `inbox` at `now`, as a worker would."""
    generation = acquire(inbox, holder, now=now)
    ids = [event.pk for event in claim_batch(inbox, holder, generation, now=now)]
    assert finish(Held(inbox, holder, generation, ids), [], now=now)
    return ids


def deliver_done(inbox, key, now, payload=None):
    assert ingest(inbox, "stripe", key, payload or {"amount": 12}, now=now)
    run_done(inbox, now)
    return Event.objects.get(inbox=inbox, source="stripe", source_id=key)


# --- events ----------------------------------------------------------------------------------


def test_a_done_event_is_cleared_to_a_tombstone_after_its_retention_and_not_before(
    inbox, t0, settings
):
    event = deliver_done(inbox, "evt_1", t0)

    prune(t0 + settings.ALWAYSON_RETAIN_DONE_EVENTS * DAY - SECOND)
    event.refresh_from_db()
    assert event.payload == {"amount": 12}

    counts = prune(t0 + settings.ALWAYSON_RETAIN_DONE_EVENTS * DAY + SECOND)
    event.refresh_from_db()
    assert (event.payload, event.error, event.status) == ({}, "", Event.Status.DONE)
    assert counts["inbox.Event (payload cleared)"] == 1
    assert counts["inbox.Event"] == 0


def test_a_pruned_done_event_refuses_its_duplicate_until_the_key_retention_passes(
    inbox, t0, settings
):
    deliver_done(inbox, "evt_1", t0)
    keys_kept = t0 + settings.ALWAYSON_RETAIN_EVENT_KEYS * DAY

    prune(t0 + settings.ALWAYSON_RETAIN_DONE_EVENTS * DAY + SECOND)
    assert ingest(inbox, "stripe", "evt_1", {"amount": 12}, now=keys_kept - DAY) is False
    prune(keys_kept - SECOND)
    assert ingest(inbox, "stripe", "evt_1", {"amount": 12}, now=keys_kept) is False

    counts = prune(keys_kept + SECOND)
    assert counts["inbox.Event"] == 1
    assert not Event.objects.filter(source_id="evt_1").exists()
    # Past every sender's retry window the key is free again, as documented.
    assert ingest(inbox, "stripe", "evt_1", {}, now=keys_kept + DAY) is True


def test_an_events_trace_context_stays_with_its_tombstone_and_goes_with_its_row(
    inbox, t0, settings
):
    event = deliver_done(inbox, "evt_1", t0)
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    EventTrace.objects.create(event=event, traceparent=traceparent)
    keys_kept = t0 + settings.ALWAYSON_RETAIN_EVENT_KEYS * DAY

    prune(t0 + settings.ALWAYSON_RETAIN_DONE_EVENTS * DAY + SECOND)
    assert EventTrace.objects.get(event=event).traceparent == traceparent

    counts = prune(keys_kept + SECOND)
    assert counts["inbox.Event"] == counts["inbox.EventTrace"] == 1
    assert not EventTrace.objects.exists()


def test_pending_running_and_dead_events_are_never_pruned(inbox, t0):
    for key in ("pending", "running", "dead"):
        ingest(inbox, "chat", key, {"text": key}, now=t0)
    Event.objects.filter(source_id="running").update(status=Event.Status.RUNNING)
    Event.objects.filter(source_id="dead").update(status=Event.Status.DEAD, error="boom")

    counts = prune(t0 + 1000 * DAY)

    # Not events: the live pages' change log the chat messages wrote (alwayson/web/live.py).
    counts.pop("alwayson_web.LiveChange")
    assert sum(counts.values()) == 0
    kept = {e.source_id: (e.status, e.payload) for e in Event.objects.all()}
    assert kept == {
        "pending": ("pending", {"text": "pending"}),
        "running": ("running", {"text": "running"}),
        "dead": ("dead", {"text": "dead"}),
    }
    assert Event.objects.get(source_id="dead").error == "boom"


def test_the_answer_key_an_expiry_timer_will_write_is_kept_until_the_timer_fired(
    inbox, t0, settings
):
    request_approval(inbox, "refund-1", "Refund 12 EUR", timedelta(days=60), now=t0)
    answer_approval(inbox, "refund-1", "yes", now=t0)
    run_done(inbox, t0)
    long_after = t0 + (settings.ALWAYSON_RETAIN_EVENT_KEYS + 10) * DAY

    prune(long_after)
    assert Event.objects.filter(source="approval", source_id="refund-1").exists()

    # The expiry fires on day 60: its copy of the key is still refused, no second wake-up.
    run_scheduler(now=t0 + 60 * DAY)
    assert Event.objects.filter(source="approval").count() == 1
    assert not Event.objects.pending().exists()

    counts = prune(t0 + (60 + settings.ALWAYSON_RETAIN_EVENT_KEYS) * DAY + SECOND)
    assert counts["inbox.Event"] == 1 and counts["timers.Timer"] == 1
    assert not Timer.objects.exists()


def test_fired_one_offs_go_after_the_key_retention_and_recurring_timers_never_fire_again(
    inbox, t0, settings
):
    add_timer(inbox, "once", due=t0, now=t0)
    add_timer(inbox, "hourly", due=t0, every=3600, now=t0)
    run_scheduler(now=t0)
    run_done(inbox, t0)
    first = set(Event.objects.filter(source="timer").values_list("source_id", flat=True))
    assert len(first) == 2
    keys_kept = t0 + settings.ALWAYSON_RETAIN_EVENT_KEYS * DAY

    prune(keys_kept - SECOND)
    assert Timer.objects.count() == 2

    prune(keys_kept + SECOND)
    assert list(Timer.objects.values_list("key", flat=True)) == ["hourly"]
    assert not Event.objects.filter(source="timer").exists()
    # The recurring timer's row says what fired: the next pass stores one new occurrence,
    # never the pruned ones again.
    run_scheduler(now=keys_kept + SECOND)
    fired = list(Event.objects.filter(source="timer").values_list("source_id", flat=True))
    assert len(fired) == 1 and fired[0].startswith("hourly@") and fired[0] not in first


# --- outbox and notices ----------------------------------------------------------------------


def test_sent_messages_go_after_their_retention_but_held_failed_and_the_newest_sent_stay(
    inbox, t0, settings
):
    def message(body, status, sent_at=None):
        return OutboxMessage.objects.create(
            inbox=inbox, body=body, status=status, created=t0, sent_at=sent_at
        )

    message("old", OutboxMessage.Status.SENT, t0)
    message("newest", OutboxMessage.Status.SENT, t0 + DAY)
    message("held", OutboxMessage.Status.HELD)
    message("failed", OutboxMessage.Status.FAILED, t0)
    retention = settings.ALWAYSON_RETAIN_SENT_OUTBOX * DAY

    prune(t0 + retention - SECOND)
    assert OutboxMessage.objects.count() == 4

    counts = prune(t0 + retention + 100 * DAY)
    assert counts["outbox.OutboxMessage"] == 1
    kept = set(OutboxMessage.objects.values_list("body", flat=True))
    # The newest sent message is when the inbox's gap started.
    assert kept == {"newest", "held", "failed"}


def test_sent_notices_go_after_their_retention_and_held_or_failed_ones_stay(
    inbox, owner, t0, settings
):
    for n, status in enumerate(Notice.Status.values):
        Notice.objects.create(
            inbox=inbox,
            recipient=owner,
            topic=f"approval:{n}",
            key=f"k{n}",
            subject="s",
            body="b",
            status=status,
            created=t0,
            due_at=t0,
            sent_at=t0,
        )
    retention = settings.ALWAYSON_RETAIN_SENT_OUTBOX * DAY

    prune(t0 + retention - SECOND)
    assert Notice.objects.count() == 3
    prune(t0 + retention + SECOND)
    assert set(Notice.objects.values_list("status", flat=True)) == {"held", "failed"}


# --- the other tables that grow --------------------------------------------------------------


def make_model_call(inbox, at, key="k"):
    return ModelCall.objects.create(
        inbox=inbox, request_key=key, generation=1, model="m", response={}, created=at
    )


def make_tool_result(inbox, at, key="k"):
    return ToolResult.objects.create(
        inbox=inbox, idempotency_key=key, tool="refund", result={}, generation=1, created=at
    )


def make_egress_call(inbox, at):
    return EgressCall.objects.create(
        inbox=inbox, service="s", method="GET", path="/", outcome="sent", at=at
    )


def make_run_record(inbox, at):
    return RunRecord.objects.create(
        inbox=inbox, generation=1, worker="w", started=at, ended=at, outcome="done"
    )


@pytest.mark.parametrize(
    "make, setting",
    [
        (make_run_record, "ALWAYSON_RETAIN_RUN_RECORDS"),
        (make_model_call, "ALWAYSON_RETAIN_MODEL_CALLS"),
        (make_tool_result, "ALWAYSON_RETAIN_MODEL_CALLS"),
        (make_egress_call, "ALWAYSON_RETAIN_EGRESS_CALLS"),
    ],
)
def test_call_logs_go_after_their_retention_and_not_before(inbox, t0, settings, make, setting):
    row = make(inbox, t0)
    retention = getattr(settings, setting) * DAY

    prune(t0 + retention - SECOND)
    assert type(row).objects.filter(pk=row.pk).exists()
    counts = prune(t0 + retention + SECOND)
    assert counts[type(row)._meta.label] == 1
    assert not type(row).objects.filter(pk=row.pk).exists()


@pytest.mark.parametrize("make", [make_model_call, make_tool_result])
def test_a_run_that_may_still_be_retried_keeps_its_cached_answers(inbox, t0, settings, make):
    ingest(inbox, "chat", "m1", {"text": "hi"}, now=t0)  # never finished: pending for good
    row = make(inbox, t0 + SECOND)
    earlier = make(inbox, t0 - SECOND, key="before")

    prune(t0 + (settings.ALWAYSON_RETAIN_MODEL_CALLS + 100) * DAY)

    assert type(row).objects.filter(pk=row.pk).exists()
    assert not type(row).objects.filter(pk=earlier.pk).exists()


def test_a_run_waiting_for_an_approval_keeps_its_cached_answers(inbox, t0, settings):
    request_approval(inbox, "refund-1", "Refund", timedelta(days=365), now=t0)
    row = make_model_call(inbox, t0 + SECOND)

    prune(t0 + (settings.ALWAYSON_RETAIN_MODEL_CALLS + 100) * DAY)

    assert ModelCall.objects.filter(pk=row.pk).exists()


def test_stale_processes_throttle_rows_attempts_and_expired_logins_go(t0, settings):
    Process.objects.create(kind="worker", worker_id="w", host="h", pid=1, started=t0, last_beat=t0)
    PasswordResetRequest.objects.create(email="a@example.com", created=t0)
    AccessAttempt.objects.create(
        user_agent="ua",
        ip_address="127.0.0.1",
        username="u",
        http_accept="*",
        path_info="/",
        get_data="",
        post_data="",
        failures_since_start=1,
    )
    AccessAttempt.objects.update(attempt_time=t0)
    LoginSession.objects.create(session_key="s" * 32, session_data="", expire_date=t0)

    assert sum(prune(t0 - SECOND).values()) == 0
    counts = prune(t0 + 2 * DAY)

    for label in (
        "alwayson_ops.Process",
        "alwayson_web.PasswordResetRequest",
        "axes.AccessAttempt",
        "sessions.Session",
    ):
        assert counts[label] == 1, label
    assert not Process.objects.exists() and not LoginSession.objects.exists()


def test_an_inbox_session_state_is_never_pruned(inbox, t0):
    Session.objects.filter(inbox=inbox).update(state={"waiting": "refund-1"}, updated=t0)

    prune(t0 + 10_000 * DAY)

    assert Session.objects.get(inbox=inbox).state == {"waiting": "refund-1"}


# --- the audit trail -------------------------------------------------------------------------


def audit_world(inbox, t0):
    owner = inbox.owner
    request_approval(inbox, "answered", "Refund 12 EUR", timedelta(hours=1), now=t0)
    answer_approval(inbox, "answered", "yes", now=t0, by=owner)
    request_approval(inbox, "waiting", "Refund 9 EUR", timedelta(days=3650), now=t0)
    # The answer reached the agent and the expiry timer fired: only the keys' age keeps
    # the settled request.
    run_scheduler(now=t0 + timedelta(hours=1))
    run_done(inbox, t0 + timedelta(hours=1))
    LogEntry.objects.create(
        user=owner,
        content_type=ContentType.objects.get_for_model(Approval),
        object_id="1",
        object_repr="answered",
        action_flag=CHANGE,
        change_message="Requeued",
    )
    LogEntry.objects.update(action_time=t0)
    AccessLog.objects.create(
        user_agent="ua", ip_address="127.0.0.1", username="owner", http_accept="*", path_info="/"
    )
    AccessLog.objects.update(attempt_time=t0)


def test_the_audit_trail_is_kept_forever_by_default(inbox, t0, settings):
    assert settings.ALWAYSON_RETAIN_AUDIT is None
    audit_world(inbox, t0)

    prune(t0 + 10_000 * DAY)

    assert Approval.objects.count() == 2
    assert AuditEntry.objects.filter(username=inbox.owner.username).exists()
    assert Approval.objects.get(request_id="answered").answered_by == inbox.owner
    assert LogEntry.objects.exists() and AccessLog.objects.exists()


def test_the_audit_trail_goes_after_ALWAYSON_RETAIN_AUDIT_but_a_waiting_approval_stays(
    inbox, t0, settings
):
    settings.ALWAYSON_RETAIN_AUDIT = 400
    audit_world(inbox, t0)

    prune(t0 + 400 * DAY - SECOND)
    assert Approval.objects.count() == 2 and LogEntry.objects.exists()

    counts = prune(t0 + 400 * DAY + SECOND)
    assert list(Approval.objects.values_list("request_id", flat=True)) == ["waiting"]
    assert counts["approvals.Approval"] == 1
    assert counts["approvals.AuditEntry"] >= 1  # with its approval (on_delete=CASCADE)
    assert not AuditEntry.objects.exists()
    assert not LogEntry.objects.exists() and not AccessLog.objects.exists()


def test_a_settled_approval_stays_while_its_expiry_timer_waits_and_goes_with_its_key(
    inbox, t0, settings
):
    settings.ALWAYSON_RETAIN_AUDIT = settings.ALWAYSON_RETAIN_EVENT_KEYS
    approval = request_approval(inbox, "refund-1", "Refund 12 EUR", timedelta(days=60), now=t0)
    answer_approval(inbox, "refund-1", "yes", now=t0)
    run_done(inbox, t0)
    past_audit = t0 + (settings.ALWAYSON_RETAIN_AUDIT + 1) * DAY

    counts = prune(past_audit)

    # Its answer key and expiry timer are still there: so is the row that refuses answers.
    assert counts["approvals.Approval"] == 0
    assert Approval.objects.get(request_id="refund-1").answer == "yes"
    assert answer_approval(inbox, "refund-1", "no", now=past_audit).stands == "yes"
    # Asking again is refused, naming the answer that stands: never a new request under the
    # old answer's key, which could not store its own.
    with pytest.raises(ValueError, match=r"request_id 'refund-1' was answered already \(yes\)"):
        request_approval(inbox, "refund-1", "Refund 12 EUR", timedelta(days=60), now=past_audit)
    assert Approval.objects.get().pk == approval.pk
    assert Event.objects.filter(source="approval").count() == 1

    run_scheduler(now=t0 + 60 * DAY)
    counts = prune(t0 + (60 + settings.ALWAYSON_RETAIN_EVENT_KEYS) * DAY + SECOND)
    assert counts["inbox.Event"] == counts["timers.Timer"] == counts["approvals.Approval"] == 1
    assert not Approval.objects.exists() and not AuditEntry.objects.exists()


def test_a_settled_approval_stays_while_its_answer_waits_for_the_agent(inbox, t0, settings):
    settings.ALWAYSON_RETAIN_AUDIT = settings.ALWAYSON_RETAIN_EVENT_KEYS
    request_approval(inbox, "refund-1", "Refund 12 EUR", timedelta(hours=1), now=t0)
    answer_approval(inbox, "refund-1", "no", now=t0)
    run_scheduler(now=t0 + DAY)  # the expiry finds the key taken
    past_audit = t0 + (settings.ALWAYSON_RETAIN_AUDIT + 1) * DAY

    counts = prune(past_audit)  # no worker ran: the answer is still pending

    assert counts["approvals.Approval"] == 0
    assert Approval.objects.get(request_id="refund-1").answer == "no"
    assert Event.objects.pending().filter(source="approval").count() == 1
    run_done(inbox, past_audit)
    counts = prune(past_audit + (settings.ALWAYSON_RETAIN_EVENT_KEYS + 1) * DAY)
    assert counts["inbox.Event"] == counts["approvals.Approval"] == 1


def test_settings_refuse_a_key_retention_shorter_than_a_sender_retries():
    for name, value in [
        ("ALWAYSON_RETAIN_EVENT_KEYS", "3"),
        ("ALWAYSON_RETAIN_DONE_EVENTS", "60"),
        ("ALWAYSON_RETAIN_AUDIT", "10"),
        ("ALWAYSON_RETAIN_SENT_OUTBOX", "a month"),
        ("ALWAYSON_RETAIN_MODEL_CALLS", "1"),
    ]:
        done = manage("check", env=environment(**{name: value}))
        assert done.returncode != 0, name
        assert "ImproperlyConfigured" in done.stderr and name in done.stderr, done.stderr


# --- batches and the command -----------------------------------------------------------------


def test_each_batch_is_one_bounded_delete_in_its_own_transaction(inbox, t0, settings):
    for n in range(5):
        ingest(inbox, "stripe", f"evt_{n}", {}, now=t0)
    run_done(inbox, t0)
    batches = []

    with CaptureQueriesContext(connection) as captured:
        prune(
            t0 + settings.ALWAYSON_RETAIN_EVENT_KEYS * DAY + SECOND,
            batch_size=2,
            on_batch=lambda name, counts: batches.append((name, counts)),
        )

    deletes = [q["sql"] for q in captured if q["sql"].startswith('DELETE FROM "inbox_event"')]
    assert len(deletes) == 3
    assert [counts for name, counts in batches if name == "inbox.Event"] == [
        {"inbox.Event": 2},
        {"inbox.Event": 2},
        {"inbox.Event": 1},
    ]
    # One transaction per batch (plus the empty one that ends each rule).
    begins = [q["sql"] for q in captured if q["sql"].upper().startswith(("BEGIN", "SAVEPOINT"))]
    assert len(begins) >= 3
    assert not Event.objects.exists()


def test_dry_run_prints_each_table_and_deletes_nothing(inbox, t0, settings):
    deliver_done(inbox, "evt_1", t0 - 365 * DAY)
    out = StringIO()

    call_command("prune", "--dry-run", stdout=out)

    lines = out.getvalue().splitlines()
    assert "inbox.Event (payload cleared)\t1" in lines
    assert "inbox.Event\t1" in lines
    assert "outbox.OutboxMessage\t0" in lines
    assert "inbox.RunRecord\t1" in lines  # the run that finished it, a year ago too
    assert lines[-1] == "would prune 3 row(s)"
    assert Event.objects.get(source_id="evt_1").payload == {"amount": 12}


def test_prune_prints_the_count_per_table(inbox, t0):
    deliver_done(inbox, "evt_1", t0 - 365 * DAY)
    out = StringIO()

    call_command("prune", "--batch-size", "1", stdout=out)

    lines = out.getvalue().splitlines()
    assert "inbox.Event (payload cleared)\t1" in lines and "inbox.Event\t1" in lines
    assert "inbox.RunRecord\t1" in lines
    assert lines[-1] == "pruned 3 row(s)"
    assert not Event.objects.exists()
    assert would_prune(t0) == dict.fromkeys(would_prune(t0), 0)


def test_a_bad_batch_size_is_refused(t0):
    with pytest.raises(CommandError, match="--batch-size"):
        call_command("prune", "--batch-size", "0")
    with pytest.raises(ValueError, match="batch_size"):
        prune(t0, batch_size=0)


# --- scheduling it -----------------------------------------------------------------------------


def test_the_systemd_timer_runs_the_prune_command_daily():
    import shlex

    from alwayson.ops.processes import SCHEDULED
    from tests.support.deploy import UNITS, normalized, unit_values

    service, timer = UNITS / "alwayson-prune.service", UNITS / "alwayson-prune.timer"
    [exec_start] = unit_values(service, "ExecStart")
    assert normalized(shlex.split(exec_start)) == SCHEDULED["prune"]
    assert unit_values(service, "Type") == ["oneshot"]
    assert unit_values(service, "User") == ["alwayson"]
    assert unit_values(timer, "Unit") == ["alwayson-prune.service"]
    assert unit_values(timer, "OnCalendar") == ["*-*-* 03:17:00"]
    assert unit_values(timer, "Persistent") == ["true"]


def test_memory_versions_go_after_their_retention_once_superseded_and_files_stay(
    inbox, t0, settings
):
    from alwayson.claude.memory import Change, MemoryWrites
    from alwayson.claude.models import MemoryFile, MemoryVersion

    settings.ALWAYSON_RETAIN_MEMORY_VERSIONS = 30
    MemoryWrites(inbox.pk, 1, (Change("/memories/a", "create", "one"),))(t0)
    MemoryWrites(inbox.pk, 2, (Change("/memories/a", "str_replace", "two"),))(t0 + DAY)
    MemoryWrites(inbox.pk, 2, (Change("/memories/b", "create", "alone"),))(t0)

    prune(t0 + 30 * DAY - SECOND)
    assert MemoryVersion.objects.count() == 3
    counts = prune(t0 + 1000 * DAY)

    assert counts["alwayson_claude.MemoryVersion"] == 1
    assert list(MemoryVersion.objects.order_by("id").values_list("path", "content")) == [
        ("/memories/a", "two"),
        ("/memories/b", "alone"),
    ]
    assert MemoryFile.objects.count() == 2


def test_memory_versions_are_kept_forever_unless_a_retention_is_set(inbox, t0, settings):
    from alwayson.claude.memory import Change, MemoryWrites
    from alwayson.claude.models import MemoryVersion

    settings.ALWAYSON_RETAIN_MEMORY_VERSIONS = None
    MemoryWrites(inbox.pk, 1, (Change("/memories/a", "create", "one"),))(t0)
    MemoryWrites(inbox.pk, 2, (Change("/memories/a", "str_replace", "two"),))(t0)

    prune(t0 + 3650 * DAY)

    assert MemoryVersion.objects.count() == 2
