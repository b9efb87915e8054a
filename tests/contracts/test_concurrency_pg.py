"""The rules under real concurrency: PostgreSQL, one connection per worker thread.

Each worker is a thread; Django gives every thread its own connection, so the workers are
separate PostgreSQL sessions racing on the same rows. A barrier releases them together. To
make a race certain rather than likely, some tests hold one worker's transaction open (a
send callback or an `event_stored` receiver that waits) or hold the lease row from the test's
own connection, and release it only once `pg_blocking_pids` shows the others queued behind it.

Every wait is bounded: threads are joined with a timeout, each worker session has a
lock_timeout and a statement_timeout, and every Event.wait has a timeout, so a regression
fails the test instead of hanging the suite. Time is always passed as `now=`.
"""

import threading
import time
from collections import Counter
from contextlib import contextmanager, suppress
from datetime import timedelta
from functools import partial

import pytest
from django.conf import settings
from django.db import connection, transaction

from alwayson.runtime.api import (
    Say,
    acquire,
    add_timer,
    answer_approval,
    claim_batch,
    dispatch,
    dispatch_inbox,
    finish,
    ingest,
    request_approval,
    run_scheduler,
)
from approvals.models import Approval
from approvals.services import answer_at_once
from inbox.clock import occurrence_label
from inbox.exceptions import InboxBusy
from inbox.models import Event, Inbox, Lease
from inbox.services import Held, acquire_next, release
from inbox.signals import event_stored
from outbox.models import OutboxMessage
from tests.support import postgres
from timers.models import Timer

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

TIMEOUT = 20  # seconds: the longest any thread, barrier or wait in this file may take
ROUNDS = 20
SECOND = timedelta(seconds=1)

# What the running test started, so teardown can release and join it before the database
# is flushed, even when an assertion failed half-way through a race.
_started = {"groups": [], "holds": []}


@pytest.fixture(autouse=True)
def _settle_threads():
    _started["groups"].clear()
    _started["holds"].clear()
    yield
    for hold in _started["holds"]:
        hold.release.set()
    for group in _started["groups"]:
        group.settle()


# --- harness ---------------------------------------------------------------------------------


def _prepare_session():
    """Bound every lock wait of this thread's session; return its backend pid."""
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '10s'")
        cursor.execute("SET statement_timeout = '15s'")
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


class Together:
    """Run callables in threads, one database connection each, released by one barrier.

    `start()` returns once every thread has passed the barrier (the caller takes part in
    it), so `pids` is complete and the callables are running; `join()` returns their results
    in order, or raises the first exception one of them raised.
    """

    def __init__(self, *fns):
        self.fns = fns
        self.results = [None] * len(fns)
        self.errors = [None] * len(fns)
        self.pids = [None] * len(fns)
        self.barrier = threading.Barrier(len(fns) + 1, timeout=TIMEOUT)
        self.threads = []
        _started["groups"].append(self)

    def _run(self, index):
        try:
            self.pids[index] = _prepare_session()
            self.barrier.wait()
            self.results[index] = self.fns[index]()
        except BaseException as exc:  # reported by join()
            self.errors[index] = exc
            self.barrier.abort()
        finally:
            connection.close()

    def start(self):
        self.threads = [
            threading.Thread(target=self._run, args=(i,), name=f"worker-{i}", daemon=True)
            for i in range(len(self.fns))
        ]
        for thread in self.threads:
            thread.start()
        # A thread that failed before the barrier broke it; join() reports why.
        with suppress(threading.BrokenBarrierError):
            self.barrier.wait()
        return self

    def join(self, timeout=TIMEOUT):
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [thread.name for thread in self.threads if thread.is_alive()]
        assert not stuck, f"still running after {timeout}s (blocked?): {stuck}"
        errors = [e for e in self.errors if e is not None]
        real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
        if real or errors:
            raise (real or errors)[0]
        return self.results

    def settle(self):
        """Join whatever is still running, without raising: teardown only."""
        for thread in self.threads:
            thread.join(TIMEOUT)


def together(*fns):
    return Together(*fns).start().join()


def wait_until_blocked(pids, timeout=TIMEOUT):
    postgres.wait_until_blocked(pids, timeout)


@contextmanager
def lease_row_locked(inbox):
    """Hold the inbox's lease row (FOR UPDATE) from the test's own connection."""
    with transaction.atomic():
        Lease.objects.select_for_update().get(inbox=inbox)
        yield


class Hold:
    """A point where one thread waits, inside its transaction, until the test releases it."""

    def __init__(self):
        self.reached = threading.Event()
        self.release = threading.Event()
        _started["holds"].append(self)

    def __call__(self):
        self.reached.set()
        assert self.release.wait(TIMEOUT), "held thread was never released"

    def wait_reached(self):
        assert self.reached.wait(TIMEOUT), "the held thread never got to its hold point"


_local = threading.local()


@contextmanager
def hold_after_store():
    """Hold a thread right after it stored an event, before its transaction commits.

    Only threads running a callable wrapped by `holding()` stop there; the receiver is
    connected after approvals' record_answer, so that has run too.
    """
    hold = Hold()

    def receiver(sender, **kwargs):
        if getattr(_local, "hold_after_store", False):
            hold()

    event_stored.connect(receiver, weak=False, dispatch_uid="test-hold-after-store")
    try:
        yield hold
    finally:
        hold.release.set()
        event_stored.disconnect(dispatch_uid="test-hold-after-store")


def holding(fn):
    def run():
        _local.hold_after_store = True
        try:
            return fn()
        finally:
            _local.hold_after_store = False

    return run


class Sends:
    """A thread-safe send callback that records (inbox id, text) and can be made to wait.

    Takes what the dispatcher passes: a delivery (with .inbox and .body), or (inbox, text).
    """

    def __init__(self, delay=0.0, hold=None):
        self.calls = []
        self.lock = threading.Lock()
        self.delay = delay
        self.hold = hold

    def __call__(self, *args):
        inbox, text = (args[0].inbox, args[0].body) if len(args) == 1 else args
        with self.lock:
            self.calls.append((inbox.pk, text))
        if self.hold is not None:
            self.hold()
        if self.delay:
            time.sleep(self.delay)


