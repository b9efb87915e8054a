from django.apps import AppConfig


class EgressConfig(AppConfig):
    name = "alwayson.egress"
    label = "alwayson_egress"
    verbose_name = "egress gateway"

    def ready(self):
        from outbox.channels import register_sender

        from .channels import send_slack, send_telegram

        # The chat senders need the bot tokens, which only the gateway adds: the outbox
        # sends through whatever is registered and never imports the gateway.
        register_sender("slack", send_slack)
        register_sender("telegram", send_telegram)
