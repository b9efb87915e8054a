"""Core Django: debug, the secret key, the apps, the middleware, URLs and templates.

INSTALLED_APPS and MIDDLEWARE are written here once, whole: no other settings module edits
them.
"""

from django.core.exceptions import ImproperlyConfigured

from . import env
from .env import BASE_DIR

DEBUG = env.strict_bool("DEBUG", True)

SECRET_KEY = env.string("SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY is not set: with DEBUG off, set SECRET_KEY to a long random value"
            ' (python -c "import secrets; print(secrets.token_urlsafe(50))")'
        )
    # Named so that Django's checks flag it (security.W009 under `check --deploy`).
    SECRET_KEY = "django-insecure-alwayson-development-key-set-SECRET_KEY-in-production"

# Debug pages and error emails mask credentials, in URLs too (DATABASE_URL, EMAIL_URL).
DEFAULT_EXCEPTION_REPORTER_FILTER = "alwayson.ops.error_reports.CredentialFilter"

INSTALLED_APPS = [
    # django.contrib.admin, with the demo's models in a section of their own, listed last
    # (alwayson/web/admin_site.py).
    "alwayson.web.admin_site.AlwaysonAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
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

MIDDLEWARE = [
    # A load balancer's probe of /healthz comes over plain http, under whatever Host it likes:
    # answered before the host check and the HTTPS redirect.
    "alwayson.ops.health.HealthCheckMiddleware",
    # /metrics likewise, so Prometheus may scrape a web process at its own address; it answers
    # only a scrape that brings ALWAYSON_METRICS_TOKEN, and 404 while that is unset
    # (alwayson/ops/metrics/).
    "alwayson.ops.metrics.MetricsMiddleware",
    # Before anything that looks a row up: a NUL in the address, query, form or headers is
    # refused.
    "alwayson.web.middleware.RefuseUnstorableInput",
    "django.middleware.security.SecurityMiddleware",
    # Static files from the app server (gunicorn) itself: right after security, whose redirect
    # and headers apply to them too, and before the rest, which a static file does not need.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # After CSRF: an admin action on ids that are not ids, or a changelist filter the list
    # does not have, is 400 with the reason (not a 500, not a silent redirect).
    "alwayson.web.middleware.RefuseBadAdminInput",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes requires: turns a locked-out login into its answer.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "alwayson.urls"
WSGI_APPLICATION = "alwayson.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
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

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# A bare www.example.com in an email's HTML part links to https (Django 6's transitional
# setting, the default from Django 7; Django 5.2 does not read it).
URLIZE_ASSUME_HTTPS = True
