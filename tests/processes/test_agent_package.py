"""Run as its own service: the team's agent package installed beside alwayson, not inside it.

The package is written to a directory outside the repository and put on the path of real
`manage.py` processes; `ALWAYSON_AGENT` names it by dotted path, as a deployment's
environment would (docs/how-to/embed-in-a-project.md, "As its own service").
"""

import json
import os
import subprocess
import sys

import pytest
from django.db import connection

from tests.support.paths import ROOT
from tests.support.processes import database_url

SUPPORT_AGENT = '''
"""The support team's agent: it lives in their package, not in alwayson."""


def agent(run):
    for event in run.events:
        run.state["seen"] = run.state.get("seen", 0) + 1
        run.say(f"Support here, about: {event.payload['text']}")
'''

SETUP = """
from django.contrib.auth import get_user_model
from alwayson.runtime.api import ingest
from inbox.models import Inbox
Inbox.objects.create(owner=get_user_model().objects.create(username="support"), slug="support")
print(ingest("support", "chat", "m-1", {"text": "my order is late"}))
"""

STORED = """
import json
from inbox.models import Event, Session
from outbox.models import OutboxMessage
print(json.dumps({
    "said": list(OutboxMessage.objects.values_list("body", flat=True)),
    "events": list(Event.objects.values_list("status", flat=True)),
    "state": Session.objects.get(inbox__slug="support").state,
}))
"""


@pytest.fixture
def service_database(transactional_db, tmp_path):
    """The database the processes share: on PostgreSQL the test database itself (committed
    to, so transactional_db); on SQLite, whose test database is in this process's memory, a
    file migrated for the test."""
    if connection.vendor == "postgresql":
        return database_url()
    path = tmp_path / "service.sqlite3"
    manage(f"sqlite:///{path}", tmp_path, "migrate", "--verbosity", "0")
    return f"sqlite:///{path}"


def write_package(root):
    """acme/agents/support.py under `root`, a directory outside the repository."""
    agents = root / "acme" / "agents"
    agents.mkdir(parents=True)
    (root / "acme" / "__init__.py").write_text("")
    (agents / "__init__.py").write_text("")
    (agents / "support.py").write_text(SUPPORT_AGENT)


def manage(url, packages, *args):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "alwayson.settings",
        "DATABASE_URL": url,
        "ALWAYSON_AGENT": "acme.agents.support.agent",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(packages), os.environ.get("PYTHONPATH")])),
    }
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""


def test_a_worker_runs_an_agent_package_installed_outside_the_repository(
    service_database, tmp_path
):
    packages = tmp_path / "site-packages"
    write_package(packages)
    assert not (ROOT / "acme").exists()  # only the path the processes are given has it

    assert manage(service_database, packages, "shell", "-c", SETUP) == "True"
    manage(service_database, packages, "runworker", "--once", "--worker-id", "support-1")

    stored = json.loads(manage(service_database, packages, "shell", "-c", STORED))
    assert stored == {
        "said": ["Support here, about: my order is late"],
        "events": ["done"],
        "state": {"seen": 1},
    }


def test_a_worker_refuses_to_start_when_the_agent_package_is_not_on_its_path(
    service_database, tmp_path
):
    with pytest.raises(AssertionError, match="ALWAYSON_AGENT"):
        manage(service_database, tmp_path / "empty", "runworker", "--once")
