"""The chaos run's invariants, as a pure function of what was recorded, and the table.

Input (`Observed`): the plan; what the senders were told (acknowledgements) and what the
answerer was told (outcomes); the database after the drain (`state.collect`); what the
receivers got; the faults as they happened; process exits; counts from the workers' logs.

The rules are Jepsen's queue checker's, tightened: nothing acknowledged is lost, nothing
appears that nobody sent, and no side effect happens twice. What faults legitimately cause
(a repeated at-least-once delivery, an at-most-once message lost in a crash) is counted and
must be explained by a fault at that moment; an unexplained one fails like a violation.
"""

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tests.chaos.agent import (
    APPROVED,
    DELIVERED_SOURCES,
    EFFECT,
    follow_key_for,
    memory_path,
    parse_run_record,
    request_id_for,
)
from tests.chaos.plan import (
    DATABASE_FAULTS,
    DISPATCHER,
    FAILOVER,
    KILL,
    PROXY_BLACKHOLE,
    PROXY_LATENCY,
    PROXY_RESET,
    RUNALL,
    RUNALL_CHILD_KILL,
    STOP,
    TERMINATE,
    Plan,
)

# A repeat or a loss is explained by a fault that could have ended a send's transaction in
# this window around it (seconds): the dispatcher's transaction starts before its send.
LEAD = 5.0
LOST_AFTER = 10.0
EXAMPLES = 5


@dataclass
class Observed:
    plan: object
    db: dict
    acks: list = field(default_factory=list)
    answers: list = field(default_factory=list)
    receipts: list = field(default_factory=list)
    faults: list = field(default_factory=list)
    exits: list = field(default_factory=list)
    orphans: list = field(default_factory=list)
    logs: dict = field(default_factory=dict)
    drain: dict = field(default_factory=dict)
    shutdown: dict = field(default_factory=dict)  # exit code of each process on SIGTERM

    def save(self, path: Path):
        """The records, for `chaos --recheck` (the plan is saved next to them)."""
        data = {name: value for name, value in vars(self).items() if name != "plan"}
        path.write_text(json.dumps(data))

    @classmethod
    def load(cls, workdir: Path) -> "Observed":
        plan = Plan.from_json((workdir / "plan.json").read_text())
        return cls(plan=plan, **json.loads((workdir / "observed.json").read_text()))


@dataclass
class Row:
    section: str
    label: str
    value: object
    rule: str = ""  # "must be 0", "must be > 0", "counted, explained" or ""
    ok: bool = True
    examples: list = field(default_factory=list)


@dataclass
class Report:
    rows: list = field(default_factory=list)
    title: str = ""

    def add(self, section, label, value, rule="", ok=True, examples=()):
        self.rows.append(Row(section, label, value, rule, ok, list(examples)[:EXAMPLES]))

    def must_be_zero(self, section, label, items):
        """A violation count: the items are the evidence."""
        items = list(items)
        self.add(section, label, len(items), "must be 0", not items, items)

    @property
    def failures(self) -> list[Row]:
        return [row for row in self.rows if not row.ok]

    def value(self, label):
        return next(row.value for row in self.rows if row.label == label)

    def render(self) -> str:
        width = max(len(row.label) for row in self.rows) + 2
        lines = [self.title] if self.title else []
        section = None
        for row in self.rows:
            if row.section != section:
                section = row.section
                lines.append(section)
            status = "" if not row.rule else ("ok" if row.ok else "FAILED")
            lines.append(f"  {row.label:<{width}}{row.value!s:>8}  {row.rule:<20}{status}")
            for example in row.examples if not row.ok else ():
                lines.append(f"      {example}")
        verdict = (
            "every invariant held"
            if not self.failures
            else (
                f"{len(self.failures)} invariant(s) FAILED: "
                + "; ".join(row.label for row in self.failures)
            )
        )
        lines.append(verdict)
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {
            "ok": not self.failures,
            "rows": [row.__dict__ for row in self.rows],
        }


