"""Ingest rows: alwayson's `ingest`, called by slug (what the webhooks and the chat form
pass) and by id, against one raw psycopg INSERT into the same table.

Every connection is a process of its own (spawned per statistics phase, reused across
repeats), so the GIL never serialises the clients: alwayson's processes call `ingest`
through Django, the reference's run a plain `INSERT` (for a duplicate: `INSERT ... ON
CONFLICT DO NOTHING`) in autocommit on a psycopg connection, by id, into the same table
(same indexes, same UNIQUE key, same foreign key). Throughput is the events of all
processes over the span from the first start to the last end.
"""

import multiprocessing
import time
from collections import Counter

from . import common

REFERENCE_INSERT = """
    INSERT INTO inbox_event (inbox_id, source, source_id, payload, status, attempts, claim_gen,
                             error, available_at, created, updated)
    VALUES (%s, %s, %s, %s, 'pending', 0, NULL, '', now(), now(), now())
"""
REFERENCE_DUPLICATE = REFERENCE_INSERT + " ON CONFLICT (inbox_id, source, source_id) DO NOTHING"
STATEMENTS = {"reference": REFERENCE_INSERT, "reference-duplicate": REFERENCE_DUPLICATE}
PAYLOAD = {"text": "a message of ordinary size", "from": "someone@example.com"}
# The fewest calls a duplicate row times per run (see again() in measure).
DUPLICATE_CALLS = 1500


def _worker(url, tasks, results):
    common.setup_django(url)
    import psycopg
    from psycopg.types.json import Jsonb

    from inbox.services import ingest

    raw = psycopg.connect(url, autocommit=True)
    while (task := tasks.get()) is not None:
        system, inboxes, source, keys = task
        start = time.monotonic()
        if system == "alwayson":
            for n, key in enumerate(keys):
                ingest(inboxes[n % len(inboxes)], source, key, PAYLOAD)
        else:
            statement = STATEMENTS[system]
            for n, key in enumerate(keys):
                raw.execute(statement, (inboxes[n % len(inboxes)], source, key, Jsonb(PAYLOAD)))
        results.put((start, time.monotonic(), len(keys)))


class Pool:
    """`size` worker processes, each with its own connections."""

    def __init__(self, url, size):
        context = multiprocessing.get_context("spawn")
        self.results = context.Queue()
        self.queues = [context.Queue() for _ in range(size)]
        self.processes = [
            context.Process(target=_worker, args=(url, queue, self.results), daemon=True)
            for queue in self.queues
        ]
        for process in self.processes:
            process.start()

    def run(self, tasks) -> float:
        """Run one task per worker (the first len(tasks) workers): events per second."""
        for queue, task in zip(self.queues, tasks, strict=False):
            queue.put(task)
        spans = [self.results.get(timeout=600) for _ in tasks]
        started, ended = min(s for s, _, _ in spans), max(e for _, e, _ in spans)
        return sum(n for _, _, n in spans) / (ended - started)

    def close(self):
        """Stop every worker: after its task, or at once when the run was interrupted
        mid-task (the database is dropped next)."""
        for queue in self.queues:
            queue.put(None)
        deadline = time.monotonic() + 30
        for process in self.processes:
            process.join(max(0.1, deadline - time.monotonic()))
            if process.is_alive():
                process.terminate()
                process.join(5)


def make_inboxes(count, prefix):
    from django.contrib.auth import get_user_model

    from inbox.models import Inbox

    owner, _ = get_user_model().objects.get_or_create(username="bench")
    return [Inbox.objects.create(owner=owner, slug=f"{prefix}-{n}") for n in range(count)]


def setup():
    """The inboxes the rows deliver to, made before the phase's statistics are gathered."""
    many = make_inboxes(100, "many")
    one = make_inboxes(1, "one")
    return {
        "ids": [inbox.pk for inbox in many],
        "slugs": [inbox.slug for inbox in many],
        "one": [one[0].pk],
    }


def measure(url, quick, repeats, interleave, inboxes, phase) -> list[dict]:
    """The ingest rows under the current statistics, on new connections (their prepared
    statements plan under `phase`'s statistics). `interleave(pair, repeats)` runs an
    (alwayson, reference) pair of callables alternately and returns medians and the load."""
    ids, slugs, one = inboxes["ids"], inboxes["slugs"], inboxes["one"]
    events = 200 if quick else 1500
    per_process = 40 if quick else 250
    pool = Pool(url, 8)
    counter = Counter()

    def keys(tag, count):
        counter[tag] += 1
        return [f"{phase}-{tag}-{counter[tag]}-{n}" for n in range(count)]

    def single(system, targets, tag):
        return lambda: pool.run([(system, targets, "bench", keys(f"{system}-{tag}", events))])

    def eight(system, targets, tag):
        def run():
            return pool.run(
                [
                    (system, targets, "bench", keys(f"{system}-{tag}-{w}", per_process))
                    for w in range(8)
                ]
            )

        return run

    def again(system, targets, source, stored):
        # A duplicate writes nothing, so quick mode's 200 of them take ~15 ms: one preemption
        # of the one client on a shared machine halved a run's rate. Each run repeats the
        # stored keys to at least DUPLICATE_CALLS calls (every one still a duplicate).
        calls = stored * max(1, -(-DUPLICATE_CALLS // len(stored)))
        return lambda: pool.run([(system, targets, source, calls)])

    try:
        # Warm every process's connections before anything is timed.
        pool.run([("alwayson", ids, "warm", keys(f"warm-a{w}", 20)) for w in range(8)])
        pool.run([("alwayson", slugs, "warm", keys(f"warm-s{w}", 20)) for w in range(8)])
        pool.run([("reference", ids, "warm", keys(f"warm-r{w}", 20)) for w in range(8)])
        stored = keys("dup", events)
        pool.run([("alwayson", ids, "dup", stored)])
        shapes = [
            (
                "ingest.id.1",
                "ingest by id, 1 connection, 100 inboxes",
                1,
                single("alwayson", ids, "id1"),
                single("reference", ids, "r1"),
            ),
            (
                "ingest.slug.1",
                "ingest by slug, 1 connection, 100 inboxes",
                1,
                single("alwayson", slugs, "slug1"),
                single("reference", ids, "r1"),
            ),
            (
                "ingest.id.8",
                "ingest by id, 8 connections, 100 inboxes",
                8,
                eight("alwayson", ids, "id8"),
                eight("reference", ids, "r8"),
            ),
            (
                "ingest.slug.8",
                "ingest by slug, 8 connections, 100 inboxes",
                8,
                eight("alwayson", slugs, "slug8"),
                eight("reference", ids, "r8"),
            ),
            (
                "ingest.one.8",
                "ingest by id, 8 connections, 1 inbox",
                8,
                eight("alwayson", one, "one8"),
                eight("reference", one, "rone8"),
            ),
            (
                "duplicate.id",
                "duplicate by id, 1 connection, 100 inboxes",
                1,
                again("alwayson", ids, "dup", stored),
                again("reference-duplicate", ids, "dup", stored),
            ),
            (
                "duplicate.slug",
                "duplicate by slug, 1 connection, 100 inboxes",
                1,
                again("alwayson", slugs, "dup", stored),
                again("reference-duplicate", ids, "dup", stored),
            ),
        ]
        rows = []
        for key, name, clients, ours, theirs in shapes:
            result = interleave((ours, theirs), repeats)
            rows.append(
                common.row(
                    name, unit="events/s", goal=0.9, key=key, phase=phase, clients=clients, **result
                )
            )
        return rows
    finally:
        pool.close()
