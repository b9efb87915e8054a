"""Every run's record keeps the version that ran it: the agent's path, its code's
fingerprint, the inbox's configuration revision; the configuration's changes are kept as
revisions, who and when; the state each run saved is kept for a replay of the next."""

import importlib
import sys

import pytest
from django.core.exceptions import ValidationError

from alwayson.runtime import versions
from alwayson.runtime.models import AgentConfig, AgentConfigRevision, SavedState
from inbox.models import RunRecord

DESK = "tests.support.kit_agents.desk"


def versions_of(inbox):
    records = RunRecord.objects.filter(inbox__slug=inbox.slug).order_by("generation")
    return [record.produced["version"] for record in records]


def test_each_run_records_its_agent_code_and_configuration_revision(harness, django_user_model):
    desk = harness.inbox("desk", agent=DESK)
    code = versions.fingerprint(importlib.import_module("tests.support.kit_agents").desk)
    desk.chat("one")
    harness.run_until_idle()

    config = AgentConfig.objects.get(inbox__slug="desk")
    dana = django_user_model.objects.create(username="dana")
    config.system_prompt = "Be brief."
    config.save(revised_by=dana, now=harness.now)
    desk.chat("two")
    harness.run_until_idle()

    assert versions_of(desk) == [
        {"agent": DESK, "code": code, "config": 1},
        {"agent": DESK, "code": code, "config": 2},
    ]
    assert code.startswith("sha256:") and len(code) == len("sha256:") + 12
    second = AgentConfigRevision.objects.get(inbox__slug="desk", number=2)
    assert (second.author, second.created, second.proposed) == (dana, harness.now, False)
    assert second.config["system_prompt"] == "Be brief."
    assert '-  "system_prompt": "",' in second.diff()
    assert '+  "system_prompt": "Be brief.",' in second.diff()


def test_a_save_that_changes_nothing_makes_no_revision(harness):
    harness.inbox("desk", agent=DESK)
    config = AgentConfig.objects.get(inbox__slug="desk")

    config.save()
    config.save(update_fields=["system_prompt"])

    assert list(AgentConfigRevision.objects.values_list("number", flat=True)) == [1]
    config.policy = {"refund": "deny"}
    config.save(update_fields=["policy"])
    config.refresh_from_db()
    assert config.revision == 2


def test_an_inbox_without_configuration_runs_the_default_agent_without_a_revision(
    harness, settings
):
    settings.ALWAYSON_AGENT = DESK
    plain = harness.inbox("plain")
    harness.worker.agents.default = importlib.import_module("tests.support.kit_agents").desk
    plain.chat("hello")
    harness.run_until_idle()

    [version] = versions_of(plain)
    assert version["config"] is None and version["code"].startswith("sha256:")


def test_the_fingerprint_follows_the_agent_modules_files(tmp_path, monkeypatch):
    package = tmp_path / "fingerprinted"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "agent.py").write_text("def agent(run):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("fingerprinted.agent")
    before = versions.fingerprint(module.agent)

    (package / "helpers.py").write_text("WORDS = 'changed'\n")
    versions._fingerprint_of.cache_clear()
    after = versions.fingerprint(module.agent)

    assert before != after
    assert versions.fingerprint(module.agent) == after
    sys.modules.pop("fingerprinted.agent")
    sys.modules.pop("fingerprinted")


def test_an_installed_agent_is_named_by_its_distribution_and_version():
    from importlib.metadata import version

    import jsonschema

    assert versions.fingerprint(jsonschema.validate) == f"jsonschema {version('jsonschema')}"


def test_a_proposed_revision_is_checked_and_not_in_force(harness):
    harness.inbox("desk", agent=DESK)
    inbox = AgentConfig.objects.get(inbox__slug="desk").inbox

    proposed = AgentConfigRevision.propose(inbox, system_prompt="Say less.", now=harness.now)

    assert (proposed.number, proposed.proposed) == (2, True)
    assert AgentConfig.objects.get(inbox=inbox).revision == 1
    with pytest.raises(ValidationError, match="policy"):
        AgentConfigRevision.propose(inbox, policy={"refund": "maybe"})
    with pytest.raises(ValueError, match="unknown field"):
        AgentConfigRevision.propose(inbox, colour="blue")
    # A save after the proposal takes the next number: the proposal keeps its own.
    config = AgentConfig.objects.get(inbox=inbox)
    config.model = "claude-other"
    config.save()
    assert config.revision == 3


def test_the_state_a_run_started_from_is_kept_by_the_run_before(harness):
    desk = harness.inbox("desk", agent=DESK)
    desk.chat("one")
    harness.run_until_idle()
    desk.chat("two")
    harness.run_until_idle()

    first, second = RunRecord.objects.filter(inbox__slug="desk").order_by("generation")
    inbox_id = first.inbox_id
    assert SavedState.before(inbox_id, first.generation) == {}
    assert SavedState.before(inbox_id, second.generation) == {"seen": 1}
    assert SavedState.before(inbox_id, second.generation + 1) == {"seen": 2}


def test_prune_keeps_the_newest_saved_state_before_the_run_records_it_keeps(
    make_inbox, settings, t0
):
    from datetime import timedelta

    from alwayson.ops.retention import prune

    settings.ALWAYSON_RETAIN_RUN_RECORDS = 30
    desk, other = make_inbox("desk"), make_inbox("other")
    old = t0 - timedelta(days=40)
    for generation in (1, 2, 3):
        SavedState.objects.create(
            inbox=desk, generation=generation, state={"n": generation}, created=old
        )
    SavedState.objects.create(inbox=desk, generation=4, state={"n": 4}, created=t0)
    SavedState.objects.create(inbox=other, generation=1, state={"n": 1}, created=old)

    assert prune(t0)["alwayson.SavedState"] == 2

    kept = SavedState.objects.order_by("inbox__slug", "generation")
    assert [(s.inbox.slug, s.generation) for s in kept] == [("desk", 3), ("desk", 4), ("other", 1)]
    assert SavedState.before(desk.pk, 4) == {"n": 3}


def test_the_claude_agents_model_settings_are_part_of_a_revision(harness):
    harness.inbox("desk", agent="alwayson.claude.agent", max_tokens=900)
    config = AgentConfig.objects.get(inbox__slug="desk")
    first = AgentConfigRevision.objects.get(inbox__slug="desk", number=config.revision)
    assert first.config["model_settings"] == {
        "max_tokens": 900,
        "temperature": None,
        "thinking_budget": None,
        "tool_choice": "",
    }

    config.model_settings.temperature = 0.2
    config.model_settings.save()
    assert config.revise(now=harness.now)
    assert not config.revise(now=harness.now)  # nothing changed since

    latest = AgentConfigRevision.objects.get(inbox__slug="desk", number=config.revision)
    assert latest.config["model_settings"]["temperature"] == 0.2
    assert '+    "temperature": 0.2,' in latest.diff()


@pytest.mark.parametrize(
    ("field", "value"), [("mid_run", "join"), ("mcp_servers", []), ("tools", ["refund"])]
)
def test_a_change_of_what_reaches_the_agent_is_a_new_revision(harness, field, value):
    harness.inbox("desk", agent=DESK)
    config = AgentConfig.objects.get(inbox__slug="desk")

    setattr(config, field, value)
    config.save(now=harness.now)

    config.refresh_from_db()
    latest = AgentConfigRevision.objects.get(inbox__slug="desk", number=config.revision)
    assert (config.revision, latest.config[field]) == (2, value)
