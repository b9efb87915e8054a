"""Live pages: what an open page shows is pushed to it when it changes, and costs nothing while
nothing does (docs/explanation/live-pages.md).

An inbox's cursor is its newest LiveChange row's id (appended by the triggers of migration 0002
in the transaction of every change a page shows), its lease's generation and whether a run holds
it now, read by one indexed query: the same cursor answers "anything new?" for a poll and "what
did I miss?" for a stream that reconnects. On PostgreSQL the triggers also NOTIFY, and each web
process that pushes LISTENs on one connection (Hub) and wakes the streams of that inbox; a woken
stream renders only if the cursor moved. Elsewhere the page polls `?since=<cursor>`.
"""

import asyncio
import logging
import threading
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.db import DatabaseError, close_old_connections, connection, connections
from django.db.models import BooleanField, ExpressionWrapper, F, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce, Now
from django.http import StreamingHttpResponse

from inbox.models import Inbox
from inbox.prebuilt import Given, Prebuilt

from .models import LiveChange, LiveWatch

log = logging.getLogger(__name__)

CHANNEL = "alwayson_live"  # the triggers' (migration 0002); the worker's work channel is another
HEARTBEAT = 15  # seconds: under the idle timeout of the proxies in front (nginx: 60 s)
RETRY_MS = 1000  # how soon a browser reconnects after a drop
REFRESH_THREADS = 4
WATCH_WAIT = 5  # seconds a new stream waits for the LISTEN connection before its first read
# A change whose trigger ran before a page's watch row committed sends no NOTIFY, though it
# may commit after the page's first read: one more read this long after, for the page
# that opened then (a run's finish takes milliseconds).
SETTLE = 1.0
ANY = "any"  # the topic of every inbox's changes: the approvals list and the dashboard


# --- the cursor ------------------------------------------------------------------------------


def with_cursor(inboxes):
    """`inboxes` annotated with what their cursor is made of, for one query."""
    newest = LiveChange.objects.filter(inbox=OuterRef("pk")).order_by("-id").values("id")[:1]
    return inboxes.annotate(
        live_change=Coalesce(Subquery(newest), 0),
        live_generation=Coalesce(F("lease__generation"), 0),
        live_held=ExpressionWrapper(
            Q(lease__until__gt=Now()) & ~Q(lease__holder=""), output_field=BooleanField()
        ),
    )


def cursor_of(inbox) -> str:
    """An inbox read through with_cursor, as the cursor its page holds."""
    return f"{inbox.live_change}.{inbox.live_generation}.{int(bool(inbox.live_held))}"


# An inbox with its cursor: read when a page opens and at every change its feed reads, so
# compiled once (inbox/prebuilt.py).
INBOX_WITH_CURSOR = Prebuilt(lambda: with_cursor(Inbox.objects.filter(pk=Given.of(Inbox, "id"))))


def inbox_cursor(inbox_id) -> str | None:
    inbox = INBOX_WITH_CURSOR.get(id=inbox_id)
    return cursor_of(inbox) if inbox else None


def global_cursor() -> str:
    """Of every inbox at once (the approvals list, the dashboard): the newest change's id."""
    newest = LiveChange.objects.order_by("-id").values_list("id", flat=True).first()
    return str(newest or 0)


# Set in a request's environ by the production web's worker, which hands a stream to its event
# loop (alwayson/web/serving.py).
PUSH = "alwayson.push"


def push_available(request) -> bool:
    """Whether this server can push to this page, on PostgreSQL: an ASGI server, or the
    production web's worker."""
    return connection.vendor == "postgresql" and (
        isinstance(request, ASGIRequest) or bool(request.META.get(PUSH))
    )


# --- the fanout ------------------------------------------------------------------------------


