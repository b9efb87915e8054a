"""Every worker query has an index, partial where it fits: the plans say so, on PostgreSQL.

Each test fills the tables with a few thousand rows the query must not touch (done events,
done timers, sent messages, answered approvals, idle leases) and a handful it must find,
runs ANALYZE, then runs the query the code runs and EXPLAINs the SQL it sent. The index is
asserted by name. The plan is the planner's own choice on this data; no setting forces it,
except in the last test, which turns sequential scans off to show that *every* statement
of a worker cycle has some index to use (a Seq Scan there means none exists).
"""

from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Min

from alwayson.claude.client import day_start
from alwayson.claude.models import ModelCall, ToolResult
from alwayson.ops.health import ProcessBeat
from alwayson.ops.models import Process
from alwayson.runtime.api import (
    Say,
    acquire,
    answer_approval,
    claim_batch,
    dispatch,
    finish,
    ingest,
    run_scheduler,
)
from approvals.models import Approval, AuditEntry
from approvals.services import Ask
from inbox.models import Event, Lease, Membership
from inbox.services import Held, acquire_next, release, renew, take_next
from outbox.models import Notice, OutboxMessage
from outbox.services import dispatch_notices
from tests.support.plans import analyze, assert_uses, explain, plan_of, sql_of
from timers.models import Timer

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db]

SECOND = timedelta(seconds=1)
HOUR = timedelta(hours=1)


# --- helpers ---------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def inlined_parameters(monkeypatch):
    """The hot paths' statements through Django's own cursor, which inlines parameters, so
    the SQL captured can be EXPLAINed as it ran (a prepared statement's is in $n form)."""
    monkeypatch.setattr("inbox.backends.postgresql.prepared_cursor", connection.cursor)


def savepoint(sql):
    """The savepoints of a test's own nested atomic blocks."""
    return sql.startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))


# --- claim_batch -----------------------------------------------------------------------------


def test_claim_pending_rows_use_the_partial_pending_index(world, t0):
    events = Event.objects.filter(inbox=world)
    due = events.pending().due(t0)
    # The batch: every due pending row, oldest first.
    assert_uses(plan_of(lambda: list(due.values_list("id", flat=True))), "event_pending_idx")
    # The oldest due retry, claimed alone.
    retry = due.filter(attempts__gt=0).order_by("id").values_list("id", flat=True)
    assert_uses(plan_of(retry.first), "event_pending_idx")
    # Rows out of attempts, parked as dead.
    out = events.out_of_attempts(settings.ALWAYSON_MAX_ATTEMPTS)
    assert_uses(plan_of(lambda: list(out)), "event_pending_idx")


def test_recount_work_uses_the_partial_pending_index(world):
    lease = Lease.objects.get(inbox=world)
    statements = [s for s in sql_of(lease.recount_work) if s.startswith("SELECT")]
    assert len(statements) == 1, statements
    assert "MIN(" in statements[0]
    assert_uses(explain(statements[0]), "event_pending_idx")
    # The same query, built here, in case recount_work changes shape.
    pending = Event.objects.filter(inbox_id=world.pk).pending()
    assert_uses(plan_of(lambda: pending.aggregate(first=Min("available_at"))), "event_pending_idx")


def test_orphans_of_an_older_generation_use_the_partial_running_index(world, t0, ttl):
    gen = acquire(world, "A", now=t0)
    assert len(claim_batch(world, "A", gen, now=t0)) == 5
    analyze()
    orphans = Event.objects.filter(inbox=world).orphaned_by(gen + 1)
    assert_uses(plan_of(lambda: list(orphans)), "event_running_idx")
    # And the takeover claim that resets them runs that query.
    later = t0 + ttl + SECOND
    new = acquire(world, "B", now=later)
    statements = sql_of(lambda: claim_batch(world, "B", new, now=later))
    orphan_query = [s for s in statements if "'running'" in s and "claim_gen" in s]
    assert orphan_query, statements
    assert_uses(explain(orphan_query[0]), "event_running_idx")


def test_finish_finds_its_running_rows_by_index(world, t0):
    gen = acquire(world, "A", now=t0)
    ids = [e.pk for e in claim_batch(world, "A", gen, now=t0)]
    analyze()
    claimed = Event.objects.running().filter(inbox=world, pk__in=ids, claim_gen=gen)
    plan = plan_of(lambda: list(claimed))
    assert "Seq Scan" not in plan, plan
    assert "event_running_idx" in plan or "inbox_event_pkey" in plan, plan


