"""The connection pool's health check (``database/postgresql/base.py``, docs/overhead-levers.md lever 32): a
pooled connection is handed out without a round trip to PostgreSQL, and one the server ended is never
handed out. Real PostgreSQL; the pool as a deployment configures it (``chatsite.settings.dev``)."""

import json
import subprocess
import sys
import tempfile
import time

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from database.postgresql.base import check_pooled_connection, psycopg_pool_check

pytestmark = pytest.mark.django_db


def _url() -> str:
    db = connection.settings_dict
    return f"postgres://{db['USER']}:{db['PASSWORD'] or ''}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def _traced(check) -> str:
    """What ``check`` sent to and read from the server on a fresh idle connection (libpq's protocol trace)."""
    with psycopg.connect(_url(), autocommit=True) as conn, tempfile.TemporaryFile("w+") as trace:
        conn.pgconn.trace(trace.fileno())
        check(conn)
        conn.pgconn.untrace()
        trace.seek(0)
        return trace.read()


def test_a_live_pooled_connection_is_checked_without_a_round_trip():
    assert _traced(check_pooled_connection) == ""
    # The trace sees a round trip when there is one: psycopg_pool's own check sends an empty query.
    assert "Query" in _traced(psycopg_pool_check)


def test_a_connection_the_server_ended_fails_the_check():
    with psycopg.connect(_url(), autocommit=True) as conn, psycopg.connect(_url(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [conn.info.backend_pid])
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                check_pooled_connection(conn)
            except psycopg.OperationalError:
                break
            time.sleep(0.02)  # the server's goodbye is on its way to the socket
        else:
            pytest.fail("a terminated connection passed the check for 5 s")


def test_the_deployed_pool_replaces_a_connection_the_server_ended():
    """Settings as ``make run`` has them: a pool of one connection; its backend is terminated while it is
    idle in the pool; the next database call is served, on a new backend, without an error."""
    script = """
import asyncio, json, time, django
django.setup()
import psycopg
from django.conf import settings
from django.db import connection
from database.connections import db_call

def backend_pid():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]

async def calls():
    call = db_call(backend_pid, thread_sensitive=False)
    first, again = await call(), await call()
    with psycopg.connect(settings.DATABASE_ADMIN_URL, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [first])
    time.sleep(0.3)
    return [first, again, await call()]

print(json.dumps({"engine": settings.DATABASES["default"]["ENGINE"], "pids": asyncio.run(calls())}))
""".replace("settings.DATABASE_ADMIN_URL", repr(_url()))
    env = {
        "PATH": "/usr/bin:/bin",
        "DJANGO_SETTINGS_MODULE": "chatsite.settings.dev",
        "DATABASE_URL": _url(),
        "REDIS_URL": settings.REDIS_URL,
        "DB_POOL_MAX_SIZE": "1",
        "DB_POOL_MIN_SIZE": "1",
        "HF_HUB_OFFLINE": "1",
    }
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["engine"] == "database.postgresql"
    first, again, after = result["pids"]
    assert again == first  # the pool handed the same connection out again
    assert after != first  # the ended one was dropped, not handed out
