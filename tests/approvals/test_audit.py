"""The audit a finance team exports: every answer with who, when, from which page and the
action as it was shown, and every expiry; in the admin with filters, and as CSV."""

import csv
import io
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse

from alwayson.runtime.api import answer_approval, request_approval, run_scheduler
from approvals.models import Approval, AuditEntry
from inbox.models import Membership, Role

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)
WINDOW = 4 * HOUR
CHANGELIST = "/admin/approvals/auditentry/"
EXPORT = "/admin/approvals/auditentry/export.csv"
HEADER = [
    "at (UTC)",
    "inbox",
    "request",
    "user",
    "answer",
    "result",
    "from",
    "action as shown",
    "approvers needed",
    "arguments asked",
    "arguments as edited",
    "reason",
    "reply",
]


@pytest.fixture
def history(make_inbox, django_user_model, t0):
    """Two inboxes' answers: from the page, the card and the API, a two-person approval,
    an expiry, a late tap."""
    desk, other = make_inbox("desk"), make_inbox("other-desk")
    people = {}
    for name in ("dana", "lee"):
        people[name] = django_user_model.objects.create_user(username=name)
        Membership.objects.create(inbox=desk, user=people[name], role=Role.APPROVER)
    dana, lee = people["dana"], people["lee"]
    request_approval(desk, "refund-1", "refund order 1", WINDOW, now=t0)
    request_approval(desk, "refund-2", "refund order 2 for 900", WINDOW, now=t0, approvers=2)
    request_approval(desk, "refund-3", "refund order 3", WINDOW, now=t0)
    request_approval(other, "refund-9", "refund order 9", WINDOW, now=t0)
    answer_approval(desk, "refund-1", "yes", now=t0 + HOUR, by=dana, via="page")
    answer_approval(desk, "refund-2", "yes", now=t0 + 2 * HOUR, by=dana, via="conversation")
    answer_approval(desk, "refund-2", "yes", now=t0 + 3 * HOUR, by=lee, via="page")
    answer_approval(other, "refund-9", "no", now=t0 + HOUR)  # the API, nobody named
    run_scheduler(now=t0 + WINDOW)  # refund-3 expires
    answer_approval(desk, "refund-3", "yes", now=t0 + WINDOW + HOUR, by=lee, via="page")
    return desk, other, dana, lee


def rows_of(response):
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == 'attachment; filename="approval-audit.csv"'
    text = b"".join(response.streaming_content).decode()
    return list(csv.reader(io.StringIO(text)))


def test_every_answer_and_expiry_is_audited(history, t0):
    entries = list(
        AuditEntry.objects.order_by("at", "id").values_list(
            "inbox__slug",
            "approval__request_id",
            "username",
            "answer",
            "via",
            "result",
            "action_shown",
            "at",
        )
    )
    assert entries == [
        ("desk", "refund-1", "dana", "yes", "page", "approved", "Refund order 1", t0 + HOUR),
        ("other-desk", "refund-9", "", "no", "api", "denied", "Refund order 9", t0 + HOUR),
        (
            "desk",
            "refund-2",
            "dana",
            "yes",
            "conversation",
            "first_approval",
            "Refund order 2 for 900",
            t0 + 2 * HOUR,
        ),
        (
            "desk",
            "refund-2",
            "lee",
            "yes",
            "page",
            "approved",
            "Refund order 2 for 900",
            t0 + 3 * HOUR,
        ),
        ("desk", "refund-3", "", "expired", "deadline", "expired", "Refund order 3", t0 + WINDOW),
        (
            "desk",
            "refund-3",
            "lee",
            "yes",
            "page",
            "already_settled",
            "Refund order 3",
            t0 + WINDOW + HOUR,
        ),
    ]


def test_a_deleted_account_keeps_its_name_in_the_audit(history):
    _, _, dana, _ = history
    dana.delete()
    entries = AuditEntry.objects.filter(username="dana")
    assert entries.count() == 2
    assert set(entries.values_list("user", flat=True)) == {None}


def test_the_admin_lists_the_audit_with_filters(history, admin_client):
    everything = admin_client.get(CHANGELIST)
    assert everything.context["cl"].result_count == 6
    html = everything.content.decode()
    assert f'href="{EXPORT}?"' in html  # "Export CSV", with the list's filters

    for params, count in (
        ({"via__exact": "conversation"}, 1),
        ({"result__exact": "approved"}, 2),
        ({"answer__exact": "expired"}, 1),
        ({"q": "lee"}, 2),
        ({"q": "refund-2"}, 2),
        ({"q": "other-desk"}, 1),
    ):
        response = admin_client.get(CHANGELIST, params)
        assert response.context["cl"].result_count == count, params
    filtered = admin_client.get(CHANGELIST, {"via__exact": "page"}).content.decode()
    assert f'href="{EXPORT}?via__exact=page"' in filtered


