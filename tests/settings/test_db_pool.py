"""ALWAYSON_DB_POOL_SIZE: a web process serving ASGI takes its PostgreSQL connections from a
pool (alwayson/asgi.py sets it), every other process (the production web, serving WSGI, among
them) keeps one per thread as before, SQLite
has no pool, and a malformed size stops start-up naming the variable.

Settings are read once per process: each case reads them in a fresh one, as Django will use
them (connections' settings_dict, defaults filled in). Nothing connects to the database.
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

READ = """
import json, sys
from django.core.exceptions import ImproperlyConfigured
try:
    if sys.argv[1] == "asgi":
        import alwayson.asgi
    elif sys.argv[1] == "wsgi":
        import alwayson.wsgi
    else:
        import django
        django.setup()
except ImproperlyConfigured as exc:
    sys.exit(f"ImproperlyConfigured: {exc}")
from django.db import connections
db = connections["default"].settings_dict
print(json.dumps({
    "CONN_MAX_AGE": db["CONN_MAX_AGE"],
    "CONN_HEALTH_CHECKS": db["CONN_HEALTH_CHECKS"],
    "pool": db["OPTIONS"].get("pool"),
}))
"""


def database_settings(entry="setup", database_url=POSTGRES, **env):
    """The default database's settings in a process started through `entry` ("setup": the
    loops and `manage.py`; "wsgi": the production web; "asgi": an ASGI server): (exit code,
    stderr, the settings)."""
    environ = environment(DATABASE_URL=database_url, **env)
    if "ALWAYSON_DB_POOL_SIZE" not in env:
        environ.pop("ALWAYSON_DB_POOL_SIZE", None)
    done = subprocess.run(
        [sys.executable, "-c", READ, entry],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    values = json.loads(done.stdout) if done.returncode == 0 else None
    return done.returncode, done.stderr.strip(), values


def test_without_a_pool_each_thread_keeps_its_connection_checked_before_reuse():
    for env in ({}, {"ALWAYSON_DB_POOL_SIZE": "0"}):
        code, stderr, values = database_settings(**env)

        assert code == 0, stderr
        assert values == {"CONN_MAX_AGE": 60, "CONN_HEALTH_CHECKS": True, "pool": None}

    code, stderr, values = database_settings(
        ALWAYSON_DB_POOL_SIZE="0", ALWAYSON_DB_CONN_MAX_AGE="0"
    )
    assert code == 0, stderr
    assert values == {"CONN_MAX_AGE": 0, "CONN_HEALTH_CHECKS": True, "pool": None}


def test_a_pool_size_gives_a_pool_of_that_size_checked_as_it_hands_a_connection_out():
    code, stderr, values = database_settings(
        ALWAYSON_DB_POOL_SIZE="7", ALWAYSON_INGEST_LOCK_WAIT="3"
    )

    assert code == 0, stderr
    assert values == {
        # Django's pool refuses persistent connections, and checks only under health checks.
        "CONN_MAX_AGE": 0,
        "CONN_HEALTH_CHECKS": True,
        # A request waits for a free connection as long as for its inbox's lock.
        "pool": {"min_size": 1, "max_size": 7, "timeout": 3.0},
    }


def test_the_production_web_serving_wsgi_keeps_a_connection_per_thread_and_no_pool():
    code, stderr, values = database_settings("wsgi")

    assert code == 0, stderr
    assert values == {"CONN_MAX_AGE": 60, "CONN_HEALTH_CHECKS": True, "pool": None}


def test_the_web_process_serving_asgi_pools_its_connections_by_default():
    code, stderr, values = database_settings("asgi")

    assert code == 0, stderr
    assert values["CONN_MAX_AGE"] == 0
    assert values["pool"] == {"min_size": 1, "max_size": 10, "timeout": 5.0}


def test_the_web_process_takes_the_pool_size_it_is_given():
    code, stderr, values = database_settings("asgi", ALWAYSON_DB_POOL_SIZE="4")
    assert code == 0, stderr
    assert values["pool"]["max_size"] == 4

    code, stderr, values = database_settings("asgi", ALWAYSON_DB_POOL_SIZE="0")
    assert code == 0, stderr
    assert (values["CONN_MAX_AGE"], values["pool"]) == (60, None)


@pytest.mark.parametrize("entry", ["setup", "asgi"])
def test_sqlite_has_no_pool(entry, tmp_path):
    code, stderr, values = database_settings(
        entry, database_url=f"sqlite:///{tmp_path / 'db.sqlite3'}", ALWAYSON_DB_POOL_SIZE="10"
    )

    assert code == 0, stderr
    assert values["pool"] is None


@pytest.mark.parametrize("value", ["-1", "ten", "1.5"])
@pytest.mark.parametrize("entry", ["setup", "asgi"])
def test_a_malformed_pool_size_stops_start_up_naming_the_variable(entry, value):
    code, stderr, _ = database_settings(entry, ALWAYSON_DB_POOL_SIZE=value)

    assert code == 1, stderr
    assert stderr.startswith("ImproperlyConfigured: ALWAYSON_DB_POOL_SIZE must be "), stderr
