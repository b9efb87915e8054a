from django.apps import AppConfig


class OpsConfig(AppConfig):
    name = "alwayson.ops"
    label = "alwayson_ops"
    verbose_name = "operations"

    def ready(self):
        from approvals.signals import approval_requested
        from inbox.signals import events_dead

        from . import metrics
        from .alerts import events_going_dead
        from .announce import announce_approval

        approval_requested.connect(announce_approval, dispatch_uid="alwayson.announce_approval")
        events_dead.connect(events_going_dead, dispatch_uid="alwayson.events_going_dead")
        metrics.connect_signals()
