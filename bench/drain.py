"""Drain benchmark: alwayson's runworker against procrastinate, side by side in one run.

    python -m bench.drain [--quick] [--repeats 3] [--db postgres://postgres@127.0.0.1:5432/bench_d]

Two shapes of work, each drained by 2 processes x 4 slots of a no-op agent:
many events per inbox (1,000 x 10) and many one-event inboxes (10,000 x 1); quick mode
200 x 10 and 2,000 x 1. The reference is procrastinate (>= 3.10) with one job per event,
`lock=f"inbox:{i}"` (its way of running one inbox's jobs one at a time), an async no-op task,
the same processes and concurrency, in the same database. alwayson runs twice: with its run
records (the default, what the goal is on) and with ALWAYSON_RUN_RECORDS=false, so a row of its
own shows what recording every run costs the drain.

Each system drains its whole queue and exits (`runworker --once`; procrastinate's
`wait=False`). Throughput is timed from the moment every process is ready (imported, set
up, connected) to the last one's exit, so interpreter start-up is left out and reported on
its own; CPU per event is the processes' own rusage over the same window, and the server's
is the CPU time of their PostgreSQL sessions (each backend's /proc/<pid>/stat, read as its
connection closes; not printed when the server runs out of this machine's sight). The
systems are interleaved and each shape is repeated; the figures are medians.

It checks what it measures and fails loudly otherwise: alwayson ran every event exactly once
(the agent's ledger) and left it done; procrastinate ran every job once, succeeded, and
never ran two jobs of one inbox at once (the task's ledger of start and end times).

The database named by --db (or DATABASE_URL) is dropped and created again: give it a name
of its own.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path

from bench.common import cpu_seconds

ROOT = Path(__file__).resolve().parent.parent
PROCESSES = 2
CONCURRENCY = 4
FULL_SHAPES = [(1000, 10), (10000, 1)]
QUICK_SHAPES = [(200, 10), (2000, 1)]
GOALS = {10: 5.0, 1: 1.8}  # events per inbox -> the goal for the ratio (issue 36)
# Recording a run is one more CTE in the finish's one statement, no round trip (issue 26):
# with records at least this fraction of the rate without.
RECORDS_GOAL = 0.9
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/bench_d"
# As in production: DEBUG on keeps every query's SQL in memory and costs each one.
PRODUCTION_ENV = {"DEBUG": "false", "SECRET_KEY": "bench-only-secret-key-not-used-for-anything"}


# --- the parent: databases, seeding, the interleaved runs -----------------------------------


def measure(db_url: str, quick: bool, repeats: int) -> list[dict]:
    """One row per shape: alwayson vs procrastinate events/s (medians), their ratio, and the
    extras (CPU ms per event for both, start-up seconds)."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, not {repeats}")
    recreate_database(db_url)
    try:
        prepare_schemas(db_url)
        shapes = QUICK_SHAPES if quick else FULL_SHAPES
        samples = {(shape, system): [] for shape in shapes for system in SYSTEMS}
        for repeat in range(repeats):
            for shape in shapes:
                # Alternate who goes first, so neither always runs on a warmer machine.
                order = list(SYSTEMS) if repeat % 2 == 0 else list(reversed(SYSTEMS))
                for system in order:
                    sample = SYSTEMS[system](db_url, *shape)
                    samples[(shape, system)].append(sample)
                    log(
                        f"  {system:13} {shape[0]}x{shape[1]}: {sample['rate']:7.0f} events/s, "
                        f"{sample['cpu_ms']:.2f} ms CPU/event, "
                        f"server {_ms(sample['server_cpu_ms'])} ms/event, "
                        f"start-up {sample['startup']:.2f}s"
                    )
        rows = [_row(shape, samples, repeats) for shape in shapes]
        return rows + [_records_row(shape, samples, repeats) for shape in shapes]
    finally:
        drop_database(db_url)


