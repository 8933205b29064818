"""The connection pool's health check (``database/postgresql/base.py``, docs/overhead-levers.md lever 32): a
pooled connection is handed out without a round trip to PostgreSQL, and one the server ended is never
handed out. Real PostgreSQL; the pool as a deployment configures it (``chatsite.settings.dev``)."""

import tempfile
import time

import psycopg
import pytest

from database.postgresql.base import check_pooled_connection, psycopg_pool_check
from tests.db.deployed import database_url, run_deployed

pytestmark = pytest.mark.django_db


def _traced(check) -> str:
    """What ``check`` sent to and read from the server on a fresh idle connection (libpq's protocol trace)."""
    with psycopg.connect(database_url(), autocommit=True) as conn, tempfile.TemporaryFile("w+") as trace:
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
    with (
        psycopg.connect(database_url(), autocommit=True) as conn,
        psycopg.connect(database_url(), autocommit=True) as admin,
    ):
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
import os, time
import psycopg

async def calls():
    call = db_call(backend_pid, thread_sensitive=False)
    first, again = await call(), await call()
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [first])
    time.sleep(0.3)
    return [first, again, await call()]

print(json.dumps({"engine": settings.DATABASES["default"]["ENGINE"], "pids": asyncio.run(calls())}))
"""
    result = run_deployed(script, DB_POOL_MAX_SIZE="1", DB_POOL_MIN_SIZE="1")
    assert result["engine"] == "database.postgresql"
    first, again, after = result["pids"]
    assert again == first  # the pool handed the same connection out again
    assert after != first  # the ended one was dropped, not handed out
