"""The admin for operators: a dead event's Requeue button, errors kept as written, a history
row for every action, and the demo's models in a section of their own."""

import pytest
from django.contrib import admin
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.test import Client

from alwayson.runtime.api import ingest
from alwayson.web.admin_site import DEMO_SECTION, AlwaysonAdminSite
from inbox.models import Event, Lease
from outbox.models import Notice, OutboxMessage
from tests.support.admin import messages_of, post_action, url

pytestmark = pytest.mark.django_db

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "agent.py", line 3, in run\n'
    "    refund(order)\n"
    "KeyError: '<order>'"
)


@pytest.fixture
def dead(inbox, t0):
    ingest(inbox, "github", "dead-1", {}, now=t0)
    Event.objects.update(status="dead", attempts=3, claim_gen=2, error=TRACEBACK)
    Lease.objects.get(inbox=inbox).recount_work()
    return Event.objects.get()


def history(obj):
    return list(
        LogEntry.objects.filter(
            content_type=ContentType.objects.get_for_model(obj), object_id=str(obj.pk)
        )
    )


def staff_with(django_user_model, username, *codenames):
    user = django_user_model.objects.create_user(username, is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


# --- the Requeue button ----------------------------------------------------------------------


def test_a_dead_events_page_requeues_it_through_a_post_form(admin_client, dead):
    page = admin_client.get(url(Event, "change", dead.pk)).content.decode()
    requeue = url(Event, "requeue", dead.pk)
    assert f'<form method="post" action="{requeue}"' in page
    assert "csrfmiddlewaretoken" in page.split(requeue, 1)[1].split("</form>", 1)[0]

    response = admin_client.post(requeue, follow=True)

    assert response.redirect_chain[-1][0] == url(Event, "change", dead.pk)
    assert messages_of(response) == ["1 event(s) requeued (back to pending, attempts reset)."]
    dead.refresh_from_db()
    assert (dead.status, dead.attempts, dead.claim_gen, dead.error) == ("pending", 0, None, "")
    # Through the service: the inbox's lease knows it has work again.
    assert Lease.objects.get(inbox=dead.inbox).work_at is not None
    assert f'action="{requeue}"' not in response.content.decode()  # not dead any more


def test_the_requeue_button_refuses_a_get_and_needs_the_csrf_token(admin_user, dead):
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    requeue = url(Event, "requeue", dead.pk)

    assert client.get(requeue).status_code == 405
    assert client.post(requeue).status_code == 403
    dead.refresh_from_db()
    assert dead.status == "dead"


def test_the_requeue_button_leaves_an_event_that_is_not_dead_alone(admin_client, dead):
    Event.objects.update(status="done")

    page = admin_client.get(url(Event, "change", dead.pk)).content.decode()
    response = admin_client.post(url(Event, "requeue", dead.pk), follow=True)

    assert url(Event, "requeue", dead.pk) not in page
    assert messages_of(response) == [
        "0 event(s) requeued (back to pending, attempts reset). "
        "1 selected event(s) were in another state and left alone."
    ]
    assert Event.objects.get().status == "done"


def test_the_requeue_button_is_hidden_and_refused_without_the_change_permission(
    django_user_model, dead
):
    viewer = staff_with(django_user_model, "viewer", "view_event")

    page = viewer.get(url(Event, "change", dead.pk))
    assert page.status_code == 200
    assert url(Event, "requeue", dead.pk) not in page.content.decode()
    assert viewer.post(url(Event, "requeue", dead.pk)).status_code == 403
    assert Event.objects.get().status == "dead"
    assert not LogEntry.objects.exists()


# --- the error as written --------------------------------------------------------------------


def test_the_error_keeps_its_indentation_in_a_monospace_block_escaped(admin_client, dead):
    html = admin_client.get(url(Event, "change", dead.pk)).content.decode()

    assert (
        '<pre style="white-space: pre-wrap">Traceback (most recent call last):\n'
        "  File &quot;agent.py&quot;, line 3, in run\n"
        "    refund(order)\n"
        "KeyError: &#x27;&lt;order&gt;&#x27;</pre>"
    ) in html
    assert "<order>" not in html


def test_a_failed_messages_error_is_shown_as_written(admin_client, inbox, t0):
    message = OutboxMessage.objects.create(
        inbox=inbox, body="b", created=t0, status="failed", error="550 refused:\n  <no such user>"
    )
    html = admin_client.get(url(OutboxMessage, "change", message.pk)).content.decode()
    assert '<pre style="white-space: pre-wrap">550 refused:\n  &lt;no such user&gt;</pre>' in html


# --- history ---------------------------------------------------------------------------------


def test_requeue_from_the_list_and_from_the_page_writes_history(admin_client, admin_user, dead):
    admin_client.post(url(Event, "requeue", dead.pk))
    Event.objects.update(status="dead")
    post_action(admin_client, Event, "requeue", Event.objects.all())

    rows = history(dead)
    assert len(rows) == 2
    for row in rows:
        assert (row.user, row.action_flag) == (admin_user, CHANGE)
        assert row.get_change_message() == "Requeued: back to pending, attempts reset."
    # On the event's own history page, as any admin change is.
    page = admin_client.get(url(Event, "history", dead.pk)).content.decode()
    assert "Requeued: back to pending, attempts reset." in page


def test_mark_dead_writes_history_for_the_rows_it_parked_only(admin_client, inbox, t0):
    ingest(inbox, "github", "pending-1", {}, now=t0)
    ingest(inbox, "github", "done-1", {}, now=t0)
    Event.objects.filter(source_id="done-1").update(status="done")

    post_action(admin_client, Event, "mark_dead", Event.objects.all(), reason="poison")

    [row] = LogEntry.objects.all()
    assert row.object_id == str(Event.objects.get(source_id="pending-1").pk)
    assert row.get_change_message() == "Marked dead: poison"


def test_resend_writes_history_for_every_message_of_the_send(admin_client, inbox, t0):
    for body in ("one", "two"):
        OutboxMessage.objects.create(
            inbox=inbox, body=body, created=t0, status="failed", send_key="k1"
        )
    first = OutboxMessage.objects.get(body="one")

    post_action(admin_client, OutboxMessage, "resend", [first])

    assert {row.object_repr for row in LogEntry.objects.all()} == {
        str(m) for m in OutboxMessage.objects.all()
    }
    assert {row.get_change_message() for row in LogEntry.objects.all()} == {
        "Resent: back to held, attempts reset, same send key."
    }


def test_resending_a_notice_writes_history(admin_client, inbox, t0):
    notice = Notice.objects.create(
        inbox=inbox,
        recipient=inbox.owner,
        topic="approval:1",
        key="k",
        subject="s",
        body="b",
        status="failed",
        created=t0,
        due_at=t0,
    )

    post_action(admin_client, Notice, "resend", [notice])

    [row] = history(notice)
    assert row.get_change_message() == "Resent: back to held, attempts reset, same Message-ID."


# --- the index ---------------------------------------------------------------------------------


def test_the_demo_model_has_its_own_section_last_in_the_index(admin_client):
    assert isinstance(admin.site, AlwaysonAdminSite)
    response = admin_client.get(url_of_index())

    sections = [app["name"] for app in response.context["app_list"]]
    assert sections[-1] == DEMO_SECTION
    demo = response.context["app_list"][-1]
    assert [m["object_name"] for m in demo["models"]] == ["Refund"]
    product = [m["object_name"] for app in response.context["app_list"][:-1] for m in app["models"]]
    assert "Refund" not in product and "Event" in product and "ModelCall" in product
    html = response.content.decode()
    assert html.index(DEMO_SECTION) > html.index("Outbox")
    assert admin_client.get(url_of("alwayson_demo", "refund")).status_code == 200


def test_the_app_page_shows_the_demo_apart_too(admin_client):
    response = admin_client.get("/admin/alwayson_demo/")
    names = [app["name"] for app in response.context["app_list"]]
    assert names == [DEMO_SECTION]


def test_the_dashboard_link_is_on_the_index_only_for_who_may_view_events(django_user_model):
    dashboard = 'href="/admin/dashboard/"'
    clerk = staff_with(django_user_model, "clerk", "view_refund")
    operator = staff_with(django_user_model, "operator", "view_event")

    assert dashboard not in clerk.get(url_of_index()).content.decode()
    assert dashboard in operator.get(url_of_index()).content.decode()


def url_of_index():
    return "/admin/"


def url_of(app_label, model_name):
    return f"/admin/{app_label}/{model_name}/"
