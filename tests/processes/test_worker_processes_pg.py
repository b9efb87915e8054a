"""`runworker` as real processes on PostgreSQL: many workers, crashes, stalls, wake-ups, signals,
and a host clock that is off by minutes.

The workers are `python manage.py runworker` subprocesses on the pytest test database (the
tests commit their rows: `transaction=True`), running `tests.support.agents.recording_agent`, which
writes each run's start and end (database clock) and each side-effect attempt to two side
tables. Every wait is bounded by a deadline, and every subprocess is killed at teardown
(after a SIGCONT, in case it was stopped), before the database is flushed.
"""

import signal
import time
from collections import Counter, defaultdict
from datetime import timedelta

import pytest
from django.db import connection, transaction

from alwayson.demo.models import Refund
from inbox import clock
from inbox.models import Event, Lease
from inbox.services import WORK_CHANNEL, Held, acquire, acquire_next, claim_batch, finish, ingest
from outbox.models import OutboxMessage
from tests.support.processes import wait_for
from tests.support.workers import START_TIMEOUT, _exited, effects, listening, make_inboxes, runs
from timers.models import Timer
from timers.services import add_timer, run_scheduler

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

SHORT_TTL = 2  # seconds: the lease in the crash and stall tests


# --- harness ---------------------------------------------------------------------------------


def wait_idle(worker, quiet=0.3):
    """Wait until every slot of the worker has found no work and gone to sleep: its database
    session is idle after an empty take (take_next's one statement), and has been for `quiet` s.
    The process heartbeat's session (its last statement on alwayson_process) is no slot."""

    def idle():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT state, query, clock_timestamp() - state_change > %s"
                " FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = %s AND query <> %s"
                " AND query NOT LIKE '%%alwayson_process%%'",
                [
                    timedelta(seconds=quiet),
                    f"alwayson-worker {worker.worker_id}"[:63],
                    f"LISTEN {WORK_CHANNEL}",
                ],
            )
            sessions = cursor.fetchall()
        return sessions and all(
            state == "idle" and "SKIP LOCKED" in query and quiet_enough
            for state, query, quiet_enough in sessions
        )

    wait_for(idle, START_TIMEOUT, f"{worker.worker_id} to go idle")


def blocking_payload(tmp_path, holder, **extra):
    """A payload whose run blocks in `holder` until the test creates the release file."""
    return {
        "started_file": str(tmp_path / "started"),
        "block_holder": holder,
        "release_file": str(tmp_path / "release"),
        **extra,
    }


def lease(inbox):
    return Lease.objects.get(inbox=inbox)


def done(events):
    return Event.objects.filter(pk__in=events, status=Event.Status.DONE).count() == len(events)


# --- 1. many processes, many inboxes ---------------------------------------------------------


def test_three_processes_serve_200_inboxes_without_overlap_or_duplicates(spawn, django_user_model):
    inboxes = make_inboxes(django_user_model, "load", 200)

    def send(inbox, n):  # each run sleeps 5 to 20 ms, to widen the windows
        ingest(inbox, "chat", f"e{n}", {"sleep": (5 + (inbox.pk * 7 + n) % 16) / 1000})

    # Three events per inbox wait before the workers start; the last two of each inbox arrive
    # while the workers drain, the fifth one group behind the fourth, so that many land in an
    # inbox whose lease is held.
    with transaction.atomic():
        for inbox in inboxes:
            for n in range(3):
                send(inbox, n)
    workers = [
        spawn(f"load-{n}", "--concurrency", "4", "--interval", "1", wait_listening=False)
        for n in range(3)
    ]
    for worker in workers:
        wait_for(lambda w=worker: listening(w) or _exited(w), START_TIMEOUT, "LISTEN")
        assert worker.alive(), worker.log()
    # Ten inboxes per transaction: one wake-up of the idle slots per commit, not per event.
    groups = [inboxes[n : n + 10] for n in range(0, len(inboxes), 10)]
    for fourth, fifth in zip([*groups, []], [[], *groups], strict=True):
        with transaction.atomic():
            for inbox in fourth:
                send(inbox, 3)
            for inbox in fifth:
                send(inbox, 4)
    total = 200 * 5
    wait_for(
        lambda: Event.objects.filter(status=Event.Status.DONE).count() == total,
        60,
        "every event to be done",
        period=0.1,
    )
    for worker in workers:
        assert worker.stop() == 0, worker.log()

    assert Event.objects.count() == total
    assert set(Event.objects.values_list("status", "attempts").distinct()) == {("done", 1)}

    recorded = runs()
    assert all(run["ended"] is not None for run in recorded)
    by_inbox = defaultdict(list)
    for run in recorded:
        by_inbox[run["inbox_id"]].append(run)
    assert set(by_inbox) == {inbox.pk for inbox in inboxes}
    for inbox_runs in by_inbox.values():
        for before, after in zip(inbox_runs, inbox_runs[1:], strict=False):
            assert before["ended"] <= after["started"], f"overlap: {before} and {after}"
            assert before["generation"] < after["generation"]

    # Each event was in exactly one run, and its side effect happened exactly once.
    claimed = Counter(pk for run in recorded for pk in run["event_ids"])
    assert sorted(claimed) == sorted(Event.objects.values_list("pk", flat=True))
    assert set(claimed.values()) == {1}
    attempts = effects()
    assert Counter(event_id for _, event_id, _ in attempts) == claimed
    assert all(fresh for _, _, fresh in attempts)
    assert Refund.objects.count() == total
    # Every run committed its one message; every lease was released on the way out.
    assert OutboxMessage.objects.count() == len(recorded)
    assert not Lease.objects.filter(until__isnull=False).exists()

    # Spread over the processes, and most inboxes served more than once.
    per_process = Counter(run["holder"] for run in recorded)
    assert len(per_process) > 1, per_process
    logged = sum(len(worker.runs_logged()) for worker in workers)
    assert logged == len(recorded)
    served = Counter(len(inbox_runs) for inbox_runs in by_inbox.values())
    assert sum(count for runs, count in served.items() if runs > 1) > 100, served
    print(f"{len(recorded)} runs; inboxes by number of runs: {dict(served)};", per_process)


