"""Settings for alwayson, read from the environment (and an optional `.env` file).

One switch picks the database: `DATABASE_URL`. SQLite is the embedded default; PostgreSQL
(`postgres://...`) is the engine for many workers on many hosts. Malformed values stop the
process at start-up instead of being read as a default.
"""

import re
from datetime import timedelta
from pathlib import Path

import django
import environ
from django.core.exceptions import ImproperlyConfigured

from alwayson.ops.logs import FORMATS, logging_config

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
    # Named so that Django's checks flag it (security.W009 under `check --deploy`).
    SECRET_KEY = "django-insecure-alwayson-development-key-set-SECRET_KEY-in-production"

# Debug pages and error emails mask credentials, in URLs too (DATABASE_URL, EMAIL_URL).
DEFAULT_EXCEPTION_REPORTER_FILTER = "alwayson.ops.error_reports.CredentialFilter"

ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]", "testserver"])

INSTALLED_APPS = [
    "django.contrib.admin",
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
    # First: a NUL in the address, query, form or headers is refused before any lookup.
    "alwayson.web.middleware.RefuseUnstorableInput",
    "django.middleware.security.SecurityMiddleware",
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
        # A web process keeps its connection between requests (checked before reuse): a
        # webhook is one statement, so opening a session per request would cost more than it.
        config.setdefault("CONN_MAX_AGE", ALWAYSON_DB_CONN_MAX_AGE)
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

# Seconds a web process keeps its PostgreSQL connection between requests; 0: one per request.
ALWAYSON_DB_CONN_MAX_AGE = (
    0
    if env.str("ALWAYSON_DB_CONN_MAX_AGE", default="60").strip() == "0"
    else positive_int("ALWAYSON_DB_CONN_MAX_AGE", 60)
)

# Prepared statements for the hot paths' statements (ingest, the worker's take and finish:
# inbox/store.py prepared_cursor); Django's own stay unprepared. Off behind a pooler in
# transaction mode that cannot keep a session's prepared statements (PgBouncer before 1.21).
ALWAYSON_DB_PREPARE = strict_bool("ALWAYSON_DB_PREPARE", True)

DATABASES = {"default": database_from_url()}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTHENTICATION_BACKENDS = [
    # First: refuses a locked-out username before any password is checked.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"


def log_format(name):
    value = env.str(name, default="text").strip().lower()
    if value not in FORMATS:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(FORMATS)}, not {value!r}")
    return value


# text: one plain line per record; json: one JSON object per line (alwayson/logs.py). Either
# way a line logged inside a worker's run carries the run's id.
ALWAYSON_LOG_FORMAT = log_format("ALWAYSON_LOG_FORMAT")
LOGGING = logging_config(ALWAYSON_LOG_FORMAT)

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
ALWAYSON_AGENT = env.str("ALWAYSON_AGENT", default="alwayson.demo.refund_desk.agent")
# The example refund desk asks two different approvers for a refund above this amount.
ALWAYSON_REFUND_TWO_APPROVERS_ABOVE = positive_int("ALWAYSON_REFUND_TWO_APPROVERS_ABOVE", 500)

# --- login and password reset throttles (django-axes; alwayson/views.py) --------------------
# A username is locked out after this many failed logins in a row, from any address (by
# address alone, an attacker rotates addresses, and behind a proxy every user shares one);
# while locked out, the right password is refused too. The admin's login is the same gate.
AXES_FAILURE_LIMIT = positive_int("ALWAYSON_LOGIN_FAILURE_LIMIT", 5)
AXES_LOCKOUT_PARAMETERS = ["username"]
# axes.W006 asks for the address among the parameters, against a lock that rotating the
# User-Agent or cookies escapes; a lock per username escapes neither, nor a new address.
SILENCED_SYSTEM_CHECKS = ["axes.W006"]
# Seconds a lockout lasts after the last failure; also the password reset throttle's window.
ALWAYSON_LOGIN_COOLOFF = timedelta(seconds=positive_int("ALWAYSON_LOGIN_COOLOFF", 900))
AXES_COOLOFF_TIME = ALWAYSON_LOGIN_COOLOFF
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "alwayson.web.views.login_locked_out"
# Password reset emails per address per cool-off.
ALWAYSON_PASSWORD_RESET_LIMIT = positive_int("ALWAYSON_PASSWORD_RESET_LIMIT", 3)

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
    from alwayson.egress.gateway import check_services

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


# --- Claude agent (alwayson/claude/) ---------------------------------------------------------
# Read only where a Claude agent runs: an inbox whose agent is alwayson.claude.agent, or every
# inbox when ALWAYSON_AGENT names it. `runworker` checks the key at start-up in that case, so
# the refund desk (the default) needs none of these. Each inbox may override the model, the
# prompt, the tools, the policy, the budget and the approval window in the admin (AgentConfig).


def optional_positive_int(name):
    if not env.str(name, default="").strip():
        return None
    return positive_int(name, None)


def claude_policy(name):
    from alwayson.runtime.policy import check_policy_syntax

    try:
        return check_policy_syntax(env.json(name, default={}))
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise ImproperlyConfigured(f"{name}: {exc}") from None


ANTHROPIC_API_KEY = env.str("ANTHROPIC_API_KEY", default="")
# Another endpoint that speaks the Messages API (a proxy; the tests' loopback server).
ANTHROPIC_BASE_URL = env.str("ANTHROPIC_BASE_URL", default="")
ALWAYSON_CLAUDE_MODEL = env.str("ALWAYSON_CLAUDE_MODEL", default="claude-sonnet-5-5")
# Modules whose @tool functions the agent may offer (imported when a Claude agent starts).
ALWAYSON_CLAUDE_TOOLS = env.list("ALWAYSON_CLAUDE_TOOLS", default=[])
# The default permission policy, JSON; an inbox's own policy replaces it tool by tool.
ALWAYSON_CLAUDE_POLICY = claude_policy("ALWAYSON_CLAUDE_POLICY")
# Tokens per UTC day per inbox; unset means no budget.
ALWAYSON_CLAUDE_DAILY_TOKEN_BUDGET = optional_positive_int("ALWAYSON_CLAUDE_DAILY_TOKEN_BUDGET")
ALWAYSON_CLAUDE_APPROVAL_WINDOW = positive_int("ALWAYSON_CLAUDE_APPROVAL_WINDOW", 4 * 3600)
ALWAYSON_CLAUDE_MAX_TOKENS = positive_int("ALWAYSON_CLAUDE_MAX_TOKENS", 4096)
# Model calls one run may make before it fails as runaway (an agent bug).
ALWAYSON_CLAUDE_MAX_CALLS = positive_int("ALWAYSON_CLAUDE_MAX_CALLS", 20)
# Seconds one Messages API request may take before it counts as a transient failure.
ALWAYSON_CLAUDE_TIMEOUT = positive_int("ALWAYSON_CLAUDE_TIMEOUT", 120)
# The transcript bound: the last N runs are kept, tool results only of the last M of them,
# and older runs go first while the transcript is longer than the character limit.
ALWAYSON_CLAUDE_KEEP_RUNS = positive_int("ALWAYSON_CLAUDE_KEEP_RUNS", 20)
ALWAYSON_CLAUDE_KEEP_TOOL_RESULTS = positive_int("ALWAYSON_CLAUDE_KEEP_TOOL_RESULTS", 3)
ALWAYSON_CLAUDE_MAX_TRANSCRIPT_CHARS = positive_int("ALWAYSON_CLAUDE_MAX_TRANSCRIPT_CHARS", 200_000)
# --- end of Claude agent ---------------------------------------------------------------------


# --- production: web server, static files, HTTPS, health (issue 12) -----------------------
# Every default follows DEBUG: with DEBUG on, development over plain http keeps working; with
# DEBUG off, the defaults are the secure ones and `manage.py check --deploy` has nothing to
# report (given a real SECRET_KEY, and on Django 6.1+ a real EMAIL_URL). Each can be set on
# its own from the environment.


def non_negative_int(name, default):
    """positive_int, where 0 is a choice too (SECURE_HSTS_SECONDS=0: no HSTS header)."""
    if env.str(name, default=str(default)).strip() == "0":
        return 0
    return positive_int(name, default)


def proxy_ssl_header(name):
    """`HTTP_X_FORWARDED_PROTO,https`: the header (as Django names it in request.META) and the
    value by which the proxy in front says the request came over HTTPS. Only set it behind a
    proxy that always sets or strips that header, or any client can claim HTTPS."""
    raw = env.str(name, default="").strip()
    if not raw:
        return None
    header, _, value = (part.strip() for part in raw.partition(","))
    if not re.fullmatch(r"HTTP_[A-Z0-9_]+", header) or not value or "," in value:
        raise ImproperlyConfigured(
            f"{name} must be a request.META header and a value, like "
            f"HTTP_X_FORWARDED_PROTO,https; not {raw!r}"
        )
    return (header, value)


def trusted_origins(name):
    origins = env.list(name, default=[])
    for origin in origins:
        if not re.fullmatch(r"https?://[^/\s]+", origin):
            raise ImproperlyConfigured(
                f"{name} must be comma-separated origins like https://example.com "
                f"(scheme and host, no path); not {origin!r}"
            )
    return origins


SECURE_SSL_REDIRECT = strict_bool("SECURE_SSL_REDIRECT", not DEBUG)
# A year, the figure the HSTS preload list asks for. 0 sends no header.
SECURE_HSTS_SECONDS = non_negative_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = strict_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", not DEBUG)
# Only the header's `preload` token: a domain joins the browsers' list when someone submits it.
SECURE_HSTS_PRELOAD = strict_bool("SECURE_HSTS_PRELOAD", not DEBUG)
SESSION_COOKIE_SECURE = strict_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = strict_bool("CSRF_COOKIE_SECURE", not DEBUG)
CSRF_TRUSTED_ORIGINS = trusted_origins("CSRF_TRUSTED_ORIGINS")
SECURE_PROXY_SSL_HEADER = proxy_ssl_header("SECURE_PROXY_SSL_HEADER")
# A load balancer's probe of /healthz comes over plain http, under whatever Host it likes:
# the health middleware answers it before the host check and the HTTPS redirect.
MIDDLEWARE.insert(0, "alwayson.ops.health.HealthCheckMiddleware")
# Static files from the app server (gunicorn) itself: whitenoise, right after security.
MIDDLEWARE.insert(
    MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1,
    "whitenoise.middleware.WhiteNoiseMiddleware",
)
# Collected by `collectstatic` (the Docker build, the web unit's start, `runall --production`)
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
# Loop processes (runworker, runscheduler, rundispatcher) write a heartbeat row this often;
# one is live while its last beat is within HEALTH_LIVE_BEATS intervals (alwayson/health.py).
ALWAYSON_HEARTBEAT_INTERVAL = positive_int("ALWAYSON_HEARTBEAT_INTERVAL", 5)
# Kinds of loop process /healthz and `manage.py status` require at least one live of.
ALWAYSON_HEALTH_REQUIRE = env.list(
    "ALWAYSON_HEALTH_REQUIRE", default=["worker", "scheduler", "dispatcher"]
)
if not set(ALWAYSON_HEALTH_REQUIRE) <= {"worker", "scheduler", "dispatcher"}:
    raise ImproperlyConfigured(
        "ALWAYSON_HEALTH_REQUIRE must list kinds among worker,scheduler,dispatcher "
        f"(or be empty), not {ALWAYSON_HEALTH_REQUIRE!r}"
    )


def bearer_token(name):
    """A secret a client brings as `Authorization: Bearer ...`; empty when unset."""
    token = env.str(name, default="").strip()
    if token and (len(token) < 16 or re.search(r"\s", token)):
        raise ImproperlyConfigured(
            f"{name} must be at least 16 characters without spaces "
            "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`), or unset"
        )
    return token


# /metrics (alwayson/metrics.py) answers only a scrape that brings this bearer token; unset,
# the endpoint is off (404). Answered before the host check and the HTTPS redirect, like
# /healthz, so Prometheus may scrape a web process at its own address.
ALWAYSON_METRICS_TOKEN = bearer_token("ALWAYSON_METRICS_TOKEN")
MIDDLEWARE.insert(1, "alwayson.ops.metrics.MetricsMiddleware")
# --- end of production ----------------------------------------------------------------------

# --- logs and alerts (issue 12; alwayson/logs.py, alwayson/alerts.py, alwayson/sentry.py) --
# ALWAYSON_LOG_FORMAT is read above, with LOGGING.
# An inbox's owner hears of its dead events at most once per this many seconds: one message
# through the inbox's channel, counting every event that went dead since the last one.
ALWAYSON_DEAD_ALERT_INTERVAL = positive_int("ALWAYSON_DEAD_ALERT_INTERVAL", 3600)
# Sentry: set the DSN to send errors (needs the `sentry` extra). Environment and release
# name what Sentry shows; the release defaults to the installed alwayson's version.
SENTRY_DSN = env.str("SENTRY_DSN", default="").strip()
SENTRY_ENVIRONMENT = env.str(
    "SENTRY_ENVIRONMENT", default="development" if DEBUG else "production"
).strip()
SENTRY_RELEASE = env.str("SENTRY_RELEASE", default="").strip()
if SENTRY_DSN:
    from contextlib import suppress
    from importlib import metadata

    from alwayson.ops.sentry import init_sentry

    # A checkout that was never installed has no version: Sentry then shows no release.
    with suppress(metadata.PackageNotFoundError):
        SENTRY_RELEASE = SENTRY_RELEASE or f"alwayson@{metadata.version('alwayson')}"
    init_sentry(SENTRY_DSN, SENTRY_ENVIRONMENT, SENTRY_RELEASE)
# --- end of logs and alerts ----------------------------------------------------------------

# --- retention and the admin for operators (issue 12) ---------------------------------------
# The admin site lists the demo's models in a section of their own (alwayson/admin_site.py).
INSTALLED_APPS[INSTALLED_APPS.index("django.contrib.admin")] = (
    "alwayson.web.admin_site.AlwaysonAdminConfig"
)
# `manage.py prune` (alwayson/retention.py):
# Days each kind of row is kept once it is finished; prune never touches pending, running or
# dead events, held or failed messages, waiting approvals, timers still to fire, or sessions.
# The longest a sender retries a delivery: Stripe retries webhooks for up to 3 days, Standard
# Webhooks senders (Svix) for about 1.5 days, GitHub not at all. A dedupe key kept for less
# than this lets a late retry in as a second wake-up, so start-up refuses a shorter setting.
RETENTION_MIN_EVENT_KEY_DAYS = 7


def retention_days(name, default, minimum=1):
    days = positive_int(name, default)
    if days < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum} days, not {days}")
    return days


