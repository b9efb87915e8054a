"""What a person can do with the Claude agent's approvals, and what the model then receives:
an edit of the arguments, a denial with a reason, a question's reply, a turn's several asks
answered one by one or all at once, two approvers by the policy. Against the loopback
Messages API (alwayson.testing.model), on both databases; answers given through the
Python API and through the pages (Django's test client).
"""

import json
import re
from datetime import timedelta
from types import SimpleNamespace
from unittest.mock import ANY

import pytest
from django.core.validators import MaxLengthValidator
from django.db.models import F
from django.test import Client

from alwayson.claude.models import ToolResult
from alwayson.claude.runner import STATE_KEY
from alwayson.demo.models import Refund
from alwayson.runtime.models import AgentConfig
from alwayson.runtime.worker import Worker
from alwayson.testing.model import message, tool_use
from approvals.models import Approval, AuditEntry
from approvals.services import answer_approval, answer_group
from inbox import clock
from inbox.models import Event, Lease, Membership, Role, Session
from inbox.services import ingest
from outbox.models import OutboxMessage
from tests.support import claude_tools
from tests.support.pages import detail_url, snapshot, text_of
from tests.support.wording import in_html, limit_error, schema_error
from timers.services import run_scheduler

pytestmark = pytest.mark.django_db

POLICY = {
    "refund": [
        {"when": {"amount": {"lt": 50}}, "then": "allow"},
        {"when": {"order": {"in": ["13"]}}, "then": "deny"},
        {"when": {"amount": {"gt": 500}}, "then": "ask", "approvers": 2},
        {"then": "ask"},
    ],
    "lookup_order": "allow",
    "delete_account": {"then": "ask", "approvers": 2},
}


def standing(answered):
    """What stands of each call answer_group answered, by request id."""
    return {rid: each.stands for rid, each in answered.items()}


@pytest.fixture
def desk(messages_api, claude_inbox, django_user_model, settings):
    """A Claude inbox with the policy above, the question tools, and two approvers."""
    settings.ALWAYSON_CLAUDE_TOOLS = [
        "tests.support.claude_tools",
        "tests.support.claude_questions",
    ]
    inbox = claude_inbox(policy=POLICY)
    people = {}
    for name in ("dana", "lee"):
        people[name] = django_user_model.objects.create_user(
            username=name, first_name=name.capitalize(), password=f"pw-{name}-123"
        )
        Membership.objects.create(inbox=inbox, user=people[name], role=Role.APPROVER)
    return SimpleNamespace(inbox=inbox, api=messages_api, **people)


def step():
    return Worker("w1").step()


def chat(inbox, key, text):
    assert ingest(inbox, "chat", key, {"text": text, "from": "owner"})


def said(inbox):
    return list(
        OutboxMessage.objects.filter(inbox=inbox).order_by("id").values_list("body", flat=True)
    )


def results_of(request):
    return [b for b in request.body["messages"][-1]["content"] if b["type"] == "tool_result"]


def pending(inbox):
    return Session.objects.get(inbox=inbox).state[STATE_KEY].get("pending")


def request_id(call):
    return f"{call['name']}-{call['id']}"


def ask(desk, *calls, text="please"):
    """The model's turn makes these calls; the run ends asking. Their approvals, in order."""
    chat(desk.inbox, f"m-{calls[0]['id']}", text)
    desk.api.reply(message(*calls))
    result = step()
    assert result.outcome.startswith("asked"), result.outcome
    return list(Approval.objects.filter(inbox=desk.inbox).order_by("id"))


def resume(desk, *replies):
    """The run that resumes the answered calls; the request it sent the model."""
    desk.api.reply(*(replies or [message("Done.")]))
    before = len(desk.api.messages_requests)
    step()
    return desk.api.messages_requests[before]


def logged_in(user):
    client = Client()
    client.force_login(user)
    return client


def argument_fields(client, approval):
    """The approval page's argument fields, by the argument each is labelled with."""
    html = text_of(client.get(detail_url(approval.inbox.slug, approval.request_id)))
    labels = re.findall(r'<label for="id_(a\d+-arg-\d+)">([^<]+?)(?: \(JSON\))?</label>', html)
    return {label: name for name, label in labels}


# --- editing the arguments before approving ----------------------------------------------------


