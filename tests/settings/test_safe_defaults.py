"""Safe defaults and loud faults: the development key is one Django's checks flag, credentials
stay off debug pages, and login and password reset are throttled.

Start-up behaviour is tested in a fresh `manage.py` process with only the variables a test
gives it, as a clean shell would start it.
"""

import os
import subprocess
import sys
from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.contrib.auth import SESSION_KEY
from django.test import Client
from django.urls import path

from alwayson.web.models import PasswordResetRequest
from tests.support.paths import ROOT


def manage(*args, **env):
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def shell(code, **env):
    result = manage("shell", "-v", "0", "-c", f"from django.conf import settings; {code}", **env)
    return result.returncode, (result.stdout + result.stderr).strip()


# --- the development key and start-up ------------------------------------------------------


def test_with_no_environment_debug_is_on_and_check_deploy_flags_the_development_key():
    assert shell("print(settings.DEBUG, settings.SECRET_KEY[:16])") == (0, "True django-insecure-")
    result = manage("check", "--deploy")
    assert "security.W009" in result.stdout + result.stderr


def test_without_debug_a_secret_key_is_required():
    code, output = shell("print(settings.DEBUG)", DEBUG="false")
    assert code != 0
    assert "SECRET_KEY is not set: with DEBUG off, set SECRET_KEY" in output
    assert shell("print(settings.DEBUG)", DEBUG="false", SECRET_KEY="k" * 50) == (0, "False")


def test_the_largest_body_follows_the_views_limits_and_stays_in_memory():
    """The web refuses a body past ALWAYSON_REQUEST_MAX_BYTES before reading it
    (alwayson/web/serving.py): the largest any view accepts. An upload up to it stays in
    memory, not in a temporary file."""
    read = (
        "print(settings.ALWAYSON_REQUEST_MAX_BYTES, settings.FILE_UPLOAD_MAX_MEMORY_SIZE,"
        " settings.DATA_UPLOAD_MAX_MEMORY_SIZE)"
    )
    forms = 2621440  # Django's DATA_UPLOAD_MAX_MEMORY_SIZE
    assert shell(read) == (0, f"{forms} {forms} {forms}")
    eight_mib = 8 * 1024 * 1024
    assert shell(read, ALWAYSON_WEBHOOK_MAX_BYTES=str(eight_mib)) == (
        0,
        f"{eight_mib} {eight_mib} {forms}",
    )


def test_throttle_settings_come_from_the_environment():
    code, output = shell(
        "print(settings.AXES_FAILURE_LIMIT, settings.AXES_COOLOFF_TIME,"
        " settings.ALWAYSON_PASSWORD_RESET_LIMIT)",
        ALWAYSON_LOGIN_FAILURE_LIMIT="7",
        ALWAYSON_LOGIN_COOLOFF="60",
        ALWAYSON_PASSWORD_RESET_LIMIT="2",
    )
    assert (code, output) == (0, "7 0:01:00 2")
    for name in ("ALWAYSON_LOGIN_FAILURE_LIMIT", "ALWAYSON_LOGIN_COOLOFF"):
        code, output = shell("print(settings.DEBUG)", **{name: "0"})
        assert code != 0 and f"{name} must be a positive integer" in output


# --- debug pages -------------------------------------------------------------------------------


def boom(request):
    raise RuntimeError("boom")


urlpatterns = [path("boom/", boom)]

# Built, not written out: the debug page quotes the source lines around `boom` above.
PASSWORD = "-".join(["hunter2", "do", "not", "show"])