# --- 2. a worker killed mid-run --------------------------------------------------------------


def test_sigkill_mid_run_is_taken_over_after_ttl_and_its_finish_is_refused(
    spawn, django_user_model, tmp_path
):
    env = {"ALWAYSON_LEASE_TTL": str(SHORT_TTL)}
    [inbox] = make_inboxes(django_user_model, "kill", 1)
    victim = spawn("kill-a", "--interval", "0.2", env=env)
    with transaction.atomic():  # visible at once: one run claims all three
        for n in range(3):
            ingest(inbox, "chat", f"e{n}", blocking_payload(tmp_path, "kill-a"))
    events = list(Event.objects.filter(inbox=inbox).values_list("pk", flat=True))
    wait_for((tmp_path / "started").exists, 15, "the run to start in kill-a")
    victim.send(signal.SIGKILL)
    assert victim.wait(5) == -signal.SIGKILL
    killed = lease(inbox)
    assert killed.holder == "kill-a" and killed.until is not None
    gen_a = killed.generation
    assert set(Event.objects.filter(pk__in=events).values_list("status", "claim_gen")) == {
        ("running", gen_a)
    }

    rescuer = spawn("kill-b", "--interval", "0.2", env=env)
    wait_for(lambda: done(events), 20, "the events to be done by kill-b")

    [first, *takeovers] = runs(inbox)
    assert (first["holder"], first["generation"], first["ended"]) == ("kill-a", gen_a, None)
    assert takeovers and {run["holder"] for run in takeovers} == {"kill-b"}
    # Taken over only once the killed lease had expired, under a newer generation.
    assert all(run["started"] > killed.until for run in takeovers)
    assert all(run["generation"] > gen_a for run in takeovers)
    # The retried events were claimed alone, each once, and finished once.
    assert sorted(pk for run in takeovers for pk in run["event_ids"]) == sorted(events)
    rows = Event.objects.filter(pk__in=events)
    assert {(e.status, e.attempts) for e in rows} == {("done", 2)}
    assert Counter(event_id for _, event_id, _ in effects()) == Counter(events)
    assert Refund.objects.count() == 3
    assert OutboxMessage.objects.filter(inbox=inbox).count() == len(takeovers)

    # The killed run's generation can finish nothing: not as its own holder, not as another,
    # not even after its holder took the lease again under a new generation.
    assert finish(Held(inbox, "kill-a", gen_a, events)) is False
    assert finish(Held(inbox, "kill-b", gen_a, events)) is False
    assert claim_batch(inbox, "kill-a", gen_a) == []
    assert rescuer.stop() == 0, rescuer.log()
    again = acquire(inbox, "kill-a")
    assert again is not None and again > gen_a
    assert finish(Held(inbox, "kill-a", gen_a, events)) is False
    assert {(e.status, e.attempts) for e in rows.all()} == {("done", 2)}
    assert OutboxMessage.objects.filter(inbox=inbox).count() == len(takeovers)


# --- 3. a worker stalled past its lease ------------------------------------------------------


