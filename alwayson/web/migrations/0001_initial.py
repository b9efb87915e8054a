
from django.db import migrations, models


class Migration(migrations.Migration):
    # The model was the project's first app's (label "alwayson"), and its table keeps that
    # app's name: this app takes it over in the state only. On a new database the table is
    # made by the migration it depends on; alwayson 0008 drops the old app's state.

    initial = True

    dependencies = [
        ("alwayson", "0007_metric_totals"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='PasswordResetRequest',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('email', models.CharField(max_length=254)),
                        ('created', models.DateTimeField()),
                    ],
                    options={
                        'db_table': 'alwayson_passwordresetrequest',
                        'indexes': [models.Index(fields=['email', 'created'], name='reset_email_created')],
                    },
                ),
            ],
        ),
    ]
