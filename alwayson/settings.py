"""Settings for alwayson, read from the environment (and an optional `.env` file).

One switch picks the database: `DATABASE_URL`. SQLite is the embedded default; PostgreSQL
(`postgres://...`) is the engine for many workers on many hosts. Malformed values stop the
process at start-up instead of being read as a default.
"""

from pathlib import Path

import django
import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def strict_bool(name, default):
    """django-environ reads any unknown word as False; a typo in DEBUG must not pass silently."""
    raw = env.str(name, default=str(default)).strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be one of true/false/1/0/yes/no/on/off, not {raw!r}")


def positive_int(name, default):
    try:
        value = env.int(name, default=default)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be an integer: {exc}") from None
    if value <= 0:
        raise ImproperlyConfigured(f"{name} must be a positive integer, not {value}")
    return value


DEBUG = strict_bool("DEBUG", True)

SECRET_KEY = env.str("SECRET_KEY", default="")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off")
    SECRET_KEY = "dev-only-insecure-key-set-SECRET_KEY-in-production"

ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]", "testserver"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "inbox",
    "timers",
    "approvals",
    "outbox",
    "alwayson",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "alwayson.urls"

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

WSGI_APPLICATION = "alwayson.wsgi.application"


def database_from_url():
    url = env.str("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'alwayson.sqlite3'}")
    try:
        config = environ.Env.db_url_config(url)
    except (KeyError, ValueError) as exc:
        raise ImproperlyConfigured(f"DATABASE_URL is not a usable database URL: {exc}") from None
    engine = config.get("ENGINE", "")
    if engine.endswith("sqlite3"):
        config.setdefault("OPTIONS", {}).update(
            {
                # Every atomic() takes the write lock up front (the article's BEGIN IMMEDIATE),
                # so a read-then-write decision can never be overtaken by another writer.
                "transaction_mode": "IMMEDIATE",
                # Seconds a writer waits for the lock before "database is locked".
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            }
        )
    elif engine.endswith("postgresql"):
        config.setdefault("OPTIONS", {}).setdefault(
            "application_name", env.str("ALWAYSON_APPLICATION_NAME", default="alwayson")
        )
        config.setdefault("CONN_HEALTH_CHECKS", True)
        idle = f"-c idle_in_transaction_session_timeout={ALWAYSON_IDLE_IN_TRANSACTION_TIMEOUT}s"
        options = config["OPTIONS"]
        options["options"] = f"{options['options']} {idle}" if options.get("options") else idle
    else:
        raise ImproperlyConfigured(
            f"DATABASE_URL must point at SQLite or PostgreSQL, not {engine or url!r}"
        )
    return config


def positive_seconds(name, default):
    try:
        value = env.float(name, default=default)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a number of seconds: {exc}") from None
    if not value > 0:
        raise ImproperlyConfigured(f"{name} must be a positive number of seconds, not {value}")
    return value


# A worker frozen inside a transaction (SIGSTOP, a debugger, a swap storm) holds its inbox's
# lease row. PostgreSQL ends a session left idle in a transaction after this many seconds, so
# the lock comes free; it must outlast the longest send an at-least-once dispatch makes
# inside its transaction (the outbox's webhook and email timeouts).
ALWAYSON_IDLE_IN_TRANSACTION_TIMEOUT = positive_int("ALWAYSON_IDLE_IN_TRANSACTION_TIMEOUT", 30)
# Seconds a delivery (ingest) or a person's answer waits for its inbox's lock before it is
# refused as busy (a webhook then answers 503 with Retry-After): under a sender's timeout.
ALWAYSON_INGEST_LOCK_WAIT = positive_seconds("ALWAYSON_INGEST_LOCK_WAIT", 5)

DATABASES = {"default": database_from_url()}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "alwayson": {"handlers": ["console"], "level": "INFO", "propagate": False},
        # httpx logs each request's full URL at INFO, and an egress service's credential may
        # be a query parameter: the gateway logs its calls itself, without it.
        "httpx": {"level": "WARNING"},
        "httpcore": {"level": "WARNING"},
    },
}