def test_take_next_finds_work_and_claims_it_by_index(world, t0, ttl):
    """The worker's fast path, one statement: the lease by lease_work_idx (under SKIP
    LOCKED), the leftover checks by the partial running and pending indexes, the batch by
    event_pending_idx."""
    statements = [s for s in sql_of(lambda: take_next("W", now=t0)) if not savepoint(s)]
    [take] = statements
    assert "SKIP LOCKED" in take, statements
    plan = explain(take)
    assert_uses(plan, "lease_work_idx")
    assert_uses(plan, "event_running_idx")
    assert_uses(plan, "event_pending_idx")
    assert "Seq Scan" not in plan, plan


def test_finish_with_release_locks_the_lease_and_finds_its_rows_by_index(world, t0):
    claim = take_next("W", now=t0)
    assert claim.inbox == world and claim.events
    analyze()
    ids = [e.pk for e in claim.events]
    statements = sql_of(
        lambda: finish(Held(world, "W", claim.generation, ids), now=t0, release=True)
    )
    fence, done = [s for s in statements if not savepoint(s)]
    assert "FOR UPDATE" in fence and "inbox_lease_pkey" in explain(fence), fence
    plan = explain(done)
    assert "Seq Scan" not in plan, plan
    assert "event_running_idx" in plan or "inbox_event_pkey" in plan, plan
    assert_uses(plan, "event_pending_idx")  # the recount


# --- the dedupe key --------------------------------------------------------------------------


def test_duplicate_check_uses_the_unique_source_key(world):
    same_key = Event.objects.filter(inbox_id=world.pk, source="chat", source_id="old-7")
    assert_uses(plan_of(same_key.exists), "event_unique_source_key")
    # answer_approval reads the answer that stands by the same key.
    answer = Event.objects.filter(inbox=world, source="approval", source_id="r1")
    assert_uses(plan_of(lambda: list(answer)), "event_unique_source_key")


def test_a_duplicate_delivery_is_refused_by_the_unique_index(world, t0):
    # ingest is one statement: the duplicate check reads the unique key's index, the inbox
    # and its lease are found by their keys; nothing scans a table.
    for ref in (world, world.slug):
        sent = sql_of(lambda ref=ref: ingest(ref, "chat", "new-1", {}, now=t0))
        # Inside the test's transaction a savepoint wraps it; on its own it is this one.
        [statement] = [sql for sql in sent if sql.lstrip().startswith("WITH")]
        plan = explain(statement)
        assert_uses(plan, "event_unique_source_key")
        assert_uses(plan, "inbox_lease_pkey")
        assert "Seq Scan" not in plan, plan


# --- leases ----------------------------------------------------------------------------------


def test_finding_an_inbox_with_work_uses_the_partial_work_index(world, t0):
    with_work = Lease.objects.with_work(t0).select_for_update(skip_locked=True)
    assert_uses(plan_of(with_work.order_by("work_at").first), "lease_work_idx")
    statements = [s for s in sql_of(lambda: acquire_next("W", now=t0)) if "work_at" in s]
    assert statements
    assert_uses(explain(statements[0]), "lease_work_idx")


# --- timers ----------------------------------------------------------------------------------


def test_due_timers_use_the_partial_due_index(world, t0):
    due = Timer.objects.due(t0).order_by("due", "id").values_list("pk", "inbox_id")
    assert_uses(plan_of(lambda: list(due[:100])), "timer_due_idx")
    # The candidates query run_scheduler sends.
    statements = sql_of(lambda: run_scheduler(now=t0))
    candidates = [s for s in statements if '"timers_timer"' in s and "LIMIT" in s]
    assert candidates, statements
    assert_uses(explain(candidates[0]), "timer_due_idx")


def test_re_registering_a_timer_finds_it_by_its_unique_key(world, t0):
    existing = Timer.objects.filter(inbox_id=world.pk, key="soon-1")
    assert_uses(plan_of(existing.first), "timer_unique_key")


# --- outbox ----------------------------------------------------------------------------------


def test_held_messages_use_the_partial_held_index(world):
    held = OutboxMessage.objects.filter(inbox_id=world.pk).held().order_by("id")
    assert_uses(plan_of(lambda: list(held)), "outbox_held_idx")
    assert_uses(plan_of(lambda: list(OutboxMessage.objects.inboxes_with_held())), "outbox_held_idx")
    stamped = OutboxMessage.objects.filter(inbox_id=world.pk, send_key="k" * 32).held()
    assert_uses(plan_of(lambda: list(stamped.order_by("id"))), "outbox_held_idx")


