"""The state machine behind tests/contracts/test_model_check.py, and the model it checks against.

The model is a second, plain-Python implementation of the article's rules: the lease and its
generations, claims (orphans back to pending, out-of-attempts parked as dead, a retry claimed
alone), the three ways a finish ends, coalescing timers, approvals and their deadlines, and
the outbox's gap. It predicts what every call returns and what every event's row holds. The
one thing it cannot predict is the retry backoff's jitter: there it checks that the delay
stays within its bounds and adopts the value the database holds.
"""

from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings
from django.db import transaction
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from alwayson.runtime.api import (
    Say,
    acquire,
    add_timer,
    answer_approval,
    claim_batch,
    dispatch,
    finish,
    ingest,
    run_scheduler,
)
from approvals.models import Approval
from approvals.services import Ask
from inbox import clock
from inbox.models import Event, Inbox, Lease, Session
from inbox.services import Defer, Done, Failed, Held
from outbox.models import Notice, OutboxMessage
from timers.models import Timer

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
INBOXES = (0, 1)
HOLDERS = ("A", "B", "C")
SOURCES = ("github", "chat")
SOURCE_IDS = ("1", "2", "3")
TIMER_KEYS = ("digest", "ping")
REQUESTS = ("r1", "r2")
# 121 s outlives the default 120 s lease; 3601 s the default outbox gap.
STEPS_OF_TIME = (1, 30, 60, 121, 3601)

RUNNING, PENDING, DONE, DEAD = "running", "pending", "done", "dead"


@dataclass
class ModelEvent:
    pk: int
    status: str
    attempts: int
    claim_gen: int | None
    available_at: datetime
    updated: datetime


@dataclass
class ModelLease:
    holder: str = ""
    generation: int = 0
    until: datetime | None = None

    def is_free(self, now):
        return self.until is None or self.until < now

    def is_held_by(self, holder, generation, now):
        return self.holder == holder and self.generation == generation and not self.is_free(now)


@dataclass
class ModelTimer:
    due: datetime
    every: int | None
    event_key: tuple[str, str] | None = None
    done: bool = False


@dataclass
class Worker:
    generation: int
    batch: list[int] | None = None


def retry_bounds(attempts):
    """The interval inbox.services.retry_delay draws from: half fixed, half jitter."""
    step = min(
        settings.ALWAYSON_RETRY_CAP, settings.ALWAYSON_RETRY_BASE * 2 ** max(attempts - 1, 0)
    )
    return timedelta(seconds=step / 2), timedelta(seconds=step)


def snapshot():
    """Every row a run or its effects can write: a refused finish must leave all of it alone."""
    tables = (Event, Lease, Session, OutboxMessage, Approval, Timer)
    return {model.__name__: list(model.objects.order_by("pk").values()) for model in tables}


class InboxMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        # The example's savepoint; teardown() rolls it back (tests/contracts/test_model_check.py).
        self._example = transaction.atomic()
        self._example.__enter__()
        from django.contrib.auth import get_user_model

        owner = get_user_model().objects.create_user(username="model-owner")
        self.inboxes = [Inbox.objects.create(owner=owner, slug=f"model-{i}") for i in INBOXES]
        self.now = T0
        self.events: dict[tuple[int, str, str], ModelEvent] = {}
        self.leases = {i: ModelLease() for i in INBOXES}
        self.workers: dict[tuple[int, str], Worker] = {}
        # Claims a worker no longer acts on (it stalled, lost its lease, claimed again, or
        # already finished them): (inbox, holder, generation, ids), for late finishes.
        self.ghosts: list[tuple[int, str, int, list[int]]] = []
        self.timers: dict[tuple[int, str], ModelTimer] = {}
        self.fired: dict[tuple[int, str], set[datetime]] = defaultdict(set)
        self.approvals: dict[tuple[int, str], dict] = {}
        self.held: dict[int, list[bool]] = {i: [] for i in INBOXES}  # urgent flag per message
        self.last_send: dict[int, datetime | None] = {i: None for i in INBOXES}
        # The dead-event alert (alwayson/ops/alerts.py): when the last was queued, how many
        # were, and how many went dead since without one (told by the dispatcher's flush, not
        # modelled). It is a notice (the inboxes have no operator: one, to the owner), never
        # an outbox message: it neither waits for nor spends the gap.
        self.last_alert: dict[int, datetime | None] = {i: None for i in INBOXES}
        self.alerts: dict[int, int] = {i: 0 for i in INBOXES}
        self.unreported: dict[int, int] = {i: 0 for i in INBOXES}
        self.sends: list[tuple[int, datetime, list[int], list[bool]]] = []
        self.last_pass: datetime | None = None
        self.said = 0

    def teardown(self):
        transaction.set_rollback(True)
        self._example.__exit__(None, None, None)

    # --- helpers ----------------------------------------------------------------------------

    def inbox_pk(self, i):
        return self.inboxes[i].pk

    def by_pk(self, pk) -> ModelEvent:
        return next(e for e in self.events.values() if e.pk == pk)

    def inbox_events(self, i):
        return sorted(
            (e for (inbox, _, _), e in self.events.items() if inbox == i), key=lambda e: e.pk
        )

    def stored(self, i, source, source_id, at):
        """The model's side of store_event: True if the key was new."""
        key = (i, source, source_id)
        if key in self.events:
            return False
        pk = Event.objects.get(inbox=self.inboxes[i], source=source, source_id=source_id).pk
        self.events[key] = ModelEvent(pk, PENDING, 0, None, at, at)
        return True

    def adopt_backoff(self, event, base):
        """The event went back to pending after a jittered backoff from `base`."""
        available_at = Event.objects.get(pk=event.pk).available_at
        low, high = retry_bounds(event.attempts)
        assert base + low <= available_at <= base + high, (
            f"event {event.pk}: backoff {available_at - base} outside [{low}, {high}]"
        )
        event.available_at = available_at

    def answered(self, i, request_id) -> bool:
        """Whether the request has an answer that stands (a deadline passed is the expiry's,
        before its timer fires)."""
        approval = self.approvals.get((i, request_id))
        return approval is not None and (
            approval["stands"] is not None or self.now >= approval["expires_at"]
        )

    def settle_approval(self, i, request_id, answer, at):
        approval = self.approvals[(i, request_id)]
        if self.stored(i, "approval", request_id, at):
            assert approval["stands"] is None
            approval["stands"] = answer

    # --- rules ------------------------------------------------------------------------------

    @initialize(
        keys=st.lists(
            st.tuples(
                st.sampled_from(INBOXES), st.sampled_from(SOURCES), st.sampled_from(SOURCE_IDS)
            ),
            min_size=1,
            max_size=4,
        )
    )
    def first_deliveries(self, keys):
        """Work from the start, so the first runs have events to claim."""
        for i, source, sid in keys:
            self.deliver(i, source, sid)

    @rule(seconds=st.sampled_from(STEPS_OF_TIME))
    def advance_clock(self, seconds):
        self.now += timedelta(seconds=seconds)

    @rule(
        i=st.sampled_from(INBOXES), source=st.sampled_from(SOURCES), sid=st.sampled_from(SOURCE_IDS)
    )
    def deliver(self, i, source, sid):
        expected_new = (i, source, sid) not in self.events
        got = ingest(self.inboxes[i], source, sid, {"n": sid}, now=self.now)
        assert got is expected_new, f"ingest of {(i, source, sid)} returned {got}"
        event(f"ingest: {'new' if got else 'duplicate'}")
        if got:
            self.stored(i, source, sid, self.now)

    @rule(i=st.sampled_from(INBOXES), holder=st.sampled_from(HOLDERS))
    def take_lease(self, i, holder):
        lease = self.leases[i]
        if lease.is_free(self.now):
            expected = lease.generation + 1
        elif lease.holder != holder:
            expected = None
        else:
            expected = lease.generation
        got = acquire(self.inboxes[i], holder, now=self.now)
        assert got == expected, f"acquire({i}, {holder}) = {got}, model says {expected}"
        event(f"acquire: {'refused' if got is None else 'taken'}")
        if got is None:
            return
        lease.holder, lease.generation, lease.until = holder, got, self.now + self.ttl
        worker = self.workers.get((i, holder))
        if worker is not None and worker.generation != got:
            if worker.batch is not None:
                self.ghosts.append((i, holder, worker.generation, worker.batch))
            worker.generation, worker.batch = got, None
        elif worker is None:
            self.workers[(i, holder)] = Worker(got)

    @property
    def ttl(self):
        return timedelta(seconds=settings.ALWAYSON_LEASE_TTL)

    @precondition(lambda self: self.workers)
    @rule(data=st.data())
    def claim(self, data):
        (i, holder) = data.draw(st.sampled_from(sorted(self.workers)), label="worker")
        self.claim_as(i, holder)

    def claim_as(self, i, holder):
        worker = self.workers[(i, holder)]
        got = [e.pk for e in claim_batch(self.inboxes[i], holder, worker.generation, now=self.now)]
        # After the call: an orphan's jittered backoff is read from its row.
        expected = self.model_claim(i, holder, worker.generation)
        assert got == expected, f"claim_batch({i}, {holder}, gen {worker.generation}) = {got}"
        event(f"claim: {min(len(got), 2)} events")
        if worker.batch is not None:
            self.ghosts.append((i, holder, worker.generation, worker.batch))
        worker.batch = got

    def model_dead_alert(self, i, count):
        """The first events to go dead after a quiet interval queue one alert at once,
        bringing along those counted since; within the interval they are only counted."""
        last = self.last_alert[i]
        interval = timedelta(seconds=settings.ALWAYSON_DEAD_ALERT_INTERVAL)
        if last is None or self.now - last >= interval:
            self.alerts[i] += 1
            self.last_alert[i], self.unreported[i] = self.now, 0
        else:
            self.unreported[i] += count

    def model_claim(self, i, holder, generation):
        if not self.leases[i].is_held_by(holder, generation, self.now):
            return []
        events = self.inbox_events(i)
        for e in events:
            if e.status == RUNNING and e.claim_gen < generation:
                e.status = PENDING
                self.adopt_backoff(e, e.updated)
                e.updated = self.now
        going_dead = 0
        for e in events:
            if e.status == PENDING and e.attempts >= settings.ALWAYSON_MAX_ATTEMPTS:
                e.status, e.updated = DEAD, self.now
                going_dead += 1
        if going_dead:
            self.model_dead_alert(i, going_dead)
        due = [e for e in events if e.status == PENDING and e.available_at <= self.now]
        retries = [e for e in due if e.attempts > 0]
        chosen = retries[:1] or due
        for e in chosen:
            e.status, e.attempts, e.claim_gen, e.updated = (
                RUNNING,
                e.attempts + 1,
                generation,
                self.now,
            )
        return [e.pk for e in chosen]

    outcomes = st.sampled_from(("done", "error", "defer"))
    effects = st.tuples(
        # Messages said, urgent or not. sampled_from, not lists(): hypothesis favours small
        # values, and an empty list in most runs would leave the outbox idle.
        st.sampled_from(((), (False,), (True,), (False, False), (False, True))),
        st.sampled_from((None, *REQUESTS)),  # an approval asked
        st.sampled_from((60, 600, 7200)),  # its expiry, seconds
        st.sampled_from((0, 60, 600)),  # a deferral's delay, seconds
    )

    @precondition(
        lambda self: self.ghosts or any(w.batch is not None for w in self.workers.values())
    )
    @rule(data=st.data(), outcome=outcomes, effects=effects)
    def finish_run(self, data, outcome, effects):
        """A worker finishes its claim; or a stalled worker wakes up and finishes a claim it
        no longer owns, or one it finished already; or a finish names an older generation."""
        running = sorted(k for k, w in self.workers.items() if w.batch is not None)
        ways = ["current"] * bool(running) + ["late", "older generation"] * bool(self.ghosts)
        way = data.draw(st.sampled_from(ways), label="way")
        event(f"finish by {way}")
        if way == "current":
            i, holder = data.draw(st.sampled_from(running), label="worker")
            self.finish_as(i, holder, outcome, effects)
            return
        i, holder, generation, ids = data.draw(st.sampled_from(self.ghosts), label="ghost")
        if way == "older generation":
            generation -= 1
        self.check_finish(i, holder, generation, ids, outcome, effects)

    def finish_as(self, i, holder, outcome, effects):
        worker = self.workers[(i, holder)]
        self.check_finish(i, holder, worker.generation, worker.batch, outcome, effects)
        # Kept as a ghost: a second finish of the same claim must be refused.
        self.ghosts.append((i, holder, worker.generation, worker.batch))
        worker.batch = None

    @rule(
        i=st.sampled_from(INBOXES),
        holder=st.sampled_from(HOLDERS),
        outcome=outcomes,
        effects=effects,
    )
    def worker_turn(self, i, holder, outcome, effects):
        """One whole turn of the worker loop: take (or renew) the lease, claim unless a claim
        is in hand, finish. The separate rules above interleave these steps; this one keeps
        complete runs frequent (retries to the dead state, sends inside the gap) however
        hypothesis mixes and swarm-disables the rules. The holder of a live lease takes the
        turn, as the worker that holds it would; `holder` only when the lease is free."""
        lease = self.leases[i]
        if not lease.is_free(self.now):
            holder = lease.holder
        self.take_lease(i, holder)
        worker = self.workers.get((i, holder))
        if worker is None or not self.leases[i].is_held_by(holder, worker.generation, self.now):
            return
        if worker.batch is None:
            self.claim_as(i, holder)
        self.finish_as(i, holder, outcome, effects)

    @precondition(lambda self: self.workers)
    @rule(data=st.data())
    def crash(self, data):
        """A worker that just stops: no finish, no release. Its claim waits for a takeover."""
        key = data.draw(st.sampled_from(sorted(self.workers)), label="worker")
        del self.workers[key]
        event("crash")

    def check_finish(self, i, holder, generation, ids, outcome, effects):
        urgent_flags, request_id, expires_in, defer_delay = effects
        inbox_pk = self.inbox_pk(i)
        run_effects = [
            Say(inbox_pk, f"said {self.said + n}", urgent=urgent)
            for n, urgent in enumerate(urgent_flags)
        ]
        if request_id is not None:
            run_effects.append(
                Ask(inbox_pk, request_id, f"refund {request_id}", timedelta(seconds=expires_in))
            )
        lease_row = Lease.objects.get(inbox_id=inbox_pk)
        fenced_off = not lease_row.is_held_by(holder, generation, self.now)
        claimed = all(
            self.by_pk(pk).status == RUNNING and self.by_pk(pk).claim_gen == generation
            for pk in ids
        )
        expected = self.leases[i].is_held_by(holder, generation, self.now) and claimed
        before = snapshot()

        ending = {
            "error": lambda: Failed("it broke"),
            "defer": lambda: Defer("later", delay=timedelta(seconds=defer_delay)),
        }.get(outcome, Done)()

        def run_finish():
            return finish(
                Held(self.inboxes[i], holder, generation, ids),
                run_effects,
                ending,
                now=self.now,
            )

        if expected and outcome != "error" and self.answered(i, request_id):
            # A request id names one request for good: asking one that has its answer fails
            # the finish past the fence (a bad effect), and nothing of the run is written.
            with pytest.raises(ValueError, match=f"request_id '{request_id}' was answered"):
                run_finish()
            assert snapshot() == before, "a failed finish wrote something"
            event("finish failed: the request id was answered")
            return
        ok = run_finish()
        # The fence, read from the lease row itself: only the holder's current generation.
        if fenced_off:
            assert ok is False, f"finish by {holder} gen {generation} passed the fence"
        assert ok is expected, f"finish({i}, {holder}, gen {generation}, {ids}) = {ok}"
        event(f"finish {outcome}: {'accepted' if ok else 'refused'}")
        if not ok:
            assert snapshot() == before, "a refused finish wrote something"
            return
        for pk in ids:
            e = self.by_pk(pk)
            if outcome == "done":
                e.status = DONE
            elif outcome == "error":
                e.status = PENDING
                self.adopt_backoff(e, self.now)
            else:
                e.status = PENDING
                e.available_at = self.now + timedelta(seconds=defer_delay)
                e.attempts = max(e.attempts - 1, 0)
            e.updated = self.now
        if outcome == "error":
            return
        self.said += len(urgent_flags)
        self.held[i].extend(urgent_flags)
        if request_id is not None and (i, request_id) not in self.approvals:
            expires_at = clock.whole_seconds(self.now + timedelta(seconds=expires_in))
            self.approvals[(i, request_id)] = {"expires_at": expires_at, "stands": None}
            self.timers[(i, f"expire:{request_id}")] = ModelTimer(
                expires_at, None, ("approval", request_id)
            )

    @rule(
        i=st.sampled_from(INBOXES),
        key=st.sampled_from(TIMER_KEYS),
        offset=st.sampled_from((-600, 0, 60, 3600)),
        every=st.sampled_from((None, 300, 3600)),
    )
    def register_timer(self, i, key, offset, every):
        due = self.now + timedelta(seconds=offset)
        add_timer(self.inboxes[i], key, due, {"timer": key}, every=every, now=self.now)
        self.timers[(i, key)] = ModelTimer(due, every)

    @precondition(lambda self: self.fired)
    @rule(data=st.data())
    def replay_timer(self, data):
        """A deploy re-registers a timer at an occurrence that already fired."""
        i, key = data.draw(st.sampled_from(sorted(self.fired)), label="timer")
        due = data.draw(st.sampled_from(sorted(self.fired[(i, key)])), label="occurrence")
        every = self.timers[(i, key)].every
        event("timer replayed")
        add_timer(self.inboxes[i], key, due, {"timer": key}, every=every, now=self.now)
        self.timers[(i, key)] = ModelTimer(due, every)

    @precondition(lambda self: self.timers)
    @rule(replay=st.booleans())
    def scheduler_pass(self, replay):
        at = self.last_pass if replay and self.last_pass is not None else self.now
        due = [(k, t) for k, t in sorted(self.timers.items()) if not t.done and t.due <= at]
        handled = run_scheduler(now=at)
        assert handled == len(due), f"run_scheduler at {at} handled {handled}, not {len(due)}"
        event(f"scheduler: {min(handled, 2)} timers")
        self.last_pass = at
        for (i, key), timer in due:
            if timer.every:
                count = int((at - timer.due).total_seconds()) // timer.every + 1
                occurrence = timer.due + timedelta(seconds=(count - 1) * timer.every)
                timer.due = occurrence + timedelta(seconds=timer.every)
            else:
                occurrence = timer.due
                timer.done = True
            if timer.event_key is not None:
                self.settle_approval(i, timer.event_key[1], "expired", at)
                continue
            self.fired[(i, key)].add(occurrence)
            self.stored(i, "timer", f"{key}@{clock.occurrence_label(occurrence)}", at)

    @precondition(lambda self: self.approvals)
    @rule(data=st.data(), answer=st.sampled_from(("yes", "no")))
    def answer(self, data, answer):
        asked = sorted(self.approvals)
        i, request_id = data.draw(st.sampled_from([*asked, (0, "never-asked")]), label="request")
        approval = self.approvals.get((i, request_id))
        if approval is None:
            expected = "unknown"
        elif approval["stands"] is not None:
            expected = approval["stands"]
        elif self.now >= approval["expires_at"]:
            expected = "expired"
        else:
            expected = answer
        got = answer_approval(self.inboxes[i], request_id, answer, now=self.now).stands
        assert got == expected, f"answer {answer} to {request_id} at {self.now} = {got}"
        event(f"answer: {got}")
        if approval is not None:
            self.settle_approval(i, request_id, expected, self.now)

    @precondition(lambda self: any(self.held.values()))
    @rule()
    def dispatch_pass(self):
        deliveries = []
        expected = 0
        for i in INBOXES:
            held = self.held[i]
            last = self.last_send[i]
            gap = timedelta(seconds=settings.ALWAYSON_OUTBOX_GAP)
            if held and (last is None or self.now - last >= gap or any(held)):
                expected += len(held)
                self.held[i], self.last_send[i] = [], self.now
        sent = dispatch(send=deliveries.append, now=self.now)
        assert sent == expected, f"dispatch at {self.now} sent {sent}, model says {expected}"
        event(f"dispatch: {'sent' if sent else 'nothing'}")
        for delivery in deliveries:
            i = next(i for i in INBOXES if self.inbox_pk(i) == delivery.inbox.pk)
            self.sends.append(
                (
                    i,
                    self.now,
                    [m.pk for m in delivery.messages],
                    [m.urgent for m in delivery.messages],
                )
            )

    # --- invariants, against the database ---------------------------------------------------

    @invariant()
    def the_articles_invariants_hold(self):
        """Checked after every step. The tables are read once (a handful of queries per step,
        where one query per check made the run twice as slow); each check below is one of the
        article's rules, and its assertion names it."""
        events = list(
            Event.objects.values_list(
                "pk",
                "inbox_id",
                "source",
                "source_id",
                "payload",
                "status",
                "attempts",
                "claim_gen",
                "available_at",
            )
        )
        one_event_per_key(events)
        attempts_stay_within_the_maximum(events)
        a_timer_occurrence_is_one_event(events)
        one_answer_per_approval(
            events, Approval.objects.values_list("inbox_id", "request_id", "answer")
        )
        sent = OutboxMessage.objects.filter(sent_at__isnull=False)
        the_outbox_keeps_its_gap_unless_urgent(
            sent.values_list("inbox_id", "sent_at", "urgent"), self.sends
        )
        leases = {
            row[0]: row[1:]
            for row in Lease.objects.values_list(
                "inbox_id", "holder", "generation", "until", "work_at"
            )
        }
        claimable_work_is_never_hidden(events, leases)
        self.the_tables_match_the_model(events, leases)

    def the_tables_match_the_model(self, events, leases):
        pks = {i: self.inbox_pk(i) for i in INBOXES}
        rows = {
            (inbox_id, source, source_id): tuple(row)
            for _, inbox_id, source, source_id, _, *row in events
        }
        model = {
            (pks[i], source, source_id): (e.status, e.attempts, e.claim_gen, e.available_at)
            for (i, source, source_id), e in self.events.items()
        }
        assert rows == model, f"events differ from the model (row, model): {_diff(rows, model)}"
        held = defaultdict(list)
        for inbox_id, urgent in (
            OutboxMessage.objects.held().order_by("id").values_list("inbox_id", "urgent")
        ):
            held[inbox_id].append(urgent)
        alerts = Counter(
            Notice.objects.filter(topic__startswith="dead-events:").values_list(
                "inbox_id", flat=True
            )
        )
        for i in INBOXES:
            mine = self.leases[i]
            assert leases[pks[i]][:3] == (mine.holder, mine.generation, mine.until), (
                f"lease of inbox {i}: {leases[pks[i]][:3]}, model {mine}"
            )
            assert held[pks[i]] == self.held[i], (
                f"inbox {i} holds {held[pks[i]]}, model {self.held[i]}"
            )
            assert alerts[pks[i]] == self.alerts[i], (
                f"inbox {i} has {alerts[pks[i]]} dead-event alerts, model {self.alerts[i]}"
            )


