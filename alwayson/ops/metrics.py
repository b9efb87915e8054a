"""Prometheus metrics: /metrics, behind a bearer token (ALWAYSON_METRICS_TOKEN).

Two sources, both read from the database at scrape, so any web process answers for the
whole deployment and every process's counts add up:

- **State** (gauges): counted at scrape by `DatabaseCollector`, each with one cheap query on
  an index the workers already use (tests/ops/test_metrics.py asserts the plans on PostgreSQL).
- **Happenings** (counters, histograms): counted in memory by the process where they happen
  (runs in a worker, timer fires in a scheduler, sends in a dispatcher, lease takeovers) and
  added to `MetricTotal` rows by an upsert that adds (`value = value + excluded.value`):
  every heartbeat from a loop process's beat thread (`ProcessBeat`), at once elsewhere (a web
  process, a test, a script). Never inside a run's transaction: what happens inside a
  transaction is counted when it commits (`on_commit`), so a rolled-back takeover or send
  is not counted. A process killed outright loses at most one heartbeat's counts.

prometheus_client is imported where a scrape needs it: the loop processes only count.
"""

import hmac
import json
import logging
import math
import threading
from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Count, Min
from django.http import Http404, HttpResponse, HttpResponseNotAllowed
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from alwayson.ops import durability
from alwayson.ops.models import MetricTotal, Process
from approvals.models import APPROVAL_SOURCE, Approval
from inbox import clock
from inbox.models import Event, Inbox, Lease, RunRecord
from inbox.signals import lease_taken_over, reserved_event_stored
from outbox.models import Notice, OutboxMessage
from outbox.signals import messages_sent
from timers.models import Timer
from timers.signals import timer_fired

log = logging.getLogger("alwayson.metrics")

INF = math.inf
RUN_OUTCOMES = tuple(RunRecord.Outcome.values)


# --- what processes count ----------------------------------------------------------------


