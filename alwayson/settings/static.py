"""Static files, served by the app server (gunicorn) itself through whitenoise."""

from pathlib import Path

from . import env
from .base import DEBUG
from .env import BASE_DIR

STATIC_URL = "static/"
# Where collectstatic writes and the production web serves from. A test session collects
# into a directory of its own (tests/conftest.py): suites running at once would otherwise
# rewrite one manifest under each other's servers.
STATIC_ROOT = Path(env.string("ALWAYSON_STATIC_ROOT") or BASE_DIR / "staticfiles")

# Collected by `collectstatic` (the Docker build, the release unit, `runall --production`)
# under hashed names, compressed, cached for good. Development serves the source files.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}
# Development reads the apps' static folders as they change, with no collectstatic (set
# here, not left to whitenoise's reading of DEBUG, which the test runner turns off).
WHITENOISE_USE_FINDERS = WHITENOISE_AUTOREFRESH = DEBUG
