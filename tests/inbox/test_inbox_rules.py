"""The inbox's serial rules: dedupe, the lease and its generations, claims, finish, poison events.

Every test passes `now` and checks the rows in the database, not only what a call returned.
"""

from datetime import timedelta

import pytest
from django.db import connection

from alwayson.runtime.api import Say, acquire, claim_batch, finish, ingest
from inbox.models import Event, Lease
from inbox.services import Failed, Held
from outbox.models import OutboxMessage

SECOND = timedelta(seconds=1)


def event(source_id, inbox=None):
    events = Event.objects.filter(source_id=source_id)
    return (events.filter(inbox=inbox) if inbox is not None else events).get()


def row(source_id):
    """The columns a run's bookkeeping changes, for before/after comparisons."""
    return Event.objects.filter(source_id=source_id).values(
        "status", "attempts", "claim_gen", "error", "updated"
    )[0]


def lease(inbox):
    return Lease.objects.get(inbox=inbox)


# --- dedupe ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_duplicate_delivery_is_stored_once(inbox, t0):
    assert ingest(inbox, "github", "delivery-7f3a", {"pr": 12}, now=t0) is True
    assert ingest(inbox, "github", "delivery-7f3a", {"pr": 99}, now=t0 + SECOND) is False

    stored = Event.objects.get(inbox=inbox)
    assert (stored.source, stored.source_id) == ("github", "delivery-7f3a")
    assert stored.payload == {"pr": 12}  # the first delivery's payload stays
    assert stored.created == t0
    assert stored.status == "pending"


@pytest.mark.django_db
def test_same_key_in_two_inboxes_is_two_events(make_inbox, t0):
    a, b = make_inbox(), make_inbox()
    assert ingest(a, "github", "delivery-7f3a", {"pr": 1}, now=t0) is True
    assert ingest(b, "github", "delivery-7f3a", {"pr": 2}, now=t0) is True

    assert Event.objects.count() == 2
    assert event("delivery-7f3a", a).payload == {"pr": 1}
    assert event("delivery-7f3a", b).payload == {"pr": 2}


@pytest.mark.django_db
def test_event_without_payload_is_stored_with_an_empty_object(inbox, t0):
    assert ingest(inbox, "chat", "ping", now=t0) is True
    assert Event.objects.get(inbox=inbox, source_id="ping").payload == {}


# --- the lease -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_first_acquire_starts_generation_one(inbox, t0, ttl):
    assert acquire(inbox, "A", now=t0) == 1

    held = lease(inbox)
    assert (held.holder, held.generation, held.until) == ("A", 1, t0 + ttl)


@pytest.mark.django_db
def test_renewal_by_the_holder_keeps_the_generation_and_extends_until(inbox, t0, ttl):
    acquire(inbox, "A", now=t0)
    assert acquire(inbox, "A", now=t0 + 60 * SECOND) == 1

    held = lease(inbox)
    assert (held.holder, held.generation, held.until) == ("A", 1, t0 + 60 * SECOND + ttl)


@pytest.mark.django_db
def test_other_holder_is_refused_while_the_lease_is_held(inbox, t0, ttl):
    acquire(inbox, "A", now=t0)
    assert acquire(inbox, "B", now=t0) is None
    assert acquire(inbox, "B", now=t0 + ttl) is None  # `until` itself is still held

    held = lease(inbox)
    assert (held.holder, held.generation, held.until) == ("A", 1, t0 + ttl)


@pytest.mark.django_db
def test_takeover_after_expiry_bumps_the_generation(inbox, t0, ttl):
    acquire(inbox, "A", now=t0)
    later = t0 + ttl + SECOND
    assert acquire(inbox, "B", now=later) == 2

    held = lease(inbox)
    assert (held.holder, held.generation, held.until) == ("B", 2, later + ttl)


@pytest.mark.django_db
def test_same_holder_after_its_own_lapse_gets_a_new_generation(inbox, t0, ttl):
    acquire(inbox, "A", now=t0)
    later = t0 + ttl + SECOND
    assert acquire(inbox, "A", now=later) == 2

    held = lease(inbox)
    assert (held.holder, held.generation, held.until) == ("A", 2, later + ttl)


# --- finish: the fence -----------------------------------------------------------------------


