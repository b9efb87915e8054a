"""Retries with backoff, the lease's work flag, and the lease verbs workers use.

retry_delay is "equal jitter": half the step fixed, half random, the step doubling per
attempt up to a cap. Tests that need an exact instant pin the jitter to its top or bottom.
Every test passes `now` and checks the rows, not only what a call returned.
"""

from datetime import timedelta

import pytest

from alwayson.runtime.api import acquire, claim_batch, finish, ingest
from inbox import rules
from inbox.models import Event, Lease
from inbox.services import (
    Failed,
    Held,
    acquire_next,
    mark_dead,
    release,
    renew,
    requeue,
    retry_delay,
)

SECOND = timedelta(seconds=1)


class PinnedJitter:
    """Stands in for rules._jitter: always the top (or bottom) of the random half."""

    def __init__(self, top=True):
        self.top = top

    def uniform(self, a, b):
        return b if self.top else a


@pytest.fixture
def retry_settings(settings):
    settings.ALWAYSON_RETRY_BASE = 10
    settings.ALWAYSON_RETRY_CAP = 3600
    settings.ALWAYSON_MAX_ATTEMPTS = 3
    return settings


@pytest.fixture
def top_jitter(monkeypatch, retry_settings):
    monkeypatch.setattr(rules, "_jitter", PinnedJitter(top=True))


def lease(inbox):
    return Lease.objects.get(inbox=inbox)


def event(source_id, inbox=None):
    events = Event.objects.filter(source_id=source_id)
    return (events.filter(inbox=inbox) if inbox is not None else events).get()


def states(inbox):
    return list(
        Event.objects.filter(inbox=inbox)
        .order_by("id")
        .values_list("source_id", "status", "attempts")
    )


def fail_once(inbox, holder, now, error="tool timed out"):
    """Acquire, claim and finish with an error at `now`: the claimed ids."""
    gen = acquire(inbox, holder, now=now)
    ids = [e.pk for e in claim_batch(inbox, holder, gen, now=now)]
    assert finish(Held(inbox, holder, gen, ids), outcome=Failed(error), now=now) is True
    return gen, ids


# --- retry_delay -----------------------------------------------------------------------------


def test_retry_delay_doubles_per_attempt(monkeypatch, retry_settings):
    monkeypatch.setattr(rules, "_jitter", PinnedJitter(top=True))
    tops = [retry_delay(n).total_seconds() for n in range(1, 6)]
    monkeypatch.setattr(rules, "_jitter", PinnedJitter(top=False))
    bottoms = [retry_delay(n).total_seconds() for n in range(1, 6)]

    assert tops == [10, 20, 40, 80, 160]
    assert bottoms == [5, 10, 20, 40, 80]
    # Attempt 0 (never claimed) waits like the first attempt.
    assert retry_delay(0).total_seconds() == 5


def test_retry_delay_is_capped(monkeypatch, retry_settings):
    retry_settings.ALWAYSON_RETRY_CAP = 60
    monkeypatch.setattr(rules, "_jitter", PinnedJitter(top=True))

    assert [retry_delay(n).total_seconds() for n in (3, 4, 5, 12)] == [40, 60, 60, 60]
    # A huge attempt count neither overflows nor escapes the cap.
    assert retry_delay(10_000).total_seconds() == 60


def test_retry_delay_jitter_stays_within_half_step_and_step(retry_settings):
    retry_settings.ALWAYSON_RETRY_CAP = 100
    for attempts, step in [(1, 10), (2, 20), (3, 40), (4, 80), (5, 100), (9, 100)]:
        delays = [retry_delay(attempts).total_seconds() for _ in range(200)]
        assert all(step / 2 <= d <= step for d in delays), (attempts, min(delays), max(delays))
        # Jittered: retries of events that failed together spread out.
        assert len(set(delays)) > 1


# --- finish with an error: the backoff -------------------------------------------------------


