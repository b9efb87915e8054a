from django.apps import AppConfig


class AlwaysonConfig(AppConfig):
    name = "alwayson"
    verbose_name = "alwayson runtime"

    def ready(self):
        from approvals.signals import approval_requested

        from . import metrics
        from .announce import announce_approval

        approval_requested.connect(announce_approval, dispatch_uid="alwayson.announce_approval")
        metrics.connect_signals()
