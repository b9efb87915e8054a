"""The policy's rule language where people and the agent meet it: the admin form refusing a
rule that cannot match its tool's schema (through the Django test client), the start-up check
of the default policy, and the Claude agent deciding by nested fields and list elements
against a loopback Messages API. The language itself is tested in
tests/runtime/test_policy_rules.py."""

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.urls import reverse
from django.utils.html import escape

from alwayson.claude.apps import checked_policy
from alwayson.runtime.models import AgentConfig
from alwayson.runtime.worker import Worker
from alwayson.testing.model import message, tool_use
from approvals.models import Approval
from approvals.services import answer_approval
from inbox.services import ingest
from tests.support import policy_tools
from tests.support.admin import agent_config_form

pytestmark = pytest.mark.django_db

TOOLS = ["tests.support.claude_tools", "tests.support.policy_tools"]


@pytest.fixture
def tools_modules(settings):
    settings.ALWAYSON_CLAUDE_TOOLS = TOOLS


def config_form(inbox, policy):
    return agent_config_form(inbox, policy=policy)


# --- the admin ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "error"),
    [
        pytest.param(
            '{"refund_items": [{"when": {"/order/amout": {"gt": 500}}, "then": "deny"}]}',
            "policy['refund_items'] rule 1 tests '/order/amout', which refund_items does not "
            "take: /order has no field 'amout'; its fields: amount, currency, id",
            id="path-not-in-schema",
        ),
        pytest.param(
            '{"refund_items": [{"then": "ask"}, {"when": {"/count": {"prefix": "1"}}, '
            '"then": "deny"}]}',
            "policy['refund_items'] rule 2 tests '/count': prefix needs a string field, but "
            "the schema says integer",
            id="prefix-on-integer",
        ),
        pytest.param(
            '{"refund_items": [{"when": {"/order/amount": {"regex": "[0-9]+"}}, "then": "deny"}]}',
            "policy['refund_items'] rule 1 tests '/order/amount': regex needs a string field, "
            "but the schema says number",
            id="regex-on-number",
        ),
        pytest.param(
            '{"refund_items": [{"when": {"/items": {"any": {"/amount": {"gt": "500"}}}}, '
            '"then": "deny"}]}',
            "policy['refund_items'] rule 1 tests '/items' any '/amount': gt \"500\" compares "
            "strings, but the schema says number",
            id="element-field-of-the-wrong-type",
        ),
        pytest.param(
            '{"refund_items": [{"when": {"order.amount": {"gt": 500}}, "then": "deny"}]}',
            "for the nested field write '/order/amount'",
            id="dotted-path",
        ),
        pytest.param(
            '{"refund_items": [{"when": {"/email": {"regex": "(a+)+@x"}}, "then": "deny"}]}',
            "policy['refund_items'] rule 1 when['/email']: regex '(a+)+@x' repeats a part that "
            "itself repeats or alternates",
            id="runaway-regex",
        ),
        pytest.param(
            '{"refund_items": [{"when": {"/email": {"regex": "[a-z"}}, "then": "deny"}]}',
            "policy['refund_items'] rule 1 when['/email']: regex '[a-z' does not compile",
            id="regex-that-does-not-compile",
        ),
        pytest.param(
            '{"refund": [{"when": {"/order": {"any": "7"}}, "then": "deny"}]}',
            "policy['refund'] rule 1 tests '/order': any needs a list field, but the schema "
            "says string",
            id="any-on-a-string",
        ),
    ],
)
def test_the_admin_refuses_a_rule_that_cannot_match_and_stores_nothing(
    admin_client, make_inbox, tools_modules, policy, error
):
    response = admin_client.post(
        reverse("admin:alwayson_agentconfig_add"), config_form(make_inbox(), policy)
    )
    assert response.status_code == 200
    page = response.content.decode()
    assert 'class="errorlist' in page
    assert escape(error) in page
    assert not AgentConfig.objects.exists()


