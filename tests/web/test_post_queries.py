"""What a person's post costs the database, counted: the chat form and an approval's answer.

Structural, not timing (bench/web.py measures the time): each post's queries are listed
here so that a new one has to be added on purpose. The chat post reads the session, the user,
the inbox with the user's role in it, then stores the message (one statement on PostgreSQL).
"""

import uuid

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test import Client

from inbox.models import Event, Inbox, Membership, Role

pytestmark = pytest.mark.django_db

# The session, the user, the inbox with the role; then storing, in a savepoint of the
# test's transaction: PostgreSQL's one statement, SQLite's insert and marker.
CHAT_POST = {"postgresql": 6, "sqlite": 7}


@pytest.fixture
def grouped(django_user_model, make_inbox, owner):
    """An approver of "desk" through a group: the role a query must find through the groups."""
    desk = make_inbox("desk", owner=owner)
    finance = Group.objects.create(name="finance")
    Membership.objects.create(inbox=desk, group=finance, role=Role.APPROVER)
    user = django_user_model.objects.create_user(username="dana")
    user.groups.add(finance)
    client = Client()
    client.force_login(user)
    # The inbox's first event takes the slower path on PostgreSQL (its marker unset): not
    # what is counted here.
    client.post("/inbox/desk/", {"message_id": str(uuid.uuid4()), "text": "first"})
    return desk, user, client


def test_the_chat_post_reads_the_role_with_the_inbox(grouped, django_assert_num_queries):
    desk, _, client = grouped
    message_id = str(uuid.uuid4())

    with django_assert_num_queries(CHAT_POST[connection.vendor]):
        response = client.post("/inbox/desk/", {"message_id": message_id, "text": "refund 7"})

    assert (response.status_code, response["Location"]) == (302, "/inbox/desk/")
    event = Event.objects.get(inbox=desk, source="chat", source_id=message_id)
    assert event.payload == {"text": "refund 7", "from": "dana"}
    assert "Sent." in client.get("/inbox/desk/").content.decode()


def test_a_role_read_with_the_inbox_answers_for_that_user_only(grouped, django_user_model):
    desk, user, _ = grouped
    other = django_user_model.objects.create_user(username="lee")
    Membership.objects.create(inbox=desk, user=other, role=Role.VIEWER)
    inbox = Inbox.objects.get_with_role(user, "desk")

    assert inbox.role_of(user) == Role.APPROVER
    # Another user's role is asked, not taken from the one read for dana.
    assert inbox.role_of(other) == Role.VIEWER
    assert not inbox.has_role(other, Role.APPROVER)
    assert Inbox.objects.get_with_role(other, "desk").role_of(other) == Role.VIEWER


def test_no_role_is_the_same_does_not_exist_as_no_inbox(grouped, django_user_model):
    outsider = django_user_model.objects.create_user(username="sam")
    for slug in ("desk", "no-such-desk"):
        with pytest.raises(Inbox.DoesNotExist):
            Inbox.objects.get_with_role(outsider, slug)
    outsider.is_active = False
    desk, user, _ = grouped
    user.is_active = False
    with pytest.raises(Inbox.DoesNotExist):
        Inbox.objects.get_with_role(user, "desk")


def test_the_role_read_with_the_inbox_is_role_of_for_every_kind_of_member(
    grouped, django_user_model, owner
):
    """The statement built once (for a stand-in user and slug) finds each user's own role:
    owner, direct member of each role, member through a group, and anyone else."""
    desk, dana, _ = grouped
    people = {"owner": owner, "dana": dana}
    for name, role in (("viewer", Role.VIEWER), ("approver", Role.APPROVER), ("manager", 3)):
        people[name] = django_user_model.objects.create_user(username=name)
        Membership.objects.create(inbox=desk, user=people[name], role=role)
    people["both"] = django_user_model.objects.create_user(username="both")
    Membership.objects.create(inbox=desk, user=people["both"], role=Role.VIEWER)
    people["both"].groups.add(Group.objects.get(name="finance"))

    for name, user in people.items():
        fresh = Inbox.objects.get(slug="desk")  # role_of asks the database
        read = Inbox.objects.get_with_role(user, "desk").role_of(user)
        assert read == fresh.role_of(user) is not None, name
    assert Inbox.objects.get_with_role(people["both"], "desk").role_of(people["both"]) == (
        Role.APPROVER
    )


@pytest.mark.parametrize("slug", ["de\x00sk", "", None, 7])
def test_a_slug_no_inbox_can_have_is_does_not_exist(grouped, slug):
    _, dana, _ = grouped
    with pytest.raises(Inbox.DoesNotExist):
        Inbox.objects.get_with_role(dana, slug)
