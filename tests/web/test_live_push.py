"""The push (alwayson/web/live.py) through real streams on PostgreSQL: Django's AsyncClient is
an ASGI client, so the stream views serve it as they serve uvicorn; the triggers NOTIFY at
commit and the process's one LISTEN connection wakes every open stream of that inbox."""

import asyncio

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection
from django.test import AsyncClient

from alwayson.web import live
from inbox.models import Membership, Role
from tests.support.outbox import hold

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.django_db(transaction=True),
]

WAIT = 20  # seconds: a bound on a wait, never a measure


def say(inbox, body):
    from inbox import clock

    return hold(inbox, body, at=clock.database_now())


def listeners():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            f" AND query = 'LISTEN {live.CHANNEL}'"
        )
        return cursor.fetchone()[0]


async def next_event(stream):
    """The next event of a stream, heartbeats skipped; a failure after WAIT seconds."""
    deadline = asyncio.get_running_loop().time() + WAIT
    while True:
        left = deadline - asyncio.get_running_loop().time()
        chunk = await asyncio.wait_for(anext(stream), max(left, 0))
        chunk = chunk.decode() if isinstance(chunk, bytes) else chunk
        if not chunk.startswith(":"):
            return chunk


def event_id(event):
    """The cursor an event carries (its `id:` line), whether a whole region or a patch."""
    return next(line[4:] for line in event.split("\n") if line.startswith("id: "))


async def open_stream(client, since):
    response = await client.get("/inbox/desk/stream/", {"since": since})
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    stream = response.streaming_content
    assert (await next_event(stream)).startswith("retry: ")
    return stream


def test_a_commit_reaches_every_open_stream_of_the_inbox_through_one_listen(desk, owner):
    async def scenario():
        client = AsyncClient()
        await client.aforce_login(owner)
        since = await sync_to_async(live.inbox_cursor)(desk.pk)
        streams = [await open_stream(client, since) for _ in range(5)]
        await asyncio.wait_for(live.hub().listening.wait(), WAIT)
        assert await sync_to_async(listeners)() == 1

        await sync_to_async(say)(desk, "Pushed to every page")

        cursor = await sync_to_async(live.inbox_cursor)(desk.pk)
        for stream in streams:
            event = await next_event(stream)
            assert event_id(event) == cursor
            assert "Pushed to every page" in event
        for stream in streams:
            await stream.aclose()
        await live.hub().stop()

    async_to_sync(scenario)()


def test_a_stream_that_reconnects_with_its_cursor_gets_what_it_missed_at_once(desk, owner):
    async def scenario():
        client = AsyncClient()
        await client.aforce_login(owner)
        seen = await sync_to_async(live.inbox_cursor)(desk.pk)
        await sync_to_async(say)(desk, "Written while the page was away")

        response = await client.get("/inbox/desk/stream/", headers={"Last-Event-ID": seen})
        stream = response.streaming_content
        assert (await next_event(stream)).startswith("retry: ")
        event = await next_event(stream)
        assert "Written while the page was away" in event
        await stream.aclose()
        await live.hub().stop()

    async_to_sync(scenario)()


def test_an_idle_conversation_page_gets_a_heartbeat_every_period_and_a_change_between(
    desk, owner, monkeypatch
):
    monkeypatch.setattr(live, "HEARTBEAT", 0.2)

    async def scenario():
        client = AsyncClient()
        await client.aforce_login(owner)
        stream = await open_stream(client, await sync_to_async(live.inbox_cursor)(desk.pk))
        await asyncio.wait_for(live.hub().listening.wait(), WAIT)
        clock = asyncio.get_running_loop().time

        async def chunk():
            sent = await asyncio.wait_for(anext(stream), WAIT)
            return sent.decode() if isinstance(sent, bytes) else sent

        beats = []
        while len(beats) < 4:
            if (await chunk()).startswith(": heartbeat"):
                beats.append(clock())
        # One a period, not one per wait; a stream that stopped beating after the first never
        # gets here. On average: a late first beat shortens one gap, never the whole span.
        assert (beats[-1] - beats[0]) / (len(beats) - 1) >= 0.1
        await sync_to_async(say)(desk, "Between two heartbeats")
        while (event := await chunk()).startswith(":"):
            pass
        assert "Between two heartbeats" in event
        assert (await chunk()).startswith(": heartbeat")  # and it goes on beating
        await stream.aclose()
        await live.hub().stop()

    async_to_sync(scenario)()