def check(observed: Observed) -> Report:
    report = Report()
    events = _Events(observed)
    _check_events(report, observed, events)
    runs = _check_runs(report, observed, events)
    _check_effects(report, observed, events)
    _check_timers(report, observed, events)
    _check_approvals(report, observed, events)
    _check_outbox(report, observed, runs)
    _check_memory(report, observed, runs)
    _check_processes(report, observed)
    _check_faults(report, observed)
    return report


class _Events:
    def __init__(self, observed):
        self.all = observed.db["events"]
        self.by_id = {e["id"]: e for e in self.all}
        self.by_key = defaultdict(list)
        for e in self.all:
            self.by_key[(e["inbox"], e["source"], e["source_id"])].append(e)
        self.flags = {}
        for delivery in observed.plan.deliveries:
            self.flags[(delivery.inbox, delivery.source, delivery.source_id)] = delivery.flags

    def of_source(self, *sources):
        return [e for e in self.all if e["source"] in sources]

    def key(self, e):
        return (e["inbox"], e["source"], e["source_id"])

    def poison(self, e):
        return bool(self.flags.get(self.key(e), {}).get("poison"))


def _check_events(report, observed, events):
    section = "events"
    planned = set(events.flags)
    acks = observed.acks
    acked = {(a["inbox"], a["source"], a["source_id"]) for a in acks}
    stored_new = Counter((a["inbox"], a["source"], a["source_id"]) for a in acks if a["stored"])
    report.add(section, "keys planned", len(planned))
    report.add(section, "deliveries acknowledged", len(acks))
    report.add(section, "  refused as duplicates", sum(1 for a in acks if not a["stored"]))
    retries = observed.logs.get("webhook_retries", {})
    report.add(
        section,
        "  webhook deliveries retried (5xx, 503 busy, unreachable)",
        sum(retries.values()),
    )
    report.must_be_zero(
        section,
        "keys acknowledged as new twice",
        [f"{key}: {n} times" for key, n in stored_new.items() if n > 1],
    )
    report.must_be_zero(section, "keys never acknowledged", sorted(planned - acked))
    report.add(section, "events stored", len(events.all))
    for source in ("chat", "standard", "timer", "approval"):
        report.add(section, f"  source {source}", len(events.of_source(source)))
    status = Counter(e["status"] for e in events.all)
    report.add(section, "done", status["done"])
    dead = [e for e in events.all if e["status"] == "dead"]
    poison = [e for e in dead if events.poison(e)]
    report.add(section, "dead: poison (fails every run)", len(poison))
    others = [e for e in dead if not events.poison(e)]
    max_attempts = observed.plan.max_attempts
    report.add(section, "dead: out of attempts under faults", len(others), "counted")
    report.must_be_zero(
        section,
        "dead before their last attempt",
        [
            f"{e['inbox']}/{e['source_id']} attempts {e['attempts']}"
            for e in dead
            if e["attempts"] < max_attempts
        ],  # fmt: skip
    )
    report.must_be_zero(
        section,
        "poison events finished",
        [
            f"{e['inbox']}/{e['source_id']}"
            for e in events.all
            if events.poison(e) and e["status"] == "done"
        ],  # fmt: skip
    )
    lost = [f"{key}: acknowledged, not stored" for key in sorted(acked - set(events.by_key))]
    lost += [
        f"{e['inbox']}/{e['source']}:{e['source_id']} left {e['status']}"
        for e in events.all
        if e["status"] in ("pending", "running")
    ]
    report.must_be_zero(section, "lost", lost)
    timer_keys = {(t["inbox"], t["key"]) for t in observed.db["timers"]}
    requested = {(a["inbox"], a["request_id"]) for a in observed.db["approvals"]}
    unexpected = []
    for e in events.all:
        if e["source"] in DELIVERED_SOURCES:
            known = events.key(e) in planned
        elif e["source"] == "timer":
            known = (e["inbox"], e["source_id"].rsplit("@", 1)[0]) in timer_keys
        elif e["source"] == "approval":
            known = (e["inbox"], e["source_id"]) in requested
        else:
            known = False
        if not known:
            unexpected.append(f"{e['inbox']}/{e['source']}:{e['source_id']}")
    report.must_be_zero(section, "unexpected (stored, never sent)", unexpected)


