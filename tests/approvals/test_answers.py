"""What an answer may carry besides yes or no, through the Python API: the arguments as a person
changed them (checked against the schema the approval keeps and the check it names), a
denial's reason, a question's reply; and a group's calls answered all at once. Every answer
is still decided once, under the inbox's lock, before the deadline, and audited; bad input
raises ValueError naming the field and writes nothing.
"""

from datetime import timedelta
from types import SimpleNamespace

import pytest

from approvals import services
from approvals.models import Approval, AuditEntry
from approvals.services import (
    REASON_MAX,
    MayNotAnswer,
    answer_approval,
    answer_group,
    request_approval,
)
from inbox.models import Event, Membership, Role
from tests.support.pages import snapshot
from tests.support.wording import schema_error

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)
SCHEMA = {
    "type": "object",
    "properties": {
        "order": {"type": "string"},
        "amount": {"type": "number", "exclusiveMinimum": 0},
        "note": {"type": "string", "maxLength": 20},
    },
    "required": ["order", "amount"],
    "additionalProperties": False,
}
ASKED = {"order": "881", "amount": 120}
QUESTION = {"choices": ["today", "Monday"], "free_text": False, "max_length": 50}


def standing(answered):
    """What stands of each call answer_group answered, by request id."""
    return {rid: each.stands for rid, each in answered.items()}


@pytest.fixture
def people(make_inbox, owner, django_user_model):
    desk = make_inbox("desk", owner=owner)
    team = {"desk": desk, "owner": owner}
    for name in ("dana", "lee", "vic"):
        team[name] = django_user_model.objects.create_user(username=name, first_name=name.title())
        role = Role.VIEWER if name == "vic" else Role.APPROVER
        Membership.objects.create(inbox=desk, user=team[name], role=role)
    return SimpleNamespace(**team)


@pytest.fixture(autouse=True)
def checks(monkeypatch):
    """A registered edit check, as an agent's app registers its own: refunds of order "13"
    are denied, amounts above 500 need two approvers. Records what it was asked."""
    seen = []

    def check(approval, arguments):
        seen.append((approval.request_id, arguments))
        if arguments["order"] == "13":
            raise ValueError("arguments: order 13 is never refunded")
        return 2 if arguments["amount"] > 500 else 1

    monkeypatch.setitem(services.edit_checks, "test", check)
    return seen


def editable(inbox, t0, request_id="refund-881", approvers=1, group="", check="test"):
    details = {"tool": "refund", "arguments": ASKED, "schema": SCHEMA}
    if check:
        details["edit_check"] = check
    return request_approval(
        inbox,
        request_id,
        f"refund order {request_id}",
        4 * HOUR,
        now=t0,
        details=details,
        approvers=approvers,
        group=group,
    )


def question(inbox, t0, request_id="when-1", group=""):
    details = {"tool": "ask", "arguments": {"q": "When?"}, "question": QUESTION}
    return request_approval(
        inbox, request_id, "when?", 4 * HOUR, now=t0, details=details, group=group
    )


def payload(request_id="refund-881"):
    return Event.objects.get(source="approval", source_id=request_id).payload


def audit():
    return list(
        AuditEntry.objects.order_by("id").values_list(
            "username", "answer", "result", "edited_arguments", "reason", "reply"
        )
    )


# --- an edit ------------------------------------------------------------------------------------


def test_an_edit_is_checked_and_becomes_what_the_yes_approves(people, t0, checks):
    editable(people.desk, t0)
    edit = {"order": "881", "amount": 80, "note": "partial"}

    stands = answer_approval(
        people.desk, "refund-881", "yes", now=t0 + HOUR, by=people.dana, arguments=edit
    ).stands

    assert stands == "yes"
    assert checks == [("refund-881", edit)]
    assert payload()["edit"] == {"arguments": edit, "by": "dana"}
    assert payload()["names"] == {"dana": "Dana"}
    approval = Approval.objects.get()
    assert (approval.arguments, approval.current_arguments, approval.edited_by) == (
        ASKED,
        edit,
        people.dana,
    )
    assert audit() == [("dana", "yes", "approved", edit, "", "")]