def _row(shape, samples, repeats):
    inboxes, per_inbox = shape
    ours, theirs = samples[(shape, "alwayson")], samples[(shape, "procrastinate")]

    def median(rows, key):
        return _median(row[key] for row in rows)

    rate, reference = median(ours, "rate"), median(theirs, "rate")
    return {
        "measure": f"drain {inboxes:,} inboxes x {per_inbox} event(s), "
        f"{PROCESSES} processes x {CONCURRENCY} slots, no-op agent",
        "alwayson": round(rate, 1),
        "reference": round(reference, 1),
        "unit": "events/s",
        "ratio": round(rate / reference, 2),
        "goal": GOALS[per_inbox],
        "key": f"drain.x{per_inbox}",
        "clients": PROCESSES * CONCURRENCY,
        "reference_system": "procrastinate, lock=inbox:{i}, same processes and concurrency",
        "alwayson_cpu_ms_per_event": round(median(ours, "cpu_ms"), 3),
        "reference_cpu_ms_per_event": round(median(theirs, "cpu_ms"), 3),
        "alwayson_server_cpu_ms_per_event": _round(median(ours, "server_cpu_ms")),
        "reference_server_cpu_ms_per_event": _round(median(theirs, "server_cpu_ms")),
        "alwayson_startup_s": round(median(ours, "startup"), 2),
        "reference_startup_s": round(median(theirs, "startup"), 2),
        "repeats": repeats,
        "samples": {
            "alwayson": [s["rate"] for s in ours],
            "reference": [s["rate"] for s in theirs],
        },
    }


def _records_row(shape, samples, repeats):
    inboxes, per_inbox = shape
    on, off = samples[(shape, "alwayson")], samples[(shape, "alwayson-unrecorded")]
    rate = statistics.median(row["rate"] for row in on)
    reference = statistics.median(row["rate"] for row in off)
    return {
        "measure": f"drain {inboxes:,} x {per_inbox}: run records on, against off",
        "alwayson": round(rate, 1),
        "reference": round(reference, 1),
        "unit": "events/s",
        "ratio": round(rate / reference, 2),
        "goal": RECORDS_GOAL,
        "key": f"drain.x{per_inbox}.records",
        "clients": PROCESSES * CONCURRENCY,
        "reference_system": "alwayson with ALWAYSON_RUN_RECORDS=false",
        "alwayson_cpu_ms_per_event": round(statistics.median(r["cpu_ms"] for r in on), 3),
        "reference_cpu_ms_per_event": round(statistics.median(r["cpu_ms"] for r in off), 3),
        "alwayson_server_cpu_ms_per_event": _round(_median(r["server_cpu_ms"] for r in on)),
        "reference_server_cpu_ms_per_event": _round(_median(r["server_cpu_ms"] for r in off)),
        "repeats": repeats,
        "samples": {"alwayson": [s["rate"] for s in on], "reference": [s["rate"] for s in off]},
    }


def _median(values):
    """The median, or None when any sample lacks the figure (the server's CPU out of sight)."""
    values = list(values)
    return None if None in values else statistics.median(values)


def _round(value):
    return None if value is None else round(value, 3)


def _ms(value):
    return "-" if value is None else f"{value:.2f}"


def log(message):
    print(message, file=sys.stderr, flush=True)


def _server(url):
    base, name = url.rsplit("/", 1)
    return f"{base}/postgres", name


def recreate_database(url):
    import psycopg

    server, name = _server(url)
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(url):
    import psycopg

    server, name = _server(url)
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def prepare_schemas(url):
    env = {**os.environ, "DATABASE_URL": url}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    from procrastinate import App, SyncPsycopgConnector

    app = App(connector=SyncPsycopgConnector(conninfo=_conninfo(url)))
    with app.open():
        app.schema_manager.apply_schema()


def _conninfo(url):
    # postgres://user@host:port/name is also a libpq URI.
    return url.replace("postgres://", "postgresql://", 1)


def _reset(conn):
    conn.execute(
        "TRUNCATE inbox_inbox, alwayson_process, procrastinate_jobs, procrastinate_events,"
        " procrastinate_workers CASCADE"
    )
    conn.execute("DELETE FROM auth_user")


