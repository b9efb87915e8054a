"""Issue 36's goals (and issue 25's that stay), each beside what this run measured, printed
after the table.

A goal is on a ratio of rows of the table (found by their `key`); where a row was measured
under several statistics phases the worst phase counts ("any statistics"). The live rows'
latencies and costs, the p99s and the limits' answers are judged on their own figures. A goal
whose rows did not run (another `--only`) says so.
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
class Worst:
    """The largest `field` of the rows whose key is in `keys` (every phase), at most
    `limit`: a p99 against its reference's under the same load."""

    measure: str
    keys: tuple
    field: str
    limit: float
    goal: str

    def judged(self, rows):
        found = [
            (entry[self.field], entry)
            for entry in rows
            if entry.get("key") in self.keys and entry.get(self.field) is not None
        ]
        if not found:
            return None
        value, entry = max(found, key=lambda pair: pair[0])
        where = ", ".join(
            part
            for part in (
                f"{entry['connections']} connections" if entry.get("connections") else "",
                f"{entry['phase']} statistics" if entry.get("phase") else "",
            )
            if part
        )
        return f"{value:.2f}" + (f" (worst: {where})" if where else ""), (
            "yes" if value <= self.limit else "no"
        )


@dataclass(frozen=True)
class Judged:
    """Rows whose key is `key` or starts with `key` + "." (a live row of bench/live.py, the
    limits of bench/limits.py), each judged by `check` (True, False, or a word on why it
    cannot be judged: fewer streams than the goal's) and shown by `show`: latencies, costs
    and answers are not ratios. Met when every such row is."""

    measure: str
    key: str
    goal: str
    check: object
    show: object

    def judged(self, rows):
        """(what was measured, "yes"/"no"), or None when the rows did not run."""
        found = [
            entry
            for entry in rows
            if entry.get("key") == self.key or str(entry.get("key", "")).startswith(self.key + ".")
        ]
        if not found:
            return None
        shown = "; ".join(self.show(entry) for entry in found)
        verdicts = [self.check(entry) for entry in found]
        words = [verdict for verdict in verdicts if isinstance(verdict, str)]
        if not all(verdicts):
            return shown, "no"
        return shown, words[0] if words else "yes"


def _worst(pairs):
    """(the lowest ratio, the phase it was measured in); (None, None) without any."""
    found = [(ratio, phase) for phase, ratio in pairs if ratio is not None]
    if not found:
        return None, None
    ratio, phase = min(found, key=lambda pair: pair[0])
    return ratio, phase


def _http(name, title, threshold, goal):
    return tuple(
        Ratio(f"{title}, {n} connections, any statistics", f"web.{name}.{n}", threshold, goal)
        for n in (4, 16)
    )


def _keys(name):
    return tuple(f"web.{name}.{n}" for n in (4, 16))


STREAMS_GOAL = 500  # streams the goals on open streams are for (quick mode holds fewer)


def _at_scale(entry, met) -> bool | str:
    if entry["streams"] < STREAMS_GOAL:
        return f"at {entry['streams']} streams only"
    return met


def _limit(entry) -> str:
    from bench import limits

    return f"{entry['measure'].split(': ', 1)[-1]}: {limits.shown(entry['production'])}"


GOALS = (
    # Issue 25's, kept where they are.
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
    # Issue 36's: the web tier as users meet it (bench/web.py, bench/limits.py, bench/live.py).
    *_http("webhook", "webhook by slug (signed), production web", 0.9, ">= 0.9 x gunicorn sync"),
    *_http("chat", "chat form post, production web", 0.9, ">= 0.9 x gunicorn sync"),
    *_http("answer", "answer post, production web", 0.8, ">= 0.8 x same-shape view"),
    Worst("p99 of the webhook", _keys("webhook"), "p99_ratio", 1.5, "<= 1.5 x gunicorn sync's"),
    Worst("p99 of the chat form post", _keys("chat"), "p99_ratio", 1.5, "<= 1.5 x gunicorn sync's"),
    Worst(
        "p99 of the answer post", _keys("answer"), "p99_ratio", 1.5, "<= 1.5 x same-shape view's"
    ),
    Judged(
        "50 open pages (Chromium): reply visible after its commit",
        "live.pages",
        "p50 <= 150 ms, p99 <= 500 ms",
        lambda entry: entry["p50_ms"] <= 150 and entry["p99_ms"] <= 500,
        lambda entry: f"p50 {entry['p50_ms']:.0f} ms, p99 {entry['p99_ms']:.0f} ms",
    ),
    Judged(
        "open streams: web CPU per change, in all",
        "live.streams",
        f"<= 50 ms at {STREAMS_GOAL} streams",
        lambda entry: _at_scale(entry, entry["cpu_ms_per_change"] <= 50),
        lambda entry: f"{entry['cpu_ms_per_change']:.0f} ms at {entry['streams']} streams",
    ),
    Judged(
        "open streams: statements per page per change",
        "live.streams",
        "0 (below 0.01)",
        lambda entry: entry["statements_per_page_per_change"] < 0.01,
        lambda entry: (
            f"{entry['statements_per_page_per_change']:.3f}"
            f" ({entry['statements_per_change']:.1f} per change at {entry['streams']} streams,"
            f" {entry.get('processes_reading', '?')} processes reading)"
        ),
    ),
    Judged(
        "open streams: a change reaches every stream",
        "live.streams",
        f"p99 <= 1 s at {STREAMS_GOAL} streams",
        lambda entry: _at_scale(entry, entry["p99_ms"] <= 1000 and entry["missed"] == 0),
        lambda entry: (
            f"p99 {entry['p99_ms']:.0f} ms at {entry['streams']} streams"
            + (f", {entry['missed']} never reached" if entry["missed"] else "")
        ),
    ),
    Judged(
        "idle open streams",
        "live.idle",
        f"0 statements, <= 2 % of a core at {STREAMS_GOAL}",
        lambda entry: _at_scale(entry, entry["statements"] == 0 and entry["cpu_percent"] <= 2),
        lambda entry: (
            f"{entry['cpu_percent']:.1f} % of a core, {entry['statements']} statements"
            f" ({entry['streams']} streams, {entry['seconds']:g} s)"
        ),
    ),
    Judged(
        "oversize declared body, none sent",
        "limits.declared",
        "413 within 100 ms, nothing on disk",
        lambda entry: entry["met"] == "yes",
        _limit,
    ),
    Judged(
        "oversize body declared and sent",
        "limits.sent",
        "413 within 100 ms, nothing on disk",
        lambda entry: entry["met"] == "yes",
        _limit,
    ),
    Judged(
        "half-closed complete delivery",
        "limits.half-closed",
        "answered 202 and stored",
        lambda entry: entry["met"] == "yes",
        _limit,
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
        if isinstance(goal, Judged | Worst):
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
