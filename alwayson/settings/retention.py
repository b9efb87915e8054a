"""What `manage.py prune` keeps (alwayson/ops/retention.py).

Days each kind of row is kept once it is finished; prune never touches pending, running or
dead events, held or failed messages, waiting approvals, timers still to fire, or sessions.
"""

from django.core.exceptions import ImproperlyConfigured

from . import env

# The longest a sender retries a delivery: Stripe retries webhooks for up to 3 days, Standard
# Webhooks senders (Svix) for about 1.5 days, GitHub not at all. A dedupe key kept for less
# than this lets a late retry in as a second wake-up, so start-up refuses a shorter setting.
RETENTION_MIN_EVENT_KEY_DAYS = 7

# A done event's payload and error are cleared after this (the row stays, as its key's tombstone).
ALWAYSON_RETAIN_DONE_EVENTS = env.days("ALWAYSON_RETAIN_DONE_EVENTS", 14)
# A done event's row, and with it its dedupe key, is deleted after this; so is a fired one-off
# timer. At least RETENTION_MIN_EVENT_KEY_DAYS, and not shorter than the payload's retention.
ALWAYSON_RETAIN_EVENT_KEYS = env.days(
    "ALWAYSON_RETAIN_EVENT_KEYS", 30, minimum=RETENTION_MIN_EVENT_KEY_DAYS
)
if ALWAYSON_RETAIN_EVENT_KEYS < ALWAYSON_RETAIN_DONE_EVENTS:
    raise ImproperlyConfigured(
        f"ALWAYSON_RETAIN_EVENT_KEYS ({ALWAYSON_RETAIN_EVENT_KEYS}) must not be shorter than "
        f"ALWAYSON_RETAIN_DONE_EVENTS ({ALWAYSON_RETAIN_DONE_EVENTS}): a key outlives its payload"
    )
# Sent outbox messages and notices (the newest sent message of each inbox stays: the gap).
ALWAYSON_RETAIN_SENT_OUTBOX = env.days("ALWAYSON_RETAIN_SENT_OUTBOX", 30)
# The egress gateway's call log.
ALWAYSON_RETAIN_EGRESS_CALLS = env.days("ALWAYSON_RETAIN_EGRESS_CALLS", 30)
# The Claude agent's answer cache and tool results (ModelCall, ToolResult); at least 2 days,
# since the daily token budget counts the calls of the current UTC day.
ALWAYSON_RETAIN_MODEL_CALLS = env.days("ALWAYSON_RETAIN_MODEL_CALLS", 30, minimum=2)
# The run records (RunRecord), by when each run ended.
ALWAYSON_RETAIN_RUN_RECORDS = env.days("ALWAYSON_RETAIN_RUN_RECORDS", 30)
# The audit trail: settled approvals with their audit entries, the admin's history and the
# login log. Unset: kept forever; deleting it is the operator's decision. Not shorter than
# the event keys: a settled approval refuses a second answer for as long as it exists.
ALWAYSON_RETAIN_AUDIT = env.optional_days("ALWAYSON_RETAIN_AUDIT", ALWAYSON_RETAIN_EVENT_KEYS)
# The Claude agent's memory history (MemoryVersion): a version older than this goes once a
# later one of the same file exists; a file's latest version, and the files, are kept.
# Unset: kept forever.
ALWAYSON_RETAIN_MEMORY_VERSIONS = env.optional_days("ALWAYSON_RETAIN_MEMORY_VERSIONS", 1)
