"""wrk, a C load generator (Debian's `wrk` 4.1), driving the web rows: its command, its run
and what it printed.

Each script (bench/wrk/*.lua, beside bench/wrk/common.lua) counts the answers' statuses per
thread, and its `done` prints one line, `BENCH-WRK {...}`, with the requests, the run's
duration, latency percentiles and the statuses; `parse` reads it. wrk's own `Requests/sec`
line counts the same requests over the same duration.
"""

import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent / "wrk"
MARK = "BENCH-WRK "
THREADS = 2  # one per core: wrk's own CPU stays small beside the servers'


class WrkFailed(RuntimeError):
    pass


@dataclass(frozen=True)
class Result:
    """One wrk run: requests/s over the run, latency percentiles (ms), the statuses."""

    requests: int
    seconds: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    statuses: dict = field(default_factory=dict)
    errors: dict = field(default_factory=dict)
    exhausted: int = 0
    # CPU per request (ms) of the server's processes and of the database's sessions over the
    # run, when the bench could read them (bench/web.py, Rows.timed).
    web_cpu_ms: float | None = None
    db_cpu_ms: float | None = None

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def unexpected(self, expected: int) -> dict:
        """Statuses other than `expected`, and socket errors, by name."""
        found = {f"HTTP {status}": n for status, n in self.statuses.items() if status != expected}
        found.update(
            {
                f"socket {kind}": n
                for kind, n in self.errors.items()
                if n and kind in ("connect", "read", "write", "timeout")
            }
        )
        if self.exhausted:
            found["ran out of prepared request ids"] = self.exhausted
        return found


def parse(output: str) -> Result:
    """The BENCH-WRK line of a run's output (what bench/wrk/common.lua's done prints)."""
    for line in output.splitlines():
        if line.startswith(MARK):
            found = json.loads(line[len(MARK) :])
            return Result(
                requests=found["requests"],
                seconds=found["duration_us"] / 1e6,
                p50_ms=found["p50_us"] / 1000,
                p90_ms=found["p90_us"] / 1000,
                p99_ms=found["p99_us"] / 1000,
                max_ms=found["max_us"] / 1000,
                statuses={int(status): n for status, n in found["statuses"].items()},
                errors=found["errors"],
                exhausted=found.get("exhausted", 0),
            )
    raise WrkFailed(f"no {MARK.strip()} line in wrk's output:\n{output[-2000:]}")


def wrk_binary() -> str:
    found = shutil.which("wrk")
    if found is None:
        raise WrkFailed("wrk is not installed (Debian: apt-get install wrk)")
    return found


def command(base, script, connections, seconds, args=(), threads=THREADS) -> list[str]:
    """wrk's argv: `threads` threads (at most one per connection), `connections` kept-alive
    connections for `seconds`, the script and its arguments after `--`."""
    return [
        wrk_binary(),
        f"-t{min(threads, connections)}",
        f"-c{connections}",
        f"-d{seconds:g}s",
        "--timeout",
        "10s",
        "-s",
        str(SCRIPTS / script),
        base + "/",
        "--",
        *(str(arg) for arg in args),
    ]


def run(base, script, connections, seconds, args=()) -> Result:
    argv = command(base, script, connections, seconds, args)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
    if done.returncode != 0:
        raise WrkFailed(
            f"wrk exited with {done.returncode}: {' '.join(argv)}\n{done.stdout}\n{done.stderr}"
        )
    return parse(done.stdout)