@pytest.mark.django_db
def test_late_finish_is_refused(inbox, t0, ttl):
    """The article's scenario 4: A stalls, B takes over and finishes, A wakes up as gen 3."""
    ingest(inbox, "chat", "msg-3", {"text": "send the report"}, now=t0)
    gen_a = acquire(inbox, "A", now=t0)
    batch_a = claim_batch(inbox, "A", gen_a, now=t0)  # A stalls here

    t2 = t0 + ttl + SECOND
    gen_b = acquire(inbox, "B", now=t2)
    batch_b = claim_batch(inbox, "B", gen_b, now=t2)
    assert [e.source_id for e in batch_b] == ["msg-3"]
    assert finish(Held(inbox, "B", gen_b, [e.pk for e in batch_b]), [Say(inbox.pk, "sent")], now=t2)
    after_b = row("msg-3")

    t3 = t2 + ttl + SECOND
    assert acquire(inbox, "A", now=t3) == 3
    late = finish(Held(inbox, "A", gen_a, [e.pk for e in batch_a]), [Say(inbox.pk, "sent")], now=t3)

    assert late is False
    assert row("msg-3") == after_b
    assert (after_b["status"], after_b["attempts"], after_b["claim_gen"]) == ("done", 2, gen_b)
    assert list(OutboxMessage.objects.values_list("body", "created")) == [("sent", t2)]


@pytest.mark.django_db
def test_finish_after_the_lease_lapsed_is_refused(inbox, t0, ttl):
    ingest(inbox, "chat", "m1", {}, now=t0)
    gen = acquire(inbox, "A", now=t0)
    ids = [e.pk for e in claim_batch(inbox, "A", gen, now=t0)]
    claimed = row("m1")

    lapsed = t0 + ttl + SECOND
    assert finish(Held(inbox, "A", gen, ids), [Say(inbox.pk, "x")], now=lapsed) is False
    # Taking the lease again starts a new generation: the old claim still can't finish,
    # although nobody else touched its event.
    assert acquire(inbox, "A", now=lapsed) == gen + 1
    assert finish(Held(inbox, "A", gen, ids), [Say(inbox.pk, "x")], now=lapsed) is False

    assert row("m1") == claimed
    assert (claimed["status"], claimed["claim_gen"]) == ("running", gen)
    assert not OutboxMessage.objects.exists()


@pytest.mark.django_db
def test_second_finish_of_the_same_claim_is_refused(inbox, t0):
    ingest(inbox, "chat", "m1", {}, now=t0)
    gen = acquire(inbox, "A", now=t0)
    ids = [e.pk for e in claim_batch(inbox, "A", gen, now=t0)]
    assert finish(Held(inbox, "A", gen, ids), [Say(inbox.pk, "reply")], now=t0) is True
    first = row("m1")

    assert finish(Held(inbox, "A", gen, ids), [Say(inbox.pk, "reply")], now=t0 + SECOND) is False

    assert row("m1") == first
    assert first["status"] == "done"
    assert list(OutboxMessage.objects.values_list("body", flat=True)) == ["reply"]


# --- claim_batch ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_claim_takes_all_pending_events_oldest_first(make_inbox, t0):
    inbox, other = make_inbox(), make_inbox()
    for source_id in ("c", "a", "b"):
        ingest(inbox, "chat", source_id, {}, now=t0)
    ingest(other, "chat", "elsewhere", {}, now=t0)
    gen = acquire(inbox, "A", now=t0)

    batch = claim_batch(inbox, "A", gen, now=t0 + SECOND)

    assert [e.source_id for e in batch] == ["c", "a", "b"]
    claimed = Event.objects.filter(inbox=inbox).order_by("id")
    assert list(claimed.values_list("source_id", "status", "attempts", "claim_gen")) == [
        ("c", "running", 1, gen),
        ("a", "running", 1, gen),
        ("b", "running", 1, gen),
    ]
    assert {e.updated for e in claimed} == {t0 + SECOND}
    untouched = event("elsewhere")
    assert (untouched.status, untouched.attempts, untouched.claim_gen) == ("pending", 0, None)


