from django.apps import AppConfig


class RuntimeConfig(AppConfig):
    name = "alwayson.runtime"
    # The label the project's first app had: existing deployments keep their migration
    # history (django_migrations rows under "alwayson") and AgentConfig's table.
    label = "alwayson"
    verbose_name = "alwayson runtime"

    def ready(self):
        from alwayson.ops import retention
        from alwayson.ops.workerrole import INSERT, SELECT, need
        from inbox.extensions import claim_extras

        from . import retention as own_tables
        from .models import AgentConfig, SavedState

        # What this app adds to the apps below (inbox/extensions.py).
        # Which agent runs the inbox, read with the worker's take (Agents.for_inbox).
        claim_extras.add(
            "agent", f"SELECT agent FROM {AgentConfig._meta.db_table} WHERE inbox_id = t.inbox_id"
        )
        # Which revision of its configuration, for the run's version (versions.py).
        claim_extras.add(
            "config_revision",
            f"SELECT revision FROM {AgentConfig._meta.db_table} WHERE inbox_id = t.inbox_id",
        )
        need(AgentConfig, SELECT, why="which agent runs the inbox, and its configuration")
        retention.table_rules.add(self.label, own_tables.rules)
        # SELECT too: the INSERT reads the new row's id back (RETURNING).
        need(SavedState, SELECT, INSERT, why="the state a run saved, kept for a replay")
