
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
                    name='DeadAlert',
                    fields=[
                        ('inbox', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='dead_alert', serialize=False, to='inbox.inbox')),
                        ('last_alert_at', models.DateTimeField(blank=True, null=True)),
                        ('alerts', models.PositiveIntegerField(default=0, help_text='alerts queued so far')),
                        ('unreported', models.PositiveIntegerField(default=0)),
                        ('keys', models.JSONField(blank=True, default=list)),
                        ('last_error', models.TextField(blank=True)),
                    ],
                    options={
                        'db_table': 'alwayson_deadalert',
                        'indexes': [models.Index(condition=models.Q(('unreported__gt', 0)), fields=['last_alert_at'], name='dead_alert_due_idx')],
                    },
                ),
                migrations.CreateModel(
                    name='MetricTotal',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('name', models.CharField(max_length=100)),
                        ('labels', models.CharField(default='{}', max_length=500)),
                        ('bucket', models.CharField(blank=True, max_length=30)),
                        ('value', models.FloatField(default=0)),
                    ],
                    options={
                        'db_table': 'alwayson_metrictotal',
                        'constraints': [models.UniqueConstraint(fields=('name', 'labels', 'bucket'), name='metric_total_key')],
                    },
                ),
                migrations.CreateModel(
                    name='Process',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('kind', models.CharField(choices=[('worker', 'Worker'), ('scheduler', 'Scheduler'), ('dispatcher', 'Dispatcher')], max_length=20)),
                        ('worker_id', models.CharField(max_length=200)),
                        ('host', models.CharField(max_length=255)),
                        ('pid', models.PositiveIntegerField()),
                        ('started', models.DateTimeField()),
                        ('last_beat', models.DateTimeField()),
                        ('stopped', models.DateTimeField(blank=True, null=True)),
                        ('runs', models.PositiveBigIntegerField(default=0)),
                        ('version', models.CharField(blank=True, max_length=50)),
                    ],
                    options={
                        'verbose_name_plural': 'processes',
                        'db_table': 'alwayson_process',
                        'indexes': [models.Index(fields=['last_beat'], name='process_beat_idx')],
                    },
                ),
            ],
        ),
    ]
