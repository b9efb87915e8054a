"""Issue 25's goals, each beside what this run measured, printed after the table.

A goal is on a ratio of rows of the table (found by their `key`); where a row was measured
under several statistics phases the worst phase counts ("any statistics"). A goal whose rows
did not run (another `--only`, or a measure this suite does not have yet) says so.
"""

from dataclasses import dataclass

from . import common

NOT_MEASURED = "not measured"


@dataclass(frozen=True)
class Ratio:
    """alwayson / reference of row `key`, at least `threshold`."""

    measure: str
    key: str
    threshold: float
    goal: str

    def value(self, rows):
        return _worst(
            (entry.get("phase"), entry.get("ratio"))
            for entry in rows
            if entry.get("key") == self.key
        )


@dataclass(frozen=True)
class Between:
    """alwayson of row `key` over alwayson of row `other` in the same phase, at least
    `threshold`: one way of calling against another (by slug against by id)."""

    measure: str
    key: str
    other: str
    threshold: float
    goal: str

    def value(self, rows):
        others = {entry.get("phase"): entry for entry in rows if entry.get("key") == self.other}
        pairs = []
        for entry in rows:
            if entry.get("key") == self.key and entry.get("phase") in others:
                theirs = others[entry.get("phase")].get("alwayson")
                ours = entry.get("alwayson")
                pairs.append((entry.get("phase"), ours / theirs if ours and theirs else None))
        return _worst(pairs)


@dataclass(frozen=True)
class Elsewhere:
    """A goal another benchmark (or a later row) measures."""

    measure: str
    goal: str
    where: str
    threshold: float = None

    def value(self, rows):
        return None, None


@dataclass(frozen=True)
class Live:
    """A live-page row of bench/live.py (its `measure` starts with `row`), judged by `check`
    on its figures and shown by `show`: latencies and idle cost are not ratios."""

    measure: str
    row: str
    goal: str
    check: object
    show: object

    def judged(self, rows):
        """(what was measured, "yes"/"no"), or None when the live rows did not run."""
        for entry in rows:
            if str(entry.get("measure", "")).startswith(self.row):
                return self.show(entry), "yes" if self.check(entry) else "no"
        return None


def _worst(pairs):
    """(the lowest ratio, the phase it was measured in); (None, None) without any."""
    found = [(ratio, phase) for phase, ratio in pairs if ratio is not None]
    if not found:
        return None, None
    ratio, phase = min(found, key=lambda pair: pair[0])
    return ratio, phase


GOALS = (
    Ratio(
        "ingest by slug, 1 connection, 100 inboxes, any statistics",
        "ingest.slug.1",
        0.9,
        ">= 0.9 x raw psycopg",
    ),
    Between(
        "ingest by slug vs by id, 1 connection",
        "ingest.slug.1",
        "ingest.id.1",
        0.9,
        "within 10 % of by id",
    ),
    Ratio(
        "ingest by slug, 8 connections, 100 inboxes, any statistics",
        "ingest.slug.8",
        0.9,
        ">= 0.9 x raw psycopg",
    ),
    Between(
        "ingest by slug vs by id, 8 connections",
        "ingest.slug.8",
        "ingest.id.8",
        0.9,
        "within 10 % of by id",
    ),
    Ratio("duplicate by slug, any statistics", "duplicate.slug", 0.9, ">= 0.9 x raw psycopg"),
    Ratio(
        "webhook (GitHub, by slug, signed) through gunicorn",
        "web.webhook",
        0.8,
        ">= 0.8 x same-shape view",
    ),
    Ratio("chat form post through gunicorn", "web.chat", 0.8, ">= 0.8 x same-shape view"),
    Ratio("approval answer post through gunicorn", "web.answer", 0.8, ">= 0.8 x same-shape view"),
    Live(
        "live page: agent reply visible after its commit",
        "reply visible after commit, pushed",
        "p50 <= 150 ms, p99 <= 500 ms",
        lambda entry: entry["p50_ms"] <= 150 and entry["p99_ms"] <= 500,
        lambda entry: f"p50 {entry['p50_ms']:.0f} ms, p99 {entry['p99_ms']:.0f} ms",
    ),
    Live(
        "500 idle conversation pages, one web process",
        "500 idle streams",
        "<= 10 % of a core, 0 queries/s",
        lambda entry: entry["cpu_percent"] <= 10 and entry["web_statements_per_s"] == 0,
        lambda entry: (
            f"{entry['cpu_percent']:.1f} % of a core, {entry['web_statements_per_s']:.2f} queries/s"
        ),
    ),
    Ratio("drain, 10 events per inbox, vs procrastinate", "drain.x10", 5, ">= 5 x procrastinate"),
    Ratio("drain, 1 event per inbox, vs procrastinate", "drain.x1", 1.8, ">= 1.8 x procrastinate"),
    # Issue 26: the goals above are with run records on; recording costs no round trip.
    Ratio("drain x10, run records on vs off", "drain.x10.records", 0.9, ">= 0.9 x records off"),
    Ratio("drain x1, run records on vs off", "drain.x1.records", 0.9, ">= 0.9 x records off"),
    Elsewhere(
        "NOTIFY wake, run cycle at 1M events, worker memory",
        "stay where they are",
        "python -m bench.steady",
    ),
)


def evaluate(rows, goals=GOALS) -> list[dict]:
    """Each goal: the measured value (text), the goal, and "yes", "no" or "not measured"."""
    lines = []
    for goal in goals:
        if isinstance(goal, Live):
            judged = goal.judged(rows)
            shown, met = judged or ("- (not in this run)", NOT_MEASURED)
            lines.append({"measure": goal.measure, "value": shown, "goal": goal.goal, "met": met})
            continue
        value, phase = goal.value(rows)
        if value is None:
            where = getattr(goal, "where", None)
            lines.append(
                {
                    "measure": goal.measure,
                    "value": f"- ({where})" if where else "- (not in this run)",
                    "goal": goal.goal,
                    "met": NOT_MEASURED,
                }
            )
            continue
        shown = f"{value:.2f}" + (f" (worst: {phase} statistics)" if phase else "")
        lines.append(
            {
                "measure": goal.measure,
                "value": shown,
                "ratio": value,
                "goal": goal.goal,
                "met": "yes" if value >= goal.threshold else "no",
            }
        )
    return lines


def print_goals(lines, out=None) -> None:
    common.print_grid(
        ["goal", "measured", "target", "met"],
        [[line["measure"], line["value"], line["goal"], line["met"]] for line in lines],
        out,
    )
