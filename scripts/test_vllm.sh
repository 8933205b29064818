#!/usr/bin/env bash
# `make test-vllm` (also run by .ci/run after `make test`): the vLLM test layer (tests/vllm) from .venv-vllm
# (`make install-vllm`), against the same PostgreSQL, Redis and RabbitMQ as the suite: a Celery worker whose
# engine is vLLM's CPU build, the real web tier, the page's WebSocket and the OpenAI-compatible API.
# Extra arguments go to pytest (e.g. `make test-vllm ARGS="-k greedy"`).
set -euo pipefail
cd "$(dirname "$0")/.."
export DJANGO_SETTINGS_MODULE=chatsite.settings.test HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 CHATSITE_TEST_VLLM=1
.venv/bin/python manage.py prepare_model
.venv-vllm/bin/python -m pytest tests/vllm -m integration -p no:cacheprovider -s "$@"
