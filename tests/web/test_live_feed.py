"""The conversation's feed (alwayson/web/feed.py): a change read once, the entries that moved
rendered once per person looking, and each page sent what it lacks from memory. The reading
and rendering are the same on both databases; the push through real streams is in
test_live_push.py."""

import json
import threading
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from alwayson.web import conversation, feed, live
from approvals.services import request_approval
from inbox import clock
from inbox.models import Membership, Role
from inbox.services import ingest
from tests.support.outbox import hold

pytestmark = pytest.mark.django_db


@pytest.fixture
def renders(monkeypatch):
    """The entries rendered, as (entry key, username) pairs."""
    rendered = []
    real = conversation.render_entry

    def counted(entry, **context):
        rendered.append((entry.key, context["user"].get_username()))
        return real(entry, **context)

    monkeypatch.setattr(conversation, "render_entry", counted)
    return rendered


def say(inbox, body):
    return hold(inbox, body, at=clock.database_now())


def member(inbox, django_user_model, username, role):
    user = django_user_model.objects.create_user(username=username)
    Membership.objects.create(inbox=inbox, user=user, role=role)
    return user


def patch_of(sent):
    """The change a patch event carries."""
    head, _, data = sent.partition("data: ")
    assert head.startswith("event: patch\n"), sent[:80]
    return json.loads(data)


def test_a_change_renders_only_the_entries_that_moved(desk, owner, renders):
    for n in range(3):
        say(desk, f"earlier {n}")
    first = feed.read(desk.pk, None, {owner.pk})
    assert len(renders) == 3
    renders.clear()

    reply = say(desk, "the new reply")
    second = feed.read(desk.pk, first, {owner.pk})

    key = f"entry-agent-{reply.pk}"
    assert renders == [(key, "owner")]
    change = patch_of(feed.message(second, owner.pk, first.revision))
    assert list(change["items"]) == [key]
    assert "the new reply" in change["items"][key]
    assert change["order"] == list(second.order) and change["order"][-1] == key


def test_a_status_change_sends_that_entry_alone(desk, owner, renders):
    say(desk, "other")
    reply = say(desk, "on its way")
    first = feed.read(desk.pk, None, {owner.pk})
    renders.clear()

    reply.status = reply.Status.SENT
    reply.save(update_fields=["status"])
    second = feed.read(desk.pk, first, {owner.pk})

    change = patch_of(feed.message(second, owner.pk, first.revision))
    assert list(change["items"]) == [f"entry-agent-{reply.pk}"]
    assert '<span class="state">sent</span>' in change["items"][f"entry-agent-{reply.pk}"]


def test_a_read_that_finds_nothing_new_is_no_new_revision(desk, owner, renders):
    say(desk, "hello")
    first = feed.read(desk.pk, None, {owner.pk})
    renders.clear()
    assert feed.read(desk.pk, first, {owner.pk}) is first
    assert renders == []
    assert feed.message(first, owner.pk, first.revision) is None


def test_the_statements_of_a_change_do_not_grow_with_the_people_looking(
    desk, owner, django_user_model
):
    viewers = [member(desk, django_user_model, f"viewer-{n}", Role.VIEWER) for n in range(6)]
    say(desk, "hello")
    one = feed.read(desk.pk, None, {owner.pk})
    everyone = {owner.pk, *(viewer.pk for viewer in viewers)}
    many = feed.read(desk.pk, None, everyone)

    say(desk, "a reply")
    with CaptureQueriesContext(connection) as for_one:
        feed.read(desk.pk, one, {owner.pk})
    with CaptureQueriesContext(connection) as for_seven:
        feed.read(desk.pk, many, everyone)
    assert len(for_seven) == len(for_one)


def test_each_person_is_rendered_once_in_their_own_words(desk, owner, django_user_model, renders):
    viewer = member(desk, django_user_model, "viewer", Role.VIEWER)
    now = clock.database_now()
    ingest(desk, "chat", "m-1", {"text": "refund order 881", "from": "owner"}, now=now)
    people = {owner.pk, viewer.pk}
    first = feed.read(desk.pk, None, people)
    renders.clear()

    request_approval(desk, "refund-881", "refund order 881", timedelta(hours=4))
    second = feed.read(desk.pk, first, people)

    assert sorted(user for _, user in renders) == ["owner", "viewer"]
    (card,) = patch_of(feed.message(second, owner.pk, first.revision))["items"].values()
    assert 'value="yes"' in card and "csrfmiddlewaretoken" not in card
    (seen,) = patch_of(feed.message(second, viewer.pk, first.revision))["items"].values()
    assert 'value="yes"' not in seen and "you can see it but not answer" in seen
    mine = second.views[owner.pk].html[f"entry-person-{desk.events.get().pk}"]
    theirs = second.views[viewer.pk].html[f"entry-person-{desk.events.get().pk}"]
    assert '<p class="who">You</p>' in mine
    assert '<p class="who">owner</p>' in theirs


