"""The Claude agent's call journal (issue 26 §1): each model call with its tokens, duration
and stop reason; each application tool call with the policy's decision and why, the approval
a person answered, the error a tool raised, when it finished; all under the run's (inbox,
generation). The real agent against the loopback Messages API, on both databases; the clock
is pinned (alwayson/testing/clock.py), so "finished" is the instant the test set.
"""

import dataclasses
import types
from datetime import timedelta

import pytest
from django.db.models import F
from django.urls import reverse

from alwayson.claude import ToolError
from alwayson.claude.models import ModelCall, ToolResult
from alwayson.runtime import tools as tools_module
from alwayson.runtime import worker as worker_module
from alwayson.runtime.models import AgentConfig
from alwayson.runtime.policy import ALLOW, ASK, decide
from alwayson.runtime.worker import Worker
from alwayson.testing.clock import Clock
from alwayson.testing.model import message, tool_use, usage
from approvals.models import Approval
from approvals.services import answer_approval
from inbox import clock
from inbox.models import Event, Lease, Membership, Role
from inbox.services import ingest
from tests.support import claude_tools
from tests.support.claude_tools import Crash

pytestmark = pytest.mark.django_db

POLICY = {
    "refund": [{"when": {"amount": {"lt": 50}}, "then": "allow"}, {"then": "ask"}],
    "lookup_order": "allow",
    "delete_account": "deny",
}


@pytest.fixture
def pinned():
    moment = Clock().start()
    yield moment
    moment.stop()


@pytest.fixture
def desk(messages_api, claude_inbox, django_user_model, pinned):
    inbox = claude_inbox(policy=POLICY)
    dana = django_user_model.objects.create_user(username="dana", first_name="Dana")
    Membership.objects.create(inbox=inbox, user=dana, role=Role.APPROVER)
    return types.SimpleNamespace(inbox=inbox, api=messages_api, dana=dana, clock=pinned)


def chat(inbox, key, text):
    assert ingest(inbox, "chat", key, {"text": text, "from": "owner"})


def step(worker="w1"):
    return Worker(worker).step()


def results_of(request):
    """The tool results a request gave the model, as the journal keeps them (no breakpoint)."""
    blocks = [b for b in request.body["messages"][-1]["content"] if b["type"] == "tool_result"]
    return [{k: v for k, v in b.items() if k != "cache_control"} for b in blocks]


def because(tool, arguments):
    """The policy's own explanation of its decision on this call."""
    return decide(POLICY, tool, arguments, ASK).because


def takeover_after_a_crash(inbox):
    """An hour later the dead worker's lease and the event's backoff have lapsed."""
    Event.objects.filter(inbox=inbox).update(updated=F("updated") - timedelta(hours=1))
    Lease.objects.filter(inbox=inbox).update(until=None, work_at=clock.database_now())


# --- model calls -------------------------------------------------------------------------------


def test_a_model_call_keeps_how_long_the_api_took_and_its_usage(desk, monkeypatch):
    # The API "takes" 1.25 s by the monotonic clock the client reads; nothing sleeps.
    readings = iter([500.0])
    fake = types.SimpleNamespace(monotonic=lambda: next(readings, 501.25))
    monkeypatch.setattr("alwayson.claude.client.time", fake)
    chat(desk.inbox, "m1", "hello")
    desk.api.reply(message("Hi.", tokens=usage(100, 20, cache_read=30, cache_write=7)))

    assert step().outcome == "quiet"

    [call] = ModelCall.objects.of_run(desk.inbox.pk, 1)
    assert call.duration_ms == 1250
    assert (call.input_tokens, call.output_tokens) == (100, 20)
    assert (call.cache_read_tokens, call.cache_write_tokens) == (30, 7)
    assert call.stop_reason == "end_turn"
    [run] = ModelCall.objects.tokens_by_run()
    assert run == {
        "inbox_id": desk.inbox.pk,
        "generation": 1,
        "calls": 1,
        "api_ms": 1250,
        "input": 100,
        "output": 20,
        "cache_read": 30,
        "cache_write": 7,
        "total": 157,
    }