def test_an_edited_call_runs_with_the_edit_and_the_model_is_told_what_changed_and_by_whom(desk):
    call = tool_use("refund", {"order": "881", "amount": 120})
    [approval] = ask(desk, call)

    stands = answer_approval(
        desk.inbox,
        approval.request_id,
        "yes",
        by=desk.dana,
        arguments={"order": "881", "amount": 80},
    ).stands

    assert stands == "yes"
    resumed = resume(desk)
    [(name, arguments, key, approved)] = claude_tools.CALLS
    assert (name, arguments, approved) == ("refund", {"order": "881", "amount": 80}, True)
    assert Refund.objects.get().idempotency_key == key
    [result] = results_of(resumed)
    assert result["tool_use_id"] == call["id"] and "is_error" not in result
    note, output = result["content"].split("\n", 1)
    assert note == (
        f"Dana (dana) changed the arguments before approving (approval {approval.request_id}):"
        " amount: 120 → 80. refund ran with the changed arguments; its result follows."
    )
    assert json.loads(output) == {"order": "881", "refunded": 80, "first_time": True}
    # The model's own call stays in the transcript as it made it; the journal has the edit.
    assert resumed.body["messages"][-2]["content"][-1]["input"] == {"order": "881", "amount": 120}
    assert ToolResult.objects.get().arguments == {"order": "881", "amount": 80}
    # The audit keeps both: the approval the arguments as asked, the entry the edit.
    approval.refresh_from_db()
    assert approval.details["arguments"] == {"order": "881", "amount": 120}
    assert (approval.edited_arguments, approval.edited_by) == (
        {"order": "881", "amount": 80},
        desk.dana,
    )
    [entry] = AuditEntry.objects.all()
    assert (entry.username, entry.result, entry.edited_arguments) == (
        "dana",
        "approved",
        {"order": "881", "amount": 80},
    )
    assert entry.asked_arguments == {"order": "881", "amount": 120}


def test_the_model_reads_every_change_in_the_order_the_schema_declares(desk):
    [approval] = ask(desk, tool_use("refund", {"amount": 120, "order": "881"}))

    answer_approval(
        desk.inbox,
        approval.request_id,
        "yes",
        by=desk.dana,
        arguments={"amount": 90, "order": "882"},
    )

    [result] = results_of(resume(desk))
    assert (
        result["content"]
        .split("\n")[0]
        .endswith(
            ': order: "881" → "882"; amount: 120 → 90. refund ran with the changed arguments;'
            " its result follows."
        )
    )


def test_an_edit_the_policy_denies_is_refused_and_nothing_is_written(desk):
    [approval] = ask(desk, tool_use("refund", {"order": "881", "amount": 120}))
    before = snapshot()

    with pytest.raises(ValueError, match=r"arguments: the policy denies refund with them \(policy"):
        answer_approval(
            desk.inbox,
            approval.request_id,
            "yes",
            by=desk.dana,
            arguments={"order": "13", "amount": 120},
        )
    below = {"order": "881", "amount": -5}
    with pytest.raises(ValueError) as refused:
        answer_approval(desk.inbox, approval.request_id, "yes", by=desk.dana, arguments=below)
    schema = approval.details["schema"]
    assert str(refused.value) == f"arguments/amount: {schema_error(schema, below, 'amount')}"

    assert snapshot() == before
    # Still open, and approved as asked it runs as asked.
    assert answer_approval(desk.inbox, approval.request_id, "yes", by=desk.dana).stands == "yes"
    [result] = results_of(resume(desk))
    assert json.loads(result["content"])["refunded"] == 120


def test_an_edit_the_policy_would_allow_is_still_fine_to_approve(desk):
    [approval] = ask(desk, tool_use("refund", {"order": "881", "amount": 120}))

    answer_approval(
        desk.inbox,
        approval.request_id,
        "yes",
        by=desk.dana,
        arguments={"order": "881", "amount": 20},
    )

    [result] = results_of(resume(desk))
    assert "amount: 120 → 20" in result["content"]
    assert [a for _, a, _, _ in claude_tools.CALLS] == [{"order": "881", "amount": 20}]


def test_an_edit_into_a_two_approver_rule_needs_a_second_person_then_runs_once(desk):
    [approval] = ask(desk, tool_use("refund", {"order": "881", "amount": 120}))
    assert approval.approvers_needed == 1
    edit = {"order": "881", "amount": 900}

    assert answer_approval(
        desk.inbox, approval.request_id, "yes", by=desk.dana, arguments=edit
    ).stands == ("waiting")
    approval.refresh_from_db()
    assert (approval.approvers_needed, approval.first_approved_by) == (2, desk.dana)
    assert step() is None  # nothing for the agent yet: a first approval stores no event
    assert answer_approval(desk.inbox, approval.request_id, "yes", by=desk.dana).stands == "waiting"

    assert answer_approval(desk.inbox, approval.request_id, "yes", by=desk.lee).stands == "yes"

    [result] = results_of(resume(desk))
    assert result["content"].startswith("Dana (dana) changed the arguments before approving")
    assert [a for _, a, _, _ in claude_tools.CALLS] == [edit]
    assert Refund.objects.count() == 1
    event = Event.objects.get(source="approval")
    assert event.payload["approved_by"] == ["dana", "lee"]
    assert event.payload["edit"] == {"arguments": edit, "by": "dana"}


