"""Metrics: /metrics behind its token, each family's values after real work, counts from
several processes adding up, and the scrape's plans on PostgreSQL.

Every scrape is parsed with prometheus_client's own parser. Times are passed explicitly
where a value depends on them (ages, lags, latencies); run durations are real, so only
their counts and bucket shape are asserted.
"""

import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from prometheus_client.parser import text_string_to_metric_families

from alwayson.ops import metrics
from alwayson.ops.health import ProcessBeat
from alwayson.ops.metrics import RUN_OUTCOMES
from alwayson.ops.models import MetricTotal, Process
from alwayson.runtime.worker import Worker
from approvals.services import answer_approval, request_approval
from inbox import clock
from inbox.services import Failed, Held, acquire, claim_batch, finish, ingest
from outbox.channels import SendFailed
from outbox.models import Channel
from outbox.services import Say, dispatch
from tests.support.paths import ROOT
from tests.support.processes import database_url
from timers.services import add_timer, run_scheduler

SECOND = timedelta(seconds=1)
HOUR = timedelta(hours=1)
TOKEN = "test-metrics-token-0123456789"


@pytest.fixture(autouse=True)
def recorder(monkeypatch):
    """A fresh recorder per test, flushing as it counts (no heartbeat thread in a test)."""
    fresh = metrics.Recorder()
    monkeypatch.setattr(metrics.recorder, "RECORDER", fresh)
    return fresh


@pytest.fixture
def token(settings):
    settings.ALWAYSON_METRICS_TOKEN = TOKEN
    return TOKEN


def scrape(now=None) -> dict:
    text = metrics.exposition(now).decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def sample(families, family, name=None, **labels):
    """The value of one sample; KeyError when the series is absent."""
    name = name or family
    for found in families[family].samples:
        if found.name == name and found.labels == labels:
            return found.value
    raise KeyError(f"{name}{labels} not in {families[family].samples}")


def runs(families, outcome):
    return sample(
        families,
        "alwayson_run_duration_seconds",
        "alwayson_run_duration_seconds_count",
        outcome=outcome,
    )


def buckets(families, family, **labels):
    return {
        found.labels["le"]: found.value
        for found in families[family].samples
        if found.name == f"{family}_bucket"
        and {k: v for k, v in found.labels.items() if k != "le"} == labels
    }


# --- the endpoint --------------------------------------------------------------------------


@pytest.mark.django_db
def test_without_a_token_setting_the_endpoint_is_not_there(client, settings):
    settings.ALWAYSON_METRICS_TOKEN = ""

    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")

    assert response.status_code == 404


@pytest.mark.django_db
@pytest.mark.parametrize("headers", [{}, {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}])
@pytest.mark.parametrize("host", ["app.example.com", "10.0.0.7:8000"])
def test_without_a_token_setting_plain_http_gets_404_not_the_https_redirect(
    client, settings, headers, host
):
    """Like a scrape with a token, answered before the host check and the HTTPS redirect: a
    scrape of the site or of gunicorn's own address over http learns that the endpoint is off."""
    settings.ALWAYSON_METRICS_TOKEN = ""
    settings.DEBUG = False
    settings.SECURE_SSL_REDIRECT = True
    settings.ALLOWED_HOSTS = ["app.example.com"]

    response = client.get("/metrics", HTTP_HOST=host, **headers)

    assert response.status_code == 404
    assert b"alwayson_" not in response.content


@pytest.mark.django_db
def test_with_a_token_setting_plain_http_without_one_is_asked_for_it(client, token, settings):
    settings.SECURE_SSL_REDIRECT = True
    settings.ALLOWED_HOSTS = ["app.example.com"]

    response = client.get("/metrics", HTTP_HOST="10.0.0.7:8000")

    assert response.status_code == 401


@pytest.mark.django_db
def test_a_scrape_without_a_bearer_token_is_asked_for_one(client, token):
    for headers in ({}, {"HTTP_AUTHORIZATION": token}, {"HTTP_AUTHORIZATION": "Bearer "}):
        response = client.get("/metrics", **headers)

        assert response.status_code == 401
        assert response["WWW-Authenticate"] == 'Bearer realm="metrics"'
        assert b"alwayson_" not in response.content


@pytest.mark.django_db
def test_a_wrong_token_is_forbidden(client, token):
    for wrong in (token[:-1], token + "x", "not-the-token-at-all"):
        response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {wrong}")

        assert response.status_code == 403
        assert b"alwayson_" not in response.content
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Basic {token}").status_code == 401


