"""The admin console: every model registered and browsable, lists whose query count does not
grow with their rows, the dead-letter actions through the services, read-only machinery
rows, and the dashboard's numbers."""

from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from alwayson.claude.models import ModelCall, ModelSettings, ToolResult
from alwayson.demo.models import Refund
from alwayson.ops.health import ProcessBeat
from alwayson.ops.models import Process
from alwayson.runtime.api import (
    acquire,
    add_timer,
    answer_approval,
    dispatch,
    ingest,
    request_approval,
)
from alwayson.runtime.models import AgentConfig, SavedState
from alwayson.web.models import LiveChange, LiveWatch
from approvals.models import Approval, AuditEntry
from inbox.models import Event, Inbox, Lease, Membership, Role, RunRecord, Session
from outbox.channels import SendFailed
from outbox.models import Channel, Notice, OutboxMessage
from tests.support.admin import messages_of, post_action, timer_form, url
from timers.models import Timer

pytestmark = pytest.mark.django_db

MODELS = [
    Inbox,
    Membership,
    Event,
    Lease,
    Session,
    RunRecord,
    Timer,
    Approval,
    AuditEntry,
    OutboxMessage,
    Notice,
    Channel,
    Refund,
    AgentConfig,
    ModelCall,
    ToolResult,
    Process,
]
MACHINERY = [
    Event,
    Lease,
    Session,
    Approval,
    AuditEntry,
    Notice,
    Refund,
    ModelCall,
    ToolResult,
    Process,
]
STATUSES = ["pending", "running", "done", "dead"]
OUTBOX_STATUSES = ["held", "sent", "failed"]


def grow(make_inbox, count):
    """`count` more inboxes, each with one row of every table (states rotating)."""
    now = timezone.now()
    for _ in range(count):
        inbox = make_inbox()
        n = inbox.pk
        ingest(inbox, "github", f"delivery-{n}", {"n": n, "nested": {"list": [1, 2]}})
        status = STATUSES[n % 4]
        Event.objects.filter(inbox=inbox).update(
            status=status, error="boom" if status == "dead" else ""
        )
        Session.objects.filter(inbox=inbox).update(state={"step": n}, updated=now)
        RunRecord.objects.create(
            inbox=inbox,
            generation=n,
            worker=f"worker-{n}",
            started=now - timedelta(seconds=n),
            ended=now,
            outcome=RunRecord.Outcome.values[n % 5],
            events=[n],
            produced={"said": n},
        )
        if n % 2:
            acquire(inbox, f"worker-{n}")
        member = get_user_model().objects.create(username=f"member-{n}")
        Membership.objects.create(inbox=inbox, user=member, role=Role.APPROVER)  # a notice
        # Answered yes, answered no, or waiting with a first approval of two: an audit row each.
        approvers = 2 if n % 3 == 2 else 1
        request_approval(
            inbox, f"refund-{n}", f"refund order {n}", timedelta(hours=4), approvers=approvers
        )
        answer_approval(inbox, f"refund-{n}", "no" if n % 3 == 1 else "yes", by=member)
        OutboxMessage.objects.create(
            inbox=inbox, body=f"message {n}", created=now, status=OUTBOX_STATUSES[n % 3]
        )
        Channel.objects.create(inbox=inbox, email=f"owner{n}@example.com" if n % 2 else "")
        Refund.objects.create(idempotency_key=f"refund-{n}", order=str(n))
        config = AgentConfig.objects.create(inbox=inbox, agent="alwayson.claude.agent", policy={})
        if n % 2:  # its change page with the model settings inline, and without
            ModelSettings.objects.create(config=config, max_tokens=1000 + n, tool_choice="auto")
        ModelCall.objects.create(
            inbox=inbox,
            request_key=f"{n:064d}",
            generation=1,
            model="claude-sonnet-5-5",
            response={"content": []},
            input_tokens=n,
            output_tokens=1,
            created=now,
        )
        ToolResult.objects.create(
            inbox=inbox,
            idempotency_key=f"refund-{n}",
            tool="refund",
            arguments={"order": str(n)},
            result={"type": "tool_result", "content": "ok"},
            generation=1,
            created=now,
        )
        process = ProcessBeat(Process.Kind.values[n % 3], f"host:{n}")
        process.register(now - n % 2 * timedelta(minutes=5))  # live or lost
        if n % 5 == 0:
            process.mark_stopped(now)


