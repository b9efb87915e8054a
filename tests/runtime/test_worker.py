"""The worker: Worker.step, its one-line log, and the runworker and deadletters commands.

Worker.step uses the database's clock, so events here are ingested with `now=None`. The
runworker tests run the real command in-process: its slots are threads with their own
connections, so those tests commit their data (transaction=True).
"""

import logging
import re
import signal
import threading
from datetime import timedelta
from io import StringIO
from types import SimpleNamespace

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from alwayson.ops import database as database_module
from alwayson.ops.database import DatabaseUnusable
from alwayson.ops.models import Process
from alwayson.runtime import loop as loop_module
from alwayson.runtime.api import (
    acquire,
    answer_approval,
    claim_batch,
    ingest,
    request_approval,
)
from alwayson.runtime.loop import LoopCommand
from alwayson.runtime.management.commands import runscheduler
from alwayson.runtime.worker import Worker, WorkerPool
from approvals.models import Approval
from inbox.models import Event, Lease, RunRecord, Session
from inbox.services import mark_dead
from outbox.models import OutboxMessage
from timers.models import Timer

SECOND = timedelta(seconds=1)
ECHO = "tests.support.agents.worker_echo_agent"


def lease(inbox):
    return Lease.objects.get(inbox=inbox)


def statuses(inbox):
    return list(Event.objects.filter(inbox=inbox).order_by("id").values_list("source_id", "status"))


class Recorder:
    """An agent that records each batch and says one message per run."""

    def __init__(self):
        self.batches = []

    def __call__(self, run):
        self.batches.append(
            (run.inbox.slug, [(e.source_id, e.payload, e.attempts) for e in run.events])
        )
        run.say(f"{len(run.events)} event(s)")


@pytest.fixture
def worker_log(caplog, monkeypatch):
    """The worker's log records. The "alwayson" logger does not propagate (it has its own
    console handler); let it reach caplog's handler on the root logger for the test."""
    monkeypatch.setattr(logging.getLogger("alwayson"), "propagate", True)
    caplog.set_level(logging.INFO, logger="alwayson.worker")
    return caplog


