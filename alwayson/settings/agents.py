"""The agents and the machinery that runs them: which agent, claims, leases and retries."""

from django.core.exceptions import ImproperlyConfigured

from . import env

# The agent the worker runs: a callable taking a Run (alwayson/runtime/run.py).
ALWAYSON_AGENT = env.string("ALWAYSON_AGENT", "alwayson.demo.refund_desk.agent")
# The example refund desk asks two different approvers for a refund above this amount.
ALWAYSON_REFUND_TWO_APPROVERS_ABOVE = env.positive_int("ALWAYSON_REFUND_TWO_APPROVERS_ABOVE", 500)
# Where people reach this site: absolute links in the agent's messages start here.
ALWAYSON_SITE_URL = env.http_url("ALWAYSON_SITE_URL", "http://127.0.0.1:8000")

# Every run's RunRecord (inbox.models): off only to measure what recording costs.
ALWAYSON_RUN_RECORDS = env.strict_bool("ALWAYSON_RUN_RECORDS", True)
# Claims before an event is parked as dead.
ALWAYSON_MAX_ATTEMPTS = env.positive_int("ALWAYSON_MAX_ATTEMPTS", 3)
# Seconds a worker owns an inbox without renewing.
ALWAYSON_LEASE_TTL = env.seconds("ALWAYSON_LEASE_TTL", 120, env.MAX_HOLD)
# Seconds a worker's lease statement (a take and its claim, a renewal, a release) may run
# before PostgreSQL cancels it (statement_timeout), or wait for SQLite's write lock: a quarter
# of the TTL (the heartbeat's interval: a renewal stuck longer gives way to the next beat's),
# at most 30 s, unless set. Less than the TTL: a lease statement that may outlast the lease
# bounds nothing.
ALWAYSON_LEASE_STATEMENT_TIMEOUT = env.positive_seconds(
    "ALWAYSON_LEASE_STATEMENT_TIMEOUT", min(ALWAYSON_LEASE_TTL / 4, 30), env.MAX_WAIT
)
if ALWAYSON_LEASE_STATEMENT_TIMEOUT >= ALWAYSON_LEASE_TTL:
    raise ImproperlyConfigured(
        f"ALWAYSON_LEASE_STATEMENT_TIMEOUT must be less than ALWAYSON_LEASE_TTL"
        f" ({ALWAYSON_LEASE_TTL}s), not {ALWAYSON_LEASE_STATEMENT_TIMEOUT}: a lease statement"
        " that may run longer than the lease bounds nothing"
    )
if ALWAYSON_LEASE_STATEMENT_TIMEOUT < 0.001:
    raise ImproperlyConfigured(
        "ALWAYSON_LEASE_STATEMENT_TIMEOUT must be at least 0.001 s (PostgreSQL counts its"
        f" timeouts in milliseconds, and 0 is none), not {ALWAYSON_LEASE_STATEMENT_TIMEOUT}"
    )
# Backoff before a failed event's next attempt: base * 2^(attempts-1) seconds, capped, jittered.
ALWAYSON_RETRY_BASE = env.seconds("ALWAYSON_RETRY_BASE", 10, env.MAX_INTERVAL)
ALWAYSON_RETRY_CAP = env.seconds("ALWAYSON_RETRY_CAP", 3600, env.MAX_INTERVAL)