def outcomes_within(seconds, **fns):
    """Run each callable in its own thread and connection; name -> its result, or
    "blocked" if it had not returned after `seconds`."""
    groups = {name: Together(fn).start() for name, fn in fns.items()}
    deadline = time.monotonic() + seconds
    results = {}
    for name, group in groups.items():
        try:
            results[name] = group.join(timeout=max(0.0, deadline - time.monotonic()))[0]
        except AssertionError:
            results[name] = "blocked"
    return results


# --- (a) acquire ---------------------------------------------------------------------------


def test_two_workers_acquiring_at_the_same_instant_one_wins(make_inbox, t0, ttl):
    winners = Counter()
    for _ in range(ROUNDS):
        inbox = make_inbox()
        a, b = together(partial(acquire, inbox, "A", now=t0), partial(acquire, inbox, "B", now=t0))
        assert {a, b} == {1, None}
        winner = "A" if a else "B"
        winners[winner] += 1
        lease = Lease.objects.get(inbox=inbox)
        assert (lease.holder, lease.generation, lease.until) == (winner, 1, t0 + ttl)
    assert sum(winners.values()) == ROUNDS


def test_two_workers_taking_over_an_expired_lease_one_wins(make_inbox, t0, ttl):
    later = t0 + ttl + SECOND
    for _ in range(ROUNDS):
        inbox = make_inbox()
        assert acquire(inbox, "old", now=t0) == 1
        a, b = together(
            partial(acquire, inbox, "A", now=later), partial(acquire, inbox, "B", now=later)
        )
        assert {a, b} == {2, None}
        lease = Lease.objects.get(inbox=inbox)
        assert (lease.holder, lease.generation, lease.until) == ("A" if a else "B", 2, later + ttl)


def test_many_acquirers_queued_on_the_lease_row_one_wins(inbox, t0, ttl):
    holders = [f"W{n}" for n in range(8)]
    with lease_row_locked(inbox):
        workers = Together(*(partial(acquire, inbox, h, now=t0) for h in holders)).start()
        wait_until_blocked(workers.pids)
    generations = workers.join()
    assert sorted(generations, key=lambda g: g is None) == [1] + [None] * 7
    lease = Lease.objects.get(inbox=inbox)
    assert lease.holder == holders[generations.index(1)]
    assert (lease.generation, lease.until) == (1, t0 + ttl)


def test_workers_looking_for_work_take_each_inbox_once(make_inbox, t0, ttl):
    busy = [make_inbox() for _ in range(12)]
    for inbox in busy:
        ingest(inbox, "chat", "m1", {}, now=t0)
    quiet = make_inbox()  # no work: nobody takes it

    def take_all(holder):
        taken = []
        for _ in range(100):
            got = acquire_next(holder, now=t0)
            if got is None:
                return taken
            taken.append((holder, *got))
        raise AssertionError("acquire_next kept returning inboxes")

    results = together(*(partial(take_all, f"W{n}") for n in range(6)))
    taken = [t for per_worker in results for t in per_worker]
    assert sorted(inbox_id for _, inbox_id, _ in taken) == sorted(i.pk for i in busy)
    for holder, inbox_id, generation in taken:
        lease = Lease.objects.get(inbox_id=inbox_id)
        assert (lease.holder, lease.generation, lease.until) == (holder, 1, t0 + ttl)
        assert generation == 1
    assert Lease.objects.get(inbox=quiet).generation == 0


def test_one_holder_claiming_twice_at_once_claims_each_event_once(inbox, t0):
    for n in range(10):
        ingest(inbox, "chat", f"m{n}", {"n": n}, now=t0)
    generation = acquire(inbox, "A", now=t0)
    batches = together(
        partial(claim_batch, inbox, "A", generation, now=t0),
        partial(claim_batch, inbox, "A", generation, now=t0),
    )
    claimed = [e.pk for batch in batches for e in batch]
    assert sorted(claimed) == sorted(Event.objects.values_list("pk", flat=True))
    assert sorted(len(batch) for batch in batches) == [0, 10]
    assert set(Event.objects.values_list("status", "attempts", "claim_gen")) == {
        ("running", 1, generation)
    }


# --- (b) ingest ----------------------------------------------------------------------------


@pytest.fixture
def stored_signals():
    sent = []

    def receiver(sender, event, **kwargs):
        sent.append(event.pk)

    event_stored.connect(receiver, weak=False, dispatch_uid="test-count-stored")
    yield sent
    event_stored.disconnect(dispatch_uid="test-count-stored")


def test_twenty_concurrent_deliveries_of_one_key_store_one_row(inbox, t0, stored_signals):
    for key in ("m1", "m2", "m3"):
        results = together(
            *(partial(ingest, inbox, "chat", key, {"n": n}, now=t0) for n in range(20))
        )
        assert results.count(True) == 1
        assert results.count(False) == 19
        row = Event.objects.get(inbox=inbox, source="chat", source_id=key)
        # The row is the winner's delivery, not a mix.
        assert row.payload == {"n": results.index(True)}
        assert (row.status, row.attempts) == ("pending", 0)
    assert Event.objects.count() == 3
    assert len(stored_signals) == 3


def _ingest_in_a_transaction(*args, **kwargs):
    """ingest inside a caller's transaction: on its own it commits in its one statement,
    before event_stored is sent, so only a caller's transaction can be held open after it."""
    with transaction.atomic():
        return ingest(*args, **kwargs)


