"""The benchmark suite: every row of the performance table, alwayson side by side with its
reference in one run, then issue 36's goals (and issue 25's that stay) beside what the run
measured.

    python bench/run.py [--quick] [--json out.json] [--only ingest,webhook,drain]

It makes a database of its own (BENCH_DATABASE_URL, default
postgres://postgres@127.0.0.1:5432/bench; dropped at the end) and sets it up the way a real
one starts: migrate, create the inboxes, VACUUM ANALYZE with every lease's marker NULL, and
measure ("fresh" statistics); then once more after the markers are set and a second ANALYZE
("marked"), autovacuum off throughout (bench/phases.py). Each measure's two systems run
interleaved (alwayson, reference, then reference, alwayson, ...) at least three times; the
table gives the medians, their ratio, the goal, and both rates as a fraction of the
machine's ceiling: pgbench's one-row INSERT transaction, measured in the same run
(bench/ceiling.py). Ratios, not absolute figures, are what to compare: the machine may be
shared. The web rows (bench/web.py: wrk against the production web and gunicorn's sync
workers, both started here) take 3 runs per system in the full mode and 2 in the quick one,
whose web rows run under the marked statistics only; the live rows (bench/live.py) run in a
process of their own. --quick takes a few minutes (fewer events per run, shorter pgbench and
wrk runs, fewer replies, 100 streams instead of 500).
"""

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import ceiling, common, goals, phases  # noqa: E402


@dataclass(frozen=True)
class Phased:
    """Rows measured under each statistics phase, on the bench database: `setup(args,
    repeats)` runs once before the first phase's statistics are gathered (what it makes is
    in them); `measure(url, args, repeats, prepared, phase, only)` returns the rows of the
    `names` asked for. A new kind of row (the live pages) is one more entry in PHASED."""

    names: tuple
    setup: Callable
    measure: Callable
    label: str


def _ingest_setup(args, repeats):
    from bench import ingest

    return ingest.setup()


def _ingest_measure(url, args, repeats, prepared, phase, only):
    from bench import ingest

    return ingest.measure(url, args.quick, repeats, interleave, prepared, phase)


def _web_setup(args, repeats):
    from django.core.management import call_command

    from bench import web

    # As a release does: the web serves the pages' static files by their hashed names.
    call_command("collectstatic", interactive=False, verbosity=0)
    return web.setup(args.quick, repeats, phases.PHASES)


def _web_measure(url, args, repeats, prepared, phase, only):
    from bench import web

    return web.measure(url, args.quick, repeats, interleave, prepared, phase, only)


PHASED = (
    Phased(("ingest",), _ingest_setup, _ingest_measure, "ingest rows"),
    Phased(("webhook", "chat", "answer", "oversize"), _web_setup, _web_measure, "web rows"),
)
PHASED_NAMES = tuple(name for kind in PHASED for name in kind.names)
MEASURES = ("ceiling", *PHASED_NAMES, "drain", "live")


def interleave(pair, repeats) -> dict:
    """Run (alwayson, reference) `repeats` times each, alternating which goes first: the
    medians, every figure, and the load average seen around the runs."""
    figures = {"alwayson": [], "reference": []}
    loads = [common.load()]
    for n in range(repeats):
        order = [("alwayson", pair[0]), ("reference", pair[1])]
        for system, run in order if n % 2 == 0 else reversed(order):
            figures[system].append(run())
            loads.append(common.load())
    return {
        "alwayson": common.median(figures["alwayson"]),
        "reference": common.median(figures["reference"]),
        "runs": figures,
        "load": common.median(loads),
    }


def parse_only(parser, raw) -> list[str]:
    only = [name.strip() for name in raw.split(",") if name.strip()]
    unknown = set(only) - set(MEASURES)
    if unknown or not only:
        parser.error(f"--only: unknown measure(s) {sorted(unknown)}; choose from {MEASURES}")
    return only


def log(started, what) -> None:
    print(f"[{time.monotonic() - started:6.1f} s] {what}", file=sys.stderr, flush=True)


def mark(inbox_ids) -> None:
    """One pending event in each inbox, through the product: the marker is what it sets."""
    from inbox.services import ingest

    for inbox_id in inbox_ids:
        ingest(inbox_id, "bench", "marker", {"text": "sets the marker"})