def seed_alwayson(url, inboxes, per_inbox):
    """Inboxes with their lease and session rows, and pending events due now, as Inbox.save
    and ingest would leave them (written in bulk: the seeding is not what is measured)."""
    import psycopg

    with psycopg.connect(_conninfo(url), autocommit=True) as conn:
        _reset(conn)
        owner = conn.execute(
            "INSERT INTO auth_user (password, is_superuser, username, first_name, last_name,"
            " email, is_staff, is_active, date_joined)"
            " VALUES ('', false, 'bench', '', '', '', false, true, now()) RETURNING id"
        ).fetchone()[0]
        conn.execute(
            "INSERT INTO inbox_inbox (owner_id, slug, name, created)"
            " SELECT %s, 'bench-' || i, '', now() FROM generate_series(1, %s) i",
            [owner, inboxes],
        )
        conn.execute(
            "INSERT INTO inbox_lease (inbox_id, holder, generation, work_at)"
            " SELECT id, '', 0, now() FROM inbox_inbox"
        )
        conn.execute("INSERT INTO inbox_session (inbox_id, state) SELECT id, '{}' FROM inbox_inbox")
        conn.execute(
            "INSERT INTO inbox_event (inbox_id, source, source_id, payload, status, attempts,"
            " error, available_at, created, updated)"
            " SELECT b.id, 'chat', 'm-' || e, jsonb_build_object('text', 'message ' || e),"
            " 'pending', 0, '', now(), now(), now()"
            " FROM inbox_inbox b, generate_series(1, %s) e",
            [per_inbox],
        )
        conn.execute("VACUUM ANALYZE inbox_event")
        conn.execute("VACUUM ANALYZE inbox_lease")


def seed_procrastinate(url, inboxes, per_inbox):
    import psycopg

    with psycopg.connect(_conninfo(url), autocommit=True) as conn:
        _reset(conn)
        # Inbox by inbox, in arrival order, as the events would have been deferred.
        conn.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, lock, args)"
            " SELECT 'default', 'noop', 'inbox:' || i, jsonb_build_object('i', i, 'e', e)"
            " FROM generate_series(1, %s) i, generate_series(1, %s) e ORDER BY e, i",
            [inboxes, per_inbox],
        )
        conn.execute("VACUUM ANALYZE procrastinate_jobs")


def run_alwayson(url, inboxes, per_inbox):
    seed_alwayson(url, inboxes, per_inbox)
    sample, ledgers = _drain("alwayson", url)
    _check_alwayson(url, ledgers, inboxes * per_inbox)
    return _sample(sample, inboxes * per_inbox)


def run_alwayson_unrecorded(url, inboxes, per_inbox):
    seed_alwayson(url, inboxes, per_inbox)
    sample, ledgers = _drain("alwayson", url, {"ALWAYSON_RUN_RECORDS": "false"})
    _check_alwayson(url, ledgers, inboxes * per_inbox, recorded=False)
    return _sample(sample, inboxes * per_inbox)


def run_procrastinate(url, inboxes, per_inbox):
    seed_procrastinate(url, inboxes, per_inbox)
    sample, ledgers = _drain("procrastinate", url)
    _check_procrastinate(url, ledgers, inboxes * per_inbox)
    return _sample(sample, inboxes * per_inbox)


SYSTEMS = {
    "alwayson": run_alwayson,
    "alwayson-unrecorded": run_alwayson_unrecorded,
    "procrastinate": run_procrastinate,
}


