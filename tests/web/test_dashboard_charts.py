"""The dashboard's charts: bucketing and percentiles on a fixed `now`, the SVG's escaping and
empty state, and the run window the charts read (bounded, one query however many rows)."""

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from alwayson.web import charts
from alwayson.web.dashboard import run_charts
from inbox.models import Inbox, RunRecord

NOW = datetime(2026, 12, 2, 14, 7, 30, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def test_buckets_end_at_the_bucket_holding_now():
    starts = charts.buckets(NOW, MINUTE, 60)
    assert len(starts) == 60
    assert starts[-1] == datetime(2026, 12, 2, 14, 7, tzinfo=UTC)
    assert starts[0] == datetime(2026, 12, 2, 13, 8, tzinfo=UTC)


def test_a_moment_lands_in_its_bucket_and_outside_the_window_in_none():
    starts = charts.buckets(NOW, MINUTE, 60)
    assert charts.bucket_of(NOW, starts, MINUTE) == 59
    assert charts.bucket_of(starts[0], starts, MINUTE) == 0
    assert charts.bucket_of(starts[0] - timedelta(seconds=1), starts, MINUTE) is None
    assert charts.bucket_of(starts[-1] + MINUTE, starts, MINUTE) is None


def test_buckets_refuse_a_zero_width():
    with pytest.raises(ValueError, match="positive width"):
        charts.buckets(NOW, timedelta(0), 3)


def test_percentiles_are_nearest_rank_and_none_for_no_values():
    values = [float(v) for v in range(1, 101)]
    assert charts.percentile(values, 50) == 50
    assert charts.percentile(values, 95) == 95
    assert charts.percentile([7.0], 95) == 7
    assert charts.percentile([], 50) is None
    with pytest.raises(ValueError, match="0..100"):
        charts.percentile(values, 101)


def test_an_empty_window_says_no_runs():
    svg = charts.bar_chart("Runs per minute", ["14:06", "14:07"], {"done": [0, 0]}, "no runs")
    assert "no runs" in svg and "<rect" not in svg
    assert 'viewBox="0 0 300 100"' in svg and 'width="100%"' in svg


def test_the_svg_escapes_names_and_carries_a_title():
    name = '<script>alert("x")</script>'
    svg = charts.bar_chart(f"Tokens of {name}", [name], {"tokens": [5]}, "no tokens")
    assert "<script>" not in svg
    assert "&lt;script&gt;" in svg
    assert svg.count("<rect") == 1
    assert "<title>Tokens of &lt;script&gt;" in svg


def test_stacked_bars_split_by_outcome_and_the_table_keeps_the_numbers():
    svg = charts.bar_chart("Runs", ["a", "b"], {"done": [3, 0], "failed": [1, 2]}, "no runs")
    assert svg.count("<rect") == 3
    html = charts.table("Runs", ["a", "b"], {"p50": [1.5, None]})
    assert "<td>1.5</td>" in html and "<td>–</td>" in html


def test_a_chart_shows_its_scale_its_time_span_and_a_legend_in_stacking_order():
    block = charts.chart_block(
        "Runs per minute", ["14:05", "14:06", "14:07"],
        {"done": [3, 0, 1], "failed": [1, 2, 0]}, "no runs",
    )  # fmt: skip
    # The tallest stack (3 + 1) tops the scale; the span runs from the first bucket to the last.
    assert '<div class="chart-y" aria-hidden="true"><span>4</span><span>0</span></div>' in block
    assert '<div class="chart-x" aria-hidden="true"><span>14:05</span><span>14:07</span>' in block
    legend = block[block.index('<ul class="chart-legend">') : block.index("</ul>")]
    assert legend.index("done") < legend.index("failed")
    assert charts.PALETTE[0] in legend and charts.PALETTE[1] in legend


def test_an_empty_chart_draws_no_scale_and_a_percentile_chart_scales_to_its_p95():
    empty = charts.chart_block("Runs", ["14:06", "14:07"], {"done": [0, 0]}, "no runs")
    assert "no runs" in empty and "chart-y" not in empty
    durations = charts.chart_block(
        "Duration", ["a", "b"], {"p50 s": [1.0, 2.0], "p95 s": [1.5, 7.25]}, "no runs", False
    )
    assert "<span>7.2</span><span>0</span>" in durations
    assert "p50 s" not in durations.split("<details>")[0]


def test_a_scale_and_the_numbers_are_rounded_as_a_person_reads_them():
    durations = charts.chart_block(
        "Duration", ["a", "b"], {"p50 s": [0.31, 0.4], "p95 s": [0.592627, 0.5]}, "no runs", False
    )
    assert '<div class="chart-y" aria-hidden="true"><span>0.59</span>' in durations
    assert "<td>0.59</td>" in durations and "592627" not in durations
    assert [charts.number(v) for v in (0.0012, 3.14159, 12.5, 1234.5, 25000.0, 4.0)] == [
        "0.0012", "3.1", "12", "1,234", "25,000", "4",
    ]  # fmt: skip


@pytest.mark.django_db
def test_the_day_charts_span_says_the_date_and_the_hours_the_time(inboxes):
    make_run(inboxes[0], 1, NOW - timedelta(minutes=3))
    blocks = run_charts(NOW)
    hour, day = blocks[0], blocks[3]
    assert '<div class="chart-x" aria-hidden="true"><span>13:08</span><span>14:07</span>' in hour
    assert "<span>01 Dec 15:00</span><span>02 Dec 14:00</span>" in day


def test_a_series_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="has 1 values for 2 labels"):
        charts.bar_chart("Runs", ["a", "b"], {"done": [1]}, "no runs")


