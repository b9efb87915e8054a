"""A change of an inbox's agent configuration in the admin is one revision, model settings
included, naming who made it; the revisions' pages show the diff (issue 42 §1)."""

import pytest
from django.urls import reverse

from alwayson.claude.models import ModelSettings
from alwayson.runtime.models import AgentConfig, AgentConfigRevision
from tests.support.admin import agent_config_form

pytestmark = pytest.mark.django_db


def test_a_change_in_the_admin_is_one_revision_by_its_author(
    admin_client, admin_user, make_inbox, settings
):
    settings.ALWAYSON_CLAUDE_TOOLS = ["tests.support.claude_tools"]
    inbox = make_inbox()
    config = AgentConfig.objects.create(inbox=inbox, agent="alwayson.claude.agent")
    ModelSettings.objects.create(config=config, max_tokens=800)
    assert config.revise()  # revision 2: the settings saved after the configuration
    change = reverse("admin:alwayson_agentconfig_change", args=[inbox.pk])

    form = agent_config_form(
        inbox, initial_settings=1, system_prompt="Be brief.", max_tokens="1200"
    )
    response = admin_client.post(change, form)

    assert response.status_code == 302, response.content.decode()[:2000]
    numbers = list(AgentConfigRevision.objects.order_by("number").values_list("number", "author"))
    assert numbers == [(1, None), (2, None), (3, admin_user.pk)]
    third = AgentConfigRevision.objects.get(number=3)
    assert third.config["system_prompt"] == "Be brief."
    assert third.config["model_settings"]["max_tokens"] == 1200
    assert AgentConfig.objects.get().revision == 3

    page = admin_client.get(reverse("admin:alwayson_agentconfigrevision_change", args=[third.pk]))
    text = page.content.decode()
    assert page.status_code == 200
    assert "+    &quot;max_tokens&quot;: 1200," in text
    assert "-    &quot;max_tokens&quot;: 800," in text
    listing = admin_client.get(change).content.decode()
    assert "revision 3 in force; every revision, with its diff" in listing