def _drain(system, url, settings=None):
    """Start the processes, wait until all are ready, let them go at once, wait for them."""
    workdir = Path(tempfile.mkdtemp(prefix="drain-"))
    env = {**os.environ, **PRODUCTION_ENV, "DATABASE_URL": url, "PYTHONUNBUFFERED": "1"}
    env.update(settings or {})
    spawned = time.time()
    children = []
    for n in range(PROCESSES):
        ledger = workdir / f"ledger-{n}.json"
        command = [sys.executable, "-m", "bench.drain", "--child", system, "--db", url]
        command += ["--worker-id", f"bench-{n}", "--ledger", str(ledger)]
        child = subprocess.Popen(
            command, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        children.append((child, ledger))
    ready = [json.loads(_line(child)) for child, _ in children]
    went = time.time()
    for child, _ in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    done = [json.loads(_line(child)) for child, _ in children]
    for child, _ in children:
        if child.wait(timeout=60) != 0:
            raise RuntimeError(f"{system} worker exited with {child.returncode}")
    ledgers = [json.loads(ledger.read_text()) for _, ledger in children]
    return {
        "seconds": max(d["end"] for d in done) - went,
        "cpu": sum(d["cpu"] - r["cpu"] for r, d in zip(ready, done, strict=True)),
        "server_cpu": _server_cpu(ready, done),
        "startup": max(r["ready"] for r in ready) - spawned,
    }, ledgers


def _line(child):
    line = child.stdout.readline()
    if not line:
        child.wait()
        raise RuntimeError(f"a worker exited early with {child.returncode}")
    return line


def _server_cpu(ready, done):
    """Seconds of server CPU the processes' sessions spent between ready and done (None when
    the server's processes were out of sight)."""
    pairs = [(r["server_cpu"], d["server_cpu"]) for r, d in zip(ready, done, strict=True)]
    if any(before is None or after is None for before, after in pairs):
        return None
    return sum(after - before for before, after in pairs)


def _sample(sample, events):
    server = sample["server_cpu"]
    return {
        "rate": events / sample["seconds"],
        "cpu_ms": sample["cpu"] * 1000 / events,
        "server_cpu_ms": None if server is None else server * 1000 / events,
        "startup": sample["startup"],
    }


def _check_alwayson(url, ledgers, events, recorded=True):
    import psycopg

    ran = [event_id for ledger in ledgers for entry in ledger for event_id in entry["events"]]
    if len(ran) != events or len(set(ran)) != events:
        raise AssertionError(
            f"alwayson ran {len(ran)} events ({len(set(ran))} distinct), expected {events} once"
        )
    with psycopg.connect(_conninfo(url)) as conn:
        states = dict(conn.execute("SELECT status, count(*) FROM inbox_event GROUP BY 1"))
        ids = {row[0] for row in conn.execute("SELECT id FROM inbox_event")}
        records = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE outcome = 'done'),"
            " coalesce(sum(jsonb_array_length(events)), 0) FROM inbox_runrecord"
        ).fetchone()
    if states != {"done": events} or ids != set(ran):
        raise AssertionError(f"alwayson left events {states}, expected {events} done")
    # Every run recorded once as done, with its events; with records off, none at all.
    runs = sum(len(ledger) for ledger in ledgers)
    expected = (runs, runs, events) if recorded else (0, 0, 0)
    if records != expected:
        raise AssertionError(
            f"alwayson recorded (records, done, events) {records}, expected {expected}"
        )


def _check_procrastinate(url, ledgers, events):
    import psycopg

    runs = [entry for ledger in ledgers for entry in ledger]
    if len(runs) != events or len({entry["job"] for entry in runs}) != events:
        raise AssertionError(f"procrastinate ran {len(runs)} jobs, expected {events} once")
    with psycopg.connect(_conninfo(url)) as conn:
        states = dict(
            conn.execute("SELECT status::text, count(*) FROM procrastinate_jobs GROUP BY 1")
        )
    if states != {"succeeded": events}:
        raise AssertionError(f"procrastinate left jobs {states}, expected {events} succeeded")
    by_lock = {}
    for entry in runs:
        by_lock.setdefault(entry["lock"], []).append((entry["start"], entry["end"]))
    for lock, spans in by_lock.items():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            if start < end:
                raise AssertionError(f"procrastinate ran two jobs of {lock} at once")


# --- the children: one worker process each ---------------------------------------------------

LEDGER = []


