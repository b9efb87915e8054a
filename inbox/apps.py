from django.apps import AppConfig
from django.db.backends.signals import connection_created

from . import tracing, webhooks
from .validation import alwayson_setting, checked_setting


def checked_secrets(name, scheme, secrets):
    """The `scheme` secrets of setting `name`."""
    return checked_setting(
        name, lambda value: [webhooks.check_secret(scheme, s) for s in value], secrets
    )


def checked_inbox_secrets(name, value):
    """Setting `name`'s per-inbox secrets, each list whole."""
    expected = ' must be JSON like {"slug": {"github": ["secret"]}}'
    return checked_setting(name, webhooks.check_inbox_secrets, value, expected)


def watch_commits(sender, connection, **kwargs):
    """Every PostgreSQL connection Django opens says when a commit was cut short of the
    synchronous standby (backends/postgresql.py, watch_commits)."""
    if connection.vendor == "postgresql":
        from .backends.postgresql import watch_commits

        watch_commits(connection.connection)


class InboxConfig(AppConfig):
    name = "inbox"
    verbose_name = "Inbox"

    def ready(self):
        connection_created.connect(watch_commits, dispatch_uid="inbox.watch_commits")
        # Here, not in the settings, which import no app: a malformed secret stops every
        # process at start-up (gunicorn's too) instead of rejecting every delivery.
        for scheme in webhooks.SCHEMES:
            name = f"ALWAYSON_{scheme.upper()}_SECRETS"  # as inbox/views.py reads them
            checked_secrets(name, scheme, alwayson_setting(name))
        checked_inbox_secrets(
            "ALWAYSON_WEBHOOK_INBOX_SECRETS", alwayson_setting("ALWAYSON_WEBHOOK_INBOX_SECRETS")
        )
        # Once per process, web and loops alike; a no-op unless an OTLP endpoint is set.
        tracing.configure()