def queries_for(client, path):
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(path)
    assert response.status_code == 200
    return len(ctx.captured_queries)


# The live pages' cursor and LISTEN bookkeeping (alwayson/web/live.py), and the copies of the
# session state a replay starts runs from (SavedState): nothing an operator reads or acts on,
# so not in the admin's index or sidebar.
INTERNAL = {LiveChange, LiveWatch, SavedState}
# Edited inline on another model's page: model -> the model whose page has it.
INLINE = {ModelSettings: AgentConfig}


def test_every_model_of_the_apps_is_registered_but_the_internal_ones():
    labels = ["inbox", "timers", "approvals", "outbox", "alwayson"]
    labels += [f"alwayson_{app}" for app in ("egress", "ops", "claude", "demo", "web")]
    for label in labels:
        for model in apps.get_app_config(label).get_models():
            registered = model not in INTERNAL and model not in INLINE
            assert admin.site.is_registered(model) == registered, model
    for model, page in INLINE.items():
        assert model in [inline.model for inline in admin.site.get_model_admin(page).inlines]


def test_the_admin_index_lists_no_internal_table(admin_client):
    page = admin_client.get(reverse("admin:index")).content.decode()
    assert "Password reset requests" in page  # the pages' app is listed, without them
    assert "Live changes" not in page and "Live watchs" not in page


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_changelist_and_change_page_load(admin_client, make_inbox, model):
    grow(make_inbox, 4)
    response = admin_client.get(url(model, "changelist"))
    assert response.status_code == 200
    assert response.context["cl"].result_count == model.objects.count() > 0
    for obj in model.objects.all():
        assert admin_client.get(url(model, "change", obj.pk)).status_code == 200


def test_no_changelist_queries_grow_with_rows(admin_client, make_inbox):
    # Every model's list at 5 rows, then at 50, from one world grown once (a world per model
    # cost CI minutes per database); the failure names each list that grew.
    grow(make_inbox, 5)
    paths = {model: url(model, "changelist") for model in MODELS}
    queries_for(admin_client, paths[Inbox])  # warm the session
    few = {model: queries_for(admin_client, path) for model, path in paths.items()}
    grow(make_inbox, 45)
    assert all(model.objects.count() >= 50 for model in MODELS)
    many = {model: queries_for(admin_client, path) for model, path in paths.items()}
    grew = [
        f"{m.__name__}: {few[m]} queries at 5 rows, {many[m]} at 50"
        for m in MODELS
        if many[m] != few[m]
    ]
    assert grew == []


def test_event_list_filters_search_and_dates(admin_client, make_inbox):
    grow(make_inbox, 8)
    changelist = url(Event, "changelist")
    dead = admin_client.get(changelist, {"status__exact": "dead"})
    assert {e.status for e in dead.context["cl"].result_list} == {"dead"}
    assert dead.context["cl"].result_count == Event.objects.dead().count() > 0

    target = Event.objects.filter(source="github").first()
    by_key = admin_client.get(changelist, {"q": target.source_id})
    assert list(by_key.context["cl"].result_list) == [target]
    by_inbox = admin_client.get(changelist, {"q": target.inbox.slug})
    assert {e.inbox_id for e in by_inbox.context["cl"].result_list} == {target.inbox_id}

    for params in (
        {"source": "approval"},
        {"inbox__id__exact": target.inbox_id},
        {"created__year": target.created.year, "created__month": target.created.month},
    ):
        response = admin_client.get(changelist, params)
        assert response.status_code == 200
        assert response.context["cl"].result_count > 0, params


def test_dead_event_page_shows_the_error_and_the_pretty_payload(admin_client, inbox):
    ingest(inbox, "github", "poison", {"order": 881, "items": ["a", "b"]})
    Event.objects.update(status="dead", attempts=3, error="too many attempts (3); KeyError")
    response = admin_client.get(url(Event, "change", Event.objects.get().pk))
    html = response.content.decode()
    assert "too many attempts (3); KeyError" in html
    assert (
        '<pre style="white-space: pre-wrap">{\n  &quot;items&quot;: [\n    &quot;a&quot;,' in html
    )
    assert 'name="_save"' not in html