@pytest.mark.django_db
def test_finish_with_error_sets_available_at_to_now_plus_backoff(inbox, t0, top_jitter):
    ingest(inbox, "chat", "m1", {}, now=t0)
    failed_at = t0 + 3 * SECOND
    gen = acquire(inbox, "A", now=t0)
    ids = [e.pk for e in claim_batch(inbox, "A", gen, now=t0)]

    assert (
        finish(Held(inbox, "A", gen, ids), outcome=Failed("tool timed out"), now=failed_at) is True
    )

    row = event("m1")
    assert (row.status, row.attempts, row.error) == ("pending", 1, "tool timed out")
    assert row.available_at == failed_at + 10 * SECOND
    assert row.updated == failed_at
    assert lease(inbox).work_at == failed_at + 10 * SECOND


@pytest.mark.django_db
def test_finish_with_error_backoff_is_jittered_within_the_step(inbox, t0, retry_settings):
    ingest(inbox, "chat", "m1", {}, now=t0)
    fail_once(inbox, "A", t0)

    row = event("m1")
    assert t0 + 5 * SECOND <= row.available_at <= t0 + 10 * SECOND
    assert lease(inbox).work_at == row.available_at


@pytest.mark.django_db
def test_failed_event_is_not_claimable_before_its_backoff(inbox, t0, top_jitter):
    ingest(inbox, "chat", "m1", {}, now=t0)
    gen, _ = fail_once(inbox, "A", t0)  # available again at t0 + 10s

    assert claim_batch(inbox, "A", gen, now=t0 + 9 * SECOND) == []
    assert states(inbox) == [("m1", "pending", 1)]

    batch = claim_batch(inbox, "A", gen, now=t0 + 10 * SECOND)
    assert [e.source_id for e in batch] == ["m1"]
    assert states(inbox) == [("m1", "running", 2)]


@pytest.mark.django_db
def test_second_failure_waits_twice_as_long(inbox, t0, top_jitter):
    ingest(inbox, "chat", "m1", {}, now=t0)
    gen, ids = fail_once(inbox, "A", t0)
    retry_at = t0 + 10 * SECOND
    assert [e.pk for e in claim_batch(inbox, "A", gen, now=retry_at)] == ids

    assert finish(Held(inbox, "A", gen, ids), outcome=Failed("again"), now=retry_at) is True

    row = event("m1")
    assert (row.status, row.attempts, row.error) == ("pending", 2, "again")
    assert row.available_at == retry_at + 20 * SECOND


@pytest.mark.django_db
def test_worker_does_not_take_an_inbox_whose_only_work_is_backing_off(inbox, t0, top_jitter):
    ingest(inbox, "chat", "m1", {}, now=t0)
    gen, _ = fail_once(inbox, "A", t0)
    assert release(inbox, "A", gen) is True

    assert acquire_next("B", now=t0 + 9 * SECOND) is None
    assert (lease(inbox).holder, lease(inbox).generation) == ("A", gen)

    assert acquire_next("B", now=t0 + 10 * SECOND) == (inbox.pk, gen + 1)


# --- retries and healthy events of the same inbox --------------------------------------------


@pytest.mark.django_db
def test_retry_waiting_for_its_backoff_does_not_block_healthy_events(inbox, t0, top_jitter):
    """The article's oldest-first limitation, gone: healthy events run meanwhile."""
    ingest(inbox, "chat", "flaky", {}, now=t0)
    gen, _ = fail_once(inbox, "A", t0)  # flaky is back at t0 + 10s
    ingest(inbox, "chat", "healthy-1", {}, now=t0 + 1 * SECOND)
    ingest(inbox, "chat", "healthy-2", {}, now=t0 + 2 * SECOND)

    batch = claim_batch(inbox, "A", gen, now=t0 + 3 * SECOND)
    assert [e.source_id for e in batch] == ["healthy-1", "healthy-2"]
    assert finish(Held(inbox, "A", gen, [e.pk for e in batch]), now=t0 + 4 * SECOND) is True

    assert states(inbox) == [
        ("flaky", "pending", 1),
        ("healthy-1", "done", 1),
        ("healthy-2", "done", 1),
    ]
    assert lease(inbox).work_at == t0 + 10 * SECOND  # only the retry is left, not yet due


