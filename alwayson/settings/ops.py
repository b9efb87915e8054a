"""Operations: process heartbeats and /healthz (alwayson/ops/health.py), /metrics
(alwayson/ops/metrics/), and the alerts of dead events (alwayson/ops/alerts.py)."""

from . import env

# Loop processes (runworker, runscheduler, rundispatcher) write a heartbeat row this often;
# one is live while its last beat is within HEALTH_LIVE_BEATS intervals (alwayson/ops/models.py).
ALWAYSON_HEARTBEAT_INTERVAL = env.seconds("ALWAYSON_HEARTBEAT_INTERVAL", 5, env.MAX_WAIT)
# Kinds of loop process /healthz and `manage.py status` require at least one live of.
ALWAYSON_HEALTH_REQUIRE = env.subset(
    "ALWAYSON_HEALTH_REQUIRE",
    ["worker", "scheduler", "dispatcher"],
    ["worker", "scheduler", "dispatcher"],
)
# /metrics answers only a scrape that brings this bearer token; unset, the endpoint is off
# (404).
ALWAYSON_METRICS_TOKEN = env.bearer_token("ALWAYSON_METRICS_TOKEN")
# An inbox's operators hear of its dead events at most once per this many seconds: one email
# each (alwayson/ops/alerts.py), counting every event that went dead since the last one.
ALWAYSON_DEAD_ALERT_INTERVAL = env.seconds("ALWAYSON_DEAD_ALERT_INTERVAL", 3600, env.MAX_INTERVAL)
# OpenTelemetry traces (inbox/tracing.py) are on when OTEL_EXPORTER_OTLP_ENDPOINT or
# OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set; spans carry message content only when this is on,
# since the messages are the users'.
ALWAYSON_TRACE_CONTENT = env.strict_bool("ALWAYSON_TRACE_CONTENT", False)
