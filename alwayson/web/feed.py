"""A conversation pushed to its open pages at the cost of its changes, not of its pages
(docs/explanation/live-pages.md, "One read per change, not one per page").

Each web process keeps one Feed per inbox with an open conversation page. A change is read once,
in one of the hub's threads, and the entries whose fingerprint moved are rendered once per
person looking (what a person sees depends on who they are), making a new State, an immutable
revision of the conversation. Every open page takes what it lacks from that State in memory: a
patch, or the whole region when it shows none of the feed's revisions. No statement and no
rendering per page.
"""

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass, field
from datetime import datetime

from django.contrib.auth import get_user_model
from django.db import connection, transaction

from approvals.models import is_operator
from inbox import clock
from inbox.models import Inbox, Role

from . import conversation, live

log = logging.getLogger(__name__)

GONE = "event: gone\ndata: \n\n"
RETRY_AFTER_ERROR = 1.0  # seconds before a feed whose read failed reads again


@dataclass(frozen=True)
class View:
    """One person's rendering of the conversation."""

    user: object
    answerer: bool
    html: dict[str, str]  # entry key -> its <li>, as this person sees it
    rendered_at: dict[str, int]  # entry key -> the revision that last rendered it
    built_at: int  # rendered whole at this revision: a page from before gets the region


@dataclass(frozen=True)
class State:
    """The conversation at one revision of this process's feed."""

    revision: int
    cursor: str
    inbox: Inbox | None  # None: the inbox is gone, and every page with it
    now: datetime | None = None
    order: tuple[str, ...] = ()
    fingerprints: dict[str, tuple] = field(default_factory=dict)
    working: bool = False
    working_at: int = 0  # the revision at which `working` last changed
    shape_at: int = 0  # the revision at which the list last became empty or not
    order_at: int = 0  # the revision at which the entries' order last changed
    views: dict[int, View] = field(default_factory=dict)  # user id -> their view
    checked: frozenset = frozenset()  # the people whose role this read checked
    messages: dict = field(default_factory=dict, compare=False)  # encoded, per (user, since)


def read(inbox_id, previous: State | None, people: set[int]) -> State:
    """The inbox as it is now, against `previous`: a new State, or `previous` itself when
    nothing a page shows moved. `people` are the users with open pages; one without a view
    in `previous` has it rendered whole. All of it as of one instant, so that a State's
    cursor says what its entries show."""
    with one_snapshot():
        return _read(inbox_id, previous, people)


@contextlib.contextmanager
def one_snapshot():
    """Every statement inside sees the database as the first one did: on PostgreSQL, a
    REPEATABLE READ transaction, read-only (it never waits for a writer, nor one for it).
    Elsewhere a plain transaction: nothing pushes there (live.push_available), and SQLite's
    (IMMEDIATE) keeps writers out meanwhile. Inside a caller's transaction, that one's
    isolation: only the first statement of a transaction may set it."""
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield


def _read(inbox_id, previous: State | None, people: set[int]) -> State:
    inbox = live.INBOX_WITH_CURSOR.get(id=inbox_id)
    revision = (previous.revision if previous else 0) + 1
    if inbox is None:
        return State(revision, "", None, checked=frozenset(people))
    cursor = live.cursor_of(inbox)
    now = clock.database_now()
    entries = conversation.entries(inbox, now)
    allowed = _audience(inbox, people)
    working = bool(inbox.live_held)

    last = previous if previous is not None and previous.inbox is not None else None
    order = tuple(entry.key for entry in entries)
    fingerprints = {entry.key: entry.fingerprint for entry in entries}
    old_prints = last.fingerprints if last else {}
    moved = {key for key, value in fingerprints.items() if old_prints.get(key) != value}

    views = {}
    for user_id, (user, answerer) in allowed.items():
        old = last.views.get(user_id) if last else None
        whole = old is None or old.answerer != answerer
        html, rendered_at = {}, {}
        for entry in entries:
            if whole or entry.key in moved or entry.key not in old.html:
                html[entry.key] = conversation.render_entry(
                    entry,
                    inbox=inbox,
                    now=now,
                    user=user,
                    answerer=answerer,
                    csrf_token=conversation.NO_TOKEN,
                )
                rendered_at[entry.key] = revision
            else:
                html[entry.key] = old.html[entry.key]
                rendered_at[entry.key] = old.rendered_at[entry.key]
        views[user_id] = View(
            user, answerer, html, rendered_at, revision if whole else old.built_at
        )

    unchanged = (
        last is not None
        and not moved
        and order == last.order
        and cursor == last.cursor
        and working == last.working
        and views.keys() == last.views.keys()
        and last.checked == people
        and all(view.built_at < revision for view in views.values())
    )
    if unchanged:
        return last
    return State(
        revision,
        cursor,
        inbox,
        now=now,
        order=order,
        fingerprints=fingerprints,
        working=working,
        working_at=revision if last is None or working != last.working else last.working_at,
        shape_at=revision if last is None or bool(order) != bool(last.order) else last.shape_at,
        order_at=revision if last is None or order != last.order else last.order_at,
        views=views,
        checked=frozenset(people),
    )


def _audience(inbox, people) -> dict[int, tuple]:
    """Of `people`, those who may see the conversation now (active, at least a viewer of
    the inbox), each with whether they may answer its approvals: {user id: (user, answers)}."""
    if not people:
        return {}
    users = get_user_model().objects.filter(pk__in=people, is_active=True)
    found = {user.pk: user for user in users}
    roles = inbox.roles_of(found)
    return {
        user_id: (user, roles[user_id] >= Role.APPROVER or is_operator(user))
        for user_id, user in found.items()
        if user_id in roles
    }


