"""Sentry, when SENTRY_DSN is set: the official SDK (`pip install 'alwayson[sentry]'`) with
its Django integration, and nothing secret in what it sends.

The SDK sends unhandled exceptions of views and commands, and every ERROR log line (a dead
event, a parked outbox send) as an event, with the frames' local variables and the log lines
before it as breadcrumbs. Any of those may hold a credential: an egress service's token read
into a variable, a DATABASE_URL in a message. `scrub_event` runs on every event before it
leaves the process and masks what alwayson's error pages mask (alwayson/ops/error_reports.py:
values under secret-looking names, passwords in URLs) and, anywhere in the event, the literal
values of the secrets this process knows: secret-looking settings, secret-looking environment
variables, and the variables the egress services read their credentials from.
"""

import os
import re

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from alwayson.egress.services import configured_services
from alwayson.ops.error_reports import _URL_PASSWORD, CredentialFilter

INSTALL_HINT = "pip install 'alwayson[sentry]' (or sentry-sdk>=2)"
FILTERED = CredentialFilter.cleansed_substitute
# Shorter values are left alone: masking every "1" or "on" would garble the event, and no
# credential is that short.
MIN_SECRET_LENGTH = 6


# What the SDK collects of a request, stated rather than left to its defaults, which its 3.0
# widened (cookies, the user, GraphQL and model inputs) and which 2.x derived from
# send_default_pii=False: this is that mapping, with cookies off, and both majors read it.
# Headers naming the client's address or its user are left out; values under secret-looking
# names are masked by the SDK's own denylist, then by scrub_event.
PERSONAL_TERMS = ["forwarded", "-ip", "remote-", "via", "-user"]
DATA_COLLECTION = {
    "user_info": False,
    "cookies": {"mode": "off"},
    "http_headers": {"request": {"mode": "denylist", "terms": PERSONAL_TERMS}},
    "url_query_params": {"mode": "denylist", "terms": PERSONAL_TERMS},
    "graphql": {"document": False, "variables": False},
    "gen_ai": {"inputs": False, "outputs": False},
    "database_query_data": False,
    "queues": False,
}


def init_sentry(dsn, environment, release):
    """Start the SDK: the operations app's ready() does, when SENTRY_DSN is set, so that every
    process reports. ImproperlyConfigured (at start-up) if it is missing or the DSN is bad."""
    # The SDK is an optional extra: imported only where SENTRY_DSN asks for it.
    try:
        import sentry_sdk
        from sentry_sdk.integrations.django import DjangoIntegration
        from sentry_sdk.utils import BadDsn
    except ImportError:
        raise ImproperlyConfigured(
            f"SENTRY_DSN is set but the Sentry SDK is not installed: {INSTALL_HINT}"
        ) from None
    try:
        sentry_sdk.init(
            dsn=dsn,
            environment=environment,
            release=release or None,
            integrations=[DjangoIntegration(), _logging_integration(sentry_sdk.VERSION)],
            data_collection=DATA_COLLECTION,
            # Breadcrumbs travel inside the event, so this scrubs them too.
            before_send=scrub_event,
        )
    except BadDsn as exc:
        raise ImproperlyConfigured(f"SENTRY_DSN is not a usable DSN: {exc}") from None


def _logging_integration(version):
    """Every ERROR line an event, INFO and above its breadcrumbs, and no log line shipped as
    one of Sentry's logs, in either major: 3.0 made events from log lines opt-in and sends
    every INFO line as a log unless `level` is None, which in 2.x meant no breadcrumbs."""
    import logging

    from sentry_sdk.integrations.logging import LoggingIntegration

    if int(version.split(".")[0]) >= 3:
        return LoggingIntegration(
            level=None, event_level=logging.ERROR, breadcrumb_level=logging.INFO
        )
    return LoggingIntegration(level=logging.INFO, event_level=logging.ERROR)


def scrub_event(event, hint):
    return Scrubber().scrub(event)


class Scrubber:
    """Masks secrets in a JSON-like structure (dicts, lists, strings)."""

    def __init__(self):
        self.hidden = CredentialFilter.hidden_settings
        values = sorted(known_secrets(), key=len, reverse=True)
        self.literal = (
            re.compile("|".join(re.escape(value) for value in values)) if values else None
        )

    def scrub(self, value, key=""):
        if isinstance(value, dict):
            return {k: self.scrub(v, str(k)) for k, v in value.items()}
        if isinstance(value, list | tuple):
            # Sentry sends headers and some variables as [name, value] pairs.
            if len(value) == 2 and isinstance(value[0], str) and self.hidden.search(value[0]):
                return [value[0], FILTERED]
            return [self.scrub(item, key) for item in value]
        if isinstance(value, str):
            if key and self.hidden.search(key) and value:
                return FILTERED
            return self.scrub_text(value)
        return value

    def scrub_text(self, text):
        text = _URL_PASSWORD.sub(rf"\g<head>{FILTERED}@", text)
        return self.literal.sub(FILTERED, text) if self.literal else text


def known_secrets() -> set[str]:
    """The values of this process's secrets: secret-looking settings (SECRET_KEY, webhook
    secrets, API keys, DATABASES' passwords), secret-looking environment variables, and the
    environment variables the egress services take their credentials from."""
    found = set()
    hidden = CredentialFilter.hidden_settings
    if settings.configured:
        for name in dir(settings):
            if name.isupper():
                _collect(name, getattr(settings, name, None), hidden, found)
        for service in configured_services().values():
            variable = service.secret_env
            if variable and os.environ.get(variable):
                found.add(os.environ[variable])
    for name, value in os.environ.items():
        if hidden.search(name):
            found.add(value)
    return {value for value in found if len(value) >= MIN_SECRET_LENGTH}


def _collect(key, value, hidden, found, secret=False):
    secret = secret or bool(hidden.search(key))
    if isinstance(value, dict):
        for k, v in value.items():
            _collect(str(k), v, hidden, found, secret)
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            _collect(key, item, hidden, found, secret)
    elif isinstance(value, str) and secret:
        found.add(value)
