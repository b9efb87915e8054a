"""Worker throughput: P runworker processes drain N inboxes x M events; prints the figures.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench .venv/bin/python bench/throughput.py \
        --inboxes 200 --events 5 --processes 3 --concurrency 4

It creates (and drops, on PostgreSQL) a database of its own, named by DATABASE_URL, so it
never touches real data. On SQLite it uses a temporary file.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--inboxes", type=int, default=200)
    parser.add_argument("--events", type=int, default=5)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--agent", default="bench.agents.reply")
    args = parser.parse_args()

    url = os.environ.get("DATABASE_URL") or f"sqlite:///{tempfile.mkdtemp()}/bench.sqlite3"
    if url.startswith("postgres"):
        recreate_postgres(url)
    env = {**os.environ, "DATABASE_URL": url, "ALWAYSON_AGENT": args.agent}
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "alwayson.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from inbox.models import Event, Inbox
    from inbox.services import ingest

    call_command("migrate", verbosity=0)
    owner = get_user_model().objects.create(username="bench")
    started = time.perf_counter()
    for i in range(args.inboxes):
        inbox = Inbox.objects.create(owner=owner, slug=f"bench-{i}")
        for e in range(args.events):
            ingest(inbox, "chat", f"m-{e}", {"text": f"message {e}"})
    ingest_seconds = time.perf_counter() - started
    total = args.inboxes * args.events

    from django.db import connection

    connection.close()
    started = time.perf_counter()
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "runworker",
                "--once",
                "-v0",
                "--concurrency",
                str(args.concurrency),
                "--worker-id",
                f"bench-{n}",
            ],
            cwd=ROOT,
            env=env,
        )
        for n in range(args.processes)
    ]
    for worker in workers:
        worker.wait(timeout=600)
    drain_seconds = time.perf_counter() - started
    done = Event.objects.filter(status="done").count()

    print(f"database           {connection.vendor}")
    print(f"events             {total} in {args.inboxes} inboxes")
    rate = total / ingest_seconds
    print(f"ingest             {rate:8.0f} events/s  ({ingest_seconds:.2f} s, one connection)")
    print(f"workers            {args.processes} process(es) x {args.concurrency} slot(s)")
    rate = done / drain_seconds
    print(f"drain              {rate:8.0f} events/s  ({drain_seconds:.2f} s, {done} done)")
    rate = args.inboxes / drain_seconds
    print(f"runs               {rate:8.0f} inbox runs/s (incl. process start-up)")
    connection.close()
    if url.startswith("postgres"):
        drop_postgres(url)


def recreate_postgres(url):
    import psycopg

    base, name = url.rsplit("/", 1)
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_postgres(url):
    import psycopg

    base, name = url.rsplit("/", 1)
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