# A done event's payload and error are cleared after this (the row stays, as its key's tombstone).
ALWAYSON_RETAIN_DONE_EVENTS = retention_days("ALWAYSON_RETAIN_DONE_EVENTS", 14)
# A done event's row, and with it its dedupe key, is deleted after this; so is a fired one-off
# timer. At least RETENTION_MIN_EVENT_KEY_DAYS, and not shorter than the payload's retention.
ALWAYSON_RETAIN_EVENT_KEYS = retention_days(
    "ALWAYSON_RETAIN_EVENT_KEYS", 30, minimum=RETENTION_MIN_EVENT_KEY_DAYS
)
if ALWAYSON_RETAIN_EVENT_KEYS < ALWAYSON_RETAIN_DONE_EVENTS:
    raise ImproperlyConfigured(
        f"ALWAYSON_RETAIN_EVENT_KEYS ({ALWAYSON_RETAIN_EVENT_KEYS}) must not be shorter than "
        f"ALWAYSON_RETAIN_DONE_EVENTS ({ALWAYSON_RETAIN_DONE_EVENTS}): a key outlives its payload"
    )
# Sent outbox messages and notices (the newest sent message of each inbox stays: the gap).
ALWAYSON_RETAIN_SENT_OUTBOX = retention_days("ALWAYSON_RETAIN_SENT_OUTBOX", 30)
# The egress gateway's call log.
ALWAYSON_RETAIN_EGRESS_CALLS = retention_days("ALWAYSON_RETAIN_EGRESS_CALLS", 30)
# The Claude agent's answer cache and tool results (ModelCall, ToolResult); at least 2 days,
# since the daily token budget counts the calls of the current UTC day.
ALWAYSON_RETAIN_MODEL_CALLS = retention_days("ALWAYSON_RETAIN_MODEL_CALLS", 30, minimum=2)


def optional_retention_days(name, minimum):
    if not env.str(name, default="").strip():
        return None
    return retention_days(name, 0, minimum=minimum)


# The audit trail: settled approvals with their audit entries, the admin's history and the
# login log. Unset: kept forever; deleting it is the operator's decision. Not shorter than
# the event keys: a settled approval refuses a second answer for as long as it exists.
ALWAYSON_RETAIN_AUDIT = optional_retention_days("ALWAYSON_RETAIN_AUDIT", ALWAYSON_RETAIN_EVENT_KEYS)
# --- end of retention and the admin ---------------------------------------------------------
