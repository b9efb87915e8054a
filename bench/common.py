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


def print_table(rows, out=sys.stdout) -> None:
    header = ["measure", "alwayson", "reference", "ratio", "goal", "met"]
    lines = [header]
    for entry in rows:
        unit = entry.get("unit", "")
        lines.append(
            [
                entry["measure"],
                f"{_figure(entry.get('alwayson'))} {unit}".strip(),
                f"{_figure(entry.get('reference'))} {unit}".strip(),
                "-" if entry.get("ratio") is None else f"{entry['ratio']:.2f}",
                "-" if entry.get("goal") is None else f">= {entry['goal']:g}",
                met(entry),
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for n, line in enumerate(lines):
        print(
            " | ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)),
            file=out,
        )
        if n == 0:
            print("-+-".join("-" * width for width in widths), file=out)


def write_json(path, rows, meta) -> None:
    Path(path).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, default=str) + "\n")


def machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
