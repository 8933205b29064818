"""Creates the ``free`` and ``paid`` tiers; ``manage.py bootstrap`` ensures the same rows later."""

from django.db import migrations

from billing.defaults import DEFAULT_TIERS


def create_tiers(apps, schema_editor):
    Tier = apps.get_model("billing", "Tier")
    # Only the fields this historical Tier has; later migrations set the fields they add.
    known = {f.name for f in Tier._meta.get_fields()}
    for name, values in DEFAULT_TIERS.items():
        Tier.objects.using(schema_editor.connection.alias).get_or_create(name=name, defaults={k: v for k, v in values.items() if k in known})


class Migration(migrations.Migration):
    dependencies = [("billing", "0001_initial")]
    operations = [migrations.RunPython(create_tiers, migrations.RunPython.noop)]
