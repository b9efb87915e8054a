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


def run_pytest(runs):
    """The generated tests as the commands startagent printed run them, in a process of their
    own, on this run's kind of database (on PostgreSQL, a test database of their own beside
    this run's). `runs` maps each directory to what startagent said there; the commands are
    one but for the test file's path, so one pytest runs them all (a pytest costs its
    imports and its test database: half a minute here). Returns the process and, per test
    file, its outcomes as junit XML says them."""
    import xml.etree.ElementTree as ET

    commands = [
        line.strip()
        for said in runs.values()
        for line in said.splitlines()
        if line.strip().startswith(TEST_COMMAND)
    ]
    assert len(commands) == len(runs), commands
    paths = [command.removeprefix(TEST_COMMAND).strip() for command in commands]
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    # The agents' modules, each in its own directory; alwayson is installed.
    env["PYTHONPATH"] = os.pathsep.join(str(directory) for directory in runs)
    if connection.vendor == "postgresql":
        env["DATABASE_URL"] = database_url()
    [directory, *_] = runs
    report = directory.parent / "junit.xml"
    python = shlex.quote(sys.executable)
    command = TEST_COMMAND.replace(" python ", f" {python} ", 1)
    done = subprocess.run(
        f"{command} {' '.join(map(shlex.quote, paths))} -q -p no:cacheprovider -rs"
        f" --junitxml={shlex.quote(str(report))}",
        shell=True,
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    outcomes = {}
    cases = ET.parse(report).iter("testcase") if report.exists() else []
    for case in cases:
        failed = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcome = failed[0] if failed else "passed"
        file = case.get("classname").rpartition(".")[2] + ".py"
        outcomes.setdefault(file, []).append(outcome)
    return done, outcomes


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """A rule-based agent and a Claude one, each written in a directory of its own, and their
    tests run: (directory, what startagent said) for each, and the run's outcomes."""
    rules = tmp_path_factory.mktemp("generated") / "rules"
    claude = rules.with_name("claude")
    rules.mkdir()
    claude.mkdir()
    written = {
        "rules": (rules, startagent("support_desk", directory=rules)),
        "claude": (claude, startagent("returns_desk", "--claude", directory=claude)),
    }
    listings = {
        kind: sorted(p.name for p in directory.iterdir())
        for kind, (directory, _) in written.items()
    }
    done, outcomes = run_pytest(dict(written.values()))
    return written, listings, done, outcomes


def test_a_rule_based_agent_and_its_tests_that_pass(generated):
    written, listings, done, outcomes = generated
    _, said = written["rules"]

    assert listings["rules"] == ["support_desk.py", "test_support_desk.py"]
    assert "    ALWAYSON_AGENT=support_desk.agent" in said
    assert 'AgentConfig.objects.create(inbox=inbox, agent="support_desk.agent")' in said
    assert done.returncode == 0, done.stdout + done.stderr
    assert outcomes["test_support_desk.py"] == ["passed"] * 5, done.stdout
    assert "skipped" not in done.stdout


def test_a_claude_agent_s_tool_and_policy_and_its_tests_that_pass(generated):
    written, listings, done, outcomes = generated
    _, said = written["claude"]

    assert listings["claude"] == ["returns_desk.py", "test_returns_desk.py"]
    assert "    ALWAYSON_AGENT=alwayson.claude.agent" in said
    assert "    ALWAYSON_CLAUDE_TOOLS=returns_desk" in said
    assert """ALWAYSON_CLAUDE_POLICY='{"refund": [{"when\"""" in said
    assert done.returncode == 0, done.stdout + done.stderr
    assert outcomes["test_returns_desk.py"] == ["passed"] * 2, done.stdout
    assert "skipped" not in done.stdout


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
