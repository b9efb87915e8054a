"""The production web process pushes the live pages on PostgreSQL: gunicorn with
alwayson/web/serving.py's workers, started exactly as alwayson/ops/processes.py starts it.

Each worker answers requests on its threads and hands an open page's stream to its event loop,
so streams hold no thread: here one worker with one thread keeps answering while several
streams are open, and a change committed to the inbox reaches them through the worker's
LISTEN connection. A stream whose client leaves is released (its inbox's watch row goes); a
stop (SIGTERM, or SIGINT's fast one) closes the open streams and the worker exits by itself,
its watch rows deleted, not killed at gunicorn's graceful_timeout; a stream of an inbox the
person has no role in gets the page's 404.
"""

import re
import signal

import pytest
from django.test import Client

from alwayson.web import live
from alwayson.web.models import LiveWatch
from inbox import clock
from inbox.models import Event
from tests.support.outbox import hold
from tests.support.processes import wait_for
from tests.support.web import (
    EventStream,
    ProductionWeb,
    collect_static,
    exchange,
    github_delivery,
    head,
)

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.django_db(transaction=True),
]

WAIT = 60  # seconds: a bound on a wait, never a measure (CI runs two suites at once on 2 cores)


@pytest.fixture(scope="module")
def static_files():
    collect_static()


@pytest.fixture
def web(tmp_path, transactional_db, static_files):
    """One worker with one thread: whatever it answers while streams are open, it answers
    beside them. Stopped before the test database is flushed."""
    server = ProductionWeb(tmp_path, WEB_CONCURRENCY="1", WEB_THREADS="1")
    yield server
    server.stop()


@pytest.fixture
def desk(make_inbox, owner):
    return make_inbox("desk", owner=owner)


def session_cookie(user):
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


def watched(inbox):
    return LiveWatch.objects.filter(inbox_id=inbox.pk).exists()


def open_stream(web, cookie, inbox):
    """A stream of `inbox`'s page from its current cursor, once it says how to reconnect."""
    since = live.inbox_cursor(inbox.pk)
    stream = EventStream(web, f"/inbox/{inbox.slug}/stream/?since={since}", cookie)
    assert stream.status == 200, web.log()[-2000:]
    assert stream.headers["content-type"] == "text/event-stream"
    assert stream.headers["connection"] == "close"
    assert "content-length" not in stream.headers
    assert stream.next_event() == f"retry: {live.RETRY_MS}"
    return stream


def event_id(event):
    """The cursor an event carries: a whole region's or a patch's (alwayson/web/feed.py)."""
    return next(line[4:] for line in event.split("\n") if line.startswith("id: "))


def say(inbox, text):
    hold(inbox, text, at=clock.database_now())
    return live.inbox_cursor(inbox.pk)


def test_a_page_is_offered_the_stream_which_receives_each_change_while_requests_are_answered(
    web, desk, owner
):
    cookie = session_cookie(owner)
    page = exchange(web, head("GET", "/inbox/desk/", {"Cookie": cookie}))
    assert page.status == 200, web.log()[-2000:]
    assert b'data-live-stream="/inbox/desk/stream/"' in page.body

    streams = [open_stream(web, cookie, desk) for _ in range(3)]
    wait_for(lambda: watched(desk), WAIT, "the worker's hub to watch the inbox")

    cursor = say(desk, "First, pushed")
    for stream in streams:
        event = stream.next_event()
        assert event_id(event) == cursor and "First, pushed" in event

    # The worker's one thread is free: the streams live on its event loop.
    for n in range(5):
        answer = exchange(web, github_delivery("desk", f"beside-the-streams-{n}"))
        assert answer.status == 202, web.log()[-2000:]
    assert Event.objects.filter(inbox=desk, source="github").count() == 5

    cursor = say(desk, "Second, pushed")
    for stream in streams:
        event = stream.next_event()
        assert event_id(event) == cursor and "Second, pushed" in event
        stream.close()


def test_a_stream_whose_client_leaves_is_released(web, desk, owner):
    stream = open_stream(web, session_cookie(owner), desk)
    wait_for(lambda: watched(desk), WAIT, "the worker's hub to watch the inbox")

    stream.close()

    wait_for(lambda: not watched(desk), WAIT, "the inbox's watch row to go")
    # And the worker still serves, its streams' loop unharmed.
    answer = exchange(web, github_delivery("desk", "after-a-stream-left"))
    assert answer.status == 202, web.log()[-2000:]


def test_a_stream_that_ends_by_itself_is_closed_and_released(web, desk, owner):
    """A person who may no longer see the page is told so, and the stream ends: the worker
    closes the connection after the last event."""
    stream = open_stream(web, session_cookie(owner), desk)
    wait_for(lambda: watched(desk), WAIT, "the worker's hub to watch the inbox")
    type(owner).objects.filter(pk=owner.pk).update(is_active=False)

    say(desk, "Not for a deactivated account")

    assert stream.next_event() == "event: gone\ndata: "
    assert stream.next_event() is None
    stream.close()
    wait_for(lambda: not watched(desk), WAIT, "the inbox's watch row to go")


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_closes_the_open_streams_and_the_worker_exits_by_itself(web, desk, owner, how):
    cookie = session_cookie(owner)
    streams = [open_stream(web, cookie, desk) for _ in range(2)]
    wait_for(lambda: watched(desk), WAIT, "the worker's hub to watch the inbox")
    [worker] = web.workers

    assert web.terminate(how) == 0, web.log()[-2000:]

    for stream in streams:
        assert stream.next_event() is None  # closed by the server: the browser reconnects
        stream.close()
    # Its own goodbye, which a worker killed at graceful_timeout never logs; and its hub's
    # cleanup ran: the watch rows of its LISTEN connection are gone.
    assert f"Worker exiting (pid: {worker})" in web.log()
    assert not re.search(r"SIGKILL|Traceback", web.log()), web.log()[-3000:]
    assert not LiveWatch.objects.exists()


def test_a_stream_of_an_inbox_without_a_role_gets_the_pages_404(web, desk, django_user_model):
    stranger = django_user_model.objects.create_user(username="stranger", password="pw-x-123")
    cookie = session_cookie(stranger)

    page = exchange(web, head("GET", "/inbox/desk/", {"Cookie": cookie}))
    stream = exchange(web, head("GET", "/inbox/desk/stream/", {"Cookie": cookie}))
    missing = exchange(web, head("GET", "/inbox/no-such-inbox/stream/", {"Cookie": cookie}))

    assert page.status == stream.status == missing.status == 404
    assert b"<h1>Page not found</h1>" in page.body
    assert stream.body == missing.body == page.body
    assert not LiveWatch.objects.exists()
