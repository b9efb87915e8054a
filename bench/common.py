"""What every benchmark shares: the result row, medians, the machine's load, the table, the
JSON file, and the benchmark database (made and dropped here, never a real one).

The database is BENCH_DATABASE_URL (default postgres://postgres@127.0.0.1:5432/bench); a
measure that needs a second one derives it with `sibling_url(url, "drain")`.
"""

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/bench"

# The bench runs the product as production would (no per-query logging of DEBUG), on its
# own database; nothing here reaches the network but the loopback.
BENCH_ENV = {
    "DEBUG": "False",
    "SECRET_KEY": "bench-only-secret-key-not-for-production-0123456789",
    "SECURE_SSL_REDIRECT": "False",
    "ALWAYSON_GITHUB_SECRETS": "bench-github-secret",
}


def bench_url() -> str:
    return os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL)


def database_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def sibling_url(url: str, suffix: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database_name(url)}_{suffix}"))


def _maintenance(url: str):
    import psycopg

    parts = urlsplit(url)
    return psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True)


def create_database(url: str) -> None:
    """Drop and create the database named by `url` (a benchmark's own, never a real one)."""
    drop_database(url)
    with _maintenance(url) as conn:
        conn.execute(f'CREATE DATABASE "{database_name(url)}"')


def drop_database(url: str) -> None:
    with _maintenance(url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database_name(url)}" WITH (FORCE)')


def durability(url: str) -> dict:
    """The settings that make a commit durable: the bench reports them with its figures."""
    import psycopg

    with psycopg.connect(url) as conn:
        return {
            name: conn.execute(f"SHOW {name}").fetchone()[0]
            for name in ("fsync", "synchronous_commit", "full_page_writes", "server_version")
        }


def setup_django(url: str) -> None:
    """Django for this process, on the bench database."""
    os.environ.update(BENCH_ENV)
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def cpu_seconds(pid) -> float | None:
    """utime + stime of process `pid` so far, all its threads (/proc/<pid>/stat), or None
    when it is gone or out of this machine's sight."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load() -> float:
    """The machine's 1-minute load average (2 cores here: above 2, others were running)."""
    return os.getloadavg()[0]


def median(values):
    return statistics.median(values) if values else None


def row(measure, alwayson, reference, unit, goal, **extras) -> dict:
    """One line of the table: the medians of both systems, their ratio, the goal it meets."""
    ratio = alwayson / reference if alwayson and reference else None
    return {
        "measure": measure,
        "alwayson": alwayson,
        "reference": reference,
        "unit": unit,
        "ratio": ratio,
        "goal": goal,
        **extras,
    }


def met(entry) -> str:
    ratio, goal = entry.get("ratio"), entry.get("goal")
    if ratio is None or goal is None:
        return "-"
    return "yes" if ratio >= goal else "no"


def _figure(value) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def ceiling_cell(entry) -> str:
    """alwayson's and the reference's rate as fractions of the machine's ceiling."""
    ours, theirs = entry.get("alwayson_of_ceiling"), entry.get("reference_of_ceiling")
    if ours is None and theirs is None:
        return "-"
    return " / ".join("-" if value is None else f"{value:.2f}" for value in (ours, theirs))


HEADER = ["measure", "stats", "alwayson", "reference", "ratio", "goal", "met", "of ceiling"]


def cells(entry) -> list[str]:
    """A row's cells: the measure, the statistics phase it ran under, both medians, their
    ratio, the goal, and both rates as a fraction of the ceiling (pgbench's one-row INSERT)."""
    unit = entry.get("unit", "")
    return [
        entry["measure"],
        entry.get("phase") or "-",
        f"{_figure(entry.get('alwayson'))} {unit}".strip(),
        f"{_figure(entry.get('reference'))} {unit}".strip(),
        "-" if entry.get("ratio") is None else f"{entry['ratio']:.2f}",
        "-" if entry.get("goal") is None else f">= {entry['goal']:g}",
        met(entry),
        ceiling_cell(entry),
    ]


def print_table(rows, out=None) -> None:
    print_grid(HEADER, [cells(entry) for entry in rows], out)


def print_grid(header, lines, out=None) -> None:
    """A plain-text table, columns padded to their widest cell, a rule under the header."""
    out = out or sys.stdout
    lines = [header, *lines]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for n, line in enumerate(lines):
        cells_ = (cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        print(" | ".join(cells_).rstrip(), file=out)
        if n == 0:
            print("-+-".join("-" * width for width in widths), file=out)


def markdown_table(header, lines) -> str:
    """The same grid as Markdown (the tables in docs/explanation/performance.md)."""
    rows = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return "\n".join(rows + ["| " + " | ".join(line) + " |" for line in lines])


def write_json(path, rows, meta, goals=()) -> None:
    document = {"meta": meta, "rows": rows, "goals": list(goals)}
    Path(path).write_text(json.dumps(document, indent=2, default=str) + "\n")


def machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
