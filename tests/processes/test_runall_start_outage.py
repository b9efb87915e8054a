"""`runall`'s start-up waits out a database server it cannot reach, within a bound, as the loops
it then starts wait out any later outage, and so does the development server it starts
(devserver); a database that does not exist still stops it at once with its one line
(tests/processes/test_unusable_database.py).

A chaos run restarted `runall` while its network to PostgreSQL was silent: the start-up's
`migrate` timed out connecting and `runall` exited, a process that died on its own (seed
205856). The process test here replays that: `runall` behind a userspace TCP proxy that forwards
nothing until the test has seen it wait. A failover's chaos run (seed 974326) found the same in
runserver, which runall started for the web: its check of the migrations read the database once
and exited on the error, and runall stopped everything.
"""

import signal
import urllib.request
from contextlib import contextmanager

import pytest
from django.db import OperationalError, connection

from alwayson.ops.database import OutageBackoff, through_outage
from tests.support.processes import database_url, free_port, start_command, wait_for
from tests.support.runall import START_TIMEOUT, STOP_TIMEOUT, Runall
from tests.support.tcp_proxy import TcpProxy

REFUSED = OperationalError(
    'connection failed: connection to server at "127.0.0.1", port 5499 failed:'
    " Connection refused\n\tIs the server running on that host and accepting TCP/IP connections?"
)
MISSING = OperationalError(
    'connection failed: connection to server at "127.0.0.1", port 5432 failed:'
    ' FATAL:  database "nowhere" does not exist'
)


class Clock:
    """Monotonic time that moves only when the code under test sleeps."""

    def __init__(self):
        self.now = 0.0
        self.slept = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


def failing(times, error):
    """A start-up that raises `error` its first `times` tries (every try when None), then
    returns "started"; its tries counted in `.tries`."""

    def work():
        work.tries += 1
        if times is None or work.tries <= times:
            raise error
        return "started"

    work.tries = 0
    return work


@contextmanager
def silent_database():
    """A TCP proxy in front of the test database that accepts connections and answers
    nothing (connect_timeout runs out) until healed, and the environment of a process that
    reaches the database through it."""
    config = connection.settings_dict
    port = config["PORT"] or 5432
    with TcpProxy(config["HOST"] or "127.0.0.1", port) as proxy:
        proxy.blackhole()
        url = database_url().replace(f":{port}/", f":{proxy.port}/")
        yield proxy, {"DATABASE_URL": url, "ALWAYSON_DB_CONNECT_TIMEOUT": "2"}


def test_a_start_up_waits_out_an_unreachable_server_at_the_loops_delays():
    clock, said = Clock(), []
    work = failing(3, REFUSED)

    if connection.vendor == "sqlite":
        # No server to wait for: SQLite's errors are its file's, raised as they come.
        with pytest.raises(OperationalError):
            through_outage(work, 60, said.append, clock=clock, sleep=clock.sleep)
        assert work.tries == 1 and said == []
        return

    assert through_outage(work, 60, said.append, clock=clock, sleep=clock.sleep) == "started"

    assert work.tries == 4
    assert clock.slept == [0.5, 1.0, 2.0]
    assert said == [
        f"database unavailable (connection failed: connection to server at"
        f' "127.0.0.1", port 5499 failed: Connection refused); retrying in {delay}s'
        for delay in ("0.5", "1.0", "2.0")
    ]


@pytest.mark.postgres_only  # SQLite's raise at once: the test above
def test_a_start_up_gives_up_on_an_outage_longer_than_its_bound():
    clock, said = Clock(), []
    work = failing(None, REFUSED)

    with pytest.raises(OperationalError) as raised:
        through_outage(work, 10, said.append, clock=clock, sleep=clock.sleep)

    assert raised.value is REFUSED
    # 0.5 + 1 + 2 + 2 + 2 + 2 = 9.5 s waited; a seventh wait would pass the 10 s bound.
    assert clock.slept == [0.5, 1.0, 2.0, 2.0, 2.0, 2.0] and work.tries == 7
    assert len(said) == 6


def test_a_database_that_does_not_exist_is_raised_at_once_not_waited_for():
    clock, said = Clock(), []
    work = failing(None, MISSING)

    with pytest.raises(OperationalError) as raised:
        through_outage(work, 60, said.append, clock=clock, sleep=clock.sleep)

    assert raised.value is MISSING
    assert work.tries == 1 and clock.slept == [] and said == []


@pytest.mark.postgres_only  # a server to be cut off from
@pytest.mark.django_db(transaction=True)  # runall's children write to the test database
def test_runall_started_while_its_database_is_silent_waits_then_migrates_and_starts(tmp_path):
    with silent_database() as (proxy, env):
        runall = Runall(tmp_path, free_port(), env=env)
        try:
            runall.wait_for(
                "runall to say it waits for the database",
                lambda: "database unavailable" in runall.output,
                timeout=START_TIMEOUT,
            )
            proxy.heal()
            runall.wait_for(
                "runall to start its processes",
                lambda: "alwayson is running at" in runall.output,
                timeout=START_TIMEOUT,
            )
            assert f"retrying in {OutageBackoff.FIRST:.1f}s" in runall.output
            assert "Traceback" not in runall.output, runall.tail()

            runall.process.send_signal(signal.SIGTERM)
            assert runall.process.wait(timeout=STOP_TIMEOUT + 15) == 0, runall.tail()
        finally:
            runall.stop()


@pytest.mark.postgres_only  # a server to be cut off from
@pytest.mark.django_db(transaction=True)  # the server reads the test database's migrations
def test_the_development_server_started_while_its_database_is_silent_waits_then_serves(tmp_path):
    log = tmp_path / "devserver.log"
    port = free_port()
    with silent_database() as (proxy, env):
        server = start_command("devserver", ["--noreload", f"127.0.0.1:{port}"], log, env=env)
        try:
            wait_for(
                lambda: "database unavailable" in log.read_text() or server.poll() is not None,
                START_TIMEOUT,
                "devserver to say it waits for the database",
            )
            assert server.poll() is None, log.read_text()
            proxy.heal()

            def login_page():
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/accounts/login/") as r:
                        return r.status == 200
                except OSError:
                    assert server.poll() is None, log.read_text()
                    return False

            wait_for(login_page, START_TIMEOUT, "devserver to serve the login page")
            assert f"retrying in {OutageBackoff.FIRST:.1f}s" in log.read_text()
            assert "Traceback" not in log.read_text(), log.read_text()
        finally:
            server.terminate()
            server.wait(timeout=STOP_TIMEOUT)
