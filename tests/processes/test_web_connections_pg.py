"""The production web process holds a bounded number of PostgreSQL sessions however many
requests it serves.

Under ASGI each request's sync view runs on a thread of its own; a connection kept per thread
(CONN_MAX_AGE) was one more open session per request served, and PostgreSQL refused clients
after about 80 webhooks. alwayson/asgi.py makes the process take its connections from a pool
(ALWAYSON_DB_POOL_SIZE, alwayson/settings/database.py). Here gunicorn runs exactly as
production starts it (alwayson/ops/processes.py) and takes signed GitHub deliveries from
several threads; its sessions, told apart by their application_name, are counted after each
batch, so a leak fails the test before it exhausts the shared cluster's connections. And a
pooled session PostgreSQL ended (a restart, a failover) is replaced, not handed to a request.
"""

import os
import secrets
import signal
import subprocess
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from alwayson.ops.processes import PROCESSES, local_argv
from tests.support.env import strong_key
from tests.support.paths import ROOT
from tests.support.processes import child_pids, database_url, free_port, is_gone, wait_for
from tests.support.webhooks import GITHUB_SECRET, github_headers

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

WORKERS = 2
POOL_SIZE = 10  # alwayson/asgi.py's default
# Each worker's budget: its pool, and the one LISTEN connection of its live pages' Hub
# (alwayson/web/live.py), opened by the first open page's stream.
SESSIONS_PER_WORKER = POOL_SIZE + 1
THREADS = 8
BATCH = 40
BATCHES = 8  # 320 deliveries
START_TIMEOUT = 60
STOP_TIMEOUT = 20


@pytest.fixture
def web(tmp_path):
    """The production web command on the test database; stopped by its pid at teardown."""
    port = free_port()
    application_name = f"poolconn-web-{secrets.token_hex(4)}"
    env = {key: value for key, value in os.environ.items() if key != "ALWAYSON_DB_POOL_SIZE"}
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    env.update(
        DEBUG="false",
        SECRET_KEY=strong_key(),
        SECURE_SSL_REDIRECT="false",
        ALLOWED_HOSTS="127.0.0.1",
        DATABASE_URL=database_url(),
        DJANGO_SETTINGS_MODULE="alwayson.settings",
        ALWAYSON_GITHUB_SECRETS=GITHUB_SECRET,
        ALWAYSON_APPLICATION_NAME=application_name,
        ALWAYSON_WEB_BIND=f"127.0.0.1:{port}",
        WEB_CONCURRENCY=str(WORKERS),
        PYTHONUNBUFFERED="1",
        no_proxy="127.0.0.1,localhost",
        NO_PROXY="127.0.0.1,localhost",
    )
    log_path = tmp_path / "web.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            local_argv(PROCESSES["web"], ROOT),
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server.url = f"http://127.0.0.1:{port}"
    server.application_name = application_name
    server.log = log_path.read_text
    try:
        wait_for(lambda: serving(server), START_TIMEOUT, "gunicorn to answer /healthz")
        assert server.poll() is None, server.log()
        yield server
    finally:
        stop(server)


def serving(server):
    if server.poll() is not None:
        return True  # exited: the fixture says so with its log
    try:
        urllib.request.urlopen(server.url + "/healthz", timeout=2).close()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def stop(server):
    workers = child_pids(server.pid)
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(STOP_TIMEOUT)
    for pid in workers:
        if not is_gone(pid):
            os.kill(pid, signal.SIGKILL)


def deliver(server, slug, key):
    body = b'{"action": "opened", "issue": {"number": 1}}'
    headers = {"Content-Type": "application/json", **github_headers(body, delivery=key)}
    request = urllib.request.Request(
        f"{server.url}/hooks/github/{slug}/", data=body, headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def sessions(application_name):
    """The server's sessions: their backends' pids."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", [application_name]
        )
        return [pid for (pid,) in cursor.fetchall()]


def deliveries(threads, web, slugs, batch):
    """BATCH deliveries spread over the inboxes, sent at once: their statuses."""
    keys = [f"delivery-{batch}-{n}" for n in range(BATCH)]
    return list(threads.map(deliver, [web] * BATCH, slugs * (BATCH // THREADS), keys))


def test_the_web_process_keeps_its_sessions_within_its_pools_however_many_requests(web, make_inbox):
    from inbox.models import Event

    slugs = [make_inbox(f"hooks-{n}").slug for n in range(THREADS)]
    bound = WORKERS * SESSIONS_PER_WORKER
    statuses, counts = [], []
    with ThreadPoolExecutor(THREADS) as threads:
        for batch in range(BATCHES):
            statuses += deliveries(threads, web, slugs, batch)
            counts.append(len(sessions(web.application_name)))
            # A leak is stopped here, long before max_connections (other tests share it).
            assert counts[-1] <= bound, (counts, web.log()[-2000:])

    assert statuses == [202] * BATCH * BATCHES, web.log()[-2000:]
    assert Event.objects.count() == BATCH * BATCHES
    assert 0 < counts[-1] <= bound, counts


def test_a_pooled_session_the_server_ended_is_replaced_before_a_request_gets_it(web, make_inbox):
    """What a PostgreSQL restart or a failover does to every idle connection in the pools."""
    slugs = [make_inbox(f"hooks-{n}").slug for n in range(THREADS)]
    with ThreadPoolExecutor(THREADS) as threads:
        assert deliveries(threads, web, slugs, "before") == [202] * BATCH, web.log()[-2000:]
        ended = sessions(web.application_name)
        assert ended
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s) AS pid", [ended])
        wait_for(
            lambda: not set(ended) & set(sessions(web.application_name)),
            10,
            "the server to end the pools' sessions",
        )
        after = deliveries(threads, web, slugs, "after")

    assert after == [202] * BATCH, web.log()[-3000:]
