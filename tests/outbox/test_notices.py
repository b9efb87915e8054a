"""Telling the approvers: a new approval is announced to the inbox's approvers by email, once
per approval and person, committed with the request, sent by the dispatcher under a stable
Message-ID, retried and parked like the outbox."""

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.conf import settings
from django.contrib.auth.models import Group
from django.core import mail
from django.core.management import call_command
from django.urls import reverse

from alwayson.runtime.api import dispatch, dispatch_notices, finish, request_approval
from alwayson.runtime.run import Run
from inbox.models import Membership, Role
from inbox.services import Held, acquire, claim_batch, ingest
from outbox.channels import SendFailed
from outbox.models import Notice, OutboxMessage
from outbox.services import resend_notices
from tests.support.mail import use_email_backend

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)
WINDOW = 4 * HOUR


@pytest.fixture
def team(make_inbox, django_user_model, settings):
    use_email_backend(settings, "django.core.mail.backends.locmem.EmailBackend")
    settings.ALWAYSON_SITE_URL = "https://desk.example.com"
    mail.outbox = []
    owner = django_user_model.objects.create_user(username="owner", email="owner@example.com")
    desk = make_inbox("desk", owner=owner)
    finance = Group.objects.create(name="finance")
    people = {"owner": owner, "desk": desk}
    for name, role in (("dana", Role.APPROVER), ("mia", Role.MANAGER), ("vic", Role.VIEWER)):
        people[name] = django_user_model.objects.create_user(
            username=name, first_name=name.capitalize(), email=f"{name}@example.com"
        )
        Membership.objects.create(inbox=desk, user=people[name], role=role)
    people["lee"] = django_user_model.objects.create_user(
        username="lee", first_name="Lee", email="lee@example.com"
    )
    people["lee"].groups.add(finance)
    Membership.objects.create(inbox=desk, group=finance, role=Role.APPROVER)
    return SimpleNamespace(**people)


def recipients():
    return sorted(Notice.objects.values_list("recipient__username", flat=True))


def test_a_new_approval_is_announced_to_each_approver_but_the_owner(team, t0):
    approval = request_approval(
        team.desk, "refund-881", "refund order 881 for 750", WINDOW, now=t0, approvers=2
    )

    # Approvers and managers, directly or through a group; not the viewer, not the owner
    # (the agent tells the owner through the inbox's channel).
    assert recipients() == ["dana", "lee", "mia"]
    notice = Notice.objects.get(recipient=team.lee)
    assert (notice.status, notice.created, notice.due_at, notice.topic) == (
        "held",
        t0,
        t0,
        "approval:refund-881",
    )
    assert notice.subject == "[desk] Approval needed: Refund order 881 for 750"
    link = "https://desk.example.com/approvals/desk/refund-881/"
    assert notice.body == (
        "Lee,\n\nthe agent of desk asks for approval:\n\nRefund order 881 for 750\n\n"
        "Two different approvers must approve it. Approve or deny before"
        f" {approval.expires_at:%Y-%m-%d %H:%M} UTC (4 h from when it was asked):\n{link}\n\n"
        "You get this email because you are an approver of desk."
    )
    assert not mail.outbox  # the dispatcher sends them


def test_asking_again_announces_nothing_twice(team, t0):
    request_approval(team.desk, "refund-881", "refund order 881", WINDOW, now=t0)
    request_approval(team.desk, "refund-881", "refund order 881", WINDOW, now=t0 + HOUR)
    assert recipients() == ["dana", "lee", "mia"]


def test_the_announcement_commits_with_the_runs_finish_or_not_at_all(team, t0, ttl):
    ingest(team.desk, "chat", "m1", {"text": "refund order 881"}, now=t0)

    def run_asking(holder, at):
        gen = acquire(team.desk, holder, now=at)
        events = claim_batch(team.desk, holder, gen, now=at)
        run = Run(team.desk, holder, gen, events, {})
        run.ask("refund-881", "refund order 881", WINDOW)
        return gen, events, run

    gen, events, run = run_asking("A", t0)
    assert not Notice.objects.exists()  # nothing before the finish
    # A stalls past its lease; B takes over and finishes; A's late finish is refused.
    later = t0 + ttl + timedelta(seconds=1)
    gen_b, events_b, run_b = run_asking("B", later)
    assert finish(Held(team.desk, "B", gen_b, [e.pk for e in events_b]), run_b.effects(), now=later)
    assert not finish(Held(team.desk, "A", gen, [e.pk for e in events]), run.effects(), now=later)

    assert recipients() == ["dana", "lee", "mia"]
    assert set(Notice.objects.values_list("created", flat=True)) == {later}


def test_the_dispatcher_sends_each_notice_once_under_a_stable_message_id(team, t0):
    request_approval(team.desk, "refund-881", "refund order 881", WINDOW, now=t0)

    assert dispatch_notices(now=t0) == 3
    assert dispatch_notices(now=t0 + HOUR) == 0

    sent = {message.to[0]: message for message in mail.outbox}
    assert sorted(sent) == ["dana@example.com", "lee@example.com", "mia@example.com"]
    for notice in Notice.objects.select_related("recipient"):
        message = sent[notice.recipient.email]
        assert message.extra_headers["Message-ID"] == f"<{notice.key}@alwayson>"
        assert message.subject == notice.subject
        assert message.body == notice.body
        assert "https://desk.example.com/approvals/desk/refund-881/" in message.alternatives[0][0]
        assert (notice.status, notice.sent_at, notice.sent_to) == (
            "sent",
            t0,
            notice.recipient.email,
        )
    # Keys differ per person and per approval, and are derived from them.
    assert len(set(Notice.objects.values_list("key", flat=True))) == 3


