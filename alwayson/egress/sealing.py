"""The sealed worker: agent code runs in a process that holds no credential
(docs/how-to/egress.md, "The sealed worker").

With ALWAYSON_EGRESS_SOCKET set, `runworker` re-executes itself (same PID, same arguments)
with an environment that lacks every credential variable alwayson knows, plus the ones a
team names in ALWAYSON_WORKER_WITHHOLD. An exec, not `del os.environ[...]`: the kernel keeps
the environment a process started with (`/proc/self/environ` reads it back), and only a new
program image replaces it.

Every other process of a sealed deployment holds credentials and may run as the same Unix
user, so each makes itself non-dumpable (`hide_from_same_user`). An exec resets that flag,
which is why the sealed worker, which has nothing to hide, is readable again.
"""

import ctypes
import logging
import os
import secrets
import sys

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from alwayson.egress.services import configured_services

log = logging.getLogger("alwayson.egress")

# Set in the sealed worker's environment: it has been sealed (do not exec again) and must not
# read the `.env` file, which may hold what was withheld (alwayson/settings/env.py).
SEALED = "ALWAYSON_SEALED_WORKER"

# The variables that hold a credential, by what needs them. The sealed worker needs none:
# it verifies no webhook (web), signs and sends nothing (dispatcher), serves no metrics
# (web), and calls services and the Messages API through the gateway (egress).
# tests/egress/test_sealed_worker.py checks that every secret the settings read is listed.
CREDENTIAL_VARIABLES = frozenset(
    {
        # web: signs sessions, password-reset links and CSRF tokens; replaced, not removed
        "SECRET_KEY",
        # web: incoming webhooks' secrets (alwayson/settings/webhooks.py)
        "ALWAYSON_GITHUB_SECRETS",
        "ALWAYSON_STRIPE_SECRETS",
        "ALWAYSON_STANDARD_SECRETS",
        "ALWAYSON_WEBHOOK_INBOX_SECRETS",
        # web: the /metrics scrape token
        "ALWAYSON_METRICS_TOKEN",
        # dispatcher: signs outbox webhooks; sends email (the SMTP password is in the URL)
        "ALWAYSON_OUTBOX_SIGNING_SECRETS",
        "EMAIL_URL",
        # dispatcher and egress: the chat channels' bot tokens (alwayson/egress/channels.py)
        "ALWAYSON_SLACK_BOT_TOKEN",
        "ALWAYSON_TELEGRAM_BOT_TOKEN",
        # egress: the Messages API key, and the token of the gateway's TCP port
        "ANTHROPIC_API_KEY",
        "ALWAYSON_EGRESS_TOKEN",
        # compose: the database owner's password (deploy/compose.yaml reads it from the same
        # file); the sealed worker connects as a role of its own (below)
        "POSTGRES_PASSWORD",
    }
)
# Its own database URL, which becomes its DATABASE_URL: the owner's URL is not handed on.
WORKER_DATABASE_URL = "ALWAYSON_WORKER_DATABASE_URL"


def withheld_names(environ) -> set[str]:
    """The names of `environ` the sealed worker must not hold: the known credentials, each
    egress service's `secret_env`, and ALWAYSON_WORKER_WITHHOLD."""
    names = set(CREDENTIAL_VARIABLES) | set(settings.ALWAYSON_WORKER_WITHHOLD)
    names |= {s.secret_env for s in configured_services().values() if s.secret_env}
    return names & set(environ)


def sealed_environment(environ) -> dict:
    """`environ` as the sealed worker gets it: no credential, a SECRET_KEY of its own (Django
    needs one; the worker signs nothing anybody checks), the mark that it is sealed, and,
    with ALWAYSON_WORKER_DATABASE_URL set, that as its DATABASE_URL: the owner's is withheld,
    and the worker reaches only what its own role may (alwayson/ops/workerrole.py)."""
    withheld = withheld_names(environ)
    sealed = {name: value for name, value in environ.items() if name not in withheld}
    sealed["SECRET_KEY"] = secrets.token_urlsafe(50)
    sealed[SEALED] = "1"
    own = sealed.pop(WORKER_DATABASE_URL, "") or settings.ALWAYSON_WORKER_DATABASE_URL
    if own:
        sealed["DATABASE_URL"] = own
    return sealed


def seal_worker():
    """Re-execute this process without its credentials, unless it is sealed already.

    Called by `runworker` first thing when ALWAYSON_EGRESS_SOCKET is set. In the sealed
    image it checks instead that nothing was handed back (a launcher that sets the mark
    itself and passes a credential is refused with the variables' names, never values).
    """
    if os.environ.get(SEALED) == "1":
        left = sorted(withheld_names(os.environ) - {"SECRET_KEY"})
        if left:
            raise ImproperlyConfigured(
                f"{SEALED} is set but the environment holds {', '.join(left)}: a sealed "
                "worker must not hold credentials (docs/how-to/egress.md#the-sealed-worker)"
            )
        return
    withheld = ", ".join(sorted(withheld_names(os.environ)))
    environment = sealed_environment(os.environ)
    log.info("sealing the worker: restarting without %s", withheld)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    connections.close_all()
    os.execve(sys.executable, sys.orig_argv, environment)


def sealing() -> bool:
    """Whether this deployment seals its worker (ALWAYSON_EGRESS_SOCKET is set)."""
    return bool(settings.ALWAYSON_EGRESS_SOCKET)


PR_SET_DUMPABLE = 4


def hide_from_same_user() -> bool:
    """Make this process non-dumpable: its /proc files become root's, and no process of the
    same user can read its environment or memory or attach to it (as ssh-agent does).
    False where the kernel has no such switch (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        log.warning("could not make this process non-dumpable (errno %s)", ctypes.get_errno())
        return False
    return True
