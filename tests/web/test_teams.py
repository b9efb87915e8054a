"""Teams: members and roles per inbox, on every page and action, and in the admin.

An inbox has an owner (always a manager) and members, users or groups, each with a role:
viewer (sees the conversation and the approvals), approver (also answers and writes to the
agent), manager (also edits the inbox, its channel and its members in the admin). Anyone else
gets the same 404 as for an inbox that does not exist.
"""

from types import SimpleNamespace

import pytest
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import reverse

from alwayson.web.views import READ_ONLY
from approvals.models import Approval, AuditEntry
from approvals.services import MayNotAnswer, answer_approval
from approvals.views import REFUSED
from inbox.models import Event, Inbox, Membership, Role
from outbox.models import Channel
from tests.support.pages import ask, detail_url, message_id_of, snapshot, text_of

pytestmark = pytest.mark.django_db

MEMBERS = {
    "viewer": Role.VIEWER,
    "approver": Role.APPROVER,
    "grouped": Role.APPROVER,  # an approver through the group "finance"
    "manager": Role.MANAGER,
    "owner": Role.MANAGER,
}
ANSWERERS = ["approver", "grouped", "manager", "owner"]
CHAT = {"message_id": "5f0f3c2e-8f0a-4c1e-9a57-1d7c4f0e2b11", "text": "refund order 7"}


@pytest.fixture
def team(django_user_model, make_inbox, owner):
    desk = make_inbox("desk", owner=owner)
    other = make_inbox("other-desk")
    finance = Group.objects.create(name="finance")
    people = {"owner": owner}
    for name in ("viewer", "approver", "grouped", "manager", "outsider"):
        people[name] = django_user_model.objects.create_user(
            username=name, email=f"{name}@example.com"
        )
    Membership.objects.create(inbox=desk, user=people["viewer"], role=Role.VIEWER)
    Membership.objects.create(inbox=desk, user=people["approver"], role=Role.APPROVER)
    Membership.objects.create(inbox=desk, group=finance, role=Role.APPROVER)
    people["grouped"].groups.add(finance)
    Membership.objects.create(inbox=desk, user=people["manager"], role=Role.MANAGER)
    # The outsider manages another inbox: a role there gives nothing here.
    Membership.objects.create(inbox=other, user=people["outsider"], role=Role.MANAGER)
    return SimpleNamespace(desk=desk, other=other, finance=finance, **people)


def client_of(user):
    client = Client()
    client.force_login(user)
    return client


# --- who holds which role ----------------------------------------------------------------------


def test_each_person_holds_their_role_and_outsiders_none(team):
    for name, role in MEMBERS.items():
        assert team.desk.role_of(getattr(team, name)) == role, name
    assert team.desk.role_of(team.outsider) is None
    assert team.other.role_of(team.outsider) == Role.MANAGER
    assert set(Inbox.objects.with_role(team.viewer)) == {team.desk}
    assert set(Inbox.objects.with_role(team.viewer, Role.APPROVER)) == set()
    assert set(Inbox.objects.with_role(team.grouped, Role.APPROVER)) == {team.desk}
    assert set(Inbox.objects.with_role(team.outsider)) == {team.other}


def test_anonymous_and_inactive_users_hold_no_role(team):
    from django.contrib.auth.models import AnonymousUser

    assert team.desk.role_of(AnonymousUser()) is None
    assert not Inbox.objects.with_role(AnonymousUser()).exists()
    team.manager.is_active = False
    team.manager.save()
    assert team.desk.role_of(team.manager) is None
    assert not Inbox.objects.with_role(team.manager).exists()


def test_the_highest_of_a_users_roles_counts(team):
    team.viewer.groups.add(team.finance)  # viewer directly, approver through the group
    assert team.desk.role_of(team.viewer) == Role.APPROVER
    Membership.objects.filter(group=team.finance).update(role=Role.VIEWER)
    Membership.objects.filter(user=team.viewer).update(role=Role.MANAGER)
    assert team.desk.role_of(team.viewer) == Role.MANAGER


def test_the_owner_stays_a_manager_whatever_a_row_says(team):
    Membership.objects.create(inbox=team.desk, user=team.owner, role=Role.VIEWER)
    assert team.desk.role_of(team.owner) == Role.MANAGER
    assert set(team.desk.people_with_role(Role.MANAGER)) == {team.owner, team.manager}


def test_leaving_the_group_takes_the_role_away(team):
    team.grouped.groups.remove(team.finance)
    assert team.desk.role_of(team.grouped) is None
    assert client_of(team.grouped).get("/inbox/desk/").status_code == 404


