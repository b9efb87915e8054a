import os

from django.apps import AppConfig

from inbox.validation import alwayson_setting, checked_setting

from .services import check_services


def checked_services(name, config):
    """The services of setting `name` as {name: Service}."""
    return checked_setting(name, check_services, config)


class EgressConfig(AppConfig):
    name = "alwayson.egress"
    label = "alwayson_egress"
    verbose_name = "egress gateway"

    def ready(self):
        from inbox.extensions import inbox_admin_fields
        from outbox.channels import senders

        from . import checks  # noqa: F401  registers the deploy check
        from .admin import outbound_services
        from .channels import send_slack, send_telegram
        from .sealing import SEALED, hide_from_same_user, sealing

        # Here, not in the settings, which import no app: every process that sets Django up
        # (gunicorn's too) refuses a malformed service before an agent calls one.
        checked_services("ALWAYSON_EGRESS_SERVICES", alwayson_setting("ALWAYSON_EGRESS_SERVICES"))
        # What this app adds to the apps below (inbox/extensions.py).
        # The chat senders need the bot tokens, which only the gateway adds: the outbox
        # sends through whatever is added and never imports the gateway.
        senders.add("slack", send_slack)
        senders.add("telegram", send_telegram)
        inbox_admin_fields.add("outbound_services", outbound_services)
        if sealing() and os.environ.get(SEALED) != "1":
            # A process of a sealed deployment that holds credentials (web, scheduler,
            # dispatcher, egress, runall): the worker, the same Unix user, must not read them.
            hide_from_same_user()
