"""Live pages in a browser (alwayson/web/live.py, feed.py, static/alwayson/live.js): Chromium
against the production web command (alwayson/ops/processes.py: gunicorn with alwayson's
worker, which hands the streams to its event loop) on the PostgreSQL test database. A reply
reaches fifty open pages by push, not by any poll; a page whose web process is killed
reconnects when it is back and shows what was written meanwhile, without a reload; a card
pushed to a page is answered from it.

The ORM calls here are plain synchronous code beside Playwright's loop (see test_browser.py).
"""

import os
import signal
import subprocess
import urllib.request

import pytest

from alwayson.ops.processes import PROCESSES, local_argv
from inbox import clock
from inbox.models import Inbox
from tests.browser.test_browser import CHROMIUM, CHROMIUM_ARGS, PASSWORD, TIMEOUT_MS
from tests.support.outbox import hold
from tests.support.paths import ROOT
from tests.support.processes import database_url, free_port, wait_for

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # reported by the browser fixture, as a failure
    expect = sync_playwright = None

pytestmark = [
    pytest.mark.browser,
    pytest.mark.postgres_only,
    pytest.mark.django_db(transaction=True),
]

CONTEXTS, PAGES_EACH = 10, 5  # 50 pages; a context's pages share its 6 connections per host
REPLY_WAIT_MS = 30_000


@pytest.fixture(scope="module")
def browser():
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    if sync_playwright is None:
        pytest.fail("Playwright is not installed: pip install -e '.[test]'.", pytrace=False)
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"Chromium not found at {CHROMIUM} (apt-get install chromium).", pytrace=False)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
    if previous is None:
        del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


class WebServer:
    """The production web command (one worker) on the test database, on a port that stays
    the same across a kill and a start."""

    def __init__(self, log_path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.process = None

    def start(self):
        env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "PYTHONUNBUFFERED": "1",
            "ALWAYSON_WEB_BIND": f"127.0.0.1:{self.port}",
            "WEB_CONCURRENCY": "1",
        }
        env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                local_argv(PROCESSES["web"], ROOT),
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a process group of its own, killed whole
            )
        wait_for(self.answers, 30, f"the web on {self.url} (log: {self.log_path})", period=0.1)

    def answers(self):
        assert self.process.poll() is None, self.log_path.read_text()
        try:
            with urllib.request.urlopen(f"{self.url}/accounts/login/", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def kill(self):
        """gunicorn's master and its worker at once, as a host that dies takes them: a
        worker outlives its killed master for a moment, serving its open streams."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


@pytest.fixture
def server(tmp_path):
    web = WebServer(tmp_path / "web.log")
    web.start()
    yield web
    web.kill()


@pytest.fixture
def desk(django_user_model, real_passwords):
    # Hashed with the server's own hasher: it checks the password.
    owner = django_user_model.objects.create_user(username="owner", password=PASSWORD)
    return Inbox.objects.create(owner=owner, slug="desk", name="Refund desk")


def say(inbox, body):
    return hold(inbox, body, at=clock.database_now())


def logged_in_context(browser, server):
    context = browser.new_context()
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    page.goto(f"{server.url}/accounts/login/?next=/")
    page.get_by_label("Username").fill("owner")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(f"{server.url}/")
    page.close()
    return context


def open_conversation(context, server, seen):
    page = context.new_page()
    page.on("request", lambda request: seen.append(request.url))
    page.goto(f"{server.url}/inbox/desk/")
    expect(page.locator("#conversation")).to_have_attribute(
        "data-live-stream", "/inbox/desk/stream/"
    )
    return page


def test_a_reply_reaches_fifty_open_pages_pushed_and_none_of_them_polls(browser, server, desk):
    first = logged_in_context(browser, server)
    state = first.storage_state()
    contexts = [first]
    for _ in range(CONTEXTS - 1):
        context = browser.new_context(storage_state=state)
        context.set_default_timeout(TIMEOUT_MS)
        contexts.append(context)
    seen = []
    try:
        pages = [
            open_conversation(context, server, seen)
            for context in contexts
            for _ in range(PAGES_EACH)
        ]
        assert len(pages) == 50

        say(desk, "Your refund of 42 EUR is approved.")

        for page in pages:
            expect(page.locator("#conversation")).to_contain_text(
                "Your refund of 42 EUR is approved.", timeout=REPLY_WAIT_MS
            )
        polls = [url for url in seen if "/inbox/desk/live/" in url]
        streams = [url for url in seen if "/inbox/desk/stream/" in url]
        assert polls == [], "a page polled"
        assert len(streams) == 50, "each page opened one stream, and kept it"
    finally:
        for context in contexts:
            context.close()


def test_a_page_reconnects_after_its_web_process_is_killed_and_catches_up(browser, server, desk):
    context = logged_in_context(browser, server)
    seen = []
    navigations = []
    try:
        page = open_conversation(context, server, seen)
        page.on("framenavigated", lambda frame: navigations.append(frame.url))
        page.evaluate("window.thisVeryPage = true")
        say(desk, "Before the restart.")
        expect(page.locator("#conversation")).to_contain_text("Before the restart.")

        server.kill()
        say(desk, "Written while the web process was down.")
        server.start()

        expect(page.locator("#conversation")).to_contain_text(
            "Written while the web process was down.", timeout=REPLY_WAIT_MS
        )
        assert page.evaluate("window.thisVeryPage") is True, "the page was reloaded"
        assert navigations == []
        assert len([url for url in seen if "/inbox/desk/stream/" in url]) >= 2, "no reconnect"

        say(desk, "After the restart.")
        expect(page.locator("#conversation")).to_contain_text("After the restart.")
    finally:
        context.close()


def test_an_approval_card_pushed_to_an_open_page_is_answered_from_it(browser, server, desk):
    from datetime import timedelta

    from approvals.models import Approval
    from approvals.services import request_approval

    say(desk, "Let me check that refund.")
    context = logged_in_context(browser, server)
    seen = []
    try:
        page = open_conversation(context, server, seen)
        other = open_conversation(context, server, seen)
        expect(page.locator("#conversation")).to_contain_text("Let me check that refund.")
        # Typed into the page before the push: it survives the entries pushed after it.
        request_approval(desk, "refund-1", "refund order 1", timedelta(hours=4))
        card = page.locator(".approval-card")
        expect(card).to_contain_text("Refund order 1", timeout=REPLY_WAIT_MS)
        page.locator("summary", has_text="Deny, with a reason").click()
        reason = page.get_by_label("Reason (optional; the agent reads it)")
        reason.fill("typed before the next push")
        say(desk, "Pushed while a reason was being typed.")
        expect(page.locator("#conversation")).to_contain_text("Pushed while a reason")
        expect(reason).to_have_value("typed before the next push")

        # The card came in a patch rendered once for both pages: each page's form
        # carries that page's own CSRF token, so the answer is accepted.
        other.locator(".approval-card").get_by_role("button", name="Approve").click()
        expect(other.locator(".approval-card")).to_contain_text("Approved.")
        assert Approval.objects.get(request_id="refund-1").answer == "yes"
        assert not [url for url in seen if "/inbox/desk/live/" in url], "a page polled"
    finally:
        context.close()