@pytest.fixture
def keep_signal_handlers():
    """runworker installs SIGTERM/SIGINT handlers; give pytest its own back afterwards."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def listed_rows(output):
    """The tab-separated rows of a listing, without indentation."""
    return [tuple(line.strip().split("\t")) for line in output.splitlines() if "\t" in line]


def runworker(*args):
    out = StringIO()
    call_command("runworker", *args, stdout=out, stderr=out)
    return out.getvalue()


# --- Worker.step -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_step_returns_none_when_no_inbox_has_work(make_inbox):
    idle = make_inbox()
    agent = Recorder()

    assert Worker("w1", agent).step() is None

    assert agent.batches == []
    held = lease(idle)
    assert (held.holder, held.generation, held.until, held.work_at) == ("", 0, None, None)


@pytest.mark.django_db
def test_step_returns_none_while_the_only_inbox_with_work_is_held(inbox):
    ingest(inbox, "chat", "m1", {})
    gen = acquire(inbox, "other")

    assert Worker("w1", Recorder()).step() is None
    assert (lease(inbox).holder, lease(inbox).generation) == ("other", gen)
    assert statuses(inbox) == [("m1", "pending")]


@pytest.mark.django_db
def test_step_runs_one_inbox_per_step(make_inbox):
    a, b = make_inbox("a"), make_inbox("b")
    ingest(a, "chat", "a1", {})
    ingest(b, "chat", "b1", {})
    ingest(a, "chat", "a2", {})
    agent = Recorder()
    worker = Worker("w1", agent)

    first = worker.step()
    assert (first.inbox, first.events) == ("a", 2)
    assert statuses(a) == [("a1", "done"), ("a2", "done")]
    assert statuses(b) == [("b1", "pending")]

    second = worker.step()
    assert (second.inbox, second.events) == ("b", 1)
    assert statuses(b) == [("b1", "done")]

    assert worker.step() is None
    assert [slug for slug, _ in agent.batches] == ["a", "b"]


@pytest.mark.django_db
def test_events_of_one_inbox_run_in_one_batch_oldest_first(inbox):
    for source_id, text in [("c", "third?"), ("a", "first"), ("b", "second")]:
        ingest(inbox, "chat", source_id, {"text": text})
    agent = Recorder()

    result = Worker("w1", agent).step()

    assert agent.batches == [
        (
            "desk",
            [
                ("c", {"text": "third?"}, 1),
                ("a", {"text": "first"}, 1),
                ("b", {"text": "second"}, 1),
            ],
        )
    ]
    assert (result.events, result.outcome) == (3, "said 1")
    assert statuses(inbox) == [("c", "done"), ("a", "done"), ("b", "done")]
    assert list(OutboxMessage.objects.values_list("body", flat=True)) == ["3 event(s)"]


@pytest.mark.django_db
def test_step_releases_the_lease_after_the_run(inbox):
    ingest(inbox, "chat", "m1", {})

    result = Worker("w1", Recorder()).step()

    held = lease(inbox)
    assert (held.holder, held.generation, held.until) == ("w1", result.generation, None)
    assert result.generation == 1
    assert held.work_at is None  # nothing left to do


@pytest.mark.django_db
def test_next_step_on_the_same_inbox_starts_a_new_generation(inbox):
    worker = Worker("w1", Recorder())
    ingest(inbox, "chat", "m1", {})
    assert worker.step().generation == 1
    ingest(inbox, "chat", "m2", {})

    second = worker.step()

    assert second.generation == 2
    assert Event.objects.get(source_id="m2").claim_gen == 2
    assert (lease(inbox).generation, lease(inbox).until) == (2, None)


@pytest.mark.django_db
def test_quiet_run_finishes_without_a_message(inbox):
    ingest(inbox, "chat", "m1", {})

    result = Worker("w1", lambda run: None).step()

    assert result.outcome == "quiet"
    assert statuses(inbox) == [("m1", "done")]
    assert not OutboxMessage.objects.exists()


@pytest.mark.django_db
def test_effect_failing_at_finish_puts_the_events_back_with_finish_failed(inbox):
    Session.objects.filter(inbox=inbox).update(state={"keep": 1})
    ingest(inbox, "chat", "m1", {})

    def agent(run):
        run.say("asking", urgent=True)
        run.ask("refund-1", "refund order 1", 60)
        run.ask("refund-1", "refund order 2", 60)  # valid alone; conflicts at finish
        run.state["keep"] = 2

    result = Worker("w1", agent).step()

    assert result.outcome.startswith("error: ValueError: request_id 'refund-1' was already used")
    row = Event.objects.get(source_id="m1")
    assert (row.status, row.attempts) == ("pending", 1)
    assert row.error.startswith("finish failed: ")
    assert "already used for 'refund order 1'" in row.error
    assert row.available_at > row.updated  # counts as a failed attempt, with its backoff
    assert not OutboxMessage.objects.exists()
    assert not Approval.objects.exists()
    assert not Timer.objects.exists()
    assert Session.objects.get(inbox=inbox).state == {"keep": 1}
    assert lease(inbox).until is None


@pytest.mark.django_db
def test_an_agent_asking_an_answered_request_id_again_fails_its_run_naming_the_id(inbox):
    """Not "asked 1" with no new card and no answer to come: an agent that builds its ids
    from the order alone, after the README's walkthrough answered refund-881."""
    request_approval(inbox, "refund-881", "refund order 881", timedelta(hours=4))
    answer_approval(inbox, "refund-881", "yes")
    ingest(inbox, "chat", "m2", {"text": "refund 881"})

    def agent(run):
        run.ask("refund-881", "refund order 881", timedelta(hours=4))
        run.say("Refund order 881? I have asked for approval.")

    result = Worker("w1", agent).step()

    assert result.outcome.startswith(
        "error: ValueError: request_id 'refund-881' was answered already (yes)"
    )
    row = Event.objects.get(source_id="m2")
    assert (row.status, row.attempts) == ("pending", 1)
    assert 'run.ask("refund-881"' in row.error  # the agent's own line
    assert not OutboxMessage.objects.exists()
    assert list(Approval.objects.values_list("request_id", "answer")) == [("refund-881", "yes")]


