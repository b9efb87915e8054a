"""Health: each loop process's heartbeat row, /healthz, `manage.py status` and the admin's
process list. Beats are written with an explicit `now`; nothing sleeps to move time.
"""

import json
import logging
import os
import socket
from datetime import timedelta
from importlib import metadata
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import OperationalError, connection
from django.utils import timezone

from alwayson.ops import health
from alwayson.ops.health import ProcessBeat, check
from alwayson.ops.models import Process
from alwayson.runtime.worker import WorkerPool
from inbox import clock
from inbox.models import Event
from inbox.services import ingest
from outbox.models import Channel, OutboxMessage
from timers.services import add_timer

SECOND = timedelta(seconds=1)
DAY = timedelta(days=1)
KINDS = ("worker", "scheduler", "dispatcher")


@pytest.fixture
def beat_every(settings):
    """The heartbeat interval, in seconds, as the settings give it (5 unless overridden)."""
    return timedelta(seconds=settings.ALWAYSON_HEARTBEAT_INTERVAL)


def beating(kinds, now):
    """One registered process of each kind, its row written at `now`."""
    beats = {kind: ProcessBeat(kind, f"host-a:{n}") for n, kind in enumerate(kinds)}
    for beat in beats.values():
        beat.register(now)
    return beats


def row(beat):
    return Process.objects.get(pk=beat.pk)


# --- the heartbeat row ---------------------------------------------------------------------


@pytest.mark.django_db
def test_register_writes_who_and_where_the_process_is(t0):
    beat = ProcessBeat("worker", "web-1:4242")

    process = beat.register(t0)

    assert (process.kind, process.worker_id, process.host, process.pid) == (
        "worker",
        "web-1:4242",
        socket.gethostname(),
        os.getpid(),
    )
    assert (process.started, process.last_beat, process.stopped, process.runs) == (t0, t0, None, 0)
    assert process.version == metadata.version("alwayson") != ""


@pytest.mark.django_db
def test_a_beat_moves_the_last_beat_and_the_run_count_of_this_row_only(t0):
    mine, other = ProcessBeat("worker", "a"), ProcessBeat("worker", "b")
    mine.register(t0)
    other.register(t0)
    mine.count_run()
    mine.count_run()

    mine.beat(t0 + 5 * SECOND)

    assert (row(mine).started, row(mine).last_beat, row(mine).runs) == (t0, t0 + 5 * SECOND, 2)
    assert (row(other).last_beat, row(other).runs) == (t0, 0)
    assert Process.objects.count() == 2


@pytest.mark.django_db
def test_a_process_is_live_within_three_beats_and_lost_after(t0, beat_every):
    beat = ProcessBeat("scheduler", "s")
    beat.register(t0)

    assert list(Process.objects.live(t0 + 3 * beat_every)) == [row(beat)]
    assert list(Process.objects.lost(t0 + 3 * beat_every + SECOND)) == [row(beat)]
    assert not Process.objects.live(t0 + 3 * beat_every + SECOND).exists()

    beat.beat(t0 + 3 * beat_every + SECOND)  # a late beat brings it back
    assert Process.objects.live(t0 + 3 * beat_every + SECOND).exists()


@pytest.mark.django_db
def test_a_clean_exit_marks_the_row_stopped_and_no_beat_follows(t0):
    beat = ProcessBeat("dispatcher", "d")
    beat.register(t0)
    beat.count_run()

    beat.stop()  # never started: nothing to join; marks stopped on the database's clock

    stopped = row(beat)
    assert stopped.stopped is not None and stopped.last_beat == stopped.stopped
    assert stopped.runs == 1
    assert Process.objects.with_state(t0).get().state == "stopped"
    assert not Process.objects.running().exists()


@pytest.mark.django_db
def test_a_crash_leaves_the_row_to_turn_lost(t0, beat_every):
    beat = ProcessBeat("worker", "w")
    beat.register(t0)

    beat.stop(clean=False)

    assert row(beat).stopped is None
    later = t0 + 3 * beat_every + SECOND
    assert Process.objects.with_state(later).get().state == "lost"