def test_people_with_a_role_come_from_users_and_groups(team):
    approvers = set(team.desk.people_with_role(Role.APPROVER))
    assert approvers == {team.owner, team.approver, team.grouped, team.manager}
    everyone = set(team.desk.people_with_role(Role.VIEWER))
    assert everyone == approvers | {team.viewer}
    team.grouped.is_active = False
    team.grouped.save()
    assert team.grouped not in set(team.desk.people_with_role(Role.APPROVER))


def test_a_membership_names_a_user_or_a_group_not_both(team):
    from django.core.exceptions import ValidationError
    from django.db import IntegrityError, transaction

    both = Membership(inbox=team.desk, user=team.outsider, group=team.finance)
    with pytest.raises(ValidationError):
        both.clean()
    with pytest.raises(IntegrityError), transaction.atomic():
        both.save()
    with pytest.raises(IntegrityError), transaction.atomic():
        Membership.objects.create(inbox=team.desk, user=team.viewer, role=Role.MANAGER)


# --- the pages ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MEMBERS)
def test_every_member_sees_home_the_conversation_and_the_approvals(team, name):
    ask(team.desk)
    client = client_of(getattr(team, name))

    home = text_of(client.get("/"))
    assert 'href="/inbox/desk/"' in home
    assert "other-desk" not in home
    if name != "owner":
        assert f'<span class="meta role">{MEMBERS[name].label}</span>' in home
    assert client.get("/inbox/desk/").status_code == 200
    assert "Refund order 881" in text_of(client.get("/approvals/"))
    page = client.get(detail_url("desk", "refund-881"))
    assert page.status_code == 200
    assert "Refund order 881?" in text_of(page)


def test_an_outsider_gets_the_same_404_as_for_nothing(team):
    ask(team.desk)
    client = client_of(team.outsider)
    before = snapshot()

    assert "/inbox/desk/" not in text_of(client.get("/"))
    assert "881" not in text_of(client.get("/approvals/"))
    responses = [
        client.get("/inbox/desk/"),
        client.post("/inbox/desk/", CHAT),
        client.get(detail_url("desk", "refund-881")),
        client.post(detail_url("desk", "refund-881"), {"answer": "yes"}),
    ]
    unknown = client.get("/inbox/no-such-desk/")
    for response in responses:
        assert response.status_code == 404
        assert response.content == unknown.content
    assert snapshot() == before
    assert client.get("/inbox/other-desk/").status_code == 200  # their own inbox


@pytest.mark.parametrize("name", ANSWERERS)
def test_approvers_and_managers_answer(team, name):
    user = getattr(team, name)
    approval = ask(team.desk)
    client = client_of(user)
    page = text_of(client.get(detail_url("desk", "refund-881")))
    assert 'value="yes"' in page and 'value="no"' in page

    response = client.post(detail_url("desk", "refund-881"), {"answer": "yes"}, follow=True)

    assert response.status_code == 200
    assert "Your answer was recorded." in text_of(response)
    approval.refresh_from_db()
    assert (approval.answer, approval.answered_by) == ("yes", user)
    entry = AuditEntry.objects.get()
    assert (entry.user, entry.username, entry.via, entry.result) == (
        user,
        name,
        "page",
        "approved",
    )
    assert f'<dd class="answered-by">{name}</dd>' in text_of(response)


def test_a_viewer_who_tries_to_answer_is_refused_clearly(team):
    ask(team.desk)
    client = client_of(team.viewer)
    page = text_of(client.get(detail_url("desk", "refund-881")))
    assert 'value="yes"' not in page and 'value="no"' not in page
    assert "answering it takes the approver role" in page
    before = snapshot()

    for answer in ("yes", "no"):
        response = client.post(detail_url("desk", "refund-881"), {"answer": answer})
        assert response.status_code == 403
        html = text_of(response)
        refusal = REFUSED.format(inbox="desk")
        assert f'<p class="error" role="alert">{refusal}</p>' in html
        assert "you are a viewer of desk" in refusal

    assert snapshot() == before
    assert Approval.objects.get().answer == ""


def test_the_api_refuses_an_answer_from_a_user_without_the_approver_role(team, t0):
    ask(team.desk)
    before = snapshot()
    for user in (team.viewer, team.outsider):
        with pytest.raises(MayNotAnswer):
            answer_approval(team.desk, "refund-881", "yes", by=user)
    assert snapshot() == before


def test_a_viewer_reads_the_conversation_but_cannot_write(team):
    client = client_of(team.viewer)
    page = text_of(client.get("/inbox/desk/"))
    assert 'aria-label="Message your agent"' not in page
    assert "writing to the agent takes the approver role" in page
    before = snapshot()

    response = client.post("/inbox/desk/", CHAT)

    assert response.status_code == 403
    assert f'<p class="error" role="alert">{READ_ONLY}</p>' in text_of(response)
    assert snapshot() == before