def test_what_a_run_said_is_read_by_the_run_index(world):
    # The timeline (alwayson/web/runs.py), among everything the busy inbox said.
    said = OutboxMessage.objects.of_run(world.pk, 2)
    assert_uses(plan_of(lambda: list(said)), "outbox_run_idx")


def test_last_send_uses_the_sent_index(world):
    messages = OutboxMessage.objects.filter(inbox_id=world.pk)
    assert_uses(plan_of(messages.last_sent_at), "outbox_sent_idx")


# --- approvals -------------------------------------------------------------------------------


def test_an_answer_finds_its_request_by_the_unique_index(world):
    request = Approval.objects.filter(inbox=world, request_id="r1")
    assert_uses(plan_of(request.first), "approval_unique_request")


# A person's keys on an approval and on its audit entries, each indexed only where set.
PEOPLE_INDEXES = {
    ("approvals_approval", "answered_by_id"): "approval_answered_by_idx",
    ("approvals_approval", "edited_by_id"): "approval_edited_by_idx",
    ("approvals_approval", "first_approved_by_id"): "approval_first_approved_by_idx",
    ("approvals_auditentry", "user_id"): "audit_user_idx",
}


def test_deleting_a_person_finds_their_answers_by_the_indexes_where_set(world, t0):
    # The history's approvals answered, edited and first approved by many people, each
    # with an audit entry of theirs; the answers of the busy inbox by nobody (expiries).
    members = list(get_user_model().objects.filter(username__startswith="member-").order_by("id"))
    history = list(Approval.objects.filter(request_id__startswith="old-").order_by("id"))
    people = dict(zip(history[::2], members, strict=False))
    for approval, member in people.items():
        approval.answered_by = approval.edited_by = approval.first_approved_by = member
    Approval.objects.bulk_update(people, ["answered_by", "edited_by", "first_approved_by"])
    AuditEntry.objects.bulk_create(
        AuditEntry(
            approval=approval,
            inbox_id=approval.inbox_id,
            user=people.get(approval),
            answer=approval.answer,
            via=AuditEntry.Via.PAGE,
            result=AuditEntry.Result.APPROVED,
            action_shown=approval.action,
            at=t0,
        )
        for approval in history
    )
    analyze()
    person = members[7]

    # What Django sends for on_delete=SET_NULL: one UPDATE per key.
    statements = sql_of(person.delete)
    used = set()
    for (table, column), index in PEOPLE_INDEXES.items():
        [update] = [
            s for s in statements if s.startswith(f'UPDATE "{table}" SET "{column}" = NULL')
        ]
        assert_uses(explain(update), index)
        used.add(index)
        # What the foreign key's own check asks when a user goes (ri_triggers.c's query),
        # planned once for any user: the partial index serves `$1 = key` too.
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            cursor.execute(
                f'PREPARE ri_check (integer) AS SELECT 1 FROM ONLY "{table}" x'
                f' WHERE $1 OPERATOR(pg_catalog.=) "{column}" FOR KEY SHARE OF x'
            )
            try:
                assert_uses(explain("EXECUTE ri_check (1)"), index)
            finally:
                cursor.execute("DEALLOCATE ri_check")
    assert used == set(PEOPLE_INDEXES.values())


# --- the Claude agent ------------------------------------------------------------------------


def test_the_model_call_cache_is_read_by_its_unique_key(world):
    cached = ModelCall.objects.filter(inbox_id=world.pk, request_key="0" * 64)
    assert_uses(
        plan_of(cached.values_list("response", flat=True).first), "modelcall_unique_request"
    )


def test_the_budget_check_sums_one_inbox_today_by_index(world, t0):
    today = ModelCall.objects.filter(inbox_id=world.pk, created__gte=day_start(t0))
    assert_uses(plan_of(today.tokens), "modelcall_inbox_created_idx")


def test_the_tool_journal_is_read_by_the_events_of_the_run(world):
    made_for = ToolResult.events.through._meta.db_table
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, made_for)
    [by_event] = [
        name
        for name, c in constraints.items()
        if c["index"] and not c["unique"] and c["columns"] == ["event_id"]
    ]
    event_ids = list(Event.objects.filter(inbox=world).values_list("pk", flat=True)[:2])
    earlier = ToolResult.objects.made_for(world.pk, "refund", event_ids)
    plan = plan_of(lambda: list(earlier))
    assert_uses(plan, by_event)
    assert_uses(plan, "alwayson_toolresult_pkey")
    assert "Seq Scan" not in plan, plan


