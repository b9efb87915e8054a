"""`manage.py demologin`, which every `make run` calls: the demo login keeps its password from
one run to the next, so a browser logged in stays logged in, and it is made only in
development."""

import io
import re
import stat
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection

pytestmark = pytest.mark.django_db


@pytest.fixture
def development(settings, tmp_path):
    """DEBUG on, as `make run` has it; the checkout (where the password file goes for a
    database that is not a SQLite file) in a temporary folder."""
    settings.DEBUG = True
    settings.BASE_DIR = tmp_path
    return tmp_path


def demologin():
    """The password it printed."""
    out = io.StringIO()
    call_command("demologin", stdout=out)
    return re.search(r"Demo login: demo / (\S+)", out.getvalue()).group(1)


def log_in(client, password) -> bool:
    """Through the login form, as a browser does: a redirect away from it when accepted."""
    response = client.post("/accounts/login/", {"username": "demo", "password": password})
    return response.status_code == 302


def password_hash():
    return get_user_model().objects.get(username="demo").password


def test_a_second_run_prints_and_keeps_the_same_password(development):
    first = demologin()
    first_hash = password_hash()

    assert demologin() == first
    assert password_hash() == first_hash


def test_a_browser_logged_in_stays_logged_in_across_runs(development, client):
    password = demologin()
    assert log_in(client, password)
    assert client.get("/approvals/").status_code == 200

    demologin()

    assert client.get("/approvals/").status_code == 200


def test_the_password_is_kept_in_a_file_only_its_owner_reads(development):
    from alwayson.demo.login import password_file

    password = demologin()

    path = password_file()
    # Beside the test database on SQLite (a file: tests/conftest.py), else in the checkout.
    database = connection.settings_dict
    on_sqlite = database["ENGINE"].endswith("sqlite3")
    assert path.parent == (Path(database["NAME"]).parent if on_sqlite else development)
    assert path.read_text().strip() == password
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_demo_user_whose_password_was_changed_gets_the_kept_one_back(development, client):
    password = demologin()
    user = get_user_model().objects.get(username="demo")
    user.set_password("changed-in-the-admin")
    user.save()

    assert demologin() == password
    assert log_in(client, password)


def test_beside_a_sqlite_file_the_password_file_is_next_to_it(tmp_path):
    from alwayson.demo.login import password_file

    database = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "x.sqlite3")}

    assert password_file(database) == tmp_path / "x.sqlite3-demo-password"


def test_demologin_refuses_to_run_with_debug_off(settings, tmp_path):
    settings.DEBUG = False
    settings.BASE_DIR = tmp_path

    with pytest.raises(CommandError, match="demologin is for development"):
        call_command("demologin", stdout=io.StringIO())

    assert not get_user_model().objects.filter(username="demo").exists()
    assert list(tmp_path.iterdir()) == []
