"""Condensed, not forgotten: before runs leave the transcript (ALWAYSON_CLAUDE_KEEP_RUNS), the
run that drops them tells the model so, and what it writes to memory then reaches every later
run's prompt. A fact given in run 1 of a 60-run conversation is used in run 60 with
KEEP_RUNS at 10, against the loopback Messages API, whose script reads the prompts it gets.
"""

import json
import re

import pytest

from alwayson.testing import message, tool_use
from alwayson.testing.model import memory

pytestmark = pytest.mark.django_db

CLAUDE = "alwayson.claude.agent"
FACT = re.compile(r"refund limit for ACME is (\d+) EUR")
RUNS = 60


def texts(content) -> str:
    return "\n".join(block.get("text", "") for block in content if isinstance(block, dict))


class Model:
    """A model that remembers only what its prompt holds: it writes the fact to memory when
    told the run that holds it is leaving, and answers the question from the prompt."""

    def __init__(self):
        self.prompts = []

    def __call__(self, request):
        messages = request.body["messages"]
        last = messages[-1]["content"]
        if any(block.get("type") == "tool_result" for block in last):
            return message("Done.")
        self.prompts.append(request.body)
        latest = texts(last)
        if "what is the refund limit" in latest:
            found = FACT.search(json.dumps(request.body))
            answer = f"The refund limit for ACME is {found[1]} EUR." if found else "I don't know."
            return message(tool_use("send_message", {"text": answer}))
        oldest = texts(messages[0]["content"])
        if "<transcript_note>" in latest and FACT.search(oldest):
            fact = FACT.search(oldest)[0]
            return message(memory("create", path="/memories/acme.md", file_text=f"The {fact}."))
        return message("ok")


def converse(harness, model, scripted):
    desk = harness.inbox("desk", agent=CLAUDE)
    scripted.reply(*[model] * (RUNS + 2))
    desk.chat("Please keep in mind: the refund limit for ACME is 450 EUR.")
    harness.run_until_idle()
    for n in range(2, RUNS):
        desk.chat(f"ping {n}")
        harness.run_until_idle()
    desk.chat("what is the refund limit for ACME?")
    harness.run_until_idle()
    return desk


def test_a_fact_from_run_1_is_used_in_run_60(harness, messages_api, settings):
    settings.ALWAYSON_CLAUDE_MEMORY = True
    settings.ALWAYSON_CLAUDE_KEEP_RUNS = 10
    model = Model()

    desk = converse(harness, model, messages_api)

    assert len(model.prompts) == RUNS
    # Told in run 11, when run 1 was about to leave, and only then was the fact written.
    told = [n for n, p in enumerate(model.prompts, 1) if "<transcript_note>" in json.dumps(p)]
    assert told == list(range(11, RUNS + 1))
    assert desk.memory() == {"/memories/acme.md": "The refund limit for ACME is 450 EUR."}
    # Run 60's transcript no longer holds run 1: the fact reached it through memory alone.
    last = model.prompts[-1]
    assert len(last["messages"]) == 10 * 2 + 1  # the ten runs kept, then this run's turn
    assert "Please keep in mind" not in json.dumps(last)
    snapshot = last["messages"][-1]["content"][0]["text"]
    assert '<file path="/memories/acme.md">\nThe refund limit for ACME is 450 EUR.\n' in snapshot
    assert desk.said() == ["The refund limit for ACME is 450 EUR."]
    assert messages_api.waiting == 0  # 60 runs, two of them with a second call


def test_without_memory_the_fact_is_gone_by_run_60(harness, messages_api, settings):
    settings.ALWAYSON_CLAUDE_KEEP_RUNS = 10
    model = Model()

    desk = converse(harness, model, messages_api)

    assert "Please keep in mind" not in json.dumps(model.prompts[-1])
    assert desk.said() == ["I don't know."]
    assert desk.memory() == {}
    assert messages_api.waiting == 1  # no run 11 wrote memory: one call fewer
