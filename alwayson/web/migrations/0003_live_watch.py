"""Notify only for watched inboxes (LiveWatch): the triggers of migration 0002 still append
every LiveChange (the cursor of every page, pushed or polling), but NOTIFY `alwayson_live`
only while some web process's hub has a page of that inbox open, or of every inbox (0).

Planned with sequential scans off, as the hot statements are (inbox/backends/postgresql.py):
the probe is one look at live_watch_unique whatever the table's statistics say.
"""

import importlib

from django.db import migrations, models

FIRST = importlib.import_module("alwayson.web.migrations.0002_live_change")

WATCHED = f"""
CREATE OR REPLACE FUNCTION alwayson_live_change() RETURNS trigger LANGUAGE plpgsql
SET enable_seqscan = off AS $$
BEGIN
    IF TG_ARGV[0] <> 'lease' THEN
        INSERT INTO alwayson_web_livechange (inbox_id, kind) VALUES (NEW.inbox_id, TG_ARGV[0]);
    END IF;
    IF EXISTS (SELECT 1 FROM alwayson_web_livewatch
               WHERE inbox_id = ANY (ARRAY[NEW.inbox_id, 0])) THEN
        PERFORM pg_notify('{FIRST.CHANNEL}', NEW.inbox_id::text || ':' || TG_ARGV[0]);
    END IF;
    RETURN NULL;
END $$"""
# The function as 0002 made it: every change notifies.
UNWATCHED = FIRST.POSTGRESQL[0].replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def _on_postgresql(sql):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):

    dependencies = [
        ("alwayson_web", "0002_live_change"),
    ]

    operations = [
        migrations.CreateModel(
            name="LiveWatch",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("inbox_id", models.BigIntegerField()),
                ("listener", models.IntegerField()),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("inbox_id", "listener"), name="live_watch_unique"
                    )
                ],
            },
        ),
        migrations.RunPython(_on_postgresql(WATCHED), _on_postgresql(UNWATCHED)),
    ]
