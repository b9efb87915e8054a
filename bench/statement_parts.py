"""What each part of a delivery's statement costs the server, one part added at a time, beside
the raw INSERT the ingest rows are measured against, in one run.

    BENCH_DATABASE_URL=postgres://postgres@127.0.0.1:5432/parts_bench \\
        .venv/bin/python bench/statement_parts.py --repeats 3

Why ingest stays below 0.9 of the raw INSERT: the try (inbox/sql/insert_try.sql) is the raw
INSERT plus what the guarantees need, and this shows the price of each. Every variant is
prepared, runs outside a transaction on a connection of its own, into the same table, with
every lease's marker set (the try's common case), planned with sequential scans off as
ingest's statements are; server CPU is the backend's utime + stime
(/proc/<pid>/stat, so the server must run on this machine). Repeats are interleaved; medians.
The database is made and dropped as bench/plans.py makes it.
"""

import argparse
import itertools
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.plans import cpu_seconds, maintenance, recreate, setup_django  # noqa: E402

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/parts_bench"
COLUMNS = (
    "INSERT INTO inbox_event (inbox_id, source, source_id, payload, status, attempts,"
    " claim_gen, error, available_at, created, updated)"
)
VALUES = "%(src)s::varchar, %(key)s::varchar, '{\"n\": 1}'::jsonb, 'pending', 0, NULL, ''"
FROM_LEASE = (
    f"{COLUMNS} SELECT l.inbox_id, {VALUES}, now(), now(), now() FROM inbox_lease AS l"
    " WHERE l.inbox_id = %(id)s::bigint AND l.work_at <= now()"
)
NOT_STORED = (
    " AND NOT EXISTS (SELECT 1 FROM inbox_event AS e WHERE e.inbox_id = l.inbox_id"
    " AND e.source = %(src)s::varchar AND e.source_id = %(key)s::varchar)"
)
SHARE = " FOR SHARE OF l SKIP LOCKED"
ON_CONFLICT = " ON CONFLICT (inbox_id, source, source_id) DO NOTHING"

# Each variant is the one above it plus one part: what that part costs is the difference.
VARIANTS = {
    "raw INSERT ... VALUES (the reference)": (
        f"{COLUMNS} VALUES (%(id)s::bigint, {VALUES}, now(), now(), now())"
    ),
    "+ the lease row read (marker stands)": FROM_LEASE,
    "+ the lease row locked FOR SHARE": FROM_LEASE + SHARE,
    "+ ON CONFLICT DO NOTHING": FROM_LEASE + SHARE + ON_CONFLICT,
    "+ the key's probe first (duplicates lock nothing)": (
        FROM_LEASE + NOT_STORED + SHARE + ON_CONFLICT
    ),
    "insert_try.sql without the branch saying why not": None,  # from the file, below
    "insert_try.sql as ingest sends it": None,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--calls", type=int, default=1500, help="calls per measure")
    parser.add_argument("--inboxes", type=int, default=100)
    args = parser.parse_args()
    if args.repeats < 1 or args.calls < 1 or args.inboxes < 1:
        parser.error("--repeats, --calls and --inboxes must be at least 1")
    url = os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL)
    recreate(url)
    setup_django(url)

    import psycopg
    from django.contrib.auth import get_user_model

    from inbox.backends.postgresql import INSERT_TRY
    from inbox.models import Inbox, Lease

    owner = get_user_model().objects.create(username="bench")
    for n in range(args.inboxes):
        Inbox.objects.create(owner=owner, slug=f"inbox-{n}")
    Lease.objects.update(work_at="2000-01-01T00:00:00Z")  # every marker stands
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("VACUUM ANALYZE")
    ids = [row[0] for row in conn.execute("SELECT id FROM inbox_inbox ORDER BY id")]
    conn.close()

    statements = dict(VARIANTS)
    statements["insert_try.sql as ingest sends it"] = INSERT_TRY
    # What a fresh delivery pays for the second branch (duplicate or "again"), which it
    # never runs: its plan's nodes are started all the same.
    statements["insert_try.sql without the branch saying why not"] = INSERT_TRY[
        : INSERT_TRY.index("UNION ALL")
    ]
    keys = itertools.count(random.randrange(10**12))
    # Planned as ingest plans its statements (BY_INDEX, inbox/backends/postgresql.py): with
    # sequential scans off, here for the whole session, so each probe is the index's.
    conns = {
        name: psycopg.connect(url, autocommit=True, options="-c enable_seqscan=off")
        for name in statements
    }

    def params(name, n):
        key = f"{n}-{next(keys)}"
        if name.startswith("insert_try.sql"):
            return {"inbox_id": ids[n % len(ids)], "slug": None, "now": None,
                    "source": "try", "source_id": key, "payload": '{"n": 1}'}  # fmt: skip
        return {"id": ids[n % len(ids)], "src": f"v{list(statements).index(name)}", "key": key}

    def measure(name):
        conn, sql = conns[name], statements[name]
        pid = conn.info.backend_pid
        cpu, start = cpu_seconds(pid), time.perf_counter()
        for n in range(args.calls):
            conn.execute(sql, params(name, n), prepare=True)
        wall = time.perf_counter() - start
        return (cpu_seconds(pid) - cpu) * 1e6 / args.calls, args.calls / wall

    for name in statements:  # warm: prepared, planned
        for n in range(20):
            conns[name].execute(statements[name], params(name, n), prepare=True)
    results = {name: [] for name in statements}
    for repeat in range(args.repeats):
        order = list(statements) if repeat % 2 == 0 else list(reversed(statements))
        for name in order:
            results[name].append(measure(name))
    for conn in conns.values():
        conn.close()

    reference = statistics.median(cpu for cpu, _ in results[next(iter(statements))])
    print(f"{args.inboxes} inboxes, {args.calls} calls per measure, {args.repeats} repeats")
    print(f"{'statement':<52}{'server µs/call':>16}{'calls/s':>10}{'raw/it':>8}")
    for name, samples in results.items():
        cpu = statistics.median(cpu for cpu, _ in samples)
        rate = statistics.median(rate for _, rate in samples)
        print(f"{name:<52}{cpu:>16.0f}{rate:>10.0f}{reference / cpu:>8.2f}")
    with maintenance(url) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')


if __name__ == "__main__":
    main()
