"""Replay: recorded runs run again by a candidate (another agent, another configuration
revision) on the same events and the state each run started from, committing nothing.

Each replayed run runs in a transaction that is rolled back, as a SandboxRun whose effects
(messages, approvals, timers, the state) are never applied. A tool call the recorded run
made (the same tool and arguments for the same events) is answered from the journal
(ToolResult), as a retried run's is; any other runs a stub that records it as "would call".
A model call the recorded run made (the same request) is answered from its stored answer;
any other goes to the model and counts against the replay's budget. What the recorded run
did and what the candidate would do are compared run by run: docs/how-to/replay.md.
"""

import json
import math
import threading
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime

from django.db import transaction

from alwayson.runtime import versions
from alwayson.runtime.loading import load_agent
from alwayson.runtime.models import AgentConfig, AgentConfigRevision, SavedState
from alwayson.runtime.policy import ALLOW, DENY
from alwayson.runtime.sandbox import SandboxRun, stubbed_tools
from alwayson.runtime.tools import BUILTINS
from approvals.models import Approval
from approvals.services import Ask
from inbox.models import Event, RunRecord
from outbox.models import OutboxMessage
from outbox.services import Say
from timers.models import Timer
from timers.services import Schedule

from . import client
from .models import TOKEN_FIELDS, ModelCall, ModelSettings, ToolResult
from .prices import KINDS, cost

# What a replayed tool call that no recorded call answers returns, unless the command names
# another.
STUB = "(replay: this tool was not run; the replay stands in for it with this text)"
# What a candidate run and a recorded run are compared on, in the report's order.
COMPARED = ("outcome", "messages", "asks", "tool_calls", "timers")
# Each kind of token (TOKEN_FIELDS) as an answer's usage names it.
USAGE_KEYS = {
    "input": "input_tokens",
    "output": "output_tokens",
    "cache_read": "cache_read_input_tokens",
    "cache_write": "cache_creation_input_tokens",
}


_ONE_AT_A_TIME = threading.Lock()


class BudgetReached(Exception):
    """The replay's budget of model calls is spent: the run that needed one more stops, and
    so does the replay."""


@dataclass
class Did:
    """What a run did (recorded) or would do (candidate)."""

    outcome: str
    messages: list = field(default_factory=list)
    asks: list = field(default_factory=list)  # the approvals' actions
    tool_calls: list = field(default_factory=list)  # {"tool", "arguments", "decision", ...}
    timers: list = field(default_factory=list)  # the timers' keys
    model_calls: int = 0
    tokens: int = 0
    tokens_by_kind: dict = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    # In USD at ALWAYSON_CLAUDE_PRICES, each call at its model's; None when a model has no
    # price (those models in no_price).
    cost_usd: float | None = 0.0
    no_price: list = field(default_factory=list)
    error: str = ""

    @classmethod
    def used(cls, calls, **fields) -> "Did":
        """What `calls` used: each `(model, {kind: tokens})`."""
        by_kind = {kind: sum(tokens[kind] for _, tokens in calls) for kind in KINDS}
        spent, no_price = cost(calls)
        return cls(
            **fields,
            model_calls=len(calls),
            tokens=sum(by_kind.values()),
            tokens_by_kind=by_kind,
            cost_usd=spent,
            no_price=no_price,
        )

    def compared(self, name):
        if name == "tool_calls":
            return [(c["tool"], c["arguments"], c["decision"]) for c in self.tool_calls]
        return getattr(self, name)


@dataclass
class RunReplay:
    inbox: str
    generation: int
    started: datetime
    recorded_version: str
    candidate_version: str
    recorded: Did
    candidate: Did

    @property
    def differences(self) -> list[str]:
        return [
            name
            for name in COMPARED
            if self.recorded.compared(name) != self.candidate.compared(name)
        ]


