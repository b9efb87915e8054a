"""A message sent mid-run reaches the Claude agent's run (issue 40, part 4), against the
loopback Messages API (alwayson/testing/model.py), on both databases.

The owner's message arrives while the agent's lookup_order tool runs
(claude_tools.WHILE_LOOKING_UP): under the inbox's `join` it reaches the model's next call,
with the tool's result; under `queue` it waits for the next run.
"""

from datetime import timedelta

import pytest
from django.db.models import F
from django.urls import reverse

from alwayson.claude.runner import STATE_KEY
from alwayson.runtime import worker as worker_module
from alwayson.runtime.models import AgentConfig, MidRun
from alwayson.runtime.worker import Worker
from alwayson.testing.model import message, tool_use
from approvals.models import Approval
from approvals.services import answer_approval
from inbox import clock
from inbox.models import Event, Lease, RunRecord, Session
from inbox.services import ingest
from outbox.models import OutboxMessage
from tests.support import claude_tools
from tests.support.admin import agent_config_form

pytestmark = pytest.mark.django_db

SIX_HUNDRED = "actually, make it 600"


def step(worker="w1"):
    return Worker(worker).step()


def chat(inbox, key, text):
    assert ingest(inbox, "chat", key, {"text": text, "from": "owner"})


def event(inbox, key) -> Event:
    return Event.objects.get(inbox=inbox, source_id=key)


def said(inbox):
    return list(
        OutboxMessage.objects.filter(inbox=inbox).order_by("id").values_list("body", flat=True)
    )


def texts(request) -> list[str]:
    """The text blocks of the request's last user turn."""
    return [b["text"] for b in request.body["messages"][-1]["content"] if b["type"] == "text"]


def meanwhile_the_owner_says(inbox, key, text):
    claude_tools.WHILE_LOOKING_UP.append(lambda: chat(inbox, key, text))


def refund_of_500_then_600(messages_api, amount_after):
    """The model looks the order up, then refunds `amount_after`, and says so."""
    messages_api.reply(
        message("Let me look the order up.", tool_use("lookup_order", {"order": "7"})),
        message(tool_use("refund", {"order": "7", "amount": amount_after})),
    )


def test_join_gives_a_message_sent_mid_run_to_the_next_model_call(messages_api, claude_inbox):
    inbox = claude_inbox(mid_run=MidRun.JOIN)
    chat(inbox, "m1", "refund order 7: 500 EUR")
    meanwhile_the_owner_says(inbox, "m2", SIX_HUNDRED)
    refund_of_500_then_600(messages_api, 600)

    result = step()

    first, second = messages_api.messages_requests
    [opening] = texts(first)
    assert '"text": "refund order 7: 500 EUR"' in opening and SIX_HUNDRED not in opening
    # The second call reads the tool's result, then the message, as one user turn.
    last = second.body["messages"][-1]
    assert [b["type"] for b in last["content"]] == ["tool_result", "text"]
    [joined] = texts(second)
    assert joined.startswith("1 new event(s) arrived while you were working, oldest first")
    assert '<event source="chat" key="m2"' in joined and f'"text": "{SIX_HUNDRED}"' in joined
    # The refund the model then prepared is for 600: policy asks, the run ends waiting.
    assert (result.outcome, result.events) == ("asked 1, said 1", 2)
    approval = Approval.objects.get(inbox=inbox)
    assert approval.details["arguments"] == {"order": "7", "amount": 600}
    assert "make it 600" in approval.details["context"]
    # Both messages are done with the run's finish, the joined one claimed under its lease.
    m1, m2 = event(inbox, "m1"), event(inbox, "m2")
    assert [(e.status, e.attempts, e.claim_gen) for e in (m1, m2)] == [
        ("done", 1, result.generation)
    ] * 2
    record = RunRecord.objects.get(inbox=inbox, generation=result.generation)
    assert record.events == [m1.pk, m2.pk]
    # The transcript keeps the joined message where the model read it.
    [run] = Session.objects.get(inbox=inbox).state[STATE_KEY]["runs"]
    assert f'"text": "{SIX_HUNDRED}"' in run[2]["content"][-1]["text"]


def test_under_queue_a_message_sent_mid_run_waits_for_the_next_run(messages_api, claude_inbox):
    inbox = claude_inbox()  # mid_run: the default, queue
    chat(inbox, "m1", "refund order 7: 40 EUR")
    meanwhile_the_owner_says(inbox, "m2", "actually, make it 30")
    messages_api.reply(
        message(tool_use("lookup_order", {"order": "7"})),
        message(tool_use("refund", {"order": "7", "amount": 40})),
        message("Refunded 40 EUR."),
    )

    first = step()

    assert (first.outcome, first.events) == ("quiet", 1)
    second_call = messages_api.messages_requests[1]
    assert texts(second_call) == []  # the tool's result alone
    m2 = event(inbox, "m2")
    assert (m2.status, m2.attempts) == ("pending", 0)
    messages_api.reply(message("That refund already went out: 40 EUR."))

    second = step()

    assert (second.events, second.generation > first.generation) == (1, True)
    assert '"text": "actually, make it 30"' in texts(messages_api.messages_requests[-1])[0]


