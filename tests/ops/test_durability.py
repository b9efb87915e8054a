"""Whether the database can lose a commit it acknowledged: the verdict, and where it is said
(check --deploy, /healthz, `status`, the metrics). Against real replication on a cluster of
the test's own: pg_receivewal streams from it as a standby would, asynchronously until
synchronous_standby_names lists it."""

import subprocess
import time
from io import StringIO

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from alwayson.ops import durability, metrics
from alwayson.ops.checks import check_durability
from tests.chaos.cluster import Cluster


@pytest.fixture(autouse=True)
def fresh_verdict(monkeypatch):
    monkeypatch.setattr(durability, "_cached", (float("-inf"), None))


def test_commits_flushed_and_no_standby_lose_nothing():
    assert durability.assess("on", {}).status == durability.OK
    assert durability.assess("remote_apply", {}).status == durability.OK


@pytest.mark.parametrize("setting", ["off", "local", "remote_write"])
def test_synchronous_commit_below_on_is_at_risk_and_says_so(setting):
    found = durability.assess(setting, {})

    assert found.status == durability.AT_RISK
    assert f"synchronous_commit is {setting}" in found.reasons[0]


def test_an_asynchronous_or_potential_standby_is_at_risk_and_named():
    found = durability.assess("on", {"east": "sync", "west": "async", "north": "potential"})

    assert found.status == durability.AT_RISK
    assert found.asynchronous == ["north", "west"]
    assert "north, west" in found.reasons[0]


def test_synchronous_and_quorum_standbys_lose_nothing():
    assert durability.assess("on", {"east": "sync", "west": "quorum"}).status == durability.OK


def test_a_standby_whose_state_is_hidden_is_unknown_and_says_what_to_grant():
    found = durability.assess("on", {"east": None})

    assert found.status == durability.UNKNOWN
    assert "pg_monitor" in found.reasons[0]


@pytest.mark.django_db
def test_the_test_database_loses_nothing_and_the_deploy_check_is_quiet():
    # SQLite has no replication to judge; the shared PostgreSQL commits on, with no standby.
    if connection.vendor == "postgresql":
        assert durability.read().status == durability.OK
    else:
        assert durability.read().status == durability.EMBEDDED
    assert check_durability(None) == []


@pytest.mark.postgres_only
@pytest.mark.django_db
def test_a_connection_that_commits_locally_is_at_risk_everywhere_it_is_reported(client):
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit TO local")

    [warning] = check_durability(None)
    assert warning.id == "alwayson_ops.W001" and "synchronous_commit is local" in warning.msg
    response = client.get("/healthz")
    assert response.json()["durability"] == "at_risk"
    assert response.json()["checks"]["database"] == "ok"  # a warning, not an outage
    out = StringIO()
    with pytest.raises(CommandError):  # no loop process runs here: unhealthy, but it printed
        call_command("status", stdout=out)
    assert "durability\tat_risk" in out.getvalue()
    assert "synchronous_commit is local" in out.getvalue()
    families = {
        family.name: family
        for family in text_string_to_metric_families(metrics.exposition().decode())
    }
    assert families["alwayson_database_at_risk"].samples[0].value == 1


def test_the_verdict_is_read_at_most_once_a_minute_per_process(monkeypatch):
    reads = []
    monkeypatch.setattr(durability, "read", lambda: reads.append(1) or durability.Durability("ok"))
    now = [1000.0]

    durability.cached(lambda: now[0])
    now[0] += durability.CACHE_SECONDS - 1
    durability.cached(lambda: now[0])
    assert len(reads) == 1
    now[0] += 1
    durability.cached(lambda: now[0])
    assert len(reads) == 2


# --- real replication, on a cluster of the test's own -----------------------------------------


@pytest.fixture(scope="module")
def primary():
    with Cluster.create() as cluster:
        yield cluster


def receivewal(cluster, tmp_path, name):
    """A standby as the primary sees one: a walsender streaming WAL to `name`, which
    flushes and reports at once (--synchronous), so it can be a synchronous standby."""
    binary = f"/usr/lib/postgresql/{cluster.version}/bin/pg_receivewal"
    process = subprocess.Popen(
        [binary, "-D", str(tmp_path), "--synchronous", "--no-password", "-d",
         f"host=127.0.0.1 port={cluster.port} user=postgres application_name={name}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    return process


def verdict_when(cluster, ready) -> durability.Durability:
    deadline = time.monotonic() + 30
    with psycopg.connect(cluster.url("postgres"), autocommit=True) as conn:
        while True:
            found = durability.read(conn)
            if ready(found) or time.monotonic() > deadline:
                return found
            time.sleep(0.1)


def set_system(cluster, **values):
    with psycopg.connect(cluster.url("postgres"), autocommit=True) as conn:
        for name, value in values.items():
            conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        conn.execute("SELECT pg_reload_conf()")


@pytest.mark.postgres_only  # a cluster of its own, once: on the PostgreSQL lane
def test_a_streaming_standby_is_at_risk_until_it_is_synchronous(primary, tmp_path):
    assert verdict_when(primary, lambda found: True).status == durability.OK
    standby = receivewal(primary, tmp_path, "west")
    try:
        found = verdict_when(primary, lambda found: found.standbys)
        assert found.status == durability.AT_RISK, (
            standby.stderr.read1() if standby.poll() else found
        )
        assert found.asynchronous == ["west"]

        set_system(primary, synchronous_standby_names="west")
        found = verdict_when(primary, lambda found: found.status != durability.AT_RISK)
        assert found.status == durability.OK and found.standbys == {"west": "sync"}

        # Listed, but commits no longer wait for it.
        set_system(primary, synchronous_commit="local")
        found = verdict_when(primary, lambda found: found.status != durability.OK)
        assert found.status == durability.AT_RISK
        assert found.reasons[0].startswith("synchronous_commit is local")
    finally:
        standby.terminate()
        standby.wait(10)
        set_system(primary, synchronous_standby_names="", synchronous_commit="on")
