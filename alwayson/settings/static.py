"""Static files, served by the app server (gunicorn) itself through whitenoise."""

from .base import DEBUG
from .env import BASE_DIR

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

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
