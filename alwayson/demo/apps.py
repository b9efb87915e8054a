from django.apps import AppConfig


class DemoConfig(AppConfig):
    """The refund desk: an example agent with a stand-in payments ledger. A project of its
    own deletes this app (and its settings line) and keeps the rest."""

    name = "alwayson.demo"
    label = "alwayson_demo"
    verbose_name = "Demo: the refund desk (example payments system)"

    def ready(self):
        from alwayson.ops.workerrole import INSERT, SELECT, need

        from .models import Refund

        # The stand-in payments ledger the desk's refunds go through, from the run.
        need(Refund, SELECT, INSERT, why="the refund desk's stand-in payments")
