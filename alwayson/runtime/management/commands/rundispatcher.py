import logging

from alwayson.ops.alerts import flush_dead_alerts
from alwayson.runtime.loop import LoopCommand
from outbox.services import dispatch, dispatch_notices

log = logging.getLogger("alwayson.dispatcher")


class Command(LoopCommand):
    help = (
        "Send held outbox messages through each inbox's channel, paced by its gap, and the"
        " notices to approvers and operators (dead-event alerts)."
    )
    role = "alwayson-dispatcher"
    kind = "dispatcher"

    def handle(self, *args, once, interval, worker_id, verbosity, **options):
        self.check_interval(interval)
        worker_id = self.worker_id(worker_id)
        self.configure(verbosity, worker_id)
        log.info("dispatcher %s: interval %.2fs", worker_id, interval)
        self.loop(once, interval, worker_id)

    def step(self) -> bool:
        # A pass that sent something may have left others due (an urgent message arriving
        # mid-pass); one that sent nothing leaves only gaps and backoffs, so sleep.
        alerts = flush_dead_alerts()
        if alerts:
            log.info("queued %s dead-event alert(s)", alerts)
        sent = dispatch()
        if sent:
            log.info("sent %s message(s)", sent)
        noticed = dispatch_notices()
        if noticed:
            log.info("sent %s notice(s)", noticed)
        return alerts + sent + noticed > 0