def _check_runs(report, observed, events) -> list[dict]:
    section = "runs (committed: one run record per fenced finish)"
    runs = []
    for message in observed.db["messages"]:
        record = parse_run_record(message["body"])
        if record:
            record["finished"] = message["created"]
            record["body"] = message["body"]
            runs.append(record)
    report.add(section, "committed runs", len(runs))
    by_inbox = defaultdict(list)
    for run in runs:
        by_inbox[run["inbox"]].append(run)
    overlaps = []
    for inbox, inbox_runs in by_inbox.items():
        inbox_runs.sort(key=lambda r: (r["claimed"], r["finished"]))
        latest = None  # the run that finishes last among those claimed so far
        for run in inbox_runs:
            if latest is not None and run["claimed"] < latest["finished"]:
                overlaps.append(
                    f"{inbox}: gen {latest['gen']} [{latest['claimed']:.3f}, "
                    f"{latest['finished']:.3f}] and gen {run['gen']} "
                    f"[{run['claimed']:.3f}, {run['finished']:.3f}]"
                )
            if latest is None or run["finished"] > latest["finished"]:
                latest = run
    report.must_be_zero(section, "overlapping committed runs of one inbox", overlaps)
    generations = Counter((run["inbox"], run["gen"]) for run in runs)
    report.must_be_zero(
        section,
        "generations that committed twice",
        [f"{key}: {n}" for key, n in generations.items() if n > 1],
    )
    finished_by = defaultdict(list)
    for run in runs:
        for pk in run["events"]:
            finished_by[pk].append(run["gen"])
    report.must_be_zero(
        section,
        "events finished by two committed runs",
        [f"event {pk}: generations {gens}" for pk, gens in finished_by.items() if len(gens) > 1],
    )
    mismatched = []
    for run in runs:
        for pk in run["events"]:
            e = events.by_id.get(pk)
            if e is None or e["status"] != "done" or e["claim_gen"] != run["gen"]:
                state = "missing" if e is None else f"{e['status']} under gen {e['claim_gen']}"
                mismatched.append(f"{run['inbox']} gen {run['gen']}: event {pk} {state}")
            elif e["inbox"] != run["inbox"]:
                mismatched.append(f"{run['inbox']} gen {run['gen']}: event {pk} of {e['inbox']}")
    report.must_be_zero(section, "committed runs whose events are not done by them", mismatched)
    report.must_be_zero(
        section,
        "done events without a committed run",
        [
            f"event {e['id']} ({e['inbox']}/{e['source_id']})"
            for e in events.all
            if e["status"] == "done" and e["id"] not in finished_by
        ],  # fmt: skip
    )
    _check_run_records(report, observed, runs, events)
    logs = observed.logs
    report.add(
        section, "finishes refused by the fence (worker logs)", logs.get("refused", 0), "counted"
    )
    report.add(section, "runs stopped by LeaseLost (worker logs)", logs.get("fenced", 0), "counted")
    report.add(
        section,
        "  leases lost at the run's own deadline (worker logs)",
        logs.get("deadline", 0),
        "counted",
    )
    report.add(
        section, "runs that failed (poison, severed connections)", logs.get("failed", 0), "counted"
    )
    return runs


