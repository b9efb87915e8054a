"""Existing deployments migrate forward (issue 23, part 9).

A deployment made before the layout move has every model in the app labelled "alwayson"
(alwayson/runtime/migrations 0001-0007). The move keeps the tables: the new apps take the
models over in the migration state only (`db_table`), alwayson 0008 drops them from the old
app's state, renames their content types and rewrites the demo agent's dotted path.

Each test takes the test database back to that layout with the migration executor (the
moved-to apps at zero, "alwayson" at 0007), fills every table with the historical models of
that state, migrates to the latest migrations and reads everything back with the current
models. The database is left at the latest migrations, whatever happens.
"""

import io
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from django.apps import apps as current_apps
from django.contrib.auth.management import create_permissions
from django.contrib.contenttypes.management import create_contenttypes
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)

# Stated here, not imported from the migration: the test checks what the migration does.
MOVED = {  # model name -> the app label it moved to (its table keeps the "alwayson_" name)
    "refund": "alwayson_demo",
    "egresscall": "alwayson_egress",
    "passwordresetrequest": "alwayson_web",
    "modelcall": "alwayson_claude",
    "toolresult": "alwayson_claude",
    "process": "alwayson_ops",
    "deadalert": "alwayson_ops",
    "metrictotal": "alwayson_ops",
}
NEW_APPS = sorted(set(MOVED.values()))
# Made by migrations after the move, so empty when a database of the old layout arrives:
# table -> its model's name (a through table's model has no content type).
NEWER_TABLES = {
    "alwayson_web_livechange": "livechange",
    "alwayson_web_livewatch": "livewatch",
    "alwayson_toolresult_events": "toolresult_events",
    # AgentConfig's model settings moved there after the move, from columns of 0009; the old
    # layout's rows set none of them, so none is copied (tests/contracts/
    # test_migrate_model_settings.py copies some).
    "alwayson_claude_modelsettings": "modelsettings",
    # The Claude agent's memory, added after the move.
    "alwayson_claude_memoryfile": "memoryfile",
    "alwayson_claude_memoryversion": "memoryversion",
    "alwayson_savedstate": "savedstate",
    # Not empty: alwayson 0012 makes each configuration's revision 1 (checked on its own).
    "alwayson_agentconfigrevision": "agentconfigrevision",
    # MCP tools' definitions (issue 41): none before.
    "alwayson_claude_mcptooldefinition": "mcptooldefinition",
}
# Columns added by migrations after the move: the old layout's rows get their defaults.
NEWER_COLUMNS = {
    # alwayson 0011: a message sent mid-run waits for the next run, as it always did; 0012:
    # each configuration is its revision 1; 0013: no MCP server named (every configured one).
    "alwayson_agentconfig": {"mid_run": "queue", "revision": 1, "mcp_servers": None},
    "alwayson_modelcall": {"duration_ms": None},
    "alwayson_toolresult": {
        "decision": "",
        "decision_reason": "",
        "approval_id": None,
        "error": "",
        "finished": None,
    },
}
PROJECT_APPS = ("inbox", "timers", "approvals", "outbox", "alwayson")
OLD_DEMO_AGENT = "alwayson.refund_desk.agent"
NEW_DEMO_AGENT = "alwayson.demo.refund_desk.agent"
# The migration history itself changes, and so may be left out of "nothing lost".
HISTORY = "django_migrations"

pytestmark = pytest.mark.django_db(transaction=True)


# -- the migration executor ------------------------------------------------------------------


@dataclass
class Layouts:
    executor: MigrationExecutor
    latest: list  # the leaf nodes: the new layout
    old: list  # the targets of the layout before the move

    @property
    def old_nodes(self):
        # project_state() takes migrations only, not the (app, None) "at zero" targets.
        return [target for target in self.old if target[1] is not None]

    def migrate(self, targets):
        self.executor.migrate(targets)
        # As django-test-migrations does: the graph and the applied set read afresh.
        self.executor.loader.build_graph()
        return self.executor.loader.project_state(
            [target for target in targets if target[1] is not None]
        ).apps

    def to_old(self):
        return self.migrate(self.old)

    def to_latest(self):
        return self.migrate(self.latest)