@dataclass
class Report:
    runs: list = field(default_factory=list)
    budget: int = 0
    paid_calls: int = 0  # model calls sent to the model (not answered from a stored one)
    stopped: str = ""  # why the replay stopped before its last run
    not_replayed: int = 0

    def totals(self) -> dict:
        differing = Counter(name for run in self.runs for name in run.differences)
        return {
            "runs": len(self.runs),
            "differ": sum(1 for run in self.runs if run.differences),
            "by_difference": {name: differing[name] for name in COMPARED},
            "recorded_tokens": sum(run.recorded.tokens for run in self.runs),
            "candidate_tokens": sum(run.candidate.tokens for run in self.runs),
            "recorded_model_calls": sum(run.recorded.model_calls for run in self.runs),
            "candidate_model_calls": sum(run.candidate.model_calls for run in self.runs),
            **{
                f"{side}_{name}": value
                for side in ("recorded", "candidate")
                for name, value in _summed([getattr(run, side) for run in self.runs]).items()
            },
            "paid_model_calls": self.paid_calls,
            "budget": self.budget,
            "not_replayed": self.not_replayed,
            "stopped": self.stopped,
        }

    def as_json(self) -> dict:
        return {
            "runs": [
                {**asdict(run), "started": run.started.isoformat(), "differences": run.differences}
                for run in self.runs
            ],
            "totals": self.totals(),
        }

    def lines(self) -> list[str]:
        """The report in words: run by run, then the totals."""
        out = []
        for run in self.runs:
            verdict = "differs: " + ", ".join(run.differences) if run.differences else "same"
            out.append(
                f"{run.inbox} #{run.generation} ({run.started:%Y-%m-%d %H:%M:%S}): {verdict}"
            )
            out.append(f"  recorded  {run.recorded_version}")
            out.append(f"  candidate {run.candidate_version}")
            for name in COMPARED:
                recorded, candidate = run.recorded.compared(name), run.candidate.compared(name)
                mark = " " if recorded == candidate else "*"
                out.append(f" {mark}{name:<11} recorded: {_listed(run.recorded, name)}")
                if recorded != candidate:
                    out.append(f"  {'':<11} candidate: {_listed(run.candidate, name)}")
            out.append(
                f"  tokens     recorded: {run.recorded.tokens} ({run.recorded.model_calls} calls)"
                f", candidate: {run.candidate.tokens} ({run.candidate.model_calls} calls)"
            )
            out.append(f"  by kind    recorded: {_kinds(run.recorded.tokens_by_kind)}")
            out.append(f"  {'':<11}candidate: {_kinds(run.candidate.tokens_by_kind)}")
            out.append(
                f"  cost       recorded: {_usd(run.recorded.cost_usd, run.recorded.no_price)}, "
                f"candidate: {_usd(run.candidate.cost_usd, run.candidate.no_price)}"
            )
            if run.candidate.error:
                out.append(f"  candidate error: {run.candidate.error}")
        totals = self.totals()
        by = ", ".join(f"{name} {n}" for name, n in totals["by_difference"].items())
        out.append(
            f"total: {totals['runs']} run(s) replayed, {totals['differ']} differ ({by}); "
            f"tokens recorded {totals['recorded_tokens']}, candidate "
            f"{totals['candidate_tokens']}; model calls paid {self.paid_calls} of budget "
            f"{self.budget}"
        )
        out.append(
            f"total tokens by kind: recorded {_kinds(totals['recorded_tokens_by_kind'])}; "
            f"candidate {_kinds(totals['candidate_tokens_by_kind'])}"
        )
        out.append(
            "total cost: recorded "
            f"{_usd(totals['recorded_cost_usd'], totals['recorded_no_price'])}, candidate "
            f"{_usd(totals['candidate_cost_usd'], totals['candidate_no_price'])}"
        )
        if self.stopped:
            out.append(f"stopped: {self.stopped}; {self.not_replayed} run(s) not replayed")
        return out


