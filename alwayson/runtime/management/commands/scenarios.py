"""Replay the design article's eight failure scenarios against the ORM.

Simulated clock, one process; a "crash" is a worker that claims and never calls finish().
The scenarios get an inbox of their own, deleted afterwards, so they run on any database
without touching real inboxes. The output matches the article's raw output line for line.
"""

import uuid
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

from alwayson.command import AlwaysonCommand
from alwayson.runtime.api import (
    Say,
    acquire,
    add_timer,
    answer_approval,
    claim_batch,
    dispatch_inbox,
    finish,
    ingest,
    request_approval,
    run_scheduler,
)
from inbox.models import Event, Inbox
from inbox.services import Held
from outbox.models import OutboxMessage

T0 = datetime.fromtimestamp(1_000_000, UTC)
DAY = timedelta(days=1)
HOUR = timedelta(hours=1)
MINUTE = timedelta(minutes=1)
SECOND = timedelta(seconds=1)


class Command(AlwaysonCommand):
    help = "Replay the article's eight failure scenarios in a scratch inbox and print the results."

    def add_arguments(self, parser):
        parser.add_argument(
            "--keep", action="store_true", help="keep the scratch inbox for inspection"
        )

    def handle(self, *args, keep=False, **options):
        people = get_user_model()
        owner, _ = people.objects.get_or_create(**{people.USERNAME_FIELD: "alwayson-scenarios"})
        inbox = Inbox.objects.create(owner=owner, slug=f"scenarios-{uuid.uuid4().hex[:12]}")
        try:
            Scenarios(inbox, self.stdout.write).run_all()
        finally:
            if keep:
                self.stdout.write(f"(kept inbox {inbox.slug})")
            else:
                inbox.delete()


