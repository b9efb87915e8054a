"""The production process set, for real: `runall --production` on PostgreSQL starts gunicorn,
runworker, runscheduler and rundispatcher from alwayson/ops/processes.py (the commands the
Dockerfile, the compose file and the systemd units run: tests/ops/test_deploy.py), with DEBUG off
and the production HTTPS defaults, behind what a TLS-terminating proxy would add.

One chat message goes through it: log in, post "refund order 881", the refund desk asks, the
dispatcher posts its message to the inbox's webhook channel (a loopback server here), the owner
approves, the refund is announced. /healthz is ok while it runs, every loop process beats,
and SIGTERM stops everything cleanly, leaving each Process row stopped.
"""

import http.client
import json
import os
import re
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import alwayson
from alwayson.ops.models import Process
from alwayson.ops.processes import PROCESSES
from outbox.models import Channel
from tests.support.deploy import normalized
from tests.support.env import strong_key
from tests.support.outbox import WebhookServer
from tests.support.paths import ROOT as BASE_DIR
from tests.support.processes import child_pids, command_of, free_port
from tests.support.runall import START_TIMEOUT, Browser, Runall, assert_all_stop
from tests.support.workerrole import drop_role

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

DB_PASSWORD = "db-pw-" + secrets.token_hex(8)  # trust authentication ignores it
WORKER_PASSWORD = "worker-pw-" + secrets.token_hex(8)  # the worker role's: ignored the same
# The sealed worker's own role (roles are the cluster's: a name of this test run alone),
# made by the release step `workerrole` from ALWAYSON_WORKER_DATABASE_URL.
WORKER_ROLE = f"alwayson_worker_p{os.getpid()}_{secrets.token_hex(4)}"
MAIL_PASSWORD = "mail-pw-" + secrets.token_hex(8)
OWNER_PASSWORD = "owner-pw-" + secrets.token_hex(8)


def database_url(connection, user=None, password=DB_PASSWORD):
    db = connection.settings_dict
    return (
        f"postgres://{user or db['USER'] or 'postgres'}:{password}@{db['HOST'] or '127.0.0.1'}"
        f":{db['PORT'] or 5432}/{db['NAME']}"
    )


@pytest.fixture
def receiver(monkeypatch):
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    server = WebhookServer().start()
    yield server
    server.stop()