def test_an_edit_equal_to_the_arguments_is_no_edit(people, t0, checks):
    editable(people.desk, t0)

    answer_approval(
        people.desk, "refund-881", "yes", now=t0 + HOUR, by=people.dana, arguments=dict(ASKED)
    )

    assert "edit" not in payload()
    assert checks == []  # nothing to check
    assert Approval.objects.get().edited_arguments is None
    assert audit() == [("dana", "yes", "approved", None, "", "")]


def refused_by_schema(arguments, where=""):
    """(arguments, alwayson's refusal): where, then jsonschema's reason."""
    prefix = f"arguments/{where}" if where else "arguments"
    return arguments, f"{prefix}: {schema_error(SCHEMA, arguments, where)}"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        refused_by_schema({"order": "881"}),
        refused_by_schema({"order": "881", "amount": 0}, "amount"),
        refused_by_schema({"order": "881", "amount": 5, "note": "x" * 21}, "note"),
        refused_by_schema({"order": "881", "amount": 5, "vat": 1}),
        # The approval's check refuses, in its own words.
        ({"order": "13", "amount": 5}, "arguments: order 13 is never refunded"),
    ],
    ids=["missing", "minimum", "too-long", "unknown-argument", "the-check-refuses"],
)
def test_an_edit_the_schema_or_the_check_refuses_writes_nothing(
    people, t0, checks, arguments, message
):
    editable(people.desk, t0)
    before = snapshot()

    with pytest.raises(ValueError, match=None) as refused:
        answer_approval(
            people.desk, "refund-881", "yes", now=t0 + HOUR, by=people.dana, arguments=arguments
        )

    assert str(refused.value) == message
    assert snapshot() == before


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"answer": "no", "arguments": ASKED}, 'arguments: an edit goes with a "yes"'),
        ({"answer": "yes", "arguments": ["881"]}, "arguments must be a JSON object"),
        ({"answer": "yes", "reason": "fine"}, 'reason: a reason goes with a "no"'),
        ({"answer": "no", "reason": "x" * (REASON_MAX + 1)}, "reason is longer than 1000"),
        ({"answer": "no", "reason": "a\x00b"}, "reason contains a NUL character"),
        ({"answer": "no", "reason": 5}, "reason must be a string"),
        ({"answer": "yes", "reply": "today"}, 'reply: a value goes with "replied"'),
        ({"answer": "replied"}, 'reply: a value goes with "replied"'),
        ({"answer": "replied", "reply": "today"}, "asks for a yes or a no, not a value"),
    ],
    ids=[
        "edit-with-no",
        "edit-not-object",
        "reason-with-yes",
        "reason-too-long",
        "reason-nul",
        "reason-int",
        "reply-with-yes",
        "replied-without-reply",
        "reply-to-a-permission",
    ],
)
def test_what_an_answer_cannot_carry_is_refused_and_nothing_is_written(people, t0, kwargs, message):
    editable(people.desk, t0)
    before = snapshot()

    with pytest.raises(ValueError, match=None) as refused:
        answer_approval(people.desk, "refund-881", now=t0 + HOUR, by=people.dana, **kwargs)

    assert message in str(refused.value)
    assert snapshot() == before


def test_a_plain_action_cannot_be_edited(people, t0):
    request_approval(people.desk, "refund-9", "refund order 9", 4 * HOUR, now=t0)

    with pytest.raises(ValueError, match="refund-9 has no arguments a person may edit"):
        answer_approval(
            people.desk, "refund-9", "yes", now=t0, by=people.dana, arguments={"order": "9"}
        )


def test_an_edit_named_check_that_is_not_registered_refuses_edits(people, t0, checks, monkeypatch):
    editable(people.desk, t0)
    monkeypatch.delitem(services.edit_checks, "test")

    with pytest.raises(ValueError, match=r"edits of refund-881 cannot be checked \('test'\)"):
        answer_approval(
            people.desk,
            "refund-881",
            "yes",
            now=t0,
            by=people.dana,
            arguments={**ASKED, "amount": 5},
        )
    assert not Event.objects.exists()


def test_an_edit_after_the_deadline_is_too_late_and_the_expiry_stands(people, t0, checks):
    editable(people.desk, t0)

    stands = answer_approval(
        people.desk,
        "refund-881",
        "yes",
        now=t0 + 5 * HOUR,
        by=people.dana,
        arguments={**ASKED, "amount": 5},
    ).stands

    assert stands == "expired"
    assert "edit" not in payload() and payload()["answer"] == "expired"
    assert Approval.objects.get().edited_arguments is None


