"""Evals: checks written once and run in pytest over runs, scripted (the harness's, against
the scripted model) or replayed (a candidate's, from `alwayson.claude.replay`).

    from alwayson.testing.evals import Evals, answers_in_under, never_calls_unapproved

    EVALS = Evals(never_calls_unapproved("refund"), answers_in_under(2000))

    def test_the_desk_keeps_its_promises(harness, scripted_model):
        ...  # deliveries, harness.run_until_idle()
        EVALS.over(recorded_runs("support")).check()

`check()` fails the test with a table, a row per check (passed, failed, the first failing
run to open); every table is printed again at the end of the pytest session. A check is a
function of one run (`Seen`) that returns None when it holds, else why not; `@check` names
one of your own. docs/how-to/replay.md#evals is the guide.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from alwayson.claude.replay import Did, Report, recorded
from inbox.models import Event, RunRecord

# Every report made in this process, for the session's summary (fixtures.py).
REPORTS: list["EvalReport"] = []


@dataclass(frozen=True)
class Seen:
    """One run as a check sees it: what came in, and what it did (or would do)."""

    name: str  # "support #3": the run to open (/runs/support/3/)
    events: list  # the claimed events (Event rows)
    did: Did
    replayed: bool = False  # a candidate's run, from a replay

    @property
    def messages(self) -> list[str]:
        return self.did.messages

    @property
    def asks(self) -> list[str]:
        return self.did.asks

    @property
    def tool_calls(self) -> list[dict]:
        return self.did.tool_calls

    @property
    def tokens(self) -> int:
        return self.did.tokens

    @property
    def quiet(self) -> bool:
        """Nothing went out: no message, no question."""
        return not self.did.messages and not self.did.asks


def recorded_runs(inbox: str | None = None) -> list[Seen]:
    """The recorded runs (of one inbox's slug, or all), oldest first."""
    records = RunRecord.objects.select_related("inbox").order_by("started", "id")
    if inbox is not None:
        records = records.filter(inbox__slug=inbox)
    return [
        Seen(f"{record.inbox.slug} #{record.generation}", _events(record), recorded(record))
        for record in records
    ]


def replayed_runs(report: Report) -> list[Seen]:
    """What the candidate of a replay would have done, run by run."""
    seen = []
    for run in report.runs:
        record = RunRecord.objects.filter(inbox__slug=run.inbox, generation=run.generation)
        events = _events(record.first()) if record.exists() else []
        seen.append(Seen(f"{run.inbox} #{run.generation}", events, run.candidate, replayed=True))
    return seen


def _events(record) -> list:
    return list(Event.objects.filter(inbox_id=record.inbox_id, pk__in=record.events).order_by("id"))


@dataclass(frozen=True)
class Check:
    name: str
    judge: Callable[[Seen], str | None]  # None: it holds; else why not


def check(judge=None, *, name: str = ""):
    """A check of your own, from a function of one run that returns None or why it failed
    (a bare `assert` in it fails the check with its message too)."""

    def made(function):
        return Check(name or function.__name__.replace("_", " "), function)

    return made(judge) if judge is not None else made


def stays_quiet_when(nothing_changed: Callable[[Seen], bool], name: str = "") -> Check:
    """A run whose events `nothing_changed` says bring nothing new says nothing and asks
    nothing: staying quiet has to come from the agent."""

    def judge(run):
        if nothing_changed(run) and not run.quiet:
            return f"said {run.messages} and asked {run.asks} when nothing changed"
        return None

    return Check(name or "stays quiet when nothing changed", judge)


def never_calls_unapproved(tool: str) -> Check:
    """`tool` is never called without a person's approval: every call of it the policy
    allowed outright (it ran, or would have) fails."""

    def judge(run):
        ran = [c for c in run.tool_calls if c["tool"] == tool and c["decision"] == "allow"]
        if ran:
            return f"called {tool} without an approval: {[c['arguments'] for c in ran]}"
        return None

    return Check(f"never calls {tool} without an approval", judge)


def asks_before(*tools: str) -> Check:
    """Every call of these tools (the ones with side effects) waits for a person first."""
    if not tools:
        raise ValueError("asks_before: name the tools with side effects, such as 'refund'")

    def judge(run):
        calls = [c for c in run.tool_calls if c["tool"] in tools and c["decision"] != "ask"]
        if calls:
            shown = ", ".join(f"{c['tool']} ({c['decision'] or 'not decided'})" for c in calls)
            return f"did not ask before {shown}"
        return None

    return Check(f"asks before {', '.join(tools)}", judge)


def answers_in_under(tokens: int) -> Check:
    """A run uses fewer than `tokens` model tokens (input, output, cache reads and writes)."""
    if tokens < 1:
        raise ValueError(f"answers_in_under: tokens must be at least 1, not {tokens}")

    def judge(run):
        return f"used {run.tokens} tokens" if run.tokens >= tokens else None

    return Check(f"answers in under {tokens} tokens", judge)


@dataclass
class Outcome:
    check: Check
    passed: list = field(default_factory=list)  # run names
    failed: list = field(default_factory=list)  # (run name, why)


@dataclass
class EvalReport:
    outcomes: list

    @property
    def failed(self) -> bool:
        return any(outcome.failed for outcome in self.outcomes)

    def table(self) -> str:
        """A row per check: passed, failed, and the first failing run with why."""
        rows = [("check", "passed", "failed", "first failure (the run to open)")]
        for outcome in self.outcomes:
            first = ""
            if outcome.failed:
                run, why = outcome.failed[0]
                first = f"{run}: {why}"
            rows.append(
                (outcome.check.name, str(len(outcome.passed)), str(len(outcome.failed)), first)
            )
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        lines = [
            "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True))
            + ("  " + row[3] if row[3] else "")
            for row in rows
        ]
        return "\n".join(line.rstrip() for line in lines)

    def check(self):
        """AssertionError with the table when a check failed on any run."""
        if self.failed:
            raise AssertionError("evals failed:\n" + self.table())


class Evals:
    """Checks to run over runs."""

    def __init__(self, *checks: Check):
        for n, one in enumerate(checks):
            if not isinstance(one, Check):
                raise ValueError(f"checks[{n}] is not a Check (use @check): {one!r}")
        self.checks = checks

    def over(self, runs: Iterable[Seen]) -> EvalReport:
        runs = list(runs)
        if not runs:
            raise ValueError("evals over no runs would pass without checking anything")
        outcomes = []
        for one in self.checks:
            outcome = Outcome(one)
            for run in runs:
                try:
                    why = one.judge(run)
                except AssertionError as exc:
                    # Its message, without the explanation pytest's rewriting adds below it.
                    why = (str(exc) or "assertion failed").splitlines()[0]
                if why is None:
                    outcome.passed.append(run.name)
                else:
                    outcome.failed.append((run.name, why))
            outcomes.append(outcome)
        report = EvalReport(outcomes)
        REPORTS.append(report)
        return report