def _summed(dids: list[Did]) -> dict:
    """The runs' tokens by kind and cost summed; the cost None when a run's is unknown."""
    no_price = sorted({model for d in dids for model in d.no_price})
    return {
        "tokens_by_kind": {kind: sum(d.tokens_by_kind[kind] for d in dids) for kind in KINDS},
        "cost_usd": None if no_price else math.fsum(d.cost_usd for d in dids),
        "no_price": no_price,
    }


def _kinds(tokens: dict) -> str:
    return ", ".join(f"{kind.replace('_', ' ')} {tokens[kind]}" for kind in KINDS)


def _usd(amount, no_price) -> str:
    if amount is None:
        return "no price for " + ", ".join(no_price)
    return f"${amount:.6f}"


def _shown(value) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def _listed(did: Did, name: str) -> str:
    """One compared thing in words; a tool call as `tool {arguments} decision`, and how the
    replay answered it: from the journal, or a stub standing in ("would call")."""
    if name != "tool_calls":
        return _shown(did.compared(name))
    calls = [
        f"{c['tool']} {_shown(c['arguments'])} {c['decision'] or '?'}"
        + (f" ({c['answered']})" if c.get("answered") else "")
        for c in did.tool_calls
    ]
    return "; ".join(calls) or "none"


# --- which runs ------------------------------------------------------------------------------


def recorded_runs(
    *,
    inboxes=(),
    since=None,
    until=None,
    outcomes=(),
    agent="",
    code="",
    config_revision=None,
):
    """The records to replay, oldest first: of these inbox slugs, started in [since, until),
    with these outcomes (default: done, error, deferred: a refused or lost run committed
    nothing to compare), run by this version (alwayson/runtime/versions.py)."""
    records = RunRecord.objects.select_related("inbox").order_by("started", "id")
    if inboxes:
        records = records.filter(inbox__slug__in=inboxes)
    if since is not None:
        records = records.filter(started__gte=since)
    if until is not None:
        records = records.filter(started__lt=until)
    known = set(RunRecord.Outcome.values)
    unknown = sorted(set(outcomes) - known)
    if unknown:
        raise ValueError(f"outcome: {', '.join(unknown)} is not one of {', '.join(sorted(known))}")
    done = (RunRecord.Outcome.DONE, RunRecord.Outcome.ERROR, RunRecord.Outcome.DEFERRED)
    records = records.filter(outcome__in=outcomes or done)
    if agent:
        records = records.filter(produced__version__agent=agent)
    if code:
        records = records.filter(produced__version__code=code)
    if config_revision is not None:
        records = records.filter(produced__version__config=config_revision)
    return records


# --- what the recorded run did ---------------------------------------------------------------


def recorded(record: RunRecord) -> Did:
    inbox_id, generation = record.inbox_id, record.generation
    calls = list(ModelCall.objects.of_run(inbox_id, generation))
    journal = {
        (row.tool, _canonical(row.arguments)): row.decision
        for row in ToolResult.objects.of_run(inbox_id, generation)
    }
    approvals = list(Approval.objects.filter(inbox_id=inbox_id, generation=generation))
    asked = {
        (a.details.get("tool"), _canonical(a.details.get("arguments") or {})) for a in approvals
    }
    tool_calls = []
    for call in calls:
        for block in _tool_uses(call.response):
            arguments = block.get("input") or {}
            key = (block["name"], _canonical(arguments))
            if block["name"] in BUILTINS:
                decision = ALLOW
            elif key in journal:
                decision = journal[key]
            else:
                decision = "ask" if key in asked else ""
            tool_calls.append(_call(block["name"], arguments, decision))
    return Did.used(
        [(call.model, {k: getattr(call, f) for k, f in TOKEN_FIELDS.items()}) for call in calls],
        outcome=record.outcome,
        messages=list(
            OutboxMessage.objects.of_run(inbox_id, generation).values_list("body", flat=True)
        ),
        asks=[a.action for a in sorted(approvals, key=lambda a: a.pk)],
        tool_calls=tool_calls,
        timers=list(
            Timer.objects.filter(inbox_id=inbox_id, generation=generation)
            .order_by("id")
            .values_list("key", flat=True)
        ),
        error=record.error,
    )


