"""Incoming webhooks (inbox/webhooks.py, inbox/views.py).

Secrets per scheme, comma-separated; several at once while a secret is rotated. An inbox may
have its own in ALWAYSON_WEBHOOK_INBOX_SECRETS, JSON {"slug": {"github": ["..."]}}, which
replace the scheme's for that inbox. Read here as plain data; each secret is checked by the
inbox app's ready() (inbox/apps.py), so a malformed secret stops every process at start-up
instead of rejecting every delivery.
"""

from . import env

ALWAYSON_GITHUB_SECRETS = env.items("ALWAYSON_GITHUB_SECRETS")
ALWAYSON_STRIPE_SECRETS = env.items("ALWAYSON_STRIPE_SECRETS")
ALWAYSON_STANDARD_SECRETS = env.items("ALWAYSON_STANDARD_SECRETS")
ALWAYSON_WEBHOOK_INBOX_SECRETS = env.json_value(
    "ALWAYSON_WEBHOOK_INBOX_SECRETS", {}, like='{"slug": {"github": ["secret"]}}'
)
# Bodies larger than this are refused with 413 before they are verified.
ALWAYSON_WEBHOOK_MAX_BYTES = env.positive_int("ALWAYSON_WEBHOOK_MAX_BYTES", 1024 * 1024)
# Seconds a Stripe signature stays valid; positive_int refuses 0, which would disable the check.
ALWAYSON_STRIPE_TOLERANCE = env.seconds("ALWAYSON_STRIPE_TOLERANCE", 300, env.MAX_WAIT)