# --- alwayson -----------------------------------------------------------------------------
# Claims before an event is parked as dead.
ALWAYSON_MAX_ATTEMPTS = positive_int("ALWAYSON_MAX_ATTEMPTS", 3)
# Seconds a worker owns an inbox without renewing.
ALWAYSON_LEASE_TTL = positive_int("ALWAYSON_LEASE_TTL", 120)
# Minimum seconds between two sends of one inbox's outbox.
ALWAYSON_OUTBOX_GAP = positive_int("ALWAYSON_OUTBOX_GAP", 3600)
# Backoff before a failed event's next attempt: base * 2^(attempts-1) seconds, capped, jittered.
ALWAYSON_RETRY_BASE = positive_int("ALWAYSON_RETRY_BASE", 10)
ALWAYSON_RETRY_CAP = positive_int("ALWAYSON_RETRY_CAP", 3600)
# Failed sends of one inbox before its held messages are parked as failed.
ALWAYSON_OUTBOX_MAX_ATTEMPTS = positive_int("ALWAYSON_OUTBOX_MAX_ATTEMPTS", 5)
# Seconds the webhook channel waits for the receiver.
ALWAYSON_OUTBOX_WEBHOOK_TIMEOUT = positive_int("ALWAYSON_OUTBOX_WEBHOOK_TIMEOUT", 10)

# Email: EMAIL_URL picks the backend (consolemail:// by default, smtp://user:pass@host:25,
# smtp+tls://...); Django's email framework does the sending.
try:
    _email = env.email_url("EMAIL_URL", default="consolemail://")
except (KeyError, ValueError) as exc:
    raise ImproperlyConfigured(f"EMAIL_URL is not a usable email URL: {exc}") from None
_smtp = {
    "host": _email.get("EMAIL_HOST") or "localhost",
    "port": _email.get("EMAIL_PORT") or 25,
    "username": _email.get("EMAIL_HOST_USER") or "",
    "password": _email.get("EMAIL_HOST_PASSWORD") or "",
    "use_tls": bool(_email.get("EMAIL_USE_TLS")),
    "use_ssl": bool(_email.get("EMAIL_USE_SSL")),
    "timeout": positive_int("EMAIL_TIMEOUT", 10),
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
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="alwayson@localhost")

_longest_send = max(ALWAYSON_OUTBOX_WEBHOOK_TIMEOUT, _smtp["timeout"])
if _longest_send >= ALWAYSON_IDLE_IN_TRANSACTION_TIMEOUT:
    raise ImproperlyConfigured(
        f"ALWAYSON_IDLE_IN_TRANSACTION_TIMEOUT ({ALWAYSON_IDLE_IN_TRANSACTION_TIMEOUT}s) must be"
        f" longer than the outbox's send timeouts ({_longest_send}s): an at-least-once send"
        " happens inside its transaction"
    )

# Where people reach this site: absolute links in the agent's messages start here.
_site = env.url("ALWAYSON_SITE_URL", default="http://127.0.0.1:8000")
if _site.scheme not in ("http", "https") or not _site.netloc:
    raise ImproperlyConfigured(f"ALWAYSON_SITE_URL must be an http(s) URL, not {_site.geturl()!r}")
ALWAYSON_SITE_URL = _site.geturl()

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

# The agent the worker runs: a callable taking a Run (alwayson/runtime.py).
ALWAYSON_AGENT = env.str("ALWAYSON_AGENT", default="alwayson.refund_desk.agent")
# The example refund desk asks two different approvers for a refund above this amount.
ALWAYSON_REFUND_TWO_APPROVERS_ABOVE = positive_int("ALWAYSON_REFUND_TWO_APPROVERS_ABOVE", 500)

# --- webhooks (inbox/webhooks.py, inbox/views.py) ----------------------------------------
# Secrets per scheme, comma-separated; several at once while a secret is rotated. An inbox
# may have its own in ALWAYSON_WEBHOOK_INBOX_SECRETS, JSON {"slug": {"github": ["..."]}},
# which replace the scheme's for that inbox. Each is checked here, so a malformed secret stops
# start-up instead of rejecting every delivery.