# --- what the candidate would do -------------------------------------------------------------


class ModelMeter:
    """The model calls of a replay: each answer kept, each call the recorded runs did not
    make (no stored answer) counted against `budget`."""

    def __init__(self, budget: int):
        self.budget = budget
        self.paid = 0
        self.answers = []
        self.models = []  # each answer's model: the answer's name for it, else the request's

    def call(self, send, run, request, _inbox_budget):
        key = client.request_key(request)
        stored = ModelCall.objects.filter(inbox_id=run.inbox.pk, request_key=key).exists()
        if not stored:
            if self.paid >= self.budget:
                raise BudgetReached(f"the budget of {self.budget} model call(s) is spent")
            self.paid += 1
        # The inbox's daily budget is for its live runs: a replay's is the one above.
        answer = send(run, request, None)
        self.answers.append(answer)
        # As client._store keeps it, so the candidate's calls are priced as recorded ones are.
        self.models.append(str(answer.get("model") or request.get("model") or ""))
        return answer


def replay(
    records,
    *,
    agent: str = "",
    revision: AgentConfigRevision | None = None,
    budget: int,
    stub: str = STUB,
) -> Report:
    """Each record's run replayed by the candidate (`agent`, a dotted path, and/or the
    configuration `revision`; each defaults to what the run had), committing nothing."""
    if budget < 0:
        raise ValueError(f"budget must be at least 0 model calls, not {budget}")
    report = Report(budget=budget)
    records = list(records)
    meter = ModelMeter(budget)
    # The stubs and the meter stand in for the process's tools and model calls while a run
    # is replayed: two replays at once (the staff page's requests) would each put back what
    # the other stood in for.
    with _ONE_AT_A_TIME:
        _replay_all(records, agent, revision, meter, stub, report)
    report.paid_calls = meter.paid
    return report


def _replay_all(records, agent, revision, meter, stub, report):
    for n, record in enumerate(records):
        if revision is not None and revision.inbox_id != record.inbox_id:
            raise ValueError(
                f"config revision: revision {revision.number} is of another inbox than "
                f"{record.inbox.slug}; replay one inbox's runs with it"
            )
        try:
            report.runs.append(_replay_one(record, agent, revision, meter, stub))
        except BudgetReached as exc:
            report.stopped = f"{exc} at {record.inbox.slug} #{record.generation}"
            report.not_replayed = len(records) - n
            break


def _replay_one(record, agent_path, revision, meter: ModelMeter, stub) -> RunReplay:
    inbox = record.inbox
    ran = (record.produced or {}).get("version") or {}
    with transaction.atomic():
        config = _candidate_config(inbox, revision)
        path = agent_path or config.agent or ran.get(versions.AGENT) or ""
        agent = load_agent(path or None, field="agent")
        events = list(Event.objects.filter(inbox=inbox, pk__in=record.events).order_by("id"))
        journal = Counter(
            (row.tool, _canonical(row.arguments))
            for row in ToolResult.objects.filter(inbox=inbox, events__in=record.events).distinct()
        )
        run = SandboxRun(
            inbox, record.generation, events, SavedState.before(inbox.pk, record.generation)
        )
        answers_before = len(meter.answers)
        error = ""
        with stubbed_tools(stub) as would_call, _metered(meter):
            try:
                with transaction.atomic():
                    agent(run)
            except BudgetReached:
                raise
            except Exception as exc:  # the candidate's failure is what the report shows
                error = f"{type(exc).__name__}: {exc}"
        answers = meter.answers[answers_before:]
        models = meter.models[answers_before:]
        candidate = _candidate_did(run, error, answers, models, journal, would_call, inbox)
        transaction.set_rollback(True)
    candidate_version = versions.label(
        versions.version(path or versions.dotted_path(agent), agent, config.revision or None)
    )
    if revision is not None:
        candidate_version += (
            f" (revision {revision.number}{', proposed' if revision.proposed else ''})"
        )
    return RunReplay(
        inbox=inbox.slug,
        generation=record.generation,
        started=record.started,
        recorded_version=versions.label(ran) or "(not recorded)",
        candidate_version=candidate_version,
        recorded=recorded(record),
        candidate=candidate,
    )


