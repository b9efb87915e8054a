"""`runworker` processes on the PostgreSQL test database, running the recording agent
(tests/support/agents.py), and what they recorded in its side tables."""

import contextlib
import signal
import subprocess

import pytest
from django.db import connection

from inbox.models import Inbox
from inbox.services import WORK_CHANNEL

AGENT = "tests.support.agents.recording_agent"
# Seconds for a worker to start and LISTEN: a bound on a failure, not a figure (a healthy
# start returns at its LISTEN). A Claude agent's worker, started beside three suites on 2
# cores, took over 20 s in CI.
START_TIMEOUT = 60
STOP_TIMEOUT = 15  # seconds for a worker to exit after SIGTERM


class WorkerProcess:
    def __init__(self, worker_id, proc, log_path):
        self.worker_id = worker_id
        self.proc = proc
        self.log_path = log_path

    @property
    def pid(self):
        return self.proc.pid

    def log(self):
        return self.log_path.read_text(errors="replace")

    def send(self, signum):
        self.proc.send_signal(signum)

    def alive(self):
        return self.proc.poll() is None

    def wait(self, timeout=STOP_TIMEOUT):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.worker_id} still running after {timeout}s\n{self.log()}")

    def stop(self, timeout=STOP_TIMEOUT):
        """SIGTERM and the exit code."""
        self.send(signal.SIGTERM)
        return self.wait(timeout)

    def runs_logged(self):
        return [line for line in self.log().splitlines() if " run inbox=" in line]

    def kill(self):
        if self.alive():
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def _exited(worker):
    return not worker.alive()


def listening(worker):
    """The worker's LISTEN connection is up (its slots were woken once it was)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = %s AND query = %s",
            [f"alwayson-worker {worker.worker_id}"[:63], f"LISTEN {WORK_CHANNEL}"],
        )
        return cursor.fetchone()[0] == 1


def make_inboxes(django_user_model, prefix, count):
    owner = django_user_model.objects.create_user(username=f"{prefix}-owner")
    return [Inbox.objects.create(owner=owner, slug=f"{prefix}-{n:03d}") for n in range(count)]


def runs(inbox=None):
    """The recorded runs, oldest first, as dicts."""
    sql = (
        "SELECT id, inbox_id, holder, generation, pid, event_ids, host_now, started, ended"
        " FROM test_worker_runs"
    )
    params = []
    if inbox is not None:
        sql += " WHERE inbox_id = %s"
        params.append(inbox.pk)
    with connection.cursor() as cursor:
        cursor.execute(sql + " ORDER BY started, id", params)
        columns = [c.name for c in cursor.description]
        return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]


def effects():
    """(run id, event id, fresh) per side-effect attempt, in order."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT run_id, event_id, fresh FROM test_worker_effects ORDER BY id")
        return cursor.fetchall()
