"""The worker's fast paths: take_next (lease and claim in one transaction) and
finish(release=True) (outcome and release in one). Same rules as acquire_next + claim_batch
and finish + release, checked on the rows; on both databases.
"""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from alwayson.runtime.api import Say, acquire, claim_batch, finish, ingest
from alwayson.runtime.models import AgentConfig
from alwayson.runtime.worker import Worker
from inbox.models import Event, Lease, Session
from inbox.services import Failed, Held, SaveState, finish_and_take, take_next
from outbox.models import OutboxMessage

pytestmark = pytest.mark.django_db

SECOND = timedelta(seconds=1)


def test_take_next_takes_the_lease_and_claims_the_batch_with_the_session_state(inbox, t0, ttl):
    Session.objects.filter(inbox=inbox).update(state={"step": 2})
    ingest(inbox, "chat", "m-1", {"text": "one"}, now=t0)
    ingest(inbox, "chat", "m-2", {"text": "two"}, now=t0 + SECOND)
    claim = take_next("W", now=t0 + 2 * SECOND)
    assert claim.inbox == inbox and claim.inbox.slug == inbox.slug
    assert claim.generation == 1
    assert [e.source_id for e in claim.events] == ["m-1", "m-2"]
    assert [e.payload for e in claim.events] == [{"text": "one"}, {"text": "two"}]
    assert claim.state == {"step": 2}
    lease = Lease.objects.get(inbox=inbox)
    assert (lease.holder, lease.generation) == ("W", 1)
    assert lease.until == t0 + 2 * SECOND + ttl
    rows = Event.objects.filter(inbox=inbox).values_list("status", "attempts", "claim_gen")
    assert set(rows) == {("running", 1, 1)}


def test_take_next_finds_nothing_without_work_or_while_the_lease_is_held(inbox, t0):
    assert take_next("W", now=t0) is None
    ingest(inbox, "chat", "m-1", {}, now=t0)
    assert acquire(inbox, "other", now=t0) == 1
    assert take_next("W", now=t0 + SECOND) is None
    assert Event.objects.get().status == "pending"


def test_take_next_claims_a_due_retry_alone(inbox, t0):
    ingest(inbox, "chat", "poison", {}, now=t0)
    claim = take_next("W", now=t0)
    assert finish(
        Held(inbox, "W", claim.generation, [claim.events[0].pk]), outcome=Failed("boom"), now=t0
    )
    ingest(inbox, "chat", "healthy", {}, now=t0 + SECOND)
    later = t0 + timedelta(hours=2)
    Lease.objects.filter(inbox=inbox).update(until=None)
    claim = take_next("W", now=later)
    assert [e.source_id for e in claim.events] == ["poison"]
    assert claim.events[0].attempts == 2


def test_take_next_resets_orphans_of_a_lost_lease_and_parks_the_dead(inbox, t0, ttl, settings):
    ingest(inbox, "chat", "m-1", {}, now=t0)
    old = take_next("A", now=t0)
    later = t0 + ttl + SECOND
    # The lease lapsed mid-run: the next taker sends the orphan back to pending, after its
    # backoff from the claim (long past), and claims it again as a retry.
    claim = take_next("B", now=later)
    assert claim.generation == old.generation + 1
    [orphan] = claim.events
    assert (orphan.status, orphan.attempts, orphan.claim_gen) == ("running", 2, claim.generation)
    assert f"generation {old.generation}" in Event.objects.get().error
    # Out of attempts: parked as dead by the next claim.
    Event.objects.update(
        status="pending", attempts=settings.ALWAYSON_MAX_ATTEMPTS, available_at=later
    )
    Lease.objects.filter(inbox=inbox).update(until=None, work_at=later)
    assert take_next("C", now=later).events == []
    dead = Event.objects.get()
    assert dead.status == "dead"
    assert dead.error.startswith("too many attempts")
    assert Lease.objects.get(inbox=inbox).work_at is None


def test_take_next_with_nothing_due_gives_the_lease_back_with_the_work_recounted(inbox, t0):
    ingest(inbox, "chat", "m-1", {}, now=t0)
    first = take_next("W", now=t0)
    ids = [first.events[0].pk]
    assert finish(
        Held(inbox, "W", first.generation, ids), outcome=Failed("boom"), now=t0, release=True
    )
    retry_at = Event.objects.get().available_at
    # A marker earlier than the work (as a take whose snapshot predates a change finds it):
    # the take claims nothing, and must not leave the inbox held or the marker wrong.
    Lease.objects.filter(inbox=inbox).update(work_at=t0)
    claim = take_next("W", now=t0 + SECOND)
    assert claim.inbox == inbox and claim.events == [] and claim.state is None
    lease = Lease.objects.get(inbox=inbox)
    assert (lease.holder, lease.generation, lease.until) == ("W", first.generation + 1, None)
    assert lease.work_at == retry_at
    assert Event.objects.get().status == "pending"


