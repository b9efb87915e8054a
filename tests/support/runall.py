"""`manage.py runall` as a subprocess, and a urllib browser that keeps its cookies."""

import contextlib
import http.cookiejar
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from tests.support.paths import ROOT
from tests.support.processes import command_of, is_gone

START_TIMEOUT = 90  # a fresh SQLite file is migrated first
WORK_TIMEOUT = 60
STOP_TIMEOUT = 20


class Runall:
    """A `runall` subprocess in its own process group, its output collected as it comes.
    `args` are runall's own, `env` overrides its environment
    (tests/processes/test_production_pg.py)."""

    def __init__(self, tmp_path, port, args=(), env=None):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.db = tmp_path / "db.sqlite3"
        environment = {
            key: value
            for key, value in os.environ.items()
            if key not in ("DJANGO_ALLOW_ASYNC_UNSAFE", "ALWAYSON_AGENT")
        }
        environment.update(
            DATABASE_URL=f"sqlite:///{self.db}",
            ALWAYSON_SITE_URL=self.url,
            DJANGO_SETTINGS_MODULE="alwayson.settings",
            EMAIL_URL="consolemail://",
            PYTHONUNBUFFERED="1",
        )
        environment.update(env or {})
        self.lines = []
        self.children = []
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "manage.py"),
                "runall",
                "--addr",
                f"127.0.0.1:{port}",
                *args,
            ],
            cwd=ROOT,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line)

    @property
    def output(self):
        return "".join(self.lines)

    def emails(self):
        """The output with quoted-printable soft line breaks undone: Django 6 encodes a long
        line of a console email that way, splitting the link."""
        return self.output.replace("=\n", "")

    def tail(self, n=60):
        return "".join(self.lines[-n:])

    def fail(self, why):
        pytest.fail(f"{why}\n--- runall output (last lines) ---\n{self.tail()}", pytrace=False)

    def wait_for(self, what, check, timeout=WORK_TIMEOUT, interval=0.25):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.fail(f"runall exited ({self.process.returncode}) while waiting for {what}")
            result = check()
            if result:
                return result
            time.sleep(interval)
        self.fail(f"timed out after {timeout}s waiting for {what}")

    def demo_password(self):
        match = re.search(r"Demo login: demo / (\S+)", self.output)
        return match.group(1) if match else None

    def stop(self):
        """Kill whatever is left of what was started here (after a failed test)."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        for pid in self.children:
            if not is_gone(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.reader.join(timeout=5)


class Browser:
    """urllib with a cookie jar: the session and CSRF cookies, like a browser keeps them.

    `behind_tls_proxy`: every request carries what a TLS-terminating proxy adds
    (X-Forwarded-Proto: https, and the https Origin a browser sends with a form), and the jar
    sends Secure cookies over the plain http hop, as the proxy would forward them.
    """

    def __init__(self, base, behind_tls_proxy=False):
        self.base = base
        self.headers = {}
        policy = None
        if behind_tls_proxy:
            self.headers = {
                "X-Forwarded-Proto": "https",
                "Origin": base.replace("http://", "https://", 1),
            }
            policy = http.cookiejar.DefaultCookiePolicy(secure_protocols=("https", "http"))
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar(policy))
        )
        self.last_headers = None

    def request(self, path, data=None):
        body = urllib.parse.urlencode(data).encode() if data is not None else None
        request = urllib.request.Request(self.base + path, data=body, headers=self.headers)
        try:
            with self.opener.open(request, timeout=10) as response:
                self.last_headers = response.headers
                return response.status, response.geturl(), response.read().decode()
        except urllib.error.HTTPError as exc:
            self.last_headers = exc.headers
            return exc.code, exc.geturl(), exc.read().decode()

    def get(self, path):
        return self.request(path)

    def post_form(self, path, fields):
        """GET the page, then POST its form with the page's CSRF token, as a browser does."""
        status, _, html = self.get(path)
        assert status == 200, (path, status)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)
        return self.request(path, {"csrfmiddlewaretoken": token, **fields})

    def answers(self, path):
        try:
            return self.get(path)[0]
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return None


def assert_all_stop(runall, children):
    try:
        status = runall.process.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        runall.fail(f"runall did not exit within {STOP_TIMEOUT}s of SIGINT")
    runall.reader.join(timeout=5)
    assert status == 0, runall.tail()
    # runall waits for its children before it exits; give a reparented straggler no slack.
    left = [(pid, command_of(pid)) for pid in children if not is_gone(pid)]
    assert left == [], f"children still running after runall exited: {left}"
    assert "alwayson stopped" in runall.output
