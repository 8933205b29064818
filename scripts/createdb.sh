#!/usr/bin/env bash
# Creates the PostgreSQL database named in DATABASE_URL when it is missing (trust auth on 127.0.0.1 here).
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
python - <<'PY'
import environ, psycopg
from psycopg import sql
env = environ.Env()
environ.Env.read_env(".env", overwrite=False)
db = env.db("DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/chatsite")
params = dict(host=db["HOST"] or None, port=db["PORT"] or None, user=db["USER"] or None, password=db["PASSWORD"] or None)
with psycopg.connect(dbname="postgres", autocommit=True, **params) as conn:
    if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]]).fetchone():
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db["NAME"])))
        print(f"created database {db['NAME']}")
PY
