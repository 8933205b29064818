"""Create the pgvector table and HNSW index where the server has the ``vector`` extension; a no-op on
stock PostgreSQL (the exact-scan store is used there). ``manage.py memory_store --install`` does the same
later, e.g. after the extension is installed on the server."""

from django.conf import settings
from django.db import migrations


def install(apps, schema_editor):
    if settings.MEMORY_VECTOR_BACKEND == "exact":
        return
    from memory.store import pgvector

    pgvector.install(schema_editor.connection)


def uninstall(apps, schema_editor):
    schema_editor.execute("DROP TABLE IF EXISTS memory_chunkvector")


class Migration(migrations.Migration):
    dependencies = [("memory", "0001_initial")]

    operations = [migrations.RunPython(install, uninstall)]
