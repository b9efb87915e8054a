"""One delivery followed from the HTTP request to the message sent, as one trace: the webhook's
SERVER span, the run that handled its event (invoke_agent) under it, the Claude agent's chat
and execute_tool spans under that, and the dispatcher's send span linked to the run.
Exported through the loopback OTLP receiver (conftest.py), decoded from protobuf."""

import pytest
from django.core import mail
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from alwayson.runtime.worker import Worker
from alwayson.testing.model import message, tool_use, usage
from alwayson.web.chat import post_chat
from inbox import tracing
from inbox.models import Event, EventTrace, RunRecord
from outbox.services import dispatch
from tests.support.otlp import attributes
from tests.support.webhooks import STANDARD_SECRET, post, standard_headers


def names(traceparent: str, span) -> bool:
    """Whether a stored traceparent names this exported span (its flags aside)."""
    return traceparent.startswith(f"00-{span.trace_id.hex()}-{span.span_id.hex()}-")


@pytest.fixture
def hooks(settings):
    settings.ALWAYSON_STANDARD_SECRETS = [STANDARD_SECRET]
    settings.ALWAYSON_WEBHOOK_INBOX_SECRETS = {}

    def deliver(inbox, msg_id="msg_1", body=b'{"type": "order.refund_requested", "order": "7"}'):
        headers = standard_headers(body, msg_id=msg_id)
        return post(Client(), "standard", inbox.slug, body, headers).status_code

    return deliver


def saying_agent(run):
    run.say("hello")


def queries_of(captured, table):
    return [q["sql"] for q in captured if f'"{table}"' in q["sql"] or f" {table} " in q["sql"]]


@pytest.mark.django_db
def test_one_webhook_delivery_is_one_trace_from_the_request_to_the_send(
    receiver, hooks, messages_api, claude_inbox
):
    inbox = claude_inbox()
    inbox.owner.email = "owner@example.com"
    inbox.owner.save()
    refund = tool_use("refund", {"order": "7", "amount": 20})
    say = tool_use("send_message", {"text": "Refunded order 7.", "urgent": True})
    messages_api.reply(
        message(refund, tokens=usage(input_tokens=120, output_tokens=30)),
        message(say, tokens=usage(input_tokens=160, output_tokens=25)),
        message("Done.", tokens=usage(input_tokens=180, output_tokens=5)),
    )

    assert hooks(inbox) == 202
    result = Worker("w1").step()
    assert result.outcome == "said 1"
    assert dispatch() == 1
    tracing.force_flush()

    spans = {s.span_id: s for s in receiver}
    (request,) = [s for s in receiver if s.kind == s.SPAN_KIND_SERVER]
    (run,) = [s for s in receiver if s.name.startswith("invoke_agent ")]
    chats = sorted(
        (s for s in receiver if s.name.startswith("chat ")), key=lambda s: s.start_time_unix_nano
    )
    tools = {
        attributes(s)["gen_ai.tool.name"]: s for s in receiver if s.name.startswith("execute_tool ")
    }
    (send,) = [s for s in receiver if s.name.startswith("send ")]
    # The request, the run, three model calls, the refund (send_message is the runtime's own
    # say, not an application tool: no execute_tool span) and the send.
    assert len(receiver) == 1 + 1 + 3 + 1 + 1

    # The request is the root of the one trace every span of the run belongs to.
    assert request.parent_span_id == b""
    assert {s.trace_id for s in receiver if s is not send} == {request.trace_id}
    assert run.parent_span_id == request.span_id
    assert list(run.links) == []
    for child in (*chats, *tools.values()):
        assert spans[child.parent_span_id] is run

    model = messages_api.messages_requests[0].body["model"]
    for chat, (tokens_in, tokens_out) in zip(chats, [(120, 30), (160, 25), (180, 5)], strict=True):
        assert chat.name == f"chat {model}"
        assert attributes(chat)["gen_ai.operation.name"] == "chat"
        assert attributes(chat)["gen_ai.request.model"] == model
        assert attributes(chat)["gen_ai.usage.input_tokens"] == tokens_in
        assert attributes(chat)["gen_ai.usage.output_tokens"] == tokens_out
    assert tools.keys() == {"refund"}
    assert attributes(tools["refund"])["gen_ai.operation.name"] == "execute_tool"
    assert attributes(tools["refund"])["gen_ai.tool.call.id"] == refund["id"]

    # The send is a trace of its own (the dispatcher's, later), linked to the run that said it.
    assert send.name == "send email"
    assert send.kind == send.SPAN_KIND_PRODUCER
    assert send.trace_id != request.trace_id and send.parent_span_id == b""
    assert [(link.trace_id, link.span_id) for link in send.links] == [(run.trace_id, run.span_id)]
    assert attributes(send) == {
        "messaging.system": "alwayson",
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
        "messaging.destination.name": "email",
        "messaging.batch.message_count": 1,
        "messaging.message.id": attributes(send)["messaging.message.id"],
        "alwayson.inbox": inbox.slug,
        "alwayson.outbox.mode": "at_least_once",
        "alwayson.outcome": "sent",
    }
    assert len(mail.outbox) == 1 and "Refunded order 7." in mail.outbox[0].body

    # What was stored: the request's context with its event, the run's with its record.
    (event,) = Event.objects.filter(inbox=inbox)
    assert names(EventTrace.objects.get(event=event).traceparent, request)
    record = RunRecord.objects.get(inbox=inbox, generation=result.generation)
    assert names(record.trace, run)


