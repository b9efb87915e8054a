"""OpenTelemetry traces, off unless an OTLP endpoint is configured.

A leaf module of the lowest layer: it imports only opentelemetry, so inbox, outbox, the
runtime, the Claude agent and the pages may all open spans. The inbox app's ready() calls
configure(), once per process.
When tracing is off every helper here is a cheap no-op: no exporter is built,
``span`` yields None and ``traceparent`` returns "".
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_propagator = TraceContextTextMapPropagator()
_provider: Any = None  # the SDK TracerProvider once configure() turned tracing on


def endpoint_configured() -> bool:
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def configure(*, exporter: Any = None, force: bool = False) -> bool:
    """Turn tracing on once per process; a no-op when no endpoint is set.

    Tests pass their own ``exporter`` (in-memory or a loopback OTLP one);
    ``force`` replaces a provider configured earlier in the same process.
    Returns whether tracing is on.
    """
    global _provider
    if _provider is not None and not force:
        return True
    if exporter is None:
        if not endpoint_configured():
            return False
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()  # reads the OTEL_EXPORTER_OTLP_* variables itself
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(
        resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "alwayson")})
    )
    # Tests want spans exported as they end; production batches them off the hot path.
    processor = SimpleSpanProcessor(exporter) if force else BatchSpanProcessor(exporter)
    provider.add_span_processor(processor)
    _provider = provider
    return True


def shutdown() -> None:
    """Flush and drop the provider (tests, and process exit)."""
    global _provider
    if _provider is not None:
        _provider.shutdown()
    _provider = None


def force_flush() -> None:
    if _provider is not None:
        _provider.force_flush()


def enabled() -> bool:
    return _provider is not None


def trace_content() -> bool:
    """Whether message content may go into spans (off by default: it is the users')."""
    from django.conf import settings

    return bool(getattr(settings, "ALWAYSON_TRACE_CONTENT", False))


@contextlib.contextmanager
def span(
    name: str,
    *,
    kind: trace.SpanKind = trace.SpanKind.INTERNAL,
    parent: str = "",
    links: tuple[str, ...] | list[str] = (),
    **attrs: Any,
) -> Iterator[Any]:
    """A span around the block, or nothing at all when tracing is off.

    ``parent`` is a W3C traceparent to continue (an event's, stored at ingest);
    ``links`` are traceparents of other causes (the other events of a run).
    Attribute names may use "__" for "." (``gen_ai__operation__name=...``).
    """
    if _provider is None:
        yield None
        return
    tracer = _provider.get_tracer("alwayson")
    ctx = context_from(parent) if parent else None
    span_links = [trace.Link(c) for c in (_span_context(tp) for tp in links) if c is not None]
    clean = {k.replace("__", "."): v for k, v in attrs.items() if v is not None}
    with tracer.start_as_current_span(
        name, context=ctx, kind=kind, links=span_links, attributes=clean
    ) as current:
        yield current


def traceparent() -> str:
    """The W3C traceparent of the current span, "" when off or outside a span."""
    if _provider is None:
        return ""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent", "")


def context_from(value: str) -> otel_context.Context | None:
    """A context whose current span is the one ``value`` (a traceparent) names."""
    if not value:
        return None
    return _propagator.extract({"traceparent": value})


def _span_context(value: str) -> trace.SpanContext | None:
    ctx = context_from(value)
    if ctx is None:
        return None
    sc = trace.get_current_span(ctx).get_span_context()
    return sc if sc.is_valid else None