def test_sigstop_past_the_lease_then_sigcont_is_fenced(spawn, django_user_model, tmp_path):
    env = {"ALWAYSON_LEASE_TTL": str(SHORT_TTL)}
    [inbox] = make_inboxes(django_user_model, "stall", 1)
    stalled = spawn("stall-a", "--interval", "0.2", env=env)
    ingest(inbox, "chat", "e0", blocking_payload(tmp_path, "stall-a"))
    [event] = Event.objects.filter(inbox=inbox)
    wait_for((tmp_path / "started").exists, 15, "the run to start in stall-a")
    stalled.send(signal.SIGSTOP)
    gen_a = lease(inbox).generation

    other = spawn("stall-b", "--interval", "0.2", env=env)
    wait_for(lambda: done([event.pk]), 20, "stall-b to take over and finish")
    assert lease(inbox).generation > gen_a

    # Wake the stalled worker and let its run go on: it repeats the refund (refused by the
    # payments system's idempotency key), says its message, and its finish is refused.
    stalled.send(signal.SIGCONT)
    (tmp_path / "release").touch()
    wait_for(
        lambda: any(f"gen={gen_a} " in line for line in stalled.runs_logged()),
        15,
        "stall-a to end its run",
    )
    [line] = [line for line in stalled.runs_logged() if f"gen={gen_a} " in line]
    assert "outcome=refused (" in line, line
    assert any("outcome=done (said 1)" in line for line in other.runs_logged()), other.log()

    first, second = runs(inbox)
    assert (first["holder"], first["generation"]) == ("stall-a", gen_a)
    assert second["holder"] == "stall-b" and second["generation"] > gen_a
    # The two runs really did overlap in time; only the fence kept the stale one out.
    assert first["started"] < second["started"] < second["ended"] < first["ended"]
    assert effects() == [(second["id"], event.pk, True), (first["id"], event.pk, False)]
    assert Refund.objects.count() == 1
    assert list(OutboxMessage.objects.filter(inbox=inbox).values_list("body", flat=True)) == [
        "handled 1 event(s)"
    ]
    event.refresh_from_db()
    assert (event.status, event.attempts, event.claim_gen) == ("done", 2, second["generation"])

    assert stalled.stop() == 0, stalled.log()
    assert other.stop() == 0, other.log()


# --- 4. NOTIFY wakes an idle worker ----------------------------------------------------------


def test_idle_worker_picks_up_new_event_well_under_its_interval(spawn, django_user_model):
    inboxes = make_inboxes(django_user_model, "wake", 3)
    worker = spawn("wake-a", "--interval", "30")
    latencies = []
    for n, inbox in enumerate(inboxes):
        wait_idle(worker)
        ingest(inbox, "chat", f"e{n}")
        committed = time.monotonic()  # the NOTIFY went out with the commit
        [event] = Event.objects.filter(inbox=inbox).values_list("pk", flat=True)
        wait_for(lambda event=event: done([event]), 10, "the event to be done", period=0.005)
        latencies.append(time.monotonic() - committed)
    # Polling alone would take about 30 s here.
    assert max(latencies) < 3, latencies
    # A stop that lands between the slot's last poll and its sleep is lost until the interval
    # ends (a library bug, reported): stop it once it sleeps.
    wait_idle(worker)
    assert worker.stop() == 0, worker.log()
    print("pick-up latencies (s):", [round(s, 3) for s in latencies])


# --- 5. signals ------------------------------------------------------------------------------


def test_sigterm_lets_the_run_in_flight_finish_release_and_exit_0(
    spawn, django_user_model, tmp_path
):
    busy, later = make_inboxes(django_user_model, "term", 2)
    worker = spawn("term-a", "--concurrency", "2", "--interval", "0.2")
    ingest(busy, "chat", "e0", blocking_payload(tmp_path, "term-a"))
    [event] = Event.objects.filter(inbox=busy)
    wait_for((tmp_path / "started").exists, 15, "the run to start")

    worker.send(signal.SIGTERM)
    time.sleep(0.5)
    assert worker.alive(), f"exited with a run in flight:\n{worker.log()}"
    ingest(later, "chat", "e1")  # arrives after the stop: nobody claims it
    time.sleep(0.5)
    (tmp_path / "release").touch()
    assert worker.wait() == 0, worker.log()

    event.refresh_from_db()
    assert (event.status, event.attempts) == ("done", 1)
    held = lease(busy)
    assert (held.holder, held.until) == ("term-a", None)
    assert OutboxMessage.objects.filter(inbox=busy).count() == 1
    assert Refund.objects.count() == 1
    assert any("outcome=done (said 1)" in line for line in worker.runs_logged()), worker.log()
    assert list(Event.objects.filter(inbox=later).values_list("status", "attempts")) == [
        ("pending", 0)
    ]