def _candidate_config(inbox, revision) -> AgentConfig:
    """The inbox's configuration as the candidate runs it, written inside the replay's
    transaction (rolled back) so the agent reads it as it reads its own."""
    config = AgentConfig.objects.filter(inbox=inbox).first()
    if revision is None:
        return config or AgentConfig(inbox=inbox)
    if config is None:
        config = revision.applied_to(AgentConfig(inbox=inbox))
        config.revision = revision.number
        AgentConfig.objects.bulk_create([config])
    else:
        revision.applied_to(config)
        config.revision = revision.number
        fields = {name: getattr(config, name) for name in AgentConfig.REVISED_FIELDS}
        AgentConfig.objects.filter(inbox=inbox).update(revision=revision.number, **fields)
    sent = revision.config.get("model_settings")
    if sent is not None:
        ModelSettings.objects.update_or_create(config_id=inbox.pk, defaults=sent)
    return config


class _metered:
    """client.call through the meter while inside: the runner calls the module's `call`."""

    def __init__(self, meter: ModelMeter):
        self.meter = meter

    def __enter__(self):
        self.original = client.call
        original, meter = self.original, self.meter
        client.call = lambda run, request, budget: meter.call(original, run, request, budget)

    def __exit__(self, *exc):
        client.call = self.original


def _candidate_did(run, error, answers, models, journal: Counter, would_call, inbox) -> Did:
    from .runner import AgentSettings, verdict  # the runner imports the models

    effects = run.recorded_effects()
    tool_calls = []
    if answers:
        config = AgentSettings.of(inbox)
        stubbed = Counter((c["tool"], _canonical(c["arguments"])) for c in would_call)
        for answer in answers:
            for block in _tool_uses(answer):
                name, arguments = block["name"], block.get("input") or {}
                tool = config.tools.get(name)
                if tool is None or tool.check_input(arguments):
                    tool_calls.append(_call(name, arguments, "refused"))
                    continue
                decision = verdict(config, tool, arguments).verdict
                key = (name, _canonical(arguments))
                answered = ""
                if name not in BUILTINS and decision != DENY:
                    if journal[key]:
                        journal[key] -= 1
                        answered = "journal"
                    elif stubbed[key]:
                        stubbed[key] -= 1
                        answered = "would call"
                tool_calls.append(_call(name, arguments, decision, answered))
    outcome = "error" if error else "deferred" if run.deferred else "done"
    return Did.used(
        [(model, _usage(answer)) for model, answer in zip(models, answers, strict=True)],
        outcome=outcome,
        messages=[e.body for e in effects if isinstance(e, Say)],
        asks=[e.action for e in effects if isinstance(e, Ask)],
        tool_calls=tool_calls,
        timers=[e.key for e in effects if isinstance(e, Schedule)],
        error=error,
    )


def _call(tool, arguments, decision, answered="") -> dict:
    call = {"tool": tool, "arguments": arguments, "decision": decision}
    if answered:
        call["answered"] = answered
    return call


def _tool_uses(answer) -> list[dict]:
    content = (answer or {}).get("content") or []
    return [block for block in content if block.get("type") == "tool_use"]


def _usage(answer) -> dict:
    """An answer's tokens by kind."""
    usage = (answer or {}).get("usage") or {}
    return {kind: usage.get(key) or 0 for kind, key in USAGE_KEYS.items()}


def _canonical(arguments) -> str:
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
