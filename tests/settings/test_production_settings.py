"""Production settings: HTTPS-only defaults once DEBUG is off (`check --deploy` has nothing to
say), development over plain http while it is on, strict parsing, error pages in the site's
look, and credentials that never reach a log line.

Settings are read once per process, so the defaults are checked in subprocesses with the
environment each case needs; the parsing helpers are called in-process.
"""

import json
import secrets
import signal
import subprocess
import sys
import time

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import RequestFactory
from django.views.defaults import server_error

from tests.support.env import check_deploy, environment, manage, strong_key
from tests.support.paths import ROOT as BASE_DIR
from tests.support.processes import free_port

SHOWN = (
    "DEBUG",
    "SECURE_SSL_REDIRECT",
    "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_HSTS_PRELOAD",
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "CSRF_TRUSTED_ORIGINS",
    "SECURE_PROXY_SSL_HEADER",
)


def settings_with(**overrides):
    """The HTTPS settings as a process started with this environment sees them."""
    script = (
        "import json, django; from django.conf import settings; django.setup(); "
        f"print(json.dumps({{name: getattr(settings, name) for name in {SHOWN!r}}}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=BASE_DIR,
        env=environment(**overrides),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# --- check --deploy ---------------------------------------------------------------------------


def production(**overrides):
    """DEBUG off, a real key, and a real mail server: Django 6.1's `check --deploy` counts
    the development default (the console) as an error, and no default can name a server."""
    return (
        environment(
            DEBUG="false",
            SECRET_KEY=strong_key(),
            EMAIL_URL="smtp+tls://mail.example.com:587",
            ALWAYSON_EGRESS_SOCKET="/run/alwayson/egress.sock",
        )
        | overrides
    )


def test_check_deploy_reports_nothing_with_debug_off_and_a_real_key():
    code, output = check_deploy(production())

    assert code == 0, output  # nothing reported, at any level


def test_check_deploy_names_what_an_operator_turned_off():
    code, output = check_deploy(production(SECURE_SSL_REDIRECT="off", SECURE_HSTS_SECONDS="0"))

    assert code != 0
    assert "security.W008" in output and "security.W004" in output


def test_check_deploy_names_a_worker_that_holds_the_credentials():
    code, output = check_deploy(production(ALWAYSON_EGRESS_SOCKET=""))

    assert code != 0
    assert "alwayson_egress.W001" in output and "ALWAYSON_EGRESS_SOCKET" in output


def test_debug_off_defaults_are_https_only():
    assert settings_with(DEBUG="false", SECRET_KEY=strong_key()) == {
        "DEBUG": False,
        "SECURE_SSL_REDIRECT": True,
        "SECURE_HSTS_SECONDS": 31536000,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
        "SECURE_HSTS_PRELOAD": True,
        "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True,
        "CSRF_TRUSTED_ORIGINS": [],
        "SECURE_PROXY_SSL_HEADER": None,
    }


def test_debug_on_keeps_development_over_plain_http():
    assert settings_with() == {
        "DEBUG": True,
        "SECURE_SSL_REDIRECT": False,
        "SECURE_HSTS_SECONDS": 0,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": False,
        "SECURE_HSTS_PRELOAD": False,
        "SESSION_COOKIE_SECURE": False,
        "CSRF_COOKIE_SECURE": False,
        "CSRF_TRUSTED_ORIGINS": [],
        "SECURE_PROXY_SSL_HEADER": None,
    }


def test_each_setting_is_read_from_the_environment():
    seen = settings_with(
        DEBUG="false",
        SECRET_KEY=strong_key(),
        SECURE_SSL_REDIRECT="no",
        SECURE_HSTS_SECONDS="3600",
        SECURE_HSTS_INCLUDE_SUBDOMAINS="0",
        SECURE_HSTS_PRELOAD="off",
        SESSION_COOKIE_SECURE="false",
        CSRF_COOKIE_SECURE="no",
        CSRF_TRUSTED_ORIGINS="https://a.example.com,https://b.example.com:8443",
        SECURE_PROXY_SSL_HEADER="HTTP_X_FORWARDED_PROTO,https",
    )

    assert seen == {
        "DEBUG": False,
        "SECURE_SSL_REDIRECT": False,
        "SECURE_HSTS_SECONDS": 3600,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": False,
        "SECURE_HSTS_PRELOAD": False,
        "SESSION_COOKIE_SECURE": False,
        "CSRF_COOKIE_SECURE": False,
        "CSRF_TRUSTED_ORIGINS": ["https://a.example.com", "https://b.example.com:8443"],
        "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"],  # a tuple, via JSON
    }


# --- strict parsing --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected", [("0", 0), ("31536000", 31536000), (" 60 ", 60), ("", 31536000)]
)
def test_hsts_seconds_is_a_whole_number(monkeypatch, value, expected):
    from alwayson.settings.env import non_negative_int

    monkeypatch.setenv("SECURE_HSTS_SECONDS", value)
    if value == "":
        monkeypatch.delenv("SECURE_HSTS_SECONDS")
    assert non_negative_int("SECURE_HSTS_SECONDS", 31536000) == expected


@pytest.mark.parametrize("value", ["-1", "a year", "1.5"])
def test_a_malformed_hsts_seconds_stops_start_up(monkeypatch, value):
    from alwayson.settings.env import non_negative_int

    monkeypatch.setenv("SECURE_HSTS_SECONDS", value)
    with pytest.raises(ImproperlyConfigured, match="SECURE_HSTS_SECONDS"):
        non_negative_int("SECURE_HSTS_SECONDS", 31536000)


