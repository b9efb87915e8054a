from django.apps import AppConfig


class WebConfig(AppConfig):
    name = "alwayson.web"
    label = "alwayson_web"
    verbose_name = "pages"

    def ready(self):
        from alwayson.ops import retention
        from alwayson.ops.workerrole import INSERT, SELECT, need

        from . import retention as own_tables
        from .models import LiveChange, LiveWatch

        # What this app adds to the apps below (inbox/extensions.py).
        retention.table_rules.add(self.label, own_tables.rules)
        # The live pages' triggers (migrations 0002-0004) run as the role whose write fired
        # them: a run's finish writes a change and asks whether anybody watches the inbox.
        need(LiveChange, INSERT, why="the live pages' triggers, on a run's writes")
        need(LiveWatch, SELECT, why="the live pages' triggers notify watched inboxes only")
