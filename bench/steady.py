"""The figures that must stay where they are while the rest gets faster: how soon an idle
worker runs a delivery (NOTIFY), what a run costs with a million finished events in the
table against ten thousand, and a worker's peak memory draining 100,000 events against 1,000.

    .venv/bin/python -m bench.steady --db postgres://postgres@127.0.0.1:5432/bench_steady

Each figure is measured against its own reference in the same run (the smaller table, the
smaller drain), the two interleaved and repeated; the wake-up is reported as milliseconds from
the delivery's insert to its run's finish, both stamped by the database's clock, with the
worker polling only every 30 seconds, so only the NOTIFY can wake it sooner. It makes and
drops databases named after --db.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

from . import common, drain

ROOT = common.ROOT
AGENT = "bench.agents.quiet"
POLL_SECONDS = 30


def _env(url):
    return {**os.environ, **common.BENCH_ENV, "DATABASE_URL": url, "ALWAYSON_AGENT": AGENT}


def _fresh(url, inboxes, per_inbox):
    """A database of its own with `inboxes` inboxes of `per_inbox` pending events each (with
    none, idle: no work marker, as after their last run)."""
    import psycopg

    drain.recreate_database(url)
    drain.prepare_schemas(url)
    drain.seed_alwayson(url, inboxes, per_inbox)
    if not per_inbox:
        with psycopg.connect(drain._conninfo(url), autocommit=True) as conn:
            conn.execute("UPDATE inbox_lease SET work_at = NULL")


def _add_history(url, count):
    """`count` finished events spread over the inboxes, a day old, as finishes leave them."""
    import psycopg

    with psycopg.connect(drain._conninfo(url), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inbox_event (inbox_id, source, source_id, payload, status, attempts,"
            " claim_gen, error, available_at, created, updated)"
            " SELECT b.id, 'history', 'h-' || g, '{\"text\": \"an old message\"}', 'done', 1,"
            " 1, '', now() - interval '1 day', now() - interval '1 day',"
            " now() - interval '1 day'"
            " FROM generate_series(1, %s) g"
            " JOIN inbox_inbox b ON b.id = (SELECT min(id) FROM inbox_inbox)"
            "   + g %% (SELECT count(*) FROM inbox_inbox)",
            [count],
        )
        conn.execute("VACUUM ANALYZE inbox_event")


# --- wake-up --------------------------------------------------------------------------------


def measure_wake(url, deliveries) -> dict:
    _fresh(url, deliveries + 1, 0)
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "runworker", "-v0", "--interval", str(POLL_SECONDS)],
        cwd=ROOT,
        env=_env(url),
    )
    try:
        return _child_json(
            [sys.executable, "-m", "bench.steady", "--deliver", url, "--count", str(deliveries)],
            url,
        )
    finally:
        worker.terminate()
        worker.wait(timeout=30)


def deliver(url, count):
    """In a process of its own: one delivery per idle inbox, each after the last one's run
    finished; the milliseconds from each insert to its finish."""
    common.setup_django(url)
    from inbox.models import Event, Inbox
    from inbox.services import ingest

    inboxes = list(Inbox.objects.order_by("pk").values_list("pk", flat=True))
    latencies = []
    for n, inbox in enumerate(inboxes[: count + 1]):
        ingest(inbox, "chat", f"wake-{n}", {"text": "wake up"})
        deadline = time.monotonic() + POLL_SECONDS / 2
        while True:
            row = Event.objects.filter(inbox_id=inbox, status="done").values("created", "updated")
            if row:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"delivery {n} was not run within {POLL_SECONDS / 2} s")
            time.sleep(0.001)
        if n:  # the first one waits for the worker to start listening
            latencies.append((row[0]["updated"] - row[0]["created"]).total_seconds() * 1000)
        time.sleep(0.05)
    return {"latencies_ms": latencies}


# --- a run's cost with a large table ---------------------------------------------------------


def cycle(url, runs):
    """In a process of its own: `runs` cycles of one delivery and the run that finishes it
    (one Worker.step), to inboxes in turn; the milliseconds per cycle."""
    common.setup_django(url)
    from alwayson.runtime.worker import Worker
    from inbox.models import Inbox
    from inbox.services import ingest

    inboxes = list(Inbox.objects.order_by("pk").values_list("pk", flat=True))
    worker = Worker("cycle")  # ALWAYSON_AGENT is the quiet agent (_env)
    tag = f"{os.getpid()}-{time.monotonic_ns()}"
    for n in range(20):  # warm: connections, prepared statements
        ingest(inboxes[n % len(inboxes)], "chat", f"warm-{tag}-{n}")
        worker.step()
    started = time.perf_counter()
    for n in range(runs):
        ingest(inboxes[n % len(inboxes)], "chat", f"cycle-{tag}-{n}", {"text": "hello"})
        if worker.step() is None:
            raise SystemExit("a delivery found no run")
    return {"ms_per_cycle": (time.perf_counter() - started) / runs * 1000}


def measure_cycles(small_url, large_url, small, large, runs, repeats) -> dict:
    for url, history in ((small_url, small), (large_url, large)):
        _fresh(url, 50, 0)
        _add_history(url, history)
    samples = {"small": [], "large": []}
    for n in range(repeats):
        order = [("small", small_url), ("large", large_url)]
        for name, url in order if n % 2 == 0 else order[::-1]:
            args = ["--cycle", url, "--count", str(runs)]
            samples[name].append(_child_json([sys.executable, "-m", "bench.steady", *args], url))
    return {name: [s["ms_per_cycle"] for s in found] for name, found in samples.items()}


# --- peak memory ------------------------------------------------------------------------------


def drain_rss_kb(url) -> int:
    """Drain every pending event with one `runworker --once` (4 slots): its peak RSS in kB."""
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "runworker", "--once", "-v0", "--concurrency", "4"],
        cwd=ROOT,
        env=_env(url),
    )
    _, status, usage = os.wait4(worker.pid, 0)
    worker.returncode = os.waitstatus_to_exitcode(status)
    if worker.returncode:
        raise SystemExit(f"runworker exited {worker.returncode}")
    import psycopg

    with psycopg.connect(drain._conninfo(url)) as conn:
        (left,) = conn.execute("SELECT count(*) FROM inbox_event WHERE status <> 'done'").fetchone()
    if left:
        raise SystemExit(f"runworker --once left {left} events not done")
    return usage.ru_maxrss


def measure_rss(url, small, large, repeats) -> dict:
    samples = {"small": [], "large": []}
    for n in range(repeats):
        order = [("small", small), ("large", large)]
        for name, events in order if n % 2 == 0 else order[::-1]:
            _fresh(url, events // 10, 10)
            samples[name].append(drain_rss_kb(url))
    return samples


# --- the run --------------------------------------------------------------------------------


def _child_json(command, url):
    import json

    out = subprocess.run(command, cwd=ROOT, env=_env(url), capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", default=common.sibling_url(common.bench_url(), "steady"))
    parser.add_argument("--quick", action="store_true", help="smaller tables, fewer runs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--deliver", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--cycle", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.deliver or args.cycle:
        import json

        if args.deliver:
            print(json.dumps(deliver(args.deliver, args.count)))
        else:
            print(json.dumps(cycle(args.cycle, args.count)))
        return

    small_url, large_url = args.db, common.sibling_url(args.db, "large")
    history = (10_000, 100_000) if args.quick else (10_000, 1_000_000)
    drained = (1_000, 10_000) if args.quick else (1_000, 100_000)
    try:
        wake = measure_wake(small_url, 30 if args.quick else 100)["latencies_ms"]
        cycles = measure_cycles(small_url, large_url, *history, 300, args.repeats)
        rss = measure_rss(small_url, *drained, args.repeats)
    finally:
        for url in (small_url, large_url):
            drain.drop_database(url)

    quantiles = statistics.quantiles(wake, n=100, method="inclusive")
    print(f"\nwake-up, delivery to finished run ({len(wake)} deliveries to idle inboxes,")
    print(f"  the worker polling every {POLL_SECONDS} s): p50 {quantiles[49]:.1f} ms,")
    print(f"  p99 {quantiles[98]:.1f} ms, max {max(wake):.1f} ms")
    small, large = (statistics.median(cycles[k]) for k in ("small", "large"))
    print(
        f"run cycle (one delivery and its run): {large:.2f} ms with {history[1]:,} finished"
        f" events, {small:.2f} ms with {history[0]:,}: {large / small:.2f}x"
    )
    small, large = (statistics.median(rss[k]) / 1024 for k in ("small", "large"))
    print(
        f"worker peak RSS: {large:.0f} MB draining {drained[1]:,} events,"
        f" {small:.0f} MB draining {drained[0]:,}: {(large / small - 1) * 100:+.1f} %"
    )
    print(f"({args.repeats} interleaved runs per side, medians)")


if __name__ == "__main__":
    main()
