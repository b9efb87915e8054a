"""Server CPU per delivery under the statistics a real database has: ingest by slug, by id
and by Inbox object, and the duplicate path by slug, beside a raw psycopg INSERT into the
same table, in one run.

    BENCH_DATABASE_URL=postgres://postgres@127.0.0.1:5432/plans_bench \\
        .venv/bin/python bench/plans.py --repeats 5

The database (made and dropped here, never a real one) starts the way a deployment does:
migrate, create the inboxes, VACUUM ANALYZE while every work marker is NULL ("fresh"); then,
once the deliveries have set the markers, ANALYZE again ("markers set"). Autovacuum is off
for the inbox tables, so each phase keeps the statistics it gathered. Each measure is a
batch of calls on one connection, outside any transaction, as a webhook makes them; its
server CPU is the backend's utime + stime (/proc/<pid>/stat, so the server must run on
this machine). Repeats are interleaved; the table shows medians, and the ratio of each
delivery's CPU to the raw INSERT's (higher is better: 1.0 is the INSERT's cost).
"""

import argparse
import itertools
import os
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/plans_bench"
TICK = os.sysconf("SC_CLK_TCK")

RAW_INSERT = """
INSERT INTO inbox_event (inbox_id, source, source_id, payload, status, attempts, claim_gen,
                         error, available_at, created, updated)
VALUES (%s, %s, %s, %s::jsonb, 'pending', 0, NULL, '', now(), now(), now())
"""


def maintenance(url):
    import psycopg

    parts = urlsplit(url)
    return psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True)


def recreate(url):
    name = urlsplit(url).path.lstrip("/")
    if not name or name in ("postgres", "template0", "template1"):
        sys.exit(f"BENCH_DATABASE_URL must name a benchmark's own database, not {url!r}")
    with maintenance(url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def setup_django(url):
    sys.path.insert(0, str(ROOT))
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "alwayson.settings")
    os.environ.setdefault("DEBUG", "False")
    os.environ.setdefault("SECRET_KEY", "bench-only-secret-key-not-for-production-0123456789")
    os.environ.setdefault("SECURE_SSL_REDIRECT", "False")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def cpu_seconds(pid) -> float:
    """A backend's user + system CPU so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14 and 15)


def measure(pid, calls, run) -> tuple[float, float]:
    """(server CPU µs per call, calls per second) of `run()` called `calls` times."""
    cpu, start = cpu_seconds(pid), time.perf_counter()
    for _ in range(calls):
        run()
    wall, cpu = time.perf_counter() - start, cpu_seconds(pid) - cpu
    return cpu * 1e6 / calls, calls / wall


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000, help="calls per measure")
    parser.add_argument("--inboxes", type=int, default=100)
    args = parser.parse_args()
    if args.repeats < 1 or args.calls < 1 or args.inboxes < 1:
        parser.error("--repeats, --calls and --inboxes must be at least 1")
    url = os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL)
    recreate(url)
    setup_django(url)

    import psycopg
    from django.contrib.auth import get_user_model
    from django.db import connection

    from alwayson.runtime.api import ingest
    from inbox.models import Inbox

    owner = get_user_model().objects.create(username="bench")
    inboxes = [Inbox.objects.create(owner=owner, slug=f"inbox-{n}") for n in range(args.inboxes)]
    connection.ensure_connection()
    raw = psycopg.connect(url, autocommit=True)
    pids = {
        "alwayson": connection.connection.info.backend_pid,
        "raw": raw.info.backend_pid,
    }
    keys = itertools.count()
    cycle = itertools.cycle

    def deliveries(refs):
        refs = cycle(refs)
        return lambda: ingest(next(refs), "bench", f"k{next(keys)}", {"n": 1})

    stored = [(inbox.slug, f"dup-{inbox.pk}") for inbox in inboxes]
    duplicates = cycle(stored)

    def duplicate():
        slug, key = next(duplicates)
        assert ingest(slug, "bench", key, {"n": 1}) is False

    raw_ids = cycle([inbox.pk for inbox in inboxes])

    def raw_insert():
        raw.execute(RAW_INSERT, (next(raw_ids), "raw", f"r{next(keys)}", '{"n": 1}'), prepare=True)

    measures = {
        "ingest by slug": ("alwayson", deliveries([i.slug for i in inboxes])),
        "ingest by id": ("alwayson", deliveries([i.pk for i in inboxes])),
        "ingest by object": ("alwayson", deliveries(inboxes)),
        "duplicate by slug": ("alwayson", duplicate),
        "raw psycopg INSERT": ("raw", raw_insert),
    }

    with connection.cursor() as cursor:
        # The statistics stay those each phase gathered: autovacuum would analyze these
        # small, busy tables again within a minute.
        for table in ("inbox_inbox", "inbox_lease", "inbox_event"):
            cursor.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")

    results = {}
    for phase in ("fresh", "markers set"):
        # Fresh: no delivery yet, every marker NULL. Markers set: the fresh phase's
        # deliveries set them all (no worker runs here).
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE")
        for slug, key in stored:
            ingest(slug, "bench", key, {"n": 1})
        for who, run in measures.values():
            measure(pids[who], 50, run)  # warm: statements prepared, plans made
        for _ in range(args.repeats):
            for name, (who, run) in measures.items():
                results.setdefault((phase, name), []).append(measure(pids[who], args.calls, run))
    raw.close()

    print(f"{args.inboxes} inboxes, {args.calls} calls per measure, {args.repeats} repeats")
    print(f"{'measure':<22}{'statistics':<14}{'server µs/call':>16}{'calls/s':>10}{'raw/it':>8}")
    for phase in ("fresh", "markers set"):
        reference = statistics.median(cpu for cpu, _ in results[(phase, "raw psycopg INSERT")])
        for name in measures:
            samples = results[(phase, name)]
            cpu = statistics.median(cpu for cpu, _ in samples)
            rate = statistics.median(rate for _, rate in samples)
            ratio = reference / cpu if cpu else float("inf")
            print(f"{name:<22}{phase:<14}{cpu:>16.0f}{rate:>10.0f}{ratio:>8.2f}")


if __name__ == "__main__":
    main()
