"""The staff page of replay (issue 42 §2): an inbox's recorded runs against a candidate,
the report on the page, nothing committed; refused to who may not change agent
configurations, and a 400 with the reason for what it cannot read."""

import pytest
from django.apps import apps
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from alwayson.runtime.models import AgentConfigRevision
from alwayson.testing import message, tool_use

CLAUDE = "alwayson.claude.agent"


def row_counts() -> dict:
    return {model._meta.label: model.objects.count() for model in apps.get_models()}


@pytest.fixture
def support(harness, messages_api):
    inbox = harness.inbox("support", agent=CLAUDE, policy={"lookup_order": "allow"})
    messages_api.reply(message(tool_use("send_message", {"text": "Hello."})), message("Done."))
    inbox.chat("hi")
    harness.run_until_idle()
    return inbox


def test_staff_replay_a_proposed_prompt_and_read_the_report(
    admin_client, harness, messages_api, support, settings
):
    settings.ALWAYSON_CLAUDE_PRICES = {
        "claude-sonnet-5-5": {"input": 3, "output": 15, "cache_read": 0.3, "cache_write": 3.75}
    }
    proposed = AgentConfigRevision.propose(support.inbox, system_prompt="Say less.")
    messages_api.reply(message("Done."))
    before = row_counts()

    response = admin_client.post(
        reverse("admin-replay"),
        {"inbox": "support", "config_revision": proposed.number, "budget": 3, "limit": 5},
    )

    assert response.status_code == 200
    text = response.content.decode()
    assert "support #1 (" in text and "differs: messages, tool_calls" in text
    assert "candidate: []" in text
    assert "model calls paid 1 of budget 3" in text
    # Recorded: two calls of 100 input and 20 output tokens; the candidate one.
    assert "by kind    recorded: input 200, output 40, cache read 0, cache write 0" in text
    assert "candidate: input 100, output 20, cache read 0, cache write 0" in text
    assert "cost       recorded: $0.001200, candidate: $0.000600" in text
    assert "total cost: recorded $0.001200, candidate $0.000600" in text
    assert row_counts() == before


def test_what_the_page_cannot_read_is_a_400_with_the_reason(admin_client, support):
    response = admin_client.post(
        reverse("admin-replay"),
        {"inbox": "support", "config_revision": 9, "budget": 999, "agent": "no.such.agent"},
    )

    assert response.status_code == 400
    text = response.content.decode()
    assert "support has no revision 9" in text
    assert "agent: cannot import &#x27;no.such.agent&#x27;" in text
    assert "Ensure this value is less than or equal to 50." in text


def test_staff_without_the_permission_to_change_configurations_are_refused(
    django_user_model, support
):
    staff = django_user_model.objects.create_user("sam", is_staff=True)
    client = Client()
    client.force_login(staff)
    assert client.get(reverse("admin-replay")).status_code == 403

    staff.user_permissions.add(Permission.objects.get(codename="change_agentconfig"))
    assert client.get(reverse("admin-replay")).status_code == 200