@pytest.mark.django_db
def test_a_run_of_two_deliveries_continues_the_first_and_links_the_second(receiver, hooks, inbox):
    assert hooks(inbox, "msg_1") == 202
    assert hooks(inbox, "msg_2") == 202

    with CaptureQueriesContext(connection) as captured:
        assert Worker("w1", saying_agent).step().events == 2
    tracing.force_flush()

    first, second = sorted(
        (s for s in receiver if s.kind == s.SPAN_KIND_SERVER), key=lambda s: s.start_time_unix_nano
    )
    (run,) = [s for s in receiver if s.name.startswith("invoke_agent ")]
    assert first.trace_id != second.trace_id
    assert (run.trace_id, run.parent_span_id) == (first.trace_id, first.span_id)
    assert [(link.trace_id, link.span_id) for link in run.links] == [
        (second.trace_id, second.span_id)
    ]
    # The run read its events' contexts in one query of its own.
    assert len(queries_of(captured, "inbox_eventtrace")) == 1


@pytest.mark.django_db
def test_a_duplicate_delivery_is_acknowledged_and_stores_no_second_trace(receiver, hooks, inbox):
    assert hooks(inbox, "msg_1") == 202
    assert hooks(inbox, "msg_1") == 200  # the sender's retry: refused by the unique key

    (event,) = Event.objects.filter(inbox=inbox)
    (kept,) = EventTrace.objects.all()
    tracing.force_flush()
    first = min(receiver, key=lambda s: s.start_time_unix_nano)
    assert kept.event_id == event.pk and names(kept.traceparent, first)


@pytest.mark.django_db
def test_a_chat_post_is_a_producer_span_the_run_answering_it_continues(receiver, inbox):
    assert post_chat(inbox, "m1", "hello", inbox.owner)
    assert not post_chat(inbox, "m1", "hello", inbox.owner)  # a double submit: one event
    Worker("w1", saying_agent).step()
    tracing.force_flush()

    posted, again = sorted(
        (s for s in receiver if s.name == "send chat"), key=lambda s: s.start_time_unix_nano
    )
    (run,) = [s for s in receiver if s.name.startswith("invoke_agent ")]
    assert posted.kind == posted.SPAN_KIND_PRODUCER
    assert attributes(posted)["alwayson.inbox"] == inbox.slug
    assert (attributes(posted)["alwayson.duplicate"], attributes(again)["alwayson.duplicate"]) == (
        False,
        True,
    )
    assert (run.trace_id, run.parent_span_id) == (posted.trace_id, posted.span_id)
    assert EventTrace.objects.count() == 1