def test_requeue_puts_back_only_dead_events_with_attempts_reset(admin_client, make_inbox, t0):
    a, b = make_inbox("a"), make_inbox("b")
    for inbox, names in ((a, ["dead-1", "dead-2", "pending-1"]), (b, ["dead-3"])):
        for name in names:
            ingest(inbox, "github", name, {}, now=t0)
    Event.objects.filter(source_id__startswith="dead").update(
        status="dead", attempts=3, claim_gen=4, error="too many attempts (3)"
    )
    Event.objects.filter(source_id="pending-1").update(attempts=1, error="timeout")
    Lease.objects.get(inbox=b).recount_work()
    assert Lease.objects.get(inbox=b).work_at is None  # b has nothing to do

    response = post_action(admin_client, Event, "requeue", Event.objects.all())

    assert messages_of(response) == [
        "3 event(s) requeued (back to pending, attempts reset). "
        "1 selected event(s) were in another state and left alone."
    ]
    rows = {e.source_id: (e.status, e.attempts, e.claim_gen, e.error) for e in Event.objects.all()}
    assert rows == {
        "dead-1": ("pending", 0, None, ""),
        "dead-2": ("pending", 0, None, ""),
        "dead-3": ("pending", 0, None, ""),
        "pending-1": ("pending", 1, None, "timeout"),
    }
    # Through the service: b's lease knows it has work again.
    assert Lease.objects.get(inbox=b).work_at is not None


def test_mark_dead_parks_only_pending_events_with_the_reason(admin_client, inbox, t0):
    for name in ("pending-1", "pending-2", "running-1", "dead-1"):
        ingest(inbox, "github", name, {}, now=t0)
    Event.objects.filter(source_id="running-1").update(status="running", attempts=1, claim_gen=1)
    Event.objects.filter(source_id="dead-1").update(status="dead", error="old reason")

    response = post_action(
        admin_client, Event, "mark_dead", Event.objects.all(), reason="poison: bad payload"
    )

    assert messages_of(response) == [
        "2 event(s) marked dead (poison: bad payload). "
        "2 selected event(s) were in another state and left alone."
    ]
    rows = {e.source_id: (e.status, e.error) for e in Event.objects.all()}
    assert rows == {
        "pending-1": ("dead", "poison: bad payload"),
        "pending-2": ("dead", "poison: bad payload"),
        "running-1": ("running", ""),
        "dead-1": ("dead", "old reason"),
    }
    assert Lease.objects.get(inbox=inbox).work_at is None  # recounted: nothing pending


def test_actions_on_all_rows_matching_a_status_filter(admin_client, make_inbox):
    """ "Select all N" through the status filter: the count is taken before the rows move."""
    for inbox in (make_inbox("a"), make_inbox("b")):
        for n in range(3):
            ingest(inbox, "github", f"dead-{n}", {})
    Event.objects.update(status="dead", attempts=3)
    Event.objects.filter(source_id="dead-0").update(status="done")
    changelist = url(Event, "changelist") + "?status__exact=dead"
    response = admin_client.post(
        changelist,
        {"action": "requeue", "select_across": "1", "index": 0, "_selected_action": ["0"]},
        follow=True,
    )
    assert messages_of(response) == ["4 event(s) requeued (back to pending, attempts reset)."]
    assert Event.objects.pending().filter(attempts=0).count() == 4
    assert Event.objects.filter(status="done").count() == 2


def test_mark_dead_without_a_reason_names_the_operator(admin_client, inbox):
    ingest(inbox, "github", "pending-1", {})
    post_action(admin_client, Event, "mark_dead", Event.objects.all())
    assert Event.objects.get().error == "marked dead in the admin by admin"


def test_actions_on_nothing_they_apply_to_say_so(admin_client, inbox):
    ingest(inbox, "github", "pending-1", {})
    response = post_action(admin_client, Event, "requeue", Event.objects.all())
    assert messages_of(response) == [
        "0 event(s) requeued (back to pending, attempts reset). "
        "1 selected event(s) were in another state and left alone."
    ]
    assert Event.objects.get().status == "pending"


