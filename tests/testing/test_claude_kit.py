"""The kit with the Claude agent: the scripted model, the harness's runs, and what became of
each tool call the model made. The project's `messages_api` fixture is the kit's
`scripted_model` with the project's test tools (tests/support/claude_tools.py)."""

from datetime import timedelta

import pytest

from alwayson.testing import AgentError, ToolCallSeen, message, rate_limited, tool_use, usage
from alwayson.testing.model import bad_request
from tests.support import claude_tools

CLAUDE = "alwayson.claude.agent"
POLICY = {
    "refund": [{"when": {"amount": {"lt": 50}}, "then": "allow"}, {"then": "ask"}],
    "lookup_order": "allow",
    "delete_account": "deny",
}


def test_each_tool_call_is_allowed_asked_denied_or_refused(harness, messages_api):
    support = harness.inbox("support", agent=CLAUDE, policy=POLICY)
    calls = [
        tool_use("lookup_order", {"order": "8"}),
        tool_use("lookup_order", {"order": "404"}),  # it runs, and reports a ToolError
        tool_use("delete_account", {"account": "5"}),
        tool_use("no_such_tool", {}),
        tool_use("lookup_order", {"order": 8}),  # not a string: its schema refuses it
        tool_use("refund", {"order": "2", "amount": 80}),
    ]
    messages_api.reply(message("On it.", *calls))
    support.chat("check order 8, delete account 5, refund 80 on order 2")

    harness.run_until_idle()

    ids = [call["id"] for call in calls]
    assert support.tool_calls() == [
        ToolCallSeen("lookup_order", {"order": "8"}, "allowed", ids[0]),
        ToolCallSeen("lookup_order", {"order": "404"}, "allowed", ids[1]),
        ToolCallSeen("delete_account", {"account": "5"}, "denied", ids[2]),
        ToolCallSeen("no_such_tool", {}, "refused", ids[3]),
        ToolCallSeen("lookup_order", {"order": 8}, "refused", ids[4]),
        ToolCallSeen("refund", {"order": "2", "amount": 80}, "asked", ids[5]),
    ]
    [approval] = support.waiting_for_approval()
    assert approval.action == "refund order 2 (80 EUR)"
    assert support.said()[0].startswith("Approval needed: refund order 2 (80 EUR).")
    assert [name for name, *_ in claude_tools.CALLS] == ["lookup_order", "lookup_order"]

    # The answer resumes the call: it runs, approved, and the model gets every result.
    messages_api.reply(
        message(tool_use("send_message", {"text": "Refunded order 2."})), message("Done.")
    )
    harness.answer(approval, "yes")
    harness.run_until_idle()

    assert claude_tools.CALLS[-1][0] == "refund" and claude_tools.CALLS[-1][3] is True
    assert support.said()[-1] == "Refunded order 2."
    assert [seen.verdict for seen in support.tool_calls()] == [
        "allowed",
        "allowed",
        "denied",
        "refused",
        "refused",
        "asked",
        "allowed",
    ]
    assert len(messages_api.messages_requests) == 3
    results = messages_api.messages_requests[1].body["messages"][-1]["content"]
    assert [block["tool_use_id"] for block in results if block["type"] == "tool_result"] == ids


def test_without_the_scripted_model_the_verdicts_come_from_the_transcript(harness, messages_api):
    support = harness.inbox("support", agent=CLAUDE, policy=POLICY)
    messages_api.reply(
        message(
            tool_use("lookup_order", {"order": "8"}), tool_use("delete_account", {"account": "5"})
        ),
        message("Done."),
    )
    support.chat("check 8 and delete 5")
    harness.run_until_idle()
    from_requests = support.tool_calls()

    harness.model = None

    assert support.tool_calls() == from_requests
    assert [seen.verdict for seen in from_requests] == ["allowed", "denied"]


def test_a_call_whose_run_failed_is_unanswered(harness, messages_api, settings):
    settings.ALWAYSON_CLAUDE_TOOLS = ["tests.support.kit_agents"]
    support = harness.inbox("support", agent=CLAUDE, policy={"crash": "allow"})
    messages_api.reply(message(tool_use("crash", {})))
    support.chat("try it")

    with pytest.raises(AgentError, match="the tool has a bug"):
        harness.run_until_idle()

    assert [seen.verdict for seen in support.tool_calls()] == ["unanswered"]


def test_a_rate_limited_model_defers_the_run_and_time_travel_retries_it(harness, messages_api):
    support = harness.inbox("support", agent=CLAUDE, policy=POLICY)
    messages_api.reply(rate_limited(30), message(tool_use("send_message", {"text": "Hello!"})))
    messages_api.reply(message("Sent."))
    support.chat("hello")

    [deferred] = harness.run_until_idle()
    assert deferred.outcome.startswith("deferred: model API unavailable")
    assert support.said() == []

    harness.advance(seconds=29)
    assert support.said() == []
    harness.advance(seconds=1)

    assert support.said() == ["Hello!"]
    assert len(messages_api.messages_requests) == 3
    assert messages_api.waiting == 0


def test_a_request_the_api_refuses_fails_the_test(harness, messages_api):
    support = harness.inbox("support", agent=CLAUDE, policy=POLICY)
    messages_api.reply(bad_request())
    support.chat("hello")

    with pytest.raises(AgentError, match="refused the agent's request"):
        harness.run_until_idle()


def test_a_spent_budget_waits_for_midnight_on_the_harness_clock(harness, messages_api):
    support = harness.inbox("support", agent=CLAUDE, policy=POLICY, daily_token_budget=100)
    messages_api.reply(message("Noted.", tokens=usage(input_tokens=90, output_tokens=20)))
    support.chat("one")
    harness.run_until_idle()
    support.chat("two")

    [deferred] = harness.run_until_idle()

    assert deferred.outcome.startswith("deferred: daily token budget spent")
    assert len(messages_api.messages_requests) == 1
    midnight = harness.now.replace(hour=0, minute=0, second=0) + timedelta(days=1)
    messages_api.reply(message("Noted again."))
    harness.advance(until_midnight := midnight - harness.now)
    assert until_midnight > timedelta(0)
    assert len(messages_api.messages_requests) == 2
    assert support.events()[-1].status == "done"