@pytest.mark.django_db
def test_the_right_token_gets_the_exposition_at_any_host_over_http(client, token, settings):
    settings.SECURE_SSL_REDIRECT = True
    settings.ALLOWED_HOSTS = ["app.example.com"]

    response = client.get(
        "/metrics", HTTP_AUTHORIZATION=f"bearer {token}", HTTP_HOST="10.0.0.7:8000"
    )

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    assert response["Cache-Control"] == "no-store"
    names = {family.name for family in text_string_to_metric_families(response.content.decode())}
    assert {"alwayson_events", "alwayson_run_duration_seconds", "alwayson_processes"} <= names
    assert client.post("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 405


@pytest.mark.django_db
def test_a_scrape_while_the_database_is_down_answers_503(client, token, monkeypatch):
    from django.db import OperationalError

    def down(now=None):
        raise OperationalError("connection refused")

    monkeypatch.setattr(metrics.middleware, "exposition", down)

    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")

    assert response.status_code == 503


@pytest.mark.parametrize("value", ["short", "has a space in the middle!!"])
def test_a_weak_or_malformed_token_stops_start_up(monkeypatch, value):
    from alwayson.settings.env import bearer_token

    monkeypatch.setenv("ALWAYSON_METRICS_TOKEN", value)
    with pytest.raises(ImproperlyConfigured, match="ALWAYSON_METRICS_TOKEN"):
        bearer_token("ALWAYSON_METRICS_TOKEN")


# --- state, read at scrape -----------------------------------------------------------------


@pytest.mark.django_db
def test_events_are_counted_by_inbox_and_status_and_the_oldest_wait_is_its_age(make_inbox, t0):
    desk, shop, quiet = make_inbox("desk"), make_inbox("shop"), make_inbox("quiet")
    ingest(desk, "chat", "1", now=t0)
    ingest(desk, "chat", "2", now=t0 + 10 * SECOND)
    ingest(shop, "chat", "1", now=t0 + 20 * SECOND)
    gen = acquire(shop, "w", now=t0 + 20 * SECOND)
    claim_batch(shop, "w", gen, now=t0 + 20 * SECOND)

    families = scrape(now=t0 + 30 * SECOND)

    assert sample(families, "alwayson_events", inbox="desk", status="pending") == 2
    assert sample(families, "alwayson_events", inbox="shop", status="running") == 1
    assert not [s for s in families["alwayson_events"].samples if s.labels["inbox"] == quiet.slug]
    assert sample(families, "alwayson_oldest_pending_age_seconds") == 30
    assert scrape(now=t0 - HOUR)["alwayson_oldest_pending_age_seconds"].samples[0].value == 0


@pytest.mark.django_db
def test_a_dead_event_is_counted_by_inbox_and_in_the_last_day_only(inbox, t0, settings):
    settings.ALWAYSON_MAX_ATTEMPTS = 1
    ingest(inbox, "chat", "poison", now=t0)
    gen = acquire(inbox, "w", now=t0)
    ids = [e.pk for e in claim_batch(inbox, "w", gen, now=t0)]
    finish(Held(inbox, "w", gen, ids), outcome=Failed("boom"), now=t0)
    gen = acquire(inbox, "w", now=t0 + HOUR)
    assert claim_batch(inbox, "w", gen, now=t0 + HOUR) == []  # out of attempts: parked as dead

    families = scrape(now=t0 + 2 * HOUR)

    assert sample(families, "alwayson_events", inbox="desk", status="dead") == 1
    assert sample(families, "alwayson_events_dead_last_day") == 1
    assert sample(scrape(now=t0 + 2 * 24 * HOUR), "alwayson_events_dead_last_day") == 0


@pytest.mark.django_db
def test_live_processes_are_counted_by_kind(t0, settings):
    for kind, name in (("worker", "a"), ("worker", "b"), ("scheduler", "s")):
        ProcessBeat(kind, name).register(t0)

    families = scrape(now=t0 + SECOND)
    later = scrape(now=t0 + HOUR)

    assert [sample(families, "alwayson_processes", kind=k) for k in Process.Kind.values] == [
        2,
        1,
        0,
    ]
    assert sample(later, "alwayson_processes", kind="worker") == 0


# --- runs, counted by the worker -----------------------------------------------------------


def thief_takes_over(run, then=None):
    """Another worker takes the lease as if this run had stalled past its TTL."""
    future = clock.resolve(None) + 2 * timedelta(seconds=settings.ALWAYSON_LEASE_TTL)
    acquire(run.inbox, "thief", now=future)
    if then:
        then(run)


def agent_for(behaviour):
    def agent(run):
        if behaviour == "say":
            run.say("done")
        elif behaviour == "fail":
            raise RuntimeError("model API down")
        elif behaviour == "defer":
            run.defer("budget spent", delay=timedelta(minutes=5))
        elif behaviour == "stalled":
            thief_takes_over(run)
        elif behaviour == "stalled-then-renews":
            thief_takes_over(run, lambda r: r.renew())

    return agent


@pytest.mark.django_db
def test_each_run_is_counted_with_its_duration_by_outcome(
    make_inbox, django_capture_on_commit_callbacks
):
    behaviours = {
        "say": "done",
        "fail": "error",
        "defer": "deferred",
        "stalled": "refused",
        "stalled-then-renews": "lost",
    }
    for n, behaviour in enumerate(behaviours):
        inbox = make_inbox(f"run-{n}")
        ingest(inbox, "chat", "a")
        ingest(inbox, "chat", "b")
        with django_capture_on_commit_callbacks(execute=True):
            result = Worker("w", agent=agent_for(behaviour)).step()
        assert result.inbox == inbox.slug and result.events == 2
    assert Worker("w", agent=agent_for("say")).step() is None  # nothing to claim: no run

    families = scrape()

    for outcome in RUN_OUTCOMES:
        assert runs(families, outcome) == 1, outcome
        assert (
            sample(families, "alwayson_run_events", "alwayson_run_events_total", outcome=outcome)
            == 2
        )
        counts = list(buckets(families, "alwayson_run_duration_seconds", outcome=outcome).values())
        assert counts == sorted(counts) and counts[-1] == 1  # cumulative, +Inf last
    total = sum(
        sample(
            families,
            "alwayson_run_duration_seconds",
            "alwayson_run_duration_seconds_sum",
            outcome=o,
        )
        for o in RUN_OUTCOMES
    )
    assert total > 0
    assert sample(families, "alwayson_finishes_refused", "alwayson_finishes_refused_total") == 1
    # Both stalled runs had their lease taken over after it lapsed.
    assert sample(families, "alwayson_lease_takeovers", "alwayson_lease_takeovers_total") == 2


@pytest.mark.django_db
def test_a_takeover_counts_only_a_lapsed_lease_not_a_released_or_renewed_one(
    inbox, t0, ttl, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        gen = acquire(inbox, "a", now=t0)  # never held: not a takeover
        acquire(inbox, "a", now=t0 + SECOND)  # renewed
        from inbox.services import release

        release(inbox, "a", gen)
        acquire(inbox, "b", now=t0 + 2 * SECOND)  # released before: not a takeover
        acquire(inbox, "c", now=t0 + 2 * SECOND + ttl + SECOND)  # lapsed: a takeover

    assert sample(scrape(), "alwayson_lease_takeovers", "alwayson_lease_takeovers_total") == 1


@pytest.mark.django_db
def test_a_takeover_rolled_back_is_not_counted(inbox, t0, ttl, django_capture_on_commit_callbacks):
    from django.db import transaction

    acquire(inbox, "a", now=t0)
    with django_capture_on_commit_callbacks(execute=True) as callbacks, transaction.atomic():
        acquire(inbox, "b", now=t0 + ttl + SECOND)
        transaction.set_rollback(True)

    assert callbacks == []
    assert sample(scrape(), "alwayson_lease_takeovers", "alwayson_lease_takeovers_total") == 0


# --- outbox, timers, approvals --------------------------------------------------------------


@pytest.mark.django_db
def test_held_and_failed_messages_and_the_send_latency_from_queued_to_sent(
    make_inbox, t0, settings, django_capture_on_commit_callbacks
):
    settings.ALWAYSON_OUTBOX_MAX_ATTEMPTS = 1
    good, broken = make_inbox("good"), make_inbox("broken")
    for inbox in (good, broken):
        ingest(inbox, "chat", "1", now=t0)
        gen = acquire(inbox, "w", now=t0)
        ids = [e.pk for e in claim_batch(inbox, "w", gen, now=t0)]
        finish(Held(inbox, "w", gen, ids), [Say(inbox.pk, "one"), Say(inbox.pk, "two")], now=t0)
    held = scrape(now=t0)

    def send(delivery):
        if delivery.inbox.pk == broken.pk:
            raise SendFailed("503 from the receiver")

    with django_capture_on_commit_callbacks(execute=True):
        assert dispatch(send=send, now=t0 + 90 * SECOND) == 2
    families = scrape(now=t0 + 90 * SECOND)

    assert sample(held, "alwayson_outbox_messages", status="held") == 4
    assert sample(families, "alwayson_outbox_messages", status="held") == 0
    assert sample(families, "alwayson_outbox_messages", status="failed") == 2
    latency = "alwayson_outbox_send_latency_seconds"
    assert sample(families, latency, f"{latency}_count") == 2
    assert sample(families, latency, f"{latency}_sum") == 180
    assert buckets(families, latency)["60.0"] == 0
    assert buckets(families, latency)["300.0"] == 2


@pytest.mark.django_db
def test_an_at_most_once_send_is_counted_once_it_went_out(
    inbox, t0, django_capture_on_commit_callbacks
):
    Channel.objects.create(inbox=inbox, mode=Channel.Mode.AT_MOST_ONCE)
    ingest(inbox, "chat", "1", now=t0)
    gen = acquire(inbox, "w", now=t0)
    ids = [e.pk for e in claim_batch(inbox, "w", gen, now=t0)]
    finish(Held(inbox, "w", gen, ids), [Say(inbox.pk, "hi")], now=t0)

    with django_capture_on_commit_callbacks(execute=True):
        dispatch(send=lambda delivery: None, now=t0 + 4 * SECOND)

    families = scrape()
    latency = "alwayson_outbox_send_latency_seconds"
    assert sample(families, latency, f"{latency}_count") == 1
    assert sample(families, latency, f"{latency}_sum") == 4


@pytest.mark.django_db
def test_timer_lag_is_how_late_the_scheduler_fired_and_overdue_grows_until_then(
    inbox, t0, django_capture_on_commit_callbacks
):
    add_timer(inbox, "digest", due=t0, now=t0 - HOUR)
    add_timer(inbox, "tick", due=t0 + 5 * SECOND, every=60, now=t0 - HOUR)
    overdue = scrape(now=t0 + 7 * SECOND)

    with django_capture_on_commit_callbacks(execute=True):
        assert run_scheduler(now=t0 + 7 * SECOND) == 2
    families = scrape(now=t0 + 7 * SECOND)

    assert sample(overdue, "alwayson_timer_overdue_seconds") == 7
    assert sample(families, "alwayson_timer_overdue_seconds") == 0  # next tick is due later
    lag = "alwayson_timer_lag_seconds"
    assert sample(families, lag, f"{lag}_count") == 2
    assert sample(families, lag, f"{lag}_sum") == 7 + 2
    assert buckets(families, lag)["2.0"] == 1
    assert buckets(families, lag)["10.0"] == 2


@pytest.mark.django_db
def test_approvals_waiting_overdue_and_settled_by_answer(
    inbox, t0, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        request_approval(inbox, "refund-1", "refund order 1", HOUR, now=t0)
        request_approval(inbox, "refund-2", "refund order 2", HOUR, now=t0)
        request_approval(inbox, "refund-3", "refund order 3", 3 * HOUR, now=t0)
        answer_approval(inbox, "refund-2", "yes", now=t0 + SECOND)
    waiting = scrape(now=t0 + 2 * SECOND)
    overdue = scrape(now=t0 + 2 * HOUR)

    with django_capture_on_commit_callbacks(execute=True):
        run_scheduler(now=t0 + 2 * HOUR)  # the expiry of refund-1
    families = scrape(now=t0 + 2 * HOUR)

    assert sample(waiting, "alwayson_approvals", state="waiting") == 2
    assert sample(overdue, "alwayson_approvals", state="waiting") == 1
    assert sample(overdue, "alwayson_approvals", state="overdue") == 1
    assert sample(families, "alwayson_approvals", state="overdue") == 0
    settled = "alwayson_approvals_settled"
    assert sample(families, settled, f"{settled}_total", answer="expired") == 1
    assert sample(families, settled, f"{settled}_total", answer="yes") == 1
    assert sample(families, settled, f"{settled}_total", answer="no") == 0


# --- counts that add up ---------------------------------------------------------------------


@pytest.mark.django_db
def test_a_loop_process_keeps_counts_until_its_heartbeat_adds_them(recorder, t0):
    beat = ProcessBeat("worker", "w")
    beat.start()  # batched from here on
    try:
        metrics.LEASE_TAKEOVERS.inc()
        metrics.LEASE_TAKEOVERS.inc()
        metrics.TIMER_LAG.observe(3)
        assert not MetricTotal.objects.exists()
        assert recorder.pending()
    finally:
        beat.stop()  # the last flush

    assert not recorder.pending() and not recorder.batched
    families = scrape()
    assert sample(families, "alwayson_lease_takeovers", "alwayson_lease_takeovers_total") == 2
    assert sample(families, "alwayson_timer_lag_seconds", "alwayson_timer_lag_seconds_count") == 1


@pytest.mark.django_db(transaction=True)
def test_a_web_process_adds_its_counts_from_a_thread_and_the_rest_when_it_exits(recorder):
    """gunicorn_conf's post_worker_init and worker_exit: a request's count costs it no
    transaction; the thread adds it, and the exit what the thread had not."""
    stop = metrics.flush_periodically(interval=0.05)
    try:
        metrics.LEASE_TAKEOVERS.inc()
        deadline = time.monotonic() + 20  # a bound on the wait, not a measure
        while not MetricTotal.objects.exists():
            assert time.monotonic() < deadline, "the thread never added the count"
            time.sleep(0.01)
    finally:
        stop()
    assert not recorder.batched

    stop = metrics.flush_periodically(interval=3600)
    metrics.LEASE_TAKEOVERS.inc()
    assert recorder.pending()
    stop()
    assert not recorder.pending()
    assert sample(scrape(), "alwayson_lease_takeovers", "alwayson_lease_takeovers_total") == 2


@pytest.mark.django_db
def test_flushes_add_to_the_totals_instead_of_replacing_them(recorder):
    recorder.batched = True
    for amount in (3, 4):
        metrics.RUN_EVENTS.inc(amount, outcome="done")
        metrics.RUN_DURATION.observe(0.2, outcome="done")
        assert recorder.flush() == 3  # the counter, the bucket, the sum

    families = scrape()
    assert sample(families, "alwayson_run_events", "alwayson_run_events_total", outcome="done") == 7
    assert runs(families, "done") == 2
    assert buckets(families, "alwayson_run_duration_seconds", outcome="done")["0.1"] == 0
    assert buckets(families, "alwayson_run_duration_seconds", outcome="done")["0.25"] == 2
    assert MetricTotal.objects.count() == 3


@pytest.mark.django_db
def test_counts_survive_a_failed_flush(recorder, monkeypatch):
    from django.db import OperationalError

    recorder.batched = True
    metrics.LEASE_TAKEOVERS.inc()

    def down(rows):
        raise OperationalError("the database went away")

    with monkeypatch.context() as patched:
        patched.setattr(metrics.recorder, "_add_totals", down)
        with pytest.raises(OperationalError):
            recorder.flush()
    metrics.LEASE_TAKEOVERS.inc()
    recorder.flush()

    assert sample(scrape(), "alwayson_lease_takeovers", "alwayson_lease_takeovers_total") == 2


def test_a_label_that_is_not_declared_is_refused():
    with pytest.raises(ValueError, match="labels must be"):
        metrics.RUN_EVENTS.inc(outcome="done", inbox="desk")


def runworker(worker_id):
    import os

    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "ALWAYSON_AGENT": "tests.support.agents.worker_echo_agent",
    }
    return subprocess.Popen(
        [sys.executable, "manage.py", "runworker", "--once", "--concurrency", "2"]
        + ["--worker-id", worker_id],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def finished(proc):
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output.decode(errors="replace")


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_runs_counted_by_several_processes_add_up(make_inbox):
    first = [make_inbox(f"first-{n}") for n in range(6)]
    for inbox in first:
        ingest(inbox, "chat", "1")
    finished(runworker("one"))  # alone, then exits: its counts must outlive it
    second = [make_inbox(f"second-{n}") for n in range(20)]
    for inbox in second:
        ingest(inbox, "chat", "1")
    two, three = runworker("two"), runworker("three")  # at once, flushing the same rows
    finished(two)
    finished(three)
    here = make_inbox("here")
    ingest(here, "chat", "1")
    assert Worker("here", agent=agent_for("say")).step().events == 1

    families = scrape()

    by_process = dict(Process.objects.values_list("worker_id", "runs"))
    assert by_process["one"] == 6 and by_process["two"] + by_process["three"] == 20
    assert runs(families, "done") == 6 + 20 + 1
    assert (
        sample(families, "alwayson_run_events", "alwayson_run_events_total", outcome="done") == 27
    )
    assert buckets(families, "alwayson_run_duration_seconds", outcome="done")["+Inf"] == 27
    # One row per series and bucket, whichever process wrote it.
    assert MetricTotal.objects.filter(name="alwayson_run_events").count() == 1