def test_a_second_approver_who_changes_the_arguments_makes_the_first_approval_of_those(desk):
    [approval] = ask(desk, tool_use("refund", {"order": "881", "amount": 900}))
    assert approval.approvers_needed == 2  # the policy's rule above 500
    answer_approval(desk.inbox, approval.request_id, "yes", by=desk.dana)

    lowered = {"order": "881", "amount": 700}
    assert (
        answer_approval(
            desk.inbox, approval.request_id, "yes", by=desk.lee, arguments=lowered
        ).stands
        == "waiting"
    )
    approval.refresh_from_db()
    assert (approval.first_approved_by, approval.edited_by) == (desk.lee, desk.lee)

    assert answer_approval(desk.inbox, approval.request_id, "yes", by=desk.dana).stands == "yes"
    [result] = results_of(resume(desk))
    assert "Lee (lee) changed the arguments" in result["content"]
    assert "amount: 900 → 700" in result["content"]
    results = list(AuditEntry.objects.order_by("id").values_list("username", "result"))
    assert results == [("dana", "first_approval"), ("lee", "first_approval"), ("dana", "approved")]


def test_the_approval_page_edits_the_arguments_from_the_tools_schema(desk):
    [approval] = ask(desk, tool_use("refund", {"order": "881", "amount": 120}))
    client = logged_in(desk.dana)
    fields = argument_fields(client, approval)
    assert set(fields) == {"order", "amount"}
    url = detail_url("support", approval.request_id)
    before = snapshot()

    # A value the schema refuses: 400, the reason on the page, nothing written.
    refused = client.post(url, {"answer": "yes", fields["order"]: "881", fields["amount"]: "0"})
    assert refused.status_code == 400
    reason = schema_error(approval.details["schema"], {"order": "881", "amount": 0}, "amount")
    assert in_html(f"Not recorded: arguments/amount: {reason}") in text_of(refused)
    not_a_number = client.post(
        url, {"answer": "yes", fields["order"]: "881", fields["amount"]: "ten"}
    )
    assert not_a_number.status_code == 400
    assert "amount: Enter a number, not &#x27;ten&#x27;." in text_of(not_a_number)
    assert snapshot() == before

    answered = client.post(url, {"answer": "yes", fields["order"]: "881", fields["amount"]: "75"})
    assert answered.status_code == 302
    [result] = results_of(resume(desk))
    assert "amount: 120 → 75" in result["content"]
    assert [a for _, a, _, _ in claude_tools.CALLS] == [{"order": "881", "amount": 75}]
    assert AuditEntry.objects.get().via == "page"


def test_approving_the_form_unchanged_is_no_edit(desk):
    [approval] = ask(desk, tool_use("refund", {"order": "881", "amount": 120}))
    client = logged_in(desk.dana)
    fields = argument_fields(client, approval)

    client.post(
        detail_url("support", approval.request_id),
        {"answer": "yes", fields["order"]: "881", fields["amount"]: "120"},
    )

    [result] = results_of(resume(desk))
    assert json.loads(result["content"])["refunded"] == 120  # the plain result, no note
    assert "edit" not in Event.objects.get(source="approval").payload
    assert AuditEntry.objects.get().edited_arguments is None


# --- a denial with a reason --------------------------------------------------------------------


def test_a_denial_with_a_reason_reaches_the_model_and_the_audit(desk):
    call = tool_use("refund", {"order": "881", "amount": 120})
    [approval] = ask(desk, call)

    answer_approval(
        desk.inbox, approval.request_id, "no", by=desk.lee, reason="  already refunded by hand  "
    )

    [result] = results_of(resume(desk))
    assert result == {
        "type": "tool_result",
        "tool_use_id": call["id"],
        "is_error": True,
        "content": (
            f"Lee (lee), an approver of support, denied this call (approval {approval.request_id}):"
            " refund was not run. The reason Lee (lee) gave: already refunded by hand"
        ),
        "cache_control": {"type": "ephemeral"},
    }
    assert claude_tools.CALLS == []
    approval.refresh_from_db()
    assert approval.reason == "already refunded by hand"
    assert AuditEntry.objects.get().reason == "already refunded by hand"


