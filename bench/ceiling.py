"""The machine's ceiling: how many one-row INSERT transactions per second this PostgreSQL
commits at all, measured by pgbench in the same run (each a durable commit, like a delivery).

Every row's rate is also shown as a fraction of the ceiling at its number of connections:
what is left between the product and the physical limit, apart from the reference.
"""

import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

CLIENTS = (1, 2, 8)
TABLE = "bench_ceiling"
SCRIPT = f"INSERT INTO {TABLE} (payload) VALUES ('a message of ordinary size');\n"
_TPS = re.compile(r"^tps = ([0-9]+(?:\.[0-9]+)?) \(without initial connection time\)", re.M)


def parse_tps(output: str) -> float:
    """The transactions per second pgbench reports, without connection start-up."""
    found = _TPS.search(output)
    if found is None:
        raise ValueError(
            f"no 'tps = ... (without initial connection time)' in pgbench's output:\n{output}"
        )
    return float(found.group(1))


def pgbench_command(url, clients, seconds, script_path) -> list[str]:
    parts = urlsplit(url)
    return [
        shutil.which("pgbench") or "pgbench",
        "-n",  # no vacuum of pgbench's own tables: there are none
        "-M",
        "prepared",
        "-f",
        str(script_path),
        "-c",
        str(clients),
        "-j",
        str(clients),
        "-T",
        str(seconds),
        "-h",
        parts.hostname or "127.0.0.1",
        "-p",
        str(parts.port or 5432),
        "-U",
        parts.username or "postgres",
        parts.path.lstrip("/"),
    ]


def measure(url, seconds, rounds=2) -> dict[int, float]:
    """tps for 1, 2 and 8 clients, `seconds` each, into a table of the bench database: the
    best of `rounds` rounds (a ceiling is what the machine can do; a shared one dips)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        conn.execute(f"CREATE TABLE {TABLE} (id bigserial PRIMARY KEY, payload text NOT NULL)")
    try:
        with tempfile.TemporaryDirectory() as folder:
            script = Path(folder) / "insert.sql"
            script.write_text(SCRIPT)
            found = {clients: 0.0 for clients in CLIENTS}
            for _ in range(rounds):
                for clients in CLIENTS:
                    done = subprocess.run(
                        pgbench_command(url, clients, seconds, script),
                        capture_output=True,
                        text=True,
                        check=False,
                    )
                    if done.returncode != 0:
                        raise RuntimeError(
                            f"pgbench failed ({done.returncode}): {done.stderr.strip()}"
                        )
                    found[clients] = max(found[clients], parse_tps(done.stdout))
            return found
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {TABLE}")


def fraction(rate, clients, ceiling) -> float | None:
    """`rate` over the ceiling at `clients` connections (the nearest measured at or below)."""
    if not rate or not ceiling or not clients:
        return None
    below = [n for n in ceiling if n <= clients]
    return rate / ceiling[max(below) if below else min(ceiling)]
