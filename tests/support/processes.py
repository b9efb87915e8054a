"""Real processes from a test: `manage.py` commands on the test database, free ports, /proc,
and bounded waits."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from django.db import connection

from tests.support.paths import ROOT


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_pids(pid):
    """Direct children of `pid`, from /proc."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return children


def command_of(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def is_gone(pid):
    """Exited and reaped, or at least exited (a zombie waiting for its new parent)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def wait_for(predicate, timeout, what, period=0.02):
    """Poll `predicate` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(period)


def database_url(name=None):
    """The test database's URL; with `name`, another database on its server."""
    db = connection.settings_dict
    auth = quote(db["USER"] or "postgres", safe="")
    if db["PASSWORD"]:
        auth += ":" + quote(db["PASSWORD"], safe="")
    host, port = db["HOST"] or "127.0.0.1", db["PORT"] or 5432
    return f"postgres://{auth}@{host}:{port}/{name or db['NAME']}"


def start_command(command, args, log_path, env=None):
    """`manage.py <command> <args>` as a process on the test database, its output in
    `log_path`; `env` adds to the environment."""
    environment = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "manage.py", command, *args],
            cwd=ROOT,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