@pytest.fixture
def layouts():
    from django.contrib.contenttypes.models import ContentType

    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes()
    old = [node for node in latest if node[0] not in ("alwayson", *NEW_APPS)]
    old += [("alwayson", "0007_metric_totals"), *((app, None) for app in NEW_APPS)]
    ContentType.objects.clear_cache()
    try:
        yield Layouts(executor, latest, old)
    finally:
        # Other tests expect the latest schema: migrate forward whatever the test did.
        Layouts(MigrationExecutor(connection), latest, old).to_latest()
        ContentType.objects.clear_cache()


@pytest.fixture
def old_layout(layouts):
    """The test database as a deployment of the old layout has it, every table filled."""
    old_apps = layouts.to_old()
    assert layouts.executor.migration_plan(layouts.old) == []
    assert {app for app, _ in layouts.executor.loader.applied_migrations}.isdisjoint(NEW_APPS)
    add_old_content_types(old_apps)
    rows = fill(old_apps)
    empty = [table for table, found in read_tables().items() if not found]
    assert not empty, f"the test leaves these tables of the old layout empty: {empty}"
    return old_apps, rows


def add_old_content_types(old_apps):
    """The content types and permissions the old layout's `migrate` made (its post-migrate
    step); the executor alone makes none."""
    for app_config in current_apps.get_app_configs():
        create_contenttypes(app_config, verbosity=0, apps=old_apps)
        create_permissions(app_config, verbosity=0, apps=old_apps)
    ContentType = old_apps.get_model("contenttypes", "ContentType")
    # The test database's own migrate made those of the newer models; a deployment of the
    # old layout never had them.
    ContentType.objects.filter(model__in=NEWER_TABLES.values()).exclude(
        app_label__in=PROJECT_APPS
    ).delete()
    labels = set(ContentType.objects.values_list("app_label", flat=True))
    assert labels.isdisjoint(NEW_APPS), "the old layout has no content type of the new apps"
    for model in MOVED:
        assert ContentType.objects.filter(app_label="alwayson", model=model).exists()


# -- the old layout's rows --------------------------------------------------------------------


