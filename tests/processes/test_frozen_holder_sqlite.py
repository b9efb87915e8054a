"""A process frozen inside a write transaction must not stall ingest for long (SQLite).

SQLite has one write lock for the whole file, taken at BEGIN IMMEDIATE; a process frozen
while holding it stalls every writer. Ingest waits for it at most ALWAYSON_INGEST_LOCK_WAIT
and is refused as busy, nothing stored. The test's database is a file shared by two real
processes (the suite's own in-memory database can't be locked from outside).
"""

import os
import sqlite3
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

# SQLite's own lock, on a file of its own, whatever the suite's database.
pytestmark = pytest.mark.engine_free

INGEST = """
import time
from alwayson.runtime.api import ingest
from inbox.exceptions import InboxBusy
from inbox.models import Event
started = time.monotonic()
try:
    outcome = "stored" if ingest("desk", "chat", "m-1", {"text": "hi"}) else "duplicate"
except InboxBusy:
    outcome = "busy"
print(outcome, round(time.monotonic() - started, 3), Event.objects.count())
"""


def manage(db, *args, wait="0.3"):
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{db}",
        "ALWAYSON_INGEST_LOCK_WAIT": wait,
        "DJANGO_SETTINGS_MODULE": "alwayson.settings",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    # The last line: `shell` may print its automatic imports first.
    return result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""


@pytest.fixture
def db_file(tmp_path):
    db = tmp_path / "frozen.sqlite3"
    manage(db, "migrate", "--verbosity", "0")
    manage(
        db,
        "shell",
        "-c",
        "from django.contrib.auth import get_user_model; from inbox.models import Inbox;"
        "Inbox.objects.create(owner=get_user_model().objects.create(username='o'), slug='desk')",
    )
    return db


def test_ingest_behind_a_frozen_writer_is_refused_as_busy_within_the_wait(db_file):
    frozen = sqlite3.connect(db_file, isolation_level=None)
    try:
        frozen.execute("BEGIN IMMEDIATE")  # the write lock, held by a process that froze
        outcome, seconds, count = manage(db_file, "shell", "-c", INGEST).split()
    finally:
        frozen.rollback()
        frozen.close()
    assert outcome == "busy"
    assert 0.3 <= float(seconds) < 5
    assert count == "0"
    outcome, _, count = manage(db_file, "shell", "-c", INGEST).split()
    assert (outcome, count) == ("stored", "1")


@pytest.mark.parametrize(
    "name, value",
    [
        # An at-least-once send happens inside its transaction: the server must not end it.
        ("ALWAYSON_IDLE_IN_TRANSACTION_TIMEOUT", "10"),
        ("ALWAYSON_IDLE_IN_TRANSACTION_TIMEOUT", "0"),
        ("ALWAYSON_INGEST_LOCK_WAIT", "0"),
        ("ALWAYSON_INGEST_LOCK_WAIT", "soon"),
    ],
)
def test_bounds_that_cannot_work_stop_start_up(name, value):
    env = {**os.environ, name: value, "DATABASE_URL": "sqlite:///:memory:"}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and name in result.stderr