@pytest.mark.postgres_only
def test_the_workers_statements_are_prepared_once_per_connection(inbox, t0):
    for n in range(3):
        now = t0 + n * SECOND
        ingest(inbox, "chat", f"m-{n}", {}, now=now)
        claim = take_next("W", now=now)
        ids = [e.pk for e in claim.events]
        assert finish(Held(inbox, "W", claim.generation, ids), now=now, release=True)
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE NOT from_sql")
        prepared = [row[0] for row in cursor.fetchall()]
    # The take (lease and batch), the finish's lock on the lease row, and the finish.
    for marker in ("SKIP LOCKED", "inbox_id = $1::bigint FOR UPDATE", "held AS"):
        assert sum(marker in statement for statement in prepared) == 1, (marker, prepared)


@pytest.mark.postgres_only
def test_take_next_reads_the_inboxs_agent_with_the_claim(make_inbox, t0):
    configured, plain = make_inbox(), make_inbox()
    AgentConfig.objects.create(inbox=configured, agent=CONFIGURED)
    ingest(configured, "chat", "m-1", {}, now=t0)
    ingest(plain, "chat", "m-1", {}, now=t0 + SECOND)
    with CaptureQueriesContext(connection) as captured:
        first, second = take_next("W", now=t0 + SECOND), take_next("W", now=t0 + SECOND)
    assert len(captured) == 2
    # With its configuration's revision, for the run's version (alwayson/runtime/versions.py).
    assert (first.inbox, first.extras) == (configured, {"agent": CONFIGURED, "config_revision": 1})
    assert (second.inbox, second.extras) == (plain, {"agent": None, "config_revision": None})


CONFIGURED = "tests.inbox.test_take_next.configured_agent"


def configured_agent(run):
    run.say("from the configured agent")


@pytest.mark.postgres_only
def test_the_worker_runs_the_agent_its_claim_read_without_a_lookup_of_its_own(inbox, t0):
    AgentConfig.objects.create(inbox=inbox, agent=CONFIGURED)
    ingest(inbox, "chat", "m-1", {})
    worker = Worker("W", agent=lambda run: run.say("from the default agent"))
    with CaptureQueriesContext(connection) as captured:
        assert worker.step().outcome == "said 1"
    reading_the_agent = [q["sql"] for q in captured if "alwayson_agentconfig" in q["sql"]]
    assert len(reading_the_agent) == 1 and "SKIP LOCKED" in reading_the_agent[0]
    assert OutboxMessage.objects.get().body == "from the configured agent"


def test_finish_with_release_commits_the_run_and_gives_the_lease_back(inbox, t0):
    ingest(inbox, "chat", "m-1", {}, now=t0)
    claim = take_next("W", now=t0)
    ids = [e.pk for e in claim.events]
    effects = [Say(inbox.pk, "hello"), SaveState(inbox.pk, {"seen": 1})]
    assert finish(Held(inbox.pk, "W", claim.generation, ids), effects, now=t0, release=True)
    lease = Lease.objects.get(inbox=inbox)
    assert lease.until is None and lease.work_at is None
    assert lease.generation == claim.generation
    assert Event.objects.get().status == "done"
    assert OutboxMessage.objects.get().body == "hello"
    assert Session.objects.get(inbox=inbox).state == {"seen": 1}


def test_finish_recounts_work_that_arrived_during_the_run(inbox, t0):
    ingest(inbox, "chat", "m-1", {}, now=t0)
    claim = take_next("W", now=t0)
    ingest(inbox, "chat", "m-2", {}, now=t0 + SECOND)
    ids = [e.pk for e in claim.events]
    assert finish(Held(inbox, "W", claim.generation, ids), now=t0 + SECOND, release=True)
    assert Lease.objects.get(inbox=inbox).work_at == t0 + SECOND
    assert [e.source_id for e in take_next("W", now=t0 + 2 * SECOND).events] == ["m-2"]


def test_a_refused_finish_does_not_release_the_new_holders_lease(inbox, t0, ttl):
    ingest(inbox, "chat", "m-1", {}, now=t0)
    old = take_next("A", now=t0)
    later = t0 + ttl + SECOND
    new = acquire(inbox, "B", now=later)
    ids = [e.pk for e in old.events]
    assert not finish(
        Held(inbox, "A", old.generation, ids), [Say(inbox.pk, "x")], now=later, release=True
    )
    lease = Lease.objects.get(inbox=inbox)
    assert (lease.holder, lease.generation, lease.until) == ("B", new, later + ttl)
    assert not OutboxMessage.objects.exists()
    assert Event.objects.get().status == "running"


