"""The egress gateway (alwayson/egress/gateway.py) and the chat channels that send through it
(alwayson/egress/channels.py)."""

from . import env

# Services an agent may call through the egress gateway, JSON by name:
# {"payments": {"base_url": "https://api.example.com", "methods": ["POST"],
#               "paths": ["/v1/refunds"], "secret_env": "PAYMENTS_TOKEN", "inboxes": ["desk"]}}
# The credential itself stays in the variable `secret_env` names, read at each call; it is
# never in settings, the database or the agent's reach. Read here as JSON; the egress app's
# ready() checks each service (alwayson/egress/apps.py) and the gateway reads them as
# Service objects (alwayson.egress.services.configured_services()).
ALWAYSON_EGRESS_SERVICES = env.json_value("ALWAYSON_EGRESS_SERVICES", {})
# The sealed worker (docs/how-to/egress.md#the-sealed-worker): the Unix socket `runegress`
# listens on. When set, `runworker` re-executes itself without any credential in its
# environment and its agents' `run.http` (and the Claude agent's model calls) go through
# this socket to the one process that holds the credentials. The deploy files set it.
ALWAYSON_EGRESS_SOCKET = env.string("ALWAYSON_EGRESS_SOCKET")
# More environment variables the sealed worker must not hold: a team's own secrets, beside
# the ones alwayson knows (alwayson/egress/sealing.py). Comma-separated names.
ALWAYSON_WORKER_WITHHOLD = env.string_list("ALWAYSON_WORKER_WITHHOLD", [])
# Port of `manage.py runegress` on 127.0.0.1 for agents running out of process; runall
# starts it when set. Its clients bring ALWAYSON_EGRESS_TOKEN, which it then requires.
ALWAYSON_EGRESS_PORT = env.integer("ALWAYSON_EGRESS_PORT", 0)
ALWAYSON_EGRESS_TOKEN = env.bearer_token("ALWAYSON_EGRESS_TOKEN")
# Chat channels of the outbox. The bot tokens are read from the environment at each send
# (ALWAYSON_SLACK_BOT_TOKEN, ALWAYSON_TELEGRAM_BOT_TOKEN) and never stored; the API URLs
# change only for a proxy or a test server.
ALWAYSON_SLACK_API_URL = env.string("ALWAYSON_SLACK_API_URL", "https://slack.com/api")
ALWAYSON_TELEGRAM_API_URL = env.string("ALWAYSON_TELEGRAM_API_URL", "https://api.telegram.org")
