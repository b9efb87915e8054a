"""What a process counts, kept until it is added to the database's MetricTotal rows."""

import logging
import threading
from collections import defaultdict

from django.db import DatabaseError, connection, transaction

from alwayson.ops.models import MetricTotal

log = logging.getLogger("alwayson.metrics")


class Recorder:
    """This process's counts not yet added to the database, by (name, labels, bucket).

    `batched` is set while a heartbeat thread flushes every ALWAYSON_HEARTBEAT_INTERVAL;
    otherwise every count is flushed as it is made (a web process's few, a test's).
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, str, str], float] = defaultdict(float)
        self.batched = False

    def add(self, items):
        with self._lock:
            for key, amount in items:
                self._pending[key] += amount
        if not self.batched:
            try:
                self.flush()
            except DatabaseError:
                log.warning("could not add metrics to the database; kept for the next try")

    def pending(self) -> dict:
        with self._lock:
            return dict(self._pending)

    def flush(self) -> int:
        """Add the pending counts to MetricTotal in one statement; the rows written.

        Keys in sorted order, so two processes flushing at once lock the shared rows in one
        order and never deadlock. On a database error the counts are kept for the next try.
        """
        with self._lock:
            taken, self._pending = self._pending, defaultdict(float)
        if not taken:
            return 0
        rows = sorted(taken.items())
        try:
            _add_totals(rows)
        except BaseException:
            with self._lock:
                for key, amount in rows:
                    self._pending[key] += amount
            raise
        return len(rows)


RECORDER = Recorder()


def _add_totals(rows):
    table = connection.ops.quote_name(MetricTotal._meta.db_table)
    values = ", ".join(["(%s, %s, %s, %s)"] * len(rows))
    params = [
        part for (name, labels, bucket), amount in rows for part in (name, labels, bucket, amount)
    ]
    # A transaction of its own, or a savepoint: a failed flush never spoils a caller's.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (name, labels, bucket, value) VALUES {values}"
            f" ON CONFLICT (name, labels, bucket)"
            f" DO UPDATE SET value = {table}.value + excluded.value",
            params,
        )


def flush() -> int:
    return RECORDER.flush()


def flush_periodically(interval):
    """From now on this process's counts are added every `interval` seconds by a thread of
    its own, as a loop process's beat adds them: a web process's requests (an approval's
    answer, counted at its commit) then cost no transaction and no WAL flush of their own.
    A process killed outright loses at most one interval's counts. Returns the function that
    stops the thread and adds what is left (a worker process's exit)."""
    RECORDER.batched = True
    stopping = threading.Event()

    def add_every_interval():
        while not stopping.wait(interval):
            _flush_apart()

    thread = threading.Thread(target=add_every_interval, name="metrics", daemon=True)
    thread.start()

    def stop():
        stopping.set()
        thread.join(timeout=10)
        RECORDER.batched = False
        _flush_apart()

    return stop


def _flush_apart():
    try:
        RECORDER.flush()
    except DatabaseError:
        log.warning("could not add metrics to the database; kept for the next try")
    finally:
        connection.close()  # this thread's: back to the pool, or closed, until the next count