@pytest.mark.django_db
def test_due_retry_is_claimed_alone_and_the_healthy_events_next(inbox, t0, top_jitter):
    ingest(inbox, "chat", "flaky", {}, now=t0)
    gen, _ = fail_once(inbox, "A", t0)
    ingest(inbox, "chat", "healthy", {}, now=t0 + 1 * SECOND)

    due = t0 + 10 * SECOND
    alone = claim_batch(inbox, "A", gen, now=due)
    assert [e.source_id for e in alone] == ["flaky"]
    assert states(inbox) == [("flaky", "running", 2), ("healthy", "pending", 0)]
    assert finish(Held(inbox, "A", gen, [e.pk for e in alone]), now=due) is True

    rest = claim_batch(inbox, "A", gen, now=due)
    assert [e.source_id for e in rest] == ["healthy"]
    assert finish(Held(inbox, "A", gen, [e.pk for e in rest]), now=due) is True
    assert states(inbox) == [("flaky", "done", 2), ("healthy", "done", 1)]
    assert lease(inbox).work_at is None


@pytest.mark.django_db
def test_orphaned_running_row_backs_off_from_its_claim_time(
    inbox, t0, ttl, retry_settings, top_jitter
):
    # A base longer than the TTL, so the backoff is still running at the takeover.
    base = retry_settings.ALWAYSON_RETRY_BASE = 1000
    ingest(inbox, "chat", "m1", {}, now=t0)
    claimed_at = t0 + 5 * SECOND
    gen_a = acquire(inbox, "A", now=claimed_at)
    claim_batch(inbox, "A", gen_a, now=claimed_at)  # A dies mid-run

    takeover = claimed_at + ttl + SECOND
    gen_b = acquire(inbox, "B", now=takeover)
    assert claim_batch(inbox, "B", gen_b, now=takeover) == []

    row = event("m1")
    assert (row.status, row.attempts, row.claim_gen) == ("pending", 1, gen_a)
    assert row.error == f"worker lost its lease during the run (generation {gen_a})"
    # Counted from A's claim, not from B's takeover.
    assert row.available_at == claimed_at + base * SECOND
    assert row.updated == takeover
    assert lease(inbox).work_at == claimed_at + base * SECOND

    due = claimed_at + base * SECOND
    gen_b2 = acquire(inbox, "B", now=due)
    assert [e.source_id for e in claim_batch(inbox, "B", gen_b2, now=due)] == ["m1"]
    assert states(inbox) == [("m1", "running", 2)]


@pytest.mark.django_db
def test_event_failing_its_last_attempt_is_parked_dead_at_the_next_claim(inbox, t0, top_jitter):
    ingest(inbox, "chat", "m1", {}, now=t0)
    now = t0
    for attempt in range(1, 4):
        gen = acquire(inbox, "A", now=now)
        batch = claim_batch(inbox, "A", gen, now=now)
        assert [(e.source_id, e.attempts) for e in batch] == [("m1", attempt)]
        assert finish(
            Held(inbox, "A", gen, [e.pk for e in batch]), outcome=Failed(f"fail {attempt}"), now=now
        )
        now = event("m1").available_at

    assert claim_batch(inbox, "A", acquire(inbox, "A", now=now), now=now) == []

    row = event("m1")
    assert (row.status, row.attempts) == ("dead", 3)
    assert row.error == "too many attempts (3); last error: fail 3"
    assert lease(inbox).work_at is None


# --- Lease.work_at ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_new_inbox_has_no_work(inbox):
    assert lease(inbox).work_at is None


