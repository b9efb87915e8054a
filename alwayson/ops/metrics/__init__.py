"""Prometheus metrics: /metrics, behind a bearer token (ALWAYSON_METRICS_TOKEN).

Both sources are read from the database at scrape, so any web process answers for the whole
deployment (docs/explanation/design.md, "Metrics are gathered from the database"): state
(gauges), one query each on an index the workers already use; happenings (counters,
histograms), counted in memory where they happen, on commit, and added to `MetricTotal` rows
by each heartbeat (at once outside a loop process). A process killed outright loses at most
one heartbeat's counts.

The parts: recorder.py (a process's counts until they are added), series.py (counters and
histograms), happenings.py (what is counted), collector.py (the scrape), middleware.py (the
endpoint). This module is their façade.
"""

from .collector import DEAD_WINDOW, DatabaseCollector, exposition
from .happenings import (
    APPROVALS_SETTLED,
    FINISHES_REFUSED,
    LEASE_TAKEOVERS,
    PERSISTED,
    RUN_DURATION,
    RUN_EVENTS,
    RUN_OUTCOMES,
    SEND_LATENCY,
    TIMER_LAG,
    connect_signals,
    record_run,
)
from .middleware import MetricsMiddleware
from .recorder import Recorder, flush, flush_periodically
from .series import Counter, Histogram

__all__ = [
    "APPROVALS_SETTLED",
    "DEAD_WINDOW",
    "FINISHES_REFUSED",
    "LEASE_TAKEOVERS",
    "PERSISTED",
    "RUN_DURATION",
    "RUN_EVENTS",
    "RUN_OUTCOMES",
    "SEND_LATENCY",
    "TIMER_LAG",
    "Counter",
    "DatabaseCollector",
    "Histogram",
    "MetricsMiddleware",
    "Recorder",
    "connect_signals",
    "exposition",
    "flush",
    "flush_periodically",
    "record_run",
]