def fill(old_apps):
    """At least one row in every table, written with the historical models of the old
    layout; returns the rows the tests look at again."""

    def model(label, name):
        return old_apps.get_model(label, name)

    ContentType = model("contenttypes", "ContentType")
    Permission = model("auth", "Permission")

    def permission(codename, model_name):
        content_type = ContentType.objects.get(app_label="alwayson", model=model_name)
        return Permission.objects.get(content_type=content_type, codename=codename)

    # auth (with both membership tables and both permission tables)
    User, Group = model("auth", "User"), model("auth", "Group")
    owner = User.objects.create(
        username="owner", email="owner@example.com", password="!", date_joined=T0
    )
    operator = User.objects.create(
        username="operator", email="op@example.com", password="!", is_staff=True, date_joined=T0
    )
    operators = Group.objects.create(name="operators")
    operators.permissions.add(permission("view_egresscall", "egresscall"))
    operators.permissions.add(permission("view_process", "process"))
    operator.groups.add(operators)
    operator.user_permissions.add(permission("change_modelcall", "modelcall"))

    # inbox
    Inbox = model("inbox", "Inbox")
    desk = Inbox.objects.create(owner=owner, slug="desk", name="Refund desk", created=T0)
    other = Inbox.objects.create(owner=operator, slug="other", name="Other", created=T0)
    model("inbox", "Session").objects.create(
        inbox=desk, state={"turns": 3, "note": "naïve ✓"}, updated=T0
    )
    model("inbox", "Lease").objects.create(
        inbox=desk, holder="worker-1", generation=7, until=T0 + timedelta(seconds=30), work_at=T0
    )
    event = model("inbox", "Event").objects.create(
        inbox=desk,
        source="webhook",
        source_id="evt-1",
        payload={"text": "refund order 881", "amount": 12.5},
        status="done",
        attempts=1,
        claim_gen=7,
        error="",
        available_at=T0,
        created=T0,
        updated=T0 + timedelta(seconds=1),
    )
    model("inbox", "EventTrace").objects.create(
        event=event, traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    )
    model("inbox", "RunRecord").objects.create(
        inbox=desk,
        generation=7,
        worker="worker-1",
        started=T0,
        ended=T0 + timedelta(seconds=1),
        outcome="done",
        events=[event.pk],
        waiting_since=T0,
        produced={"said": 1},
    )
    Membership = model("inbox", "Membership")
    Membership.objects.create(inbox=desk, user=operator, role=2)
    Membership.objects.create(inbox=desk, group=operators, role=1)

    # timers
    model("timers", "Timer").objects.create(
        inbox=desk,
        key="digest",
        due=T0 + timedelta(hours=21),
        every=None,
        cron="0 9 * * *",
        timezone="Europe/Berlin",
        policy="catch_up",
        catch_up_max=3,
        payload={"kind": "digest"},
        event_source="",
        event_id="",
        done=False,
    )

    # approvals
    approval = model("approvals", "Approval").objects.create(
        inbox=desk,
        request_id="refund-881",
        action="refund 12.50 EUR on order 881",
        details={"tool": "refund", "arguments": {"order": "881", "amount": 12.5}},
        requested_at=T0,
        expires_at=T0 + timedelta(hours=1),
        answer="yes",
        answered_at=T0 + timedelta(minutes=5),
        approvers_needed=2,
        first_approved_by=owner,
        first_approved_at=T0 + timedelta(minutes=2),
        answered_by=operator,
    )
    model("approvals", "AuditEntry").objects.create(
        approval=approval,
        inbox=desk,
        user=operator,
        username="operator",
        answer="yes",
        via="page",
        result="approved",
        action_shown="refund 12.50 EUR on order 881",
        at=T0 + timedelta(minutes=5),
    )

    # outbox
    model("outbox", "Channel").objects.create(
        inbox=desk,
        kind="slack",
        target="C0123",
        mode="at_most_once",
        gap=60,
        failures=2,
        retry_at=T0,
        last_error="timeout",
    )
    model("outbox", "OutboxMessage").objects.create(
        inbox=desk,
        body="Refunded order 881.",
        urgent=True,
        status="sent",
        created=T0,
        sent_at=T0 + timedelta(seconds=5),
        attempts=1,
        send_key="s-1",
    )
    model("outbox", "Notice").objects.create(
        inbox=desk,
        recipient=operator,
        topic="approval:refund-881",
        key="n-1",
        subject="An approval is waiting",
        body="refund-881",
        status="held",
        created=T0,
        due_at=T0,
    )

    # alwayson: the model that stays, and every model that moves
    AgentConfig = model("alwayson", "AgentConfig")
    AgentConfig.objects.create(
        inbox=desk,
        agent=OLD_DEMO_AGENT,
        model="claude-sonnet-4-5",
        system_prompt="You run the refund desk.",
        tools=["refund"],
        policy={"refund": [{"when": {"amount": {"lt": 50}}, "then": "allow"}, {"then": "ask"}]},
        daily_token_budget=100_000,
        approval_window=600,
    )
    AgentConfig.objects.create(inbox=other, agent="alwayson.claude.agent", tools=None)
    refund = model("alwayson", "Refund").objects.create(idempotency_key="refund-881", order="881")
    model("alwayson", "EgressCall").objects.create(
        inbox=desk, service="stripe", method="POST", path="/v1/refunds", outcome="sent",
        status=200, at=T0,
    )  # fmt: skip
    model("alwayson", "EgressCall").objects.create(
        inbox=None, service="slack", method="POST", path="/api/chat.postMessage",
        outcome="refused", status=None, error="not allowed", at=T0,
    )  # fmt: skip
    model("alwayson", "PasswordResetRequest").objects.create(email="owner@example.com", created=T0)
    model("alwayson", "ModelCall").objects.create(
        inbox=desk,
        request_key="req-1",
        generation=7,
        model="claude-sonnet-4-5",
        stop_reason="tool_use",
        response={"content": [{"type": "tool_use", "name": "refund"}]},
        input_tokens=1200,
        output_tokens=80,
        cache_read_tokens=900,
        cache_write_tokens=300,
        created=T0,
    )
    model("alwayson", "ToolResult").objects.create(
        inbox=desk,
        idempotency_key="refund-881",
        tool="refund",
        arguments={"order": "881"},
        result={"ok": True},
        approved=True,
        generation=7,
        created=T0,
    )
    model("alwayson", "Process").objects.create(
        kind="worker", worker_id="host-a:123", host="host-a", pid=123, started=T0,
        last_beat=T0 + timedelta(seconds=10), stopped=None, runs=41, version="1.2.0",
    )  # fmt: skip
    model("alwayson", "DeadAlert").objects.create(
        inbox=desk, last_alert_at=T0, alerts=2, unreported=1, keys=["webhook:evt-0"],
        last_error="Traceback: boom",
    )  # fmt: skip
    model("alwayson", "MetricTotal").objects.create(
        name="runs_total", labels='{"outcome": "done"}', bucket="2026-03-01", value=2.5
    )

    # the admin's history of a moved model, and the rest of Django's tables
    LogEntry = model("admin", "LogEntry")
    log_entry = LogEntry.objects.create(
        action_time=T0,
        user=operator,
        content_type=ContentType.objects.get(app_label="alwayson", model="refund"),
        object_id=str(refund.pk),
        object_repr="refund-881",
        action_flag=2,
        change_message='[{"changed": {"fields": ["Order"]}}]',
    )
    model("sessions", "Session").objects.create(
        session_key="k" * 32, session_data="e30:", expire_date=T0 + timedelta(days=14)
    )
    attempt = model("axes", "AccessAttempt").objects.create(
        user_agent="curl", ip_address="203.0.113.7", username="owner", http_accept="*/*",
        path_info="/admin/login/", attempt_time=T0, get_data="", post_data="username=owner",
        failures_since_start=3,
    )  # fmt: skip
    model("axes", "AccessAttemptExpiration").objects.create(
        access_attempt=attempt, expires_at=T0 + timedelta(hours=1)
    )
    model("axes", "AccessLog").objects.create(
        user_agent="curl", ip_address="203.0.113.7", username="owner", http_accept="*/*",
        path_info="/admin/login/", attempt_time=T0, logout_time=None, session_hash="h",
    )  # fmt: skip
    model("axes", "AccessFailureLog").objects.create(
        user_agent="curl", ip_address="203.0.113.7", username="owner", http_accept="*/*",
        path_info="/admin/login/", attempt_time=T0, locked_out=True,
    )  # fmt: skip

    return {
        "operator": operator.pk,
        "operators": operators.pk,
        "desk": desk.pk,
        "other": other.pk,
        "event": event.pk,
        "refund": refund.pk,
        "log_entry": log_entry.pk,
        "content_types": {
            model_name: ContentType.objects.get(app_label="alwayson", model=model_name).pk
            for model_name in [*MOVED, "agentconfig"]
        },
    }


