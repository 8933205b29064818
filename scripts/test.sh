#!/usr/bin/env bash
# The test command (`make test`, called by .ci/run): ruff, then the whole pytest suite against the local
# PostgreSQL, Redis, a real Celery worker and Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
export DJANGO_SETTINGS_MODULE=chatsite.settings.test HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
ruff check .
python -m pytest "$@"