def test_a_person_who_loses_the_role_stops_receiving(desk, django_user_model):
    viewer = django_user_model.objects.create_user(username="viewer")
    membership = Membership.objects.create(inbox=desk, user=viewer, role=Role.VIEWER)

    async def scenario():
        client = AsyncClient()
        await client.aforce_login(viewer)
        stream = await open_stream(client, await sync_to_async(live.inbox_cursor)(desk.pk))
        await asyncio.wait_for(live.hub().listening.wait(), WAIT)

        await sync_to_async(membership.delete)()
        await sync_to_async(say)(desk, "Not for the viewer")

        event = await next_event(stream)
        assert event.startswith("event: gone")
        assert "Not for the viewer" not in event
        with pytest.raises(StopAsyncIteration):
            await next_event(stream)
        await live.hub().stop()

    async_to_sync(scenario)()


def test_the_stream_answers_the_same_404_as_the_page(desk, django_user_model):
    stranger = django_user_model.objects.create_user(username="stranger")

    async def scenario():
        client = AsyncClient()
        await client.aforce_login(stranger)
        assert (await client.get("/inbox/desk/stream/")).status_code == 404
        assert (await client.get("/inbox/nowhere/stream/")).status_code == 404
        assert (await AsyncClient().get("/inbox/desk/stream/")).status_code == 302

    async_to_sync(scenario)()


def test_an_asgi_page_on_postgresql_is_offered_the_push(desk, owner):
    async def scenario():
        client = AsyncClient()
        await client.aforce_login(owner)
        html = (await client.get("/inbox/desk/")).content.decode()
        assert 'data-live-stream="/inbox/desk/stream/"' in html

    async_to_sync(scenario)()


def test_a_page_stops_showing_work_when_the_runs_lease_lapses_unreleased(desk, owner, monkeypatch):
    from datetime import timedelta

    from inbox import clock
    from inbox.models import Lease
    from inbox.services import acquire

    monkeypatch.setattr(live, "HEARTBEAT", 0.1)
    acquire(desk, "worker-that-dies")

    async def scenario():
        client = AsyncClient()
        await client.aforce_login(owner)
        # The hub listening first: its first connection wakes every stream open then.
        first = await open_stream(client, "")
        await asyncio.wait_for(live.hub().listening.wait(), WAIT)
        stream = await open_stream(client, "")
        working = await next_event(stream)
        assert "Your agent is working" in working

        # The run's process dies: its lease lapses with no write, so no notification.
        lapsed = await sync_to_async(clock.database_now)() - timedelta(seconds=1)
        await sync_to_async(Lease.objects.filter(inbox=desk).update)(until=lapsed)

        idle = await next_event(stream)
        assert "Your agent is working" not in idle
        assert event_id(idle).endswith(".0")
        await stream.aclose()
        await first.aclose()
        await live.hub().stop()

    async_to_sync(scenario)()


def watches():
    from alwayson.web.models import LiveWatch

    return sorted(LiveWatch.objects.values_list("inbox_id", "listener"))


def test_only_a_watched_inbox_notifies_the_web_processes(desk, make_inbox, owner):
    import psycopg

    from alwayson.web.models import LiveWatch

    watched = make_inbox("watched", owner=owner)
    LiveWatch.objects.create(inbox_id=watched.pk, listener=0)
    params = connection.get_connection_params()
    keys = ("dbname", "user", "host", "port")
    with psycopg.connect(autocommit=True, **{k: params[k] for k in keys if params.get(k)}) as ear:
        ear.execute(f"LISTEN {live.CHANNEL}")
        say(desk, "Nobody has this inbox open")
        say(watched, "Somebody has this one open")
        # Notifications arrive in commit order: the first is the watched inbox's.
        heard = next(ear.notifies(timeout=WAIT))
        assert heard.payload == f"{watched.pk}:message"

        LiveWatch.objects.create(inbox_id=LiveWatch.EVERY_INBOX, listener=0)
        say(desk, "The dashboard is open: every inbox is watched")
        heard = next(ear.notifies(timeout=WAIT))
        assert heard.payload == f"{desk.pk}:message"


