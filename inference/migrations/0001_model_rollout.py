# The ModelRollout model moved here from observability (routing decisions live next to routing). The table
# already exists (observability 0001) and keeps its name: only Django's model state changes.

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ("observability", "0001_model_rollout"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="ModelRollout",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("model_name", models.CharField(max_length=100, unique=True)),
                        ("stable_version", models.CharField(blank=True, default="", max_length=64)),
                        ("candidate_version", models.CharField(max_length=64)),
                        ("percent", models.PositiveSmallIntegerField(validators=[django.core.validators.MaxValueValidator(100)])),
                        ("updated_at", models.DateTimeField(auto_now=True)),
                    ],
                    options={"db_table": "observability_modelrollout"},
                ),
            ],
            database_operations=[],
        ),
    ]