def test_of_run_gives_one_runs_calls_in_order_and_not_another_runs(desk):
    chat(desk.inbox, "m1", "look up 7")
    desk.api.reply(message(tool_use("lookup_order", {"order": "7"})), message("Done."))
    step()
    chat(desk.inbox, "m2", "look up 8")
    desk.api.reply(message(tool_use("lookup_order", {"order": "8"})), message("Done."))
    step()

    first, second = (ModelCall.objects.of_run(desk.inbox.pk, g) for g in (1, 2))
    assert [c.stop_reason for c in first] == ["tool_use", "end_turn"]
    assert [c.stop_reason for c in second] == ["tool_use", "end_turn"]
    assert {c.pk for c in first}.isdisjoint(c.pk for c in second)
    assert [c.arguments for c in ToolResult.objects.of_run(desk.inbox.pk, 1)] == [{"order": "7"}]
    assert [c.arguments for c in ToolResult.objects.of_run(desk.inbox.pk, 2)] == [{"order": "8"}]


# --- the policy's decisions --------------------------------------------------------------------


def test_an_allowed_call_is_journaled_with_the_rule_that_allowed_it_and_when_it_finished(desk):
    chat(desk.inbox, "m1", "refund 20 on order 7")
    arguments = {"order": "7", "amount": 20}
    desk.api.reply(message(tool_use("refund", arguments)), message("Refunded."))

    step()

    [row] = ToolResult.objects.of_run(desk.inbox.pk, 1)
    assert (row.tool, row.arguments, row.decision) == ("refund", arguments, ALLOW)
    assert row.decision_reason == because("refund", arguments) == "policy for refund, rule 1: allow"
    assert (row.approved, row.approval, row.error) == (False, None, "")
    assert row.finished == desk.clock.now
    assert [row.result] == results_of(desk.api.messages_requests[1])


def test_a_denied_call_is_journaled_with_the_denial_the_model_got_and_never_runs(desk):
    chat(desk.inbox, "m1", "delete account 42")
    desk.api.reply(message(tool_use("delete_account", {"account": "42"})), message("Cannot."))

    step()

    assert claude_tools.CALLS == []
    [row] = ToolResult.objects.filter(inbox=desk.inbox)
    assert (row.tool, row.decision, row.generation) == ("delete_account", "deny", 1)
    assert row.decision_reason == because("delete_account", {}) == "policy for delete_account: deny"
    [given] = results_of(desk.api.messages_requests[1])
    assert row.result == given and given["is_error"] is True
    assert given["content"] == (
        "Denied by policy (policy for delete_account: deny): delete_account was not run."
    )
    assert row.finished == desk.clock.now and row.approval is None


def test_an_asked_call_is_journaled_when_its_answer_resumes_it_with_who_approved(desk):
    arguments = {"order": "881", "amount": 120}
    chat(desk.inbox, "m1", "refund 120 on order 881")
    desk.api.reply(message(tool_use("refund", arguments)))
    assert step().outcome.startswith("asked")
    # Its key will come from the answer's event: until then the approval is its record.
    assert not ToolResult.objects.exists()
    [approval] = Approval.objects.filter(inbox=desk.inbox)

    desk.clock.jump(minutes=5)
    assert answer_approval(desk.inbox, approval.request_id, "yes", by=desk.dana).stands == "yes"
    desk.api.reply(message("Refunded."))
    step()

    [row] = ToolResult.objects.filter(inbox=desk.inbox)
    assert (row.tool, row.arguments, row.decision, row.approved) == ("refund", arguments, ASK, True)
    assert row.decision_reason == because("refund", arguments) == "policy for refund, rule 2: ask"
    assert row.approval == approval
    assert row.approval.answered_by == desk.dana
    assert row.generation == 2  # the run the answer resumed, which ran it
    assert row.finished == desk.clock.now
    assert [row.result] == results_of(desk.api.messages_requests[-1])
    assert "is_error" not in row.result and len(claude_tools.CALLS) == 1


def test_a_persons_denial_keeps_the_ask_and_journals_the_denial_as_the_result(desk):
    arguments = {"order": "881", "amount": 120}
    chat(desk.inbox, "m1", "refund 120 on order 881")
    desk.api.reply(message(tool_use("refund", arguments)))
    step()
    [approval] = Approval.objects.filter(inbox=desk.inbox)

    answer_approval(desk.inbox, approval.request_id, "no", by=desk.dana, reason="too much")
    desk.api.reply(message("Understood."))
    step()

    assert claude_tools.CALLS == []
    [row] = ToolResult.objects.filter(inbox=desk.inbox)
    assert (row.decision, row.approved, row.approval) == (ASK, False, approval)
    assert row.decision_reason == "policy for refund, rule 2: ask"
    assert row.approval.answer == "no" and row.approval.answered_by == desk.dana
    [given] = results_of(desk.api.messages_requests[-1])
    assert row.result == given and given["is_error"] is True
    assert "The reason Dana (dana) gave: too much" in given["content"]


# --- a tool's error ----------------------------------------------------------------------------


