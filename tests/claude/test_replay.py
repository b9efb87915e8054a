"""Replay (issue 42 §2): recorded runs run again by a candidate, on the same events and the
state each started from, committing nothing; tool calls the recorded run made answered from
its journal, others stubbed; model calls counted against a budget; a report of what differs.
Against the scripted model, on both databases."""

import json
import sys

import pytest
from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import connection

from alwayson.claude.prices import price_of
from alwayson.claude.replay import recorded_runs, replay
from alwayson.runtime import tools
from alwayson.runtime.models import AgentConfigRevision
from alwayson.testing import message, tool_use, usage
from inbox.models import RunRecord
from tests import support as support_package
from tests.support import claude_tools

CLAUDE = "alwayson.claude.agent"
POLICY = {
    "refund": [{"when": {"amount": {"lt": 50}}, "then": "allow"}, {"then": "ask"}],
    "lookup_order": "allow",
    "delete_account": "deny",
}


def row_counts() -> dict:
    """Every table's rows, those of many-to-many relations and of no model included."""
    with connection.cursor() as cursor:
        counts = {}
        for table in connection.introspection.table_names(cursor):
            cursor.execute(f"SELECT count(*) FROM {connection.ops.quote_name(table)}")
            counts[table] = cursor.fetchone()[0]
    return counts


@pytest.fixture
def support(harness, messages_api):
    """An inbox whose one recorded run looked order 8 up and said so."""
    inbox = harness.inbox("support", agent=CLAUDE, policy=POLICY, system_prompt="Be kind.")
    messages_api.reply(
        message(tool_use("lookup_order", {"order": "8"}), tokens=usage(100, 10)),
        message(tool_use("send_message", {"text": "Order 8 shipped."}), tokens=usage(120, 10)),
        message("Done.", tokens=usage(130, 5)),
    )
    inbox.chat("where is order 8?")
    harness.run_until_idle()
    assert inbox.said() == ["Order 8 shipped."]
    claude_tools.CALLS.clear()
    return inbox


def test_a_changed_prompt_is_replayed_without_committing_anything(harness, messages_api, support):
    proposed = AgentConfigRevision.propose(
        support.inbox, system_prompt="Refund late orders at once.", now=harness.now
    )
    messages_api.reply(
        message(tool_use("lookup_order", {"order": "8"}), tokens=usage(100, 10)),
        message(tool_use("refund", {"order": "8", "amount": 20}), tokens=usage(110, 10)),
        message(tool_use("send_message", {"text": "Refunded order 8."}), tokens=usage(120, 10)),
        message("Done.", tokens=usage(130, 5)),
    )
    before = row_counts()

    report = replay(recorded_runs(inboxes=["support"]), revision=proposed, budget=10)

    assert row_counts() == before
    assert claude_tools.CALLS == []  # the refund was stubbed, the lookup answered from the journal
    [run] = report.runs
    assert run.differences == ["messages", "tool_calls"]
    assert run.recorded.messages == ["Order 8 shipped."]
    assert run.candidate.messages == ["Refunded order 8."]
    assert run.candidate.tool_calls == [
        {
            "tool": "lookup_order",
            "arguments": {"order": "8"},
            "decision": "allow",
            "answered": "journal",
        },
        {
            "tool": "refund",
            "arguments": {"order": "8", "amount": 20},
            "decision": "allow",
            "answered": "would call",
        },
        {"tool": "send_message", "arguments": {"text": "Refunded order 8."}, "decision": "allow"},
    ]
    assert [c["tool"] for c in run.recorded.tool_calls] == ["lookup_order", "send_message"]
    assert (run.recorded.tokens, run.candidate.tokens) == (375, 495)
    assert report.paid_calls == 4 and report.totals()["differ"] == 1
    # The candidate's requests carried its prompt, and the stub's words came back as the result.
    system = json.dumps(messages_api.messages_requests[-1].body["system"])
    assert "Refund late orders at once." in system
    results = messages_api.messages_requests[-2].body["messages"][-1]["content"]
    assert "this tool was not run" in json.dumps(results)
    assert "(revision 2, proposed)" in run.candidate_version
    assert ' *tool_calls  recorded: lookup_order {"order": "8"} allow; send_message' in "\n".join(
        report.lines()
    )
    assert (
        'candidate: lookup_order {"order": "8"} allow (journal); refund {"amount": 20, '
        '"order": "8"} allow (would call); send_message'
    ) in "\n".join(report.lines())
    assert (
        run.recorded_version
        == f"{CLAUDE} @ {RunRecord.objects.get().produced['version']['code']} config r1"
    )