def test_deliveries_queued_behind_an_uncommitted_insert_are_duplicates(inbox, t0, stored_signals):
    with hold_after_store() as hold:
        first = Together(
            holding(partial(_ingest_in_a_transaction, inbox, "chat", "m1", {"n": 0}, now=t0))
        ).start()
        hold.wait_reached()
        rest = Together(
            *(partial(ingest, inbox, "chat", "m1", {"n": n}, now=t0) for n in range(1, 20))
        ).start()
        wait_until_blocked(rest.pids)  # each waits on the first insert's transaction
        hold.release.set()
        assert first.join() == [True]
        assert rest.join() == [False] * 19
    assert list(Event.objects.values_list("source_id", "payload")) == [("m1", {"n": 0})]
    assert len(stored_signals) == 1


def _run_one_event(inbox, t0):
    """Ingest, acquire and claim one event: a run in progress whose finish will find no
    pending work left (work_at still says t0 until that finish recounts)."""
    assert ingest(inbox, "chat", "m0", now=t0)
    generation = acquire(inbox, "W", now=t0)
    [event] = claim_batch(inbox, "W", generation, now=t0)
    assert Lease.objects.get(inbox=inbox).work_at == t0
    return generation, event.pk


def test_an_ingest_waiting_behind_a_finish_that_recounts_keeps_its_work_marker(make_inbox, t0):
    """The ingest's statement starts while the finish holds the lease row, after the finish
    recounted (no pending work: work_at None) and before it commits. Its snapshot still shows
    work_at = t0; the marker must be decided on the row the finish leaves, or the new event
    is pending with no marker and no worker ever finds it."""
    for n in range(ROUNDS // 2):
        inbox = make_inbox()
        generation, event_id = _run_one_event(inbox, t0)
        hold = Hold()
        done = Together(
            partial(
                finish,
                Held(inbox, "W", generation, [event_id]),
                effects=[lambda now, hold=hold: hold()],
                now=t0 + SECOND,
            )
        ).start()
        hold.wait_reached()  # the finish recounted under the lease row's lock
        late = Together(partial(ingest, inbox, "chat", f"m{n + 1}", now=t0 + 2 * SECOND)).start()
        wait_until_blocked(late.pids)  # its statement waits on the lease row
        hold.release.set()
        assert done.join() == [True]
        assert late.join() == [True]
        assert Lease.objects.get(inbox=inbox).work_at == t0 + 2 * SECOND
        assert release(inbox, "W", generation)
        assert acquire_next("X", now=t0 + 3 * SECOND) == (inbox.pk, generation + 1)


def test_a_finish_waiting_behind_an_uncommitted_ingest_counts_its_event(make_inbox, t0):
    """The other order: the ingest holds the lease row (in a caller's transaction, held
    after storing) when the finish asks for it; the finish recounts after the ingest
    commits and leaves the marker at the new event."""
    for n in range(ROUNDS // 2):
        inbox = make_inbox()
        generation, event_id = _run_one_event(inbox, t0)
        with hold_after_store() as hold:
            early = Together(
                holding(
                    partial(_ingest_in_a_transaction, inbox, "chat", f"m{n + 1}", now=t0 + SECOND)
                )
            ).start()
            hold.wait_reached()
            done = Together(
                partial(finish, Held(inbox, "W", generation, [event_id]), now=t0 + 2 * SECOND)
            ).start()
            wait_until_blocked(done.pids)
            hold.release.set()
            assert early.join() == [True]
            assert done.join() == [True]
        assert Lease.objects.get(inbox=inbox).work_at == t0 + SECOND
        assert release(inbox, "W", generation)
        assert acquire_next("X", now=t0 + 3 * SECOND) == (inbox.pk, generation + 1)


@contextmanager
def inbox_row_locked(inbox):
    """Hold the inbox's own row (FOR UPDATE) from the test's connection: an ingest then
    waits in its event's foreign key check (deferred to its commit), after it locked the
    lease row and wrote its event."""
    with transaction.atomic():
        Inbox.objects.select_for_update().get(pk=inbox.pk)
        yield


def _blockers(pid):
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_blocking_pids(%s)", [pid])
        return set(cursor.fetchone()[0])


def _own_pid():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def test_a_finish_waits_for_ingests_sharing_the_lease_row_and_counts_their_events(make_inbox, t0):
    """Deliveries to an inbox whose marker already stands share its lease row (FOR SHARE):
    neither waits for the other. A finish's FOR UPDATE still waits for both to commit, so
    its recount sees their events. Taking no lock while the marker stands would let the
    finish recount (no pending work: work_at None) and commit first, losing the marker."""
    for n in range(ROUNDS // 4):
        inbox = make_inbox()
        generation, event_id = _run_one_event(inbox, t0)
        later = t0 + 2 * SECOND
        with inbox_row_locked(inbox):
            deliveries = Together(
                *(partial(ingest, inbox, "chat", f"m{n}-{k}", now=later) for k in range(2))
            ).start()
            wait_until_blocked(deliveries.pids)
            # Both wait only on the inbox row the test holds, not on each other's lease lock.
            assert [_blockers(pid) for pid in deliveries.pids] == [{_own_pid()}] * 2
            done = Together(
                partial(finish, Held(inbox, "W", generation, [event_id]), now=t0 + SECOND)
            ).start()
            wait_until_blocked(done.pids)
            # On their lease lock (PostgreSQL names the sharer it waits on first).
            assert _blockers(done.pids[0]) in ({pid} for pid in deliveries.pids)
        assert deliveries.join() == [True, True]
        assert done.join() == [True]
        assert Lease.objects.get(inbox=inbox).work_at == later
        assert release(inbox, "W", generation)
        assert acquire_next("X", now=later) == (inbox.pk, generation + 1)


def test_ingests_and_finishes_racing_on_one_inbox_never_lose_a_marker(inbox, t0):
    """Many rounds of a finish and deliveries released together: after each, every pending
    event is found through the marker."""
    for n in range(ROUNDS):
        now = t0 + n * 10 * SECOND
        assert ingest(inbox, "chat", f"seed-{n}", now=now)
        generation = acquire(inbox, "W", now=now)
        claimed = [event.pk for event in claim_batch(inbox, "W", generation, now=now)]
        results = together(
            partial(finish, Held(inbox, "W", generation, claimed), now=now + SECOND),
            *(partial(ingest, inbox, "chat", f"r{n}-{k}", now=now + SECOND) for k in range(4)),
        )
        assert results == [True] * 5
        release(inbox, "W", generation)
        pending = Event.objects.filter(inbox=inbox, status="pending")
        assert pending.count() == 4
        assert Lease.objects.get(inbox=inbox).work_at == now + SECOND
        # Drain them so the next round starts from an inbox with no pending work.
        generation = acquire(inbox, "W", now=now + 2 * SECOND)
        batch = [event.pk for event in claim_batch(inbox, "W", generation, now=now + 2 * SECOND)]
        assert len(batch) == 4
        assert finish(Held(inbox, "W", generation, batch), now=now + 2 * SECOND)
        release(inbox, "W", generation)
        assert Lease.objects.get(inbox=inbox).work_at is None


def answer_stands(*args, **kwargs):
    """answer_approval's outcome that stands: what the racing callers are told."""
    return answer_approval(*args, **kwargs).stands


# --- (c) answer_approval vs the expiry scheduler -------------------------------------------

EXPIRES_IN = 60


def _approval_state(inbox, request_id):
    event = Event.objects.get(inbox=inbox)  # the inbox's only event: the answer that stands
    assert (event.source, event.source_id) == ("approval", request_id)
    approval = Approval.objects.get(inbox=inbox, request_id=request_id)
    timer = Timer.objects.get(inbox=inbox)
    return event.payload["answer"], approval, timer


@pytest.mark.parametrize("answer_offset", [-1, 0, 1], ids=["before", "at", "after"])
def test_answer_racing_the_expiry_scheduler_one_answer_stands(make_inbox, t0, answer_offset):
    deadline = t0 + timedelta(seconds=EXPIRES_IN)
    answered = deadline + answer_offset * SECOND
    outcomes = Counter()
    for n in range(ROUNDS):
        inbox = make_inbox()
        request_id = f"refund-{n}"
        request_approval(inbox, request_id, "refund order 42", EXPIRES_IN, now=t0)
        yes, no, handled = together(
            partial(answer_stands, inbox, request_id, "yes", now=answered),
            partial(answer_stands, inbox, request_id, "no", now=answered),
            partial(run_scheduler, now=deadline),
        )
        stands, approval, timer = _approval_state(inbox, request_id)
        assert yes == no == stands, f"round {n}: callers told {yes}/{no}, stored {stands}"
        assert approval.answer == stands
        assert handled == 1  # this round's expiry timer; earlier rounds' are all done
        assert timer.done
        if answer_offset >= 0:
            assert stands == "expired"
        if stands == "expired":
            assert approval.answered_at in {deadline, answered}
        else:
            assert approval.answered_at == answered
        outcomes[stands] += 1
    assert sum(outcomes.values()) == ROUNDS
    assert Timer.objects.due(deadline + timedelta(days=1)).count() == 0


def test_answer_waiting_on_an_uncommitted_expiry_is_told_expired(inbox, t0):
    deadline = t0 + timedelta(seconds=EXPIRES_IN)
    request_approval(inbox, "r1", "refund order 42", EXPIRES_IN, now=t0)
    with hold_after_store() as hold:
        scheduler = Together(holding(partial(run_scheduler, now=deadline))).start()
        hold.wait_reached()  # the expiry is stored, not committed
        answer = Together(partial(answer_stands, inbox, "r1", "yes", now=deadline - SECOND)).start()
        wait_until_blocked(answer.pids)
        hold.release.set()
        assert scheduler.join() == [1]
        assert answer.join() == ["expired"]
    stands, approval, timer = _approval_state(inbox, "r1")
    assert (stands, approval.answer, approval.answered_at, timer.done) == (
        "expired",
        "expired",
        deadline,
        True,
    )


def test_expiry_waiting_on_an_uncommitted_answer_leaves_the_answer(inbox, t0):
    deadline = t0 + timedelta(seconds=EXPIRES_IN)
    request_approval(inbox, "r1", "refund order 42", EXPIRES_IN, now=t0)
    with hold_after_store() as hold:
        answer = Together(
            holding(partial(answer_stands, inbox, "r1", "yes", now=deadline - SECOND))
        ).start()
        hold.wait_reached()  # the answer is stored, not committed
        scheduler = Together(partial(run_scheduler, now=deadline)).start()
        wait_until_blocked(scheduler.pids)
        hold.release.set()
        assert answer.join() == ["yes"]
        assert scheduler.join() == [1]
    stands, approval, timer = _approval_state(inbox, "r1")
    assert (stands, approval.answer, approval.answered_at, timer.done) == (
        "yes",
        "yes",
        deadline - SECOND,
        True,
    )
    assert answer_approval(inbox, "r1", "no", now=deadline).stands == "yes"


# --- (d) dispatchers -----------------------------------------------------------------------

GAP = timedelta(seconds=settings.ALWAYSON_OUTBOX_GAP)


def _queue(inbox, bodies, at):
    for body in bodies:
        OutboxMessage.objects.create(inbox=inbox, body=body, created=at)


def _assert_sent_once(sends, expected, now):
    """`expected`: inbox id -> the bodies that must have gone out, in order, as one send."""
    by_inbox = Counter(inbox_id for inbox_id, _ in sends.calls)
    assert by_inbox == Counter(expected.keys()), "one send per inbox with held messages"
    for inbox_id, text in sends.calls:
        assert text == "\n\n".join(expected[inbox_id])
    assert OutboxMessage.objects.filter(sent_at=now).count() == sum(map(len, expected.values()))


def test_concurrent_dispatchers_send_each_message_once_and_keep_the_gap(make_inbox, t0):
    inboxes = [make_inbox() for _ in range(6)]
    expected = {}
    for inbox in inboxes:
        expected[inbox.pk] = [f"{inbox.slug} update {n}" for n in range(3)]
        _queue(inbox, expected[inbox.pk], t0)
    now = t0 + timedelta(minutes=5)
    sends = Sends(delay=0.005)
    counts = together(
        partial(dispatch, sends, now=now),
        partial(dispatch, sends, now=now),
        *(partial(dispatch_inbox, inbox, sends, now=now) for inbox in inboxes),
    )
    assert sum(counts) == 18
    _assert_sent_once(sends, expected, now)
    assert not OutboxMessage.objects.held().exists()

    # New messages inside the gap stay held, however many dispatchers try.
    for inbox in inboxes:
        _queue(inbox, [f"{inbox.slug} late"], now)
    early = now + GAP - SECOND
    late_sends = Sends(delay=0.005)
    counts = together(*(partial(dispatch, late_sends, now=early) for _ in range(3)))
    assert counts == [0, 0, 0]
    assert late_sends.calls == []
    assert OutboxMessage.objects.held().count() == 6

    # Once the gap has passed, each inbox sends its new message exactly once.
    after = now + GAP
    counts = together(*(partial(dispatch, late_sends, now=after) for _ in range(3)))
    assert sum(counts) == 6
    _assert_sent_once(late_sends, {i.pk: [f"{i.slug} late"] for i in inboxes}, after)
    assert not OutboxMessage.objects.held().exists()


def test_dispatcher_mid_send_excludes_others_without_blocking_the_inbox(
    make_inbox, django_user_model, t0
):
    owner = django_user_model.objects.create(username="shared-owner")
    inbox = make_inbox(owner=owner)
    sibling = make_inbox(owner=owner)  # another inbox of the same owner
    other = make_inbox()
    _queue(inbox, ["one", "two"], t0)
    _queue(sibling, ["sibling news"], t0)
    _queue(other, ["other news"], t0)
    ingest(inbox, "chat", "m0", {}, now=t0)
    now = t0 + timedelta(minutes=1)
    generation = acquire(inbox, "A", now=now)
    batch = claim_batch(inbox, "A", generation, now=now)

    def run_finishes():
        # A run's finish writes an outbox row for this inbox while the send is under way.
        say = Say(inbox.pk, "written during the send")
        return finish(Held(inbox, "A", generation, [e.pk for e in batch]), [say], now=now)

    hold = Hold()
    sends = Sends(hold=hold)
    first = Together(partial(dispatch_inbox, inbox, sends, now=now)).start()
    try:
        hold.wait_reached()  # inside send(): this inbox is being dispatched, nothing marked
        others = Sends()
        # None of these may wait for the send in progress: a second dispatcher of the same
        # inbox skips it, and other inboxes, new events and run effects go ahead.
        assert outcomes_within(
            5,
            same_inbox=partial(dispatch_inbox, inbox, others, now=now),
            ingest=partial(ingest, inbox, "chat", "m1", {}, now=now),
            finish_with_say=run_finishes,
            same_owner=partial(dispatch_inbox, sibling, others, now=now),
            other_owner=partial(dispatch_inbox, other, others, now=now),
        ) == {
            "same_inbox": 0,
            "ingest": True,
            "finish_with_say": True,
            "same_owner": 1,
            "other_owner": 1,
        }
        assert sorted(others.calls) == sorted(
            [(sibling.pk, "sibling news"), (other.pk, "other news")]
        )
    finally:
        hold.release.set()
    assert first.join() == [2]
    assert sends.calls == [(inbox.pk, "one\n\ntwo")]
    held = OutboxMessage.objects.held()
    assert list(held.values_list("body", flat=True)) == ["written during the send"]
    assert dispatch_inbox(inbox, sends, now=now) == 0  # the gap
    assert dispatch(sends, now=now + GAP) == 1
    assert sends.calls[-1] == (inbox.pk, "written during the send")


# --- (e) schedulers ------------------------------------------------------------------------


def _drain(now, batch_size, inbox=None):
    counts = []
    for _ in range(1000):
        handled = run_scheduler(now=now, batch_size=batch_size, inbox=inbox)
        if not handled:
            return counts
        counts.append(handled)
    raise AssertionError("the scheduler never ran out of due timers")


def test_concurrent_schedulers_turn_each_due_timer_into_one_event(make_inbox, t0, monkeypatch):
    now = t0 + timedelta(hours=1)
    inboxes = [make_inbox() for _ in range(8)]
    expected = {}  # timer pk -> (event source, source_id, next due or None)
    not_due = []
    for inbox in inboxes:
        for n in range(12):
            due = t0 + n * timedelta(minutes=3)
            timer = add_timer(inbox, f"once-{n}", due, {"n": n}, now=t0)
            expected[timer.pk] = ("timer", f"once-{n}@{occurrence_label(due)}", None)
        for n in range(12):
            due, every = t0 + n * SECOND, 60 * (n + 1)
            timer = add_timer(inbox, f"every-{n}", due, {"n": n}, every=every, now=t0)
            skipped = int((now - due).total_seconds()) // every
            occurrence = due + timedelta(seconds=skipped * every)
            expected[timer.pk] = (
                "timer",
                f"every-{n}@{occurrence_label(occurrence)}",
                occurrence + timedelta(seconds=every),
            )
        timer = add_timer(inbox, "fixed", t0, event_key=("alarm", f"fixed-{inbox.pk}"), now=t0)
        expected[timer.pk] = ("alarm", f"fixed-{inbox.pk}", None)
        for n in range(4):
            not_due.append(add_timer(inbox, f"later-{n}", now + (n + 1) * SECOND, now=t0).pk)
    assert Timer.objects.due(now).count() == len(expected) == 8 * 25

    fired = []
    lock = threading.Lock()
    original_fire = Timer.fire

    def recording_fire(self, now):
        with lock:
            fired.append(self.pk)
        return original_fire(self, now)

    monkeypatch.setattr(Timer, "fire", recording_fire)

    counts = together(
        partial(_drain, now, 7),
        partial(_drain, now, 7),
        partial(_drain, now, 13),
        partial(_drain, now, 100),
        partial(_drain, now, 5, inbox=inboxes[0]),
    )
    assert sum(map(sum, counts)) == len(expected)
    assert Counter(fired) == Counter(expected.keys()), "each due timer fired by one scheduler"

    events = Counter(Event.objects.values_list("source", "source_id"))
    assert events == Counter((source, key) for source, key, _ in expected.values())
    for timer in Timer.objects.filter(pk__in=expected):
        _, _, next_due = expected[timer.pk]
        assert (timer.done, timer.due if next_due else None) == (next_due is None, next_due)
    assert set(Timer.objects.filter(pk__in=not_due).values_list("done", flat=True)) == {False}
    assert Timer.objects.due(now).count() == 0
    assert together(partial(run_scheduler, now=now), partial(run_scheduler, now=now)) == [0, 0]
    assert Event.objects.count() == len(expected)


# --- (f) a late finish racing the new holder's claim ---------------------------------------


def _claimed_run(inbox, t0, n_events=3):
    for n in range(n_events):
        ingest(inbox, "chat", f"m{n}", {"n": n}, now=t0)
    generation = acquire(inbox, "A", now=t0)
    batch = claim_batch(inbox, "A", generation, now=t0)
    assert len(batch) == n_events
    return generation, [e.pk for e in batch]


def _assert_taken_over(inbox, ids, old, new):
    """After a takeover claim: the oldest event runs alone under the new generation (it is a
    retry now), the rest are back to pending; nothing is done and no effect was written."""
    rows = list(Event.objects.filter(pk__in=ids).values_list("status", "attempts", "claim_gen"))
    assert rows[0] == ("running", 2, new)
    assert rows[1:] == [("pending", 1, old)] * (len(ids) - 1)
    assert not OutboxMessage.objects.filter(inbox=inbox).exists()


def test_late_finish_racing_the_new_holders_claim_is_refused(make_inbox, t0, ttl):
    later = t0 + ttl + SECOND
    for n in range(ROUNDS):
        inbox = make_inbox()
        old, ids = _claimed_run(inbox, t0)
        new = acquire(inbox, "B", now=later)
        assert new == old + 1
        late_finish = partial(
            finish, Held(inbox, "A", old, ids), [Say(inbox.pk, "from the lost run")], now=later
        )
        claim = partial(claim_batch, inbox, "B", new, now=later)
        if n % 2:
            finished, batch = together(late_finish, claim)
        else:  # queue both behind the lease row, then let them go at once
            with lease_row_locked(inbox):
                racers = Together(late_finish, claim).start()
                wait_until_blocked(racers.pids)
            finished, batch = racers.join()
        assert finished is False
        assert [e.pk for e in batch] == ids[:1]
        _assert_taken_over(inbox, ids, old, new)
        assert finish(Held(inbox, "B", new, ids[:1]), now=later)
        assert Event.objects.get(pk=ids[0]).status == "done"


def test_late_finish_racing_a_takeover_after_expiry_is_refused(make_inbox, t0, ttl):
    later = t0 + ttl + SECOND

    def take_over(inbox):
        new = acquire(inbox, "B", now=later)
        return new, claim_batch(inbox, "B", new, now=later)

    for _ in range(ROUNDS):
        inbox = make_inbox()
        old, ids = _claimed_run(inbox, t0)
        finished, (new, batch) = together(
            partial(finish, Held(inbox, "A", old, ids), [Say(inbox.pk, "lost")], now=later),
            partial(take_over, inbox),
        )
        # Refused whichever went first: the lease had expired at `later` either way.
        assert finished is False
        assert new == old + 1
        assert [e.pk for e in batch] == ids[:1]
        _assert_taken_over(inbox, ids, old, new)


def test_takeover_waits_for_a_finish_in_progress(inbox, t0, ttl):
    old, ids = _claimed_run(inbox, t0)
    hold = Hold()

    def slow_effect(now):
        Say(inbox.pk, "done in time")(now)
        hold()  # the finish's transaction holds the lease row here

    in_time = t0 + ttl - SECOND
    later = t0 + ttl + SECOND
    finishing = Together(partial(finish, Held(inbox, "A", old, ids), [slow_effect], now=in_time))
    finishing.start()
    try:
        hold.wait_reached()
        takeover = Together(partial(acquire, inbox, "B", now=later)).start()
        wait_until_blocked(takeover.pids)
    finally:
        hold.release.set()
    assert finishing.join() == [True]
    assert takeover.join() == [old + 1]
    assert claim_batch(inbox, "B", old + 1, now=later) == []
    assert set(Event.objects.values_list("status", "attempts", "claim_gen")) == {("done", 1, old)}
    assert list(OutboxMessage.objects.values_list("body", flat=True)) == ["done in time"]


# --- (g) two approvers answering at once ---------------------------------------------------

AUDIT = ("username", "answer", "result")


@pytest.fixture
def approvers(inbox, django_user_model):
    from inbox.models import Membership, Role

    people = []
    for name in ("dana", "lee", "sam"):
        user = django_user_model.objects.create_user(username=name, email=f"{name}@example.com")
        Membership.objects.create(inbox=inbox, user=user, role=Role.APPROVER)
        people.append(user)
    return people


def _ask_two(inbox, request_id, t0):
    request_approval(inbox, request_id, "refund order 42 for 900", EXPIRES_IN, now=t0, approvers=2)


def _answers_queued_on_the_lease(inbox, *answers):
    """Start each (user, answer) in its own connection while the test holds the inbox's
    lock, release it once every one of them waits for it: they have all read nothing yet
    that the one before them writes, unless they read it after taking the lock."""
    with lease_row_locked(inbox):
        group = Together(*answers).start()
        wait_until_blocked(group.pids)
    return group.join()


def test_two_approvers_at_once_make_one_first_and_one_second_approval(inbox, approvers, t0):
    dana, lee, _ = approvers
    for n in range(ROUNDS):
        request_id = f"refund-{n}"
        _ask_two(inbox, request_id, t0)
        results = _answers_queued_on_the_lease(
            inbox,
            partial(answer_stands, inbox, request_id, "yes", now=t0 + SECOND, by=dana),
            partial(answer_stands, inbox, request_id, "yes", now=t0 + SECOND, by=lee),
        )
        assert sorted(results) == ["waiting", "yes"], f"round {n}: {results}"
        first, second = (dana, lee) if results[0] == "waiting" else (lee, dana)
        [event] = Event.objects.filter(inbox=inbox, source="approval", source_id=request_id)
        assert event.payload["answer"] == "yes"
        assert event.payload["approved_by"] == [first.username, second.username]
        approval = Approval.objects.get(inbox=inbox, request_id=request_id)
        assert (approval.answer, approval.first_approved_by, approval.answered_by) == (
            "yes",
            first,
            second,
        )
        assert list(approval.audit.order_by("id").values_list(*AUDIT)) == [
            (first.username, "yes", "first_approval"),
            (second.username, "yes", "approved"),
        ]
    assert Event.objects.filter(source="approval").count() == ROUNDS


def test_a_second_yes_and_a_no_at_once_one_answer_stands(inbox, approvers, t0):
    dana, lee, sam = approvers
    outcomes = Counter()
    for n in range(ROUNDS):
        request_id = f"refund-{n}"
        _ask_two(inbox, request_id, t0)
        assert (
            answer_approval(inbox, request_id, "yes", now=t0 + SECOND, by=dana).stands == "waiting"
        )
        yes, no = _answers_queued_on_the_lease(
            inbox,
            partial(answer_stands, inbox, request_id, "yes", now=t0 + 2 * SECOND, by=lee),
            partial(answer_stands, inbox, request_id, "no", now=t0 + 2 * SECOND, by=sam),
        )
        [event] = Event.objects.filter(inbox=inbox, source="approval", source_id=request_id)
        stands = event.payload["answer"]
        assert yes == no == stands, f"round {n}: told {yes}/{no}, stored {stands}"
        approval = Approval.objects.get(inbox=inbox, request_id=request_id)
        assert (approval.answer, approval.answered_by) == (stands, lee if stands == "yes" else sam)
        results = list(approval.audit.order_by("id").values_list("result", flat=True))
        assert results[0] == "first_approval"
        assert sorted(results[1:]) == sorted(
            ["approved" if stands == "yes" else "denied", "already_settled"]
        )
        outcomes[stands] += 1
    assert sum(outcomes.values()) == ROUNDS


# --- (g') the page's plain answers in one statement (approvals/sql/answer.sql) -------------


def _at_once(user, inbox, request_id, answer, now):
    """The page's one-statement answer: (the audit's result, what stands)."""
    answered = answer_at_once(user, inbox.slug, request_id, answer, now=now)
    return answered.result, answered.stands


def test_a_yes_and_a_no_in_one_statement_each_at_once_one_answer_stands(inbox, approvers, t0):
    dana, lee, _ = approvers
    outcomes = Counter()
    for n in range(ROUNDS):
        request_id = f"refund-{n}"
        request_approval(inbox, request_id, "refund order 42", EXPIRES_IN, now=t0)
        yes, no = _answers_queued_on_the_lease(
            inbox,
            partial(_at_once, dana, inbox, request_id, "yes", t0 + SECOND),
            partial(_at_once, lee, inbox, request_id, "no", t0 + SECOND),
        )
        [event] = Event.objects.filter(inbox=inbox, source="approval", source_id=request_id)
        stands = event.payload["answer"]
        assert yes[1] == no[1] == stands, f"round {n}: told {yes}/{no}, stored {stands}"
        assert sorted([yes[0], no[0]]) == sorted(
            ["approved" if stands == "yes" else "denied", "already_settled"]
        )
        approval = Approval.objects.get(inbox=inbox, request_id=request_id)
        assert (approval.answer, approval.answered_by) == (stands, dana if stands == "yes" else lee)
        assert approval.audit.count() == 2
        outcomes[stands] += 1
    assert sum(outcomes.values()) == ROUNDS


def test_a_one_statement_answer_racing_the_expiry_scheduler_one_answer_stands(
    make_inbox, django_user_model, t0
):
    from inbox.models import Membership, Role

    dana = django_user_model.objects.create_user(username="dana")
    deadline = t0 + timedelta(seconds=EXPIRES_IN)
    outcomes = Counter()
    for n in range(ROUNDS):
        inbox = make_inbox()
        Membership.objects.create(inbox=inbox, user=dana, role=Role.APPROVER)
        request_id = f"refund-{n}"
        request_approval(inbox, request_id, "refund order 42", EXPIRES_IN, now=t0)
        (result, told), handled = together(
            partial(_at_once, dana, inbox, request_id, "yes", deadline - SECOND),
            partial(run_scheduler, now=deadline),
        )
        stands, approval, timer = _approval_state(inbox, request_id)
        assert told == stands == approval.answer, f"round {n}: told {told}, stored {stands}"
        assert result == ("approved" if stands == "yes" else "already_settled")
        assert (handled, timer.done) == (1, True)
        outcomes[stands] += 1
    assert sum(outcomes.values()) == ROUNDS


def test_a_one_statement_answer_waiting_past_its_bound_is_busy_and_stores_nothing(
    inbox, approvers, t0, settings
):
    settings.ALWAYSON_INGEST_LOCK_WAIT = 0.2
    dana = approvers[0]
    request_approval(inbox, "r1", "refund order 42", EXPIRES_IN, now=t0)
    with lease_row_locked(inbox):
        answer = Together(partial(_at_once, dana, inbox, "r1", "yes", t0 + SECOND)).start()
        with pytest.raises(InboxBusy):
            answer.join()
    approval = Approval.objects.get(inbox=inbox, request_id="r1")
    assert (approval.answer, approval.audit.count()) == ("", 0)
    assert not Event.objects.filter(inbox=inbox, source="approval").exists()
    # The bound was the statement's own (SET LOCAL): the session's next one waits as before.
    assert _at_once(dana, inbox, "r1", "yes", t0 + SECOND) == ("approved", "yes")


def test_a_second_yes_racing_a_third_approvers_edit_never_approves_unseen_arguments(
    inbox, approvers, t0
):
    """Lee approves the arguments he was shown while Sam changes them: whichever the lock
    takes first, an approval stands only for arguments two people approved."""
    dana, lee, sam = approvers
    schema = {"type": "object", "properties": {"amount": {"type": "number"}}}
    shown, changed = {"amount": 900}, {"amount": 600}
    outcomes = Counter()
    for n in range(ROUNDS):
        request_id = f"refund-{n}"
        request_approval(
            inbox,
            request_id,
            "refund order 42 for 900",
            EXPIRES_IN,
            now=t0,
            approvers=2,
            details={"arguments": shown, "schema": schema},
        )
        answer_approval(inbox, request_id, "yes", now=t0 + SECOND, by=dana)
        yes, edit = _answers_queued_on_the_lease(
            inbox,
            partial(
                answer_stands,
                inbox,
                request_id,
                "yes",
                now=t0 + 2 * SECOND,
                by=lee,
                arguments=shown,
            ),
            partial(
                answer_stands,
                inbox,
                request_id,
                "yes",
                now=t0 + 2 * SECOND,
                by=sam,
                arguments=changed,
            ),
        )
        approval = Approval.objects.get(inbox=inbox, request_id=request_id)
        results = list(approval.audit.order_by("id").values_list("username", "result"))
        if yes == "yes":  # Lee's second approval first: the arguments Dana and he approved
            assert edit == "yes" and approval.answer == "yes", f"round {n}: {yes}/{edit}"
            [event] = Event.objects.filter(inbox=inbox, source="approval", source_id=request_id)
            assert "edit" not in event.payload and event.payload["approved_by"] == ["dana", "lee"]
            assert results[1:] == [("lee", "approved"), ("sam", "already_settled")]
        else:  # Sam's edit first: a first approval of it; Lee's then one of what he saw
            assert (yes, edit) == ("waiting", "waiting"), f"round {n}: {yes}/{edit}"
            assert not Event.objects.filter(inbox=inbox, source_id=request_id).exists()
            assert (approval.first_approved_by, approval.current_arguments) == (lee, shown)
            assert results[1:] == [("sam", "first_approval"), ("lee", "first_approval")]
        outcomes[yes] += 1
    assert sum(outcomes.values()) == ROUNDS


def test_one_approver_in_two_tabs_at_once_is_one_first_approval(inbox, approvers, t0):
    dana = approvers[0]
    _ask_two(inbox, "refund-1", t0)
    results = _answers_queued_on_the_lease(
        inbox,
        *(
            partial(answer_stands, inbox, "refund-1", "yes", now=t0 + SECOND, by=dana)
            for _ in range(4)
        ),
    )
    assert results == ["waiting"] * 4
    assert not Event.objects.filter(source="approval").exists()
    approval = Approval.objects.get(inbox=inbox)
    assert (approval.first_approved_by, approval.answer) == (dana, "")
    assert sorted(approval.audit.values_list("result", flat=True)) == [
        "first_approval",
        *["not_counted"] * 3,
    ]


def test_a_second_approval_racing_the_expiry_one_answer_stands(make_inbox, approvers, t0):
    from inbox.models import Membership

    dana, lee, _ = approvers
    deadline = t0 + timedelta(seconds=EXPIRES_IN)
    outcomes = Counter()
    for n in range(ROUNDS):
        inbox = make_inbox()
        for user in (dana, lee):
            Membership.objects.create(inbox=inbox, user=user, role=2)
        _ask_two(inbox, "r", t0)
        answer_approval(inbox, "r", "yes", now=t0 + SECOND, by=dana)
        told, handled = together(
            partial(answer_stands, inbox, "r", "yes", now=deadline - SECOND, by=lee),
            partial(run_scheduler, now=deadline),
        )
        stands, approval, timer = _approval_state(inbox, "r")
        assert told == stands == approval.answer, f"round {n}: told {told}, stored {stands}"
        assert handled == 1 and timer.done
        assert approval.answered_by == (lee if stands == "yes" else None)
        outcomes[stands] += 1
    assert sum(outcomes.values()) == ROUNDS


def test_concurrent_dispatchers_send_each_notice_once(make_inbox, django_user_model, t0):
    from inbox.models import Membership
    from outbox.models import Notice
    from outbox.services import dispatch_notices

    inbox = make_inbox()
    for n in range(12):
        user = django_user_model.objects.create_user(username=f"a{n}", email=f"a{n}@x.example")
        Membership.objects.create(inbox=inbox, user=user, role=2)
    for n in range(3):
        request_approval(inbox, f"r{n}", f"refund order {n}", EXPIRES_IN, now=t0)
    sent, lock = [], threading.Lock()

    def send(notice):
        with lock:
            sent.append(notice.key)
        time.sleep(0.002)
        return notice.recipient.email

    counts = together(*(partial(dispatch_notices, send, now=t0) for _ in range(4)))

    assert sum(counts) == 36
    assert sorted(sent) == sorted(Notice.objects.values_list("key", flat=True))
    assert len(set(sent)) == 36
    assert set(Notice.objects.values_list("status", flat=True)) == {"sent"}