def test_actions_need_the_change_permission(client, django_user_model, inbox):
    ingest(inbox, "github", "dead-1", {})
    Event.objects.update(status="dead")
    viewer = django_user_model.objects.create_user("viewer", password="pw-viewer-123")
    viewer.is_staff = True
    viewer.save()
    viewer.user_permissions.add(Permission.objects.get(codename="view_event"))
    client.force_login(viewer)

    response = client.get(url(Event, "changelist"))
    assert response.status_code == 200
    assert response.context["action_form"] is None or "requeue" not in str(
        response.context["action_form"]
    )
    post_action(client, Event, "requeue", Event.objects.all())
    assert Event.objects.get().status == "dead"


def test_resend_puts_back_only_failed_messages(admin_client, inbox, t0):
    def message(body, **fields):
        return OutboxMessage.objects.create(inbox=inbox, body=body, created=t0, **fields)

    message("f1", status="failed", attempts=5, error="smtp down")
    message("f2", status="failed", attempts=5, error="smtp down")
    message("h1")
    message("s1", status="sent", sent_at=t0)

    response = post_action(admin_client, OutboxMessage, "resend", OutboxMessage.objects.all())

    assert messages_of(response) == [
        "2 message(s) put back in the outbox (held, attempts reset). "
        "2 selected message(s) had not failed and were left alone."
    ]
    rows = {m.body: (m.status, m.attempts, m.error) for m in OutboxMessage.objects.all()}
    assert rows == {
        "f1": ("held", 0, ""),
        "f2": ("held", 0, ""),
        "h1": ("held", 0, ""),
        "s1": ("sent", 0, ""),
    }


def test_resend_puts_back_whole_sends_and_says_so(admin_client, inbox, t0):
    def message(body, send_key):
        return OutboxMessage.objects.create(
            inbox=inbox,
            body=body,
            created=t0,
            status="failed",
            attempts=5,
            error="smtp down",
            send_key=send_key,
        )

    first = message("a1", "a" * 32)
    message("a2", "a" * 32)
    message("b1", "b" * 32)

    response = post_action(
        admin_client, OutboxMessage, "resend", OutboxMessage.objects.filter(pk=first.pk)
    )

    assert messages_of(response) == [
        "2 message(s) put back in the outbox (held, attempts reset). 1 of them were not"
        " selected: they were parked in the same send(s) as selected ones, and go again with"
        " them under the same key."
    ]
    rows = {m.body: (m.status, m.attempts, m.send_key) for m in OutboxMessage.objects.all()}
    assert rows == {
        "a1": ("held", 0, "a" * 32),
        "a2": ("held", 0, "a" * 32),
        "b1": ("failed", 5, "b" * 32),
    }


def test_a_message_whose_send_was_attempted_cannot_be_edited(admin_client, inbox, t0):
    """A retry carries the body the receiver may already have under the send's key."""
    message = OutboxMessage.objects.create(inbox=inbox, body="draft", created=t0)

    def timed_out(delivery):
        raise SendFailed("timed out")

    assert dispatch(timed_out, now=t0) == 0
    message.refresh_from_db()
    assert (message.status, message.attempts) == ("held", 1)

    response = admin_client.post(
        url(OutboxMessage, "change", message.pk), {"body": "edited", "urgent": "on"}
    )

    assert response.status_code == 403
    message.refresh_from_db()
    assert (message.body, message.urgent) == ("draft", False)


def test_event_fields_cannot_be_changed_through_the_form(admin_client, inbox):
    ingest(inbox, "github", "delivery-1", {"a": 1})
    event = Event.objects.get()
    response = admin_client.post(
        url(Event, "change", event.pk),
        {"status": "done", "attempts": "0", "error": "edited", "payload": "{}"},
    )
    assert response.status_code == 403
    event.refresh_from_db()
    assert (event.status, event.attempts, event.error, event.payload) == (
        "pending",
        0,
        "",
        {"a": 1},
    )


@pytest.mark.parametrize("model", MACHINERY, ids=lambda m: m.__name__)
def test_machinery_rows_are_view_only(admin_client, make_inbox, model):
    grow(make_inbox, 2)
    obj = model.objects.first()
    assert admin_client.get(url(model, "add")).status_code == 403
    page = admin_client.get(url(model, "change", obj.pk))
    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()
    assert admin_client.post(url(model, "change", obj.pk), {}).status_code == 403
    assert admin_client.post(url(model, "delete", obj.pk), {"post": "yes"}).status_code == 403
    assert model.objects.filter(pk=obj.pk).exists()