class Scenarios:
    def __init__(self, inbox, write):
        self.inbox = inbox
        self.write = write
        self.ttl = timedelta(seconds=settings.ALWAYSON_LEASE_TTL)

    def say(self, *parts):
        self.write(" ".join(str(p) for p in parts))

    def events(self):
        return Event.objects.filter(inbox=self.inbox)

    def status(self, source_id):
        event = self.events().get(source_id=source_id)
        return (event.status, event.attempts)

    def run(self, holder, now, messages=()):
        """One run: take the lease, claim, finish."""
        generation = acquire(self.inbox, holder, now)
        batch = claim_batch(self.inbox, holder, generation, now)
        effects = [Say(self.inbox.pk, body) for body in messages]
        finish(Held(self.inbox, holder, generation, [e.pk for e in batch]), effects, now=now)
        return batch

    def run_all(self):
        t = T0
        inbox = self.inbox

        self.say("1. webhook delivered twice")
        first = ingest(inbox, "github", "delivery-7f3a", {"pr": 12}, now=t)
        retry = ingest(inbox, "github", "delivery-7f3a", {"pr": 12}, now=t)
        self.say("   first:", first, " retry:", retry, " rows:", self.events().count())

        self.say("2. two workers ask for the lease at the same time")
        self.say("   A:", acquire(inbox, "A", t), " B:", acquire(inbox, "B", t))
        self.run("A", t)

        self.say("3. three quick chat messages")
        for n in range(3):
            ingest(inbox, "chat", f"msg-{n}", {"text": f"message {n}"}, now=t)
        self.say("   events in one run:", len(self.run("A", t + 5 * SECOND)))

        self.say("4. A stalls mid-run; B takes over; A wakes up")
        ingest(inbox, "chat", "msg-3", {"text": "send the report"}, now=t)
        gen_a = acquire(inbox, "A", t + 10 * SECOND)
        batch_a = claim_batch(inbox, "A", gen_a, t + 10 * SECOND)  # A stalls here
        self.say("   B before A's lease expires:", acquire(inbox, "B", t + 60 * SECOND))
        t2 = t + 10 * SECOND + self.ttl + SECOND
        gen_b = acquire(inbox, "B", t2)
        batch_b = claim_batch(inbox, "B", gen_b, t2)
        self.say("   B after expiry: gen", gen_b, " re-claims", [e.source_id for e in batch_b])
        finish(
            Held(inbox, "B", gen_b, [e.pk for e in batch_b]), [Say(inbox.pk, "report sent")], now=t2
        )
        t3 = t2 + self.ttl + SECOND  # B's lease lapses too
        self.say("   A renews after both leases lapsed: gen", acquire(inbox, "A", t3))
        late = finish(
            Held(inbox, "A", gen_a, [e.pk for e in batch_a]), [Say(inbox.pk, "report sent")], now=t3
        )
        self.say("   A finishes its old claim (gen", gen_a, "):", late)
        outbox_rows = OutboxMessage.objects.filter(inbox=inbox).count()
        self.say("   msg-3:", self.status("msg-3"), " outbox rows:", outbox_rows)

        self.say("5. a poison event arrives together with a healthy one")
        ingest(inbox, "chat", "poison", {"text": "x"}, now=t3)
        ingest(inbox, "chat", "healthy", {"text": "ok"}, now=t3)
        now = t3 + self.ttl + SECOND
        for n in range(5):
            worker = f"W{n}"
            generation = acquire(inbox, worker, now)
            got = claim_batch(inbox, worker, generation, now)
            ids = [e.source_id for e in got]
            if "poison" in ids:
                self.say(f"   {worker} claimed {ids} and crashed")  # no finish()
            else:
                finish(Held(inbox, worker, generation, [e.pk for e in got]), now=now)
                self.say(f"   {worker} claimed {ids} and finished")
            now += self.ttl + SECOND
        self.say("   poison:", self.status("poison"), " healthy:", self.status("healthy"))

        self.say("6. timers: a second scheduler pass, a replay, a three-day outage")
        add_timer(inbox, "digest", now, {"task": "daily digest"}, every=int(DAY.total_seconds()))
        pass_1 = run_scheduler(now, inbox=inbox)
        pass_2 = run_scheduler(now, inbox=inbox)
        self.say("   pass 1:", pass_1, " pass 2:", pass_2)
        add_timer(inbox, "digest", now, {"task": "daily digest"}, every=int(DAY.total_seconds()))
        replayed = run_scheduler(now, inbox=inbox)
        digests = self.events().filter(source_id__startswith="digest@")
        self.say(
            "   replay of the same occurrence:", replayed, "due,", digests.count(), "event total"
        )
        later = now + DAY + 3 * DAY + 10 * MINUTE  # next due + 3 days
        run_scheduler(later, inbox=inbox)
        payload = digests.order_by("-id").first().payload
        next_due = inbox.timers.get(key="digest").due
        self.say(
            "   after the outage: events total",
            digests.count(),
            " skipped",
            payload["skipped"],
            " late by",
            payload["late_by"] // 60,
            "min",
            " next due in",
            round((next_due - later).total_seconds() / 3600, 1),
            "h",
        )

        self.say("7. approvals with a four-hour window")
        window = 4 * HOUR
        request_approval(inbox, "refund-881", "refund order 881", window, now=later)
        run_scheduler(later + 5 * HOUR, inbox=inbox)
        outcome = answer_approval(inbox, "refund-881", "yes", now=later + 6 * HOUR).stands
        self.say("   881: expiry ran at 5h, yes at 6h ->", outcome)
        request_approval(inbox, "refund-882", "refund order 882", window, now=later)
        outcome = answer_approval(inbox, "refund-882", "yes", now=later + 5 * HOUR).stands
        self.say("   882: yes at 5h, scheduler not run yet ->", outcome)
        request_approval(inbox, "refund-883", "refund order 883", window, now=later)
        first = answer_approval(inbox, "refund-883", "yes", now=later + HOUR).stands
        second = answer_approval(inbox, "refund-883", "no", now=later + 2 * HOUR).stands
        self.say("   883: yes at 1h ->", first, " second tap no at 2h ->", second)
        run_scheduler(later + 5 * HOUR, inbox=inbox)
        stored = self.events().get(source="approval", source_id="refund-883").payload["answer"]
        self.say("   883 after its expiry timer fired:", stored)
        self.say(
            "   never requested ->", answer_approval(inbox, "refund-999", "yes", now=later).stands
        )

        self.say("8. outbox: three updates inside an hour")
        sent = []
        m = later + 6 * HOUR
        outbox = OutboxMessage.objects.filter(inbox=inbox)
        outbox.held().update(status=OutboxMessage.Status.SENT, sent_at=m - 2 * HOUR)
        for n, minute in enumerate((0, 10, 20)):
            at = m + minute * MINUTE
            with transaction.atomic():
                OutboxMessage.objects.create(inbox=inbox, body=f"update {n}", created=at)
            dispatch_inbox(inbox, lambda delivery: sent.append(delivery.body), now=at)
        dispatch_inbox(inbox, lambda delivery: sent.append(delivery.body), now=m + 61 * MINUTE)
        self.say("   sends:", [s.replace("\n\n", " | ") for s in sent])
