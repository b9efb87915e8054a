"""The egress gateway (alwayson/egress/gateway.py) and the chat channels that send through it
(alwayson/egress/channels.py)."""

from . import env

# Services an agent may call through the egress gateway, JSON by name:
# {"payments": {"base_url": "https://api.example.com", "methods": ["POST"],
#               "paths": ["/v1/refunds"], "secret_env": "PAYMENTS_TOKEN", "inboxes": ["desk"]}}
# The credential itself stays in the variable `secret_env` names, read at each call; it is
# never in settings, the database or the agent's reach. Read here as JSON; the egress app's
# ready() checks each service (alwayson/egress/apps.py) and the gateway reads them as
# Service objects (alwayson.egress.gateway.services()).
ALWAYSON_EGRESS_SERVICES = env.json_value("ALWAYSON_EGRESS_SERVICES", {})
# Port of `manage.py runegress` (127.0.0.1) for agents running out of process; runall starts
# it when set.
ALWAYSON_EGRESS_PORT = env.integer("ALWAYSON_EGRESS_PORT", 0)
# Chat channels of the outbox. The bot tokens are read from the environment at each send
# (ALWAYSON_SLACK_BOT_TOKEN, ALWAYSON_TELEGRAM_BOT_TOKEN) and never stored; the API URLs
# change only for a proxy or a test server.
ALWAYSON_SLACK_API_URL = env.string("ALWAYSON_SLACK_API_URL", "https://slack.com/api")
ALWAYSON_TELEGRAM_API_URL = env.string("ALWAYSON_TELEGRAM_API_URL", "https://api.telegram.org")
