"""Ingest and webhook rows: alwayson's `ingest` against one raw psycopg INSERT.

Every connection is a process of its own (spawned once, reused across repeats), so the GIL
never serialises the clients: alwayson's processes call `ingest` through Django, the
reference's run `INSERT ... ON CONFLICT DO NOTHING` in autocommit on a plain psycopg
connection, into the same table (same indexes, same UNIQUE key, same foreign key).
Throughput is the events of all processes over the span from the first start to the last end.
"""

import hashlib
import hmac
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter

from . import common

REFERENCE_INSERT = """
    INSERT INTO inbox_event (inbox_id, source, source_id, payload, status, attempts, claim_gen,
                             error, available_at, created, updated)
    VALUES (%s, %s, %s, %s, 'pending', 0, NULL, '', now(), now(), now())
    ON CONFLICT (inbox_id, source, source_id) DO NOTHING
"""
PAYLOAD = {"text": "a message of ordinary size", "from": "someone@example.com"}
GITHUB_SECRET = common.BENCH_ENV["ALWAYSON_GITHUB_SECRETS"]


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
            for n, key in enumerate(keys):
                raw.execute(
                    REFERENCE_INSERT, (inboxes[n % len(inboxes)], source, key, Jsonb(PAYLOAD))
                )
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
        for queue in self.queues:
            queue.put(None)
        for process in self.processes:
            process.join(30)


def _make_inboxes(count, prefix):
    from django.contrib.auth import get_user_model

    from inbox.models import Inbox

    owner, _ = get_user_model().objects.get_or_create(username="bench")
    return [Inbox.objects.create(owner=owner, slug=f"{prefix}-{n}") for n in range(count)]


def measure(url, quick, repeats, interleave) -> list[dict]:
    """The four ingest rows. `interleave(pairs)` runs each (alwayson, reference) callable pair
    `repeats` times, alternating, and returns their medians and the load."""
    from django.db import connection

    many = [inbox.pk for inbox in _make_inboxes(100, "many")]
    one = [_make_inboxes(1, "one")[0].pk]
    connection.close()
    events = 400 if quick else 3000
    per_process = 80 if quick else 400
    pool = Pool(url, 8)
    counter = Counter()

    def keys(tag, count):
        counter[tag] += 1
        return [f"{tag}-{counter[tag]}-{n}" for n in range(count)]

    def single(system, inboxes, source):
        return lambda: pool.run([(system, inboxes, source, keys(f"{system}-1", events))])

    def eight(system, inboxes, tag):
        def run():
            return pool.run(
                [
                    (system, inboxes, "bench", keys(f"{system}-{tag}-{w}", per_process))
                    for w in range(8)
                ]
            )

        return run

    try:
        # Warm every process's connections before anything is timed.
        pool.run([("alwayson", many, "warm", keys(f"warm-a{w}", 20)) for w in range(8)])
        pool.run([("reference", many, "warm", keys(f"warm-r{w}", 20)) for w in range(8)])
        stored = keys("dup", events)
        pool.run([("alwayson", many, "dup-a", stored)])
        pool.run([("reference", many, "dup-r", stored)])
        rows = []
        goal = 0.8
        for measure_name, pair in [
            (
                "ingest, 1 connection, 100 inboxes",
                (single("alwayson", many, "bench"), single("reference", many, "bench")),
            ),
            (
                "ingest, 8 connections, 1 inbox",
                (eight("alwayson", one, "one"), eight("reference", one, "one")),
            ),
            (
                "ingest, 8 connections, 100 inboxes",
                (eight("alwayson", many, "many"), eight("reference", many, "many")),
            ),
            (
                "ingest of a duplicate, 1 connection",
                (
                    lambda: pool.run([("alwayson", many, "dup-a", stored)]),
                    lambda: pool.run([("reference", many, "dup-r", stored)]),
                ),
            ),
        ]:
            result = interleave(pair, repeats)
            rows.append(common.row(measure_name, unit="events/s", goal=goal, **result))
        return rows
    finally:
        pool.close()


# --- webhook ---------------------------------------------------------------------------------


def _drive(base, requests, concurrency, out):
    """POST every (path, headers, body) with `concurrency` threads: requests/s, statuses."""
    pending = list(reversed(requests))
    lock = threading.Lock()
    statuses = Counter()

    def client():
        while True:
            with lock:
                if not pending:
                    return
                path, headers, body = pending.pop()
            request = urllib.request.Request(base + path, data=body, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    status = response.status
            except urllib.error.HTTPError as exc:
                status = exc.code
            with lock:
                statuses[status] += 1

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.put((len(requests) / (time.monotonic() - started), dict(statuses)))


def _signed(slug, key, body):
    signature = hmac.new(GITHUB_SECRET.encode(), body, hashlib.sha256).hexdigest()
    headers = {
        "Content-Type": "application/json",
        "X-Hub-Signature-256": f"sha256={signature}",
        "X-GitHub-Hook-ID": "1",
        "X-GitHub-Delivery": key,
        "X-GitHub-Event": "issues",
    }
    return f"/hooks/github/{slug}/", headers, body


def _raw(slug, key, body):
    headers = {"Content-Type": "application/json", "X-Key": key}
    return f"/bench/raw/{slug}/", headers, body


def _wait_until_serving(base, server, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"gunicorn exited with {server.returncode}")
        try:
            urllib.request.urlopen(base + "/healthz", timeout=2)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("gunicorn did not answer within a minute")


def measure_webhook(url, quick, repeats, interleave, port=8931) -> list[dict]:
    """The real GitHub endpoint (signed deliveries) against the one-INSERT view, both served
    by the same gunicorn (the product's config: 2 sync workers), driven from another process
    by `concurrency` client threads."""
    slugs = [inbox.slug for inbox in _make_inboxes(100, "hook")]
    from django.db import connection

    connection.close()
    count, concurrency = (400 if quick else 3000), 4
    base = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        **common.BENCH_ENV,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "ALWAYSON_WEB_BIND": f"127.0.0.1:{port}",
        "WEB_CONCURRENCY": "2",
    }
    gunicorn = os.path.join(os.path.dirname(sys.executable), "gunicorn")
    server = subprocess.Popen(
        [gunicorn, "--config", "python:alwayson.gunicorn_conf", "alwayson.wsgi"],
        cwd=common.ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    context = multiprocessing.get_context("spawn")
    counter = Counter()
    body = json.dumps({"action": "opened", "issue": {"number": 1, "title": "a bug"}}).encode()

    def drive(build, tag):
        counter[tag] += 1
        requests = [
            build(slugs[n % len(slugs)], f"{tag}-{counter[tag]}-{n}", body) for n in range(count)
        ]
        out = context.Queue()
        process = context.Process(target=_drive, args=(base, requests, concurrency, out))
        process.start()
        rate, statuses = out.get(timeout=600)
        process.join()
        if set(statuses) != {202}:
            raise RuntimeError(f"{tag}: unexpected answers {statuses}")
        return rate

    try:
        _wait_until_serving(base, server)
        for build, tag in ((_signed, "warm-a"), (_raw, "warm-r")):
            drive(build, tag)
        result = interleave((lambda: drive(_signed, "a"), lambda: drive(_raw, "r")), repeats)
        return [
            common.row(
                "webhook endpoint, gunicorn (2 workers), persistent connections",
                unit="requests/s",
                goal=0.7,
                **result,
            )
        ]
    finally:
        server.terminate()
        server.wait(30)