@pytest.mark.parametrize(
    "role",
    ["owner", Role.MANAGER, Role.APPROVER, "operator"],
    ids=["owner", "manager", "approver", "operator"],
)
def test_a_denial_names_who_gave_it_and_their_role_in_the_inbox(desk, django_user_model, role):
    [approval] = ask(desk, tool_use("refund", {"order": "881", "amount": 120}))
    if role == "owner":
        person = desk.inbox.owner
        person.first_name = "Olga"
        person.save()
    elif role == "operator":
        person = django_user_model.objects.create_user(
            username="ops", first_name="Omar", is_staff=True, password="pw-ops-123"
        )
        person.user_permissions.add(*operator_permissions())
    else:
        person = django_user_model.objects.create_user(
            username="mia", first_name="Mia", password="pw-mia-123"
        )
        Membership.objects.create(inbox=desk.inbox, user=person, role=role)

    answer_approval(desk.inbox, approval.request_id, "no", by=person)

    [result] = results_of(resume(desk))
    part = {
        "owner": "the owner of support",
        Role.MANAGER: "a manager of support",
        Role.APPROVER: "an approver of support",
        "operator": "an operator",
    }[role]
    who = f"{person.first_name} ({person.get_username()})"
    assert result["content"] == (
        f"{who}, {part}, denied this call (approval {approval.request_id}): refund was not run."
    )


def operator_permissions():
    from django.contrib.auth.models import Permission

    return Permission.objects.filter(
        content_type__app_label="approvals", codename="answer_any_approval"
    )


def test_a_reason_too_long_or_with_a_yes_is_refused_on_the_page_and_through_the_api(desk):
    [approval] = ask(desk, tool_use("refund", {"order": "881", "amount": 120}))
    client = logged_in(desk.dana)
    url = detail_url("support", approval.request_id)
    before = snapshot()

    page = client.post(url, {"answer": "no", f"a{approval.pk}-reason": "x" * 1001})
    assert page.status_code == 400
    assert in_html(limit_error(MaxLengthValidator(1000), 1001)) in text_of(page)
    with pytest.raises(ValueError, match="reason is longer than 1000 characters"):
        answer_approval(desk.inbox, approval.request_id, "no", by=desk.dana, reason="x" * 1001)
    with pytest.raises(ValueError, match='reason: a reason goes with a "no"'):
        answer_approval(desk.inbox, approval.request_id, "yes", by=desk.dana, reason="fine")

    assert snapshot() == before


def test_an_answer_is_recorded_once_and_a_second_is_refused_with_the_first_standing(desk):
    [approval] = ask(desk, tool_use("refund", {"order": "881", "amount": 120}))
    answer_approval(desk.inbox, approval.request_id, "no", by=desk.dana, reason="not today")

    second = logged_in(desk.lee).post(
        detail_url("support", approval.request_id),
        {"answer": "yes"},
        follow=True,
    )

    assert "already settled; the first outcome stands" in text_of(second)
    assert answer_approval(desk.inbox, approval.request_id, "yes", by=desk.lee).stands == "no"
    assert Event.objects.filter(source="approval").count() == 1
    results = list(AuditEntry.objects.order_by("id").values_list("username", "result"))
    assert results == [("dana", "denied"), ("lee", "already_settled"), ("lee", "already_settled")]


# --- the policy as it is at the answer ---------------------------------------------------------


def test_a_plain_yes_to_a_call_the_policy_denies_by_then_runs_nothing_and_tells_the_model_why(
    desk,
):
    call = tool_use("refund", {"order": "881", "amount": 120})
    [approval] = ask(desk, call)
    # While the approval waits, the inbox's policy for the tool becomes "deny".
    AgentConfig.objects.filter(inbox=desk.inbox).update(policy={**POLICY, "refund": "deny"})

    assert answer_approval(desk.inbox, approval.request_id, "yes", by=desk.dana).stands == "yes"
    [result] = results_of(resume(desk))

    assert claude_tools.CALLS == [] and not Refund.objects.exists()
    assert result["tool_use_id"] == call["id"] and result["is_error"] is True
    assert result["content"] == (
        f"Dana (dana) approved this call (approval {approval.request_id}), but the policy now"
        " denies it (policy for refund: deny): refund was not run."
    )
    # Journaled as not run, with its approval: a retry replays the refusal.
    [journaled] = ToolResult.objects.filter(tool="refund")
    assert journaled.result["content"] == result["content"]
    assert journaled.approval_id == approval.pk


def test_a_plain_yes_by_two_approvers_to_a_call_the_policy_denies_by_then_names_both(desk):
    call = tool_use("delete_account", {"account": "c-1"})
    [approval] = ask(desk, call)
    AgentConfig.objects.filter(inbox=desk.inbox).update(policy={**POLICY, "delete_account": "deny"})
    answer_approval(desk.inbox, approval.request_id, "yes", by=desk.dana)
    assert answer_approval(desk.inbox, approval.request_id, "yes", by=desk.lee).stands == "yes"

    [result] = results_of(resume(desk))

    assert claude_tools.CALLS == []
    assert result["content"].startswith("Dana (dana) and Lee (lee) approved this call")
    assert result["content"].endswith(
        "but the policy now denies it (policy for delete_account: deny):"
        " delete_account was not run."
    )


