"""The Messages API settings move from the runtime's AgentConfig to this app's ModelSettings.

The rows are copied here; alwayson 0010, which depends on this migration, then drops the old
columns. A configuration that set none of them gets no row: no row reads as all blank. Back,
the settings are copied into the old columns, which alwayson 0010's reverse has made again.
"""

import django.db.models.deletion
from django.db import migrations, models

FIELDS = ("max_tokens", "temperature", "thinking_budget", "tool_choice")
# Each field's blank: a row whose fields are all blank sets nothing.
BLANK = {"max_tokens": None, "temperature": None, "thinking_budget": None, "tool_choice": ""}


def forwards(apps, schema_editor):
    db = schema_editor.connection.alias
    AgentConfig = apps.get_model("alwayson", "AgentConfig")
    ModelSettings = apps.get_model("alwayson_claude", "ModelSettings")
    rows = AgentConfig.objects.using(db).exclude(**BLANK).order_by("pk").values("pk", *FIELDS)
    ModelSettings.objects.using(db).bulk_create(
        ModelSettings(config_id=row.pop("pk"), **row) for row in rows
    )


def backwards(apps, schema_editor):
    db = schema_editor.connection.alias
    AgentConfig = apps.get_model("alwayson", "AgentConfig")
    ModelSettings = apps.get_model("alwayson_claude", "ModelSettings")
    for row in ModelSettings.objects.using(db).order_by("pk").values("pk", *FIELDS):
        AgentConfig.objects.using(db).filter(pk=row.pop("pk")).update(**row)


class Migration(migrations.Migration):

    dependencies = [
        ("alwayson", "0009_agent_model_settings"),
        ("alwayson_claude", "0004_calls_by_run"),
    ]

    operations = [
        migrations.CreateModel(
            name='ModelSettings',
            fields=[
                ('config', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='model_settings', serialize=False, to='alwayson.agentconfig')),
                ('max_tokens', models.PositiveIntegerField(blank=True, help_text='Most tokens the model may write per call, thinking included. Blank: ALWAYSON_CLAUDE_MAX_TOKENS.', null=True)),
                ('temperature', models.FloatField(blank=True, help_text="0 to 1: lower is more predictable. Not with extended thinking. Blank: the API's default.", null=True)),
                ('thinking_budget', models.PositiveIntegerField(blank=True, help_text='Extended thinking: tokens the model may think with per call, at least 1024 and less than max_tokens. Blank: no extended thinking.', null=True)),
                ('tool_choice', models.CharField(blank=True, help_text="auto (the model decides), any (it must call a tool), a tool's name (it must call that one), or none (it may call no tool, not even send_message: nothing goes out). any and a tool's name hold for the first call of each run, so the model can still end its turn. With extended thinking: auto or none. Blank: auto.", max_length=64)),
            ],
            options={
                'verbose_name': 'model settings',
                'verbose_name_plural': 'model settings',
            },
        ),
        migrations.RunPython(forwards, backwards),
    ]