def _check_run_records(report, observed, runs, events):
    """alwayson's own RunRecord rows against the runs that committed (their messages): one
    record marked done per committed run, listing its events, and none marked done that
    did not commit."""
    section = "run records (RunRecord, written by the fenced finish)"
    records = observed.db["run_records"]
    report.add(section, "run records", len(records))
    done = Counter((r["inbox"], r["gen"]) for r in records if r["outcome"] == "done")
    listed = {(r["inbox"], r["gen"]): r["events"] for r in records if r["outcome"] == "done"}
    report.must_be_zero(
        section,
        "committed runs without exactly one record marked done, listing their events",
        [
            f"{run['inbox']} gen {run['gen']}: {done[(run['inbox'], run['gen'])]} done records"
            for run in runs
            if done[(run["inbox"], run["gen"])] != 1
            or sorted(listed[(run["inbox"], run["gen"])]) != sorted(run["events"])
        ],
    )
    committed = {(run["inbox"], run["gen"]) for run in runs}
    report.must_be_zero(
        section,
        "records marked done whose run did not commit",
        [
            f"{inbox} gen {gen}: events {events_of}"
            for (inbox, gen), events_of in listed.items()
            if (inbox, gen) not in committed
            and any(
                events.by_id.get(pk, {}).get("status") != "done"
                or events.by_id[pk]["claim_gen"] != gen
                for pk in events_of
            )
        ],
    )
    for outcome in ("error", "deferred", "refused", "lost"):
        report.add(
            section,
            f"records marked {outcome}",
            sum(1 for r in records if r["outcome"] == outcome),
            "counted",
        )


def _check_memory(report, observed, runs):
    """Memory written as an effect of the fenced finish (alwayson/claude/memory.py): one
    version per committed run, holding its run record, none from a run that did not commit,
    and the files exactly what the committed runs wrote."""
    section = "memory (written by the fenced finish)"
    versions = observed.db["memory"]
    report.add(section, "memory versions", len(versions))
    committed = {(run["inbox"], run["gen"]): run["body"] for run in runs}
    written = Counter((v["inbox"], v["gen"]) for v in versions)
    report.must_be_zero(
        section,
        "memory writes from runs that did not commit",
        [f"{v['inbox']} gen {v['gen']}: {v['path']}" for v in versions
         if (v["inbox"], v["gen"]) not in committed],
    )  # fmt: skip
    report.must_be_zero(
        section,
        "committed runs without exactly one memory write of their record",
        [f"{inbox} gen {gen}: {written[(inbox, gen)]} writes"
         for (inbox, gen), body in committed.items()
         if written[(inbox, gen)] != 1 or not any(
             v["inbox"] == inbox and v["gen"] == gen and v["content"] == body for v in versions)],
    )  # fmt: skip
    expected = {(inbox, memory_path(gen)): body for (inbox, gen), body in committed.items()}
    files = {(f["inbox"], f["path"]): f["content"] for f in observed.db["memory_files"]}
    report.must_be_zero(
        section,
        "memory files other than what the committed runs wrote",
        sorted(f"{inbox} {path}" for inbox, path in set(files) ^ set(expected))
        + sorted(f"{inbox} {path}: changed" for (inbox, path), content in files.items()
                 if (inbox, path) in expected and expected[inbox, path] != content),
    )  # fmt: skip


def _check_effects(report, observed, events):
    section = "side effects (ledger, UNIQUE idempotency key from run.key)"
    ledger = observed.db["ledger"]
    report.add(section, "ledger effects", len(ledger))
    per_event = Counter(
        (row["inbox"], row["source"], row["source_id"], row["kind"]) for row in ledger
    )
    report.must_be_zero(
        section,
        "duplicate ledger effects",
        [f"{key}: {n} rows" for key, n in per_event.items() if n > 1],
    )
    attempts = observed.db["attempts"]
    report.add(section, "repeats refused by the key", attempts.get("refused", 0), "counted")
    missing = []
    for e in events.all:
        if e["status"] != "done":
            continue
        if e["source"] in DELIVERED_SOURCES:
            kind = EFFECT
        elif e["source"] == "approval" and e["payload"].get("answer") == "yes":
            kind = APPROVED
        else:
            continue
        if (e["inbox"], e["source"], e["source_id"], kind) not in per_event:
            missing.append(f"{e['inbox']}/{e['source']}:{e['source_id']} ({kind})")
    report.must_be_zero(section, "done events missing their effect", missing)
    dead_keys = {events.key(e) for e in events.all if e["status"] == "dead"}
    report.add(
        section,
        "effects of events that later died",
        sum(1 for row in ledger if (row["inbox"], row["source"], row["source_id"]) in dead_keys),
        "counted",
    )