def test_a_replay_in_a_process_that_never_imported_the_tools_stubs_them_all(
    harness, messages_api, support, monkeypatch
):
    proposed = AgentConfigRevision.propose(
        support.inbox, system_prompt="Refund late orders at once.", now=harness.now
    )
    # As `manage.py replay` starts: no tool module imported yet (the first run imports them).
    monkeypatch.setattr(tools, "_registry", {})
    monkeypatch.delitem(sys.modules, claude_tools.__name__)
    # The import below binds the fresh module to its package too: put the first one back after,
    # or later tests' `from tests.support import claude_tools` gets a module no tool writes to.
    monkeypatch.setattr(support_package, "claude_tools", claude_tools)
    messages_api.reply(
        message(tool_use("refund", {"order": "8", "amount": 20})),
        message("Done."),
    )

    report = replay(recorded_runs(inboxes=["support"]), revision=proposed, budget=10)

    [run] = report.runs
    assert run.candidate.tool_calls == [
        {
            "tool": "refund",
            "arguments": {"order": "8", "amount": 20},
            "decision": "allow",
            "answered": "would call",
        }
    ]
    assert sys.modules[claude_tools.__name__].CALLS == []  # the real refund never ran


def test_the_same_agent_and_configuration_is_answered_from_the_records(messages_api, support):
    requests = len(messages_api.messages_requests)

    report = replay(recorded_runs(inboxes=["support"]), budget=0)

    [run] = report.runs
    assert run.differences == []
    assert (report.paid_calls, len(messages_api.messages_requests)) == (0, requests)
    assert run.candidate.tool_calls[0]["answered"] == "journal"


def test_the_budget_stops_the_replay_at_the_call_past_it(harness, messages_api, support):
    support.chat("and order 9?")
    messages_api.reply(message("Nothing to add."))
    harness.run_until_idle()
    proposed = AgentConfigRevision.propose(support.inbox, system_prompt="Other.", now=harness.now)
    messages_api.reply(message(tool_use("lookup_order", {"order": "8"})), message("Done."))
    before = row_counts()

    report = replay(recorded_runs(inboxes=["support"]), revision=proposed, budget=1)

    assert row_counts() == before
    assert report.runs == [] and report.paid_calls == 1
    assert report.stopped == "the budget of 1 model call(s) is spent at support #1"
    assert report.not_replayed == 2


def test_the_command_prints_and_saves_the_report(harness, messages_api, support, tmp_path):
    out = tmp_path / "report.json"
    printed = []

    call_command(
        "replay", "--inbox", "support", "--budget", "0", "--out", str(out), stdout=Printed(printed)
    )

    text = "".join(printed)
    assert "support #1 (" in text and "): same" in text
    assert "total: 1 run(s) replayed, 0 differ" in text
    saved = json.loads(out.read_text())
    assert saved["totals"]["runs"] == 1 and saved["runs"][0]["differences"] == []


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        (["--budget", "-1"], "--budget must be 0 or more model calls, not -1"),
        (["--budget", "1", "--inbox", "nope"], "--inbox: no inbox nope"),
        (["--budget", "1", "--since", "yesterday"], "--since: 'yesterday' is not a date"),
        (["--budget", "1", "--outcome", "fine"], "outcome: fine is not one of"),
        (["--budget", "1", "--config-revision", "2"], "--config-revision: name the one inbox"),
        (
            ["--budget", "1", "--inbox", "support", "--config-revision", "9"],
            "--config-revision: inbox support has no revision 9",
        ),
        (
            ["--budget", "1", "--since", "2026-12-02", "--until", "2026-12-01"],
            "must be before --until",
        ),
    ],
)
def test_the_command_refuses_what_it_cannot_read(support, tmp_path, arguments, error):
    with pytest.raises(CommandError, match=error.replace("(", r"\(").replace(")", r"\)")):
        call_command("replay", *arguments, "--out", str(tmp_path / "r.json"))


