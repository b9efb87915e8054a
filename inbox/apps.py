from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from . import webhooks


def checked_secrets(name, scheme, secrets):
    """The `scheme` secrets of setting `name`; ImproperlyConfigured naming it otherwise."""
    try:
        return [webhooks.check_secret(scheme, secret) for secret in secrets]
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}: {exc}") from None


def checked_inbox_secrets(name, value):
    """Setting `name`'s per-inbox secrets, each list whole; ImproperlyConfigured otherwise."""
    try:
        return webhooks.check_inbox_secrets(value)
    except ValueError as exc:
        raise ImproperlyConfigured(
            f'{name} must be JSON like {{"slug": {{"github": ["secret"]}}}}: {exc}'
        ) from None


class InboxConfig(AppConfig):
    name = "inbox"
    verbose_name = "Inbox"

    def ready(self):
        # Here, not in the settings, which import no app: a malformed secret stops every
        # process at start-up (gunicorn's too) instead of rejecting every delivery.
        for scheme in webhooks.SCHEMES:
            name = f"ALWAYSON_{scheme.upper()}_SECRETS"  # as inbox/views.py reads them
            checked_secrets(name, scheme, getattr(settings, name))
        checked_inbox_secrets(
            "ALWAYSON_WEBHOOK_INBOX_SECRETS", settings.ALWAYSON_WEBHOOK_INBOX_SECRETS
        )