# -- reading the database back -----------------------------------------------------------------


def read_tables():
    """Every row of every table but the migration history, read with SQL: {table: rows}."""
    found = {}
    with connection.cursor() as cursor:
        for table in sorted(connection.introspection.table_names(cursor)):
            if table == HISTORY:
                continue
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            columns = [column[0] for column in cursor.description]
            rows = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
            found[table] = sorted(rows, key=repr)
    return found


def read_models(model_apps, models):
    """{table: (app label, rows as values() of the given models of `model_apps`)}."""
    by_table = {m._meta.db_table: m for m in model_apps.get_models(include_auto_created=True)}
    found = {}
    for old in models:
        table = old._meta.db_table
        assert table in by_table, f"no model of this layout reads the table {table}"
        model = by_table[table]
        fields = [field.attname for field in old._meta.concrete_fields]
        rows = list(model._base_manager.order_by("pk").values(*fields))
        found[table] = (model._meta.app_label, rows)
    return found


def project_models(old_apps):
    """The old layout's models of the project's apps, with their auto-created through tables,
    and of auth (whose permission and membership rows point at moved models)."""
    return [
        model
        for model in old_apps.get_models(include_auto_created=True)
        if model._meta.app_label in (*PROJECT_APPS, "auth", "admin")
    ]


def moved_to(app_label, model_name):
    return MOVED[model_name] if app_label == "alwayson" and model_name in MOVED else app_label


def expected_after_the_move(tables):
    """What the move changes: the moved models' content types carry their new app's label,
    and the demo agent's dotted path is the new one; the tables of later migrations are there,
    empty. Nothing else."""
    expected = dict(tables) | {table: [] for table in NEWER_TABLES}
    expected["django_content_type"] = sorted(
        (
            {**row, "app_label": moved_to(row["app_label"], row["model"])}
            for row in tables["django_content_type"]
        ),
        key=repr,
    )
    expected["alwayson_agentconfig"] = sorted(
        (
            {**row, "agent": NEW_DEMO_AGENT if row["agent"] == OLD_DEMO_AGENT else row["agent"]}
            for row in tables["alwayson_agentconfig"]
        ),
        key=repr,
    )
    for table, defaults in NEWER_COLUMNS.items():
        expected[table] = sorted(({**row, **defaults} for row in expected[table]), key=repr)
    return expected


