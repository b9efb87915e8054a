"""The Claude agent's session state as types (alwayson/claude/session.py): what a run stores
reads back as it was, and every shape an earlier version stored still reads. The agent
resuming such sessions end to end: tests/claude/test_claude_approvals.py."""

import copy
from types import SimpleNamespace

import pytest

from alwayson.claude.session import Answer, ClaudeSession, WaitingTurn

REFUND = {"type": "tool_use", "id": "toolu_1", "name": "refund", "input": {"order": "7"}}
LOOKUP = {"type": "tool_use", "id": "toolu_2", "name": "lookup_order", "input": {"order": "7"}}
WIPE = {"type": "tool_use", "id": "toolu_3", "name": "delete_account", "input": {"id": "a"}}
SENT = {"type": "tool_result", "tool_use_id": "toolu_0", "content": "Sent."}
RUNS = [
    [
        {"role": "user", "content": [{"type": "text", "text": "<events>…</events>"}]},
        {"role": "assistant", "content": [REFUND, LOOKUP, WIPE]},
    ]
]
HELD = [{"type": "text", "text": "<event source='chat'>and one more</event>"}]

# A turn waiting for one call of three, the first answered.
WAITING = {
    "runs": RUNS,
    "pending": {
        "results": [SENT],
        "remaining": [REFUND, LOOKUP, WIPE],
        "waiting": {"toolu_3": "delete_account-toolu_3"},
        "answers": {
            "toolu_1": {
                "request_id": "refund-toolu_1",
                "payload": {"answer": "yes", "answered_by": "dana"},
            }
        },
        "reasons": {"toolu_1": "refund rule 2", "toolu_3": "delete_account: ask"},
    },
    "held": HELD,
    "budget_notice": "2026-12-01",
}
# As this version stores them.
CURRENT = [
    pytest.param({}, id="empty"),
    pytest.param({"runs": RUNS}, id="transcript"),
    pytest.param({"runs": RUNS, "api_failures": 3}, id="failing"),
    pytest.param({"budget_notice": "2026-12-01", "api_failures": 1}, id="budget-notice"),
    pytest.param(WAITING, id="waiting-turn"),
    pytest.param({"runs": RUNS, "someday": {"kept": True}}, id="unknown-key"),
]


@pytest.mark.parametrize("state", CURRENT)
def test_a_stored_session_reads_and_is_stored_again_as_it_was(state):
    stored = copy.deepcopy(state)
    assert ClaudeSession.from_state(state).to_state() == stored
    assert state == stored


def test_the_session_is_a_copy_of_the_stored_state():
    state = copy.deepcopy(WAITING)
    session = ClaudeSession.from_state(state)
    session.runs[0].append({"role": "user", "content": "more"})
    session.turn.waiting.clear()
    assert len(state["runs"][0]) == 2
    assert state["pending"]["waiting"] == {"toolu_3": "delete_account-toolu_3"}


def test_a_waiting_turn_reads_as_types():
    session = ClaudeSession.from_state(WAITING)
    turn = session.turn
    assert turn.remaining == [REFUND, LOOKUP, WIPE]
    assert turn.answers == {
        "toolu_1": Answer("refund-toolu_1", {"answer": "yes", "answered_by": "dana"})
    }
    assert turn.lead_request_id == "refund-toolu_1"
    assert (session.held, session.budget_notice, session.api_failures) == (HELD, "2026-12-01", 0)


def test_nothing_stored_reads_as_a_new_session():
    for state in (None, {}):
        session = ClaudeSession.from_state(state)
        assert session == ClaudeSession()
        assert (session.runs, session.turn, session.held) == ([], None, [])
        assert session.to_state() == {}


def test_a_turn_saved_when_one_call_was_asked_at_a_time_reads_as_a_waiting_turn():
    old = {
        "runs": RUNS,
        "pending": {
            "request_id": "refund-toolu_1",
            "call": REFUND,
            "results": [SENT],
            "remaining": [LOOKUP, WIPE],
        },
        "held": HELD,
    }
    session = ClaudeSession.from_state(old)
    assert session.turn == WaitingTurn(
        results=[SENT],
        remaining=[REFUND, LOOKUP, WIPE],
        waiting={"toolu_1": "refund-toolu_1"},
        answers={},
        reasons={},
    )
    assert session.held == HELD
    # Stored again in this version's shape, which reads back the same.
    again = session.to_state()
    assert again["pending"] == {
        "results": [SENT],
        "remaining": [REFUND, LOOKUP, WIPE],
        "waiting": {"toolu_1": "refund-toolu_1"},
        "answers": {},
        "reasons": {},
    }
    assert ClaudeSession.from_state(again) == session


def test_a_turn_saved_before_the_journal_kept_why_it_asked_reads_with_no_reasons():
    old = {
        "results": [],
        "remaining": [REFUND],
        "waiting": {"toolu_1": "refund-toolu_1"},
        "answers": {},
    }
    turn = WaitingTurn.from_state(old)
    assert turn.reasons == {}
    assert turn.to_state() == old | {"reasons": {}}


def event(source, source_id, payload=None):
    return SimpleNamespace(source=source, source_id=source_id, payload=payload or {})


def test_answers_are_taken_from_the_approval_events_of_the_calls_that_wait():
    turn = WaitingTurn(
        results=[],
        remaining=[REFUND, WIPE],
        waiting={"toolu_1": "refund-toolu_1", "toolu_3": "delete_account-toolu_3"},
    )
    events = [
        event("chat", "m1", {"text": "hello"}),
        event("approval", "refund-toolu_1", {"answer": "no"}),
        event("approval", "someone-else", {"answer": "yes"}),
        event("webhook", "refund-toolu_1"),  # the same id from another source answers nothing
    ]

    answered = turn.take_answers(events)

    assert answered == [events[1]]
    assert turn.waiting == {"toolu_3": "delete_account-toolu_3"}
    assert turn.answers == {"toolu_1": Answer("refund-toolu_1", {"answer": "no"})}
    assert turn.lead_request_id == "refund-toolu_1"
    assert turn.take_answers([event("approval", "delete_account-toolu_3")]) != []
    assert turn.waiting == {}
