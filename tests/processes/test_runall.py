"""`manage.py runall`, the README's one command, as a newcomer meets it: a real subprocess
with its web server, worker, scheduler and dispatcher, driven over HTTP.

The subprocess always runs on its own temporary SQLite file, whatever database the test run
uses, so these tests pass unchanged on both. Every wait is bounded; nothing sleeps to move a
clock, only to poll.
"""

import contextlib
import os
import re
import signal
import sqlite3

import pytest

from tests.support.processes import child_pids, command_of, free_port
from tests.support.runall import START_TIMEOUT, Browser, Runall, assert_all_stop

CHILD_COMMANDS = {"devserver", "runworker", "runscheduler", "rundispatcher"}


@pytest.fixture
def runall(tmp_path):
    server = Runall(tmp_path, free_port(), args=("--demo",))  # as `make run` starts it
    yield server
    server.stop()


def wait_until_up(runall):
    browser = Browser(runall.url)
    runall.wait_for(
        "the login page", lambda: browser.answers("/accounts/login/") == 200, START_TIMEOUT
    )
    runall.wait_for("four child processes", lambda: len(child_pids(runall.process.pid)) == 4)
    children = runall.children = child_pids(runall.process.pid)
    commands = {name for pid in children for name in CHILD_COMMANDS if name in command_of(pid)}
    assert commands == CHILD_COMMANDS, [command_of(pid) for pid in children]
    return browser, children


def test_runall_runs_the_refund_walkthrough_and_stops_on_ctrl_c(runall):
    browser, children = wait_until_up(runall)
    password = runall.demo_password()
    assert password, runall.tail()
    # Kept beside runall's SQLite file, for the next run to print again.
    assert (runall.db.parent / "db.sqlite3-demo-password").read_text().strip() == password
    assert f"{runall.url}/accounts/login/" in runall.output

    # Log in with the printed demo password; the login returns to the inbox page.
    status, url, html = browser.post_form(
        "/accounts/login/?next=/inbox/demo-desk/",
        {"username": "demo", "password": password, "next": "/inbox/demo-desk/"},
    )
    assert (status, url) == (200, f"{runall.url}/inbox/demo-desk/"), html[:500]

    # Post "refund order 881".
    status, _, html = browser.get("/inbox/demo-desk/")
    message_id = re.search(r'name="message_id" value="([0-9a-f-]{36})"', html).group(1)
    status, url, html = browser.post_form(
        "/inbox/demo-desk/", {"message_id": message_id, "text": "refund order 881"}
    )
    assert status == 200 and "Sent." in html

    # The worker asks; the approval appears on its page.
    approval = "/approvals/demo-desk/refund-881/"
    runall.wait_for("the approval page", lambda: browser.answers(approval) == 200)
    status, _, html = browser.get("/approvals/")
    assert "Refund order 881" in html
    # The dispatcher emails the link (the console email is runall's output).
    runall.wait_for("the approval email", lambda: f"{runall.url}{approval}" in runall.emails())

    # Approve.
    status, url, html = browser.post_form(approval, {"answer": "yes"})
    assert status == 200 and url == f"{runall.url}{approval}"
    assert "Approved." in html

    # The worker refunds and says so, on the inbox page and in the console email.
    runall.wait_for(
        "Refunded order 881 on the inbox page",
        lambda: "Refunded order 881" in browser.get("/inbox/demo-desk/")[2],
    )
    runall.wait_for(
        "Refunded order 881 in the console email",
        lambda: re.search(r"Subject: \[demo-desk\] Refunded order 881", runall.emails()),
    )

    # Ctrl-C: SIGINT to runall; it and every child exit, with status 0.
    runall.process.send_signal(signal.SIGINT)
    assert_all_stop(runall, children)


def process_rows(db):
    """(kind, stopped) of each Process row in runall's own SQLite file."""
    with contextlib.closing(sqlite3.connect(db, timeout=30)) as conn:
        return sorted(conn.execute("SELECT kind, stopped FROM alwayson_process"))


def test_ctrl_c_in_a_terminal_is_one_clean_stop(runall):
    """A terminal's Ctrl-C is SIGINT to the whole foreground process group: each loop still
    gets one stop request, not two (a second one exits at once), so it finishes, logs its
    stop line and marks its Process row stopped, not lost."""
    _, children = wait_until_up(runall)
    runall.wait_for("the three loops' Process rows", lambda: len(process_rows(runall.db)) == 3)

    os.killpg(runall.process.pid, signal.SIGINT)

    assert_all_stop(runall, children)
    assert re.search(r"worker \S+: stopped after \d+ run\(s\)", runall.output), runall.tail()
    stopped = [(kind, stopped is not None) for kind, stopped in process_rows(runall.db)]
    assert stopped == [("dispatcher", True), ("scheduler", True), ("worker", True)], runall.tail()


# --- options, refused before anything starts -------------------------------------------------


@pytest.mark.parametrize("addr", ["localhost", "127.0.0.1:http", "", "0.0.0.0:"])
def test_a_malformed_addr_is_refused(addr):
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match=r"--addr must be \[address:\]port"):
        call_command("runall", "--addr", addr)


def test_production_mode_refuses_debug_on(settings):
    from django.core.management import CommandError, call_command

    settings.DEBUG = True
    with pytest.raises(CommandError, match="--production needs DEBUG=false"):
        call_command("runall", "--production")


def test_production_mode_runs_the_production_set_not_a_worker_count(settings):
    from django.core.management import CommandError, call_command

    settings.DEBUG = False
    with pytest.raises(CommandError, match="--concurrency is for development"):
        call_command("runall", "--production", "--concurrency", "8")


def test_production_mode_makes_no_demo_data(settings):
    from django.core.management import CommandError, call_command

    settings.DEBUG = False
    with pytest.raises(CommandError, match="--demo is for development"):
        call_command("runall", "--production", "--demo")


# --- demo data, only when asked ----------------------------------------------------------------


def development_set(demo):
    """runall's development set, made without starting it: what it printed, and the commands."""
    import io

    from alwayson.ops.management.commands.runall import Command

    command = Command(stdout=io.StringIO())
    commands, _, _ = command.development_set("127.0.0.1:8000", demo, None)
    return command.stdout.getvalue(), commands


@pytest.mark.django_db
def test_without_demo_runall_makes_no_user_and_no_inbox_and_says_how_to_log_in(settings):
    from django.contrib.auth import get_user_model

    from inbox.models import Inbox

    settings.DEBUG = True

    printed, commands = development_set(demo=False)

    assert not get_user_model().objects.exists() and not Inbox.objects.exists()
    assert "No demo data: log in as a user of this project" in printed
    assert set(commands) == {"web", "worker", "scheduler", "dispatcher"}


@pytest.mark.django_db
def test_with_demo_runall_makes_the_demo_login_and_prints_where_to_go(settings, tmp_path):
    from inbox.models import Inbox

    settings.DEBUG = True
    settings.BASE_DIR = tmp_path  # the password file, for a database that is not a file

    printed, _ = development_set(demo=True)

    assert Inbox.objects.get().slug == "demo-desk"
    assert re.search(
        r"Demo login: demo / \S+  at http://127\.0\.0\.1:8000/accounts/login/", printed
    )
    assert "Post 'refund order 881' at http://127.0.0.1:8000/inbox/demo-desk/" in printed


def test_demo_data_is_refused_with_debug_off_before_anything_is_migrated(settings):
    from django.core.management import CommandError, call_command

    settings.DEBUG = False
    with pytest.raises(CommandError, match="--demo is for development: DEBUG is off"):
        call_command("runall", "--demo")