@pytest.mark.django_db
def test_each_run_logs_one_line(inbox, worker_log):
    ingest(inbox, "chat", "m1", {})
    ingest(inbox, "chat", "m2", {})

    Worker("w1", Recorder()).step()

    lines = [r.getMessage() for r in worker_log.records if r.name == "alwayson.worker"]
    assert len(lines) == 1
    assert re.fullmatch(
        r"run inbox=desk gen=1 events=2 outcome=done \(said 1\) duration=\d+\.\d{3}s", lines[0]
    ), lines


@pytest.mark.django_db
def test_failed_run_logs_its_outcome(inbox, worker_log):
    ingest(inbox, "chat", "m1", {})

    def agent(run):
        raise KeyError("missing")

    Worker("w1", agent).step()

    runs = [r.getMessage() for r in worker_log.records if r.getMessage().startswith("run ")]
    assert len(runs) == 1
    assert re.fullmatch(
        r"run inbox=desk gen=1 events=1 outcome=error \(KeyError: 'missing'\) duration=\S+s",
        runs[0],
    ), runs
    assert any(r.levelno == logging.WARNING for r in worker_log.records)


def says(run):
    run.say("Done")


def stays_quiet(run):
    pass


def raises(run):
    raise ValueError("refund 881 failed")


def defers(run):
    run.defer("budget spent", delay=60)


def is_fenced_off(run):
    run.mark_lost()
    run.renew()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("agent", "word", "detail"),
    [
        (says, "done", "said 1"),
        (stays_quiet, "done", "said nothing"),
        (raises, "error", "ValueError: refund 881 failed"),
        (defers, "deferred", "budget spent"),
        (is_fenced_off, "refused", "fenced off mid-run"),
    ],
    ids=lambda value: getattr(value, "__name__", None),
)
def test_a_run_logs_the_outcome_its_record_and_the_pages_show(
    inbox, worker_log, agent, word, detail
):
    ingest(inbox, "chat", "m1", {})

    result = Worker("w1", agent).step()

    record = RunRecord.objects.get(inbox=inbox, generation=result.generation)
    assert record.outcome == word  # the run page's badge: record.get_outcome_display()
    [line] = [r.getMessage() for r in worker_log.records if r.getMessage().startswith("run ")]
    assert f" outcome={word} ({detail}) " in line, line


# --- runworker -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_runworker_once_drains_every_inbox_and_exits(make_inbox, keep_signal_handlers):
    inboxes = [make_inbox(f"box-{n}") for n in range(3)]
    for inbox in inboxes:
        ingest(inbox, "chat", "m1", {"text": f"{inbox.slug} first"})
        ingest(inbox, "chat", "m2", {"text": f"{inbox.slug} second"})

    runworker("--once", "--agent", ECHO, "--worker-id", "test-worker")

    assert set(Event.objects.values_list("status", flat=True)) == {"done"}
    bodies = sorted(OutboxMessage.objects.values_list("body", flat=True))
    assert bodies == [f"echo: box-{n} first | box-{n} second" for n in range(3)]
    for inbox in inboxes:
        held = lease(inbox)
        assert (held.holder, held.generation, held.until, held.work_at) == (
            "test-worker",
            1,
            None,
            None,
        )


@pytest.mark.postgres_only  # SQLite's in-memory test database locks tables across threads
@pytest.mark.django_db(transaction=True)
def test_runworker_once_with_several_slots_runs_each_inbox_once(make_inbox, keep_signal_handlers):
    inboxes = [make_inbox(f"box-{n}") for n in range(4)]
    for inbox in inboxes:
        ingest(inbox, "chat", "m1", {"text": inbox.slug})

    runworker("--once", "--concurrency", "2", "--agent", ECHO, "--worker-id", "slots")

    assert set(Event.objects.values_list("status", "attempts")) == {("done", 1)}
    assert sorted(OutboxMessage.objects.values_list("body", flat=True)) == [
        f"echo: box-{n}" for n in range(4)
    ]


