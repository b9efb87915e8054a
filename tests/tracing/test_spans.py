"""The spans alwayson opens: the worker's invoke_agent run, the Claude agent's chat and
execute_tool spans inside it. Exported through the loopback OTLP receiver (conftest.py)."""

import pytest
from django.test import Client

from alwayson.runtime.api import ingest
from alwayson.runtime.worker import Worker
from alwayson.testing.model import message, tool_use, usage
from inbox import tracing
from inbox.models import RunRecord
from tests.support.otlp import attributes
from tests.support.webhooks import STANDARD_SECRET, post, standard_headers


def saying_agent(run):
    run.say("hello")


@pytest.mark.django_db
def test_a_worker_step_exports_one_invoke_agent_span_with_the_runs_attributes(receiver, inbox):
    ingest(inbox, "chat", "m1", {})
    ingest(inbox, "chat", "m2", {})

    result = Worker("w1", saying_agent).step()
    tracing.force_flush()

    (run,) = receiver
    name = f"{__name__}.saying_agent"
    assert run.name == f"invoke_agent {name}"
    assert run.kind == run.SPAN_KIND_INTERNAL
    assert attributes(run) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": name,
        "alwayson.inbox": inbox.slug,
        "alwayson.generation": result.generation,
        "alwayson.events": 2,
        "alwayson.outcome": "done",
        "alwayson.outcome.detail": "said 1",
    }
    # The run's record names the span: from a record to its trace, and back.
    record = RunRecord.objects.get(inbox=inbox, generation=result.generation)
    assert record.trace.startswith(f"00-{run.trace_id.hex()}-{run.span_id.hex()}-")
    assert record.produced["said"] == 1


@pytest.mark.django_db
def test_an_agent_with_a_name_is_traced_by_it_and_its_failure_is_the_outcome(receiver, inbox):
    class Failing:
        name = "refunds"

        def __call__(self, run):
            raise RuntimeError("boom")

    ingest(inbox, "chat", "m1", {})

    result = Worker("w1", Failing()).step()
    tracing.force_flush()

    (run,) = receiver
    assert run.name == "invoke_agent refunds"
    assert result.outcome == "error: RuntimeError: boom"
    assert attributes(run)["alwayson.outcome"] == "error"
    assert attributes(run)["alwayson.outcome.detail"] == "RuntimeError: boom"


@pytest.mark.django_db
def test_with_tracing_off_a_worker_step_exports_nothing(receiver, inbox):
    tracing.shutdown()
    ingest(inbox, "chat", "m1", {})

    result = Worker("w1", saying_agent).step()

    assert result.events == 1
    assert not tracing.enabled()
    assert receiver == []


def claude_run(messages_api, claude_inbox, slug="support"):
    """One Claude run that makes one allowed tool call (a refund) and then answers."""
    inbox = claude_inbox(slug)
    ingest(inbox, "chat", "m1", {"text": "refund 20 on order 7", "from": "owner"})
    call = tool_use("refund", {"order": "7", "amount": 20})
    messages_api.reply(
        message(call, tokens=usage(input_tokens=120, output_tokens=30)), message("Refunded.")
    )
    Worker("w1").step()
    tracing.force_flush()
    return call


@pytest.mark.django_db
def test_the_claude_agents_calls_and_tools_are_children_of_the_run(
    receiver, messages_api, claude_inbox
):
    call = claude_run(messages_api, claude_inbox)

    (run,) = [s for s in receiver if s.name.startswith("invoke_agent ")]
    chats = [s for s in receiver if s.name.startswith("chat ")]
    (tool,) = [s for s in receiver if s.name.startswith("execute_tool ")]
    assert len(receiver) == 4 and len(chats) == 2
    for child in (*chats, tool):
        assert child.trace_id == run.trace_id
        assert child.parent_span_id == run.span_id

    model = messages_api.messages_requests[0].body["model"]
    first = min(chats, key=lambda s: s.start_time_unix_nano)
    assert first.name == f"chat {model}"
    assert first.kind == first.SPAN_KIND_CLIENT
    assert attributes(first) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": model,
        "gen_ai.response.model": "claude-sonnet-5-5",
        "gen_ai.response.id": attributes(first)["gen_ai.response.id"],
        "gen_ai.usage.input_tokens": 120,
        "gen_ai.usage.output_tokens": 30,
        "gen_ai.response.finish_reasons": ["tool_use"],
    }
    assert attributes(first)["gen_ai.response.id"].startswith("msg_loopback_")

    assert tool.name == "execute_tool refund"
    assert tool.kind == tool.SPAN_KIND_INTERNAL
    assert attributes(tool) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "refund",
        "gen_ai.tool.call.id": call["id"],
    }
    # The tool ran between the two calls, inside the run.
    assert first.end_time_unix_nano <= tool.start_time_unix_nano
    assert tool.end_time_unix_nano <= max(c.start_time_unix_nano for c in chats)


