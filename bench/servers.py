"""The web servers the web and live rows measure, started by the bench on its database:

- production: the command alwayson/ops/processes.py's PROCESSES["web"] names, run as
  `processes.local_argv` runs it (whatever server and workers it says: the bench does not
  care), 2 workers (WEB_CONCURRENCY);
- reference: gunicorn's sync workers serving `alwayson.wsgi`, the plain Django deployment a
  team would otherwise run: the product's gunicorn config (bind, workers, logs, timeouts),
  `--worker-class sync --threads 1` (gunicorn turns a sync worker with threads into gthread),
  2 workers, persistent database connections (CONN_MAX_AGE, the product's default outside a
  pool).

Both run the same settings module, the same code and the same database; each writes its
stderr (tracebacks of a 500) to a log file the bench names when a row fails, and gets a
TMPDIR of its own, where an oversize body would be spooled (bench/limits.py looks there).
"""

import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from alwayson.ops import processes

from . import common

WORKERS = 2
LOGS = Path(tempfile.gettempdir()) / "alwayson-bench-web"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def production_argv() -> list[str]:
    return processes.local_argv(processes.PROCESSES["web"], common.ROOT)


def reference_argv() -> list[str]:
    gunicorn = processes.local_argv(("gunicorn",), common.ROOT)[0]
    return [
        gunicorn,
        "--config",
        "python:alwayson.gunicorn_conf",
        "--worker-class",
        "sync",
        "--threads",
        "1",
        "alwayson.wsgi",
    ]


class Server:
    """One web server (a master and its workers) on 127.0.0.1, on `url`'s database."""

    def __init__(self, name, argv, url, settings, workers=WORKERS, env=None):
        self.name = name
        self.argv = argv
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        LOGS.mkdir(exist_ok=True)
        self.log = LOGS / f"{name}.log"
        self.tmpdir = Path(tempfile.mkdtemp(prefix=f"{name}-tmp-", dir=LOGS))
        self.env = {
            **os.environ,
            **common.BENCH_ENV,
            "DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": settings,
            "ALWAYSON_WEB_BIND": f"127.0.0.1:{self.port}",
            "WEB_CONCURRENCY": str(workers),
            "TMPDIR": str(self.tmpdir),
            **(env or {}),
        }
        self.process = None

    def start(self, timeout=60) -> "Server":
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                self.argv,
                cwd=common.ROOT,
                env=self.env,
                stdout=subprocess.DEVNULL,  # the access log, as a process manager would keep it
                stderr=log,
            )
        self._wait(timeout)
        return self

    def _wait(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the {self.name} web server exited with {self.process.returncode}"
                    f" (its log: {self.log})"
                )
            try:
                urllib.request.urlopen(self.base + "/healthz", timeout=2)
                return
            except urllib.error.HTTPError:
                return  # answering, whatever it says of the loops' health
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"the {self.name} web server did not answer (its log: {self.log})")

    def pids(self) -> list[int]:
        """The master and every process under it (workers, and anything they start)."""
        children = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(stat.parent.name))
        found, todo = [], [self.process.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo += children.get(pid, [])
        return found

    def cpu_seconds(self) -> float:
        """utime + stime of every process of the server so far (/proc/<pid>/stat)."""
        return sum(filter(None, map(common.cpu_seconds, self.pids())))

    def stop(self):
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def production(url, settings="bench.settings", workers=WORKERS, env=None) -> Server:
    return Server("production", production_argv(), url, settings, workers, env)


def reference(url, settings="bench.settings", workers=WORKERS, env=None) -> Server:
    return Server("reference", reference_argv(), url, settings, workers, env)
