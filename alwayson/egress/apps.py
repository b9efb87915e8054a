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
        from outbox.channels import register_sender

        from . import checks  # noqa: F401  registers the deploy check
        from .channels import send_slack, send_telegram
        from .sealing import SEALED, hide_from_same_user, sealing

        # Here, not in the settings, which import no app: every process that sets Django up
        # (gunicorn's too) refuses a malformed service before an agent calls one.
        checked_services("ALWAYSON_EGRESS_SERVICES", alwayson_setting("ALWAYSON_EGRESS_SERVICES"))
        # The chat senders need the bot tokens, which only the gateway adds: the outbox
        # sends through whatever is registered and never imports the gateway.
        register_sender("slack", send_slack)
        register_sender("telegram", send_telegram)
        if sealing() and os.environ.get(SEALED) != "1":
            # A process of a sealed deployment that holds credentials (web, scheduler,
            # dispatcher, egress, runall): the worker, the same Unix user, must not read them.
            hide_from_same_user()