def message(state: State, user_id: int, since: int | None) -> str | None:
    """What a page of `user_id` showing revision `since` (None: none of this feed's) is sent
    to show `state`: GONE, the whole region, a patch, or None when it shows it already.
    Encoded once per (person, revision shown), for every page that shares them."""
    view = state.views.get(user_id)
    if view is None:
        return GONE
    if since is not None and since >= state.revision:
        return None
    key = (user_id, since)
    if key not in state.messages:
        state.messages[key] = _encode(state, view, since)
    return state.messages[key]


def _encode(state: State, view: View, since: int | None) -> str:
    if since is None or since < view.built_at or since < state.shape_at:
        items = [view.html[key] for key in state.order]
        region = conversation.render_region(
            inbox=state.inbox, items=items, working=state.working, cursor=state.cursor
        )
        return live.sse(state.cursor, region)
    items = {key: view.html[key] for key in state.order if view.rendered_at[key] > since}
    if not items and state.order_at <= since and state.working_at <= since:
        # A revision that moved nothing this person sees (another person's page opened,
        # a change to what they may see only): nothing to send. A reconnect from the older
        # cursor still gets the whole region.
        return None
    change = {"order": state.order, "items": items}
    if state.working_at > since:
        change["working"] = conversation.render_working(state.working)
    return f"event: patch\nid: {state.cursor}\ndata: {json.dumps(change)}\n\n"


class Page:
    """One open page's stream: whose it is and the revision it shows."""

    def __init__(self, user_id, since_cursor):
        self.user_id = user_id
        self.since_cursor = since_cursor
        self.revision: int | None = None
        self.wake = asyncio.Event()
        self.beat = False  # a heartbeat is due (Feed._beat)

    def next_message(self, state: State | None) -> str | None:
        if state is None or (state.inbox is not None and self.user_id not in state.checked):
            return None  # its person's first read is under way
        if self.revision is None and state.inbox is not None and self.since_cursor == state.cursor:
            # It was rendered at this very cursor: it shows this revision already.
            self.revision = state.revision
        sent = message(state, self.user_id, self.revision)
        self.revision = state.revision
        return sent


class Feed:
    """One inbox's conversation in this process, for all of its open pages."""

    def __init__(self, hub, inbox_id):
        self.hub = hub
        self.inbox_id = inbox_id
        self.topic = f"inbox:{inbox_id}"
        self.state: State | None = None
        self.pages: set[Page] = set()
        self.wake = hub.subscribe(self.topic)
        loop = asyncio.get_running_loop()
        self.task = loop.create_task(self.run())
        # One timer for every page of the feed, not a timeout per page per wait: a change
        # then costs each page a wake and a send, nothing to arm and cancel.
        self.beating = loop.call_later(live.HEARTBEAT, self._beat)

    def open(self, user_id, since_cursor) -> Page:
        page = Page(user_id, since_cursor)
        if self.state is None or user_id not in self.state.views:
            self.wake.set()  # a read renders their view
        self.pages.add(page)
        return page

    def close(self, page):
        self.pages.discard(page)
        if not self.pages:
            self.hub.drop_feed(self)

    def _beat(self):
        """Every HEARTBEAT seconds, a heartbeat for every page: none is silent for longer,
        whatever it was sent meanwhile (the proxies in front close a silent connection)."""
        for page in self.pages:
            page.beat = True
            page.wake.set()
        self.beating = asyncio.get_running_loop().call_later(live.HEARTBEAT, self._beat)

    async def run(self):
        """Read and render once per change while pages are open; wake every page after."""
        await self.hub.watching()
        # A change whose trigger ran before this inbox's watch committed sent no NOTIFY,
        # though it may commit after the first read: one more read a moment later.
        asyncio.get_running_loop().call_later(live.SETTLE, self.wake.set)
        self.wake.set()
        while True:
            await self._wait_for_change()
            self.wake.clear()
            people = {page.user_id for page in self.pages}
            try:
                state = await self.hub.in_thread(read, self.inbox_id, self.state, people)
            except Exception:  # a database that went away, or a bug: the pages wait, not die
                log.exception("reading inbox %s for its open pages failed", self.inbox_id)
                await asyncio.sleep(RETRY_AFTER_ERROR)
                self.wake.set()
                continue
            if state is not self.state:
                self.state = state
                for page in self.pages:
                    page.wake.set()

    async def _wait_for_change(self):
        """Until a change is notified; while a run holds the lease, at most a heartbeat: a
        run that dies lets its lease lapse without a write, and the pages must stop saying
        the agent is working. One read per inbox, not per page."""
        held = self.state is not None and self.state.working
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), live.HEARTBEAT if held else None)

    async def stop(self):
        self.beating.cancel()
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        self.hub.unsubscribe(self.topic, self.wake)


def stream(inbox_id, user_id, since_cursor):
    """The conversation's event stream for one page of `user_id`."""

    async def events():
        feed = live.hub().feed(inbox_id, Feed)
        page = feed.open(user_id, since_cursor)
        try:
            yield f"retry: {live.RETRY_MS}\n\n"
            while True:
                page.wake.clear()
                sent = page.next_message(feed.state)
                if sent is not None:
                    yield sent
                    if sent is GONE:
                        return
                    continue
                if page.beat:
                    page.beat = False
                    yield ": heartbeat\n\n"
                    continue
                await page.wake.wait()
        finally:
            feed.close(page)

    return live.event_stream(events())
