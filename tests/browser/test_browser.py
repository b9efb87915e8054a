"""Browser tests: Playwright driving Debian's Chromium, headless, against a live server.

The worker, scheduler and dispatcher steps run for real in this process between browser
actions (Worker.step, run_scheduler, dispatch); email goes to Django's locmem outbox, the test
stand-in for the console email. Screenshots go to artifacts/screenshots/ (git-ignored).

Chromium is required, not optional: without it these tests fail with a message saying how to
install it (`make test` does, as root). They are never skipped, so CI cannot pass without them.

Playwright's sync API keeps an asyncio loop running in this thread, and Django refuses ORM
calls from a thread with a running loop; DJANGO_ALLOW_ASYNC_UNSAFE lifts that for this
module only (the ORM calls here are plain synchronous code).
"""

import io
import os
import re
import socket
import subprocess
import sys
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.conf import settings as django_settings
from django.core import mail
from django.core.management import call_command

from alwayson.claude.models import ModelCall
from alwayson.demo import refund_desk
from alwayson.ops.models import Process
from alwayson.runtime.worker import Worker
from approvals.models import Approval
from approvals.services import request_approval
from inbox import clock
from inbox.models import Event, Inbox, Lease
from inbox.services import acquire, ingest, release
from outbox.models import OutboxMessage
from outbox.services import dispatch, dispatch_notices
from tests.support.mail import use_email_backend
from tests.support.paths import ROOT
from tests.support.processes import free_port, wait_for
from timers.models import Timer
from timers.services import run_scheduler

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # reported by the browser fixture, as a failure
    expect = sync_playwright = None

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM = os.environ.get("ALWAYSON_TEST_CHROMIUM", "/usr/bin/chromium")
# Each new window (a context's first page) of this Chromium (156) also starts a renderer for
# its address bar's two drop-downs, WebUI pages the headless window never shows: 10 pages cost
# 8.3 s of CPU over their first 5 s with them, 2.1 without (docs/how-to/development.md,
# "Where CI's time goes"). The pages under test are untouched.
CHROMIUM_UI_OFF = "--disable-features=WebUIOmniboxPopup,WebUIOmniboxAimPopup"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    CHROMIUM_UI_OFF,
]
SCREENSHOTS = django_settings.BASE_DIR / "artifacts" / "screenshots"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
PASSWORD = "pw-browser-123"
TIMEOUT_MS = 15_000


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def allow_orm_beside_playwrights_loop():
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    yield
    if previous is None:
        del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture(scope="module")
def browser(allow_orm_beside_playwrights_loop):
    if sync_playwright is None:
        pytest.fail(
            "Playwright is not installed: make install (the test extra, from the lock).",
            pytrace=False,
        )
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"Chromium not found at {CHROMIUM}: the browser tests need Debian's Chromium. "
            "Install it with `apt-get install -y chromium` (make test does, as root), or point "
            "ALWAYSON_TEST_CHROMIUM at a Chromium binary. These tests are never skipped.",
            pytrace=False,
        )
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def new_page(browser):
    """Pages in fresh contexts (no shared cookies), closed after the test."""
    contexts = []

    def make(viewport=DESKTOP):
        context = browser.new_context(viewport=viewport)
        context.set_default_timeout(TIMEOUT_MS)
        contexts.append(context)
        return context.new_page()

    yield make
    for context in contexts:
        context.close()


@pytest.fixture
def site(live_server, settings):
    """The live server's URL; the agent's links point at it, and email stays in memory."""
    settings.ALWAYSON_SITE_URL = live_server.url
    use_email_backend(settings, "django.core.mail.backends.locmem.EmailBackend")
    mail.outbox = []
    return live_server.url


@pytest.fixture
def owner_user(django_user_model, site):
    return django_user_model.objects.create_user(
        username="owner", password=PASSWORD, email="owner@example.com"
    )


@pytest.fixture
def desk(owner_user):
    return Inbox.objects.create(owner=owner_user, slug="desk", name="Refund desk")


@pytest.fixture
def staff_user(django_user_model, site):
    return django_user_model.objects.create_superuser(
        username="operator", password=PASSWORD, email="operator@example.com"
    )


# --- helpers ---------------------------------------------------------------------------------


def screenshot(page, name):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def assert_fits_a_phone(page):
    """No sideways scrolling at phone width."""
    width = page.evaluate("document.documentElement.scrollWidth")
    viewport = page.viewport_size["width"]
    assert width <= viewport, f"{page.url} is {width}px wide in a {viewport}px viewport"


def log_in(page, site, username, next_path="/"):
    page.goto(f"{site}/accounts/login/?next={next_path}")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(f"{site}{next_path}")


def log_in_to_admin(page, site, username, next_path="/admin/", password=PASSWORD):
    page.goto(f"{site}/admin/login/?next={next_path}")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.locator("input[type=submit]").click()
    expect(page).to_have_url(f"{site}{next_path}")


def step_worker():
    # The refund desk by default; an inbox with an AgentConfig runs its own agent.
    return Worker(worker_id="browser-test", agent=refund_desk.agent).step()


def run_background_once():
    """One pass of what runall's processes do: the scheduler, the worker, the dispatcher."""
    run_scheduler()
    result = step_worker()
    dispatch()
    dispatch_notices()
    return result


# --- the walkthrough ---------------------------------------------------------------------------


