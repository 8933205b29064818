#!/usr/bin/env bash
# The test command (`make test`, called by .ci/run): ruff, then the pytest suite in two runs:
#   1. unit + db layers (no worker process may be alive: queued replies must stay queued there);
#   2. integration + browser layers against live Celery workers with the real default model, daphne,
#      PostgreSQL, Redis and Debian's Chromium.
# Extra arguments go to both runs (e.g. `make test ARGS="-k stop"`); a run that selects nothing is fine.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
export DJANGO_SETTINGS_MODULE=chatsite.settings.test HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
if ! command -v chromium >/dev/null; then
  # Playwright's own browser download does not work here; the browser test drives Debian's Chromium.
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
ruff check .
python manage.py prepare_model
# The vector-store tests run on both backends: a PostgreSQL with pgvector (bundled in a wheel) for that half.
if [ -z "${TEST_PGVECTOR_SOCKET_DIR:-}" ]; then
  TEST_PGVECTOR_SOCKET_DIR="$(python scripts/pgvector_server.py)" \
    || { TEST_PGVECTOR_SOCKET_DIR=""; echo "pgvector test server did not start: its store tests are skipped" >&2; }
  export TEST_PGVECTOR_SOCKET_DIR
fi

run_pytest() {
  local rc=0
  python -m pytest "$@" || rc=$?
  # 5 = no test selected by this run's marker (e.g. a -k that matches only the other layer)
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then exit "$rc"; fi
}
run_pytest -m "not integration" "$@"
run_pytest -m integration "$@"