def test_the_hub_watches_an_inbox_from_its_first_open_page_until_its_last_closes(desk):
    # What a stream does as it opens and as it ends (live.stream), for two pages of one inbox.
    async def scenario():
        hub = live.hub()
        topic = f"inbox:{desk.pk}"
        first = hub.subscribe(topic)
        await hub.watching()
        second = hub.subscribe(topic)
        await hub.watching()
        assert await sync_to_async(watches)() == [(desk.pk, hub.listener)]

        hub.unsubscribe(topic, first)
        await hub.watch()
        assert await sync_to_async(watches)() == [(desk.pk, hub.listener)]
        hub.unsubscribe(topic, second)
        await hub.watch()
        assert await sync_to_async(watches)() == []

        hub.subscribe(live.ANY)
        await hub.watching()
        assert await sync_to_async(watches)() == [(0, hub.listener)]
        await hub.stop()
        assert await sync_to_async(watches)() == []

    async_to_sync(scenario)()


def test_a_hub_that_listens_again_watches_under_its_new_connection_and_drops_dead_ones(desk, owner):
    from alwayson.web.models import LiveWatch

    LiveWatch.objects.create(inbox_id=desk.pk, listener=2**31 - 1)  # no such backend

    async def scenario():
        client = AsyncClient()
        await client.aforce_login(owner)
        stream = await open_stream(client, "")
        await next_event(stream)  # the page as it is
        hub = live.hub()
        old = hub.listener
        assert await sync_to_async(watches)() == [(desk.pk, old)]

        def sever():
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [old])

        await sync_to_async(sever)()
        deadline = asyncio.get_running_loop().time() + WAIT
        while hub.listener in (None, old):
            assert asyncio.get_running_loop().time() < deadline, "the hub did not listen again"
            await asyncio.sleep(0.05)
        assert await sync_to_async(watches)() == [(desk.pk, hub.listener)]

        await sync_to_async(say)(desk, "Heard on the new connection")
        while "Heard on the new connection" not in (event := await next_event(stream)):
            pass  # the wake-up of the reconnect refreshes the page first
        assert event_id(event) == await sync_to_async(live.inbox_cursor)(desk.pk)
        await stream.aclose()
        await hub.stop()

    async_to_sync(scenario)()


def test_prune_deletes_the_watches_of_listeners_no_longer_connected(desk):
    from django.core.management import call_command

    from alwayson.web.models import LiveWatch

    alive = connection.cursor().connection.info.backend_pid
    LiveWatch.objects.create(inbox_id=desk.pk, listener=alive)
    LiveWatch.objects.create(inbox_id=desk.pk, listener=2**31 - 1)
    call_command("prune", verbosity=0)
    assert watches() == [(desk.pk, alive)]