def make_run(inbox, generation, started, outcome="done"):
    return RunRecord.objects.create(
        inbox=inbox,
        generation=generation,
        worker="w",
        started=started,
        ended=started + timedelta(seconds=2),
        outcome=outcome,
        waiting_since=started - timedelta(seconds=5),
    )


@pytest.fixture
def inboxes():
    users = get_user_model()
    mine = Inbox.objects.create(owner=users.objects.create_user("me@x", "me@x"), slug="mine")
    theirs = Inbox.objects.create(owner=users.objects.create_user("you@x", "you@x"), slug="theirs")
    return mine, theirs


@pytest.mark.django_db
def test_the_window_holds_only_runs_started_in_it_and_only_the_owners(inboxes):
    mine, theirs = inboxes
    since = NOW - timedelta(hours=1)
    inside = make_run(mine, 1, NOW - timedelta(minutes=3))
    make_run(mine, 2, since - timedelta(seconds=1))
    make_run(mine, 3, NOW)  # until is exclusive
    make_run(theirs, 1, NOW - timedelta(minutes=3))
    rows = RunRecord.objects.filter(inbox__owner=mine.owner).in_window(since, NOW)
    assert list(rows) == [inside]


@pytest.mark.django_db
def test_the_window_refuses_an_inverted_range():
    with pytest.raises(ValueError, match="since < until"):
        RunRecord.objects.in_window(NOW, NOW)


@pytest.mark.django_db
def test_the_window_reads_in_one_query_however_many_rows(inboxes):
    mine, _ = inboxes
    since = NOW - timedelta(hours=1)

    def read():
        with CaptureQueriesContext(connection) as ctx:
            list(RunRecord.objects.of_inbox(mine.id).in_window(since, NOW))
        return len(ctx)

    make_run(mine, 1, NOW - MINUTE)
    few = read()
    for g in range(2, 30):
        make_run(mine, g, NOW - MINUTE * (g % 50 + 1), "error")
    assert read() == few == 1


def test_run_series_buckets_outcomes_and_takes_percentiles_per_minute():
    starts = charts.buckets(NOW, MINUTE, 3)
    base = starts[0]
    rows = [
        {
            "started": base + timedelta(seconds=10 * k),
            "ended": base + timedelta(seconds=10 * k + k + 1),
            "outcome": "done" if k < 4 else "lost",
            "waiting_since": base + timedelta(seconds=10 * k - 2 * (k + 1)),
        }
        for k in range(5)
    ] + [{"started": starts[2], "ended": starts[2], "outcome": "deferred", "waiting_since": None}]
    series = charts.run_series(rows, starts, MINUTE)
    assert series["counts"] == {
        "done": [4, 0, 0],
        "error/refused/lost": [1, 0, 0],
        "deferred": [0, 0, 1],
    }
    assert series["duration"]["p50 s"] == [3.0, None, 0.0]
    assert series["duration"]["p95 s"] == [5.0, None, 0.0]
    assert series["age"]["p95 s"] == [10.0, None, None]