def test_the_export_is_the_filtered_list_in_time_order(history, admin_client, t0):
    rows = rows_of(admin_client.get(EXPORT))
    assert rows[0] == HEADER
    assert len(rows) == 7
    assert rows[1] == [
        f"{t0 + HOUR:%Y-%m-%d %H:%M:%S}",
        "desk",
        "refund-1",
        "dana",
        "yes",
        "approved",
        "approval page",
        "Refund order 1",
        "1",
        "",  # a plain action: no arguments, nothing edited, no reason or reply
        "",
        "",
        "",
    ]
    times = [row[0] for row in rows[1:]]
    assert times == sorted(times)

    two = rows_of(admin_client.get(EXPORT, {"q": "refund-2"}))
    assert [(r[3], r[5], r[6], r[8]) for r in two[1:]] == [
        ("dana", "first approval, waiting for a second", "conversation card", "2"),
        ("lee", "approved", "approval page", "2"),
    ]
    expired = rows_of(admin_client.get(EXPORT, {"answer__exact": "expired"}))
    assert [(r[3], r[5], r[6]) for r in expired[1:]] == [
        ("", "expired: nobody answered in time", "deadline")
    ]
    assert admin_client.get(EXPORT, {"no_such_field": "1"}).status_code == 400


def test_the_export_action_exports_the_selection(history, admin_client):
    chosen = AuditEntry.objects.filter(username="lee").order_by("id")
    response = admin_client.post(
        CHANGELIST,
        {"action": "export_selected", "_selected_action": [e.pk for e in chosen], "index": 0},
    )
    rows = rows_of(response)
    assert [row[3] for row in rows[1:]] == ["lee", "lee"]


def test_a_cell_a_spreadsheet_would_run_is_exported_as_text(make_inbox, admin_client, t0):
    desk = make_inbox("desk")
    action = '=HYPERLINK("https://evil.example","refund order 1")'
    request_approval(desk, "refund-1", action, WINDOW, now=t0)
    answer_approval(desk, "refund-1", "no", now=t0 + HOUR)

    [row] = rows_of(admin_client.get(EXPORT))[1:]
    assert row[7] == "'" + action[0].upper() + action[1:]


def test_a_staff_member_sees_and_exports_their_inboxes_audit_only(history):
    desk, _, dana, _ = history
    dana.is_staff = True
    dana.save()
    client = Client()
    client.force_login(dana)

    listed = client.get(CHANGELIST)
    assert listed.status_code == 200
    assert listed.context["cl"].result_count == 5
    rows = rows_of(client.get(EXPORT))
    assert {row[1] for row in rows[1:]} == {"desk"}
    other_entry = AuditEntry.objects.get(inbox__slug="other-desk")
    change = client.get(reverse("admin:approvals_auditentry_change", args=[other_entry.pk]))
    assert change.status_code == 302  # "does not exist", as for any other inbox's row


def test_the_audit_is_view_only_and_the_export_needs_a_staff_login(history, admin_client):
    entry = AuditEntry.objects.first()
    assert admin_client.get(reverse("admin:approvals_auditentry_add")).status_code == 403
    change = reverse("admin:approvals_auditentry_change", args=[entry.pk])
    assert 'name="_save"' not in admin_client.get(change).content.decode()
    assert admin_client.post(change, {"username": "someone"}).status_code == 403
    delete = reverse("admin:approvals_auditentry_delete", args=[entry.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert AuditEntry.objects.count() == 6

    anonymous = Client().get(EXPORT)
    assert anonymous.status_code == 302
    assert anonymous["Location"].startswith("/admin/login/")
    _, _, _, lee = history  # a member, not staff: no admin at all
    member = Client()
    member.force_login(lee)
    assert member.get(EXPORT).status_code == 302


def test_the_export_keeps_the_arguments_asked_and_as_edited_and_the_reason(
    make_inbox, admin_client, t0, django_user_model
):
    desk = make_inbox("desk")
    dana = django_user_model.objects.create_user(username="dana")
    Membership.objects.create(inbox=desk, user=dana, role=Role.APPROVER)
    schema = {
        "type": "object",
        "properties": {"order": {"type": "string"}, "amount": {"type": "number"}},
    }
    details = {"tool": "refund", "arguments": {"order": "1", "amount": 900}, "schema": schema}
    request_approval(desk, "refund-1", "refund order 1", WINDOW, now=t0, details=details)
    request_approval(desk, "refund-2", "refund order 2", WINDOW, now=t0, details=details)
    answer_approval(
        desk, "refund-1", "yes", now=t0, by=dana, arguments={"order": "1", "amount": 600}
    )
    answer_approval(desk, "refund-2", "no", now=t0, by=dana, reason="=not this one")

    edited, denied = rows_of(admin_client.get(EXPORT))[1:]

    assert edited[9:] == ['{"amount": 900, "order": "1"}', '{"amount": 600, "order": "1"}', "", ""]
    assert denied[9:] == ['{"amount": 900, "order": "1"}', "", "'=not this one", ""]
    page = admin_client.get(
        f"/admin/approvals/approval/{Approval.objects.get(request_id='refund-1').pk}/change/"
    )
    assert page.status_code == 200
    assert "&quot;amount&quot;: 600" in page.content.decode()  # edited_arguments, read-only