class Printed:
    def __init__(self, into):
        self.into = into

    def write(self, text):
        self.into.append(text)

    def flush(self):
        pass


def test_a_proposed_model_setting_reaches_the_candidates_requests(harness, messages_api, support):
    proposed = AgentConfigRevision.propose(
        support.inbox, model_settings={"temperature": 0.3}, now=harness.now
    )
    messages_api.reply(message("Nothing to say."))
    before = row_counts()

    report = replay(recorded_runs(inboxes=["support"]), revision=proposed, budget=5)

    assert row_counts() == before
    assert messages_api.messages_requests[-1].body["temperature"] == 0.3
    [run] = report.runs
    assert run.candidate.messages == [] and run.differences == ["messages", "tool_calls"]
    with pytest.raises(ValueError, match="model_settings must be a dict"):
        AgentConfigRevision.propose(support.inbox, model_settings=0.3)


def test_another_agent_replays_a_rule_based_agents_runs_from_their_start_state(harness):
    desk = harness.inbox("desk", agent="tests.support.kit_agents.desk")
    desk.chat("one")
    desk.chat("later")
    harness.run_until_idle()
    desk.chat("two")
    harness.run_until_idle()
    before = row_counts()

    same = replay(recorded_runs(inboxes=["desk"]), budget=0)
    broken = replay(
        recorded_runs(inboxes=["desk"]), agent="tests.support.kit_agents.broken", budget=0
    )

    assert row_counts() == before
    assert [run.differences for run in same.runs] == [[], []]
    first, second = same.runs
    assert first.candidate.timers == ["follow-up"] and first.candidate.messages == [
        "desk-owner said: one",
        "I will follow up in an hour.",
    ]
    assert second.recorded.messages == second.candidate.messages == ["desk-owner said: two"]
    assert [run.differences for run in broken.runs] == [
        ["outcome", "messages", "timers"],
        ["outcome", "messages"],
    ]
    assert broken.runs[0].candidate.error == "ValueError: the agent broke on purpose"
    assert "tests.support.kit_agents.broken @ sha256:" in broken.runs[0].candidate_version


# --- tokens by kind and cost ------------------------------------------------------------------

SONNET = {"input": 3, "output": 15, "cache_read": 0.3, "cache_write": 3.75}
HAIKU = {"input": 1, "output": 5, "cache_read": 0.1, "cache_write": 1.25}


def test_a_changed_model_s_tokens_by_kind_and_cost_at_each_model_s_price(
    settings, harness, messages_api, support
):
    settings.ALWAYSON_CLAUDE_PRICES = {"claude-sonnet-5-5": SONNET, "claude-haiku-5*": HAIKU}
    proposed = AgentConfigRevision.propose(
        support.inbox, model="claude-haiku-5", system_prompt="Say less.", now=harness.now
    )
    messages_api.reply(
        message(
            "Nothing to add.",
            tokens=usage(200, 30, cache_read=1000, cache_write=400),
            model="claude-haiku-5-20261201",
        )
    )

    report = replay(recorded_runs(inboxes=["support"]), revision=proposed, budget=5)

    assert messages_api.messages_requests[-1].body["model"] == "claude-haiku-5"
    [run] = report.runs
    recorded, candidate = run.recorded, run.candidate
    kinds = ("input", "output", "cache_read", "cache_write")
    assert recorded.tokens_by_kind == dict(zip(kinds, (350, 25, 0, 0), strict=True))
    assert candidate.tokens_by_kind == dict(zip(kinds, (200, 30, 1000, 400), strict=True))
    assert (recorded.tokens, candidate.tokens) == (375, 1630)  # the sum stays
    # Recorded at Sonnet's prices: 350 x 3 + 25 x 15 per million; the candidate at Haiku's
    # (its dated name, by the prefix): 200 x 1 + 30 x 5 + 1000 x 0.1 + 400 x 1.25.
    assert (recorded.cost_usd, candidate.cost_usd) == (0.001425, 0.00095)
    lines = "\n".join(report.lines())
    assert "  by kind    recorded: input 350, output 25, cache read 0, cache write 0" in lines
    assert "             candidate: input 200, output 30, cache read 1000, cache write 400" in lines
    assert "  cost       recorded: $0.001425, candidate: $0.000950" in lines
    assert "total cost: recorded $0.001425, candidate $0.000950" in lines
    totals = json.loads(json.dumps(report.as_json()))["totals"]
    assert totals["recorded_tokens_by_kind"] == recorded.tokens_by_kind
    assert totals["candidate_tokens_by_kind"] == candidate.tokens_by_kind
    assert (totals["recorded_cost_usd"], totals["candidate_cost_usd"]) == (0.001425, 0.00095)