class Hub:
    """One LISTEN connection for this process's event loop, waking the streams subscribed to
    an inbox's topic (and ANY's). Started by the first subscriber; reconnects on its own and,
    once listening again, wakes every stream, as something may have changed meanwhile."""

    def __init__(self):
        self.topics: dict[str, set[asyncio.Event]] = defaultdict(set)
        self.task: asyncio.Task | None = None
        self.listening = asyncio.Event()
        # Where the streams read and render: a few threads, each keeping its database
        # connection between refreshes, however many pages are open.
        self.executor = ThreadPoolExecutor(REFRESH_THREADS, thread_name_prefix="live")
        # The LiveWatch rows written for this hub: under which LISTEN backend, which inboxes.
        self.listener: int | None = None
        self.watched: set[int] = set()
        self._watching = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        # The shared readers of the inboxes with open conversation pages (alwayson/web/feed.py).
        self.feeds: dict[int, object] = {}
        # Per topic, how many notifications woke it, and the refreshes its pages share since
        # the last one (refresh(share=...)).
        self.waves: dict[str, int] = defaultdict(int)
        self.shared: dict[tuple, asyncio.Future] = {}

    async def in_thread(self, work, *args):
        """`work(*args)` in one of the hub's threads, with a database connection as a
        request's would be: checked at the start, handed back to the pool at the end
        (CONN_MAX_AGE 0 under ASGI) instead of idling there between changes."""

        def run():
            close_old_connections()
            try:
                return work(*args)
            finally:
                close_old_connections()

        return await asyncio.get_running_loop().run_in_executor(self.executor, run)

    async def refresh(self, refresh, since, share=None):
        """`refresh(since)` in a thread. With `share` (topic, audience): the pages of one
        audience that one notification woke at one cursor share one refresh, so a change
        costs a read and a render per audience, not per page."""
        if share is None:
            return await self.in_thread(refresh, since)
        topic, audience = share
        key = (topic, self.waves[topic], audience, since)
        if key not in self.shared:
            self.shared[key] = asyncio.ensure_future(self.in_thread(refresh, since))
        return await asyncio.shield(self.shared[key])

    def feed(self, inbox_id, make):
        """The inbox's feed in this process, made by `make(hub, inbox_id)` for its first page."""
        if inbox_id not in self.feeds:
            self.feeds[inbox_id] = make(self, inbox_id)
        return self.feeds[inbox_id]

    def drop_feed(self, feed):
        """Its last page closed: the feed stops reading (not awaited by the closing page)."""
        if self.feeds.get(feed.inbox_id) is feed:
            del self.feeds[feed.inbox_id]
        self._background(feed.stop())

    def _background(self, coroutine):
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def subscribe(self, topic) -> asyncio.Event:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self.listen())
        wake = asyncio.Event()
        self.topics[topic].add(wake)
        return wake

    def unsubscribe(self, topic, wake):
        self.topics[topic].discard(wake)
        if not self.topics[topic]:
            del self.topics[topic]
            # Not awaited: a closing stream does not wait for it (the next watch() waits).
            self._background(self.watch())

    async def watching(self):
        """Once this returns, the hub's watch rows name every topic it has (as soon as it
        listens: not waited for past WATCH_WAIT, the reconnect writes them then)."""
        try:
            await asyncio.wait_for(self.listening.wait(), WATCH_WAIT)
        except TimeoutError:
            return
        await self.watch()

    async def watch(self):
        """Write and delete LiveWatch rows until they are the hub's topics. One at a time: a
        page that closes while another opens must not leave its inbox unwatched."""
        async with self._watching:
            if self.listener is None:
                return
            wanted = {_watched_inbox(topic) for topic in self.topics}
            add, drop = wanted - self.watched, self.watched - wanted
            if add or drop:
                await self.in_thread(LiveWatch.objects.replace, self.listener, add, drop)
                self.watched = wanted

    async def _listening_as(self, listener):
        """A new LISTEN connection: its watch rows for every topic, the dead listeners'
        rows (this process's previous connection's among them) gone."""
        async with self._watching:
            wanted = {_watched_inbox(topic) for topic in self.topics}

            def rewrite():
                LiveWatch.objects.of_dead_listeners().delete()
                LiveWatch.objects.replace(listener, wanted, ())

            await self.in_thread(rewrite)
            self.listener, self.watched = listener, wanted

    def publish(self, payload: str):
        """A notification's payload, "<inbox id>:<kind>"."""
        inbox_id, _, _kind = payload.partition(":")
        self.wake((f"inbox:{inbox_id}", ANY))

    def wake(self, topics):
        """Wake the streams of `topics`: a new wave, whose refreshes are not yet shared."""
        topics = set(topics)
        for topic in topics:
            self.waves[topic] += 1
            for wake in self.topics.get(topic, ()):
                wake.set()
        self.shared = {key: done for key, done in self.shared.items() if key[0] not in topics}

    async def stop(self):
        """Close the LISTEN connection and the refreshing threads' (a test's loop ends; a
        process just exits)."""
        feeds, self.feeds = list(self.feeds.values()), {}
        await asyncio.gather(*(feed.stop() for feed in feeds), return_exceptions=True)
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, *self._tasks, return_exceptions=True)
        if self.listener is not None:
            await self.in_thread(LiveWatch.objects.filter(listener=self.listener).delete)
            self.listener = None
        # One close per thread: each waits for the others, so no thread takes two.
        everyone = threading.Barrier(REFRESH_THREADS)

        def close():
            everyone.wait(timeout=10)
            connections.close_all()

        loop = asyncio.get_running_loop()
        await asyncio.gather(
            *(loop.run_in_executor(self.executor, close) for _ in range(REFRESH_THREADS))
        )
        self.executor.shutdown()

    def wake_all(self):
        self.wake(list(self.topics))

    async def listen(self):
        # PostgreSQL's alone: imported here, so that a process on SQLite never loads psycopg.
        import psycopg

        from inbox.backends.postgresql import session_params

        conninfo = session_params()
        delay = 0.5
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    autocommit=True, **conninfo
                ) as listener:
                    await listener.execute(f"LISTEN {CHANNEL}")
                    await self._listening_as(listener.info.backend_pid)
                    self.listening.set()
                    delay = 0.5
                    self.wake_all()
                    async for notify in listener.notifies():
                        self.publish(notify.payload)
            except (psycopg.Error, OSError, DatabaseError):
                self.listening.clear()
                self.listener = None
                log.warning("live LISTEN connection lost; retrying in %.1fs", delay, exc_info=True)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10)


