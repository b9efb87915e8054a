from django.apps import AppConfig

from inbox.validation import alwayson_setting


class OpsConfig(AppConfig):
    name = "alwayson.ops"
    label = "alwayson_ops"
    verbose_name = "operations"

    def ready(self):
        from approvals.signals import approval_requested
        from inbox.signals import events_dead

        from . import checks, metrics  # noqa: F401  checks registers the deploy check
        from .alerts import events_going_dead
        from .announce import announce_approval
        from .sentry import init_sentry
        from .workerrole import declare_machinery

        # Here, not in the settings: every process that sets Django up (runserver, gunicorn,
        # the loops, any command) reports to Sentry, and importing the settings starts nothing.
        if dsn := alwayson_setting("SENTRY_DSN"):
            init_sentry(
                dsn, alwayson_setting("SENTRY_ENVIRONMENT"), alwayson_setting("SENTRY_RELEASE")
            )
        approval_requested.connect(announce_approval, dispatch_uid="alwayson.announce_approval")
        events_dead.connect(events_going_dead, dispatch_uid="alwayson.events_going_dead")
        metrics.connect_signals()
        # What a run needs of the machinery's tables: the sealed worker's database role.
        declare_machinery()
