"""The project's first app held every model; each now lives in the app of its job.

The tables stay where they are (each model keeps its `db_table`), so this drops the models
from this app's state only, and moves their content types with them: permissions given to
groups and users, and the admin's history, follow the model to its new app.
"""

from django.db import migrations, models

# model name -> the app label it moved to
MOVED = {
    "refund": "alwayson_demo",
    "egresscall": "alwayson_egress",
    "passwordresetrequest": "alwayson_web",
    "modelcall": "alwayson_claude",
    "toolresult": "alwayson_claude",
    "process": "alwayson_ops",
    "deadalert": "alwayson_ops",
    "metrictotal": "alwayson_ops",
}
OLD_DEMO_AGENT = "alwayson.refund_desk.agent"
NEW_DEMO_AGENT = "alwayson.demo.refund_desk.agent"


def move_content_types(apps, schema_editor, moves):
    ContentType = apps.get_model("contenttypes", "ContentType")
    db = schema_editor.connection.alias
    for model, (old, new) in moves.items():
        # A content type already made under the new label (a `migrate` interrupted after
        # its post-migrate step) has no permissions given yet: the old one, which has, wins.
        if ContentType.objects.using(db).filter(app_label=old, model=model).exists():
            ContentType.objects.using(db).filter(app_label=new, model=model).delete()
        ContentType.objects.using(db).filter(app_label=old, model=model).update(app_label=new)


def forwards(apps, schema_editor):
    move_content_types(apps, schema_editor, {m: ("alwayson", new) for m, new in MOVED.items()})
    # The demo agent's dotted path moved with it.
    AgentConfig = apps.get_model("alwayson", "AgentConfig")
    AgentConfig.objects.using(schema_editor.connection.alias).filter(agent=OLD_DEMO_AGENT).update(
        agent=NEW_DEMO_AGENT
    )


def backwards(apps, schema_editor):
    move_content_types(apps, schema_editor, {m: (new, "alwayson") for m, new in MOVED.items()})
    AgentConfig = apps.get_model("alwayson", "AgentConfig")
    AgentConfig.objects.using(schema_editor.connection.alias).filter(agent=NEW_DEMO_AGENT).update(
        agent=OLD_DEMO_AGENT
    )


class Migration(migrations.Migration):

    dependencies = [
        ("alwayson", "0007_metric_totals"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("alwayson_claude", "0001_initial"),
        ("alwayson_demo", "0001_initial"),
        ("alwayson_egress", "0001_initial"),
        ("alwayson_ops", "0001_initial"),
        ("alwayson_web", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveField(
                    model_name='deadalert',
                    name='inbox',
                ),
                migrations.RemoveField(
                    model_name='egresscall',
                    name='inbox',
                ),
                migrations.DeleteModel(
                    name='MetricTotal',
                ),
                migrations.RemoveField(
                    model_name='modelcall',
                    name='inbox',
                ),
                migrations.DeleteModel(
                    name='PasswordResetRequest',
                ),
                migrations.DeleteModel(
                    name='Process',
                ),
                migrations.DeleteModel(
                    name='Refund',
                ),
                migrations.RemoveField(
                    model_name='toolresult',
                    name='inbox',
                ),
                migrations.DeleteModel(
                    name='DeadAlert',
                ),
                migrations.DeleteModel(
                    name='EgressCall',
                ),
                migrations.DeleteModel(
                    name='ModelCall',
                ),
                migrations.DeleteModel(
                    name='ToolResult',
                ),
            ],
        ),
        migrations.AlterField(
            model_name='agentconfig',
            name='agent',
            field=models.CharField(blank=True, help_text='Dotted path of the agent callable, e.g. alwayson.claude.agent or alwayson.demo.refund_desk.agent. Blank: ALWAYSON_AGENT.', max_length=200),
        ),
        migrations.RunPython(forwards, backwards),
    ]
