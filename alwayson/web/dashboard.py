"""The operator's dashboard: one admin page with the state of every inbox at a glance.

A fixed number of queries however many inboxes there are: events by status per inbox (with
the oldest pending event and the dead of the last 24 hours), held and failed outbox messages
per inbox, the leases held now, and the Claude agent's model tokens (per inbox today against
its budget, and per run for the latest runs). Ages and "now" come from the database's clock,
the one the leases and timers use.
"""

from datetime import timedelta
from html import escape

from django.conf import settings
from django.contrib import admin
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import permission_required
from django.db.models import Count, Min, Q, Sum
from django.db.models.functions import Coalesce, Now
from django.shortcuts import render

from alwayson.claude.models import ModelCall, token_sums
from alwayson.runtime.models import AgentConfig
from inbox import clock
from inbox.clock import day_start
from inbox.models import Event, Inbox, Lease, RunRecord
from outbox.models import OutboxMessage

from . import charts, live

STATUSES = Event.Status.values


def inbox_rows(now):
    since = now - timedelta(hours=24)
    counts = {
        f"n_{status}": Count("events", filter=Q(events__status=status)) for status in STATUSES
    }
    return list(
        Inbox.objects.order_by("slug")
        .values("pk", "slug")
        .annotate(
            **counts,
            dead_24h=Count(
                "events",
                filter=Q(events__status=Event.Status.DEAD, events__updated__gte=since),
            ),
            oldest_pending=Min("events__created", filter=Q(events__status=Event.Status.PENDING)),
        )
    )


def outbox_by_inbox():
    held, failed = OutboxMessage.Status.HELD, OutboxMessage.Status.FAILED
    rows = (
        OutboxMessage.objects.filter(status__in=[held, failed])
        .values("inbox_id")
        .annotate(
            held=Count("id", filter=Q(status=held)),
            failed=Count("id", filter=Q(status=failed)),
            oldest_held=Min("created", filter=Q(status=held)),
        )
        .order_by()
    )
    return {row["inbox_id"]: row for row in rows}


RECENT_RUNS = 10


def tokens_by_inbox(now):
    """Model tokens per inbox since midnight UTC (the budget's day), with each budget."""
    rows = (
        ModelCall.objects.filter(created__gte=day_start(now))
        .values("inbox_id")
        .annotate(
            calls=Count("id"),
            **token_sums(),
        )
        .order_by()
    )
    budgets = dict(AgentConfig.objects.values_list("inbox_id", "daily_token_budget"))
    usage = {row["inbox_id"]: row for row in rows}
    default = settings.ALWAYSON_CLAUDE_DAILY_TOKEN_BUDGET
    return usage, budgets, default


def recent_runs():
    """The model usage of the latest runs: one run is one (inbox, generation)."""
    return list(
        ModelCall.objects.values("inbox__slug", "inbox_id", "generation")
        .annotate(
            calls=Count("id"),
            **token_sums(),
            started=Min("created"),
        )
        .order_by("-started")[:RECENT_RUNS]
    )


# (name, bucket width, bucket count, label format): the last hour per minute and the last day
# per hour, both always drawn so the live fragment needs no state to refresh either. The day's
# labels carry the date: its span crosses midnight.
WINDOWS = (
    ("last hour", "minute", timedelta(minutes=1), 60, "%H:%M"),
    ("last day", "hour", timedelta(hours=1), 24, "%d %b %H:00"),
)


def run_charts(now):
    """Per window, one bounded query over RunRecord's started index; three charts each."""
    blocks = []
    for name, unit, width, count, fmt in WINDOWS:
        starts = charts.buckets(now, width, count)
        rows = RunRecord.objects.in_window(starts[0], starts[-1] + width).values(
            "started", "ended", "outcome", "waiting_since"
        )
        series = charts.run_series(rows, starts, width)
        labels = [start.strftime(fmt) for start in starts]
        blocks += [
            charts.chart_block(f"Runs per {unit}, {name}", labels, series["counts"], "no runs"),
            charts.chart_block(
                f"Run duration per {unit}, {name} (p95 drawn)",
                labels,
                series["duration"],
                "no runs",
                False,
            ),
            charts.chart_block(
                f"Event age when claimed per {unit}, {name} (p95 drawn)",
                labels,
                series["age"],
                "no runs",
                False,
            ),
        ]
    return blocks