def test_outbox_and_channel_keep_dispatcher_fields(admin_client, inbox, t0):
    held = OutboxMessage.objects.create(inbox=inbox, body="draft", created=t0, attempts=2)
    sent = OutboxMessage.objects.create(inbox=inbox, body="old", created=t0, status="sent")
    response = admin_client.post(
        url(OutboxMessage, "change", held.pk),
        {"body": "fixed", "urgent": "on", "status": "sent", "attempts": "0"},
    )
    assert response.status_code == 302
    held.refresh_from_db()
    assert (held.body, held.urgent, held.status, held.attempts) == ("fixed", True, "held", 2)
    assert (
        admin_client.post(url(OutboxMessage, "change", sent.pk), {"body": "x"}).status_code == 403
    )
    assert admin_client.get(url(OutboxMessage, "add")).status_code == 403

    channel = Channel.objects.create(inbox=inbox, failures=3, last_error="smtp down")
    response = admin_client.post(
        url(Channel, "change", channel.pk),
        {
            "kind": "email",
            "email": "ops@example.com",
            "url": "",
            "mode": "at_least_once",
            "gap": "60",
            "failures": "0",
            "last_error": "",
        },
    )
    assert response.status_code == 302
    channel.refresh_from_db()
    assert (channel.email, channel.gap, channel.failures, channel.last_error) == (
        "ops@example.com",
        60,
        3,
        "smtp down",
    )


def test_lease_list_shows_who_holds_what_until_when(admin_client, make_inbox):
    held, lapsed, never = make_inbox("held"), make_inbox("lapsed"), make_inbox("never")
    acquire(held, "worker-1")
    acquire(lapsed, "worker-2", now=timezone.now() - timedelta(days=1))
    acquire(lapsed, "worker-2", now=timezone.now() - timedelta(hours=2))  # a takeover: gen 2
    changelist = url(Lease, "changelist")

    response = admin_client.get(changelist, {"held": "yes"})
    assert [(lease.inbox.slug, lease.holder) for lease in response.context["cl"].result_list] == [
        ("held", "worker-1")
    ]
    free = admin_client.get(changelist, {"held": "no"})
    assert {lease.inbox.slug for lease in free.context["cl"].result_list} == {"lapsed", "never"}

    page = admin_client.get(url(Lease, "change", Lease.objects.get(inbox=lapsed).pk))
    html = page.content.decode()
    assert "worker-2" in html and "icon-no" in html
    assert Lease.objects.get(inbox=lapsed).generation == 2
    assert Lease.objects.get(inbox=never).generation == 0


def test_deleting_an_inbox_takes_its_machinery_rows_along(admin_client, make_inbox):
    grow(make_inbox, 2)
    first, second = Inbox.objects.order_by("pk")
    confirm = admin_client.get(url(Inbox, "delete", first.pk))
    assert confirm.status_code == 200
    assert not confirm.context["perms_lacking"]
    assert admin_client.post(url(Inbox, "delete", first.pk), {"post": "yes"}).status_code == 302

    response = post_action(admin_client, Inbox, "delete_selected", [second], post="yes")
    assert response.status_code == 200
    assert not Inbox.objects.exists()
    assert not Event.objects.exists() and not Lease.objects.exists()


def test_deleting_an_owner_takes_their_inboxes_along(admin_client, make_inbox, owner):
    make_inbox("mine", owner=owner)
    ingest("mine", "github", "delivery-1", {})
    confirm = admin_client.get(reverse("admin:auth_user_delete", args=[owner.pk]))
    assert not confirm.context["perms_lacking"]
    response = admin_client.post(
        reverse("admin:auth_user_delete", args=[owner.pk]), {"post": "yes"}
    )
    assert response.status_code == 302
    assert not Inbox.objects.exists() and not Event.objects.exists()


# --- the dashboard ---------------------------------------------------------------------------


