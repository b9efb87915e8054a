from django.apps import AppConfig

from inbox.validation import alwayson_setting, checked_setting
from inbox.webhooks import check_secret


def checked_signing_secrets(name, secrets_by_slug):
    """Setting `name`'s signing secrets by inbox slug, each a Standard Webhooks secret."""
    return checked_setting(
        name,
        lambda value: {
            slug: [check_secret("standard", secret) for secret in secrets]
            for slug, secrets in value.items()
        },
        secrets_by_slug,
    )


class OutboxConfig(AppConfig):
    name = "outbox"
    verbose_name = "Outbox"

    def ready(self):
        # Here, not in the settings, which import no app: a malformed secret stops every
        # process at start-up instead of failing every signed send.
        checked_signing_secrets(
            "ALWAYSON_OUTBOX_SIGNING_SECRETS", alwayson_setting("ALWAYSON_OUTBOX_SIGNING_SECRETS")
        )
