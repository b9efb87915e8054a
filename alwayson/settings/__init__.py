"""Settings for alwayson, read from the environment (and an optional `.env` file).

One switch picks the database: `DATABASE_URL`. Malformed values stop the process at start-up
instead of being read as a default.

One module per concern; each declares its settings as UPPERCASE names, reads the environment
only through env.py's parsers, and imports by name the few values of another module it
depends on, so its dependencies show. Their star imports below make `alwayson.settings` the
whole of them; helpers are lowercase or private, which Django does not read as settings.

Nothing here imports an app or starts anything: values whose check needs an app's code are
checked in that app's ready() (inbox, outbox, egress, Claude), and Sentry starts in the
operations app's ready(), so every process that sets Django up checks and reports the same.
"""

# In reading order, core Django first; the order changes nothing, since a module imports by
# name what it needs from another and no two define the same setting.
# isort: off
from .base import *  # noqa: F403  DEBUG, the secret key, INSTALLED_APPS, MIDDLEWARE, templates
from .database import *  # noqa: F403
from .security import *  # noqa: F403  hosts, HTTPS, cookies, the proxy in front
from .static import *  # noqa: F403
from .accounts import *  # noqa: F403  login, passwords, the throttles
from .agents import *  # noqa: F403  the agent, claims, leases, retries
from .outbox import *  # noqa: F403  sends, email, signing secrets
from .webhooks import *  # noqa: F403
from .bodies import *  # noqa: F403  the largest request body, kept in memory
from .egress import *  # noqa: F403  the gateway's services, the chat channels
from .claude import *  # noqa: F403
from .ops import *  # noqa: F403  heartbeats, health, metrics, dead-event alerts
from .logs import *  # noqa: F403
from .sentry import *  # noqa: F403
from .retention import *  # noqa: F403
# isort: on
