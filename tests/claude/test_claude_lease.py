"""A Claude agent stops spending the moment its run loses its lease: no model call and no tool
call after the lease's deadline, whatever the database is doing (the run's own clock decides:
alwayson/runtime/run.py). On both databases, against the loopback Messages API; the run's
clock is the test's, moved by hand.
"""

import pytest

from alwayson.claude import client
from alwayson.claude.models import ToolResult
from alwayson.runtime.run import LeaseLost, Run
from alwayson.runtime.worker import Worker
from alwayson.testing.model import message, tool_use
from inbox.models import Event
from inbox.services import acquire, claim_batch, ingest
from outbox.models import OutboxMessage
from tests.support import claude_tools
from tests.support.clock import Ticks

pytestmark = pytest.mark.django_db

TTL = 60


@pytest.fixture
def ticks(settings):
    settings.ALWAYSON_LEASE_TTL = TTL
    return Ticks()


def worker(ticks):
    made = Worker("w1")
    made.clock = ticks
    return made


def refund_asked(inbox):
    assert ingest(inbox, "chat", "m1", {"text": "refund 20 on order 7", "from": "owner"})


def test_no_tool_call_runs_when_the_deadline_passed_during_the_model_call(
    messages_api, claude_inbox, ticks, monkeypatch
):
    inbox = claude_inbox()
    refund_asked(inbox)
    messages_api.reply(
        message(tool_use("refund", {"order": "7", "amount": 20})), message("Refunded.")
    )
    real = client._traced_send

    def slow_model(request, run):
        answer = real(request, run)
        ticks.move(TTL)  # the model took longer than the lease, and nothing renewed it
        return answer

    monkeypatch.setattr(client, "_traced_send", slow_model)

    result = worker(ticks).step()

    assert result.outcome == "fenced"
    assert claude_tools.CALLS == []
    assert not ToolResult.objects.exists()
    assert len(messages_api.messages_requests) == 1
    assert not OutboxMessage.objects.filter(inbox=inbox).exists()
    assert Event.objects.get(inbox=inbox).status == "running"


def test_no_model_call_follows_a_tool_call_that_outlasted_the_lease(
    messages_api, claude_inbox, ticks, monkeypatch
):
    inbox = claude_inbox()
    refund_asked(inbox)
    messages_api.reply(
        message(tool_use("refund", {"order": "7", "amount": 20})), message("Refunded.")
    )
    real = claude_tools.payments.refund

    def slow_refund(*args, **kwargs):
        paid = real(*args, **kwargs)
        ticks.move(TTL)  # the payment provider took longer than the lease
        return paid

    monkeypatch.setattr(claude_tools.payments, "refund", slow_refund)

    result = worker(ticks).step()

    assert result.outcome == "fenced"
    assert [name for name, *_ in claude_tools.CALLS] == ["refund"]
    # The tool's result would have gone to the model in a second call: never sent.
    assert len(messages_api.messages_requests) == 1
    assert messages_api.waiting == 1
    assert not OutboxMessage.objects.filter(inbox=inbox).exists()


def test_a_model_call_for_a_lost_run_is_refused_before_it_is_sent(messages_api, inbox, ticks):
    ingest(inbox, "chat", "m1", {})
    generation = acquire(inbox, "A")
    run = Run(inbox, "A", generation, claim_batch(inbox, "A", generation), {}, clock=ticks)
    ticks.move(TTL)
    request = {"model": "claude-sonnet-5-5", "max_tokens": 10, "messages": []}

    with pytest.raises(LeaseLost):
        client.call(run, request, budget=None)

    assert messages_api.requests == []
