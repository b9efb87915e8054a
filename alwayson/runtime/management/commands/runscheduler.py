import logging

from alwayson.runtime.loop import LoopCommand
from timers.services import run_scheduler

log = logging.getLogger("alwayson.scheduler")


class Command(LoopCommand):
    help = "Turn due timers into inbox events. Several schedulers may run at once."
    role = "alwayson-scheduler"
    kind = "scheduler"

    def handle(self, *args, once, interval, worker_id, verbosity, **options):
        self.check_interval(interval)
        worker_id = self.worker_id(worker_id)
        self.configure(verbosity, worker_id)
        log.info("scheduler %s: interval %.2fs", worker_id, interval)
        self.loop(once, interval, worker_id)

    def step(self) -> bool:
        handled = run_scheduler()
        if handled:
            log.info("fired %s timer(s)", handled)
        return handled > 0
