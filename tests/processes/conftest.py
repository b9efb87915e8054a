"""Fixtures of the process tests: `runworker` subprocesses and the recording agent's tables."""

import os

import pytest


@pytest.fixture
def side_tables(transactional_db):
    """The recording agent's side tables (tests/support/agents.py), created and emptied."""
    from django.db import connection

    from tests.support.agents import PROCESS_TABLES

    with connection.cursor() as cursor:
        for ddl in PROCESS_TABLES:
            cursor.execute(ddl)
        cursor.execute("TRUNCATE test_worker_runs, test_worker_effects RESTART IDENTITY")


@pytest.fixture
def spawn(side_tables, tmp_path):
    """Start `runworker` subprocesses; all are killed at teardown, before the db flush."""
    from tests.support.processes import start_command, wait_for
    from tests.support.workers import AGENT, START_TIMEOUT, WorkerProcess, _exited, listening

    started = []

    def start(worker_id, *args, env=None, wait_listening=True, pythonpath=None):
        environment = {"ALWAYSON_AGENT": AGENT, "ALWAYSON_RETRY_BASE": "1", **(env or {})}
        if pythonpath:
            environment["PYTHONPATH"] = os.pathsep.join(
                [str(pythonpath), *filter(None, [os.environ.get("PYTHONPATH")])]
            )
        log_path = tmp_path / f"{worker_id}.log"
        proc = start_command("runworker", ["--worker-id", worker_id, *args], log_path, environment)
        worker = WorkerProcess(worker_id, proc, log_path)
        started.append(worker)
        if wait_listening:
            wait_for(
                lambda: listening(worker) or _exited(worker),
                START_TIMEOUT,
                f"{worker_id} to LISTEN",
            )
            assert worker.alive(), f"{worker_id} exited early:\n{worker.log()}"
        return worker

    yield start
    for worker in started:
        worker.kill()
