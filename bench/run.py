"""The benchmark suite: every row of the performance table, alwayson side by side with its
reference in one run.

    python bench/run.py [--quick] [--json out.json] [--only ingest,webhook,drain]

It makes a database of its own (BENCH_DATABASE_URL, default
postgres://postgres@127.0.0.1:5432/bench; dropped at the end), runs each measure's two
systems interleaved (alwayson, reference, then reference, alwayson, ...) at least three
times, and prints the medians, their ratio and the goal, with the machine's load while it
ran. Ratios, not absolute figures, are what to compare: the machine may be shared.
--quick takes about two minutes (fewer events per run).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402

MEASURES = ("ingest", "webhook", "drain")


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


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="about two minutes in all")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON here")
    parser.add_argument("--only", default=",".join(MEASURES), help="comma-separated measures")
    parser.add_argument("--repeats", type=int, default=None, help="runs per system (>= 3)")
    args = parser.parse_args(argv)
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = set(only) - set(MEASURES)
    if unknown:
        parser.error(f"--only: unknown measure(s) {sorted(unknown)}; choose from {MEASURES}")
    repeats = args.repeats or (3 if args.quick else 5)
    if repeats < 3:
        parser.error("--repeats must be at least 3")

    url = common.bench_url()
    meta = {
        **common.machine(),
        "quick": args.quick,
        "repeats": repeats,
        "database": common.database_name(url),
    }
    rows = []
    if {"ingest", "webhook"} & set(only):
        common.create_database(url)
        try:
            meta["postgresql"] = common.durability(url)
            common.setup_django(url)
            from django.core.management import call_command

            call_command("migrate", verbosity=0)
            from bench import ingest

            if "ingest" in only:
                rows += ingest.measure(url, args.quick, repeats, interleave)
            if "webhook" in only:
                rows += ingest.measure_webhook(url, args.quick, repeats, interleave)
        finally:
            from django.db import connections

            connections.close_all()
            common.drop_database(url)
    if "drain" in only:
        from bench import drain

        rows += drain.measure(common.sibling_url(url, "drain"), args.quick, repeats)

    for entry in rows:
        entry.setdefault("met", common.met(entry))
    print()
    common.print_table(rows)
    loads = [entry["load"] for entry in rows if entry.get("load") is not None]
    if loads:
        print(
            f"\nload average (1 min) while measuring: median {common.median(loads):.2f} "
            f"on {meta['cpus']} cores; {repeats} runs per system, medians"
        )
    if "postgresql" in meta:
        print("postgresql: " + ", ".join(f"{k}={v}" for k, v in meta["postgresql"].items()))
    if args.json:
        common.write_json(args.json, rows, meta)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
