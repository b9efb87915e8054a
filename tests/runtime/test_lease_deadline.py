"""A run keeps its lease's deadline itself, on a clock no database call can block: the TTL from
its take, moved to the TTL from each renewal that succeeds, counted from the moment that
renewal was sent. Past the deadline with no renewal the run is lost at once: `lost`,
LeaseLost from `renew()` within a bound (never waiting on the database past the deadline),
`run.http` refused, and the worker finishes nothing. On both databases.

The run's clock is the test's (Ticks), moved by hand: no test sleeps to move time. Only the
waits that must end at the deadline are measured on the real clock, over a fraction of a
second.
"""

import contextlib
import logging
import threading
import time
from datetime import timedelta

import pytest

from alwayson.egress.models import EgressCall
from alwayson.runtime import worker as worker_module
from alwayson.runtime.api import acquire, claim_batch, ingest
from alwayson.runtime.run import LeaseLost, Run, lease_clock
from alwayson.runtime.worker import Heartbeat, Worker
from inbox.clock import database_now
from inbox.models import Event, Lease, RunRecord
from outbox.models import OutboxMessage
from tests.support.clock import Ticks
from tests.support.egress import SECRET, answer, services_for
from tests.support.loopback import Loopback
from tests.support.runs import session_state

pytestmark = pytest.mark.django_db

TTL = 60


@pytest.fixture(autouse=True)
def ttl(settings):
    settings.ALWAYSON_LEASE_TTL = TTL
    return TTL


@pytest.fixture
def ticks():
    return Ticks()


@pytest.fixture
def worker_log(caplog, monkeypatch):
    """The "alwayson" logger does not propagate (its own console handler): let its records
    reach caplog's handler on the root logger for the test."""
    monkeypatch.setattr(logging.getLogger("alwayson"), "propagate", True)
    caplog.set_level(logging.INFO, logger="alwayson.worker")
    return caplog


def taken(inbox, clock=lease_clock, left=None, renewer=None):
    """A run over a real claim, its lease taken now on `clock`, or so that `left` seconds
    of it are left."""
    ingest(inbox, "chat", f"m-{Event.objects.count()}", {})
    generation = acquire(inbox, "A")
    events = claim_batch(inbox, "A", generation)
    taken_at = None if left is None else clock() - (TTL - left)
    return Run(
        inbox,
        "A",
        generation,
        events,
        session_state(inbox),
        taken_at=taken_at,
        renewer=renewer,
        clock=clock,
    )


def lease(inbox):
    return Lease.objects.get(inbox=inbox)


def lost_lines(caplog):
    return [r for r in caplog.records if r.getMessage().startswith("lease lost: ")]


# --- the deadline --------------------------------------------------------------------------------


def test_a_run_is_lost_the_moment_its_deadline_passes_without_asking_the_database(
    inbox, ticks, django_assert_num_queries
):
    run = taken(inbox, ticks)

    with django_assert_num_queries(0):
        ticks.move(TTL - 0.01)
        assert run.lost is False
        ticks.move(0.01)
        assert run.lost is True
        with pytest.raises(LeaseLost, match="deadline"):
            run.renew()
        with pytest.raises(LeaseLost):
            run.check_lease()

    # The database would still have renewed it: the run's own clock decided.
    held = lease(inbox)
    assert (held.holder, held.generation) == ("A", run.generation)
    assert held.until > database_now()
    assert "deadline" in run.lost_because


def test_a_renewal_moves_the_deadline_to_the_ttl_from_when_it_was_sent(inbox, ticks):
    def slow_renewal(run, timeout):
        assert timeout == pytest.approx(TTL - 30)  # it may wait until the deadline, no more
        ticks.move(5)  # the statement took five seconds to come back
        return True

    run = taken(inbox, ticks, renewer=slow_renewal)
    start = ticks()
    ticks.move(30)

    run.renew()

    # From when it was sent (start + 30), not from when it answered (start + 35).
    assert run.deadline == start + 30 + TTL
    ticks.move(TTL - 5 - 0.01)
    assert run.lost is False
    ticks.move(0.01)
    assert run.lost is True


def test_a_renewal_with_the_database_moves_its_lease_and_the_deadline(inbox, ticks):
    run = taken(inbox, ticks)
    soon = database_now() + timedelta(seconds=5)
    Lease.objects.filter(inbox=inbox).update(until=soon)
    ticks.move(TTL - 1)

    run.renew()

    assert lease(inbox).until > soon
    assert run.deadline == ticks() + TTL
    ticks.move(TTL - 1)
    assert run.lost is False


def test_a_renewal_that_answers_after_the_deadline_does_not_bring_the_run_back(inbox, ticks):
    def late(run, timeout):
        ticks.move(timeout + 1)
        return True

    run = taken(inbox, ticks, renewer=late)
    ticks.move(TTL - 1)

    with pytest.raises(LeaseLost, match="deadline"):
        run.renew()

    assert run.lost is True
    ticks.move(-TTL)  # whatever the clock says later: lost stays lost
    assert run.lost is True


def test_renew_with_no_answer_is_lease_lost_and_the_run_stays_lost(inbox, ticks):
    run = taken(inbox, ticks, renewer=lambda run, timeout: None)

    with pytest.raises(LeaseLost, match="did not answer"):
        run.renew()

    assert run.lost is True


