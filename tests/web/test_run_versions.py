"""The run list shows and filters by the version each run's record keeps; a run's page shows
it (issue 42 §1)."""

import re
from datetime import timedelta

import pytest
from django.urls import reverse

from inbox.models import RunRecord

pytestmark = pytest.mark.django_db

OLD = {"agent": "shop.agent.agent", "code": "sha256:aaaaaaaaaaaa", "config": 1}
NEW = {"agent": "shop.agent.agent", "code": "sha256:bbbbbbbbbbbb", "config": 2}
OTHER = {"agent": "shop.other.agent", "code": "shop 1.2.0", "config": 2}


def records(desk, t0):
    for generation, version in enumerate([OLD, NEW, OTHER, None], start=1):
        produced = {"said": 1} | ({"version": version} if version else {})
        RunRecord.objects.create(
            inbox=desk,
            generation=generation,
            worker="w1",
            started=t0 + timedelta(minutes=generation),
            ended=t0 + timedelta(minutes=generation, seconds=1),
            outcome="done",
            produced=produced,
        )


def listed(response) -> list[int]:
    assert response.status_code == 200
    return [int(n) for n in re.findall(r'aria-label="Run (\d+) of desk', response.content.decode())]


def test_the_run_list_filters_by_agent_code_and_configuration_revision(desk, owner_client, t0):
    records(desk, t0)
    runs = reverse("runs")

    assert listed(owner_client.get(runs)) == [4, 3, 2, 1]
    assert listed(owner_client.get(runs, {"code": NEW["code"]})) == [2]
    assert listed(owner_client.get(runs, {"agent": "shop.agent.agent"})) == [2, 1]
    assert listed(owner_client.get(runs, {"config_revision": 2})) == [3, 2]
    assert listed(owner_client.get(runs, {"agent": "shop.other.agent", "config_revision": 1})) == []
    page = owner_client.get(runs).content.decode()
    title = "shop.agent.agent @ sha256:bbbbbbbbbbbb config r2"
    assert f'<code title="{title}">sha256:bbbbbbbbbbbb</code> · r2' in page


def test_a_revision_that_cannot_be_read_is_a_400(desk, owner_client):
    response = owner_client.get(reverse("runs"), {"config_revision": "0"})

    assert response.status_code == 400
    assert "Configuration revision" in response.content.decode()


def test_a_runs_page_names_its_version_and_links_to_its_runs(desk, owner_client, t0):
    records(desk, t0)

    page = owner_client.get(reverse("run", args=["desk", 3])).content.decode()

    assert "<code>shop.other.agent @ shop 1.2.0 config r2</code>" in page
    assert "?inbox=desk&amp;code=shop%201.2.0" in page