@pytest.mark.django_db
def test_a_beat_after_the_row_was_pruned_registers_again(t0):
    beat = ProcessBeat("worker", "paused-for-a-day")
    beat.register(t0)
    first = beat.pk
    Process.objects.filter(pk=first).delete()

    beat.beat(t0 + DAY)

    assert beat.pk != first
    assert (row(beat).started, row(beat).last_beat) == (t0 + DAY, t0 + DAY)


@pytest.mark.django_db
def test_register_prunes_rows_whose_last_beat_is_a_day_old(t0):
    old_stopped, old_lost, recent_stopped = (ProcessBeat("worker", n) for n in "abc")
    old_stopped.register(t0)
    old_stopped.mark_stopped(t0)
    old_lost.register(t0)
    recent_stopped.register(t0 + 2 * SECOND)
    recent_stopped.mark_stopped(t0 + 2 * SECOND)

    ProcessBeat("worker", "new").register(t0 + DAY + SECOND)

    assert sorted(Process.objects.values_list("worker_id", flat=True)) == ["c", "new"]


@pytest.mark.django_db
def test_a_database_outage_at_start_leaves_registration_to_the_first_beat(t0, monkeypatch, caplog):
    def unreachable():
        raise OperationalError("connection refused")

    monkeypatch.setattr(clock, "database_now", unreachable)
    beat = ProcessBeat("scheduler", "s")
    caplog.set_level(logging.WARNING, logger="alwayson.health")
    monkeypatch.setattr(logging.getLogger("alwayson"), "propagate", True)

    beat.start()
    try:
        assert beat.pk is None and not Process.objects.exists()
        assert "could not register scheduler s" in caplog.text
        beat.beat(t0)
        assert row(beat).started == t0
    finally:
        monkeypatch.undo()
        beat.stop()
    assert row(beat).stopped is not None


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="kind must be one of"):
        ProcessBeat("cron", "x")


# --- the loops beat --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_runscheduler_and_rundispatcher_leave_a_stopped_row_with_their_work(
    make_inbox, loop_command
):
    inbox = make_inbox()
    Channel.objects.create(inbox=inbox, kind=Channel.Kind.WEBHOOK, url="http://127.0.0.1:9/")
    past = timezone.now().replace(microsecond=0) - 10 * SECOND  # the commands' clock is real
    add_timer(inbox, "follow-up", past, {"task": "check"}, now=past)

    call_command("runscheduler", "--once", "--worker-id", "sched-1", "--verbosity", "0")
    call_command("rundispatcher", "--once", "--worker-id", "disp-1", "--verbosity", "0")

    scheduler = Process.objects.get(kind="scheduler")
    assert (scheduler.worker_id, scheduler.runs, scheduler.pid) == ("sched-1", 1, os.getpid())
    assert scheduler.stopped is not None
    dispatcher = Process.objects.get(kind="dispatcher")
    assert (dispatcher.worker_id, dispatcher.runs) == ("disp-1", 0)  # nothing was held
    assert dispatcher.stopped is not None
    assert Event.objects.filter(source="timer").count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_worker_pool_counts_its_runs_on_its_row(make_inbox):
    for _ in range(3):
        ingest(make_inbox(), "chat", "m", {})

    # One slot: SQLite's shared in-memory test database refuses a second writer outright.
    runs = WorkerPool("pool-1", agent=lambda run: run.say("ok"), once=True).run()

    worker = Process.objects.get()
    assert (worker.kind, worker.worker_id, worker.runs, runs) == ("worker", "pool-1", 3, 3)
    assert worker.stopped is not None
    assert OutboxMessage.objects.count() == 3


# --- the check -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_healthy_when_the_database_answers_and_every_kind_beats(t0):
    beating(KINDS, t0)

    result = check(t0 + SECOND)

    assert result.ok
    assert result.as_json() == {
        "status": "ok",
        "version": metadata.version("alwayson"),
        "checks": {"database": "ok", "worker": "ok", "scheduler": "ok", "dispatcher": "ok"},
    }


@pytest.mark.django_db
def test_a_lost_or_stopped_kind_fails_by_name(t0, beat_every):
    beats = beating(KINDS, t0)
    beats["dispatcher"].mark_stopped(t0)
    for kind in ("worker", "dispatcher"):
        beats[kind].beat(t0 + 3 * beat_every)  # a late beat does not revive the dispatcher

    result = check(t0 + 3 * beat_every + SECOND)

    assert not result.ok
    assert result.failing == ["scheduler", "dispatcher"]
    assert result.checks == {
        "database": "ok",
        "worker": "ok",
        "scheduler": "failing",
        "dispatcher": "failing",
    }