@pytest.mark.django_db
def test_stale_running_rows_go_back_to_pending_on_a_newer_generations_claim(inbox, t0, ttl):
    ingest(inbox, "chat", "first", {}, now=t0)
    ingest(inbox, "chat", "second", {}, now=t0)
    gen_a = acquire(inbox, "A", now=t0)
    claim_batch(inbox, "A", gen_a, now=t0)  # A crashes without finishing

    later = t0 + ttl + SECOND
    gen_b = acquire(inbox, "B", now=later)
    batch = claim_batch(inbox, "B", gen_b, now=later)

    # Both of A's rows were released; the oldest is retried alone, the other waits pending.
    assert [e.source_id for e in batch] == ["first"]
    assert list(Event.objects.values_list("source_id", "status", "attempts", "claim_gen")) == [
        ("first", "running", 2, gen_b),
        ("second", "pending", 1, gen_a),
    ]
    assert event("second").updated == later


@pytest.mark.django_db
def test_poison_event_is_dead_after_three_claims_and_the_healthy_one_finishes(inbox, t0, ttl):
    """The article's scenario 5: every worker that claims the poison event crashes."""
    ingest(inbox, "chat", "poison", {"text": "x"}, now=t0)
    ingest(inbox, "chat", "healthy", {"text": "ok"}, now=t0)
    now = t0
    claims = []
    for n in range(5):
        worker = f"W{n}"
        gen = acquire(inbox, worker, now=now)
        batch = claim_batch(inbox, worker, gen, now=now)
        claims.append([e.source_id for e in batch])
        if "poison" not in claims[-1]:
            assert finish(Held(inbox, worker, gen, [e.pk for e in batch]), now=now)  # else: crash
        now += ttl + SECOND

    assert claims == [["poison", "healthy"], ["poison"], ["poison"], ["healthy"], []]
    poison, healthy = event("poison"), event("healthy")
    assert (poison.status, poison.attempts) == ("dead", 3)
    assert "too many attempts" in poison.error
    assert (healthy.status, healthy.attempts, healthy.error) == ("done", 2, "")


# --- finish: outcomes ----------------------------------------------------------------------


@pytest.mark.django_db
def test_finish_with_error_returns_events_to_pending_and_drops_the_effects(inbox, t0):
    ingest(inbox, "chat", "m1", {}, now=t0)
    ingest(inbox, "chat", "m2", {}, now=t0)
    gen = acquire(inbox, "A", now=t0)
    ids = [e.pk for e in claim_batch(inbox, "A", gen, now=t0)]

    done = finish(
        Held(inbox, "A", gen, ids),
        [Say(inbox.pk, "reply")],
        outcome=Failed("tool timed out"),
        now=t0,
    )

    assert done is True
    assert list(Event.objects.values_list("source_id", "status", "attempts", "error")) == [
        ("m1", "pending", 1, "tool timed out"),
        ("m2", "pending", 1, "tool timed out"),
    ]
    assert not OutboxMessage.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_finish_runs_each_effect_with_now_inside_its_transaction(inbox, t0):
    ingest(inbox, "chat", "m1", {}, now=t0)
    gen = acquire(inbox, "A", now=t0)
    ids = [e.pk for e in claim_batch(inbox, "A", gen, now=t0)]
    seen = []

    def observe(now):
        # The finish's own update is visible: same transaction, not yet committed.
        seen.append((now, connection.in_atomic_block, event("m1").status))

    finished_at = t0 + 5 * SECOND
    effects = [Say(inbox.pk, "one"), observe, Say(inbox.pk, "two")]
    assert finish(Held(inbox, "A", gen, ids), effects, now=finished_at) is True

    assert seen == [(finished_at, True, "done")]
    assert list(OutboxMessage.objects.values_list("body", "created")) == [
        ("one", finished_at),
        ("two", finished_at),
    ]
    assert event("m1").status == "done"


@pytest.mark.django_db
def test_effect_that_raises_commits_nothing_of_the_finish(inbox, t0):
    ingest(inbox, "chat", "m1", {}, now=t0)
    gen = acquire(inbox, "A", now=t0)
    ids = [e.pk for e in claim_batch(inbox, "A", gen, now=t0)]
    claimed = row("m1")

    def broken(now):
        raise RuntimeError("effect failed")

    with pytest.raises(RuntimeError, match="effect failed"):
        finish(Held(inbox, "A", gen, ids), [Say(inbox.pk, "before"), broken], now=t0 + SECOND)

    assert row("m1") == claimed
    assert claimed["status"] == "running"
    assert not OutboxMessage.objects.exists()
