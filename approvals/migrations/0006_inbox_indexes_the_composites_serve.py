"""The inbox foreign keys' own indexes dropped: approval_unique_request and audit_inbox_at_idx
start with inbox_id and serve every lookup by inbox, and each answer writes an entry in every
index of both tables.

Dropped by name (the same on both databases), not by AlterField: on SQLite that rebuilds
approvals_approval, and the copy would lose the live pages' triggers on it
(alwayson/web/migrations/0004_live_approval_triggers_again.py)."""

import django.db.models.deletion
from django.db import migrations, models

DROPPED = {
    "approvals_approval_inbox_id_7dac27f9": "approvals_approval",
    "approvals_auditentry_inbox_id_3119f586": "approvals_auditentry",
}


class Migration(migrations.Migration):

    dependencies = [
        ("approvals", "0005_asked_by_run"),
        ("inbox", "0006_event_traces"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX IF EXISTS "{name}"',
                    reverse_sql=f'CREATE INDEX "{name}" ON "{table}" ("inbox_id")',
                )
                for name, table in DROPPED.items()
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="approval",
                    name="inbox",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="approvals",
                        to="inbox.inbox",
                    ),
                ),
                migrations.AlterField(
                    model_name="auditentry",
                    name="inbox",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="inbox.inbox",
                    ),
                ),
            ],
        ),
    ]
