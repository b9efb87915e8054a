"""Live pages (alwayson/web/live.py): the cursor the triggers move, the fallback poll's one
query, what a stream's refresh sends on a reconnect, and who may keep receiving. On both
databases; the push itself (LISTEN and the fanout through a real stream) is in
test_live_push.py, on PostgreSQL.
"""

import asyncio
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from alwayson.web import feed, live
from approvals.services import request_approval
from inbox.models import Membership, Role
from inbox.services import acquire, ingest, release
from outbox.models import OutboxMessage
from tests.support.outbox import hold

pytestmark = pytest.mark.django_db


def say(inbox, body):
    return hold(inbox, body, at=live_now())


def live_now():
    from inbox import clock

    return clock.database_now()


def chat(inbox, text, message_id):
    ingest(inbox, "chat", message_id, {"text": text, "from": "owner"})


def not_login_lookups(queries):
    """The queries a request makes beyond the session's and the user's, which every page a
    person is logged in to makes (the session middleware's, the auth middleware's)."""
    login = ('FROM "django_session"', 'FROM "auth_user" WHERE')
    return [q["sql"] for q in queries if not any(part in q["sql"] for part in login)]


# --- the cursor ------------------------------------------------------------------------------


def test_what_a_conversation_shows_moves_its_cursor_and_nothing_else_does(desk, make_inbox):
    other = make_inbox("other")
    seen = [live.inbox_cursor(desk.pk)]

    def moved():
        now = live.inbox_cursor(desk.pk)
        changed = now != seen[-1]
        seen.append(now)
        return changed

    chat(desk, "hello", "m1")
    assert moved(), "a person's chat message"
    message = say(desk, "On it.")
    assert moved(), "what the agent said"
    OutboxMessage.objects.filter(pk=message.pk).update(status=OutboxMessage.Status.SENT)
    assert moved(), "its sending"
    request_approval(desk, "r1", "refund order 1", timedelta(hours=1))
    assert moved(), "an approval asked"
    generation = acquire(desk, "worker-1")
    assert moved(), "a run taking the lease (the working indicator)"
    release(desk, "worker-1", generation)
    assert moved(), "the run releasing it"

    ingest(desk, "github", "d1", {"action": "opened"})
    assert not moved(), "a webhook's event is not on the conversation page"
    chat(other, "elsewhere", "m2")
    say(other, "elsewhere")
    assert not moved(), "another inbox's change"
    assert live.inbox_cursor(other.pk) != "0.0.0"


def test_a_renewal_does_not_move_the_cursor(desk):
    acquire(desk, "worker-1")
    held = live.inbox_cursor(desk.pk)
    acquire(desk, "worker-1")  # the same holder renews
    assert live.inbox_cursor(desk.pk) == held
    assert held.endswith(".1"), "a run holds the lease: the page shows it working"


# --- the fallback poll -----------------------------------------------------------------------


def test_an_idle_poll_is_one_query_and_no_rendering(owner_client, desk):
    say(desk, "Hello")
    page = owner_client.get("/inbox/desk/")
    cursor = page.context["cursor"]
    assert f'data-live-cursor="{cursor}"' in page.content.decode()

    with CaptureQueriesContext(connection) as queries:
        response = owner_client.get("/inbox/desk/live/", {"since": cursor})

    assert response.status_code == 204
    assert response.templates == []
    own = not_login_lookups(queries.captured_queries)
    assert len(own) == 1, own
    assert "alwayson_web_livechange" in own[0]


def test_a_poll_after_a_change_gets_the_conversation_and_its_new_cursor(owner_client, desk):
    cursor = owner_client.get("/inbox/desk/").context["cursor"]
    say(desk, "Your refund is on its way.")

    response = owner_client.get("/inbox/desk/live/", {"since": cursor})

    assert response.status_code == 200
    assert "Your refund is on its way." in response.content.decode()
    new = response["X-Live-Cursor"]
    assert new != cursor
    assert f'data-live-cursor="{new}"' in response.content.decode()
    assert owner_client.get("/inbox/desk/live/", {"since": new}).status_code == 204


def test_the_poll_answers_who_may_see_the_page_and_nobody_else(desk, django_user_model):
    viewer = django_user_model.objects.create_user(username="viewer")
    membership = Membership.objects.create(inbox=desk, user=viewer, role=Role.VIEWER)
    client = Client()
    client.force_login(viewer)
    assert client.get("/inbox/desk/live/").status_code == 200

    membership.delete()
    assert client.get("/inbox/desk/live/").status_code == 404
    assert client.get("/inbox/nowhere/live/").status_code == 404
    assert Client().get("/inbox/desk/live/").status_code == 302  # to the login page