def one_event_per_key(events):
    keys = Counter((inbox_id, source, source_id) for _, inbox_id, source, source_id, *_ in events)
    assert all(n == 1 for n in keys.values()), f"a key stored twice: {keys.most_common(1)}"


def attempts_stay_within_the_maximum(events):
    limit = settings.ALWAYSON_MAX_ATTEMPTS
    for pk, *_, status, attempts, _, _ in events:
        assert attempts <= limit, f"event {pk} {status} after {attempts} attempts"
        if status == DEAD:
            assert attempts >= limit, f"event {pk} dead after {attempts} attempts"
        if status == RUNNING:
            assert attempts >= 1, f"event {pk} running without a counted attempt"


def a_timer_occurrence_is_one_event(events):
    """Grouped by the timer and the occurrence in the payload, not by the event key, so an
    occurrence stored under a second key counts twice."""
    occurrences = Counter(
        (inbox_id, payload.get("timer"), payload.get("scheduled_for"))
        for _, inbox_id, source, _, payload, *_ in events
        if source == "timer"
    )
    assert all(n == 1 for n in occurrences.values()), (
        f"a timer occurrence stored twice: {occurrences.most_common(1)}"
    )


def one_answer_per_approval(events, approvals):
    answers = Counter(
        (inbox_id, source_id)
        for _, inbox_id, source, source_id, *_ in events
        if source == "approval"
    )
    assert all(n == 1 for n in answers.values()), f"two answers: {answers.most_common(1)}"
    stored = {
        (inbox_id, source_id): payload["answer"]
        for _, inbox_id, source, source_id, payload, *_ in events
        if source == "approval"
    }
    for inbox_id, request_id, answer in approvals:
        assert answer == stored.get((inbox_id, request_id), ""), (
            f"approval {request_id}: its row says {answer!r}, the answer that stands is"
            f" {stored.get((inbox_id, request_id))!r}"
        )


