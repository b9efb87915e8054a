"""The tracing leaf: off costs nothing, on exports OTLP/HTTP spans with parents and links."""

from inbox import tracing


def test_off_without_an_endpoint_builds_nothing_and_spans_are_free(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    tracing.shutdown()
    assert tracing.configure() is False
    assert not tracing.enabled()
    with tracing.span("invoke_agent x", gen_ai__agent__name="x") as current:
        assert current is None
        assert tracing.traceparent() == ""


def test_an_endpoint_in_the_environment_turns_tracing_on(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9/v1/traces")
    tracing.shutdown()
    try:
        assert tracing.configure() is True
        assert tracing.enabled()
    finally:
        tracing.shutdown()


def test_spans_continue_a_stored_traceparent_and_link_the_others(receiver):
    with tracing.span("POST /hooks", kind=tracing.trace.SpanKind.SERVER):
        first = tracing.traceparent()
    with tracing.span("other"):
        second = tracing.traceparent()
    assert first.startswith("00-") and len(first) == 55
    with tracing.span(
        "invoke_agent helper", parent=first, links=[second], gen_ai__agent__name="helper"
    ):
        run = tracing.traceparent()
    tracing.force_flush()

    by_name = {s.name: s for s in receiver}
    request, other, invoke = (
        by_name["POST /hooks"],
        by_name["other"],
        by_name["invoke_agent helper"],
    )
    assert invoke.trace_id == request.trace_id
    assert invoke.parent_span_id == request.span_id
    assert [link.span_id for link in invoke.links] == [other.span_id]
    assert {a.key: a.value.string_value for a in invoke.attributes} == {
        "gen_ai.agent.name": "helper"
    }
    assert run.split("-")[2] == invoke.span_id.hex()


def test_a_malformed_traceparent_starts_a_new_trace_rather_than_failing(receiver):
    with tracing.span("invoke_agent helper", parent="garbage", links=["nope"]):
        pass
    tracing.force_flush()
    (only,) = receiver
    assert only.parent_span_id == b""
    assert list(only.links) == []
