"""`manage.py runall`, the README's one command, as a newcomer meets it: a real subprocess
with its web server, worker, scheduler and dispatcher, driven over HTTP.

The subprocess always runs on its own temporary SQLite file, whatever database the test run
uses, so these tests pass unchanged on both. Every wait is bounded; nothing sleeps to move a
clock, only to poll.
"""

import contextlib
import http.cookiejar
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

BASE_DIR = Path(__file__).resolve().parent.parent
START_TIMEOUT = 90  # a fresh SQLite file is migrated first
WORK_TIMEOUT = 60
STOP_TIMEOUT = 20
CHILD_COMMANDS = {"runserver", "runworker", "runscheduler", "rundispatcher"}


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


class Runall:
    """A `runall` subprocess in its own process group, its output collected as it comes.
    `args` are runall's own, `env` overrides its environment (tests/test_production_pg.py)."""

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
                str(BASE_DIR / "manage.py"),
                "runall",
                "--addr",
                f"127.0.0.1:{port}",
                *args,
            ],
            cwd=BASE_DIR,
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


@pytest.fixture
def runall(tmp_path):
    server = Runall(tmp_path, free_port())
    yield server
    server.stop()


def wait_until_up(runall):
    browser = Browser(runall.url)
    runall.wait_for(
        "the login page", lambda: browser.answers("/accounts/login/") == 200, START_TIMEOUT
    )
    runall.wait_for("four child processes", lambda: len(child_pids(runall.process.pid)) == 4)
    children = runall.children = child_pids(runall.process.pid)
    commands = {name for pid in children for name in CHILD_COMMANDS if name in command_of(pid)}
    assert commands == CHILD_COMMANDS, [command_of(pid) for pid in children]
    return browser, children


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


def test_runall_runs_the_refund_walkthrough_and_stops_on_ctrl_c(runall):
    browser, children = wait_until_up(runall)
    password = runall.demo_password()
    assert password, runall.tail()
    assert f"{runall.url}/accounts/login/" in runall.output

    # Log in with the printed demo password; the login returns to the inbox page.
    status, url, html = browser.post_form(
        "/accounts/login/?next=/inbox/demo-desk/",
        {"username": "demo", "password": password, "next": "/inbox/demo-desk/"},
    )
    assert (status, url) == (200, f"{runall.url}/inbox/demo-desk/"), html[:500]

    # Post "refund order 881".
    status, _, html = browser.get("/inbox/demo-desk/")
    message_id = re.search(r'name="message_id" value="([0-9a-f-]{36})"', html).group(1)
    status, url, html = browser.post_form(
        "/inbox/demo-desk/", {"message_id": message_id, "text": "refund order 881"}
    )
    assert status == 200 and "Sent." in html

    # The worker asks; the approval appears on its page.
    approval = "/approvals/demo-desk/refund-881/"
    runall.wait_for("the approval page", lambda: browser.answers(approval) == 200)
    status, _, html = browser.get("/approvals/")
    assert "Refund order 881" in html
    # The dispatcher emails the link (the console email is runall's output).
    runall.wait_for("the approval email", lambda: f"{runall.url}{approval}" in runall.emails())

    # Approve.
    status, url, html = browser.post_form(approval, {"answer": "yes"})
    assert status == 200 and url == f"{runall.url}{approval}"
    assert "Approved." in html

    # The worker refunds and says so, on the inbox page and in the console email.
    runall.wait_for(
        "Refunded order 881 on the inbox page",
        lambda: "Refunded order 881" in browser.get("/inbox/demo-desk/")[2],
    )
    runall.wait_for(
        "Refunded order 881 in the console email",
        lambda: re.search(r"Subject: \[demo-desk\] Refunded order 881", runall.emails()),
    )

    # Ctrl-C: SIGINT to runall; it and every child exit, with status 0.
    runall.process.send_signal(signal.SIGINT)
    assert_all_stop(runall, children)


def test_ctrl_c_in_a_terminal_stops_everything(runall):
    """A terminal's Ctrl-C reaches the whole foreground process group, children included."""
    _, children = wait_until_up(runall)

    os.killpg(runall.process.pid, signal.SIGINT)

    assert_all_stop(runall, children)


# --- options, refused before anything starts -------------------------------------------------


@pytest.mark.parametrize("addr", ["localhost", "127.0.0.1:http", "", "0.0.0.0:"])
def test_a_malformed_addr_is_refused(addr):
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match=r"--addr must be \[address:\]port"):
        call_command("runall", "--addr", addr)


def test_production_mode_refuses_debug_on(settings):
    from django.core.management import CommandError, call_command

    settings.DEBUG = True
    with pytest.raises(CommandError, match="--production needs DEBUG=false"):
        call_command("runall", "--production")


def test_production_mode_runs_the_production_set_not_a_worker_count(settings):
    from django.core.management import CommandError, call_command

    settings.DEBUG = False
    with pytest.raises(CommandError, match="--concurrency is for development"):
        call_command("runall", "--production", "--concurrency", "8")