def _cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _Sessions:
    """The CPU time the PostgreSQL server spent on this process's sessions: every psycopg
    connection the process opens is followed, and its backend's /proc/<pid>/stat read when
    it closes (and for those still open, when asked). None when the server's processes are
    out of sight (another machine, a container)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.open = weakref.WeakSet()
        self.closed = 0.0
        self.visible = True

    def follow(self):
        import psycopg

        sessions = self
        connect, aconnect = psycopg.Connection.connect, psycopg.AsyncConnection.connect
        close, aclose = psycopg.Connection.close, psycopg.AsyncConnection.close

        def connect_followed(cls, *args, **kwargs):
            conn = connect.__func__(cls, *args, **kwargs)
            with sessions.lock:
                sessions.open.add(conn)
            return conn

        async def aconnect_followed(cls, *args, **kwargs):
            conn = await aconnect.__func__(cls, *args, **kwargs)
            with sessions.lock:
                sessions.open.add(conn)
            return conn

        def close_followed(conn):
            sessions.closing(conn)
            close(conn)

        async def aclose_followed(conn):
            sessions.closing(conn)
            await aclose(conn)

        psycopg.Connection.connect = classmethod(connect_followed)
        psycopg.AsyncConnection.connect = classmethod(aconnect_followed)
        psycopg.Connection.close = close_followed
        psycopg.AsyncConnection.close = aclose_followed
        psycopg.connect = psycopg.Connection.connect  # the name Django's backend calls

    def closing(self, conn):
        with self.lock:
            if conn in self.open:
                self.open.discard(conn)
                if not conn.closed:
                    self.closed += self._backend_cpu(conn)

    def cpu(self) -> float | None:
        """Seconds of server CPU: the closed sessions' and the open ones' so far."""
        with self.lock:
            total = self.closed + sum(
                self._backend_cpu(conn) for conn in list(self.open) if not conn.closed
            )
            return total if self.visible else None

    def _backend_cpu(self, conn) -> float:
        seconds = cpu_seconds(conn.info.backend_pid)
        if seconds is None:
            self.visible = False
            return 0.0
        return seconds


SESSIONS = _Sessions()


def _ready_then_wait():
    print(json.dumps({"ready": time.time(), "cpu": _cpu(), "server_cpu": SESSIONS.cpu()}))
    sys.stdout.flush()
    if sys.stdin.readline().strip() != "go":
        sys.exit(3)


def _finished(ledger_path):
    end, cpu, server = time.time(), _cpu(), SESSIONS.cpu()
    Path(ledger_path).write_text(json.dumps(LEDGER))
    print(json.dumps({"end": end, "cpu": cpu, "server_cpu": server}), flush=True)


def child_alwayson(url, worker_id, ledger_path):
    """What `runworker --once -v0 --concurrency 4` does, with the go signal between the
    set-up (imports, agent load and preflight) and the first run."""
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "alwayson.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from alwayson.runtime.management.commands.runworker import Command
    from alwayson.runtime.worker import WorkerPool

    Command().configure(0, worker_id)
    pool = WorkerPool(worker_id=worker_id, agent=ledger_agent, concurrency=CONCURRENCY, once=True)
    pool.worker.agents.preflight()
    _ready_then_wait()
    pool.run()
    _finished(ledger_path)


def ledger_agent(run):
    """A no-op agent that notes which events it ran."""
    LEDGER.append({"events": [event.pk for event in run.events]})


def child_procrastinate(url, worker_id, ledger_path):
    import asyncio

    from procrastinate import App, PsycopgConnector

    app = App(connector=PsycopgConnector(conninfo=_conninfo(url)))

    @app.task(name="noop", pass_context=True)
    async def noop(context, i, e):
        start = time.time()
        await asyncio.sleep(0)
        LEDGER.append(
            {"job": context.job.id, "lock": context.job.lock, "start": start, "end": time.time()}
        )

    async def main():
        async with app.open_async():
            # Connected before the go signal, as alwayson's slots are after their first query.
            await app.check_connection_async()
            await asyncio.get_running_loop().run_in_executor(None, _ready_then_wait)
            await app.run_worker_async(
                concurrency=CONCURRENCY, wait=False, name=worker_id, install_signal_handlers=False
            )

    asyncio.run(main())
    _finished(ledger_path)


CHILDREN = {"alwayson": child_alwayson, "procrastinate": child_procrastinate}


def print_table(rows):
    print(
        "| measure | alwayson | reference | ratio | goal | CPU ms/event (alwayson / ref)"
        " | server CPU ms/event (alwayson / ref) |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['measure']} | {row['alwayson']:,.0f} {row['unit']} | "
            f"{row['reference']:,.0f} {row['unit']} | {row['ratio']:.2f} | >= {row['goal']} | "
            f"{row['alwayson_cpu_ms_per_event']:.2f} / {row['reference_cpu_ms_per_event']:.2f} | "
            f"{_ms(row['alwayson_server_cpu_ms_per_event'])} / "
            f"{_ms(row['reference_server_cpu_ms_per_event'])} |"
        )


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller shapes (about a minute)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--db", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--worker-id", help=argparse.SUPPRESS)
    parser.add_argument("--ledger", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        SESSIONS.follow()
        CHILDREN[args.child](args.db, args.worker_id, args.ledger)
        return
    load = os.getloadavg()
    rows = measure(args.db, args.quick, args.repeats)
    print_table(rows)
    print(f"load average before the run: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    threading.current_thread().name = "main"
    main()
