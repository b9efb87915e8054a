"""What the chaos process itself reads and writes in the run's database, through the ORM:
set-up, stopping the recurring timers for the drain, the drain's status, the final dump.

The chaos process points Django's default connection at its own cluster first
(`use_database`); it never touches the database DATABASE_URL names.
"""

import contextlib
import time
from datetime import UTC, datetime, timedelta

import environ
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import DatabaseError, connection, connections, transaction

from alwayson.claude.models import MemoryFile, MemoryVersion
from approvals.models import Approval
from inbox.models import Event, Inbox, Lease, RunRecord
from outbox.models import Channel, Notice, OutboxMessage
from tests.chaos.agent import LEDGER_TABLES
from timers.models import Timer
from timers.services import add_timer

OWNER = "chaos"
CRON_EVERY_MINUTE = "* * * * *"


def use_database(url: str):
    """Point this process's default connection at `url` (the run's own cluster)."""
    config = environ.Env.db_url_config(url)
    config.setdefault("OPTIONS", {})["application_name"] = "chaos-run"
    config["CONN_HEALTH_CHECKS"] = True
    connections["default"].close()
    db = connections.settings["default"]
    for key in ("ENGINE", "NAME", "USER", "PASSWORD", "HOST", "PORT", "OPTIONS"):
        db[key] = config.get(key, "" if key != "OPTIONS" else {})
    db["CONN_HEALTH_CHECKS"] = True
    with contextlib.suppress(AttributeError):
        del connections["default"]


def with_retry(call, timeout: float, what: str):
    """The run's own reads and writes wait out the faults it injected."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except DatabaseError:
            connection.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def setup(plan, webhook_url: str) -> dict:
    """Migrate; create the owner, the inboxes, their channels and timers and the ledger.
    Returns each recurring timer's first due time (epoch seconds), for the accounting."""
    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        for ddl in LEDGER_TABLES:
            cursor.execute(ddl)
    owner = get_user_model().objects.create(username=OWNER, email="chaos@example.com")
    first_due = {}
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=10)
    for n, spec in enumerate(plan.inboxes):
        inbox = Inbox.objects.create(owner=owner, slug=spec.slug)
        Channel.objects.update_or_create(
            inbox=inbox,
            defaults={
                "kind": spec.kind,
                "mode": spec.mode,
                "gap": spec.gap,
                "url": f"{webhook_url}/{spec.slug}" if spec.kind == "webhook" else "",
            },
        )
        due = start + timedelta(seconds=n % spec.tick_every)
        tick = add_timer(
            inbox,
            "tick",
            due,
            {"tick": spec.slug},
            every=spec.tick_every,
            policy=spec.tick_policy,
            catch_up_max=3,
        )
        first_due[f"{spec.slug}/tick"] = tick.due.timestamp()
        if spec.cron:
            cron = add_timer(inbox, "minutely", cron=CRON_EVERY_MINUTE, payload={"cron": spec.slug})
            first_due[f"{spec.slug}/minutely"] = cron.due.timestamp()
    return first_due


def stop_recurring_timers():
    """For the drain: recurring timers stop firing (done, their `due` left as it was, the next
    occurrence not fired). Under the inbox's lease lock, like every write to an inbox."""
    recurring = Timer.objects.filter(done=False).exclude(every__isnull=True, cron="")
    for pk, inbox_id in list(recurring.values_list("pk", "inbox_id")):
        with transaction.atomic():
            Lease.objects.select_for_update().get(inbox_id=inbox_id)
            Timer.objects.filter(pk=pk).update(done=True)


def drain_status() -> dict:
    """What is still in flight; the run has drained when every count is 0."""
    now = datetime.now(UTC)
    return {
        "events pending": Event.objects.pending().count(),
        "events running": Event.objects.running().count(),
        "outbox held": OutboxMessage.objects.held().count(),
        "timers to fire": Timer.objects.filter(done=False).count(),
        "approvals open": Approval.objects.filter(answer="").count(),
        "leases held": Lease.objects.filter(until__gte=now).count(),
    }