class Recorder:
    """This process's counts not yet added to the database, by (name, labels, bucket).

    `batched` is set while a heartbeat thread flushes every ALWAYSON_HEARTBEAT_INTERVAL;
    otherwise every count is flushed as it is made (a web process's few, a test's).
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, str, str], float] = defaultdict(float)
        self.batched = False

    def add(self, items):
        with self._lock:
            for key, amount in items:
                self._pending[key] += amount
        if not self.batched:
            try:
                self.flush()
            except DatabaseError:
                log.warning("could not add metrics to the database; kept for the next try")

    def pending(self) -> dict:
        with self._lock:
            return dict(self._pending)

    def flush(self) -> int:
        """Add the pending counts to MetricTotal in one statement; the rows written.

        Keys in sorted order, so two processes flushing at once lock the shared rows in one
        order and never deadlock. On a database error the counts are kept for the next try.
        """
        with self._lock:
            taken, self._pending = self._pending, defaultdict(float)
        if not taken:
            return 0
        rows = sorted(taken.items())
        try:
            _add_totals(rows)
        except BaseException:
            with self._lock:
                for key, amount in rows:
                    self._pending[key] += amount
            raise
        return len(rows)


RECORDER = Recorder()


def _add_totals(rows):
    table = connection.ops.quote_name(MetricTotal._meta.db_table)
    values = ", ".join(["(%s, %s, %s, %s)"] * len(rows))
    params = [
        part for (name, labels, bucket), amount in rows for part in (name, labels, bucket, amount)
    ]
    # A transaction of its own, or a savepoint: a failed flush never spoils a caller's.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (name, labels, bucket, value) VALUES {values}"
            f" ON CONFLICT (name, labels, bucket)"
            f" DO UPDATE SET value = {table}.value + excluded.value",
            params,
        )


def flush() -> int:
    return RECORDER.flush()


def flush_periodically(interval):
    """From now on this process's counts are added every `interval` seconds by a thread of
    its own, as a loop process's beat adds them: a web process's requests (an approval's
    answer, counted at its commit) then cost no transaction and no WAL flush of their own.
    A process killed outright loses at most one interval's counts. Returns the function that
    stops the thread and adds what is left (a worker process's exit)."""
    RECORDER.batched = True
    stopping = threading.Event()

    def add_every_interval():
        while not stopping.wait(interval):
            _flush_apart()

    thread = threading.Thread(target=add_every_interval, name="metrics", daemon=True)
    thread.start()

    def stop():
        stopping.set()
        thread.join(timeout=10)
        RECORDER.batched = False
        _flush_apart()

    return stop


def _flush_apart():
    try:
        RECORDER.flush()
    except DatabaseError:
        log.warning("could not add metrics to the database; kept for the next try")
    finally:
        connection.close()  # this thread's: back to the pool, or closed, until the next count


def _labels(labelnames, labels) -> str:
    if set(labels) != set(labelnames):
        raise ValueError(f"labels must be {sorted(labelnames)}, not {sorted(labels)}")
    return json.dumps({name: str(labels[name]) for name in sorted(labels)}, separators=(",", ":"))


@dataclass(frozen=True)
class Counter:
    name: str  # without _total: the exposition adds it
    documentation: str
    labelnames: tuple = ()
    # Label values always shown, at 0 until counted: {"outcome": RUN_OUTCOMES}.
    known: tuple = ()

    def inc(self, amount=1, **labels):
        RECORDER.add([((self.name, _labels(self.labelnames, labels), ""), amount)])

    def family(self, totals):

        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        series = {labels: values.get("", 0.0) for labels, values in totals.items()}
        for labels in _known_series(self.labelnames, self.known):
            series.setdefault(labels, 0.0)
        for labels, value in sorted(series.items()):
            family.add_metric(_label_values(labels, self.labelnames), value)
        return family


@dataclass(frozen=True)
class Histogram:
    name: str
    documentation: str
    buckets: tuple  # upper bounds, ascending, without +Inf
    labelnames: tuple = ()
    known: tuple = ()

    def observe(self, value, **labels):
        self.observe_many([value], **labels)

    def observe_many(self, values, **labels):
        """Observations of one series, counted as one addition (one flush, not one each)."""
        labels = _labels(self.labelnames, labels)
        items = [((self.name, labels, "sum"), sum(values))]
        for value in values:
            items.append(((self.name, labels, _bound_text(self.bucket_of(value))), 1))
        RECORDER.add(items)

    def bucket_of(self, value) -> float:
        """The smallest bound at or above `value`: a row per bucket, made cumulative at scrape."""
        index = bisect_left(self.buckets, value)
        return self.buckets[index] if index < len(self.buckets) else INF

    def family(self, totals):

        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        series = dict(totals)
        for labels in _known_series(self.labelnames, self.known):
            series.setdefault(labels, {})
        bounds = (*self.buckets, INF)
        for labels, values in sorted(series.items()):
            counts = [0.0] * len(bounds)
            for bucket, value in values.items():
                if bucket != "sum":
                    # A bound from an older release falls in the next bound of this one.
                    counts[bounds.index(self.bucket_of(float(bucket)))] += value
            cumulative, running = [], 0.0
            for bound, count in zip(bounds, counts, strict=True):
                running += count
                cumulative.append((floatToGoString(bound), running))
            family.add_metric(
                _label_values(labels, self.labelnames), cumulative, sum_value=values.get("sum", 0.0)
            )
        return family


def _bound_text(bound) -> str:
    """A bucket's upper bound as stored: "0.5", "600.0", "+Inf"."""
    return "+Inf" if bound == INF else repr(float(bound))


def _known_series(labelnames, known):
    if not labelnames:
        return ["{}"]
    if not known:
        return []
    (name,) = labelnames
    return [_labels(labelnames, {name: value}) for value in known]


def _label_values(labels, labelnames):
    parsed = json.loads(labels)
    return [parsed.get(name, "") for name in labelnames]


SECONDS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

RUN_DURATION = Histogram(
    "alwayson_run_duration_seconds",
    "Agent runs (a claim that found events) from claim to finish, by outcome.",
    SECONDS_BUCKETS,
    ("outcome",),
    RUN_OUTCOMES,
)
RUN_EVENTS = Counter(
    "alwayson_run_events",
    "Events handled by agent runs, by the run's outcome.",
    ("outcome",),
    RUN_OUTCOMES,
)
LEASE_TAKEOVERS = Counter(
    "alwayson_lease_takeovers",
    "Acquires that took over a lease its holder had let lapse (a stalled or dead worker).",
)
FINISHES_REFUSED = Counter(
    "alwayson_finishes_refused",
    "Run finishes refused by the fence: the lease had moved on, nothing was committed.",
)
SEND_LATENCY = Histogram(
    "alwayson_outbox_send_latency_seconds",
    "Outbox messages sent, from queued (the run's finish) to sent; the gap is part of it.",
    (1, 5, 15, 60, 300, 900, 1800, 3600, 7200, 21600, 86400),
)
TIMER_LAG = Histogram(
    "alwayson_timer_lag_seconds",
    "Timers fired, from their due time to the scheduler's firing.",
    (0.5, 1, 2, 5, 10, 30, 60, 300, 3600),
)
APPROVALS_SETTLED = Counter(
    "alwayson_approvals_settled",
    "Approvals settled, by the answer that stands (expired: nobody answered in time).",
    ("answer",),
    ("yes", "no", "expired"),
)
PERSISTED = (
    RUN_DURATION,
    RUN_EVENTS,
    LEASE_TAKEOVERS,
    FINISHES_REFUSED,
    SEND_LATENCY,
    TIMER_LAG,
    APPROVALS_SETTLED,
)


def record_run(result):
    """Count one worker step (alwayson/runtime/worker.py); a claim that found nothing is no run.
    A run fenced off mid-run is counted as lost: no finish of it was refused."""
    if not result.ran:
        return
    outcome = RunRecord.Outcome.LOST if result.fenced else result.recorded
    RUN_DURATION.observe(result.seconds, outcome=outcome.value)
    RUN_EVENTS.inc(result.events, outcome=outcome.value)
    if outcome == RunRecord.Outcome.REFUSED:
        FINISHES_REFUSED.inc()


# Signals from the apps below alwayson, each counted when its transaction commits.


def _count_takeover(sender, lease, now, **kwargs):
    transaction.on_commit(LEASE_TAKEOVERS.inc)


def _count_timer_fire(sender, timer, now, late_by, **kwargs):
    transaction.on_commit(lambda: TIMER_LAG.observe(max(late_by, 0.0)))


def _count_sent(sender, messages, at, **kwargs):
    latencies = [max((at - message.created).total_seconds(), 0.0) for message in messages]
    transaction.on_commit(lambda: SEND_LATENCY.observe_many(latencies))


def _count_settled(sender, event, now, **kwargs):
    if event.source != APPROVAL_SOURCE or not isinstance(event.payload, dict):
        return
    answer = event.payload.get("answer")
    if answer in Approval.Answer.values:
        transaction.on_commit(lambda: APPROVALS_SETTLED.inc(answer=answer))


def connect_signals():
    lease_taken_over.connect(_count_takeover, dispatch_uid="alwayson.metrics.takeover")
    timer_fired.connect(_count_timer_fire, dispatch_uid="alwayson.metrics.timer")
    messages_sent.connect(_count_sent, dispatch_uid="alwayson.metrics.sent")
    reserved_event_stored.connect(_count_settled, dispatch_uid="alwayson.metrics.settled")


# --- the scrape ----------------------------------------------------------------------------

DEAD_WINDOW = timedelta(days=1)


class DatabaseCollector:
    """Every family, read from the database at scrape (`now`: the database's clock)."""

    def __init__(self, now=None):
        self.now = now

    def collect(self):
        now = clock.resolve(self.now)
        yield from self.state(now)
        totals = defaultdict(lambda: defaultdict(dict))
        for name, labels, bucket, value in MetricTotal.objects.values_list(
            "name", "labels", "bucket", "value"
        ):
            totals[name][labels][bucket] = value
        for metric in PERSISTED:
            yield metric.family(totals.get(metric.name, {}))

    def state(self, now):

        events = GaugeMetricFamily(
            "alwayson_events",
            "Events pending, running or dead, by inbox slug (inboxes with none are left out).",
            labels=["inbox", "status"],
        )
        counts = []
        # One query per status, each on that status's partial index (done events are not
        # counted: they are most of the table and no index covers them).
        for status, rows in (
            ("pending", Event.objects.pending()),  # event_pending_idx
            ("running", Event.objects.running()),  # event_running_idx
            ("dead", Event.objects.dead()),  # event_dead_idx
        ):
            for inbox_id, count in (
                rows.values("inbox_id")
                .annotate(n=Count("*"))
                .values_list("inbox_id", "n")
                .order_by()
            ):
                counts.append((inbox_id, status, count))
        slugs = dict(
            Inbox.objects.filter(pk__in={row[0] for row in counts}).values_list("pk", "slug")
        )
        for inbox_id, status, count in sorted(
            counts, key=lambda row: (slugs.get(row[0], ""), row[1])
        ):
            events.add_metric([slugs.get(inbox_id, str(inbox_id)), status], count)
        yield events

        dead = Event.objects.dead().filter(updated__gte=now - DEAD_WINDOW).count()  # event_dead_idx
        yield GaugeMetricFamily(
            "alwayson_events_dead_last_day",
            "Events that went dead in the last 24 hours.",
            value=dead,
        )

        # lease_work_idx: when the longest-waiting claimable work became claimable.
        oldest = Lease.objects.filter(work_at__isnull=False).aggregate(first=Min("work_at"))[
            "first"
        ]
        yield GaugeMetricFamily(
            "alwayson_oldest_pending_age_seconds",
            "Seconds the longest-waiting claimable event has waited (0: none waits).",
            value=_seconds_since(oldest, now),
        )

        outbox = GaugeMetricFamily(
            "alwayson_outbox_messages",
            "Outbox messages held (waiting for the gap or a retry) and failed (parked).",
            labels=["status"],
        )
        outbox.add_metric(["held"], OutboxMessage.objects.held().count())  # outbox_held_idx
        outbox.add_metric(["failed"], OutboxMessage.objects.failed().count())  # outbox_failed_idx
        yield outbox
        notices = GaugeMetricFamily(
            "alwayson_notices", "Notices to approvers held and failed (parked).", labels=["status"]
        )
        notices.add_metric(["held"], Notice.objects.held().count())  # notice_due_idx
        notices.add_metric(["failed"], Notice.objects.failed().count())  # notice_failed_idx
        yield notices

        # timer_due_idx: the earliest timer not yet fired.
        due = Timer.objects.filter(done=False).aggregate(first=Min("due"))["first"]
        yield GaugeMetricFamily(
            "alwayson_timer_overdue_seconds",
            "Seconds the most overdue timer is past its due time (0: none is due);"
            " it grows while no scheduler fires.",
            value=_seconds_since(due, now),
        )

        approvals = GaugeMetricFamily(
            "alwayson_approvals",
            "Approvals not answered: waiting for a person, or past the deadline with"
            " the expiry not yet fired (overdue).",
            labels=["state"],
        )
        unanswered = Approval.objects.filter(answer="")  # approval_waiting_idx
        approvals.add_metric(["waiting"], unanswered.filter(expires_at__gt=now).count())
        approvals.add_metric(["overdue"], unanswered.filter(expires_at__lte=now).count())
        yield approvals

        processes = GaugeMetricFamily(
            "alwayson_processes", "Loop processes with a live heartbeat, by kind.", labels=["kind"]
        )
        live = dict(
            Process.objects.live(now)
            .values("kind")
            .annotate(n=Count("*"))
            .values_list("kind", "n")
            .order_by()
        )  # process_beat_idx
        for kind in Process.Kind.values:
            processes.add_metric([kind], live.get(kind, 0))
        yield processes

        found = durability.cached()
        if found.status != durability.EMBEDDED:
            yield GaugeMetricFamily(
                "alwayson_database_at_risk",
                "1 when the database can lose a commit it acknowledged (synchronous_commit"
                " below on, or an asynchronous standby), 0 when it cannot, NaN when unknown.",
                value={durability.OK: 0, durability.AT_RISK: 1}.get(found.status, math.nan),
            )
            yield GaugeMetricFamily(
                "alwayson_database_asynchronous_standbys",
                "Standbys streaming from the database asynchronously: a failover to one loses"
                " the commits it had not received.",
                value=len(found.asynchronous),
            )


def _seconds_since(moment, now) -> float:
    if moment is None:
        return 0.0
    return max((now - moment).total_seconds(), 0.0)


def exposition(now=None) -> bytes:

    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(now))
    return generate_latest(registry)