def test_finish_with_an_error_backs_each_event_off_in_one_update(inbox, t0, settings):
    for n in range(3):
        ingest(inbox, "chat", f"m-{n}", {}, now=t0)
    gen = acquire(inbox, "W", now=t0)
    ids = [e.pk for e in claim_batch(inbox, "W", gen, now=t0)]
    with CaptureQueriesContext(connection) as captured:
        assert finish(Held(inbox, "W", gen, ids), outcome=Failed("boom"), now=t0)
    updates = [q["sql"] for q in captured if q["sql"].startswith('UPDATE "inbox_event"')]
    assert len(updates) == 1, updates
    step = settings.ALWAYSON_RETRY_BASE
    for event in Event.objects.all():
        assert (event.status, event.error, event.attempts) == ("pending", "boom", 1)
        assert t0 + timedelta(seconds=step / 2) <= event.available_at
        assert event.available_at <= t0 + timedelta(seconds=step)


# --- a finish that takes the next inbox (WorkerPool's slots) ---------------------------------


def test_finish_and_take_finishes_the_run_and_claims_the_next_inbox(make_inbox, t0):
    first, second = make_inbox(), make_inbox()
    ingest(first, "chat", "a-1", {}, now=t0)
    ingest(second, "chat", "b-1", {}, now=t0 + SECOND)
    claim = take_next("W", now=t0 + SECOND)
    ids = [e.pk for e in claim.events]

    finished, following = finish_and_take(
        Held(first, "W", claim.generation, ids), [Say(first.pk, "done")], now=t0 + SECOND
    )
    assert finished is True
    assert following.inbox == second
    assert [e.source_id for e in following.events] == ["b-1"]
    assert Lease.objects.get(inbox=first).until is None
    assert Lease.objects.get(inbox=second).holder == "W"
    assert OutboxMessage.objects.get().body == "done"
    statuses = dict(Event.objects.values_list("source_id", "status"))
    assert statuses == {"a-1": "done", "b-1": "running"}


def test_finish_and_take_continues_with_the_same_inbox_when_work_arrived_meanwhile(inbox, t0):
    ingest(inbox, "chat", "m-1", {}, now=t0)
    claim = take_next("W", now=t0)
    ingest(inbox, "chat", "m-2", {}, now=t0 + SECOND)

    finished, following = finish_and_take(
        Held(inbox, "W", claim.generation, [e.pk for e in claim.events]), now=t0 + SECOND
    )
    assert finished is True
    assert (following.inbox, following.generation) == (inbox, claim.generation + 1)
    assert [e.source_id for e in following.events] == ["m-2"]


def test_finish_and_take_with_no_work_left_takes_nothing(inbox, t0):
    ingest(inbox, "chat", "m-1", {}, now=t0)
    claim = take_next("W", now=t0)
    finished, following = finish_and_take(
        Held(inbox, "W", claim.generation, [e.pk for e in claim.events]), now=t0
    )
    assert (finished, following) == (True, None)
    lease = Lease.objects.get(inbox=inbox)
    assert (lease.until, lease.work_at) == (None, None)


def test_a_refused_finish_and_take_writes_nothing_of_the_run(make_inbox, t0, ttl):
    mine, other = make_inbox(), make_inbox()
    ingest(mine, "chat", "m-1", {}, now=t0)
    old = take_next("A", now=t0)
    later = t0 + ttl + SECOND
    new = acquire(mine, "B", now=later)
    ingest(other, "chat", "o-1", {}, now=later)

    finished, following = finish_and_take(
        Held(mine, "A", old.generation, [e.pk for e in old.events]), [Say(mine.pk, "x")], now=later
    )
    assert finished is False
    assert not OutboxMessage.objects.exists()
    lease = Lease.objects.get(inbox=mine)
    assert (lease.holder, lease.generation) == ("B", new)
    assert Event.objects.get(source_id="m-1").status == "running"
    # A claim the refused finish's transaction took stands (it committed); none is also fine,
    # and the caller then takes with take_next.
    following = following or take_next("A", now=later)
    assert following.inbox == other


def test_a_chaining_worker_runs_each_inbox_once_and_ends_holding_nothing(make_inbox):
    inboxes = [make_inbox() for _ in range(3)]
    for n, inbox in enumerate(inboxes):
        ingest(inbox, "chat", f"m-{n}", {})
    ran = []
    worker = Worker("W", agent=lambda run: ran.append(run.inbox.slug))
    worker.may_chain = lambda: True
    results = []
    while (result := worker.step()) is not None:
        results.append(result)
    assert sorted(ran) == sorted(inbox.slug for inbox in inboxes)
    assert [result.events for result in results] == [1, 1, 1]
    assert set(Event.objects.values_list("status", flat=True)) == {"done"}
    assert not worker.carrying()
    assert not Lease.objects.filter(until__isnull=False).exists()
