"""The database: `DATABASE_URL` picks it. SQLite is the embedded default; PostgreSQL
(`postgres://...`) is the engine for many workers on many hosts."""

from django.core.exceptions import ImproperlyConfigured

from . import env
from .env import BASE_DIR

# A worker frozen inside a transaction (SIGSTOP, a debugger, a swap storm) holds its inbox's
# lease row. PostgreSQL ends a session left idle in a transaction after this many seconds, so
# the lock comes free; it must outlast the longest send an at-least-once dispatch makes
# inside its transaction (the outbox's webhook and email timeouts: checked in outbox.py).
ALWAYSON_IDLE_IN_TRANSACTION_TIMEOUT = env.seconds(
    "ALWAYSON_IDLE_IN_TRANSACTION_TIMEOUT", 30, env.MAX_HOLD
)
# Seconds a delivery (ingest) or a person's answer waits for its inbox's lock before it is
# refused as busy (a webhook then answers 503 with Retry-After): under a sender's timeout.
ALWAYSON_INGEST_LOCK_WAIT = env.positive_seconds("ALWAYSON_INGEST_LOCK_WAIT", 5, env.MAX_WAIT)

# Seconds a web process keeps its PostgreSQL connection between requests; 0: one per request.
ALWAYSON_DB_CONN_MAX_AGE = env.seconds_or_zero("ALWAYSON_DB_CONN_MAX_AGE", 60, env.MAX_HOLD)

# Connections a process serving ASGI (alwayson/asgi.py sets it: uvicorn, daphne) keeps in a
# pool shared by its threads; 0 (WSGI, the production web among them, and the loops): none,
# each thread keeps its own (ALWAYSON_DB_CONN_MAX_AGE). Under ASGI a request's view runs on a
# thread of its own, so a connection kept per thread would be one more open session per
# request served.
ALWAYSON_DB_POOL_SIZE = env.non_negative_int("ALWAYSON_DB_POOL_SIZE", 0)

# Prepared statements for the hot paths' statements (ingest, the worker's take and finish:
# prepared_cursor in inbox/backends/postgresql.py); Django's own stay unprepared. Off behind a
# pooler in transaction mode that cannot keep a session's prepared statements (PgBouncer
# before 1.21).
ALWAYSON_DB_PREPARE = env.strict_bool("ALWAYSON_DB_PREPARE", True)

# The liveness of every PostgreSQL connection a process opens: Django's (the pool's too) and
# the sessions it opens beside them (the LISTEN of the worker and of the live pages). Without
# them a connection whose peer stopped answering (a cut network, a host gone) hangs the
# thread that waits on it for as long as the kernel retries: minutes, or for ever on an idle
# connection. A value in DATABASE_URL's query string (`?connect_timeout=3`) wins over these.
# Seconds libpq waits for a connection to open (TCP, TLS and PostgreSQL's start-up), at least
# 2 (libpq's minimum).
ALWAYSON_DB_CONNECT_TIMEOUT = env.whole(
    "ALWAYSON_DB_CONNECT_TIMEOUT", 10, 2, env.MAX_WAIT, "seconds"
)
# TCP keepalives: after this many idle seconds the kernel probes the peer, every
# ALWAYSON_DB_KEEPALIVES_INTERVAL seconds, and gives the connection up after
# ALWAYSON_DB_KEEPALIVES_COUNT unanswered probes: an idle connection to a host that is gone
# fails in 25 s instead of about two hours (Linux's defaults).
ALWAYSON_DB_KEEPALIVES_IDLE = env.seconds("ALWAYSON_DB_KEEPALIVES_IDLE", 10, env.MAX_WAIT)
ALWAYSON_DB_KEEPALIVES_INTERVAL = env.seconds("ALWAYSON_DB_KEEPALIVES_INTERVAL", 5, env.MAX_WAIT)
ALWAYSON_DB_KEEPALIVES_COUNT = env.whole("ALWAYSON_DB_KEEPALIVES_COUNT", 3, 1, 100, "probes")
# Seconds data sent on a connection may stay unacknowledged before the kernel gives it up
# (TCP_USER_TIMEOUT, Linux): a statement sent into a cut network fails in this time instead
# of the kernel's 15 minutes of retransmissions. 0: the kernel's default.
ALWAYSON_DB_TCP_USER_TIMEOUT = env.seconds_or_zero("ALWAYSON_DB_TCP_USER_TIMEOUT", 30, env.MAX_WAIT)


