"""Rows through gunicorn: the GitHub webhook by slug with its signature checked, the chat
form post of a logged-in person (session and CSRF token), and an approval's answer post, each
against a reference view served by the same gunicorn (bench/urls.py) that does the same HTTP
work and one INSERT.

One gunicorn per statistics phase, started as production starts the web process (its
command in alwayson/ops/processes.py: uvicorn's workers serving ASGI; 2 workers, persistent
connections: new ones per phase, whose prepared statements plan under its statistics),
driven from another process by 4 client threads. The person logs in through the login form
once.
"""

import hashlib
import hmac
import json
import multiprocessing
import os
import re
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from datetime import timedelta
from http.cookies import SimpleCookie
from urllib.parse import urlencode

from alwayson.ops import processes

from . import common

GITHUB_SECRET = common.BENCH_ENV["ALWAYSON_GITHUB_SECRETS"]
# Requests that warm each view (its code, the workers' connections and statements) untimed.
WARM = 20
USERNAME, PASSWORD = "bench", "bench-password-0123"
CONCURRENCY = 4
WORKERS = 2
SERVER_LOG = os.path.join(tempfile.gettempdir(), "alwayson-bench-gunicorn.log")
_TOKEN = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


def counts(quick) -> dict:
    """Requests per timed run of each row."""
    return (
        {"webhook": 150, "chat": 100, "answer": 50}
        if quick
        else {
            "webhook": 1000,
            "chat": 400,
            "answer": 100,
        }
    )


def setup(quick, repeats, phases) -> dict:
    """The person (the owner of the inboxes, so an approver), 100 inboxes, and one waiting
    approval for every answer any phase will post (each is answered once)."""
    from django.contrib.auth import get_user_model

    from approvals.services import request_approval
    from bench.ingest import make_inboxes

    user, _ = get_user_model().objects.get_or_create(username=USERNAME)
    user.set_password(PASSWORD)
    user.save()
    inboxes = make_inboxes(100, "web")
    slugs = [inbox.slug for inbox in inboxes]
    per_run = counts(quick)["answer"]
    approvals = {}
    for phase in phases:
        approvals[phase] = []
        for n in range(WARM + per_run * repeats):
            inbox = inboxes[n % len(inboxes)]
            request_id = f"{phase}-{n}"
            request_approval(inbox.pk, request_id, "refund", timedelta(days=1))
            approvals[phase].append((inbox.slug, request_id))
    return {"slugs": slugs, "approvals": approvals}


class Session:
    """A browser's cookies (kept whatever their Secure flag: the bench speaks plain HTTP on
    the loopback) and the CSRF token of the last form it read."""

    def __init__(self, base):
        self.base = base
        self.cookies = {}
        self.token = None
        self.opener = urllib.request.build_opener(_NoRedirect)

    def fetch(self, path, form=None) -> tuple[int, str]:
        data = urlencode(form).encode() if form is not None else None
        request = urllib.request.Request(self.base + path, data=data, headers=self.headers())
        try:
            response = self.opener.open(request, timeout=30)
        except urllib.error.HTTPError as exc:
            response = exc
        for header in response.headers.get_all("Set-Cookie") or []:
            for name, morsel in SimpleCookie(header).items():
                self.cookies[name] = morsel.value
        text = response.read().decode(errors="replace")
        if found := _TOKEN.search(text):
            self.token = found.group(1)
        return response.status if hasattr(response, "status") else response.code, text

    def headers(self) -> dict:
        cookie = "; ".join(f"{name}={value}" for name, value in self.cookies.items())
        return {"Cookie": cookie} if cookie else {}

    def log_in(self, username, password, then):
        self.fetch("/accounts/login/")
        status, text = self.fetch(
            "/accounts/login/",
            {"csrfmiddlewaretoken": self.token, "username": username, "password": password},
        )
        if status != 302:
            raise RuntimeError(f"logging in answered {status}, not a redirect: {text[:300]}")
        # Logging in rotates the CSRF token: read the one the form carries now.
        status, _ = self.fetch(then)
        if status != 200:
            raise RuntimeError(f"{then} answered {status} after logging in")
        return self


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def _drive(base, requests, concurrency, out):
    """POST every (path, headers, body) with `concurrency` threads: requests/s, statuses."""
    pending = list(reversed(requests))
    lock = threading.Lock()
    statuses = Counter()
    opener = urllib.request.build_opener(_NoRedirect)

    def client():
        while True:
            with lock:
                if not pending:
                    return
                path, headers, body = pending.pop()
            request = urllib.request.Request(base + path, data=body, headers=headers)
            try:
                with opener.open(request, timeout=30) as response:
                    status = response.status
            except urllib.error.HTTPError as exc:
                status = exc.code
            with lock:
                statuses[status] += 1

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.put((len(requests) / (time.monotonic() - started), dict(statuses)))


