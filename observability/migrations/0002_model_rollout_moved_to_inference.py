# ModelRollout now belongs to inference (inference 0001 takes over its table): drop it from this app's
# model state only; the table stays.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("observability", "0001_model_rollout"),
        ("inference", "0001_model_rollout"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="ModelRollout")],
            database_operations=[],
        ),
    ]