def _epoch(moment):
    return moment.timestamp() if moment else None


def expected_occurrences(timer: Timer, first_due: float) -> int:
    """Occurrences from the first due time up to (not including) the timer's final `due`."""
    count, moment = 0, datetime.fromtimestamp(first_due, UTC)
    while moment < timer.due:
        count += 1
        moment = timer.next_after(moment)
    return count


def collect(first_due: dict) -> dict:
    """Everything the checker reads from the database, as plain data."""
    slug_of = dict(Inbox.objects.values_list("pk", "slug"))
    events = [
        {
            "id": e.pk,
            "inbox": slug_of[e.inbox_id],
            "source": e.source,
            "source_id": e.source_id,
            "status": e.status,
            "attempts": e.attempts,
            "claim_gen": e.claim_gen,
            "payload": e.payload if isinstance(e.payload, dict) else {},
            "error": e.error.splitlines()[-1] if e.error else "",
        }
        for e in Event.objects.order_by("id")
    ]
    messages = [
        {
            "id": m.pk,
            "inbox": slug_of[m.inbox_id],
            "body": m.body,
            "status": m.status,
            "created": _epoch(m.created),
            "sent_at": _epoch(m.sent_at),
            "urgent": m.urgent,
            "error": m.error.splitlines()[-1] if m.error else "",
        }
        for m in OutboxMessage.objects.order_by("id")
    ]
    channels = {
        slug_of[c.inbox_id]: {"kind": c.kind, "mode": c.mode} for c in Channel.objects.all()
    }
    # Emails to people, not through an inbox's channel (dead-event alerts, approval notices):
    # told apart from the channel's sends by their Message-ID.
    notices = [
        {"message_id": f"<{n.key}@alwayson>", "inbox": slug_of[n.inbox_id], "topic": n.topic}
        for n in Notice.objects.order_by("id")
    ]
    approvals = [
        {
            "inbox": slug_of[a.inbox_id],
            "request_id": a.request_id,
            "answer": a.answer,
            "expires_at": _epoch(a.expires_at),
        }
        for a in Approval.objects.order_by("id")
    ]
    timers = []
    for timer in Timer.objects.order_by("id"):
        name = f"{slug_of[timer.inbox_id]}/{timer.key}"
        record = {
            "inbox": slug_of[timer.inbox_id],
            "key": timer.key,
            "recurring": timer.recurring,
            "done": timer.done,
            "due": _epoch(timer.due),
        }
        if timer.recurring and name in first_due:
            record["expected"] = expected_occurrences(timer, first_due[name])
        timers.append(record)
    run_records = [
        {
            "inbox": slug_of[r.inbox_id],
            "gen": r.generation,
            "outcome": r.outcome,
            "events": r.events,
        }
        for r in RunRecord.objects.order_by("id")
    ]
    memory = [
        {
            "inbox": slug_of[v.inbox_id],
            "gen": v.generation,
            "path": v.path,
            "content": v.content,
        }
        for v in MemoryVersion.objects.order_by("id")
    ]
    memory_files = [
        {"inbox": slug_of[f.inbox_id], "path": f.path, "content": f.content}
        for f in MemoryFile.objects.order_by("id")
    ]
    with connection.cursor() as cursor:
        cursor.execute("SELECT key, inbox_id, source, source_id, kind FROM chaos_ledger")
        ledger = [
            {"key": k, "inbox": slug_of[i], "source": s, "source_id": sid, "kind": kind}
            for k, i, s, sid, kind in cursor.fetchall()
        ]
        cursor.execute("SELECT fresh, count(*) FROM chaos_effect_attempts GROUP BY fresh")
        attempts = {("fresh" if fresh else "refused"): n for fresh, n in cursor.fetchall()}
    return {
        "events": events,
        "messages": messages,
        "notices": notices,
        "channels": channels,
        "approvals": approvals,
        "timers": timers,
        "ledger": ledger,
        "attempts": attempts,
        "run_records": run_records,
        "memory": memory,
        "memory_files": memory_files,
    }
