"""The Messages API settings are the Claude app's now (alwayson_claude 0005 copied them into
its ModelSettings, hence the dependency): their columns go."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('alwayson', '0009_agent_model_settings'),
        ('alwayson_claude', '0005_model_settings'),
    ]

    operations = [
        migrations.RemoveField(
            model_name='agentconfig',
            name='max_tokens',
        ),
        migrations.RemoveField(
            model_name='agentconfig',
            name='temperature',
        ),
        migrations.RemoveField(
            model_name='agentconfig',
            name='thinking_budget',
        ),
        migrations.RemoveField(
            model_name='agentconfig',
            name='tool_choice',
        ),
    ]
