"""The people's keys (who answered, edited, first approved; the audit entry's user) indexed
only where set: a NULL never matches a user, and each answer's UPDATE, never a heap-only one
(it changes `answer`, approval_waiting_idx's predicate), wrote an entry in each of the three
indexes of approvals_approval, two of them for the NULLs of a plain answer.

Dropped by name (the same on both databases), not by AlterField: on SQLite that rebuilds
approvals_approval, and the copy would lose the live pages' triggers on it
(alwayson/web/migrations/0004_live_approval_triggers_again.py). The partial indexes are made
by AddIndex, which rebuilds nothing."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

DROPPED = {
    "approvals_approval_answered_by_id_bc48aba7": ("approvals_approval", "answered_by_id"),
    "approvals_approval_edited_by_id_01dc7ef6": ("approvals_approval", "edited_by_id"),
    "approvals_approval_first_approved_by_id_89f47173": (
        "approvals_approval",
        "first_approved_by_id",
    ),
    "approvals_auditentry_user_id_ec498727": ("approvals_auditentry", "user_id"),
}
PEOPLE = ("answered_by", "edited_by", "first_approved_by")


def _person(related_name="+"):
    return models.ForeignKey(
        blank=True,
        db_index=False,
        null=True,
        on_delete=django.db.models.deletion.SET_NULL,
        related_name=related_name,
        to=settings.AUTH_USER_MODEL,
    )


class Migration(migrations.Migration):

    dependencies = [
        ("approvals", "0006_inbox_indexes_the_composites_serve"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX IF EXISTS "{name}"',
                    reverse_sql=f'CREATE INDEX "{name}" ON "{table}" ("{column}")',
                )
                for name, (table, column) in DROPPED.items()
            ],
            state_operations=[
                *(
                    migrations.AlterField(model_name="approval", name=name, field=_person())
                    for name in PEOPLE
                ),
                migrations.AlterField(model_name="auditentry", name="user", field=_person()),
            ],
        ),
        *(
            migrations.AddIndex(
                model_name="approval",
                index=models.Index(
                    condition=models.Q((f"{name}__isnull", False)),
                    fields=[name],
                    name=f"approval_{name}_idx",
                ),
            )
            for name in PEOPLE
        ),
        migrations.AddIndex(
            model_name="auditentry",
            index=models.Index(
                condition=models.Q(("user__isnull", False)), fields=["user"], name="audit_user_idx"
            ),
        ),
    ]