# --- two approvers and an edit -----------------------------------------------------------------


def test_an_edit_that_needs_two_approvers_raises_the_bar_and_waits(people, t0, checks):
    editable(people.desk, t0)
    big = {**ASKED, "amount": 900}

    assert (
        answer_approval(
            people.desk, "refund-881", "yes", now=t0 + HOUR, by=people.dana, arguments=big
        ).stands
        == "waiting"
    )

    approval = Approval.objects.get()
    assert (approval.approvers_needed, approval.first_approved_by, approval.current_arguments) == (
        2,
        people.dana,
        big,
    )
    assert not Event.objects.exists()
    # Without the edit the second approver approves what the first one edited.
    assert (
        answer_approval(people.desk, "refund-881", "yes", now=t0 + HOUR, by=people.lee).stands
        == "yes"
    )
    assert payload()["edit"] == {"arguments": big, "by": "dana"}
    assert payload()["approved_by"] == ["dana", "lee"]
    assert payload()["approvers_needed"] == 2


def test_an_edit_never_lowers_the_bar_a_request_was_asked_with(people, t0, checks):
    editable(people.desk, t0, approvers=2)

    answer_approval(
        people.desk, "refund-881", "yes", now=t0, by=people.dana, arguments={**ASKED, "amount": 5}
    )

    approval = Approval.objects.get()
    assert (approval.approvers_needed, approval.answer) == (2, "")


def test_the_first_approver_may_move_their_approval_to_new_arguments(people, t0, checks):
    editable(people.desk, t0, approvers=2)
    answer_approval(people.desk, "refund-881", "yes", now=t0, by=people.dana)
    assert (
        answer_approval(people.desk, "refund-881", "yes", now=t0, by=people.dana).stands
        == "waiting"
    )

    changed = {**ASKED, "amount": 60}
    assert (
        answer_approval(
            people.desk, "refund-881", "yes", now=t0, by=people.dana, arguments=changed
        ).stands
        == "waiting"
    )
    assert answer_approval(people.desk, "refund-881", "yes", now=t0, by=people.lee).stands == "yes"

    assert payload()["edit"] == {"arguments": changed, "by": "dana"}
    assert [row[2] for row in audit()] == [
        "first_approval",
        "not_counted",
        "first_approval",
        "approved",
    ]


# --- a reason and a reply ----------------------------------------------------------------------


def test_a_denials_reason_goes_to_the_agent_the_row_and_the_audit(people, t0):
    editable(people.desk, t0)

    answer_approval(people.desk, "refund-881", "no", now=t0, by=people.lee, reason=" not this one ")

    assert payload()["reason"] == "not this one"
    approval = Approval.objects.get()
    assert (approval.answer, approval.reason, approval.answered_by) == (
        "no",
        "not this one",
        people.lee,
    )
    assert audit() == [("lee", "no", "denied", None, "not this one", "")]


def test_a_question_takes_a_reply_from_its_choices(people, t0):
    question(people.desk, t0)
    before = snapshot()
    for wrong, message in (
        ({"answer": "yes"}, 'asks a question; answer it with "replied"'),
        ({"answer": "replied", "reply": "Tuesday"}, "reply must be one of today, Monday"),
        ({"answer": "replied", "reply": "   "}, "reply must not be blank"),
        ({"answer": "replied", "reply": "M" * 51}, "reply is longer than 50 characters"),
    ):
        with pytest.raises(ValueError, match=None) as refused:
            answer_approval(people.desk, "when-1", now=t0, by=people.dana, **wrong)
        assert message in str(refused.value)
    assert snapshot() == before

    assert (
        answer_approval(
            people.desk, "when-1", "replied", now=t0, by=people.dana, reply="Monday"
        ).stands
        == "replied"
    )

    assert payload("when-1")["reply"] == "Monday"
    approval = Approval.objects.get()
    assert (approval.answer, approval.reply, approval.outcome_words(t0)) == (
        "replied",
        "Monday",
        "Answered.",
    )
    assert audit() == [("dana", "replied", "replied", None, "", "Monday")]
    # Answered once: a later reply is refused with the first standing.
    assert answer_approval(
        people.desk, "when-1", "replied", now=t0, by=people.lee, reply="today"
    ).stands == ("replied")
    assert Event.objects.filter(source="approval").count() == 1


