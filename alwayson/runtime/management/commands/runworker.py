import logging
import time

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError
from django.db import InterfaceError, OperationalError, connection

from alwayson.egress.sealing import seal_worker, sealing
from alwayson.ops.workerrole import DOCS, reach
from alwayson.runtime.loading import load_agent
from alwayson.runtime.loop import LoopCommand, OutageBackoff
from alwayson.runtime.worker import WorkerPool

log = logging.getLogger("alwayson.worker")


class Command(LoopCommand):
    help = "Run the agent for inboxes with work: acquire, claim, run, finish, release."
    role = "alwayson-worker"

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument(
            "--concurrency", type=int, default=1, help="slots (threads) per process"
        )
        parser.add_argument("--max-runs", type=int, default=None, help="exit after this many runs")
        parser.add_argument("--agent", default=None, help="dotted path; default ALWAYSON_AGENT")

    def handle(
        self, *args, once, interval, worker_id, concurrency, max_runs, agent, verbosity, **kw
    ):
        self.check_interval(interval)
        self.check_positive("concurrency", concurrency)
        self.check_positive("max-runs", max_runs)
        worker_id = self.worker_id(worker_id)
        if sealing():
            # First, before an agent's module is imported: the agent code runs in a process
            # that never held a credential (alwayson/egress/sealing.py). Returns when sealed.
            seal_worker()
            # Still before an agent is imported: its code can read what the role can.
            check_reach()
        try:
            # Before configure(), which reopens the connection: a bad flag touches nothing.
            default_agent = load_agent(agent, field="--agent" if agent else "ALWAYSON_AGENT")
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.configure(verbosity, worker_id)
        try:
            pool = WorkerPool(
                worker_id=worker_id,
                agent=default_agent,
                concurrency=concurrency,
                interval=interval,
                once=once,
                max_runs=max_runs,
            )
            # A missing API key or a broken tool module stops the worker here, once, with
            # its reason, instead of failing every run.
            pool.worker.agents.preflight()
        except (ValueError, ImproperlyConfigured) as exc:
            raise CommandError(str(exc)) from None
        self.install_signals(pool.request_stop)
        log.info("worker %s: %s slot(s), interval %.2fs", worker_id, concurrency, interval)
        runs = pool.run()
        log.info("worker %s: stopped after %s run(s)", worker_id, runs)


def check_reach():
    """The sealed worker's database role reaches what a run needs and nothing more
    (alwayson/ops/workerrole.py), or the worker refuses to start, saying what is wrong and
    the command that fixes it. A database that does not answer yet is waited for, as every
    loop waits: no agent runs before its role was checked."""
    if connection.vendor != "postgresql":
        log.warning(
            "a sealed worker on SQLite reaches every table (the database is a file it can "
            "read): a role of its own needs PostgreSQL (%s)",
            DOCS,
        )
        return
    backoff = OutageBackoff()
    while True:
        try:
            found = reach(connection)
            break
        except (OperationalError, InterfaceError) as exc:
            delay = backoff.next()
            log.warning(
                "could not check the worker's database role (%s); again in %.1fs",
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
                delay,
            )
            connection.close()
            time.sleep(delay)
    if not found.right:
        raise CommandError(found.problem())
    log.info("database role %s: reaches what a run needs and nothing more", found.role)
