"""A bad setting stops `manage.py` with one line saying what to set and exit status 1, not a
traceback through Django's start-up; `--traceback` still shows it, and the web process
(anything importing alwayson.wsgi) still fails with the whole of it.

Each case is a fresh process with only the variables it gives, as a clean shell starts it.
"""

import subprocess

import pytest

from alwayson.ops.processes import PROCESSES, local_argv
from tests.support.env import environment, manage
from tests.support.paths import ROOT

SECRET_KEY_HINT = (
    "ImproperlyConfigured: SECRET_KEY is not set: with DEBUG off, set SECRET_KEY to a long"
    ' random value (python -c "import secrets; print(secrets.token_urlsafe(50))")'
)


def test_a_missing_secret_key_with_debug_off_is_one_line_saying_what_to_set():
    done = manage("check", env=environment(DEBUG="false"))

    assert done.returncode == 1
    assert done.stderr.strip() == SECRET_KEY_HINT
    assert done.stdout == ""


@pytest.mark.parametrize(
    "name, value, says",
    [
        ("ALWAYSON_LEASE_TTL", "two minutes", "ALWAYSON_LEASE_TTL must be an integer"),
        ("DEBUG", "maybe", "DEBUG must be one of true/false"),
        (
            "ALWAYSON_RETAIN_EVENT_KEYS",
            "1000000",
            "ALWAYSON_RETAIN_EVENT_KEYS must be from 7 to 3650 days, not 1000000",
        ),
        (
            "ALWAYSON_WORKER_DATABASE_URL",
            "sqlite:////tmp/worker.sqlite3",
            "ALWAYSON_WORKER_DATABASE_URL must be a postgres:// URL with a user",
        ),
        # Checked by the egress app's ready(), past the settings import.
        ("ALWAYSON_EGRESS_SERVICES", '{"payments": 1}', "ALWAYSON_EGRESS_SERVICES"),
        # The Claude app's ready().
        (
            "ALWAYSON_CLAUDE_PRICES",
            '{"claude-sonnet-4-5": {"input": 3, "output": 15, "cache_read": -1, "cache_write": 4}}',
            "ALWAYSON_CLAUDE_PRICES: claude-sonnet-4-5.cache_read must be 0 or more, not -1",
        ),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(name, value, says):
    done = manage("check", env=environment(**{name: value}))

    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("ImproperlyConfigured: ") and says in line, line


def test_the_workers_own_database_url_is_refused_beside_sqlite(tmp_path):
    env = environment(
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        ALWAYSON_WORKER_DATABASE_URL="postgres://worker@127.0.0.1:5432/alwayson",
    )
    done = manage("check", env=env)

    assert done.returncode == 1
    assert done.stderr.strip() == (
        "ImproperlyConfigured: ALWAYSON_WORKER_DATABASE_URL is for PostgreSQL: DATABASE_URL "
        "is not (SQLite has no roles; unset it)"
    )


def test_traceback_shows_where_a_bad_setting_was_raised():
    done = manage("check", "--traceback", env=environment(DEBUG="false"))

    assert done.returncode != 0
    assert "Traceback (most recent call last)" in done.stderr
    assert 'alwayson/settings/base.py", line' in done.stderr
    assert done.stderr.strip().endswith(
        SECRET_KEY_HINT.replace(
            "ImproperlyConfigured", "django.core.exceptions.ImproperlyConfigured"
        )
    )


def test_the_web_process_still_fails_loudly_on_a_bad_setting():
    # gunicorn as deployed, loading the application and stopping (--check-config).
    program, *args = local_argv(PROCESSES["web"], ROOT)
    done = subprocess.run(
        [program, "--check-config", *args],
        cwd=ROOT,
        env=environment(DEBUG="false"),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode != 0
    assert "Traceback (most recent call last)" in done.stderr
    assert "SECRET_KEY is not set" in done.stderr.strip().splitlines()[-1]


FORGOTTEN = (
    " is not set, and alwayson's apps read it: add `from alwayson.settings.embedded import *`"
    " to your settings, before your own values of alwayson's settings"
    " (docs/how-to/embed-in-a-project.md)"
)


@pytest.mark.parametrize(
    "label, name",
    [
        ("inbox", "ALWAYSON_GITHUB_SECRETS"),
        ("inbox", "ALWAYSON_WEBHOOK_INBOX_SECRETS"),
        ("outbox", "ALWAYSON_OUTBOX_SIGNING_SECRETS"),
        ("alwayson_egress", "ALWAYSON_EGRESS_SERVICES"),
        ("alwayson_ops", "SENTRY_DSN"),
        ("alwayson_claude", "ALWAYSON_CLAUDE_POLICY"),
    ],
)
def test_an_app_reading_a_setting_the_project_lacks_says_how_to_take_alwayson_s(
    settings, label, name
):
    from django.apps import apps
    from django.core.exceptions import ImproperlyConfigured

    delattr(settings, name)

    with pytest.raises(ImproperlyConfigured) as raised:
        apps.get_app_config(label).ready()
    assert str(raised.value) == name + FORGOTTEN