# --- the endpoint --------------------------------------------------------------------------


class MetricsMiddleware:
    """Answers /metrics, early (like /healthz): a Prometheus server scrapes a web process at
    its own address over a private network, before the host check and the HTTPS redirect.

    Off unless ALWAYSON_METRICS_TOKEN is set: the site's 404, answered here too (gone on to
    the URLs, a request over plain http got the HTTPS redirect instead). With a token: 401
    without `Authorization: Bearer ...`, 403 with a wrong one (compared in constant time), 503
    while the database is unavailable. The right token gets the metrics over plain http too,
    not a redirect: by the time it arrives it has crossed in the clear, so a redirect would
    protect nothing and only break the scrape of gunicorn's own address on a private network;
    anywhere else a scrape goes through the TLS proxy (docs/how-to/operations.md#metrics).
    """

    PATHS = ("/metrics", "/metrics/")

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path_info not in self.PATHS:
            return self.get_response(request)
        token = settings.ALWAYSON_METRICS_TOKEN
        if not token:
            raise Http404("metrics are off: ALWAYSON_METRICS_TOKEN is not set")
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            response = HttpResponse(
                "a bearer token is required\n", status=401, content_type="text/plain"
            )
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
        if not hmac.compare_digest(given.strip().encode(), token.encode()):
            return HttpResponse("wrong token\n", status=403, content_type="text/plain")
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "HEAD"])
        try:
            body = exposition()
        except DatabaseError:
            log.warning("metrics: the database is unavailable", exc_info=True)
            return HttpResponse("database unavailable\n", status=503, content_type="text/plain")

        response = HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
        response["Cache-Control"] = "no-store"
        return response
