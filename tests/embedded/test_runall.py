"""`runall` in the stranger's project: no demo data unless asked, and when asked, a demo
login by the field its user model logs in with and addresses under its prefix for alwayson."""

import io
import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from alwayson.ops.management.commands.runall import Command, home_url
from inbox.models import Inbox

pytestmark = pytest.mark.django_db


@pytest.fixture
def development(settings, tmp_path):
    """DEBUG on, as a developer runs runall; the demo password's file in a temporary folder
    (BASE_DIR is the project's)."""
    settings.DEBUG = True
    settings.BASE_DIR = tmp_path


def development_set(demo):
    """runall's development set, made without starting its processes: what it printed."""
    command = Command(stdout=io.StringIO())
    command.development_set("127.0.0.1:8000", demo, None)
    return command.stdout.getvalue()


def test_runall_makes_no_superuser_and_no_inbox_in_the_project_s_database_unasked(development):
    printed = development_set(demo=False)

    assert not get_user_model().objects.exists()
    assert not Inbox.objects.exists()
    assert "No demo data" in printed and "--demo" in printed


def test_the_demo_login_asked_for_is_the_email_it_logs_in_with_at_the_project_s_addresses(
    development,
):
    printed = development_set(demo=True)

    login = re.search(r"Demo login: (\S+) / (\S+)  at (\S+)", printed)
    assert login, printed
    name, password, page = login.groups()
    assert name == "demo@example.com"
    assert page == "http://127.0.0.1:8000/accounts/login/"
    assert "Post 'refund order 881' at http://127.0.0.1:8000/agents/inbox/demo-desk/" in printed
    # What it printed logs in, and the inbox page it named answers.
    browser = Client()
    assert (
        browser.post("/accounts/login/", {"username": name, "password": password}).status_code
        == 302
    )
    assert browser.get("/agents/inbox/demo-desk/").status_code == 200


def test_runall_says_where_alwayson_runs_under_the_project_s_prefix():
    assert home_url("127.0.0.1:8000") == "http://127.0.0.1:8000/agents/"
