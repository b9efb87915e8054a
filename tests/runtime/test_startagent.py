"""`manage.py startagent`: the module and its tests it writes, the tests passing as written
(run by pytest in a process of their own, as an agent author runs them), and the names and
files it refuses."""

import os
import shlex
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from alwayson.runtime.management.commands.startagent import TEST_COMMAND
from tests.support.processes import database_url


def startagent(*args, directory):
    from io import StringIO

    out = StringIO()
    call_command("startagent", *args, directory=str(directory), stdout=out)
    return out.getvalue()


def run_pytest(directory, said):
    """The generated tests as the command startagent printed runs them, in a process of its
    own, on this run's kind of database (on PostgreSQL, a test database of their own beside
    this run's)."""
    [command] = [
        line.strip() for line in said.splitlines() if line.strip().startswith(TEST_COMMAND)
    ]
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(directory)  # the agent's module; alwayson is installed
    if connection.vendor == "postgresql":
        env["DATABASE_URL"] = database_url()
    python = shlex.quote(sys.executable)
    return subprocess.run(
        command.replace(" python ", f" {python} ", 1) + " -q -p no:cacheprovider -rs",
        shell=True,
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_rule_based_agent_and_its_tests_that_pass(tmp_path):
    said = startagent("support_desk", directory=tmp_path)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["support_desk.py", "test_support_desk.py"]
    assert "    ALWAYSON_AGENT=support_desk.agent" in said
    assert 'AgentConfig.objects.create(inbox=inbox, agent="support_desk.agent")' in said
    done = run_pytest(tmp_path, said)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 passed" in done.stdout and "skipped" not in done.stdout


def test_a_claude_agent_s_tool_and_policy_and_its_tests_that_pass(tmp_path):
    said = startagent("returns_desk", "--claude", directory=tmp_path)

    assert "    ALWAYSON_AGENT=alwayson.claude.agent" in said
    assert "    ALWAYSON_CLAUDE_TOOLS=returns_desk" in said
    assert """ALWAYSON_CLAUDE_POLICY='{"refund": [{"when\"""" in said
    done = run_pytest(tmp_path, said)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout and "skipped" not in done.stdout


def test_a_dotted_name_goes_in_its_package(tmp_path):
    package = tmp_path / "acme" / "agents"
    package.mkdir(parents=True)
    (tmp_path / "acme" / "__init__.py").touch()
    (package / "__init__.py").touch()

    said = startagent("acme.agents.support", directory=tmp_path)

    assert (package / "support.py").is_file() and (package / "test_support.py").is_file()
    assert 'AGENT = "acme.agents.support.agent"' in (package / "test_support.py").read_text()
    assert "ALWAYSON_AGENT=acme.agents.support.agent" in said


@pytest.mark.parametrize(
    "name, reason",
    [
        ("2fast", "is not a module name"),
        ("my-agent", "is not a module name"),
        ("acme..support", "is not a module name"),
        ("café", "is not a module name"),
        ("class", "is a Python keyword"),
        ("json", "a module Python imports already"),
        ("inbox", "a module Python imports already"),
        ("test_desk", "collected as tests"),
        ("acme.support", "acme is not a package"),
    ],
)
def test_a_name_that_cannot_be_a_new_module_is_refused(tmp_path, name, reason):
    with pytest.raises(CommandError, match=reason):
        startagent(name, directory=tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("existing", ["support.py", "test_support.py"])
def test_an_existing_file_is_never_overwritten(tmp_path, existing):
    (tmp_path / existing).write_text("# mine\n")

    with pytest.raises(CommandError, match=f"{existing} exists already; nothing was written"):
        startagent("support", "--claude", directory=tmp_path)

    assert [p.name for p in tmp_path.iterdir()] == [existing]
    assert (tmp_path / existing).read_text() == "# mine\n"


def test_a_directory_that_does_not_exist_is_refused(tmp_path):
    with pytest.raises(CommandError, match="is not a directory"):
        startagent("support", directory=tmp_path / "nowhere")
