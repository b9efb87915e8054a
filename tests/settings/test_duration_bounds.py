"""Every duration setting is bounded at start-up: a value past its kind's maximum stops the
settings import with ImproperlyConfigured naming the variable and the range, instead of
passing `check` and failing later (`prune` with OverflowError, a sleep, PostgreSQL's
millisecond timeouts). At the maxima everything still works.

The settings are imported in a fresh process with only the variables a case gives it.
"""

import json
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import call_command

from alwayson.ops.retention import prune, would_prune
from inbox import clock
from tests.support.env import environment
from tests.support.paths import ROOT

DAY = 86400

# Each bounded setting, the most it takes and its unit; docs/reference/settings.md lists them.
BOUNDED = [
    ("ALWAYSON_RETAIN_DONE_EVENTS", 3650, "days"),
    ("ALWAYSON_RETAIN_EVENT_KEYS", 3650, "days"),
    ("ALWAYSON_RETAIN_SENT_OUTBOX", 3650, "days"),
    ("ALWAYSON_RETAIN_EGRESS_CALLS", 3650, "days"),
    ("ALWAYSON_RETAIN_MODEL_CALLS", 3650, "days"),
    ("ALWAYSON_RETAIN_AUDIT", 3650, "days"),
    ("ALWAYSON_INGEST_LOCK_WAIT", 3600, "seconds"),
    ("ALWAYSON_OUTBOX_WEBHOOK_TIMEOUT", 3600, "seconds"),
    ("EMAIL_TIMEOUT", 3600, "seconds"),
    ("ALWAYSON_CLAUDE_TIMEOUT", 3600, "seconds"),
    ("ALWAYSON_STRIPE_TOLERANCE", 3600, "seconds"),
    ("ALWAYSON_HEARTBEAT_INTERVAL", 3600, "seconds"),
    ("ALWAYSON_DB_CONNECT_TIMEOUT", 3600, "seconds"),
    ("ALWAYSON_DB_KEEPALIVES_IDLE", 3600, "seconds"),
    ("ALWAYSON_DB_KEEPALIVES_INTERVAL", 3600, "seconds"),
    ("ALWAYSON_DB_TCP_USER_TIMEOUT", 3600, "seconds"),
    ("ALWAYSON_LEASE_STATEMENT_TIMEOUT", 3600, "seconds"),
    ("ALWAYSON_IDLE_IN_TRANSACTION_TIMEOUT", DAY, "seconds"),
    ("ALWAYSON_DB_CONN_MAX_AGE", DAY, "seconds"),
    ("ALWAYSON_LEASE_TTL", DAY, "seconds"),
    ("ALWAYSON_RETRY_BASE", 30 * DAY, "seconds"),
    ("ALWAYSON_RETRY_CAP", 30 * DAY, "seconds"),
    ("ALWAYSON_OUTBOX_GAP", 30 * DAY, "seconds"),
    ("ALWAYSON_LOGIN_COOLOFF", 30 * DAY, "seconds"),
    ("ALWAYSON_DEAD_ALERT_INTERVAL", 30 * DAY, "seconds"),
    ("ALWAYSON_CLAUDE_APPROVAL_WINDOW", 365 * DAY, "seconds"),
    ("SECURE_HSTS_SECONDS", 2 * 365 * DAY, "seconds"),
]
# Read under another name, or not as a plain setting.
READ_AS = {"ALWAYSON_LOGIN_COOLOFF": "AXES_COOLOFF_TIME", "EMAIL_TIMEOUT": None}

IMPORT = """
import json, sys
from datetime import timedelta
from django.core.exceptions import ImproperlyConfigured
try:
    import alwayson.settings as settings
except ImproperlyConfigured as exc:
    sys.exit(f"ImproperlyConfigured: {exc}")
values = {name: getattr(settings, name) for name in sys.argv[1:]}
print(json.dumps({
    name: value.total_seconds() if isinstance(value, timedelta) else value
    for name, value in values.items()
}))
"""


def import_settings(names=(), **env):
    """Import the settings in a fresh process: (exit code, stderr, the values of `names`)."""
    done = subprocess.run(
        [sys.executable, "-c", IMPORT, *names],
        cwd=ROOT,
        env=environment(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    values = json.loads(done.stdout) if done.returncode == 0 else None
    return done.returncode, done.stderr.strip(), values


@pytest.mark.parametrize("name, maximum, unit", BOUNDED, ids=[b[0] for b in BOUNDED])
def test_a_duration_past_its_maximum_stops_start_up_naming_the_variable(name, maximum, unit):
    for value in (str(maximum + 1), "1000000000"):
        code, stderr, _ = import_settings(**{name: value})

        assert code == 1, (name, value)
        assert stderr.startswith(f"ImproperlyConfigured: {name} must be "), stderr
        assert f"to {maximum} {unit}" in stderr and value in stderr, stderr


@pytest.mark.parametrize("value", ["inf", "1e12", "nan", "-inf"])
def test_a_lock_wait_that_is_no_number_of_seconds_stops_start_up(value):
    code, stderr, _ = import_settings(ALWAYSON_INGEST_LOCK_WAIT=value)

    assert code == 1
    assert stderr.startswith("ImproperlyConfigured: ALWAYSON_INGEST_LOCK_WAIT must be "), stderr


def test_every_duration_at_its_maximum_is_taken():
    read = {name: READ_AS.get(name, name) for name, _, _ in BOUNDED}
    code, stderr, values = import_settings(
        [setting for setting in read.values() if setting],
        **{name: str(maximum) for name, maximum, _ in BOUNDED},
    )

    assert code == 0, stderr
    assert values == {read[name]: maximum for name, maximum, _ in BOUNDED if read[name]}


RETENTION = [name for name, _, unit in BOUNDED if unit == "days"]


@pytest.mark.django_db
def test_prune_works_with_every_retention_at_its_maximum(settings, inbox):
    for name in RETENTION:
        setattr(settings, name, 3650)
    out = StringIO()

    call_command("prune", "--dry-run", stdout=out)

    assert out.getvalue().splitlines()[-1] == "would prune 0 row(s)"
    now = clock.database_now()
    assert sum(would_prune(now).values()) == 0
    assert sum(prune(now).values()) == 0