@pytest.mark.django_db
def test_only_the_required_kinds_are_checked(t0, settings):
    settings.ALWAYSON_HEALTH_REQUIRE = ["worker"]
    beating(["worker"], t0)

    assert check(t0).checks == {"database": "ok", "worker": "ok"}

    settings.ALWAYSON_HEALTH_REQUIRE = []
    assert check(t0).checks == {"database": "ok"}


@pytest.mark.django_db
def test_one_live_process_of_a_kind_is_enough(t0, beat_every):
    lost, live = ProcessBeat("worker", "old"), ProcessBeat("worker", "new")
    lost.register(t0)
    live.register(t0 + 10 * beat_every)
    beating(["scheduler", "dispatcher"], t0 + 10 * beat_every)

    assert check(t0 + 10 * beat_every).ok


@pytest.mark.django_db
def test_an_unreachable_database_fails_and_leaves_the_rest_unknown(monkeypatch, caplog):
    def unreachable():
        raise OperationalError("connection refused\nIs the server running on that host?")

    monkeypatch.setattr(clock, "database_now", unreachable)
    caplog.set_level(logging.WARNING, logger="alwayson.health")

    assert check().checks == {
        "database": "failing",
        "worker": "unknown",
        "scheduler": "unknown",
        "dispatcher": "unknown",
    }
    # One line per poll through an outage, no traceback.
    [record] = caplog.records
    assert record.getMessage() == "health check: the database is unavailable: connection refused"
    assert record.exc_info is None


# --- GET /healthz ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_healthz_answers_200_with_the_version_and_the_checks_and_is_never_cached(client):
    beating(KINDS, clock.database_now())

    response = client.get("/healthz")

    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response["Cache-Control"] == "no-store"
    assert response.json() == {
        "status": "ok",
        "version": metadata.version("alwayson"),
        "checks": {"database": "ok", "worker": "ok", "scheduler": "ok", "dispatcher": "ok"},
        "durability": "ok" if connection.vendor == "postgresql" else "embedded",
    }
    assert client.get("/healthz/").status_code == 200


@pytest.mark.django_db
def test_healthz_answers_503_naming_only_which_check_fails(client):
    beating(["worker"], clock.database_now())

    response = client.get("/healthz")

    assert response.status_code == 503
    assert json.loads(response.content) == {
        "status": "failing",
        "version": metadata.version("alwayson"),
        "checks": {
            "database": "ok",
            "worker": "ok",
            "scheduler": "failing",
            "dispatcher": "failing",
        },
        "durability": "ok" if connection.vendor == "postgresql" else "embedded",
    }


@pytest.mark.django_db
def test_healthz_logs_its_503_as_information_not_as_a_server_error(client, caplog):
    """Every start-up answers a few probes 503 before its processes beat: no ERROR line."""
    caplog.set_level(logging.DEBUG)
    beating(["worker"], clock.database_now())

    assert client.get("/healthz").status_code == 503

    logged = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    assert logged == [
        ("alwayson.health", "INFO", "health check failing: scheduler, dispatcher"),
    ]


@pytest.mark.django_db
def test_healthz_answers_a_probe_before_the_host_check_and_the_https_redirect(client, settings):
    settings.ALLOWED_HOSTS = ["alwayson.example.com"]
    settings.SECURE_SSL_REDIRECT = True
    beating(KINDS, clock.database_now())

    probe = client.get("/healthz", HTTP_HOST="10.0.3.7:8000")

    assert probe.status_code == 200 and probe.json()["status"] == "ok"
    # Any other page from that address is refused, and from the real host redirected.
    assert client.get("/accounts/login/", HTTP_HOST="10.0.3.7:8000").status_code == 400
    redirect = client.get("/accounts/login/", HTTP_HOST="alwayson.example.com")
    assert (redirect.status_code, redirect["Location"]) == (
        301,
        "https://alwayson.example.com/accounts/login/",
    )


@pytest.mark.django_db
def test_healthz_needs_no_login_and_takes_only_get(client):
    assert client.get("/healthz").status_code == 503  # no process: failing, but answered
    assert client.post("/healthz").status_code == 405


