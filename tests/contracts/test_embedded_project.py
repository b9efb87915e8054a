"""alwayson inside a stranger's Django project (tests/embedded/: its own settings, user
model and URLs) passes its smoke suite, on the database this suite runs on. That suite needs
a process of its own: another DJANGO_SETTINGS_MODULE, another set of migrations."""

import os
import re
import subprocess
import sys

from django.db import connection

from tests.support.paths import ROOT

SMOKE_TESTS = 15


def embedded_environment():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.embedded.settings"}
    env.pop("EMBEDDED_TEST_DATABASE", None)
    if connection.vendor == "postgresql":
        # Its own test database on the same server: this suite's is in use meanwhile.
        name = connection.settings_dict["NAME"]
        parent = name if name.startswith("test_") else f"test_{name}"
        env["EMBEDDED_TEST_DATABASE"] = f"{parent}_embedded"
    return env


def test_the_embedded_project_passes_its_smoke_suite_on_this_database():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/embedded",
            "-p",
            "no:cacheprovider",
            "-p",
            "alwayson.testing",
            "--confcutdir",
            "tests/embedded",
            "-rA",
        ],
        cwd=ROOT,
        env=embedded_environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"embedded project database: {connection.vendor}" in output
    # pytest adds "(0:01:01)" to a run of a minute or more, as on a busy machine.
    summary = output.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"=* ?{SMOKE_TESTS} passed(, \d+ warnings?)? in [\d.]+s( \(\d+:\d\d:\d\d\))? ?=*", summary
    ), summary
    assert "skipped" not in summary and "deselected" not in summary


def test_a_project_that_forgets_alwayson_s_settings_stops_at_start_up_saying_how_to_take_them(
    tmp_path,
):
    line = "from alwayson.settings.embedded import *  # noqa: F403\n"
    settings = (ROOT / "tests" / "embedded" / "settings.py").read_text()
    assert line in settings
    (tmp_path / "forgetful_settings.py").write_text(settings.replace(line, ""))
    env = {
        **embedded_environment(),
        "DJANGO_SETTINGS_MODULE": "forgetful_settings",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
    }

    result = subprocess.run(
        [sys.executable, "-m", "django", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 1
    # Its first alwayson app (inbox) reads the webhook secrets in ready().
    assert result.stderr.strip().splitlines()[-1] == (
        "django.core.exceptions.ImproperlyConfigured: ALWAYSON_GITHUB_SECRETS is not set, and"
        " alwayson's apps read it: add `from alwayson.settings.embedded import *` to your"
        " settings, before your own values of alwayson's settings"
        " (docs/how-to/embed-in-a-project.md)"
    )
