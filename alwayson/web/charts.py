"""Dashboard charts as inline SVG: pure functions from series to markup, no JS.

Every label goes through escape() because inbox names are the person's own text; each chart
carries a <title> and aria-label, and the numbers sit in a table beside it (the SVG is a
picture of the table, never the only place the numbers are).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from html import escape

from inbox.models import RunRecord

# done, failed, deferred: distinct in hue and in lightness, so they part without colour too.
PALETTE = ("#417690", "#ba2121", "#c9a227")


def buckets(now: datetime, width: timedelta, count: int) -> list[datetime]:
    """The starts of `count` buckets of `width` ending at the bucket holding `now`."""
    if count < 1 or width <= timedelta(0):
        raise ValueError("buckets needs count >= 1 and a positive width")
    epoch = datetime(2000, 1, 1, tzinfo=now.tzinfo)
    last = epoch + ((now - epoch) // width) * width
    return [last - width * (count - 1 - i) for i in range(count)]


def bucket_of(moment: datetime, starts: list[datetime], width: timedelta) -> int | None:
    """The index of the bucket holding `moment`, or None outside the window."""
    if not starts or moment < starts[0] or moment >= starts[-1] + width:
        return None
    return int((moment - starts[0]) // width)


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100); None for no values, so a gap is not a zero."""
    if not 0 <= p <= 100:
        raise ValueError(f"percentile p must be in 0..100, got {p}")
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def number(value: float) -> str:
    """A chart's number as a person reads it: whole numbers with thousands separators, and
    below 10 two significant digits (a p95 of 0.592627 s reads 0.59)."""
    if value == int(value):
        return f"{int(value):,}"
    if abs(value) >= 10:
        return f"{value:,.0f}"
    return f"{value:.2g}"


def bar_chart(title: str, labels: list[str], series: dict[str, list[float]], empty: str) -> str:
    """Stacked bars, one per label; `series` maps a name to one value per label.

    With nothing to show the chart says `empty` (e.g. "no runs") instead of drawing axes.
    """
    for name, values in series.items():
        if len(values) != len(labels):
            raise ValueError(f"series {name!r} has {len(values)} values for {len(labels)} labels")
    totals = [sum((series[n][i] or 0) for n in series) for i in range(len(labels))]
    w, h = 300, 100
    head = (
        f'<svg class="chart" viewBox="0 0 {w} {h}" width="100%" role="img" '
        f'aria-label="{escape(title)}" preserveAspectRatio="none">'
        f"<title>{escape(title)}</title>"
    )
    if not labels or max(totals, default=0) <= 0:
        return (
            head
            + f'<text x="{w // 2}" y="{h // 2}" text-anchor="middle">{escape(empty)}</text></svg>'
        )
    top = max(totals)
    step = w / len(labels)
    parts = [head]
    for i, label in enumerate(labels):
        y = h
        for k, name in enumerate(series):
            value = series[name][i] or 0
            if value <= 0:
                continue
            bar = h * value / top
            y -= bar
            parts.append(
                f'<rect class="s{k}" fill="{PALETTE[k % len(PALETTE)]}" '
                f'x="{i * step:.2f}" y="{y:.2f}" width="{step * 0.9:.2f}" '
                f'height="{bar:.2f}">'
                f"<title>{escape(label)} {escape(name)}: {number(value)}</title></rect>"
            )
    parts.append("</svg>")
    return "".join(parts)


def table(caption: str, labels: list[str], series: dict[str, list[float | None]]) -> str:
    """The chart's numbers as a (visually hidden when styled so) table; None shows as a dash."""
    rows = "".join(
        '<tr><th scope="row">'
        + escape(label)
        + "</th>"
        + "".join(
            f"<td>{'–' if series[n][i] is None else number(series[n][i])}</td>" for n in series
        )
        + "</tr>"
        for i, label in enumerate(labels)
    )
    head = "".join(f'<th scope="col">{escape(n)}</th>' for n in series)
    return (
        f'<table class="chart-numbers"><caption>{escape(caption)}</caption>'
        f"<thead><tr><th></th>{head}</tr></thead><tbody>{rows}</tbody></table>"
    )


Outcome = RunRecord.Outcome
FAILED = (Outcome.ERROR, Outcome.REFUSED, Outcome.LOST)