@pytest.mark.django_db
def test_healthz_says_database_failing_when_it_is_down(client, monkeypatch):
    def unreachable():
        raise OperationalError("connection refused")

    monkeypatch.setattr(health.clock, "database_now", unreachable)

    response = client.get("/healthz")

    assert response.status_code == 503
    assert response.json()["checks"]["database"] == "failing"
    assert response.json()["version"] == metadata.version("alwayson")  # known without it
    assert "refused" not in response.content.decode()


# --- manage.py status ------------------------------------------------------------------------


def status(*args):
    out = StringIO()
    call_command("status", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_status_prints_the_checks_and_the_live_and_lost_processes(beat_every):
    now = clock.database_now()
    beats = beating(KINDS, now)
    beats["worker"].count_run()
    beats["worker"].beat(now)
    lost = ProcessBeat("worker", "gone:1")
    lost.register(now - 10 * beat_every)
    done = ProcessBeat("worker", "done:2")
    done.register(now)
    done.mark_stopped(now)

    output = status()

    lines = output.splitlines()
    assert lines[:4] == ["database\tok", "worker\tok", "scheduler\tok", "dispatcher\tok"]
    assert lines[-1] == "healthy"
    # Every row the admin lists is counted, the stopped one too; --all lists it.
    window = f"{(3 * beat_every).total_seconds():.0f}"
    assert lines[4] == (
        f"processes: 3 live (beating), 1 lost (not stopped, no beat for {window}s),"
        " 1 stopped cleanly (--all lists them)"
    )
    rows = [line.strip().split("\t") for line in lines if line.startswith("  ")]
    assert [(r[0], r[1], r[2], r[5]) for r in rows] == [
        ("dispatcher", "live", "host-a:2", "0 run(s)"),
        ("scheduler", "live", "host-a:1", "0 run(s)"),
        ("worker", "live", "host-a:0", "1 run(s)"),
        ("worker", "lost", "gone:1", "0 run(s)"),
    ]
    everything = status("--all").splitlines()
    assert everything[4].endswith("1 stopped cleanly (listed below)")
    assert ("worker", "stopped", "done:2") in [
        tuple(line.strip().split("\t")[:3]) for line in everything if line.startswith("  ")
    ]


@pytest.mark.django_db
def test_status_counts_the_stopped_processes_the_admin_lists_when_none_runs(admin_client):
    now = clock.database_now()
    for kind in KINDS:
        stopped = ProcessBeat(kind, f"{kind}:1")
        stopped.register(now)
        stopped.mark_stopped(now)

    with pytest.raises(CommandError):  # nothing beats: unhealthy, but the count comes first
        out = StringIO()
        call_command("status", stdout=out)
    [counts] = [line for line in out.getvalue().splitlines() if line.startswith("processes:")]

    assert counts.startswith("processes: 0 live (beating), 0 lost")
    assert counts.endswith("3 stopped cleanly (--all lists them)")
    admin = admin_client.get("/admin/alwayson_ops/process/")
    assert admin.context["cl"].result_count == 3


@pytest.mark.django_db
def test_status_exits_non_zero_naming_what_fails():
    beating(["worker", "dispatcher"], clock.database_now())

    with pytest.raises(CommandError, match=r"unhealthy: scheduler failing"):
        status()


# --- the admin -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_admin_lists_processes_with_their_state_read_only(admin_client, beat_every):
    now = clock.database_now()
    beating(["worker"], now)
    ProcessBeat("scheduler", "gone:7").register(now - 10 * beat_every)

    page = admin_client.get("/admin/alwayson_ops/process/")
    html = page.content.decode()

    assert page.status_code == 200
    assert "host-a:0" in html and "gone:7" in html
    assert ">live<" in html and ">lost<" in html
    assert "/admin/alwayson_ops/process/add/" not in html
    lost_only = admin_client.get("/admin/alwayson_ops/process/?state=lost").content.decode()
    assert "gone:7" in lost_only and "host-a:0" not in lost_only

    worker = Process.objects.get(kind="worker")
    detail = admin_client.get(f"/admin/alwayson_ops/process/{worker.pk}/change/")
    assert detail.status_code == 200
    assert 'name="_save"' not in detail.content.decode()
    assert admin_client.get("/admin/alwayson_ops/process/add/").status_code == 403