def test_a_question_may_be_declined_and_is_never_asked_of_two(people, t0):
    question(people.desk, t0)
    answer_approval(people.desk, "when-1", "no", now=t0, by=people.dana, reason="ask Lee")
    assert payload("when-1")["reason"] == "ask Lee"

    with pytest.raises(ValueError, match="a question is answered by one person, not two"):
        request_approval(
            people.desk,
            "when-2",
            "when?",
            HOUR,
            now=t0,
            approvers=2,
            details={"arguments": {}, "question": QUESTION},
        )


@pytest.mark.parametrize(
    ("details", "message"),
    [
        ({"schema": {"type": "object"}}, "a schema goes with the arguments"),
        ({"schema": {"type": 5}, "arguments": {}}, "details schema is not a JSON Schema"),
        ({"schema": SCHEMA, "arguments": {}, "edit_check": "nobody"}, "'nobody' is not registered"),
        ({"question": {"choices": "a", "free_text": True, "max_length": 5}}, "details question"),
        ({"question": {"choices": [], "free_text": False, "max_length": 5}}, "details question"),
    ],
    ids=["schema-without-arguments", "bad-schema", "unknown-check", "choices-str", "nothing"],
)
def test_details_a_page_could_not_use_are_refused_when_asked(people, t0, details, message):
    with pytest.raises(ValueError, match=None) as refused:
        request_approval(people.desk, "r-1", "do it", HOUR, now=t0, details=details)
    assert message in str(refused.value)
    assert not Approval.objects.exists()


# --- a group, all at once ----------------------------------------------------------------------


def test_a_group_is_answered_all_at_once_leaving_questions_open(people, t0):
    editable(people.desk, t0, "refund-1", group="refund-1", check="")
    editable(people.desk, t0, "refund-2", group="refund-1", approvers=2, check="")
    question(people.desk, t0, "when-1", group="refund-1")
    editable(people.desk, t0, "refund-3", check="")  # not of the group

    stands = standing(answer_group(people.desk, "refund-2", "yes", now=t0, by=people.dana))

    assert stands == {"refund-1": "yes", "refund-2": "waiting"}
    assert Approval.objects.get(request_id="when-1").answer == ""
    assert Approval.objects.get(request_id="refund-3").answer == ""
    # The rest, all at once again: the settled one is left alone, not audited again.
    assert standing(
        answer_group(people.desk, "refund-1", "no", now=t0, by=people.lee, reason="stop")
    ) == {
        "refund-2": "no",
        "when-1": "no",
    }
    assert {e.source_id: e.payload.get("reason") for e in Event.objects.all()} == {
        "refund-1": None,
        "refund-2": "stop",
        "when-1": "stop",
    }
    assert [row[:3] for row in audit()] == [
        ("dana", "yes", "approved"),
        ("dana", "yes", "first_approval"),
        ("lee", "no", "denied"),
        ("lee", "no", "denied"),
    ]


def test_a_request_without_a_group_is_its_own_group(people, t0):
    editable(people.desk, t0, check="")

    assert standing(answer_group(people.desk, "refund-881", "yes", now=t0, by=people.dana)) == {
        "refund-881": "yes"
    }
    assert standing(answer_group(people.desk, "nothing-such", "yes", now=t0, by=people.dana)) == {}


def test_all_at_once_takes_the_roles_and_the_deadline_of_one_answer(people, t0):
    editable(people.desk, t0, "refund-1", group="refund-1", check="")
    editable(people.desk, t0, "refund-2", group="refund-1", check="")
    before = snapshot()

    with pytest.raises(MayNotAnswer):
        answer_group(people.desk, "refund-1", "yes", now=t0, by=people.vic)
    with pytest.raises(ValueError, match='answer must be "yes" or "no" for a group'):
        answer_group(people.desk, "refund-1", "replied", now=t0, by=people.dana)
    assert snapshot() == before

    late = standing(answer_group(people.desk, "refund-1", "yes", now=t0 + 5 * HOUR, by=people.dana))

    assert late == {"refund-1": "expired", "refund-2": "expired"}
    # Each: the expiry as the deadline's, then the late answer as not counted.
    assert [row[:3] for row in audit()] == [
        ("", "expired", "expired"),
        ("dana", "yes", "too_late"),
    ] * 2