@pytest.mark.django_db(transaction=True)
def test_runworker_max_runs_stops_after_that_many_runs(make_inbox, keep_signal_handlers):
    inboxes = [make_inbox(f"box-{n}") for n in range(3)]
    for inbox in inboxes:
        ingest(inbox, "chat", "m1", {"text": inbox.slug})

    runworker("--max-runs", "2", "--interval", "0.05", "--agent", ECHO, "--worker-id", "w2")

    # Oldest work first: the first two inboxes ran, the third waits untouched.
    assert [statuses(inbox) for inbox in inboxes] == [
        [("m1", "done")],
        [("m1", "done")],
        [("m1", "pending")],
    ]
    assert OutboxMessage.objects.count() == 2
    last = lease(inboxes[2])
    assert (last.holder, last.generation, last.until) == ("", 0, None)


@pytest.mark.django_db(transaction=True)
def test_runworker_max_runs_counts_only_runs_that_ran(make_inbox, keep_signal_handlers):
    empty, busy = make_inbox("empty"), make_inbox("busy")
    ingest(busy, "chat", "m1", {"text": "hello"})
    # A lease that says work is due where nothing is claimable (a race or a crash leaves one):
    # the worker takes it first, its claim finds nothing, and that is not a run.
    Lease.objects.filter(inbox=empty).update(work_at=timezone.now() - timedelta(hours=1))

    runworker("--max-runs", "1", "--interval", "0.05", "--agent", ECHO, "--worker-id", "w1")

    assert statuses(busy) == [("m1", "done")]
    assert list(OutboxMessage.objects.values_list("body", flat=True)) == ["echo: hello"]
    assert lease(empty).work_at is None


BAD_FLAGS = [
    (["--concurrency", "0"], "concurrency"),
    (["--interval", "0"], "interval"),
    (["--interval", "-1"], "interval"),
    (["--max-runs", "0"], "--max-runs"),
    (["--agent", "no.such.module.agent"], "cannot import"),
    (["--agent", "alwayson.demo.refund_desk.APPROVAL_WINDOW"], "not callable"),
]


@pytest.mark.django_db(transaction=True)  # one test for all: each flush costs on PostgreSQL
def test_runworker_bad_flags_raise_command_error_and_run_nothing(inbox, keep_signal_handlers):
    ingest(inbox, "chat", "m1", {"text": "refund order 1"})

    for args, message in BAD_FLAGS:
        with pytest.raises(CommandError, match=message):
            runworker("--once", *args)

        assert statuses(inbox) == [("m1", "pending")], args
        held = lease(inbox)
        assert (held.holder, held.generation, held.until) == ("", 0, None), args
        assert not OutboxMessage.objects.exists(), args


# --- deadletters -----------------------------------------------------------------------------


@pytest.fixture
def dead_events(make_inbox, t0, ttl):
    """A poison event dead after three crashed claims, and one parked by hand."""
    a, b = make_inbox("alpha"), make_inbox("beta")
    ingest(a, "webhook", "poison-1", {}, now=t0)
    ingest(b, "chat", "parked-1", {}, now=t0)
    ingest(b, "chat", "alive-1", {}, now=t0)
    now = t0
    for n in range(4):
        gen = acquire(a, f"W{n}", now=now)
        claim_batch(a, f"W{n}", gen, now=now)  # crashes every time
        now += ttl + 60 * SECOND
    mark_dead([Event.objects.get(source_id="parked-1").pk], "operator: bad payload", now=now)
    return Event.objects.get(source_id="poison-1"), Event.objects.get(source_id="parked-1")


