from django.apps import AppConfig


class AlwaysonConfig(AppConfig):
    name = "alwayson"
    verbose_name = "alwayson runtime"

    def ready(self):
        from approvals.signals import approval_requested
        from inbox.services import CLAIM_EXTRAS
        from inbox.signals import events_dead

        from . import metrics
        from .alerts import events_going_dead
        from .announce import announce_approval
        from .models import AgentConfig

        # Which agent runs the inbox, read with the worker's take (Agents.for_inbox).
        CLAIM_EXTRAS["agent"] = (
            f"SELECT agent FROM {AgentConfig._meta.db_table} WHERE inbox_id = t.inbox_id"
        )

        approval_requested.connect(announce_approval, dispatch_uid="alwayson.announce_approval")
        events_dead.connect(events_going_dead, dispatch_uid="alwayson.events_going_dead")
        metrics.connect_signals()
