"""AgentConfig's Messages API settings (max_tokens, temperature, thinking_budget,
tool_choice) moved to the Claude app's ModelSettings (issue 39, item 4): a deployment's rows
arrive in the new table, and go back on a reverse migration.

As tests/contracts/test_migrate_forward.py does for the layout's move: the test database is
taken back to the migrations before the move with the migration executor, filled with the
historical models of that state, migrated to the latest and read with the current models.
The database is left at the latest migrations, whatever happens.
"""

from datetime import UTC, datetime

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
# Stated here, not imported from the migrations: the test checks what they do.
BEFORE = [("alwayson", "0009_agent_model_settings"), ("alwayson_claude", "0004_calls_by_run")]
FIELDS = ("max_tokens", "temperature", "thinking_budget", "tool_choice")
# slug -> the four settings as the old columns held them
STORED = {
    "thinker": (8000, None, 2048, "auto"),
    "chooser": (None, 0.3, None, "refund"),
    "capped": (1500, None, None, ""),
    "plain": (None, None, None, ""),  # sets nothing: no settings row
}


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    executor.loader.build_graph()
    return executor.loader.project_state(targets).apps


@pytest.fixture
def before_the_move():
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    apps = dict(latest)
    assert apps["alwayson_claude"] != BEFORE[1][1], "the move is the Claude app's latest"
    old = [node for node in latest if node[0] not in dict(BEFORE)] + BEFORE
    try:
        yield old, latest, migrate(old)
    finally:
        # Other tests expect the latest schema: migrate forward whatever the test did.
        migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())


def columns(table):
    with connection.cursor() as cursor:
        return {c.name for c in connection.introspection.get_table_description(cursor, table)}


def fill(old_apps):
    User = old_apps.get_model("auth", "User")
    Inbox = old_apps.get_model("inbox", "Inbox")
    AgentConfig = old_apps.get_model("alwayson", "AgentConfig")
    owner = User.objects.create(username="owner", password="!", date_joined=T0)
    for slug, values in STORED.items():
        inbox = Inbox.objects.create(owner=owner, slug=slug, name=slug, created=T0)
        AgentConfig.objects.create(
            inbox=inbox,
            agent="alwayson.claude.agent",
            model="claude-sonnet-4-5",
            tools=["refund"],
            **dict(zip(FIELDS, values, strict=True)),
        )
    return {slug: pk for pk, slug in Inbox.objects.values_list("pk", "slug")}


def test_the_model_settings_arrive_in_the_claude_app_and_go_back(before_the_move, settings):
    old, latest, old_apps = before_the_move
    assert set(FIELDS) <= columns("alwayson_agentconfig")
    inboxes = fill(old_apps)

    migrate(latest)

    from alwayson.claude.models import ModelSettings
    from alwayson.claude.runner import AgentSettings
    from alwayson.runtime.models import AgentConfig
    from inbox.models import Inbox

    assert not set(FIELDS) & columns("alwayson_agentconfig")
    moved = {
        row.pop("config__inbox__slug"): tuple(row.values())
        for row in ModelSettings.objects.order_by("pk").values("config__inbox__slug", *FIELDS)
    }
    assert moved == {slug: values for slug, values in STORED.items() if slug != "plain"}
    # The rest of the configuration stays where it was.
    kept = {c.inbox.slug: (c.agent, c.model, c.tools) for c in AgentConfig.objects.all()}
    assert kept == {
        slug: ("alwayson.claude.agent", "claude-sonnet-4-5", ["refund"]) for slug in STORED
    }

    # The Claude agent reads them as it read the columns; blank, the defaults.
    settings.ALWAYSON_CLAUDE_TOOLS = ["tests.support.claude_tools"]
    read = {}
    for slug in STORED:
        agent = AgentSettings.of(Inbox.objects.get(slug=slug))
        read[slug] = (agent.max_tokens, agent.temperature, agent.thinking_budget, agent.tool_choice)
    default = settings.ALWAYSON_CLAUDE_MAX_TOKENS
    assert read == {
        "thinker": (8000, None, 2048, "auto"),
        "chooser": (default, 0.3, None, "refund"),
        "capped": (1500, None, None, ""),
        "plain": (default, None, None, ""),
    }

    # Back: the old columns hold them again, the new table is gone.
    back_apps = migrate(old)
    assert "alwayson_claude_modelsettings" not in connection.introspection.table_names()
    OldConfig = back_apps.get_model("alwayson", "AgentConfig")
    restored = {
        row.pop("inbox_id"): tuple(row.values())
        for row in OldConfig.objects.values("inbox_id", *FIELDS)
    }
    assert restored == {inboxes[slug]: values for slug, values in STORED.items()}

    # And forward again.
    migrate(latest)
    assert ModelSettings.objects.count() == len(STORED) - 1
    assert ModelSettings.objects.get(config__inbox__slug="thinker").thinking_budget == 2048