@pytest.mark.django_db
def test_deadletters_lists_dead_events(dead_events):
    poison, parked = dead_events
    out = StringIO()

    call_command("deadletters", stdout=out)

    assert poison.status == "dead"
    assert poison.error.startswith("too many attempts (3); last error: worker lost its lease")
    assert listed_rows(out.getvalue()) == [
        (str(poison.pk), "alpha", "webhook", "poison-1", "3", poison.error),
        (str(parked.pk), "beta", "chat", "parked-1", "0", "operator: bad payload"),
    ]
    assert "2 dead event(s)" in out.getvalue()


@pytest.mark.django_db
def test_deadletters_lists_an_event_dead_of_a_traceback_on_one_line(dead_events):
    poison, _ = dead_events
    Event.objects.filter(pk=poison.pk).update(
        error="Traceback (most recent call last):\n  File \"agent.py\", line 3\nKeyError: 'order'"
    )
    out = StringIO()

    call_command("deadletters", "--inbox", "alpha", stdout=out)

    assert listed_rows(out.getvalue()) == [
        (str(poison.pk), "alpha", "webhook", "poison-1", "3", "KeyError: 'order'"),
    ]


@pytest.mark.django_db
def test_deadletters_lists_one_inbox(dead_events):
    _, parked = dead_events
    out = StringIO()

    call_command("deadletters", "--inbox", "beta", stdout=out)

    assert listed_rows(out.getvalue()) == [
        (str(parked.pk), "beta", "chat", "parked-1", "0", "operator: bad payload"),
    ]
    assert "1 dead event(s)" in out.getvalue()


@pytest.mark.django_db
def test_deadletters_requeue_puts_events_back_with_attempts_reset(dead_events):
    poison, parked = dead_events
    out = StringIO()

    call_command("deadletters", "--requeue", str(poison.pk), str(parked.pk), stdout=out)

    assert out.getvalue().strip() == "requeued 2 event(s)"
    rows = Event.objects.filter(pk__in=[poison.pk, parked.pk]).order_by("id")
    assert list(rows.values_list("status", "attempts", "claim_gen", "error")) == [
        ("pending", 0, None, ""),
        ("pending", 0, None, ""),
    ]
    for slug in ("alpha", "beta"):
        assert Lease.objects.get(inbox__slug=slug).work_at is not None
    listed = StringIO()
    call_command("deadletters", stdout=listed)
    assert "0 dead event(s)" in listed.getvalue()
    assert listed_rows(listed.getvalue()) == []


@pytest.mark.django_db
@pytest.mark.parametrize("which", ["alive", "unknown"])
def test_deadletters_requeue_of_a_non_dead_id_raises_and_changes_nothing(dead_events, which):
    poison, _ = dead_events
    other = Event.objects.get(source_id="alive-1").pk if which == "alive" else 999_999
    before = list(Event.objects.order_by("id").values())
    leases = list(Lease.objects.order_by("inbox_id").values())

    with pytest.raises(CommandError, match=str(other)):
        call_command("deadletters", "--requeue", str(poison.pk), str(other), stdout=StringIO())

    assert list(Event.objects.order_by("id").values()) == before
    assert list(Lease.objects.order_by("inbox_id").values()) == leases
    assert Event.objects.get(pk=poison.pk).status == "dead"


# --- database outages --------------------------------------------------------------------------

# Seconds between retries while the database is unreachable: doubling from half a second, and
# never more than two, so a loop is back within two seconds of the database. No test sleeps:
# the stop event's wait records what it was asked and returns at once.
RETRIES = [0.5, 1.0, 2.0, 2.0, 2.0, 2.0]


class RecordedWaits(threading.Event):
    def __init__(self):
        super().__init__()
        self.asked = []

    def wait(self, timeout=None):
        self.asked.append(timeout)
        return self.is_set()


def outage(outcomes):
    """A step that plays `outcomes`: an exception is raised, anything else returned."""
    outcomes = iter(outcomes)

    def step():
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    return step


DOWN = DatabaseError("connection refused")


