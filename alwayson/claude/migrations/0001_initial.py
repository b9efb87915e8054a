
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
                    name='ModelCall',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('request_key', models.CharField(max_length=64)),
                        ('generation', models.PositiveBigIntegerField()),
                        ('model', models.CharField(max_length=100)),
                        ('stop_reason', models.CharField(blank=True, max_length=50)),
                        ('response', models.JSONField()),
                        ('input_tokens', models.PositiveIntegerField(default=0)),
                        ('output_tokens', models.PositiveIntegerField(default=0)),
                        ('cache_read_tokens', models.PositiveIntegerField(default=0)),
                        ('cache_write_tokens', models.PositiveIntegerField(default=0)),
                        ('created', models.DateTimeField()),
                        ('inbox', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='model_calls', to='inbox.inbox')),
                    ],
                    options={
                        'db_table': 'alwayson_modelcall',
                        'ordering': ['id'],
                        'indexes': [models.Index(fields=['inbox', 'created'], name='modelcall_inbox_created_idx')],
                        'constraints': [models.UniqueConstraint(fields=('inbox', 'request_key'), name='modelcall_unique_request')],
                    },
                ),
                migrations.CreateModel(
                    name='ToolResult',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('idempotency_key', models.CharField(max_length=200)),
                        ('tool', models.CharField(max_length=64)),
                        ('arguments', models.JSONField(default=dict)),
                        ('result', models.JSONField()),
                        ('approved', models.BooleanField(default=False)),
                        ('generation', models.PositiveBigIntegerField()),
                        ('created', models.DateTimeField()),
                        ('inbox', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='tool_results', to='inbox.inbox')),
                    ],
                    options={
                        'db_table': 'alwayson_toolresult',
                        'ordering': ['id'],
                        'constraints': [models.UniqueConstraint(fields=('inbox', 'idempotency_key'), name='toolresult_unique_key')],
                    },
                ),
            ],
        ),
    ]
