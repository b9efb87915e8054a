"""The kit's tests fail, never skip, without Django settings: the tutorial's first test, run
in a directory outside the checkout (no pytest settings there) with the command the
tutorial shows, and without the settings part of it.

pytest-django alone skips every test that needs the database when no settings are named
("1 skipped", exit 0), which reads as a pass.
"""

import os
import re
import shutil
import subprocess
import sys

from django.db import connection

from tests.support.paths import ROOT
from tests.support.processes import database_url

TUTORIAL = ROOT / "docs" / "tutorial"


def tutorial_project(directory):
    """Step 1's agent and test as the tutorial has the reader write them."""
    shutil.copy(TUTORIAL / "desk_1_reply.py", directory / "desk.py")
    test = (TUTORIAL / "test_desk_1_reply.py").read_text(encoding="utf-8")
    (directory / "test_desk.py").write_text(
        test.replace('"desk_1_reply.agent"', '"desk.agent"'), encoding="utf-8"
    )


def shown_command():
    """The command the tutorial shows for step 1's test."""
    page = (TUTORIAL / "first-agent.md").read_text(encoding="utf-8")
    [command] = re.findall(
        r"^(DJANGO_SETTINGS_MODULE=\S+ python -m pytest test_desk\.py)$", page, re.M
    )
    return command


def run(command, directory):
    """`command` in a shell in `directory`, with this interpreter as `python`, no settings
    module from this run, and this run's kind of database."""
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    if connection.vendor == "postgresql":
        env["DATABASE_URL"] = database_url()  # its test database goes beside this run's
    python = f"{sys.executable} -m pytest -p no:cacheprovider"
    return subprocess.run(
        command.replace("python -m pytest", python, 1),
        shell=True,
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_tutorial_s_test_without_settings_fails_saying_what_to_set(tmp_path, db):
    tutorial_project(tmp_path)
    bare = shown_command().split(" ", 1)[1]  # without DJANGO_SETTINGS_MODULE=...

    done = run(bare, tmp_path)

    output = done.stdout + done.stderr
    assert done.returncode == 4, output  # pytest's usage error: no test ran
    assert "skipped" not in output and "passed" not in output
    assert "ERROR: alwayson.testing: no Django settings" in output
    assert "DJANGO_SETTINGS_MODULE=alwayson.settings python -m pytest" in output


def test_the_command_the_tutorial_shows_runs_its_test_outside_the_checkout(tmp_path, db):
    assert not str(tmp_path).startswith(str(ROOT))  # no pyproject.toml naming settings
    tutorial_project(tmp_path)

    done = run(shown_command(), tmp_path)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout and "skipped" not in done.stdout


def test_the_kit_without_pytest_django_fails_saying_to_install_it(tmp_path, db):
    tutorial_project(tmp_path)

    done = run(shown_command().replace("pytest ", "pytest -p no:django ", 1), tmp_path)

    output = done.stdout + done.stderr
    assert done.returncode == 4, output
    assert "ERROR: alwayson.testing needs pytest-django (pip install pytest-django" in output