@pytest.mark.django_db  # the loops close and health-check their connection
def test_a_loop_command_is_back_within_two_seconds_of_the_database(
    monkeypatch, keep_signal_handlers
):
    stop = RecordedWaits()
    monkeypatch.setattr(loop_module, "threading", SimpleNamespace(Event=lambda: stop))
    command = LoopCommand()
    command.kind = "scheduler"
    # Six failures, one pass with work (the backoff starts over), two failures, then idle.
    command.step = outage([DOWN] * 6 + [True] + [DOWN] * 2 + [False])

    command.loop(once=True, interval=1.0, worker_id="outage-test")

    assert stop.asked == RETRIES + [0.5, 1.0]


@pytest.mark.django_db  # the loops close and health-check their connection
def test_a_worker_slot_is_back_within_two_seconds_of_the_database():
    pool = WorkerPool(agent=Recorder(), once=True)
    pool.stop = RecordedWaits()
    pool.worker.step = outage([DOWN] * 6 + [None])

    pool.slot()

    assert pool.stop.asked == RETRIES


@pytest.mark.django_db  # the loops close and health-check their connection
def test_the_listen_connection_is_back_within_two_seconds_of_the_database(monkeypatch):
    import psycopg

    pool = WorkerPool(agent=Recorder())
    pool.stop = RecordedWaits()
    attempts = []

    def connect(**conninfo):
        attempts.append(conninfo)
        if len(attempts) == len(RETRIES):
            pool.stop.set()
        raise psycopg.OperationalError("connection refused")

    monkeypatch.setattr(psycopg, "connect", connect)

    pool.listen()

    assert pool.stop.asked == RETRIES


# --- a database the loops cannot use ------------------------------------------------------------


def missing_table_error():
    """What this database raises for a statement naming a table it does not have."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM alwayson_no_such_table")
    except DatabaseError as exc:
        return exc
    raise AssertionError("alwayson_no_such_table exists")


@pytest.mark.django_db  # the loops close and health-check their connection
def test_a_loop_command_exits_at_a_table_the_database_lacks_where_an_outage_is_retried(
    monkeypatch, keep_signal_handlers
):
    """As when a database that was down at start-up comes back never migrated."""
    stop = RecordedWaits()
    monkeypatch.setattr(loop_module, "threading", SimpleNamespace(Event=lambda: stop))
    # Down at start-up, the start-up check could not look (check_database lets an outage by).
    monkeypatch.setattr(loop_module, "check_database", lambda: None)
    # What `migrate` would apply to it (the test database has every migration applied).
    monkeypatch.setattr(
        database_module, "unapplied_migrations", lambda using: ["inbox.0001_initial", "x.0002"]
    )
    step = outage([DOWN, missing_table_error()])
    monkeypatch.setattr(runscheduler.Command, "step", lambda self: step())

    with pytest.raises(CommandError) as stopped:
        call_command("runscheduler", "--once")

    assert stop.asked == [0.5]  # the outage's one retry; none for the missing table
    message = str(stopped.value)
    assert message.startswith(
        "the database has 2 unapplied migrations (from inbox.0001_initial):"
        " run `python manage.py migrate` ("
    )
    assert "alwayson_no_such_table" in message


@pytest.mark.django_db(transaction=True)  # the slots are threads with their own connections
def test_a_worker_stops_every_slot_at_a_table_the_database_lacks():
    error = missing_table_error()
    pool = WorkerPool(agent=Recorder(), concurrency=2, worker_id="unusable-test")
    pool.stop = RecordedWaits()  # retries (were there any) take no time
    steps = []

    def step():
        steps.append(1)
        if len(steps) > 20:  # a pool that retried it forever: stop, and fail below
            pool.request_stop()
            return None
        raise error

    pool.worker.step = step

    with pytest.raises(DatabaseUnusable) as stopped:
        pool.run()

    assert len(steps) <= 2  # once per slot at most
    assert pool.stop.asked == []
    message = str(stopped.value)
    assert "alwayson_no_such_table" in message
    # Nothing for migrate to do: every migration is recorded as applied.
    assert message.endswith(
        "though `manage.py showmigrations` lists every migration as applied:"
        " was the schema changed by hand?"
    )
    # Not a clean stop: its Process row turns lost rather than stopped.
    assert Process.objects.get(worker_id="unusable-test").stopped is None