@pytest.mark.parametrize("name", ANSWERERS)
def test_approvers_and_managers_write_to_the_agent(team, name):
    client = client_of(getattr(team, name))
    message_id = message_id_of(client.get("/inbox/desk/"))

    response = client.post("/inbox/desk/", {"message_id": message_id, "text": "refund order 7"})

    assert response.status_code == 302
    event = Event.objects.get(source="chat")
    assert (event.inbox, event.payload) == (team.desk, {"text": "refund order 7", "from": name})


def test_teammates_messages_say_who_wrote_them(team):
    client_of(team.approver).post("/inbox/desk/", CHAT)
    ask(team.desk)

    theirs = text_of(client_of(team.manager).get("/inbox/desk/"))
    mine = text_of(client_of(team.approver).get("/inbox/desk/"))

    assert '<p class="who">approver</p>' in theirs
    assert '<p class="who">You</p>' in mine


def test_the_conversation_card_has_buttons_only_for_those_who_answer(team):
    approval = ask(team.desk)
    viewer_page = text_of(client_of(team.viewer).get("/inbox/desk/"))
    approver_page = text_of(client_of(team.approver).get("/inbox/desk/"))

    assert f'id="approve-{approval.pk}"' not in viewer_page
    assert "you can see it but not answer" in viewer_page
    assert f'id="approve-{approval.pk}"' in approver_page
    assert '<input type="hidden" name="via" value="conversation">' in approver_page


def test_an_answer_on_the_card_is_audited_as_from_the_conversation(team):
    ask(team.desk)
    client = client_of(team.grouped)

    response = client.post(
        detail_url("desk", "refund-881"),
        {"answer": "no", "via": "conversation", "next": "/inbox/desk/"},
    )

    assert response.status_code == 302
    assert response["Location"] == "/inbox/desk/"
    entry = AuditEntry.objects.get()
    assert (entry.username, entry.answer, entry.via, entry.result) == (
        "grouped",
        "no",
        "conversation",
        "denied",
    )
    assert entry.action_shown == "Refund order 881"
    assert "Answered by grouped" in text_of(client.get("/inbox/desk/"))


def test_staff_with_the_answer_permission_still_answer_any_inbox(team, django_user_model):
    from django.contrib.auth.models import Permission

    ask(team.desk)
    operator = django_user_model.objects.create_user(username="operator", is_staff=True)
    operator.user_permissions.add(Permission.objects.get(codename="answer_any_approval"))
    client = client_of(operator)

    response = client.post(detail_url("desk", "refund-881"), {"answer": "yes"})

    assert response.status_code == 302
    assert AuditEntry.objects.get().username == "operator"
    assert client.get("/inbox/desk/").status_code == 404  # approvals only, as before


# --- the admin ---------------------------------------------------------------------------------


def admin_url(model, view, *args):
    opts = model._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_{view}", args=args)


@pytest.fixture
def staff_team(team):
    for name in ("viewer", "manager", "outsider"):
        user = getattr(team, name)
        user.is_staff = True
        user.save()
    Membership.objects.filter(user=team.outsider).delete()  # no role anywhere
    Channel.objects.create(inbox=team.desk, email="desk@example.com")
    Channel.objects.create(inbox=team.other, email="other@example.com")
    return team


def change_form_data(response):
    """What the change form would post back unchanged: the form's and its inlines' values."""
    data = {}
    form = response.context["adminform"].form
    for name in form.fields:
        value = form.initial.get(name)
        if value is not None:
            data[name] = value
    for inline in response.context["inline_admin_formsets"]:
        formset = inline.formset
        for key, value in formset.management_form.initial.items():
            data[f"{formset.prefix}-{key}"] = value
        for subform in formset.forms:
            for name in subform.fields:
                value = subform.instance.pk if name == "id" else subform.initial.get(name)
                if value is not None:
                    data[subform.add_prefix(name)] = getattr(value, "pk", value)
    return data