def _check_timers(report, observed, events):
    section = "timers"
    timer_events = events.of_source("timer")
    timers = observed.db["timers"]
    recurring = [t for t in timers if t["recurring"]]
    one_offs = [t for t in timers if not t["recurring"]]
    report.add(section, "timer events", len(timer_events))
    occurrences = Counter()
    covered = Counter()
    for e in timer_events:
        key = e["source_id"].rsplit("@", 1)[0]
        occurrences[(e["inbox"], key, e["payload"].get("scheduled_for"))] += 1
        covered[(e["inbox"], key)] += 1 + int(e["payload"].get("skipped") or 0)
    report.add(section, "recurring occurrences due", sum(t.get("expected", 0) for t in recurring))
    report.must_be_zero(
        section,
        "timer occurrences with more than one event",
        [f"{key}: {n} events" for key, n in occurrences.items() if n > 1],
    )
    report.must_be_zero(
        section,
        "recurring occurrences neither fired nor counted skipped",
        [
            f"{t['inbox']}/{t['key']}: {t['expected']} due, {covered[(t['inbox'], t['key'])]} "
            "accounted for"
            for t in recurring
            if "expected" in t and covered[(t["inbox"], t["key"])] != t["expected"]
        ],
    )
    report.add(
        section,
        "  missed in outages, counted as skipped",
        sum(int(e["payload"].get("skipped") or 0) for e in timer_events),
    )
    follow = {(t["inbox"], t["key"]): t for t in one_offs if t["key"].startswith("follow-")}
    report.add(section, "follow-up timers (one-off, scheduled by runs)", len(follow))
    report.must_be_zero(
        section,
        "done events whose follow-up timer is missing",
        [
            f"{e['inbox']}/{e['source_id']}"
            for e in events.of_source(*DELIVERED_SOURCES)
            if e["status"] == "done"
            and events.flags.get(events.key(e), {}).get("follow")
            and (e["inbox"], follow_key_for(e["source_id"])) not in follow
        ],
    )


def _check_approvals(report, observed, events):
    section = "approvals"
    approvals = observed.db["approvals"]
    answer_events = defaultdict(list)
    for e in events.of_source("approval"):
        answer_events[(e["inbox"], e["source_id"])].append(e)
    outcomes = Counter(a["answer"] or "none" for a in approvals)
    report.add(section, "approvals requested", len(approvals))
    for answer in ("yes", "no", "expired"):
        report.add(section, f"  outcome {answer}", outcomes[answer])
    report.add(section, "answers given", len(observed.answers))
    report.must_be_zero(
        section,
        "approvals with more than one answer event",
        [f"{key}: {len(found)}" for key, found in answer_events.items() if len(found) > 1],
    )
    no_event, disagree = [], []
    for a in approvals:
        found = answer_events.get((a["inbox"], a["request_id"]), [])
        if not found:
            no_event.append(f"{a['inbox']}/{a['request_id']}")
        elif found[0]["payload"].get("answer") != a["answer"]:
            disagree.append(
                f"{a['inbox']}/{a['request_id']}: row {a['answer']!r}, "
                f"event {found[0]['payload'].get('answer')!r}"
            )
    report.must_be_zero(section, "approvals without an outcome", no_event)
    report.must_be_zero(section, "approval rows disagreeing with their event", disagree)
    stood = {
        key: found[0]["payload"].get("answer") for key, found in answer_events.items() if found
    }
    told_wrong, late_stood = [], []
    for answer in observed.answers:
        key = (answer["inbox"], answer["request_id"])
        if answer["returned"] != stood.get(key):
            told_wrong.append(f"{key}: told {answer['returned']!r}, {stood.get(key)!r} stood")
        if answer["decision"] == "late" and stood.get(key) != "expired":
            late_stood.append(f"{key}: {stood.get(key)!r}")
    report.must_be_zero(section, "answers told an outcome that did not stand", told_wrong)
    report.must_be_zero(section, "answers after the deadline that stood", late_stood)
    requested = {(a["inbox"], a["request_id"]) for a in approvals}
    report.must_be_zero(
        section,
        "done events whose approval request is missing",
        [
            f"{e['inbox']}/{e['source_id']}"
            for e in events.of_source(*DELIVERED_SOURCES)
            if e["status"] == "done"
            and events.flags.get(events.key(e), {}).get("ask")
            and (e["inbox"], request_id_for(e["source_id"])) not in requested
        ],  # fmt: skip
    )