def test_the_refund_walkthrough(new_page, site, desk, staff_user):
    page = new_page()

    # Log in: the inbox page sends an anonymous visitor to the login page and back.
    page.goto(f"{site}/inbox/desk/")
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/inbox/desk/$"))
    page.get_by_label("Username").fill("owner")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(f"{site}/inbox/desk/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Refund desk")

    # Post "refund order 881".
    page.get_by_label("Message to your agent").fill("refund order 881")
    page.get_by_role("button", name="Send").click()
    expect(page.get_by_role("status")).to_have_text("Sent.")
    chat = Event.objects.get(inbox=desk, source="chat")
    assert chat.payload["text"] == "refund order 881"

    # The worker runs the agent: it asks for approval and says so, with the link.
    result = run_background_once()
    assert result is not None and result.events == 1
    chat.refresh_from_db()
    assert chat.status == "done"
    link = f"{site}/approvals/desk/refund-881/"
    assert len(mail.outbox) == 1
    assert mail.outbox[0].to == ["owner@example.com"]
    assert link in mail.outbox[0].body

    # No reload: the conversation polls, and the reply and its approval card appear.
    expect(page.locator(".entry.agent").last).to_contain_text("Refund order 881?")
    expect(page.get_by_role("link", name=link)).to_have_attribute("href", link)
    expect(page.locator(".approval-card")).to_contain_text("Refund order 881")

    # The approvals page lists it; its own page has the buttons.
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Approvals").click()
    expect(page).to_have_url(f"{site}/approvals/")
    waiting = page.locator("section", has=page.locator("#waiting-heading"))
    expect(waiting).to_contain_text("Refund order 881")
    expect(waiting).to_contain_text(re.compile(r"\d+ h \d+ min left"))
    waiting.get_by_role("link", name="Refund order 881").click()
    expect(page).to_have_url(link)
    expect(page.get_by_role("heading", level=1)).to_have_text("Refund order 881?")
    expect(page.get_by_role("button", name="Approve")).to_be_visible()
    expect(page.get_by_role("button", name="Deny")).to_be_visible()
    screenshot(page, "approval-page")
    page.set_viewport_size(PHONE)
    assert_fits_a_phone(page)
    screenshot(page, "approval-page-phone")
    page.set_viewport_size(DESKTOP)

    # Approve.
    page.get_by_role("button", name="Approve").click()
    expect(page).to_have_url(link)
    expect(page.locator(".outcome")).to_have_text("Approved.")
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)
    expect(page.get_by_role("button", name="Deny")).to_have_count(0)
    screenshot(page, "approval-approved")
    assert Approval.objects.get(inbox=desk, request_id="refund-881").answer == "yes"

    # The worker runs the answer: the refund, and the message saying so.
    result = run_background_once()
    assert result is not None and result.events == 1
    assert len(mail.outbox) == 2
    assert "Refunded order 881" in mail.outbox[1].body
    assert mail.outbox[1].subject == "[desk] Refunded order 881, approved by owner"

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Inboxes").click()
    page.get_by_role("link", name="Refund desk").click()
    expect(page).to_have_url(f"{site}/inbox/desk/")
    newest = page.locator(".entry.agent").last
    expect(newest).to_contain_text("Refunded order 881")
    expect(page.locator(".entry.agent")).to_have_count(2)
    expect(page.locator(".approval-card .outcome")).to_have_text("Approved.")
    page.set_viewport_size(PHONE)
    assert_fits_a_phone(page)
    screenshot(page, "inbox-page-phone")

    # Nothing is left to do.
    assert run_background_once() is None
    assert len(mail.outbox) == 2

    # Log out; the operator finds the same events in the admin.
    page.get_by_role("button", name="Log out owner").click()
    expect(page).to_have_url(re.compile(r"/accounts/login/$"))
    page.set_viewport_size(DESKTOP)
    log_in_to_admin(page, site, "operator", "/admin/inbox/event/")
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(2)
    expect(page.locator("#result_list")).to_contain_text(chat.source_id)
    expect(page.locator("#result_list")).to_contain_text("refund-881")
    page.locator("#searchbar").fill("refund-881")
    page.locator("#changelist-search input[type=submit]").click()
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("refund-881")


# --- the live conversation ---------------------------------------------------------------------

REPLY_TIMES = SCREENSHOTS.parent / "reply-times.txt"


def mark_page(page):
    """A marker a reload would wipe: proof that what appears came without one."""
    page.evaluate("window.__noReload = true")


def assert_not_reloaded(page):
    assert page.evaluate("window.__noReload === true"), "the page reloaded"


def test_a_message_and_its_reply_appear_without_reload(new_page, site, desk):
    page = new_page(PHONE)
    log_in(page, site, "owner", "/inbox/desk/")
    page.get_by_label("Message to your agent").fill("hello?")
    page.get_by_role("button", name="Send").click()
    person = page.locator(".entry.person").last
    expect(person).to_contain_text("hello?")
    expect(person.locator(".state")).to_have_text("received")
    mark_page(page)

    assert step_worker().outcome == "said 1"  # committed when step() returns
    committed = time.monotonic()
    expect(page.locator(".entry.agent").last).to_contain_text("I'm the refund desk")
    seconds = time.monotonic() - committed
    expect(person.locator(".state")).to_have_text("answered")
    assert_not_reloaded(page)
    REPLY_TIMES.parent.mkdir(parents=True, exist_ok=True)
    with REPLY_TIMES.open("a") as times:
        times.write(f"reply visible {seconds:.3f}s after its commit\n")
    print(f"reply visible {seconds:.3f}s after its commit")
    assert_fits_a_phone(page)
    screenshot(page, "conversation-phone")


def test_the_page_says_the_agent_is_working_while_a_run_holds_the_lease(new_page, site, desk):
    page = new_page()
    log_in(page, site, "owner", "/inbox/desk/")
    mark_page(page)
    working = page.locator(".working")
    expect(working).to_have_text("")

    generation = acquire(desk, "worker-7")  # a run holds the lease
    expect(working).to_contain_text("Your agent is working…")
    screenshot(page, "conversation-working")
    release(desk, "worker-7", generation)
    expect(working).to_have_text("")
    assert_not_reloaded(page)


def test_approving_inline_with_the_keyboard_comes_back_to_the_conversation(new_page, site, desk):
    request_approval(desk, "refund-881", "refund order 881", timedelta(hours=4))
    page = new_page(PHONE)
    log_in(page, site, "owner", "/inbox/desk/")
    card = page.locator(".approval-card")
    expect(card).to_contain_text("Refund order 881")
    expect(card).to_contain_text(re.compile(r"3 h 59 min left to answer"))
    assert_fits_a_phone(page)
    screenshot(page, "conversation-approval-phone")

    card.get_by_role("button", name="Approve").focus()
    page.keyboard.press("Enter")
    expect(page).to_have_url(f"{site}/inbox/desk/")
    expect(card.locator(".outcome")).to_have_text("Approved.")
    assert Approval.objects.get(request_id="refund-881").answer == "yes"


def test_every_page_fits_a_phone(new_page, site, desk, django_user_model):
    request_approval(desk, "refund-881", "refund order 881", timedelta(hours=4))
    django_user_model.objects.create_user(username="newcomer", password=PASSWORD)
    page = new_page(PHONE)
    page.goto(f"{site}/accounts/login/")
    assert_fits_a_phone(page)
    screenshot(page, "login-phone")
    log_in(page, site, "owner")
    for name, path in (
        ("home-phone", "/"),
        ("approvals-phone", "/approvals/"),
        ("approval-detail-phone", "/approvals/desk/refund-881/"),
    ):
        page.goto(f"{site}{path}")
        assert_fits_a_phone(page)
        screenshot(page, name)
    newcomer = new_page(PHONE)
    log_in(newcomer, site, "newcomer")
    expect(newcomer.locator(".empty")).to_contain_text("Ask your administrator")
    assert_fits_a_phone(newcomer)
    screenshot(newcomer, "home-empty-phone")


def test_every_kind_of_page_has_an_icon_and_no_request_for_one_is_a_404(new_page, site):
    # The people's pages, the admin's and an error page each name the icon, and get it.
    # (A response that names none, /healthz's JSON, makes the browser ask /favicon.ico, out
    # of the page's sight: tests/web/test_views.py checks that address.)
    failed = []
    for path in ("/accounts/login/", "/admin/login/", "/no-such-page/"):
        page = new_page()  # a fresh context: no icon cached from the page before
        page.on("response", lambda r: failed.append(r.url) if r.status >= 400 else None)
        with page.expect_response(lambda r: "favicon" in r.url and r.status < 300) as icon:
            page.goto(f"{site}{path}")
        assert icon.value.status == 200, (path, icon.value.url)
        assert icon.value.headers["content-type"].startswith("image/svg+xml"), path
    assert [url for url in failed if "favicon" in url] == []


# --- an expired request --------------------------------------------------------------------