def test_a_plain_yes_to_a_call_the_policy_still_asks_or_now_allows_runs_it(desk):
    calls = [
        tool_use("refund", {"order": "881", "amount": 120}),
        tool_use("refund", {"order": "882", "amount": 130}),
    ]
    approvals = ask(desk, *calls)
    AgentConfig.objects.filter(inbox=desk.inbox).update(
        policy={
            **POLICY,
            "refund": [{"when": {"order": {"in": ["882"]}}, "then": "allow"}, {"then": "ask"}],
        }
    )
    for approval in approvals:
        answer_approval(desk.inbox, approval.request_id, "yes", by=desk.dana)

    results = results_of(resume(desk))

    assert [a["order"] for _, a, _, _ in claude_tools.CALLS] == ["881", "882"]
    assert [json.loads(r["content"])["refunded"] for r in results] == [120, 130]


# --- a question and its reply ------------------------------------------------------------------


def test_a_question_is_answered_with_a_value_that_is_the_tools_result(desk):
    call = tool_use(
        "ask_owner", {"question": "Ship today or Monday?", "options": ["today", "Monday"]}
    )
    [approval] = ask(desk, call)

    assert approval.details["question"] == {
        "choices": ["today", "Monday"],
        "free_text": True,
        "max_length": 2000,
    }
    assert "schema" not in approval.details  # a question is answered, not edited
    [notice] = said(desk.inbox)
    assert notice.startswith("Question for you: Ship today or Monday? Answer within 4 hours: ")
    with pytest.raises(ValueError, match='answer: .* asks a question; answer it with "replied"'):
        answer_approval(desk.inbox, approval.request_id, "yes", by=desk.dana)

    assert (
        answer_approval(
            desk.inbox, approval.request_id, "replied", by=desk.dana, reply="Monday, after 10"
        ).stands
        == "replied"
    )

    [result] = results_of(resume(desk))
    assert (result["tool_use_id"], result["content"]) == (call["id"], "Monday, after 10")
    assert [(n, reply) for n, _, _, reply in claude_tools.CALLS] == [
        ("ask_owner", "Monday, after 10")
    ]
    approval.refresh_from_db()
    assert (approval.answer, approval.reply, approval.answered_by) == (
        "replied",
        "Monday, after 10",
        desk.dana,
    )
    assert AuditEntry.objects.get().result == "replied"


def test_a_question_with_fixed_choices_refuses_any_other_reply_and_a_permission_any_value(desk):
    carrier = tool_use("choose_carrier", {"order": "7"})
    refund = tool_use("refund", {"order": "881", "amount": 120})
    question, permission = ask(desk, carrier, refund)
    client = logged_in(desk.dana)
    before = snapshot()

    with pytest.raises(ValueError, match="reply must be one of DHL, UPS"):
        answer_approval(desk.inbox, question.request_id, "replied", by=desk.dana, reply="FedEx")
    page = client.post(
        detail_url("support", permission.request_id), {"answer": "replied", "reply": "yes please"}
    )
    assert page.status_code == 400
    assert "asks for a yes or a no, not a value" in text_of(page)
    assert snapshot() == before

    chosen = client.post(
        detail_url("support", question.request_id),
        {"answer": "replied", f"a{question.pk}-choice": "UPS"},
    )
    assert chosen.status_code == 302
    answer_approval(desk.inbox, permission.request_id, "no", by=desk.dana)
    results = results_of(resume(desk))
    assert results[0]["content"] == "order 7 ships with UPS"
    assert results[1]["is_error"] is True


def test_a_question_always_goes_to_a_person_though_the_policy_may_deny_it(desk):
    configs = AgentConfig.objects.filter(inbox=desk.inbox)
    configs.update(policy={**POLICY, "ask_owner": "allow"})
    [approval] = ask(desk, tool_use("ask_owner", {"question": "Which colour?"}))
    assert approval.details["question"]["free_text"] is True

    configs.update(policy={**POLICY, "ask_owner": "deny"})
    answer_approval(desk.inbox, approval.request_id, "replied", by=desk.dana, reply="Blue")
    denied = tool_use("ask_owner", {"question": "Which size?"})
    resumed = resume(desk, message(denied), message("Fine."))
    assert results_of(resumed)[0]["content"] == "Blue"
    [result] = results_of(desk.api.messages_requests[-1])
    assert result["is_error"] and result["content"].startswith("Denied by policy")