@pytest.fixture
def production_env(receiver, transactional_db):
    from django.db import connection

    yield {
        "DEBUG": "false",
        "SECRET_KEY": strong_key(),
        "DATABASE_URL": database_url(connection),
        "ALWAYSON_WORKER_DATABASE_URL": database_url(connection, WORKER_ROLE, WORKER_PASSWORD),
        # Never used (the channel is a webhook); its password must still never be printed.
        "EMAIL_URL": f"smtp+tls://mailer:{MAIL_PASSWORD}@127.0.0.1:{free_port()}",
        "ALLOWED_HOSTS": "127.0.0.1",
        "SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https",
        "ALWAYSON_HEARTBEAT_INTERVAL": "1",
        "WEB_CONCURRENCY": "1",
        "no_proxy": "127.0.0.1,localhost",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    drop_role(WORKER_ROLE)


@pytest.fixture
def desk(django_user_model, receiver, real_passwords):
    from inbox.models import Inbox

    owner = django_user_model.objects.create_user(username="owner", password=OWNER_PASSWORD)
    inbox = Inbox.objects.create(owner=owner, slug="desk", name="Refund desk")
    Channel.objects.create(inbox=inbox, kind=Channel.Kind.WEBHOOK, url=receiver.url())
    return inbox


@pytest.fixture
def runall_production(tmp_path, production_env, transactional_db):
    """Stopped (killed, after a failure) before the test database is flushed."""
    port = free_port()
    env = {**production_env, "ALWAYSON_SITE_URL": f"https://127.0.0.1:{port}"}
    server = Runall(tmp_path, port, args=["--production"], env=env)
    yield server
    server.stop()


def plain_get(port, path):
    """One request as a client would send it straight over http: (status, Location)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.getheader("Location")
    finally:
        connection.close()


def status_command(env):
    return subprocess.run(
        [sys.executable, str(BASE_DIR / "manage.py"), "status"],
        cwd=BASE_DIR,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def posted_texts(receiver):
    return [json.loads(post["body"])["text"] for post in receiver.posts()]


def test_the_production_set_serves_one_event_end_to_end_and_stops_cleanly(
    runall_production, desk, receiver, production_env
):
    runall = runall_production
    proxied = Browser(runall.url, behind_tls_proxy=True)

    # Up: the release steps ran, then the processes of alwayson/ops/processes.py.
    runall.wait_for("/healthz", lambda: proxied.answers("/healthz") == 200, START_TIMEOUT)
    runall.wait_for(
        "every child process", lambda: len(child_pids(runall.process.pid)) == len(PROCESSES)
    )
    runall.children = child_pids(runall.process.pid)
    started = sorted(normalized(command_of(pid).split()) for pid in runall.children)
    assert started == sorted(PROCESSES.values())
    assert "migrate: python manage.py migrate --noinput" in runall.output
    assert "collectstatic: python manage.py collectstatic --noinput" in runall.output

    status, _, body = proxied.get("/healthz")
    assert status == 200
    assert json.loads(body) == {
        "status": "ok",
        "version": alwayson.__version__,
        "checks": {"database": "ok", "worker": "ok", "scheduler": "ok", "dispatcher": "ok"},
        "durability": "ok",
    }

    # Straight over http, a page redirects to https; through the proxy it is served, with HSTS.
    assert plain_get(runall.port, "/accounts/login/") == (
        301,
        f"https://127.0.0.1:{runall.port}/accounts/login/",
    )
    status, _, html = proxied.get("/accounts/login/")
    assert status == 200
    hsts = proxied.last_headers["Strict-Transport-Security"]
    assert hsts == "max-age=31536000; includeSubDomains; preload"

    # Static files: collected under hashed names, served by whitenoise, cached for good.
    stylesheet = re.search(r'href="(/static/alwayson/site\.[0-9a-f]{12}\.css)"', html).group(1)
    status, _, css = proxied.get(stylesheet)
    assert status == 200 and "--accent" in css
    assert "immutable" in proxied.last_headers["Cache-Control"]
    status, _, html = proxied.get("/no-such-page/")
    assert status == 404 and "<h1>Page not found</h1>" in html and stylesheet in html

    # Log in and post the chat message (CSRF checked against the https origin).
    status, url, html = proxied.post_form(
        "/accounts/login/",
        {"username": "owner", "password": OWNER_PASSWORD, "next": "/inbox/desk/"},
    )
    assert (status, url) == (200, f"{runall.url}/inbox/desk/"), html[:300]
    message_id = re.search(r'name="message_id" value="([0-9a-f-]{36})"', html).group(1)
    status, _, html = proxied.post_form(
        "/inbox/desk/", {"message_id": message_id, "text": "refund order 881"}
    )
    assert status == 200 and "Sent." in html

    # The worker runs the refund desk; the dispatcher posts its question to the channel.
    approval = f"https://127.0.0.1:{runall.port}/approvals/desk/refund-881/"
    runall.wait_for("the question on the webhook channel", lambda: posted_texts(receiver))
    assert posted_texts(receiver) == [
        f"Refund order 881? Approve or deny within 4 hours: {approval}"
    ]
    status, _, html = proxied.post_form("/approvals/desk/refund-881/", {"answer": "yes"})
    assert status == 200 and "Approved." in html
    runall.wait_for("the refund announced", lambda: len(posted_texts(receiver)) == 2)
    assert posted_texts(receiver)[1] == "Refunded order 881, approved by owner"

    # Every loop process beats (once a second here); the worker's next beat counts both runs.
    def beating():
        rows = list(Process.objects.running().order_by("kind"))
        return len(rows) == 3 and all(row.last_beat > row.started for row in rows) and rows

    rows = runall.wait_for("a beat from each loop process", beating)
    assert [row.kind for row in rows] == ["dispatcher", "scheduler", "worker"]
    assert {row.pid for row in rows} <= set(runall.children)
    # The production set seals its worker (docs/how-to/egress.md#the-sealed-worker): what the
    # other processes hold, the worker's environment does not.
    worker_environ = Path(f"/proc/{Process.objects.get(kind='worker').pid}/environ").read_bytes()
    for secret in (MAIL_PASSWORD, DB_PASSWORD, production_env["SECRET_KEY"]):
        assert secret.encode() not in worker_environ
    assert b"ALWAYSON_SEALED_WORKER=1" in worker_environ
    # ... and it connects as its own role, which the release step made: the owner's URL is
    # not in its reach either.
    own_url = f"DATABASE_URL={production_env['ALWAYSON_WORKER_DATABASE_URL']}"
    assert own_url.encode() in worker_environ.split(b"\0")
    assert f"checked: {WORKER_ROLE} reaches what a run needs" in runall.output
    runall.wait_for(
        "the worker's two runs on its row",
        lambda: Process.objects.get(kind="worker").runs >= 2,
    )
    done = status_command(production_env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "healthy"

    # SIGTERM (what systemd and compose send): everything stops, each loop says goodbye.
    runall.process.send_signal(signal.SIGTERM)
    assert_all_stop(runall, runall.children)
    assert Process.objects.count() == 3
    assert not Process.objects.running().exists()
    done = status_command(production_env)
    assert done.returncode == 1
    assert "unhealthy: worker, scheduler, dispatcher failing" in done.stderr

    for secret in (DB_PASSWORD, WORKER_PASSWORD, MAIL_PASSWORD, production_env["SECRET_KEY"]):
        assert secret not in runall.output