def test_an_expired_request_shows_the_expired_words_and_no_buttons(new_page, site, desk):
    approval = request_approval(desk, "refund-882", "refund order 882", timedelta(hours=4))
    past = clock.whole_seconds(clock.database_now() - timedelta(minutes=3))
    Approval.objects.filter(pk=approval.pk).update(expires_at=past)
    Timer.objects.filter(inbox=desk, key=approval.expiry_timer_key).update(due=past)
    words = f"This request expired at {past:%H:%M} UTC; nothing was done."

    page = new_page(PHONE)
    log_in(page, site, "owner", "/approvals/desk/refund-882/")

    expect(page.locator(".outcome")).to_have_text(words)
    expect(page.get_by_role("button")).to_have_count(1)  # "Log out owner", nothing else
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)
    expect(page.get_by_role("button", name="Deny")).to_have_count(0)
    assert_fits_a_phone(page)
    screenshot(page, "approval-expired-phone")
    assert not Event.objects.exists()  # looking stored nothing

    page.goto(f"{site}/approvals/")
    settled = page.locator("section", has=page.locator("#settled-heading"))
    expect(settled).to_contain_text("Refund order 882")
    expect(settled).to_contain_text(words)
    expect(page.locator("section", has=page.locator("#waiting-heading"))).to_contain_text(
        "Nothing is waiting for you."
    )

    # The expiry timer fires; the agent tells the owner nothing was refunded.
    assert run_scheduler() == 1
    assert step_worker() is not None
    dispatch()
    assert Approval.objects.get(pk=approval.pk).answer == "expired"
    assert "Did not refund order 882: nobody approved it in time." in mail.outbox[-1].body


# --- another user ----------------------------------------------------------------------------


def test_a_second_user_cannot_see_the_first_users_approvals(
    new_page, site, desk, django_user_model
):
    request_approval(desk, "refund-881", "refund order 881", timedelta(hours=4))
    django_user_model.objects.create_user(username="second", password=PASSWORD)

    page = new_page()
    log_in(page, site, "second", "/approvals/")
    expect(page.get_by_text("Nothing is waiting for you.")).to_be_visible()
    expect(page.get_by_text("No answers yet.")).to_be_visible()
    expect(page.locator("main")).not_to_contain_text("881")

    unknown = page.goto(f"{site}/approvals/desk/refund-404/")
    unknown_body = unknown.body()
    theirs = page.goto(f"{site}/approvals/desk/refund-881/")
    assert theirs.status == unknown.status == 404
    assert theirs.body() == unknown_body
    inbox = page.goto(f"{site}/inbox/desk/")
    assert inbox.status == 404

    # The owner, in another browser, still sees it waiting.
    owners = new_page()
    log_in(owners, site, "owner", "/approvals/")
    expect(owners.get_by_role("link", name="Refund order 881")).to_be_visible()
    assert Approval.objects.get().answer == ""


# --- the admin -------------------------------------------------------------------------------


def dead_event(inbox, source_id="delivery-7f3a", error="agent failed: KeyError 'order'"):
    assert ingest(inbox, "github", source_id, {"pr": 12})
    Event.objects.filter(inbox=inbox, source_id=source_id).update(
        status=Event.Status.DEAD, attempts=3, error=error
    )
    Lease.objects.filter(inbox=inbox).update(work_at=None)
    return Event.objects.get(inbox=inbox, source_id=source_id)


def test_the_admin_requeues_a_dead_event(new_page, site, desk, staff_user):
    event = dead_event(desk)
    ingest(desk, "chat", "still-pending", {"text": "hello"})

    page = new_page()
    log_in_to_admin(page, site, "operator", "/admin/inbox/event/")
    row = page.locator("#result_list tbody tr", has_text="delivery-7f3a")
    expect(row).to_have_count(1)
    row.locator('input[name="_selected_action"]').check()

    actions = page.locator('select[name="action"] option').evaluate_all(
        "options => options.map(o => [o.value, o.textContent.trim()])"
    )
    requeue = [value for value, label in actions if "requeue" in f"{value} {label}".lower()]
    assert requeue, f"no requeue action in the Event changelist; actions: {actions}"
    page.locator('select[name="action"]').select_option(requeue[0])
    page.locator('.actions button[name="index"]').click()  # "Go" (Django 5), "Run" (6)

    expect(page.locator(".messagelist")).to_contain_text(re.compile(r"\b1\b"))
    event.refresh_from_db()
    assert (event.status, event.attempts, event.error) == ("pending", 0, "")
    assert Event.objects.get(source_id="still-pending").attempts == 0
    # Back in the worker's hands: the requeued event runs again.
    assert step_worker() is not None
    event.refresh_from_db()
    assert event.status == "done"


def test_a_dead_events_page_shows_its_error_as_written_and_requeues_it(
    new_page, site, desk, staff_user
):
    error = "Traceback (most recent call last):\n  File \"agent.py\", line 3\nKeyError: 'order'"
    event = dead_event(desk, error=error)

    for name, viewport in (("admin-dead-event", DESKTOP), ("admin-dead-event-phone", PHONE)):
        page = new_page(viewport)
        log_in_to_admin(page, site, "operator", f"/admin/inbox/event/{event.pk}/change/")
        block = page.locator(".field-error_block pre")
        expect(block).to_have_text(error)
        # The indentation is kept on screen: the "File" line starts two spaces in.
        assert block.evaluate("e => getComputedStyle(e).whiteSpace") == "pre-wrap"
        expect(page.get_by_role("button", name="Requeue")).to_be_visible()
        screenshot(page, name)

    page.get_by_role("button", name="Requeue").click()
    expect(page.locator(".messagelist")).to_contain_text("1 event(s) requeued")
    expect(page.get_by_role("button", name="Requeue")).to_have_count(0)
    event.refresh_from_db()
    assert (event.status, event.attempts) == ("pending", 0)
    page.get_by_role("link", name="History").click()
    expect(page.locator("#content")).to_contain_text("Requeued: back to pending")


def test_the_admin_index_keeps_the_demo_apart_and_links_the_dashboard(new_page, site, staff_user):
    page = new_page()
    log_in_to_admin(page, site, "operator")
    expect(page.locator("#alwayson-dashboard-link a", has_text="Dashboard")).to_be_visible()
    sections = page.locator("#content-main .module caption").all_inner_texts()
    assert sections[-1].upper().startswith("DEMO"), sections
    # Internal tables (the live pages' cursor and watches) are not listed.
    expect(page.locator("#content-main")).not_to_contain_text("Live changes")
    expect(page.locator("#content-main")).not_to_contain_text("Live watchs")
    screenshot(page, "admin-index")

    # On a phone the link reads "Dashboard" on one line, not a letter a line.
    page.set_viewport_size(PHONE)
    link = page.locator("#alwayson-dashboard-link a")
    assert link.evaluate("a => a.getClientRects().length") == 1
    assert_fits_a_phone(page)
    screenshot(page, "admin-index-phone")