@pytest.mark.django_db
def test_ingest_sets_work_at_to_the_earliest_arrival(inbox, t0):
    ingest(inbox, "chat", "later", {}, now=t0 + 5 * SECOND)
    assert lease(inbox).work_at == t0 + 5 * SECOND

    ingest(inbox, "chat", "earlier", {}, now=t0)
    assert lease(inbox).work_at == t0

    ingest(inbox, "chat", "latest", {}, now=t0 + 9 * SECOND)
    assert lease(inbox).work_at == t0  # earlier work wins

    assert ingest(inbox, "chat", "earlier", {}, now=t0 - 60 * SECOND) is False
    assert lease(inbox).work_at == t0  # a duplicate delivery is no new work


@pytest.mark.django_db
def test_finish_clears_work_at_when_nothing_is_pending(inbox, t0):
    ingest(inbox, "chat", "m1", {}, now=t0)
    gen = acquire(inbox, "A", now=t0)
    ids = [e.pk for e in claim_batch(inbox, "A", gen, now=t0)]
    assert finish(Held(inbox, "A", gen, ids), now=t0 + SECOND) is True

    assert lease(inbox).work_at is None


@pytest.mark.django_db
def test_finish_recounts_work_at_from_events_that_arrived_during_the_run(inbox, t0):
    ingest(inbox, "chat", "m1", {}, now=t0)
    gen = acquire(inbox, "A", now=t0)
    ids = [e.pk for e in claim_batch(inbox, "A", gen, now=t0)]
    ingest(inbox, "chat", "m2", {}, now=t0 + 2 * SECOND)  # arrives mid-run
    assert finish(Held(inbox, "A", gen, ids), now=t0 + 3 * SECOND) is True

    assert lease(inbox).work_at == t0 + 2 * SECOND


@pytest.mark.django_db
def test_claim_with_nothing_due_recounts_work_at(inbox, t0, top_jitter):
    ingest(inbox, "chat", "m1", {}, now=t0)
    gen, _ = fail_once(inbox, "A", t0)
    # A stale flag (as a crash can leave it) is corrected by the next empty claim.
    Lease.objects.filter(inbox=inbox).update(work_at=t0)

    assert claim_batch(inbox, "A", gen, now=t0 + SECOND) == []
    assert lease(inbox).work_at == t0 + 10 * SECOND


@pytest.mark.django_db
def test_claim_keeps_work_at_so_a_crashed_run_is_found_again(inbox, t0, ttl):
    ingest(inbox, "chat", "m1", {}, now=t0)
    inbox_id, gen = acquire_next("A", now=t0)
    assert inbox_id == inbox.pk
    assert len(claim_batch(inbox, "A", gen, now=t0)) == 1  # then A crashes
    assert lease(inbox).work_at == t0

    assert acquire_next("B", now=t0 + ttl) is None  # A's lease still holds
    taken = acquire_next("B", now=t0 + ttl + SECOND)
    assert taken == (inbox.pk, gen + 1)
    batch = claim_batch(inbox, "B", gen + 1, now=t0 + ttl + SECOND)
    assert [(e.source_id, e.attempts, e.claim_gen) for e in batch] == [("m1", 2, gen + 1)]


# --- acquire_next ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_acquire_next_skips_held_not_due_and_empty_inboxes(make_inbox, t0, ttl):
    held, not_due = make_inbox("held"), make_inbox("not-due")
    make_inbox("empty")
    expired, free = make_inbox("expired"), make_inbox("free")
    now = t0 + 10 * SECOND
    ingest(held, "chat", "h", {}, now=t0 - 60 * SECOND)  # the oldest work of all
    acquire(held, "X", now=t0)
    ingest(not_due, "chat", "n", {}, now=now + SECOND)
    ingest(expired, "chat", "e", {}, now=t0 - 30 * SECOND)
    acquire(expired, "Y", now=t0 - ttl - 5 * SECOND)
    ingest(free, "chat", "f", {}, now=t0 - 10 * SECOND)

    first = acquire_next("W", now=now)
    second = acquire_next("W", now=now)
    third = acquire_next("W", now=now)

    # Soonest work first; each takeover starts a new generation.
    assert first == (expired.pk, 2)
    assert second == (free.pk, 1)
    assert third is None
    rows = {
        lease.inbox.slug: (lease.holder, lease.generation, lease.until)
        for lease in Lease.objects.select_related("inbox")
    }
    assert rows == {
        "held": ("X", 1, t0 + ttl),
        "not-due": ("", 0, None),
        "empty": ("", 0, None),
        "expired": ("W", 2, now + ttl),
        "free": ("W", 1, now + ttl),
    }