def test_a_page_served_by_wsgi_or_on_sqlite_is_told_to_poll(owner_client, desk):
    html = owner_client.get("/inbox/desk/").content.decode()
    assert 'data-live-poll="/inbox/desk/live/"' in html
    assert "data-live-stream" not in html, "the test client is WSGI: no push offered"
    assert owner_client.get("/inbox/desk/stream/").status_code == 404


# --- a stream: what it sends after a reconnect (alwayson/web/feed.py) ------------------------


def test_a_reconnect_gets_what_it_missed_from_its_cursor(desk, owner):
    say(desk, "first")
    seen = live.inbox_cursor(desk.pk)
    state = feed.read(desk.pk, None, {owner.pk})
    assert feed.Page(owner.pk, seen).next_message(state) is None, "nothing missed: nothing sent"

    say(desk, "second, while the page was away")
    chat(desk, "and a message from a colleague", "m9")
    state = feed.read(desk.pk, state, {owner.pk})
    sent = feed.Page(owner.pk, seen).next_message(state)
    newer = live.inbox_cursor(desk.pk)
    assert newer != seen and sent.startswith(f"id: {newer}\n")
    assert "second, while the page was away" in sent
    assert "and a message from a colleague" in sent
    assert f'data-live-cursor="{newer}"' in sent


# --- the approvals list and the dashboard ----------------------------------------------------


def test_the_approvals_list_polls_every_inbox_it_shows(owner_client, desk):
    page = owner_client.get("/approvals/")
    html = page.content.decode()
    assert 'data-live-poll="/approvals/live/"' in html
    cursor = html.split('data-live-cursor="', 1)[1].split('"', 1)[0]
    assert owner_client.get("/approvals/live/", {"since": cursor}).status_code == 204

    request_approval(desk, "r2", "refund order 2", timedelta(hours=1))
    response = owner_client.get("/approvals/live/", {"since": cursor})
    assert response.status_code == 200
    assert "Refund order 2" in response.content.decode()


def test_the_dashboard_polls_and_moves_when_a_run_starts(desk, django_user_model):
    operator = django_user_model.objects.create_superuser(username="operator")
    client = Client()
    client.force_login(operator)
    cursor = client.get("/admin/dashboard/").context["cursor"]
    assert client.get("/admin/dashboard/live/", {"since": cursor}).status_code == 204

    acquire(desk, "worker-1")
    response = client.get("/admin/dashboard/live/", {"since": cursor})
    assert response.status_code == 200
    assert "held by worker-1" in response.content.decode()


def test_the_dashboards_poll_is_for_its_operators_only(owner_client):
    assert owner_client.get("/admin/dashboard/live/").status_code == 302  # not staff


# --- the fanout ------------------------------------------------------------------------------


def test_a_notification_wakes_the_streams_of_its_inbox_and_of_every_inbox_only():
    async def scenario():
        hub = live.Hub()
        hub.task = asyncio.get_running_loop().create_future()  # no LISTEN in this test
        desk_pages = [hub.subscribe("inbox:7") for _ in range(3)]
        other_page = hub.subscribe("inbox:8")
        approvals_page = hub.subscribe(live.ANY)

        hub.publish("7:message")

        assert all(page.is_set() for page in desk_pages)
        assert approvals_page.is_set()
        assert not other_page.is_set()
        hub.unsubscribe("inbox:7", desk_pages[0])
        assert len(hub.topics["inbox:7"]) == 2
        for page in desk_pages[1:]:
            hub.unsubscribe("inbox:7", page)
        assert "inbox:7" not in hub.topics, "a topic nobody watches is forgotten"
        hub.task.cancel()

    asyncio.run(scenario())


def test_prune_keeps_each_inboxs_newest_change_and_so_its_cursor(desk, make_inbox):
    from django.core.management import call_command

    from alwayson.web.models import LiveChange

    other = make_inbox("other")
    for n in range(3):
        say(desk, f"desk {n}")
    say(other, "other")
    cursors = live.inbox_cursor(desk.pk), live.inbox_cursor(other.pk)

    call_command("prune", verbosity=0)

    assert LiveChange.objects.filter(inbox=desk).count() == 1
    assert (live.inbox_cursor(desk.pk), live.inbox_cursor(other.pk)) == cursors