def github_headers(key, body, secret=GITHUB_SECRET) -> dict:
    signature = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {
        "Content-Type": "application/json",
        "X-Hub-Signature-256": f"sha256={signature}",
        "X-GitHub-Hook-ID": "1",
        "X-GitHub-Delivery": key,
        "X-GitHub-Event": "issues",
    }


def _wait_until_serving(base, server, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"gunicorn exited with {server.returncode}")
        try:
            urllib.request.urlopen(base + "/healthz", timeout=2)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("gunicorn did not answer within a minute")


def _gunicorn(url, port):
    env = {
        **os.environ,
        **common.BENCH_ENV,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "ALWAYSON_WEB_BIND": f"127.0.0.1:{port}",
        "WEB_CONCURRENCY": str(WORKERS),
    }
    return subprocess.Popen(
        processes.local_argv(processes.PROCESSES["web"], common.ROOT),
        cwd=common.ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        # Where a 500's traceback goes (the django.request logger): named by a failed row.
        stderr=open(SERVER_LOG, "w"),  # noqa: SIM115 (the server's, for as long as it runs)
    )


def measure(url, quick, repeats, interleave, prepared, phase, only, port=8931) -> list[dict]:
    """The rows named in `only` ("webhook", "chat", "answer") under `phase`'s statistics."""
    slugs, approvals = prepared["slugs"], list(prepared["approvals"][phase])
    sizes = counts(quick)
    base = f"http://127.0.0.1:{port}"
    server = _gunicorn(url, port)
    context = multiprocessing.get_context("spawn")
    counter = Counter()
    body = json.dumps({"action": "opened", "issue": {"number": 1, "title": "a bug"}}).encode()

    def drive(requests, expected, tag):
        out = context.Queue()
        process = context.Process(target=_drive, args=(base, requests, CONCURRENCY, out))
        process.start()
        rate, statuses = out.get(timeout=600)
        process.join()
        if set(statuses) != {expected}:
            raise RuntimeError(
                f"{tag}: unexpected answers {statuses}, expected all {expected}"
                f" (the server's log: {SERVER_LOG})"
            )
        return rate

    def webhook(prefix, tag):
        def run(size=sizes["webhook"]):
            counter[tag] += 1
            requests = []
            for n in range(size):
                key = f"{phase}-{tag}-{counter[tag]}-{n}"
                slug = slugs[n % len(slugs)]
                requests.append((prefix.format(slug=slug), github_headers(key, body), body))
            return drive(requests, 202, tag)

        return run

    def form_headers(session):
        return {**session.headers(), "Content-Type": "application/x-www-form-urlencoded"}

    def chat(session, prefix, tag):
        def run(size=sizes["chat"]):
            headers = form_headers(session)
            requests = []
            for n in range(size):
                form = {
                    "csrfmiddlewaretoken": session.token,
                    "message_id": str(uuid.uuid4()),
                    "text": "Where is my parcel? It was due on Monday.",
                }
                path = prefix.format(slug=slugs[n % len(slugs)])
                requests.append((path, headers, urlencode(form).encode()))
            return drive(requests, 302, tag)

        return run

    def answer(session, prefix, tag):
        def run(size=sizes["answer"]):
            # The product's view answers a waiting approval once; the reference's only
            # stores, so it gets keys of its own.
            counter[tag] += 1
            headers = form_headers(session)
            requests = []
            for n in range(size):
                if tag == "answer":
                    slug, request_id = approvals.pop()
                else:
                    slug, request_id = slugs[n % len(slugs)], f"{phase}-{counter[tag]}-{n}"
                form = {"csrfmiddlewaretoken": session.token, "answer": "yes"}
                path = prefix.format(slug=slug, request_id=request_id)
                requests.append((path, headers, urlencode(form).encode()))
            return drive(requests, 302, tag)

        return run

    try:
        _wait_until_serving(base, server)
        session = Session(base).log_in(USERNAME, PASSWORD, f"/inbox/{slugs[0]}/")
        shapes = {
            "webhook": (
                "webhook: GitHub by slug, signed, gunicorn",
                webhook("/hooks/github/{slug}/", "hook"),
                webhook("/bench/raw/{slug}/", "raw"),
            ),
            "chat": (
                "chat form post: session + CSRF, gunicorn",
                chat(session, "/inbox/{slug}/", "chat"),
                chat(session, "/bench/chat/{slug}/", "chat-ref"),
            ),
            "answer": (
                "approval answer post: session + CSRF, gunicorn",
                answer(session, "/approvals/{slug}/{request_id}/", "answer"),
                answer(session, "/bench/answer/{slug}/{request_id}/", "answer-ref"),
            ),
        }
        rows = []
        for name in ("webhook", "chat", "answer"):
            if name not in only:
                continue
            title, ours, theirs = shapes[name]
            ours(WARM), theirs(WARM)
            result = interleave((ours, theirs), repeats)
            rows.append(
                common.row(
                    title,
                    unit="requests/s",
                    goal=0.8,
                    key=f"web.{name}",
                    phase=phase,
                    clients=WORKERS,
                    **result,
                )
            )
        return rows
    finally:
        server.terminate()
        server.wait(30)
