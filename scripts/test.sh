#!/usr/bin/env bash
# The test command (`make test`, called by .ci/run): ruff, then the whole pytest suite against the local
# PostgreSQL and Redis, real Celery worker processes with the real default model, and Debian's Chromium.
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
python -m pytest "$@"