def test_a_runs_model_and_tool_calls_are_read_by_the_run_index(world):
    # The timeline of one run and the run list's tokens (alwayson/web/runs.py), among the
    # busy inbox's many calls; without it, every call of the inbox is read.
    calls = ModelCall.objects.of_run(world.pk, 2)
    assert_uses(plan_of(lambda: list(calls)), "modelcall_run_idx")
    tools = ToolResult.objects.of_run(world.pk, 2)
    assert_uses(plan_of(lambda: list(tools)), "toolresult_run_idx")


# --- process heartbeats ----------------------------------------------------------------------


def test_health_and_pruning_read_heartbeats_by_the_beat_index(world, t0):
    live = Process.objects.live(t0).values_list("kind", flat=True).distinct()
    assert_uses(plan_of(lambda: set(live)), "process_beat_idx")
    statements = sql_of(lambda: ProcessBeat("worker", "new").register(t0))
    [prune] = [s for s in statements if s.startswith("DELETE")]
    assert_uses(explain(prune), "process_beat_idx")


def test_due_notices_use_the_partial_due_index(world, t0):
    due = Notice.objects.due(t0).order_by("due_at", "id").values_list("pk", flat=True)
    assert_uses(plan_of(lambda: list(due[:100])), "notice_due_idx")
    statements = sql_of(lambda: dispatch_notices(lambda notice: "", now=t0 - HOUR))
    [candidates] = [s for s in statements if '"outbox_notice"' in s and "LIMIT" in s]
    assert_uses(explain(candidates), "notice_due_idx")


# --- the whole cycle -------------------------------------------------------------------------


def test_no_statement_of_a_worker_cycle_needs_a_table_scan(world, t0, ttl):
    """Every SELECT/UPDATE/DELETE a worker, the scheduler, the dispatcher and an answer send
    is EXPLAINed with sequential scans disabled: a Seq Scan left in a plan means no index
    can serve that statement at all."""
    member = Membership.objects.get(inbox=world).user

    def cycle():
        ingest(world, "chat", "cycle-1", {}, now=t0)
        inbox_id, gen = acquire_next("W", now=t0)
        assert inbox_id == world.pk
        renew(world, "W", gen, now=t0)
        batch = claim_batch(world, "W", gen, now=t0)
        # The run asks: an approval, its expiry timer and a notice to each approver.
        effects = [Say(world.pk, "hi"), Ask(world.pk, "r2", "refund order 43", HOUR)]
        finish(Held(world, "W", gen, [e.pk for e in batch]), effects, now=t0)
        release(world, "W", gen)
        # The worker's fast path: take_next, then finish and release together.
        ingest(world, "chat", "cycle-0", {}, now=t0)
        claim = take_next("W", now=t0)
        assert claim.inbox == world
        finish(
            Held(world, "W", claim.generation, [e.pk for e in claim.events]), now=t0, release=True
        )
        run_scheduler(now=t0)
        dispatch(lambda *args: None, now=t0)
        dispatch_notices(lambda notice: "", now=t0)
        answer_approval(world, "r1", "yes", now=t0, by=member)
        # A lost lease: the next holder's claim resets the orphans.
        ingest(world, "chat", "cycle-2", {}, now=t0)
        gen = acquire(world, "A", now=t0)
        claim_batch(world, "A", gen, now=t0)
        later = t0 + ttl + SECOND
        claim_batch(world, "B", acquire(world, "B", now=later), now=later)
        # A loop process's heartbeat.
        heartbeat = ProcessBeat("worker", "W")
        heartbeat.register(t0)
        heartbeat.beat(t0 + SECOND)
        heartbeat.mark_stopped(t0 + 2 * SECOND)

    def reads_a_table(sql):
        verb = sql.split(None, 1)[0]
        return verb in ("UPDATE", "DELETE", "WITH") or (verb == "SELECT" and " FROM " in sql)

    statements = [s for s in sql_of(cycle) if reads_a_table(s)]
    assert len(statements) > 20
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
    try:
        scans = {}
        for sql in statements:
            plan = explain(sql)
            if "Seq Scan" in plan:
                scans[sql] = plan
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = on")
    assert not scans, "\n\n".join(f"{sql}\n{plan}" for sql, plan in scans.items())