@pytest.mark.django_db
def test_message_content_goes_into_chat_spans_only_when_allowed(
    receiver, messages_api, claude_inbox, settings
):
    content_keys = {"gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions"}
    settings.ALWAYSON_TRACE_CONTENT = False
    claude_run(messages_api, claude_inbox)
    for s in receiver:
        assert not content_keys & attributes(s).keys()
        assert not any("refund 20" in str(v) for v in attributes(s).values())
    receiver.clear()

    settings.ALWAYSON_TRACE_CONTENT = True
    claude_run(messages_api, claude_inbox, "support-2")
    first = min(
        (s for s in receiver if s.name.startswith("chat ")), key=lambda s: s.start_time_unix_nano
    )
    assert content_keys <= attributes(first).keys()
    assert "refund 20 on order 7" in attributes(first)["gen_ai.input.messages"]
    assert '"tool_use"' in attributes(first)["gen_ai.output.messages"]


SENDER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.django_db
def test_a_webhook_request_is_a_server_span_continuing_the_senders_trace(receiver, inbox, settings):
    settings.ALWAYSON_STANDARD_SECRETS = [STANDARD_SECRET]
    settings.ALWAYSON_WEBHOOK_INBOX_SECRETS = {}
    body = b'{"type": "ping"}'
    headers = {**standard_headers(body), "traceparent": SENDER}

    assert post(Client(), "standard", inbox.slug, body, headers).status_code == 202
    tracing.force_flush()

    (request,) = receiver
    assert request.name == "POST /hooks/standard/<str:slug>/"
    assert request.kind == request.SPAN_KIND_SERVER
    assert request.trace_id.hex() == SENDER.split("-")[1]
    assert request.parent_span_id.hex() == SENDER.split("-")[2]
    assert attributes(request) == {
        "http.request.method": "POST",
        "http.route": "/hooks/standard/<str:slug>/",
        "http.response.status_code": 202,
        "alwayson.inbox": inbox.slug,
        "alwayson.webhook.scheme": "standard",
    }


@pytest.mark.django_db
def test_a_refused_webhook_span_carries_its_status(receiver, inbox, settings):
    settings.ALWAYSON_STANDARD_SECRETS = [STANDARD_SECRET]
    settings.ALWAYSON_WEBHOOK_INBOX_SECRETS = {}
    body = b'{"type": "ping"}'
    headers = standard_headers(body, secret="whsec_" + "A" * 32)

    status = post(Client(), "standard", inbox.slug, body, headers).status_code
    tracing.force_flush()

    (request,) = receiver
    assert status == 401  # the wrong secret signed it
    assert request.parent_span_id == b""
    assert attributes(request)["http.response.status_code"] == status


@pytest.mark.django_db
def test_an_mcp_tools_call_is_an_execute_tool_span_of_the_run_like_an_application_tools(
    receiver, messages_api, claude_inbox, scripted_mcp_server, settings
):
    scripted_mcp_server.tool("search", "Search issues.", {"type": "object"}, answer="2 issues")
    scripted_mcp_server.connect(settings, approve_new=True)
    inbox = claude_inbox("support", policy={"mcp__tracker__search": "allow"})
    ingest(inbox, "chat", "m1", {"text": "any login issues?", "from": "owner"})
    call = tool_use("mcp__tracker__search", {"q": "login"})
    messages_api.reply(message(call), message("Two."))

    Worker("w1").step()
    tracing.force_flush()

    (run,) = [s for s in receiver if s.name.startswith("invoke_agent ")]
    (tool,) = [s for s in receiver if s.name.startswith("execute_tool ")]
    assert [name for name, *_ in scripted_mcp_server.calls] == ["search"]
    assert (tool.trace_id, tool.parent_span_id) == (run.trace_id, run.span_id)
    assert tool.name == "execute_tool mcp__tracker__search"
    assert attributes(tool) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "mcp__tracker__search",
        "gen_ai.tool.call.id": call["id"],
    }
