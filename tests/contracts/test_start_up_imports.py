"""What a process on SQLite does not load at start-up: the libraries only some work needs
(PostgreSQL's driver, the HTTP clients of an outbound call, the MCP SDK, JSON Schema) are
imported where that work is done, so that every `manage.py` command starts without them
(docs/how-to/development.md, "Where CI's time goes"). Structural, not timing."""

import json
import subprocess
import sys

from tests.support.env import environment
from tests.support.paths import ROOT

LOADED = """
import json, sys
import django
django.setup()
from django.core.management import call_command
call_command("check", verbosity=0)
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""
LOADED_WHERE_USED = {"psycopg", "httpx", "httpx2", "mcp", "jsonschema"}


def test_a_command_on_sqlite_starts_without_the_libraries_only_some_work_needs(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", LOADED],
        cwd=ROOT,
        env=environment(DATABASE_URL=f"sqlite:///{tmp_path / 'start.sqlite3'}"),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.splitlines()[-1]))  # after check's own line
    assert "django" in loaded  # the check ran in a set-up Django
    assert LOADED_WHERE_USED.isdisjoint(loaded)