def webhook_secrets(name, scheme):
    from inbox.webhooks import check_secret

    raw = env.str(name, default="")
    if not raw.strip():
        return []
    secrets = [item.strip() for item in raw.split(",")]
    try:
        return [check_secret(scheme, secret) for secret in secrets]
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}: {exc}") from None


def webhook_inbox_secrets(name):
    from inbox.webhooks import check_inbox_secrets

    try:
        return check_inbox_secrets(env.json(name, default={}))
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise ImproperlyConfigured(
            f'{name} must be JSON like {{"slug": {{"github": ["secret"]}}}}: {exc}'
        ) from None


ALWAYSON_GITHUB_SECRETS = webhook_secrets("ALWAYSON_GITHUB_SECRETS", "github")
ALWAYSON_STRIPE_SECRETS = webhook_secrets("ALWAYSON_STRIPE_SECRETS", "stripe")
ALWAYSON_STANDARD_SECRETS = webhook_secrets("ALWAYSON_STANDARD_SECRETS", "standard")
ALWAYSON_WEBHOOK_INBOX_SECRETS = webhook_inbox_secrets("ALWAYSON_WEBHOOK_INBOX_SECRETS")
# Bodies larger than this are refused with 413 before they are verified.
ALWAYSON_WEBHOOK_MAX_BYTES = positive_int("ALWAYSON_WEBHOOK_MAX_BYTES", 1024 * 1024)
# Seconds a Stripe signature stays valid; positive_int refuses 0, which would disable the check.
ALWAYSON_STRIPE_TOLERANCE = positive_int("ALWAYSON_STRIPE_TOLERANCE", 300)
# --- end of webhooks ------------------------------------------------------------------------

# --- egress and outbox signing (alwayson/egress.py, outbox/channels.py) --------------------
# Services an agent may call through the egress gateway, JSON by name:
# {"payments": {"base_url": "https://api.example.com", "methods": ["POST"],
#               "paths": ["/v1/refunds"], "secret_env": "PAYMENTS_TOKEN", "inboxes": ["desk"]}}
# The credential itself stays in the variable `secret_env` names, read at each call; it is
# never in settings, the database or the agent's reach.


def egress_services(name):
    from alwayson.egress import check_services

    try:
        return check_services(env.json(name, default={}))
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise ImproperlyConfigured(f"{name}: {exc}") from None


def outbox_signing_secrets(name):
    """{"<inbox slug>": ["whsec_...", ...]}: the webhook channel signs each send with every
    listed secret (Standard Webhooks), so a receiver can rotate without missing one."""
    from inbox.webhooks import check_secret

    try:
        config = env.json(name, default={})
        if not isinstance(config, dict):
            raise ValueError("expected a JSON object of secrets by inbox slug")
        return {
            slug: [check_secret("standard", s) for s in ([v] if isinstance(v, str) else v)]
            for slug, v in config.items()
        }
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(f"{name}: {exc}") from None


ALWAYSON_EGRESS_SERVICES = egress_services("ALWAYSON_EGRESS_SERVICES")
# Port of `manage.py runegress` (127.0.0.1) for agents running out of process; runall starts
# it when set.
ALWAYSON_EGRESS_PORT = env.int("ALWAYSON_EGRESS_PORT", default=0)
ALWAYSON_OUTBOX_SIGNING_SECRETS = outbox_signing_secrets("ALWAYSON_OUTBOX_SIGNING_SECRETS")
# Chat channels of the outbox. The bot tokens are read from the environment at each send
# (ALWAYSON_SLACK_BOT_TOKEN, ALWAYSON_TELEGRAM_BOT_TOKEN) and never stored; the API URLs
# change only for a proxy or a test server.
ALWAYSON_SLACK_API_URL = env.str("ALWAYSON_SLACK_API_URL", default="https://slack.com/api")
ALWAYSON_TELEGRAM_API_URL = env.str("ALWAYSON_TELEGRAM_API_URL", default="https://api.telegram.org")
# --- end of egress ---------------------------------------------------------------------------