def without_revision_ids(tables):
    """The tables, the revisions alwayson 0012 makes without their ids: made again on the way
    forward, they take the sequence's next ones on PostgreSQL."""
    revisions = tables["alwayson_agentconfigrevision"]
    return tables | {"alwayson_agentconfigrevision": [{**row, "id": None} for row in revisions]}


def assert_at_latest(layouts):
    executor = MigrationExecutor(connection)
    assert executor.migration_plan(layouts.latest) == []
    assert executor.loader.detect_conflicts() == {}


# -- the tests ---------------------------------------------------------------------------------


def test_a_database_of_the_old_layout_migrates_forward_with_every_row(layouts, old_layout):
    old_apps, _ = old_layout
    before = read_tables()
    models = project_models(old_apps)
    before_values = read_models(old_apps, models)

    layouts.to_latest()

    assert_at_latest(layouts)
    after = read_tables()
    assert after.keys() == before.keys() | NEWER_TABLES.keys(), "none dropped, only newer made"
    expected = expected_after_the_move(before)
    expected["alwayson_agentconfigrevision"] = after["alwayson_agentconfigrevision"]
    for table in after:
        assert after[table] == expected[table], table

    # The current models read the same tables, with the same fields and values.
    after_values = read_models(current_apps, models)
    for old in models:
        table = old._meta.db_table
        label, rows = after_values[table]
        assert label == moved_to(old._meta.app_label, old._meta.model_name), table
        old_rows = before_values[table][1]
        if table == "alwayson_agentconfig":
            old_rows = [
                {**row, "agent": NEW_DEMO_AGENT if row["agent"] == OLD_DEMO_AGENT else row["agent"]}
                for row in old_rows
            ]
        assert rows == old_rows, table
        assert rows, f"{table} was filled"
    for model_name, label in MOVED.items():
        model = current_apps.get_model(label, model_name)
        assert model._meta.db_table == f"alwayson_{model_name}"
        assert model._base_manager.exists(), model_name

    # Their indexes and constraints are the ones the current models declare.
    with connection.cursor() as cursor:
        for model_name, label in MOVED.items():
            meta = current_apps.get_model(label, model_name)._meta
            names = set(connection.introspection.get_constraints(cursor, meta.db_table))
            declared = {index.name for index in meta.indexes}
            declared |= {constraint.name for constraint in meta.constraints}
            assert declared <= names, (model_name, declared - names)

    from alwayson.runtime.models import AgentConfig

    agents = dict(AgentConfig.objects.values_list("inbox__slug", "agent"))
    assert agents == {"desk": NEW_DEMO_AGENT, "other": "alwayson.claude.agent"}
    # Each configuration's first revision is what it was, by nobody, at its last change.
    from alwayson.runtime.models import AgentConfigRevision

    for config in AgentConfig.objects.all():
        [revision] = AgentConfigRevision.objects.filter(inbox_id=config.inbox_id)
        assert (revision.number, config.revision, revision.author) == (1, 1, None)
        assert (revision.config, revision.created) == (config.snapshot(), config.updated)

    out = io.StringIO()
    try:  # --check exits non-zero when a model differs from its migrations
        call_command("makemigrations", check=True, dry_run=True, verbosity=1, stdout=out)
    except SystemExit:
        pytest.fail(f"the models differ from their migrations:\n{out.getvalue()}")