@pytest.mark.parametrize(
    "seconds, words",
    [
        (4, "4 seconds"),
        (60, "1 minute"),
        (90, "1 minute 30 seconds"),
        (4 * 3600, "4 hours"),
        (5400, "1 hour 30 minutes"),
        (86400, "1 day"),
        (2 * 86400 + 3600, "2 days 1 hour"),
    ],
)
def test_the_approval_window_is_announced_in_the_units_a_person_would_use(
    desk, settings, seconds, words
):
    settings.ALWAYSON_CLAUDE_APPROVAL_WINDOW = seconds
    [approval] = ask(desk, tool_use("refund", {"order": "881", "amount": 120}))
    window = approval.expires_at - approval.requested_at  # the deadline in whole seconds
    assert timedelta(seconds=seconds - 1) < window <= timedelta(seconds=seconds)
    [notice] = said(desk.inbox)
    assert f" Approve or deny within {words}: " in notice


def test_a_late_answer_on_the_page_says_the_request_expired_not_that_it_was_settled(desk):
    first, second = ask(
        desk,
        tool_use("refund", {"order": "881", "amount": 120}),
        tool_use("refund", {"order": "882", "amount": 130}),
    )
    past = clock.whole_seconds(clock.database_now() - timedelta(minutes=5))
    Approval.objects.filter(inbox=desk.inbox).update(expires_at=past)
    client = logged_in(desk.dana)
    too_late = f"Too late: this request expired at {past:%H:%M} UTC, before your answer"

    # The deadline passed; the expiry timer has not fired yet.
    page = text_of(
        client.post(detail_url("support", first.request_id), {"answer": "yes"}, follow=True)
    )
    assert too_late in page and "already settled" not in page
    # The expiry timer has fired (at its own time): the request stands as expired.
    assert run_scheduler(now=second.expires_at + timedelta(seconds=1)) == 2  # both calls
    page = text_of(
        client.post(detail_url("support", second.request_id), {"answer": "no"}, follow=True)
    )
    assert too_late in page and "already settled" not in page
    # All of the turn's calls at once, every one expired.
    page = text_of(
        client.post(f"/approvals/support/{first.request_id}/all/", {"answer": "yes"}, follow=True)
    )
    assert too_late in page and "the first outcomes stand" not in page
    assert set(Approval.objects.values_list("answer", flat=True)) == {"expired"}


# --- several asks in one turn ------------------------------------------------------------------


def turn_of_four():
    return [
        tool_use("refund", {"order": "1", "amount": 100}),
        tool_use("lookup_order", {"order": "5"}),
        tool_use("refund", {"order": "2", "amount": 200}),
        tool_use("refund", {"order": "13", "amount": 100}),
    ]


def test_several_asks_in_one_turn_become_one_group_and_resume_once_all_are_answered(desk):
    calls = turn_of_four()
    first, second = ask(desk, *calls)

    assert first.group == second.group == first.request_id
    [notice] = said(desk.inbox)
    link = f"/approvals/support/{first.request_id}/"
    assert notice.startswith(
        "Approval needed for 2 calls: refund order 1 (100 EUR); refund order 2 (200 EUR)."
        " Answer them within 4 hours, one by one or all at once: "
    )
    assert notice.endswith(link)
    assert claude_tools.CALLS == []  # the lookup comes after the first asked call: it waits
    assert pending(desk.inbox)["waiting"] == {
        calls[0]["id"]: first.request_id,
        calls[2]["id"]: second.request_id,
    }

    answer_approval(desk.inbox, first.request_id, "yes", by=desk.dana)
    assert step().outcome == "quiet"  # one answered, one still waits: no model call
    assert len(desk.api.messages_requests) == 1
    answer_approval(desk.inbox, second.request_id, "no", by=desk.lee, reason="order 2 is fine")

    resumed = resume(desk)
    results = results_of(resumed)
    assert [r["tool_use_id"] for r in results] == [c["id"] for c in calls]
    assert json.loads(results[0]["content"])["refunded"] == 100
    assert results[1]["content"] == "order 5: delivered on 2026-02-27"
    assert results[2]["is_error"] and results[2]["content"].endswith(
        "The reason Lee (lee) gave: order 2 is fine"
    )
    assert results[3]["is_error"] and results[3]["content"].startswith("Denied by policy")
    assert [(n, a) for n, a, _, _ in claude_tools.CALLS] == [
        ("refund", {"order": "1", "amount": 100}),
        ("lookup_order", {"order": "5"}),
    ]
    assert len(desk.api.messages_requests) == 2
    assert "pending" not in Session.objects.get(inbox=desk.inbox).state[STATE_KEY]