def test_a_lost_run_logs_it_once_with_the_reason(inbox, ticks, worker_log):
    run = taken(inbox, ticks)
    ticks.move(TTL)

    assert run.lost and run.lost
    with pytest.raises(LeaseLost):
        run.renew()

    [line] = lost_lines(worker_log)
    assert line.levelno == logging.WARNING
    assert f"inbox={inbox.slug} gen={run.generation}" in line.getMessage()
    assert "no renewal succeeded by the lease's deadline" in line.getMessage()


# --- renew() never waits past the deadline -------------------------------------------------------


@pytest.fixture
def hung_database(monkeypatch):
    """Every renewal the heartbeat's thread sends hangs until released, as on a connection
    whose peer stopped answering; the test's own statements are unaffected."""
    release = threading.Event()
    real = worker_module.renew

    def renew(*args, **kwargs):
        if threading.current_thread().name == "heartbeat":
            release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(worker_module, "renew", renew)
    yield release
    release.set()


@pytest.fixture
def heartbeat():
    beat = Heartbeat()
    beat.start()
    yield beat
    beat.stop()


@pytest.mark.django_db(transaction=True)
def test_renew_through_a_hung_heartbeat_raises_lease_lost_at_the_deadline(
    inbox, hung_database, heartbeat
):
    run = taken(inbox, left=0.4, renewer=heartbeat.renew_now)

    with pytest.raises(LeaseLost, match="did not answer"):
        run.renew()

    assert run.deadline <= lease_clock() < run.deadline + 1.0
    assert run.lost is True


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_loses_a_run_at_its_deadline_while_every_renewal_hangs(
    inbox, hung_database, heartbeat, worker_log
):
    run = taken(inbox, left=0.4)
    heartbeat.track(run)
    deadline = run.deadline + (time.time() - lease_clock())  # on the log's clock

    waiting = time.monotonic() + 5
    while not lost_lines(worker_log) and time.monotonic() < waiting:
        time.sleep(0.02)  # waiting for the heartbeat's thread, not moving time

    [line] = lost_lines(worker_log)
    assert f"gen={run.generation}" in line.getMessage()
    # Nobody asked the run: the heartbeat's deadline thread lost it, on time.
    assert deadline - 0.01 <= line.created < deadline + 1.0
    assert line.threadName == "lease-deadlines"
    heartbeat.untrack(run)


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_renewal_moves_the_deadline(inbox, heartbeat):
    run = taken(inbox, left=5, renewer=heartbeat.renew_now)
    before = run.deadline

    run.renew()

    assert run.deadline > before + TTL - 10
    assert run.lost is False


# --- what a lost run may no longer do ------------------------------------------------------------


@pytest.fixture
def outside(settings, monkeypatch):
    with Loopback(answer) as service:
        monkeypatch.setenv("PAYMENTS_TOKEN", SECRET)
        settings.ALWAYSON_EGRESS_SERVICES = services_for(service.url())
        yield service


def test_run_http_is_refused_past_the_deadline_and_so_is_a_client_taken_before(
    inbox, ticks, outside
):
    run = taken(inbox, ticks)
    http = run.http
    assert http.post("payments", "/v1/refunds", json={"order": "1"}).ok

    ticks.move(TTL)

    with pytest.raises(LeaseLost):
        run.http  # noqa: B018
    with pytest.raises(LeaseLost):
        http.post("payments", "/v1/refunds", json={"order": "2"})
    assert len(outside.requests) == 1
    assert EgressCall.objects.count() == 1  # the refusal left the process with nothing


def test_an_agent_that_ends_past_its_deadline_is_fenced_and_commits_nothing(inbox, ticks):
    ingest(inbox, "chat", "m1", {})

    def agent(run):
        run.say("done, a little late")
        ticks.move(TTL)  # a step that took longer than the lease, unnoticed by the agent

    worker = Worker("A", agent)
    worker.clock = ticks
    result = worker.step()

    assert result.outcome == "fenced"
    assert not OutboxMessage.objects.filter(inbox=inbox).exists()
    event = Event.objects.get(source_id="m1")
    assert (event.status, event.claim_gen) == ("running", result.generation)
    record = RunRecord.objects.get(inbox=inbox)
    assert record.outcome == RunRecord.Outcome.REFUSED
    assert "deadline" in record.error
    # Given back at once: the next take retries the event.
    assert lease(inbox).until is None


def test_an_agent_that_swallows_lease_lost_is_still_fenced(inbox, ticks):
    ingest(inbox, "chat", "m1", {})

    def agent(run):
        ticks.move(TTL)
        with contextlib.suppress(LeaseLost):
            run.renew()
        run.say("carrying on regardless")

    worker = Worker("A", agent)
    worker.clock = ticks
    assert worker.step().outcome == "fenced"
    assert not OutboxMessage.objects.filter(inbox=inbox).exists()


def test_a_run_taken_with_a_slow_take_counts_its_lease_from_before_the_take(
    inbox, ticks, monkeypatch
):
    """The worker reads its clock before the take is sent: a take that took long to answer
    leaves the run that much less time, as it leaves the lease the database stamped."""
    ingest(inbox, "chat", "m1", {})
    seen = []
    real = worker_module.take_next

    def slow_take(holder):
        claim = real(holder)
        ticks.move(20)
        return claim

    def agent(run):
        seen.append(run.deadline - ticks())

    monkeypatch.setattr(worker_module, "take_next", slow_take)
    worker = Worker("A", agent)
    worker.clock = ticks
    worker.step()

    assert seen == [TTL - 20]