def _watched_inbox(topic) -> int:
    return LiveWatch.EVERY_INBOX if topic == ANY else int(topic.removeprefix("inbox:"))


_hubs: dict[asyncio.AbstractEventLoop, Hub] = {}


def hub() -> Hub:
    """This event loop's hub (one per web process: uvicorn runs one loop, and so does the
    production web's worker, for its streams)."""
    loop = asyncio.get_running_loop()
    if loop not in _hubs:
        _hubs.clear()  # a loop that ended (tests) takes its hub with it
        _hubs[loop] = Hub()
    return _hubs[loop]


async def stop_hub():
    """This event loop's hub stopped, if it started: the loop is ending (a web process stops)."""
    stopping = _hubs.pop(asyncio.get_running_loop(), None)
    if stopping is not None:
        await stopping.stop()


# --- the stream ------------------------------------------------------------------------------

GONE = object()  # the person may no longer see the page: the stream says so and ends


def sse(cursor: str, html: str) -> str:
    data = "".join(f"data: {line}\n" for line in html.splitlines())
    return f"id: {cursor}\n{data}\n"


def stream(
    topic: str,
    since: str,
    refresh: Callable,
    audience,
    gap: float = 0,
    recheck=lambda cursor: False,
) -> StreamingHttpResponse:
    """The page's event stream. `refresh(since)` (synchronous, in a thread) returns GONE,
    None while `since` is still the cursor, or (cursor, fragment); the pages of one
    `audience` woken by one change share it. After a push the next waits `gap` seconds. While
    `recheck(cursor)`, a heartbeat also refreshes: a lease whose run died lapses without a
    write, so no notification would tell the page. Those reads are the page's own, never
    shared: they look for what no notification announced."""

    async def events():
        live = hub()
        wake = live.subscribe(topic)  # before the first read: nothing falls in between
        await live.watching()
        own_read = True  # the first read, and the settling one

        def settle():
            nonlocal own_read
            own_read = True
            wake.set()

        asyncio.get_running_loop().call_later(SETTLE, settle)
        cursor = since
        try:
            yield f"retry: {RETRY_MS}\n\n"
            while True:
                wake.clear()
                share = None if own_read else (topic, audience)
                own_read = False
                result = await live.refresh(refresh, cursor, share)
                if result is GONE:
                    yield "event: gone\ndata: \n\n"
                    return
                if result is not None:
                    cursor, html = result
                    yield sse(cursor, html)
                    if gap:
                        await asyncio.sleep(gap)
                while True:
                    try:
                        await asyncio.wait_for(wake.wait(), HEARTBEAT)
                        break
                    except TimeoutError:
                        yield ": heartbeat\n\n"
                        if recheck(cursor):
                            own_read = True
                            break
        finally:
            live.unsubscribe(topic, wake)

    return event_stream(events())


def event_stream(events) -> StreamingHttpResponse:
    """A response streaming the async iterator `events` (SSE text) to a page."""
    response = StreamingHttpResponse(events, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on as it comes
    return response


async def release_request_connection(request):
    """The stream outlives its request: under ASGI, give back the database connection the
    request's middleware opened instead of holding it as long as the page is open (under the
    production web's worker it is its thread's, kept)."""
    if isinstance(request, ASGIRequest):
        await sync_to_async(_close_connection)()


def _close_connection():
    connection.close()  # this thread's: the one the request's middleware ran in


def last_seen(request) -> str:
    """The cursor the page showed: the browser's Last-Event-ID on a reconnect, else ?since."""
    return request.headers.get("Last-Event-ID") or request.GET.get("since", "")