def the_outbox_keeps_its_gap_unless_urgent(sent_rows, deliveries):
    gap = timedelta(seconds=settings.ALWAYSON_OUTBOX_GAP)
    sends = defaultdict(lambda: defaultdict(list))
    for inbox_id, sent_at, urgent in sent_rows:
        sends[inbox_id][sent_at].append(urgent)
    for inbox_id, by_time in sends.items():
        times = sorted(by_time)
        for previous, at in zip(times, times[1:], strict=False):
            assert at - previous >= gap or any(by_time[at]), (
                f"inbox {inbox_id} sent at {at}, {at - previous} after its last send,"
                " with nothing urgent"
            )
    delivered = Counter(pk for *_, pks, _ in deliveries for pk in pks)
    assert all(n == 1 for n in delivered.values()), "a message was delivered twice"


def claimable_work_is_never_hidden(events, leases):
    """Lease.work_at is where workers look for work: never later than the first pending
    event's time, or that event waits for nobody."""
    first = {}
    for _, inbox_id, *_, status, _, _, available_at in events:
        if status == PENDING:
            first[inbox_id] = min(first.get(inbox_id, available_at), available_at)
    for inbox_id, at in first.items():
        work_at = leases[inbox_id][3]
        assert work_at is not None and work_at <= at, (
            f"inbox {inbox_id}: work_at {work_at}, but an event is claimable from {at}"
        )


def _diff(rows, model):
    keys = sorted(set(rows) | set(model), key=str)
    return {k: (rows.get(k), model.get(k)) for k in keys if rows.get(k) != model.get(k)}