def test_a_group_answered_all_at_once_resumes_in_one_run(desk):
    first, second = ask(desk, *turn_of_four())

    assert standing(answer_group(desk.inbox, second.request_id, "yes", by=desk.dana)) == {
        first.request_id: "yes",
        second.request_id: "yes",
    }

    desk.api.reply(message("Done."))
    assert step().events == 2  # both answers, one run
    results = results_of(desk.api.messages_requests[-1])
    assert [json.loads(r["content"])["refunded"] for r in (results[0], results[2])] == [100, 200]
    assert list(AuditEntry.objects.values_list("result", flat=True)) == ["approved", "approved"]
    # A second "all at once" finds nothing open and changes nothing.
    assert standing(answer_group(desk.inbox, first.request_id, "no", by=desk.lee)) == {}
    assert AuditEntry.objects.count() == 2


def test_all_at_once_from_the_conversation_card(desk):
    first, second = ask(desk, *turn_of_four())
    client = logged_in(desk.dana)
    page = text_of(client.get("/inbox/support/"))
    assert page.count('class="answer-form"') == 2  # each call answerable on its own
    assert 'aria-label="Answer all open calls of this turn"' in page

    answered = client.post(
        f"/approvals/support/{first.request_id}/all/",
        {
            "answer": "no",
            "all-reason": "wrong customer",
            "via": "conversation",
            "next": "/inbox/support/",
        },
    )

    assert (answered.status_code, answered["Location"]) == (302, "/inbox/support/")
    assert set(AuditEntry.objects.values_list("via", "result", "reason")) == {
        ("conversation", "denied", "wrong customer")
    }
    results = results_of(resume(desk))
    assert [
        r["content"].endswith("The reason Dana (dana) gave: wrong customer") for r in results
    ] == [
        True,
        False,
        True,
        False,
    ]


def test_a_groups_calls_that_expire_resume_the_run_once(desk):
    calls = turn_of_four()
    first, _ = ask(desk, *calls)

    assert run_scheduler(now=first.expires_at + timedelta(seconds=1)) == 2
    Event.objects.filter(inbox=desk.inbox, status="pending").update(
        available_at=clock.database_now() - timedelta(seconds=1)
    )
    Lease.objects.filter(inbox=desk.inbox).update(work_at=clock.database_now())

    results = results_of(resume(desk))
    assert ["before it expired" in r["content"] for r in results] == [True, False, True, False]
    assert [n for n, _, _, _ in claude_tools.CALLS] == ["lookup_order"]


def test_a_crash_while_resuming_a_group_repeats_its_calls_under_the_same_keys(desk):
    calls = [
        tool_use("refund", {"order": "1", "amount": 100}),
        tool_use("refund", {"order": "2", "amount": 200}),
    ]
    first, _ = ask(desk, *calls)
    answer_group(desk.inbox, first.request_id, "yes", by=desk.dana)  # one batch of two events
    claude_tools.CRASH_AFTER_REFUND.append(True)
    with pytest.raises(claude_tools.Crash):
        step()

    # An hour later the dead worker's lease has lapsed; each event is retried alone.
    Event.objects.filter(inbox=desk.inbox).update(updated=F("updated") - timedelta(hours=1))
    Lease.objects.filter(inbox=desk.inbox).update(until=None, work_at=clock.database_now())
    assert Worker("w2").step().outcome == "quiet"  # one answer: the other call still waits
    desk.api.reply(message("Done."))
    assert Worker("w2").step().events == 1

    ran = [(arguments["order"], key) for _, arguments, key, _ in claude_tools.CALLS]
    assert [order for order, _ in ran] == ["1", "1", "2"]  # order 1 again, after the crash
    assert ran[0][1] == ran[1][1]  # under the same key
    assert sorted(Refund.objects.values_list("order", flat=True)) == ["1", "2"]


# --- two approvers by the policy ---------------------------------------------------------------


def test_a_tool_level_rule_asks_two_different_approvers(desk):
    call = tool_use("delete_account", {"account": "5"})
    [approval] = ask(desk, call)

    assert approval.approvers_needed == 2
    assert said(desk.inbox)[0].startswith(
        "Approval needed: delete account (account: 5). Two different approvers must approve it."
    )
    assert answer_approval(desk.inbox, approval.request_id, "yes", by=desk.dana).stands == "waiting"
    assert step() is None
    assert answer_approval(desk.inbox, approval.request_id, "yes", by=desk.lee).stands == "yes"
    [result] = results_of(resume(desk))
    assert result["content"] == "deleted 5"
    assert [n for n, _, _, _ in claude_tools.CALLS] == ["delete_account"]


