from django.db import migrations

ADDED = ("mcp_servers", "mid_run")


def fill_the_added_fields(apps, schema_editor):
    """Revisions made before they kept mcp_servers and mid_run get the configuration's values:
    those fields were not revised until now, so what ran under each revision is what is set."""
    AgentConfig = apps.get_model("alwayson", "AgentConfig")
    Revision = apps.get_model("alwayson", "AgentConfigRevision")
    configs = {config.inbox_id: config for config in AgentConfig.objects.all()}
    for revision in Revision.objects.all().iterator():
        config = configs.get(revision.inbox_id)
        missing = [name for name in ADDED if name not in revision.config]
        if config is None or not missing:
            continue
        for name in missing:
            revision.config[name] = getattr(config, name)
        revision.save(update_fields=["config"])


class Migration(migrations.Migration):
    dependencies = [
        ("alwayson", "0013_agentconfig_mcp_servers"),
    ]

    operations = [migrations.RunPython(fill_the_added_fields, migrations.RunPython.noop)]