def test_the_admin_dashboard(new_page, site, desk, staff_user, make_inbox):
    # Something to show: done, pending and dead events, a held message, a held lease.
    other = make_inbox("ops-desk", owner=staff_user)
    ingest(desk, "chat", "m-1", {"text": "refund order 881"})
    step_worker()
    ingest(desk, "chat", "m-2", {"text": "hello"})
    dead_event(other)
    OutboxMessage.objects.create(inbox=other, body="daily digest", created=clock.database_now())
    assert acquire(other, "worker-7") is not None

    for name, viewport in (("admin-dashboard", DESKTOP), ("admin-dashboard-phone", PHONE)):
        page = new_page(viewport)
        log_in_to_admin(page, site, "operator")
        response = page.goto(f"{site}/admin/dashboard/")
        assert response.status == 200, f"/admin/dashboard/ answered {response.status}"
        expect(page.locator("#content")).to_contain_text("desk")
        expect(page.locator("#content")).to_contain_text("ops-desk")
        screenshot(page, name)


# Cells of the page's tables a person cannot see without scrolling sideways: past the
# viewport, or past the visible box of an ancestor that clips or scrolls its overflow (a
# scrollbar at the foot of a long list is no way to find the last column). With
# `scrolling`, a cell that a box scrolling sideways reaches (overflow-x: auto) counts as
# shown. Each as "table id: text".
HIDDEN_CELLS = """(scrolling) => {
  const hidden = [];
  for (const cell of document.querySelectorAll('#content table :is(th, td)')) {
    if (!cell.getClientRects().length) continue;  // not shown at this width
    let left = -Infinity, right = Infinity, scrolled = false;
    for (let box = cell.parentElement; box && !scrolled; box = box.parentElement) {
      const overflow = getComputedStyle(box).overflowX;
      if (overflow === 'visible') continue;
      const edge = box.getBoundingClientRect().left + box.clientLeft - box.scrollLeft;
      // What is outside a box that scrolls sideways bounds the box, not what it scrolls.
      scrolled = scrolling && (overflow === 'auto' || overflow === 'scroll');
      left = Math.max(left, edge);
      right = Math.min(right, edge + (scrolled ? box.scrollWidth : box.clientWidth));
    }
    if (!scrolled) {
      left = Math.max(left, 0);
      right = Math.min(right, document.documentElement.clientWidth);
    }
    const shown = cell.getBoundingClientRect();
    if (shown.left < left - 0.5 || shown.right > right + 0.5) {
      hidden.push(`${cell.closest('table').id}: ${cell.textContent.trim().slice(0, 40)}`);
    }
  }
  return hidden;
}"""


def assert_no_cell_hidden(page, scrolling=False):
    assert_fits_a_phone(page)  # no sideways scrolling of the page itself, at any width
    hidden = page.evaluate(HIDDEN_CELLS, scrolling)
    width = page.viewport_size["width"]
    assert hidden == [], f"{page.url} at {width}px hides {len(hidden)} cells: {hidden[:8]}"


def busy_processes(now, count=24):
    """Loop processes as a fleet on Kubernetes records them: pod names, host:pid ids."""

    kinds = ["worker", "worker", "scheduler", "dispatcher"]
    Process.objects.bulk_create(
        Process(
            kind=kinds[n % 4],
            worker_id=f"alwayson-{kinds[n % 4]}-7d9f8c6b5-x{n:02d}q4:{4100 + n}",
            host=f"alwayson-{kinds[n % 4]}-7d9f8c6b5-x{n:02d}q4",
            pid=4100 + n,
            version="0.1.0",
            started=now - timedelta(hours=n),
            last_beat=now - timedelta(seconds=n),
            stopped=now if n % 5 == 4 else None,
            runs=1234567 * n,
        )
        for n in range(count)
    )


TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/agents/acme/refunds.py", line 41, in agent\n'
    '    payments.refund(order, idempotency_key=run.key("refund", event))\n'
    "requests.exceptions.ConnectionError: payments.acme.example.com: connection refused"
)


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1280px", "390px"])
def test_the_admins_tables_show_every_column(new_page, site, desk, staff_user, viewport):
    now = clock.database_now()
    busy_processes(now)
    ingest(desk, "chat", "m-1", {"text": "refund order 881"})
    dead_event(desk)
    # A dead event as the worker stores its error (a traceback), under a delivery's UUID.
    dead_event(desk, "3f0c2a9e-5b7d-4c1e-9a8f-2d6b7e4c1a90", TRACEBACK)
    OutboxMessage.objects.create(inbox=desk, body="daily digest", created=now)
    assert acquire(desk, "alwayson-worker-7d9f8c6b5-x00q4:4100") is not None
    ModelCall.objects.bulk_create(
        ModelCall(
            inbox=desk,
            request_key=f"{n:064d}",
            generation=n,
            model="claude-sonnet-5-5",
            response={"content": []},
            input_tokens=123456 * n,
            output_tokens=7890 * n,
            cache_read_tokens=45678 * n,
            cache_write_tokens=1234 * n,
            created=now,
        )
        for n in range(1, 12)
    )
    page = new_page(viewport)
    log_in_to_admin(page, site, "operator")
    width = viewport["width"]

    # Every cell in sight, but for a changelist on a phone: Django's list scrolls sideways
    # in its own box there, and the page does not.
    for name, path, scrolling in (
        ("processes", "/admin/alwayson_ops/process/", viewport == PHONE),
        ("dead-events", "/admin/inbox/event/?status__exact=dead", viewport == PHONE),
        ("dashboard", "/admin/dashboard/", False),
    ):
        page.goto(f"{site}{path}")
        # The dashboard's charts keep their numbers under a closed <details>: the first
        # table in sight is the first one outside them.
        expect(page.locator("#content table:not(details table)").first).to_be_visible()
        screenshot(page, f"admin-{name}-{width}")
        assert_no_cell_hidden(page, scrolling)

    # A traceback's first line says only that it is one: the list shows the exception.
    page.goto(f"{site}/admin/inbox/event/?status__exact=dead")
    row = page.locator("#result_list tbody tr", has_text="3f0c2a9e")
    expect(row.locator("td.field-error_excerpt")).to_have_text(
        re.compile(r"^requests\.exceptions\.ConnectionError: payments\.acme")
    )
    expect(page.locator("#result_list")).not_to_contain_text("Traceback")


# --- a Claude agent's tool call, approved in the browser ---------------------------------------


