"""Sentry: set the DSN to send errors (needs the `sentry` extra). Environment and release name
what Sentry shows; the release defaults to the installed alwayson's version.

Only read here: the operations app's ready() starts the SDK (alwayson/ops/apps.py), so every
process that sets Django up (runserver, gunicorn, the loops, any command) reports, and
importing the settings starts nothing.
"""

from contextlib import suppress
from importlib import metadata

from . import env
from .base import DEBUG

SENTRY_DSN = env.string("SENTRY_DSN").strip()
SENTRY_ENVIRONMENT = env.string(
    "SENTRY_ENVIRONMENT", "development" if DEBUG else "production"
).strip()
SENTRY_RELEASE = env.string("SENTRY_RELEASE").strip()
if SENTRY_DSN and not SENTRY_RELEASE:
    # A checkout that was never installed has no version: Sentry then shows no release.
    with suppress(metadata.PackageNotFoundError):
        SENTRY_RELEASE = f"alwayson@{metadata.version('alwayson')}"
