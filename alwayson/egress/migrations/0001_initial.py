
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    # The model was the project's first app's (label "alwayson"), and its table keeps that
    # app's name: this app takes it over in the state only. On a new database the table is
    # made by the migration it depends on; alwayson 0008 drops the old app's state.

    initial = True

    dependencies = [
        ("alwayson", "0007_metric_totals"),
        ('inbox', '0004_event_inbox_no_own_index'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='EgressCall',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('service', models.CharField(max_length=50)),
                        ('method', models.CharField(max_length=10)),
                        ('path', models.CharField(max_length=300)),
                        ('outcome', models.CharField(choices=[('sent', 'Sent'), ('refused', 'Refused'), ('failed', 'Failed')], max_length=10)),
                        ('status', models.PositiveSmallIntegerField(blank=True, null=True)),
                        ('error', models.CharField(blank=True, max_length=500)),
                        ('at', models.DateTimeField()),
                        ('inbox', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='inbox.inbox')),
                    ],
                    options={
                        'db_table': 'alwayson_egresscall',
                        'ordering': ['-id'],
                        'indexes': [models.Index(fields=['inbox', 'service', 'at'], name='egress_inbox_service_idx'), models.Index(fields=['at'], name='egress_at_idx')],
                    },
                ),
            ],
        ),
    ]
