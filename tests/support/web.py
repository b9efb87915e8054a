"""The production web command (alwayson/ops/processes.py's "web") as a process on the test
database, and a client that speaks HTTP/1.1 on a bare socket: what a test needs to send what
no library sends (a length it never keeps, a half-close) and to read a stream as it comes."""

import functools
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import pytest
from django.conf import settings
from django.db import connection

from alwayson.ops.processes import PROCESSES, local_argv
from tests.support.env import environment
from tests.support.paths import ROOT
from tests.support.processes import child_pids, database_url, free_port, is_gone, wait_for
from tests.support.webhooks import GITHUB_SECRET, github_headers

START_TIMEOUT = 60
STOP_TIMEOUT = 20
READ_TIMEOUT = 20  # seconds: a bound on a wait, never a measure


def web_database_url():
    if connection.vendor == "sqlite":
        return f"sqlite:///{connection.settings_dict['NAME']}"
    return database_url()


@functools.cache  # the same files for the whole run: a manage.py process costs seconds
def collect_static():
    """Pages with DEBUG off link hashed static names, read from collectstatic's manifest."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "collectstatic", "--noinput", "-v0"],
        cwd=ROOT,
        env=environment(DEBUG="false", SECRET_KEY=settings.SECRET_KEY),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


class ProductionWeb:
    """The web command, exactly as production starts it, with DEBUG off, over plain http (no
    proxy in front), on the test database. The test's SECRET_KEY, so that a session made by
    the test's client is the web's too. Its temporary files go to `tmp`."""

    def __init__(self, tmp_path, **env):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.tmp = tmp_path / "web-tmp"
        self.tmp.mkdir()
        self.application_name = f"web-{secrets.token_hex(4)}"
        variables = environment(
            DEBUG="false",
            SECRET_KEY=settings.SECRET_KEY,
            SECURE_SSL_REDIRECT="false",
            ALLOWED_HOSTS="127.0.0.1",
            DATABASE_URL=web_database_url(),
            ALWAYSON_GITHUB_SECRETS=GITHUB_SECRET,
            ALWAYSON_APPLICATION_NAME=self.application_name,
            ALWAYSON_WEB_BIND=f"127.0.0.1:{self.port}",
            TMPDIR=str(self.tmp),
            PYTHONUNBUFFERED="1",
            no_proxy="127.0.0.1,localhost",
            NO_PROXY="127.0.0.1,localhost",
            **env,
        )
        if "ALWAYSON_DB_POOL_SIZE" not in env:
            variables.pop("ALWAYSON_DB_POOL_SIZE", None)
        self.log_path = tmp_path / "web.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                local_argv(PROCESSES["web"], ROOT),
                cwd=ROOT,
                env=variables,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for(self.answering, START_TIMEOUT, f"gunicorn to answer /healthz ({self.log_path})")
        assert self.process.poll() is None, self.log()
        self.workers = wait_for(
            lambda: child_pids(self.process.pid), START_TIMEOUT, "gunicorn's workers"
        )

    def log(self):
        return self.log_path.read_text(errors="replace")

    def answering(self):
        if self.process.poll() is not None:
            return True  # exited: the caller says so with its log
        try:
            urllib.request.urlopen(self.url + "/healthz", timeout=2).close()
        except urllib.error.HTTPError:
            return True  # 503 while no loop process beats: answered all the same
        except OSError:
            return False
        return True

    def terminate(self, how=signal.SIGTERM):
        """SIGTERM, as systemd and compose stop it (SIGINT: Ctrl-C, a fast stop): the
        master's exit code."""
        self.process.send_signal(how)
        try:
            return self.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"gunicorn did not stop within {STOP_TIMEOUT}s of {how!r}:\n{self.log()}")

    def stop(self):
        """Whatever is left of it, killed (a failed test's)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT)
        for pid in self.workers:
            if not is_gone(pid):
                os.kill(pid, signal.SIGKILL)


# --- HTTP/1.1 on a socket ----------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    headers: dict
    body: bytes
    closed: bool = False  # the server closed the connection after it (read_answer's until_closed)
    raw: bytes = field(default=b"", repr=False)


def head(method, path, headers=(), length=None):
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{name}: {value}" for name, value in dict(headers).items()]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def connect(web):
    sock = socket.create_connection(("127.0.0.1", web.port), timeout=READ_TIMEOUT)
    sock.settimeout(READ_TIMEOUT)
    return sock


def read_head(sock, buffer=b""):
    """(status, headers, what was read past the head)."""
    while b"\r\n\r\n" not in buffer:
        data = sock.recv(65536)
        if not data:
            raise AssertionError(f"the connection closed before a response's head: {buffer!r}")
        buffer += data
    raw, rest = buffer.split(b"\r\n\r\n", 1)
    status_line, *lines = raw.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, rest


def read_answer(sock, until_closed=False):
    """One response; `until_closed`: then whether the server closed the connection (a kept-alive
    one stays open for gunicorn's keepalive, so this waits that long)."""
    status, headers, body = read_head(sock)
    while status == 100:  # an interim answer: the final one follows
        status, headers, body = read_head(sock, body)
    length = int(headers.get("content-length", -1))
    while length < 0 or len(body) < length:
        data = sock.recv(65536)
        if not data:
            break
        body += data
    closed = length < 0
    if until_closed and not closed:
        try:
            closed = sock.recv(1) == b""
        except ConnectionResetError:
            closed = True
    return Answer(status, headers, body[: length if length >= 0 else None], closed)


def exchange(web, request: bytes, half_close=False, until_closed=False):
    """Send `request` whole on a new connection (then shut the sending side, if asked), and
    read the answer."""
    with connect(web) as sock:
        sock.sendall(request)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        return read_answer(sock, until_closed)


GITHUB_BODY = b'{"action": "opened", "issue": {"number": 1}}'


def github_delivery(slug, delivery, body=GITHUB_BODY, chunked=False):
    """A signed GitHub delivery to `slug`'s webhook, as bytes on the wire."""
    headers = {"Content-Type": "application/json", **github_headers(body, delivery=delivery)}
    if not chunked:
        return head("POST", f"/hooks/github/{slug}/", headers, len(body)) + body
    headers["Transfer-Encoding"] = "chunked"
    middle = len(body) // 2
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:middle], body[middle:])
    )
    return head("POST", f"/hooks/github/{slug}/", headers) + chunks + b"0\r\n\r\n"