@pytest.mark.django_db
def test_acquire_next_takes_an_inbox_once_its_work_is_due(inbox, t0, ttl):
    ingest(inbox, "chat", "m1", {}, now=t0 + 60 * SECOND)

    assert acquire_next("W", now=t0 + 59 * SECOND) is None
    assert acquire_next("W", now=t0 + 60 * SECOND) == (inbox.pk, 1)
    assert (lease(inbox).holder, lease(inbox).until) == ("W", t0 + 60 * SECOND + ttl)


@pytest.mark.django_db
def test_acquire_next_takes_a_released_lease_with_a_new_generation(inbox, t0, ttl):
    ingest(inbox, "chat", "m1", {}, now=t0)
    gen = acquire(inbox, "A", now=t0)
    assert release(inbox, "A", gen) is True

    assert acquire_next("A", now=t0 + SECOND) == (inbox.pk, gen + 1)


# --- renew and release: compare-and-set on (holder, generation) ------------------------------


@pytest.mark.django_db
def test_renew_extends_the_holders_lease(inbox, t0, ttl):
    gen = acquire(inbox, "A", now=t0)

    assert renew(inbox, "A", gen, now=t0 + 60 * SECOND) is True
    held = lease(inbox)
    assert (held.holder, held.generation, held.until) == ("A", gen, t0 + 60 * SECOND + ttl)


@pytest.mark.django_db
def test_renew_of_a_lapsed_lease_fails_even_for_its_holder(inbox, t0, ttl):
    gen = acquire(inbox, "A", now=t0)

    assert renew(inbox, "A", gen, now=t0 + ttl + SECOND) is False
    assert lease(inbox).until == t0 + ttl


@pytest.mark.django_db
def test_stale_worker_cannot_renew_or_release_after_a_takeover(inbox, t0, ttl):
    gen_a = acquire(inbox, "A", now=t0)
    later = t0 + ttl + SECOND
    gen_b = acquire(inbox, "B", now=later)
    taken = ("B", gen_b, later + ttl)

    assert renew(inbox, "A", gen_a, now=later) is False
    assert release(inbox, "A", gen_a) is False
    held = lease(inbox)
    assert (held.holder, held.generation, held.until) == taken


@pytest.mark.django_db
def test_same_holder_with_an_old_generation_cannot_renew_or_release(inbox, t0, ttl):
    gen_1 = acquire(inbox, "A", now=t0)
    later = t0 + ttl + SECOND
    gen_2 = acquire(inbox, "A", now=later)  # A's own lapse: a new generation

    assert renew(inbox, "A", gen_1, now=later) is False
    assert release(inbox, "A", gen_1) is False
    held = lease(inbox)
    assert (held.holder, held.generation, held.until) == ("A", gen_2, later + ttl)


@pytest.mark.django_db
def test_release_frees_the_lease_once_and_keeps_the_generation(inbox, t0, ttl):
    gen_a = acquire(inbox, "A", now=t0)
    assert release(inbox, "A", gen_a) is True
    assert (lease(inbox).holder, lease(inbox).generation, lease(inbox).until) == ("A", gen_a, None)

    gen_b = acquire(inbox, "B", now=t0 + SECOND)
    assert gen_b == gen_a + 1
    # A releasing twice must not free B's lease.
    assert release(inbox, "A", gen_a) is False
    assert renew(inbox, "A", gen_a, now=t0 + SECOND) is False
    held = lease(inbox)
    assert (held.holder, held.generation, held.until) == ("B", gen_b, t0 + SECOND + ttl)

    assert release(inbox, "B", gen_b) is True
    assert release(inbox, "B", gen_b) is False
    assert renew(inbox, "B", gen_b, now=t0 + 2 * SECOND) is False  # released: nothing to renew
    assert lease(inbox).until is None


