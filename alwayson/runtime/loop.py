"""What every loop command shares: flags, logging by verbosity, process name, signals."""

import logging
import math
import os
import signal
import socket
import threading

from django.core.management.base import CommandError
from django.db import close_old_connections, connections

from alwayson.command import AlwaysonCommand
from alwayson.ops.database import OUTAGE, DatabaseUnusable, OutageBackoff, check_database
from alwayson.ops.health import ProcessBeat
from alwayson.ops.models import Process
from inbox.validation import require_key

VERBOSITY_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}
# Longer sleeps are a typo (a wait past threading.TIMEOUT_MAX even raises OverflowError).
MAX_INTERVAL = 24 * 3600
# The worker id is the lease holder and the Process row's name: it fits both columns.
WORKER_ID_MAX = Process._meta.get_field("worker_id").max_length


class LoopCommand(AlwaysonCommand):
    """Base for runworker, runscheduler and rundispatcher.

    A single-threaded loop command implements `step()`: one unit of work, returning whether
    there was any. The loop drains (steps while there is work), then sleeps `--interval`.
    While it runs, the process beats its `Process` row (alwayson/ops/health.py).

    A database it cannot use (none by that name, migrations not applied), found at start-up or
    once an outage ends, stops it with one line saying what to do (alwayson/ops/database.py).
    """

    #: the process's role, shown in pg_stat_activity.application_name
    role = "alwayson"
    #: its Process.kind
    kind = None
    default_interval = 1.0

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="drain what is due, then exit")
        parser.add_argument(
            "--interval",
            type=float,
            default=self.default_interval,
            help=f"seconds to sleep when idle (default {self.default_interval})",
        )
        parser.add_argument(
            "--worker-id", default=None, help="this process's name (default host:pid)"
        )

    def check_positive(self, name, value, most=None):
        """`--name` is None (not given) or a positive, finite number, at most `most`."""
        if value is None:
            return
        if not math.isfinite(value) or value <= 0:
            raise CommandError(f"--{name} must be positive, not {value}")
        if most is not None and value > most:
            raise CommandError(f"--{name} must be at most {most}, not {value}")

    def check_interval(self, interval):
        self.check_positive("interval", interval, most=MAX_INTERVAL)

    def worker_id(self, given):
        """`--worker-id`, or host:pid when not given."""
        if given is None or given == "":
            return default_worker_id()
        try:
            return require_key("--worker-id", given, WORKER_ID_MAX)
        except ValueError as exc:
            raise CommandError(str(exc)) from None

    def configure(self, verbosity, worker_id):
        logging.getLogger("alwayson").setLevel(VERBOSITY_LEVELS.get(verbosity, logging.DEBUG))
        db = connections.settings["default"]
        # A loop wakes every second: keep its connection between wakes (health-checked by
        # close_old_connections) instead of opening a database session per poll.
        db["CONN_MAX_AGE"] = 300
        if db["ENGINE"].endswith("postgresql"):
            # Set before any connection opens: every thread's connection copies it.
            db.setdefault("OPTIONS", {})["application_name"] = f"{self.role} {worker_id}"[:63]
        connections["default"].close()
        # Opens it anew, with the settings above.
        check_database()

    def execute(self, *args, **options):
        try:
            return super().execute(*args, **options)
        except DatabaseUnusable as exc:
            # One line and exit 1, as a bad flag: a supervisor that restarts the process
            # shows the same line again rather than a traceback every half second.
            raise CommandError(str(exc)) from None

    def install_signals(self, stop):
        """First SIGTERM/SIGINT: stop taking work and let the runs in flight finish.
        Second: exit at once (leases then lapse on their own)."""
        received = []

        def handle(signum, frame):
            received.append(signum)
            if len(received) > 1:
                os._exit(128 + signum)
            stop()

        signal.signal(signal.SIGTERM, handle)
        # An ignored SIGINT stays ignored: `runall` starts its children so, since a terminal's
        # Ctrl-C reaches the whole process group and `runall` sends each child its own SIGTERM.
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, handle)

    def step(self) -> bool:
        raise NotImplementedError

    def loop(self, once, interval, worker_id):
        """Drain, then sleep in `interval` ticks until a signal; `once` drains and returns."""
        stop = threading.Event()
        self.install_signals(stop.set)
        log = logging.getLogger(f"alwayson.{self.role}")
        process_beat = ProcessBeat(self.kind, worker_id)
        process_beat.start()
        clean = False
        try:
            self.drain(stop, once, interval, process_beat, log)
            clean = True
        finally:
            process_beat.stop(clean)
            connections["default"].close()

    def drain(self, stop, once, interval, process_beat, log):
        backoff = OutageBackoff()
        while not stop.is_set():
            close_old_connections()
            had_work = backoff.attempt(self.step, stop, log)
            if had_work is OUTAGE:
                continue
            if had_work:
                process_beat.count_run()
                continue
            if once:
                break
            stop.wait(interval)


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"
