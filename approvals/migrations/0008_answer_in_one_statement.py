"""approvals_answer, the database function that answers a plain yes or no in one statement
on PostgreSQL (approvals/sql/answer.sql, where its rules are written; approvals/services.py,
answer_at_once, calls it). SQLite has no such functions: its answers take decide_answer's
path, which states the same rules in Python.

The file is read here, as it is now: a change to it takes a new migration that runs it again
(CREATE OR REPLACE), so that a database migrated before the change gets it too."""

from pathlib import Path

from django.conf import settings
from django.db import migrations

ANSWER_SQL = Path(__file__).resolve().parent.parent / "sql" / "answer.sql"
DROP = (
    "DROP FUNCTION IF EXISTS approvals_answer(bigint, boolean, text, text, text, text, text,"
    " text, jsonb, timestamptz, text, text, text)"
)


def install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ANSWER_SQL.read_text(), params=None)


def uninstall(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):

    dependencies = [
        ("approvals", "0007_people_indexed_where_set"),
        ("inbox", "0007_runrecord_inbox_no_own_index"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [migrations.RunPython(install, uninstall)]
