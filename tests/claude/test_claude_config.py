"""The Claude agent's configuration: the policy format, per-inbox agents edited in the admin
with validation, the worker's start-up key check, the generic deferral, the dashboard's
token numbers."""

import json
import re
from datetime import timedelta
from unittest.mock import ANY

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.core.management import CommandError, call_command
from django.core.validators import MinValueValidator
from django.urls import reverse
from django.utils import timezone

from alwayson.claude.apps import checked_policy
from alwayson.claude.models import ModelCall, ModelSettings
from alwayson.runtime.agents import Agents
from alwayson.runtime.models import AgentConfig
from alwayson.runtime.policy import ASK, check_policy, check_policy_syntax, decide
from alwayson.runtime.run import Run
from alwayson.settings import env
from approvals.services import request_approval
from inbox.models import Event, Lease, Session
from inbox.services import Defer, Failed, Held, acquire, claim_batch, finish, ingest
from outbox.models import OutboxMessage
from outbox.services import Say
from tests.support.admin import agent_config_form
from tests.support.wording import in_html, limit_error

REFUND_POLICY = {
    "refund": [
        {"when": {"amount": {"lt": 50}}, "then": "allow"},
        {"when": {"order": {"in": ["13", "666"]}}, "then": "deny"},
        {"then": "ask"},
    ],
    "delete_account": "deny",
}


# --- the policy --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "arguments", "verdict"),
    [
        ("refund", {"order": "1", "amount": 49.99}, "allow"),
        ("refund", {"order": "1", "amount": 50}, "ask"),
        ("refund", {"order": "13", "amount": 60}, "deny"),
        ("refund", {"order": "13", "amount": 10}, "allow"),  # the first rule that holds
        ("refund", {"order": "1", "amount": "10"}, "ask"),  # a string is not under 50
        ("refund", {"order": "1"}, "ask"),  # a missing argument holds no condition
        ("delete_account", {"account": "a"}, "deny"),
        ("lookup_order", {"order": "1"}, "allow"),  # not named: the default given
    ],
)
def test_the_policy_decides_each_call(tool, arguments, verdict):
    assert decide(REFUND_POLICY, tool, arguments, default="allow").verdict == verdict


def test_a_list_in_which_no_rule_holds_asks():
    policy = {"refund": [{"when": {"amount": {"lt": 10}}, "then": "allow"}]}
    decision = decide(policy, "refund", {"amount": 20}, default="allow")
    assert decision.verdict == ASK and "no rule matched" in decision.because


def test_equality_is_the_bare_value():
    policy = {"send_message": [{"when": {"urgent": True}, "then": "ask"}, {"then": "allow"}]}
    assert decide(policy, "send_message", {"urgent": True}, "allow").verdict == "ask"
    assert decide(policy, "send_message", {"urgent": False}, "allow").verdict == "allow"


@pytest.mark.parametrize(
    ("policy", "error"),
    [
        ([], "must be a JSON object"),
        ({"refund": "maybe"}, "must be one of allow, ask, deny"),
        ({"refund": []}, "non-empty list of rules"),
        ({"refund": [{"when": {}}]}, 'with "then"'),
        ({"refund": [{"then": "allow", "if": {}}]}, "unknown keys ['if']"),
        ({"refund": [{"when": {"amount": {"below": 5}}, "then": "allow"}]}, "unknown operator"),
        ({"refund": [{"when": {"amount": {"lt": [5]}}, "then": "allow"}]}, "lt needs a number"),
        ({"refund": [{"when": {"order": {"in": "13"}}, "then": "deny"}]}, "in needs a list"),
        ({"refund": [{"when": {"amount": {}}, "then": "deny"}]}, "names no operator"),
    ],
)
def test_a_malformed_policy_is_refused_with_its_place(policy, error):
    with pytest.raises(ValueError, match=None) as raised:
        check_policy_syntax(policy)
    assert error in str(raised.value)


def test_a_policy_may_only_name_tools_and_arguments_that_exist():
    offered = {"refund": {"properties": {"order": {}, "amount": {}}}, "send_message": {}}
    assert check_policy(REFUND_POLICY | {"delete_account": "ask"}, offered | {"delete_account": {}})
    with pytest.raises(ValueError, match="unknown tool 'wire_money'"):
        check_policy({"wire_money": "ask"}, offered)
    with pytest.raises(ValueError, match="tests 'currency', which refund does not take"):
        check_policy({"refund": [{"when": {"currency": "EUR"}, "then": "allow"}]}, offered)


