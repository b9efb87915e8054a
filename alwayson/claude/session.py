"""The Claude agent's part of an inbox's session state (Run.state["claude"]), as types: the
transcript, the turn whose calls wait for people's answers, the events held for it, the
outage count and the budget notice.

Stored as JSON under the keys it has always had ("runs", "pending", "held", "api_failures",
"budget_notice"), so a session saved by an earlier version reads, including a turn saved
when one call was asked at a time.
"""

import copy
from dataclasses import dataclass, field

from approvals.models import APPROVAL_SOURCE

# The agent's key in the inbox's session state.
STATE_KEY = "claude"


@dataclass
class Answer:
    """A person's answer to an asked call (or its expiry): the approval's request id and the
    answer event's payload, as the approvals wrote it."""

    request_id: str
    payload: object

    @classmethod
    def from_state(cls, state: dict) -> "Answer":
        return cls(state["request_id"], state["payload"])

    def to_state(self) -> dict:
        return {"request_id": self.request_id, "payload": self.payload}


@dataclass
class WaitingTurn:
    """A turn of the model whose calls wait for people: from the first call the policy asked,
    every call of the turn, resumed in order once each asked one has its answer."""

    # The tool_result blocks of the turn's calls before the first asked one.
    results: list[dict]
    # The tool_use blocks from the first asked call on.
    remaining: list[dict]
    # Tool-use id -> the request id of its approval, while unanswered.
    waiting: dict[str, str]
    # Tool-use id -> its approval's answer, once it arrived.
    answers: dict[str, Answer] = field(default_factory=dict)
    # Tool-use id -> why the policy asked, for the call's journal row.
    reasons: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_state(cls, state: dict) -> "WaitingTurn":
        if "waiting" not in state:
            # Saved by a version that asked one call at a time: {"request_id", "call",
            # "results", "remaining"}, the asked call apart from those after it.
            call = state["call"]
            return cls(
                results=state["results"],
                remaining=[call, *state["remaining"]],
                waiting={call["id"]: state["request_id"]},
            )
        return cls(
            results=state["results"],
            remaining=state["remaining"],
            waiting=state["waiting"],
            answers={key: Answer.from_state(value) for key, value in state["answers"].items()},
            # Absent from a turn saved before the journal kept why a call was asked.
            reasons=state.get("reasons", {}),
        )

    def to_state(self) -> dict:
        return {
            "results": self.results,
            "remaining": self.remaining,
            "waiting": self.waiting,
            "answers": {key: answer.to_state() for key, answer in self.answers.items()},
            "reasons": self.reasons,
        }

    def take_answers(self, events) -> list:
        """Record the answers among `events` to the calls still waiting; the events that
        answered one."""
        asked = {request_id: tool_use_id for tool_use_id, request_id in self.waiting.items()}
        answered = [e for e in events if e.source == APPROVAL_SOURCE and e.source_id in asked]
        for event in answered:
            tool_use_id = asked[event.source_id]
            self.answers[tool_use_id] = Answer(event.source_id, event.payload)
            del self.waiting[tool_use_id]
        return answered

    @property
    def lead_request_id(self) -> str:
        """The request id of the first asked call's approval: the resumed calls take their
        keys from its answer."""
        return self.answers[self.remaining[0]["id"]].request_id


@dataclass
class ClaudeSession:
    """The agent's session: read with `from_state` at the start of a run, a copy the run works
    on; written back with `to_state` when the run completes, asks or defers."""

    # The transcript: each run's exchange, a list of messages.
    runs: list[list[dict]] = field(default_factory=list)
    # Stored as "pending".
    turn: WaitingTurn | None = None
    # The events (as the model reads them) that arrived while the turn's calls waited.
    held: list[dict] = field(default_factory=list)
    # Model API failures in a row, for the outage backoff.
    api_failures: int = 0
    # The UTC day whose spent budget the owner was told of.
    budget_notice: str | None = None
    # Keys this version does not know, kept as they were.
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_state(cls, state: dict | None) -> "ClaudeSession":
        state = copy.deepcopy(state or {})
        pending = state.pop("pending", None)
        return cls(
            runs=state.pop("runs", []),
            turn=None if pending is None else WaitingTurn.from_state(pending),
            held=state.pop("held", []),
            api_failures=state.pop("api_failures", 0),
            budget_notice=state.pop("budget_notice", None),
            extra=state,
        )

    def to_state(self) -> dict:
        """The JSON to store; what is empty is left out."""
        state = dict(self.extra)
        if self.runs:
            state["runs"] = self.runs
        if self.turn is not None:
            state["pending"] = self.turn.to_state()
        if self.held:
            state["held"] = self.held
        if self.api_failures:
            state["api_failures"] = self.api_failures
        if self.budget_notice is not None:
            state["budget_notice"] = self.budget_notice
        return state