def _explains_send(fault) -> bool:
    """Could this fault end a dispatcher's transaction, or its process, mid-send?"""
    if fault["kind"] in DATABASE_FAULTS:
        return True
    return fault["role"] in (DISPATCHER, RUNALL) and fault["kind"] in (
        KILL,
        STOP,
        TERMINATE,
        RUNALL_CHILD_KILL,
        PROXY_BLACKHOLE,  # the commit after the send held past the send's timeouts
        PROXY_RESET,
    )


def _explanation(faults, lo, hi) -> str | None:
    for fault in faults:
        if _explains_send(fault) and fault["start"] <= hi and fault["end"] >= lo:
            return f"{fault['kind']} {fault.get('target') or ''} at {fault['start']:.1f}".strip()
    return None


def _check_outbox(report, observed, runs):
    section = "outbox (receivers on 127.0.0.1: webhook and SMTP)"
    messages = observed.db["messages"]
    channels = observed.db["channels"]
    faults = observed.faults
    notices = {n["message_id"] for n in observed.db["notices"]}
    notices_received = [r for r in observed.receipts if r["key"] in notices]
    received = defaultdict(list)  # body -> receipts, in order
    for receipt in sorted(observed.receipts, key=lambda r: r["t"]):
        if receipt["key"] in notices:
            continue  # an email to a person (an operator's alert), not the channel's send
        for body in receipt["bodies"]:
            received[body].append(receipt)
    by_body = {m["body"]: m for m in messages}
    report.add(section, "messages", len(messages))
    report.add(section, "deliveries received", len(observed.receipts))
    for kind in ("webhook", "email"):
        report.add(
            section,
            f"  by {kind}",
            sum(1 for r in observed.receipts if r["channel"] == kind),
        )
    report.add(section, "  notices to people (alerts, approvals), not sends", len(notices_received))
    report.must_be_zero(
        section,
        "messages received that were never queued",
        [body[:80] for body in received if body not in by_body],
    )
    report.must_be_zero(
        section,
        "rows never sent (left held)",
        [f"{m['inbox']} #{m['id']}" for m in messages if m["status"] == "held"],
    )
    never, amo_lost, amo_failed, amo_unexplained = [], [], [], []
    repeats, repeats_new_key, repeats_unexplained, amo_repeats = [], [], [], []
    for m in messages:
        mode = channels[m["inbox"]]["mode"]
        got = received.get(m["body"], [])
        if mode == "at_most_once":
            if len(got) > 1:
                amo_repeats.append(f"{m['inbox']} #{m['id']}: {len(got)} deliveries")
            if not got:
                # Marked sent (or failed) and committed before the send: a crash, or a send
                # that timed out in a stall, loses it. Nothing else may.
                sent_at = m["sent_at"] or 0
                why = _explanation(faults, sent_at - 2, sent_at + LOST_AFTER)
                line = f"{m['inbox']} #{m['id']} {m['status']} at {sent_at:.1f}: {why}"
                if not why:
                    amo_unexplained.append(f"{line} {m['error']}")
                else:
                    (amo_failed if m["status"] == "failed" else amo_lost).append(line)
            continue
        if not got:
            never.append(f"{m['inbox']} #{m['id']} ({m['status']})")
        for earlier, later in zip(got, got[1:], strict=False):
            why = _explanation(faults, earlier["t"] - LEAD, later["t"])
            line = f"{m['inbox']} #{m['id']} at {earlier['t']:.1f} and {later['t']:.1f}: {why}"
            (repeats if why else repeats_unexplained).append(line)
            if later["key"] != earlier["key"]:
                repeats_new_key.append(line)
    report.must_be_zero(section, "at-least-once rows never delivered", never)
    report.add(section, "at-least-once deliveries repeated", len(repeats), "counted, explained")
    # A retried send keeps its rows and its key (the outbox's send_key): a repeat under
    # another key is one a receiver that dedupes on the key would act on twice.
    report.must_be_zero(section, "  of which under a different key", repeats_new_key)
    report.must_be_zero(section, "repeats without a crash to explain them", repeats_unexplained)
    report.must_be_zero(section, "at-most-once deliveries repeated", amo_repeats)
    report.add(section, "at-most-once rows lost in a crash", len(amo_lost), "counted, explained")
    report.add(
        section,
        "at-most-once sends failed in a stall (not retried)",
        len(amo_failed),
        "counted, explained",
    )
    report.must_be_zero(section, "at-most-once losses without a crash", amo_unexplained)
    return runs


