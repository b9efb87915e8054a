"""Sentry: with SENTRY_DSN set, an exception in a view and a dead event's ERROR line reach
Sentry (here a loopback server on 127.0.0.1 standing in for it), and no secret of the
process does: not the egress credentials, not secret-looking variables, not a database
password, wherever they show up (messages, local variables, breadcrumbs).

The SDK is started in-process with the DSN pointing at the loopback server, and stopped
(a client without a DSN) afterwards. A DSN set without the SDK installed stops start-up.
"""

import gzip
import json
import logging
import os
import subprocess
import sys

import pytest
import sentry_sdk
from django.http import HttpResponse
from django.test import Client
from django.urls import path

from alwayson import urls as project_urls
from alwayson.egress.services import check_services
from alwayson.ops.sentry import FILTERED, init_sentry
from tests.support.events import claim, out_of_attempts
from tests.support.loopback import Loopback
from tests.support.paths import ROOT as BASE_DIR

# Under a secret-looking name: masked wherever its value appears.
BOT_TOKEN = "xoxb-bot-token-value-4711"
# Under an innocent name, which an egress service names as where its credential is.
EGRESS_CREDENTIAL = "egress-credential-value-0815"
DB_PASSWORD = "db-password-9911"


def leaky_view(request):
    header_value = f"Bearer {os.environ['PAYMENTS_CRED']}"
    bot = os.environ["ALWAYSON_SLACK_BOT_TOKEN"]
    raise RuntimeError(
        f"payments refused {header_value} (bot {bot}) via "
        f"postgres://alwayson:{DB_PASSWORD}@db.internal/alwayson"
    )


def fine_view(request):
    return HttpResponse("ok")


urlpatterns = [path("leaky/", leaky_view), path("fine/", fine_view), *project_urls.urlpatterns]


def envelopes(server):
    """The envelopes the SDK sent: each as its decoded text."""
    sentry_sdk.flush(timeout=10)
    texts = []
    for request in server.requests:
        body = request["body"]
        if request["headers"].get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        texts.append(body.decode())
    return texts


def events(texts):
    """The `event` items of the envelopes (header line, then item header and payload pairs)."""
    found = []
    for text in texts:
        lines = text.splitlines()[1:]
        for header, payload in zip(lines[::2], lines[1::2], strict=False):
            if json.loads(header).get("type") == "event":
                found.append(json.loads(payload))
    return found


@pytest.fixture
def sentry(monkeypatch, settings):
    monkeypatch.setenv("ALWAYSON_SLACK_BOT_TOKEN", BOT_TOKEN)
    monkeypatch.setenv("PAYMENTS_CRED", EGRESS_CREDENTIAL)
    settings.ALWAYSON_EGRESS_SERVICES = check_services(
        {"payments": {"base_url": "https://pay.example.com", "secret_env": "PAYMENTS_CRED"}}
    )
    settings.ROOT_URLCONF = __name__
    with Loopback() as server:
        init_sentry(f"http://publickey@127.0.0.1:{server.port}/42", "test", "alwayson@test")
        try:
            yield server
        finally:
            sentry_sdk.flush(timeout=10)
            # A client without a DSN or integrations: nothing more is sent, and the SDK's
            # patches of Django and logging pass straight through for the tests after.
            sentry_sdk.init(default_integrations=False, auto_enabling_integrations=False)


@pytest.mark.django_db
def test_an_exception_in_a_view_reaches_sentry_without_its_secrets(sentry):
    client = Client(raise_request_exception=False)
    client.cookies["theme"] = "a-cookie-value"
    assert client.get("/fine/").status_code == 200
    assert client.get("/leaky/").status_code == 500

    texts = envelopes(sentry)
    [event] = events(texts)
    [exception] = event["exception"]["values"]
    assert exception["type"] == "RuntimeError"
    assert exception["value"] == (
        f"payments refused Bearer {FILTERED} (bot {FILTERED}) via "
        f"postgres://alwayson:{FILTERED}@db.internal/alwayson"
    )
    assert (event["environment"], event["release"]) == ("test", "alwayson@test")
    assert event["transaction"] == "/leaky/"
    frame = exception["stacktrace"]["frames"][-1]
    assert frame["function"] == "leaky_view"
    assert frame["vars"]["header_value"] == f"'Bearer {FILTERED}'"
    # No personal data either: neither the cookie nor the client's address.
    assert "cookies" not in event["request"]
    assert "REMOTE_ADDR" not in event["request"].get("env", {})
    for text in texts:
        for secret in (BOT_TOKEN, EGRESS_CREDENTIAL, DB_PASSWORD, "a-cookie-value"):
            assert secret not in text


@pytest.mark.django_db
def test_a_dead_event_reaches_sentry_as_an_error_without_its_secrets(
    sentry, inbox, t0, django_capture_on_commit_callbacks
):
    error = f"Traceback ...\nPermissionError: payments refused {EGRESS_CREDENTIAL}"
    out_of_attempts(inbox, "m1", now=t0, error=error)

    with django_capture_on_commit_callbacks(execute=True):
        claim(inbox, t0)

    texts = envelopes(sentry)
    [event] = events(texts)
    assert (event["level"], event["logger"]) == ("error", "alwayson.events")
    assert event["logentry"]["formatted"] == (
        "event went dead: inbox=desk source=chat key=m1 attempts=3"
        f" last error: PermissionError: payments refused {FILTERED}"
    )
    assert event["extra"]["source_id"] == "m1"
    for text in texts:
        assert EGRESS_CREDENTIAL not in text


def item_types(texts):
    """The type of every item of the envelopes."""
    types = []
    for text in texts:
        lines = text.splitlines()[1:]
        types += [json.loads(header).get("type") for header in lines[::2]]
    return types


@pytest.mark.django_db
def test_log_lines_reach_sentry_as_breadcrumbs_of_an_error_never_as_logs_of_their_own(sentry):
    """sentry-sdk 3.0 would send every INFO line as one of its logs unless told not to."""
    logger = logging.getLogger("alwayson.events")
    logger.info("claimed event m0 for inbox desk")
    logger.warning("retrying a send to payments")
    logger.error("event went dead: inbox=desk")

    texts = envelopes(sentry)
    assert "log" not in item_types(texts)
    [event] = events(texts)
    crumbs = [crumb["message"] for crumb in event["breadcrumbs"]["values"]]
    assert crumbs[-2:] == ["claimed event m0 for inbox desk", "retrying a send to payments"]


def test_a_dsn_without_the_sdk_installed_stops_start_up_saying_what_to_install():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENTRY_")}
    env.update(DJANGO_SETTINGS_MODULE="alwayson.settings", SENTRY_DSN="http://key@127.0.0.1:9/1")
    # The SDK made unimportable, as in an install without the `sentry` extra.
    script = "import sys; sys.modules['sentry_sdk'] = None; import django; django.setup()"
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode != 0
    assert "ImproperlyConfigured: SENTRY_DSN is set but the Sentry SDK is not installed" in (
        done.stderr
    )
    assert "pip install 'alwayson[sentry]'" in done.stderr
