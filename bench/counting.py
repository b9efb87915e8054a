"""The statements a web process runs, counted for the live rows (bench/live.py).

Installed only by bench/live_settings.py, when BENCH_STATEMENTS_DIR names a directory: every
database connection the process opens (a request's, the live hub's threads', a pool's
checkout) gets an execute wrapper that adds one to the process's counter, an 8-byte file
`<dir>/<pid>` mapped into memory (no system call per statement; a lock, as threads share it).
The bench sums the files whenever it likes, whichever worker served what, so it needs no
request to the server, which would itself run statements and wake an idle process.

Why this and not PostgreSQL's own counters: pg_stat_statements is not installed here, and
pg_stat_database's transactions are per database, reported up to 10 s late, and count the
bench's own commits too. What it does not see: statements sent outside Django's cursors
(the live hub's LISTEN connection, which runs LISTEN once; a delivery's libpq statement,
which takes Django's cursors itself while an execute wrapper is installed).
"""

import mmap
import os
import threading
from pathlib import Path

from django.apps import AppConfig

DIRECTORY = "BENCH_STATEMENTS_DIR"


class Counter:
    """This process's statements, in `<directory>/<pid>`; a forked child counts in its own."""

    def __init__(self, directory):
        self.directory = Path(directory)
        self.lock = threading.Lock()
        self.view = None
        self.pid = None

    def _open(self):
        path = self.directory / str(os.getpid())
        with open(path, "wb+") as file:
            file.write(b"\0" * 8)
            file.flush()
            self.view = memoryview(mmap.mmap(file.fileno(), 8)).cast("Q")
        self.pid = os.getpid()

    def add(self, n=1):
        with self.lock:
            if self.pid != os.getpid():
                self._open()
            self.view[0] += n

    def __call__(self, execute, sql, params, many, context):
        self.add()
        return execute(sql, params, many, context)


def by_process(directory) -> dict[str, int]:
    """Each counted process's statements so far, by its pid."""
    return {
        path.name: int.from_bytes(path.read_bytes()[:8], "little")
        for path in Path(directory).iterdir()
    }


def total(directory) -> int:
    """Every counted process's statements so far."""
    return sum(by_process(directory).values())


class StatementCounting(AppConfig):
    name = "bench"
    label = "bench_statement_counting"
    verbose_name = "bench: statements counted"

    def ready(self):
        directory = os.environ.get(DIRECTORY)
        if not directory:
            return
        from django.db.backends.signals import connection_created

        counter = Counter(directory)

        def install(sender, connection, **kwargs):
            if counter not in connection.execute_wrappers:
                connection.execute_wrappers.append(counter)

        connection_created.connect(install, weak=False)
