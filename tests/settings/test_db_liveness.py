"""The liveness of every PostgreSQL connection: keepalives, tcp_user_timeout and connect_timeout
from settings with safe defaults, in DATABASES' OPTIONS and so on every connection Django
opens (the pool's too); a lease statement's bound; a bad value stops start-up naming the
variable. SQLite gets none of them (no network).

Settings are read once per process: each case reads them in a fresh one, with only the
variables it gives. Nothing connects to the database here; the connections themselves are
in test_db_liveness_pg.py.
"""

import json
import subprocess
import sys

import pytest

from tests.support.env import environment
from tests.support.paths import ROOT

# Each case names its own DATABASE_URL, and reads the settings without connecting.
pytestmark = pytest.mark.engine_free

POSTGRES = "postgres://postgres@127.0.0.1:5432/alwayson_settings_only"
LIVENESS = (
    "connect_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
)
VARIABLES = (
    "ALWAYSON_DB_CONNECT_TIMEOUT",
    "ALWAYSON_DB_KEEPALIVES_IDLE",
    "ALWAYSON_DB_KEEPALIVES_INTERVAL",
    "ALWAYSON_DB_KEEPALIVES_COUNT",
    "ALWAYSON_DB_TCP_USER_TIMEOUT",
    "ALWAYSON_LEASE_STATEMENT_TIMEOUT",
    "ALWAYSON_LEASE_TTL",
)

READ = """
import json, sys
from django.core.exceptions import ImproperlyConfigured
try:
    import django
    django.setup()
except ImproperlyConfigured as exc:
    sys.exit(f"ImproperlyConfigured: {exc}")
from django.conf import settings
from django.db import connections
options = connections["default"].settings_dict["OPTIONS"]
print(json.dumps({
    "options": {key: options[key] for key in sys.argv[1:] if key in options},
    "lease_statement_timeout": settings.ALWAYSON_LEASE_STATEMENT_TIMEOUT,
}))
"""


def read(database_url=POSTGRES, **env):
    """(exit code, stderr, {"options": the liveness OPTIONS, "lease_statement_timeout"})."""
    environ = environment(DATABASE_URL=database_url, **env)
    for name in VARIABLES:
        if name not in env:
            environ.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", READ, *LIVENESS],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    values = json.loads(done.stdout) if done.returncode == 0 else None
    return done.returncode, done.stderr.strip(), values


def test_every_postgresql_connection_gets_keepalives_a_user_timeout_and_a_connect_timeout():
    code, stderr, values = read()

    assert code == 0, stderr
    assert values["options"] == {
        "connect_timeout": 10,
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": 30000,  # libpq counts it in milliseconds
    }


def test_the_settings_set_them_and_zero_leaves_the_user_timeout_to_the_kernel():
    code, stderr, values = read(
        ALWAYSON_DB_CONNECT_TIMEOUT="4",
        ALWAYSON_DB_KEEPALIVES_IDLE="7",
        ALWAYSON_DB_KEEPALIVES_INTERVAL="2",
        ALWAYSON_DB_KEEPALIVES_COUNT="6",
        ALWAYSON_DB_TCP_USER_TIMEOUT="0",
    )

    assert code == 0, stderr
    assert values["options"] == {
        "connect_timeout": 4,
        "keepalives": 1,
        "keepalives_idle": 7,
        "keepalives_interval": 2,
        "keepalives_count": 6,
    }


def test_a_value_in_the_database_url_wins_over_the_setting():
    code, stderr, values = read(
        f"{POSTGRES}?connect_timeout=3&tcp_user_timeout=2500", ALWAYSON_DB_CONNECT_TIMEOUT="20"
    )

    assert code == 0, stderr
    assert values["options"]["connect_timeout"] == 3
    assert values["options"]["tcp_user_timeout"] == 2500
    assert values["options"]["keepalives_idle"] == 10


def test_sqlite_has_no_network_to_keep_alive(tmp_path):
    code, stderr, values = read(f"sqlite:///{tmp_path / 'db.sqlite3'}")

    assert code == 0, stderr
    assert values["options"] == {}


@pytest.mark.parametrize(
    "name, value, says",
    [
        ("ALWAYSON_DB_CONNECT_TIMEOUT", "1", "must be from 2 to 3600 seconds, not 1"),
        ("ALWAYSON_DB_CONNECT_TIMEOUT", "ten", "must be an integer"),
        ("ALWAYSON_DB_KEEPALIVES_IDLE", "0", "must be a positive integer, not 0"),
        ("ALWAYSON_DB_KEEPALIVES_INTERVAL", "-5", "must be a positive integer, not -5"),
        ("ALWAYSON_DB_KEEPALIVES_COUNT", "0", "must be from 1 to 100 probes, not 0"),
        ("ALWAYSON_DB_KEEPALIVES_COUNT", "3.5", "must be an integer"),
        ("ALWAYSON_DB_TCP_USER_TIMEOUT", "-1", "must be a positive integer, not -1"),
        ("ALWAYSON_DB_TCP_USER_TIMEOUT", "30s", "must be an integer"),
        ("ALWAYSON_LEASE_STATEMENT_TIMEOUT", "0", "must be more than 0"),
        ("ALWAYSON_LEASE_STATEMENT_TIMEOUT", "0.0001", "must be at least 0.001 s"),
        ("ALWAYSON_LEASE_STATEMENT_TIMEOUT", "soon", "must be a number of seconds"),
        ("ALWAYSON_LEASE_STATEMENT_TIMEOUT", "120", "must be less than ALWAYSON_LEASE_TTL (120s)"),
    ],
)
def test_a_bad_value_stops_start_up_naming_the_variable(name, value, says):
    code, stderr, _ = read(**{name: value})

    assert code == 1
    assert stderr.startswith(f"ImproperlyConfigured: {name} must be "), stderr
    assert says in stderr, stderr


@pytest.mark.parametrize(
    "ttl, bound",
    [("120", 30), ("400", 30), ("60", 15), ("2", 0.5)],
)
def test_a_lease_statement_is_bounded_by_a_quarter_of_the_ttl_at_most_30_s(ttl, bound):
    code, stderr, values = read(ALWAYSON_LEASE_TTL=ttl)

    assert code == 0, stderr
    assert values["lease_statement_timeout"] == bound


def test_a_lease_statement_bound_below_the_ttl_is_taken():
    code, stderr, values = read(ALWAYSON_LEASE_TTL="10", ALWAYSON_LEASE_STATEMENT_TIMEOUT="9.5")

    assert code == 0, stderr
    assert values["lease_statement_timeout"] == 9.5