def test_notices_neither_wait_for_nor_spend_the_inboxs_gap(team, t0):
    OutboxMessage.objects.create(inbox=team.desk, body="sent just now", created=t0, status="sent")
    OutboxMessage.objects.filter(inbox=team.desk).update(sent_at=t0)
    OutboxMessage.objects.create(inbox=team.desk, body="held for the gap", created=t0)
    request_approval(team.desk, "refund-881", "refund order 881", WINDOW, now=t0)

    minute = timedelta(minutes=1)
    assert dispatch(send=lambda delivery: None, now=t0 + minute) == 0  # the gap holds it
    assert dispatch_notices(now=t0 + minute) == 3
    gap = timedelta(seconds=settings.ALWAYSON_OUTBOX_GAP)
    assert dispatch(send=lambda delivery: None, now=t0 + gap) == 1


def test_a_failed_notice_is_retried_with_backoff_and_parked_like_the_outbox(team, t0, settings):
    settings.ALWAYSON_OUTBOX_MAX_ATTEMPTS = 3
    request_approval(team.desk, "refund-881", "refund order 881", WINDOW, now=t0)
    attempts = []

    def failing(notice):
        attempts.append((notice.recipient.username, notice.key))
        if notice.recipient.username == "lee":
            raise SendFailed("smtp: connection refused")
        return notice.recipient.email

    assert dispatch_notices(send=failing, now=t0) == 2
    lee = Notice.objects.get(recipient=team.lee)
    assert (lee.status, lee.attempts, lee.error) == ("held", 1, "smtp: connection refused")
    assert lee.due_at > t0
    assert dispatch_notices(send=failing, now=lee.due_at - timedelta(seconds=1)) == 0
    at = lee.due_at
    for _ in range(2):
        dispatch_notices(send=failing, now=at)
        lee.refresh_from_db()
        at = max(at, lee.due_at)
    assert (lee.status, lee.attempts) == ("failed", 3)
    assert dispatch_notices(send=failing, now=at + 10 * HOUR) == 0
    # Every attempt carried the same key: the same Message-ID.
    assert {key for name, key in attempts if name == "lee"} == {lee.key}

    assert resend_notices([lee.pk], now=at) == [lee.pk]
    assert dispatch_notices(now=at) == 1
    assert mail.outbox[-1].extra_headers["Message-ID"] == f"<{lee.key}@alwayson>"
    lee.refresh_from_db()
    assert (lee.status, lee.attempts, lee.error) == ("sent", 0, "")


def test_an_approver_without_an_address_shows_up_as_a_failed_notice(team, t0, settings):
    settings.ALWAYSON_OUTBOX_MAX_ATTEMPTS = 1
    team.dana.email = ""
    team.dana.save()
    request_approval(team.desk, "refund-881", "refund order 881", WINDOW, now=t0)

    assert dispatch_notices(now=t0) == 2

    dana = Notice.objects.get(recipient=team.dana)
    assert (dana.status, dana.error) == ("failed", "no address: user dana has no email")


@pytest.mark.django_db(transaction=True)  # the loop closes and reopens its connection
def test_rundispatcher_sends_the_notices(team, t0, loop_command):
    request_approval(team.desk, "refund-881", "refund order 881", WINDOW)
    call_command("rundispatcher", "--once", verbosity=0)
    assert sorted(m.to[0] for m in mail.outbox) == [
        "dana@example.com",
        "lee@example.com",
        "mia@example.com",
    ]


def test_the_admin_lists_notices_and_resends_parked_ones(team, t0, admin_client, settings):
    settings.ALWAYSON_OUTBOX_MAX_ATTEMPTS = 1
    request_approval(team.desk, "refund-881", "refund order 881", WINDOW, now=t0)
    dispatch_notices(send=lambda notice: (_ for _ in ()).throw(SendFailed("down")), now=t0)
    assert set(Notice.objects.values_list("status", flat=True)) == {"failed"}
    changelist = reverse("admin:outbox_notice_changelist")
    assert admin_client.get(changelist).status_code == 200
    one = Notice.objects.get(recipient=team.dana)

    response = admin_client.post(
        changelist,
        {"action": "resend", "_selected_action": [one.pk], "index": 0},
        follow=True,
    )

    assert "1 notice(s) put back" in response.content.decode()
    one.refresh_from_db()
    assert (one.status, one.attempts) == ("held", 0)


def test_deadletters_lists_parked_notices_and_resends_them(team, t0, settings):
    from io import StringIO

    from django.core.management.base import CommandError

    settings.ALWAYSON_OUTBOX_MAX_ATTEMPTS = 1
    request_approval(team.desk, "refund-881", "refund order 881", WINDOW, now=t0)
    dispatch_notices(send=lambda notice: (_ for _ in ()).throw(SendFailed("down")), now=t0)
    lee = Notice.objects.get(recipient=team.lee)

    def run(*args):
        out = StringIO()
        call_command("deadletters", *args, stdout=out)
        return out.getvalue()

    listing = run()
    assert "3 failed notice(s)" in listing
    assert f"  {lee.pk}\tdesk\tlee\tapproval:refund-881\t1\tdown\t{lee.key}" in listing
    with pytest.raises(CommandError, match="not failed notices"):
        run("--resend-notices", str(lee.pk), "999999")
    assert Notice.objects.failed().count() == 3
    assert "resent 1 notice(s)" in run("--resend-notices", str(lee.pk))
    assert Notice.objects.get(pk=lee.pk).status == "held"