def test_dashboard_numbers(admin_client, make_inbox):
    a, b = make_inbox("a"), make_inbox("b")
    make_inbox("idle")  # no events at all
    now = timezone.now()
    states = {
        a: ["pending", "pending", "pending", "running", "done", "done", "dead", "dead-old"],
        b: ["pending", "dead", "dead", "done"],
    }
    for inbox, names in states.items():
        for n, state in enumerate(names):
            ingest(inbox, "github", f"{state}-{n}", {})
            Event.objects.filter(inbox=inbox, source_id=f"{state}-{n}").update(
                status=state.removesuffix("-old"),
                updated=now - timedelta(days=2) if state == "dead-old" else now,
            )
    Event.objects.filter(inbox=a, source_id="pending-0").update(created=now - timedelta(hours=2))
    Event.objects.filter(inbox=b, source_id="pending-0").update(created=now - timedelta(minutes=5))
    for body, status in (("h1", "held"), ("h2", "held"), ("s", "sent"), ("f", "failed")):
        OutboxMessage.objects.create(inbox=a, body=body, status=status, created=now)
    OutboxMessage.objects.create(inbox=b, body="h3", status="held", created=now)
    acquire(a, "worker-1")
    acquire(b, "worker-2", now=now - timedelta(days=1))  # lapsed long ago

    response = admin_client.get(reverse("admin-dashboard"))

    assert response.status_code == 200
    rows = {row["slug"]: row for row in response.context["rows"]}
    assert rows["a"]["by_status"] == {"pending": 3, "running": 1, "done": 2, "dead": 2}
    assert rows["b"]["by_status"] == {"pending": 1, "running": 0, "done": 1, "dead": 2}
    assert rows["idle"]["by_status"] == {"pending": 0, "running": 0, "done": 0, "dead": 0}
    assert (rows["a"]["dead_24h"], rows["b"]["dead_24h"], rows["idle"]["dead_24h"]) == (1, 2, 0)
    assert timedelta(hours=2) <= rows["a"]["oldest_pending_age"] < timedelta(hours=2, minutes=5)
    assert timedelta(minutes=5) <= rows["b"]["oldest_pending_age"] < timedelta(minutes=10)
    assert rows["idle"]["oldest_pending_age"] is None
    assert (rows["a"]["held"], rows["a"]["failed"], rows["b"]["held"]) == (2, 1, 1)
    assert response.context["totals"] == {"pending": 4, "running": 1, "done": 3, "dead": 4}
    assert (response.context["dead_24h"], response.context["held"]) == (3, 3)
    assert [(lease.inbox.slug, lease.holder) for lease in response.context["leases"]] == [
        ("a", "worker-1")
    ]
    assert rows["a"]["lease"].holder == "worker-1" and rows["b"]["lease"] is None
    html = response.content.decode()
    assert '<strong id="dead-24h">3</strong>' in html
    assert '<strong id="held-outbox">3</strong>' in html
    assert '<strong id="leases-held">1</strong>' in html
    assert "2\xa0hours" in html  # a's oldest pending event


def test_dashboard_queries_do_not_grow_with_inboxes(admin_client, make_inbox):
    grow(make_inbox, 2)
    path = reverse("admin-dashboard")
    queries_for(admin_client, path)
    few = queries_for(admin_client, path)
    grow(make_inbox, 10)
    assert queries_for(admin_client, path) == few


def test_dashboard_is_staff_only(client, django_user_model):
    path = reverse("admin-dashboard")
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"] == f"{reverse('admin:login')}?next={path}"

    user = django_user_model.objects.create_user("plain", password="pw-plain-123")
    client.force_login(user)
    assert client.get(path).status_code == 302


def test_dashboard_needs_the_permission_to_view_events(client, django_user_model, make_inbox):
    make_inbox("payroll-desk")
    clerk = django_user_model.objects.create_user("clerk", is_staff=True)
    client.force_login(clerk)
    path = reverse("admin-dashboard")

    refused = client.get(path)
    assert refused.status_code == 403
    assert b"payroll-desk" not in refused.content
    index = client.get(reverse("admin:index")).content.decode()
    assert f'href="{path}"' not in index

    clerk.user_permissions.add(
        Permission.objects.get(content_type__app_label="inbox", codename="view_event")
    )
    allowed = client.get(path)
    assert allowed.status_code == 200
    assert [row["slug"] for row in allowed.context["rows"]] == ["payroll-desk"]
    assert f'href="{path}"' in client.get(reverse("admin:index")).content.decode()