def test_a_person_approves_a_claude_tool_call_and_sees_the_follow_up(
    new_page, site, desk, messages_api
):
    from alwayson.demo.models import Refund
    from alwayson.runtime.models import AgentConfig
    from alwayson.testing.model import message, tool_use

    AgentConfig.objects.create(
        inbox=desk,
        agent="alwayson.claude.agent",
        policy={"refund": [{"when": {"amount": {"lt": 50}}, "then": "allow"}, {"then": "ask"}]},
    )
    page = new_page()
    log_in(page, site, "owner", "/inbox/desk/")
    page.get_by_label("Message to your agent").fill("Please refund order 881, 120 EUR")
    page.get_by_role("button", name="Send").click()
    expect(page.get_by_role("status")).to_have_text("Sent.")

    # The model wants a refund over the policy's limit: the run ends asking the owner.
    call = tool_use("refund", {"order": "881", "amount": 120})
    messages_api.reply(message("This refund needs approval.", call))
    assert run_background_once().outcome == "asked 1, said 1"
    notice = page.locator(".entry.agent").last  # the conversation updates itself
    expect(notice).to_contain_text("Approval needed: refund order 881 (120 EUR)")

    # The approval page shows the tool, its arguments and who asked.
    notice.locator(".body").get_by_role("link").click()  # the approval page's address
    expect(page.get_by_role("heading", level=1)).to_have_text("Refund order 881 (120 EUR)?")
    details = page.get_by_label("What you are asked to approve")
    expect(details).to_contain_text("refund")
    arguments = details.locator("table.arguments")
    expect(arguments.locator("tr", has_text="order")).to_contain_text("881")
    expect(arguments.locator("tr", has_text="amount")).to_contain_text("120")
    expect(details).to_contain_text("the Claude agent of desk (claude-sonnet-5-5)")
    expect(details).to_contain_text("a chat message from owner: “Please refund order 881, 120 EUR”")
    screenshot(page, "claude-approval-page")
    page.set_viewport_size(PHONE)
    assert_fits_a_phone(page)
    screenshot(page, "claude-approval-page-phone")
    page.set_viewport_size(DESKTOP)
    page.get_by_role("button", name="Approve").click()
    expect(page.locator(".outcome")).to_have_text("Approved.")

    # The next run resumes the call: the refund runs, the model reads its result and says so.
    follow_up = tool_use("send_message", {"text": "Refunded 120 EUR on order 881.", "urgent": True})
    messages_api.reply(message(follow_up), message("Done."))
    assert run_background_once().outcome == "said 1"
    assert Refund.objects.get().order == "881"
    resumed = messages_api.messages_requests[1].body["messages"][-1]["content"][0]
    assert (resumed["type"], resumed["tool_use_id"]) == ("tool_result", call["id"])

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Inboxes").click()
    page.get_by_role("link", name="Refund desk").click()
    expect(page.locator(".entry.agent").last).to_contain_text("Refunded 120 EUR on order 881.")
    screenshot(page, "claude-follow-up")
    assert run_background_once() is None
    assert len(messages_api.messages_requests) == 3


# --- a team: two approvers for a refund above the threshold ------------------------------------


def test_two_approvers_in_two_browsers_approve_a_big_refund(
    new_page, site, desk, django_user_model
):
    from django.contrib.auth.models import Group

    from inbox.models import Membership, Role

    finance = Group.objects.create(name="finance")
    Membership.objects.create(inbox=desk, group=finance, role=Role.APPROVER)
    for name in ("dana", "lee"):
        user = django_user_model.objects.create_user(
            username=name,
            password=PASSWORD,
            first_name=name.capitalize(),
            email=f"{name}@example.com",
        )
        user.groups.add(finance)

    # Dana asks the desk for a refund above the threshold (500).
    dana = new_page()
    log_in(dana, site, "dana", "/inbox/desk/")
    dana.get_by_label("Message to your agent").fill("refund order 881 for 750")
    dana.get_by_role("button", name="Send").click()
    expect(dana.get_by_role("status")).to_have_text("Sent.")
    mark_page(dana)

    # The agent asks for two approvers; each approver gets an email with the link.
    assert run_background_once().outcome == "asked 1, said 1"
    link = f"{site}/approvals/desk/refund-881/"
    notices = {m.to[0]: m for m in mail.outbox if m.to[0] != "owner@example.com"}
    assert sorted(notices) == ["dana@example.com", "lee@example.com"]
    for message in notices.values():
        assert link in message.body
        assert message.subject == "[desk] Approval needed: Refund order 881 for 750"
        assert re.fullmatch(r"<[0-9a-f]{32}@alwayson>", message.extra_headers["Message-ID"])
    card = dana.locator(".approval-card")
    expect(card).to_contain_text("Refund order 881 for 750")
    expect(card).to_contain_text("Needs two different approvers")
    expect(dana.locator(".entry.agent").last).to_contain_text("two different approvers")

    # Dana approves on the card: a first approval, waiting for a second approver.
    card.get_by_role("button", name="Approve").click()
    expect(dana).to_have_url(f"{site}/inbox/desk/")
    expect(card.locator(".waiting-second")).to_have_text(
        "You approved; waiting for a second, different approver."
    )
    expect(card.get_by_role("button", name="Approve")).to_have_count(0)
    assert Approval.objects.get().answer == ""
    assert run_background_once() is None  # nothing for the agent yet
    mark_page(dana)

    # Lee, in another browser, follows the link in his email.
    lee = new_page()
    log_in(lee, site, "lee", "/approvals/desk/refund-881/")
    expect(lee.locator(".waiting-second")).to_contain_text(
        "Dana approved. It needs your approval as the second, different approver."
    )
    screenshot(lee, "two-person-second-approver")
    lee.get_by_role("button", name="Approve").click()
    expect(lee.locator(".outcome")).to_have_text("Approved.")
    expect(lee.locator(".answered-by")).to_have_text("Dana and Lee")

    # The agent refunds and names both; Dana sees it without reloading, and nothing on her
    # page still says the request waits for a second approver.
    assert run_background_once().outcome == "said 1"
    reply = "Refunded order 881, approved by Dana and Lee"
    expect(dana.locator(".entry.agent").last).to_contain_text(reply)
    expect(card.locator(".outcome")).to_have_text("Approved.")
    expect(card.locator(".answered-by")).to_have_text("Answered by Dana and Lee")
    expect(dana.locator("main")).not_to_contain_text("second, different approver")
    assert_not_reloaded(dana)
    screenshot(dana, "two-person-approved")
    assert reply in mail.outbox[-1].body  # and the owner's email says so
    approval = Approval.objects.get()
    assert (approval.first_approved_by.username, approval.answered_by.username) == ("dana", "lee")


# --- approvals people act on: an edit, a reason ------------------------------------------------


def claude_desk(desk, django_user_model):
    """The desk runs the Claude agent: refunds above 500 need two approvers, others ask."""
    from alwayson.runtime.models import AgentConfig
    from inbox.models import Membership, Role

    AgentConfig.objects.create(
        inbox=desk,
        agent="alwayson.claude.agent",
        policy={
            "refund": [
                {"when": {"amount": {"gt": 500}}, "then": "ask", "approvers": 2},
                {"then": "ask"},
            ]
        },
    )
    for name in ("dana", "lee"):
        user = django_user_model.objects.create_user(
            username=name, password=PASSWORD, first_name=name.capitalize()
        )
        Membership.objects.create(inbox=desk, user=user, role=Role.APPROVER)


