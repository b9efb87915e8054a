"""The chaos run's client processes, which faults hit like any other:

    python -m tests.chaos.clients ingest --plan plan.json --name i2 --log i2.jsonl --t0 T
    python -m tests.chaos.clients answer --plan plan.json --name a1 --log a1.jsonl

An ingester is a sender: it delivers its share of the plan at the planned moments through
`ingest`, retries each delivery until it is acknowledged (stored or refused as a duplicate),
and appends each acknowledgement to its log. Restarted after a kill, it resumes after the last
acknowledged delivery, so the one in flight is delivered again, as a real sender would.

The answerer answers approvals as the plan decides for each (`Plan.decision`): at once, twice,
after the deadline, or never, and logs the outcome `answer_approval` returned for each call.
"""

import argparse
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

log = logging.getLogger("alwayson.chaos")

BACKOFF = (0.2, 2.0)
POLL = 0.2


def read_log(path: Path) -> list[dict]:
    """The JSON lines of a client's log; a last line cut by a SIGKILL is ignored."""
    if not path.exists():
        return []
    lines = []
    for line in path.read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return lines


class Log:
    def __init__(self, path: Path):
        self.path = path

    def write(self, record: dict):
        with self.path.open("a") as out:
            out.write(json.dumps(record) + "\n")
            out.flush()
            os.fsync(out.fileno())


def retrying(call, what):
    """Call until it returns: a sender retries until it is acknowledged. Any failure counts
    (the database down, a severed connection, the inbox busy)."""
    from django.db import connection

    backoff = BACKOFF[0]
    while True:
        try:
            return call()
        except Exception as exc:  # a sender retries whatever went wrong
            log.warning(
                "%s failed (%s: %s); retrying in %.1fs", what, type(exc).__name__, exc, backoff
            )
            connection.close()
            time.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF[1])


def ingest_all(plan, name: str, out: Log, t0: float):
    from inbox.services import ingest

    done = {record["n"] for record in read_log(out.path)}
    for n, (at, delivery) in enumerate(plan.sends_of(name)):
        if n in done:
            continue
        time.sleep(max(0.0, t0 + at - time.time()))
        stored = retrying(
            lambda d=delivery: ingest(d.inbox, d.source, d.source_id, d.flags),
            f"ingest {delivery.inbox}/{delivery.source_id}",
        )
        out.write(
            {
                "n": n,
                "inbox": delivery.inbox,
                "source": delivery.source,
                "source_id": delivery.source_id,
                "stored": stored,
                "t": time.time(),
            }
        )


def answer_forever(plan, out: Log):
    """Answer approvals as they appear, until SIGTERM."""
    from approvals.models import Approval
    from approvals.services import answer_approval
    from inbox.clock import database_now

    handled = {(r["inbox"], r["request_id"], r["step"]) for r in read_log(out.path)}
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))

    def calls_for(approval, decision, now):
        """(step, answer) calls still to make for this approval now."""
        if decision in ("yes", "no"):
            return [(0, decision)]
        if decision == "double":
            return [(0, "yes"), (1, "no")]
        # A late answer waits until the deadline has passed on the database's clock.
        if decision == "late" and now.timestamp() >= approval.expires_at.timestamp() + 0.2:
            return [(0, "yes")]
        return []

    while not stop:
        waiting = retrying(
            lambda: (
                database_now(),
                list(Approval.objects.filter(answer="").select_related("inbox")),
            ),
            "list approvals",
        )
        now, approvals = waiting
        for approval in approvals:
            slug = approval.inbox.slug
            decision = plan.decision(slug, approval.request_id)
            for step, given in calls_for(approval, decision, now):
                if (slug, approval.request_id, step) in handled:
                    continue
                returned = retrying(
                    lambda a=approval, g=given: answer_approval(a.inbox, a.request_id, g).stands,
                    f"answer {slug}/{approval.request_id}",
                )
                out.write(
                    {
                        "inbox": slug,
                        "request_id": approval.request_id,
                        "step": step,
                        "decision": decision,
                        "given": given,
                        "returned": returned,
                        "t": time.time(),
                    }
                )
                handled.add((slug, approval.request_id, step))
        time.sleep(POLL)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.clients")
    parser.add_argument("role", choices=["ingest", "answer"])
    parser.add_argument("--plan", required=True, type=Path)
    parser.add_argument("--name", required=True)
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("--t0", type=float, default=None, help="the run's start (epoch seconds)")
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "alwayson.settings")
    import django

    django.setup()
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
    from tests.chaos.plan import Plan

    plan = Plan.from_json(args.plan.read_text())
    out = Log(args.log)
    if args.role == "ingest":
        ingest_all(plan, args.name, out, args.t0 or time.time())
        log.info("%s: every delivery acknowledged", args.name)
    else:
        answer_forever(plan, out)


if __name__ == "__main__":
    main()
