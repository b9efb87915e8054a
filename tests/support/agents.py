"""Test agents: callables a worker runs, named by ALWAYSON_AGENT or passed to Worker."""


# --- process agents (tests/processes/test_worker_processes_pg.py) ---------------------------------
# Loaded by real `runworker` subprocesses through ALWAYSON_AGENT. They write what each run did
# to two side tables (PROCESS_TABLES, created by the test), on the database's clock, outside
# the run's transaction: a record of what happened even for a run whose finish is refused.

import os as _os
import time as _time
from pathlib import Path as _Path

PROCESS_TABLES = (
    """
    CREATE TABLE IF NOT EXISTS test_worker_runs (
        id bigserial PRIMARY KEY,
        inbox_id bigint NOT NULL,
        holder text NOT NULL,
        generation bigint NOT NULL,
        pid integer NOT NULL,
        event_ids bigint[] NOT NULL,
        host_now timestamptz NOT NULL,
        started timestamptz NOT NULL DEFAULT clock_timestamp(),
        ended timestamptz
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS test_worker_effects (
        id bigserial PRIMARY KEY,
        run_id bigint NOT NULL,
        event_id bigint NOT NULL,
        fresh boolean NOT NULL,
        at timestamptz NOT NULL DEFAULT clock_timestamp()
    )
    """,
)

#: seconds a blocked run waits for its release file before it gives up (and fails the run)
BLOCK_LIMIT = float(_os.environ.get("TEST_AGENT_BLOCK_LIMIT", "60"))


def recording_agent(run):
    """Record the run's start and end, refund once per event under its idempotency key, and
    say one message per run.

    Event payload keys it honours:
      sleep          seconds to sleep in the run (the longest in the batch)
      started_file   a path touched once the run has started
      block_holder   with release_file: if this run's holder is block_holder, wait (bounded by
      release_file   BLOCK_LIMIT) until release_file exists before doing anything else
    """
    from django.db import connection
    from django.utils import timezone

    from alwayson.demo import payments

    payloads = [event.payload for event in run.events]
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO test_worker_runs (inbox_id, holder, generation, pid, event_ids, host_now)"
            " VALUES (%s, %s, %s, %s, %s, %s) RETURNING id",
            [
                run.inbox.pk,
                run.holder,
                run.generation,
                _os.getpid(),
                [event.pk for event in run.events],
                timezone.now(),
            ],
        )
        run_id = cursor.fetchone()[0]
    for payload in payloads:
        if payload.get("started_file"):
            _Path(payload["started_file"]).touch()
    for payload in payloads:
        if payload.get("block_holder") == run.holder:
            release = _Path(payload["release_file"])
            deadline = _time.monotonic() + BLOCK_LIMIT
            while not release.exists():
                if _time.monotonic() > deadline:
                    raise RuntimeError(f"{release} never appeared")
                _time.sleep(0.01)
    pause = max(float(payload.get("sleep", 0)) for payload in payloads)
    if pause:
        _time.sleep(pause)
    for event in run.events:
        order = f"{run.inbox.slug}/{event.source_id}"[:50]
        fresh = payments.refund(order, idempotency_key=run.key("refund", event))
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO test_worker_effects (run_id, event_id, fresh) VALUES (%s, %s, %s)",
                [run_id, event.pk, fresh],
            )
    run.say(f"handled {len(run.events)} event(s)")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE test_worker_runs SET ended = clock_timestamp() WHERE id = %s", [run_id]
        )


def spending_agent(run):
    """Spend outside the database until stopped: POST after POST to the egress service
    "outside", each naming the run, paced a little; it never looks at its lease itself
    (tests/processes/test_blackhole_pg.py: alwayson must stop it)."""
    spent = 0
    while True:
        run.http.post(
            "outside",
            "/spend",
            json={"holder": run.holder, "generation": run.generation, "n": spent},
        )
        spent += 1
        _time.sleep(0.05)


# --- in-process agents (tests/runtime/test_worker.py) ---------------------------------------------
# Named by `runworker --agent` in tests that call the command in-process.


def worker_echo_agent(run):
    """Say one message per run: the texts of its events, oldest first."""
    texts = [str(event.payload.get("text", event.source_id)) for event in run.events]
    run.say("echo: " + " | ".join(texts))