def test_a_staff_manager_edits_their_inbox_and_its_members_in_the_admin(staff_team):
    team = staff_team
    client = client_of(team.manager)

    index = text_of(client.get(reverse("admin:index")))
    for model in (Inbox, Membership, Approval, AuditEntry, Channel):
        assert admin_url(model, "changelist") in index, model
    assert admin_url(Event, "changelist") not in index

    listed = client.get(admin_url(Inbox, "changelist"))
    assert list(listed.context["cl"].result_list) == [team.desk]

    page = client.get(admin_url(Inbox, "change", team.desk.pk))
    assert page.status_code == 200
    assert "memberships-TOTAL_FORMS" in text_of(page)  # the members, on the inbox's page
    data = change_form_data(page)
    data.update({"name": "Refund desk", "owner": team.manager.pk})
    data["memberships-0-role"] = Role.APPROVER  # the first row: the manager is ordered first
    assert data["memberships-0-id"] == Membership.objects.get(user=team.manager).pk
    saved = client.post(admin_url(Inbox, "change", team.desk.pk), data)
    assert saved.status_code == 302, saved.context and saved.context["errors"]
    team.desk.refresh_from_db()
    assert (team.desk.name, team.desk.owner) == ("Refund desk", team.owner)  # owner read-only
    assert Membership.objects.get(user=team.manager).role == Role.APPROVER  # demoted themself

    # Another inbox: as if it did not exist.
    other = client.get(admin_url(Inbox, "change", team.other.pk))
    assert other.status_code == 302 and other["Location"] == reverse("admin:index")


def test_a_staff_manager_adds_members_and_edits_the_channel_of_their_inbox_only(staff_team):
    team = staff_team
    client = client_of(team.manager)

    added = client.post(
        admin_url(Membership, "add"),
        {"inbox": team.desk.pk, "user": team.outsider.pk, "role": Role.VIEWER},
    )
    assert added.status_code == 302
    assert team.desk.role_of(team.outsider) == Role.VIEWER
    refused = client.post(
        admin_url(Membership, "add"),
        {"inbox": team.other.pk, "user": team.manager.pk, "role": Role.MANAGER},
    )
    assert refused.status_code == 200
    assert "inbox" in refused.context["adminform"].form.errors
    assert team.other.role_of(team.manager) is None

    channels = client.get(admin_url(Channel, "changelist"))
    assert [c.pk for c in channels.context["cl"].result_list] == [team.desk.pk]
    edited = client.post(
        admin_url(Channel, "change", team.desk.pk),
        {
            "kind": "email",
            "email": "team@example.com",
            "url": "",
            "target": "",
            "mode": "at_least_once",
            "gap": "",
        },
    )
    assert edited.status_code == 302
    assert Channel.objects.get(pk=team.desk.pk).email == "team@example.com"
    assert client.get(admin_url(Channel, "change", team.other.pk)).status_code == 302
    assert Channel.objects.get(pk=team.other.pk).email == "other@example.com"


def test_a_staff_viewer_sees_their_inbox_in_the_admin_and_changes_nothing(staff_team):
    team = staff_team
    ask(team.desk)
    ask(team.other, "refund-999", "refund order 999")
    client = client_of(team.viewer)

    page = client.get(admin_url(Inbox, "change", team.desk.pk))
    assert page.status_code == 200
    assert 'name="_save"' not in text_of(page)
    assert client.post(admin_url(Inbox, "change", team.desk.pk), {"name": "x"}).status_code == 403
    assert client.get(admin_url(Membership, "add")).status_code == 403
    assert client.post(admin_url(Channel, "change", team.desk.pk), {}).status_code == 403
    approvals = client.get(admin_url(Approval, "changelist"))
    assert [a.request_id for a in approvals.context["cl"].result_list] == ["refund-881"]
    team.desk.refresh_from_db()
    assert team.desk.name == ""


def test_the_admins_inbox_filters_list_only_inboxes_the_user_may_see(staff_team, make_inbox):
    team = staff_team
    ops = make_inbox("ops-desk")
    Membership.objects.create(inbox=ops, user=team.manager, role=Role.VIEWER)
    for inbox in (team.desk, ops, team.other):
        ask(inbox, "refund-999", "refund order 999")
        answer_approval(inbox, "refund-999", "no")
    client = client_of(team.manager)

    for model in (Approval, AuditEntry, Membership):
        html = text_of(client.get(admin_url(model, "changelist")))
        assert "other-desk" not in html, model
    approvals = text_of(client.get(admin_url(Approval, "changelist")))
    for inbox in (team.desk, ops):  # the filter's choices: the two the manager may see
        assert f"?inbox__id__exact={inbox.pk}" in approvals
    assert f"?inbox__id__exact={team.other.pk}" not in approvals


def test_staff_without_a_role_or_a_permission_see_nothing_of_inboxes(staff_team):
    client = client_of(staff_team.outsider)
    index = client.get(reverse("admin:index"))
    assert index.status_code == 200
    assert admin_url(Inbox, "changelist") not in text_of(index)
    for model in (Inbox, Membership, Approval, AuditEntry, Channel):
        assert client.get(admin_url(model, "changelist")).status_code == 403, model