def test_an_approver_edits_the_amount_by_keyboard_on_a_phone_and_a_second_approves_it(
    new_page, site, desk, messages_api, django_user_model
):
    from alwayson.demo.models import Refund
    from alwayson.testing.model import message, tool_use
    from tests.support import claude_tools

    claude_desk(desk, django_user_model)
    ingest(desk, "chat", "m1", {"text": "refund order 881 in full, 900 EUR", "from": "owner"})
    call = tool_use("refund", {"order": "881", "amount": 900})
    messages_api.reply(message("This needs two approvers.", call))
    assert run_background_once().outcome == "asked 1, said 1"
    approval = Approval.objects.get()
    assert approval.approvers_needed == 2

    # Dana, on a phone, with the keyboard only: open the arguments, lower the amount, approve.
    dana = new_page(PHONE)
    log_in(dana, site, "dana", approval.get_absolute_url())
    toggle = dana.get_by_text("Change the arguments before approving")
    toggle.focus()
    dana.keyboard.press("Enter")
    amount = dana.get_by_label("amount", exact=True)
    expect(amount).to_be_visible()
    expect(amount).to_have_value("900")
    dana.keyboard.press("Tab")
    expect(dana.get_by_label("order", exact=True)).to_be_focused()
    dana.keyboard.press("Tab")
    expect(amount).to_be_focused()
    dana.keyboard.press("Control+A")
    dana.keyboard.type("600")
    assert_fits_a_phone(dana)
    screenshot(dana, "approval-edit-phone")
    approve = dana.get_by_role("button", name="Approve", exact=True)
    for _ in range(4):  # past the reason's summary to the button, whatever lies between
        if approve.evaluate("button => button === document.activeElement"):
            break
        dana.keyboard.press("Tab")
    expect(approve).to_be_focused()
    dana.keyboard.press("Enter")
    expect(dana.get_by_role("status").first).to_contain_text(
        "Your approval as you changed it is recorded. A second, different approver must also"
    )
    assert run_background_once() is None  # a first approval: nothing for the agent yet

    # Lee sees what Dana changed and approves it as it is.
    lee = new_page()
    log_in(lee, site, "lee", approval.get_absolute_url())
    changes = lee.locator(".changes")
    expect(changes).to_contain_text("By Dana:")
    expect(changes).to_contain_text("amount: 900 → 600")
    lee.get_by_role("button", name="Approve", exact=True).click()
    expect(lee.locator(".outcome")).to_have_text("Approved.")
    expect(lee.locator(".answered-by")).to_have_text("Dana and Lee")

    # The tool runs once, with the edited amount; the model reads what changed and by whom.
    messages_api.reply(message("Refunded 600 EUR."))
    assert run_background_once().outcome == "quiet"
    assert [a for _, a, _, _ in claude_tools.CALLS] == [{"order": "881", "amount": 600}]
    assert Refund.objects.count() == 1
    [result] = messages_api.messages_requests[1].body["messages"][-1]["content"]
    assert result["tool_use_id"] == call["id"]
    assert result["content"].startswith(
        f"Dana (dana) changed the arguments before approving (approval {approval.request_id}):"
        " amount: 900 → 600."
    )
    assert run_background_once() is None


def test_a_denial_with_a_reason_typed_on_the_card_survives_a_live_update_and_reaches_the_model(
    new_page, site, desk, messages_api, django_user_model
):
    from alwayson.testing.model import message, tool_use

    claude_desk(desk, django_user_model)
    ingest(desk, "chat", "m1", {"text": "refund order 881, 120 EUR", "from": "owner"})
    call = tool_use("refund", {"order": "881", "amount": 120})
    messages_api.reply(message(call))
    assert run_background_once().outcome == "asked 1, said 1"

    page = new_page(PHONE)
    log_in(page, site, "owner", "/inbox/desk/")
    card = page.locator(".approval-card")
    card.get_by_text("Deny, with a reason").focus()
    page.keyboard.press("Enter")
    reason = card.get_by_label("Reason (optional; the agent reads it)")
    page.keyboard.press("Tab")
    expect(reason).to_be_focused()
    page.keyboard.type("The customer already got")
    mark_page(page)

    # Something else happens in the conversation while the owner types: the page updates,
    # and what they typed, the open reason and the focus stay.
    ingest(desk, "chat", "m2", {"text": "also: parcel arrived", "from": "lee"})
    expect(page.locator(".entry.person").last).to_contain_text("also: parcel arrived")
    assert_not_reloaded(page)
    expect(reason).to_be_focused()
    expect(reason).to_have_value("The customer already got")
    page.keyboard.type(" a voucher.")
    assert_fits_a_phone(page)
    screenshot(page, "approval-deny-reason-phone")
    page.keyboard.press("Tab")
    expect(card.get_by_role("button", name="Approve")).to_be_focused()
    page.keyboard.press("Tab")
    expect(card.get_by_role("button", name="Deny")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page).to_have_url(f"{site}/inbox/desk/")
    expect(card.locator(".outcome")).to_have_text("Denied.")
    expect(card.locator(".reason")).to_have_text("Reason: The customer already got a voucher.")

    messages_api.reply(message("Understood."))
    assert run_background_once().outcome == "quiet"
    result = messages_api.messages_requests[1].body["messages"][-1]["content"][0]
    assert (result["tool_use_id"], result["is_error"]) == (call["id"], True)
    assert result["content"].endswith("The reason owner gave: The customer already got a voucher.")


def test_a_turns_calls_answered_all_at_once_on_a_phone(new_page, site, desk, django_user_model):
    schema = {
        "type": "object",
        "properties": {
            "order": {"type": "string"},
            "amount": {"type": "number"},
            "lines": {"type": "array", "items": {"type": "string"}},
        },
    }
    for n in (1, 2):
        details = {
            "tool": "refund",
            "arguments": {"order": str(n), "amount": 100 * n},
            "schema": schema,
        }
        request_approval(
            desk,
            f"refund-{n}",
            f"refund order {n}",
            timedelta(hours=4),
            details=details,
            group="refund-1",
        )
    page = new_page(PHONE)
    log_in(page, site, "owner", "/inbox/desk/")
    card = page.locator(".approval-card")
    expect(card).to_contain_text("Your agent asks about 2 calls of one turn")
    for toggle in card.get_by_text("Change the arguments before approving").all():
        toggle.click()
    assert_fits_a_phone(page)
    screenshot(page, "approval-group-card-phone")

    page.goto(f"{site}/approvals/desk/refund-2/")
    expect(page.get_by_role("heading", level=1)).to_have_text("2 calls asked in one turn")
    for toggle in page.get_by_text("Change the arguments before approving").all():
        toggle.click()
    assert_fits_a_phone(page)
    screenshot(page, "approval-group-page-phone")
    approve_all = page.get_by_role("button", name="Approve all")
    approve_all.focus()
    page.keyboard.press("Enter")
    expect(page.get_by_role("status").first).to_contain_text(
        "Your answer was recorded for 2 call(s): 2 approved."
    )
    expect(page.locator(".outcome")).to_have_text(["Approved.", "Approved."])
    assert set(Approval.objects.values_list("answer", flat=True)) == {"yes"}


