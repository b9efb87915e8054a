"""Is alwayson up? Loop processes' heartbeats, and the check /healthz and `status` share.

Every loop process (runworker, runscheduler, rundispatcher) keeps one `Process` row through a
`ProcessBeat`: written when it starts, beaten every ALWAYSON_HEARTBEAT_INTERVAL seconds and
marked stopped when it exits cleanly. The beats come from a thread of their own, outside any
work transaction, so an agent run of ten minutes or a slow send does not make its process
look lost; a process that is killed, hangs in its beat, or loses the database does.

The check is healthy when the database answers and each kind named by
ALWAYSON_HEALTH_REQUIRE has at least one live process. Beside the checks, /healthz reports
whether the database can lose an acknowledged commit (durability.py): a warning for the
operator, never a 503 (a load balancer would take every web process out for a setting).
"""

import logging
import os
import socket
import threading
from dataclasses import dataclass

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection
from django.http import HttpResponseNotAllowed, JsonResponse
from django.utils.log import log_response

import alwayson
from alwayson.ops import durability, metrics
from alwayson.ops.models import Process
from inbox import clock

log = logging.getLogger("alwayson.health")

OK, FAILING, UNKNOWN = "ok", "failing", "unknown"


class ProcessBeat:
    """This process's `Process` row, beaten from a thread of its own."""

    def __init__(self, kind: str, worker_id: str):
        if kind not in Process.Kind.values:
            raise ValueError(f"kind must be one of {Process.Kind.values}, not {kind!r}")
        self.kind = kind
        self.worker_id = worker_id
        self.pk = None
        self.runs = 0
        self._runs_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="process-beat", daemon=True)

    def count_run(self):
        with self._runs_lock:
            self.runs += 1

    def register(self, now=None) -> Process:
        """A new row for this process, after pruning rows whose last beat is a day old."""
        now = clock.resolve(now)
        Process.objects.prune(now)
        row = Process.objects.create(
            kind=self.kind,
            worker_id=self.worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            started=now,
            last_beat=now,
            runs=self.runs,
            version=alwayson.__version__,
        )
        self.pk = row.pk
        return row

    def beat(self, now=None):
        """Compare-and-set the last beat and the run count on this process's row, if it is
        still a running row. A stopped row stays stopped: a beat that lost the race with the
        goodbye must not bring it back. Gone (pruned after this process was paused for a day,
        or never written because the database was down at start): register again."""
        if self.pk is not None:
            now = clock.resolve(now)
            if Process.objects.running().filter(pk=self.pk).update(last_beat=now, runs=self.runs):
                return
            if Process.objects.filter(pk=self.pk).exists():
                return
        self.register(now)

    def mark_stopped(self, now=None) -> bool:
        if self.pk is None:
            return False
        now = clock.resolve(now)
        return bool(
            Process.objects.running()
            .filter(pk=self.pk)
            .update(last_beat=now, stopped=now, runs=self.runs)
        )

    def start(self):
        """Register (a database outage leaves that to the first beat) and start beating;
        from now on this process's metrics are flushed with each beat."""
        metrics.recorder.RECORDER.batched = True
        try:
            self.register()
        except DatabaseError:
            log.warning("could not register %s %s; beats retry", self.kind, self.worker_id)
        self._thread.start()

    def stop(self, clean=True):
        """Stop beating; on a clean exit (after the last unit of work, so no beat can follow
        the goodbye) mark the row stopped. A crash leaves it to turn lost."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._flush_metrics()
        metrics.recorder.RECORDER.batched = False
        if not clean:
            return
        try:
            self.mark_stopped()
        except DatabaseError:
            log.warning("could not mark %s %s stopped", self.kind, self.worker_id)

    def _flush_metrics(self):
        try:
            metrics.flush()
        except DatabaseError:
            log.warning("could not add metrics to the database; kept for the next beat")

    def _loop(self):
        try:
            while not self._stop.wait(settings.ALWAYSON_HEARTBEAT_INTERVAL):
                close_old_connections()
                # Before the beat: the beat's write stays the session's last statement.
                self._flush_metrics()
                try:
                    self.beat()
                except DatabaseError:
                    log.warning("heartbeat could not reach the database", exc_info=True)
                    connection.close()
        finally:
            connection.close()


@dataclass
class Health:
    """Each check's outcome, in order: the database, then each required kind of process."""

    checks: dict[str, str]

    @property
    def ok(self) -> bool:
        return all(outcome == OK for outcome in self.checks.values())

    @property
    def failing(self) -> list[str]:
        return [name for name, outcome in self.checks.items() if outcome != OK]

    def as_json(self):
        return {
            "status": OK if self.ok else FAILING,
            "version": alwayson.__version__,
            "checks": self.checks,
        }


def check(now=None) -> Health:
    required = settings.ALWAYSON_HEALTH_REQUIRE
    try:
        now = clock.resolve(now)
        live = set(Process.objects.live(now).values_list("kind", flat=True).distinct())
    except DatabaseError as exc:
        # One line: a load balancer polls this every few seconds through an outage.
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log.warning("health check: the database is unavailable: %s", reason)
        return Health({"database": FAILING} | dict.fromkeys(required, UNKNOWN))
    return Health({"database": OK} | {kind: OK if kind in live else FAILING for kind in required})


class HealthCheckMiddleware:
    """Answers GET /healthz first, before the host check and the HTTPS redirect: a load
    balancer or an orchestrator probes the app over plain http under an address of its own.
    No authentication, and nothing beyond which check is ok or failing, the database's
    durability verdict and the version that answers (so a rolling upgrade can be watched).
    200 when healthy, 503 when not (logged at INFO), never cached."""

    PATHS = ("/healthz", "/healthz/")

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path_info not in self.PATHS:
            return self.get_response(request)
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "HEAD"])
        health = check()
        # Its verdict only: which standbys and settings stay for check --deploy and `status`.
        found = health.as_json() | {"durability": durability.cached().status}
        response = JsonResponse(found, status=200 if health.ok else 503)
        response["Cache-Control"] = "no-store"
        if not health.ok:
            # The answer a probe asks for (every start-up gives a few), not a server error,
            # which is how Django would log a 503 (ERROR django.request): logged here once,
            # as information, naming what fails, and so not again by Django.
            log_response(
                "health check failing: %s",
                ", ".join(health.failing),
                response=response,
                request=request,
                logger=log,
                level="info",
            )
        return response
