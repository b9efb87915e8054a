"""`prune` on PostgreSQL while a real `runworker` process drains the same inboxes: old done
rows go, in many small transactions, and every new event is still run once and done."""

from datetime import timedelta

import pytest
from django.db import connection, connections, transaction

from alwayson.ops.retention import prune, rules
from alwayson.runtime.api import (
    acquire,
    answer_approval,
    claim_batch,
    finish,
    request_approval,
    run_scheduler,
)
from approvals.models import Approval
from inbox import clock
from inbox.models import Event
from inbox.services import Held, ingest
from outbox.models import OutboxMessage
from tests.support.clock import T0
from tests.support.plans import assert_uses, plan_of
from tests.support.processes import wait_for
from tests.support.workers import _exited, effects, make_inboxes, runs
from timers.models import Timer

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

OLD = 2000  # done events past every retention, spread over the inboxes the worker drains
NEW = 120


def test_prune_while_a_worker_drains_loses_nothing(spawn, django_user_model):
    inboxes = make_inboxes(django_user_model, "prune", 6)
    long_ago = clock.database_now() - timedelta(days=400)
    Event.objects.bulk_create(
        Event(
            inbox=inboxes[n % len(inboxes)],
            source="stripe",
            source_id=f"old-{n}",
            payload={"n": n},
            status=Event.Status.DONE,
            attempts=1,
            available_at=long_ago,
            created=long_ago,
            updated=long_ago,
        )
        for n in range(OLD)
    )
    with transaction.atomic():
        for n in range(NEW // 2):
            ingest(inboxes[n % len(inboxes)], "chat", f"new-{n}", {"sleep": 0.005})
    worker = spawn("drain", "--concurrency", "3", "--interval", "1", wait_listening=False)
    wait_for(lambda: runs() or _exited(worker), 60, "the worker's first run", period=0.1)
    assert worker.alive(), worker.log()

    # Prune in small batches while the worker runs, and while more events arrive.
    pruned = {}
    for n in range(NEW // 2, NEW):
        ingest(inboxes[n % len(inboxes)], "chat", f"new-{n}", {"sleep": 0.005})
        if n % 10 == 0:
            for table, count in prune(clock.database_now(), batch_size=25).items():
                pruned[table] = pruned.get(table, 0) + count
    new = Event.objects.filter(source="chat")
    wait_for(
        lambda: new.filter(status=Event.Status.DONE).count() == NEW,
        60,
        "every new event to be done",
        period=0.1,
    )
    for table, count in prune(clock.database_now(), batch_size=25).items():
        pruned[table] = pruned.get(table, 0) + count
    assert worker.stop() == 0, worker.log()

    assert pruned["inbox.Event"] == OLD
    assert not Event.objects.filter(source="stripe").exists()
    # Every new event: kept, done, with its payload, run once, its side effect made once.
    assert new.count() == NEW
    assert set(new.values_list("status", "attempts").distinct()) == {("done", 1)}
    assert all(payload == {"sleep": 0.005} for payload in new.values_list("payload", flat=True))
    ran = sorted(pk for run in runs() for pk in run["event_ids"])
    assert ran == sorted(new.values_list("pk", flat=True))
    assert sorted(event for _, event, fresh in effects() if fresh) == ran


# --- each batch reads an index, not the table ------------------------------------------------


RECENT = 3000  # rows a daily pass must not read: kept for weeks yet


@pytest.fixture
def history(django_user_model):
    """A table of recent finished rows with a day's worth past their retention at its head."""
    [inbox] = make_inboxes(django_user_model, "plans", 1)
    old, recent = T0 - timedelta(days=400), T0 - timedelta(hours=1)
    ages = [old] * 30 + [recent] * RECENT
    Event.objects.bulk_create(
        Event(
            inbox=inbox,
            source="chat",
            source_id=f"e{n}",
            payload={"text": "hi"},
            status=Event.Status.DONE,
            available_at=at,
            created=at,
            updated=at,
        )
        for n, at in enumerate(ages)
    )
    Event.objects.bulk_create(
        Event(
            inbox=inbox, source="chat", source_id=f"p{n}", available_at=T0, created=T0, updated=T0
        )
        for n in range(RECENT)
    )
    Timer.objects.bulk_create(
        Timer(inbox=inbox, key=f"t{n}", due=at, done=True) for n, at in enumerate(ages)
    )
    OutboxMessage.objects.bulk_create(
        OutboxMessage(inbox=inbox, body="b", status="sent", created=at, sent_at=at) for at in ages
    )
    with connection.cursor() as cursor:
        for model in (Event, Timer, OutboxMessage):
            cursor.execute(f"ANALYZE {model._meta.db_table}")


@pytest.mark.parametrize(
    "rule, index",
    [
        ("inbox.Event (payload cleared)", "event_done_idx"),
        ("inbox.Event", "event_done_idx"),
        ("timers.Timer", "timer_done_idx"),
        ("outbox.OutboxMessage", "outbox_sent_age_idx"),
    ],
)
@pytest.mark.django_db(transaction=False)
def test_a_prune_batch_walks_its_partial_index(history, rule, index):
    [found] = [r for r in rules(T0) if r.name == rule]
    batches = found.batches(10)

    assert_uses(plan_of(batches.next), index)
    # The next batch starts after the last one, still along the index.
    assert_uses(plan_of(batches.next), index)


# --- an answer and the prune of its approval never cross -------------------------------------


def test_prune_leaves_an_approval_an_answer_holds_for_the_next_pass(inbox, settings):
    settings.ALWAYSON_RETAIN_AUDIT = settings.ALWAYSON_RETAIN_EVENT_KEYS
    request_approval(inbox, "refund-1", "Refund 12 EUR", timedelta(hours=1), now=T0)
    answer_approval(inbox, "refund-1", "yes", now=T0)
    run_scheduler(now=T0 + timedelta(hours=1))
    generation = acquire(inbox, "w", now=T0 + timedelta(hours=1))
    ids = [e.pk for e in claim_batch(inbox, "w", generation, now=T0 + timedelta(hours=1))]
    assert finish(Held(inbox, "w", generation, ids), [], now=T0 + timedelta(hours=1))
    long_after = T0 + timedelta(days=settings.ALWAYSON_RETAIN_EVENT_KEYS + 1)
    # Another session answering it, between its lock of the row and its audit entry.
    answering = connections.create_connection("default")
    try:
        with answering.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute(
                "SELECT id FROM approvals_approval WHERE request_id = %s FOR UPDATE", ["refund-1"]
            )
            with connection.cursor() as mine:
                mine.execute("SET lock_timeout = '5s'")  # waiting instead would fail, not hang
            counts = prune(long_after)
            assert counts["inbox.Event"] == counts["timers.Timer"] == 1
            assert counts["approvals.Approval"] == 0
            cursor.execute("COMMIT")
    finally:
        answering.close()
        with connection.cursor() as mine:
            mine.execute("RESET lock_timeout")

    assert prune(long_after)["approvals.Approval"] == 1
    assert not Approval.objects.exists()