def test_moved_models_keep_their_content_types_and_permissions(layouts, old_layout):
    _, rows = old_layout
    layouts.to_latest()

    from django.contrib.admin.models import LogEntry
    from django.contrib.auth.models import Group, Permission, User
    from django.contrib.contenttypes.models import ContentType

    ContentType.objects.clear_cache()
    ids = rows["content_types"]
    for model_name, label in MOVED.items():
        model = current_apps.get_model(label, model_name)
        content_type = ContentType.objects.get_for_model(model)
        assert (content_type.app_label, content_type.pk) == (label, ids[model_name])
        assert content_type.model_class() is model
        codenames = set(
            Permission.objects.filter(content_type=content_type).values_list("codename", flat=True)
        )
        assert codenames == {
            f"{action}_{model_name}" for action in ("add", "change", "delete", "view")
        }
    assert not ContentType.objects.filter(app_label="alwayson", model__in=MOVED).exists()
    kept = ContentType.objects.filter(app_label="alwayson")
    # The models alwayson 0012 added are the app's own, with content types of their own.
    assert list(kept.values_list("model", flat=True)) == [
        "agentconfig",
        "agentconfigrevision",
        "savedstate",
    ]
    assert kept.get(model="agentconfig").pk == ids["agentconfig"]
    for label in NEW_APPS:
        assert Permission.objects.filter(content_type__app_label=label).exists(), label
    assert not Permission.objects.filter(
        content_type__app_label="alwayson", content_type__model__in=MOVED
    ).exists()

    # What was given on them still holds, under the new labels.
    operators = Group.objects.get(pk=rows["operators"])
    assert set(operators.permissions.values_list("content_type__app_label", "codename")) == {
        ("alwayson_egress", "view_egresscall"),
        ("alwayson_ops", "view_process"),
    }
    assert Permission.objects.filter(
        content_type__app_label="alwayson_egress", group=operators
    ).exists()
    operator = User.objects.get(pk=rows["operator"])
    assert operator.has_perm("alwayson_egress.view_egresscall")
    assert operator.has_perm("alwayson_ops.view_process")
    assert operator.has_perm("alwayson_claude.change_modelcall")
    assert not operator.has_perm("alwayson.view_egresscall")

    # The admin's history of a moved row opens that row with the current model.
    entry = LogEntry.objects.get(pk=rows["log_entry"])
    assert entry.content_type_id == ids["refund"]
    from alwayson.demo.models import Refund

    refund = entry.get_edited_object()
    assert isinstance(refund, Refund)
    assert (refund.pk, refund.order) == (rows["refund"], "881")
    assert entry.get_admin_url() == f"/admin/alwayson_demo/refund/{rows['refund']}/change/"


def test_a_content_type_made_early_under_the_new_label_gives_way_to_the_old_one(
    layouts, old_layout
):
    """A `migrate` of one new app alone runs its post-migrate step before alwayson 0008: the
    new label's content type then exists, without anything given on it. The old one, whose
    permissions groups hold, is the one kept."""
    old_apps, rows = old_layout
    ContentType = old_apps.get_model("contenttypes", "ContentType")
    Permission = old_apps.get_model("auth", "Permission")
    early = ContentType.objects.create(app_label="alwayson_egress", model="egresscall")
    Permission.objects.create(content_type=early, codename="view_egresscall", name="early")

    layouts.to_latest()

    from django.contrib.auth.models import Group, Permission
    from django.contrib.contenttypes.models import ContentType

    ContentType.objects.clear_cache()
    kept = ContentType.objects.get(app_label="alwayson_egress", model="egresscall")
    assert kept.pk == rows["content_types"]["egresscall"] != early.pk
    assert not ContentType.objects.filter(pk=early.pk).exists()
    assert not Permission.objects.filter(name="early").exists()
    operators = Group.objects.get(pk=rows["operators"])
    assert operators.permissions.filter(content_type=kept, codename="view_egresscall").exists()


def test_migrating_back_to_the_old_layout_and_forward_again_keeps_every_row(layouts, old_layout):
    old_apps, rows = old_layout
    old_tables = read_tables()
    layouts.to_latest()
    new_tables = read_tables()
    revisions = new_tables["alwayson_agentconfigrevision"]
    assert len(revisions) == len(old_tables["alwayson_agentconfig"])
    assert new_tables == expected_after_the_move(old_tables) | {
        "alwayson_agentconfigrevision": revisions
    }

    # Back: the reverse of 0008 gives the content types and the agent path back.
    back_apps = layouts.to_old()
    assert {app for app, _ in layouts.executor.loader.applied_migrations}.isdisjoint(NEW_APPS)
    assert read_tables() == old_tables
    ContentType = back_apps.get_model("contenttypes", "ContentType")
    for model_name, pk in rows["content_types"].items():
        assert ContentType.objects.get(pk=pk).app_label == "alwayson", model_name
    assert not ContentType.objects.filter(app_label__in=NEW_APPS).exists()
    AgentConfig = back_apps.get_model("alwayson", "AgentConfig")
    assert AgentConfig.objects.get(inbox_id=rows["desk"]).agent == OLD_DEMO_AGENT
    # The historical models of the old layout still read the moved tables.
    assert back_apps.get_model("alwayson", "Refund").objects.get().order == "881"

    # And forward again.
    layouts.to_latest()
    assert_at_latest(layouts)
    assert without_revision_ids(read_tables()) == without_revision_ids(new_tables)
    from alwayson.demo.models import Refund

    assert Refund.objects.get().pk == rows["refund"]