class EventStream:
    """A page's event stream read as it comes, on a connection of its own."""

    def __init__(self, web, path, cookie):
        self.web = web
        self.path = path
        self.received = []  # every event so far, heartbeats included: what a failure shows
        self.sock = connect(web)
        self.sock.sendall(head("GET", path, {"Cookie": cookie, "Accept": "text/event-stream"}))
        self.status, self.headers, self.buffer = read_head(self.sock)

    def next_event(self):
        """The next event, heartbeats skipped; None when the server closed the stream. None
        within READ_TIMEOUT fails the test with what the stream received and the web's log."""
        deadline = time.monotonic() + READ_TIMEOUT
        while True:
            while b"\n\n" in self.buffer:
                event, self.buffer = self.buffer.split(b"\n\n", 1)
                self.received.append(event.decode(errors="replace"))
                if not event.startswith(b":"):
                    return event.decode()
            self.sock.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise AssertionError(self.silence()) from None
            if not data:
                return None
            self.buffer += data

    def silence(self):
        received = "\n".join(repr(event[:300]) for event in self.received[-10:])
        return (
            f"no event on {self.path} within {READ_TIMEOUT}s; it received, last first-to-last:\n"
            f"{received or '(nothing)'}\npartial: {self.buffer[-300:]!r}\n"
            f"the web's log (its tail):\n{self.web.log()[-6000:]}"
        )

    def close(self):
        self.sock.close()