def test_an_argument_rule_asks_two_approvers_for_a_refund_above_500(desk):
    small, large = ask(
        desk,
        tool_use("refund", {"order": "1", "amount": 120}),
        tool_use("refund", {"order": "2", "amount": 750}),
    )
    assert (small.approvers_needed, large.approvers_needed) == (1, 2)
    assert "refund order 2 (750 EUR) (two approvers)" in said(desk.inbox)[0]

    assert standing(answer_group(desk.inbox, small.request_id, "yes", by=desk.dana)) == {
        small.request_id: "yes",
        large.request_id: "waiting",
    }
    assert step().outcome == "quiet"
    assert standing(answer_group(desk.inbox, small.request_id, "yes", by=desk.lee)) == {
        large.request_id: "yes"
    }
    resume(desk)
    assert sorted(Refund.objects.values_list("order", flat=True)) == ["1", "2"]


# --- a session saved before grouping -----------------------------------------------------------


def test_a_call_pending_in_the_old_sessions_shape_still_resumes(desk):
    call = tool_use("refund", {"order": "881", "amount": 120})
    [approval] = ask(desk, call)
    session = Session.objects.get(inbox=desk.inbox)
    state = session.state
    new = state[STATE_KEY]["pending"]
    state[STATE_KEY]["pending"] = {
        "request_id": approval.request_id,
        "call": new["remaining"][0],
        "results": [],
        "remaining": [],
    }
    Session.objects.filter(pk=session.pk).update(state=state)

    answer_approval(desk.inbox, approval.request_id, "yes", by=desk.dana)

    [result] = results_of(resume(desk))
    assert result["tool_use_id"] == call["id"]
    assert json.loads(result["content"])["refunded"] == 120


def test_a_turn_in_the_old_sessions_shape_resumes_the_calls_after_the_asked_one(desk):
    refund = tool_use("refund", {"order": "881", "amount": 120})
    lookup = tool_use("lookup_order", {"order": "881"})
    [approval] = ask(desk, refund, lookup)
    session = Session.objects.get(inbox=desk.inbox)
    state = session.state
    new = state[STATE_KEY]["pending"]
    assert [call["id"] for call in new["remaining"]] == [refund["id"], lookup["id"]]
    # One asked call at a time: the asked call apart, the calls after it in "remaining".
    state[STATE_KEY]["pending"] = {
        "request_id": approval.request_id,
        "call": new["remaining"][0],
        "results": new["results"],
        "remaining": new["remaining"][1:],
    }
    Session.objects.filter(pk=session.pk).update(state=state)
    claude_tools.CALLS.clear()

    answer_approval(desk.inbox, approval.request_id, "yes", by=desk.dana)

    results = results_of(resume(desk))
    assert [r["tool_use_id"] for r in results] == [refund["id"], lookup["id"]]
    assert json.loads(results[0]["content"])["refunded"] == 120
    assert results[1]["content"] == "order 881: delivered on 2026-02-27"
    assert [name for name, *_ in claude_tools.CALLS] == ["refund", "lookup_order"]
    assert pending(desk.inbox) is None


def test_a_turn_saved_before_the_journal_kept_why_it_asked_still_resumes(desk):
    call = tool_use("refund", {"order": "881", "amount": 120})
    [approval] = ask(desk, call)
    session = Session.objects.get(inbox=desk.inbox)
    state = session.state
    assert state[STATE_KEY]["pending"].pop("reasons") == {call["id"]: ANY}
    Session.objects.filter(pk=session.pk).update(state=state)

    answer_approval(desk.inbox, approval.request_id, "yes", by=desk.dana)

    [result] = results_of(resume(desk))
    assert json.loads(result["content"])["refunded"] == 120
    row = ToolResult.objects.get(tool="refund")
    assert (row.decision, row.decision_reason, row.approval_id) == ("ask", "", approval.pk)


def test_a_turns_asks_are_one_email_to_each_approver_listing_them_all(desk, settings):
    from django.core import mail

    from outbox.models import Notice
    from outbox.services import dispatch_notices
    from tests.support.mail import use_email_backend

    use_email_backend(settings, "django.core.mail.backends.locmem.EmailBackend")
    settings.ALWAYSON_SITE_URL = "https://desk.example.com"
    mail.outbox = []
    for user in (desk.dana, desk.lee):
        user.email = f"{user.username}@example.com"
        user.save()
    first, second = ask(
        desk,
        tool_use("refund", {"order": "1", "amount": 100}),
        tool_use("refund", {"order": "2", "amount": 750}),
    )

    assert Notice.objects.count() == 2  # one per approver, not one per call
    assert dispatch_notices() == 2
    for email in mail.outbox:
        assert email.subject == "[support] Approval needed: 2 calls of one turn"
        assert (
            "- Refund order 1 (100 EUR)\n- Refund order 2 (750 EUR) (two different approvers)"
            in (email.body)
        )
        assert f"https://desk.example.com/approvals/support/{first.request_id}/" in email.body
    assert sorted(m.to[0] for m in mail.outbox) == ["dana@example.com", "lee@example.com"]