def test_a_tool_that_raises_is_journaled_with_its_error_and_the_result_the_model_got(desk):
    chat(desk.inbox, "m1", "look up order 404")
    desk.api.reply(message(tool_use("lookup_order", {"order": "404"})), message("No such order."))

    step()

    [row] = ToolResult.objects.filter(inbox=desk.inbox)
    assert (row.decision, row.error) == (ALLOW, "there is no order 404")
    [given] = results_of(desk.api.messages_requests[1])
    assert row.result == given
    assert given == {**given, "content": "there is no order 404", "is_error": True}
    assert row.finished == desk.clock.now


def test_a_tools_error_in_the_journal_has_the_api_key_scrubbed(desk, monkeypatch, settings):
    def failing(call, order):
        raise ToolError(f"upstream said: bad key {settings.ANTHROPIC_API_KEY}")

    registered = tools_module._registry["lookup_order"]
    monkeypatch.setitem(
        tools_module._registry, "lookup_order", dataclasses.replace(registered, function=failing)
    )
    chat(desk.inbox, "m1", "look up order 7")
    desk.api.reply(message(tool_use("lookup_order", {"order": "7"})), message("Failed."))

    step()

    [row] = ToolResult.objects.filter(inbox=desk.inbox)
    assert settings.ANTHROPIC_API_KEY and settings.ANTHROPIC_API_KEY not in row.error
    assert row.error.startswith("upstream said: bad key ") and row.finished == desk.clock.now


# --- a crash and its retry ---------------------------------------------------------------------


def test_a_retry_after_a_crash_neither_adds_rows_nor_changes_their_decisions(desk, monkeypatch):
    chat(desk.inbox, "m1", "refund 20 on order 7 and delete account 42")
    refund = tool_use("refund", {"order": "7", "amount": 20})
    delete = tool_use("delete_account", {"account": "42"})
    desk.api.reply(message(refund, delete), message("Done."))

    def crash(*args, **kwargs):
        raise Crash

    monkeypatch.setattr(worker_module, "finish", crash)
    with pytest.raises(Crash):
        step()
    monkeypatch.undo()
    before = list(ToolResult.objects.filter(inbox=desk.inbox).values())
    assert [(r["tool"], r["decision"]) for r in before] == [
        ("refund", ALLOW),
        ("delete_account", "deny"),
    ]
    # Meanwhile the policy turned around: the calls made before the crash stay decided.
    AgentConfig.objects.filter(inbox=desk.inbox).update(
        policy={"refund": "deny", "lookup_order": "allow", "delete_account": "allow"}
    )
    takeover_after_a_crash(desk.inbox)

    assert step("w2").outcome == "quiet"

    assert list(ToolResult.objects.filter(inbox=desk.inbox).values()) == before
    assert [c[0] for c in claude_tools.CALLS] == ["refund"]  # delete_account never ran
    # The model was given the same results: its second answer came from the cache.
    assert len(desk.api.messages_requests) == 2
    assert ModelCall.objects.of_run(desk.inbox.pk, 1).count() == 2
    assert not ModelCall.objects.of_run(desk.inbox.pk, 2).exists()
    assert ToolResult.objects.of_run(desk.inbox.pk, 1).count() == 2


# --- the admin ---------------------------------------------------------------------------------


def test_the_admin_shows_the_journal_read_only(desk, admin_client):
    arguments = {"order": "881", "amount": 120}
    chat(desk.inbox, "m1", "refund 120 on order 881")
    desk.api.reply(message(tool_use("refund", arguments)))
    step()
    [approval] = Approval.objects.filter(inbox=desk.inbox)
    answer_approval(desk.inbox, approval.request_id, "no", by=desk.dana, reason="too much")
    desk.api.reply(message("Understood."))
    step()
    [row] = ToolResult.objects.filter(inbox=desk.inbox)
    call = ModelCall.objects.first()

    page = admin_client.get(reverse("admin:alwayson_claude_toolresult_change", args=[row.pk]))
    listed = admin_client.get(reverse("admin:alwayson_claude_toolresult_changelist"))
    model_page = admin_client.get(reverse("admin:alwayson_claude_modelcall_change", args=[call.pk]))

    html = page.content.decode()
    assert "policy for refund, rule 2: ask" in html
    approval_url = reverse("admin:approvals_approval_change", args=[approval.pk])
    assert f'href="{approval_url}"' in html
    assert page.context["adminform"].form.fields == {}  # nothing to edit
    assert listed.context["cl"].result_list[0] == row
    assert "Duration ms" in model_page.content.decode()