def test_the_admin_saves_rules_on_nested_fields_and_lists_as_written(
    admin_client, make_inbox, tools_modules
):
    inbox = make_inbox()
    policy = (
        '{"refund_items": ['
        '{"when": {"/items": {"any": {"/amount": {"gt": 500}}}}, "then": "deny"},'
        '{"when": {"/email": {"regex": ".*@example\\\\.com"}, "/order/amount": {"lt": 50}},'
        ' "then": "allow"},'
        '{"then": "ask"}],'
        ' "refund": [{"when": {"amount": {"lt": 50}}, "then": "allow"}, {"then": "ask"}]}'
    )
    response = admin_client.post(
        reverse("admin:alwayson_agentconfig_add"), config_form(inbox, policy)
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    stored = AgentConfig.objects.get(inbox=inbox).policy
    assert stored["refund_items"][1]["when"]["/email"] == {"regex": r".*@example\.com"}
    assert stored["refund"] == [{"when": {"amount": {"lt": 50}}, "then": "allow"}, {"then": "ask"}]


def test_a_default_policy_with_a_runaway_regex_stops_start_up():
    with pytest.raises(ImproperlyConfigured, match=r"ALWAYSON_CLAUDE_POLICY: .*\(a\+\)\+"):
        checked_policy(
            "ALWAYSON_CLAUDE_POLICY",
            {"lookup_order": [{"when": {"/order": {"regex": "(a+)+"}}, "then": "deny"}]},
        )


# --- the agent ------------------------------------------------------------------------------------

POLICY = {
    "refund_items": [
        {"when": {"/items": {"any": {"/amount": {"gt": 500}}}}, "then": "deny"},
        {"when": {"/order/amount": {"gt": 100}}, "then": "ask"},
        {"when": {"/email": {"regex": r"[a-z.]+@example\.com"}}, "then": "allow"},
        {"then": "ask"},
    ]
}


@pytest.fixture
def agent_tools(messages_api, settings):
    settings.ALWAYSON_CLAUDE_TOOLS = TOOLS
    policy_tools.CALLS.clear()
    return messages_api


def refund(email, amount=None, items=()):
    order = {"id": "881"} if amount is None else {"id": "881", "amount": amount}
    return tool_use(
        "refund_items",
        {"order": order, "email": email, "items": [{"sku": s, "amount": a} for s, a in items]},
    )


def test_the_agent_denies_a_list_with_one_item_over_the_limit_and_runs_what_the_rules_allow(
    agent_tools, claude_inbox
):
    inbox = claude_inbox(policy=POLICY)
    assert ingest(inbox, "chat", "m1", {"text": "refund the three orders", "from": "owner"})
    one_large = refund("ann@example.com", 20, [("A", 10), ("B", 600), ("C", 5)])
    allowed = refund("ann@example.com", 20, [("A", 10)])
    stranger = refund("ann@elsewhere.org", 20, [("A", 10)])
    agent_tools.reply(message(one_large, allowed, stranger))

    assert Worker("w1").step().outcome == "asked 1, said 1"

    # Only the allowed call ran; the denied one never reached the tool; the third asks.
    assert [c["items"] for c in policy_tools.CALLS] == [[{"sku": "A", "amount": 10}]]
    approval = Approval.objects.get(inbox=inbox)
    assert approval.details["arguments"]["email"] == "ann@elsewhere.org"
    assert answer_approval(inbox, approval.request_id, "no").stands == "no"
    agent_tools.reply(message("One refund was denied by policy, one ran, one you declined."))

    assert Worker("w1").step().outcome == "quiet"

    resumed = agent_tools.messages_requests[1].body["messages"][-1]["content"]
    results = {b["tool_use_id"]: b for b in resumed if b["type"] == "tool_result"}
    assert results[one_large["id"]]["is_error"]
    assert results[one_large["id"]]["content"] == (
        "Denied by policy (policy for refund_items, rule 1: deny): refund_items was not run."
    )
    assert results[allowed["id"]]["content"] == "refunded order 881"
    assert results[stranger["id"]]["is_error"]
    assert "A person through the API denied this call" in results[stranger["id"]]["content"]
    assert len(policy_tools.CALLS) == 1


def test_the_agent_asks_when_a_field_a_deny_rule_tests_is_absent(agent_tools, claude_inbox):
    inbox = claude_inbox(policy=POLICY)
    assert ingest(inbox, "chat", "m1", {"text": "refund order 881", "from": "owner"})
    # No amounts at all: rule 1 cannot be judged, so rule 3's allow becomes ask.
    no_amounts = tool_use(
        "refund_items",
        {"order": {"id": "881"}, "email": "ann@example.com", "items": [{"sku": "A"}]},
    )
    agent_tools.reply(message(no_amounts))

    result = Worker("w1").step()

    assert result.outcome == "asked 1, said 1"
    assert policy_tools.CALLS == []
    assert Approval.objects.get(inbox=inbox).action == "refund order 881"
