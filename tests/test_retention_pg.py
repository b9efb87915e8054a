"""`prune` on PostgreSQL while a real `runworker` process drains the same inboxes: old done
rows go, in many small transactions, and every new event is still run once and done."""

from datetime import timedelta

import pytest
from django.db import transaction

from alwayson.retention import prune
from inbox import clock
from inbox.models import Event
from inbox.services import ingest
from tests.test_worker_processes_pg import (  # noqa: F401 (fixtures)
    _exited,
    effects,
    make_inboxes,
    runs,
    side_tables,
    spawn,
    wait_for,
)

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

OLD = 2000  # done events past every retention, spread over the inboxes the worker drains
NEW = 120


def test_prune_while_a_worker_drains_loses_nothing(spawn, django_user_model):  # noqa: F811
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