def test_the_dashboard_charts_fit_a_phone(new_page, site, desk, staff_user):

    from inbox.models import RunRecord

    now = clock.database_now()
    for g in range(1, 30):
        started = now - timedelta(minutes=g % 55 + 1)
        RunRecord.objects.create(
            inbox=desk,
            generation=g,
            worker="w",
            started=started,
            # Fractions of a second, as runs take: the scale must not read 7.592627.
            ended=started + timedelta(seconds=g % 7 + 1, microseconds=592_627),
            outcome="done" if g % 4 else "error",
            waiting_since=started - timedelta(seconds=g % 11),
        )
    # Something for every chart: dead events, sent and held messages, tokens against a budget.
    from alwayson.runtime.models import AgentConfig

    for n in range(1, 6):
        moment = now - timedelta(minutes=7 * n)
        Event.objects.create(
            inbox=desk,
            source="chart",
            source_id=str(n),
            status="dead",
            available_at=moment,
            created=moment,
            updated=moment,
        )
        OutboxMessage.objects.create(
            inbox=desk, body="b", status="sent", created=moment, sent_at=moment
        )
    OutboxMessage.objects.create(inbox=desk, body="b", status="held", created=now)
    AgentConfig.objects.update_or_create(inbox=desk, defaults={"daily_token_budget": 10000})
    ModelCall.objects.create(
        inbox=desk,
        request_key="chart",
        generation=1,
        model="m",
        response={},
        input_tokens=6200,
        created=now,
    )
    for name, viewport in (("dashboard-charts", DESKTOP), ("dashboard-charts-phone", PHONE)):
        page = new_page(viewport)
        log_in_to_admin(page, site, "operator")
        page.goto(f"{site}/admin/dashboard/")
        expect(page.locator("svg.chart").first).to_be_visible()
        assert page.locator("svg.chart rect").count() > 0
        screenshot(page, name)
        # Each chart fills its column, beside its scale, rather than sitting at the SVG's
        # default 300 px; the scale and the time span are read beside it.
        svg = page.locator("svg.chart").first.bounding_box()
        column = page.locator(".chart-block").first.bounding_box()
        scale = page.locator(".chart-frame .chart-y").first.bounding_box()
        assert svg["width"] + scale["width"] >= column["width"] - 10
        assert svg["x"] >= scale["x"] + scale["width"]
        expect(page.locator(".chart-frame .chart-x").first).to_be_visible()
        expect(page.locator(".chart-legend").first).to_contain_text("done")
        if viewport is DESKTOP:
            assert svg["width"] > 320
        expect(page.locator("svg.chart.bars")).to_contain_text("of 10,000 (62%)")
        # Scales read as a person writes numbers (no 0.592627), and the day's span has dates.
        scales = page.locator(".chart-frame .chart-y span").all_inner_texts()
        assert all(re.fullmatch(r"[\d,]+|\d\.\d|0\.0*[1-9]\d?", v) for v in scales), scales
        assert any("." in v for v in scales), scales  # the durations' p95, rounded
        day = page.locator(".chart-block", has_text="Runs per hour, last day").locator(".chart-x")
        expect(day).to_contain_text(re.compile(r"^\d\d [A-Z][a-z]{2} \d\d:00"))
        if viewport is PHONE:
            assert_fits_a_phone(page)


# --- what did my agent do? ---------------------------------------------------------------------


def test_a_message_links_to_its_run_whose_timeline_shows_the_tool_call_and_its_decision(
    new_page, site, desk, messages_api
):

    from alwayson.runtime.models import AgentConfig
    from alwayson.testing.model import message, tool_use, usage

    AgentConfig.objects.create(
        inbox=desk,
        agent="alwayson.claude.agent",
        policy={"refund": [{"when": {"amount": {"lt": 50}}, "then": "allow"}, {"then": "ask"}]},
    )
    ingest(desk, "chat", "m1", {"text": "Please refund order 7, 20 EUR", "from": "owner"})
    messages_api.reply(
        message(
            "Order 7 is under the limit: refunding it.",
            tool_use("refund", {"order": "7", "amount": 20}),
            tokens=usage(1800, 120, cache_read=900),
        ),
        message(tool_use("send_message", {"text": "Refunded 20 EUR on order 7."})),
        message("Done."),
    )
    assert run_background_once().outcome == "said 1"
    ingest(desk, "chat", "m2", {"text": "And order 881, 120 EUR", "from": "owner"})
    messages_api.reply(
        message("This one needs approval.", tool_use("refund", {"order": "881", "amount": 120}))
    )
    assert run_background_once().outcome.startswith("asked 1")

    page = new_page()
    log_in(page, site, "owner", "/inbox/desk/")
    said = page.locator(".entry.agent", has_text="Refunded 20 EUR on order 7.")
    said.get_by_role("link", name="why did it say this?").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Run #1 of Refund desk")
    tool = page.locator(".step.tool")
    expect(tool).to_contain_text("refund")
    expect(tool.locator(".badge")).to_have_text("allow")
    expect(tool).to_contain_text("Why: policy for refund, rule 1: allow")
    expect(page.locator(".step.message")).to_contain_text("Refunded 20 EUR on order 7.")

    for where, name in ((page.url, "timeline"), (f"{site}/runs/", "runs")):
        page.goto(where)
        for viewport in (DESKTOP, PHONE):
            page.set_viewport_size(viewport)
            assert_fits_a_phone(page)
            screenshot(page, f"{name}-{viewport['width']}")
        page.set_viewport_size(DESKTOP)

    # From the list, each run's link opens its timeline.
    page.get_by_role("link", name="Run 2 of desk: timeline").click()
    expect(page.locator(".step.approval")).to_contain_text("Refund order 881")


# --- memory: a person corrects what the agent remembered ---------------------------------------


def test_a_manager_corrects_a_memory_file_and_the_next_run_uses_the_correction(
    new_page, site, desk, messages_api, settings
):
    from alwayson.runtime.models import AgentConfig
    from alwayson.testing.model import memory, message, tool_use

    settings.ALWAYSON_CLAUDE_MEMORY = True
    AgentConfig.objects.create(inbox=desk, agent="alwayson.claude.agent")
    assert ingest(desk, "chat", "m1", {"text": "my refund limit is 900 EUR", "from": "owner"})
    messages_api.reply(
        message(memory("create", path="/memories/owner.md", file_text="Refund limit: 900 EUR")),
        message("Noted."),
    )
    assert run_background_once() is not None
    written_by = Lease.objects.get(inbox=desk).generation

    page = new_page()
    log_in(page, site, "owner", "/inbox/desk/")
    page.get_by_role("link", name="Memory").click()
    page.get_by_role("link", name="/memories/owner.md").click()
    history = page.get_by_label("Versions, newest first")
    expect(history.get_by_role("link", name=f"run #{written_by}")).to_have_attribute(
        "href", f"/runs/desk/{written_by}/"
    )
    page.get_by_label("Content").fill("Refund limit: 450 EUR")
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_role("status")).to_have_text("Saved /memories/owner.md.")
    expect(history.locator("li").first).to_contain_text("edited by a person by owner")
    screenshot(page, "memory-file")

    def answer_from_memory(request):
        snapshot = request.body["messages"][-1]["content"][0]["text"]
        limit = re.search(r"Refund limit: (\d+) EUR", snapshot)[1]
        return message(tool_use("send_message", {"text": f"Your refund limit is {limit} EUR."}))

    messages_api.reply(answer_from_memory, message("Done."))
    page.get_by_role("link", name="Conversation").click()
    page.get_by_label("Message to your agent").fill("What is my refund limit?")
    page.get_by_role("button", name="Send").click()
    expect(page.get_by_role("status")).to_have_text("Sent.")
    assert run_background_once().outcome == "said 1"
    expect(page.locator(".entry.agent").last).to_contain_text("Your refund limit is 450 EUR.")