def test_pages_of_one_person_at_one_revision_share_one_message(desk, owner):
    first = feed.read(desk.pk, None, {owner.pk})
    say(desk, "once for all")
    second = feed.read(desk.pk, first, {owner.pk})
    pages = [feed.Page(owner.pk, first.cursor) for _ in range(20)]
    sent = []
    for page in pages:
        assert page.next_message(first) is None  # rendered at this very cursor
        sent.append(page.next_message(second))
    assert all(message is sent[0] for message in sent)
    assert all(page.next_message(second) is None for page in pages)


def test_a_page_from_another_cursor_gets_the_whole_region(desk, owner):
    say(desk, "already there")
    state = feed.read(desk.pk, None, {owner.pk})
    page = feed.Page(owner.pk, "0.0.0")
    sent = page.next_message(state)
    assert sent.startswith(f'id: {state.cursor}\ndata: <div id="conversation"')
    assert "already there" in sent


def test_the_first_entry_sends_the_whole_region_to_a_page_of_an_empty_conversation(desk, owner):
    empty = feed.read(desk.pk, None, {owner.pk})
    say(desk, "the first word")
    state = feed.read(desk.pk, empty, {owner.pk})
    sent = feed.message(state, owner.pk, empty.revision)
    assert sent.startswith("id: ") and "<ol" in sent


def test_a_person_who_lost_the_role_is_told_the_page_is_gone(desk, owner, django_user_model):
    viewer = member(desk, django_user_model, "viewer", Role.VIEWER)
    people = {owner.pk, viewer.pk}
    first = feed.read(desk.pk, None, people)
    Membership.objects.filter(user=viewer).delete()
    say(desk, "not for the viewer")
    second = feed.read(desk.pk, first, people)
    assert feed.message(second, viewer.pk, first.revision) == feed.GONE
    assert "not for the viewer" in feed.message(second, owner.pk, first.revision)


def test_a_deactivated_account_and_a_deleted_inbox_end_the_page(desk, owner, django_user_model):
    viewer = member(desk, django_user_model, "viewer", Role.VIEWER)
    people = {owner.pk, viewer.pk}
    first = feed.read(desk.pk, None, people)
    viewer.is_active = False
    viewer.save()
    second = feed.read(desk.pk, first, people)
    assert feed.message(second, viewer.pk, first.revision) == feed.GONE
    desk_id = desk.pk
    desk.delete()
    gone = feed.read(desk_id, second, people)
    assert feed.message(gone, owner.pk, second.revision) == feed.GONE


@pytest.mark.postgres_only  # the feed runs where pages are pushed (live.push_available)
@pytest.mark.django_db(transaction=True)  # the read's own transaction, as in the hub's threads
def test_a_change_committed_during_a_read_is_whole_in_the_next_revision(desk, owner, monkeypatch):
    """A state is one snapshot: had the read seen the change's entries at the cursor from
    before it, a page rendered at that cursor would take the state for the one it shows,
    and the next read, finding no entry moved, would never send it the change."""
    shown = live.inbox_cursor(desk.pk)
    entries = conversation.entries

    def committed_meanwhile(inbox, now):
        # After the read's cursor, before its entries: another connection commits a change.
        monkeypatch.setattr(conversation, "entries", entries)
        thread = threading.Thread(target=_say_and_close, args=(desk, "committed meanwhile"))
        thread.start()
        thread.join()
        return entries(inbox, now)

    monkeypatch.setattr(conversation, "entries", committed_meanwhile)
    during = feed.read(desk.pk, None, {owner.pk})
    page = feed.Page(owner.pk, shown)

    assert page.next_message(during) is None  # it was rendered at this very cursor
    after = feed.read(desk.pk, during, {owner.pk})
    sent = page.next_message(after)
    assert sent is not None and "committed meanwhile" in sent
    assert sent.startswith(f"id: {live.inbox_cursor(desk.pk)}\n")


def _say_and_close(inbox, body):
    try:
        say(inbox, body)
    finally:
        connections.close_all()  # this thread's