# --- requeue and mark_dead -------------------------------------------------------------------


@pytest.mark.django_db
def test_requeue_puts_dead_events_back_with_attempts_reset(make_inbox, t0, ttl, retry_settings):
    a, b = make_inbox("a"), make_inbox("b")
    ingest(a, "chat", "poison", {}, now=t0)
    ingest(b, "chat", "parked", {}, now=t0)
    ingest(b, "chat", "healthy", {}, now=t0)
    now = t0
    for n in range(4):  # three claims that crash, then the fourth parks it as dead
        gen = acquire(a, f"W{n}", now=now)
        claim_batch(a, f"W{n}", gen, now=now)
        now += ttl + 60 * SECOND
    parked = event("parked")
    assert mark_dead([parked.pk], "operator: bad payload", now=now) == [parked.pk]
    poison = event("poison")
    assert (poison.status, poison.attempts) == ("dead", 3)
    requeued_at = now + SECOND

    requeued = requeue([poison.pk, parked.pk, event("healthy").pk], now=requeued_at)

    assert requeued == [poison.pk, parked.pk]
    rows = Event.objects.order_by("id").values_list(
        "source_id", "status", "attempts", "claim_gen", "error", "available_at"
    )
    assert list(rows) == [
        ("poison", "pending", 0, None, "", requeued_at),
        ("parked", "pending", 0, None, "", requeued_at),
        ("healthy", "pending", 0, None, "", t0),  # not dead: untouched
    ]
    assert lease(a).work_at == requeued_at
    assert lease(b).work_at == t0  # earlier work wins


@pytest.mark.django_db
def test_requeue_of_events_that_are_not_dead_changes_nothing(inbox, t0):
    ingest(inbox, "chat", "m1", {}, now=t0)
    before = list(Event.objects.values())

    assert requeue([event("m1").pk, 999_999], now=t0 + SECOND) == []
    assert list(Event.objects.values()) == before


@pytest.mark.django_db
def test_mark_dead_parks_pending_events_and_recounts_work(inbox, t0):
    ingest(inbox, "chat", "running", {}, now=t0)
    gen = acquire(inbox, "A", now=t0)
    claim_batch(inbox, "A", gen, now=t0)
    ingest(inbox, "chat", "bad", {}, now=t0 + SECOND)
    ingest(inbox, "chat", "good", {}, now=t0 + 2 * SECOND)

    parked = mark_dead(
        [event("bad").pk, event("running").pk], "operator: bad payload", now=t0 + 3 * SECOND
    )

    assert parked == [event("bad").pk]
    rows = Event.objects.order_by("id").values_list("source_id", "status", "error", "updated")
    assert list(rows) == [
        ("running", "running", "", t0),  # a running row is its worker's, not the operator's
        ("bad", "dead", "operator: bad payload", t0 + 3 * SECOND),
        ("good", "pending", "", t0 + 2 * SECOND),
    ]
    assert lease(inbox).work_at == t0 + 2 * SECOND

    good = event("good").pk
    assert mark_dead([good], "operator: spam", now=t0 + 4 * SECOND) == [good]
    assert lease(inbox).work_at is None


@pytest.mark.django_db
def test_mark_dead_requires_a_reason(inbox, t0):
    ingest(inbox, "chat", "m1", {}, now=t0)

    with pytest.raises(ValueError, match="reason"):
        mark_dead([event("m1").pk], "  ", now=t0)
    assert event("m1").status == "pending"
