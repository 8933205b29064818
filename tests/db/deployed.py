"""Running a script under the settings a deployment runs with (``chatsite.settings.dev``, as ``make run``:
psycopg's pool, the project's database backend), against the test database, for the tests that check how
deployed processes use PostgreSQL."""

import json
import subprocess
import sys

from django.conf import settings
from django.db import connection


def database_url() -> str:
    """The test database as a ``DATABASE_URL``."""
    db = connection.settings_dict
    return f"postgres://{db['USER']}:{db['PASSWORD'] or ''}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


#: What every script runs first: Django set up, and ``backend_pid()``, the PostgreSQL backend serving the call.
PRELUDE = """
import asyncio, json, django
django.setup()
from django.conf import settings
from django.db import connection
from database.connections import db_call

def backend_pid():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]
"""


def run_deployed(script: str, **environ: str) -> dict:
    """Run :data:`PRELUDE` then ``script`` (Python that prints one JSON object as its last line) in a fresh
    interpreter with the deployed settings on the test database, ``environ`` added (``DB_POOL_MAX_SIZE`` and the
    like); returns that object. Fails the test with the script's error output if it exits non-zero."""
    env = {
        "PATH": "/usr/bin:/bin",
        "DJANGO_SETTINGS_MODULE": "chatsite.settings.dev",
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "HF_HUB_OFFLINE": "1",
        **environ,
    }
    out = subprocess.run(
        [sys.executable, "-c", PRELUDE + script],
        env=env,
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