@pytest.mark.django_db
def test_a_failed_send_span_says_so_and_links_each_run_of_its_messages(receiver, inbox):
    from outbox.channels import SendFailed

    for n in (1, 2):
        post_chat(inbox, f"m{n}", "hello", inbox.owner)
        Worker("w1", saying_agent).step()
    runs = sorted(
        (s for s in receiver if s.name.startswith("invoke_agent ")),
        key=lambda s: s.start_time_unix_nano,
    )

    def refuse(delivery):
        raise SendFailed("the channel said no")

    assert dispatch(send=refuse) == 0
    tracing.force_flush()

    (send,) = [s for s in receiver if s.name.startswith("send email")]
    assert attributes(send)["messaging.batch.message_count"] == 2
    assert attributes(send)["alwayson.outcome"] == "failed"
    assert attributes(send)["error.type"] == "SendFailed"
    assert send.status.code == send.status.STATUS_CODE_ERROR
    assert [link.span_id for link in send.links] == [run.span_id for run in runs]


@pytest.mark.django_db
def test_with_tracing_off_nothing_is_stored_and_no_query_is_added(receiver, hooks, inbox):
    tracing.shutdown()

    with CaptureQueriesContext(connection) as captured:
        assert hooks(inbox, "msg_1") == 202
        post_chat(inbox, "m1", "hello", inbox.owner)
        assert Worker("w1", saying_agent).step().events == 2
        assert dispatch(send=lambda delivery: None) == 1

    assert not EventTrace.objects.exists()
    assert queries_of(captured, "inbox_eventtrace") == []
    # The dispatcher reads no run record to link: only the run's finish wrote one.
    assert [q for q in queries_of(captured, "inbox_runrecord") if q.startswith("SELECT")] == []
    assert receiver == []


@pytest.mark.django_db
def test_a_batch_stored_in_a_span_keeps_its_context_for_each_new_event(receiver, inbox):
    from alwayson.runtime.api import ingest, ingest_many

    assert ingest(inbox, "stripe", "evt_1", {})
    with tracing.span("POST /import"):
        traceparent = tracing.traceparent()
        stored = ingest_many(inbox, [("stripe", "evt_1"), ("stripe", "evt_2"), ("stripe", "evt_3")])
    assert stored == [False, True, True]
    traces = EventTrace.objects.order_by("event_id")
    assert [(t.event.source_id, t.traceparent) for t in traces] == [
        ("evt_2", traceparent),
        ("evt_3", traceparent),
    ]


@pytest.mark.django_db
def test_an_answer_posted_in_a_span_keeps_its_context_for_its_event(
    receiver, inbox, django_user_model
):
    """On PostgreSQL the page's plain answer is one statement (approvals/sql/answer.sql): the
    trace goes in it, as store_event keeps it on answer_approval's path (SQLite)."""
    from approvals.services import request_approval
    from inbox.models import Membership, Role

    dana = django_user_model.objects.create_user(username="dana")
    Membership.objects.create(inbox=inbox, user=dana, role=Role.APPROVER)
    request_approval(inbox, "r1", "refund order 7", 3600)
    client = Client()
    client.force_login(dana)
    with tracing.span("POST /approvals"):
        traceparent = tracing.traceparent()
        response = client.post(f"/approvals/{inbox.slug}/r1/", {"answer": "yes"})

    assert response.status_code == 302
    event = Event.objects.get(inbox=inbox, source="approval", source_id="r1")
    assert event.payload["answer"] == "yes"
    assert EventTrace.objects.get().event_id == event.pk
    assert EventTrace.objects.get().traceparent == traceparent