@pytest.mark.parametrize(
    "value",
    [
        "X-Forwarded-Proto: https",
        "HTTP_X_FORWARDED_PROTO",
        "HTTP_X_FORWARDED_PROTO,",
        "X_FORWARDED_PROTO,https",
        "HTTP_X_FORWARDED_PROTO,https,http",
    ],
)
def test_a_malformed_proxy_ssl_header_stops_start_up(monkeypatch, value):
    from alwayson.settings.env import proxy_ssl_header

    monkeypatch.setenv("SECURE_PROXY_SSL_HEADER", value)
    with pytest.raises(ImproperlyConfigured, match="SECURE_PROXY_SSL_HEADER"):
        proxy_ssl_header("SECURE_PROXY_SSL_HEADER")


@pytest.mark.parametrize(
    "value", ["example.com", "https://example.com/", "https://example.com/app", "ftp://x.org"]
)
def test_a_trusted_origin_without_scheme_or_with_a_path_stops_start_up(monkeypatch, value):
    from alwayson.settings.env import trusted_origins

    monkeypatch.setenv("CSRF_TRUSTED_ORIGINS", value)
    with pytest.raises(ImproperlyConfigured, match="CSRF_TRUSTED_ORIGINS"):
        trusted_origins("CSRF_TRUSTED_ORIGINS")


@pytest.mark.parametrize(
    "name, value",
    [
        ("SECURE_SSL_REDIRECT", "maybe"),
        ("ALWAYSON_HEALTH_REQUIRE", "worker,cron"),
        ("ALWAYSON_HEARTBEAT_INTERVAL", "0"),
        ("ALWAYSON_DB_PREPARE", "sometimes"),
    ],
)
def test_a_malformed_module_level_setting_stops_start_up(name, value):
    done = manage("check", env=environment(**{name: value}))

    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and name in done.stderr


@pytest.mark.parametrize("value, prepare", [("true", True), ("off", False), ("", False)])
def test_alwayson_db_prepare_is_read_strictly(value, prepare):
    script = (
        "import json, django; from django.conf import settings; django.setup(); "
        "print(json.dumps(settings.ALWAYSON_DB_PREPARE))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=BASE_DIR,
        env=environment(ALWAYSON_DB_PREPARE=value),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) is prepare


def test_an_empty_health_requirement_checks_the_database_only():
    script = "import django; from django.conf import settings; django.setup(); " + (
        "print(settings.ALWAYSON_HEALTH_REQUIRE)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=BASE_DIR,
        env=environment(ALWAYSON_HEALTH_REQUIRE=""),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr


# --- error pages -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_missing_page_is_a_404_in_the_sites_look(client):
    response = client.get("/no-such-page/")

    html = response.content.decode()
    assert response.status_code == 404
    assert "<h1>Page not found</h1>" in html
    assert "alwayson/site.css" in html and 'class="bar"' in html
    assert "Using the URLconf" not in html  # not Django's technical page


def test_a_server_error_is_a_500_in_the_sites_look_without_details():
    response = server_error(RequestFactory().get("/"))

    html = response.content.decode()
    assert response.status_code == 500
    assert "<h1>Something went wrong</h1>" in html
    assert "alwayson/site.css" in html and 'class="bar"' in html
    assert "Traceback" not in html


# --- credentials never in a log line ---------------------------------------------------------

DB_PASSWORD = "db-pw-" + secrets.token_hex(8)
MAIL_PASSWORD = "mail-pw-" + secrets.token_hex(8)


def test_the_loop_commands_never_log_the_database_or_email_password(tmp_path):
    """At full verbosity, through start-up and a database outage (logged with tracebacks)."""
    env = environment(
        DATABASE_URL=f"postgres://alwayson:{DB_PASSWORD}@127.0.0.1:{free_port()}/alwayson",
        EMAIL_URL=f"smtp+tls://mailer:{MAIL_PASSWORD}@127.0.0.1:{free_port()}",
        PYTHONUNBUFFERED="1",
    )
    logs, processes = {}, {}
    for command in ("runworker", "runscheduler", "rundispatcher"):
        logs[command] = tmp_path / f"{command}.log"
        with open(logs[command], "wb") as out:
            processes[command] = subprocess.Popen(
                [sys.executable, str(BASE_DIR / "manage.py"), command, "-v", "2"],
                cwd=BASE_DIR,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def outage_logged(command):
        # Everything the asserts below look for: the worker's first "database unavailable"
        # (at start-up) comes before its loop logs the outage with its traceback.
        text = logs[command].read_text()
        return (
            "database unavailable" in text
            and "Traceback" in text
            and f"could not register {command[3:]}" in text
        )

    try:
        for command, process in processes.items():
            deadline = time.monotonic() + 30
            while not outage_logged(command):
                assert process.poll() is None, logs[command].read_text()
                assert time.monotonic() < deadline, logs[command].read_text()
                time.sleep(0.1)
        for process in processes.values():
            process.send_signal(signal.SIGTERM)
        for command, process in processes.items():
            assert process.wait(timeout=20) == 0, logs[command].read_text()
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)

    for command, log in logs.items():
        output = log.read_text()
        assert outage_logged(command), command
        assert DB_PASSWORD not in output, command
        assert MAIL_PASSWORD not in output, command