# --- an MCP server's tool in the demo inbox (docs/how-to/mcp-demo-inbox.md) --------------------


@pytest.fixture
def orders_mcp(tmp_path):
    """The demo's MCP server (alwayson/demo/orders_mcp.py) as the how-to starts it: a process
    of its own, here on a free port; `printed()` is what it printed about its calls."""
    port = free_port()
    log = tmp_path / "orders_mcp.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "alwayson.demo.orders_mcp", str(port)],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def listening():
        if process.poll() is not None:
            pytest.fail(f"the demo's MCP server exited: {log.read_text()}")
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    def printed():
        return [line for line in log.read_text().splitlines() if "order_status called" in line]

    try:
        wait_for(listening, 30, "the demo's MCP server to listen")
        yield SimpleNamespace(url=f"http://127.0.0.1:{port}/mcp", printed=printed)
    finally:
        process.terminate()
        process.wait(10)


def demo_login(settings, tmp_path) -> str:
    """`make run`'s demo login and inbox (manage.py demologin, which needs DEBUG on, as `make
    run` has it; its password file in a temporary folder); the password it printed."""
    checkout = settings.BASE_DIR
    settings.DEBUG, settings.BASE_DIR = True, tmp_path
    out = io.StringIO()
    call_command("demologin", stdout=out)
    settings.DEBUG, settings.BASE_DIR = False, checkout
    return re.search(r"Demo login: demo / (\S+)", out.getvalue())[1]


def test_the_mcp_how_to_a_tools_definition_and_its_call_approved_by_a_person(
    new_page, site, settings, tmp_path, scripted_model, orders_mcp
):
    from alwayson.claude.models import McpToolDefinition, ToolResult
    from alwayson.testing.model import message, tool_use

    # 2. The settings name the server; the model is the scripted one (the Messages API in use).
    settings.ALWAYSON_MCP_SERVERS = {"orders": {"url": orders_mcp.url}}
    password = demo_login(settings, tmp_path)
    page = new_page()

    # 3. The demo inbox runs the Claude agent, offered the server's tools.
    log_in_to_admin(page, site, "demo", "/admin/alwayson/agentconfig/add/", password)
    page.locator(".field-inbox .select2-selection").click()
    page.locator(".select2-search__field").fill("demo-desk")
    page.locator(".select2-results__option", has_text="demo-desk").click()
    page.get_by_label("Agent:", exact=True).fill("alwayson.claude.agent")
    page.get_by_label("MCP servers:", exact=True).fill('["orders"]')
    page.get_by_role("button", name="Save", exact=True).click()
    expect(page.locator(".messagelist")).to_contain_text("was added successfully")

    # 4. A first question: the run lists the server's tools; the new one is withheld.
    page.goto(f"{site}/inbox/demo-desk/")
    page.get_by_label("Message to your agent").fill("Where is order 881?")
    page.get_by_role("button", name="Send").click()
    expect(page.get_by_role("status")).to_have_text("Sent.")
    cannot = "I cannot look orders up yet."
    answer = {"text": cannot, "urgent": True}
    scripted_model.reply(message(tool_use("send_message", answer)), message("Done."))
    assert run_background_once().outcome == "said 1"
    offered = [t["name"] for t in scripted_model.messages_requests[0].body["tools"]]
    assert "mcp__orders__order_status" not in offered
    expect(page.locator(".entry.agent").last).to_contain_text(cannot)

    # 5. Its definition, approved in the admin.
    page.goto(f"{site}/admin/alwayson_claude/mcptooldefinition/")
    row = page.locator("#result_list tbody tr", has_text="order_status")
    row.get_by_role("link", name="order_status").click()
    expect(page.locator(".field-diff")).to_contain_text("(none approved before)")
    expect(page.locator(".field-diff")).to_contain_text("Where an order is")
    page.go_back()
    row.locator("input.action-select").check()
    page.locator("select[name=action]").select_option(label="Approve the selected definitions")
    page.locator('.actions button[name="index"]').click()  # "Go" (Django 5), "Run" (6)
    expect(page.locator(".messagelist")).to_have_text("1 definition(s) approved.")
    assert McpToolDefinition.objects.get(name="order_status").approved_by.username == "demo"

    # 6. Asked again, the agent calls the tool: the policy asks (MCP tools' default), on a card.
    page.goto(f"{site}/inbox/demo-desk/")
    page.get_by_label("Message to your agent").fill("I approved the tool: where is order 881?")
    page.get_by_role("button", name="Send").click()
    expect(page.get_by_role("status")).to_have_text("Sent.")
    call = tool_use("mcp__orders__order_status", {"order": "881"})
    scripted_model.reply(message("Let me look it up.", call))
    assert run_background_once().outcome == "asked 1, said 1"  # the card, and its notice
    offered = {t["name"]: t for t in scripted_model.messages_requests[2].body["tools"]}
    schema = offered["mcp__orders__order_status"]["input_schema"]
    assert schema["required"] == ["order"]
    card = page.locator(".approval-card")
    expect(card).to_contain_text(re.compile(r"order_status on orders \(order: 881\)", re.I))
    screenshot(page, "mcp-approval-card")
    assert orders_mcp.printed() == []  # nothing ran before a person said yes
    card.get_by_role("button", name="Approve").click()
    expect(card.locator(".outcome")).to_have_text("Approved.")

    # 7. The next run makes the call, once; the model reads the server's answer and says it.
    said = "Order 881 shipped on 2 December by parcel post; it is due Tuesday."
    answer = {"text": said, "urgent": True}
    scripted_model.reply(message(tool_use("send_message", answer)), message("Done."))
    assert run_background_once().outcome == "said 1"
    result = scripted_model.messages_requests[3].body["messages"][-1]["content"][0]
    assert result["tool_use_id"] == call["id"]
    assert 'server="orders" tool="order_status"' in result["content"]
    assert "shipped on 2 December by parcel post, due Tuesday" in result["content"]
    assert orders_mcp.printed() == ["order_status called for order 881"]
    assert run_background_once() is None

    # 8. The answer links to its run, whose timeline shows the call, the decision and who said
    # yes.
    page.locator(".entry.agent", has_text=said).get_by_role(
        "link", name="why did it say this?"
    ).click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Run #3 of Refund desk")
    tool = page.locator(".step.tool")
    expect(tool.locator(".what")).to_contain_text("mcp__orders__order_status")
    expect(tool.locator(".badge")).to_have_text("ask")
    why = "Why: mcp__orders__order_status is not in the policy (default: ask)"
    expect(tool.locator(".why")).to_have_text(why)
    expect(tool.locator(".approved")).to_contain_text("Answered by demo")
    tool.locator(".result").get_by_text("(show all)").click()  # what the model read, whole
    expect(tool.locator(".result pre")).to_contain_text("shipped on 2 December by parcel post")
    screenshot(page, "mcp-timeline-1280")  # docs/images/mcp-timeline-1280.png
    journaled = ToolResult.objects.get(tool="mcp__orders__order_status")
    assert (journaled.decision, journaled.approval.answered_by.username) == ("ask", "demo")