def test_a_model_without_a_price_has_no_cost_and_the_report_says_so(
    settings, messages_api, support, tmp_path
):
    settings.ALWAYSON_CLAUDE_PRICES = {"claude-haiku-5*": HAIKU}
    out = tmp_path / "report.json"

    call_command(
        "replay", "--inbox", "support", "--budget", "0", "--out", str(out), stdout=Printed([])
    )

    saved = json.loads(out.read_text())
    [run] = saved["runs"]
    assert run["recorded"]["cost_usd"] is None and run["candidate"]["cost_usd"] is None
    assert run["recorded"]["no_price"] == ["claude-sonnet-5-5"]
    assert run["recorded"]["tokens_by_kind"]["input"] == 350  # tokens are still counted
    totals = saved["totals"]
    assert totals["recorded_cost_usd"] is None and totals["candidate_cost_usd"] is None
    assert totals["candidate_no_price"] == ["claude-sonnet-5-5"]
    lines = replay(recorded_runs(inboxes=["support"]), budget=0).lines()
    assert (
        "  cost       recorded: no price for claude-sonnet-5-5, "
        "candidate: no price for claude-sonnet-5-5"
    ) in lines
    assert "total cost: recorded no price for claude-sonnet-5-5, candidate no price for " in (
        "\n".join(lines)
    )


def test_an_exact_model_name_wins_then_the_longest_prefix(settings):
    settings.ALWAYSON_CLAUDE_PRICES = {
        "claude-*": {"input": 1},
        "claude-sonnet-5*": {"input": 2},
        "claude-sonnet-5-5": {"input": 3},
    }
    assert price_of("claude-sonnet-5-5") == {"input": 3}
    assert price_of("claude-sonnet-5-5-20261201") == {"input": 2}
    assert price_of("claude-opus-5") == {"input": 1}
    assert price_of("gpt-5") is None


@pytest.mark.parametrize(
    ("prices", "error"),
    [
        ([], "ALWAYSON_CLAUDE_PRICES: expected a JSON object of prices by model"),
        (
            {"claude-sonnet-5-5": {**SONNET, "output": "15"}},
            "ALWAYSON_CLAUDE_PRICES: claude-sonnet-5-5.output must be a number of USD per "
            "million tokens, not '15'",
        ),
        (
            {"claude-sonnet-5-5": {**SONNET, "cache_read": True}},
            "claude-sonnet-5-5.cache_read must be a number of USD per million tokens, not True",
        ),
        (
            {"claude-sonnet-5-5": {**SONNET, "cache_write": -3.75}},
            "ALWAYSON_CLAUDE_PRICES: claude-sonnet-5-5.cache_write must be 0 or more, not -3.75",
        ),
        (
            {"claude-haiku-5*": {**HAIKU, "cache_hit": 0.1}},
            "ALWAYSON_CLAUDE_PRICES: claude-haiku-5*: unknown kind(s) cache_hit; the kinds are "
            "input, output, cache_read, cache_write",
        ),
        (
            {"claude-haiku-5": {"input": 1, "output": 5}},
            "claude-haiku-5: no price for cache_read, cache_write (0 if it is free)",
        ),
        ({"claude-*-5": HAIKU}, "model 'claude-*-5': a model's name, or a prefix ending in one *"),
    ],
)
def test_malformed_prices_stop_start_up_naming_the_model_and_field(settings, prices, error):
    settings.ALWAYSON_CLAUDE_PRICES = prices

    with pytest.raises(ImproperlyConfigured) as raised:
        apps.get_app_config("alwayson_claude").ready()
    assert error in str(raised.value)
