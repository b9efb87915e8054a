"""The approval page and the conversation card answer with more than yes or no: the
arguments' form built from their JSON Schema, a reason, a reply, a turn's calls all at once.
What each renders, and what a bad post gets: a 4xx with the reason, nothing written.
"""

import re
from datetime import timedelta

import pytest
from django import forms
from django.core.validators import MaxLengthValidator
from django.test import Client

from approvals.models import Approval, AuditEntry
from approvals.services import answer_approval, request_approval
from inbox.models import Event, Membership, Role
from tests.support.pages import detail_url, snapshot, text_of
from tests.support.wording import field_error, in_html, limit_error, schema_error

pytestmark = pytest.mark.django_db

WINDOW = timedelta(hours=4)
SCHEMA = {
    "type": "object",
    "properties": {
        "order": {"type": "string", "description": "The order number"},
        "amount": {"type": "number", "exclusiveMinimum": 0},
        "count": {"type": "integer"},
        "urgent": {"type": "boolean"},
        "currency": {"enum": ["EUR", "USD"]},
        "lines": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["order", "amount"],
}
ASKED = {"order": "881", "amount": 120, "lines": ["a"]}


@pytest.fixture
def team(make_inbox, owner, django_user_model):
    desk = make_inbox("desk", owner=owner)
    viewer = django_user_model.objects.create_user(username="vic")
    Membership.objects.create(inbox=desk, user=viewer, role=Role.VIEWER)
    clients = {}
    for user in (owner, viewer):
        clients[user.username] = Client()
        clients[user.username].force_login(user)
    return desk, clients


def editable(desk, request_id="refund-881", group="", arguments=ASKED):
    details = {"tool": "refund", "arguments": arguments, "schema": SCHEMA}
    return request_approval(
        desk, request_id, f"refund {request_id}", WINDOW, details=details, group=group
    )


def question(desk, request_id="when-1", group="", free_text=True):
    details = {
        "tool": "ask",
        "arguments": {"q": "When?"},
        "question": {"choices": ["today", "Monday"], "free_text": free_text, "max_length": 40},
    }
    return request_approval(
        desk, request_id, "when shall we ship?", WINDOW, details=details, group=group
    )


def fields_of(html):
    """{label: (name, the control's tag)} of the argument fields."""
    found = {}
    for name, label in re.findall(r'<label for="id_(a\d+-arg-\d+)">([^<]+?)</label>', html):
        control = re.search(rf'<(input|select|textarea)[^>]*name="{name}"[^>]*>', html)
        found[label] = (name, control.group(0))
    return found


# --- the arguments' form -------------------------------------------------------------------------


def test_the_page_builds_the_arguments_form_from_the_schema(team):
    desk, clients = team
    approval = editable(desk)

    html = text_of(clients["owner"].get(detail_url("desk", "refund-881")))

    fields = fields_of(html)
    assert list(fields) == ["order", "amount", "count", "urgent", "currency", "lines (JSON)"]
    assert 'type="text"' in fields["order"][1] and 'value="881"' in fields["order"][1]
    assert "required" in fields["order"][1]
    assert 'type="number"' in fields["amount"][1] and 'value="120"' in fields["amount"][1]
    assert 'step="1"' in fields["count"][1] and "required" not in fields["count"][1]
    assert fields["urgent"][1].startswith("<select") and fields["currency"][1].startswith("<select")
    assert '<option value="true">yes</option>' in html
    assert '<option value="&quot;USD&quot;">USD</option>' in html
    assert fields["lines (JSON)"][1].startswith("<textarea")
    assert "The order number" in html  # the schema's description is the field's help
    assert f'aria-describedby="id_a{approval.pk}-arg-0_helptext"' in html
    # Folded under a summary: one Tab and Enter away, nothing to scroll past otherwise.
    assert "<summary" in html and "Change the arguments before approving" in html
    # One Approve and one Deny: the form's buttons.
    assert html.count(">Approve<") == 1 and html.count(">Deny<") == 1


def test_an_edit_through_the_page_stores_every_kind_of_value(team):
    desk, clients = team
    approval = editable(desk)
    fields = {
        label: name
        for label, (name, _) in fields_of(
            text_of(clients["owner"].get(detail_url("desk", "refund-881")))
        ).items()
    }

    response = clients["owner"].post(
        detail_url("desk", "refund-881"),
        {
            "answer": "yes",
            fields["order"]: "881",
            fields["amount"]: "99.5",
            fields["count"]: "3",
            fields["urgent"]: "true",
            fields["currency"]: '"USD"',
            fields["lines (JSON)"]: '["a", "b"]',
        },
        follow=True,
    )

    assert "Your answer was recorded, with the arguments as you changed them." in text_of(response)
    edit = Event.objects.get(source="approval").payload["edit"]
    assert edit == {
        "arguments": {
            "order": "881",
            "amount": 99.5,
            "count": 3,
            "urgent": True,
            "currency": "USD",
            "lines": ["a", "b"],
        },
        "by": "owner",
    }
    html = text_of(response)
    assert "Changed" in html and "<strong>99.5</strong>" in html  # as asked → as edited
    approval.refresh_from_db()
    assert approval.edited_arguments == edit["arguments"]


@pytest.mark.parametrize(
    ("label", "value", "reason"),
    [
        # Refused by the schema: where, then jsonschema's reason.
        ("amount", "-3", "arguments/amount: " + schema_error(SCHEMA, {"amount": -3}, "amount")),
        ("amount", "1,5", "amount: Enter a number, not '1,5'."),
        ("count", "2.5", "count: Enter a whole number, not '2.5'."),
        ("lines (JSON)", "[a", "lines (JSON): Not valid JSON: "),
        (
            "lines (JSON)",
            "[1]",
            "arguments/lines/0: " + schema_error(SCHEMA, {"lines": [1]}, "lines/0"),
        ),
        # Refused by the form's field: its label, then Django's reason.
        (
            "urgent",
            "maybe",
            "urgent: " + field_error(forms.ChoiceField(), "invalid_choice", value="maybe"),
        ),
        ("order", "", "order: " + field_error(forms.CharField(), "required")),
    ],
    ids=["minimum", "comma", "not-whole", "not-json", "wrong-type", "not-a-choice", "required"],
)
def test_an_edit_that_fails_the_schema_is_400_with_the_reason_and_nothing_written(
    team, label, value, reason
):
    desk, clients = team
    editable(desk)
    url = detail_url("desk", "refund-881")
    fields = {lab: name for lab, (name, _) in fields_of(text_of(clients["owner"].get(url))).items()}
    posted = {fields["order"]: "881", fields["amount"]: "120", fields["lines (JSON)"]: '["a"]'}
    before = snapshot()

    response = clients["owner"].post(url, {"answer": "yes", **posted, fields[label]: value})

    assert response.status_code == 400
    assert in_html(reason) in text_of(response)
    assert snapshot() == before
    assert 'class="edit" id="edit-' in text_of(response) and "open>" in text_of(response)


def test_a_plain_approve_from_the_card_changes_nothing(team):
    desk, clients = team
    editable(desk)

    clients["owner"].post(
        detail_url("desk", "refund-881"),
        {"answer": "yes", "via": "conversation", "next": "/inbox/desk/"},
    )

    payload = Event.objects.get(source="approval").payload
    assert payload["answer"] == "yes" and "edit" not in payload
    assert AuditEntry.objects.get().via == "conversation"


# --- a reason, a reply -------------------------------------------------------------------------


def test_a_denial_with_a_reason_shows_on_the_page_and_the_card(team):
    desk, clients = team
    approval = editable(desk)

    clients["owner"].post(
        detail_url("desk", "refund-881"),
        {"answer": "no", f"a{approval.pk}-reason": "the customer already has a voucher"},
    )

    page = text_of(clients["owner"].get(detail_url("desk", "refund-881")))
    assert '<p class="outcome" role="status">Denied.</p>' in page
    assert "Reason: the customer already has a voucher" in page
    card = text_of(clients["owner"].get("/inbox/desk/"))
    assert "Reason: the customer already has a voucher" in card


def test_a_question_offers_its_choices_and_a_box_of_ones_own(team):
    desk, clients = team
    approval = question(desk)
    url = detail_url("desk", "when-1")

    html = text_of(clients["owner"].get(url))

    assert "<legend>Choose an answer</legend>" in html
    assert html.count('type="radio"') == 2
    assert "Or write your own answer" in html
    assert ">Send answer<" in html and ">Decline<" in html and ">Approve<" not in html
    before = snapshot()
    both = clients["owner"].post(
        url, {"answer": "replied", f"a{approval.pk}-choice": "today", f"a{approval.pk}-own": "x"}
    )
    assert both.status_code == 400
    assert "Choose one answer or write your own, not both." in text_of(both)
    neither = clients["owner"].post(url, {"answer": "replied"})
    assert neither.status_code == 400 and "Choose an answer or write one." in text_of(neither)
    assert snapshot() == before

    clients["owner"].post(url, {"answer": "replied", f"a{approval.pk}-own": "Tuesday at 9"})

    page = text_of(clients["owner"].get(url))
    assert "Answered." in page and "Reply: Tuesday at 9" in page
    assert "Reply: Tuesday at 9" in text_of(clients["owner"].get("/inbox/desk/"))


# --- a turn's calls ----------------------------------------------------------------------------


def test_a_groups_page_lists_each_call_and_answers_them_all_at_once(team):
    desk, clients = team
    first = editable(desk, "refund-1", group="refund-1")
    editable(desk, "refund-2", group="refund-1")
    question(desk, "when-1", group="refund-1")

    html = text_of(clients["owner"].get(detail_url("desk", "refund-2")))

    assert "<h1>3 calls asked in one turn</h1>" in html
    assert html.count('<section class="call"') == 3
    assert html.count('class="answer-form"') == 3
    assert 'aria-label="Answer all 3 open calls"' in html
    response = clients["owner"].post(
        f"/approvals/desk/{first.request_id}/all/", {"answer": "yes"}, follow=True
    )
    assert "Your answer was recorded for 2 call(s): 2 approved." in text_of(response)
    answers = dict(Approval.objects.values_list("request_id", "answer"))
    assert answers == {"refund-1": "yes", "refund-2": "yes", "when-1": ""}
    # One call left: no "all at once" form for one.
    assert "Answer all" not in text_of(response)


def test_the_conversation_card_lists_a_turns_calls_with_one_answer_for_all(team):
    desk, clients = team
    editable(desk, "refund-1", group="refund-1")
    editable(desk, "refund-2", group="refund-1")

    html = text_of(clients["owner"].get("/inbox/desk/"))

    assert html.count('class="entry approval-card"') == 1
    assert "Your agent asks about 2 calls of one turn" in html
    assert html.count('class="answer-form"') == 2
    assert 'action="/approvals/desk/refund-1/all/"' in html
    assert 'name="all-reason"' in html


@pytest.mark.parametrize(
    ("who", "data", "status", "reason"),
    [
        ("vic", {"answer": "yes"}, 403, "you are a viewer of desk"),
        ("owner", {"answer": "replied"}, 400, 'answer must be "yes" or "no"'),
        ("owner", {"answer": ["yes", "no"]}, 400, 'answer must be "yes" or "no"'),
        (
            "owner",
            {"answer": "no", "all-reason": "x" * 1001},
            400,
            limit_error(MaxLengthValidator(1000), 1001),
        ),
    ],
    ids=["viewer", "replied", "twice", "reason-too-long"],
)
def test_a_bad_all_at_once_post_is_refused_and_nothing_changes(team, who, data, status, reason):
    desk, clients = team
    editable(desk, "refund-1", group="refund-1")
    editable(desk, "refund-2", group="refund-1")
    before = snapshot()

    response = clients[who].post("/approvals/desk/refund-1/all/", data)

    assert response.status_code == status
    html = response["Content-Type"].startswith("text/html")
    assert (in_html(reason) if html else reason) in text_of(response)
    assert snapshot() == before


def test_all_at_once_is_post_only_and_hides_other_peoples_requests(team, make_inbox):
    desk, clients = team
    editable(desk, "refund-1", group="refund-1")
    other = make_inbox("other")
    editable(other, "refund-9")

    assert clients["owner"].get("/approvals/desk/refund-1/all/").status_code == 405
    assert (
        clients["owner"].post("/approvals/other/refund-9/all/", {"answer": "yes"}).status_code
        == 404
    )


def test_the_second_approvers_page_shows_what_the_first_one_changed(team, django_user_model):
    desk, clients = team
    details = {"tool": "refund", "arguments": ASKED, "schema": SCHEMA}
    request_approval(desk, "big", "refund big", WINDOW, details=details, approvers=2)
    dana = django_user_model.objects.create_user(username="dana", first_name="Dana")
    Membership.objects.create(inbox=desk, user=dana, role=Role.APPROVER)
    answer_approval(desk, "big", "yes", by=dana, arguments={**ASKED, "amount": 60})

    html = text_of(clients["owner"].get(detail_url("desk", "big")))

    assert "By Dana:" in html and "<code>amount</code>: 120 → <strong>60</strong>" in html
    assert 'value="60"' in html  # the form starts from the edit the second approver approves
    assert "Changing them makes yours the first approval of the new arguments" in html


def test_approve_all_approves_what_the_page_showed_not_an_edit_made_since(team, django_user_model):
    desk, clients = team
    details = {"tool": "refund", "arguments": ASKED, "schema": SCHEMA}
    for request_id in ("big-1", "big-2"):
        request_approval(
            desk,
            request_id,
            f"refund {request_id}",
            WINDOW,
            details=details,
            approvers=2,
            group="big-1",
        )
    dana = django_user_model.objects.create_user(username="dana", first_name="Dana")
    Membership.objects.create(inbox=desk, user=dana, role=Role.APPROVER)
    answer_approval(desk, "big-2", "yes", by=dana)  # a first approval of the arguments as asked
    page = text_of(clients["owner"].get(detail_url("desk", "big-1")))
    shown = dict(re.findall(r'<input type="hidden" name="(shown-[^"]+)" value="([^"]+)">', page))
    shown = {name: value.replace("&quot;", '"') for name, value in shown.items()}
    assert set(shown) == {"shown-big-1", "shown-big-2"}
    # Meanwhile Dana changes big-1's amount and approves it: a first approval of her edit.
    answer_approval(desk, "big-1", "yes", by=dana, arguments={**ASKED, "amount": 60})

    response = clients["owner"].post("/approvals/desk/big-1/all/", {"answer": "yes", **shown})

    assert response.status_code == 302
    big1, big2 = Approval.objects.order_by("request_id")
    # big-1: the owner approved what they saw, which is not Dana's edit: a new first approval.
    assert (big1.answer, big1.first_approved_by.username, big1.current_arguments) == (
        "",
        "owner",
        ASKED,
    )
    # big-2: what they saw is what Dana approved: the second approval settles it.
    assert (big2.answer, big2.answered_by.username) == ("yes", "owner")
    assert list(Event.objects.values_list("source_id", flat=True)) == ["big-2"]


def test_approve_all_with_shown_arguments_that_are_not_json_is_400(team):
    desk, clients = team
    editable(desk, "refund-1", group="refund-1")
    editable(desk, "refund-2", group="refund-1")
    before = snapshot()

    response = clients["owner"].post(
        "/approvals/desk/refund-1/all/", {"answer": "yes", "shown-refund-1": "{nope"}
    )

    assert response.status_code == 400
    assert "shown-refund-1: not JSON" in text_of(response)
    assert snapshot() == before