def run_series(rows, starts: list[datetime], width: timedelta) -> dict:
    """Per bucket: runs done / failed (error, refused, lost) / deferred, duration and claim-age
    p50/p95 in seconds. `rows` are dicts with started, ended, outcome, waiting_since."""
    n = len(starts)
    done, failed, deferred = [0] * n, [0] * n, [0] * n
    durations = [[] for _ in range(n)]
    ages = [[] for _ in range(n)]
    for row in rows:
        i = bucket_of(row["started"], starts, width)
        if i is None:
            continue
        outcome = row["outcome"]
        (done if outcome == Outcome.DONE else failed if outcome in FAILED else deferred)[i] += 1
        durations[i].append((row["ended"] - row["started"]).total_seconds())
        if row["waiting_since"] is not None:
            ages[i].append((row["started"] - row["waiting_since"]).total_seconds())
    return {
        "counts": {"done": done, "error/refused/lost": failed, "deferred": deferred},
        "duration": {
            "p50 s": [percentile(d, 50) for d in durations],
            "p95 s": [percentile(d, 95) for d in durations],
        },
        "age": {
            "p50 s": [percentile(a, 50) for a in ages],
            "p95 s": [percentile(a, 95) for a in ages],
        },
    }


def budget_bars(title: str, rows: list[tuple[str, int, int | None]], empty: str) -> str:
    """Horizontal bars, one per (label, used, budget): the share of its budget used, capped at
    full width and red when reached; without a budget, the share of the largest use. The
    percentage is floored so an inbox is shown at 100% only once it has reached its budget."""
    rows = [(label, used, budget) for label, used, budget in rows if used or budget]
    if not rows:
        return f'<p class="chart-empty">{escape(empty)}</p>'
    most = max(used for _, used, _ in rows) or 1
    # Drawn no wider than its viewBox (dashboard.css), so a label's 12 units stay about
    # 12 px on a desk and no less than 10 on a phone, rather than growing with the column.
    row_h, w = 24, 400
    h = row_h * len(rows)
    parts = [
        f'<svg class="chart bars" viewBox="0 0 {w} {h}" width="100%" role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
    ]
    for k, (label, used, budget) in enumerate(rows):
        if budget:
            share = used / budget
            text = f"{label}: {used:,} of {budget:,} ({math.floor(100 * share)}%)"
        else:
            share = used / most
            text = f"{label}: {used:,} (no budget)"
        over = bool(budget) and used >= budget
        y = k * row_h
        parts.append(
            f'<rect fill="#eee" x="0" y="{y + 2}" width="{w}" height="{row_h - 4}"></rect>'
            f'<rect class="{"over" if over else "used"}" '
            f'fill="{PALETTE[1] if over else PALETTE[0]}" x="0" y="{y + 2}" '
            f'width="{w * min(share, 1):.2f}" height="{row_h - 4}"><title>{escape(text)}</title>'
            f'</rect><text x="4" y="{y + row_h - 8}" font-size="12">{escape(text)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def count_series(moments, starts: list[datetime], width: timedelta) -> list[int]:
    """How many of `moments` fall in each bucket; those outside the window are dropped."""
    counts = [0] * len(starts)
    for moment in moments:
        i = bucket_of(moment, starts, width)
        if i is not None:
            counts[i] += 1
    return counts


def chart_block(title: str, labels: list[str], series: dict, empty: str, stacked=True) -> str:
    """One chart with its axes and legend, and its numbers. Percentile series are drawn as p95
    bars (p50 in the table)."""
    drawn = series if stacked else {k: v for k, v in list(series.items())[-1:]}
    clean = {k: [v or 0 for v in vs] for k, vs in drawn.items()}
    return (
        '<figure class="chart-block">'
        + f"<figcaption>{escape(title)}</figcaption>"
        + legend(drawn)
        + axes(bar_chart(title, labels, clean, empty), labels, clean)
        + "<details><summary>Numbers</summary>"
        + table(title, labels, series)
        + "</details></figure>"
    )


def legend(series: dict) -> str:
    """Each drawn series' colour and name, in the bars' stacking order (bottom first)."""
    items = "".join(
        f'<li><span class="swatch" style="background:{PALETTE[k % len(PALETTE)]}"></span>'
        f"{escape(name)}</li>"
        for k, name in enumerate(series)
    )
    return f'<ul class="chart-legend">{items}</ul>'


def axes(svg: str, labels: list[str], series: dict) -> str:
    """The chart between its scale and its time span, as HTML beside the SVG: text inside a
    stretched (preserveAspectRatio="none") SVG would stretch with it. The scale is the tallest
    stack, the bar that reaches the top; the span is the first and last bucket's label."""
    totals = [sum(values[i] for values in series.values()) for i in range(len(labels))]
    top = max(totals, default=0)
    if top <= 0:
        return svg
    return (
        '<div class="chart-frame">'
        f'<div class="chart-y" aria-hidden="true"><span>{number(top)}</span><span>0</span></div>'
        f"{svg}"
        f'<div class="chart-x" aria-hidden="true"><span>{escape(labels[0])}</span>'
        f"<span>{escape(labels[-1])}</span></div></div>"
    )
