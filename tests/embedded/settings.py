"""A stranger's Django project that installs alwayson's apps beside its own: the settings
docs/how-to/embed-in-a-project.md lists, and nothing taken from alwayson's project settings
but alwayson's own (alwayson.settings.embedded: the ALWAYSON_* names and the few of the
model's, Sentry's and django-axes' that its apps read). Its own user model, its own URLs
with alwayson's under /agents/, its own database from DATABASE_URL.

Run by tests/contracts/test_embedded_project.py in a pytest process of its own.
"""

import os
from pathlib import Path

from alwayson.settings.embedded import *  # noqa: F403

BASE_DIR = Path(__file__).resolve().parent

DEBUG = False
SECRET_KEY = "the-acme-project-s-own-test-key-not-alwayson-s"
ALLOWED_HOSTS = ["acme.example.com", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # The project's own apps: its user model first, before anything migrates against it.
    "tests.embedded.accounts",
    # alwayson's, in this order (its apps' ready() register with alwayson.ops).
    "axes",
    "inbox",
    "timers",
    "approvals",
    "outbox",
    "alwayson.egress",
    "alwayson.ops",
    "alwayson.runtime",
    "alwayson.claude",
    "alwayson.demo",
    "alwayson.web",
]

AUTH_USER_MODEL = "accounts.User"
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

MIDDLEWARE = [
    "alwayson.web.middleware.RefuseUnstorableInput",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",
]

# alwayson locks a login out by username alone (alwayson/settings/accounts.py), which
# django-axes warns about.
SILENCED_SYSTEM_CHECKS = ["axes.W006"]

ROOT_URLCONF = "tests.embedded.urls"
LOGIN_URL = "login"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # The project's own templates (its login page) only: alwayson's ship in its apps.
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def _database(url):
    """The project reads its own DATABASE_URL (SQLite by default), as alwayson does."""
    import environ

    config = environ.Env.db_url_config(url)
    if config["ENGINE"].endswith("sqlite3"):
        config["OPTIONS"] = {"transaction_mode": "IMMEDIATE", "timeout": 30}
    if os.environ.get("EMBEDDED_TEST_DATABASE"):
        # Its own test database on a PostgreSQL server another suite also tests on.
        config["TEST"] = {"NAME": os.environ["EMBEDDED_TEST_DATABASE"]}
    return config


DATABASES = {"default": _database(os.environ.get("DATABASE_URL", "sqlite:///:memory:"))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "static/"
USE_TZ = True
TIME_ZONE = "UTC"
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
DEFAULT_FROM_EMAIL = "agents@acme.example.com"

# alwayson's settings, overridden after the import as any project would.
ALWAYSON_AGENT = "tests.embedded.agent.agent"
ALWAYSON_SITE_URL = "https://acme.example.com"