def claude_policy(name):
    """The default policy as start-up reads it: JSON in the settings, its syntax checked in
    the Claude app's ready()."""
    return checked_policy(name, env.json_value(name, {}))


def test_a_malformed_default_policy_stops_start_up(monkeypatch):
    monkeypatch.setenv("ALWAYSON_CLAUDE_POLICY", '{"refund": "sometimes"}')
    with pytest.raises(ImproperlyConfigured, match="ALWAYSON_CLAUDE_POLICY: policy"):
        claude_policy("ALWAYSON_CLAUDE_POLICY")
    monkeypatch.setenv("ALWAYSON_CLAUDE_POLICY", "{not json")
    with pytest.raises(ImproperlyConfigured, match="ALWAYSON_CLAUDE_POLICY"):
        claude_policy("ALWAYSON_CLAUDE_POLICY")


# --- per-inbox agents in the admin -------------------------------------------------------------


@pytest.fixture
def tools_module(settings):
    settings.ALWAYSON_CLAUDE_TOOLS = ["tests.support.claude_tools"]


config_form = agent_config_form


# What the Messages API would refuse, refused on saving, by field (ALWAYSON_CLAUDE_MAX_TOKENS
# is 4096 in the tests).
BAD_MODEL_SETTINGS = [
    ({"max_tokens": 0}, "max_tokens", "must be at least 1, not 0"),
    ({"temperature": 1.5}, "temperature", "must be between 0 and 1, not 1.5"),
    ({"temperature": -0.1}, "temperature", "must be between 0 and 1, not -0.1"),
    ({"thinking_budget": 512}, "thinking_budget", "must be at least 1024 tokens"),
    (
        {"thinking_budget": 4096},
        "thinking_budget",
        "must be less than max_tokens (4096, ALWAYSON_CLAUDE_MAX_TOKENS), not 4096",
    ),
    (
        {"max_tokens": 2000, "thinking_budget": 2000},
        "thinking_budget",
        "must be less than max_tokens (2000), not 2000",
    ),
    (
        {"thinking_budget": 2048, "temperature": 0.5},
        "temperature",
        "must be blank with extended thinking",
    ),
    (
        {"tool_choice": "wire_money"},
        "tool_choice",
        "must be auto, any, none or the name of a tool the inbox offers (send_message, "
        "schedule, delete_account, lookup_order, refund)",
    ),
    (
        {"tools": ["lookup_order"], "tool_choice": "refund"},
        "tool_choice",
        "the name of a tool the inbox offers (send_message, schedule, lookup_order)",
    ),
    (
        {"thinking_budget": 2048, "tool_choice": "any"},
        "tool_choice",
        "must be auto or none with extended thinking",
    ),
    (
        {"thinking_budget": 2048, "tool_choice": "send_message"},
        "tool_choice",
        "must be auto or none with extended thinking",
    ),
]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"agent": "alwayson.nowhere.agent"}, "agent: cannot import"),
        ({"agent": "alwayson.settings.DEBUG"}, "is not callable"),
        ({"tools": '["refund", "wire_money"]'}, "unknown tool(s) wire_money"),
        ({"tools": '"refund"'}, "must be a JSON list of tool names"),
        ({"policy": '{"refund": "sometimes"}'}, "must be one of allow, ask, deny"),
        ({"policy": '{"wire_money": "allow"}'}, "unknown tool 'wire_money'"),
        (
            {"tools": '["lookup_order"]', "policy": '{"refund": "allow"}'},
            "unknown tool 'refund'",
        ),
        # The limits alwayson set, in Django's words.
        ({"daily_token_budget": "0"}, limit_error(MinValueValidator(1))),
        ({"approval_window": "5"}, limit_error(MinValueValidator(60))),
    ],
)
def test_a_bad_agent_configuration_is_a_form_error_and_nothing_is_stored(
    admin_client, make_inbox, tools_module, fields, error
):
    inbox = make_inbox()
    response = admin_client.post(
        reverse("admin:alwayson_agentconfig_add"), config_form(inbox, **fields)
    )
    assert response.status_code == 200
    assert in_html(error) in response.content.decode()
    assert not AgentConfig.objects.exists()


