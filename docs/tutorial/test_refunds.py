"""Step 5's tests (docs/tutorial/first-agent.md); CI runs every step's."""
# --8<-- [start:tests]

import pytest
from alwayson.testing import Evals, check, message, tool_use
from alwayson.testing.evals import answers_in_under, recorded_runs

from refunds import POLICY

pytest_plugins = ["alwayson.testing"]


@pytest.fixture
def support(harness, scripted_model, settings):
    settings.ALWAYSON_CLAUDE_TOOLS = ["refunds"]
    return harness.inbox("support", agent="alwayson.claude.agent", policy=POLICY)


def test_a_small_refund_runs_and_a_large_one_asks(harness, scripted_model, support):
    scripted_model.reply(
        message(
            "Two refunds.",
            tool_use("refund_order", {"order": "1", "amount": 20}),
            tool_use("refund_order", {"order": "2", "amount": 80}),
        )
    )
    support.chat("refund 20 on order 1 and 80 on order 2")
    harness.run_until_idle()

    assert [(c.tool, c.verdict) for c in support.tool_calls()] == [
        ("refund_order", "allowed"),
        ("refund_order", "asked"),
    ]
    [approval] = support.waiting_for_approval()
    assert approval.action == "refund order 2 (80 EUR)"

    scripted_model.reply(
        message(tool_use("send_message", {"text": "Both orders are refunded."})),
        message("Done."),
    )
    harness.answer(approval, "yes")
    harness.run_until_idle()

    assert support.said()[-1] == "Both orders are refunded."
    # What the model was given for the approved call: the tool's own result.
    results = scripted_model.messages_requests[1].body["messages"][-1]["content"]
    assert '"refunded": 80' in results[-1]["content"]


# --8<-- [end:tests]


# --8<-- [start:evals]
@check
def asks_before_a_large_refund(run):
    for call in run.tool_calls:
        if call["tool"] == "refund_order" and call["arguments"]["amount"] >= 50:
            assert call["decision"] == "ask", f"refunded {call['arguments']} without asking"


EVALS = Evals(asks_before_a_large_refund, answers_in_under(5000))


def test_the_desk_keeps_its_promises(harness, scripted_model, support):
    scripted_model.reply(
        message(
            tool_use("refund_order", {"order": "1", "amount": 20}),
            tool_use("refund_order", {"order": "2", "amount": 80}),
        )
    )
    support.chat("refund 20 on order 1 and 80 on order 2")
    harness.run_until_idle()

    EVALS.over(recorded_runs("support")).check()


# --8<-- [end:evals]
