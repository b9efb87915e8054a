"""Prometheus metrics: /metrics, behind a bearer token (ALWAYSON_METRICS_TOKEN).

Two sources, both read from the database at scrape, so any web process answers for the
whole deployment and every process's counts add up:

- **State** (gauges): counted at scrape by `DatabaseCollector`, each with one cheap query on
  an index the workers already use (tests/ops/test_metrics.py asserts the plans on PostgreSQL).
- **Happenings** (counters, histograms): counted in memory by the process where they happen
  (runs in a worker, timer fires in a scheduler, sends in a dispatcher, lease takeovers) and
  added to `MetricTotal` rows by an upsert that adds (`value = value + excluded.value`):
  every heartbeat from a loop process's beat thread (`ProcessBeat`), at once elsewhere (a web
  process, a test, a script). Never inside a run's transaction: what happens inside a
  transaction is counted when it commits (`on_commit`), so a rolled-back takeover or send
  is not counted. A process killed outright loses at most one heartbeat's counts.

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