def flow_charts(now):
    """Dead events (by when they died) and outbox messages sent, per bucket of both windows.

    The hour window lies inside the day's, so each kind is one bounded query over the day
    (event_dead_idx's partial index, outbox_sent_age_idx) bucketed twice; the held backlog is
    one count, as of now."""
    day = WINDOWS[-1]
    since = charts.buckets(now, day[2], day[3])[0]
    dead = list(
        Event.objects.dead()
        .filter(updated__gte=since, updated__lte=now)
        .values_list("updated", flat=True)
    )
    sent = list(
        OutboxMessage.objects.sent()
        .filter(sent_at__gte=since, sent_at__lte=now)
        .values_list("sent_at", flat=True)
    )
    held = OutboxMessage.objects.held().count()
    blocks = []
    for name, unit, width, count, fmt in WINDOWS:
        starts = charts.buckets(now, width, count)
        labels = [start.strftime(fmt) for start in starts]
        blocks += [
            charts.chart_block(
                f"Events gone dead per {unit}, {name}",
                labels,
                {"dead": charts.count_series(dead, starts, width)},
                "no dead events",
            ),
            charts.chart_block(
                f"Outbox sent per {unit}, {name}; {held} held now",
                labels,
                {"sent": charts.count_series(sent, starts, width)},
                "nothing sent",
            ),
        ]
    return blocks


def token_chart(rows):
    """Today's tokens per inbox against its budget, from the rows already read (no query)."""
    bars = [(row["slug"], row["tokens"].get("total", 0), row["budget"]) for row in rows]
    title = "Model tokens today per inbox, share of the daily budget"
    return (
        '<figure class="chart-block chart-wide">'
        f"<figcaption>{escape(title)}</figcaption>"
        + charts.budget_bars(title, bars, "no tokens today")
        + "</figure>"
    )


def dashboard_context(now):
    outbox = outbox_by_inbox()
    leases = list(
        Lease.objects.filter(until__gt=now).select_related("inbox").order_by("inbox__slug")
    )
    held_by = {lease.inbox_id: lease for lease in leases}
    usage, budgets, default_budget = tokens_by_inbox(now)
    rows = []
    for row in inbox_rows(now):
        messages = outbox.get(row["pk"], {})
        tokens = usage.get(row["pk"], {})
        budget = budgets.get(row["pk"]) or default_budget
        rows.append(
            {
                "pk": row["pk"],
                "slug": row["slug"],
                "counts": [(status, row[f"n_{status}"]) for status in STATUSES],
                "by_status": {status: row[f"n_{status}"] for status in STATUSES},
                "oldest_pending": row["oldest_pending"],
                "oldest_pending_age": now - row["oldest_pending"]
                if row["oldest_pending"]
                else None,
                "dead_24h": row["dead_24h"],
                "held": messages.get("held", 0),
                "failed": messages.get("failed", 0),
                "oldest_held": messages.get("oldest_held"),
                "lease": held_by.get(row["pk"]),
                "tokens": tokens,
                "budget": budget,
                "over_budget": bool(budget and tokens.get("total", 0) >= budget),
            }
        )
    totals = {status: sum(row["by_status"][status] for row in rows) for status in STATUSES}
    return {
        "now": now,
        "statuses": STATUSES,
        "rows": rows,
        "totals": totals,
        "dead_24h": sum(row["dead_24h"] for row in rows),
        "held": sum(row["held"] for row in rows),
        "failed": sum(row["failed"] for row in rows),
        "leases": leases,
        "tokens_today": sum(row["tokens"].get("total", 0) for row in rows),
        "token_rows": [row for row in rows if row["tokens"] or row["budget"]],
        "recent_runs": recent_runs(),
        "charts": run_charts(now) + flow_charts(now) + [token_chart(rows)],
    }


def dashboard_cursor() -> str:
    """The newest change with every lease's generation and how many are held: a run starting
    or ending anywhere moves it, as it moves the dashboard's counts."""
    leases = Lease.objects.aggregate(
        generations=Coalesce(Sum("generation"), 0),
        held=Count("pk", filter=Q(until__gt=Now()) & ~Q(holder="")),
    )
    return f"{live.global_cursor()}.{leases['generations']}.{leases['held']}"


@staff_member_required
# Every inbox's events at a glance: for staff who may view events, not any staff user (403).
# The admin index (alwayson/admin/index.html) shows the link on the same permission.
@permission_required("inbox.view_event", raise_exception=True)
def dashboard(request):
    cursor = dashboard_cursor()  # first: what is shown is at least as new
    context = {
        "cursor": cursor,
        **admin.site.each_context(request),
        "title": "Dashboard",
        **dashboard_context(clock.database_now()),
    }
    return render(request, "alwayson/admin/dashboard.html", context)