@pytest.mark.django_db
def test_the_dashboard_says_no_runs_for_an_empty_hour(admin_client):
    from django.urls import reverse

    body = admin_client.get(reverse("admin-dashboard")).content.decode()
    assert body.count(">no runs</text>") == 6
    assert body.count(">no dead events</text>") == 2
    assert "Runs per minute, last hour" in body
    assert "Runs per hour, last day" in body


@pytest.mark.django_db
def test_the_dashboard_charts_runs_and_its_queries_do_not_grow_with_them(admin_client, inboxes):
    from django.urls import reverse

    from inbox import clock

    mine, theirs = inboxes
    now = clock.database_now()
    path = reverse("admin-dashboard")

    def queries():
        with CaptureQueriesContext(connection) as ctx:
            body = admin_client.get(path).content.decode()
        return len(ctx), body

    make_run(mine, 1, now - MINUTE)
    few, body = queries()
    assert body.count(">no runs</text>") == 0
    for g in range(2, 40):
        make_run(mine if g % 2 else theirs, g, now - MINUTE * (g % 50 + 1), "error")
    many, body = queries()
    assert many == few
    assert "error/refused/lost: 1" in body


@pytest.mark.django_db
def test_the_day_charts_bucket_runs_by_hour_and_the_hour_charts_ignore_older_ones(inboxes):
    from alwayson.web.dashboard import run_charts

    mine, _ = inboxes
    make_run(mine, 1, NOW - timedelta(hours=3))  # 11:07: only in the day window
    make_run(mine, 2, NOW - MINUTE, "error")  # 14:06: in both
    make_run(mine, 3, NOW - timedelta(hours=25))  # outside both
    with CaptureQueriesContext(connection) as ctx:
        blocks = run_charts(NOW)
    assert len(ctx) == 2
    assert len(blocks) == 6
    hour_runs, day_runs = blocks[0], blocks[3]
    assert (
        "Runs per minute, last hour" in hour_runs
        and "<title>14:06 error/refused/lost: 1" in hour_runs
    )
    assert "11:00 done" not in hour_runs
    assert "Runs per hour, last day" in day_runs
    assert "<title>02 Dec 11:00 done: 1</title>" in day_runs
    assert "<title>02 Dec 14:00 error/refused/lost: 1</title>" in day_runs
    assert day_runs.count("<rect") == 2


def test_count_series_counts_moments_per_bucket_and_drops_those_outside():
    starts = charts.buckets(NOW, MINUTE, 3)
    moments = [
        starts[0],
        starts[0] + timedelta(seconds=59),
        starts[2],
        starts[0] - MINUTE,
        NOW + MINUTE,
    ]
    assert charts.count_series(moments, starts, MINUTE) == [2, 0, 1]


def make_event(inbox, n, status, updated):
    from inbox.models import Event

    return Event.objects.create(
        inbox=inbox,
        source="test",
        source_id=str(n),
        status=status,
        available_at=updated,
        created=updated,
        updated=updated,
    )


def make_message(inbox, status, sent_at=None):
    from outbox.models import OutboxMessage

    return OutboxMessage.objects.create(
        inbox=inbox, body="b", status=status, created=NOW - timedelta(hours=2), sent_at=sent_at
    )