def test_admin_index_links_to_the_dashboard(admin_client):
    html = admin_client.get(reverse("admin:index")).content.decode()
    assert f'href="{reverse("admin-dashboard")}"' in html


# --- timers: edited through the same Schedule as add_timer -------------------------------------


@pytest.mark.django_db
def test_a_cron_timer_is_added_through_the_schedule(admin_client, make_inbox):
    inbox = make_inbox()
    response = admin_client.post(
        url(Timer, "add"), timer_form(inbox, cron="0 9 * * *", timezone="Europe/Berlin")
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    timer = Timer.objects.get(inbox=inbox, key="digest")
    assert (timer.cron, timer.timezone, timer.done) == ("0 9 * * *", "Europe/Berlin", False)
    assert timer.due.astimezone(ZoneInfo("Europe/Berlin")).hour == 9
    assert timer.payload == {"task": "daily digest"}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"cron": "61 * * * *"}, "cron: invalid expression"),
        ({"cron": "0 9 * * *", "timezone": "Mars/Olympus"}, "timezone: unknown time zone"),
        ({"cron": "0 9 * * *", "every": "60"}, "either every or cron"),
        ({}, "needs due"),
    ],
)
def test_a_bad_timer_is_a_form_error_and_nothing_is_stored(admin_client, make_inbox, fields, error):
    inbox = make_inbox()
    response = admin_client.post(url(Timer, "add"), timer_form(inbox, **fields))
    assert response.status_code == 200
    assert error in response.content.decode()
    assert not Timer.objects.exists()


@pytest.mark.django_db
def test_editing_a_timer_reschedules_it_and_keeps_its_identity(admin_client, make_inbox):
    inbox = make_inbox()
    add_timer(inbox, "digest", timezone_now_whole(), {"task": "daily digest"}, every=3600)
    timer = Timer.objects.get()
    data = timer_form(inbox, every="7200", due=timer.due.strftime("%Y-%m-%d %H:%M:%S"))
    data.update({"key": "renamed", "inbox": make_inbox().pk})  # read-only on change: ignored
    response = admin_client.post(url(Timer, "change", timer.pk), data)
    assert response.status_code == 302, response.content.decode()[:2000]
    timer.refresh_from_db()
    assert (timer.key, timer.inbox_id, timer.every) == ("digest", inbox.pk, 7200)
    assert Timer.objects.count() == 1


@pytest.mark.django_db
def test_an_approval_expiry_timer_is_view_only(admin_client, make_inbox):
    inbox = make_inbox()
    request_approval(inbox, "refund-1", "refund order 1", timedelta(hours=4))
    timer = Timer.objects.get(inbox=inbox)
    page = admin_client.get(url(Timer, "change", timer.pk))
    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()
    assert admin_client.post(url(Timer, "change", timer.pk), {}).status_code == 403


def timezone_now_whole():
    return timezone.now().replace(microsecond=0)


# --- the admin's names ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/admin/login/",
        "/admin/",
        "/admin/inbox/event/",
        "/admin/dashboard/",
        "/admin/password_change/",
        "/admin/password_change/done/",
        # The accounts' password pages render the admin's templates outside its views.
        "/accounts/password_reset/",
        "/accounts/password_reset/done/",
        "/accounts/reset/MQ/not-a-token/",
        "/accounts/reset/done/",
        "/accounts/password_change/",
        "/accounts/password_change/done/",
    ],
)
def test_every_admin_page_says_alwayson_not_django(client, admin_user, path):
    if "reset" not in path and "login" not in path:
        client.force_login(admin_user)

    response = client.get(path)

    assert response.status_code == 200
    page = response.content.decode()
    assert "Django" not in page
    title = page.split("<title>", 1)[1].split("</title>", 1)[0]
    assert title.strip().endswith("| alwayson admin"), title
    assert '<div id="site-name"><a href="/admin/">alwayson administration</a></div>' in page


def test_the_admin_index_is_titled_for_alwayson(admin_client):
    page = admin_client.get("/admin/").content.decode()
    assert "<h1>alwayson site administration</h1>" in page