def liveness_options() -> dict:
    """The libpq parameters the settings above give every PostgreSQL connection."""
    options = {
        "connect_timeout": ALWAYSON_DB_CONNECT_TIMEOUT,
        "keepalives": 1,
        "keepalives_idle": ALWAYSON_DB_KEEPALIVES_IDLE,
        "keepalives_interval": ALWAYSON_DB_KEEPALIVES_INTERVAL,
        "keepalives_count": ALWAYSON_DB_KEEPALIVES_COUNT,
    }
    if ALWAYSON_DB_TCP_USER_TIMEOUT:
        options["tcp_user_timeout"] = ALWAYSON_DB_TCP_USER_TIMEOUT * 1000  # milliseconds
    return options


def _database(url):
    config = env.database_config("DATABASE_URL", url)
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
            "application_name", env.string("ALWAYSON_APPLICATION_NAME", "alwayson")
        )
        # A web process keeps its connection between requests, checked before reuse (a
        # restart or a failover ends every idle session): a webhook is one statement, so
        # opening a session per request would cost more than it.
        config.setdefault("CONN_HEALTH_CHECKS", True)
        if ALWAYSON_DB_POOL_SIZE:
            # The pool keeps them instead, checked as it hands one out: Django gives the pool
            # a check only under CONN_HEALTH_CHECKS. Its pool refuses CONN_MAX_AGE.
            config["CONN_MAX_AGE"] = 0
            config["OPTIONS"]["pool"] = {
                "min_size": 1,
                "max_size": ALWAYSON_DB_POOL_SIZE,
                "timeout": ALWAYSON_INGEST_LOCK_WAIT,
            }
        else:
            config.setdefault("CONN_MAX_AGE", ALWAYSON_DB_CONN_MAX_AGE)
        for key, value in liveness_options().items():
            config["OPTIONS"].setdefault(key, value)
        idle = f"-c idle_in_transaction_session_timeout={ALWAYSON_IDLE_IN_TRANSACTION_TIMEOUT}s"
        options = config["OPTIONS"]
        options["options"] = f"{options['options']} {idle}" if options.get("options") else idle
    else:
        raise ImproperlyConfigured(
            f"DATABASE_URL must point at SQLite or PostgreSQL, not {engine or url!r}"
        )
    return config


DATABASES = {
    "default": _database(env.string("DATABASE_URL", f"sqlite:///{BASE_DIR / 'alwayson.sqlite3'}"))
}

# The sealed worker's own database URL: a role that reaches only what a run needs, made by
# `manage.py workerrole` (docs/how-to/egress.md#the-workers-database-role). The sealed
# worker re-executes itself with it as its DATABASE_URL, so agent code never holds the
# owner's; `workerrole` without a role name makes this URL's user, with its password.
ALWAYSON_WORKER_DATABASE_URL = env.string("ALWAYSON_WORKER_DATABASE_URL")
if ALWAYSON_WORKER_DATABASE_URL:
    _worker = env.database_config("ALWAYSON_WORKER_DATABASE_URL", ALWAYSON_WORKER_DATABASE_URL)
    if not _worker.get("ENGINE", "").endswith("postgresql") or not _worker.get("USER"):
        raise ImproperlyConfigured(
            "ALWAYSON_WORKER_DATABASE_URL must be a postgres:// URL with a user (the worker's "
            "role); SQLite has no roles"
        )
    if not DATABASES["default"]["ENGINE"].endswith("postgresql"):
        raise ImproperlyConfigured(
            "ALWAYSON_WORKER_DATABASE_URL is for PostgreSQL: DATABASE_URL is not (SQLite has "
            "no roles; unset it)"
        )