def _check_processes(report, observed):
    section = "processes"
    exits = observed.exits
    report.add(
        section,
        "exits (killed, or runall after a child died)",
        sum(1 for x in exits if x["expected"]),
    )
    report.must_be_zero(
        section,
        "processes that died on their own",
        [f"{x['name']}.{x['incarnation']} exited {x['code']}" for x in exits if not x["expected"]],
    )
    report.must_be_zero(section, "children left running after runall exited", observed.orphans)
    report.must_be_zero(
        section,
        "processes that did not stop cleanly on SIGTERM",
        [f"{name} exited {code}" for name, code in observed.shutdown.items() if code != 0],
    )
    report.must_be_zero(section, "worker slots that died", observed.logs.get("slot_deaths", []))
    child_kills = [f for f in observed.faults if f["kind"] == RUNALL_CHILD_KILL]
    report.must_be_zero(
        section,
        "runall child kills runall did not answer by stopping",
        [f"{f['detail']}" for f in child_kills if not f.get("answered")],
    )
    drain = observed.drain
    report.add(section, "drain (seconds)", round(drain.get("seconds", 0), 1))
    report.must_be_zero(
        section,
        "left in flight after the drain",
        [] if drain.get("drained") else [str(drain.get("left"))],
    )


def _check_faults(report, observed):
    section = "faults injected"
    kinds = Counter(f["kind"] for f in observed.faults)
    for kind in observed.plan.fault_kinds:
        report.add(section, kind, kinds[kind], "must be > 0", kinds[kind] > 0)
    terminate = [f for f in observed.faults if f["kind"] == TERMINATE]
    mid = sum(1 for f in terminate if f.get("mid_transaction"))
    report.add(section, "  terminate: mid-transaction", mid, "must be > 0", mid > 0)
    stops = [f for f in observed.faults if f["kind"] == STOP]
    report.add(
        section,
        "  stop: longest (s)",
        round(max((f["end"] - f["start"] for f in stops), default=0), 1),
    )
    if not observed.plan.failover:
        outage = [f for f in observed.faults if f["kind"] == "pg-outage"]
        report.add(
            section,
            "  pg-outage: seconds down",
            round(sum(f["end"] - f["start"] for f in outage), 1),
        )
    blackholes = [f for f in observed.faults if f["kind"] == PROXY_BLACKHOLE]
    report.add(
        section,
        "  proxy-blackhole: longest (s)",
        round(max((f["end"] - f["start"] for f in blackholes), default=0), 1),
    )
    latency = [f for f in observed.faults if f["kind"] == PROXY_LATENCY]
    report.add(
        section,
        "  proxy-latency: most added (ms a chunk)",
        round(1000 * max((f.get("latency", 0) for f in latency), default=0)),
    )
    resets = [f for f in observed.faults if f["kind"] == PROXY_RESET]
    report.add(section, "  proxy-reset: connections reset", sum(f.get("reset", 0) for f in resets))
    for fault in observed.faults:
        if fault["kind"] == FAILOVER:
            report.add(
                section,
                "  failover: lag, then primary down (s)",
                round(fault["end"] - fault["start"], 1),
            )
