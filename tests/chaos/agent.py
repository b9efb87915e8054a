"""The agent the chaos run's workers run (ALWAYSON_AGENT=tests.chaos.agent.agent).

For each delivered event it performs one side effect into a ledger with a UNIQUE key, through
`run.key(...)`, outside the run's transaction, as a payments API would; a "yes" answer to an
approval performs another. The event's flags (the chaos plan's) make it sleep, ask for an
approval, schedule a one-off follow-up timer, speak urgently, or fail every time (poison).

Every run that gets to its finish says exactly one message, its run record (and writes it to
the inbox's memory, as a memory file of its own, through the same fenced finish):
`chaos-run inbox=... gen=... holder=... claimed=... events=...`. The message commits in the
run's fenced transaction, so the committed runs are exactly the messages, with the claim time
(the events' `updated`, stamped by the claim) and the finish time (the message's `created`).
"""

import re
import time
from datetime import datetime, timedelta

from django.db import connection

# The ledger: one row per side effect, keyed by the caller's idempotency key. The attempts
# table records every call, including those the key refused.
LEDGER_TABLES = (
    """
    CREATE TABLE IF NOT EXISTS chaos_ledger (
        key text PRIMARY KEY,
        inbox_id bigint NOT NULL,
        source text NOT NULL,
        source_id text NOT NULL,
        kind text NOT NULL,
        holder text NOT NULL,
        generation bigint NOT NULL,
        at timestamptz NOT NULL DEFAULT clock_timestamp()
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS chaos_effect_attempts (
        id bigserial PRIMARY KEY,
        key text NOT NULL,
        fresh boolean NOT NULL,
        holder text NOT NULL,
        generation bigint NOT NULL,
        at timestamptz NOT NULL DEFAULT clock_timestamp()
    )
    """,
)

DELIVERED_SOURCES = ("chat", "standard")
EFFECT = "effect"  # the side effect of a delivered event
APPROVED = "approved"  # the side effect of a "yes"
RUN_RECORD = re.compile(
    r"^chaos-run inbox=(?P<inbox>\S+) gen=(?P<gen>\d+) holder=(?P<holder>\S+)"
    r" claimed=(?P<claimed>\S+) events=(?P<events>[\d,]+)$"
)


class Poisoned(Exception):
    """This event fails every run that claims it, until it is dead."""


def flags(event) -> dict:
    """The plan's flags: the payload of a chat event, the body of a Standard Webhook."""
    payload = event.payload if isinstance(event.payload, dict) else {}
    if event.source == "standard":
        body = payload.get("body")
        return body if isinstance(body, dict) else {}
    return payload


def request_id_for(source_id) -> str:
    return f"ap-{source_id}"


def follow_key_for(source_id) -> str:
    return f"follow-{source_id}"


def agent(run):
    marks = [flags(event) for event in run.events if event.source in DELIVERED_SOURCES]
    if any(mark.get("poison") for mark in marks):
        raise Poisoned(f"poison in {[e.source_id for e in run.events]}")
    pause = max((float(mark.get("sleep", 0)) for mark in marks), default=0)
    if pause:
        time.sleep(pause)
        run.renew()  # LeaseLost here if a stall or a slow step cost this run its lease
    for event in run.events:
        if event.source in DELIVERED_SOURCES:
            perform(run, event, EFFECT)
            mark = flags(event)
            if mark.get("ask"):
                run.ask(
                    request_id_for(event.source_id),
                    f"chaos action {event.source_id}",
                    timedelta(seconds=int(mark["ask"])),
                )
            if mark.get("follow"):
                run.schedule(
                    follow_key_for(event.source_id),
                    delay=timedelta(seconds=int(mark["follow"])),
                    payload={"follow": event.source_id},
                )
        elif event.source == "approval" and event.payload.get("answer") == "yes":
            perform(run, event, APPROVED)
    claimed = min(event.updated for event in run.events)
    record = run_record(run.inbox.slug, run.generation, run.holder, claimed, run.events)
    run.say(record, urgent=any(mark.get("urgent") for mark in marks))
    # A memory write as the Claude agent's are made: an effect of the fenced finish. The
    # check finds exactly the committed runs' writes, each with its run record.
    # Imported here: the checker imports this module without Django's apps loaded.
    from alwayson.claude.memory import Change, MemoryWrites

    change = Change(memory_path(run.generation), "create", record)
    run.effect(MemoryWrites(run.inbox.pk, run.generation, (change,)))


def memory_path(generation) -> str:
    return f"/memories/runs/{generation}"


def perform(run, event, kind):
    """The side effect: a ledger row under the run's idempotency key for this event. Called
    again on a retry, the key refuses it; the attempt is recorded either way."""
    key = run.key(kind, event)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO chaos_ledger (key, inbox_id, source, source_id, kind, holder, generation)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (key) DO NOTHING RETURNING key",
            [key, run.inbox.pk, event.source, event.source_id, kind, run.holder, run.generation],
        )
        fresh = cursor.fetchone() is not None
        cursor.execute(
            "INSERT INTO chaos_effect_attempts (key, fresh, holder, generation)"
            " VALUES (%s, %s, %s, %s)",
            [key, fresh, run.holder, run.generation],
        )


def run_record(slug, generation, holder, claimed: datetime, events) -> str:
    ids = ",".join(str(event.pk) for event in events)
    return (
        f"chaos-run inbox={slug} gen={generation} holder={holder}"
        f" claimed={claimed.isoformat()} events={ids}"
    )


def parse_run_record(body: str) -> dict | None:
    """The run record in a message body, or None for any other text."""
    match = RUN_RECORD.match(body.strip())
    if not match:
        return None
    return {
        "inbox": match["inbox"],
        "gen": int(match["gen"]),
        "holder": match["holder"],
        "claimed": datetime.fromisoformat(match["claimed"]).timestamp(),
        "events": [int(pk) for pk in match["events"].split(",")],
    }
