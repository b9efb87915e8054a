"""PostgreSQL's plans for what the code sends: the statements captured, EXPLAINed, an index
asserted by name; and the busy world they are read on (the `world` fixture builds it)."""

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from alwayson.claude.models import ModelCall, ToolResult
from alwayson.ops.health import ProcessBeat
from alwayson.ops.models import Process
from alwayson.runtime.api import add_timer, ingest, request_approval
from approvals.models import Approval, AuditEntry
from inbox.models import Event, Inbox, Lease, Membership, Role
from outbox.models import Notice, OutboxMessage
from tests.support.clock import HOUR, SECOND, T0
from timers.models import Timer

NOISE = 3000  # rows per table that no worker query should read


def sql_of(run):
    """The statements `run()` sent, as executed (parameters inlined by the driver)."""
    with CaptureQueriesContext(connection) as captured:
        run()
    return [q["sql"] for q in captured.captured_queries]


def explain(sql):
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql)
        return "\n".join(row[0] for row in cursor.fetchall())


def plan_of(run):
    """The plan of the one statement `run()` sends."""
    statements = sql_of(run)
    assert len(statements) == 1, statements
    return explain(statements[0])


def assert_uses(plan, index):
    assert f" {index} " in f"{plan}\n".replace("\n", " \n"), f"{index} not used:\n{plan}"


def analyze():
    with connection.cursor() as cursor:
        for model in (
            Event,
            Lease,
            Timer,
            OutboxMessage,
            Approval,
            Inbox,
            ModelCall,
            ToolResult,
            ToolResult.events.through,
            Process,
            Membership,
            Notice,
            AuditEntry,
        ):
            cursor.execute(f"ANALYZE {model._meta.db_table}")


def build_world(t0=T0):
    owner = get_user_model().objects.create(username="plans-owner")
    inbox = Inbox.objects.create(owner=owner, slug="busy")
    idle = Inbox.objects.bulk_create(
        Inbox(owner=owner, slug=f"idle-{n}", created=t0) for n in range(NOISE)
    )
    # bulk_create skips Inbox.save(), which makes the lease row; make them here, all idle.
    Lease.objects.bulk_create(Lease(inbox=i, holder="old", generation=3) for i in idle)
    past = t0 - timedelta(days=400)
    history = [inbox] * (NOISE // 2) + idle[: NOISE // 2]

    old_events = Event.objects.bulk_create(
        Event(
            inbox=owner_inbox,
            source="chat",
            source_id=f"old-{n}",
            status=Event.Status.DONE,
            attempts=1,
            claim_gen=1,
            available_at=past + n * SECOND,
            created=past + n * SECOND,
            updated=past + n * SECOND,
        )
        for n, owner_inbox in enumerate(history)
    )
    Timer.objects.bulk_create(
        Timer(inbox=owner_inbox, key=f"old-{n}", due=past + n * SECOND, done=True)
        for n, owner_inbox in enumerate(history)
    )
    OutboxMessage.objects.bulk_create(
        OutboxMessage(
            inbox=owner_inbox,
            body=f"old {n}",
            status=OutboxMessage.Status.SENT,
            created=past + n * SECOND,
            sent_at=past + n * SECOND,
        )
        for n, owner_inbox in enumerate(history)
    )
    Approval.objects.bulk_create(
        Approval(
            inbox=owner_inbox,
            request_id=f"old-{n}",
            action="refund",
            requested_at=past,
            expires_at=past + HOUR,
            answer=Approval.Answer.YES,
            answered_at=past,
        )
        for n, owner_inbox in enumerate(history)
    )

    ModelCall.objects.bulk_create(
        ModelCall(
            inbox=owner_inbox,
            request_key=f"{n:064x}",
            generation=1,
            model="claude-sonnet-5-5",
            response={"content": []},
            input_tokens=100,
            created=past + n * SECOND,
        )
        for n, owner_inbox in enumerate(history)
    )
    tool_results = ToolResult.objects.bulk_create(
        ToolResult(
            inbox=owner_inbox,
            idempotency_key=f"refund-{n}",
            tool="refund",
            result={"content": "ok"},
            generation=1,
            created=past + n * SECOND,
        )
        for n, owner_inbox in enumerate(history)
    )
    made_for = ToolResult.events.through
    made_for.objects.bulk_create(
        made_for(toolresult_id=call.pk, event_id=event.pk)
        for call, event in zip(tool_results, old_events, strict=True)
    )
    # A day of restarted processes, stopped cleanly, that neither health nor pruning reads.
    Process.objects.bulk_create(
        Process(
            kind=Process.Kind.WORKER,
            worker_id=f"old-{n}",
            host="h",
            pid=n,
            started=t0 - timedelta(hours=20) + n * SECOND,
            last_beat=t0 - timedelta(hours=20) + n * SECOND,
            stopped=t0 - timedelta(hours=20) + n * SECOND,
        )
        for n in range(NOISE)
    )
    # Members of every inbox, and the notices of long-answered approvals.
    members = get_user_model().objects.bulk_create(
        get_user_model()(username=f"member-{n}", email=f"m{n}@example.com") for n in range(NOISE)
    )
    Membership.objects.bulk_create(
        Membership(inbox=i, user=m, role=Role.APPROVER) for i, m in zip(idle, members, strict=True)
    )
    Notice.objects.bulk_create(
        Notice(
            inbox=i,
            recipient=m,
            topic=f"approval:old-{n}",
            key=f"{n:032d}",
            subject="old",
            body="old",
            status=Notice.Status.SENT,
            created=past,
            due_at=past,
            sent_at=past,
        )
        for n, (i, m) in enumerate(zip(idle, members, strict=True))
    )
    Membership.objects.create(inbox=inbox, user=members[0], role=Role.APPROVER)

    # The live work, through the API.
    for n in range(5):
        ingest(inbox, "chat", f"new-{n}", {"n": n}, now=t0)
    for n in range(3):
        add_timer(inbox, f"soon-{n}", t0 - n * SECOND, now=t0)
        add_timer(inbox, f"later-{n}", t0 + (n + 1) * HOUR, now=t0)
    for n in range(3):
        OutboxMessage.objects.create(inbox=inbox, body=f"held {n}", created=t0)
    request_approval(inbox, "r1", "refund order 42", 3600, now=t0)
    for kind in Process.Kind.values:
        ProcessBeat(kind, f"live-{kind}").register(t0)
    analyze()