def test_second_signal_during_a_long_run_exits_at_once(spawn, django_user_model, tmp_path):
    [inbox] = make_inboxes(django_user_model, "twice", 1)
    worker = spawn("twice-a", "--interval", "0.2")
    ingest(inbox, "chat", "e0", blocking_payload(tmp_path, "twice-a"))
    wait_for((tmp_path / "started").exists, 15, "the run to start")

    worker.send(signal.SIGTERM)
    time.sleep(0.5)
    assert worker.alive(), f"exited with a run in flight:\n{worker.log()}"
    signalled = time.monotonic()
    worker.send(signal.SIGTERM)
    code = worker.wait(5)
    assert code != 0 and code == 128 + signal.SIGTERM, worker.log()
    assert time.monotonic() - signalled < 2
    # Nothing committed; the lease is left to expire on its own.
    assert list(Event.objects.filter(inbox=inbox).values_list("status", flat=True)) == ["running"]
    assert lease(inbox).until is not None
    assert OutboxMessage.objects.count() == 0


# --- 6. a host clock off by minutes ----------------------------------------------------------

SKEW = timedelta(minutes=10)

SITECUSTOMIZE = """
import os, time
_skew = float(os.environ["TEST_CLOCK_SKEW"])
_time, _time_ns = time.time, time.time_ns
time.time = lambda: _time() + _skew
time.time_ns = lambda: _time_ns() + int(_skew * 1e9)
import django.utils.timezone as _tz
_now = _tz.now
_tz.now = lambda: _now() + _tz.timedelta(seconds=_skew)
"""


def skew_host_clock(monkeypatch, skew):
    """This process's clock, as Django and `time` see it, moved forward by `skew`."""
    from django.utils import timezone

    real_now, real_time, real_time_ns = timezone.now, time.time, time.time_ns
    monkeypatch.setattr(timezone, "now", lambda: real_now() + skew)
    monkeypatch.setattr(time, "time", lambda: real_time() + skew.total_seconds())
    monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() + int(skew.total_seconds() * 1e9))


def test_skewed_host_clock_cannot_steal_a_lease_or_fire_a_timer_early(
    django_user_model, monkeypatch
):
    from django.utils import timezone

    [inbox] = make_inboxes(django_user_model, "skew", 1)
    ingest(inbox, "chat", "e0")
    gen = acquire(inbox, "holder-a")  # a live lease, TTL from the database's clock
    db_now = clock.database_now()
    add_timer(inbox, "reminder", db_now + timedelta(minutes=5))

    skew_host_clock(monkeypatch, SKEW)
    assert abs(timezone.now() - clock.database_now() - SKEW) < timedelta(seconds=5)
    assert abs(time.time() - clock.database_now().timestamp() - SKEW.total_seconds()) < 5

    assert acquire(inbox, "holder-b") is None
    assert acquire_next("holder-b") is None
    held = lease(inbox)
    assert (held.holder, held.generation) == ("holder-a", gen)
    assert run_scheduler() == 0
    assert not Timer.objects.get(inbox=inbox).done
    assert not Event.objects.filter(inbox=inbox, source="timer").exists()

    # The skew would matter if the host's clock were used: the same calls given the host's
    # time steal the lease and fire the timer (rolled back).
    with transaction.atomic():
        assert acquire(inbox, "holder-b", now=timezone.now()) == gen + 1
        assert run_scheduler(now=timezone.now()) == 1
        transaction.set_rollback(True)
    assert lease(inbox).holder == "holder-a"
    assert not Timer.objects.get(inbox=inbox).done


def test_worker_process_with_skewed_clock_cannot_steal_a_live_lease(
    spawn, django_user_model, tmp_path
):
    held, free = make_inboxes(django_user_model, "skewp", 2)
    ingest(held, "chat", "e0")
    ingest(free, "chat", "e1")
    gen = acquire(held, "holder-a")  # live for the default TTL on the database's clock
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(SITECUSTOMIZE)

    worker = spawn(
        "skewed",
        "--once",
        env={"TEST_CLOCK_SKEW": str(SKEW.total_seconds())},
        wait_listening=False,
        pythonpath=tmp_path / "hook",
    )
    assert worker.wait(30) == 0, worker.log()

    # It ran the free inbox, and its host clock was 10 minutes ahead while it did...
    [run] = runs()
    assert (run["inbox_id"], run["holder"]) == (free.pk, "skewed")
    assert abs(run["host_now"] - run["started"] - SKEW) < timedelta(seconds=5)
    # ...yet it left the inbox whose lease was still live to its holder.
    assert (lease(held).holder, lease(held).generation) == ("holder-a", gen)
    assert list(Event.objects.filter(inbox=held).values_list("status", "attempts")) == [
        ("pending", 0)
    ]