def test_fifty_open_pages_cost_one_read_and_one_render_per_change(desk, owner, monkeypatch):
    from django.test.utils import CaptureQueriesContext

    from alwayson.web import conversation, feed

    reads, renders = [], []
    real_read, real_render = feed.read, conversation.render_entry

    def counted_read(*args):
        with CaptureQueriesContext(connection) as statements:  # the hub thread's connection
            state = real_read(*args)
        reads.append(len(statements))
        return state

    def counted_render(entry, **context):
        renders.append(entry.key)
        return real_render(entry, **context)

    monkeypatch.setattr(feed, "read", counted_read)
    monkeypatch.setattr(conversation, "render_entry", counted_render)
    monkeypatch.setattr(live, "SETTLE", 0)

    async def change_reaches(streams, body):
        reads.clear()
        renders.clear()
        await sync_to_async(say)(desk, body)
        cursor = await sync_to_async(live.inbox_cursor)(desk.pk)
        for stream in streams:
            event = await next_event(stream)
            assert event_id(event) == cursor and body in event
        return list(reads), list(renders)

    async def scenario():
        client = AsyncClient()
        await client.aforce_login(owner)
        since = await sync_to_async(live.inbox_cursor)(desk.pk)
        one = [await open_stream(client, since)]
        await asyncio.wait_for(live.hub().listening.wait(), WAIT)
        deadline = asyncio.get_running_loop().time() + WAIT
        while len(reads) < 2:  # the first read and the settling one
            assert asyncio.get_running_loop().time() < deadline, "the feed never read"
            await asyncio.sleep(0.01)
        alone = await change_reaches(one, "Seen by one page")

        fifty = one + [await open_stream(client, since) for _ in range(49)]
        for stream in fifty[1:]:  # opened at an older cursor: the region, from memory
            assert "Seen by one page" in await next_event(stream)
        crowd = await change_reaches(fifty, "Seen by fifty pages")

        assert len(alone[0]) == len(crowd[0]) == 1, "one read per change"
        assert alone[0] == crowd[0], "the same statements, for one page and for fifty"
        assert len(crowd[1]) == 1, "the new entry rendered once"
        for stream in fifty:
            await stream.aclose()
        await live.hub().stop()

    async_to_sync(scenario)()


def test_open_approval_lists_of_one_person_share_one_refresh_per_change(desk, owner, monkeypatch):
    from datetime import timedelta

    from alwayson.web import streams
    from approvals.services import request_approval

    refreshes = []
    real = streams._refresh_approvals

    def counted(*args):
        refreshes.append(args[-1])
        return real(*args)

    monkeypatch.setattr(streams, "_refresh_approvals", counted)
    monkeypatch.setattr(live, "SETTLE", 0)

    async def scenario():
        client = AsyncClient()
        await client.aforce_login(owner)
        since = await sync_to_async(live.global_cursor)()
        lists, heard = [], []
        for _ in range(5):
            response = await client.get("/approvals/stream/", {"since": since})
            lists.append(response.streaming_content)
            assert (await next_event(lists[-1])).startswith("retry: ")
            # A stream reads only while it is listened to: each page listens on its own.
            heard.append(asyncio.ensure_future(next_event(lists[-1])))
        await asyncio.wait_for(live.hub().listening.wait(), WAIT)
        deadline = asyncio.get_running_loop().time() + WAIT
        while len(refreshes) < 5:  # each page's first read (its settling one, at 0 s, with it)
            assert asyncio.get_running_loop().time() < deadline, "the pages never read"
            await asyncio.sleep(0.01)
        refreshes.clear()

        await sync_to_async(request_approval)(desk, "r-1", "refund order 1", timedelta(hours=1))
        for event in heard:
            assert "Refund order 1" in await event
        assert len(refreshes) == 1, "one refresh for the five pages of one person"
        for stream in lists:
            await stream.aclose()
        await live.hub().stop()

    async_to_sync(scenario)()


def test_another_persons_page_opening_sends_nothing_to_the_pages_already_open(
    desk, owner, django_user_model
):
    from alwayson.web import feed

    colleague = django_user_model.objects.create_user("colleague", password="x")
    Membership.objects.create(inbox=desk, user=colleague, role=Role.VIEWER)
    say(desk, "Before either page")
    alone = feed.read(desk.pk, None, {owner.pk})

    both = feed.read(desk.pk, alone, {owner.pk, colleague.pk})

    assert both is not alone  # the colleague's view was rendered
    assert feed.message(both, owner.pk, alone.revision) is None
    assert "Before either page" in feed.message(both, colleague.pk, None)
    # What the owner's page does hear of next is a change.
    say(desk, "After the second page")
    changed = feed.read(desk.pk, both, {owner.pk, colleague.pk})
    patch = feed.message(changed, owner.pk, both.revision)
    assert patch.startswith("event: patch") and "After the second page" in patch
