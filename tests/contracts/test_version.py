"""One version number, pyproject.toml's: the package, every alwayson command's `--version`,
/healthz (tests/ops/test_health.py) and each process's heartbeat row report it, and
CHANGELOG.md's upgrade notes are written against it."""

import re
import subprocess
import sys
import tomllib
from importlib import metadata

import django
import pytest
from django.core.management import get_commands, load_command_class

import alwayson
from tests.support.paths import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
OUR_APPS = ("alwayson", "inbox", "timers", "approvals", "outbox")


def test_the_package_reports_pyproject_s_version():
    # An editable install keeps the version it was installed with: `make install` again
    # (the Makefile does it when pyproject.toml changes).
    assert alwayson.__version__ == metadata.version("alwayson") == PROJECT["version"]


def test_the_version_is_one_pip_can_compare():
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?(\.dev\d+)?", PROJECT["version"])


def our_commands():
    commands = {name: app for name, app in get_commands().items() if app.split(".")[0] in OUR_APPS}
    # Guards the test below against finding nothing.
    assert {"runworker", "runall", "status", "prune", "startagent"} <= commands.keys()
    return sorted(commands.items())


@pytest.mark.parametrize(("name", "app"), our_commands())
def test_every_alwayson_command_s_version_is_alwayson_s(name, app, capsys):
    parser = load_command_class(app, name).create_parser("manage.py", name)

    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--version"])

    assert exited.value.code == 0
    assert capsys.readouterr().out == f"{alwayson.__version__}\n"


def test_django_s_own_commands_still_report_django_s_version(capsys):
    parser = load_command_class("django.core", "check").create_parser("manage.py", "check")
    with pytest.raises(SystemExit):
        parser.parse_args(["--version"])
    assert capsys.readouterr().out == f"{django.get_version()}\n"


def test_manage_py_status_version_prints_the_version_alone():
    done = subprocess.run(
        [sys.executable, "manage.py", "status", "--version"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{PROJECT['version']}\n", "")


def test_the_changelog_has_a_section_for_the_version():
    """A release's number is in CHANGELOG.md's headings (a .devN build's under its release's)."""
    release = re.sub(r"\.dev\d+$", "", PROJECT["version"])
    headings = re.findall(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert release in headings, headings