def model_settings(inbox, **fields) -> ModelSettings:
    """Settings of a configuration that offers `tools` (every tool when not given)."""
    config = AgentConfig.objects.create(
        inbox=inbox, agent="alwayson.claude.agent", tools=fields.pop("tools", None)
    )
    return ModelSettings(config=config, **fields)


@pytest.mark.django_db
@pytest.mark.parametrize(("fields", "field", "error"), BAD_MODEL_SETTINGS)
def test_model_settings_the_api_would_refuse_are_refused_naming_the_field(
    make_inbox, tools_module, fields, field, error
):
    settings_row = model_settings(make_inbox(), **fields)
    with pytest.raises(ValidationError) as raised:
        settings_row.full_clean()
    assert list(raised.value.message_dict) == [field]
    [message] = raised.value.message_dict[field]
    assert error in message


def test_model_settings_without_a_configuration_are_refused_naming_both():
    with pytest.raises(ValidationError) as raised:
        ModelSettings(max_tokens=0).full_clean()
    assert raised.value.message_dict == {
        "config": ["This field cannot be null."],
        "max_tokens": ["must be at least 1, not 0"],
    }


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("fields", "field", "error"),
    [*BAD_MODEL_SETTINGS[:3], *(case for case in BAD_MODEL_SETTINGS if "tools" in case[0])],
)
def test_bad_model_settings_are_a_form_error_in_the_admin(
    admin_client, make_inbox, tools_module, fields, field, error
):
    inbox = make_inbox()
    form = config_form(
        inbox,
        **{
            name: json.dumps(value) if name == "tools" else str(value)
            for name, value in fields.items()
        },
    )
    response = admin_client.post(reverse("admin:alwayson_agentconfig_add"), form)
    assert response.status_code == 200
    assert in_html(error) in response.content.decode()
    assert not response.context["adminform"].form.errors
    [inline] = response.context["inline_admin_formsets"]
    assert inline.formset.errors == [{field: [ANY]}]
    assert not AgentConfig.objects.exists()
    assert not ModelSettings.objects.exists()


