"""The scrape: the state counted from the database, and the happenings' totals."""

import math
from collections import defaultdict
from datetime import timedelta

from django.db.models import Count, Min
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from alwayson.ops import durability
from alwayson.ops.models import MetricTotal, Process
from approvals.models import Approval
from inbox import clock
from inbox.models import Event, Inbox, Lease
from outbox.models import Notice, OutboxMessage
from timers.models import Timer

from .happenings import PERSISTED

DEAD_WINDOW = timedelta(days=1)


class DatabaseCollector:
    """Every family, read from the database at scrape (`now`: the database's clock)."""

    def __init__(self, now=None):
        self.now = now

    def collect(self):
        now = clock.resolve(self.now)
        yield from self.state(now)
        totals = defaultdict(lambda: defaultdict(dict))
        for name, labels, bucket, value in MetricTotal.objects.values_list(
            "name", "labels", "bucket", "value"
        ):
            totals[name][labels][bucket] = value
        for metric in PERSISTED:
            yield metric.family(totals.get(metric.name, {}))

    def state(self, now):

        events = GaugeMetricFamily(
            "alwayson_events",
            "Events pending, running or dead, by inbox slug (inboxes with none are left out).",
            labels=["inbox", "status"],
        )
        counts = []
        # One query per status, each on that status's partial index (done events are not
        # counted: they are most of the table and no index covers them).
        for status, rows in (
            ("pending", Event.objects.pending()),  # event_pending_idx
            ("running", Event.objects.running()),  # event_running_idx
            ("dead", Event.objects.dead()),  # event_dead_idx
        ):
            for inbox_id, count in (
                rows.values("inbox_id")
                .annotate(n=Count("*"))
                .values_list("inbox_id", "n")
                .order_by()
            ):
                counts.append((inbox_id, status, count))
        slugs = dict(
            Inbox.objects.filter(pk__in={row[0] for row in counts}).values_list("pk", "slug")
        )
        for inbox_id, status, count in sorted(
            counts, key=lambda row: (slugs.get(row[0], ""), row[1])
        ):
            events.add_metric([slugs.get(inbox_id, str(inbox_id)), status], count)
        yield events

        dead = Event.objects.dead().filter(updated__gte=now - DEAD_WINDOW).count()  # event_dead_idx
        yield GaugeMetricFamily(
            "alwayson_events_dead_last_day",
            "Events that went dead in the last 24 hours.",
            value=dead,
        )

        # lease_work_idx: when the longest-waiting claimable work became claimable.
        oldest = Lease.objects.filter(work_at__isnull=False).aggregate(first=Min("work_at"))[
            "first"
        ]
        yield GaugeMetricFamily(
            "alwayson_oldest_pending_age_seconds",
            "Seconds the longest-waiting claimable event has waited (0: none waits).",
            value=_seconds_since(oldest, now),
        )

        outbox = GaugeMetricFamily(
            "alwayson_outbox_messages",
            "Outbox messages held (waiting for the gap or a retry) and failed (parked).",
            labels=["status"],
        )
        outbox.add_metric(["held"], OutboxMessage.objects.held().count())  # outbox_held_idx
        outbox.add_metric(["failed"], OutboxMessage.objects.failed().count())  # outbox_failed_idx
        yield outbox
        notices = GaugeMetricFamily(
            "alwayson_notices", "Notices to approvers held and failed (parked).", labels=["status"]
        )
        notices.add_metric(["held"], Notice.objects.held().count())  # notice_due_idx
        notices.add_metric(["failed"], Notice.objects.failed().count())  # notice_failed_idx
        yield notices

        # timer_due_idx: the earliest timer not yet fired.
        due = Timer.objects.filter(done=False).aggregate(first=Min("due"))["first"]
        yield GaugeMetricFamily(
            "alwayson_timer_overdue_seconds",
            "Seconds the most overdue timer is past its due time (0: none is due);"
            " it grows while no scheduler fires.",
            value=_seconds_since(due, now),
        )

        approvals = GaugeMetricFamily(
            "alwayson_approvals",
            "Approvals not answered: waiting for a person, or past the deadline with"
            " the expiry not yet fired (overdue).",
            labels=["state"],
        )
        unanswered = Approval.objects.filter(answer="")  # approval_waiting_idx
        approvals.add_metric(["waiting"], unanswered.filter(expires_at__gt=now).count())
        approvals.add_metric(["overdue"], unanswered.filter(expires_at__lte=now).count())
        yield approvals

        processes = GaugeMetricFamily(
            "alwayson_processes", "Loop processes with a live heartbeat, by kind.", labels=["kind"]
        )
        live = dict(
            Process.objects.live(now)
            .values("kind")
            .annotate(n=Count("*"))
            .values_list("kind", "n")
            .order_by()
        )  # process_beat_idx
        for kind in Process.Kind.values:
            processes.add_metric([kind], live.get(kind, 0))
        yield processes

        found = durability.cached()
        if found.status != durability.EMBEDDED:
            yield GaugeMetricFamily(
                "alwayson_database_at_risk",
                "1 when the database can lose a commit it acknowledged (synchronous_commit"
                " below on, or an asynchronous standby), 0 when it cannot, NaN when unknown.",
                value={durability.OK: 0, durability.AT_RISK: 1}.get(found.status, math.nan),
            )
            yield GaugeMetricFamily(
                "alwayson_database_asynchronous_standbys",
                "Standbys streaming from the database asynchronously: a failover to one loses"
                " the commits it had not received.",
                value=len(found.asynchronous),
            )


def _seconds_since(moment, now) -> float:
    if moment is None:
        return 0.0
    return max((now - moment).total_seconds(), 0.0)


def exposition(now=None) -> bytes:

    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(now))
    return generate_latest(registry)
