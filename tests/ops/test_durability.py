"""Whether the database can lose a commit it acknowledged: the verdict, and where it is said
(check --deploy, /healthz, `status`, the metrics). Against real replication on a cluster of
the test's own: pg_receivewal streams from it as a standby would, asynchronously until
synchronous_standby_names lists it."""

import subprocess
import threading
import time
from io import StringIO

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from alwayson.ops import durability, metrics
from alwayson.ops.checks import check_durability
from inbox.backends import postgresql
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


# --- a commit waiting for a synchronous standby that does not answer ----------------------------

# A client's cancel of the commit's wait, this long after the commit was sent: PostgreSQL's
# only way to end the wait short of the standby (the lease's statement_timeout, much shorter,
# does not reach it).
CANCEL_AFTER = 1.0
LEASE_BOUND = "50ms"


def commit_cancelled_after(conn, seconds, commit):
    """Seconds `commit` (a function of `conn`) took, cancelled after `seconds`."""
    canceller = threading.Timer(seconds, conn.cancel)
    sent = time.monotonic()
    canceller.start()
    try:
        commit(conn)
    finally:
        canceller.cancel()
    return time.monotonic() - sent


def standby_gone(cluster):
    """A synchronous standby listed that is not connected (stopped, or cut off): every commit
    waits for it. Returns once one does (the server applies the setting on its own time)."""
    with psycopg.connect(cluster.url("postgres"), autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS probe (n int)")
        conn.execute("CREATE TABLE IF NOT EXISTS finished (how text)")
    set_system(cluster, synchronous_standby_names="gone")
    heard = []
    deadline = time.monotonic() + 30
    with psycopg.connect(cluster.url("postgres"), autocommit=True) as conn:
        conn.add_notice_handler(lambda diag: heard.append(diag.message_primary))
        while not heard and time.monotonic() < deadline:
            commit_cancelled_after(conn, 0.2, probe)
    assert heard, "commits never waited for the listed standby"


def probe(conn):
    conn.execute("INSERT INTO probe VALUES (1)")


def lease_bounded_explicit(conn):
    """A lease transaction as lease_statements() makes one: BEGIN, the bound, a write, COMMIT."""
    with conn.transaction():
        conn.execute(postgresql.STATEMENT_TIMEOUT, {"statement_timeout": LEASE_BOUND})
        conn.execute("INSERT INTO finished VALUES ('explicit')")


def lease_bounded_pipeline(conn):
    """A lease transaction as take_next's pipeline makes one: the bound and a write, one
    implicit transaction committed at the Sync."""
    with conn.pipeline():
        conn.execute(postgresql.BY_INDEX_LEASE, {"statement_timeout": LEASE_BOUND})
        conn.execute("INSERT INTO finished VALUES ('pipeline')")


@pytest.mark.postgres_only  # a cluster of its own, once: on the PostgreSQL lane
@pytest.mark.parametrize("commit", [lease_bounded_explicit, lease_bounded_pipeline])
def test_a_lease_bounded_commit_waits_for_the_synchronous_standby_and_a_cut_wait_is_loud(
    primary, commit, caplog
):
    try:
        standby_gone(primary)
        with psycopg.connect(primary.url("postgres"), autocommit=True) as conn:
            postgresql.watch_commits(conn)
            with caplog.at_level("ERROR", logger="alwayson.durability"):
                took = commit_cancelled_after(conn, CANCEL_AFTER, commit)
            # Not cut at the lease's bound: the commit waited until it was cancelled.
            assert took >= CANCEL_AFTER
            # PostgreSQL then answers success: committed here, not on the standby...
            how = commit.__name__.removeprefix("lease_bounded_")
            found = conn.execute("SELECT count(*) FROM finished WHERE how = %s", [how]).fetchone()
            assert found == (1,)
            # ...and says so only in a WARNING, which alwayson logs and keeps for the finish.
            [record] = caplog.records
            assert "a failover may lose it" in record.getMessage()
            assert "synchronous replication" in postgresql._unreplicated[conn]
    finally:
        set_system(primary, synchronous_standby_names="")