@pytest.mark.django_db
def test_the_debug_page_shows_no_password_from_database_url_or_email_url(settings):
    settings.DEBUG = True
    settings.ROOT_URLCONF = __name__
    # Any setting that holds a URL with a password is masked too, whatever its name.
    settings.ALWAYSON_BROKER = f"redis://:{PASSWORD}@cache:6379/0"
    client = Client(raise_request_exception=False)

    # runserver (wsgiref) copies the process environment into every request's META, which the
    # debug page lists: DATABASE_URL and EMAIL_URL with it.
    response = client.get(
        "/boom/",
        DATABASE_URL=f"postgres://alwayson:{PASSWORD}@db.internal:5432/alwayson",
        EMAIL_URL=f"smtp+tls://mailer:{PASSWORD}@smtp.internal:587",
        SENTRY_DSN=f"https://public:{PASSWORD}@sentry.internal/1",
    )

    assert response.status_code == 500
    html = response.content.decode()
    assert "RuntimeError" in html and "DATABASE_URL" in html and "EMAIL_URL" in html
    assert PASSWORD not in html
    assert "cache:6379" in html  # masked, not dropped: the rest of a URL still helps


# --- login throttling --------------------------------------------------------------------------


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user(
        "owner", email="owner@example.com", password="pw-owner-123", is_staff=True
    )


def log_in(client, password, url="/accounts/login/"):
    return client.post(url, {"username": "owner", "password": password})


def logged_in(client):
    return SESSION_KEY in client.session


@pytest.mark.django_db
def test_after_the_limit_of_wrong_passwords_the_right_one_is_refused_with_the_reason(
    settings, user
):
    client = Client()
    limit = settings.AXES_FAILURE_LIMIT
    assert limit == 5  # the default
    for _ in range(limit - 1):
        assert log_in(client, "wrong").status_code == 200
    assert log_in(client, "pw-owner-123").status_code == 302  # under the limit: in
    client.logout()

    for _ in range(limit):
        log_in(client, "wrong")
    refused = log_in(client, "pw-owner-123")

    assert refused.status_code == 429
    assert "Too many failed logins" in refused.content.decode()
    assert "15 minutes" in refused.content.decode()
    assert not logged_in(client)
    # The admin's login is the same gate, and another client is refused as well.
    other = Client()
    assert log_in(other, "pw-owner-123", "/admin/login/").status_code == 429
    assert not logged_in(other)


@pytest.mark.django_db
def test_the_lockout_ends_after_the_cool_off(settings, user):
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        log_in(client, "wrong")
    assert log_in(client, "pw-owner-123").status_code == 429

    # Move the failures back past the cool-off instead of waiting for it.
    cool_off = settings.AXES_COOLOFF_TIME
    for attempt in AccessAttempt.objects.all():
        attempt.attempt_time -= cool_off + timedelta(seconds=1)
        attempt.save()

    assert log_in(client, "pw-owner-123").status_code == 302
    assert logged_in(client)


# --- password reset throttling -----------------------------------------------------------------


def ask_reset(client, email="owner@example.com"):
    return client.post("/accounts/password_reset/", {"email": email})


@pytest.mark.django_db
def test_password_resets_per_address_are_throttled_with_the_reason(settings, user, mailoutbox):
    client = Client()
    limit = settings.ALWAYSON_PASSWORD_RESET_LIMIT
    for _ in range(limit):
        assert ask_reset(client).status_code == 302
    assert len(mailoutbox) == limit

    refused = ask_reset(Client())

    assert refused.status_code == 429
    assert "Too many password reset requests" in refused.content.decode()
    assert len(mailoutbox) == limit
    # Counted per address, whether or not it belongs to anybody: the answer tells nothing.
    assert ask_reset(client, "nobody@example.com").status_code == 302


@pytest.mark.django_db
def test_password_resets_are_allowed_again_after_the_cool_off(settings, user, mailoutbox):
    client = Client()
    for _ in range(settings.ALWAYSON_PASSWORD_RESET_LIMIT):
        ask_reset(client)
    assert ask_reset(client).status_code == 429

    cool_off = settings.AXES_COOLOFF_TIME
    for asked in PasswordResetRequest.objects.all():
        asked.created -= cool_off + timedelta(seconds=1)
        asked.save()

    assert ask_reset(client).status_code == 302
    assert len(mailoutbox) == settings.ALWAYSON_PASSWORD_RESET_LIMIT + 1