def phased_rows(url, args, repeats, only, meta) -> list[dict]:
    """Set up the bench database, then every phased row under each phase's statistics."""
    import psycopg
    from django.core.management import call_command
    from django.db import connection

    started = time.monotonic()
    call_command("migrate", verbosity=0)
    kinds = [kind for kind in PHASED if set(kind.names) & set(only)]
    prepared = {kind.label: kind.setup(args, repeats) for kind in kinds}
    log(started, "set up: migrated, " + ", ".join(f"{kind.label} prepared" for kind in kinds))
    rows = []
    meta["phases"] = {}
    for phase in phases.PHASES:
        connection.close()
        with psycopg.connect(url, autocommit=True) as conn:
            described = phases.prepare(conn.cursor(), phase, mark=mark)
        connection.close()
        meta["phases"][phase] = described
        print(phases.summary(phase, described), flush=True)
        for kind in kinds:
            rows += kind.measure(url, args, repeats, prepared[kind.label], phase, only)
            log(started, f"{kind.label} measured under {phase} statistics")
    return rows


def add_ceiling_fractions(rows, found) -> None:
    for entry in rows:
        for system in ("alwayson", "reference"):
            entry[f"{system}_of_ceiling"] = ceiling.fraction(
                entry.get(system), entry.get("clients"), found
            )


def live_pages(url, quick) -> list[dict]:
    """bench/live.py's rows (50 pages in a browser, 500 streams, idle streams), in a process of
    its own: it sets Django up on a database of its own. It prints its figures as it ends."""
    import json
    import os
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "live.json")
        command = [sys.executable, str(Path(__file__).with_name("live.py")), "--json", out]
        subprocess.run(
            command + (["--quick"] if quick else []),
            check=True,
            env={**os.environ, "BENCH_DATABASE_URL": url},
        )
        with open(out) as written:
            return json.load(written)["rows"]


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="about three minutes in all")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON here")
    parser.add_argument("--only", default=",".join(MEASURES), help="comma-separated measures")
    parser.add_argument("--repeats", type=int, default=None, help="runs per system (>= 3)")
    args = parser.parse_args(argv)
    only = parse_only(parser, args.only)
    repeats = args.repeats or (3 if args.quick else 5)
    if repeats < 3:
        parser.error("--repeats must be at least 3")

    started = time.monotonic()
    url = common.bench_url()
    meta = {
        **common.machine(),
        "quick": args.quick,
        "repeats": repeats,
        "database": common.database_name(url),
    }
    rows = []
    found = {}
    if {"ceiling", *PHASED_NAMES} & set(only):
        common.create_database(url)
        try:
            meta["postgresql"] = common.durability(url)
            if "ceiling" in only:
                found = ceiling.measure(url, 2 if args.quick else 5)
                meta["ceiling_tps"] = found
                print(
                    "ceiling (pgbench, one-row INSERT transactions): "
                    + ", ".join(f"{tps:,.0f} tps at {n} client(s)" for n, tps in found.items()),
                    flush=True,
                )
            if set(PHASED_NAMES) & set(only):
                common.setup_django(url)
                rows += phased_rows(url, args, repeats, only, meta)
        finally:
            if set(PHASED_NAMES) & set(only):
                from django.db import connections

                connections.close_all()
            common.drop_database(url)
    if "drain" in only:
        from bench import drain

        rows += drain.measure(common.sibling_url(url, "drain"), args.quick, repeats)

    live_rows = []
    if "live" in only:
        live_rows = live_pages(url, args.quick)

    from bench import limits, web

    table = [entry for entry in rows if not str(entry.get("key", "")).startswith("limits.")]
    add_ceiling_fractions(table, found)
    for entry in table:
        entry.setdefault("met", common.met(entry))
    print()
    common.print_table(table)
    print("\nof ceiling: alwayson's / the reference's rate over pgbench's one-row INSERT tps")
    print("at the row's connections (web rows: the server's 2 workers; drain: its 8 slots).")
    if any("p99_ratio" in entry for entry in table):
        print("\nweb rows' latency under the same load (wrk; medians of the runs' percentiles):")
        web.print_latencies(table)
        print("\nweb rows' CPU per request (the server's processes and the database's sessions,")
        print("from /proc over each run; medians of the runs):")
        web.print_cpu(table)
    if len(table) < len(rows):
        print("\nbodies bounded before they are read (bench/limits.py):")
        limits.print_rows(rows)
    lines = goals.evaluate(rows + live_rows)
    print("\nissue 36's goals, with issue 25's that stay (the worst statistics phase counts):")
    goals.print_goals(lines)
    loads = [entry["load"] for entry in rows if entry.get("load") is not None]
    if loads:
        print(
            f"\nload average (1 min) while measuring: median {common.median(loads):.2f} "
            f"on {meta['cpus']} cores; {repeats} runs per system (web rows: "
            f"{web.sizes(args.quick)['runs']}), medians"
        )
    if "postgresql" in meta:
        print("postgresql: " + ", ".join(f"{k}={v}" for k, v in meta["postgresql"].items()))
    meta["wall_seconds"] = round(time.monotonic() - started, 1)
    print(f"wall time: {meta['wall_seconds'] / 60:.1f} min")
    if args.json:
        common.write_json(args.json, rows + live_rows, meta, goals=lines)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