@pytest.mark.django_db
def test_model_settings_are_saved_from_the_admin(admin_client, make_inbox, tools_module):
    inbox = make_inbox()
    response = admin_client.post(
        reverse("admin:alwayson_agentconfig_add"),
        config_form(inbox, max_tokens="8000", thinking_budget="2048", tool_choice="none"),
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    settings_row = ModelSettings.objects.get(config__inbox=inbox)
    assert (settings_row.max_tokens, settings_row.thinking_budget, settings_row.tool_choice) == (
        8000,
        2048,
        "none",
    )
    assert settings_row.temperature is None
    ModelSettings.objects.filter(pk=inbox.pk).update(thinking_budget=None, temperature=0.3)
    settings_row.refresh_from_db()
    settings_row.full_clean()  # a temperature without thinking is fine


@pytest.mark.django_db
def test_model_settings_are_checked_against_the_tools_saved_with_them(
    admin_client, make_inbox, tools_module
):
    """On the change page, the tools as edited on it decide which tool tool_choice may name,
    not those saved before."""
    inbox = make_inbox()
    config = AgentConfig.objects.create(inbox=inbox, agent="alwayson.claude.agent")
    ModelSettings.objects.create(config=config, tool_choice="refund")
    change = reverse("admin:alwayson_agentconfig_change", args=[inbox.pk])

    narrowed = config_form(
        inbox, initial_settings=1, tools='["lookup_order"]', tool_choice="refund"
    )
    response = admin_client.post(change, narrowed)
    assert response.status_code == 200
    [inline] = response.context["inline_admin_formsets"]
    assert list(inline.formset.errors[0]) == ["tool_choice"]
    assert AgentConfig.objects.get().tools is None

    chosen = config_form(
        inbox, initial_settings=1, tools='["lookup_order"]', tool_choice="lookup_order"
    )
    response = admin_client.post(change, chosen)
    assert response.status_code == 302, response.content.decode()[:3000]
    assert AgentConfig.objects.get().tools == ["lookup_order"]
    assert ModelSettings.objects.get().tool_choice == "lookup_order"


@pytest.mark.django_db
def test_an_agent_configuration_is_saved_from_the_admin(admin_client, make_inbox, tools_module):
    inbox = make_inbox()
    policy = '{"refund": [{"when": {"amount": {"lt": 50}}, "then": "allow"}, {"then": "ask"}]}'
    response = admin_client.post(
        reverse("admin:alwayson_agentconfig_add"),
        config_form(
            inbox,
            model="claude-haiku-5-5",
            tools='["refund"]',
            policy=policy,
            daily_token_budget="200000",
            approval_window="3600",
        ),
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    config = AgentConfig.objects.get(inbox=inbox)
    assert (config.model, config.tools, config.daily_token_budget) == (
        "claude-haiku-5-5",
        ["refund"],
        200000,
    )
    assert config.policy["refund"][0]["then"] == "allow"
    page = admin_client.get(reverse("admin:alwayson_agentconfig_changelist"))
    assert "claude-haiku-5-5" in page.content.decode()


@pytest.mark.django_db
def test_the_admin_resets_the_conversation_of_the_selected_inboxes(admin_client, make_inbox):
    inboxes = {slug: make_inbox(slug) for slug in ("idle", "due", "asking", "fresh", "other")}
    for inbox in inboxes.values():
        AgentConfig.objects.create(inbox=inbox, agent="alwayson.claude.agent")
    talked = {"claude": {"runs": [[{"role": "user", "content": "hello"}]]}}
    Session.objects.exclude(inbox__slug="fresh").update(state=talked)
    assert ingest(inboxes["due"], "chat", "m1", {"text": "hello"})
    request_approval(inboxes["asking"], "refund-1", "refund order 1", timedelta(hours=1))
    selected = [inboxes[slug].pk for slug in ("idle", "due", "asking", "fresh")]

    response = admin_client.post(
        reverse("admin:alwayson_agentconfig_changelist"),
        {"action": "reset_conversation", "_selected_action": selected},
        follow=True,
    )

    assert response.status_code == 200
    [notice] = [str(m) for m in response.context["messages"]]
    assert notice == (
        "Reset the conversation of 1 inbox(es): idle. Nothing to reset in fresh. Left alone "
        "while a run works on it or its events are due (try again in a moment): due. Left "
        "alone while an approval is open (answer it or let it expire first): asking (refund-1)."
    )
    states = dict(Session.objects.values_list("inbox__slug", "state"))
    assert states == {"idle": {}, "due": talked, "asking": talked, "fresh": {}, "other": talked}
    [entry] = LogEntry.objects.all()
    assert (entry.object_id, entry.change_message) == (
        str(inboxes["idle"].pk),
        "Conversation reset: the session state cleared.",
    )


@pytest.mark.django_db
def test_resetting_a_conversation_needs_the_change_permission(
    client, make_inbox, django_user_model
):
    inbox = make_inbox("idle")
    AgentConfig.objects.create(inbox=inbox, agent="alwayson.claude.agent")
    Session.objects.filter(inbox=inbox).update(state={"claude": {"runs": []}})
    viewer = django_user_model.objects.create_user("viewer", password="x", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_agentconfig"))
    client.force_login(viewer)

    response = client.post(
        reverse("admin:alwayson_agentconfig_changelist"),
        {"action": "reset_conversation", "_selected_action": [inbox.pk]},
    )

    assert response.status_code == 200  # the list again: no such action for this user
    assert Session.objects.get(inbox=inbox).state == {"claude": {"runs": []}}


@pytest.mark.django_db
def test_full_clean_is_the_same_check_outside_the_admin(make_inbox, tools_module):
    config = AgentConfig(inbox=make_inbox(), agent="alwayson.claude.agent", policy=[])
    with pytest.raises(ValidationError) as raised:
        config.full_clean()
    assert "the policy must be a JSON object" in str(raised.value.message_dict["policy"])


@pytest.mark.django_db
def test_an_inbox_without_a_configuration_runs_the_default_agent(make_inbox):
    def default(run):
        pass

    agents = Agents(default)
    plain, claude, blank = make_inbox(), make_inbox(), make_inbox()
    AgentConfig.objects.create(inbox=claude, agent="alwayson.claude.agent")
    AgentConfig.objects.create(inbox=blank, agent="", model="claude-haiku-5-5")
    from alwayson.claude import agent as claude_agent

    assert agents.for_inbox(plain) is default
    assert agents.for_inbox(blank) is default
    assert agents.for_inbox(claude) is claude_agent
    assert agents.in_use() == [default, claude_agent]


# --- the start-up key check ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)  # runworker's slots are threads with connections
def test_the_worker_refuses_to_start_without_a_key_when_an_inbox_runs_claude(
    make_inbox, settings, loop_command
):
    settings.ANTHROPIC_API_KEY = ""
    call_command("runworker", "--once")  # the refund desk alone needs no key
    AgentConfig.objects.create(inbox=make_inbox(), agent="alwayson.claude.agent")
    with pytest.raises(CommandError, match="ANTHROPIC_API_KEY is not set"):
        call_command("runworker", "--once")


@pytest.mark.django_db(transaction=True)
def test_the_worker_refuses_to_start_with_a_key_the_api_refuses(
    messages_api, settings, loop_command
):
    settings.ALWAYSON_AGENT = "alwayson.claude.agent"
    settings.ANTHROPIC_API_KEY = "sk-ant-revoked"
    with pytest.raises(CommandError, match=r"ANTHROPIC_API_KEY was refused by .* \(401"):
        call_command("runworker", "--once")
    assert [r.path for r in messages_api.requests] == ["/v1/models?limit=1"]


@pytest.mark.django_db
def test_a_good_key_passes_the_start_up_check(messages_api, settings):
    settings.ALWAYSON_AGENT = "alwayson.claude.agent"
    Agents().preflight()
    assert [r.path for r in messages_api.requests] == ["/v1/models?limit=1"]


@pytest.mark.django_db
def test_an_unreachable_api_at_start_up_only_warns(settings, caplog, monkeypatch):
    import logging

    monkeypatch.setattr(logging.getLogger("alwayson"), "propagate", True)
    caplog.set_level(logging.WARNING, logger="alwayson.claude")
    settings.ALWAYSON_AGENT = "alwayson.claude.agent"
    settings.ANTHROPIC_API_KEY = "sk-ant-anything"
    settings.ANTHROPIC_BASE_URL = "http://127.0.0.1:9"  # discard: nothing listens
    from alwayson.claude.client import _client

    try:
        Agents().preflight()  # no exception: the runs will retry
    finally:
        _client.cache_clear()
    (warning,) = {r.getMessage() for r in caplog.records if r.levelname == "WARNING"}
    # The reason in the parentheses is the SDK's own words, which its releases change
    # ("Connection error." before anthropic 2.17, the refused connection's since).
    assert re.fullmatch(
        r"could not reach the Messages API to check the key \(.+\); runs will retry", warning
    ), warning


# --- the deferral --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_deferred_run_gives_its_events_back_with_their_attempt_and_commits_its_notice(
    inbox, t0, settings
):
    settings.ALWAYSON_MAX_ATTEMPTS = 1
    ingest(inbox, "chat", "m1", {}, now=t0)
    until = t0 + timedelta(hours=3)
    for n in range(3):  # more deferrals than attempts: never dead
        now = t0 + timedelta(hours=3 * n)
        gen = acquire(inbox, f"w{n}", now=now)
        [claimed] = claim_batch(inbox, f"w{n}", gen, now=now)
        assert claimed.attempts == 1
        until = now + timedelta(hours=3)
        notice = Say(inbox.pk, f"waiting ({n})")
        defer = Defer("budget spent", until=until)
        assert finish(Held(inbox, f"w{n}", gen, [claimed.pk]), [notice], outcome=defer, now=now)
        event = Event.objects.get(pk=claimed.pk)
        assert (event.status, event.attempts, event.error) == ("pending", 0, "budget spent")
        assert event.available_at == until
        assert Lease.objects.get(inbox=inbox).work_at == until
        assert claim_batch(inbox, f"w{n}", gen, now=until - timedelta(seconds=1)) == []
        Lease.objects.filter(inbox=inbox).update(until=None)
    assert OutboxMessage.objects.filter(inbox=inbox).count() == 3


@pytest.mark.django_db
def test_a_deferral_is_fenced_like_any_finish(inbox, t0, ttl):
    ingest(inbox, "chat", "m1", {}, now=t0)
    gen = acquire(inbox, "A", now=t0)
    [claimed] = claim_batch(inbox, "A", gen, now=t0)
    late = t0 + ttl + timedelta(seconds=1)
    acquire(inbox, "B", now=late)
    defer = Defer("later", delay=60)
    assert not finish(
        Held(inbox, "A", gen, [claimed.pk]), [Say(inbox.pk, "x")], outcome=defer, now=late
    )
    assert not OutboxMessage.objects.exists()
    assert Event.objects.get(pk=claimed.pk).status == "running"


def test_a_deferral_is_checked_when_made():
    with pytest.raises(ValueError, match="either until"):
        Defer("x")
    with pytest.raises(ValueError, match="either until"):
        Defer("x", until=timezone.now(), delay=5)
    with pytest.raises(ValueError, match="until must be an aware datetime"):
        Defer("x", until=timezone.now().replace(tzinfo=None))
    with pytest.raises(ValueError, match="reason must be a non-empty string"):
        Defer("", delay=5)
    # One outcome per run: an error and a deferral together is no outcome at all.
    with pytest.raises(ValueError, match="a run ends Done, Failed or Defer, not tuple"):
        finish(Held("nowhere", "A", 1, []), outcome=(Failed("boom"), Defer("x", delay=1)))


@pytest.mark.django_db
def test_run_defer_drops_what_was_recorded_before_it(inbox, t0):
    run = Run(inbox, "A", 1, [], {"seen": 1})
    run.say("before")
    run.ask("r1", "refund order 1", 3600)
    run.defer("later", delay=60)
    run.say("the notice")
    effects = run.effects()
    # The state is as the run found it: nothing to save with the deferral.
    assert [type(e).__name__ for e in effects] == ["Say"]
    assert effects[0].body == "the notice"
    assert run.deferred.reason == "later"


# --- the dashboard -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_dashboard_shows_tokens_per_inbox_today_and_per_run(admin_client, make_inbox):
    a, b = make_inbox("a"), make_inbox("b")
    AgentConfig.objects.create(inbox=a, agent="alwayson.claude.agent", daily_token_budget=1000)
    now = timezone.now()
    rows = [(a, 1, 400, 100, now), (a, 2, 500, 50, now), (b, 1, 10, 5, now)]
    rows.append((b, 1, 7000, 7000, now - timedelta(days=2)))  # not today
    for n, (inbox, generation, tokens_in, tokens_out, created) in enumerate(rows):
        ModelCall.objects.create(
            inbox=inbox,
            request_key=f"{n:064d}",
            generation=generation,
            model="claude-sonnet-5-5",
            response={},
            input_tokens=tokens_in,
            output_tokens=tokens_out,
            cache_read_tokens=1,
            created=created,
        )

    response = admin_client.get(reverse("admin-dashboard"))

    context = response.context
    by_slug = {row["slug"]: row for row in context["token_rows"]}
    assert by_slug["a"]["tokens"]["total"] == 1052 and by_slug["a"]["budget"] == 1000
    assert by_slug["a"]["over_budget"] is True
    assert by_slug["b"]["tokens"]["total"] == 16 and by_slug["b"]["budget"] is None
    assert context["tokens_today"] == 1068
    runs = [(r["inbox__slug"], r["generation"], r["total"]) for r in context["recent_runs"]]
    assert sorted(runs) == [("a", 1, 501), ("a", 2, 551), ("b", 1, 14017)]
    html = response.content.decode()
    assert 'id="tokens-today">1068<' in html
    assert "spent: events wait for midnight UTC" in html


@pytest.mark.django_db
def test_the_model_call_list_filters_one_run(admin_client, make_inbox):
    inbox = make_inbox("a")
    for n, generation in enumerate((1, 2, 2)):
        ModelCall.objects.create(
            inbox=inbox,
            request_key=f"{n:064d}",
            generation=generation,
            model="claude-sonnet-5-5",
            response={},
            input_tokens=10,
            created=timezone.now(),
        )
    changelist = reverse("admin:alwayson_claude_modelcall_changelist")
    response = admin_client.get(changelist, {"inbox__id__exact": inbox.pk, "generation": 2})
    assert response.status_code == 200
    assert {c.generation for c in response.context["cl"].result_list} == {2}
    assert response.context["cl"].result_count == 2