@pytest.mark.django_db
def test_flow_charts_count_dead_events_and_sent_messages_and_the_held_backlog(inboxes):
    from alwayson.web.dashboard import flow_charts

    mine, theirs = inboxes

    def read():
        with CaptureQueriesContext(connection) as ctx:
            blocks = flow_charts(NOW)
        return len(ctx), blocks

    make_event(mine, 1, "dead", NOW - MINUTE)  # 14:06, in both windows
    make_event(theirs, 2, "dead", NOW - timedelta(hours=2))  # 12:07, day only
    make_event(mine, 3, "done", NOW - MINUTE)  # not dead
    make_event(mine, 4, "dead", NOW - timedelta(hours=30))  # outside both
    make_message(mine, "sent", NOW - timedelta(minutes=2))  # 14:05
    make_message(mine, "held")
    make_message(theirs, "held")
    few, blocks = read()
    hour_dead, hour_sent, day_dead, day_sent = blocks
    assert "<title>14:06 dead: 1</title>" in hour_dead and hour_dead.count("<rect") == 1
    assert day_dead.count("<rect") == 2 and "<title>02 Dec 12:00 dead: 1</title>" in day_dead
    assert "<title>14:05 sent: 1</title>" in hour_sent
    assert "2 held now" in hour_sent and "<title>02 Dec 14:00 sent: 1</title>" in day_sent
    for n in range(5, 40):
        make_event(mine, n, "dead", NOW - MINUTE * n)
        make_message(theirs, "sent", NOW - MINUTE * n)
    many, _ = read()
    assert many == few == 3


@pytest.mark.django_db
def test_flow_charts_say_so_when_nothing_died_or_was_sent():
    from alwayson.web.dashboard import flow_charts

    blocks = flow_charts(NOW)
    assert sum(">no dead events</text>" in b for b in blocks) == 2
    assert sum(">nothing sent</text>" in b for b in blocks) == 2
    assert "0 held now" in blocks[1]


def test_budget_bars_show_the_floored_share_and_cap_an_inbox_over_its_budget():
    svg = charts.budget_bars(
        "Tokens",
        [("a", 999, 1000), ("b", 1500, 1000), ("c", 50, None), ("idle", 0, None)],
        "no tokens today",
    )
    assert "a: 999 of 1,000 (99%)" in svg
    assert "b: 1,500 of 1,000 (150%)" in svg
    assert "c: 50 (no budget)" in svg
    assert "idle" not in svg
    assert 'width="399.60"' in svg  # a: 99.9% of 400
    assert (
        svg.count('class="over"') == 1
        and 'class="over" fill="#ba2121" x="0" y="26" width="400.00"' in svg
    )
    assert 'width="13.33"' in svg  # c: 50 of the largest use 1500


def test_budget_bars_escape_the_inbox_name_and_say_when_there_is_nothing():
    svg = charts.budget_bars("Tokens", [("<b>x</b>", 5, 10)], "none")
    assert "<b>" not in svg and "&lt;b&gt;x&lt;/b&gt;: 5 of 10 (50%)" in svg
    assert charts.budget_bars("Tokens", [("a", 0, None)], "no tokens today") == (
        '<p class="chart-empty">no tokens today</p>'
    )


@pytest.mark.django_db
def test_the_dashboard_draws_tokens_today_against_each_budget_in_constant_queries(
    admin_client, inboxes, settings
):
    from django.urls import reverse

    from alwayson.claude.models import ModelCall
    from alwayson.runtime.models import AgentConfig
    from inbox import clock

    settings.ALWAYSON_CLAUDE_DAILY_TOKEN_BUDGET = None
    mine, theirs = inboxes
    AgentConfig.objects.create(inbox=mine, daily_token_budget=1000)
    now = clock.database_now()
    path = reverse("admin-dashboard")

    def call(inbox, tokens):
        n = ModelCall.objects.count()
        return ModelCall.objects.create(
            inbox=inbox,
            request_key=f"k{n}",
            generation=n + 1,
            model="m",
            response={},
            input_tokens=tokens,
            created=now,
        )

    def queries():
        with CaptureQueriesContext(connection) as ctx:
            body = admin_client.get(path).content.decode()
        return len(ctx), body

    call(mine, 250)
    few, body = queries()
    assert "mine: 250 of 1,000 (25%)" in body
    for _ in range(5):
        call(theirs, 10)
    many, body = queries()
    assert many == few
    assert "theirs: 50 (no budget)" in body