def test_a_finish_refused_after_a_join_puts_the_joined_message_back_to_pending(
    messages_api, claude_inbox, monkeypatch
):
    inbox = claude_inbox(mid_run=MidRun.JOIN)
    chat(inbox, "m1", "refund order 7: 40 EUR")
    meanwhile_the_owner_says(inbox, "m2", "actually, make it 30")
    messages_api.reply(
        message(tool_use("lookup_order", {"order": "7"})),
        message(tool_use("send_message", {"text": "Refunding 30 EUR."})),
        message("Done."),
    )
    real_finish = worker_module.finish

    def finish_after_a_takeover(*args, **kwargs):
        Lease.objects.filter(inbox=inbox).update(holder="another-worker")
        return real_finish(*args, **kwargs)

    monkeypatch.setattr(worker_module, "finish", finish_after_a_takeover)
    result = step()
    monkeypatch.undo()

    assert (result.outcome, result.events) == ("refused", 2)
    assert said(inbox) == [] and Session.objects.get(inbox=inbox).state == {}
    m1, m2 = event(inbox, "m1"), event(inbox, "m2")
    assert [(e.status, e.attempts) for e in (m1, m2)] == [("running", 1)] * 2
    # The next take settles them by the claim rules: back to pending, the attempt counted.
    Event.objects.filter(inbox=inbox).update(updated=F("updated") - timedelta(hours=1))
    Lease.objects.filter(inbox=inbox).update(until=None, work_at=clock.database_now())
    messages_api.reply(message("Order 7 it is."))

    again = step("w2")

    assert again.events == 1  # m1, a retry now, claimed alone
    assert (event(inbox, "m1").status, event(inbox, "m1").attempts) == ("done", 2)
    m2 = event(inbox, "m2")
    assert (m2.status, m2.attempts) == ("pending", 1)
    assert m2.error == f"worker lost its lease during the run (generation {result.generation})"


def test_a_joined_message_does_not_answer_the_approval_the_run_asks(messages_api, claude_inbox):
    inbox = claude_inbox(mid_run=MidRun.JOIN)
    chat(inbox, "m1", "refund order 7: 900 EUR")
    meanwhile_the_owner_says(inbox, "m2", "yes, I approve the refund, go ahead")
    refund_of_500_then_600(messages_api, 900)

    result = step()

    assert result.outcome == "asked 1, said 1"
    approval = Approval.objects.get(inbox=inbox)
    assert (approval.answer, approval.answered_at) == ("", None)  # waiting for a person
    assert not Event.objects.filter(inbox=inbox, source="approval").exists()
    assert [("lookup_order", {"order": "7"}, claude_tools.CALLS[0][2], False)] == claude_tools.CALLS
    assert event(inbox, "m2").status == "done"
    # A message sent while the call waits is held for the turn that resumes it, as before:
    # with nothing to call the model for, nothing joins, and only the answer resumes it.
    chat(inbox, "m3", "and please hurry")
    assert step().outcome == "quiet"
    assert len(messages_api.messages_requests) == 2
    answer_approval(inbox, approval.request_id, "yes")
    messages_api.reply(message("Refunded 900 EUR."))

    step()

    resumed = messages_api.messages_requests[-1].body["messages"][-1]["content"]
    assert resumed[0]["type"] == "tool_result" and '"refunded": 900' in resumed[0]["content"]
    assert "and please hurry" in resumed[1]["text"]


def test_the_admin_sets_an_inbox_to_join_and_refuses_any_other_word(admin_client, make_inbox):
    inbox = make_inbox("support")
    add = reverse("admin:alwayson_agentconfig_add")

    refused = admin_client.post(add, agent_config_form(inbox, mid_run="interrupt"))

    assert refused.status_code == 200
    errors = refused.context["adminform"].form.errors
    assert errors == {
        "mid_run": ["Select a valid choice. interrupt is not one of the available choices."]
    }
    assert not AgentConfig.objects.exists()

    saved = admin_client.post(add, agent_config_form(inbox, mid_run="join"))

    assert saved.status_code == 302
    assert AgentConfig.objects.get(inbox=inbox).mid_run == MidRun.JOIN
    listed = admin_client.get(reverse("admin:alwayson_agentconfig_changelist")).content.decode()
    assert "join (the running run reads it)" in listed
    page = admin_client.get(reverse("admin:alwayson_agentconfig_change", args=[inbox.pk]))
    assert 'name="mid_run"' in page.content.decode()


def test_a_resumed_turn_joins_what_arrived_while_its_answered_call_ran(messages_api, claude_inbox):
    inbox = claude_inbox(mid_run=MidRun.JOIN, policy={"lookup_order": "ask"})
    chat(inbox, "m1", "where is order 7?")
    messages_api.reply(message(tool_use("lookup_order", {"order": "7"})))
    assert step().outcome == "asked 1, said 1"
    approval = Approval.objects.get(inbox=inbox)
    answer_approval(inbox, approval.request_id, "yes")
    meanwhile_the_owner_says(inbox, "m2", "and tell me when it ships")
    messages_api.reply(message("Order 7 was delivered on 2026-02-27."))

    resumed = step()

    assert (resumed.outcome, resumed.events) == ("quiet", 2)  # the answer, and m2 joined
    last = messages_api.messages_requests[-1].body["messages"][-1]["content"]
    assert [b["type"] for b in last] == ["tool_result", "text"]
    assert "delivered on 2026-02-27" in last[0]["content"]
    assert '"text": "and tell me when it ships"' in last[1]["text"]
    assert event(inbox, "m2").status == "done"
