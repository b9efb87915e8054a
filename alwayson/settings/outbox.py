"""The outbox: how often and how persistently it sends, its webhook and email channels, and
the secrets its webhooks are signed with. Email goes through Django's email framework, which
password reset uses too.

The chat channels' settings are with the egress gateway that sends them (egress.py).
"""

import django
from django.core.exceptions import ImproperlyConfigured

from . import env
from .database import ALWAYSON_IDLE_IN_TRANSACTION_TIMEOUT

# Minimum seconds between two sends of one inbox's outbox.
ALWAYSON_OUTBOX_GAP = env.seconds("ALWAYSON_OUTBOX_GAP", 3600, env.MAX_INTERVAL)
# Failed sends of one inbox before its held messages are parked as failed.
ALWAYSON_OUTBOX_MAX_ATTEMPTS = env.positive_int("ALWAYSON_OUTBOX_MAX_ATTEMPTS", 5)
# Seconds the webhook channel waits for the receiver.
ALWAYSON_OUTBOX_WEBHOOK_TIMEOUT = env.seconds("ALWAYSON_OUTBOX_WEBHOOK_TIMEOUT", 10, env.MAX_WAIT)

# {"<inbox slug>": ["whsec_...", ...]}: the webhook channel signs each send with every listed
# secret (Standard Webhooks), so a receiver can rotate without missing one. The secrets'
# format is checked by the outbox app's ready() (outbox/apps.py), with inbox/webhooks.py.
ALWAYSON_OUTBOX_SIGNING_SECRETS = env.lists_by_key(
    "ALWAYSON_OUTBOX_SIGNING_SECRETS", "secrets by inbox slug"
)

# Email: EMAIL_URL picks the backend (consolemail:// by default, smtp://user:pass@host:25,
# smtp+tls://...).
_email = env.email_config("EMAIL_URL", "consolemail://")
_smtp = {
    "host": _email.get("EMAIL_HOST") or "localhost",
    "port": _email.get("EMAIL_PORT") or 25,
    "username": _email.get("EMAIL_HOST_USER") or "",
    "password": _email.get("EMAIL_HOST_PASSWORD") or "",
    "use_tls": bool(_email.get("EMAIL_USE_TLS")),
    "use_ssl": bool(_email.get("EMAIL_USE_SSL")),
    "timeout": env.seconds("EMAIL_TIMEOUT", 10, env.MAX_WAIT),
}
if django.VERSION >= (6, 1):
    # Django 6.1 replaces the EMAIL_* settings with MAILERS (EMAIL_* go in Django 7).
    MAILERS = {
        "default": {
            "BACKEND": _email["EMAIL_BACKEND"],
            "OPTIONS": _smtp if _email["EMAIL_BACKEND"].endswith("smtp.EmailBackend") else {},
        }
    }
else:
    EMAIL_BACKEND = _email["EMAIL_BACKEND"]
    EMAIL_HOST = _smtp["host"]
    EMAIL_PORT = _smtp["port"]
    EMAIL_HOST_USER = _smtp["username"]
    EMAIL_HOST_PASSWORD = _smtp["password"]
    EMAIL_USE_TLS = _smtp["use_tls"]
    EMAIL_USE_SSL = _smtp["use_ssl"]
    EMAIL_TIMEOUT = _smtp["timeout"]
DEFAULT_FROM_EMAIL = env.string("DEFAULT_FROM_EMAIL", "alwayson@localhost")

# An at-least-once send happens inside its transaction: PostgreSQL must not end that session
# as idle (database.py) while a send is still waiting for its receiver.
_longest_send = max(ALWAYSON_OUTBOX_WEBHOOK_TIMEOUT, _smtp["timeout"])
if _longest_send >= ALWAYSON_IDLE_IN_TRANSACTION_TIMEOUT:
    raise ImproperlyConfigured(
        f"ALWAYSON_IDLE_IN_TRANSACTION_TIMEOUT ({ALWAYSON_IDLE_IN_TRANSACTION_TIMEOUT}s) must be"
        f" longer than the outbox's send timeouts ({_longest_send}s): an at-least-once send"
        " happens inside its transaction"
    )
